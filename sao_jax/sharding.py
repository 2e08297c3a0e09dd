"""Device mesh and logical-axis shardings, both from config."""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from sao_jax.config import ConfigError, MeshConfig


def make_mesh(cfg: MeshConfig, devices=None) -> Mesh:
  devices = list(jax.devices() if devices is None else devices)
  shape = list(cfg.shape)
  fixed = math.prod(s for s in shape if s != -1)
  if -1 in shape:
    if len(devices) % fixed:
      raise ConfigError(f"mesh {cfg.shape} does not divide {len(devices)} devices")
    shape[shape.index(-1)] = len(devices) // fixed
  if math.prod(shape) != len(devices):
    raise ConfigError(
      f"mesh shape {tuple(shape)} needs {math.prod(shape)} devices, have {len(devices)}"
    )
  return Mesh(np.asarray(devices).reshape(shape), tuple(cfg.axes))


def logical_shardings(abstract_tree, mesh: Mesh, rules):
  """NamedShardings for a tree whose leaves may be flax LogicallyPartitioned boxes; a
  ConfigError names the first array dimension that its mesh axes cannot split evenly."""
  specs = nn.get_partition_spec(abstract_tree)
  shardings = nn.logical_to_mesh_sharding(specs, mesh, list(rules))
  _check_divisible(abstract_tree, specs, shardings, mesh)
  return shardings


def _check_divisible(abstract_tree, specs, shardings, mesh: Mesh) -> None:
  is_spec = lambda x: isinstance(x, P)  # noqa: E731
  is_sh = lambda x: isinstance(x, NamedSharding)  # noqa: E731
  leaves = jax.tree_util.tree_flatten_with_path(nn.unbox(abstract_tree))[0]
  logical = jax.tree.leaves(specs, is_leaf=is_spec)
  mesh_specs = jax.tree.leaves(shardings, is_leaf=is_sh)
  if not len(leaves) == len(logical) == len(mesh_specs):
    return  # (a tree this check cannot pair up; jax reports any problem itself)
  for (path, leaf), names, sh in zip(leaves, logical, mesh_specs, strict=True):
    for dim, (size, axes) in enumerate(zip(getattr(leaf, "shape", ()), sh.spec, strict=False)):
      axes = (axes,) if isinstance(axes, str) else tuple(axes or ())
      parts = math.prod(mesh.shape[a] for a in axes)
      if parts > 1 and size % parts:
        name = names[dim] if dim < len(names) else None
        raise ConfigError(
          f"{jax.tree_util.keystr(path)}: its {name or 'dim ' + str(dim)!s} dimension of "
          f"size {size} cannot be split over mesh axes {axes} of {parts} devices "
          f"(mesh.shape {dict(mesh.shape)}); pick a mesh.shape whose {'/'.join(axes)} size "
          f"divides the model's {name or 'dimension'} (see model.heads, model.kv_heads, "
          "model.width, model.mlp_dim, the vocabulary size)"
        )


def batch_sharding(mesh: Mesh, rules) -> NamedSharding:
  """Leading (batch) axis split over the mesh axes that the 'batch' rule names."""
  axes = dict(rules).get("batch")
  return NamedSharding(mesh, P(axes))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def batch_divisor(mesh: Mesh, rules) -> int:
  axes = dict(rules).get("batch") or ()
  axes = (axes,) if isinstance(axes, str) else axes
  return math.prod(mesh.shape[a] for a in axes)


def process_rows(sharding: NamedSharding, rows: int) -> slice:
  """The rows of a `rows`-row batch that this process's devices hold under `sharding` (all
  of them in a single process): what its data loader must build."""
  spans = [
    (s.start or 0, rows if s.stop is None else s.stop)
    for (s, *_) in sharding.addressable_devices_indices_map((rows,)).values()
  ]
  start, stop = min(a for a, _ in spans), max(b for _, b in spans)
  if set().union(*(range(a, b) for a, b in spans)) != set(range(start, stop)):
    raise ValueError(
      f"this process's batch rows {sorted(set(spans))} are not contiguous; "
      "order the mesh devices by process"
    )
  return slice(start, stop)


def put_batch(batch, sharding: NamedSharding, *, local: bool = False):
  """`batch` (a pytree of host arrays with a leading batch axis) as global arrays on
  `sharding`. Single process: a device_put. Several processes: every process calls this with
  either the whole batch (`local=False`; it keeps only its `process_rows`) or only its own
  rows (`local=True`), and `jax.make_array_from_process_local_data` assembles the global
  arrays without any process holding another's rows on device."""
  if jax.process_count() == 1:
    return jax.device_put(batch, sharding)

  def put(x):
    x = np.asarray(x)
    if local:
      return jax.make_array_from_process_local_data(sharding, x)
    return jax.make_array_from_process_local_data(
      sharding, x[process_rows(sharding, x.shape[0])], x.shape
    )

  return jax.tree.map(put, batch)
