"""Delay and waste of SAO with its learner slowed by a competing job: the work ahead of the
learner bounded (`sao.backpressure=True`, the default) against the earlier bound (False), over
the embedded transport and over Kafka (a local broker started by each run), from one shared
SFT start per seed.

  python experiments/backpressure.py                               # 3 seeds x 4 arms x 120 s
  python experiments/backpressure.py --seeds 1 --seconds 20 --variant tiny   # smoke test

The competing job: `--hog` spinning processes (pure Python, one thread each). With the roles
pinned (the default, `samplers.pin_cores=True`: learner on core 0, samplers on the others) they
are pinned to the learner's core, so the learner runs at a fraction of its speed while the
samplers do not: the case where samplers out-produce it. `--no-pin` leaves every process
free to move (the hog then slows samplers and learner alike).

Arms (order drawn per seed, recorded): {embedded, kafka} x {loose (backpressure off),
bounded (on)}, named e.g. kafka_bounded, each a `sao-jax train` process tree with init_from
the seed's SFT run, for `--seconds` of RL. Per arm, from its summary.json and metrics:
trajectories consumed and the share dropped as stale (and as of a discarded lineage), learner
busy, sampling->training delay (mean, p95), staleness (mean of the updates' means),
trajectories/s, tasks redelivered by the transport and duplicate records. Mean ± s.e. over
seeds per arm; writes OUT/results.json and prints the table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import shutil
import time

import numpy as np

from sao_jax import stats
from sao_jax.procs import CpuHog, run_train
from sao_jax.results_file import ResultFile
from sao_jax.setup import load_config

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
TRANSPORTS = ("embedded", "kafka")
BOUNDS = {"loose": False, "bounded": True}  # arm suffix -> sao.backpressure
ARMS = [f"{t}_{b}" for t in TRANSPORTS for b in BOUNDS]
ROWS = [
  ("stale_share", "dropped as stale / consumed", "{:.1%}"),
  ("lineage_share", "dropped as of a discarded lineage / consumed", "{:.1%}"),
  ("learner_busy", "learner busy fraction", "{:.1%}"),
  ("delay_mean_s", "sampling->training delay mean (s)", "{:.2f}"),
  ("delay_p95_s", "sampling->training delay p95 (s)", "{:.2f}"),
  ("staleness_mean", "staleness of the trained, mean (versions)", "{:.2f}"),
  ("trajectories_per_s", "trajectories consumed/s", "{:.1f}"),
  ("used_per_s", "trajectories trained on/s", "{:.1f}"),
  ("steps", "learner updates", "{:.0f}"),
  ("task_redelivered", "tasks redelivered by the transport", "{:.0f}"),
  ("duplicates", "duplicate records", "{:.0f}"),
  ("accuracy", "final held-out accuracy", "{:.1%}"),
]


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--config", default=str(HERE / "configs" / "sao_arith.py"))
  p.add_argument("--variant", default="default")
  p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
  p.add_argument("--seconds", type=float, default=120.0, help="RL training seconds per arm")
  p.add_argument("--seeds", type=int, default=3)
  p.add_argument("--first-seed", type=int, default=0)
  p.add_argument("--hog", type=int, default=1, help="spinning processes beside each arm (0: none)")
  p.add_argument("--no-pin", action="store_true", help="roles and hog not pinned to cores")
  p.add_argument("--arms", default=",".join(ARMS), help=f"some of {', '.join(ARMS)}")
  p.add_argument("--out", default="results/backpressure", help="results.json (committed)")
  p.add_argument("--workdir", default="runs/backpressure", help="every run's files (large)")
  args = p.parse_args(argv)
  arms = [a for a in ARMS if a in args.arms.split(",")]
  if not arms or set(args.arms.split(",")) - set(ARMS):
    raise SystemExit(f"--arms takes some of {', '.join(ARMS)}, got {args.arms!r}")
  if args.seeds < 1 or args.first_seed < 0 or args.hog < 0:
    raise SystemExit("--seeds must be >= 1, --first-seed and --hog >= 0")
  pin = not args.no_pin
  if pin and (os.cpu_count() or 1) < 2:
    raise SystemExit("pinned roles need at least 2 CPU cores (or pass --no-pin)")
  sets = [*args.set, f"samplers.pin_cores={pin}"]
  base = load_config(args.config, args.variant, sets)  # a bad config fails here, at once
  config = f"{args.config}:{args.variant}"
  out, work = pathlib.Path(args.out), pathlib.Path(args.workdir)
  for d in (out, work):
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
  hog_cores = (0,) if pin else ()
  t0 = time.time()
  seeds = list(range(args.first_seed, args.first_seed + args.seeds))
  runs = []
  for seed in seeds:
    runs.append(_one_seed(config, sets, seed, arms, work / f"seed{seed}", args, hog_cores))
  summary = {a: {k: stats.summarize([r[a].get(k) for r in runs]) for k, _, _ in ROWS} for a in arms}
  rf = ResultFile(
    out / "results.json",
    series=f"backpressure/{base.name}",
    config=dataclasses.replace(base, rl=dataclasses.replace(base.rl, max_seconds=args.seconds)),
  )
  rf.finish(
    {
      "seeds": len(seeds),
      "seed_list": seeds,
      "seconds_per_arm": args.seconds,
      "competing_job": {
        "processes": args.hog,
        "kind": "pure-Python spin loop, one thread each",
        "cores": list(hog_cores) or "any",
        "roles_pinned": pin,
      },
      "arms": {
        a: {"transport": a.split("_")[0], "sao.backpressure": BOUNDS[a.split("_")[1]]} for a in arms
      },
      "runs": runs,
      "summary": summary,
      "wall_s": time.time() - t0,
    }
  )
  print_table(rf.doc, arms)
  print(f"results: {out}/results.json")
  return rf.doc


def _one_seed(config, sets, seed, arms, work: pathlib.Path, args, hog_cores) -> dict:
  work.mkdir(parents=True, exist_ok=True)
  common = [*sets, f"seed={seed}"]
  sft, _ = run_train(config, work / "sft", [*common, "rl.steps=0", "rl.max_seconds=0"], cwd=REPO)
  print(f"seed {seed}: SFT held-out accuracy {sft['sft']['accuracy']:.3f}", flush=True)
  order = [str(a) for a in np.random.default_rng((seed, 23)).permutation(arms)]
  run: dict = {"seed": seed, "order": order, "sft": sft["sft"]}
  for arm in order:
    transport, bound = arm.split("_")
    wd = work / arm
    with CpuHog(args.hog, hog_cores):
      summary, _ = run_train(
        config,
        wd,
        [
          *common,
          f"init_from={work / 'sft'}",
          "sft.steps=0",
          "sft.max_seconds=0",
          "rl.steps=0",
          f"rl.max_seconds={args.seconds}",
          "rl.algorithm=sao",
          f"transport.kind={transport}",
          f"sao.backpressure={BOUNDS[bound]}",
        ],
        cwd=REPO,
      )
    run[arm] = arm_metrics(summary["rl"], wd / "metrics.jsonl")
    m = run[arm]
    print(
      f"seed {seed}: {arm}: {m['stale_share']:.1%} stale, busy {m['learner_busy']:.1%}, "
      f"delay {m['delay_mean_s']:.2f} s, staleness {m['staleness_mean']:.2f}, "
      f"{m['steps']} updates",
      flush=True,
    )
  return run


def arm_metrics(rl: dict, metrics_path: pathlib.Path) -> dict:
  """What this experiment reads of one run: its summary's counts and rates, the shares of
  the consumed records dropped, and the mean staleness of the trained trajectories."""
  rows = [
    json.loads(line)
    for line in metrics_path.read_text().splitlines()
    if line.strip() and '"phase": "rl"' in line
  ]
  staleness = [r["staleness_mean"] for r in rows if "staleness_mean" in r]
  consumed = max(rl["trajectories"], 1)
  used = rl["trajectories"] - rl["dropped_stale"] - rl.get("dropped_lineage", 0)
  keys = (
    "steps",
    "seconds",
    "trajectories",
    "dropped_stale",
    "dropped_lineage",
    "duplicates",
    "task_redelivered",
    "learner_busy",
    "learner_busy_steady",
    "delay_mean_s",
    "delay_p95_s",
    "trajectories_per_s",
    "accuracy",
    "length_mean",
  )
  return {
    **{k: rl.get(k) for k in keys},
    "stale_share": rl["dropped_stale"] / consumed,
    "lineage_share": rl.get("dropped_lineage", 0) / consumed,
    "used_per_s": rl["trajectories_per_s"] * used / consumed,
    "staleness_mean": float(np.mean(staleness)) if staleness else None,
  }


def print_table(doc: dict, arms: list[str]) -> None:
  sm = doc["summary"]
  job = doc["competing_job"]
  print(
    f"\n{doc['seeds']} seeds, mean ± s.e.; competing job: {job['processes']} spinning "
    f"process(es) on cores {job['cores']} (roles pinned: {job['roles_pinned']})"
  )
  print(f"{'':46s}" + "".join(f"{a:>20s}" for a in arms))
  for key, label, spec in ROWS:
    pct = "%" in spec
    spec = spec.replace("%", "f") if pct else spec
    cells = [
      stats.fmt(sm[a][key], spec, 100.0 if pct else 1.0) + ("%" if pct and sm[a][key] else "")
      for a in arms
    ]
    print(f"{label:46s}" + "".join(f"{c:>20s}" for c in cells))


if __name__ == "__main__":
  main()
