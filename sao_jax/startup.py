"""Where a process's start-up time goes, and the compilation cache that shortens it.

`mark(name)` records the first time a named start-up stage finished, in seconds since this
process loaded sao_jax; `breakdown(names)` turns marks into durations per stage (what a resume
logs: imports, task load, compile, restore, sampler start, first batch, first update).

`enable_compile_cache` turns on JAX's persistent compilation cache. A restarted learner or
sampler then loads its programs from disk instead of compiling them again. The cache key is
JAX's own: the lowered program, the compile options, the backend and the jax/jaxlib versions,
so a change of code or config that changes a program compiles it anew, and anything else is
reused. Settings: "user" (a per-user directory: $SAO_JAX_CACHE, else $XDG_CACHE_HOME/sao_jax/xla
or ~/.cache/sao_jax/xla), "workdir" (WORKDIR/xla_cache), "off", or a directory path.
"""

from __future__ import annotations

import os
import pathlib
import time

import sao_jax

MARKS: dict[str, float] = {}
# Programs that compile faster than this are not worth a file each.
MIN_COMPILE_S = 0.2
MAX_CACHE_BYTES = 2 << 30  # least recently used entries go first beyond this


def mark(name: str, at: float | None = None) -> float:
  """Seconds since the process loaded sao_jax (until now, or until the time `at` when the
  stage ended earlier), recorded under `name` the first time."""
  return MARKS.setdefault(name, (time.time() if at is None else at) - sao_jax.PROCESS_T0)


def breakdown(names: list[str]) -> dict[str, float]:
  """{stage: seconds} between successive marks of `names` (in order; absent ones skipped),
  the first measured from process start."""
  out, prev = {}, 0.0
  for name in names:
    if name in MARKS:
      out[name] = round(MARKS[name] - prev, 3)
      prev = MARKS[name]
  return out


def cache_dir(setting: str, workdir: str | pathlib.Path | None = None) -> pathlib.Path | None:
  """The directory `setting` names (see the module docstring), or None for "off"."""
  if setting == "off":
    return None
  if setting == "user":
    if os.environ.get("SAO_JAX_CACHE"):
      return pathlib.Path(os.environ["SAO_JAX_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(base) / "sao_jax" / "xla"
  if setting == "workdir":
    if workdir is None:
      raise ValueError("compile cache 'workdir' needs a workdir")
    return pathlib.Path(workdir) / "xla_cache"
  return pathlib.Path(setting)


def enable_compile_cache(setting: str, workdir=None) -> str | None:
  """Points JAX's persistent compilation cache at `setting`'s directory (created); returns
  it, or None when off or when this process already uses another cache directory (JAX sets
  its cache up once per process)."""
  import jax

  path = cache_dir(setting, workdir)
  if path is None:
    return None
  current = jax.config.jax_compilation_cache_dir
  if current and pathlib.Path(current) != path:
    return None
  path.mkdir(parents=True, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", str(path))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_S)
  jax.config.update("jax_compilation_cache_max_size", MAX_CACHE_BYTES)
  return str(path)
