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

import dataclasses
import multiprocessing as mp
import os
import pathlib
import time

from sao_jax import config as config_lib
from sao_jax import storage
from sao_jax.runners.sampler_proc import SamplerSpec
from sao_jax.runners.samplers import SamplerGroup
from sao_jax.transport import auth
from sao_jax.transport.broker import wait_until_answers
from sao_jax.transport.kafka import KafkaSpec


def run_sampler_role(
  bootstrap: str,
  run_id: str,
  num: int = 1,
  threads: int = 0,
  max_restarts: int = 5,
  wait_s: float = 60.0,
  key: bytes | None = None,
  security: dict | None = None,
) -> int:
  """`key`: the run's key (`sao_jax.transport.auth`; `sao-jax sampler --key-file` or
  SAO_JAX_RUN_KEY): without it, a run whose learner seals its messages is not seen at all.
  `security`: this machine's TLS / SASL settings (`kafka_security.settings`; its own file
  paths, not the learner's)."""
  security = security or {}
  wait_until_answers(bootstrap, timeout=10.0, security=security)
  spec = KafkaSpec(bootstrap=bootstrap, run_id=run_id, key=key, security=security)
  spec.create_topics(only=("control",))  # so that the read below sees a later announcement
  print(f"sampler: waiting for run {run_id} at {bootstrap} (up to {wait_s:.0f} s)", flush=True)
  control = spec.read_control(timeout=wait_s)
  if control is None:
    hint = (
      "is the learner running, with this run id?"
      if key is not None
      else "is the learner running, with this run id? A learner seals its announcements "
      "with the run's key: pass --key-file (a copy of its WORKDIR/run.key) or set "
      f"{auth.KEY_ENV}"
    )
    raise config_lib.ConfigError(
      f"no SAO run {run_id!r} at {bootstrap}: nothing announced on {spec.topic('control')} "
      f"within {wait_s:.0f} s that this sampler could read ({hint})"
    )
  if control.get("status") == "finished":
    print(f"run {run_id} has already finished", flush=True)
    return 0
  base_seed = int.from_bytes(os.urandom(3), "little")
  run = _Incarnation(control, spec, threads, base_seed)  # raises if the params are unseen
  watcher = spec.watch_control()
  group = SamplerGroup(
    mp.get_context("spawn"), run.make_spec, num, max_restarts, name="sao-remote-sampler"
  ).start()
  print(
    f"sampler: {num} process(es) joined run {run_id} at {bootstrap}; Ctrl-C stops them", flush=True
  )
  try:
    while True:
      dead = group.dead()
      if dead:
        group.restart(dead)
      for news in watcher.poll(timeout_s=1.0):
        if news.get("status") == "finished":
          print(f"sampler: run {run_id} finished", flush=True)
          return 0
        if news.get("status") == "running" and news.get("incarnation") != run.incarnation:
          # The learner restarted (e.g. resumed after a crash): its tasks now come on a new
          # topic, to a new group. Follow it with fresh processes.
          print(
            f"sampler: the learner of run {run_id} restarted (incarnation "
            f"{news.get('incarnation')}); following it",
            flush=True,
          )
          run = _Incarnation(news, spec, threads, base_seed)
          group.replace_all(run.make_spec)
      time.sleep(0.2)
  finally:
    group.close()
    watcher.close()


class _Incarnation:
  """One learner start as announced on the control topic: what its samplers need."""

  def __init__(self, control: dict, base: KafkaSpec, threads: int, base_seed: int):
    """`base`: the run's address, key and this machine's security settings."""
    self.cfg = config_lib.from_dict(control["config"])
    self.param_dir = control["param_dir"]
    if storage.is_remote(self.param_dir):
      try:  # reachable with this machine's credentials (sao_jax.storage)?
        storage.open_store(self.param_dir).list()
      except storage.StoreError as err:
        raise config_lib.ConfigError(
          f"the run's parameters at {self.param_dir} are out of reach from this machine "
          f"({str(err)[:300]}); set the bucket's credentials (and AWS_ENDPOINT_URL for an "
          "S3-compatible service) in this machine's environment"
        ) from None
    elif not pathlib.Path(self.param_dir).is_dir():
      raise config_lib.ConfigError(
        f"the run's parameter directory {self.param_dir} is not visible from this machine; "
        "mount the learner's workdir at the same path (shared storage), or give the run a "
        "bucket (storage.url)"
      )
    self.incarnation = control.get("incarnation", "")
    self.spec = dataclasses.replace(
      base, partitions=int(control["partitions"]), incarnation=self.incarnation
    )
    self.threads, self.base_seed, self.key = threads, base_seed, base.key

  def make_spec(self, i: int, restarts: int) -> SamplerSpec:
    return SamplerSpec(
      sampler_id=i,
      config=config_lib.to_dict(self.cfg),
      param_dir=self.param_dir,
      transport=self.spec,
      seed=self.base_seed + 1000 * restarts + i,
      threads=self.threads or self.cfg.samplers.threads,
      # (a path or the learner's workdir may not exist on this machine)
      compile_cache="off" if self.cfg.recovery.compile_cache == "off" else "user",
      key=self.key,
    )
