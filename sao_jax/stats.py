"""Statistics over seeds: every headline number is a mean with its standard error and a 95 %
interval (Student's t, since seeds are few)."""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats as _st


def summarize(values: Sequence[float | None]) -> dict:
  """Mean, standard error, 95 % t-interval and the values themselves. `None` values (e.g.
  "never reached the target") are counted in `missing` and left out of the statistics."""
  vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
  n = len(vals)
  out = {"n": n, "values": list(values), "missing": len(values) - n}
  if n == 0:
    return dict(out, mean=None, se=None, ci95=None)
  mean = float(np.mean(vals))
  if n == 1:
    return dict(out, mean=mean, se=None, ci95=None)
  se = float(np.std(vals, ddof=1) / math.sqrt(n))
  half = float(_st.t.ppf(0.975, n - 1) * se)
  return dict(out, mean=mean, se=se, ci95=[mean - half, mean + half])


def fmt(s: dict, spec: str = "{:.3g}", scale: float = 1.0) -> str:
  """'mean ± se' of a `summarize` result ('-' when empty)."""
  if s.get("mean") is None:
    return "-"
  m = spec.format(s["mean"] * scale)
  return m if s.get("se") is None else f"{m} ± {spec.format(s['se'] * scale)}"
