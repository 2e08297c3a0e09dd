"""Does RL earn its keep where imitation cannot? Continued SFT, GRPO(N=8) and SAO from one SFT
start per seed, for the same training wall-clock, in the two settings where RL is known to
win: imperfect demonstrations and test problems outside the demonstrations' distribution.

  python experiments/rl_vs_sft.py --setting flawed                 # 3 seeds
  python experiments/rl_vs_sft.py --setting flawed --misreads gave,used
  python experiments/rl_vs_sft.py --setting ood
  python experiments/rl_vs_sft.py --setting flawed --variant tiny --seconds 10 --seeds 1
  python experiments/rl_vs_sft.py --setting ood --arm-set sao:rl.optim.lr=3e-4  # tuned values

  python experiments/rl_vs_sft.py --setting clean --config experiments/configs/code.py
  python experiments/rl_vs_sft.py --setting flawed --config experiments/configs/code.py \\
      --misreads add

Settings (on top of --config, default experiments/configs/sao_arith.py; any task family):
  clean   the config as it is (perfect, in-distribution demonstrations).
  flawed  the demonstrations come from a teacher who misreads the words of --misreads the
          same way every time (task.options.teacher_misreads: a systematic error, so
          imitation learns it; arithmetic, default "gave": subtraction verbs read as
          additions; code: a stage of envs.code.CODE_MISREADS); rewards and the test split
          are true.
          A reference arm, `sft_clean`, trains the same SFT start and continuation on clean
          demonstrations, so each seed measures the gap the flaw opens (clean minus flawed
          continued SFT) and how much of it RL recovers: (RL - continued SFT) / gap.
  ood     everything trains on 1-2 operations with operands up to 9 (task.n_ops_mix=(1,2));
          besides that test split (100 problems: 1-operation ones are few), every arm is
          scored on problems of 3 operations (`ops3`) and of operands up to 20 with a number
          above 9 (`operands20`). model.max_len is raised to hold the
          longest of them (learned positions past the training lengths stay untrained: part
          of what out of distribution means for this model).

Per seed (seeds 0..N-1 of model, data order and sampling; the tasks are the same): one SFT
start (`sao-jax train` with rl.steps=0), then each arm as its own `sao-jax train` process from
it, in an order drawn per seed: `sft_continued` (SFT for --seconds more on the same
demonstrations), `grpo` (synchronous GRPO(N=8), sampling in the learner), `sao`. Held-out
accuracy on a grid of --eval-points deferred evaluations per arm (the curve), then the final
parameters on every test split of the setting. Per arm and split: mean ± s.e. over seeds;
per seed the paired difference to continued SFT, summarised the same way.

Equal wall-clock is the headline; equal samples sits beside it: each arm's curve against
the training samples it consumed (demonstrations for SFT, trajectories for RL), read per
seed at the fewest samples any of continued SFT, GRPO and SAO reached. Each RL arm's
diagnosis (sao_jax.bench.rl_vs_sft.diagnosis) over its logged updates (every log_every-th,
as in any run: logging more often would slow the arms): batch reward, reward sparsity (share
of zero-reward trajectories; share of batches with nothing but zeros), GRPO's share of
groups with no signal, mean |advantage|, and the batch reward against updates.

Writes OUT/results.json (command, commit, machine, resolved config, every run) and
OUT/accuracy_vs_time.png; prints the table. Workdirs go to --workdir.
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import time

import numpy as np

from sao_jax import config as config_lib
from sao_jax import stats
from sao_jax.bench.arith_report import plateau_gain, plateau_summary
from sao_jax.bench.rl_vs_sft import (
  DIAGNOSIS,
  SETTINGS,
  accuracy_at,
  diagnosis,
  samples_at,
  setting_overrides,
  splits_for,
  training_samples,
)
from sao_jax.metrics import read_jsonl
from sao_jax.procs import run_train
from sao_jax.results_file import ResultFile
from sao_jax.setup import make_setup

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
ARMS = ("sft_continued", "grpo", "sao")
LABELS = {
  "sft": "SFT start",
  "sft_continued": "continued SFT",
  "grpo": "GRPO(N=8)",
  "sao": "SAO",
  "sft_clean": "SFT on clean demonstrations (reference)",
}


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--setting", required=True, choices=SETTINGS)
  p.add_argument("--misreads", default="gave", help="flawed: verbs the teacher misreads")
  p.add_argument("--config", default=str(HERE / "configs" / "sao_arith.py"))
  p.add_argument("--variant", default="default")
  p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
  p.add_argument("--arm-set", action="append", default=[], metavar="ARM:KEY=VALUE")
  p.add_argument("--seconds", type=float, default=240.0, help="training seconds per arm")
  p.add_argument("--seeds", type=int, default=3)
  p.add_argument("--first-seed", type=int, default=0)
  p.add_argument("--eval-points", type=int, default=12, help="deferred evaluations per arm")
  p.add_argument(
    "--start-eval-every",
    type=float,
    default=0.0,
    help="seconds between held-out evaluations of the SFT starts (0: none), for their "
    "plateau measure (e.g. --set sft.steps=1500 --start-eval-every 40)",
  )
  p.add_argument("--out", default=None, help="default results/rl_vs_sft_<setting>")
  p.add_argument("--workdir", default=None, help="default runs/rl_vs_sft_<setting>")
  args = p.parse_args(argv)
  if args.start_eval_every < 0:
    raise SystemExit("--start-eval-every must be >= 0")
  if args.seeds < 1 or args.first_seed < 0 or args.eval_points < 1 or args.seconds <= 0:
    raise SystemExit("--seeds, --eval-points and --seconds must be positive")
  arms = [*ARMS, *(["sft_clean"] if args.setting == "flawed" else [])]
  arm_sets: dict[str, list[str]] = {a: [] for a in arms}
  for item in args.arm_set:
    arm, sep, kv = item.partition(":")
    if not sep or arm not in arm_sets or "=" not in kv:
      raise SystemExit(f"--arm-set takes ARM:KEY=VALUE with ARM one of {', '.join(arms)}")
    arm_sets[arm].append(kv)
  misreads = [m for m in args.misreads.split(",") if m]
  sets, base = setting_overrides(args.setting, misreads, args.config, args.variant, args.set)
  splits = splits_for(args.setting, base)
  flaw_rate = None
  if args.setting == "flawed":
    flaw_rate = make_setup(base).family.teacher_flaw_rate()
  config = f"{args.config}:{args.variant}"
  out = pathlib.Path(args.out or f"results/rl_vs_sft_{args.setting}")
  work = pathlib.Path(args.workdir or f"runs/rl_vs_sft_{args.setting}")
  for d in (out, work):
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
  t0 = time.time()
  seeds = list(range(args.first_seed, args.first_seed + args.seeds))
  every = args.seconds / args.eval_points
  runs = [
    one_seed(config, sets, arm_sets, seed, arms, splits, work / f"seed{seed}", args, every)
    for seed in seeds
  ]
  summary = summarize(runs, arms, list(splits))
  rf = ResultFile(out / "results.json", series=f"rl_vs_sft/{args.setting}/{base.name}", config=base)
  rf.finish(
    {
      "setting": args.setting,
      "misreads": misreads if args.setting == "flawed" else None,
      "teacher_flaw_rate": flaw_rate,
      "splits": splits,
      "seeds": len(seeds),
      "seed_list": seeds,
      "seconds_per_arm": args.seconds,
      "eval_every_s": every,
      "arm_overrides": arm_sets,
      "runs": runs,
      "summary": summary,
      "wall_s": time.time() - t0,
    }
  )
  print_table(rf.doc)
  plot(rf.doc, out / "accuracy_vs_time.png")
  print(f"results: {out}/results.json")
  return rf.doc


def _score(workdir: pathlib.Path, splits: dict[str, list[str]]) -> dict[str, float]:
  from sao_jax.runners.run import eval_workdir

  return {name: eval_workdir(workdir, None, sets)["accuracy"] for name, sets in splits.items()}


def _start(config, workdir, sets, eval_every: float) -> dict:
  """An SFT start (`sao-jax train` with no RL); with `eval_every` seconds, its held-out curve
  (deferred evaluations) and its plateau measure, the last-third gain."""
  timing = [f"eval.every_seconds={eval_every}", "eval.deferred=True"] if eval_every else []
  summary, _ = run_train(config, workdir, [*sets, "rl.steps=0", "rl.max_seconds=0", *timing])
  info = summary["sft"]
  curve = info.pop("eval_curve", None)
  if eval_every:
    info.update(curve=curve, plateau=plateau_gain(curve, info["num_problems"]))
  return info


def one_seed(config, sets, arm_sets, seed, arms, splits, work, args, every) -> dict:
  work.mkdir(parents=True, exist_ok=True)
  common = [*sets, f"seed={seed}"]
  starts = {"sft": work / "start"}
  info = _start(config, starts["sft"], common, args.start_eval_every)
  run: dict = {"seed": seed, "sft": {**info, "splits": _score(starts["sft"], splits)}}
  if "sft_clean" in arms:  # the same SFT start on clean demonstrations
    starts["sft_clean"] = work / "start_clean"
    clean = [*common, "task.options.teacher_misreads=()"]
    run["sft_clean_start"] = _start(config, starts["sft_clean"], clean, args.start_eval_every)
  order = [str(a) for a in np.random.default_rng((seed, 23)).permutation(arms)]
  run["order"] = order
  for arm in order:
    timing = [f"eval.every_seconds={every}", "eval.deferred=True", "rl.steps=0", "sft.steps=0"]
    timing.append("rl.sampling=inline")
    if arm in ("sft_continued", "sft_clean"):
      phase = [f"sft.max_seconds={args.seconds}", "rl.max_seconds=0"]
      start = starts["sft_clean" if arm == "sft_clean" else "sft"]
      extra = ["task.options.teacher_misreads=()"] if arm == "sft_clean" else []
    else:
      phase = ["sft.max_seconds=0", f"rl.max_seconds={args.seconds}", f"rl.algorithm={arm}"]
      start, extra = starts["sft"], []
    summary, mem = run_train(
      config,
      work / arm,
      [*common, *extra, f"init_from={start}", *timing, *phase, *arm_sets[arm]],
    )
    phase = "sft" if arm in ("sft_continued", "sft_clean") else "rl"
    info = {k: v for k, v in summary[phase].items() if k != "length_hist"}
    info.update(splits=_score(work / arm, splits), peak_tree_pss_mb=mem["pss_peak_mb"])
    start_acc = run["sft_clean_start" if arm == "sft_clean" else "sft"]["accuracy"]
    info.update(_samples(work / arm, phase, info, start_acc))
    run[arm] = info
    print(
      f"seed {seed}: {arm} {info['steps']} steps in {info['seconds']:.0f} s, "
      + ", ".join(f"{k} {v:.3f}" for k, v in info["splits"].items()),
      flush=True,
    )
  return run


def _samples(workdir: pathlib.Path, phase: str, info: dict, start_acc: float) -> dict:
  """An arm's training samples, its curve against them (from the SFT start's accuracy at 0
  to its final one) and, for RL, its diagnosis."""
  rows = read_jsonl(workdir / "metrics.jsonl")
  steps, cum = training_samples(rows, config_lib.read_saved(workdir / "config.json"), phase)
  curve = [[0.0, start_acc]] + [
    [samples_at(steps, cum, st), acc] for _, st, acc in info["eval_curve"] if st > 0
  ]
  total = samples_at(steps, cum, info["steps"])
  if curve[-1][0] < total:
    curve.append([total, info["splits"]["test"]])
  out = {"samples": total, "sample_curve": curve}
  if phase == "rl":
    out["diagnosis"] = diagnosis(rows)
  return out


def equal_samples(runs: list[dict], arms: list[str]) -> dict | None:
  """Test accuracy per arm at the fewest samples any of continued SFT, GRPO and SAO reached
  (per seed), with the paired differences; None where a run lacks a sample curve."""
  main = [a for a in ARMS if a in arms]
  if not all("sample_curve" in r.get(a, {}) for r in runs for a in main):
    return None
  for r in runs:
    n = min(r[a]["samples"] for a in main)
    r["equal_samples"] = {"samples": n}
    for a in main:
      xs, accs = zip(*r[a]["sample_curve"], strict=True)
      r["equal_samples"][a] = accuracy_at(xs, accs, n)
  out = {k: stats.summarize([r["equal_samples"][k] for r in runs]) for k in ["samples", *main]}
  pairs = [("grpo", "sft_continued"), ("sao", "sft_continued"), ("sao", "grpo")]
  for a, b in pairs:
    if a in main and b in main:
      diffs = [r["equal_samples"][a] - r["equal_samples"][b] for r in runs]
      out[f"{a}_minus_{b}"] = stats.summarize(diffs)
  return out


def summarize(runs: list[dict], arms: list[str], splits: list[str]) -> dict:
  """Per arm and split, accuracy over seeds; each RL arm's paired difference to continued
  SFT per seed; for the flawed setting the gap and the fraction of it each arm recovers."""
  out: dict = {}
  for arm in ["sft", *arms]:
    out[arm] = {s: stats.summarize([r[arm]["splits"][s] for r in runs]) for s in splits}
  for arm in ("grpo", "sao"):
    out[f"{arm}_minus_sft_continued"] = {
      s: stats.summarize([r[arm]["splits"][s] - r["sft_continued"]["splits"][s] for r in runs])
      for s in splits
    }
  out["sao_minus_grpo"] = {
    s: stats.summarize([r["sao"]["splits"][s] - r["grpo"]["splits"][s] for r in runs])
    for s in splits
  }
  out["equal_samples"] = equal_samples(runs, arms)
  if all("plateau" in r["sft"] for r in runs):  # the starts' plateau measure
    out["plateau"] = plateau_summary(runs)
    if all("plateau" in r.get("sft_clean_start", {}) for r in runs):
      out["plateau_clean"] = plateau_summary([{"sft": r["sft_clean_start"]} for r in runs])
  for arm in ("grpo", "sao"):
    if all("diagnosis" in r.get(arm, {}) for r in runs):
      diag = [r[arm]["diagnosis"] for r in runs]
      out.setdefault("diagnosis", {})[arm] = {
        k: stats.summarize([d.get(k) for d in diag]) for k in DIAGNOSIS
      }
  if "sft_clean" in arms:
    gaps = [r["sft_clean"]["splits"]["test"] - r["sft_continued"]["splits"]["test"] for r in runs]
    out["flaw_gap"] = stats.summarize(gaps)
    for arm in ("grpo", "sao"):
      rec = []
      for r, gap in zip(runs, gaps, strict=True):
        gain = r[arm]["splits"]["test"] - r["sft_continued"]["splits"]["test"]
        rec.append(gain / gap if gap > 0 else None)
        r.setdefault("recovered", {})[arm] = rec[-1]
      out[f"{arm}_recovered_fraction"] = stats.summarize(rec)
  return out


def print_table(r: dict):
  sm = r["summary"]
  splits = list(r["splits"])
  print(f"\n{r['setting']}: {r['seeds']} seeds, {r['seconds_per_arm']:.0f} s per arm, mean ± s.e.")
  print(f"{'':44s}" + "".join(f"{s:>18s}" for s in splits))
  for key in ["sft", "sft_continued", "grpo", "sao", "sft_clean"]:
    if key in sm:
      cells = [stats.fmt(sm[key][s], "{:.1f}", 100) for s in splits]
      print(f"{LABELS[key]:44s}" + "".join(f"{c:>18s}" for c in cells))
  for key in ("grpo_minus_sft_continued", "sao_minus_grpo", "sao_minus_sft_continued"):
    cells = [stats.fmt(sm[key][s], "{:+.1f}", 100) for s in splits]
    print(f"{key + ' (points)':44s}" + "".join(f"{c:>18s}" for c in cells))
  eq = sm.get("equal_samples")
  if eq:
    n = stats.fmt(eq["samples"], "{:.0f}")
    print(f"\nat equal samples (per seed the fewest any arm reached: {n})")
    for key in ("sft_continued", "grpo", "sao"):
      if key in eq:
        print(f"{LABELS[key]:44s}{stats.fmt(eq[key], '{:.1f}', 100):>18s}")
    for key in ("grpo_minus_sft_continued", "sao_minus_sft_continued", "sao_minus_grpo"):
      if key in eq:
        print(f"{key + ' (points)':44s}{stats.fmt(eq[key], '{:+.1f}', 100):>18s}")
  for arm, d in sm.get("diagnosis", {}).items():
    print(
      f"{LABELS[arm]} batches: reward {stats.fmt(d['reward'], '{:.3f}')}, zero-reward "
      f"trajectories {stats.fmt(d['reward_zero_frac'], '{:.1%}')}, all-zero batches "
      f"{stats.fmt(d['all_zero_batch'], '{:.1%}')}, flat groups "
      f"{stats.fmt(d['groups_flat'], '{:.1%}')}, |advantage| {stats.fmt(d['adv_abs'], '{:.3f}')}"
      f" (negative {stats.fmt(d['adv_neg_frac'], '{:.1%}')})"
    )
  for key, what in (("plateau", "SFT start"), ("plateau_clean", "clean SFT start")):
    if key in sm:
      g, verdict = sm[key]["last_third_gain_points"], sm[key]["plateaued"]
      print(f"{what}: last-third gain {stats.fmt(g, '{:+.1f}')} points, plateaued: {verdict}")
  if "flaw_gap" in sm:
    print(
      f"flaw rate {r['teacher_flaw_rate']:.1%}; gap (clean - flawed continued SFT) "
      f"{stats.fmt(sm['flaw_gap'], '{:.1f}', 100)} points; recovered: GRPO "
      f"{stats.fmt(sm['grpo_recovered_fraction'], '{:.2f}')}, SAO "
      f"{stats.fmt(sm['sao_recovered_fraction'], '{:.2f}')}"
    )


def plot(r: dict, path: pathlib.Path):
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  from sao_jax.analysis.plots import plot_rl_vs_sft

  fig = plot_rl_vs_sft(r)
  fig.savefig(path, dpi=120)
  plt.close(fig)


if __name__ == "__main__":
  main()
