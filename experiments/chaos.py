"""Chaos: kill -9 a training run at many random moments and audit that nothing was lost.

  python experiments/chaos.py                          # 20 kills over Kafka (an external
                                                       # broker), 20 over the embedded transport
  python experiments/chaos.py --transports kafka --kills 4       # smoke test
  python experiments/chaos.py --bucket s3://BUCKET/chaos          # snapshots and parameters
                                                       # only in a bucket (storage.url)

One `sao-jax train` run of the tiny SAO config per transport (SFT, then SAO; snapshots every
`--checkpoint-every` updates, the journal kept) is killed `--kills` times with SIGKILL and
restarted with the same command each time. The kill moments rotate over four targets:
  sft        during supervised warm-up (until it has finished),
  rl         a random moment of the RL phase,
  snapshot   while an Orbax snapshot is being written (its temporary folder exists),
  publish    while a parameter file for the samplers is being written (its temporary file
             exists);
a target that is not reached within `--target-wait` seconds falls back to a random RL moment
(the row says which moment it was). The kills alternate between the whole process group
(learner and samplers at once) and the learner alone (its samplers notice and exit).

The audit counts from outside the learner. Over Kafka, a consumer of the driver's own reads
every record of the trajectories topic from the broker (which outlives every learner
process): produced = records on the topic; every record before the learner group's final
committed offsets must be in the ledger (applied, or dropped: too stale or of a lineage a
resume discarded, both counted in the audit's `stale`) or on the dead-letter topic (rejected
at the learner's door, `rejected_dead_lettered`): lost = those that are neither; applied
twice = record ids that appear in more than one update of the ledger. Over the embedded
transport there is no broker to read from; the audit compares the journal (every
record the learner ever took, kept in full) with the ledger (`sao_jax.recovery.audit`).
Both check that the ledger's updates run 1..N without a gap. Writes OUT/chaos.json.

With `--bucket URL`, each transport's run keeps its snapshots and parameter versions in
`URL/<transport>` (`storage.url`; endpoint and credentials from the environment,
docs/deployment.md), and the learner's local snapshot folder is deleted after every kill, so
every restart resumes from the bucket alone. The `publish` moment (a local temporary file)
does not exist then: those kills fall back to a random RL moment.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import time

from sao_jax import interrupt, recovery
from sao_jax.config import load_config
from sao_jax.procs import kill_and_wait, train_argv
from sao_jax.results_file import ResultFile, config_file_id

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
CONFIG = str(HERE / "configs" / "sao_arith.py") + ":tiny"
TARGETS = ("sft", "rl", "snapshot", "publish")


class Run:
  """One `sao-jax train` command, started again after every kill."""

  def __init__(
    self,
    workdir: pathlib.Path,
    overrides: list[str],
    log_path: pathlib.Path,
    config: str = CONFIG,
  ):
    self.workdir, self.log_path = workdir, log_path
    self.cmd = train_argv(config, workdir, overrides)
    self.proc: subprocess.Popen | None = None
    self.env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}

  def start(self) -> None:
    with open(self.log_path, "ab") as log:
      self.proc = subprocess.Popen(
        self.cmd,
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=self.env,
      )

  def running(self) -> bool:
    return self.proc is not None and self.proc.poll() is None

  def kill(self, whole_group: bool) -> None:
    # the samplers of a learner killed alone exit by themselves within the wait
    for p in kill_and_wait(self.proc, whole_group=whole_group, timeout=60):
      os.kill(p, signal.SIGKILL)  # (never leave one behind, whatever happened)

  # What the run is doing, read from its workdir -------------------------------------------
  def sft_done(self) -> bool:
    progress = self.workdir / "progress.json"
    return progress.exists() and "sft" in json.loads(progress.read_text() or "{}")

  def in_sft(self) -> bool:
    metrics = self.workdir / "metrics.jsonl"
    return not self.sft_done() and metrics.exists() and '"phase": "sft"' in metrics.read_text()

  def updates(self) -> int:
    path = self.workdir / "ledger.jsonl"
    return path.read_text().count("\n") if path.exists() else 0

  def writing_snapshot(self) -> bool:
    d = self.workdir / "checkpoints" / "rl"
    return d.exists() and any(not n.isdigit() for n in os.listdir(d))

  def forget_local_snapshots(self) -> None:
    """Deletes the learner's local snapshot folder (a fresh disk: the bucket holds them)."""
    import shutil

    shutil.rmtree(self.workdir / "checkpoints", ignore_errors=True)

  def writing_params(self) -> bool:
    d = self.workdir / "params"
    return d.exists() and any(n.startswith(".") for n in os.listdir(d))


