"""The asynchronous SAO learner: K sampler processes feed it single trajectories.

    task queue (indices; prioritised by the tracker) ──► sampler processes (spawn)
    sampler processes ── binary trajectory records ──► transport ──► learner buffer
    learner ── params v+1 every `param_sync_every` updates ──► param directory ──► samplers

The learner updates as soon as `sao.batch_size` rows have arrived, whatever policy version
produced them; staleness is corrected in the loss (`sao_jax.learner.make_sao_update`).
Every process started here is stopped here: on normal exit, on an exception, on Ctrl-C, and
when a sampler fails.

`SAOLearner` owns the loop's state and its lifecycle: `start` (restore or begin, publish),
then per update `fill` (tasks out, records in), `update` (one jitted step and its
bookkeeping), `snapshot`, `validate` / `rollback` (shadow models), `publish`; `finish` ends
the phase. `run_sao` is the function the trainer calls.

A learner over several processes (`sao_jax.distributed`) takes trajectories in through process
0 alone: it starts the samplers, reads the transport, de-duplicates, journals, keeps the ledger
and the event log, and forms each batch; every process receives that batch
(`distributed.from_primary`) and runs the same jitted update, validations, Orbax saves and
publishing (collectives). The other processes start no process and write only their shards of
the snapshots. Every decision they must share follows from values that are the same in all of
them (the step, the update's metrics, validation accuracy) or comes from process 0 (the
batch, and what `PhaseClock` decides from the wall clock).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np

from sao_jax import admission, distributed, interrupt, procs, recovery, startup, storage
from sao_jax import checkpoint as ckpt_lib
from sao_jax import config as config_lib
from sao_jax.batches import SAOBatch
from sao_jax.buffer import Item, TrajectoryBuffer, batch_rows, decode_trajectory
from sao_jax.learner import make_sao_update
from sao_jax.lineage import LineageLog, LineageTree
from sao_jax.metrics import MetricsWriter, peak_memory_mb
from sao_jax.packing import round_up
from sao_jax.rl import trackers
from sao_jax.runners.common import (
  PhaseClock,
  defer_dir,
  delay_stats,
  eval_fn,
  finish_phase,
  length_stats,
  log_step,
  programs_for,
)
from sao_jax.runners.samplers import SamplerPool, new_run_id
from sao_jax.setup import Setup
from sao_jax.state import TrainState, copy_tree
from sao_jax.transport import auth, records
from sao_jax.transport.params import ParamPublisher

STALL_WARN_S = 60.0  # waiting this long for a new trajectory is reported
# learner_busy_steady leaves out this many first updates of a process: sampler start-up, the
# first compilations and (Kafka) the consumer-group join are paid once per run, not per update.
STEADY_AFTER = 10
STALENESS_BINS = 8  # histogram buckets 0..7, the last one is ">= 7"
# Updates watched after each start, resume or rollback (staleness, off-policy deviation, drops):
# the restart transient in the event log, the metrics and summary.json.
TRANSIENT_UPDATES = 20


def poisoned(cfg: config_lib.Config, update: int) -> bool:
  """Fault injection: whether update number `update` gets NaN gradients (decided by seed
  and update number, so a resumed run poisons the same updates)."""
  f = cfg.faults
  if update in f.nan_steps:
    return True
  return f.nan_prob > 0 and np.random.default_rng((cfg.seed, 99, update)).random() < f.nan_prob


@dataclasses.dataclass
class LoopState:
  """What the loop carries from update to update. `step`, `counts`, the task RNG, the clock
  and `snap_journal` are saved with every snapshot; the rest is this process's."""

  step: int = 0
  counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  seen_ids: set[int] = dataclasses.field(default_factory=set)  # applied or waiting
  snap_journal: dict[int, int] = dataclasses.field(default_factory=dict)  # step -> journal pos
  outstanding: int = 0  # tasks handed out and not yet returned
  probs: np.ndarray | None = None  # task-sampling distribution (prioritised)
  pending_commit: dict[int, int] | None = None  # Kafka offsets to commit once saved
  busy: float = 0.0  # seconds inside the jitted update
  reward_s: float = 0.0  # samplers' environment-step (reward) seconds of consumed trajectories
  sandbox_runs: int = 0  # sandbox executions that scored consumed trajectories
  delays: list[float] = dataclasses.field(default_factory=list)  # trajectory end -> its update
  lengths: list[int] = dataclasses.field(default_factory=list)  # tokens per used trajectory
  rss_peak: float = 0.0
  nonfinite_recent: collections.deque = dataclasses.field(default_factory=collections.deque)
  last_fresh: float = dataclasses.field(default_factory=time.time)  # last new record arrived
  stall_reports: int = 0
  steady_from: int = 0
  steady_mark: tuple[float, float] | None = None  # (busy, wall) after the first updates
  t_loop: float = 0.0
  resume_info: dict | None = None  # set on a resume until the first update is logged


# Start-up stages of a learner process, in order (`sao_jax.startup` marks): imports until the
# run begins; setup (config, tokenizer, task load); restore_init (the SFT result the phase
# starts from); samplers_started (processes spawned, topics made); compile_init; restore (the
# snapshot); first_record (samplers imported, compiled and decoded); first_update (batch
# filled, update compiled or loaded from the cache, applied).
STARTUP_STAGES = [
  "imports",
  "setup",
  "restore_init",
  "samplers_started",
  "compile_init",
  "restore",
  "first_record",
  "first_update",
]


