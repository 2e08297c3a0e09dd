"""The SAO learner's intake (runners.learner_parts.intake) over a stand-in transport end and
sampler pool: tasks out, records in, batches taken, the ledger, a resume's replay and the
commit positions; no process, no broker. (The door's checks: tests/test_admission.py.)"""

import collections
import types

import numpy as np
from test_admission import EXPECT, N_TASKS, V, _clean, _Source

from sao_jax import admission, recovery
from sao_jax.buffer import TrajectoryBuffer
from sao_jax.config import Config, RLConfig, SamplersConfig, SAOConfig, TransportConfig
from sao_jax.runners.grpo import GroupIntake
from sao_jax.runners.learner_parts.intake import Intake


class _End:
  """A transport's learner end whose sampler answers each task at once with a clean record
  of policy version `version` (Kafka-like positions: partition 0, one offset a record)."""

  def __init__(self, version=2):
    self.src, self.version = _Source(3), version
    self.tasks, self.inbox, self.sent, self.dead, self.committed = [], [], [], [], []
    self.offset = 0

  def put_tasks(self, indices, handouts=None):
    for i in indices:
      self.tasks.append(int(i))
      data = self.src.encode(*_clean(task=int(i), version=self.version))
      self.inbox.append((data, (0, self.offset)))
      self.sent.append(self.inbox[-1])
      self.offset += 1

  def get_records(self, n, timeout=0.0):
    got, self.inbox = self.inbox[:n], self.inbox[n:]
    return got

  def dead_letter(self, data, reason):
    self.dead.append(reason)

  def positions(self):
    return {0: self.offset}

  def commit_positions(self, positions):
    self.committed.append(positions)


class _Pool:
  def __init__(self, end, leftovers=None):
    self.learner, self.restarts, self.leftovers = end, 0, leftovers
    self.group = types.SimpleNamespace(alive=lambda: 1, procs=[0])
    self.stopped = []

  def stop_local(self, meta):  # a quarantined sampler's process, if it is ours
    self.stopped.append(meta)
    return True

  def check(self):
    if self.leftovers is None:
      return None
    self.restarts += 1
    out, self.leftovers = self.leftovers, None
    return out


def _intake(tmp_path, end, cfg=None, rows=4, max_staleness=4, cls=Intake):
  cfg = cfg or Config(sao=SAOConfig(sampler_slots=2, refill_rows=1), samplers=SamplersConfig(num=1))
  counts = collections.Counter()
  guard = admission.RecordGuard(
    vocab_size=V, num_tasks=N_TASKS, counts=counts, reward_range=lambda i: (0.0, 1.0)
  )
  guard.published(3)
  intake = cls(
    cfg,
    tmp_path,
    guard=guard,
    buffer=TrajectoryBuffer(rows, max_staleness),
    journal=recovery.Journal(tmp_path / "journal"),
    ledger=recovery.Ledger(tmp_path / "ledger.jsonl"),
    counts=counts,
    n_sample=N_TASKS,
    expect=EXPECT,
  )
  intake.attach(_Pool(end))
  return intake


def test_fill_hands_out_tasks_and_takes_records_until_a_batch_is_ready(tmp_path):
  end = _End()
  intake = _intake(tmp_path, end)
  intake.fill(step=2, probs=None)
  # one batch (4) plus what one sampler holds in flight (2): six tasks, from the task RNG
  want = np.random.default_rng((Config().seed, 3)).choice(N_TASKS, size=6).tolist()
  assert end.tasks == want
  assert [it.rec.meta["task_index"] for it in intake.buffer] == want[:4]
  assert [it.seq for it in intake.buffer] == [0, 1, 2, 3] and intake.journal.next_seq == 4
  assert intake.outstanding == 2 and intake.buffer.ready(2)
  assert intake.counts["duplicates"] == 0 and not end.dead
  # with backpressure, the next work goes out before the update: the two waiting records
  # come in first and count against the bound (4 + 2 - 0 outstanding - 6 buffered: none)
  intake.top_up_before_update(step=2, probs=None)
  assert len(end.tasks) == 6 and len(intake.buffer) == 6 and intake.outstanding == 0
  # a redelivered record is a duplicate: not journaled or buffered again
  intake.ingest([end.sent[0]])
  assert intake.counts["duplicates"] == 1 and intake.journal.next_seq == 6