def _wait(cond, run: Run, timeout: float, poll: float = 0.002) -> bool:
  deadline = time.time() + timeout
  while time.time() < deadline:
    if not run.running():
      return False
    if cond():
      return True
    time.sleep(poll)
  return False


def kill_at(run: Run, target: str, rng: random.Random, wait_s: float) -> str:
  """Waits for `target`'s moment and returns the moment actually hit ('' if the run ended)."""
  if target == "sft" and not run.sft_done() and _wait(run.in_sft, run, wait_s, 0.1):
    time.sleep(rng.uniform(0.5, 4.0))
    if run.in_sft():
      return "sft"
  start = run.updates()
  if not _wait(lambda: run.updates() > start, run, 900, 0.1):
    return ""
  if target == "snapshot" and _wait(run.writing_snapshot, run, wait_s):
    return "snapshot"
  if target == "publish" and _wait(run.writing_params, run, wait_s):
    return "publish"
  time.sleep(rng.uniform(1.0, 8.0))
  return "rl" if run.running() else ""


def audit_kafka(bootstrap: str, workdir: pathlib.Path, partitions: int) -> dict:
  from sao_jax import config as config_lib
  from sao_jax.transport import kafka_security
  from sao_jax.transport.kafka import committed_offsets, topic_record_ids

  run_id = (workdir / "run_id").read_text().strip()
  topic = f"sao.{run_id}.trajectories"
  cfg = config_lib.read_saved(workdir / "config.json")
  security = kafka_security.from_config(cfg.transport)  # (a TLS / SASL broker: the run's own)
  on_topic = topic_record_ids(bootstrap, topic, partitions, security=security)
  committed = committed_offsets(
    bootstrap, f"sao.{run_id}.learner", topic, partitions, security=security
  )
  # Records the learner's door rejected (sao_jax.admission) went to the dead-letter topic,
  # flushed before any offset past them was committed: accounted for, not lost.
  dead = topic_record_ids(bootstrap, f"sao.{run_id}.dead-letter", 1, security=security)
  rejected = {rid for _, _, rid in dead}
  rejected.discard(None)
  rows = recovery.Ledger(workdir / "ledger.jsonl").rows()
  applied = collections.Counter(i for r in rows for i in r["applied"])
  uses = collections.Counter(i for r in rows for i in r["applied"] + r["stale"])
  used = set(uses)
  before_commit = {rid for part, off, rid in on_topic if off < committed[part] and rid}
  ids_on_topic = {rid for _, _, rid in on_topic if rid}
  return {
    "source": f"topic {topic} read from the broker",
    "produced": len(on_topic),
    "distinct_on_topic": len(ids_on_topic),
    "duplicates_on_topic": len(on_topic) - len(ids_on_topic),
    "covered_by_commits": len(before_commit),
    "applied": sum(applied.values()),
    "stale": sum(uses.values()) - sum(applied.values()),
    "rejected_dead_lettered": len(rejected & ids_on_topic),
    "lost": len(before_commit - used - rejected),
    "applied_twice": sum(1 for n in uses.values() if n > 1),
    "applied_not_on_topic": len(set(applied) - ids_on_topic),
    "unused_after_last_commit": len(ids_on_topic - used - rejected),
    "steps": len(rows),
    "steps_contiguous": [r["step"] for r in rows] == list(range(1, len(rows) + 1)),
  }


def audit_embedded(workdir: pathlib.Path) -> dict:
  from sao_jax import checkpoint as ckpt

  _, meta = ckpt.read_meta(workdir / "checkpoints" / "rl")
  a = recovery.audit(workdir, meta["stream"]["journal_next"])
  steps = len(recovery.Ledger(workdir / "ledger.jsonl").rows())
  return dict(a, steps=steps, source="journal (every record the learner took) vs ledger")


def run_overrides(args) -> list[str]:
  """The config overrides of every transport's run (each adds its `transport.kind`)."""
  return [
    f"rl.steps={args.rl_steps}",
    f"sft.steps={args.sft_steps}",
    f"checkpoint_every={args.checkpoint_every}",
    "recovery.keep_journal=True",
    "log_every=1",
    *args.set,
  ]


