"""Running untrusted Python (generated programs) in a sandbox, one fresh process per program.

`run_job` runs one program with its tests; `SandboxPool` runs a batch concurrently on worker
processes. Standard library only, so pool workers start without JAX.
"""

from sao_jax.sandbox.pool import SandboxPool, default_num_workers
from sao_jax.sandbox.runner import (
  STATUSES,
  Isolation,
  Job,
  Limits,
  RunResult,
  SandboxIsolationWarning,
  resolve_isolation,
  run_job,
)

__all__ = [
  "STATUSES",
  "Isolation",
  "Job",
  "Limits",
  "RunResult",
  "SandboxIsolationWarning",
  "SandboxPool",
  "default_num_workers",
  "resolve_isolation",
  "run_job",
]
