"""Synchronous GRPO(N=8) against asynchronous SAO: same model, tasks, rows per update and
machine, from one shared SFT checkpoint per seed, each arm a `sao-jax train` process of its own.

  python experiments/bench_sync_vs_async.py                      # 5 seeds x 240 s per arm
  python experiments/bench_sync_vs_async.py --config experiments/configs/sao_chain.py \\
      --out results/bench_chain                                  # heavy-tailed lengths
  python experiments/bench_sync_vs_async.py --config experiments/configs/sao_chain.py \\
      --set samplers.pin_cores=True --out results/bench_chain_pinned  # roles on their own cores
  python experiments/bench_sync_vs_async.py --variant tiny --seconds 15 --seeds 2  # smoke test
  python experiments/bench_sync_vs_async.py --arm-set sao:rl.optim.lr=3e-4 \\
      --arm-set grpo:rl.prompts_per_step=8                       # each arm's tuned values

Arms: `grpo` samples in the learner process (sample, score, update, repeat); `grpo_samplers`
is the same synchronous GRPO through the SAO sampler processes, transport and core pinning
(staleness 0: the learner waits for samples, the samplers for the new version, and the
samplers' continuous batching works inside each step); `sao` is SAO. Every arm updates on the
same number of rows per step (GRPO: prompts_per_step x 8 rows of the same prompts; SAO:
sao.batch_size single trajectories of as many tasks) from the same SFT parameters, for the
same training wall-clock.

Method, the same for every arm:
  * each arm runs as its own process tree (`sao-jax train` with init_from the seed's SFT
    run, which is a process of its own too); its peak memory is the peak, sampled every
    second by this process, of the PSS summed over that tree (learner, samplers, broker if the
    run starts one: `sao_jax.procs.TreeMemoryPeak`), so that pages the processes share count
    once;
  * the arms' order is drawn per seed (recorded in `runs[i].order`);
  * held-out accuracy on a fixed grid of `--eval-points` evaluations per arm (every
    seconds / points training seconds), deferred: the parameters are saved at each point and
    evaluated after the arm's training (`eval.deferred`), so nothing runs while an arm's clock
    is stopped; the time to a target accuracy is interpolated linearly between the two
    evaluations around it;
  * the baseline is the best synchronous GRPO of the run: of the GRPO arms that ran, the one
    with the most learner steps per second over the seeds (`summary.baseline` names it and
    why). The target of each seed is the baseline's final accuracy in that seed. A seed in
    which an arm never reaches it is censored at the arm's budget (its time a lower bound),
    counted in `censored`;
  * SAO / baseline ratios per seed, summarised as mean ± s.e., a 95 % t-interval and a 95 %
    percentile bootstrap interval over seeds (`summary.ratio`); also against each GRPO arm.

Writes OUT/results.json (the command, commit, machine, the resolved config and every run) and
OUT/accuracy_vs_time.png, and prints the table. The runs' workdirs go to --workdir.
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
from sao_jax.bench.sync_vs_async import ARMS, plot, print_table, summarize
from sao_jax.procs import run_train
from sao_jax.results_file import ResultFile
from sao_jax.setup import load_config, make_setup

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
# arm -> (rl.algorithm, rl.sampling)


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--config", default=str(HERE / "configs" / "sao_arith.py"))
  p.add_argument("--variant", default="default")
  p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
  p.add_argument(
    "--arm-set",
    action="append",
    default=[],
    metavar="ARM:KEY=VALUE",
    help="an override for one arm only, e.g. sao:rl.optim.lr=3e-4 (each arm's tuned values)",
  )
  p.add_argument("--seconds", type=float, default=240.0, help="RL training seconds per arm")
  p.add_argument("--seeds", type=int, default=5, help="how many seeds (default 5)")
  p.add_argument("--first-seed", type=int, default=0, help="seeds first..first+N-1 (default 0)")
  p.add_argument(
    "--eval-points", type=int, default=20, help="held-out evaluations per arm (default 20)"
  )
  p.add_argument(
    "--eval-every", type=float, default=None, help="seconds between evaluations (overrides)"
  )
  p.add_argument(
    "--out",
    default="results/bench_sync_vs_async",
    help="results.json and the plot (small: committed)",
  )
  p.add_argument(
    "--workdir",
    default="runs/bench_sync_vs_async",
    help="checkpoints, metrics and logs of every run (large)",
  )
  p.add_argument(
    "--arms",
    default="grpo,grpo_samplers,sao",
    help="comma-separated subset of: grpo (synchronous GRPO(N=8), sampling in the "
    "learner process), grpo_samplers (the same, through the SAO sampler "
    "processes), sao",
  )
  p.add_argument("--no-progress", action="store_true", help="(the runs never show one)")
  args = p.parse_args(argv)
  arm_names = [a for a in ARMS if a in args.arms.split(",")]
  if not arm_names or set(args.arms.split(",")) - set(ARMS):
    raise SystemExit(f"--arms takes some of {', '.join(ARMS)}, got {args.arms!r}")
  if args.seeds < 1 or args.first_seed < 0:
    raise SystemExit("--seeds must be >= 1 and --first-seed >= 0")
  if args.eval_points < 1:
    raise SystemExit("--eval-points must be >= 1")

  arm_sets: dict[str, list[str]] = {a: [] for a in ARMS}
  for item in args.arm_set:
    arm, sep, kv = item.partition(":")
    if not sep or arm not in ARMS or "=" not in kv:
      raise SystemExit(f"--arm-set takes ARM:KEY=VALUE with ARM one of {', '.join(ARMS)}: {item!r}")
    arm_sets[arm].append(kv)
  base = load_config(args.config, args.variant, args.set)  # a bad config fails here, at once
  for arm in arm_names:
    load_config(args.config, args.variant, [*args.set, *arm_sets[arm]])
  config = f"{args.config}:{args.variant}"
  out, work = pathlib.Path(args.out), pathlib.Path(args.workdir)
  for d in (out, work):
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
  eval_every = args.eval_every or args.seconds / args.eval_points
  t0 = time.time()
  seeds = list(range(args.first_seed, args.first_seed + args.seeds))
  runs = [
    _one_seed(
      config, args.set, arm_sets, seed, arm_names, work / f"seed{seed}", args.seconds, eval_every
    )
    for seed in seeds
  ]
  summary = summarize(runs, arm_names)
  rf = ResultFile(
    out / "results.json",
    series=f"bench_sync_vs_async/{base.name}/{'+'.join(arm_names)}",
    config=dataclasses.replace(base, rl=dataclasses.replace(base.rl, max_seconds=args.seconds)),
  )
  results = {
    "seeds": len(seeds),
    "seed_list": seeds,
    "seconds_per_arm": args.seconds,
    "eval_every_s": eval_every,
    "arm_overrides": {a: arm_sets[a] for a in arm_names},
    "method": {
      "process": "each arm a `sao-jax train` process tree of its own",
      "memory": "peak of the PSS summed over the arm's process tree, sampled every 1 s",
      "order": "arms in an order drawn per seed (runs[i].order)",
      "eval": "deferred held-out evals every eval_every_s training seconds, interpolated",
      "baseline": "the synchronous GRPO arm with the most learner steps/s over seeds",
    },
    "target_lengths": target_lengths(base),
    "runs": runs,
    "summary": summary,
    "wall_s": time.time() - t0,
    "loadavg_end": [round(x, 2) for x in os.getloadavg()],
  }
  rf.finish(results)
  results = rf.doc
  print_table(results)
  plot(results, out / "accuracy_vs_time.png")
  print(f"results: {out}/results.json")
  return results


def target_lengths(cfg) -> dict:
  """The lengths (tokens, EOS included) of the task family's worked solutions on the train
  split, what the SFT start imitates: the declared law in data, beside which the JSON's
  per-arm `length_hist` (what each arm generated) is read and the notebook plots it."""
  s = make_setup(cfg)
  return stats.length_summary(len(s.tok.encode(t.solution, add_eos=True)) for t in s.train)


def _train(config: str, workdir: pathlib.Path, sets: list[str]) -> tuple[dict, dict]:
  """One `sao-jax train` process tree (`sao_jax.procs.run_train`): its summary.json and its
  peak memory (PSS and RSS summed over the tree)."""
  return run_train(config, workdir, sets, cwd=REPO)


def _one_seed(
  config: str,
  sets: list[str],
  arm_sets: dict[str, list[str]],
  seed: int,
  arm_names: list[str],
  work: pathlib.Path,
  seconds: float,
  eval_every: float,
) -> dict:
  work.mkdir(parents=True, exist_ok=True)
  common = [*sets, f"seed={seed}"]
  sft, _ = _train(config, work / "sft", [*common, "rl.steps=0", "rl.max_seconds=0"])
  print(
    f"seed {seed}: SFT {sft['sft']['steps']} steps, held-out accuracy {sft['sft']['accuracy']:.3f}",
    flush=True,
  )
  order = [str(a) for a in np.random.default_rng((seed, 17)).permutation(arm_names)]
  run: dict = {"seed": seed, "order": order, "sft": sft["sft"]}
  for name in order:
    algorithm, sampling = ARMS[name]
    summary, mem = _train(
      config,
      work / name,
      [
        *common,
        f"init_from={work / 'sft'}",
        "sft.steps=0",
        "sft.max_seconds=0",
        "rl.steps=0",
        f"rl.max_seconds={seconds}",
        f"rl.algorithm={algorithm}",
        f"rl.sampling={sampling}",
        f"eval.every_seconds={eval_every}",
        "eval.deferred=True",
        *arm_sets[name],
      ],
    )
    info = summary["rl"]
    info.update(
      learner_steps_per_s=info["steps"] / info["seconds"],
      peak_tree_pss_mb=mem["pss_peak_mb"],
      peak_tree_rss_mb=mem["rss_peak_mb"],
      peak_tree_processes=mem["processes_peak"],
      memory_samples=mem["samples"],
      process_wall_s=mem["process_wall_s"],
      start_accuracy=summary.get("start", {}).get("accuracy"),
    )
    run[name] = info
    print(
      f"seed {seed}: {name} {info['steps']} steps, {info['trajectories_per_s']:.1f} traj/s, "
      f"held-out accuracy {info['accuracy']:.3f}, peak memory {mem['pss_peak_mb']:.0f} MiB "
      f"(PSS, {mem['processes_peak']} processes)",
      flush=True,
    )
  return run


if __name__ == "__main__":
  main()
