"""The asynchronous SAO learner: K sampler processes feed it single trajectories.

    task queue (indices; prioritised by the tracker) ──► sampler processes (spawn)
    sampler processes ── binary trajectory records ──► transport ──► learner buffer
    learner ── params v+1 every `param_sync_every` updates ──► param directory ──► samplers

The learner updates as soon as `sao.batch_size` rows have arrived, whatever policy version
produced them; staleness is corrected in the loss (`sao_jax.learner.make_sao_update`).
Every process started here is stopped here: on normal exit, on an exception, on Ctrl-C, and
when a sampler fails.

`SAOLearner` is the loop over four parts (`sao_jax.runners.learner_parts`): the intake
(samplers, transport, admission guard, buffer, journal, ledger), safety (non-finite guard,
shadow validation, rollback), publishing and snapshots, and statistics (counters,
transients, the metric row, the summary). `start` restores or begins and publishes; then
per update the intake fills the buffer and `update` takes one jitted step and hands its
outcome to the parts; `finish` ends the phase. `run_sao` is the function the trainer calls.

A learner over several processes (`sao_jax.distributed`) takes trajectories in through process
0 alone: only it has an intake (it starts the samplers, reads the transport, de-duplicates,
journals, keeps the ledger and the event log, and forms each batch); every process receives
that batch (`distributed.from_primary`) and runs the same jitted update, validations, Orbax
saves and publishing (collectives). The other processes start no process and write only their
shards of the snapshots. Every decision they must share follows from values that are the same
in all of them (the step, the update's metrics, validation accuracy) or comes from process 0
(the batch, and what `PhaseClock` decides from the wall clock).
"""

from __future__ import annotations

import collections
import contextlib
import pathlib
import time

import jax
import numpy as np

from sao_jax import checkpoint as ckpt_lib
from sao_jax import config as config_lib
from sao_jax import distributed, recovery, startup, storage
from sao_jax.batches import SAOBatch
from sao_jax.buffer import Item, batch_rows
from sao_jax.lineage import LineageLog, LineageTree
from sao_jax.metrics import MetricsWriter
from sao_jax.packing import round_up
from sao_jax.rl import trackers
from sao_jax.runners.common import (
  PhaseClock,
  defer_dir,
  eval_fn,
  finish_phase,
  log_step,
  programs_for,
)
from sao_jax.runners.learner_parts.intake import Intake, Taken
from sao_jax.runners.learner_parts.publishing import Publishing
from sao_jax.runners.learner_parts.safety import Safety
from sao_jax.runners.learner_parts.statistics import Statistics
from sao_jax.setup import Setup
from sao_jax.state import TrainState, copy_tree


def poisoned(cfg: config_lib.Config, update: int) -> bool:
  """Fault injection: whether update number `update` gets NaN gradients (decided by seed
  and update number, so a resumed run poisons the same updates)."""
  f = cfg.faults
  if update in f.nan_steps:
    return True
  return f.nan_prob > 0 and np.random.default_rng((cfg.seed, 99, update)).random() < f.nan_prob


