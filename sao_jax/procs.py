"""Process helpers (Linux /proc): stopping sampler processes, pinning a whole process to
cores, and, for fault injection, finding the processes of a run (the soak run and the fault
tests kill some and check that none is left behind)."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time
from collections.abc import Sequence


def train_argv(config: str, workdir, overrides: Sequence[str] = ()) -> list[str]:
  """The command line of a `sao-jax train` subprocess of `config` ("path:name") into
  `workdir`, without the progress bar, with each "key=value" of `overrides` as a `--set`
  (this interpreter, so the subprocess runs the same installation)."""
  return [
    sys.executable,
    "-m",
    "sao_jax.cli",
    "train",
    "--config",
    config,
    "--workdir",
    str(workdir),
    "--no-progress",
  ] + [a for kv in overrides for a in ("--set", kv)]


def run_train(
  config: str, workdir, overrides: Sequence[str] = (), *, cwd=None
) -> tuple[dict, dict]:
  """Runs one `sao-jax train` of `config` into `workdir` as a process tree of its own and
  returns (its summary.json, its peak memory from `TreeMemoryPeak` with "process_wall_s").
  Its output goes to `workdir`.log; on a failure, or when this process is interrupted, the
  whole tree is stopped; a failed run raises RuntimeError with the log's tail."""
  import json

  workdir = pathlib.Path(workdir)
  log_path = workdir.with_suffix(".log")
  t0 = time.monotonic()
  with open(log_path, "w") as log:
    proc = subprocess.Popen(
      train_argv(config, workdir, overrides),
      cwd=cwd,
      stdout=log,
      stderr=subprocess.STDOUT,
      start_new_session=True,  # its own process group: stopped as a whole
    )
    memory = TreeMemoryPeak(proc.pid).start()
    try:
      proc.wait()
    finally:
      mem = memory.stop()
      if proc.poll() is None:
        kill_and_wait(proc, whole_group=True, timeout=10)
  if proc.returncode != 0:
    tail = log_path.read_text()[-3000:]
    raise RuntimeError(f"sao-jax train into {workdir} failed ({proc.returncode}):\n{tail}")
  summary = json.loads((workdir / "summary.json").read_text())
  return summary, dict(mem, process_wall_s=time.monotonic() - t0)


class CpuHog:
  """A competing job: `processes` processes that spin (pure Python, one thread each), each
  pinned to `cores` when given. A context manager; every process is killed and reaped on
  exit, whatever happened inside."""

  def __init__(self, processes: int = 1, cores: Sequence[int] = ()):
    self.n, self.cores = processes, tuple(cores)
    self.procs: list[subprocess.Popen] = []

  def __enter__(self) -> CpuHog:
    pin = f"os.sched_setaffinity(0, {set(self.cores)!r})\n" if self.cores else ""
    code = f"import os\n{pin}while True:\n  pass\n"
    self.procs = [
      subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL)
      for _ in range(self.n)
    ]
    return self

  def __exit__(self, *exc) -> None:
    for proc in self.procs:
      proc.kill()
    for proc in self.procs:
      proc.wait()
    self.procs = []


def _children() -> dict[int, list[int]]:
  """Every process's children, from one pass over /proc."""
  kids: dict[int, list[int]] = {}
  for d in pathlib.Path("/proc").iterdir():
    if d.name.isdigit():
      try:
        ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
      except (OSError, IndexError, ValueError):
        continue
      kids.setdefault(ppid, []).append(int(d.name))
  return kids


def descendants(pid: int) -> list[int]:
  """Every process below `pid` (children, their children, ...)."""
  kids, out, frontier = _children(), [], [pid]
  while frontier:
    below = kids.get(frontier.pop(), [])
    out += below
    frontier += below
  return out


def tree_memory_mb(pid: int) -> dict[str, float]:
  """Memory now of `pid` and every process below it, in MiB (Linux /proc smaps_rollup):
  "pss" sums each process's proportional set size, so that a page shared by processes (the
  libraries each of them maps, a copy-on-write page) is counted once in all; "rss" sums
  their resident sets, counting a shared page in each process; "processes" how many."""
  pss = rss = n = 0
  for p in [pid, *descendants(pid)]:
    try:
      text = pathlib.Path(f"/proc/{p}/smaps_rollup").read_text()
    except OSError:  # exited meanwhile
      continue
    fields = dict(line.split(":", 1) for line in text.splitlines()[1:] if ":" in line)
    try:
      pss += int(fields["Pss"].split()[0])
      rss += int(fields["Rss"].split()[0])
    except (KeyError, ValueError, IndexError):
      continue
    n += 1
  return {"pss": pss / 1024, "rss": rss / 1024, "processes": n}


