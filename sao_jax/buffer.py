"""The SAO learner's trajectory buffer: decoded records in consumption order -> batches.

Records arrive from any sampler, in any order, from any policy version. The buffer keeps
them in the order the learner consumed them (the journal's order), and a batch is a
deterministic function of that sequence and the learner step, so a replay from the journal
after a crash forms exactly the batches the crashed run formed.

A trajectory record holds one row per environment step (S rows). A batch holds `rows`
rows: whole trajectories in consumption order until the next one would not fit; the rest is
padding (`row_valid` False) and that trajectory waits for the next batch. Trajectories are
never split across updates and no row is dropped.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Iterable

import numpy as np

from sao_jax.batches import SAOBatch
from sao_jax.transport import records

TRAJECTORY_ARRAYS = (("prompt", "prompt_valid"), ("tokens", "valid", "logp"))


@dataclasses.dataclass
class Item:
  """A consumed record waiting in the learner's buffer."""

  rec: records.Record
  seq: int  # journal sequence number
  pos: tuple[int, int] | None  # transport position (Kafka partition, offset)
  replayed: bool = False  # from the journal after a restart

  @property
  def num_rows(self) -> int:
    if self.rec.kind == records.RecordKind.LONG_TRAJECTORY:
      return 1  # a row of the memory policy's batch is a whole trajectory (MemorySAOBatch)
    return len(self.rec.arrays["tokens"])


def check_trajectory(
  rec: records.Record, widths: tuple[int, int], num_tasks: int, max_rows: int
) -> None:
  """Raises `records.Malformed` unless `rec` carries what the batch is built from, in the
  shapes it is compiled for: a well-formed record from a foreign writer (other config or code
  version) must be dropped like a corrupt one, not crash the learner."""
  a, m = rec.arrays, rec.meta
  for names, width in zip(TRAJECTORY_ARRAYS, widths, strict=True):
    for k in names:
      if k not in a or a[k].ndim != 2 or a[k].shape[1] != width or len(a[k]) < 1:
        raise records.Malformed(
          f"trajectory array {k!r} missing or not [steps, {width}]: "
          f"{a[k].shape if k in a else None}"
        )
  if len({len(a[k]) for names in TRAJECTORY_ARRAYS for k in names}) != 1:
    raise records.Malformed("trajectory arrays disagree on the number of steps")
  if "version" in a and (
    a["version"].shape != a["tokens"].shape or a["version"].dtype.kind not in "iu"
  ):
    raise records.Malformed(
      f"trajectory array 'version' must be integers shaped like tokens "
      f"{a['tokens'].shape}, got {a['version'].dtype} {a['version'].shape}"
    )
  if len(a["tokens"]) > max_rows:
    raise records.Malformed(
      f"trajectory of {len(a['tokens'])} steps does not fit a batch of {max_rows} rows"
    )
  numbers = [m.get(k) for k in ("reward", "t_end")]
  if not (
    all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in numbers)
    and isinstance(m.get("task_index"), int)
    and 0 <= m["task_index"] < num_tasks
  ):
    raise records.Malformed(f"trajectory meta lacks a valid reward/t_end/task_index: {m}"[:300])
  rs = m.get("reward_s", 0.0)
  if not (isinstance(rs, (int, float)) and not isinstance(rs, bool) and 0 <= rs < float("inf")):
    raise records.Malformed(f"trajectory meta reward_s {rs!r} is not a duration")
  runs = m.get("sandbox_runs", 0)
  if not (isinstance(runs, int) and not isinstance(runs, bool) and runs >= 0):
    raise records.Malformed(f"trajectory meta sandbox_runs {runs!r} is not a count")


