"""The asynchronous pipeline with real sampler processes: it trains, and every process it
starts is gone afterwards: on success, on Ctrl-C, and when samplers keep dying."""

import json
import os
import pathlib
import signal
import subprocess
import time
import uuid

import pytest
from conftest import subprocess_env, train_cmd

CFG = "experiments/configs/sao_arith.py:tiny"
LONG = ("--set", "rl.max_seconds=300", "--set", "rl.steps=0")  # runs until stopped
pytestmark = pytest.mark.slow


def _tagged_pids(tag: str) -> list[int]:
  """Processes whose environment carries `tag` (the run and everything it spawned)."""
  pids = []
  for d in pathlib.Path("/proc").iterdir():
    if d.name.isdigit():
      try:
        if tag.encode() in (d / "environ").read_bytes():
          pids.append(int(d.name))
      except OSError:
        pass
  return pids


def _start(repo_root, workdir, *extra):
  tag = f"SAO_JAX_TEST_TAG={uuid.uuid4().hex}"
  env = dict(subprocess_env(), SAO_JAX_TEST_TAG=tag.split("=")[1])
  proc = subprocess.Popen(
    train_cmd(CFG, workdir) + list(extra),
    cwd=repo_root,
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    start_new_session=True,  # a process group of its own, as a terminal gives a command
  )
  return proc, tag.split("=")[1]


@pytest.fixture
def start(repo_root):
  """`_start` in this checkout; every run it started, and the processes tagged with it, are
  killed at teardown, also when the test failed (a run left hanging would hold the host's
  CPU for the rest of the suite)."""
  runs = []

  def go(workdir, *extra):
    runs.append(_start(repo_root, workdir, *extra))
    return runs[-1]

  yield go
  for proc, tag in runs:
    if proc.poll() is None:
      proc.kill()
      proc.communicate()
    for pid in _tagged_pids(tag):
      try:
        os.kill(pid, signal.SIGKILL)
      except ProcessLookupError:
        pass


def _children(pid: int) -> list[int]:
  out = []
  for d in pathlib.Path("/proc").iterdir():
    if d.name.isdigit():
      try:
        if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
          out.append(int(d.name))
      except (OSError, IndexError, ValueError):
        pass
  return out


def _wait_for_rl_rows(workdir, proc, timeout=120):
  deadline = time.time() + timeout
  while time.time() < deadline:
    assert proc.poll() is None, proc.communicate()
    path = workdir / "metrics.jsonl"
    if path.exists() and '"phase": "rl"' in path.read_text():
      return
    time.sleep(0.5)
  raise AssertionError("no RL rows in time")


def test_sao_run_trains_and_cleans_up(start, tmp_path):
  proc, tag = start(tmp_path / "w", "--set", "rl.steps=14")
  out, err = proc.communicate(timeout=300)
  assert proc.returncode == 0, err
  summary = json.loads((tmp_path / "w" / "summary.json").read_text())
  rl = summary["rl"]
  assert rl["steps"] == 14 and rl["trajectories"] >= 14 * 16
  assert rl["bad_records"] == 0 and rl["duplicates"] == 0
  assert 0 < rl["learner_busy"] <= 1 and rl["delay_p95_s"] >= rl["delay_mean_s"] > 0
  assert 0 < rl["learner_busy_steady"] <= 1  # updates 11-14: after the start-up
  rows = [json.loads(x) for x in (tmp_path / "w" / "metrics.jsonl").read_text().splitlines()]
  rl_rows = [r for r in rows if r["phase"] == "rl"]
  for key in (
    "staleness_mean",
    "staleness_max",
    "staleness_hist",
    "is_dev",
    "kl_behaviour",
    "is_truncated_frac",
    "dropped_stale",
    "learner_busy",
    "queue_depth",
    "delay_mean",
    "trajectories_per_s",
    "peak_rss_all_mb",
  ):
    assert key in rl_rows[-1], key
  assert sum(rl_rows[-1]["staleness_hist"]) > 0
  # Backpressure (on by default): after every update, the tasks outstanding plus the records
  # buffered stay within one batch (16 rows) plus what 2 samplers of 8 slots hold in flight.
  ahead = [r["outstanding_tasks"] + r["queue_depth"] for r in rl_rows]
  assert max(ahead) <= 16 + 2 * 8, ahead
  assert _tagged_pids(tag) == []


