"""`sao-jax sampler`: sampler processes that join a running SAO learner over Kafka.

The learner (`sao-jax learner`, or `sao-jax train` with transport.kind=kafka) announces its
resolved config and parameter directory on `sao.RUN.control`; this role reads that, starts
`--num` sampler processes on this machine, restarts any that die, and stops them when the
learner announces "finished" or on Ctrl-C. The samplers take tasks from the run's task
topic as members of its consumer group, so the load spreads over every machine that joins.
A learner that restarts (a resume after a crash) announces a new incarnation, with its own
task topic and group; the samplers here are restarted to follow it.
"""
from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import pathlib
import queue
import time

from sao_jax import config as config_lib
from sao_jax.procs import stop_processes
from sao_jax.runners.sampler_proc import SamplerError, SamplerSpec, sampler_main
from sao_jax.transport.broker import wait_until_answers
from sao_jax.transport.kafka import _CLIENT, KafkaSpec


def run_sampler_role(bootstrap: str, run_id: str, num: int = 1, threads: int = 0,
                     max_restarts: int = 5, wait_s: float = 60.0) -> int:
  wait_until_answers(bootstrap, timeout=10.0)
  spec = KafkaSpec(bootstrap=bootstrap, run_id=run_id)
  spec.create_topics(only=("control",))  # so that the read below sees a later announcement
  print(f"sampler: waiting for run {run_id} at {bootstrap} (up to {wait_s:.0f} s)", flush=True)
  control = spec.read_control(timeout=wait_s)
  if control is None:
    raise config_lib.ConfigError(
        f"no SAO run {run_id!r} at {bootstrap}: nothing announced on {spec.topic('control')} "
        f"within {wait_s:.0f} s (is the learner running, with this run id?)")
  if control.get("status") == "finished":
    print(f"run {run_id} has already finished", flush=True)
    return 0
  ctx = mp.get_context("spawn")
  errors = ctx.Queue()
  base_seed = int.from_bytes(os.urandom(3), "little")
  run = _Incarnation(ctx, control, bootstrap, run_id, threads)  # raises if params unseen

  from kafka import KafkaConsumer, TopicPartition
  watcher = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                          auto_offset_reset="latest", fetch_max_wait_ms=200, **_CLIENT)
  watcher.assign([TopicPartition(spec.topic("control"), 0)])
  procs = [run.spawn(i, base_seed + i, errors) for i in range(num)]
  restarts = 0
  print(f"sampler: {num} process(es) joined run {run_id} at {bootstrap}; Ctrl-C stops them",
        flush=True)
  try:
    while True:
      with contextlib.suppress(queue.Empty):
        raise SamplerError(f"a sampler failed:\n{errors.get_nowait()}")
      for i, p in enumerate(procs):
        if p.exitcode not in (None, 0):
          if restarts >= max_restarts:
            raise SamplerError(f"{p.name} died with exit code {p.exitcode} after {restarts} "
                               "restarts; stopping")
          restarts += 1
          print(f"sampler: {p.name} died ({p.exitcode}); restarting it", flush=True)
          procs[i] = run.spawn(i, base_seed + 1000 * restarts + i, errors)
      for recs in watcher.poll(timeout_ms=1000).values():
        for r in recs:
          try:
            news = json.loads(r.value)
          except (ValueError, TypeError):
            continue  # not an announcement
          if news.get("status") == "finished":
            print(f"sampler: run {run_id} finished", flush=True)
            return 0
          if news.get("status") == "running" and news.get("incarnation") != run.incarnation:
            # The learner restarted (e.g. resumed after a crash): its tasks now come on a
            # new topic, to a new group. Follow it with fresh processes.
            print(f"sampler: the learner of run {run_id} restarted (incarnation "
                  f"{news.get('incarnation')}); following it", flush=True)
            run.stop.set()
            stop_processes(procs)
            run = _Incarnation(ctx, news, bootstrap, run_id, threads)
            procs = [run.spawn(i, base_seed + i, errors) for i in range(num)]
      time.sleep(0.2)
  finally:
    run.stop.set()
    stop_processes(procs)
    errors.cancel_join_thread()
    errors.close()
    watcher.close()


class _Incarnation:
  """One learner start as announced on the control topic: what its samplers need."""

  def __init__(self, ctx, control: dict, bootstrap: str, run_id: str, threads: int):
    self.cfg = config_lib.from_dict(control["config"])
    self.param_dir = pathlib.Path(control["param_dir"])
    if not self.param_dir.is_dir():
      raise config_lib.ConfigError(
          f"the run's parameter directory {self.param_dir} is not visible from this machine; "
          "mount the learner's workdir at the same path (shared storage)")
    self.incarnation = control.get("incarnation", "")
    self.spec = KafkaSpec(bootstrap=bootstrap, run_id=run_id,
                          partitions=int(control["partitions"]), incarnation=self.incarnation)
    self.ctx, self.threads = ctx, threads
    self.stop = ctx.Event()

  def spawn(self, i: int, seed: int, errors) -> mp.Process:
    s = SamplerSpec(sampler_id=i, config=config_lib.to_dict(self.cfg),
                    param_dir=str(self.param_dir), transport=self.spec, seed=seed,
                    threads=self.threads or self.cfg.sao.sampler_threads)
    p = self.ctx.Process(target=sampler_main, name=f"sao-remote-sampler-{i}",
                         args=(s, self.stop, errors), daemon=True)
    p.start()
    return p