class SAOLearner:
  """The learner of one SAO phase (see the module docstring)."""

  batch_cls = SAOBatch  # what `batch_from` returns

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
    self.primary = distributed.is_primary()  # takes the trajectories in (module docstring)
    self.n_val = rcfg.val_problems if rcfg.shadow_every else 0  # < len(s.train): setup checks
    self.val_tasks = s.train[len(s.train) - self.n_val :]
    self.n_sample = len(s.train) - self.n_val  # the validation tail is never sampled in RL
    self.with_ref = rl.kl_coef > 0
    self.progs = self.make_programs()
    self.rows = round_up(self.batch_rows(), self.progs.batch_divisor)
    # The policy's identity is (lineage, version) (sao_jax.lineage): process 0's, which
    # publishes and forms the batches; every start, resume and rollback begins a lineage.
    self.lineage = LineageTree(weigh_discarded=self.cfg.sao.discarded_lineage == "weight")
    self.lineage_log = LineageLog(workdir / "lineages.jsonl") if self.primary else None
    self.buffer = TrajectoryBuffer(self.rows, self.max_staleness(), lineage=self.lineage)
    self.transients: list[dict] = []  # the first updates after each resume or rollback
    self.mngr = ckpt_lib.manager(
      workdir / "checkpoints" / "rl",
      every=cfg.checkpoint_every,
      keep=rcfg.keep,
      remote=ckpt_lib.snapshot_url(cfg, "rl"),
    )
    self.shadows = ckpt_lib.ShadowBank(
      workdir / "checkpoints" / "shadows",
      rcfg.shadow_keep,
      remote=ckpt_lib.snapshot_url(cfg, "shadows"),
    )
    # Where parameter versions are published: the workdir, or only the bucket (storage.url).
    self.param_dir = (
      storage.join(cfg.storage.url, "params") if cfg.storage.url else workdir / "params"
    )
    self.journal = self.ledger = self.events = None  # process 0's files
    if self.primary:
      self.journal = recovery.Journal(workdir / "journal")
      self.ledger = recovery.Ledger(workdir / "ledger.jsonl")
      self.events = recovery.EventLog(workdir / "events.jsonl", "rl")
    self.counts_at_start: dict[str, int] = {}
    self.task_rng = np.random.default_rng((cfg.seed, 3))
    self.clock = PhaseClock(
      rl.steps,
      rl.max_seconds if max_seconds is None else max_seconds,
      eval_every,
      self.make_eval_fn(),
      defer_dir=defer_dir(cfg, workdir, "rl"),
    )
    self.eval_every = eval_every
    self.validate_fn = self.make_eval_fn(self.val_tasks)
    self.loop = LoopState(nonfinite_recent=collections.deque(maxlen=rcfg.nonfinite_window))
    self.state: TrainState | None = None
    self.pool: SamplerPool | None = None
    self.publisher: ParamPublisher | None = None
    self.run_id = ""
    self.key: bytes | None = None  # the run's key (sao_jax.transport.auth), process 0's
    self.compile_cache = jax.config.jax_compilation_cache_dir or None
    # (prompt_len, completion_len), tasks, rows: what a record must fit to be batched
    self.expect = ((s.prompt_len, rl.max_new_tokens), len(s.train), self.rows)
    self.guard = admission.RecordGuard(
      vocab_size=s.model.cfg.vocab_size,
      num_tasks=self.n_sample,
      counts=self.loop.counts,
      reward_range=lambda i: s.family.reward_range(s.train[i]),
      state_path=workdir / "published.json" if self.primary else None,
      window=cfg.samplers.quarantine_window,
      rate=cfg.samplers.quarantine_rate,
      lineage_known=self._lineage_known,
      task_id_of=lambda i: s.train[i].task_id,
      rescore=self._rescore,
    )
    # Families whose reward costs a sandbox run: a sampled fraction re-scored before use.
    self.audit: admission.RewardAudit | None = None
    fam = s.family
    if self.primary and fam.auditable and not fam.verifiable and cfg.sao.audit_fraction > 0:
      fam.make_env(s.tok)  # the learner's own sandbox pool, made before its threads share it
      self.audit = admission.RewardAudit(
        cfg.sao.audit_fraction,
        lambda rec: self._rescore(rec.meta["task_index"], rec, costly=True),
        workers=cfg.sao.audit_workers,
      )

  def _rescore(self, index: int, rec, costly: bool = False) -> float | None:
    """A one-step record's reward recomputed from its completion (verifiable families; with
    `costly`, auditable ones too: a sandbox run)."""
    a = rec.arrays
    if "tokens" not in a or a["tokens"].shape[0] != 1 or not 0 <= index < len(self.s.train):
      return None
    completion = a["tokens"][0][a["valid"][0].astype(bool)]
    return self.s.family.rescore(self.s.train[index], self.s.tok, completion, costly=costly)

  # What a subclass changes ---------------------------------------------------------------------
  def make_programs(self):
    rl, sao = self.cfg.rl, self.cfg.sao
    return programs_for(
      self.s,
      rl.optim,
      lambda m, tx: make_sao_update(m, tx, rl, sao),
      num_tasks=len(self.s.train),
      with_ref=self.with_ref,
    )

  def make_eval_fn(self, tasks=None):
    """params -> held-out metrics on `tasks` (default: the test split's first problems)."""
    return eval_fn(self.s, self.progs, tasks=tasks)

  def batch_rows(self) -> int:
    return self.cfg.sao.batch_size

  def max_staleness(self) -> int:
    return self.cfg.sao.max_staleness

  def next_batch(self) -> tuple[object, list[Item], list[Item], np.ndarray | None]:
    """(batch for the jitted update, records in it, records dropped as stale, staleness of
    each trajectory in it). With several processes, only process 0 holds records: every
    process gets its batch, cast to the fixed shapes and dtypes of `batch_cls.abstract`; the
    others get no records and no staleness."""
    items, stale, staleness = [], [], None
    if self.primary:
      items, stale = self.buffer.take_batch(self.loop.step)  # (stale or of a discarded lineage)
      batch, staleness = self.batch_from(items, self.loop.step)
    if jax.process_count() > 1:
      like = self.batch_cls.abstract(self.rows, self.s.prompt_len, self.cfg.rl.max_new_tokens)
      if not self.primary:
        batch = jax.tree.map(lambda a: np.zeros(a.shape, a.dtype), like)
      batch = distributed.from_primary(
        jax.tree.map(lambda x, a: np.asarray(x, a.dtype), batch, like)
      )
    return batch, items, stale, staleness

  def batch_from(self, items: list[Item], step: int) -> tuple[object, np.ndarray]:
    """The update's batch from the records the buffer chose at learner step `step` (a pure
    function of them, the step and the config: `sao-jax replay` rebuilds every batch from
    the journal with it), and the staleness of each trajectory (its oldest token's)."""
    loop, sao = self.loop, self.cfg.sao
    batch, orphans = batch_rows(items, step, self.rows, sao.max_staleness, self.lineage)
    loop.counts["orphan_version"] += orphans
    if poisoned(self.cfg, step + 1):
      batch.poison_b[0] = np.nan
      loop.counts["poisoned"] += 1
    staleness = np.where(batch.valid_bt, batch.staleness_bt, 0).max(-1)[batch.head_b]
    return batch, staleness

  @classmethod
  def update_side(cls, s: Setup) -> SAOLearner:
    """The learner's update half only (programs, batch rows, `batch_from`), opening no file
    and starting no process: what `sao-jax replay` re-executes a finished run with."""
    self = cls.__new__(cls)
    self.s, self.cfg = s, s.cfg
    self.with_ref = s.cfg.rl.kl_coef > 0
    self.progs = self.make_programs()
    self.rows = round_up(self.batch_rows(), self.progs.batch_divisor)
    self.loop = LoopState()
    self.lineage = None  # ages are version differences: the same on a path without rollbacks
    return self

  # Start ----------------------------------------------------------------------------------
  def prepare(self) -> None:
    """What the samplers need before they start: the run id (the same topics after a
    restart, so offsets replay) and an empty parameter directory to wait on (process 0's)."""
    param_dir = self.param_dir
    if self.primary:
      if self.cfg.transport.kind == "kafka":
        id_path = self.workdir / "run_id"
        self.run_id = self.cfg.transport.run_id or (
          id_path.read_text().strip() if id_path.exists() else new_run_id(self.cfg)
        )
        id_path.write_text(self.run_id)
      storage.open_store(param_dir).clear()  # an earlier start's versions
      self.key = auth.load_or_create(self.workdir)  # kept across resumes (records on a topic)
    self.publisher = ParamPublisher(param_dir, key=self.key)

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
    loop = self.loop
    fresh = self.fresh_state()
    startup.mark("compile_init")
    resumed = ckpt_lib.restore_latest_valid(self.mngr, fresh) if self.mngr.all_steps() else None
    startup.mark("restore")
    if resumed is not None:
      self.state, meta, loop.step, skipped = resumed
      st = meta["stream"]
      self.task_rng.bit_generator.state = st["task_rng"]
      loop.counts.update(st["counts"])
      self.clock.resume_at(st["train_seconds"])
      loop.snap_journal = {int(k): v for k, v in st["snap_journal"].items()}
      self.shadows.reset_to(
        loop.step,
        {int(k): v for k, v in st["shadows"].items()},
        {int(k): v for k, v in st.get("shadow_lineages", {}).items()},
      )
      self.lineage.restore(LineageTree.from_json(st.get("lineage")))
      if self.primary:
        loop.seen_ids = self.ledger.cut_to(loop.step)
        for seq, data in self.journal.read_from(st["journal_next"]):
          rec = records.decode(data)  # journaled records were decoded once already
          if rec.record_id not in loop.seen_ids:
            loop.seen_ids.add(rec.record_id)
            self.buffer.extend([Item(rec, seq, None, replayed=True)])
      loop.counts["resumes"] += 1
      self.guard.resumed = True
      loop.counts["snapshots_skipped_corrupt"] += len(skipped)
      loop.resume_info = {
        "event": "resume",
        "from_step": loop.step,
        "skipped_snapshots": skipped,
        "replay_records": len(self.buffer),
        "journal_tail_bytes": self.journal.truncated_tail if self.primary else 0,
      }
      print(
        f"sao: resuming from snapshot step {loop.step} (replaying {len(self.buffer)} "
        f"journaled records{'; skipped unreadable ' + str(skipped) if skipped else ''})",
        flush=True,
      )
    else:
      self.state = self.initial_state(init, fresh)
      if self.primary:
        self.ledger.cut_to(0)
      self.shadows.reset_to(0, {})
    loop.steady_from = loop.step
    self.counts_at_start = dict(loop.counts)
    if self.primary:  # a new lineage from the restored step (records of the lost one: dropped)
      self.lineage.merge(self.lineage_log.nodes())  # incl. incarnations that died since
      self.begin_lineage("resume" if resumed is not None else "start", loop.step)
    if self.primary:
      self.events.write(
        "start", resumed=resumed is not None, from_step=loop.step, lineage=self.lineage_hex()
      )
    self.publish()  # samplers start from the (restored) policy
    return resumed is not None

  def _lineage_known(self, lineage) -> bool:
    """Whether a record's meta lineage is one this run began (`admission.RecordGuard`)."""
    ok = isinstance(lineage, int) and not isinstance(lineage, bool)
    return ok and self.lineage.known(lineage)

  def lineage_hex(self) -> str | None:
    return None if self.lineage.current is None else f"{self.lineage.current:012x}"

  def begin_lineage(self, why: str, origin: int, parent: int | None = None) -> None:
    """A new current lineage from this step on (process 0), started from `parent`'s (default
    the current lineage's) version `origin`; its first updates are watched (`transients`)."""
    loop = self.loop
    if parent is not None and self.lineage.known(parent):
      node = self.lineage.branch_from(parent, origin, loop.step, why)
    else:
      node = self.lineage.begin(loop.step, why, origin=origin)
    self.lineage_log.append(node)
    loop.counts["lineages"] += 1
    self.transients.append(
      {
        "why": why,
        "step": loop.step,
        "lineage": self.lineage_hex(),
        "updates": 0,
        "staleness_mean": 0.0,
        "staleness_max": 0,
        "is_dev_mean": 0.0,
        "is_dev_max": 0.0,
        "kl_behaviour_mean": 0.0,
        "dropped_stale": 0,
        "dropped_lineage": 0,
        "weighted_lineage": 0,
        "orphan_version": 0,
      }
    )

  def watch_transient(
    self, metrics, staleness, stale: int, discarded: int, weighted: int, orphans: int
  ) -> None:
    """Adds one update to the transient of the newest lineage while it is in its first
    `TRANSIENT_UPDATES` updates: written to the event log as it goes (a killed incarnation's
    partial one is kept) and to the metrics once complete."""
    if not self.transients or self.transients[-1]["updates"] >= TRANSIENT_UPDATES:
      return
    t = self.transients[-1]
    n = t["updates"] = t["updates"] + 1
    mean = lambda key, x: t[key] + (float(x) - t[key]) / n  # noqa: E731 - a running mean
    t["staleness_mean"] = mean("staleness_mean", np.mean(staleness))
    t["staleness_max"] = max(t["staleness_max"], int(np.max(staleness)))
    if "is_dev" in metrics:  # SAO's update; synchronous GRPO's (through samplers) has none
      t["is_dev_mean"] = mean("is_dev_mean", metrics["is_dev"])
      t["is_dev_max"] = max(t["is_dev_max"], float(metrics["is_dev"]))
      t["kl_behaviour_mean"] = mean("kl_behaviour_mean", metrics["kl_behaviour"])
    t["dropped_stale"] += stale
    t["dropped_lineage"] += discarded
    t["weighted_lineage"] += weighted
    t["orphan_version"] += orphans
    self.events.write("transient", **t)
    if n == TRANSIENT_UPDATES:
      self.writer.write(self.loop.step, dict(t, event="transient"), phase="rl_event", advance=0)

  def count_deltas(self) -> dict[str, int]:
    """This incarnation's counters: what it added since it started (the event log sums the
    incarnations; the snapshot's counters are the restored lineage's)."""
    start = self.counts_at_start
    return {
      k: int(v - start.get(k, 0)) for k, v in self.loop.counts.items() if v != start.get(k, 0)
    }

  # Data in --------------------------------------------------------------------------------
  def ingest(self, got: list[tuple[bytes, tuple[int, int] | None]]) -> None:
    """Decodes, de-duplicates and journals (written through before use: a crash from here
    on replays them) what arrived, then queues it for batching."""
    loop, fresh = self.loop, []
    key = getattr(self, "key", None)
    for sealed, pos in got:
      try:  # the tag first: nothing of a message without one under the run's key is read
        data = auth.unseal(key, sealed)
      except auth.Unauthenticated as err:
        self.guard.reject_unauthenticated(sealed, str(err), self.pool.learner)
        continue
      rec = decode_trajectory(data, self.pool.learner, loop.counts, self.expect)
      if rec is None:
        self.guard.charge_malformed(data)
        continue
      if rec.record_id in loop.seen_ids or self.guard.is_redelivery(rec.record_id):
        loop.counts["duplicates"] += 1  # redelivered: already applied, waiting or refused
        continue
      # Only the answer to a task this learner handed out and still waits for frees a place
      # in the task queue. A record of an earlier incarnation's task (redelivered after a
      # resume, or finished by a sampler that followed the restart) is trained on as extra
      # data; letting it free a place too handed out a task more for each of them, a
      # standing surplus of records that waited in the queue (measured: 2-3 versions of
      # staleness after kill -9s against 1.3 without).
      ours = self.guard.outstanding[rec.meta["task_index"]] > 0
      if not self.guard.admit(rec, data, self.pool.learner):
        continue  # dead-lettered and counted; its task handed out again
      loop.seen_ids.add(rec.record_id)
      loop.last_fresh, loop.stall_reports = time.time(), 0
      if self.audit is not None and self.audit.picks(rec.record_id):
        self.audit.hold(rec, (data, pos, ours))  # (its task still counts as outstanding)
        continue
      if ours:
        loop.outstanding = max(0, loop.outstanding - 1)
      fresh.append((rec, data, pos))
    fresh += self.audited()
    if fresh:
      startup.mark("first_record")
    first = self.journal.append([data for _, data, _ in fresh])
    self.buffer.extend(Item(rec, first + k, pos) for k, (rec, _, pos) in enumerate(fresh))

  def audited(self) -> list[tuple[records.Record, bytes, tuple[int, int] | None]]:
    """The held records whose reward audit is done: confirmed ones to be journaled and
    batched, the others rejected (`RecordGuard.reject_audited`). A failed audit (the sandbox
    itself failed, not the program) is counted and lets the record through."""
    out, loop = [], self.loop
    for rec, (data, pos, ours), true, err in self.audit.released() if self.audit else []:
      if err is not None:
        loop.counts["audit_errors"] += 1
        if loop.counts["audit_errors"] == 1:
          print(f"sao: a reward audit failed ({err!r}); the record is trained on", flush=True)
      elif true is not None and abs(float(rec.meta["reward"]) - true) > admission.REWARD_TOL:
        self.guard.reject_audited(rec, data, true, self.pool.learner, reissue=ours)
        continue  # (a reissued task stays outstanding)
      else:
        loop.counts["audited"] += 1
      if ours:
        loop.outstanding = max(0, loop.outstanding - 1)
      out.append((rec, data, pos))
    return out

  def held_positions(self) -> list[tuple[int, int]]:
    """Transport positions of the records whose audit is pending (not committed past)."""
    held = self.audit.held() if self.audit is not None else []
    return [pos for _, pos, _ in held if pos is not None]

  def check_samplers(self) -> None:
    # A terminal's Ctrl-C also stops the samplers: not a death to restart them for.
    interrupt.check()
    before = self.pool.restarts
    leftovers = self.pool.check()
    self.loop.counts["sampler_restarts"] += self.pool.restarts - before
    if leftovers is not None and self.cfg.transport.kind == "embedded":
      self.ingest([(data, None) for data in leftovers])
      self.loop.outstanding = 0  # the old task queue is gone; new tasks go to the new samplers
      self.guard.tasks_dropped()

  def hand_out(self, indices: list[int]) -> None:
    handouts = self.guard.new_handouts(len(indices))
    self.pool.learner.put_tasks(indices, handouts)
    self.guard.handed_out(indices, handouts)
    self.loop.outstanding += len(indices)

  def refresh_priorities(self) -> None:
    """The task-sampling distribution from the value tracker, every 10 updates. Every
    process calls this (the tracker may be sharded over all of them)."""
    loop, sao = self.loop, self.cfg.sao
    if sao.prioritized and (loop.probs is None or loop.step % 10 == 0):
      p64 = np.asarray(
        distributed.host_value(trackers.priority_weights(self.state.tracker, sao.priority_eps)),
        np.float64,
      )
      p64 = p64[: self.n_sample]
      loop.probs = p64 / p64.sum()

  def work_ahead_room(self) -> int:
    """How many more tasks may be handed out now. The work ahead of the learner is bounded
    so that nothing waits long enough to go stale (`sao.backpressure`): with it, tasks
    outstanding plus records buffered that a batch will still take stay within one batch
    plus what the samplers hold in flight (samplers.num x sampler_slots); without it (the
    bound before), tasks outstanding stay at one batch plus two calls per sampler, whatever
    is buffered."""
    loop, sao = self.loop, self.cfg.sao
    in_flight = max(1, self.cfg.samplers.num) * sao.sampler_slots
    if sao.backpressure:
      # Records a batch will not take (stale, or of a discarded lineage) wait for nothing.
      fresh = self.buffer.fresh(loop.step)
      return max(0, self.rows + in_flight - loop.outstanding - fresh)
    return max(0, self.rows + 2 * in_flight - loop.outstanding)

  def top_up(self) -> None:
    """Hands out as many new tasks as `work_ahead_room` allows."""
    loop = self.loop
    new = self.task_rng.choice(self.n_sample, size=self.work_ahead_room(), p=loop.probs)
    self.hand_out(new.tolist())

  def top_up_before_update(self) -> None:
    """With backpressure, the samplers' next work is handed out as a batch leaves the
    buffer, before the update: they sample while the learner trains. Whatever already
    arrived is taken in first, so records the learner did not hand out (an answer
    redelivered by the transport, a sampler that joined) count against the bound too."""
    if not (self.primary and self.cfg.sao.backpressure):
      return
    got = self.pool.learner.get_records(max(self.rows, 1024), timeout=0.0)
    if got:
      self.ingest(got)
    self.top_up()

  def fill(self) -> None:
    """Hands out tasks and gathers trajectories until the next batch is full. Tasks are
    topped up on every pass, so samplers keep working while the learner waits or updates."""
    loop = self.loop
    self.check_samplers()
    while not self.buffer.ready(loop.step):
      interrupt.check()  # a Ctrl-C stops here, between passes, not inside a send
      self.top_up()
      got = self.pool.learner.get_records(self.rows, timeout=0.05)
      if got or (self.audit is not None and self.audit.held()):
        self.ingest(got)  # (also releases records whose reward audit is done)
      if not got:
        self.check_samplers()
      self._report_stall()

  def _report_stall(self) -> None:
    loop = self.loop
    waited = time.time() - loop.last_fresh
    if waited > STALL_WARN_S * (loop.stall_reports + 1):  # a line per minute, never silent
      loop.stall_reports += 1
      print(
        f"sao: no new trajectory for {waited:.0f} s at update {loop.step}: "
        f"{loop.outstanding} tasks outstanding, {len(self.buffer)} records buffered, "
        f"{self.pool.group.alive()}/{len(self.pool.group.procs)} local samplers alive"
        f"{', kafka run ' + self.run_id if self.run_id else ''}",
        flush=True,
      )

  # One update -----------------------------------------------------------------------------
  def update(self) -> dict:
    """The next batch from the buffer through the jitted update, and its bookkeeping.
    Returns the metrics row of this update."""
    loop, sao, rcfg = self.loop, self.cfg.sao, self.cfg.recovery
    orphans_before = loop.counts["orphan_version"]
    batch, items, dropped, staleness = self.next_batch()
    self.top_up_before_update()
    # Dropped: too stale, or of a lineage that a resume or rollback discarded (sao_jax.lineage).
    discarded = [it for it in dropped if self.buffer.discarded(it, loop.step)]
    loop.counts["dropped_lineage"] += len(discarded)
    loop.counts["dropped_stale"] += len(dropped) - len(discarded)
    # (with sao.discarded_lineage="weight": those trained on at their distance)
    weighted = []  # (only a tree that weighs them lets one into a batch)
    if self.lineage is not None and self.lineage.weigh_discarded:
      weighted = [it for it in items if self.buffer.discarded(it, loop.step)]
    loop.counts["weighted_lineage"] += len(weighted)
    tu = time.time()
    self.state, metrics = self.progs.update(self.state, self.progs.shard_batch(batch))
    metrics = jax.device_get(metrics)
    unverified = metrics.pop("unverified_b", None)  # trajectories the update left out
    if unverified is not None and self.primary:
      traj_b = getattr(batch, "traj_b", None)  # (a memory batch's rows are its trajectories)
      for row in np.flatnonzero(unverified):
        item = items[int(row if traj_b is None else traj_b[row])]
        self.guard.reject_unverified(item.rec, sao.verify_drift)
    t_done = time.time()
    loop.busy += t_done - tu
    loop.step += 1
    if loop.step == loop.steady_from + STEADY_AFTER:  # start and warm-up over from here
      loop.steady_mark = (loop.busy, time.time() - loop.t_loop)
    check = self._check(metrics) if self.cfg.recovery.keep_journal else None  # (a collective)
    if self.primary:
      self.ledger.append(
        loop.step,
        [it.rec.record_id for it in items],
        [it.rec.record_id for it in dropped],
        check=check,
        lineage=self.lineage_hex(),
        discarded=[it.rec.record_id for it in discarded],
        weighted=[it.rec.record_id for it in weighted],
      )
      self.watch_transient(
        metrics,
        staleness,
        len(dropped) - len(discarded),
        len(discarded),
        len(weighted),
        loop.counts["orphan_version"] - orphans_before,
      )
    if loop.resume_info is not None and "recovery_s" not in loop.resume_info:
      # The first update ended at t_done (before the ledger write): the restart's time and
      # its last stage both end there, so the stages add up to it whatever the ledger took.
      loop.resume_info["recovery_s"] = startup.mark("first_update", at=t_done)
      loop.resume_info["breakdown_s"] = startup.breakdown(STARTUP_STAGES)
      loop.resume_info["compile_cache"] = self.compile_cache
      loop.counts["recovery_ms_total"] += int(1000 * loop.resume_info["recovery_s"])
      self.writer.write(loop.step, loop.resume_info, phase="rl_event", advance=0)
      if self.primary:
        self.events.write(
          "resume", step=loop.step, **{k: v for k, v in loop.resume_info.items() if k != "event"}
        )
      print(
        f"sao: first update {loop.resume_info['recovery_s']:.1f} s after the restart", flush=True
      )
    skipped = int(metrics["nonfinite_skipped"])
    loop.counts["nonfinite_skipped"] += skipped
    loop.nonfinite_recent.append(skipped)
    loop.counts["consumed"] += len(items)
    loop.reward_s += sum(it.rec.meta.get("reward_s", 0.0) for it in items)
    loop.sandbox_runs += sum(it.rec.meta.get("sandbox_runs", 0) for it in items)
    lengths = [int(it.rec.arrays["valid"].sum()) for it in items]  # sampled tokens
    loop.counts["tokens"] += sum(lengths)
    loop.lengths.extend(lengths)
    # (replayed records waited through the crash: not a transport delay)
    loop.delays.extend(t_done - it.rec.meta["t_end"] for it in items if not it.replayed)
    val_acc = None
    if self.n_val and loop.step % rcfg.shadow_every == 0:
      val_acc = self.validate()
    if self.n_val and sum(loop.nonfinite_recent) >= rcfg.nonfinite_limit:
      self.rollback(
        f"{sum(loop.nonfinite_recent)} of the last {len(loop.nonfinite_recent)} "
        "updates had non-finite gradients"
      )
    if loop.step % sao.param_sync_every == 0:
      self.publish()
    self.snapshot(metrics=None if val_acc is None else {ckpt_lib.BEST_METRIC: val_acc})
    if loop.pending_commit is not None and not self.mngr.is_saving_in_progress():
      self.pool.learner.commit_positions(loop.pending_commit)  # what a finished snapshot holds
      loop.pending_commit = None
    if not self.primary:
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

  def _row(self, metrics, staleness: np.ndarray, tu: float, t_done: float, val_acc) -> dict:
    loop = self.loop
    # The learner's whole process tree (samplers and a local broker included), by the one
    # method the benchmark uses too (sao_jax.procs.tree_memory_mb), sampled at each row.
    loop.rss_peak = max(loop.rss_peak, procs.tree_memory_mb(os.getpid())["rss"])
    wall = time.time() - loop.t_loop
    hist = np.bincount(np.minimum(staleness, STALENESS_BINS - 1), minlength=STALENESS_BINS)
    c = loop.counts
    row = dict(
      metrics,
      accuracy=float(metrics["reward"]),
      staleness_mean=float(staleness.mean()),
      staleness_max=int(staleness.max()),
      staleness_hist=hist.tolist(),
      learner_busy=loop.busy / max(wall, 1e-9),
      queue_depth=len(self.buffer),
      outstanding_tasks=loop.outstanding,
      delay_mean=float(np.mean(loop.delays[-self.rows :])) if loop.delays else None,
      learner_time=t_done - tu,
      trajectories=c["consumed"],
      dropped_stale=c["dropped_stale"],
      dropped_lineage=c["dropped_lineage"],
      weighted_lineage=c["weighted_lineage"],
      bad_records=c["bad_records"],
      duplicates=c["duplicates"],
      duplicate_answers=c["duplicate_answers"],
      rejected=c["rejected"],
      nonfinite_total=c["nonfinite_skipped"],
      rollbacks=c["rollbacks"],
      sampler_restarts=c["sampler_restarts"],
      train_seconds=self.clock.elapsed,
      trajectories_per_s=c["consumed"] / max(wall, 1e-9),
      peak_memory_mb=peak_memory_mb(),
      peak_rss_all_mb=loop.rss_peak,
    )
    if val_acc is not None:
      row["val_accuracy"] = val_acc
    return row

  # Snapshots, shadows, rollback, publishing -------------------------------------------------
  def stream_meta(self) -> dict:
    loop = self.loop
    return {
      "phase": "rl",
      "stream": {
        "journal_next": self.buffer.first_seq(self.journal.next_seq),
        "task_rng": self.task_rng.bit_generator.state,
        "counts": dict(loop.counts),
        "train_seconds": self.clock.elapsed,
        "snap_journal": loop.snap_journal,
        "shadows": self.shadows.scores,
        "shadow_lineages": self.shadows.lineages,
        "lineage": self.lineage.to_json(),
      },
    }

  def snapshot(self, force: bool = False, metrics: dict | None = None) -> bool:
    """An Orbax snapshot of state and stream positions when due (or `force`); the Kafka
    offsets it covers are committed once it is written."""
    loop = self.loop
    if not force and not self.mngr.should_save(loop.step):
      return False
    if not self.primary:  # its shards only: the JSON items are process 0's
      ckpt_lib.save(self.mngr, self.state, self.cfg, {"phase": "rl"}, force=force, metrics=metrics)
      return True
    self.journal.rotate()
    loop.snap_journal[loop.step] = self.buffer.first_seq(self.journal.next_seq)
    kept = set(self.mngr.all_steps()) | {loop.step}
    for k in [k for k in loop.snap_journal if k not in kept]:
      del loop.snap_journal[k]
    ckpt_lib.save(self.mngr, self.state, self.cfg, self.stream_meta(), force=force, metrics=metrics)
    if not self.cfg.recovery.keep_journal:
      self.journal.prune(min(loop.snap_journal.values()))
    loop.pending_commit = self.buffer.safe_positions(
      self.pool.learner.positions(), also=self.held_positions()
    )
    return True

  def validate(self) -> float:
    """Greedy accuracy on the validation tasks; keeps a shadow, or rolls back to the best
    one if accuracy fell more than recovery.regress_threshold below it."""
    rcfg = self.cfg.recovery
    val_acc = self.validate_fn(self.state.params)["accuracy"]
    best = self.shadows.best()
    if best is not None and val_acc < best[1] - rcfg.regress_threshold:
      self.rollback(
        f"validation accuracy {val_acc:.3f} fell below the best shadow's "
        f"{best[1]:.3f} by more than {rcfg.regress_threshold}"
      )
    else:
      self.shadows.save(self.loop.step, self.state.params, val_acc, self.lineage.current)
    return val_acc

  def rollback(self, reason: str) -> None:
    """Back to the best shadow's params with a fresh optimizer and the step size times
    recovery.lr_decay; samplers get the restored policy at once."""
    loop, rcfg = self.loop, self.cfg.recovery
    if loop.counts["rollbacks"] >= rcfg.max_rollbacks:
      raise RuntimeError(
        f"SAO learner: {reason}, and the run already rolled back "
        f"{loop.counts['rollbacks']} times (recovery.max_rollbacks); stopping"
      )
    best = self.shadows.restore_best(self.state.params)
    if best is None:
      raise RuntimeError(f"SAO learner: {reason}, and no shadow is left to roll back to")
    loop.counts["rollbacks"] += 1
    params = best[2]
    lr_scale = float(jax.device_get(self.state.lr_scale)) * rcfg.lr_decay
    reset = self.progs.init(jax.random.key(self.cfg.seed + 7 + loop.counts["rollbacks"]))
    st = self.state
    self.state = reset.replace(
      step=st.step,
      params=params,
      tracker=st.tracker,
      rng=st.rng,
      nonfinite=st.nonfinite,
      ref_params=st.ref_params,
      lr_scale=jnp.asarray(lr_scale, jnp.float32),
    )
    loop.nonfinite_recent.clear()
    if self.primary:  # the shadow's parameters go on as a new lineage (sao_jax.lineage)
      self.begin_lineage("rollback", best[0], parent=self.shadows.lineages.get(best[0]))
    self.publish()
    event = {
      "event": "rollback",
      "reason": reason,
      "to_shadow_step": best[0],
      "shadow_val_accuracy": best[1],
      "lr_scale": lr_scale,
      "rollbacks": loop.counts["rollbacks"],
      "lineage": self.lineage_hex(),
    }
    print(
      f"sao: rollback at step {loop.step} to shadow {best[0]} ({reason}); lr scale {lr_scale:g}",
      flush=True,
    )
    self.writer.write(loop.step, event, phase="rl_event", advance=0)
    if self.primary:
      self.events.write(
        "rollback", step=loop.step, **{k: v for k, v in event.items() if k != "event"}
      )

  def publish(self) -> None:
    lineage = -1 if self.lineage.current is None else self.lineage.current
    self.publisher.publish(self.loop.step, self.state.params, lineage=lineage)
    self.guard.published(self.loop.step)

  # The loop -------------------------------------------------------------------------------
  def run(self, init: TrainState) -> tuple[TrainState, dict]:
    loop, cfg = self.loop, self.cfg
    self.prepare()
    # Samplers start first: their imports and compilation overlap the learner's restore.
    # Only process 0 starts them and reads their trajectories.
    pool = (
      SamplerPool(
        cfg,
        self.param_dir,
        self.run_id,
        tasks=(self.s.train, self.s.test),
        compile_cache=self.compile_cache,
        key=self.key,
        key_file=self.workdir / auth.KEY_FILE,
      )
      if self.primary
      else contextlib.nullcontext()
    )
    with pool as self.pool:
      if self.primary:
        self.guard.on_quarantine = self.pool.stop_local
      startup.mark("samplers_started")
      resumed = self.start(init)
      self.writer.progress("sao", cfg.rl.steps or None)
      if not resumed:
        self.snapshot(force=True)  # step 0: a resume before the first interval starts here
        if self.n_val:
          val = self.validate_fn(self.state.params)["accuracy"]
          self.shadows.save(0, self.state.params, val, self.lineage.current)
      self.clock.maybe_eval(
        loop.step, self.state.params, force=bool(self.eval_every) and not resumed
      )
      loop.t_loop = time.time()
      while self.clock.running(loop.step):
        self.refresh_priorities()
        if self.primary:
          self.fill()
        row = self.update()
        log_step(self.writer, self.clock, cfg, loop.step, self.state.params, row, "rl")
        if loop.step % cfg.log_every == 0 and self.primary:
          self.events.write("counts", step=loop.step, counts=self.count_deltas())
      wall = time.time() - loop.t_loop
      self.snapshot(force=True)
      self.mngr.wait_until_finished()
      if self.primary:
        self.pool.learner.commit_positions(loop.pending_commit)
    return self.state, self.finish(wall)

  def finish(self, wall: float) -> dict:
    """Closes the journal, ledger and shadows; the final snapshot and eval; the summary."""
    loop, c = self.loop, self.loop.counts
    self.shadows.close()
    held = len(self.audit.held()) if self.audit is not None else 0
    if self.audit is not None:
      self.audit.close()
    if self.primary:
      self.journal.close()
      self.ledger.close()
      self.events.write("finish", step=loop.step, counts=self.count_deltas())
      self.events.close()
    info = finish_phase(
      self.mngr, self.state, self.cfg, self.clock, loop.step, "rl", packer=self.progs.packer
    )
    steady = None
    if loop.steady_mark is not None and wall > loop.steady_mark[1]:
      steady = (loop.busy - loop.steady_mark[0]) / (wall - loop.steady_mark[1])
    info.update(
      trajectories=c["consumed"],
      dropped_stale=c["dropped_stale"],
      bad_records=c["bad_records"],
      duplicates=c["duplicates"],
      duplicate_answers=c["duplicate_answers"],
      unused_at_end=len(self.buffer),
      audited=c["audited"],
      audit_errors=c["audit_errors"],
      audit_held_at_end=held,
      nonfinite_skipped=c["nonfinite_skipped"],
      rollbacks=c["rollbacks"],
      sampler_restarts=c["sampler_restarts"],
      resumes=c["resumes"],
      orphan_version=c["orphan_version"],
      dropped_lineage=c["dropped_lineage"],
      weighted_lineage=c["weighted_lineage"],
      lineage=self.lineage_hex(),
      learner_busy=loop.busy / max(wall, 1e-9),
      learner_busy_steady=steady,
      trajectories_per_s=c["consumed"] / max(wall, 1e-9),
      tokens_per_s=c["tokens"] / max(wall, 1e-9),
      peak_rss_all_mb=loop.rss_peak,
      reward_s_per_trajectory=loop.reward_s / max(c["consumed"], 1),
      learner_peak_mb=peak_memory_mb(),
      seconds_per_step=info["seconds"] / max(loop.step - loop.steady_from, 1),
      sandbox_runs=loop.sandbox_runs,
      sandbox_runs_per_s=loop.sandbox_runs / max(wall, 1e-9),
      **self.guard.summary(),
      **delay_stats(loop.delays),
      **length_stats(loop.lengths),
    )
    if loop.resume_info is not None:
      info["recovery_s"] = loop.resume_info.get("recovery_s")
    # Everything that happened, over every process that ran this phase (killed ones too).
    info["lifetime"] = recovery.EventLog.lifetime(self.workdir / "events.jsonl", "rl")
    # The first TRANSIENT_UPDATES updates of each lineage (start, resumes, rollbacks).
    info["transients"] = info["lifetime"].pop("transients")
    return info


def run_sao(
  s: Setup,
  writer: MetricsWriter,
  state: TrainState,
  workdir: pathlib.Path,
  *,
  max_seconds: float | None = None,
  eval_every: float = 0.0,
) -> tuple:
  """Asynchronous single-trajectory training from `state`'s params; returns (state,
  programs, summary) like the other phases. Resumes by itself when
  `workdir/checkpoints/rl` holds a snapshot (see sao_jax.recovery): state, clock, counters
  and stream positions come back from the newest readable snapshot, and the records
  consumed after it are replayed from the journal before new ones."""
  learner = SAOLearner(s, writer, workdir, max_seconds=max_seconds, eval_every=eval_every)
  state, info = learner.run(state)
  return state, learner.progs, info
