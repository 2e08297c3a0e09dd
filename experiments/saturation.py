"""Saturated rewards: does SAO keep a policy that already solves its tasks, at temperature 1?

From an SFT start that solves one-operation sums (of numbers up to 20) nearly always, SAO
trains for `--updates` updates at temperature 1 with the advantage as the learner computes
it now (r - v over the batch std, not centred) and, as the control, with the SPO recipe's
batch centring (`sao.adv_center=True`), which gives correct answers of high-value tasks
negative advantages when nearly every answer is right. Same SFT checkpoint, tasks and seed
for both arms.

  python experiments/saturation.py                   # 3 seeds x 2 arms x 300 updates
  python experiments/saturation.py --seeds 1 --updates 20 --variant tiny   # smoke test

Reported per arm (mean ± s.e. over seeds): the largest drop of the training reward (moving
average over 20 updates) below its best so far, the same for held-out greedy accuracy
(evaluated every --eval-every training seconds), and the final values. "No collapse" means
both drops stay under 5 points. Writes results/saturation.json and results/saturation.png.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import shutil
import time

import numpy as np

from sao_jax import stats
from sao_jax.metrics import MetricsWriter, read_jsonl
from sao_jax.results_file import ResultFile
from sao_jax.runners.sao import run_sao
from sao_jax.runners.sft import run_sft
from sao_jax.setup import load_config, make_setup

HERE = pathlib.Path(__file__).resolve().parent
# One-operation sums of numbers up to 20: 441 problems, 100 held out; a longer warm start
# than the arithmetic default, so that sampling at temperature 1 already earns nearly every
# reward (at 300 steps on sums up to 50 it earned 0.2-0.5: not the regime in question).
TASK = (
  "task.n_ops=1",
  "task.ops=+",
  "task.max_operand=20",
  "eval.num_problems=100",
  "task.num_test=100",
  "rl.temperature=1.0",
)
ARMS = {"not_centred": False, "centred_control": True}
WINDOW = 20  # updates in the training-reward moving average


def max_drop(values) -> float:
  """Largest fall below the best value so far (0 if it never falls)."""
  x = np.asarray(values, float)
  return float(np.max(np.maximum.accumulate(x) - x)) if x.size else 0.0


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--config", default=str(HERE / "configs" / "sao_arith.py"))
  p.add_argument("--variant", default="default")
  p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
  p.add_argument("--seeds", type=int, default=3)
  p.add_argument("--updates", type=int, default=300)
  p.add_argument("--sft-steps", type=int, default=800)
  p.add_argument("--eval-every", type=float, default=30.0, help="training seconds")
  p.add_argument("--out", default="results/saturation.json")
  p.add_argument("--workdir", default="runs/saturation")
  p.add_argument("--no-progress", action="store_true")
  args = p.parse_args(argv)
  base = load_config(args.config, args.variant, [*TASK, *args.set])
  base = dataclasses.replace(
    base,
    rl=dataclasses.replace(base.rl, steps=args.updates, max_seconds=0),
    sft=dataclasses.replace(base.sft, steps=args.sft_steps, max_seconds=0),
    log_every=1,
  )
  work = pathlib.Path(args.workdir)
  shutil.rmtree(work, ignore_errors=True)
  t0 = time.time()
  runs = []
  for seed in range(args.seeds):
    cfg = dataclasses.replace(base, seed=seed)
    s = make_setup(cfg)
    w = MetricsWriter(work / f"seed{seed}" / "sft", show_progress=not args.no_progress)
    sft_state, _, sft = run_sft(s, w, None, work / f"seed{seed}" / "sft")
    w.close()
    run = {"seed": seed, "sft_accuracy": sft["accuracy"]}
    for arm, center in ARMS.items():
      acfg = dataclasses.replace(cfg, sao=dataclasses.replace(cfg.sao, adv_center=center))
      d = work / f"seed{seed}" / arm
      w = MetricsWriter(d, show_progress=not args.no_progress)
      _, _, info = run_sao(
        dataclasses.replace(s, cfg=acfg), w, sft_state, d, eval_every=args.eval_every
      )
      w.close()
      rows = [r for r in read_jsonl(d / "metrics.jsonl") if r.get("phase") == "rl"]
      reward = [r["reward"] for r in rows if "reward" in r]
      smooth = np.convolve(reward, np.ones(WINDOW) / WINDOW, mode="valid").tolist()
      curve = [sft["accuracy"]] + [acc for _, _, acc in info["eval_curve"]]
      run[arm] = {
        "updates": info["steps"],
        "final_accuracy": info["accuracy"],
        "reward_first": float(np.mean(reward[:WINDOW])),
        "reward_last": float(np.mean(reward[-WINDOW:])),
        "reward_max_drop": max_drop(smooth),
        "accuracy_max_drop": max_drop(curve),
        "accuracy_curve": curve,
        "reward": reward,
        "adv_neg_frac_mean": float(np.mean([r["adv_neg_frac"] for r in rows])),
        "eval_curve": info["eval_curve"],
      }
      print(
        f"seed {seed} {arm}: reward {run[arm]['reward_first']:.3f} -> "
        f"{run[arm]['reward_last']:.3f} (largest drop {run[arm]['reward_max_drop']:.3f}),"
        f" held-out {sft['accuracy']:.3f} -> {info['accuracy']:.3f} (largest drop "
        f"{run[arm]['accuracy_max_drop']:.3f})",
        flush=True,
      )
    runs.append(run)
  keys = (
    "reward_first",
    "reward_last",
    "reward_max_drop",
    "final_accuracy",
    "accuracy_max_drop",
    "adv_neg_frac_mean",
  )
  summary = {"sft_accuracy": stats.summarize([r["sft_accuracy"] for r in runs])}
  for arm in ARMS:
    summary[arm] = {k: stats.summarize([r[arm][k] for r in runs]) for k in keys}
    summary[arm]["collapsed_seeds"] = sum(
      r[arm]["reward_max_drop"] > 0.05 or r[arm]["accuracy_max_drop"] > 0.05 for r in runs
    )
  rf = ResultFile(args.out, series=f"saturation/{base.name}", config=base)
  result = {
    "updates": args.updates,
    "seeds": args.seeds,
    "runs": runs,
    "summary": summary,
    "wall_s": time.time() - t0,
    "loadavg_end": [round(x, 2) for x in os.getloadavg()],
  }
  out = rf.finish(result)
  result = rf.doc
  for arm in ARMS:
    sm = summary[arm]
    print(
      f"{arm}: reward {stats.fmt(sm['reward_first'])} -> {stats.fmt(sm['reward_last'])}, "
      f"largest drop {stats.fmt(sm['reward_max_drop'])}; held-out final "
      f"{stats.fmt(sm['final_accuracy'])}, largest drop {stats.fmt(sm['accuracy_max_drop'])};"
      f" {sm['collapsed_seeds']}/{args.seeds} seeds dropped > 5 points"
    )
  plot(result, out.with_suffix(".png"))
  print(f"results: {out}")
  return result


def plot(result: dict, path: pathlib.Path) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(6, 4))
  for arm, color in zip(ARMS, ("tab:orange", "tab:gray"), strict=True):
    for i, run in enumerate(result["runs"]):
      r = np.convolve(run[arm]["reward"], np.ones(WINDOW) / WINDOW, mode="valid")
      ax.plot(
        np.arange(len(r)) + WINDOW,
        r,
        color=color,
        alpha=0.7,
        label=arm.replace("_", " ") if i == 0 else None,
      )
  ax.set_xlabel("SAO update")
  ax.set_ylabel(f"training reward (mean of {WINDOW} updates)")
  ax.set_ylim(-0.02, 1.02)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


if __name__ == "__main__":
  main()
