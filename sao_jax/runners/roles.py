"""`sao-jax sampler`: sampler processes that join a running SAO learner over Kafka.

The learner (`sao-jax learner`, or `sao-jax train` with transport.kind=kafka) announces its
resolved config and parameter directory on `sao.RUN.control`; this role reads that, starts
`--num` sampler processes on this machine, restarts any that die, and stops them when the
learner announces "finished" or on Ctrl-C. The samplers take tasks from the run's task
topic as members of its consumer group, so the load spreads over every machine that joins.
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
  cfg = config_lib.from_dict(control["config"])
  param_dir = pathlib.Path(control["param_dir"])
  if not param_dir.is_dir():
    raise config_lib.ConfigError(
        f"the run's parameter directory {param_dir} is not visible from this machine; mount "
        "the learner's workdir at the same path (shared storage)")
  spec = KafkaSpec(bootstrap=bootstrap, run_id=run_id, partitions=int(control["partitions"]))
  ctx = mp.get_context("spawn")
  stop, errors = ctx.Event(), ctx.Queue()
  base_seed = int.from_bytes(os.urandom(3), "little")

  def spawn(i: int, generation: int) -> mp.Process:
    s = SamplerSpec(sampler_id=i, config=config_lib.to_dict(cfg), param_dir=str(param_dir),
                    transport=spec, seed=base_seed + 1000 * generation + i,
                    threads=threads or cfg.sao.sampler_threads)
    p = ctx.Process(target=sampler_main, name=f"sao-remote-sampler-{i}",
                    args=(s, stop, errors), daemon=True)
    p.start()
    return p

  from kafka import KafkaConsumer, TopicPartition
  watcher = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                          auto_offset_reset="latest", fetch_max_wait_ms=200, **_CLIENT)
  watcher.assign([TopicPartition(spec.topic("control"), 0)])
  procs = [spawn(i, 0) for i in range(num)]
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
          procs[i] = spawn(i, restarts)
      finished = False
      for recs in watcher.poll(timeout_ms=1000).values():
        for r in recs:
          with contextlib.suppress(ValueError, TypeError):
            finished |= json.loads(r.value).get("status") == "finished"
      if finished:
        print(f"sampler: run {run_id} finished", flush=True)
        return 0
      time.sleep(0.2)
  finally:
    stop.set()
    deadline = time.time() + 10
    for p in procs:
      p.join(timeout=max(0.1, deadline - time.time()))
      if p.is_alive():
        p.kill()
        p.join()
    errors.cancel_join_thread()
    errors.close()
    watcher.close()
