"""Synchronous GRPO(N=8) against asynchronous SAO: same model, tasks, rows per update and
machine, side by side in one run, from one shared SFT checkpoint per seed.

  python experiments/bench_sync_vs_async.py                      # 3 seeds x 240 s per arm
  python experiments/bench_sync_vs_async.py --arms sao --seconds 720 --out results/bench_sao_long
                                                   # 3x longer, SAO only
  python experiments/bench_sync_vs_async.py --config experiments/configs/sao_longtail.py \
      --arms grpo,grpo_samplers,sao --set sao.pin_cores=True --out results/bench_longtail_pinned
                                                   # long-tailed lengths, roles on own cores
  python experiments/bench_sync_vs_async.py --variant tiny --seconds 15 --seeds 1  # smoke test

Arms: `grpo` samples in the learner process (sample, score, update, repeat); `grpo_samplers`
is the same synchronous GRPO through the SAO sampler processes, transport and core pinning
(staleness 0: the learner waits for samples, the samplers for the new version), so that
only the algorithm differs from `sao`. Every arm updates on the same number of rows per step
(GRPO: prompts_per_step x 8 rows of the same prompts; SAO: sao.batch_size single
trajectories of as many different tasks) from the same SFT parameters, for the same training
wall-clock (held-out evaluation excluded), and is evaluated on the same held-out problems.
Each seed (`--seeds N`: seeds 0..N-1 of the model, SFT data order and RL sampling; the tasks
are the same) trains its own SFT start and every arm from it; each figure is reported as
mean ± standard error over seeds, with a 95 % t-interval in the JSON, and SAO's ratio to the
synchronous arm (through the samplers when it ran). Writes OUT/results.json (with the
command, commit, machine and load) and OUT/accuracy_vs_time.png, and prints the table.
Checkpoints and metrics of the runs go to --workdir.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import shutil
import time

from sao_jax import stats
from sao_jax.metrics import MetricsWriter, peak_memory_mb
from sao_jax.results_file import ResultFile
from sao_jax.runners.grpo import run_grpo, run_grpo_samplers
from sao_jax.runners.sao import run_sao
from sao_jax.runners.sft import run_sft
from sao_jax.setup import load_config, make_setup

HERE = pathlib.Path(__file__).resolve().parent
# arm -> (phase, rl.algorithm, rl.sampling)
ARMS = {
  "grpo": (run_grpo, "grpo", "inline"),
  "grpo_samplers": (run_grpo_samplers, "grpo", "samplers"),
  "sao": (run_sao, "sao", "inline"),
}
ARM_LABELS = {"grpo": "GRPO(N=8), in learner", "grpo_samplers": "GRPO(N=8), samplers", "sao": "SAO"}
ROWS = [
  ("trajectories_per_s", "trajectories/s", "{:.1f}"),
  ("learner_steps_per_s", "learner steps/s", "{:.2f}"),
  ("seconds_per_step", "step latency (s per learner step)", "{:.2f}"),
  ("tokens_per_s", "generated tokens/s", "{:.0f}"),
  ("learner_busy", "learner busy fraction", "{:.1%}"),
  ("delay_mean_s", "sampling->training delay mean (s)", "{:.2f}"),
  ("delay_p95_s", "sampling->training delay p95 (s)", "{:.2f}"),
  ("learner_peak_mb", "peak memory, learner process (MiB)", "{:.0f}"),
  ("peak_rss_all_mb", "peak memory, all processes (MiB)", "{:.0f}"),
  ("length_mean", "completion tokens per trajectory, mean", "{:.1f}"),
  ("length_p90", "completion tokens per trajectory, p90", "{:.0f}"),
  ("accuracy", "final held-out accuracy", "{:.1%}"),
  ("time_to_target_s", "training s to GRPO's final accuracy", "{:.0f}"),
]


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--config", default=str(HERE / "configs" / "sao_arith.py"))
  p.add_argument("--variant", default="default")
  p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
  p.add_argument("--seconds", type=float, default=240.0, help="RL training seconds per arm")
  p.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 (default 3)")
  p.add_argument("--eval-every", type=float, default=None)
  p.add_argument(
    "--out",
    default="results/bench_sync_vs_async",
    help="results.json and the plot (small: committed)",
  )
  p.add_argument(
    "--workdir",
    default="runs/bench_sync_vs_async",
    help="checkpoints and metrics of every run (large)",
  )
  p.add_argument(
    "--arms",
    default="grpo,sao",
    help="comma-separated subset of: grpo (synchronous GRPO(N=8), sampling in the "
    "learner process), grpo_samplers (the same, through the SAO sampler "
    "processes: only the algorithm differs from sao), sao",
  )
  p.add_argument("--no-progress", action="store_true")
  args = p.parse_args(argv)
  arm_names = args.arms.split(",")
  if not arm_names or set(arm_names) - set(ARMS):
    raise SystemExit(f"--arms takes some of {', '.join(ARMS)}, got {args.arms!r}")
  if args.seeds < 1:
    raise SystemExit("--seeds must be >= 1")

  base = load_config(args.config, args.variant, args.set)
  base = dataclasses.replace(
    base, rl=dataclasses.replace(base.rl, steps=0, max_seconds=args.seconds), log_every=1
  )
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
  rf = ResultFile(
    out / "results.json",
    series=f"bench_sync_vs_async/{base.name}/{'+'.join(arm_names)}",
    config=base,
  )
  results = {
    "seeds": args.seeds,
    "seconds_per_arm": args.seconds,
    "runs": runs,
    "summary": _summary(runs, arm_names),
    "wall_s": time.time() - t0,
    "loadavg_end": [round(x, 2) for x in os.getloadavg()],
    "bench_peak_memory_mb": peak_memory_mb(),
  }
  rf.finish(results)
  results = rf.doc
  print_table(results)
  plot(results, out / "accuracy_vs_time.png")
  print(f"results: {out}/results.json")
  return results


def _one_seed(cfg, arm_names, work: pathlib.Path, eval_every: float, no_progress: bool) -> dict:
  s_sao = make_setup(cfg)

  def writer(name):
    return MetricsWriter(work / name, show_progress=not no_progress)

  w = writer("sft")
  sft_state, _, sft = run_sft(s_sao, w, None, work / "sft")
  w.close()
  print(
    f"seed {cfg.seed}: SFT {sft['steps']} steps, held-out accuracy {sft['accuracy']:.3f}",
    flush=True,
  )
  arms = {}
  for name in [a for a in ARMS if a in arm_names]:
    fn, algorithm, sampling = ARMS[name]
    s = dataclasses.replace(
      s_sao,
      cfg=dataclasses.replace(
        cfg, rl=dataclasses.replace(cfg.rl, algorithm=algorithm, sampling=sampling)
      ),
    )
    w = writer(name)
    _, _, info = fn(s, w, sft_state, work / name, eval_every=eval_every)
    w.close()
    info["learner_steps_per_s"] = info["steps"] / info["seconds"]
    arms[name] = info
    print(
      f"seed {cfg.seed}: {name} {info['steps']} steps, held-out accuracy {info['accuracy']:.3f}",
      flush=True,
    )
  base = baseline(arms)
  if base:  # wall-clock to the synchronous arm's final accuracy, for every arm
    target = arms[base]["accuracy"]
    for info in arms.values():
      info["time_to_target_s"] = _time_to(info["eval_curve"], target)
  return {"seed": cfg.seed, "sft": sft, **arms}


def baseline(arms) -> str | None:
  """The synchronous arm SAO is compared with: through the samplers when it ran (only the
  algorithm differs), else sampling in the learner."""
  return next((a for a in ("grpo_samplers", "grpo") if a in arms), None)


def _summary(runs: list[dict], arm_names: list[str]) -> dict:
  """Per arm and metric, and per SAO/baseline ratio: mean, s.e. and 95 % interval over
  seeds. With both GRPO arms, also SAO / GRPO-in-the-learner (`ratio_inline`)."""
  keys = [k for k, _, _ in ROWS]
  out = {"sft_accuracy": stats.summarize([r["sft"]["accuracy"] for r in runs])}
  for arm in arm_names:
    out[arm] = {k: stats.summarize([r[arm].get(k) for r in runs]) for k in keys}
  base = baseline(arm_names)
  pairs = [("ratio", base)] + (
    [("ratio_inline", "grpo")] if base == "grpo_samplers" and "grpo" in arm_names else []
  )
  for name, ref in pairs:
    if "sao" in arm_names and ref:
      out[name] = {
        "baseline": ref,
        **{
          k: stats.summarize(
            [
              r["sao"][k] / r[ref][k] if r["sao"].get(k) is not None and r[ref].get(k) else None
              for r in runs
            ]
          )
          for k in keys
        },
      }
  return out


def _time_to(curve, target):
  """First training second at which a held-out eval reached `target` (None: never)."""
  return next((t for t, _, acc in curve if acc >= target - 1e-9), None)


def print_table(r: dict):
  sm = r["summary"]
  arms = [a for a in ARMS if a in sm]
  ratios = [k for k in ("ratio", "ratio_inline") if k in sm]
  print(f"\n{r['seeds']} seeds, mean ± s.e.")
  head = [ARM_LABELS[a] for a in arms] + [f"SAO/{sm[k]['baseline']}" for k in ratios]
  print(f"{'':40s}" + "".join(f"{h:>22s}" for h in head))
  for key, label, spec in ROWS:
    pct = "%" in spec
    spec = spec.replace("%", "f") if pct else spec
    scale = 100.0 if pct else 1.0
    cells = [
      stats.fmt(sm[a].get(key, {}), spec, scale) + ("%" if pct and sm[a].get(key) else "")
      for a in arms
    ]
    cells += [
      stats.fmt(sm[k].get(key, {}), "{:.2f}")
      + ("x" if sm[k].get(key, {}).get("mean") is not None else "")
      for k in ratios
    ]
    print(f"{label:40s}" + "".join(f"{c:>22s}" for c in cells))
  print(f"held-out accuracy of the SFT start: {stats.fmt(sm['sft_accuracy'], '{:.3f}')}\n")


def plot(r: dict, path: pathlib.Path):
  """Held-out accuracy against training seconds: each seed thin, the mean over seeds bold."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import numpy as np

  fig, ax = plt.subplots(figsize=(6, 4))
  colors = {"grpo": "tab:blue", "grpo_samplers": "tab:green", "sao": "tab:orange"}
  for key, label in ARM_LABELS.items():
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
  ax.axhline(
    100 * r["summary"]["sft_accuracy"]["mean"], color="gray", ls="--", label="SFT start (mean)"
  )
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


if __name__ == "__main__":
  main()
