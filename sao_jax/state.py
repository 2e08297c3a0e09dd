"""The learner's state: everything one update reads and writes, and a snapshot saves."""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array
  ref_params: Any = None  # frozen reference policy for the KL penalty (None: no KL)
  tracker: Any = None  # SAO: per-task value tracker (checkpointed with the state)
  lr_scale: jax.Array = None  # multiplies every update; lowered on a rollback
  nonfinite: jax.Array = None  # updates skipped because gradients or loss were not finite


def copy_tree(tree):
  """Fresh buffers of a pytree: the jitted updates donate their input state."""
  return jax.tree.map(jnp.copy, tree)


def tree_digest(tree) -> jax.Array:
  """A uint32 fingerprint of a pytree's exact bits (what `sao-jax replay` compares at every
  step). Each leaf's bits, as unsigned integers, are summed with position-dependent odd
  multipliers in wrapping uint32 arithmetic: integer sums are exact and associative, so the
  result does not depend on how the reduction is split over devices, and flipping any one bit
  of any element changes it."""
  total = jnp.uint32(0)
  for k, leaf in enumerate(jax.tree.leaves(tree)):
    x = jnp.asarray(leaf)
    if x.dtype.itemsize == 4:
      bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
    elif x.dtype.itemsize == 2:
      bits = jax.lax.bitcast_convert_type(x, jnp.uint16).astype(jnp.uint32)
    elif x.dtype.itemsize == 1:
      bits = jax.lax.bitcast_convert_type(x, jnp.uint8).astype(jnp.uint32)
    else:  # 8-byte leaves: both halves
      halves = jax.lax.bitcast_convert_type(x, jnp.uint32)
      bits = halves[..., 0] ^ (halves[..., 1] * jnp.uint32(0x85EBCA6B))
    pos = jnp.arange(bits.size, dtype=jnp.uint32).reshape(bits.shape)
    mult = pos * jnp.uint32(0x9E3779B1) + jnp.uint32(2 * k + 1)
    total = total + jnp.sum(bits * (mult | jnp.uint32(1)), dtype=jnp.uint32) * jnp.uint32(
      0x27D4EB2F + 2 * k
    )
  return total
