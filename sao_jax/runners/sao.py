"""The asynchronous SAO run on one machine: K sampler processes and this learner process.

    task queue (indices; prioritised by the tracker) ──► sampler processes (spawn)
    sampler processes ── binary trajectory records ──► trajectory queue ──► learner
    learner ── params v+1 every `param_sync_every` updates ──► param directory ──► samplers

The learner updates as soon as `sao.batch_size` trajectories have arrived, whatever policy
version produced them; staleness is corrected in the loss. Every process started here is
stopped here: on normal exit, on an exception, on Ctrl-C, and when a sampler fails.
"""
from __future__ import annotations

import collections
import contextlib
import multiprocessing as mp
import os
import pathlib
import queue
import shutil
import time
import uuid

import jax
import jax.numpy as jnp
import numpy as np

import sao_jax
from sao_jax import checkpoint as ckpt_lib
from sao_jax import config as config_lib
from sao_jax import recovery
from sao_jax.buffer import Item, TrajectoryBuffer, batch_rows, decode_trajectory
from sao_jax.learner import TrainState, make_sao_update
from sao_jax.metrics import MetricsWriter, peak_memory_mb
from sao_jax.procs import stop_processes
from sao_jax.rl import trackers
from sao_jax.runners import train
from sao_jax.runners.sampler_proc import SamplerError, SamplerSpec, sampler_main
from sao_jax.transport import records
from sao_jax.transport.base import EmbeddedSpec
from sao_jax.transport.broker import LocalBroker, wait_until_answers
from sao_jax.transport.kafka import KafkaSpec
from sao_jax.transport.params import ParamPublisher

STALL_WARN_S = 60.0  # waiting this long for a new trajectory is reported
# learner_busy_steady leaves out this many first updates of a process: sampler start-up, the
# first compilations and (Kafka) the consumer-group join are paid once per run, not per update.
STEADY_AFTER = 10
STALENESS_BINS = 8
  # histogram buckets 0..7, last one is ">= 7"


def process_tree_rss_mb(pids) -> float:
  """Resident memory now of the given processes (Linux /proc), in MiB."""
  total = 0
  for pid in pids:
    with contextlib.suppress(OSError):
      with open(f"/proc/{pid}/statm") as f:
        total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
  return total / 2**20


def new_run_id(cfg: config_lib.Config) -> str:
  return f"{cfg.name}-{time.strftime('%Y%m%d%H%M%S')}-{os.getpid()}"