def decode_trajectory(
  data: bytes,
  learner,
  counts: collections.Counter,
  expect: tuple | Callable[[records.Record], None] | None = None,
) -> records.Record | None:
  """A trajectory record, or None for one that is malformed (counted in
  `counts['bad_records']`, sent to the learner end's dead-letter topic, and logged the first
  time) or of another kind. With `expect` (`(prompt_len, completion_len)`, number of tasks,
  rows per batch) a record must also fit the learner's batch (`check_trajectory`); a
  callable `expect(rec)` replaces both checks, for records of another kind (it raises
  `records.Malformed`; e.g. `runners.memory_sao.LongRecordCheck`)."""
  try:
    rec = records.decode(data)
    if callable(expect):
      expect(rec)
      return rec
    if rec.kind != records.RecordKind.TRAJECTORY:
      raise records.Malformed(f"expected a trajectory record, got {rec.kind.name}")
    if expect is not None:
      check_trajectory(rec, *expect)
    return rec
  except records.RecordError as err:
    counts["bad_records"] += 1
    if counts["bad_records"] == 1:
      print(
        f"sao: skipping a malformed trajectory record ({err}); further ones are only "
        "counted (bad_records) and copied to the dead-letter topic",
        flush=True,
      )
    learner.dead_letter(data, str(err))
    return None


def on_path(rec: records.Record, step: int, tree) -> bool:
  """Whether every token of `rec` is of a policy on the path to the current one of `tree`
  (a `sao_jax.lineage.LineageTree` with a current lineage): an ancestor, not a discarded or
  unknown lineage's."""
  lineage, a = rec.meta.get("lineage", -1), rec.arrays
  if "version" in a and not tree.holds(lineage, a["version"][a["valid"].astype(bool)], step):
    return False
  return tree.age(lineage, rec.policy_version, step) >= 0


def record_age(rec: records.Record, step: int, tree=None) -> int:
  """Updates between the policy that made `rec` (its oldest token's) and the learner's at
  `step`. With a `sao_jax.lineage.LineageTree`, along the tree: -1 when any of its tokens is
  of a policy that is not an ancestor of the current one (a lineage that a resume or rollback
  discarded, or one the run never had), unless the tree weighs discarded lineages: then its
  farthest token's distance along the tree (-1 still for a lineage the run never had).
  Without one: `step` minus the record's version."""
  if tree is None or tree.current is None:
    return step - rec.policy_version
  lineage = rec.meta.get("lineage", -1)
  if on_path(rec, step, tree):
    return tree.age(lineage, rec.policy_version, step)
  if not tree.weigh_discarded:
    return -1
  a = rec.arrays
  versions = [rec.policy_version]
  if "version" in a:
    versions = np.append(a["version"][a["valid"].astype(bool)], rec.policy_version)
  d = tree.distance(lineage, np.asarray(versions), step)
  return -1 if (d < 0).any() else int(d.max())


class TrajectoryBuffer:
  """Consumed records in order; batches of `rows` rows of trajectories at most
  `max_staleness` policy versions old. With a `lineage` tree (`sao_jax.lineage`), age is
  measured along it and records of a discarded lineage are dropped like stale ones
  (`discarded` tells them apart)."""

  def __init__(self, rows: int, max_staleness: int, lineage=None):
    self.rows, self.max_staleness = rows, max_staleness
    self.lineage = lineage
    self._items: collections.deque[Item] = collections.deque()

  def __len__(self) -> int:
    return len(self._items)

  def __iter__(self):
    return iter(self._items)

  def extend(self, items: Iterable[Item]) -> None:
    self._items.extend(items)

  def first_seq(self, default: int) -> int:
    """Journal sequence number of the oldest waiting record (`default` when empty)."""
    return self._items[0].seq if self._items else default

  def _stale(self, it: Item, step: int) -> bool:
    age = record_age(it.rec, step, self.lineage)
    return age < 0 or age > self.max_staleness

  def discarded(self, it: Item, step: int) -> bool:
    """Whether `it` is of a policy off the current lineage's path (dropped as such, or
    weighed by its distance when the tree weighs discarded lineages)."""
    if self.lineage is None or self.lineage.current is None:
      return record_age(it.rec, step) < 0
    return not on_path(it.rec, step, self.lineage)

  def fresh(self, step: int) -> int:
    """How many waiting records a batch at `step` would still take (not stale, not of a
    discarded lineage)."""
    return sum(not self._stale(it, step) for it in self._items)

  def ready(self, step: int) -> bool:
    """Whether the next batch at `step` would be full: its fresh records fill `rows`."""
    n = 0
    for it in self._items:
      if self._stale(it, step):
        continue
      n += it.num_rows
      if n >= self.rows:
        return True
    return False

  def take_batch(self, step: int) -> tuple[list[Item], list[Item]]:
    """The next fresh records, in consumption order, while their rows fit in `rows`, and the
    too-stale records (or of a discarded lineage) met on the way (dropped)."""
    batch, stale, n = [], [], 0
    while self._items and n < self.rows:
      it = self._items[0]
      if self._stale(it, step):
        stale.append(self._items.popleft())
        continue
      if n + it.num_rows > self.rows:
        break
      n += it.num_rows
      batch.append(self._items.popleft())
    return batch, stale

  def safe_positions(
    self, read_positions: dict[int, int], also: Iterable[tuple[int, int]] = ()
  ) -> dict[int, int]:
    """Per partition: the offset before which every read record is applied or dropped (not
    waiting here, nor at `also`: records held elsewhere, e.g. for a reward audit)."""
    out = dict(read_positions)
    for part, off in [it.pos for it in self._items if it.pos is not None] + list(also):
      out[part] = min(out.get(part, off), off)
    return out


