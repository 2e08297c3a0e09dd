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
    raise ConfigError(f"mesh shape {tuple(shape)} needs {math.prod(shape)} devices, "
                      f"have {len(devices)}")
  return Mesh(np.asarray(devices).reshape(shape), tuple(cfg.axes))


def logical_shardings(abstract_tree, mesh: Mesh, rules):
  """NamedShardings for a tree whose leaves may be flax LogicallyPartitioned boxes."""
  specs = nn.get_partition_spec(abstract_tree)
  return nn.logical_to_mesh_sharding(specs, mesh, list(rules))


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
