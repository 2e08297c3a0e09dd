"""The arms, statistics, table and figure of experiments/bench_sync_vs_async.py: per arm and
metric over seeds; the synchronous baseline SAO is compared with (the faster GRPO arm), each
arm's time to the baseline's final accuracy (interpolated between evaluations, censored at
the budget) and SAO's per-seed ratios with their bootstrap intervals."""

from __future__ import annotations

import pathlib

import numpy as np

from sao_jax import stats
from sao_jax.bench.figures import seed_curves

ARMS = {"grpo": ("grpo", "inline"), "grpo_samplers": ("grpo", "samplers"), "sao": ("sao", "inline")}
SYNC_ARMS = ("grpo", "grpo_samplers")
ARM_LABELS = {"grpo": "GRPO(N=8), in learner", "grpo_samplers": "GRPO(N=8), samplers", "sao": "SAO"}
ROWS = [
  ("trajectories_per_s", "trajectories/s", "{:.1f}"),
  ("learner_steps_per_s", "learner steps/s", "{:.2f}"),
  ("seconds_per_step", "step latency (s per learner step)", "{:.2f}"),
  ("tokens_per_s", "generated tokens/s", "{:.0f}"),
  ("learner_busy", "learner busy fraction", "{:.1%}"),
  ("delay_mean_s", "sampling->training delay mean (s)", "{:.2f}"),
  ("delay_p95_s", "sampling->training delay p95 (s)", "{:.2f}"),
  ("peak_tree_pss_mb", "peak memory, arm's process tree (PSS MiB)", "{:.0f}"),
  ("length_mean", "completion tokens per trajectory, mean", "{:.1f}"),
  ("length_p90", "completion tokens per trajectory, p90", "{:.0f}"),
  ("length_cv", "completion tokens per trajectory, CV", "{:.2f}"),
  ("accuracy", "final held-out accuracy", "{:.1%}"),
  ("time_to_target_s", "training s to the baseline's final accuracy", "{:.0f}"),
]
# Ratios summarised over seeds (SAO / baseline); the others are in the JSON per arm.
RATIO_KEYS = [k for k, _, _ in ROWS if not k.startswith("length_")]


def best_baseline(runs: list[dict], arm_names: list[str]) -> dict | None:
  """The synchronous arm SAO is compared with: of the GRPO arms that ran, the one with the
  most learner steps/s, mean over seeds."""
  speeds = {
    a: float(np.mean([r[a]["learner_steps_per_s"] for r in runs]))
    for a in SYNC_ARMS
    if a in arm_names
  }
  if not speeds:
    return None
  arm = max(speeds, key=speeds.get)
  return {"arm": arm, "by": "learner_steps_per_s, mean over seeds", "values": speeds}


def time_to(curve, target: float) -> float | None:
  """Training seconds at which the accuracy curve [(seconds, step, accuracy), ...] first
  reaches `target`, interpolated linearly between the evaluations before and at it (the
  first evaluation's own time when it is already there); None when it never does."""
  prev = None
  for t, _, acc in curve:
    if acc >= target - 1e-9:
      if prev is None or prev[1] >= target:
        return float(t)
      t0, a0 = prev
      return float(t0 + (target - a0) / (acc - a0) * (t - t0))
    prev = (t, acc)
  return None


def with_times(runs: list[dict], arm_names: list[str], base: str) -> None:
  """Each arm's time to the baseline's final accuracy of its seed (censored: the budget)."""
  for r in runs:
    target = r[base]["accuracy"]
    r["target_accuracy"] = target
    for a in arm_names:
      t = time_to(r[a]["eval_curve"], target)
      r[a]["time_to_target_s"] = t
      r[a]["reached_target"] = t is not None


def seed_ratio(r: dict, num: str, den: str, k: str) -> tuple[float | None, int]:
  """One seed's num/den of metric `k`, and how many of the two were censored (time to
  target: an arm that did not reach it counts with its budget, a lower bound on its time)."""
  a, b, censored = r[num].get(k), r[den].get(k), 0
  if k == "time_to_target_s":
    censored = (a is None) + (b is None)
    a = r[num]["seconds"] if a is None else a
    b = r[den]["seconds"] if b is None else b
  return (a / b if a is not None and b else None), censored