def chaos(transport: str, kills: int, out: pathlib.Path, args, rng: random.Random) -> dict:
  workdir = out / transport / "run"
  if workdir.exists():
    raise SystemExit(f"{workdir} exists: pass a new --out")
  workdir.mkdir(parents=True)
  overrides = [*run_overrides(args), f"transport.kind={transport}"]
  if args.bucket:
    overrides.append(f"storage.url={args.bucket.rstrip('/')}/{transport}")
  broker = None
  if transport == "kafka":  # external: started here, outlives every learner process
    from sao_jax.transport.broker import LocalBroker

    broker = LocalBroker(log_dir=str(out / transport)).start()
    overrides.append(f"transport.bootstrap_servers={broker.bootstrap}")
  run = Run(workdir, overrides, out / transport / "train.log")
  rows = []
  try:
    run.start()
    for k in range(kills):
      target, whole = TARGETS[k % len(TARGETS)], k % 2 == 0
      hit = kill_at(run, target, rng, args.target_wait)
      if not hit:
        print(f"{transport}: the run finished before kill {k + 1}; raise --rl-steps", flush=True)
        break
      step = run.updates()
      run.kill(whole_group=whole)
      if args.bucket:
        run.forget_local_snapshots()
      rows.append(
        {
          "kill": k + 1,
          "target": target,
          "hit": hit,
          "updates_in_ledger": step,
          "whole_group": whole,
          "t": round(time.time(), 1),
        }
      )
      print(
        f"{transport} kill {k + 1}/{kills}: {hit} ({'group' if whole else 'learner'}) at "
        f"update {step}",
        flush=True,
      )
      run.start()
    run.proc.wait(timeout=args.finish_timeout)
    rc = run.proc.returncode
    summary = json.loads((workdir / "summary.json").read_text()) if rc == 0 else {}
    audit = (
      audit_kafka(broker.bootstrap, workdir, 4) if transport == "kafka" else audit_embedded(workdir)
    )
  finally:
    if run.running():
      run.kill(whole_group=True)
    if broker is not None:
      broker.stop()
  rl = summary.get("rl", {})
  return {
    "overrides": overrides,
    "returncode": rc,
    "kills": rows,
    "hits": dict(collections.Counter(r["hit"] for r in rows)),
    "audit": audit,
    "final_accuracy": rl.get("accuracy"),
    "steps": rl.get("steps"),
    "lifetime": rl.get("lifetime"),
  }


def main(argv=None) -> int:
  interrupt.driver_signals()  # a kill stops the run tree and the broker too
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--transports", default="kafka,embedded")
  p.add_argument("--kills", type=int, default=20, help="per transport")
  p.add_argument("--rl-steps", type=int, default=600)
  p.add_argument("--sft-steps", type=int, default=150)
  p.add_argument("--checkpoint-every", type=int, default=10)
  p.add_argument("--target-wait", type=float, default=60.0)
  p.add_argument("--finish-timeout", type=float, default=3600.0)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--set", action="append", default=[])
  p.add_argument("--out", default="results/chaos")
  p.add_argument(
    "--bucket", default="", help="s3:// or gs:// prefix: snapshots and parameters only there"
  )
  args = p.parse_args(argv)
  out = pathlib.Path(args.out).absolute()
  out.mkdir(parents=True, exist_ok=True)
  rng = random.Random(args.seed)
  # The runs' resolved config but for `transport.kind`, which each transport's run sets.
  rf = ResultFile(
    out / "chaos.json",
    series="chaos/" + args.transports.replace(",", "+"),
    config=load_config(CONFIG, overrides=run_overrides(args)),
    argv=sys.argv if argv is None else argv,
  )
  result = rf.update(config_file=config_file_id(CONFIG), transports={}).doc
  ok = True
  for transport in args.transports.split(","):
    r = chaos(transport, args.kills, out, args, rng)
    result["transports"][transport] = r
    rf.write(done=transport)
    a = r["audit"]
    ok &= (
      r["returncode"] == 0 and a["lost"] == 0 and a["applied_twice"] == 0 and a["steps_contiguous"]
    )
    print(
      f"{transport}: {len(r['kills'])} kills {r['hits']}; exit {r['returncode']}; "
      f"audit: lost {a['lost']}, applied twice {a['applied_twice']}, steps "
      f"{'1..' + str(a.get('steps', '?')) if a['steps_contiguous'] else 'NOT contiguous'}",
      flush=True,
    )
  rf.finish()
  print(f"wrote {out / 'chaos.json'}")
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