def test_synchronous_grpo_through_the_samplers_with_deferred_evals(start, tmp_path):
  """rl.sampling='samplers': GRPO(N=8) one synchronous step at a time through the sampler
  processes (staleness 0), as the benchmark's `grpo_samplers` arm runs it, with its periodic
  evals deferred (eval.deferred: the parameters saved at each, evaluated after the phase)."""
  sets = ("rl.algorithm='grpo'", "rl.sampling='samplers'", "rl.steps=6")
  sets += ("eval.every_seconds=1e-9", "eval.deferred=True", "eval.num_problems=16")
  proc, tag = start(tmp_path / "w", *[a for kv in sets for a in ("--set", kv)])
  out, err = proc.communicate(timeout=300)
  assert proc.returncode == 0, err
  rl = json.loads((tmp_path / "w" / "summary.json").read_text())["rl"]
  assert rl["steps"] == 6 and rl["trajectories"] == 6 * 2 * 8  # prompts_per_step 2, N=8
  assert rl["dropped_stale"] == 0 and rl["transients"][0]["staleness_max"] == 0
  # The completion lengths' law, as the benchmark's JSON carries it: every trajectory binned.
  assert sum(rl["length_hist"]["counts"]) == rl["trajectories"] and rl["length_cv"] >= 0
  # An eval at each update (deferred: run after the phase, in order); the last step's is the
  # closing one (not evaluated twice).
  curve = rl["eval_curve"]
  assert [step for _, step, _ in curve] == [0, 1, 2, 3, 4, 5, 6], curve
  assert [t for t, _, _ in curve] == sorted(t for t, _, _ in curve)
  assert curve[-1][2] == rl["accuracy"] and all(0 <= a <= 1 for _, _, a in curve)
  assert not list((tmp_path / "w" / "deferred_eval" / "rl").iterdir())
  assert _tagged_pids(tag) == []


@pytest.mark.parametrize("to", ["learner", "group"])
def test_ctrl_c_stops_everything(start, tmp_path, to):
  """SIGINT to the learner alone, or to its whole process group as a terminal's Ctrl-C (the
  samplers then stop too: not a death the learner may restart them for)."""
  proc, tag = start(tmp_path / "w", *LONG)
  _wait_for_rl_rows(tmp_path / "w", proc)
  assert len(_children(proc.pid)) >= 2  # the samplers (plus multiprocessing's helper)
  if to == "group":
    os.killpg(proc.pid, signal.SIGINT)
  else:
    proc.send_signal(signal.SIGINT)
  # A guard against a hang, not a target (a Ctrl-C inside a TensorBoard write once hung the
  # run's close for good: MetricsWriter.close now bounds that wait).
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == 130 and "interrupted" in err, err[-3000:]
  assert "stopping at the end of this step" in err  # at a step boundary (sao_jax.interrupt)
  assert "Traceback" not in err and "restart" not in err, err[-3000:]
  deadline = time.time() + 10
  while _tagged_pids(tag) and time.time() < deadline:
    time.sleep(0.2)
  assert _tagged_pids(tag) == []


def test_a_sampler_dying_beyond_the_restart_budget_stops_the_run(start, tmp_path):
  """(Within the budget a dead sampler is restarted: tests/test_faults.py.)"""
  proc, tag = start(tmp_path / "w", *LONG, "--set", "samplers.max_restarts=0")
  _wait_for_rl_rows(tmp_path / "w", proc)
  samplers = [
    p
    for p in _children(proc.pid)
    if b"spawn_main" in pathlib.Path(f"/proc/{p}/cmdline").read_bytes()
  ]
  assert samplers
  os.kill(samplers[0], signal.SIGKILL)
  _, err = proc.communicate(timeout=120)  # a guard against a hang, as above
  assert proc.returncode != 0
  assert "died with exit code -9 and the run already restarted 0 samplers" in err
  deadline = time.time() + 10
  while _tagged_pids(tag) and time.time() < deadline:
    time.sleep(0.2)
  assert _tagged_pids(tag) == []
