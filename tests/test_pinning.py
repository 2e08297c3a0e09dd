"""Pinning a process confines every thread, including XLA's compute threads that exist before
the pin (pinning only the calling thread left a 'pinned' learner computing on every core)."""

import os
import pathlib
import subprocess
import sys

import pytest

SCRIPT = r"""
import os, pathlib, sys, threading
import jax, jax.numpy as jnp
jnp.ones((256, 256)).sum().block_until_ready()  # XLA's thread pool exists now
started = threading.Event()
t = threading.Thread(target=started.wait, daemon=True)
t.start()
from sao_jax.procs import pin_process
core = int(sys.argv[1])
pinned = pin_process([core])
late = threading.Thread(target=started.wait, daemon=True)
late.start()
masks = {}
for d in pathlib.Path("/proc/self/task").iterdir():
  masks[int(d.name)] = sorted(os.sched_getaffinity(int(d.name)))
started.set()
print(len(pinned), len(masks), sorted({tuple(m) for m in masks.values()}))
"""


@pytest.mark.skipif(
  not pathlib.Path("/proc/self/task").is_dir() or len(os.sched_getaffinity(0)) < 2,
  reason="needs Linux /proc and two cores",
)
def test_pin_process_confines_every_thread(repo_root):
  core = max(os.sched_getaffinity(0))
  out = subprocess.run(
    [sys.executable, "-c", SCRIPT, str(core)],
    cwd=repo_root,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert out.returncode == 0, out.stderr[-2000:]
  n_pinned, n_threads, masks = out.stdout.strip().split(" ", 2)
  assert int(n_pinned) >= 3  # main, the waiting thread and XLA's pool at least
  assert masks == f"[({core},)]", (masks, n_threads)
