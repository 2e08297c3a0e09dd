"""Does a run that was killed learn as well as one that was not? Killed vs uninterrupted SAO.

  python experiments/kill_lineage.py --sft-steps 100 --seeds 0,1,2        # weak start
  python experiments/kill_lineage.py --sft-steps 300 --seeds 0,1,2        # normal start
  python experiments/kill_lineage.py --quick                               # smoke test
  python experiments/kill_lineage.py --table results/kill_lineage/fit      # the tables

For each seed, two `sao-jax train` runs of the same config, seed and SFT start (SFT is
deterministic on the CPU, so both arms start from the same model), each over Kafka with its
own external broker (started here, outliving every learner process), for `--rl-seconds` of
RL training time (`rl.max_seconds`: a resumed run carries its training clock over, so both
arms train for the same time, the killed one in many pieces):
  uninterrupted  runs to the end;
  killed         is killed with SIGKILL `--kills` times during RL and restarted with the same
                 command each time; the moments rotate over `--rotation` (default: a random
                 update, a parameter file being published, a random update, a publish, an
                 Orbax snapshot being written; see `experiments/chaos.py`), alternating
                 between the whole process group and the learner alone. Five kills per
                 snapshot interval so that all of them fit in the run (a resume goes back to
                 the last snapshot, and the run ends when its RL clock does: with one
                 snapshot kill in three, only 14-16 of 20 kills fitted in 150 s at
                 snapshots every 20 updates); the result records the kills done.
The arms' order is drawn per seed and recorded. Per run: held-out accuracy and format rate
(the final evaluation), mean staleness and off-policy deviation (|pi/mu - 1|) over every
update, over the last 20 updates, stale and discarded-lineage drops (over every incarnation:
the event log's counters), the restart transients (`summary.json` "transients", where the
learner writes them), and the Kafka audit: trajectories lost and applied twice, read from
the broker. Writes OUT/sft<S>_seed<k>.json per seed (each arm written as it finishes;
--resume keeps the finished ones).
"""

from __future__ import annotations

import argparse
import pathlib
import random
import sys

import chaos  # (the script's folder is on the path: the kill moments, processes, Kafka audit)
import numpy as np

from sao_jax import interrupt, stats
from sao_jax.config import load_config
from sao_jax.metrics import read_jsonl
from sao_jax.results_file import ResultFile, config_file_id, load

HERE = pathlib.Path(__file__).resolve().parent
CONFIG = str(HERE / "configs" / "sao_arith.py")
ARMS = ("uninterrupted", "killed")
ROTATION = "rl,publish,rl,publish,snapshot"
LAST = 20  # the last updates' off-policy deviation: where the run ended up


def overrides(args, seed: int) -> list[str]:
  return [
    f"seed={seed}",
    f"sft.steps={args.sft_steps}",
    f"rl.max_seconds={args.rl_seconds}",
    "rl.steps=0",
    f"checkpoint_every={args.checkpoint_every}",
    "recovery.keep_journal=True",
    "log_every=1",
    "transport.kind=kafka",
    *args.set,
  ]


def run_arm(arm: str, workdir: pathlib.Path, sets: list[str], args, rng: random.Random) -> dict:
  from sao_jax.transport.broker import LocalBroker

  workdir.mkdir(parents=True)
  broker = LocalBroker(log_dir=str(workdir.parent / f"{arm}_broker")).start()
  run = chaos.Run(
    workdir,
    [*sets, f"transport.bootstrap_servers={broker.bootstrap}"],
    workdir.parent / f"{arm}.log",
    config=args.config,
  )
  kills, moments = [], args.rotation.split(",")
  try:
    run.start()
    for k in range(args.kills if arm == "killed" else 0):
      hit = chaos.kill_at(run, moments[k % len(moments)], rng, args.target_wait)
      if not hit:
        print(f"  the run finished before kill {k + 1}", flush=True)
        break
      kills.append({"hit": hit, "at_update": run.updates(), "whole_group": k % 2 == 0})
      run.kill(whole_group=k % 2 == 0)
      run.start()
    run.proc.wait(timeout=args.finish_timeout)
    rc = run.proc.returncode
    audit = chaos.audit_kafka(broker.bootstrap, workdir, 4)
  finally:
    if run.running():
      run.kill(whole_group=True)
    broker.stop()
  if arm == "killed" and len(kills) < args.kills:
    print(f"  only {len(kills)} of {args.kills} kills fitted in the run", flush=True)
  return dict(measure(workdir), returncode=rc, kills=kills, kills_done=len(kills), audit=audit)


