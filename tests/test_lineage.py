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


def test_distance_runs_up_the_discarded_branch_and_down_the_current_path():
  t = _resumed_then_rolled_back()
  # Ancestors: the same as age.
  for lineage, v in [(B, 23), (A, 16), (A, 12), (R, 10), (R, 3)]:
    assert t.distance(lineage, v, 25) == t.age(lineage, v, 25), (lineage, v)
  # R after 10 (the killed incarnation's tail): up to R's 10, then 11 down to B's 25.
  assert t.distance(R, 14, 25) == 4 + 11
  # A after 16 (rolled back): up to A's 16, then 5 down.
  assert t.distance(A, 17, 25) == 6 and t.distance(A, 20, 25) == 9
  # A lineage off the path altogether: R's 12 resumed as D and died at 14; D's 14 is 2 up
  # to R's 12, 2 more to R's 10, then 11 down.
  d = t.nodes[B]
  t.current = R
  t.begin(12, "resume", _id=C)
  t.current = d.id
  assert t.distance(C, 14, 25) == 2 + 2 + 11 and t.age(C, 14, 25) == -1
  # Unknown lineages, versions a lineage never had, the current one's future: none.
  for lineage, v in [(0xD, 5), (-1, 3), (A, 9), (B, 26)]:
    assert t.distance(lineage, v, 25) == -1, (lineage, v)
  assert t.distance(R, np.array([3, 14, -5]), 25).tolist() == [18, 15, -1]
  assert t.measure(R, 14, 25) == -1  # dropping (the default) measures ages only
  t.weigh_discarded = True
  assert t.measure(R, 14, 25) == 15


def test_weighing_discarded_lineages_trains_their_records_at_their_distance():
  t = _resumed_then_rolled_back()
  t.weigh_discarded = True
  buf = TrajectoryBuffer(rows=4, max_staleness=12, lineage=t)
  recs = [
    _rec(R, [14, 14, -1], rid=1),  # discarded: 15 updates away, beyond max_staleness
    _rec(A, [16, 17, -1], rid=3),  # one token after the rollback point: 5 and 6 away
    _rec(B, [24, 24, 25], rid=4),
    _rec(0xD, [24, 24, 24], rid=6),  # a lineage the run never had: never trained on
  ]
  assert [record_age(r, 25, t) for r in recs] == [15, 6, 1, -1]
  buf.extend(Item(r, i, None) for i, r in enumerate(recs))
  batch_items, dropped = buf.take_batch(25)
  assert [it.rec.record_id for it in batch_items] == [3, 4]
  assert [it.rec.record_id for it in dropped] == [1, 6]
  assert [buf.discarded(it, 25) for it in batch_items] == [True, False]
  batch, orphans = batch_rows(batch_items, 25, 4, 12, t)
  assert orphans == 0  # every token has a distance: none is given the largest staleness
  # (the padding token takes the record's version, A's 16: 5 updates away)
  assert batch.staleness_bt[0].tolist() == [5, 6, 5]
  assert batch.staleness_bt[1].tolist() == [1, 1, 0]


def test_the_audit_accepts_weighed_records_only_where_the_ledger_says_so(tmp_path):
  from sao_jax import recovery
  from sao_jax.transport import records as rec_lib

  t = _resumed_then_rolled_back()
  log = LineageLog(tmp_path / "lineages.jsonl")
  for n in t.nodes.values():
    log.append(n)
  journal = recovery.Journal(tmp_path / "journal")
  rec = _rec(A, [17, 17, -1], rid=7)  # of the rolled-back branch
  journal.append(
    [rec_lib.encode(rec_lib.RecordKind.TRAJECTORY, 7, rec.policy_version, rec.arrays, rec.meta)]
  )
  journal.close()
  ledger = recovery.Ledger(tmp_path / "ledger.jsonl")
  ledger.append(1, [7], [], lineage=f"{B:012x}", weighted=[7])
  ledger.close()
  a = recovery.audit(tmp_path, 1)
  assert a["discarded_lineage_applied"] == 0 and a["discarded_lineage_weighted"] == 1
  (tmp_path / "ledger.jsonl").unlink()
  ledger = recovery.Ledger(tmp_path / "ledger.jsonl")
  ledger.append(1, [7], [], lineage=f"{B:012x}")  # trained on as if it were B's: caught
  ledger.close()
  assert recovery.audit(tmp_path, 1)["discarded_lineage_applied"] == 1
