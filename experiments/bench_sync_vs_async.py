"""Synchronous GRPO(N=8) against asynchronous SAO: same model, tasks, rows per update and
machine, side by side in one run, from one shared SFT checkpoint per seed.

  python experiments/bench_sync_vs_async.py                      # 3 seeds x 240 s per arm (~40 min)
  python experiments/bench_sync_vs_async.py --arms sao --seconds 720 --out results/bench_sao_long
                                                   # 3x longer, SAO only
  python experiments/bench_sync_vs_async.py --set sao.pin_cores=True   # pinned cores
  python experiments/bench_sync_vs_async.py --set task.n_ops_mix="(2,3)" --set rl.max_new_tokens=32
                                                   # 2- and 3-op mix: more length variance
  python experiments/bench_sync_vs_async.py --variant tiny --seconds 15 --seeds 1  # smoke test

Both arms update on the same number of rows per step (GRPO: prompts_per_step x 8 rows of
the same prompts; SAO: sao.batch_size single trajectories of as many different tasks) from
the same SFT parameters, for the same training wall-clock (held-out evaluation excluded),
and are evaluated on the same held-out problems. Each seed (`--seeds N`: seeds 0..N-1 of the
model, SFT data order and RL sampling; the tasks are the same) trains its own SFT start and
both arms from it; every figure is reported as mean ± standard error over seeds, with a 95 %
t-interval in the JSON. Writes OUT/results.json (with the command, commit and machine) and
OUT/accuracy_vs_time.png, and prints the table (Traditional | SAO | ratio).
Checkpoints and metrics of the runs go to --workdir.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import shutil
import time

from sao_jax import config as config_lib
from sao_jax import stats
from sao_jax.metrics import MetricsWriter, peak_memory_mb
from sao_jax.provenance import provenance
from sao_jax.runners.grpo import run_grpo
from sao_jax.runners.sao import run_sao
from sao_jax.runners.sft import run_sft
from sao_jax.setup import load_config, make_setup

HERE = pathlib.Path(__file__).resolve().parent
ROWS = [("trajectories_per_s", "trajectories/s", "{:.1f}"),
        ("learner_steps_per_s", "learner steps/s", "{:.2f}"),
        ("tokens_per_s", "generated tokens/s", "{:.0f}"),
        ("learner_busy", "learner busy fraction", "{:.1%}"),
        ("delay_mean_s", "sampling->training delay mean (s)", "{:.2f}"),
        ("delay_p95_s", "sampling->training delay p95 (s)", "{:.2f}"),
        ("peak_rss_all_mb", "peak memory, all processes (MiB)", "{:.0f}"),
        ("accuracy", "final held-out accuracy", "{:.1%}"),
        ("time_to_target_s", "training s to GRPO's final accuracy", "{:.0f}")]


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--config", default=str(HERE / "configs" / "sao_arith.py"))
  p.add_argument("--variant", default="default")
  p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
  p.add_argument("--seconds", type=float, default=240.0, help="RL training seconds per arm")
  p.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 (default 3)")
  p.add_argument("--eval-every", type=float, default=None)
  p.add_argument("--out", default="results/bench_sync_vs_async",
                 help="results.json and the plot (small: committed)")
  p.add_argument("--workdir", default="runs/bench_sync_vs_async",
                 help="checkpoints and metrics of every run (large)")
  p.add_argument("--arms", default="grpo,sao", help="comma-separated subset of grpo,sao")
  p.add_argument("--no-progress", action="store_true")
  args = p.parse_args(argv)
  arm_names = args.arms.split(",")
  if not arm_names or set(arm_names) - {"grpo", "sao"}:
    raise SystemExit(f"--arms takes grpo and/or sao, got {args.arms!r}")
  if args.seeds < 1:
    raise SystemExit("--seeds must be >= 1")

  base = load_config(args.config, args.variant, args.set)
  base = dataclasses.replace(base, rl=dataclasses.replace(base.rl, steps=0,
                                                          max_seconds=args.seconds), log_every=1)
  out, work = pathlib.Path(args.out), pathlib.Path(args.workdir)
  for d in (out, work):
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
  eval_every = args.eval_every or args.seconds / 6
  t0 = time.time()
  runs = []
  for seed in range(args.seeds):
    cfg = dataclasses.replace(base, seed=seed)
    runs.append(_one_seed(cfg, arm_names, work / f"seed{seed}", eval_every, args.no_progress))
  results = {"provenance": provenance(), "config": config_lib.to_dict(base),
             "seeds": args.seeds, "seconds_per_arm": args.seconds, "runs": runs,
             "summary": _summary(runs, arm_names), "wall_s": time.time() - t0,
             "bench_peak_memory_mb": peak_memory_mb()}
  (out / "results.json").write_text(json.dumps(results, indent=2))
  print_table(results)
  plot(results, out / "accuracy_vs_time.png")
  print(f"results: {out}/results.json")
  return results


def _one_seed(cfg, arm_names, work: pathlib.Path, eval_every: float, no_progress: bool) -> dict:
  s_sao = make_setup(cfg)
  s_grpo = dataclasses.replace(s_sao, cfg=dataclasses.replace(
      cfg, rl=dataclasses.replace(cfg.rl, algorithm="grpo")))

  def writer(name):
    return MetricsWriter(work / name, show_progress=not no_progress)

  w = writer("sft")
  sft_state, _, sft = run_sft(s_sao, w, None, work / "sft")
  w.close()
  print(f"seed {cfg.seed}: SFT {sft['steps']} steps, held-out accuracy {sft['accuracy']:.3f}",
        flush=True)
  arms = {}
  for name, fn, s in (("grpo", run_grpo, s_grpo), ("sao", run_sao, s_sao)):
    if name not in arm_names:
      continue
    w = writer(name)
    _, _, info = fn(s, w, sft_state, work / name, eval_every=eval_every)
    w.close()
    info["learner_steps_per_s"] = info["steps"] / info["seconds"]
    arms[name] = info
    print(f"seed {cfg.seed}: {name} {info['steps']} steps, held-out accuracy "
          f"{info['accuracy']:.3f}", flush=True)
  if "grpo" in arms:  # wall-clock to the synchronous arm's final accuracy, for both arms
    target = arms["grpo"]["accuracy"]
    for info in arms.values():
      info["time_to_target_s"] = _time_to(info["eval_curve"], target)
  return {"seed": cfg.seed, "sft": sft, **arms}


def _summary(runs: list[dict], arm_names: list[str]) -> dict:
  """Per arm and metric, and per SAO/GRPO ratio: mean, s.e. and 95 % interval over seeds."""
  keys = [k for k, _, _ in ROWS]
  out = {"sft_accuracy": stats.summarize([r["sft"]["accuracy"] for r in runs])}
  for arm in arm_names:
    out[arm] = {k: stats.summarize([r[arm].get(k) for r in runs]) for k in keys}
  if len(arm_names) == 2:
    out["ratio"] = {k: stats.summarize([
        r["sao"][k] / r["grpo"][k] if r["sao"].get(k) is not None and r["grpo"].get(k) else None
        for r in runs]) for k in keys}
  return out


def _time_to(curve, target):
  """First training second at which a held-out eval reached `target` (None: never)."""
  return next((t for t, _, acc in curve if acc >= target - 1e-9), None)


def print_table(r: dict):
  sm = r["summary"]
  g, a, q = sm.get("grpo", {}), sm.get("sao", {}), sm.get("ratio", {})
  print(f"\n{r['seeds']} seeds, mean ± s.e.")
  print(f"{'':38s} {'Traditional (GRPO N=8)':>24s} {'SAO':>20s} {'SAO/GRPO':>16s}")
  for key, label, spec in ROWS:
    pct = "%" in spec
    spec = spec.replace("%", "f") if pct else spec
    scale = 100.0 if pct else 1.0
    cells = [stats.fmt(d.get(key, {}), spec, scale) + ("%" if pct and d.get(key) else "")
             for d in (g, a)]
    ratio = stats.fmt(q.get(key, {}), "{:.2f}") + ("x" if q.get(key, {}).get("mean") else "")
    print(f"{label:38s} {cells[0]:>24s} {cells[1]:>20s} {ratio:>16s}")
  print(f"held-out accuracy of the SFT start: {stats.fmt(sm['sft_accuracy'], '{:.3f}')}\n")


def plot(r: dict, path: pathlib.Path):
  """Held-out accuracy against training seconds: each seed thin, the mean over seeds bold."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import numpy as np
  fig, ax = plt.subplots(figsize=(6, 4))
  colors = {"grpo": "tab:blue", "sao": "tab:orange"}
  for key, label in (("grpo", "GRPO(N=8), synchronous"), ("sao", "SAO, asynchronous")):
    curves = [run[key]["eval_curve"] for run in r["runs"] if key in run]
    if not curves:
      continue
    for c in curves:
      ax.plot([x[0] for x in c], [100 * x[2] for x in c], color=colors[key], alpha=0.3, lw=1)
    n = min(len(c) for c in curves)
    t = np.mean([[x[0] for x in c[:n]] for c in curves], axis=0)
    acc = np.mean([[100 * x[2] for x in c[:n]] for c in curves], axis=0)
    ax.plot(t, acc, color=colors[key], marker="o", lw=2, label=f"{label} (mean of {len(curves)})")
  ax.set_xlabel("training seconds after the SFT checkpoint")
  ax.set_ylabel("held-out greedy accuracy (%)")
  ax.axhline(100 * r["summary"]["sft_accuracy"]["mean"], color="gray", ls="--",
             label="SFT start (mean)")
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


if __name__ == "__main__":
  main()
