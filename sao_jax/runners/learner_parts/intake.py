"""The SAO learner's intake (process 0 only): tasks out to the samplers, trajectory records
in through the transport, the admission guard and reward audit, the buffer batches are
taken from, the journal every record is written to before use, and the ledger of what each
update applied.

Everything but `samplers` works on whatever object stands for the transport end
(`pool.learner`: put_tasks, get_records, dead_letter, positions, commit_positions), so the
intake is tested without processes (tests/test_learner_intake.py, tests/test_admission.py).
"""

from __future__ import annotations

import collections
import pathlib
import time
from typing import NamedTuple

import numpy as np

from sao_jax import admission, interrupt, recovery, startup, storage
from sao_jax import config as config_lib
from sao_jax.buffer import Item, TrajectoryBuffer, decode_trajectory
from sao_jax.lineage import LineageTree
from sao_jax.runners.samplers import SamplerPool, new_run_id
from sao_jax.setup import Setup
from sao_jax.transport import auth, records

STALL_WARN_S = 60.0  # waiting this long for a new trajectory is reported


class Taken(NamedTuple):
  """The records an update takes from the buffer (`Intake.take`)."""

  items: list[Item]  # in the batch
  dropped: list[Item]  # too stale, or of a discarded lineage
  discarded: list[Item]  # of `dropped`, those of a discarded lineage
  weighted: list[Item]  # of `items`, those of a discarded lineage weighed by their distance


