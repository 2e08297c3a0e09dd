"""sao_jax.procs.kill_and_wait: the fault scripts' SIGKILL of a run and wait for what was
below it."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from sao_jax.procs import alive, descendants, kill_and_wait

# a parent with one child that outlives it unless killed with it
PARENT = ["sh", "-c", "sleep 30 & wait"]


def _with_child() -> tuple[subprocess.Popen, int]:
  proc = subprocess.Popen(PARENT, start_new_session=True)
  deadline = time.time() + 10
  while not descendants(proc.pid) and time.time() < deadline:
    time.sleep(0.01)
  (child,) = descendants(proc.pid)
  return proc, child


def test_kill_and_wait_takes_the_whole_group():
  proc, child = _with_child()
  try:
    assert kill_and_wait(proc, whole_group=True, timeout=10) == []
    assert proc.returncode == -signal.SIGKILL and not alive(child)
  finally:
    if alive(child):
      os.kill(child, signal.SIGKILL)


def test_kill_and_wait_alone_returns_the_child_left_running():
  proc, child = _with_child()
  try:
    t0 = time.time()
    assert kill_and_wait(proc, whole_group=False, timeout=0.3, poll=0.05) == [child]
    assert proc.returncode == -signal.SIGKILL and 0.3 <= time.time() - t0 < 5
  finally:
    os.killpg(proc.pid, signal.SIGKILL)  # the child is still in the parent's group
  deadline = time.time() + 10
  while alive(child) and time.time() < deadline:
    time.sleep(0.01)
  assert not alive(child)


def test_cpu_hog_spins_pinned_and_is_gone_afterwards():
  from sao_jax.procs import CpuHog

  with CpuHog(2, cores=(0,)) as hog:
    pids = [p.pid for p in hog.procs]
    time.sleep(0.5)
    assert all(alive(pid) for pid in pids)
    assert all(os.sched_getaffinity(pid) == {0} for pid in pids)
    # spinning: each has used CPU time already (utime in clock ticks, field 14 of stat)
    ticks = [int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[11]) for pid in pids]
    assert all(t > 0 for t in ticks), ticks
  assert not any(alive(pid) for pid in pids)
