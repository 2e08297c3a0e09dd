"""Policy identity is (lineage, version): the lineage tree's ages along resumes and rollbacks,
its log, and the buffer and batch that use it (sao_jax.lineage)."""

import numpy as np
import pytest

from sao_jax.buffer import Item, TrajectoryBuffer, batch_rows, record_age
from sao_jax.lineage import LineageLog, LineageTree, Node
from sao_jax.transport import records

R, A, B, C = 0x10, 0xA, 0xB, 0xC  # lineage ids, given for readable tests


def _resumed_then_rolled_back() -> LineageTree:
  """R from 0; killed after 14, resumed from its snapshot at 10 as A; at 20 A rolls back to
  its shadow of 16 as B."""
  t = LineageTree()
  t.begin(0, "start", _id=R)
  t.begin(10, "resume", _id=A)  # A's 10 is R's 10
  t.begin(20, "rollback", origin=16, _id=B)  # B's 20 is A's 16
  return t


def test_age_along_the_path_and_minus_one_off_it():
  t = _resumed_then_rolled_back()
  assert [n.id for n, _ in t.path()] == [B, A, R]
  # B's own versions: 20..step.
  assert t.age(B, 23, 25) == 2 and t.age(B, 20, 25) == 5
  # A's versions up to 16 are ancestors: 25 - 20 on B, then 16 - v on A.
  assert t.age(A, 16, 25) == 5 and t.age(A, 12, 25) == 9
  # R's up to 10: ... + (16 - 10) on A + (10 - v) on R.
  assert t.age(R, 10, 25) == 11 and t.age(R, 3, 25) == 18
  # Discarded: R after 10 (the killed incarnation's), A after 16 (rolled back), and
  # unknown lineages or ones from before a lineage began.
  for lineage, v in [(R, 11), (R, 14), (A, 17), (A, 20), (A, 9), (C, 5), (-1, 3), (B, 26)]:
    assert t.age(lineage, v, 25) == -1, (lineage, v)
  ages = t.age(R, np.array([[3, 10], [11, -1]]), 25)
  assert ages.tolist() == [[18, 11], [-1, -1]]
  assert t.holds(R, [3, 10], 25) and not t.holds(R, [10, 11], 25)


def test_a_resume_keeps_version_numbers_so_ages_are_differences():
  t = LineageTree()
  t.begin(0, "start", _id=R)
  t.begin(8, "resume", _id=A)
  for v in range(0, 9):
    assert t.age(R, v, 12) == 12 - v
  assert t.age(A, 12, 12) == 0


def test_branch_from_a_lineage_off_the_path():
  """A rollback to a shadow that a discarded lineage saved: the new lineage's path goes
  through that one."""
  t = _resumed_then_rolled_back()
  t.branch_from(A, 18, 30, "rollback")  # A's 18 was discarded by B, its shadow kept
  assert [n.id for n, _ in t.path()][1:] == [A, R]
  assert t.age(A, 18, 30) == 0 and t.age(B, 22, 30) == -1
  with pytest.raises(ValueError, match="not in the tree"):
    t.branch_from(C, 1, 31, "rollback")


def test_tree_json_round_trip_and_log(tmp_path):
  t = _resumed_then_rolled_back()
  back = LineageTree.from_json(t.to_json())
  assert back.current == B and back.age(R, 3, 25) == 18
  log = LineageLog(tmp_path / "lineages.jsonl")
  for n in t.nodes.values():
    log.append(n)
  with open(log.path, "a") as f:
    f.write('{"id": 5, "sta')  # a half-written last line (crash) is skipped
  assert [n.id for n in log.nodes()] == [R, A, B]
  assert log.nodes()[2] == Node.from_json(t.nodes[B].to_json())
  fresh = LineageTree()
  assert fresh.path() == [] and fresh.age(R, 1, 2) == -1
  new = fresh.begin(0, "start")
  assert 0 <= new.id < 2**48 and new.parent is None and fresh.current == new.id


