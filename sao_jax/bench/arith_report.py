"""The arms, statistics, plateau criterion, table and figure of experiments/sft_grpo_arith.py
(GRPO(N=8) against continued SFT from one SFT checkpoint, on arithmetic): per arm and metric
over seeds, SFT's last-third gain and whether it plateaued, the printed table, accuracy
against training seconds."""

from __future__ import annotations

import math
import pathlib
import sys

import numpy as np

from sao_jax import stats
from sao_jax.bench.figures import seed_curves

ARMS = ("sft", "grpo", "sft_continued")
LABELS = {
  "sft": "SFT checkpoint",
  "grpo": "+ GRPO(N=8)",
  "sft_continued": "+ SFT continued (control)",
}
# summarised per arm over seeds (gain_points: not for the SFT start itself; easy_*: no-demos)
KEYS = (
  "accuracy",
  "gain_points",
  "minus_control_points",
  "easy_accuracy",
  "easy_gain_points",
  "easy_minus_control_points",
  "steps",
  "seconds",
)
PLATEAU_MAX_GAIN = 3.0  # points: below the RL gains this setting is there to measure
PLATEAU_CRITERION = (
  "plateaued when SFT's last-third gain (the rise, in points, of the least-squares line "
  "through the last third of its held-out evaluations over their step span) averages below "
  f"{PLATEAU_MAX_GAIN:g} points over seeds and its 95 % t-interval over seeds contains 0"
)


def plateau_gain(curve: list, num_problems: int, fraction: float = 1 / 3) -> dict:
  """SFT's held-out accuracy gain over the last `fraction` of its evaluations, in points.

  curve: (train seconds, step, accuracy) per evaluation. With (x_i, y_i) the last
  n = max(2, ceil(fraction * evaluations)) of them (step, 100 * accuracy), the gain is the
  rise of their least-squares line over its span: slope * (x_n - x_1). eval_se_points is one
  evaluation's binomial standard error at the final accuracy, 100 * sqrt(p (1 - p) / m) for
  m test problems: the noise of a single point, for scale.
  """
  by_step = {int(step): float(acc) for _, step, acc in curve}  # a step evaluated twice: last
  steps = sorted(by_step)
  if len(steps) < 2:
    raise ValueError(f"a plateau measure needs >= 2 evaluations, got {len(steps)}")
  x = np.asarray(steps[-max(2, math.ceil(fraction * len(steps))) :], np.float64)
  y = np.asarray([100 * by_step[int(s)] for s in x])
  slope = float(np.polyfit(x, y, 1)[0])
  p = by_step[steps[-1]]
  return {
    "gain_points": slope * float(x[-1] - x[0]),
    "from_step": int(x[0]),
    "to_step": int(x[-1]),
    "evaluations": len(x),
    "eval_se_points": 100 * math.sqrt(p * (1 - p) / num_problems),
  }


def plateau_summary(runs: list[dict]) -> dict:
  """The last-third gain over seeds and whether SFT plateaued by PLATEAU_CRITERION (an
  interval that contains 0 alone is not enough: with 3 seeds a steady rise of 15 points can
  be within noise of 0)."""
  g = stats.summarize([r["sft"]["plateau"]["gain_points"] for r in runs])
  within = None if g["ci95"] is None else bool(g["ci95"][0] <= 0.0 <= g["ci95"][1])
  plateaued = None if within is None else bool(within and g["mean"] < PLATEAU_MAX_GAIN)
  return {
    "last_third_gain_points": g,
    "within_noise": within,
    "plateaued": plateaued,
    "criterion": PLATEAU_CRITERION,
  }


def summary(runs: list[dict]) -> dict:
  """Per arm and metric: mean, s.e. and 95 % t-interval over seeds (`stats.summarize`)."""
  return {
    arm: {k: stats.summarize([r[arm][k] for r in runs]) for k in KEYS if k in runs[0][arm]}
    for arm in ARMS
  }


