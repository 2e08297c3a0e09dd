"""Synchronous GRPO(N=8) against asynchronous SAO: same model, tasks, rows per update and
machine, side by side in one run, from one shared SFT checkpoint.

  python experiments/bench_sync_vs_async.py                      # 240 s per arm (~12 min)
  python experiments/bench_sync_vs_async.py --arms sao --seconds 720   # 3x longer, SAO only
  python experiments/bench_sync_vs_async.py --set sao.pin_cores=True   # pinned cores
  python experiments/bench_sync_vs_async.py --set task.n_ops_mix="(2,3)" --set rl.max_new_tokens=32
                                                   # 2- and 3-op mix: more length variance
  python experiments/bench_sync_vs_async.py --variant tiny --seconds 15  # smoke test

Both arms update on the same number of rows per step (GRPO: prompts_per_step x 8 rows of
the same prompts; SAO: sao.batch_size single trajectories of as many different tasks) from
the same SFT parameters, for the same training wall-clock (held-out evaluation excluded),
and are evaluated on the same held-out problems. Solutions vary in length (one- and
two-digit numbers; with n_ops_mix, two and three steps), so stragglers matter. Writes
OUT/results.json and OUT/accuracy_vs_time.png and prints the seed-style table
(Traditional | SAO | improvement).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import platform
import shutil
import time

import jax

from sao_jax import config as config_lib
from sao_jax.metrics import MetricsWriter, peak_memory_mb
from sao_jax.runners import train
from sao_jax.runners.sao import run_sao

HERE = pathlib.Path(__file__).resolve().parent
ROWS = [("trajectories_per_s", "trajectories/s", "{:.1f}"),
        ("learner_steps_per_s", "learner steps/s", "{:.2f}"),
        ("tokens_per_s", "generated tokens/s", "{:.0f}"),
        ("learner_busy", "learner busy fraction", "{:.1%}"),
        ("delay_mean_s", "sampling->training delay mean (s)", "{:.2f}"),
        ("delay_p95_s", "sampling->training delay p95 (s)", "{:.2f}"),
        ("peak_rss_all_mb", "peak memory, all processes (MiB)", "{:.0f}"),
        ("accuracy", "final held-out accuracy", "{:.1%}")]


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--config", default=str(HERE / "configs" / "sao_arith.py"))
  p.add_argument("--variant", default="default")
  p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
  p.add_argument("--seconds", type=float, default=240.0, help="RL training seconds per arm")
  p.add_argument("--eval-every", type=float, default=None)
  p.add_argument("--out", default="results/bench_sync_vs_async")
  p.add_argument("--arms", default="grpo,sao", help="comma-separated subset of grpo,sao")
  p.add_argument("--no-progress", action="store_true")
  args = p.parse_args(argv)
  arm_names = args.arms.split(",")
  if not arm_names or set(arm_names) - {"grpo", "sao"}:
    raise SystemExit(f"--arms takes grpo and/or sao, got {args.arms!r}")

  cfg = config_lib.load_config(args.config, args.variant, args.set)
  cfg = dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl, steps=0,
                                                        max_seconds=args.seconds), log_every=1)
  out = pathlib.Path(args.out)
  shutil.rmtree(out, ignore_errors=True)
  out.mkdir(parents=True)
  eval_every = args.eval_every or args.seconds / 6
  t0 = time.time()
  s_sao = train.make_setup(cfg)
  s_grpo = dataclasses.replace(s_sao, cfg=dataclasses.replace(
      cfg, rl=dataclasses.replace(cfg.rl, algorithm="grpo")))

  def writer(name):
    return MetricsWriter(out / name, show_progress=not args.no_progress)

  w = writer("sft")
  sft_state, _, sft = train.run_sft(s_sao, w, None, out / "sft")
  w.close()
  print(f"SFT: {sft['steps']} steps, held-out accuracy {sft['accuracy']:.3f}", flush=True)
  arms = {}
  for name, fn, s in (("grpo", train.run_grpo, s_grpo), ("sao", run_sao, s_sao)):
    if name not in arm_names:
      continue
    w = writer(name)
    _, _, info = fn(s, w, sft_state, out / name, eval_every=eval_every)
    w.close()
    info["learner_steps_per_s"] = info["steps"] / info["seconds"]
    arms[name] = info
    print(f"{name}: {info['steps']} steps, held-out accuracy {info['accuracy']:.3f}", flush=True)

  results = {"config": config_lib.to_dict(cfg), "sft": sft, **arms}
  if len(arms) == 2:
    g, a = arms["grpo"], arms["sao"]
    results["ratios"] = {k: a[k] / g[k] for k, _, _ in ROWS if g.get(k)}
    results["time_to_grpo_final_accuracy_s"] = {
        "grpo": _time_to(g["eval_curve"], g["accuracy"]),
        "sao": _time_to(a["eval_curve"], g["accuracy"])}
  results.update({
      "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                  "devices": [str(d) for d in jax.devices()], "jax": jax.__version__},
      "wall_s": time.time() - t0, "bench_peak_memory_mb": peak_memory_mb()})
  (out / "results.json").write_text(json.dumps(results, indent=2))
  print_table(results)
  plot(results, out / "accuracy_vs_time.png")
  print(f"results: {out}/results.json")
  return results


def _time_to(curve, target):
  """First training second at which a held-out eval reached `target` (None: never)."""
  return next((t for t, _, acc in curve if acc >= target - 1e-9), None)


def print_table(r: dict):
  g, a = r.get("grpo", {}), r.get("sao", {})
  print(f"\n{'':36s} {'Traditional (GRPO N=8)':>22s} {'SAO':>10s} {'SAO/GRPO':>9s}")
  for key, label, fmt in ROWS:
    gv, av = g.get(key), a.get(key)
    ratio = f"{av / gv:.2f}x" if gv and av is not None else "-"
    print(f"{label:36s} {fmt.format(gv) if gv is not None else '-':>22s} "
          f"{fmt.format(av) if av is not None else '-':>10s} {ratio:>9s}")
  print(f"held-out accuracy of the SFT start: {r['sft']['accuracy']:.1%}")
  if "time_to_grpo_final_accuracy_s" in r:
    tt = r["time_to_grpo_final_accuracy_s"]
    print(f"training seconds to GRPO's final accuracy: GRPO {tt['grpo']}, SAO {tt['sao']}")
  print()


def plot(r: dict, path: pathlib.Path):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(6, 4))
  for key, label in (("grpo", "GRPO(N=8), synchronous"), ("sao", "SAO, asynchronous")):
    if key not in r:
      continue
    c = r[key]["eval_curve"]
    ax.plot([x[0] for x in c], [100 * x[2] for x in c], marker="o", label=label)
  ax.set_xlabel("training seconds after the SFT checkpoint")
  ax.set_ylabel("held-out greedy accuracy (%)")
  ax.axhline(100 * r["sft"]["accuracy"], color="gray", ls="--", label="SFT start")
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


if __name__ == "__main__":
  main()
