"""The SAO learner's outputs: parameter versions for the samplers, and Orbax snapshots of the
state with the stream positions, whose transport offsets are committed only once written.

The intake (process 0's) is passed in where a snapshot needs it; the other processes pass
None and write their shards only. Tested with a stand-in intake (tests/test_learner_publishing.py).
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from typing import Protocol

from sao_jax import checkpoint as ckpt_lib
from sao_jax import config as config_lib
from sao_jax.state import TrainState
from sao_jax.transport.params import ParamPublisher


class StreamSide(Protocol):
  """What a snapshot needs of the intake (`learner_parts.intake.Intake`)."""

  def mark_journal(self) -> int: ...
  def prune_journal(self, keep_from: int) -> None: ...
  def safe_positions(self) -> dict[int, int]: ...
  def commit(self, positions: dict[int, int] | None) -> None: ...


class Publishing:
  """Publishes parameters (`open` first) and saves snapshots through `mngr`.

  `snap_journal` maps each kept snapshot's step to the journal position its replay starts
  from (saved in the snapshots: a resume replays from there); `pending_commit` holds the
  transport offsets of the newest snapshot until it is written."""

  def __init__(self, cfg: config_lib.Config, mngr):
    self.cfg, self.mngr = cfg, mngr
    self.publisher: ParamPublisher | None = None
    self.snap_journal: dict[int, int] = {}
    self.pending_commit: dict[int, int] | None = None

  def open(self, param_dir: str | pathlib.Path, key: bytes | None) -> None:
    self.publisher = ParamPublisher(param_dir, key=key)

  def publish(self, step: int, params, lineage: int | None) -> None:
    self.publisher.publish(step, params, lineage=-1 if lineage is None else lineage)

  def snapshot(
    self,
    step: int,
    state: TrainState,
    intake: StreamSide | None,
    stream_meta: Callable[[], dict],
    *,
    force: bool = False,
    metrics: dict | None = None,
  ) -> bool:
    """A snapshot of `state` at `step` when due (or `force`). With the intake: the journal
    is rotated, its replay position kept, `stream_meta()` saved with the state, the journal
    pruned to what a kept snapshot may replay (unless recovery.keep_journal), and the
    transport offsets the snapshot covers held for `commit_written`."""
    if not force and not self.mngr.should_save(step):
      return False
    if intake is None:  # its shards only: the JSON items are process 0's
      ckpt_lib.save(self.mngr, state, self.cfg, {"phase": "rl"}, force=force, metrics=metrics)
      return True
    self.snap_journal[step] = intake.mark_journal()
    kept = set(self.mngr.all_steps()) | {step}
    for k in [k for k in self.snap_journal if k not in kept]:
      del self.snap_journal[k]
    ckpt_lib.save(self.mngr, state, self.cfg, stream_meta(), force=force, metrics=metrics)
    if not self.cfg.recovery.keep_journal:
      intake.prune_journal(min(self.snap_journal.values()))
    self.pending_commit = intake.safe_positions()
    return True

  def commit_written(self, intake: StreamSide | None) -> None:
    """Commits the held offsets once no snapshot is being written (what one holds)."""
    if self.pending_commit is not None and not self.mngr.is_saving_in_progress():
      intake.commit(self.pending_commit)
      self.pending_commit = None

  def finish(self, intake: StreamSide | None) -> None:
    """Waits for the last snapshot, then commits its offsets (process 0)."""
    self.mngr.wait_until_finished()
    if intake is not None:
      intake.commit(self.pending_commit)