class SamplerPool:
  """K sampler processes and the transport to them; a context manager that always cleans up
  (processes, queues, and the local broker if it started one)."""

  def __init__(self, cfg: config_lib.Config, param_dir: pathlib.Path, run_id: str = ""):
    self.ctx = mp.get_context("spawn")
    self.errors = self.ctx.Queue()
    self.cfg = cfg
    self.broker = None
    self.transport = None
    self.stop = self.ctx.Event()
    sao = cfg.sao
    ncpu = len(os.sched_getaffinity(0))
    cores: list[tuple[int, ...]] = [()] * sao.num_samplers
    self.learner_cores: tuple[int, ...] = ()
    if sao.pin_cores:
      if ncpu < 2:
        raise config_lib.ConfigError("sao.pin_cores needs at least 2 CPU cores")
      allowed = sorted(os.sched_getaffinity(0))
      self.learner_cores = (allowed[0],)
      rest = allowed[1:]
      cores = [tuple(rest[i::sao.num_samplers]) or tuple(rest) for i in range(sao.num_samplers)]
    self.cores = cores
    self.param_dir = param_dir
    self.run_id = run_id
    self.procs: list[mp.Process] = []
    self.restarts = 0
    self.learner = None

  def _make_transport(self):
    t = self.cfg.transport
    if t.kind == "embedded":
      return EmbeddedSpec(self.ctx)
    bootstrap = t.bootstrap_servers
    if not bootstrap:
      self.broker = LocalBroker().start()
      bootstrap = self.broker.bootstrap
    else:
      wait_until_answers(bootstrap, timeout=10.0)
    run_id = self.run_id or t.run_id or new_run_id(self.cfg)
    spec = KafkaSpec(bootstrap=bootstrap, run_id=run_id, partitions=t.partitions,
                     broker_timeout_s=t.broker_timeout_s, incarnation=uuid.uuid4().hex[:8])
    spec.create_topics()
    spec.announce({"status": "running", "config": config_lib.to_dict(self.cfg),
                   "param_dir": str(self.param_dir.absolute()), "partitions": t.partitions,
                   "incarnation": spec.incarnation})
    print(f"sao: kafka transport at {bootstrap}, run id {run_id}; more samplers can join with: "
          f"sao-jax sampler --bootstrap {bootstrap} --run-id {run_id}", flush=True)
    return spec

  def __enter__(self):
    try:
      self.transport = self._make_transport()
      self.learner = self.transport.learner_end()
      self._start_samplers()
    except BaseException:
      self.__exit__(None, None, None)
      raise
    return self

  def _spawn(self, i: int) -> mp.Process:
    sao = self.cfg.sao
    spec = SamplerSpec(sampler_id=i, config=config_lib.to_dict(self.cfg),
                       param_dir=str(self.param_dir), transport=self.transport,
                       seed=self.cfg.seed * 1000 + i + 7919 * self.restarts,
                       threads=sao.sampler_threads, cores=self.cores[i])
    p = self.ctx.Process(target=sampler_main, name=f"sao-sampler-{i}",
                         args=(spec, self.stop, self.errors), daemon=True)
    p.start()
    return p

  def _start_samplers(self):
    for i in range(self.cfg.sao.num_samplers):
      self.procs.append(self._spawn(i))
    if self.learner_cores:
      os.sched_setaffinity(0, self.learner_cores)

  def check(self) -> list[bytes] | None:
    """Restarts samplers that died (a crash, kill -9, the OOM killer), up to
    `sao.max_sampler_restarts` per run; raises SamplerError beyond that, or if a sampler
    reported an exception (a bug that a restart would repeat).

    On Kafka the dead sampler alone is restarted; the group gives its unacknowledged tasks to
    the others. On the embedded transport a process killed while it held a queue's lock can
    block that queue for everyone, so the sampler group restarts on fresh queues: the live
    samplers finish and send their current call first, and the records still in the old
    queue are returned to the caller. Returns None if nothing died, else those records
    (and the caller's count of tasks in flight starts again from zero).
    """
    with contextlib.suppress(queue.Empty):
      raise SamplerError(f"a sampler failed:\n{self.errors.get_nowait()}")
    dead = [i for i, p in enumerate(self.procs)
            if p.exitcode not in (None, 0) and not self.stop.is_set()]
    if not dead:
      if self.learner is not None:
        self.learner.check()  # the transport itself (Kafka: a lost broker -> BrokerError)
      return None
    for i in dead:
      p = self.procs[i]
      if self.restarts >= self.cfg.sao.max_sampler_restarts:
        raise SamplerError(f"{p.name} died with exit code {p.exitcode} and the run already "
                           f"restarted {self.restarts} samplers (sao.max_sampler_restarts); "
                           "run stopped")
      self.restarts += 1
      print(f"sao: {p.name} died with exit code {p.exitcode}; restarting it "
            f"({self.restarts}/{self.cfg.sao.max_sampler_restarts})", flush=True)
    if self.cfg.transport.kind != "embedded":
      for i in dead:
        self.procs[i] = self._spawn(i)
      return []
    old_stop, old_procs, old_spec = self.stop, self.procs, self.transport
    old_stop.set()
    stop_processes(old_procs, timeout=30)
    leftovers = []
    with contextlib.suppress(queue.Empty):
      while True:
        leftovers.append(old_spec.traj_q.get(timeout=0.2))
    old_spec.close()
    self.stop = self.ctx.Event()
    self.transport = EmbeddedSpec(self.ctx)
    self.learner = self.transport.learner_end()
    self.procs = [self._spawn(i) for i in range(len(old_procs))]
    return leftovers

  def __exit__(self, *exc):
    self.stop.set()
    if isinstance(self.transport, KafkaSpec):
      with contextlib.suppress(Exception):
        self.transport.announce({"status": "finished"})  # remote samplers stop
    stop_processes(self.procs)
    self.errors.cancel_join_thread()
    self.errors.close()
    for closer in (self.learner, self.transport):
      if closer is not None:
        with contextlib.suppress(Exception):
          closer.close()
    if self.broker is not None:
      self.broker.stop()
    if self.learner_cores:
      os.sched_setaffinity(0, range(os.cpu_count()))
    return False

  def pids(self) -> list[int]:
    return [p.pid for p in self.procs if p.pid is not None]