def _rec(lineage, versions, rid=1):
  versions = np.asarray(versions, np.int32)[None]
  valid = versions >= 0
  arrays = {
    "prompt": np.ones((1, 4), np.int32),
    "prompt_valid": np.ones((1, 4), bool),
    "tokens": np.ones(versions.shape, np.int32),
    "valid": valid,
    "logp": np.full(versions.shape, -1.0, np.float32),
    "rewards": np.zeros(1, np.float32),
    "step_seconds": np.zeros(1, np.float32),
    "version": versions,
  }
  meta = {"lineage": lineage, "task_index": 0, "task_id": 0, "reward": 1.0, "t_end": 0.0}
  version = int(versions[valid].min())
  return records.decode(records.encode(records.RecordKind.TRAJECTORY, rid, version, arrays, meta))


def test_the_buffer_drops_records_of_a_discarded_lineage_and_batches_along_the_tree():
  t = _resumed_then_rolled_back()
  buf = TrajectoryBuffer(rows=3, max_staleness=12, lineage=t)
  recs = [
    _rec(R, [14, 14, -1], rid=1),  # the killed incarnation's, after the snapshot: discarded
    _rec(A, [15, 16, 16], rid=2),  # A's up to the rollback point: 5 + (16 - v) at 25
    _rec(A, [16, 17, -1], rid=3),  # one token after the rollback point: discarded
    _rec(B, [24, 24, 25], rid=4),
    _rec(R, [2, 2, 2], rid=5),  # an ancestor, but 19 updates old: stale
  ]
  assert [record_age(r, 25, t) for r in recs] == [-1, 6, -1, 1, 19]
  assert record_age(recs[0], 25) == 11  # without the tree: the plain difference
  buf.extend(Item(r, i, None) for i, r in enumerate(recs))
  batch_items, dropped = buf.take_batch(25)
  assert [it.rec.record_id for it in batch_items] == [2, 4]
  assert [it.rec.record_id for it in dropped] == [1, 3, 5]  # (5: too stale)
  assert [buf.discarded(it, 25) for it in dropped] == [True, True, False]
  batch, orphans = batch_rows(batch_items, 25, 3, 12, t)
  assert orphans == 0
  # Per token, along the tree: A's 15 and 16 are 6 and 5 updates from B's 25 (B began at
  # 20 from A's 16), not the 10 and 9 that the numbers' difference says.
  assert batch.staleness_bt[0].tolist() == [6, 5, 5] and batch.staleness_bt[1].tolist() == [1, 1, 0]
  # Without a tree (replay, which stops at a rollback) the numbers' differences.
  plain, _ = batch_rows(batch_items, 25, 3, 12)
  assert plain.staleness_bt[0].tolist() == [10, 9, 9]


def test_a_batch_sampler_samples_a_call_again_under_a_lineage_announced_meanwhile():
  """A call decoded while the learner resumed (lineage B announced, same version number) is
  decoded again under B before anything of it is sent."""
  from sao_jax.runners.sampler_proc import _calls, _Held

  announced = {"now": (A, 3, "params of A3")}
  last = [None]

  def poll():
    got = announced["now"]
    if got == last[0]:
      return None
    last[0] = got
    return got

  class End:
    calls = 0

    def get_tasks(self, n, timeout):
      self.calls += 1
      return [4, 5] if self.calls == 1 else []

  sampled = []

  def sample(held, indices):
    sampled.append((held.lineage, held.version, held.params, tuple(indices)))
    if len(sampled) == 1:
      announced["now"] = (B, 3, "params of B3")  # the learner resumed meanwhile
    return [f"trajectory of {held.lineage:x}"]

  end, alive = End(), iter([True] * 3 + [False]).__next__
  out = list(_calls(2, _Held(poll), alive, end, sample))
  assert sampled == [(A, 3, "params of A3", (4, 5)), (B, 3, "params of B3", (4, 5))]
  assert [(h.lineage, idx, o) for h, idx, o in out] == [(B, [4, 5], ["trajectory of b"])]
