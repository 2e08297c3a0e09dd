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

from sao_jax.seqpack import PackPlan


def _abstract(cls, rows: int, prompt_len: int, completion_len: int):
  """ShapeDtypeStructs of every field from its name's suffix and the class's dtypes."""
  dims = {"b": rows, "p": prompt_len, "t": completion_len}
  fields = {}
  for f in dataclasses.fields(cls):
    if f.name == "pack":  # unpacked: a packed batch's shapes depend on its plan
      continue
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
  pack: PackPlan | None = None  # `sao_jax.seqpack.plan` of the rows, or None: unpacked

  DTYPES = {
    "prompt_bp": jnp.int32,
    "prompt_valid_bp": jnp.bool_,
    "tokens_bt": jnp.int32,
    "valid_bt": jnp.bool_,
    "weight_b": jnp.float32,
  }
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
  pack: PackPlan | None = None  # `sao_jax.seqpack.plan` of the rows, or None: unpacked

  DTYPES = {
    "prompt_bp": jnp.int32,
    "prompt_valid_bp": jnp.bool_,
    "tokens_bt": jnp.int32,
    "valid_bt": jnp.bool_,
    "logp_bt": jnp.float32,
    "rewards_b": jnp.float32,
  }
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
  pack: PackPlan | None = None  # `sao_jax.seqpack.plan` of the rows, or None: unpacked

  DTYPES = {
    **RLBatch.DTYPES,
    "task_b": jnp.int32,
    "staleness_bt": jnp.int32,
    "row_valid_b": jnp.bool_,
    "traj_b": jnp.int32,
    "head_b": jnp.bool_,
    "poison_b": jnp.float32,
  }
  abstract = classmethod(_abstract)

  @classmethod
  def single_steps(cls, staleness_b=None, **fields) -> SAOBatch:
    """A batch in which every row is a whole one-step trajectory: traj_b = row index,
    head_b = row_valid_b (all rows valid unless given), no poison (unless given), and
    staleness_b [B] (one version per row) broadcast over the row's tokens."""
    rows = len(fields["rewards_b"])
    if staleness_b is not None:
      fields["staleness_bt"] = np.broadcast_to(
        np.asarray(staleness_b, np.int32)[:, None], np.shape(fields["tokens_bt"])
      ).copy()
    fields.setdefault("row_valid_b", np.ones(rows, bool))
    fields.setdefault("traj_b", np.arange(rows, dtype=np.int32))
    fields.setdefault("head_b", np.asarray(fields["row_valid_b"], bool))
    fields.setdefault("poison_b", np.zeros(rows, np.float32))
    return cls(**fields)


@flax.struct.dataclass
class MemoryBatch:
  """Whole trajectories of the policy with compressed memory (`sao_jax.compression`).

  B trajectories (the batch axis), S environment steps each, R of their steps taken as
  training rows (the graded steps first: only some steps carry a training signal, while the
  compressor must run over every step). Per step: the step's segment seg_bsl (observation and
  action tokens, the encoder's input), its reward, whether an environment boundary came
  before it, and step_valid_bs (False on padding steps). Per row: its step index, validity
  and loss weight (supervised phase), whether the step was graded, the raw window it saw
  (prompt_brp) and its completion (tokens_brt).

  logp_brt (behaviour log-probs), the shipped bank (bank_*: INT8 vectors [B, C, E, D] or
  float32 without quantisation, per-vector scales, step index and turning flag of each entry,
  entries written) and its graveyard (gone_*: the entry evicted at each step, laid out per
  step, gone_step_bs -1 where none; `sao_jax.compression.memory`) come with sampled
  trajectories (RL); supervised batches of expert episodes leave them None and the learner
  builds bank and graveyard in-graph.
  """

  seg_bsl: jax.Array
  seg_valid_bsl: jax.Array
  rewards_bs: jax.Array
  boundary_bs: jax.Array
  step_valid_bs: jax.Array
  row_step_br: jax.Array
  row_valid_br: jax.Array
  row_weight_br: jax.Array
  graded_br: jax.Array
  prompt_brp: jax.Array
  prompt_valid_brp: jax.Array
  tokens_brt: jax.Array
  valid_brt: jax.Array
  logp_brt: jax.Array | None = None
  bank_vec_bced: jax.Array | None = None
  bank_scale_bce: jax.Array | None = None
  bank_step_bc: jax.Array | None = None
  bank_turning_bc: jax.Array | None = None
  bank_count_b: jax.Array | None = None
  gone_vec_bsed: jax.Array | None = None
  gone_scale_bse: jax.Array | None = None
  gone_step_bs: jax.Array | None = None

  DTYPES = {
    "seg_bsl": jnp.int32,
    "seg_valid_bsl": jnp.bool_,
    "rewards_bs": jnp.float32,
    "boundary_bs": jnp.bool_,
    "step_valid_bs": jnp.bool_,
    "row_step_br": jnp.int32,
    "row_valid_br": jnp.bool_,
    "row_weight_br": jnp.float32,
    "graded_br": jnp.bool_,
    "prompt_brp": jnp.int32,
    "prompt_valid_brp": jnp.bool_,
    "tokens_brt": jnp.int32,
    "valid_brt": jnp.bool_,
    "logp_brt": jnp.float32,
    "bank_vec_bced": jnp.int8,
    "bank_scale_bce": jnp.float32,
    "bank_step_bc": jnp.int32,
    "bank_turning_bc": jnp.bool_,
    "bank_count_b": jnp.int32,
    "gone_vec_bsed": jnp.int8,
    "gone_scale_bse": jnp.float32,
    "gone_step_bs": jnp.int32,
  }
  SAMPLED = (
    "logp_brt",
    "bank_vec_bced",
    "bank_scale_bce",
    "bank_step_bc",
    "bank_turning_bc",
    "bank_count_b",
    "gone_vec_bsed",
    "gone_scale_bse",
    "gone_step_bs",
  )

  @classmethod
  def abstract(
    cls,
    trajectories: int,
    steps: int,
    rows: int,
    prompt_len: int,
    completion_len: int,
    *,
    step_len: int,
    capacity: int,
    vectors: int,
    dim: int,
    sampled: bool,
    quantized: bool = True,
  ) -> MemoryBatch:
    """Shapes and dtypes of a batch; `sampled`: with behaviour log-probs and the bank."""
    dims = {
      "b": trajectories,
      "s": steps,
      "r": rows,
      "p": prompt_len,
      "t": completion_len,
      "l": step_len,
      "c": capacity,
      "e": vectors,
      "d": dim,
    }
    fields = {}
    for f in dataclasses.fields(cls):
      if f.name in cls.SAMPLED and not sampled:
        continue
      dtype = cls.DTYPES[f.name]
      if f.name in ("bank_vec_bced", "gone_vec_bsed") and not quantized:
        dtype = jnp.float32
      suffix = f.name.rsplit("_", 1)[1]
      fields[f.name] = jax.ShapeDtypeStruct(tuple(dims[c] for c in suffix), dtype)
    return cls(**fields)


@flax.struct.dataclass
class MemorySAOBatch:
  """SAO's batch of the policy with compressed memory: B whole long-horizon trajectories from
  any policy versions (`memory`, with behaviour log-probs, bank and graveyard), and per
  trajectory its tracker index task_b, its staleness_b (learner version - the version that
  played it: a memory sampler keeps one policy for a whole episode), accuracy_b (its mean
  reward over its graded steps) and poison_b (0, or NaN on an update chosen for fault
  injection)."""

  memory: MemoryBatch
  task_b: jax.Array
  accuracy_b: jax.Array
  staleness_b: jax.Array
  poison_b: jax.Array