def print_table(r: dict):
  sm, n = r["summary"], len(r["seeds"])
  easy = "easy_accuracy" in sm["sft"]
  print(f"\n{n} seed(s), mean ± s.e. over seeds (held-out accuracy in %)")
  if easy:
    nd = r.get("no_demos", {})
    print(
      f"held-out: the RL tasks' test split ({nd.get('hard_test_problems')} problems); easy: "
      f"the SFT tasks' ({nd.get('easy_test_problems')} problems)"
    )
  print(
    f"{'arm':28s} {'steps':>14s} {'train s':>14s} {'held-out acc':>16s} {'gain (points)':>16s}"
    + (f" {'easy acc':>16s}" if easy else "")
  )
  for arm in ARMS:
    a = sm[arm]
    print(
      f"{LABELS[arm]:28s} {stats.fmt(a['steps'], '{:.0f}'):>14s} "
      f"{stats.fmt(a['seconds'], '{:.0f}'):>14s} "
      f"{stats.fmt(a['accuracy'], '{:.1f}', 100):>16s} "
      f"{stats.fmt(a.get('gain_points', {}), '{:.1f}'):>16s}"
      + (f" {stats.fmt(a['easy_accuracy'], '{:.1f}', 100):>16s}" if easy else "")
    )
  d = sm["grpo"]["minus_control_points"]
  ci = d["ci95"]
  print(
    f"GRPO - control: {stats.fmt(d, '{:.1f}')} points"
    + (f" (95 % CI {ci[0]:+.1f} .. {ci[1]:+.1f})" if ci else "")
    + f", n={r['num_test_problems']} test problems per seed"
  )
  pl = r.get("plateau")
  if pl:
    g = pl["last_third_gain_points"]
    verdict = {True: "plateaued", False: "still changing", None: "undefined with one seed"}
    print(
      f"SFT last-third gain: {stats.fmt(g, '{:+.1f}')} points"
      + (f" (95 % CI {g['ci95'][0]:+.1f} .. {g['ci95'][1]:+.1f})" if g["ci95"] else "")
      + f": {verdict[pl['plateaued']]} (criterion: {pl['criterion']})"
    )
  print()


def plot(r: dict, path: pathlib.Path):
  """Held-out accuracy against training seconds: each seed thin, the mean over seeds bold;
  with a plateau run, SFT's own curve (accuracy against steps) on the left."""
  try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    print("matplotlib not installed: no plot", file=sys.stderr)
    return

  plateau = r.get("plateau")
  fig, axes = plt.subplots(1, 2 if plateau else 1, figsize=(11 if plateau else 6, 4))
  ax = axes[-1] if plateau else axes
  colors = {"grpo": "tab:orange", "sft_continued": "tab:blue"}
  for name, key in (("GRPO(N=8)", "grpo"), ("SFT continued", "sft_continued")):
    curves = [run[key]["eval_curve"] for run in r["runs"]]
    seed_curves(ax, curves, colors[key], name, marker="o")
  ax.axhline(
    100 * r["summary"]["sft"]["accuracy"]["mean"], color="gray", ls="--", label="SFT (mean)"
  )
  ax.set_xlabel("training seconds after the SFT checkpoint")
  hard = " (hard problems)" if r.get("no_demos") else ""
  ax.set_ylabel(f"held-out greedy accuracy{hard} (%)")
  ax.set_title(f"arithmetic, n={r['num_test_problems']} test problems, {len(r['seeds'])} seeds")
  ax.legend()
  if plateau:
    ax0 = axes[0]
    for run in r["runs"]:
      c, pl = run["sft"]["eval_curve"], run["sft"]["plateau"]
      ax0.plot([x[1] for x in c], [100 * x[2] for x in c], marker=".", label=f"seed {run['seed']}")
    ax0.axvspan(pl["from_step"], pl["to_step"], color="gray", alpha=0.15, label="last third")
    ax0.set(xlabel="SFT step", ylabel="held-out greedy accuracy (%)", title="SFT to its plateau")
    ax0.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