def measure(workdir: pathlib.Path) -> dict:
  """What a finished run's workdir says (every incarnation's updates and counters)."""
  summary = load(workdir / "summary.json") if (workdir / "summary.json").exists() else {}
  rl = summary.get("rl", {})
  rows = [r for r in read_jsonl(workdir / "metrics.jsonl") if r.get("phase") == "rl"]
  updates = [r for r in rows if "loss" in r]
  counts = (rl.get("lifetime") or {}).get("counts", {})

  def mean(key, rs):
    xs = [r[key] for r in rs if r.get(key) is not None]
    return float(np.mean(xs)) if xs else None

  consumed, stale = counts.get("consumed", 0), counts.get("dropped_stale", 0)
  discarded = counts.get("dropped_lineage", 0)
  return {
    "accuracy": rl.get("accuracy"),
    "format_rate": rl.get("format_rate"),
    "updates": len(updates),
    "final_step": rl.get("steps"),
    "staleness_mean": mean("staleness_mean", updates),
    "is_dev_mean": mean("is_dev", updates),
    "is_dev_last": mean("is_dev", updates[-LAST:]),
    "kl_behaviour_mean": mean("kl_behaviour", updates),
    "delay_mean": mean("delay_mean", updates),
    "consumed": consumed,
    "dropped_stale": stale,
    "dropped_lineage": discarded,
    "weighted_lineage": counts.get("weighted_lineage", 0),  # (sao.discarded_lineage="weight")
    "dropped_frac": (stale + discarded) / max(consumed + stale + discarded, 1),
    "duplicates": counts.get("duplicates", 0),
    "incarnations": (rl.get("lifetime") or {}).get("incarnations"),
    "transients": rl.get("transients"),
  }


def paired_arms(folder: pathlib.Path, sft_steps: int, seed: int, run_here: list[str]) -> dict:
  """The arms of the same seed and start in another series' finished result file: those not
  run here under their own names, those run here too under '<arm>_<folder name>'."""
  path = folder / f"sft{sft_steps}_seed{seed}.json"
  if not path.exists():
    raise SystemExit(f"--pair-with: {path} does not exist (run that series' seed first)")
  other = load(path)
  if not other.get("complete"):
    raise SystemExit(f"--pair-with: {path} is not finished")
  return {
    (f"{arm}_{folder.name}" if arm in run_here else arm): dict(a, copied_from=str(path))
    for arm, a in other.get("arms", {}).items()
  }


COLUMNS = (  # (key in an arm's results, heading, format, scale)
  ("accuracy", "accuracy %", "{:.1f}", 100),
  ("format_rate", "format %", "{:.1f}", 100),
  ("staleness_mean", "staleness", "{:.2f}", 1),
  ("is_dev_mean", "|pi/mu-1| %", "{:.2f}", 100),
  ("dropped_frac", "dropped %", "{:.1f}", 100),
  ("kills_done", "kills", "{:.0f}", 1),
)


def table(folders: list[str]) -> None:
  """Prints each result folder's arms per start, mean ± s.e. over its seeds, the paired
  killed - uninterrupted difference (95 % t-interval), and lost / applied twice at most."""
  for folder in folders:
    files = sorted(pathlib.Path(folder).glob("sft*_seed*.json"))
    by_start: dict[int, list[dict]] = {}
    for f in files:
      doc = load(f)
      if doc.get("complete"):
        by_start.setdefault(doc["sft_steps"], []).append(doc)
    for start, docs in sorted(by_start.items()):
      seeds = [d["seed"] for d in docs]
      print(f"\n{folder}: SFT {start} steps, seeds {seeds}")
      print(f"{'arm':26s}" + "".join(f"{h:>22s}" for _, h, _, _ in COLUMNS) + "   lost twice")
      arms = sorted({a for d in docs for a in d["arms"]})
      for arm in arms:
        got = [d["arms"][arm] for d in docs if arm in d["arms"]]
        cells = [
          stats.fmt(stats.summarize([a.get(k) for a in got]), spec, scale)
          for k, _, spec, scale in COLUMNS
        ]
        lost = max(a["audit"]["lost"] for a in got)
        twice = max(a["audit"]["applied_twice"] for a in got)
        print(f"{arm:26s}" + "".join(f"{c:>22s}" for c in cells) + f"   {lost:4d} {twice:5d}")
      for arm in [a for a in arms if a.startswith("killed")]:  # vs uninterrupted, and a
        # variant of the killed arm vs the paired series' killed arm (killed - killed_fit)
        ctrls = [a for a in arms if a.startswith("uninterrupted")]
        ctrls += [a for a in arms if arm == "killed" and a.startswith("killed_")]
        for ctrl in ctrls:
          pairs = [d["arms"] for d in docs if arm in d["arms"] and ctrl in d["arms"]]
          diff = stats.seed_stats([p[arm]["accuracy"] - p[ctrl]["accuracy"] for p in pairs])
          print(
            f"  {arm} - {ctrl}: accuracy {100 * diff.mean:+.1f} ± {100 * diff.se:.1f} points "
            f"(95 % CI {100 * diff.ci_low:+.1f} .. {100 * diff.ci_high:+.1f}, n={diff.n})"
          )


