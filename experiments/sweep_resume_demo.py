"""kill -9 a running sweep halfway, rerun the same command, and count: trials finished before
the kill, trials interrupted, trials after the resume, duplicates and lost trials.

Runs `sao-jax sweep SWEEP --dir DIR --parallel P` as a user would, waits until `--kill-after`
trials have ended (and another is running), sends SIGKILL to the sweep process, checks that
no trial process outlives it, reruns the same command to the end, and writes DIR's reports
plus demo.json (command, numbers, git commit, machine) into OUT.

Run (24 tiny GRPO trials, ~4 min on a quiet 2-core CPU):
  python experiments/sweep_resume_demo.py --out results/sweep_resume_demo
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import shutil
import signal
import subprocess
import sys
import time

from sao_jax.results_file import ResultFile
from sao_jax.sweep import kill_leftovers, trial_processes

REPORTS = (
  "trials.csv",
  "trials.json",
  "points.csv",
  "sweep.png",
  "best_config.py",
  "events.jsonl",
  "sweep.json",
)


def _events(d: pathlib.Path) -> list[dict]:
  p = d / "events.jsonl"
  if not p.exists():
    return []
  out = []
  for line in p.read_text().splitlines():
    try:
      out.append(json.loads(line))
    except json.JSONDecodeError:
      continue  # a line being written
  return out


def _snapshots(d: pathlib.Path, trial: int) -> list[pathlib.Path]:
  return [p for p in (d / "trials" / str(trial) / "checkpoints").glob("*/*") if p.name.isdigit()]


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--sweep", default="experiments/sweeps/grpo_lr_tiny.py")
  p.add_argument(
    "--dir",
    default="runs/sweep_resume_demo",
    help="the sweep's DIR (trial workdirs; not committed)",
  )
  p.add_argument("--out", default="results/sweep_resume_demo")
  p.add_argument("--parallel", type=int, default=2)
  p.add_argument("--kill-after", type=int, default=12, help="ended trials before the kill")
  args = p.parse_args(argv)
  d = pathlib.Path(args.dir).resolve()
  out = pathlib.Path(args.out)
  if d.exists():
    shutil.rmtree(d)
  cmd = [
    "sao-jax",
    "sweep",
    args.sweep,
    "--dir",
    args.dir,
    "--parallel",
    str(args.parallel),
    "--no-progress",
  ]
  run_cmd = [sys.executable, "-m", "sao_jax.cli", *cmd[1:]]
  t0 = time.time()
  proc = subprocess.Popen(run_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  try:
    while True:
      ev = _events(d)
      ended = {e["trial"] for e in ev if e["event"] == "end"}
      running = {e["trial"] for e in ev if e["event"] == "start"} - ended
      # Halfway, with as many trials running as --parallel allows (several interrupted),
      # one of them far enough to have a snapshot to resume from.
      if (
        len(ended) >= args.kill_after
        and len(running) >= args.parallel
        and any(_snapshots(d, n) for n in running)
      ):
        break
      if proc.poll() is not None:
        raise SystemExit(f"the sweep ended ({proc.returncode}) before the kill")
      time.sleep(0.1)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  t_kill = time.time() - t0
  ev = _events(d)
  done_before = sorted({e["trial"] for e in ev if e["event"] == "end"})
  interrupted = sorted({e["trial"] for e in ev if e["event"] == "start"} - set(done_before))
  with_snapshot = [n for n in interrupted if _snapshots(d, n)]
  time.sleep(5.0)
  survivors = trial_processes(d)
  kill_leftovers(d)
  print(
    f"killed after {t_kill:.0f} s: {len(done_before)} trials done, {len(interrupted)} "
    f"running ({interrupted}); trial processes alive 5 s later: {len(survivors)}",
    flush=True,
  )
  t1 = time.time()
  rerun = subprocess.run(run_cmd, capture_output=True, text=True)
  t_resume = time.time() - t1
  if rerun.returncode != 0:
    print(rerun.stdout[-3000:], rerun.stderr[-3000:], file=sys.stderr)
    return 1
  data = json.loads((d / "trials.json").read_text())
  rows, sweep = data["trials"], data["sweep"]
  ev = _events(d)
  pairs = [(r["point"], r["seed"]) for r in rows]
  expected = len(data["points"]) * sweep["seeds"]
  ends: dict[int, int] = {}
  starts: dict[int, int] = {}
  for e in ev:
    if e["event"] in ("start", "end"):
      bucket = starts if e["event"] == "start" else ends
      bucket[e["trial"]] = bucket.get(e["trial"], 0) + 1
  result = {
    "command": " ".join(cmd),
    "demo_command": "python experiments/sweep_resume_demo.py "
    + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()),
    "trials_planned": expected,
    "trials_done_before_kill": len(done_before),
    "trials_running_at_kill": interrupted,
    "trial_processes_alive_5s_after_kill": len(survivors),
    "trials_in_final_table": len(rows),
    "trials_complete_after_resume": sum(r["status"] == "complete" for r in rows),
    "status": {s: sum(r["status"] == s for r in rows) for s in {r["status"] for r in rows}},
    "duplicates": (len(pairs) - len(set(pairs))) + sum(n - 1 for n in ends.values() if n > 1),
    "lost": expected - len(set(pairs)) + sum(r["status"] in ("running", "waiting") for r in rows),
    "done_before_kill_started_again": sum(starts.get(n, 0) - 1 for n in done_before),
    "interrupted_rerun_attempts": {n: starts.get(n, 0) for n in interrupted},
    "interrupted_with_snapshot": with_snapshot,
    "resumed_from_snapshot": [
      n
      for n in with_snapshot
      if "resuming the run in" in (d / "trials" / str(n) / "train.log").read_text()
    ],
    "seconds_to_kill": round(t_kill, 1),
    "seconds_resume": round(t_resume, 1),
    "best": json.loads(rerun.stdout[rerun.stdout.index("{") :]).get("best"),
    "machine": {
      "platform": platform.platform(),
      "cpus": os.cpu_count(),
      "python": platform.python_version(),
      "jax": __import__("jax").__version__,
    },
  }
  out.mkdir(parents=True, exist_ok=True)
  for f in REPORTS:
    if (d / f).exists():
      shutil.copy(d / f, out / f)
  # No JAX backend here: the sweep's trials ran in their own processes.
  rf = ResultFile(out / "demo.json", series="sweep_resume_demo", devices=False)
  rf.finish(result)
  print(json.dumps(result, indent=2))
  ok = result["duplicates"] == 0 and result["lost"] == 0 and not survivors
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
