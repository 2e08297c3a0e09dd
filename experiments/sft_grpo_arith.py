"""SFT -> GRPO(N=8) on arithmetic word problems, against the control that matters: simply
continuing SFT for the same training wall-clock.

  python experiments/sft_grpo_arith.py                      # default, ~10 min on 2 CPU cores
  python experiments/sft_grpo_arith.py --variant tiny       # seconds, a smoke test
  python experiments/sft_grpo_arith.py --set rl.max_seconds=300 --out results/arith_300s

Writes OUT/results.json (accuracies, deltas, curves, steps, machine), OUT/curves.png and
OUT/{sft,grpo,sft_continued}/metrics.jsonl; prints a table. Held-out accuracy is greedy
exact-match on the first `eval.num_problems` test problems, disjoint from training.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import shutil
import sys
import time

import jax

from sao_jax import config as config_lib
from sao_jax.metrics import MetricsWriter, peak_memory_mb
from sao_jax.runners.grpo import run_grpo
from sao_jax.runners.sft import run_sft
from sao_jax.setup import make_setup

HERE = pathlib.Path(__file__).resolve().parent


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--config", default=str(HERE / "configs" / "arith_grpo.py"))
  p.add_argument("--variant", default="default")
  p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
  p.add_argument("--out", default="results/sft_grpo_arith")
  p.add_argument(
    "--eval-every",
    type=float,
    default=None,
    help="held-out eval every N training seconds (default: rl.max_seconds / 8)",
  )
  p.add_argument("--no-progress", action="store_true")
  args = p.parse_args(argv)

  cfg = config_lib.load_config(args.config, args.variant, args.set)
  if not cfg.sft.steps or not (cfg.rl.max_seconds or cfg.rl.steps):
    raise SystemExit("the experiment needs sft.steps > 0 and an RL budget")
  out = pathlib.Path(args.out)
  if out.exists():
    shutil.rmtree(out)
  out.mkdir(parents=True)
  (out / "config.json").write_text(config_lib.to_json(cfg))
  t_start = time.time()
  s = make_setup(cfg)
  eval_every = args.eval_every
  if eval_every is None:
    eval_every = (cfg.rl.max_seconds or 60.0) / 8

  def writer(name):
    return MetricsWriter(out / name, show_progress=not args.no_progress)

  w = writer("sft")
  sft_state, _, sft = run_sft(s, w, None, out / "sft")
  w.close()
  print(
    f"SFT: {sft['steps']} steps, {sft['seconds']:.0f} s, held-out accuracy {sft['accuracy']:.3f}",
    flush=True,
  )

  w = writer("grpo")
  _, _, grpo = run_grpo(s, w, sft_state, out / "grpo", eval_every=eval_every)
  w.close()
  print(
    f"GRPO: {grpo['steps']} steps, {grpo['seconds']:.0f} s, held-out accuracy "
    f"{grpo['accuracy']:.3f}",
    flush=True,
  )

  # Control: the same training seconds spent on more SFT (optimizer state carried over).
  w = writer("sft_continued")
  _, _, ctrl = run_sft(
    s,
    w,
    sft_state,
    out / "sft_continued",
    steps=0,
    max_seconds=grpo["seconds"],
    tag="sft_continued",
    eval_every=eval_every,
    keep_opt_state=True,
  )
  w.close()
  print(
    f"SFT continued: {ctrl['steps']} steps, {ctrl['seconds']:.0f} s, held-out accuracy "
    f"{ctrl['accuracy']:.3f}",
    flush=True,
  )

  results = {
    "config": config_lib.to_dict(cfg),
    "machine": {
      "platform": platform.platform(),
      "cpus": os.cpu_count(),
      "devices": [str(d) for d in jax.devices()],
      "jax": jax.__version__,
    },
    "num_test_problems": sft["num_problems"],
    "sft": sft,
    "grpo": grpo,
    "sft_continued": ctrl,
    "grpo_gain_points": 100 * (grpo["accuracy"] - sft["accuracy"]),
    "control_gain_points": 100 * (ctrl["accuracy"] - sft["accuracy"]),
    "grpo_minus_control_points": 100 * (grpo["accuracy"] - ctrl["accuracy"]),
    "wall_s": time.time() - t_start,
    "peak_memory_mb": peak_memory_mb(),
  }
  (out / "results.json").write_text(json.dumps(results, indent=2))
  print_table(results)
  plot(results, out / "curves.png")
  print(f"results: {out}/results.json, {out}/curves.png")
  return results


def print_table(r: dict):
  rows = [
    ("SFT checkpoint", r["sft"]),
    ("+ GRPO(N=8)", r["grpo"]),
    ("+ SFT continued (control)", r["sft_continued"]),
  ]
  print(f"\n{'arm':28s} {'steps':>6s} {'train s':>8s} {'held-out acc':>13s}")
  for name, d in rows:
    print(f"{name:28s} {d['steps']:6d} {d['seconds']:8.0f} {100 * d['accuracy']:12.1f}%")
  print(
    f"GRPO gain over SFT: {r['grpo_gain_points']:+.1f} points; control gain: "
    f"{r['control_gain_points']:+.1f} points; GRPO - control: "
    f"{r['grpo_minus_control_points']:+.1f} points (n={r['num_test_problems']})\n"
  )


def plot(r: dict, path: pathlib.Path):
  try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    print("matplotlib not installed: no plot", file=sys.stderr)
    return
  fig, ax = plt.subplots(figsize=(6, 4))
  for name, key in (("GRPO(N=8)", "grpo"), ("SFT continued", "sft_continued")):
    curve = r[key]["eval_curve"]
    ax.plot([c[0] for c in curve], [100 * c[2] for c in curve], marker="o", label=name)
  ax.axhline(100 * r["sft"]["accuracy"], color="gray", ls="--", label="SFT checkpoint")
  ax.set_xlabel("training seconds after the SFT checkpoint")
  ax.set_ylabel("held-out greedy accuracy (%)")
  ax.set_title(f"arithmetic, n={r['num_test_problems']} test problems")
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


if __name__ == "__main__":
  main()