def batch_rows(
  items: list[Item], step: int, rows: int, max_staleness: int, lineage=None
) -> tuple[SAOBatch, int]:
  """The SAO update's batch from whole trajectories: one row per environment step, padded to
  `rows` (numpy fields). Returns (batch, number of records with a token whose policy is not
  an ancestor of the learner's at `step` (without a `lineage` tree: whose version is ahead
  of `step`); the buffer drops those before they get here, and a token of one is given the
  largest staleness still used). Staleness is per token, from the record's per-token
  `version` array (the record's policy_version on every token when it has none), measured
  along the `sao_jax.lineage.LineageTree` when one is given (the same numbers unless a
  rollback is on the path; a token of a discarded lineage that the tree weighs: its distance,
  `LineageTree.measure`)."""
  if not items:
    raise ValueError("a batch needs at least one trajectory")
  parts: dict[str, list] = collections.defaultdict(list)
  orphans = 0
  for j, it in enumerate(items):
    rec, a = it.rec, it.rec.arrays
    version = a.get("version")
    if version is None:
      version = np.full(a["tokens"].shape, rec.policy_version, np.int64)
    version = np.where(a["valid"], version, rec.policy_version).astype(np.int64)
    if lineage is None or lineage.current is None:
      lag = step - version
    else:
      lag = lineage.measure(rec.meta.get("lineage", -1), version, step)
    if (lag < 0).any():
      orphans += 1
      lag = np.where(lag < 0, max_staleness, lag)
    n = len(a["tokens"])
    for k in ("prompt", "prompt_valid", "tokens", "valid", "logp"):
      parts[k].append(a[k])
    parts["rewards"].append(np.full(n, rec.meta["reward"], np.float32))
    parts["task"].append(np.full(n, rec.meta["task_index"], np.int32))
    parts["staleness"].append(lag.astype(np.int32))
    parts["traj"].append(np.full(n, j, np.int32))
    parts["head"].append(np.arange(n) == 0)
  cat = {k: np.concatenate(v) for k, v in parts.items()}
  n = len(cat["tokens"])
  if n > rows:
    raise ValueError(f"{n} rows of trajectories do not fit a batch of {rows}")

  def pad(x, fill=0):
    return np.concatenate([x, np.full((rows - n,) + x.shape[1:], fill, x.dtype)])

  # Padding rows are zeros, each its own (empty) trajectory so that it shares no statistics.
  traj = np.concatenate([cat["traj"], np.arange(len(items), len(items) + rows - n, dtype=np.int32)])
  return SAOBatch(
    prompt_bp=pad(cat["prompt"]),
    prompt_valid_bp=pad(cat["prompt_valid"]),
    tokens_bt=pad(cat["tokens"]),
    valid_bt=pad(cat["valid"]),
    logp_bt=pad(cat["logp"].astype(np.float32)),
    rewards_b=pad(cat["rewards"]),
    task_b=pad(cat["task"]),
    staleness_bt=pad(cat["staleness"]),
    row_valid_b=np.arange(rows) < n,
    traj_b=traj,
    head_b=pad(cat["head"]),
    poison_b=np.zeros(rows, np.float32),
  ), orphans
