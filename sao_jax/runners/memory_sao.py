"""SAO for the policy with compressed memory (`rl.algorithm='sao'` with `compression.enabled`).

The sampler processes, transport, buffer, journal, snapshots, shadows, rollbacks, publishing
and metrics of `runners.sao.SAOLearner`; what differs is the unit of data:

- a sampler plays whole long-horizon episodes, one per task, `sampler_slots` side by side
  as inline GRPO does (`MemoryPolicy.play`, called from `runners.sampler_proc`), under one
  policy version per episode, and ships each as a
  LONG_TRAJECTORY record (`LongTrajectory.arrays`: steps, behaviour log-probs, final INT8 bank
  and graveyard; `transport.records`);
- the learner checks a record against the shapes it is compiled for (`LongRecordCheck`), and
  a batch is `sao.batch_size` whole trajectories (`MemorySAOBatch`, built by
  `compression.rollout.trajectories_to_batch`: the graded steps are the rows); the update is
  `compression.sao_update.make_memory_sao_update` (tracker baseline per question, decoupled
  PPO with is_cap, freshness, exact replay of every row's memory);
- held-out evaluation and shadow validation are `evaluation.evaluate`'s, as for text.

What it cannot do is refused by `sao_jax.setup` (`_check_memory_rl`).
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib

import numpy as np

from sao_jax.batches import MemorySAOBatch
from sao_jax.buffer import Item, record_age
from sao_jax.compression.policy import MemoryPolicy
from sao_jax.compression.rollout import (
  BANK_KEYS,
  GRAVE_KEYS,
  LAYOUT,
  STEP_KEYS,
  ExpertEpisodes,
  LongTrajectory,
  trajectories_to_batch,
)
from sao_jax.metrics import MetricsWriter
from sao_jax.policy import TextPolicy
from sao_jax.runners.grpo import SyncGRPOLearner
from sao_jax.runners.sao import SAOLearner, poisoned
from sao_jax.setup import Setup
from sao_jax.transport import records


@dataclasses.dataclass(frozen=True)
class LongRecordCheck:
  """`buffer.decode_trajectory`'s check of a LONG_TRAJECTORY record: raises
  `records.Malformed` unless it has this run's layout and shapes (a well-formed record of
  another config or code version is dropped like a corrupt one, never crashes the learner).

  Per step (S of them, 1 <= S <= steps): prompt/prompt_valid [S, P], tokens/valid/logp/
  version [S, T], rewards/graded/boundary [S], seg/seg_valid [S, L]; the bank [C, E, D]
  vectors, [C, E] scales, [C] steps and turning flags, a count; the graveyard G entries
  [G, E, D], [G, E], [G], [G] evicted at steps in [0, S). Meta as a text trajectory's."""

  prompt_len: int
  completion_len: int
  step_len: int
  steps: int
  capacity: int
  vectors: int
  dim: int
  quantized: bool
  num_tasks: int

  def __call__(self, rec: records.Record) -> None:
    if rec.kind != records.RecordKind.LONG_TRAJECTORY:
      raise records.Malformed(f"expected a long trajectory record, got {rec.kind.name}")
    a, m = rec.arrays, rec.meta
    if m.get("layout") != LAYOUT:
      raise records.Malformed(f"long trajectory layout {m.get('layout')!r}, expected {LAYOUT}")
    missing = [
      k
      for k in (*STEP_KEYS, "version", *(f"bank_{k}" for k in BANK_KEYS), *GRAVE_KEYS)
      if k not in a
    ]
    if missing:
      raise records.Malformed(f"long trajectory lacks arrays {missing}")
    s = len(a["tokens"]) if a["tokens"].ndim else 0
    if not 1 <= s <= self.steps:
      raise records.Malformed(f"long trajectory of {s} steps, not in 1..{self.steps}")
    g = len(a["gone_at_g"]) if a["gone_at_g"].ndim == 1 else -1
    c, e, d = self.capacity, self.vectors, self.dim
    want = {
      "prompt": ((s, self.prompt_len), "iu"),
      "prompt_valid": ((s, self.prompt_len), "b"),
      "tokens": ((s, self.completion_len), "iu"),
      "valid": ((s, self.completion_len), "b"),
      "logp": ((s, self.completion_len), "f"),
      "version": ((s, self.completion_len), "iu"),
      "rewards": ((s,), "f"),
      "graded": ((s,), "b"),
      "boundary": ((s,), "b"),
      "seg": ((s, self.step_len), "iu"),
      "seg_valid": ((s, self.step_len), "b"),
      "bank_vec_ced": ((c, e, d), "i" if self.quantized else "f"),
      "bank_scale_ce": ((c, e), "f"),
      "bank_step_c": ((c,), "iu"),
      "bank_turning_c": ((c,), "b"),
      "bank_count": ((), "iu"),
      "gone_vec_ged": ((g, e, d), "i" if self.quantized else "f"),
      "gone_scale_ge": ((g, e), "f"),
      "gone_step_g": ((g,), "iu"),
      "gone_at_g": ((g,), "iu"),
    }
    for k, (shape, kinds) in want.items():
      if a[k].shape != shape or a[k].dtype.kind not in kinds:
        raise records.Malformed(
          f"long trajectory array {k!r} is {a[k].dtype} {a[k].shape}, expected {shape} "
          f"of kind {kinds!r}"
        )
    if g and not (0 <= int(a["gone_at_g"].min()) and int(a["gone_at_g"].max()) < s):
      raise records.Malformed(f"graveyard entries evicted outside the {s} steps")
    if not 0 <= int(a["bank_count"]) <= c:
      raise records.Malformed(f"bank count {int(a['bank_count'])} not in 0..{c}")
    numbers = [m.get(k) for k in ("reward", "accuracy", "t_end")]
    if not (
      all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in numbers)
      and isinstance(m.get("task_index"), int)
      and 0 <= m["task_index"] < self.num_tasks
      and isinstance(m.get("task_id"), int)
      and 0.0 <= m["accuracy"] <= 1.0
    ):
      raise records.Malformed(
        f"long trajectory meta lacks a valid reward/accuracy/t_end/task_index/task_id: {m}"[:300]
      )