def test_taken_records_are_counted_ledgered_and_committed_past(tmp_path):
  end = _End(version=1)
  intake = _intake(tmp_path, end, rows=2, max_staleness=1)
  intake.hand_out([0, 1])
  end.version = 3
  intake.hand_out([2, 3, 4])
  intake.ingest(end.get_records(10))
  taken = intake.take(step=3)  # version 1 at step 3: two versions old, over the bound
  assert [it.rec.meta["task_index"] for it in taken.items] == [2, 3]
  assert [it.rec.meta["task_index"] for it in taken.dropped] == [0, 1]
  assert taken.discarded == [] and taken.weighted == []
  assert intake.counts["dropped_stale"] == 2 and intake.counts["dropped_lineage"] == 0
  intake.record(4, *taken, check={"loss": 0.5}, lineage="00000000000a")
  row = intake.ledger.rows()[-1]
  assert row["step"] == 4 and row["check"] == {"loss": 0.5}
  assert row["applied"] == [it.rec.record_id for it in taken.items]
  assert row["stale"] == [it.rec.record_id for it in taken.dropped]
  # what a snapshot asks: a new journal segment, the replay position (the waiting record's)
  # and the offsets safe to commit (before the waiting record at offset 4)
  assert intake.mark_journal() == 4 == intake.journal_next()
  assert intake.safe_positions() == {0: 4}
  intake.commit({0: 4})
  assert end.committed == [{0: 4}]


def test_a_resume_replays_what_the_ledger_did_not_apply(tmp_path):
  end = _End()
  intake = _intake(tmp_path, end, rows=2)
  intake.hand_out([5, 6, 7])
  intake.ingest(end.get_records(10))
  taken = intake.take(step=2)
  intake.record(3, *taken, check=None, lineage=None)
  rng_state = intake.task_rng.bit_generator.state
  draw = intake.task_rng.integers(1000)
  assert intake.close() == 0
  again = _intake(tmp_path, _End())  # a new incarnation over the same files
  again.resume(3, {"task_rng": rng_state, "journal_next": 0})
  assert [it.rec.meta["task_index"] for it in again.buffer] == [7]
  assert all(it.replayed for it in again.buffer) and again.guard.resumed
  assert again.seen_ids == {it.rec.record_id for it in taken.items} | {
    it.rec.record_id for it in again.buffer
  }
  assert again.task_rng.integers(1000) == draw


def test_a_sampler_restart_hands_its_leftovers_in(tmp_path):
  end = _End()
  cfg = Config(transport=TransportConfig(kind="embedded"))
  intake = _intake(tmp_path, end, cfg=cfg)
  intake.hand_out([1, 2])
  leftovers = [data for data, _ in end.get_records(10)]
  intake.pool.leftovers = leftovers
  intake.check_samplers()
  assert intake.counts["sampler_restarts"] == 1 and len(intake.buffer) == 2
  assert intake.outstanding == 0 and not intake.guard.outstanding  # a new task queue


def test_rows_the_update_flagged_are_charged_to_their_records(tmp_path):
  end = _End()
  intake = _intake(tmp_path, end)
  intake.hand_out([0, 1, 2])
  intake.ingest(end.get_records(10))
  items = list(intake.buffer)
  intake.reject_unverified(np.array([False, True, False]), items, object(), drift=1.0)
  assert intake.counts["rejected_logp_drift"] == 1 and intake.counts["rejected"] == 1
  memory = types.SimpleNamespace(traj_b=np.array([0, 0, 2, 2]))  # rows of trajectories
  intake.reject_unverified(np.array([False, False, True, True]), items, memory, drift=1.0)
  assert intake.counts["rejected_logp_drift"] == 3


def test_synchronous_grpo_hands_out_one_group_a_step(tmp_path):
  end = _End()
  cfg = Config(rl=RLConfig(prompts_per_step=2, group_size=2))
  intake = _intake(tmp_path, end, cfg=cfg, rows=4, max_staleness=0, cls=GroupIntake)
  intake.fill(step=2, probs=None)
  prompts = np.random.default_rng((cfg.seed, 3)).integers(0, N_TASKS, 2)
  assert end.tasks == np.repeat(prompts, 2).tolist()  # each prompt group_size times
  assert len(intake.buffer) == 4 and intake.outstanding == 0
  intake.top_up_before_update(step=2, probs=None)  # nothing ahead of the update
  assert len(end.tasks) == 4
