"""Soak run: SAO training for a long stretch with faults injected on a schedule.

  python experiments/soak.py                         # 30 training minutes (~40 min wall)
  python experiments/soak.py --minutes 3 --fault-every 40 --variant tiny   # smoke test

One `sao-jax train` run (the default SAO config, embedded transport, snapshots every 100
updates, shadows every 50) is driven through faults, one every `--fault-every` seconds
(jittered ±50 %, seeded), cycling through:
  kill_learner        kill -9 the learner, rerun the same command (resume from snapshot);
  kill_sampler        kill -9 one sampler process (the learner restarts its samplers);
  corrupt_and_kill    kill -9 the learner, damage its newest snapshot, rerun (fall back);
and NaN gradients injected in the update itself (`faults.nan_steps`, fixed in advance:
isolated ones are skipped, bursts of three trigger a rollback to the best shadow).
At the end the journal/ledger audit counts trajectories lost and applied twice (both must
be 0). Writes OUT/soak.json and prints a table: updates, faults survived, rollbacks,
skipped updates, recovery times (process start -> first update after a restart, as the
resumed learner logs it), trajectories lost.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import time

import numpy as np

from sao_jax.procs import descendants, kill_and_wait
from sao_jax.results_file import ResultFile

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
FAULTS = ("kill_learner", "kill_sampler", "corrupt_and_kill")


def _ledger_lines(workdir: pathlib.Path) -> int:
  path = workdir / "ledger.jsonl"
  return path.read_text().count("\n") if path.exists() else 0


def _nan_schedule(rng, est_updates: int) -> list[int]:
  """A few isolated NaN updates and two bursts of three (each burst: one rollback)."""
  singles = sorted(rng.choice(np.arange(60, est_updates), size=4, replace=False).tolist())
  bursts = [int(est_updates * f) for f in (0.4, 0.8)]
  steps = set(singles)
  for b in bursts:
    steps.update((b, b + 1, b + 2))
    steps.difference_update(range(b - 25, b))  # keep singles out of the burst's window
  return sorted(steps)


def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--minutes", type=float, default=30.0, help="SAO training minutes")
  p.add_argument("--fault-every", type=float, default=150.0, help="seconds between faults")
  p.add_argument("--variant", default="default")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument(
    "--est-updates-per-s",
    type=float,
    default=0.8,
    help="for placing the NaN schedule inside the run",
  )
  p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
  p.add_argument("--out", default=str(REPO / "results" / "soak"))
  p.add_argument(
    "--report-only",
    action="store_true",
    help="recompute OUT/soak.json's report from OUT/run and the attempt logs",
  )
  p.add_argument(
    "--resume",
    action="store_true",
    help="continue the run in OUT/run (e.g. after the driver itself stopped), "
    "keeping the fault log of OUT/soak.json",
  )
  args = p.parse_args()

  out = pathlib.Path(args.out)
  workdir = out / "run"
  if (args.report_only or args.resume) and not (out / "soak.json").exists():
    p.error(f"--report-only and --resume read {out / 'soak.json'}: there is none")
  # The run's config is the train command's (its workdir's config.json): the NaN steps are
  # drawn here, so a resumed soak is checked on its series alone.
  rf = ResultFile(
    out / "soak.json",
    series=f"soak/{args.variant}",
    resume=args.resume or args.report_only,
  )
  previous = {k: v for k, v in rf.kept.items() if k not in rf.doc}  # its data, not its header
  if args.report_only:
    return _report(previous, out, workdir, previous["returncode"], rf)
  if not args.resume:
    shutil.rmtree(workdir, ignore_errors=True)
  out.mkdir(parents=True, exist_ok=True)
  rng = np.random.default_rng(args.seed + 1000 * bool(args.resume))
  seconds = args.minutes * 60
  nan_steps = previous.get("nan_steps") or _nan_schedule(rng, int(seconds * args.est_updates_per_s))
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)
  cmd = [
    sys.executable,
    "-m",
    "sao_jax.cli",
    "train",
    "--config",
    f"{HERE / 'configs' / 'sao_arith.py'}:{args.variant}",
    "--workdir",
    str(workdir),
    "--no-progress",
    "--set",
    f"rl.max_seconds={seconds}",
    "--set",
    "rl.steps=0",
    "--set",
    "recovery.keep_journal=True",
    "--set",
    f"faults.nan_steps=({','.join(map(str, nan_steps))},)",
    *sum((["--set", kv] for kv in args.set), []),
  ]
  events: list[dict] = previous.get("faults", [])
  attempt = previous.get("attempts", 0)
  t0 = time.time() - previous.get("wall_s", 0.0)
  driver_restarts = previous.get("driver_restarts", []) + (
    [
      {
        "t": round(t0 + previous.get("wall_s", 0.0) - t0, 1),
        "previous_returncode": previous.get("returncode"),
      }
    ]
    if previous
    else []
  )
  fault_i = 0
  proc = None
  try:
    while True:
      attempt += 1
      log = open(out / f"attempt_{attempt}.log", "w")
      proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
      start_lines = _ledger_lines(workdir)
      while proc.poll() is None and _ledger_lines(workdir) <= start_lines:
        time.sleep(0.5)  # wait for RL updates (after SFT on the first attempt)
      next_fault = time.time() + args.fault_every * rng.uniform(0.5, 1.5)
      while proc.poll() is None:
        if time.time() >= next_fault:
          kind = FAULTS[fault_i % len(FAULTS)]
          fault_i += 1
          step = _ledger_lines(workdir)
          if kind == "kill_sampler":
            samplers = [
              q
              for q in descendants(proc.pid)
              if b"spawn_main" in pathlib.Path(f"/proc/{q}/cmdline").read_bytes()
            ]
            if samplers:
              os.kill(samplers[0], signal.SIGKILL)
              events.append({"fault": kind, "t": time.time() - t0, "at_update": step})
              print(f"[soak] {time.time() - t0:7.0f}s  {kind} at update ~{step}", flush=True)
            next_fault = time.time() + args.fault_every * rng.uniform(0.5, 1.5)
            continue
          orphans = kill_and_wait(proc, whole_group=False, timeout=30, poll=0.2)
          ev = {"fault": kind, "t": time.time() - t0, "at_update": step, "orphans": len(orphans)}
          if kind == "corrupt_and_kill":
            ckdir = workdir / "checkpoints" / "rl"
            steps = sorted(int(d.name) for d in ckdir.iterdir() if d.name.isdigit())
            if steps:
              for f in (ckdir / str(steps[-1])).rglob("*"):
                if f.is_file() and "params" in str(f) and f.stat().st_size:
                  f.write_bytes(b"\0corrupt")
              ev["corrupted_snapshot"] = steps[-1]
          events.append(ev)
          print(f"[soak] {time.time() - t0:7.0f}s  {kind} at update ~{step}", flush=True)
          break
        time.sleep(0.5)
      log.close()
      if proc.returncode is not None and proc.returncode != -signal.SIGKILL:
        break  # finished (or failed: reported below)
  finally:
    if proc is not None and proc.poll() is None:
      proc.kill()
      proc.wait()
  wall = time.time() - t0
  rc = proc.returncode
  result: dict = {
    "machine": platform.processor() or platform.machine(),
    "cpus": os.cpu_count(),
    "minutes": args.minutes,
    "wall_s": round(wall, 1),
    "returncode": rc,
    "attempts": attempt,
    "faults": events,
    "driver_restarts": driver_restarts,
    "nan_steps": nan_steps,
  }
  return _report(result, out, workdir, rc, rf)


def _report(result: dict, out: pathlib.Path, workdir: pathlib.Path, rc: int, rf) -> int:
  """Adds the run's numbers to `result`. Fault counts come from the driver's log and the
  attempt logs, not from the final summary: the summary's counters describe the lineage of
  the final state, which forgets events between a snapshot and the crash that followed it."""
  if rc == 0:
    from sao_jax import checkpoint as ckpt
    from sao_jax import recovery
    from sao_jax.metrics import read_jsonl

    summary = json.loads((workdir / "summary.json").read_text())
    rl = summary["rl"]
    _, meta = ckpt.read_meta(workdir / "checkpoints" / "rl")
    audit = recovery.audit(workdir, meta["stream"]["journal_next"])
    rows = read_jsonl(workdir / "metrics.jsonl")
    resumes = [r for r in rows if r.get("event") == "resume"]
    rec = [r["recovery_s"] for r in resumes if "recovery_s" in r]
    # A rollback redone while replaying after a crash is logged again: count each once.
    rollbacks = list({r["step"]: r for r in rows if r.get("event") == "rollback"}.values())
    logs = "".join(f.read_text(errors="replace") for f in sorted(out.glob("attempt_*.log")))
    skipped = {r["step"] for r in rows if r.get("phase") == "rl" and r.get("nonfinite_skipped")}
    result.update(
      updates=rl["steps"],
      final_accuracy=rl["accuracy"],
      start_accuracy=summary["sft"]["accuracy"],
      trajectories=rl["trajectories"],
      rollbacks=len(rollbacks),
      rollbacks_in_final_lineage=rl["rollbacks"],
      rollback_events=[
        {k: r[k] for k in ("step", "reason", "to_shadow_step", "lr_scale")} for r in rollbacks
      ],
      # each update is once in the final lineage, so its skip count is exact
      skipped_nonfinite=rl["nonfinite_skipped"],
      skipped_nonfinite_logged_steps=sorted(skipped),
      sampler_restarts=logs.count("; restarting it ("),
      learner_kills=sum(f["fault"] != "kill_sampler" for f in result["faults"]),
      sampler_kills=sum(f["fault"] == "kill_sampler" for f in result["faults"]),
      resumes=len(resumes),
      recovery_s=rec,
      recovery_median_s=statistics.median(rec) if rec else None,
      fallbacks=sum(len(r.get("skipped_snapshots", [])) for r in resumes),
      audit=audit,
      trajectories_lost=audit["lost"],
      applied_twice=audit["applied_twice"],
      final_metrics_finite=all(math.isfinite(v) for v in (rl["accuracy"],)),
    )
  rf.finish(result)
  print(json.dumps({k: v for k, v in result.items() if k not in ("faults", "audit")}, indent=2))
  if rc == 0:
    print("\n| what | value |\n|---|---|")
    for k in (
      "updates",
      "trajectories",
      "learner_kills",
      "resumes",
      "sampler_kills",
      "sampler_restarts",
      "fallbacks",
      "rollbacks",
      "skipped_nonfinite",
      "recovery_median_s",
      "trajectories_lost",
      "applied_twice",
      "start_accuracy",
      "final_accuracy",
    ):
      print(f"| {k} | {result[k]} |")
  print(f"\nwrote {out / 'soak.json'}")
  return 0 if rc == 0 and result.get("trajectories_lost") == 0 else 1


if __name__ == "__main__":
  sys.exit(main())
