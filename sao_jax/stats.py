"""Statistics over seeds: mean, standard error and a Student-t confidence interval.

For n values x_1..x_n (one per seed):

  mean  m  = (1/n) sum_i x_i
  sd    s  = sqrt( sum_i (x_i - m)^2 / (n - 1) )        (Bessel-corrected)
  s.e.  se = s / sqrt(n)
  CI       = m -/+ t_{(1 + c)/2, n - 1} * se             (two-sided, confidence c = 0.95)

t is Student's t quantile with n - 1 degrees of freedom (scipy.stats.t), which is what
makes a 3-seed interval honest: t_{0.975, 2} = 4.30, not the normal 1.96. With one seed the
spread is unknown and se and the interval are NaN.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

import numpy as np
from scipy import stats as sp_stats


@dataclasses.dataclass(frozen=True)
class SeedStats:
  """Summary of one quantity over seeds."""

  n: int
  mean: float
  se: float
  ci_low: float
  ci_high: float
  confidence: float = 0.95

  def as_dict(self, prefix: str = "") -> dict[str, float | int]:
    return {
      f"{prefix}n": self.n,
      f"{prefix}mean": self.mean,
      f"{prefix}se": self.se,
      f"{prefix}ci_low": self.ci_low,
      f"{prefix}ci_high": self.ci_high,
    }

  def __str__(self) -> str:
    if self.n == 0:
      return "n/a (no values)"
    if self.n == 1:
      return f"{self.mean:.4g} (n=1, no spread)"
    return (
      f"{self.mean:.4g} +- {self.se:.2g} s.e. ({self.confidence:.0%} CI "
      f"{self.ci_low:.4g} .. {self.ci_high:.4g}, n={self.n})"
    )


def t_quantile(confidence: float, dof: int) -> float:
  """Two-sided Student-t multiplier: t_{(1 + confidence)/2, dof}."""
  if not 0 < confidence < 1:
    raise ValueError(f"confidence must be in (0, 1), got {confidence}")
  if dof < 1:
    raise ValueError(f"degrees of freedom must be >= 1, got {dof}")
  return float(sp_stats.t.ppf(0.5 + confidence / 2, dof))


def seed_stats(values: Iterable[float], confidence: float = 0.95) -> SeedStats:
  """Mean, standard error and t-interval of `values` (one per seed; all must be finite:
  the caller decides what a failed or diverged seed means and drops it explicitly)."""
  x = np.asarray([float(v) for v in values], np.float64)
  if not np.all(np.isfinite(x)):
    raise ValueError(f"seed_stats needs finite values, got {x.tolist()}")
  n = int(x.size)
  nan = math.nan
  if n == 0:
    return SeedStats(0, nan, nan, nan, nan, confidence)
  mean = float(x.mean())
  if n == 1:
    return SeedStats(1, mean, nan, nan, nan, confidence)
  se = float(x.std(ddof=1) / math.sqrt(n))
  half = t_quantile(confidence, n - 1) * se
  return SeedStats(n, mean, se, mean - half, mean + half, confidence)


def summarize(values: Iterable[float | None], confidence: float = 0.95) -> dict:
  """`seed_stats` as a JSON-ready dict that also keeps the values themselves. `None` or
  non-finite values (a seed that never reached a target, say) are counted in `missing` and
  left out; mean, se and ci95 are None where they are undefined."""
  values = list(values)
  kept = [float(v) for v in values if v is not None and math.isfinite(float(v))]
  st = seed_stats(kept, confidence)
  num = lambda x: None if math.isnan(x) else x  # noqa: E731
  return {
    "n": st.n,
    "values": values,
    "missing": len(values) - st.n,
    "mean": num(st.mean),
    "se": num(st.se),
    "ci95": None if math.isnan(st.ci_low) else [st.ci_low, st.ci_high],
  }


def bootstrap_ci(
  values: Iterable[float], confidence: float = 0.95, n_resamples: int = 10_000, seed: int = 0
) -> list[float] | None:
  """Percentile bootstrap interval of the mean of `values` (one per seed: a per-seed ratio,
  say), by scipy.stats.bootstrap with a fixed generator so that it is reproducible; None
  with fewer than 2 values, or when they are all equal (no spread to resample)."""
  x = np.asarray([float(v) for v in values], np.float64)
  if x.size < 2 or np.allclose(x, x[0], rtol=1e-12, atol=0.0):
    return None
  ci = sp_stats.bootstrap(
    (x,),
    np.mean,
    confidence_level=confidence,
    n_resamples=n_resamples,
    method="percentile",
    rng=np.random.default_rng(seed),
  ).confidence_interval
  return [float(ci.low), float(ci.high)]


def length_histogram(lengths: Iterable[float]) -> dict:
  """A histogram of lengths (tokens) on power-of-two bins, [0, 8), [8, 16), [16, 32), ...,
  the last one up to the longest: what a heavy-tailed law of lengths looks like at a glance
  and on a log axis. {"edges": [...], "counts": [...]}."""
  x = np.asarray(list(lengths), np.float64)
  top = int(x.max()) if x.size else 0
  edges = [0, *(2**i for i in range(3, max(4, math.ceil(math.log2(max(top, 1))) + 1)))]
  edges[-1] = max(edges[-1], top + 1)
  counts, _ = np.histogram(x, bins=edges)
  return {"edges": [int(e) for e in edges], "counts": counts.tolist()}


def length_summary(lengths) -> dict:
  """What a length law looks like in data: mean, coefficient of variation, quantiles, max,
  max/mean and a histogram (bin edges and counts), of completion lengths in tokens."""
  x = np.asarray(list(lengths), np.float64)
  if x.size == 0:
    return {"n": 0}
  mean = float(x.mean())
  top = int(x.max())
  return {
    "n": int(x.size),
    "mean": mean,
    "cv": float(x.std() / mean) if mean else 0.0,
    "p50": float(np.percentile(x, 50)),
    "p90": float(np.percentile(x, 90)),
    "p99": float(np.percentile(x, 99)),
    "max": top,
    "max_over_mean": top / mean if mean else 0.0,
    "histogram": length_histogram(x),
  }


def merge_length_histograms(hists: Iterable[dict]) -> dict:
  """The sum of `length_histogram`s (several seeds' or runs'): their bins share the lower
  edges 0, 8, 16, 32, ...; only the last bin's upper edge (the longest length + 1) differs,
  and the merged one ends at the largest. {"edges": [], "counts": []} for none."""
  counts: dict[int, int] = {}
  top = 0
  for h in hists:
    edges = h["edges"]
    for lo, c in zip(edges[:-1], h["counts"], strict=True):
      counts[lo] = counts.get(lo, 0) + int(c)
    top = max(top, edges[-1])
  if not counts:
    return {"edges": [], "counts": []}
  lows = sorted(counts)
  return {"edges": [*lows, max(top, lows[-1] + 1)], "counts": [counts[lo] for lo in lows]}


def fmt(s: dict, spec: str = "{:.3g}", scale: float = 1.0) -> str:
  """'mean ± se' of a `summarize` result ('-' when empty). A signed `spec` ('{:+.1f}') signs
  the mean only: a standard error has no sign."""
  if s.get("mean") is None:
    return "-"
  m = spec.format(s["mean"] * scale)
  return m if s.get("se") is None else f"{m} ± {spec.replace('+', '').format(s['se'] * scale)}"


def welch_interval(a: SeedStats, b: SeedStats, confidence: float = 0.95) -> tuple[float, float]:
  """Interval for mean(a) - mean(b) from two independent sets of seeds (Welch):

    d = m_a - m_b,  se_d = sqrt(se_a^2 + se_b^2),  d -/+ t_{(1 + c)/2, nu} * se_d
    nu = se_d^4 / (se_a^4 / (n_a - 1) + se_b^4 / (n_b - 1))   (Welch-Satterthwaite)

  Welch rather than a pooled t because sweep points differ in their spread (a diverging
  learning rate scatters its seeds). Both sides with no spread at all (every seed equal):
  the interval is the point d. NaN when either side has fewer than two seeds."""
  d = a.mean - b.mean
  if a.n < 2 or b.n < 2:
    return math.nan, math.nan
  va, vb = a.se**2, b.se**2
  if va + vb == 0.0:
    return d, d
  nu = (va + vb) ** 2 / (va**2 / (a.n - 1) + vb**2 / (b.n - 1))
  half = float(sp_stats.t.ppf(0.5 + confidence / 2, nu)) * math.sqrt(va + vb)
  return d - half, d + half


def wilson(p: float, n: int, z: float = 1.959964) -> tuple[float, float]:
  """Wilson score interval of a proportion p seen over n trials (z: the normal quantile,
  1.96 for 95 %). Unlike p -/+ z s.e. it does not collapse to a point at p = 0 or 1."""
  centre = (p + z * z / (2 * n)) / (1 + z * z / n)
  half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
  return max(0.0, centre - half), min(1.0, centre + half)
