"""Typed batches: what each update function takes, with shapes in the field names.

Rows are left-padded prompts [B, P] followed by completions [B, T] (see `sao_jax.sampling`).
Every batch is a `flax.struct` dataclass (a pytree), so it is jitted, sharded (one
`NamedSharding` per field, all split over the batch axis) and donated like any array tree.
`abstract(rows, prompt_len, completion_len)` gives the shapes and dtypes the programs are
compiled for, without data.
"""
from __future__ import annotations

import dataclasses

import flax
import jax
import jax.numpy as jnp
import numpy as np


def _abstract(cls, rows: int, prompt_len: int, completion_len: int):
  """ShapeDtypeStructs of every field from its name's suffix and the class's dtypes."""
  dims = {"b": rows, "p": prompt_len, "t": completion_len}
  fields = {}
  for f in dataclasses.fields(cls):
    suffix = f.name.rsplit("_", 1)[1]
    fields[f.name] = jax.ShapeDtypeStruct(tuple(dims[c] for c in suffix), cls.DTYPES[f.name])
  return cls(**fields)


@flax.struct.dataclass
class SFTBatch:
  """Teacher-forced rows: the target completion (solution + EOS) after each prompt.
  weight_b weighs each row's token-mean cross-entropy (1 for every real row)."""

  prompt_bp: jax.Array
  prompt_valid_bp: jax.Array
  tokens_bt: jax.Array
  valid_bt: jax.Array
  weight_b: jax.Array

  DTYPES = {"prompt_bp": jnp.int32, "prompt_valid_bp": jnp.bool_, "tokens_bt": jnp.int32,
            "valid_bt": jnp.bool_, "weight_b": jnp.float32}
  abstract = classmethod(_abstract)


@flax.struct.dataclass
class RLBatch:
  """Synchronous GRPO: G sampled completions of each prompt (consecutive rows), their
  behaviour log-probs and rewards."""

  prompt_bp: jax.Array
  prompt_valid_bp: jax.Array
  tokens_bt: jax.Array
  valid_bt: jax.Array
  logp_bt: jax.Array
  rewards_b: jax.Array

  DTYPES = {"prompt_bp": jnp.int32, "prompt_valid_bp": jnp.bool_, "tokens_bt": jnp.int32,
            "valid_bt": jnp.bool_, "logp_bt": jnp.float32, "rewards_b": jnp.float32}
  abstract = classmethod(_abstract)


@flax.struct.dataclass
class SAOBatch:
  """Single trajectories from any policy versions, one row per environment step.

  rewards_b: the trajectory's total reward on each of its rows; task_b: tracker index;
  staleness_bt: learner version - the version that produced each token (a sampler that
  takes new parameters mid-completion mixes versions); row_valid_b: False on padding rows;
  traj_b: which trajectory of the batch (0..B-1) a row belongs to; head_b: its first row;
  poison_b: 0, or NaN on a row of an update chosen for fault injection.
  """

  prompt_bp: jax.Array
  prompt_valid_bp: jax.Array
  tokens_bt: jax.Array
  valid_bt: jax.Array
  logp_bt: jax.Array
  rewards_b: jax.Array
  task_b: jax.Array
  staleness_bt: jax.Array
  row_valid_b: jax.Array
  traj_b: jax.Array
  head_b: jax.Array
  poison_b: jax.Array

  DTYPES = {**RLBatch.DTYPES, "task_b": jnp.int32, "staleness_bt": jnp.int32,
            "row_valid_b": jnp.bool_, "traj_b": jnp.int32, "head_b": jnp.bool_,
            "poison_b": jnp.float32}
  abstract = classmethod(_abstract)

  @classmethod
  def single_steps(cls, staleness_b=None, **fields) -> SAOBatch:
    """A batch in which every row is a whole one-step trajectory: traj_b = row index,
    head_b = row_valid_b (all rows valid unless given), no poison (unless given), and
    staleness_b [B] (one version per row) broadcast over the row's tokens."""
    rows = len(fields["rewards_b"])
    if staleness_b is not None:
      fields["staleness_bt"] = np.broadcast_to(np.asarray(staleness_b, np.int32)[:, None],
                                               np.shape(fields["tokens_bt"])).copy()
    fields.setdefault("row_valid_b", np.ones(rows, bool))
    fields.setdefault("traj_b", np.arange(rows, dtype=np.int32))
    fields.setdefault("head_b", np.asarray(fields["row_valid_b"], bool))
    fields.setdefault("poison_b", np.zeros(rows, np.float32))
    return cls(**fields)
