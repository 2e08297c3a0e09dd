"""Sequence packing of learner rows: the forward pass over real tokens only.

A learner batch is B rows of L = P + T slots (a left-padded prompt, then the completion);
with variable-length completions most of the slots can be padding, and every padded slot
costs a full forward and backward pass. Packing moves each row's *span* (its first valid slot
to the last slot whose output is read) into packed rows of `factor` x L slots, several rows
per packed row, each tagged with a segment id. Attention is causal within a segment and never
crosses segments; token positions are the row's own (counted over its valid slots, as in the
unpacked layout). So each packed slot computes exactly what the same slot of the unpacked row
computes, up to the order of float sums, and the per-token outputs are gathered back to the
[B, T] layout every loss reads. Only the forward pass changes: losses, advantages and metrics
are untouched.

Packed rows longer than a batch row (`factor` > 1) let several spans share one even where
each fills most of a row (a prompt of 40 tokens and an answer of 15 in a 72-slot row: none
fit two to a row, five to a row of 288). The price is attention: a packed row's score matrix
is (factor x L)^2 (masked outside each segment), so its attention FLOPs per token grow with
`factor`, against the dense layers' 6 x parameters per token (factor x L / (6 x width) more
work: 19 % at L = 72, width 256, factor 4).

The plan is made on the host, from the batch's validity masks (`plan`), with first-fit
decreasing; the number of packed rows is rounded up to a multiple of `bucket` (so a run
compiles a few packed shapes, not one per batch). Where packing would not save slots,
`plan` returns None and the update runs unpacked (another compiled program: packed and
unpacked batches are different pytrees).

Shapes: Q packed rows of factor x L slots (L below).
  src_ql: int32, the flat index (b * L + l) of the row slot each packed slot holds (0 on
    padding slots);
  seg_ql: int32, 1 + the row index of that slot (0 on padding slots): the segment id;
  dst_bl: int32, the flat index (q * factor * L + j) of the packed slot holding each row slot
    (0 where the row slot is not packed; the outputs read there are masked by the caller's
    `valid`).

On a data-parallel mesh the plan gathers across the batch's shards (rows are packed globally,
not per shard), which costs a collective; packing is meant for one device or one host.
"""

from __future__ import annotations

import dataclasses

import flax
import jax
import jax.numpy as jnp
import numpy as np

from sao_jax.packing import round_up


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
  plen = prompt_valid_bp.shape[1]
  any_valid = valid_bl.any(axis=1)
  first = np.where(any_valid, valid_bl.argmax(axis=1), 0)
  t_any = valid_bt.any(axis=1)
  last_t = valid_bt.shape[1] - 1 - np.asarray(valid_bt, bool)[:, ::-1].argmax(axis=1)
  last_read = np.where(t_any, plen - 1 + last_t, plen - 1)
  end = np.where(any_valid, np.maximum(last_read, first) + 1, 0)
  start = np.where(any_valid, np.minimum(first, plen - 1), 0)
  return start.astype(np.int64), end.astype(np.int64)


def plan(prompt_valid_bp, valid_bt, *, bucket: int = 1, factor: int = 1) -> PackPlan | None:
  """The packing of a batch whose rows have these validity masks ([B, P] and [B, T], host
  arrays) into the fewest packed rows of `factor` x (P + T) slots that are a multiple of
  `bucket`, or None where that would not be fewer slots than B rows (module docstring)."""
  prompt_valid_bp = np.asarray(prompt_valid_bp, bool)
  valid_bt = np.asarray(valid_bt, bool)
  b = prompt_valid_bp.shape[0]
  row_len = prompt_valid_bp.shape[1] + valid_bt.shape[1]
  length = max(int(factor), 1) * row_len
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
  rows = round_up(max(len(fill), 1), max(int(bucket), 1))
  if rows * length >= b * row_len:
    return None
  src = np.zeros((rows, length), np.int32)
  seg = np.zeros((rows, length), np.int32)
  dst = np.zeros((b, row_len), np.int32)
  for i in range(b):
    if size[i] == 0:
      continue
    n, j = where[i], offset[i]
    slots = np.arange(start[i], end[i])
    src[n, j : j + size[i]] = i * row_len + slots
    seg[n, j : j + size[i]] = i + 1
    dst[i, slots] = n * length + j + np.arange(size[i])
  return PackPlan(src_ql=src, seg_ql=seg, dst_bl=dst)


def packed_attention(plan_: PackPlan, valid_bl: jax.Array) -> jax.Array:
  """The [Q, L, L] attention mask of the packed rows: a query sees the valid keys of its own
  segment at or before it."""
  kvalid_ql = gather(plan_, valid_bl) & (plan_.seg_ql > 0)
  s = jnp.arange(plan_.seg_ql.shape[1])
  same = plan_.seg_ql[:, :, None] == plan_.seg_ql[:, None, :]
  return same & kvalid_ql[:, None, :] & (s[None, None, :] <= s[None, :, None])


def gather(plan_: PackPlan, x_bl: jax.Array) -> jax.Array:
  """[B, L, ...] row-layout values at each packed slot: [Q, L, ...]."""
  flat = x_bl.reshape((-1,) + x_bl.shape[2:])
  return jnp.take(flat, plan_.src_ql, axis=0)


def scatter_back(plan_: PackPlan, x_ql: jax.Array) -> jax.Array:
  """[Q, L, ...] packed values back at their row slots: [B, L, ...] (unpacked slots read
  packed slot 0; the caller masks them)."""
  flat = x_ql.reshape((-1,) + x_ql.shape[2:])
  return jnp.take(flat, plan_.dst_bl, axis=0)


class Packer:
  """Packs the batches of one run on the host (`learner.pack='on'`): `packer(batch)` is the
  batch with its `pack` plan, or unchanged where packing saves nothing or the batch has no
  text rows to pack. The packed row count is a multiple of `bucket`, so a run compiles a few
  packed programs, not one per batch; it depends on the batch alone (not on earlier
  batches), so a replayed update packs exactly as the run did. Counts what it did: batches
  packed and not, slots computed against the slots a padded batch computes, and the most
  packed rows a batch took."""

  def __init__(self, bucket: int, factor: int = 1):
    self.bucket = max(int(bucket), 1)
    self.factor = max(int(factor), 1)
    self.rows = 0
    self.counts = {"packed": 0, "unpacked": 0, "slots": 0, "padded_slots": 0}

  def __call__(self, batch):
    if not hasattr(batch, "pack") or batch.pack is not None:
      return batch
    b, length = (
      batch.prompt_valid_bp.shape[0],
      batch.prompt_valid_bp.shape[1] + batch.valid_bt.shape[1],
    )
    p = plan(batch.prompt_valid_bp, batch.valid_bt, bucket=self.bucket, factor=self.factor)
    self.counts["padded_slots"] += b * length
    if p is None:
      self.counts["unpacked"] += 1
      self.counts["slots"] += b * length
      return batch
    self.rows = max(self.rows, p.rows)
    self.counts["packed"] += 1
    self.counts["slots"] += p.src_ql.size
    return dataclasses.replace(batch, pack=p)
