"""What the benchmarks' figures share: curves over seeds, each seed thin and their mean bold."""

from __future__ import annotations

import numpy as np


def seed_curves(
  ax,
  curves: list[list],
  color: str,
  label: str,
  *,
  x: int = 0,
  y: int = 2,
  band: bool = False,
  **mean_kw,
) -> None:
  """Draws on `ax` each seed's curve thin and the mean over seeds bold (labelled "`label`
  (mean of n)"); a curve is a list of points, `x` and `y` index a point's coordinates
  (default: an eval curve's (seconds, step, accuracy)), accuracies drawn in %. The mean is
  taken point by point over the first points every seed has (evaluations on a common grid);
  with `band`, its standard error over seeds as a shaded band. `mean_kw` styles the mean
  (e.g. marker="o")."""
  if not curves:
    return
  for c in curves:
    ax.plot([p[x] for p in c], [100 * p[y] for p in c], color=color, alpha=0.3, lw=1)
  n = min(len(c) for c in curves)
  xs = np.mean([[p[x] for p in c[:n]] for c in curves], axis=0)
  ys = np.asarray([[100 * p[y] for p in c[:n]] for c in curves])
  mean = ys.mean(axis=0)
  ax.plot(xs, mean, color=color, lw=2, label=f"{label} (mean of {len(curves)})", **mean_kw)
  if band and len(curves) > 1:
    se = ys.std(axis=0, ddof=1) / np.sqrt(len(curves))
    ax.fill_between(xs, mean - se, mean + se, color=color, alpha=0.15)