class SAOLearner:
  """The learner of one SAO phase (see the module docstring)."""

  batch_cls = SAOBatch  # what `batch_from` returns
  intake_cls = Intake  # how tasks go out and records come in

  def __init__(
    self,
    s: Setup,
    writer: MetricsWriter,
    workdir: pathlib.Path,
    *,
    max_seconds: float | None = None,
    eval_every: float = 0.0,
  ):
    cfg, rl, rcfg = s.cfg, s.cfg.rl, s.cfg.recovery
    self.s, self.cfg, self.writer, self.workdir = s, cfg, writer, workdir
    primary = distributed.is_primary()  # takes the trajectories in (module docstring)
    n_val = rcfg.val_problems if rcfg.shadow_every else 0  # < len(s.train): setup checks
    self.n_sample = len(s.train) - n_val  # the validation tail is never sampled in RL
    self.with_ref = rl.kl_coef > 0
    self.progs = self.make_programs()
    self.rows = round_up(self.batch_rows(), self.progs.batch_divisor)
    self.step = 0
    self.probs: np.ndarray | None = None  # task-sampling distribution (prioritised)
    self.state: TrainState | None = None
    # The policy's identity is (lineage, version) (sao_jax.lineage): process 0's, which
    # publishes and forms the batches; every start, resume and rollback begins a lineage.
    self.lineage = LineageTree(weigh_discarded=cfg.sao.discarded_lineage == "weight")
    self.lineage_log = LineageLog(workdir / "lineages.jsonl") if primary else None
    events = recovery.EventLog(workdir / "events.jsonl", "rl") if primary else None
    self.stats = Statistics(writer, events)
    self.counts = self.stats.counts  # (saved with every snapshot)
    ckpts, url = workdir / "checkpoints", ckpt_lib.snapshot_url
    self.publishing = Publishing(
      cfg,
      ckpt_lib.manager(
        ckpts / "rl", every=cfg.checkpoint_every, keep=rcfg.keep, remote=url(cfg, "rl")
      ),
    )
    # Where parameter versions are published: the workdir, or only the bucket (storage.url).
    self.param_dir = (
      storage.join(cfg.storage.url, "params") if cfg.storage.url else workdir / "params"
    )
    self.clock = PhaseClock(
      rl.steps,
      rl.max_seconds if max_seconds is None else max_seconds,
      eval_every,
      self.make_eval_fn(),
      defer_dir=defer_dir(cfg, workdir, "rl"),
    )
    self.eval_every = eval_every
    self.safety = Safety(
      rcfg,
      ckpt_lib.ShadowBank(ckpts / "shadows", rcfg.shadow_keep, remote=url(cfg, "shadows")),
      self.make_eval_fn(s.train[len(s.train) - n_val :]),
      n_val,
      self.counts,
    )
    self.compile_cache = jax.config.jax_compilation_cache_dir or None
    self.intake: Intake | None = None  # process 0's
    if primary:
      self.intake = self.intake_cls.open(
        s,
        workdir,
        rows=self.rows,
        max_staleness=self.max_staleness(),
        n_sample=self.n_sample,
        expect=self.record_check(),
        counts=self.counts,
        lineage=self.lineage,
      )

  # What a subclass changes ---------------------------------------------------------------------
  def make_programs(self):
    """The run's policy's SAO update (`Policy.sao_update`), whichever kind it is."""
    s = self.s
    return programs_for(
      s,
      s.cfg.rl.optim,
      lambda _, tx: s.policy.sao_update(tx, s.cfg),
      num_tasks=len(s.train),
      with_ref=self.with_ref,
    )

  def make_eval_fn(self, tasks=None):
    """params -> held-out metrics on `tasks` (default: the test split's first problems)."""
    return eval_fn(self.s, self.progs, tasks=tasks)

  def batch_rows(self) -> int:
    return self.cfg.sao.batch_size

  def max_staleness(self) -> int:
    return self.cfg.sao.max_staleness

  def record_check(self):
    """What a record must fit to be batched: (prompt_len, completion_len), tasks, rows."""
    return ((self.s.prompt_len, self.cfg.rl.max_new_tokens), len(self.s.train), self.rows)

  def refresh_priorities(self) -> None:
    """The task-sampling distribution from the value tracker, every 10 updates. Every
    process calls this (the tracker may be sharded over all of them)."""
    sao = self.cfg.sao
    if sao.prioritized and (self.probs is None or self.step % 10 == 0):
      p64 = np.asarray(
        distributed.host_value(trackers.priority_weights(self.state.tracker, sao.priority_eps)),
        np.float64,
      )
      p64 = p64[: self.n_sample]
      self.probs = p64 / p64.sum()

  def batch_from(self, items: list[Item], step: int) -> tuple[object, np.ndarray]:
    """The update's batch from the records the buffer chose at learner step `step` (a pure
    function of them, the step and the config: `sao-jax replay` rebuilds every batch from
    the journal with it), and the staleness of each trajectory (its oldest token's)."""
    sao = self.cfg.sao
    batch, orphans = batch_rows(items, step, self.rows, sao.max_staleness, self.lineage)
    self.counts["orphan_version"] += orphans
    if poisoned(self.cfg, step + 1):
      batch.poison_b[0] = np.nan
      self.counts["poisoned"] += 1
    staleness = np.where(batch.valid_bt, batch.staleness_bt, 0).max(-1)[batch.head_b]
    return batch, staleness

  def _row(self, metrics, staleness: np.ndarray, tu: float, t_done: float, val_acc) -> dict:
    return self.stats.row(
      metrics,
      staleness,
      tu,
      t_done,
      val_acc,
      rows=self.rows,
      queue_depth=len(self.intake.buffer),
      outstanding=self.intake.outstanding,
      train_seconds=self.clock.elapsed,
    )

  @classmethod
  def update_side(cls, s: Setup) -> SAOLearner:
    """The learner's update half only (programs, batch rows, `batch_from`), opening no file
    and starting no process: what `sao-jax replay` re-executes a finished run with."""
    self = cls.__new__(cls)
    self.s, self.cfg = s, s.cfg
    self.with_ref = s.cfg.rl.kl_coef > 0
    self.progs = self.make_programs()
    self.rows = round_up(self.batch_rows(), self.progs.batch_divisor)
    self.counts = collections.Counter()
    self.lineage = None  # ages are version differences: the same on a path without rollbacks
    return self

  # Start ----------------------------------------------------------------------------------
  def fresh_state(self) -> TrainState:
    """New parameters and optimizer state from the phase's key (seed + 1): the template a
    snapshot restores into, and the optimizer a new run starts with."""
    return self.progs.init(jax.random.key(self.cfg.seed + 1))

  def initial_state(self, init: TrainState, fresh: TrainState | None = None) -> TrainState:
    """A new run's first state: `fresh` (default `fresh_state()`) with a copy of `init`'s
    params, and another copy as the frozen KL reference when there is a KL term. `sao-jax
    replay` rebuilds the start through here, so it matches the run's bit for bit."""
    fresh = self.fresh_state() if fresh is None else fresh
    return fresh.replace(
      params=copy_tree(init.params), ref_params=copy_tree(init.params) if self.with_ref else None
    )

  def start(self, init: TrainState) -> bool:
    """Restores the newest readable snapshot (and replays the journal after it), or starts
    from `init`'s params. Publishes the policy samplers start from. Returns resumed?"""
    fresh = self.fresh_state()
    startup.mark("compile_init")
    mngr = self.publishing.mngr
    resumed = ckpt_lib.restore_latest_valid(mngr, fresh) if mngr.all_steps() else None
    startup.mark("restore")
    if resumed is not None:
      self.restore(*resumed)
    else:
      self.state = self.initial_state(init, fresh)
      if self.intake is not None:
        self.intake.begin()
      self.safety.shadows.reset_to(0, {})
    self.stats.begin(self.step)
    if self.intake is not None:  # a new lineage from this step (records of the lost one: dropped)
      self.lineage.merge(self.lineage_log.nodes())  # incl. incarnations that died since
      self.begin_lineage("resume" if resumed is not None else "start", self.step)
    self.stats.event(
      "start", resumed=resumed is not None, from_step=self.step, lineage=self.lineage_hex()
    )
    self.publish()  # samplers start from the (restored) policy
    return resumed is not None

  def restore(self, state: TrainState, meta: dict, step: int, skipped: list[int]) -> None:
    """Continues from the snapshot of `step` (`ckpt_lib.restore_latest_valid`'s result):
    counters, clock, shadows, lineage tree and (process 0) the journal's records after it."""
    self.state, self.step, st = state, step, meta["stream"]
    intake = self.intake
    self.counts.update(st["counts"])
    self.clock.resume_at(st["train_seconds"])
    self.publishing.snap_journal = {int(k): v for k, v in st["snap_journal"].items()}
    self.safety.shadows.reset_to(
      step,
      {int(k): v for k, v in st["shadows"].items()},
      {int(k): v for k, v in st.get("shadow_lineages", {}).items()},
    )
    self.lineage.restore(LineageTree.from_json(st.get("lineage")))
    if intake is not None:
      intake.resume(step, st)
    self.counts["resumes"] += 1
    self.counts["snapshots_skipped_corrupt"] += len(skipped)
    replayed = len(intake.buffer) if intake is not None else 0
    self.stats.resume_info = {
      "event": "resume",
      "from_step": step,
      "skipped_snapshots": skipped,
      "replay_records": replayed,
      "journal_tail_bytes": intake.journal.truncated_tail if intake is not None else 0,
    }
    print(
      f"sao: resuming from snapshot step {step} (replaying {replayed} "
      f"journaled records{'; skipped unreadable ' + str(skipped) if skipped else ''})",
      flush=True,
    )

  def lineage_hex(self) -> str | None:
    return None if self.lineage.current is None else f"{self.lineage.current:012x}"

  def begin_lineage(self, why: str, origin: int, parent: int | None = None) -> None:
    """A new current lineage from this step on (process 0), started from `parent`'s (default
    the current lineage's) version `origin`; its first updates are watched (transients)."""
    if parent is not None and self.lineage.known(parent):
      node = self.lineage.branch_from(parent, origin, self.step, why)
    else:
      node = self.lineage.begin(self.step, why, origin=origin)
    self.lineage_log.append(node)
    self.counts["lineages"] += 1
    self.stats.begin_transient(why, self.step, self.lineage_hex())

  # One update -----------------------------------------------------------------------------
  def next_batch(self) -> tuple[object, Taken, np.ndarray | None]:
    """(batch for the jitted update, the records taken for it (`Taken`), staleness of each
    trajectory in it). With several processes, only process 0 holds records: every process
    gets its batch, cast to the fixed shapes and dtypes of `batch_cls.abstract`; the others
    take no records and get no staleness."""
    taken, staleness = Taken([], [], [], []), None
    if self.intake is not None:
      taken = self.intake.take(self.step)
      batch, staleness = self.batch_from(taken.items, self.step)
    if jax.process_count() > 1:
      like = self.batch_cls.abstract(self.rows, self.s.prompt_len, self.cfg.rl.max_new_tokens)
      if self.intake is None:
        batch = jax.tree.map(lambda a: np.zeros(a.shape, a.dtype), like)
      batch = distributed.from_primary(
        jax.tree.map(lambda x, a: np.asarray(x, a.dtype), batch, like)
      )
    return batch, taken, staleness

  def update(self) -> dict:
    """The next batch from the buffer through the jitted update, then its outcome to the
    parts: ledger, counters, validation and rollback, publishing, snapshot, commit.
    Returns the metrics row of this update (process 0's; {} elsewhere)."""
    intake, stats = self.intake, self.stats
    orphans_before = self.counts["orphan_version"]
    batch, taken, staleness = self.next_batch()
    if intake is not None:
      intake.top_up_before_update(self.step, self.probs)
    tu = time.time()
    self.state, metrics = self.progs.update(self.state, self.progs.shard_batch(batch))
    metrics = jax.device_get(metrics)
    unverified = metrics.pop("unverified_b", None)  # trajectories the update left out
    if unverified is not None and intake is not None:
      intake.reject_unverified(unverified, taken.items, batch, self.cfg.sao.verify_drift)
    t_done = time.time()
    self.step += 1
    stats.timed(self.step, tu, t_done)
    check = self._check(metrics) if self.cfg.recovery.keep_journal else None  # (a collective)
    if intake is not None:
      intake.record(self.step, *taken, check=check, lineage=self.lineage_hex())
      stale = len(taken.dropped) - len(taken.discarded)
      orphans = self.counts["orphan_version"] - orphans_before
      stats.watch_transient(
        self.step, metrics, staleness, stale, len(taken.discarded), len(taken.weighted), orphans
      )
    stats.first_update(self.step, t_done, self.compile_cache)
    self.safety.note(metrics)
    stats.consumed(taken.items, t_done)
    val_acc = self.validate() if self.safety.validation_due(self.step) else None
    if (reason := self.safety.nonfinite_reason()) is not None:
      self.rollback(reason)
    if self.step % self.cfg.sao.param_sync_every == 0:
      self.publish()
    self.snapshot(metrics=None if val_acc is None else {ckpt_lib.BEST_METRIC: val_acc})
    self.publishing.commit_written(intake)  # the offsets a finished snapshot holds
    if intake is None:
      return {}  # (its metrics are not written)
    return self._row(metrics, staleness, tu, t_done, val_acc)

  def _check(self, metrics) -> dict:
    """What `sao-jax replay` compares at this step: exact loss and gradient norm (float32,
    exact as JSON floats) and the fingerprint of the new parameters' bits."""
    return {
      "loss": float(metrics["loss"]),
      "grad_norm": float(metrics["grad_norm"]),
      "digest": int(jax.device_get(self.progs.digest(self.state.params))),
    }

  # Snapshots, shadows, rollback, publishing -------------------------------------------------
  def stream_meta(self) -> dict:
    """What a snapshot saves beside the state (process 0's): stream positions, counters,
    clock, shadows and the lineage tree."""
    intake, shadows = self.intake, self.safety.shadows
    return {
      "phase": "rl",
      "stream": {
        "journal_next": intake.journal_next(),
        "task_rng": intake.task_rng.bit_generator.state,
        "counts": dict(self.counts),
        "train_seconds": self.clock.elapsed,
        "snap_journal": self.publishing.snap_journal,
        "shadows": shadows.scores,
        "shadow_lineages": shadows.lineages,
        "lineage": self.lineage.to_json(),
      },
    }

  def snapshot(self, force: bool = False, metrics: dict | None = None) -> bool:
    """An Orbax snapshot of state and stream positions when due (or `force`); the Kafka
    offsets it covers are committed once it is written."""
    return self.publishing.snapshot(
      self.step, self.state, self.intake, self.stream_meta, force=force, metrics=metrics
    )

  def validate(self) -> float:
    """Greedy accuracy on the validation tasks; keeps a shadow, or rolls back to the best
    one if accuracy fell more than recovery.regress_threshold below it."""
    val_acc, reason = self.safety.judge(self.step, self.state.params, self.lineage.current)
    if reason is not None:
      self.rollback(reason)
    return val_acc

  def rollback(self, reason: str) -> None:
    """Back to the best shadow's params with a fresh optimizer and the step size times
    recovery.lr_decay; samplers get the restored policy at once."""
    seed = self.cfg.seed
    self.state, event = self.safety.rollback(
      self.state, reason, lambda n: self.progs.init(jax.random.key(seed + 7 + n))
    )
    shadow = event["to_shadow_step"]
    if self.intake is not None:  # the shadow's parameters go on as a new lineage
      self.begin_lineage("rollback", shadow, parent=self.safety.shadows.lineages.get(shadow))
    self.publish()
    event["lineage"] = self.lineage_hex()
    print(
      f"sao: rollback at step {self.step} to shadow {shadow} ({reason}); "
      f"lr scale {event['lr_scale']:g}",
      flush=True,
    )
    self.writer.write(self.step, event, phase="rl_event", advance=0)
    self.stats.event("rollback", step=self.step, **{k: v for k, v in event.items() if k != "event"})

  def publish(self) -> None:
    self.publishing.publish(self.step, self.state.params, self.lineage.current)
    if self.intake is not None:
      self.intake.guard.published(self.step)

  # The loop -------------------------------------------------------------------------------
  def run(self, init: TrainState) -> tuple[TrainState, dict]:
    cfg, intake = self.cfg, self.intake
    # What the samplers need before they start (process 0's): run id, key, empty directory.
    key = intake.prepare(self.param_dir) if intake is not None else None
    self.publishing.open(self.param_dir, key)
    # Samplers start first: their imports and compilation overlap the learner's restore.
    # Only process 0 starts them and reads their trajectories.
    pool = (
      intake.samplers(self.param_dir, self.compile_cache)
      if intake is not None
      else contextlib.nullcontext()
    )
    with pool as opened:
      if intake is not None:
        intake.attach(opened)
      startup.mark("samplers_started")
      resumed = self.start(init)
      self.writer.progress("sao", cfg.rl.steps or None)
      if not resumed:
        self.snapshot(force=True)  # step 0: a resume before the first interval starts here
        self.safety.first_shadow(self.state.params, self.lineage.current)
      self.clock.maybe_eval(
        self.step, self.state.params, force=bool(self.eval_every) and not resumed
      )
      self.stats.t_loop = time.time()
      while self.clock.running(self.step):
        self.refresh_priorities()
        if intake is not None:
          intake.fill(self.step, self.probs)
        row = self.update()
        log_step(self.writer, self.clock, cfg, self.step, self.state.params, row, "rl")
        if self.step % cfg.log_every == 0:
          self.stats.event("counts", step=self.step, counts=self.stats.count_deltas())
      wall = time.time() - self.stats.t_loop
      self.snapshot(force=True)
      self.publishing.finish(intake)
    return self.state, self.finish(wall)

  def finish(self, wall: float) -> dict:
    """Closes the shadows, the intake's files and the event log; the final snapshot and
    eval; the summary."""
    intake = self.intake
    self.safety.shadows.close()
    held = intake.close() if intake is not None else 0
    self.stats.event("finish", step=self.step, counts=self.stats.count_deltas())
    self.stats.close()
    info = finish_phase(
      self.publishing.mngr,
      self.state,
      self.cfg,
      self.clock,
      self.step,
      "rl",
      packer=self.progs.packer,
    )
    return self.stats.summary(
      info,
      wall,
      self.step,
      unused_at_end=len(intake.buffer) if intake is not None else 0,
      audit_held=held,
      guard=intake.guard.summary() if intake is not None else {},
      lineage=self.lineage_hex(),
      events_path=self.workdir / "events.jsonl",
    )


def run_sao(
  s: Setup,
  writer: MetricsWriter,
  state: TrainState,
  workdir: pathlib.Path,
  *,
  max_seconds: float | None = None,
  eval_every: float = 0.0,
  learner_cls: type | None = None,
) -> tuple:
  """Asynchronous single-trajectory training from `state`'s params by `learner_cls`
  (default SAOLearner; a subclass for another policy kind, or synchronous GRPO through the
  samplers); returns (state, programs, summary) like the other phases. Resumes by itself when
  `workdir/checkpoints/rl` holds a snapshot (see sao_jax.recovery): state, clock, counters
  and stream positions come back from the newest readable snapshot, and the records
  consumed after it are replayed from the journal before new ones."""
  learner = (learner_cls or SAOLearner)(
    s, writer, workdir, max_seconds=max_seconds, eval_every=eval_every
  )
  state, info = learner.run(state)
  return state, learner.progs, info
