"""Process-tree helpers (Linux /proc) for fault injection: the soak run and the fault tests
kill processes of a run and check that none is left behind."""
from __future__ import annotations

import pathlib


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
