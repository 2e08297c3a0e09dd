"""Process helpers (Linux /proc): stopping sampler processes, and, for fault injection,
finding the processes of a run (the soak run and the fault tests kill some and check that
none is left behind)."""

from __future__ import annotations

import pathlib
import time


def descendants(pid: int) -> list[int]:
  """Every process below `pid` (children, their children, ...)."""
  out, frontier = [], [pid]
  while frontier:
    parent = frontier.pop()
    for d in pathlib.Path("/proc").iterdir():
      if d.name.isdigit():
        try:
          if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == parent:
            out.append(int(d.name))
            frontier.append(int(d.name))
        except (OSError, IndexError, ValueError):
          pass
  return out


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