class Intake:
  """Process 0's side of the data flow (see the module docstring), from its parts: `open`
  makes them for a run.

  `n_sample`: the tasks handed out (the validation tail never is); `expect`: what a record
  must fit to be batched (`buffer.decode_trajectory`); `counts`: the learner's counter, which
  `guard` counts into too; `tasks`: (train, test) for the samplers; `audit`: the reward
  audit of costly families, if any."""

  def __init__(
    self,
    cfg: config_lib.Config,
    workdir: pathlib.Path,
    *,
    guard: admission.RecordGuard,
    buffer: TrajectoryBuffer,
    journal: recovery.Journal,
    ledger: recovery.Ledger,
    counts: collections.Counter,
    n_sample: int,
    expect,
    tasks: tuple = ((), ()),
    audit: admission.RewardAudit | None = None,
  ):
    self.cfg, self.workdir, self.tasks = cfg, workdir, tasks
    self.guard, self.buffer, self.journal, self.ledger = guard, buffer, journal, ledger
    self.counts, self.n_sample, self.expect, self.audit = counts, n_sample, expect, audit
    self.rows = buffer.rows
    self.task_rng = np.random.default_rng((cfg.seed, 3))
    self.pool: SamplerPool | None = None
    self.run_id = ""
    self.key: bytes | None = None  # the run's key (sao_jax.transport.auth)
    self.seen_ids: set[int] = set()  # applied or waiting
    self.outstanding = 0  # tasks handed out and not yet returned
    self.last_fresh = time.time()  # last new record arrived
    self.stall_reports = 0

  @classmethod
  def open(
    cls,
    s: Setup,
    workdir: pathlib.Path,
    *,
    rows: int,
    max_staleness: int,
    n_sample: int,
    expect,
    counts: collections.Counter,
    lineage: LineageTree,
  ) -> Intake:
    """The intake of a run: its buffer of `rows`-row batches at most `max_staleness`
    versions old (ages along `lineage`), the journal and ledger in `workdir`, the admission
    guard and (costly rewards) the audit."""
    cfg, fam = s.cfg, s.family

    def rescore(index: int, rec, costly: bool = False) -> float | None:
      """A one-step record's reward recomputed from its completion (verifiable families;
      with `costly`, auditable ones too: a sandbox run)."""
      a = rec.arrays
      if "tokens" not in a or a["tokens"].shape[0] != 1 or not 0 <= index < len(s.train):
        return None
      completion = a["tokens"][0][a["valid"][0].astype(bool)]
      return fam.rescore(s.train[index], s.tok, completion, costly=costly)

    def lineage_known(node) -> bool:
      """Whether a record's meta lineage is one this run began."""
      return isinstance(node, int) and not isinstance(node, bool) and lineage.known(node)

    guard = admission.RecordGuard(
      vocab_size=s.model.cfg.vocab_size,
      num_tasks=n_sample,
      counts=counts,
      reward_range=lambda i: fam.reward_range(s.train[i]),
      state_path=workdir / "published.json",
      window=cfg.samplers.quarantine_window,
      rate=cfg.samplers.quarantine_rate,
      lineage_known=lineage_known,
      task_id_of=lambda i: s.train[i].task_id,
      rescore=rescore,
    )
    # Families whose reward costs a sandbox run: a sampled fraction re-scored before use.
    audit = None
    if fam.auditable and not fam.verifiable and cfg.sao.audit_fraction > 0:
      fam.make_env(s.tok)  # the learner's own sandbox pool, made before its threads share it
      audit = admission.RewardAudit(
        cfg.sao.audit_fraction,
        lambda rec: rescore(rec.meta["task_index"], rec, costly=True),
        workers=cfg.sao.audit_workers,
      )
    return cls(
      cfg,
      workdir,
      guard=guard,
      buffer=TrajectoryBuffer(rows, max_staleness, lineage=lineage),
      journal=recovery.Journal(workdir / "journal"),
      ledger=recovery.Ledger(workdir / "ledger.jsonl"),
      counts=counts,
      n_sample=n_sample,
      expect=expect,
      tasks=(s.train, s.test),
      audit=audit,
    )

  # Start and end ----------------------------------------------------------------------------
  def prepare(self, param_dir) -> bytes:
    """What the samplers need before they start: the run id (the same topics after a
    restart, so offsets replay), an empty parameter directory to wait on, and the run's key
    (kept across resumes: records on a topic); returns the key."""
    if self.cfg.transport.kind == "kafka":
      id_path = self.workdir / "run_id"
      self.run_id = self.cfg.transport.run_id or (
        id_path.read_text().strip() if id_path.exists() else new_run_id(self.cfg)
      )
      id_path.write_text(self.run_id)
    storage.open_store(param_dir).clear()  # an earlier start's versions
    self.key = auth.load_or_create(self.workdir)
    return self.key

  def samplers(self, param_dir, compile_cache: str | None) -> SamplerPool:
    """The sampler processes and the transport (a context manager; `attach` what it opens)."""
    return SamplerPool(
      self.cfg,
      param_dir,
      self.run_id,
      tasks=self.tasks,
      compile_cache=compile_cache,
      key=self.key,
      key_file=self.workdir / auth.KEY_FILE,
    )

  def attach(self, pool: SamplerPool) -> None:
    self.pool = pool
    self.guard.on_quarantine = pool.stop_local

  def resume(self, step: int, stream: dict) -> None:
    """After a restore at `step` (`stream`: what its snapshot saved): the task RNG back, the
    ledger cut back to it, and the journal's records from the snapshot's position on queued
    again (those not applied by then)."""
    self.task_rng.bit_generator.state = stream["task_rng"]
    self.guard.resumed = True
    self.seen_ids = self.ledger.cut_to(step)
    for seq, data in self.journal.read_from(stream["journal_next"]):
      rec = records.decode(data)  # journaled records were decoded once already
      if rec.record_id not in self.seen_ids:
        self.seen_ids.add(rec.record_id)
        self.buffer.extend([Item(rec, seq, None, replayed=True)])

  def begin(self) -> None:
    """A new run: an earlier attempt's ledger is emptied."""
    self.ledger.cut_to(0)

  def close(self) -> int:
    """Closes the audit, journal and ledger; returns the records the audit still held."""
    held = len(self.audit.held()) if self.audit is not None else 0
    if self.audit is not None:
      self.audit.close()
    self.journal.close()
    self.ledger.close()
    return held

  # Records in -------------------------------------------------------------------------------
  def ingest(self, got: list[tuple[bytes, tuple[int, int] | None]]) -> None:
    """Decodes, de-duplicates and journals (written through before use: a crash from here
    on replays them) what arrived, then queues it for batching."""
    fresh, end = [], self.pool.learner
    for sealed, pos in got:
      try:  # the tag first: nothing of a message without one under the run's key is read
        data = auth.unseal(self.key, sealed)
      except auth.Unauthenticated as err:
        self.guard.reject_unauthenticated(sealed, str(err), end)
        continue
      rec = decode_trajectory(data, end, self.counts, self.expect)
      if rec is None:
        self.guard.charge_malformed(data)
        continue
      if rec.record_id in self.seen_ids or self.guard.is_redelivery(rec.record_id):
        self.counts["duplicates"] += 1  # redelivered: already applied, waiting or refused
        continue
      # Only the answer to a task this learner handed out and still waits for frees a place
      # in the task queue. A record of an earlier incarnation's task (redelivered after a
      # resume, or finished by a sampler that followed the restart) is trained on as extra
      # data; letting it free a place too handed out a task more for each of them, a
      # standing surplus of records that waited in the queue (measured: 2-3 versions of
      # staleness after kill -9s against 1.3 without).
      ours = self.guard.outstanding[rec.meta["task_index"]] > 0
      if not self.guard.admit(rec, data, end):
        continue  # dead-lettered and counted; its task handed out again
      self.seen_ids.add(rec.record_id)
      self.last_fresh, self.stall_reports = time.time(), 0
      if self.audit is not None and self.audit.picks(rec.record_id):
        self.audit.hold(rec, (data, pos, ours))  # (its task still counts as outstanding)
        continue
      if ours:
        self.outstanding = max(0, self.outstanding - 1)
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
    out = []
    for rec, (data, pos, ours), true, err in self.audit.released() if self.audit else []:
      if err is not None:
        self.counts["audit_errors"] += 1
        if self.counts["audit_errors"] == 1:
          print(f"sao: a reward audit failed ({err!r}); the record is trained on", flush=True)
      elif true is not None and abs(float(rec.meta["reward"]) - true) > admission.REWARD_TOL:
        self.guard.reject_audited(rec, data, true, self.pool.learner, reissue=ours)
        continue  # (a reissued task stays outstanding)
      else:
        self.counts["audited"] += 1
      if ours:
        self.outstanding = max(0, self.outstanding - 1)
      out.append((rec, data, pos))
    return out

  def check_samplers(self) -> None:
    # A terminal's Ctrl-C also stops the samplers: not a death to restart them for.
    interrupt.check()
    before = self.pool.restarts
    leftovers = self.pool.check()
    self.counts["sampler_restarts"] += self.pool.restarts - before
    if leftovers is not None and self.cfg.transport.kind == "embedded":
      self.ingest([(data, None) for data in leftovers])
      self.outstanding = 0  # the old task queue is gone; new tasks go to the new samplers
      self.guard.tasks_dropped()

  # Tasks out --------------------------------------------------------------------------------
  def hand_out(self, indices: list[int]) -> None:
    handouts = self.guard.new_handouts(len(indices))
    self.pool.learner.put_tasks(indices, handouts)
    self.guard.handed_out(indices, handouts)
    self.outstanding += len(indices)

  def work_ahead_room(self, step: int) -> int:
    """How many more tasks may be handed out now. The work ahead of the learner is bounded
    so that nothing waits long enough to go stale (`sao.backpressure`): with it, tasks
    outstanding plus records buffered that a batch will still take stay within one batch
    plus what the samplers hold in flight (samplers.num x sampler_slots); without it (the
    bound before), tasks outstanding stay at one batch plus two calls per sampler, whatever
    is buffered."""
    sao = self.cfg.sao
    in_flight = max(1, self.cfg.samplers.num) * sao.sampler_slots
    if sao.backpressure:
      # Records a batch will not take (stale, or of a discarded lineage) wait for nothing.
      fresh = self.buffer.fresh(step)
      return max(0, self.rows + in_flight - self.outstanding - fresh)
    return max(0, self.rows + 2 * in_flight - self.outstanding)

  def top_up(self, step: int, probs: np.ndarray | None) -> None:
    """Hands out as many new tasks as `work_ahead_room` allows, drawn from `probs`."""
    new = self.task_rng.choice(self.n_sample, size=self.work_ahead_room(step), p=probs)
    self.hand_out(new.tolist())

  def top_up_before_update(self, step: int, probs: np.ndarray | None) -> None:
    """With backpressure, the samplers' next work is handed out as a batch leaves the
    buffer, before the update: they sample while the learner trains. Whatever already
    arrived is taken in first, so records the learner did not hand out (an answer
    redelivered by the transport, a sampler that joined) count against the bound too."""
    if not self.cfg.sao.backpressure:
      return
    got = self.pool.learner.get_records(max(self.rows, 1024), timeout=0.0)
    if got:
      self.ingest(got)
    self.top_up(step, probs)

  def fill(self, step: int, probs: np.ndarray | None) -> None:
    """Hands out tasks and gathers trajectories until the next batch is full. Tasks are
    topped up on every pass, so samplers keep working while the learner waits or updates."""
    self.check_samplers()
    while not self.buffer.ready(step):
      interrupt.check()  # a Ctrl-C stops here, between passes, not inside a send
      self.top_up(step, probs)
      got = self.pool.learner.get_records(self.rows, timeout=0.05)
      if got or (self.audit is not None and self.audit.held()):
        self.ingest(got)  # (also releases records whose reward audit is done)
      if not got:
        self.check_samplers()
      self.report_stall(step)

  def report_stall(self, step: int) -> None:
    waited = time.time() - self.last_fresh
    if waited > STALL_WARN_S * (self.stall_reports + 1):  # a line per minute, never silent
      self.stall_reports += 1
      print(
        f"sao: no new trajectory for {waited:.0f} s at update {step}: "
        f"{self.outstanding} tasks outstanding, {len(self.buffer)} records buffered, "
        f"{self.pool.group.alive()}/{len(self.pool.group.procs)} local samplers alive"
        f"{', kafka run ' + self.run_id if self.run_id else ''}",
        flush=True,
      )

  # Batches and their record -----------------------------------------------------------------
  def take(self, step: int) -> Taken:
    """The records for the batch at `step` and those dropped on the way, counted: too stale,
    or of a lineage that a resume or rollback discarded (sao_jax.lineage)."""
    items, dropped = self.buffer.take_batch(step)
    discarded = [it for it in dropped if self.buffer.discarded(it, step)]
    self.counts["dropped_lineage"] += len(discarded)
    self.counts["dropped_stale"] += len(dropped) - len(discarded)
    # (with sao.discarded_lineage="weight": those trained on at their distance; only a tree
    # that weighs them lets one into a batch)
    weighted, tree = [], self.buffer.lineage
    if tree is not None and tree.weigh_discarded:
      weighted = [it for it in items if self.buffer.discarded(it, step)]
    self.counts["weighted_lineage"] += len(weighted)
    return Taken(items, dropped, discarded, weighted)

  def reject_unverified(self, unverified, items: list[Item], batch, drift: float) -> None:
    """Rejects the records of the rows the update flagged as not the policy's own
    log-probabilities (sao.verify_drift)."""
    traj_b = getattr(batch, "traj_b", None)  # (a memory batch's rows are its trajectories)
    for row in np.flatnonzero(unverified):
      item = items[int(row if traj_b is None else traj_b[row])]
      self.guard.reject_unverified(item.rec, drift)

  def record(
    self, step: int, items, dropped, discarded, weighted, check: dict | None, lineage
  ) -> None:
    """The ledger row of update `step`: the records applied and dropped (by id)."""
    self.ledger.append(
      step,
      [it.rec.record_id for it in items],
      [it.rec.record_id for it in dropped],
      check=check,
      lineage=lineage,
      discarded=[it.rec.record_id for it in discarded],
      weighted=[it.rec.record_id for it in weighted],
    )

  # What a snapshot needs (`learner_parts.publishing.StreamSide`) ----------------------------
  def journal_next(self) -> int:
    """The journal position a resume replays from: the oldest waiting record's."""
    return self.buffer.first_seq(self.journal.next_seq)

  def mark_journal(self) -> int:
    """Starts a new journal segment for the snapshot being taken; its replay position."""
    self.journal.rotate()
    return self.journal_next()

  def prune_journal(self, keep_from: int) -> None:
    self.journal.prune(keep_from)

  def safe_positions(self) -> dict[int, int]:
    """Transport positions safe to commit: before every record still waiting or held by
    the reward audit."""
    held = self.audit.held() if self.audit is not None else []
    also = [pos for _, pos, _ in held if pos is not None]
    return self.buffer.safe_positions(self.pool.learner.positions(), also=also)

  def commit(self, positions: dict[int, int] | None) -> None:
    self.pool.learner.commit_positions(positions)