def _poisoned(cfg: config_lib.Config, update: int) -> bool:
  f = cfg.faults
  if update in f.nan_steps:
    return True
  return f.nan_prob > 0 and np.random.default_rng((cfg.seed, 99, update)).random() < f.nan_prob


def run_sao(s: train.Setup, writer: MetricsWriter, state: TrainState, workdir: pathlib.Path, *,
            max_seconds: float | None = None, eval_every: float = 0.0) -> tuple:
  """Asynchronous single-trajectory training from `state`'s params. Returns like run_grpo.

  Resumes by itself when `workdir/checkpoints/rl` holds a snapshot (see sao_jax.recovery):
  state, clock, counters and stream positions come back from the newest readable snapshot,
  and the records consumed after it are replayed from the journal before new ones.
  """
  cfg, rl, sao, rcfg = s.cfg, s.cfg.rl, s.cfg.sao, s.cfg.recovery
  max_seconds = rl.max_seconds if max_seconds is None else max_seconds
  n_val = rcfg.val_problems if rcfg.shadow_every else 0
  if n_val >= len(s.train):
    raise config_lib.ConfigError(f"recovery.val_problems {n_val} >= train problems "
                                 f"{len(s.train)}")
  val_tasks = s.train[len(s.train) - n_val:]
  n_sample = len(s.train) - n_val  # the validation tail is never sampled in RL
  with_ref = rl.kl_coef > 0
  progs = train.programs_for(s, rl.optim, lambda m, tx: make_sao_update(m, tx, rl, sao),
                             num_tasks=len(s.train), with_ref=with_ref)
  fresh = progs.init(jax.random.key(cfg.seed + 1))
  bs = train.round_up(sao.batch_size, progs.batch_divisor)
  ckpt_dir = workdir / "checkpoints" / "rl"
  mngr = ckpt_lib.manager(ckpt_dir, every=cfg.checkpoint_every, keep=rcfg.keep)
  shadows = ckpt_lib.ShadowBank(workdir / "checkpoints" / "shadows", rcfg.shadow_keep)
  journal = recovery.Journal(workdir / "journal")
  ledger = recovery.Ledger(workdir / "ledger.jsonl")
  rng = np.random.default_rng((cfg.seed, 3))
  clock = train.PhaseClock(rl.steps, max_seconds, eval_every,
                           lambda params: train.evaluate(s, progs, params))
  counts = collections.Counter()
  buffer = TrajectoryBuffer(bs, sao.max_staleness)
  snap_journal: dict[int, int] = {}  # snapshot step -> its journal_next (for pruning)
  resumed = ckpt_lib.restore_latest_valid(mngr, fresh) if mngr.all_steps() else None
  if resumed is not None:
    state, meta, step, skipped = resumed
    st = meta["stream"]
    rng.bit_generator.state = st["task_rng"]
    counts.update(st["counts"])
    clock.resume_at(st["train_seconds"])
    snap_journal = {int(k): v for k, v in st["snap_journal"].items()}
    seen_ids = ledger.cut_to(step)
    shadows.reset_to(step, {int(k): v for k, v in st["shadows"].items()})
    for seq, data in journal.read_from(st["journal_next"]):
      rec = records.decode(data)  # journaled records were decoded once already
      if rec.record_id not in seen_ids:
        seen_ids.add(rec.record_id)
        buffer.extend([Item(rec, seq, None, replayed=True)])
    counts["resumes"] += 1
    counts["snapshots_skipped_corrupt"] += len(skipped)
    resume_info = {"event": "resume", "from_step": step, "skipped_snapshots": skipped,
                   "replay_records": len(buffer), "journal_tail_bytes": journal.truncated_tail}
    print(f"sao: resuming from snapshot step {step} (replaying {len(buffer)} journaled "
          f"records{'; skipped unreadable ' + str(skipped) if skipped else ''})", flush=True)
  else:
    state = fresh.replace(params=train.copy_tree(state.params),
                          ref_params=train.copy_tree(state.params) if with_ref else None)
    step, seen_ids, resume_info = 0, set(), None
    ledger.cut_to(0)
    shadows.reset_to(0, {})
  run_id = ""
  if cfg.transport.kind == "kafka":  # the same topics after a restart: offsets replay
    id_path = workdir / "run_id"
    run_id = cfg.transport.run_id or (id_path.read_text().strip() if id_path.exists()
                                      else new_run_id(cfg))
    id_path.write_text(run_id)
  param_dir = workdir / "params"
  shutil.rmtree(param_dir, ignore_errors=True)
  publisher = ParamPublisher(param_dir)
  publisher.publish(step, state.params)  # samplers start from the (restored) policy

  def stream_meta() -> dict:
    return {"phase": "rl", "stream": {
        "journal_next": buffer.first_seq(journal.next_seq),
        "task_rng": rng.bit_generator.state, "counts": dict(counts),
        "train_seconds": clock.elapsed, "snap_journal": snap_journal,
        "shadows": shadows.scores}}

  def snapshot(force=False, metrics=None) -> bool:
    nonlocal pending_commit
    if not force and not mngr.should_save(step):
      return False
    journal.rotate()
    snap_journal[step] = buffer.first_seq(journal.next_seq)
    kept = set(mngr.all_steps()) | {step}
    for k in [k for k in snap_journal if k not in kept]:
      del snap_journal[k]
    ckpt_lib.save(mngr, state, cfg, stream_meta(), force=force, metrics=metrics)
    if not rcfg.keep_journal:
      journal.prune(min(snap_journal.values()))
    pending_commit = buffer.safe_positions(pool.learner.positions())
    return True

  def validate() -> float:
    return train.evaluate(s, progs, state.params, tasks=val_tasks)["accuracy"]

  def rollback(reason: str):
    nonlocal state
    best = shadows.best()
    if counts["rollbacks"] >= rcfg.max_rollbacks:
      raise RuntimeError(f"SAO learner: {reason}, and the run already rolled back "
                         f"{counts['rollbacks']} times (recovery.max_rollbacks); stopping")
    counts["rollbacks"] += 1
    params = shadows.restore(best[0], state.params)
    lr_scale = float(jax.device_get(state.lr_scale)) * rcfg.lr_decay
    reset = progs.init(jax.random.key(cfg.seed + 7 + counts["rollbacks"]))
    state = reset.replace(step=state.step, params=params, tracker=state.tracker, rng=state.rng,
                          nonfinite=state.nonfinite, ref_params=state.ref_params,
                          lr_scale=jnp.asarray(lr_scale, jnp.float32))
    nonfinite_recent.clear()
    publisher.publish(step, state.params)
    event = {"event": "rollback", "reason": reason, "to_shadow_step": best[0],
             "shadow_val_accuracy": best[1], "lr_scale": lr_scale,
             "rollbacks": counts["rollbacks"]}
    print(f"sao: rollback at step {step} to shadow {best[0]} ({reason}); lr scale "
          f"{lr_scale:g}", flush=True)
    writer.write(step, event, phase="rl_event", advance=0)

  writer.progress("sao", rl.steps or None)
  delays: list[float] = []
  busy = 0.0
  outstanding = 0  # tasks handed out and not yet returned
  # Enough tasks in flight to fill the next batch while every sampler holds a full call's worth.
  target_depth = bs + 2 * max(1, sao.num_samplers) * sao.sampler_slots
  probs = None
  rss_peak = 0.0
  pending_commit = None
  nonfinite_recent: collections.deque[int] = collections.deque(maxlen=rcfg.nonfinite_window)
  first_update_logged = resume_info is None
  t_fresh = [time.time(), 0]  # when the last new record arrived; stall warnings since
  steady_from, steady_mark = step, None  # (busy, wall) after this process's first updates
  expect = ((s.prompt_len, rl.max_new_tokens), len(s.train), bs)

  def ingest(got):
    nonlocal outstanding
    fresh_items = []
    for data, pos in got:
      rec = decode_trajectory(data, pool.learner, counts, expect)
      if rec is None:
        continue
      if rec.record_id in seen_ids:  # redelivered: already applied or waiting
        counts["duplicates"] += 1
        continue
      seen_ids.add(rec.record_id)
      outstanding = max(0, outstanding - 1)
      t_fresh[:] = [time.time(), 0]
      fresh_items.append((rec, data, pos))
    # Written through to the journal before use: a crash from here on replays them.
    first = journal.append([data for _, data, _ in fresh_items])
    buffer.extend(Item(rec, first + k, pos) for k, (rec, _, pos) in enumerate(fresh_items))

  def check_samplers():
    nonlocal outstanding
    leftovers = pool.check()
    if leftovers is not None and cfg.transport.kind == "embedded":
      outstanding = 0  # the old task queue is gone; new tasks go to the new samplers
      ingest([(data, None) for data in leftovers])

  with SamplerPool(cfg, param_dir, run_id) as pool:
    if resumed is None:
      snapshot(force=True)  # step 0: a resume before the first interval starts from here
      if n_val:
        shadows.save(0, state.params, validate())
    clock.maybe_eval(step, state.params, force=bool(eval_every) and resumed is None)
    t_loop = time.time()
    while clock.running(step):
      check_samplers()
      if sao.prioritized and (probs is None or step % 10 == 0):
        p64 = np.asarray(jax.device_get(trackers.priority_weights(state.tracker,
                                                                  sao.priority_eps)), np.float64)
        p64 = p64[:n_sample]
        probs = p64 / p64.sum()
      # Gather what has arrived; block (briefly) only while a batch is not full. Tasks are
      # topped up on every pass, so samplers keep working while the learner waits or updates.
      while not buffer.ready(step):
        new = rng.choice(n_sample, size=max(0, target_depth - outstanding), p=probs)
        pool.learner.put_tasks(new.tolist())
        outstanding += len(new)
        got = pool.learner.get_records(bs, timeout=0.05)
        if got:
          ingest(got)
        else:
          check_samplers()
        waited = time.time() - t_fresh[0]
        if waited > STALL_WARN_S * (t_fresh[1] + 1):  # a line per minute, never silent
          t_fresh[1] += 1
          alive = sum(p.is_alive() for p in pool.procs)
          print(f"sao: no new trajectory for {waited:.0f} s at update {step}: {outstanding} "
                f"tasks outstanding, {len(buffer)} records buffered, {alive}/"
                f"{len(pool.procs)} local samplers alive"
                f"{', kafka run ' + run_id if run_id else ''}", flush=True)
      batch_items, stale_items = buffer.take_batch(step)
      counts["dropped_stale"] += len(stale_items)
      batch, orphans = batch_rows(batch_items, step, bs, sao.max_staleness)
      counts["orphan_version"] += orphans
      if _poisoned(cfg, step + 1):
        batch["poison"][0] = np.nan
        counts["poisoned"] += 1
      staleness = batch["staleness"][batch["head"]]  # one per trajectory
      tu = time.time()
      state, metrics = progs.update(state, progs.shard_batch(batch))
      metrics = jax.device_get(metrics)
      t_done = time.time()
      busy += t_done - tu
      step += 1
      if step == steady_from + STEADY_AFTER:  # start and warm-up over: steady state from here
        steady_mark = (busy, time.time() - t_loop)
      ledger.append(step, [it.rec.record_id for it in batch_items],
                    [it.rec.record_id for it in stale_items])
      if not first_update_logged:
        first_update_logged = True
        resume_info["recovery_s"] = t_done - sao_jax.PROCESS_T0
        counts["recovery_ms_total"] += int(1000 * resume_info["recovery_s"])
        writer.write(step, resume_info, phase="rl_event", advance=0)
        print(f"sao: first update {resume_info['recovery_s']:.1f} s after the restart",
              flush=True)
      skipped = int(metrics["nonfinite_skipped"])
      counts["nonfinite_skipped"] += skipped
      nonfinite_recent.append(skipped)
      counts["consumed"] += len(batch_items)
      counts["tokens"] += int(batch["valid"].sum())
      # (replayed records waited through the crash: not a transport delay)
      delays.extend(t_done - it.rec.meta["t_end"] for it in batch_items if not it.replayed)
      val_acc = None
      if n_val and step % rcfg.shadow_every == 0:
        val_acc = validate()
        best = shadows.best()
        if best is not None and val_acc < best[1] - rcfg.regress_threshold:
          rollback(f"validation accuracy {val_acc:.3f} fell below the best shadow's "
                   f"{best[1]:.3f} by more than {rcfg.regress_threshold}")
        else:
          shadows.save(step, state.params, val_acc)
      if n_val and sum(nonfinite_recent) >= rcfg.nonfinite_limit:
        rollback(f"{sum(nonfinite_recent)} of the last {len(nonfinite_recent)} updates had "
                 "non-finite gradients")
      if step % sao.param_sync_every == 0:
        publisher.publish(step, state.params)
      snapshot(metrics=None if val_acc is None else {ckpt_lib.BEST_METRIC: val_acc})
      if pending_commit is not None and not mngr.is_saving_in_progress():
        pool.learner.commit_positions(pending_commit)  # only what a finished snapshot holds
        pending_commit = None
      rss_peak = max(rss_peak, process_tree_rss_mb([os.getpid(), *pool.pids()]))
      wall = time.time() - t_loop
      hist = np.bincount(np.minimum(staleness, STALENESS_BINS - 1), minlength=STALENESS_BINS)
      row = dict(metrics, accuracy=float(metrics["reward"]),
                 staleness_mean=float(staleness.mean()), staleness_max=int(staleness.max()),
                 staleness_hist=hist.tolist(), learner_busy=busy / max(wall, 1e-9),
                 queue_depth=len(buffer), outstanding_tasks=outstanding,
                 delay_mean=float(np.mean(delays[-bs:])) if delays else None,
                 learner_time=t_done - tu,
                 trajectories=counts["consumed"], dropped_stale=counts["dropped_stale"],
                 bad_records=counts["bad_records"], duplicates=counts["duplicates"],
                 nonfinite_total=counts["nonfinite_skipped"], rollbacks=counts["rollbacks"],
                 sampler_restarts=pool.restarts, train_seconds=clock.elapsed,
                 trajectories_per_s=counts["consumed"] / max(wall, 1e-9),
                 peak_memory_mb=peak_memory_mb(), peak_rss_all_mb=rss_peak)
      if val_acc is not None:
        row["val_accuracy"] = val_acc
      train.log_step(writer, clock, cfg, step, state.params, row, "rl")
    wall = time.time() - t_loop
    snapshot(force=True)
    mngr.wait_until_finished()
    pool.learner.commit_positions(pending_commit)
    counts["sampler_restarts"] += pool.restarts
  journal.close()
  ledger.close()
  shadows.close()
  info = train.finish_phase(mngr, state, cfg, clock, step, "rl")
  info.update(trajectories=counts["consumed"], dropped_stale=counts["dropped_stale"],
              bad_records=counts["bad_records"], duplicates=counts["duplicates"],
              unused_at_end=len(buffer), nonfinite_skipped=counts["nonfinite_skipped"],
              rollbacks=counts["rollbacks"], sampler_restarts=counts["sampler_restarts"],
              resumes=counts["resumes"], orphan_version=counts["orphan_version"],
              learner_busy=busy / max(wall, 1e-9),
              learner_busy_steady=(None if steady_mark is None or wall <= steady_mark[1] else
                                   (busy - steady_mark[0]) / (wall - steady_mark[1])),
              trajectories_per_s=counts["consumed"] / max(wall, 1e-9),
              tokens_per_s=counts["tokens"] / max(wall, 1e-9), peak_rss_all_mb=rss_peak,
              **train.delay_stats(delays))
  if resume_info is not None:
    info["recovery_s"] = resume_info.get("recovery_s")
  return state, progs, info
