"""Fault tests with real processes: kill -9 the learner at random points and rerun, corrupt
the latest snapshot, kill a sampler, inject NaN gradients. Each must end in a finished run
with finite metrics, and the journal/ledger audit must find no trajectory lost and none
applied twice."""

import json
import math
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import kill9_when, subprocess_env, train_cmd

from sao_jax import checkpoint as ckpt
from sao_jax import recovery
from sao_jax.metrics import read_jsonl
from sao_jax.procs import descendants

pytestmark = pytest.mark.slow
CFG = "experiments/configs/sao_arith.py:tiny"
STEPS = 36
BASE = (
  "--set",
  f"rl.steps={STEPS}",
  "--set",
  "checkpoint_every=8",
  "--set",
  "log_every=1",
  "--set",
  "recovery.shadow_every=10",
  "--set",
  "recovery.val_problems=32",
  "--set",
  "recovery.keep_journal=True",
)


def _cmd(workdir, *extra):
  return train_cmd(CFG, workdir) + [*BASE, *extra]


def _ledger_steps(workdir) -> int:
  path = workdir / "ledger.jsonl"
  return path.read_text().count("\n") if path.exists() else 0


def _snapshot_steps(workdir) -> list[int]:
  """Steps of the finished snapshots (Orbax renames a step's folder to its number last)."""
  d = workdir / "checkpoints" / "rl"
  return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit()) if d.is_dir() else []


def _kill_learner_at(repo_root, workdir, at_step: int, *extra):
  """Starts the run and kill -9s the learner once `at_step` updates are in the ledger and
  two more than its newest snapshot (so that updates after the snapshot, with their metrics
  rows, were done and are redone after the restart, whatever the timing)."""

  def ready() -> bool:
    newest = max(_snapshot_steps(workdir), default=0)
    return _ledger_steps(workdir) >= max(at_step, newest + 2)

  # (The samplers and the broker notice that their learner is gone and exit by themselves.)
  kill9_when(_cmd(workdir, *extra), ready, timeout_s=240)


