"""The plot a claim's notebook shows: per analysis, each unit's value (a seed's, coloured by
host), the estimate with its interval or bound, and the goal line."""

from __future__ import annotations

import math

from sao_jax.analysis.render import Evaluated


def plot_claim(ev: Evaluated, columns: int = 3):
  """One small panel per analysis that has values; returns the matplotlib figure (None when
  no analysis has data)."""
  import matplotlib.pyplot as plt

  by_analysis: dict[str, list] = {}
  for r in ev.rows:
    if r.estimate.values:
      by_analysis.setdefault(r.analysis.id, []).append(r)
  if not by_analysis:
    return None
  n = len(by_analysis)
  cols = min(columns, n)
  fig, axes = plt.subplots(
    math.ceil(n / cols), cols, figsize=(4.2 * cols, 3.2 * math.ceil(n / cols)), squeeze=False
  )
  for ax, rows in zip(axes.flat, by_analysis.values(), strict=False):
    a = rows[0].analysis
    s = a.format.scale
    for i, r in enumerate(rows):
      e = r.estimate
      ax.scatter([i] * len(e.values), [v * s for v in e.values], s=18, alpha=0.7)
      if e.estimate is not None:
        lo = e.ci_low if e.ci_low is not None else e.estimate
        hi = e.bound if e.bound is not None else e.ci_high if e.ci_high is not None else e.estimate
        ax.errorbar(
          [i + 0.15],
          [e.estimate * s],
          yerr=[[(e.estimate - lo) * s], [(hi - e.estimate) * s]],
          fmt="D",
          color="black",
          capsize=3,
        )
    if a.goal is not None:
      ax.axhline(a.goal.value * s, color="tab:red", ls="--", lw=1, label=f"goal {a.goal.op}")
      ax.legend(fontsize=7, loc="best")
    ax.set_xticks(
      range(len(rows)),
      [("expl. " if r.exploratory else "") + r.host.split(" (")[0][:18] for r in rows],
      fontsize=7,
      rotation=15,
    )
    ax.set_title(a.id + (" (primary)" if a.primary else ""), fontsize=9)
    ax.set_ylabel(a.format.suffix.strip() or "value", fontsize=8)
  for ax in list(axes.flat)[n:]:
    ax.axis("off")
  fig.suptitle(f"({ev.claim.key}) {ev.claim.title}: each dot a seed, diamond the estimate")
  fig.tight_layout()
  return fig