def main(argv=None) -> int:
  interrupt.driver_signals()  # a kill stops the run trees and brokers too
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--config", default=CONFIG)
  p.add_argument("--sft-steps", type=int, default=100)
  p.add_argument("--seeds", default="0,1,2")
  p.add_argument("--kills", type=int, default=20)
  p.add_argument("--rl-seconds", type=float, default=150.0)
  p.add_argument("--checkpoint-every", type=int, default=20)
  p.add_argument(
    "--rotation",
    default=ROTATION,
    help=f"the kill moments in turn, of rl, publish, snapshot (default {ROTATION})",
  )
  p.add_argument(
    "--arms",
    default=",".join(ARMS),
    help="the arms to run (e.g. 'killed' for a variant of the killed arm alone)",
  )
  p.add_argument(
    "--pair-with",
    default="",
    help="another series' result folder: its arms of the same seed are copied into each "
    "file (those run here too under '<arm>_<its folder name>'), e.g. the uninterrupted arm "
    "for a variant of the killed one run alone (--arms killed)",
  )
  p.add_argument(
    "--target-wait",
    type=float,
    default=60.0,
    help="seconds to wait for a snapshot or publish moment before a random one instead",
  )
  p.add_argument("--finish-timeout", type=float, default=3600.0)
  p.add_argument("--set", action="append", default=[], help="more config overrides")
  p.add_argument("--label", default="", help="a tag for the series (e.g. 'before')")
  p.add_argument("--quick", action="store_true", help="tiny config, one seed, 3 kills, 40 s")
  p.add_argument("--resume", action="store_true")
  p.add_argument(
    "--table",
    action="append",
    default=[],
    metavar="FOLDER",
    help="print the finished result files of FOLDER (repeatable) as tables, run nothing",
  )
  p.add_argument("--out", default="results/kill_lineage", help="result files (one per seed)")
  p.add_argument(
    "--workdir",
    default="runs/kill_lineage",
    help="the runs' workdirs and brokers go to WORKDIR/<name of --out> (~150 MB per seed)",
  )
  args = p.parse_args(argv)
  if args.table:
    table(args.table)
    return 0
  moments = args.rotation.split(",")
  if not set(moments) <= {"rl", "publish", "snapshot"}:
    p.error(f"--rotation takes moments of rl, publish, snapshot, not {args.rotation!r}")
  arms_run = [a for a in args.arms.split(",") if a]
  if not arms_run or set(arms_run) - set(ARMS):
    p.error(f"--arms takes {', '.join(ARMS)}, not {args.arms!r}")
  if args.quick:
    args.config = CONFIG + ":tiny"
    args.seeds, args.kills, args.rl_seconds, args.sft_steps = "0", 3, 40.0, 20
    args.checkpoint_every, args.target_wait = 10, 5.0
  out = pathlib.Path(args.out).absolute()
  out.mkdir(parents=True, exist_ok=True)
  runs = pathlib.Path(args.workdir).absolute() / out.name
  series = f"kill_lineage/sft{args.sft_steps}" + (f"/{args.label}" if args.label else "")
  settings = {
    "sft_steps": args.sft_steps,
    "kills": args.kills,
    "rl_seconds": args.rl_seconds,
    "checkpoint_every": args.checkpoint_every,
    "rotation": args.rotation,
    "target_wait": args.target_wait,
    "arms_run": arms_run,  # ("arms" holds the arms' results)
    "quick": args.quick,
  }
  for seed in [int(s) for s in args.seeds.split(",")]:
    sets = overrides(args, seed)
    rf = ResultFile(
      out / f"sft{args.sft_steps}_seed{seed}.json",
      series=series,
      config=load_config(args.config, overrides=sets),
      resume=args.resume,
      argv=sys.argv if argv is None else argv,
      settings=settings,
    )
    rng = random.Random(seed)
    order = list(ARMS)
    rng.shuffle(order)  # (drawn over both arms whichever run: the same order in each series)
    order = [a for a in order if a in arms_run]
    arms = dict(rf.kept.get("arms", {}))
    if args.pair_with:  # (each copied arm names its file: copied_from)
      arms.update(paired_arms(pathlib.Path(args.pair_with), args.sft_steps, seed, arms_run))
    rf.update(config_file=config_file_id(args.config), seed=seed, order=order, arms=arms)
    for arm in order:
      if arm in arms:
        continue
      print(f"seed {seed}, SFT {args.sft_steps}: {arm}", flush=True)
      work = runs / f"sft{args.sft_steps}_seed{seed}" / arm / "run"
      if work.exists():
        raise SystemExit(f"{work} exists: pass a new --workdir (or remove it to run it again)")
      arms[arm] = run_arm(arm, work, sets, args, random.Random(f"{seed}-{arm}"))
      a = arms[arm]
      print(
        f"  accuracy {a['accuracy']}, format {a['format_rate']}, staleness "
        f"{a['staleness_mean']}, |pi/mu-1| {a['is_dev_mean']}, dropped stale {a['dropped_stale']}"
        f" / lineage {a['dropped_lineage']}, weighed {a['weighted_lineage']}; lost "
        f"{a['audit']['lost']}, twice "
        f"{a['audit']['applied_twice']}",
        flush=True,
      )
      rf.write(done=arm)
    rf.finish()
  print(f"wrote {out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