def ratios_over_seeds(runs: list[dict], num: str, den: str) -> dict:
  """Per-seed num/den of every RATIO_KEYS metric: mean, s.e., t-interval and bootstrap
  interval over seeds; for the time to target, the seeds `censored` (see `seed_ratio`)."""
  out: dict = {"numerator": num, "denominator": den}
  for k in RATIO_KEYS:
    pairs = [seed_ratio(r, num, den, k) for r in runs]
    values = [v for v, _ in pairs]
    s = stats.summarize(values)
    s["bootstrap95"] = stats.bootstrap_ci([v for v in values if v is not None])
    if k == "time_to_target_s":
      s["censored"] = sum(c for _, c in pairs)
    out[k] = s
  return out


def summarize(runs: list[dict], arm_names: list[str]) -> dict:
  """Per arm and metric over seeds; the baseline and SAO's ratios to it and to each GRPO arm."""
  out: dict = {"sft_accuracy": stats.summarize([r["sft"]["accuracy"] for r in runs])}
  base = best_baseline(runs, arm_names)
  if base:
    with_times(runs, arm_names, base["arm"])
    out["baseline"] = base
  for arm in arm_names:
    out[arm] = {k: stats.summarize([r[arm].get(k) for r in runs]) for k, _, _ in ROWS}
    hists = [r[arm]["length_hist"] for r in runs if "length_hist" in r[arm]]
    if hists:  # completions of every seed, pooled
      out[arm]["length_hist"] = stats.merge_length_histograms(hists)
  if base and "sao" in arm_names:
    out["ratio"] = ratios_over_seeds(runs, "sao", base["arm"])
    for r in runs:  # each seed's ratios too: the unit a declared analysis reads
      r["vs_baseline"] = {
        "arm": base["arm"],
        **{k: seed_ratio(r, "sao", base["arm"], k)[0] for k in RATIO_KEYS},
      }
    for a in SYNC_ARMS:
      if a in arm_names:
        out[f"ratio_vs_{a}"] = ratios_over_seeds(runs, "sao", a)
  return out


def print_table(r: dict):
  sm = r["summary"]
  arms = [a for a in ARMS if a in sm]
  print(f"\n{r['seeds']} seeds, mean ± s.e.; SAO/baseline: mean [95 % bootstrap interval]")
  head = [ARM_LABELS[a] for a in arms] + ([f"SAO/{sm['baseline']['arm']}"] if "ratio" in sm else [])
  print(f"{'':44s}" + "".join(f"{h:>24s}" for h in head))
  for key, label, spec in ROWS:
    pct = "%" in spec
    spec = spec.replace("%", "f") if pct else spec
    scale = 100.0 if pct else 1.0
    cells = [
      stats.fmt(sm[a].get(key, {}), spec, scale) + ("%" if pct and sm[a].get(key) else "")
      for a in arms
    ]
    if "ratio" in sm:
      q = sm["ratio"].get(key, {})
      ci = q.get("bootstrap95")
      cells.append(
        "-"
        if q.get("mean") is None
        else f"{q['mean']:.2f}x" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")
      )
    print(f"{label:44s}" + "".join(f"{c:>24s}" for c in cells))
  print(f"held-out accuracy of the SFT start: {stats.fmt(sm['sft_accuracy'], '{:.3f}')}")
  if "baseline" in sm:
    b = sm["baseline"]
    speeds = ", ".join(f"{a} {v:.3f}" for a, v in b["values"].items())
    print(f"baseline: {b['arm']} (learner steps/s: {speeds})\n")


def plot(r: dict, path: pathlib.Path):
  """Held-out accuracy against training seconds: each seed thin, the mean over seeds bold."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(6, 4))
  colors = {"grpo": "tab:blue", "grpo_samplers": "tab:green", "sao": "tab:orange"}
  for key, label in ARM_LABELS.items():
    curves = [run[key]["eval_curve"] for run in r["runs"] if key in run]
    seed_curves(ax, curves, colors[key], label)
  ax.set_xlabel("training seconds after the SFT checkpoint")
  ax.set_ylabel("held-out greedy accuracy (%)")
  ax.axhline(
    100 * r["summary"]["sft_accuracy"]["mean"], color="gray", ls="--", label="SFT start (mean)"
  )
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
