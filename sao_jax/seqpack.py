"""Sequence packing of learner rows: the forward pass over real tokens only.

A learner batch is B rows of L = P + T slots (a left-padded prompt, then the completion);
with variable-length completions most of the slots can be padding, and every padded slot
costs a full forward and backward pass. Packing moves each row's *span* (its first valid slot
to the last slot whose output is read) into a few packed rows of the same length L, several
rows per packed row, each tagged with a segment id. Attention is causal within a segment and
never crosses segments; token positions are the row's own (counted over its valid slots, as
in the unpacked layout). So each packed slot computes exactly what the same slot of the
unpacked row computes, up to the order of float sums, and the per-token outputs are gathered
back to the [B, T] layout every loss reads. Only the forward pass changes: losses,
advantages and metrics are untouched.

The plan is made on the host, from the batch's validity masks (`plan`), with first-fit
decreasing; the number of packed rows is rounded up to a multiple of `bucket` (so a run
compiles a few packed shapes, not one per batch). Where packing would not save a packed row,
`plan` returns None and the update runs unpacked (another compiled program: packed and
unpacked batches are different pytrees).

Shapes: Q packed rows of L slots.
  src_ql: int32, the flat index (b * L + l) of the row slot each packed slot holds (0 on
    padding slots);
  seg_ql: int32, 1 + the row index of that slot (0 on padding slots): the segment id;
  dst_bl: int32, the flat index (q * L + j) of the packed slot holding each row slot (0 where
    the row slot is not packed; the outputs read there are masked by the caller's `valid`).

On a data-parallel mesh the plan gathers across the batch's shards (rows are packed globally,
not per shard), which costs a collective; packing is meant for one device or one host.
"""

from __future__ import annotations

import flax
import jax
import jax.numpy as jnp
import numpy as np


@flax.struct.dataclass
class PackPlan:
  src_ql: jax.Array
  seg_ql: jax.Array
  dst_bl: jax.Array

  @property
  def rows(self) -> int:
    return self.src_ql.shape[0]


def spans(prompt_valid_bp: np.ndarray, valid_bt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """[B] first slot and end (exclusive) of each row's span: from its first valid slot to the
  last slot whose output is read, which is P - 1 (the last prompt slot: it predicts the first
  completion token and carries the value head's output) or P - 1 + t for the last valid
  completion token t. A row with no valid slot has an empty span (start = end = 0)."""
  valid_bl = np.concatenate([prompt_valid_bp, valid_bt], axis=1).astype(bool)
  b, length = valid_bl.shape
  plen = prompt_valid_bp.shape[1]
  any_valid = valid_bl.any(axis=1)
  first = np.where(any_valid, valid_bl.argmax(axis=1), 0)
  t_any = valid_bt.any(axis=1)
  last_t = valid_bt.shape[1] - 1 - np.asarray(valid_bt, bool)[:, ::-1].argmax(axis=1)
  last_read = np.where(t_any, plen - 1 + last_t, plen - 1)
  end = np.where(any_valid, np.maximum(last_read, first) + 1, 0)
  start = np.where(any_valid, np.minimum(first, plen - 1), 0)
  del b, length
  return start.astype(np.int64), end.astype(np.int64)


def plan(prompt_valid_bp, valid_bt, *, bucket: int = 1) -> PackPlan | None:
  """The packing of a batch whose rows have these validity masks ([B, P] and [B, T], host
  arrays), or None where it would not use fewer packed rows than B (module docstring)."""
  prompt_valid_bp = np.asarray(prompt_valid_bp, bool)
  valid_bt = np.asarray(valid_bt, bool)
  b = prompt_valid_bp.shape[0]
  length = prompt_valid_bp.shape[1] + valid_bt.shape[1]
  start, end = spans(prompt_valid_bp, valid_bt)
  size = end - start
  # First-fit decreasing: each row's span into the first packed row with room for it.
  fill: list[int] = []
  where = np.zeros(b, np.int64)  # packed row of each row
  offset = np.zeros(b, np.int64)  # its first packed slot
  for i in np.argsort(-size, kind="stable"):
    if size[i] == 0:
      continue
    n = next((q for q, used in enumerate(fill) if used + size[i] <= length), len(fill))
    if n == len(fill):
      fill.append(0)
    where[i], offset[i] = n, fill[n]
    fill[n] += size[i]
  bucket = max(int(bucket), 1)
  rows = max(-(-max(len(fill), 1) // bucket) * bucket, bucket)
  if rows >= b:
    return None
  src = np.zeros((rows, length), np.int32)
  seg = np.zeros((rows, length), np.int32)
  dst = np.zeros((b, length), np.int32)
  for i in range(b):
    if size[i] == 0:
      continue
    n, j = where[i], offset[i]
    slots = np.arange(start[i], end[i])
    src[n, j : j + size[i]] = i * length + slots
    seg[n, j : j + size[i]] = i + 1
    dst[i, slots] = n * length + j + np.arange(size[i])
  return PackPlan(src_ql=src, seg_ql=seg, dst_bl=dst)


def packed_attention(plan_: PackPlan, valid_bl: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(key validity [Q, L] and the [Q, L, L] mask) of the packed rows: a query sees the valid
  keys of its own segment at or before it."""
  kvalid_ql = jnp.take(valid_bl.reshape(-1), plan_.src_ql) & (plan_.seg_ql > 0)
  s = jnp.arange(plan_.seg_ql.shape[1])
  same = plan_.seg_ql[:, :, None] == plan_.seg_ql[:, None, :]
  mask = same & kvalid_ql[:, None, :] & (s[None, None, :] <= s[None, :, None])
  return kvalid_ql, mask


def gather(plan_: PackPlan, x_bl: jax.Array) -> jax.Array:
  """[B, L, ...] row-layout values at each packed slot: [Q, L, ...]."""
  flat = x_bl.reshape((-1,) + x_bl.shape[2:])
  return jnp.take(flat, plan_.src_ql, axis=0)


def scatter_back(plan_: PackPlan, x_ql: jax.Array) -> jax.Array:
  """[Q, L, ...] packed values back at their row slots: [B, L, ...] (unpacked slots read
  packed slot 0; the caller masks them)."""
  flat = x_ql.reshape((-1,) + x_ql.shape[2:])
  return jnp.take(flat, plan_.dst_bl, axis=0)
