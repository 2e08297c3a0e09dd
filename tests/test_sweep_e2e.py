"""`sao-jax sweep` end to end, with real `sao-jax train` trials of the tiny GRPO config:
kill -9 of the sweep while trials run, no trial process outlives it, the rerun resumes and
the final table holds every trial once.

The trials run the SFT phase only (rl.steps=0; the metric is sft.accuracy): the sweep does
not care which phases a trial runs, and compiling the RL programs would double the test's
time. A snapshot every step gives the interrupted trials something to resume from.
"""

from __future__ import annotations

import csv
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest
from conftest import subprocess_env

from sao_jax.sweep import kill_leftovers, trial_processes

SWEEP = """
from sao_jax.sweep import Choice, Sweep


def get_sweep(variant="default"):
  return Sweep(name="e2e", config="experiments/configs/arith_grpo.py:tiny", strategy="grid",
               axes=(Choice("sft.optim.lr", (1e-3, 3e-3)),), seeds=2, metric="sft.accuracy",
               fixed=("sft.steps=4", "rl.steps=0", "eval.num_problems=8", "eval.batch_size=8",
                      "checkpoint_every=1"),
               report=("sft.format_rate", "wall_s"))
"""


def _events(d: pathlib.Path) -> list[dict]:
  p = d / "events.jsonl"
  return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


def _snapshots(d: pathlib.Path, trial: int) -> list[pathlib.Path]:
  return [p for p in (d / "trials" / str(trial) / "checkpoints").glob("*/*") if p.name.isdigit()]


@pytest.mark.slow
def test_sweep_kill_9_and_resume(repo_root, tmp_path):
  (tmp_path / "s.py").write_text(SWEEP)
  d = (tmp_path / "sweep").resolve()
  cmd = [
    sys.executable,
    "-m",
    "sao_jax.cli",
    "sweep",
    str(tmp_path / "s.py"),
    "--dir",
    str(d),
    "--parallel",
    "2",
    "--no-progress",
  ]
  proc = subprocess.Popen(
    cmd, cwd=repo_root, env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
  )
  try:
    deadline = time.time() + 240
    while time.time() < deadline:  # kill once 2 trials ended and a running one has a snapshot
      ev = _events(d)
      ended = {e["trial"] for e in ev if e["event"] == "end"}
      running = {e["trial"] for e in ev if e["event"] == "start"} - ended
      if len(ended) >= 2 and any(_snapshots(d, n) for n in running):
        break
      time.sleep(0.1)
    else:
      pytest.fail(f"the sweep never had 2 trials done and a snapshot in another: {_events(d)}")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    ev = _events(d)
    done_before = {e["trial"] for e in ev if e["event"] == "end"}
    interrupted = {e["trial"] for e in ev if e["event"] == "start"} - done_before
    with_snapshot = {n for n in interrupted if _snapshots(d, n)}
    assert len(done_before) >= 2 and with_snapshot
    t0 = time.time()
    while trial_processes(d) and time.time() - t0 < 10:
      time.sleep(0.1)
    assert not trial_processes(d), "trial processes outlived the killed sweep"
    out = subprocess.run(
      cmd, cwd=repo_root, env=subprocess_env(), capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert not trial_processes(d)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
    kill_leftovers(d)
  with open(d / "trials.csv") as f:
    rows = list(csv.DictReader(f))
  assert sorted((int(r["point"]), int(r["seed"])) for r in rows) == [(0, 0), (0, 1), (1, 0), (1, 1)]
  assert all(r["status"] == "complete" for r in rows), rows
  assert all(0.0 <= float(r["sft.accuracy"]) <= 1.0 for r in rows)
  assert all(float(r["wall_s"]) > 0 and float(r["trial_wall_s"]) > 0 for r in rows)
  ev = _events(d)
  for r in rows:
    n = int(r["trial"])
    starts = sum(e["event"] == "start" and e["trial"] == n for e in ev)
    ends = sum(e["event"] == "end" and e["trial"] == n for e in ev)
    assert ends == 1 and starts == int(r["attempts"]) == (2 if n in interrupted else 1), (n, r)
  assert sorted(p.name for p in (d / "trials").iterdir()) == ["0", "1", "2", "3"]
  # An interrupted trial with a snapshot resumed from it rather than starting over.
  for n in with_snapshot:
    log = (d / "trials" / str(n) / "train.log").read_text()
    assert "resuming the run in" in log, log[-1500:]
  for f in ("trials.json", "points.csv", "sweep.png"):
    assert (d / f).exists(), f
  # best_config.py only where the points can be told apart; the verdict says which.
  data = json.loads((d / "trials.json").read_text())
  assert (d / "best_config.py").exists() == (data["best"] is not None), data["verdict"]