def memory_sao_batch(
  items: list[Item],
  step: int,
  *,
  steps: int,
  rows: int,
  completion_len: int,
  max_staleness: int,
  seed: int,
  lineage=None,
) -> tuple[MemorySAOBatch, np.ndarray, int]:
  """The update's batch from whole long trajectories (a pure function of the records, the
  learner step and the config, as `buffer.batch_rows`): `trajectories_to_batch` with R =
  `rows` rows per trajectory (graded steps first, the rest drawn with `seed`). Returns
  (batch, staleness of each trajectory, number of records of a policy that is not an ancestor
  of the learner's (along the `lineage` tree when given, else whose version is ahead of
  `step`); they get the largest staleness still used, as in `buffer.batch_rows`)."""
  if not items:
    raise ValueError("a batch needs at least one trajectory")
  trajs = [LongTrajectory.from_arrays(it.rec.arrays, it.rec.meta["task_id"]) for it in items]
  memory = trajectories_to_batch(trajs, steps, rows, seed=seed, completion_len=completion_len)
  lag = np.asarray([record_age(it.rec, step, lineage) for it in items], np.int64)
  orphans = int((lag < 0).sum())
  staleness = np.where(lag < 0, max_staleness, lag).astype(np.int32)
  batch = MemorySAOBatch(
    memory=memory,
    task_b=np.asarray([it.rec.meta["task_index"] for it in items], np.int32),
    staleness_b=staleness,
    accuracy_b=np.asarray([it.rec.meta["accuracy"] for it in items], np.float32),
    poison_b=np.zeros(len(items), np.float32),
  )
  return batch, staleness, orphans


class MemorySAOLearner(SAOLearner):
  """`SAOLearner` whose records are whole trajectories of the policy with compressed memory
  (see the module docstring). `sao.batch_size` counts trajectories."""

  batch_cls = MemorySAOBatch

  def __init__(self, s: Setup, writer: MetricsWriter, workdir: pathlib.Path, **kw):
    super().__init__(s, writer, workdir, **kw)
    self.bank_stats: dict[str, float] = {}  # bank entries, evictions per trajectory (last batch)

  def record_check(self) -> LongRecordCheck:
    c, s = self.cfg.compression, self.s
    return LongRecordCheck(
      prompt_len=c.window,
      completion_len=s.cfg.rl.max_new_tokens,
      step_len=c.step_len,
      steps=s.max_steps,
      capacity=c.capacity,
      vectors=c.vectors_per_step,
      dim=c.dim,
      quantized=c.quantize,
      num_tasks=self.n_sample,
    )

  @functools.cached_property
  def graded_rows(self) -> int:
    """Rows per trajectory: the most graded steps of an expert episode (as inline GRPO)."""
    return max(ExpertEpisodes(self.s).max_graded(), 1)

  def batch_from(self, items: list[Item], step: int) -> tuple[MemorySAOBatch, np.ndarray]:
    if len(items) != self.rows:  # the buffer hands out full batches (one row a trajectory)
      raise ValueError(f"a batch of {len(items)} trajectories, expected {self.rows}")
    cfg = self.cfg
    batch, staleness, orphans = memory_sao_batch(
      items,
      step,
      steps=self.s.max_steps,
      rows=self.graded_rows,
      completion_len=cfg.rl.max_new_tokens,
      max_staleness=cfg.sao.max_staleness,
      seed=int(np.random.default_rng((cfg.seed, 5, step)).integers(2**31)),
      lineage=self.lineage,
    )
    self.counts["orphan_version"] += orphans
    if poisoned(cfg, step + 1):
      batch.poison_b[0] = np.nan
      self.counts["poisoned"] += 1
    self.bank_stats = {
      "kept_steps_mean": float(np.mean([int(it.rec.arrays["bank_count"]) for it in items])),
      "evicted_mean": float(np.mean([len(it.rec.arrays["gone_at_g"]) for it in items])),
    }
    return batch, staleness

  def _row(self, metrics, staleness, tu, t_done, val_acc) -> dict:
    return dict(super()._row(metrics, staleness, tu, t_done, val_acc), **self.bank_stats)


# The SAO learner of each kind of policy (their records and batches differ).
SAO_LEARNERS = {TextPolicy: SAOLearner, MemoryPolicy: MemorySAOLearner}


def learner_class(algorithm: str, policy) -> type:
  """The learner of an RL phase that samples in sampler processes: synchronous GRPO through
  the samplers (`rl.algorithm='grpo'`), or the SAO learner of the policy's kind."""
  return SyncGRPOLearner if algorithm == "grpo" else SAO_LEARNERS[type(policy)]
