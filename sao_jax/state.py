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
