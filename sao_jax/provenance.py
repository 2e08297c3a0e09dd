"""Where a result came from: the command, the code version and the machine, written into
every result file (`sao_jax.results_file`) so that a number can be traced back and rerun."""

from __future__ import annotations

import os
import pathlib
import platform
import subprocess
import sys
import time


def _git(*args: str) -> str | None:
  root = pathlib.Path(__file__).resolve().parents[1]
  try:
    out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10)
  except (OSError, subprocess.TimeoutExpired):
    return None
  return out.stdout.strip() if out.returncode == 0 else None


# Instruction-set extensions XLA's CPU code generator may use: two hosts that differ in them
# compile different float code, so the same seeded run can train to a different result.
SIMD_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_bf16", "amx_tile", "neon", "asimd")


def cpu(cpuinfo: str | None = None) -> dict:
  """The CPU's model name and which of SIMD_FLAGS it has, from /proc/cpuinfo (or `cpuinfo`,
  its text); {"model": platform.processor()} where that file cannot be read."""
  if cpuinfo is None:
    try:
      cpuinfo = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
      return {"model": platform.processor() or platform.machine()}
  fields = {}
  for line in cpuinfo.splitlines():
    key, _, value = line.partition(":")
    fields.setdefault(key.strip(), value.strip())  # the first processor's
  flags = set((fields.get("flags") or fields.get("Features") or "").split())
  model = fields.get("model name") or fields.get("Model") or platform.processor()
  out = {"model": model or platform.machine(), "simd": [f for f in SIMD_FLAGS if f in flags]}
  # a virtual CPU's name can be as vague as "AMD EPYC": family/model/stepping tell them apart
  ids = [fields.get(k) for k in ("cpu family", "model", "stepping")]
  if all(ids):
    out["family_model_stepping"] = "/".join(ids)
  return out


def machine(devices: bool = True) -> dict:
  """The host, and with `devices` JAX's devices (which starts a JAX backend: a process that
  runs no JAX itself, like the sweep driver, passes False)."""
  out = {
    "platform": platform.platform(),
    "python": platform.python_version(),
    "cpus": os.cpu_count(),
    "cpus_usable": len(os.sched_getaffinity(0)),
    "cpu": cpu(),
  }
  if devices:
    import jax

    out.update(devices=[str(d) for d in jax.devices()], jax=jax.__version__)
  return {
    **out,
    # other work on the machine: 1-, 5- and 15-minute load averages when this was read
    "loadavg": [round(x, 2) for x in os.getloadavg()],
  }


def provenance(argv: list[str] | None = None, devices: bool = True) -> dict:
  """{"command", "commit", "dirty", "dirty_files", "time", "machine"} of the current process
  (`dirty_files`: the tracked files that differ from the commit, at most 20, so a reader can
  tell a changed results file from changed code)."""
  argv = sys.argv if argv is None else argv
  status = _git("status", "--porcelain", "--untracked-files=no")
  changed = [line.split(maxsplit=1)[-1] for line in (status or "").splitlines() if line.strip()]
  return {
    "command": " ".join(["python", *argv]),
    "commit": _git("rev-parse", "HEAD"),
    "dirty": bool(status) if status is not None else None,
    "dirty_files": changed[:20],
    "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    "machine": machine(devices),
  }
