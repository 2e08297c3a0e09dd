"""The SAO learner's publishing part (runners.learner_parts.publishing): parameter versions,
snapshots with their journal positions, and the transport commit held until a snapshot is
written. A real Orbax manager and a stand-in intake; no process."""

import jax
import jax.numpy as jnp
import numpy as np

from sao_jax import checkpoint as ckpt_lib
from sao_jax.config import Config, RecoveryConfig
from sao_jax.runners.learner_parts.publishing import Publishing
from sao_jax.state import TrainState
from sao_jax.transport.params import ParamSubscriber


class _Intake:
  """What a snapshot asks of the intake, recorded."""

  def __init__(self):
    self.calls, self.seq, self.positions = [], 0, {0: 0}

  def mark_journal(self):
    self.seq += 10
    self.calls.append(("mark", self.seq))
    return self.seq

  def prune_journal(self, keep_from):
    self.calls.append(("prune", keep_from))

  def safe_positions(self):
    self.positions = {0: self.seq + 1}
    return self.positions

  def commit(self, positions):
    self.calls.append(("commit", positions))


def _state(step):
  return TrainState(
    step=jnp.asarray(step, jnp.int32),
    params={"w": jnp.full(2, float(step))},
    opt_state={"m": jnp.zeros(2)},
    rng=jax.random.key(0),
    lr_scale=jnp.asarray(1.0, jnp.float32),
    nonfinite=jnp.asarray(0, jnp.int32),
  )


def _publishing(tmp_path, keep_journal=False, every=2):
  cfg = Config(recovery=RecoveryConfig(keep=2, keep_journal=keep_journal))
  return Publishing(cfg, ckpt_lib.manager(tmp_path / "rl", every=every, keep=2))


def test_a_snapshot_keeps_its_journal_position_and_commits_once_written(tmp_path):
  pub, intake = _publishing(tmp_path), _Intake()
  meta = lambda: {"phase": "rl", "stream": {"snap_journal": dict(pub.snap_journal)}}  # noqa: E731
  assert pub.snapshot(0, _state(0), intake, meta, force=True)  # a new run's first
  pub.mngr.wait_until_finished()
  pub.commit_written(intake)
  assert not pub.snapshot(1, _state(1), intake, meta)  # not due
  for step in (2, 4, 6):
    assert pub.snapshot(step, _state(step), intake, meta)
    pub.mngr.wait_until_finished()
    pub.commit_written(intake)
  # each: the journal rotated, pruned to the oldest kept snapshot's position, offsets
  # committed once the snapshot is written
  assert intake.calls == [
    ("mark", 10),
    ("prune", 10),
    ("commit", {0: 11}),
    ("mark", 20),
    ("prune", 10),
    ("commit", {0: 21}),
    ("mark", 30),
    ("prune", 10),  # (step 0 is still on disk until step 4's save replaces it: keep=2)
    ("commit", {0: 31}),
    ("mark", 40),
    ("prune", 20),  # step 0's snapshot is gone: its position with it
    ("commit", {0: 41}),
  ]
  assert pub.snap_journal == {2: 20, 4: 30, 6: 40} and pub.pending_commit is None
  assert pub.mngr.all_steps() == [4, 6]
  _, saved = ckpt_lib.read_meta(tmp_path / "rl", 6)
  assert saved["stream"]["snap_journal"] == {"2": 20, "4": 30, "6": 40}
  assert saved["phase"] == "rl"
  pub.mngr.close()


def test_the_commit_waits_while_a_snapshot_is_being_written(tmp_path):
  pub, intake = _publishing(tmp_path), _Intake()
  pub.pending_commit = {0: 5}
  pub.mngr = type("Busy", (), {"is_saving_in_progress": lambda self: True})()
  pub.commit_written(intake)
  assert intake.calls == [] and pub.pending_commit == {0: 5}


def test_with_keep_journal_nothing_is_pruned_and_the_end_commits(tmp_path):
  pub, intake = _publishing(tmp_path, keep_journal=True), _Intake()
  pub.snapshot(3, _state(3), intake, lambda: {"phase": "rl", "stream": {}}, force=True)
  pub.finish(intake)
  assert intake.calls == [("mark", 10), ("commit", {0: 11})]
  assert pub.mngr.all_steps() == [3]
  pub.mngr.close()


def test_another_process_saves_its_shards_without_stream_positions(tmp_path):
  pub = _publishing(tmp_path)
  assert pub.snapshot(2, _state(2), None, lambda: 1 / 0)  # (never asked for the stream)
  pub.finish(None)
  _, saved = ckpt_lib.read_meta(tmp_path / "rl", 2)
  assert saved["phase"] == "rl" and "stream" not in saved and pub.snap_journal == {}
  pub.mngr.close()


def test_published_versions_name_their_lineage(tmp_path):
  pub = _publishing(tmp_path)
  pub.open(tmp_path / "params", key=None)
  pub.publish(3, {"w": np.ones(2, np.float32)}, lineage=None)
  got = ParamSubscriber(tmp_path / "params").poll((-2, -2))
  assert got[:2] == (-1, 3) and got[2]["['w']"].tolist() == [1.0, 1.0]
  pub.publish(4, {"w": np.zeros(2, np.float32)}, lineage=12)
  assert ParamSubscriber(tmp_path / "params").poll(got[:2])[:2] == (12, 4)
  pub.mngr.close()
