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

import jax
import numpy as np

from sao_jax import checkpoint as ckpt_lib
from sao_jax import config as config_lib
from sao_jax.learner import TrainState, make_sao_update
from sao_jax.metrics import MetricsWriter, peak_memory_mb
from sao_jax.rl import trackers
from sao_jax.runners import train
from sao_jax.runners.sampler_proc import SamplerError, SamplerSpec, sampler_main
from sao_jax.transport import records
from sao_jax.transport.base import EmbeddedSpec
from sao_jax.transport.broker import LocalBroker, wait_until_answers
from sao_jax.transport.kafka import KafkaSpec
from sao_jax.transport.params import ParamPublisher

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


class SamplerPool:
  """K sampler processes and the transport to them; a context manager that always cleans up
  (processes, queues, and the local broker if it started one)."""

  def __init__(self, cfg: config_lib.Config, param_dir: pathlib.Path):
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
    self.procs: list[mp.Process] = []
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
    run_id = t.run_id or f"{self.cfg.name}-{time.strftime('%Y%m%d%H%M%S')}-{os.getpid()}"
    spec = KafkaSpec(bootstrap=bootstrap, run_id=run_id, partitions=t.partitions,
                     broker_timeout_s=t.broker_timeout_s)
    spec.create_topics()
    print(f"sao: kafka transport at {bootstrap}, run id {run_id}", flush=True)
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

  def _start_samplers(self):
    sao = self.cfg.sao
    for i in range(sao.num_samplers):
      spec = SamplerSpec(sampler_id=i, config=config_lib.to_dict(self.cfg),
                         param_dir=str(self.param_dir), transport=self.transport,
                         seed=self.cfg.seed * 1000 + i, threads=sao.sampler_threads,
                         cores=self.cores[i])
      p = self.ctx.Process(target=sampler_main, name=f"sao-sampler-{i}",
                           args=(spec, self.stop, self.errors), daemon=True)
      p.start()
      self.procs.append(p)
    if self.learner_cores:
      os.sched_setaffinity(0, self.learner_cores)

  def check(self):
    """Raises if a sampler reported an error or died, or the transport is lost."""
    with contextlib.suppress(queue.Empty):
      raise SamplerError(f"a sampler failed:\n{self.errors.get_nowait()}")
    for p in self.procs:
      if p.exitcode not in (None, 0):
        raise SamplerError(f"{p.name} died with exit code {p.exitcode}; run stopped")
    if self.learner is not None:
      self.learner.check()

  def __exit__(self, *exc):
    self.stop.set()
    deadline = time.time() + 10
    for p in self.procs:
      p.join(timeout=max(0.1, deadline - time.time()))
    for p in self.procs:
      if p.is_alive():
        p.terminate()
        p.join(timeout=5)
      if p.is_alive():
        p.kill()
        p.join()
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


def _pad_rows(rows: list[dict], n: int) -> dict[str, np.ndarray]:
  out = {k: np.stack([r[k] for r in rows]) for k in rows[0]}
  if len(rows) < n:
    out = {k: np.concatenate([v, np.zeros((n - len(rows),) + v.shape[1:], v.dtype)])
           for k, v in out.items()}
  return out


def _check_trajectory(rec: records.Record, widths: tuple[int, int], num_tasks: int) -> None:
  """Raises `records.Malformed` unless `rec` carries what the batch is built from, in the
  shapes it is compiled for: a well-formed record from a foreign writer (other config or code
  version) must be dropped like a corrupt one, not crash the learner."""
  a, m = rec.arrays, rec.meta
  for names, width in zip((("prompt", "prompt_valid"), ("tokens", "valid", "logp")), widths,
                          strict=True):
    for k in names:
      if k not in a or a[k].ndim != 2 or a[k].shape[1] != width or len(a[k]) < 1:
        raise records.Malformed(f"trajectory array {k!r} missing or not [steps, {width}]: "
                                f"{a[k].shape if k in a else None}")
  if len({len(a[k]) for k in ("prompt", "prompt_valid", "tokens", "valid", "logp")}) != 1:
    raise records.Malformed("trajectory arrays disagree on the number of steps")
  numbers = [m.get(k) for k in ("reward", "t_end")]
  if not (all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in numbers)
          and isinstance(m.get("task_index"), int) and 0 <= m["task_index"] < num_tasks):
    raise records.Malformed(f"trajectory meta lacks a valid reward/t_end/task_index: {m}"[:300])


