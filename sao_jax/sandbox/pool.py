"""A pool of sandbox workers that scores a batch of programs concurrently.

Each worker is a small process (`sao_jax.sandbox.worker`, standard library only) that runs
one sandbox at a time; a thread per worker in the caller's process feeds it jobs and waits
for the result, so the caller (a sampler between two decode calls, an evaluation) blocks
only on `map` or on the futures `submit` returns. Workers die with the process that owns
the pool, and the sandboxes with their workers, whatever way the owner ends.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import pathlib
import queue
import select
import subprocess
import sys
import time
import weakref
from collections.abc import Sequence

from sao_jax.sandbox.runner import (
  Isolation,
  Job,
  RunResult,
  remove_scratch_of,
  resolve_isolation,
)

# A worker that has not answered this long after a job's own limits is declared hung.
_WORKER_GRACE_S = 30.0
_PACKAGE_ROOT = str(pathlib.Path(__file__).resolve().parents[2])


def default_num_workers() -> int:
  """One worker per core this process may run on."""
  return max(1, len(os.sched_getaffinity(0)))


class _WorkerDied(Exception):
  pass


class _Worker:
  """One worker process and the pipe protocol to it; used by one thread at a time."""

  def __init__(self, iso: Isolation):
    self._iso = iso
    self.proc = self._spawn()

  def _spawn(self) -> subprocess.Popen:
    # An environment of its own: nothing of the caller's (tokens, keys) reaches the worker,
    # and sandboxes start from an empty one anyway.
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": _PACKAGE_ROOT}
    return subprocess.Popen(
      [
        sys.executable,
        "-B",
        "-s",
        "-m",
        "sao_jax.sandbox.worker",
        json.dumps(self._iso.to_dict()),
        str(os.getpid()),
      ],
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      env=env,
      close_fds=True,
    )

  def run(self, job: Job) -> RunResult:
    line = (json.dumps(job.to_dict()) + "\n").encode()
    try:
      self.proc.stdin.write(line)
      self.proc.stdin.flush()
    except (BrokenPipeError, ValueError) as err:
      raise _WorkerDied("the worker's input is closed") from err
    fd = self.proc.stdout.fileno()
    deadline = time.monotonic() + job.limits.wall_s + _WORKER_GRACE_S + 15.0
    buf = b""
    while not buf.endswith(b"\n"):
      left = deadline - time.monotonic()
      if left <= 0:
        raise _WorkerDied("the worker stopped answering")
      ready, _, _ = select.select([fd], [], [], left)
      if ready:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
          raise _WorkerDied(f"the worker exited ({self.proc.poll()})")
        buf += chunk
    return RunResult.from_dict(json.loads(buf))

  def restart(self) -> None:
    self.close(timeout=0.0)
    self.proc = self._spawn()

  def close(self, timeout: float = 2.0) -> None:
    try:
      self.proc.stdin.close()
    except OSError:
      pass
    try:
      self.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
      self.proc.kill()
      self.proc.wait()
    self.proc.stdout.close()
    remove_scratch_of(self.proc.pid, self._iso)  # a worker killed mid-job cleaned up nothing


class SandboxPool:
  """Scores programs in sandboxes, `num_workers` at a time (default: one per core).

  Use it as a context manager (or call `close`); it is also closed when garbage-collected
  and at interpreter exit. `isolation` and `bwrap_path` are passed to `resolve_isolation`,
  which runs the start-up probe (and warns once if it falls back to rlimits).

    with SandboxPool() as pool:
      results = pool.map([Job(program, tests) for program in programs])
  """

  def __init__(
    self, num_workers: int | None = None, *, isolation: str = "auto", bwrap_path: str | None = None
  ):
    if num_workers is not None and (not isinstance(num_workers, int) or num_workers < 1):
      raise ValueError(f"num_workers must be an int >= 1, got {num_workers!r}")
    self.isolation = resolve_isolation(isolation, bwrap_path)
    self.num_workers = num_workers or default_num_workers()
    self._workers: list[_Worker] = []
    self._idle: queue.SimpleQueue[_Worker] = queue.SimpleQueue()
    self._executor = concurrent.futures.ThreadPoolExecutor(
      self.num_workers, thread_name_prefix="sandbox"
    )
    self._finalizer = weakref.finalize(self, _shutdown, self._executor, self._workers)
    try:
      for _ in range(self.num_workers):
        worker = _Worker(self.isolation)
        self._workers.append(worker)
        self._idle.put(worker)
    except BaseException:
      self.close()
      raise

  def submit(self, job: Job) -> concurrent.futures.Future[RunResult]:
    """Queues `job`; the future's result is its RunResult (never an exception for anything
    the program does; a worker that dies is restarted and the job reported "crashed")."""
    if not self._finalizer.alive:
      raise RuntimeError("SandboxPool is closed")
    return self._executor.submit(self._run, job)

  def map(self, jobs: Sequence[Job]) -> list[RunResult]:
    """Runs `jobs` concurrently; results in the same order."""
    futures = [self.submit(job) for job in jobs]
    return [f.result() for f in futures]

  def worker_pids(self) -> list[int]:
    return [w.proc.pid for w in self._workers]

  def _run(self, job: Job) -> RunResult:
    worker = self._idle.get()
    try:
      return worker.run(job)
    except _WorkerDied as err:
      worker.restart()
      return RunResult(
        "crashed",
        0,
        len(job.tests),
        0.0,
        detail=f"sandbox worker: {err}",
        isolation=self.isolation.mode,
      )
    finally:
      self._idle.put(worker)

  def close(self) -> None:
    """Waits for running jobs (bounded by their limits), drops queued ones, stops workers."""
    self._finalizer()

  def __enter__(self) -> SandboxPool:
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def _shutdown(executor: concurrent.futures.ThreadPoolExecutor, workers: list[_Worker]) -> None:
  executor.shutdown(wait=True, cancel_futures=True)
  for worker in workers:
    worker.close()