class TreeMemoryPeak:
  """The peak of `tree_memory_mb(pid)` (PSS and RSS, each its own peak), sampled every
  `interval` seconds on a thread from `start()` to `stop()`: one method for a process tree
  of any shape (a learner alone, or with its sampler processes and broker)."""

  def __init__(self, pid: int, interval: float = 1.0):
    import threading

    self.pid, self.interval = pid, interval
    self.peak = {"pss": 0.0, "rss": 0.0, "processes": 0}
    self.samples = 0
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True, name="tree-memory")

  def _run(self) -> None:
    while not self._stop.is_set():
      now = tree_memory_mb(self.pid)
      if now["processes"]:
        self.samples += 1
        self.peak = {k: max(self.peak[k], v) for k, v in now.items()}
      self._stop.wait(self.interval)

  def start(self) -> TreeMemoryPeak:
    self._thread.start()
    return self

  def stop(self) -> dict:
    """Stops sampling; {"pss_peak_mb", "rss_peak_mb", "processes_peak", "samples",
    "interval_s"}."""
    self._stop.set()
    self._thread.join()
    return {
      "pss_peak_mb": self.peak["pss"],
      "rss_peak_mb": self.peak["rss"],
      "processes_peak": self.peak["processes"],
      "samples": self.samples,
      "interval_s": self.interval,
    }


def pin_process(cores) -> list[int]:
  """Confines every thread of this process to `cores`; returns the thread ids pinned.

  `os.sched_setaffinity(0, ...)` pins only the calling thread on Linux: the threads that
  already exist keep their old affinity. XLA starts its compute thread pool when the
  backend is first used, so a learner pinned that way still ran its updates on every core.
  Threads started afterwards inherit the mask of the thread that starts them."""
  cores = set(cores)
  task_dir = pathlib.Path("/proc/self/task")
  if not task_dir.is_dir():  # no /proc: the calling thread only
    os.sched_setaffinity(0, cores)
    return [0]
  pinned = []
  for d in task_dir.iterdir():
    try:
      os.sched_setaffinity(int(d.name), cores)
      pinned.append(int(d.name))
    except (ProcessLookupError, ValueError):  # a thread that ended meanwhile
      continue
  return pinned


def alive(pid: int) -> bool:
  """Running (a zombie waiting to be reaped counts as gone)."""
  try:
    return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
  except OSError:
    return False


def stop_processes(procs, timeout: float = 10.0) -> None:
  """Waits up to `timeout` seconds in all for multiprocessing `procs` to exit (their stop
  event set by the caller), then terminates, then kills what is left. Reaps all."""
  deadline = time.time() + timeout
  for p in procs:
    p.join(timeout=max(0.1, deadline - time.time()))
  for p in procs:
    if p.is_alive():
      p.terminate()
      p.join(timeout=5)
    if p.is_alive():
      p.kill()
      p.join()


def kill_and_wait(
  proc: subprocess.Popen, *, whole_group: bool, timeout: float, poll: float = 0.1
) -> list[int]:
  """SIGKILLs `proc` (with `whole_group`, its whole process group: started with
  `start_new_session=True`, its own and its children's), reaps it, then waits up to
  `timeout` seconds for the processes that were below it to exit (a sampler whose learner is
  gone exits by itself). Returns those still alive."""
  kids = descendants(proc.pid)  # read before the kill: orphans are re-parented at once
  try:
    if whole_group:
      os.killpg(proc.pid, signal.SIGKILL)
    else:
      os.kill(proc.pid, signal.SIGKILL)
  except ProcessLookupError:
    pass
  proc.wait()
  deadline = time.time() + timeout
  while any(alive(p) for p in kids) and time.time() < deadline:
    time.sleep(poll)
  return [p for p in kids if alive(p)]