def _decode(data: bytes, learner, counts, expect: tuple | None = None) -> records.Record | None:
  """A trajectory record, or None for one that is malformed (counted, dead-lettered, and
  logged the first time) or of another kind. With `expect` (`(prompt_len, completion_len)`,
  number of tasks), a record must also fit the learner's batch (`_check_trajectory`)."""
  try:
    rec = records.decode(data)
    if rec.kind != records.RecordKind.TRAJECTORY:
      raise records.Malformed(f"expected a trajectory record, got {rec.kind.name}")
    if expect is not None:
      _check_trajectory(rec, *expect)
    return rec
  except records.RecordError as err:
    counts["bad_records"] += 1
    if counts["bad_records"] == 1:
      print(f"sao: skipping a malformed trajectory record ({err}); further ones are only "
            "counted (bad_records) and copied to the dead-letter topic", flush=True)
    learner.dead_letter(data, str(err))
    return None


def run_sao(s: train.Setup, writer: MetricsWriter, state: TrainState, workdir: pathlib.Path, *,
            max_seconds: float | None = None, eval_every: float = 0.0) -> tuple:
  """Asynchronous single-trajectory training from `state`'s params. Returns like run_grpo."""
  cfg, rl, sao = s.cfg, s.cfg.rl, s.cfg.sao
  max_seconds = rl.max_seconds if max_seconds is None else max_seconds
  progs = train.programs_for(s, rl.optim, lambda m, tx: make_sao_update(m, tx, rl, sao),
                             num_tasks=len(s.train))
  fresh = progs.init(jax.random.key(cfg.seed + 1))
  state = fresh.replace(params=train.copy_tree(state.params))
  bs = train.round_up(sao.batch_size, progs.batch_divisor)
  param_dir = workdir / "params"
  shutil.rmtree(param_dir, ignore_errors=True)
  publisher = ParamPublisher(param_dir)
  publisher.publish(0, state.params)
  mngr = ckpt_lib.manager(workdir / "checkpoints" / "rl", every=cfg.checkpoint_every)
  rng = np.random.default_rng((cfg.seed, 3))
  clock = train.PhaseClock(rl.steps, max_seconds, eval_every,
                           lambda params: train.evaluate(s, progs, params))
  writer.progress("sao", rl.steps or None)

  counts = collections.Counter()
  seen_ids: set[int] = set()
  buffer: list[tuple[records.Record, float]] = []
  delays: list[float] = []
  busy = 0.0
  step = 0
  outstanding = 0  # tasks handed out and not yet returned
  # Enough tasks in flight to fill the next batch while every sampler holds a full call's worth.
  target_depth = bs + 2 * sao.num_samplers * sao.sampler_slots
  probs = None
  rss_peak = 0.0
  expect = ((s.prompt_len, rl.max_new_tokens), len(s.train))
  with SamplerPool(cfg, param_dir) as pool:
    clock.maybe_eval(step, state.params, force=bool(eval_every))
    t_loop = time.time()
    while clock.running(step):
      pool.check()
      if sao.prioritized and (probs is None or step % 10 == 0):
        p64 = np.asarray(jax.device_get(trackers.priority_weights(state.tracker,
                                                                  sao.priority_eps)), np.float64)
        probs = p64 / p64.sum()
      # Gather what has arrived; block (briefly) only while a batch is not full. Tasks are
      # topped up on every pass, so samplers keep working while the learner waits or updates.
      while len(buffer) < bs:
        new = rng.choice(len(s.train), size=max(0, target_depth - outstanding), p=probs)
        pool.learner.put_tasks(new.tolist())
        outstanding += len(new)
        got = pool.learner.get_trajectories(bs - len(buffer), timeout=0.05)
        if not got:
          pool.check()
          continue
        for data in got:
          rec = _decode(data, pool.learner, counts, expect)
          if rec is None:
            continue
          if rec.record_id in seen_ids:  # redelivered: its task was already counted back
            counts["duplicates"] += 1
            continue
          seen_ids.add(rec.record_id)
          outstanding -= 1
          if step - rec.policy_version > sao.max_staleness:
            counts["dropped_stale"] += 1
            continue
          buffer.append((rec, time.time()))
      batch_recs, buffer = buffer[:bs], buffer[bs:]
      rows = []
      for rec, _ in batch_recs:
        a = rec.arrays
        for k in range(a["tokens"].shape[0]):  # one row per environment step
          rows.append({"prompt": a["prompt"][k], "prompt_valid": a["prompt_valid"][k],
                       "tokens": a["tokens"][k], "valid": a["valid"][k], "logp": a["logp"][k],
                       "rewards": np.float32(rec.meta["reward"]),
                       "task": np.int32(rec.meta["task_index"]),
                       "staleness": np.int32(step - rec.policy_version),
                       "row_valid": np.bool_(True)})
      batch = _pad_rows(rows[:bs], bs)
      staleness = batch["staleness"][batch["row_valid"]]
      tu = time.time()
      state, metrics = progs.update(state, progs.shard_batch(batch))
      metrics = jax.device_get(metrics)
      t_done = time.time()
      busy += t_done - tu
      step += 1
      counts["consumed"] += len(batch_recs)
      counts["tokens"] += int(batch["valid"].sum())
      delays.extend(t_done - rec.meta["t_end"] for rec, _ in batch_recs)
      if not buffer:
        pool.learner.commit()  # every record read so far is applied (or counted as dropped)
      if step % sao.param_sync_every == 0:
        publisher.publish(step, state.params)
      ckpt_lib.save(mngr, state, cfg, {"phase": "rl"})
      rss_peak = max(rss_peak, process_tree_rss_mb([os.getpid(), *pool.pids()]))
      wall = time.time() - t_loop
      hist = np.bincount(np.minimum(staleness, STALENESS_BINS - 1), minlength=STALENESS_BINS)
      row = dict(metrics, accuracy=float(metrics["reward"]),
                 staleness_mean=float(staleness.mean()), staleness_max=int(staleness.max()),
                 staleness_hist=hist.tolist(), learner_busy=busy / max(wall, 1e-9),
                 queue_depth=len(buffer), outstanding_tasks=outstanding,
                 delay_mean=float(np.mean(delays[-bs:])), learner_time=t_done - tu,
                 trajectories=counts["consumed"], dropped_stale=counts["dropped_stale"],
                 bad_records=counts["bad_records"], train_seconds=clock.elapsed,
                 trajectories_per_s=counts["consumed"] / max(wall, 1e-9),
                 peak_memory_mb=peak_memory_mb(), peak_rss_all_mb=rss_peak)
      train.log_step(writer, clock, cfg, step, state.params, row, "rl")
    wall = time.time() - t_loop
  info = train.finish_phase(mngr, state, cfg, clock, step, "rl")
  info.update(trajectories=counts["consumed"], dropped_stale=counts["dropped_stale"],
              bad_records=counts["bad_records"], duplicates=counts["duplicates"],
              learner_busy=busy / max(wall, 1e-9),
              trajectories_per_s=counts["consumed"] / max(wall, 1e-9),
              tokens_per_s=counts["tokens"] / max(wall, 1e-9), peak_rss_all_mb=rss_peak,
              **train.delay_stats(delays))
  return state, progs, info