def _finish(repo_root, workdir, *extra) -> tuple[dict, str]:
  proc = subprocess.run(
    _cmd(workdir, *extra),
    cwd=repo_root,
    env=subprocess_env(),
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  return json.loads((workdir / "summary.json").read_text()), proc.stdout + proc.stderr


def _audit(workdir) -> dict:
  _, meta = ckpt.read_meta(workdir / "checkpoints" / "rl")
  return recovery.audit(workdir, meta["stream"]["journal_next"])


def _check_finished(workdir, summary):
  rl = summary["rl"]
  assert rl["steps"] == STEPS
  assert math.isfinite(rl["accuracy"]) and 0 <= rl["accuracy"] <= 1
  a = _audit(workdir)
  assert a["lost"] == 0 and a["applied_twice"] == 0 and a["not_consumed"] == 0, a
  assert a["steps_contiguous"], a
  # No record of a policy off the path of the lineage an update extended was trained on
  # (sao_jax.lineage): the killed incarnation's records after its snapshot are dropped.
  assert a["discarded_lineage_applied"] == 0, a
  assert a["applied"] + a["stale"] == a["consumed"] and a["applied"] == rl["trajectories"]
  rows = read_jsonl(workdir / "metrics.jsonl")
  last = [r for r in rows if r["phase"] == "rl"][-1]
  assert all(math.isfinite(last[k]) for k in ("loss", "grad_norm", "reward"))
  return a, rows


@pytest.mark.parametrize("seed", [0, 1])
def test_kill_9_the_learner_and_rerun(repo_root, tmp_path, seed):
  """Seed 0: a plain crash; the replayed updates reproduce the crashed run's metrics exactly.
  Seed 1: the latest snapshot is also corrupted; the resume falls back to the one before."""
  workdir = tmp_path / "w"
  at = int(np.random.default_rng(seed).integers(12, 28))
  _kill_learner_at(repo_root, workdir, at)
  steps_before = sorted(ckpt.manager(workdir / "checkpoints" / "rl").all_steps())
  if seed == 1:
    latest = workdir / "checkpoints" / "rl" / str(steps_before[-1])
    for f in latest.rglob("*"):
      if f.is_file() and "params" in str(f) and f.stat().st_size:
        f.write_bytes(b"\0garbage")
  summary, out = _finish(repo_root, workdir)
  rl = summary["rl"]
  assert rl["resumes"] == 1 and 0 < rl["recovery_s"] < 300
  print(f"recovery after kill -9 (seed {seed}): {rl['recovery_s']:.1f} s")
  audit, rows = _check_finished(workdir, summary)
  resume = [r for r in rows if r.get("event") == "resume"][0]
  # Where the restart's time went, stage by stage, adding up to the whole.
  stages = list(resume["breakdown_s"])
  assert stages[0] == "imports" and stages[-1] == "first_update", stages
  assert {"setup", "compile_init", "restore"} <= set(stages), stages
  assert abs(sum(resume["breakdown_s"].values()) - resume["recovery_s"]) < 0.5, resume
  assert resume["compile_cache"] == os.environ["SAO_JAX_CACHE"]
  # The event log counts both processes: the killed one's updates after its last snapshot
  # were done twice (once lost, once replayed), which the restored lineage cannot show.
  life = rl["lifetime"]
  assert life["incarnations"] == 2 and life["killed"] == 1 and life["resumes"] == 1, life
  assert len(life["recovery_s"]) == 1 and life["counts"]["consumed"] >= rl["trajectories"]
  expected_from = steps_before[-1] if seed == 0 else steps_before[-2]
  assert resume["from_step"] == expected_from, (steps_before, resume)
  if seed == 1:
    assert "unreadable" in out and resume["skipped_snapshots"] == [steps_before[-1]]
  # The resumed run is a new policy lineage; the killed one's records of versions after the
  # snapshot are of a discarded lineage: dropped and counted, never trained on.
  ledger = recovery.Ledger(workdir / "ledger.jsonl").rows()
  lineages = {r["lineage"] for r in ledger}
  assert len(lineages) == 2 and life["counts"]["lineages"] == 2, (lineages, life)
  assert rl["lineage"] in lineages and rl["dropped_lineage"] == audit["discarded_lineage_dropped"]
  if seed == 1:  # resumed 11 updates back: the journal held many of the lost lineage's records
    assert audit["discarded_lineage_dropped"] > 0, audit
  # The first updates of each lineage, the killed incarnation's (cut short by the kill) too.
  start, resumed = rl["transients"]
  assert (start["why"], resumed["why"]) == ("start", "resume"), rl["transients"]
  assert 0 < start["updates"] <= 20 and resumed["updates"] == min(20, STEPS - expected_from)
  assert resumed["dropped_lineage"] <= audit["discarded_lineage_dropped"]
  for t in (start, resumed):
    assert t["orphan_version"] == 0 and 0 <= t["staleness_mean"] <= t["staleness_max"], t
  # Updates after the snapshot were redone from the journal on the same batches until the
  # first that met a record of the lost lineage: on CPU the metrics of those steps match
  # the crashed run's bit for bit.
  by_step: dict[int, list[dict]] = {}
  for r in rows:
    if r["phase"] == "rl" and "loss" in r:
      by_step.setdefault(r["step"], []).append(r)
  redone = [s for s, rs in by_step.items() if len(rs) == 2]
  assert redone and min(redone) == resume["from_step"] + 1
  first_drop = min([r["step"] for r in ledger if r["discarded"]], default=STEPS + 1)
  for s in [s for s in redone if s < first_drop]:
    a, b = by_step[s]
    for k in ("loss", "grad_norm", "reward", "is_dev", "staleness_mean"):
      assert a[k] == b[k], (s, k, a[k], b[k])
  if seed == 0:
    _check_replay(repo_root, workdir)


def _replay(repo_root, workdir, *extra) -> tuple[int, dict, str]:
  proc = subprocess.run(
    [sys.executable, "-m", "sao_jax.cli", "replay", str(workdir), "--no-progress", *extra],
    cwd=repo_root,
    env=subprocess_env(),
    capture_output=True,
    text=True,
    timeout=600,
  )
  out = pathlib.Path(extra[extra.index("--out") + 1]) if "--out" in extra else workdir / "replay"
  report = json.loads((out / "replay.json").read_text()) if proc.returncode in (0, 1) else {}
  return proc.returncode, report, proc.stdout + proc.stderr


def _check_replay(repo_root, workdir):
  """`sao-jax replay` re-derives the whole asynchronous run, across its crash and resume, from
  the journal: every update's loss, gradient norm and parameter digest bit-identical, and the
  params at every kept snapshot too. A changed record is found at its step."""
  rc, report, out = _replay(repo_root, workdir)
  assert rc == 0, out[-3000:]
  assert report["all_equal"] and report["steps_replayed"] == STEPS, report
  assert report["snapshots_compared"] and report["snapshots_equal"], report
  assert all(r["ok"] for r in report["steps"])
  # The ledger says step 5's loss was different: replay --until 7 names step 5 and only it,
  # and leaves the state after step 7 and that update's batch for inspection.
  ledger = workdir / "ledger.jsonl"
  rows = [json.loads(line) for line in ledger.read_text().splitlines()]
  rows[4]["check"]["loss"] = np.nextafter(np.float32(rows[4]["check"]["loss"]), np.float32(9))
  rows[4]["check"]["loss"] = float(rows[4]["check"]["loss"])
  ledger.write_text("".join(json.dumps(r) + "\n" for r in rows))
  rc, report, out = _replay(repo_root, workdir, "--until", "7", "--out", str(workdir / "r7"))
  assert rc == 1, out[-3000:]
  assert report["steps_replayed"] == 7 and report["mismatched_steps"] == 1, report
  assert report["first_mismatch"]["step"] == 5 and report["first_mismatch"]["fields"] == ["loss"]
  state = report["state_at_until"]
  assert state["step"] == 7 and pathlib.Path(state["snapshot"]).is_dir()
  with np.load(report["batch_at_until"]) as batch:
    assert batch["tokens_bt"].shape[0] >= 1 and batch["valid_bt"].any()


def test_a_killed_sampler_is_restarted(repo_root, tmp_path):
  workdir = tmp_path / "w"
  proc = subprocess.Popen(
    _cmd(workdir),
    cwd=repo_root,
    env=subprocess_env(),
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
  )
  try:
    while _ledger_steps(workdir) < 8:
      assert proc.poll() is None, proc.communicate()[0][-3000:]
      time.sleep(0.1)
    samplers = [
      p
      for p in descendants(proc.pid)
      if b"spawn_main" in pathlib.Path(f"/proc/{p}/cmdline").read_bytes()
    ]
    os.kill(samplers[0], signal.SIGKILL)
    out, _ = proc.communicate(timeout=300)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  assert proc.returncode == 0, out[-3000:]
  assert "died with exit code -9; restarting it" in out
  # The surviving sampler finished and sent its in-flight trajectories before its restart.
  assert re.search(
    r"sampler \d: sent (\d+) of \1 in-flight trajectories before the restart", out
  ), out[-3000:]
  summary = json.loads((workdir / "summary.json").read_text())
  assert summary["rl"]["sampler_restarts"] == 1
  _check_finished(workdir, summary)


def test_nan_gradients_are_skipped_and_repeated_ones_roll_back(repo_root, tmp_path):
  workdir = tmp_path / "w"
  # One isolated NaN step (skipped), then three in a row (3 of the last 20: roll back).
  summary, out = _finish(repo_root, workdir, "--set", "faults.nan_steps=(3,25,26,27)")
  rl = summary["rl"]
  assert rl["nonfinite_skipped"] == 4 and rl["rollbacks"] == 1, rl
  assert "rollback at step 27 to shadow" in out
  _, rows = _check_finished(workdir, summary)
  skipped = {r["step"] for r in rows if r["phase"] == "rl" and r.get("nonfinite_skipped")}
  assert skipped == {3, 25, 26, 27}
  event = [r for r in rows if r.get("event") == "rollback"][0]
  assert event["lr_scale"] == 0.5 and event["to_shadow_step"] in (0, 10, 20)
  after = [r for r in rows if r["phase"] == "rl" and r["step"] > 27]
  assert after and all(r["lr_scale"] == 0.5 for r in after)
  before = [r for r in rows if r["phase"] == "rl" and r["step"] < 27]
  assert all(r["lr_scale"] == 1.0 for r in before)


def test_synchronous_grpo_resumed_equals_uninterrupted(repo_root, tmp_path):
  """GRPO has no timing-dependent inputs, so a run killed with -9 and resumed from its
  snapshot must log the same numbers as an uninterrupted run, step for step. (SAO matches
  on the replayed updates; after them its batches depend on when trajectories arrive, as
  they do between any two SAO runs.)"""
  cfg = "experiments/configs/arith_grpo.py:tiny"
  extra = ["--set", "rl.steps=16", "--set", "checkpoint_every=4", "--set", "log_every=1"]

  def cmd(w):
    return train_cmd(cfg, w) + extra

  a, b = tmp_path / "a", tmp_path / "b"
  subprocess.run(
    cmd(a), cwd=repo_root, env=subprocess_env(), check=True, capture_output=True, timeout=300
  )
  proc = subprocess.Popen(
    cmd(b),
    cwd=repo_root,
    env=subprocess_env(),
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
  )
  try:
    while (
      not (b / "metrics.jsonl").exists()
      or sum(r["phase"] == "rl" and r["step"] >= 9 for r in read_jsonl(b / "metrics.jsonl")) == 0
    ):
      assert proc.poll() is None
      time.sleep(0.05)
    proc.kill()
    proc.wait()
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  out = subprocess.run(
    cmd(b), cwd=repo_root, env=subprocess_env(), capture_output=True, text=True, timeout=300
  )
  assert out.returncode == 0, out.stderr[-3000:]
  assert "grpo: resuming from snapshot step" in out.stdout

  def last_per_step(w):
    rows = {}
    for r in read_jsonl(w / "metrics.jsonl"):
      if r["phase"] == "rl" and "loss" in r:
        rows[r["step"]] = r
    return rows

  ra, rb = last_per_step(a), last_per_step(b)
  assert sorted(ra) == sorted(rb) == list(range(1, 17))
  for step in ra:
    for k in ("loss", "grad_norm", "reward", "kl_behaviour"):
      assert ra[step][k] == rb[step][k], (step, k)
  sa = json.loads((a / "summary.json").read_text())["rl"]
  sb = json.loads((b / "summary.json").read_text())["rl"]
  assert sa["accuracy"] == sb["accuracy"]
