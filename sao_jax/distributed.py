"""Joining a learner's processes (one per host) with JAX's multi-controller runtime.

After `initialize`, `jax.devices()` lists every process's devices, so the mesh of
`sao_jax.sharding.make_mesh` spans all hosts; each process feeds its own devices
(`sao_jax.sharding.process_rows`, `jax.make_array_from_process_local_data`) and every process
runs the same jitted programs. Process 0 is the primary: the only one that writes metrics,
publishes parameters to samplers and, in the SAO learner, takes trajectories in; what it alone
decides or reads reaches the others through `from_primary`.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import numpy as np
from jax.experimental import multihost_utils

from sao_jax.config import ConfigError, DistributedConfig

ENV_COORDINATOR = "SAO_JAX_COORDINATOR"
ENV_NUM_PROCESSES = "SAO_JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "SAO_JAX_PROCESS_ID"


def resolve(cfg: DistributedConfig, environ=None) -> DistributedConfig:
  """`cfg` with the fields left at their defaults read from the environment, checked whole:
  a coordinator "host:port" needs the process count and this process's id."""
  environ = os.environ if environ is None else environ

  def env_int(name: str, default: int) -> int:
    raw = environ.get(name, "").strip()
    if not raw:
      return default
    try:
      return int(raw)
    except ValueError:
      raise ConfigError(f"${name}={raw!r} is not an integer") from None

  out = dataclasses.replace(
    cfg,
    coordinator=cfg.coordinator or environ.get(ENV_COORDINATOR, "").strip(),
    num_processes=cfg.num_processes or env_int(ENV_NUM_PROCESSES, 0),
    process_id=cfg.process_id if cfg.process_id >= 0 else env_int(ENV_PROCESS_ID, -1),
  )
  if out.coordinator not in ("", "auto") and (out.num_processes < 1 or out.process_id < 0):
    raise ConfigError(
      f"distributed.coordinator {out.coordinator!r} needs distributed.num_processes and "
      f"distributed.process_id (or ${ENV_NUM_PROCESSES} and ${ENV_PROCESS_ID})"
    )
  if not out.coordinator and out.num_processes > 1:
    raise ConfigError(
      f"distributed.num_processes={out.num_processes} needs "
      f"distributed.coordinator (or ${ENV_COORDINATOR}): process 0's host:port"
    )
  return out


def initialize(cfg: DistributedConfig, environ=None) -> DistributedConfig:
  """Joins this process to the others (once; later calls return at once) and returns the
  resolved config. Must run before any JAX computation (it ends with one broadcast of its
  own, see below). Cross-process collectives on CPU devices go through gloo unless
  $JAX_CPU_COLLECTIVES_IMPLEMENTATION names another (mpi)."""
  cfg = resolve(cfg, environ)
  if not cfg.coordinator or jax.distributed.is_initialized():
    return cfg
  if not os.environ.get("JAX_CPU_COLLECTIVES_IMPLEMENTATION"):
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  if cfg.coordinator == "auto":  # the cluster (TPU pod, SLURM, ...) says who is who
    kw = {
      k: v
      for k, v in (
        ("num_processes", cfg.num_processes or None),
        ("process_id", cfg.process_id if cfg.process_id >= 0 else None),
      )
      if v is not None
    }
    jax.distributed.initialize(initialization_timeout=cfg.init_timeout_s, **kw)
  else:
    jax.distributed.initialize(
      cfg.coordinator, cfg.num_processes, cfg.process_id, initialization_timeout=cfg.init_timeout_s
    )
  # Connect the devices that `from_primary` joins now, while the processes are in step: gloo
  # opens a group's connections at its first collective and gives up if a peer is 30 s late,
  # while the others may wait in a broadcast for minutes (process 0 waiting for trajectories).
  from_primary(np.zeros(1, np.uint8))
  return cfg


def is_primary() -> bool:
  """Whether this process writes files and publishes (process 0; always, single-process)."""
  return jax.process_index() == 0


def host_value(tree):
  """`tree`'s arrays as host numpy arrays, whole, in every process. With several processes
  an array may live partly on other hosts' devices: it is all-gathered, a collective that
  every process must call at the same point of the program."""
  if jax.process_count() == 1:
    return jax.device_get(tree)
  return multihost_utils.process_allgather(tree, tiled=True)


def from_primary(tree):
  """`tree` as process 0 holds it, in every process: a batch that process 0 alone formed, or a
  decision taken from its clock. Every process calls this at the same point with a tree of the
  same structure, shapes and dtypes (the values of the others are ignored); it is a
  collective. Single process: `tree` itself, untouched. The leaves travel as one buffer of
  their bytes (one all-reduce), so what arrives is bit for bit what was sent: a float sum,
  which the broadcast is, would turn -0.0 into 0.0, and 64-bit integers would lose their
  high half without jax_enable_x64."""
  if jax.process_count() == 1:
    return tree
  leaves, treedef = jax.tree.flatten(tree)
  arrays = [np.asarray(x) for x in leaves]
  sent = np.concatenate([np.zeros(0, np.uint8)] + [a.reshape(-1).view(np.uint8) for a in arrays])
  got = np.asarray(multihost_utils.broadcast_one_to_all(sent))
  out, at = [], 0
  for a in arrays:
    out.append(got[at : at + a.nbytes].copy().view(a.dtype).reshape(a.shape))
    at += a.nbytes
  return treedef.unflatten(out)


def agree(flag: bool) -> bool:
  """Process 0's `flag` in every process (a collective; single process: `flag`)."""
  return bool(from_primary(np.bool_(flag)))
