"""SFT -> GRPO(N=8) on arithmetic word problems, against the control that matters: simply
continuing SFT for the same training wall-clock.

  python experiments/sft_grpo_arith.py                      # 3 seeds, ~30 min on 2 CPU cores
  python experiments/sft_grpo_arith.py --variant tiny --seeds 2   # seconds, a smoke test
  python experiments/sft_grpo_arith.py --set rl.max_seconds=300 --out results/arith_300s

Each seed (`--seeds N`: seeds 0..N-1 of the model, SFT data order and RL sampling; the tasks
are the same) trains its own SFT checkpoint, then GRPO from it and the control from it. Each
figure is reported as mean ± standard error over seeds, with a 95 % t-interval in the JSON
(`sao_jax.stats.summarize`). Writes OUT/results.json (per-seed runs, the summary over seeds,
command, commit and machine), OUT/curves.png and OUT/seed<k>/{sft,grpo,sft_continued}/
metrics.jsonl; prints a table. Held-out accuracy is greedy exact-match on the first
`eval.num_problems` test problems, disjoint from training.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import shutil
import sys
import time

from sao_jax import config as config_lib
from sao_jax import stats
from sao_jax.metrics import MetricsWriter, peak_memory_mb
from sao_jax.provenance import provenance
from sao_jax.runners.grpo import run_grpo
from sao_jax.runners.sft import run_sft
from sao_jax.setup import make_setup

HERE = pathlib.Path(__file__).resolve().parent
ARMS = ("sft", "grpo", "sft_continued")
LABELS = {
  "sft": "SFT checkpoint",
  "grpo": "+ GRPO(N=8)",
  "sft_continued": "+ SFT continued (control)",
}
# summarised per arm over seeds (gain_points: not for the SFT start itself)
KEYS = ("accuracy", "gain_points", "minus_control_points", "steps", "seconds")


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--config", default=str(HERE / "configs" / "arith_grpo.py"))
  p.add_argument("--variant", default="default")
  p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
  p.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 (default 3)")
  p.add_argument("--out", default="results/sft_grpo_arith")
  p.add_argument(
    "--eval-every",
    type=float,
    default=None,
    help="held-out eval every N training seconds (default: rl.max_seconds / 8)",
  )
  p.add_argument("--no-progress", action="store_true")
  args = p.parse_args(argv)
  if args.seeds < 1:
    raise SystemExit("--seeds must be >= 1")

  cfg = config_lib.load_config(args.config, args.variant, args.set)
  if not cfg.sft.steps or not (cfg.rl.max_seconds or cfg.rl.steps):
    raise SystemExit("the experiment needs sft.steps > 0 and an RL budget")
  out = pathlib.Path(args.out)
  if out.exists():
    shutil.rmtree(out)
  out.mkdir(parents=True)
  (out / "config.json").write_text(config_lib.to_json(cfg))
  t_start = time.time()
  eval_every = args.eval_every
  if eval_every is None:
    eval_every = (cfg.rl.max_seconds or 60.0) / 8
  runs = [
    _one_seed(dataclasses.replace(cfg, seed=seed), out / f"seed{seed}", eval_every, args)
    for seed in range(args.seeds)
  ]
  results = {
    "provenance": provenance(),
    "config": config_lib.to_dict(cfg),
    "seeds": [r["seed"] for r in runs],
    "num_test_problems": runs[0]["sft"]["num_problems"],
    "runs": runs,
    "summary": summary(runs),
    "wall_s": time.time() - t_start,
    "peak_memory_mb": peak_memory_mb(),
  }
  (out / "results.json").write_text(json.dumps(results, indent=2))
  print_table(results)
  plot(results, out / "curves.png")
  print(f"results: {out}/results.json, {out}/curves.png")
  return results


def _one_seed(cfg: config_lib.Config, work: pathlib.Path, eval_every: float, args) -> dict:
  """SFT, then GRPO and the continued-SFT control from the same SFT checkpoint."""
  s = make_setup(cfg)

  def writer(name):
    return MetricsWriter(work / name, show_progress=not args.no_progress)

  w = writer("sft")
  sft_state, _, sft = run_sft(s, w, None, work / "sft")
  w.close()
  print(
    f"seed {cfg.seed}: SFT {sft['steps']} steps, {sft['seconds']:.0f} s, held-out accuracy "
    f"{sft['accuracy']:.3f}",
    flush=True,
  )

  w = writer("grpo")
  _, _, grpo = run_grpo(s, w, sft_state, work / "grpo", eval_every=eval_every)
  w.close()
  print(
    f"seed {cfg.seed}: GRPO {grpo['steps']} steps, {grpo['seconds']:.0f} s, held-out accuracy "
    f"{grpo['accuracy']:.3f}",
    flush=True,
  )

  # Control: the same training seconds spent on more SFT (optimizer state carried over).
  w = writer("sft_continued")
  _, _, ctrl = run_sft(
    s,
    w,
    sft_state,
    work / "sft_continued",
    steps=0,
    max_seconds=grpo["seconds"],
    tag="sft_continued",
    eval_every=eval_every,
    keep_opt_state=True,
  )
  w.close()
  print(
    f"seed {cfg.seed}: SFT continued {ctrl['steps']} steps, {ctrl['seconds']:.0f} s, held-out "
    f"accuracy {ctrl['accuracy']:.3f}",
    flush=True,
  )
  for arm in (grpo, ctrl):
    arm["gain_points"] = 100 * (arm["accuracy"] - sft["accuracy"])
  grpo["minus_control_points"] = 100 * (grpo["accuracy"] - ctrl["accuracy"])
  return {"seed": cfg.seed, "sft": sft, "grpo": grpo, "sft_continued": ctrl}


def summary(runs: list[dict]) -> dict:
  """Per arm and metric: mean, s.e. and 95 % t-interval over seeds (`stats.summarize`)."""
  return {
    arm: {k: stats.summarize([r[arm][k] for r in runs]) for k in KEYS if k in runs[0][arm]}
    for arm in ARMS
  }


def print_table(r: dict):
  sm, n = r["summary"], len(r["seeds"])
  print(f"\n{n} seed(s), mean ± s.e. over seeds (held-out accuracy in %)")
  print(f"{'arm':28s} {'steps':>14s} {'train s':>14s} {'held-out acc':>16s} {'gain (points)':>16s}")
  for arm in ARMS:
    a = sm[arm]
    print(
      f"{LABELS[arm]:28s} {stats.fmt(a['steps'], '{:.0f}'):>14s} "
      f"{stats.fmt(a['seconds'], '{:.0f}'):>14s} "
      f"{stats.fmt(a['accuracy'], '{:.1f}', 100):>16s} "
      f"{stats.fmt(a.get('gain_points', {}), '{:.1f}'):>16s}"
    )
  d = sm["grpo"]["minus_control_points"]
  ci = d["ci95"]
  print(
    f"GRPO - control: {stats.fmt(d, '{:.1f}')} points"
    + (f" (95 % CI {ci[0]:+.1f} .. {ci[1]:+.1f})" if ci else "")
    + f", n={r['num_test_problems']} test problems per seed\n"
  )


def plot(r: dict, path: pathlib.Path):
  """Held-out accuracy against training seconds: each seed thin, the mean over seeds bold."""
  try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    print("matplotlib not installed: no plot", file=sys.stderr)
    return
  import numpy as np

  fig, ax = plt.subplots(figsize=(6, 4))
  colors = {"grpo": "tab:orange", "sft_continued": "tab:blue"}
  for name, key in (("GRPO(N=8)", "grpo"), ("SFT continued", "sft_continued")):
    curves = [run[key]["eval_curve"] for run in r["runs"]]
    for c in curves:
      ax.plot([x[0] for x in c], [100 * x[2] for x in c], color=colors[key], alpha=0.3, lw=1)
    k = min(len(c) for c in curves)
    t = np.mean([[x[0] for x in c[:k]] for c in curves], axis=0)
    acc = np.mean([[100 * x[2] for x in c[:k]] for c in curves], axis=0)
    ax.plot(t, acc, color=colors[key], marker="o", lw=2, label=f"{name} (mean of {len(curves)})")
  ax.axhline(
    100 * r["summary"]["sft"]["accuracy"]["mean"], color="gray", ls="--", label="SFT (mean)"
  )
  ax.set_xlabel("training seconds after the SFT checkpoint")
  ax.set_ylabel("held-out greedy accuracy (%)")
  ax.set_title(f"arithmetic, n={r['num_test_problems']} test problems, {len(r['seeds'])} seeds")
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


if __name__ == "__main__":
  main()
