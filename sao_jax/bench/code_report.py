"""The arms, statistics, table and figure of experiments/bench_code.py (coding RL from an SFT
start: SAO, GRPO(N=8) and the continued-SFT control; and the busy pair, SAO scored in the
sandbox against a free exact-match reward): per arm and metric over seeds, the printed table,
pass rate against training seconds."""

from __future__ import annotations

import pathlib

from sao_jax import stats
from sao_jax.bench.figures import seed_curves

ARMS = ("sao", "grpo", "sft_continued")
LABELS = {
  "sao": "SFT -> SAO",
  "grpo": "SFT -> GRPO(N=8)",
  "sft_continued": "SFT -> more SFT (control)",
}
# (key, label, format, percent?) of the per-arm table
ROWS = [
  ("pass_rate", "held-out pass rate (tests passed)", "{:.1f}", True),
  ("solved_rate", "held-out tasks fully solved", "{:.1f}", True),
  ("gain_points", "gain over the SFT start (points)", "{:+.1f}", False),
  ("minus_control_points", "minus the SFT control (points)", "{:+.1f}", False),
  ("steps", "updates", "{:.0f}", False),
  ("trajectories_per_s", "trajectories/s", "{:.1f}", False),
  ("learner_busy", "learner busy fraction", "{:.1f}", True),
  ("reward_s_per_trajectory", "reward s per trajectory", "{:.4f}", False),
  ("sandbox_runs_per_s", "sandbox executions/s", "{:.1f}", False),
]
BUSY_ROWS = [
  ("learner_busy", "learner busy fraction", "{:.1f}", True),
  ("learner_busy_steady", "learner busy, after 10 updates", "{:.1f}", True),
  ("trajectories_per_s", "trajectories/s", "{:.1f}", False),
  ("steps", "updates", "{:.0f}", False),
  ("reward_s_per_trajectory", "reward s per trajectory", "{:.4f}", False),
  ("sandbox_runs_per_s", "sandbox executions/s", "{:.1f}", False),
  ("delay_mean_s", "sampling->training delay (s)", "{:.1f}", False),
  ("pass_rate", "held-out pass rate after", "{:.1f}", True),
]


def summarize(runs: list[dict], arm_names: list[str], busy: bool) -> dict:
  """Per arm and metric: mean, s.e. and 95 % interval over seeds; and for the busy pair the
  per-seed ratio code / free."""
  out = {
    "sft": {
      k: stats.summarize([r["sft"].get(k) for r in runs])
      for k in ("pass_rate", "solved_rate", "steps", "seconds")
    }
  }
  for arm in arm_names:
    out[arm] = {
      k: stats.summarize([r[arm].get(k) for r in runs]) for k, *_ in ROWS + [("seconds",)]
    }
  if busy:
    for arm in ("busy_code", "busy_free"):
      out[arm] = {k: stats.summarize([r[arm].get(k) for r in runs]) for k, *_ in BUSY_ROWS}
    out["busy_ratio_code_over_free"] = {
      k: stats.summarize(
        [r["busy_code"][k] / r["busy_free"][k] if r["busy_free"].get(k) else None for r in runs]
      )
      for k in ("learner_busy", "trajectories_per_s")
    }
  return out


def cell(d: dict, spec: str, pct: bool) -> str:
  return stats.fmt(d, spec, 100.0 if pct else 1.0) + (
    "%" if pct and d.get("mean") is not None else ""
  )


def print_table(r: dict):
  sm = r["summary"]
  arms = [a for a in ARMS if a in sm]
  n = len(r["seeds"])
  print(f"\nCoding RL, {n} seed(s), {r['seconds_per_arm']:.0f} training s per arm, mean ± s.e.")
  print(
    f"SFT start: pass rate {cell(sm['sft']['pass_rate'], '{:.1f}', True)}, fully solved "
    f"{cell(sm['sft']['solved_rate'], '{:.1f}', True)}"
  )
  print(f"{'':36s}" + "".join(f"{LABELS[a]:>28s}" for a in arms))
  for key, label, spec, pct in ROWS:
    print(f"{label:36s}" + "".join(f"{cell(sm[a].get(key, {}), spec, pct):>28s}" for a in arms))
  if "busy_code" in sm:
    print(f"\nDoes the sandbox keep up? SAO, {r['busy_seconds']:.0f} s, no periodic eval")
    print(f"{'':36s}{'code reward (sandbox)':>28s}{'free reward (exact match)':>28s}")
    for key, label, spec, pct in BUSY_ROWS:
      print(
        f"{label:36s}"
        + "".join(f"{cell(sm[a].get(key, {}), spec, pct):>28s}" for a in ("busy_code", "busy_free"))
      )
    q = sm["busy_ratio_code_over_free"]
    print(
      f"code / free: learner busy {stats.fmt(q['learner_busy'], '{:.2f}')}, "
      f"trajectories/s {stats.fmt(q['trajectories_per_s'], '{:.2f}')}"
    )
  la, lb = r["load_average_start"], r["load_average_end"]
  print(
    f"load average (1, 5, 15 min): start {la[0]:.1f} {la[1]:.1f} {la[2]:.1f}, "
    f"end {lb[0]:.1f} {lb[1]:.1f} {lb[2]:.1f}\n"
  )


def plot(r: dict, path: pathlib.Path):
  """Held-out pass rate against training seconds: each seed thin, the mean over seeds bold
  with its standard error as a band (at the mean time of each eval point)."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(6.5, 4.2))
  colors = {"sao": "tab:orange", "grpo": "tab:blue", "sft_continued": "tab:green"}
  for arm in ARMS:
    curves = [run[arm]["eval_curve"] for run in r["runs"] if arm in run]
    seed_curves(ax, curves, colors[arm], LABELS[arm], band=True, marker="o")
  ax.axhline(
    100 * r["summary"]["sft"]["pass_rate"]["mean"], color="gray", ls="--", label="SFT start (mean)"
  )
  ax.set_xlabel("training seconds after the SFT checkpoint")
  ax.set_ylabel("held-out pass rate (% of hidden tests)")
  ax.set_title(
    f"code family, {len(r['runs'])} seed(s), {r['config']['eval']['num_problems']} held-out tasks"
  )
  ax.legend(fontsize=8)
  fig.tight_layout()
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=120)
  plt.close(fig)
