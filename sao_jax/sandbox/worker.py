"""A sandbox pool worker: `python -m sao_jax.sandbox.worker ISOLATION_JSON PARENT_PID`.

Reads one job per line (JSON) on stdin, runs it with `run_job`, writes one result per line
(JSON) on stdout; exits at EOF. Workers are separate small processes rather than threads of
the caller because starting a sandbox forks the process that starts it: forking a small
worker costs little, forking a sampler that holds a model and XLA's memory does not.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys

from sao_jax.sandbox.runner import Isolation, Job, RunResult, run_job

_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent_pid: int) -> None:
  """SIGKILL when the pool's process dies, however it dies; bwrap's --die-with-parent then
  takes the sandbox down too."""
  try:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
  except (OSError, AttributeError):
    pass
  if os.getppid() != parent_pid:  # the parent died before the line above ran
    os._exit(1)


def main(argv: list[str]) -> int:
  iso = Isolation.from_dict(json.loads(argv[0]))
  _die_with_parent(int(argv[1]))
  signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the pool owner's to handle
  out = sys.stdout
  for line in sys.stdin:
    try:
      job = Job.from_dict(json.loads(line))
    except (ValueError, KeyError, TypeError) as err:
      result = RunResult("crashed", 0, 0, 0.0, detail=f"bad job: {err}", isolation=iso.mode)
    else:
      try:
        result = run_job(job, iso)
      except OSError as err:
        result = RunResult(
          "crashed",
          0,
          len(job.tests),
          0.0,
          detail=f"the sandbox could not start: {err}",
          isolation=iso.mode,
        )
    out.write(json.dumps(result.to_dict()) + "\n")
    out.flush()
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
