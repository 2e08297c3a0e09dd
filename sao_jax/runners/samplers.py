"""Sampler processes: one supervisor for every place that runs them, and the learner's pool.

`SamplerGroup` starts K sampler processes (spawn), reports an exception raised in any of them,
restarts one that died (kill -9, the OOM killer) up to a budget, and stops them all; the
embedded pool of `sao-jax train` and `sao-jax sampler` (which joins a run over Kafka) both
use it. `SamplerPool` is the learner's side: the transport (multiprocessing queues, or Kafka
on a given cluster or a local broker started here) plus a group of local samplers.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pathlib
import queue
import socket
import sys
import time
import uuid
from collections.abc import Callable

from sao_jax import config as config_lib
from sao_jax import storage
from sao_jax.procs import pin_process, stop_processes
from sao_jax.runners.sampler_proc import SamplerError, SamplerSpec, sampler_main
from sao_jax.transport import auth, kafka_security
from sao_jax.transport.base import EmbeddedSpec
from sao_jax.transport.broker import BrokerError, LocalBroker, wait_until_answers
from sao_jax.transport.kafka import KafkaSpec


class SamplerGroup:
  """`num` sampler processes built from `make_spec(index, restarts_so_far)`."""

  def __init__(
    self,
    ctx,
    make_spec: Callable[[int, int], SamplerSpec],
    num: int,
    max_restarts: int,
    name: str = "sao-sampler",
  ):
    self.ctx, self.make_spec, self.num = ctx, make_spec, num
    self.max_restarts, self.name = max_restarts, name
    self.errors = ctx.Queue()
    self.stop = ctx.Event()
    # Set with `stop` when the group is restarted: samplers finish and send the trajectories
    # they have in flight before they exit (at close they just exit).
    self.drain = ctx.Event()
    self.procs: list[mp.Process] = []
    self.restarts = 0

  def _spawn(self, i: int) -> mp.Process:
    p = self.ctx.Process(
      target=sampler_main,
      name=f"{self.name}-{i}",
      args=(self.make_spec(i, self.restarts), self.stop, self.errors, self.drain),
      daemon=True,
    )
    p.start()
    return p

  def start(self) -> SamplerGroup:
    self.procs = [self._spawn(i) for i in range(self.num)]
    return self

  def dead(self) -> list[int]:
    """Indices of samplers that died; raises SamplerError if one reported an exception (a
    bug that a restart would repeat)."""
    with contextlib.suppress(queue.Empty):
      raise SamplerError(f"a sampler failed:\n{self.errors.get_nowait()}")
    if self.stop.is_set():
      return []
    return [i for i, p in enumerate(self.procs) if p.exitcode not in (None, 0)]

  def count_restarts(self, dead: list[int]) -> None:
    """Charges `dead` to the restart budget; SamplerError when it is spent."""
    for i in dead:
      p = self.procs[i]
      if self.restarts >= self.max_restarts:
        raise SamplerError(
          f"{p.name} died with exit code {p.exitcode} and the run already "
          f"restarted {self.restarts} samplers (samplers.max_restarts); "
          "run stopped"
        )
      self.restarts += 1
      print(
        f"sao: {p.name} died with exit code {p.exitcode}; restarting it "
        f"({self.restarts}/{self.max_restarts})",
        flush=True,
      )

  def restart(self, dead: list[int]) -> None:
    self.count_restarts(dead)
    for i in dead:
      self.procs[i] = self._spawn(i)

  def replace_all(self, make_spec: Callable[[int, int], SamplerSpec] | None = None) -> None:
    """Stops every sampler (they finish and send their current call) and starts them again,
    from `make_spec` if given (a new transport or learner incarnation)."""
    self.drain.set()
    self.stop.set()
    stop_processes(self.procs, timeout=30)
    self.stop, self.drain = self.ctx.Event(), self.ctx.Event()
    if make_spec is not None:
      self.make_spec = make_spec
    self.start()

  def alive(self) -> int:
    return sum(p.is_alive() for p in self.procs)

  def pids(self) -> list[int]:
    return [p.pid for p in self.procs if p.pid is not None]

  def close(self) -> None:
    self.stop.set()
    stop_processes(self.procs)
    self.errors.cancel_join_thread()
    self.errors.close()


def new_run_id(cfg: config_lib.Config) -> str:
  return f"{cfg.name}-{time.strftime('%Y%m%d%H%M%S')}-{os.getpid()}"


class SamplerPool:
  """The learner's transport and its local sampler processes; a context manager that always
  cleans up (processes, queues, and the local broker if it started one)."""

  def __init__(
    self,
    cfg: config_lib.Config,
    param_dir: pathlib.Path | str,
    run_id: str = "",
    tasks: tuple | None = None,
    compile_cache: str | None = None,
    key: bytes | None = None,
    key_file: pathlib.Path | None = None,
  ):
    """`param_dir`: where parameter versions are published (a directory or a bucket URL).
    `tasks`: (train, test) as the learner loaded them, handed to local samplers so that
    they do not load them again (None: each sampler loads them). `compile_cache`: the
    persistent compilation cache directory the samplers share with the learner (None: off).
    `key_file`: where the run's key is (named in the hint for remote samplers)."""
    self.ctx = mp.get_context("spawn")
    self.cfg, self.param_dir, self.run_id, self.tasks = cfg, param_dir, run_id, tasks
    self.compile_cache = compile_cache or "off"
    self.key = key  # the run's key: the samplers seal their records with it
    self.key_file = key_file or pathlib.Path(param_dir).parent / auth.KEY_FILE
    self.broker = None
    self.transport = None
    self.learner = None
    sam = cfg.samplers
    self.cores: list[tuple[int, ...]] = [()] * sam.num
    self.learner_cores: tuple[int, ...] = ()
    self.allowed_cores = sorted(os.sched_getaffinity(0))  # restored on exit
    if sam.pin_cores:
      allowed = self.allowed_cores
      if len(allowed) < 2:
        raise config_lib.ConfigError("samplers.pin_cores needs at least 2 CPU cores")
      self.learner_cores = (allowed[0],)
      rest = allowed[1:]
      self.cores = [tuple(rest[i :: sam.num]) or tuple(rest) for i in range(sam.num)]
    self.group = SamplerGroup(self.ctx, self._spec_maker(), sam.num, sam.max_restarts)

  def _spec_maker(self):
    transport, cfg = self.transport, self.cfg

    def make(i: int, restarts: int) -> SamplerSpec:
      return SamplerSpec(
        sampler_id=i,
        config=config_lib.to_dict(cfg),
        param_dir=str(self.param_dir),
        transport=transport,
        seed=cfg.seed * 1000 + i + 7919 * restarts,
        threads=cfg.samplers.threads,
        cores=self.cores[i],
        compile_cache=self.compile_cache,
        tasks=self.tasks,
        key=self.key,
      )

    return make

  def _make_transport(self):
    t = self.cfg.transport
    if t.kind == "embedded":
      return EmbeddedSpec(self.ctx)
    bootstrap = t.bootstrap_servers
    try:
      security = kafka_security.from_config(t)
    except kafka_security.SecurityError as err:
      raise config_lib.ConfigError(f"transport: {err}") from None
    if not bootstrap:
      if security:
        raise config_lib.ConfigError(
          "transport.security_protocol applies to a broker of yours "
          "(transport.bootstrap_servers); the local broker a run starts listens on loopback only"
        )
      self.broker = LocalBroker().start()
      bootstrap = self.broker.bootstrap
    else:
      wait_until_answers(bootstrap, timeout=10.0, security=security)
    run_id = self.run_id or t.run_id or new_run_id(self.cfg)
    spec = KafkaSpec(
      bootstrap=bootstrap,
      run_id=run_id,
      partitions=t.partitions,
      broker_timeout_s=t.broker_timeout_s,
      incarnation=uuid.uuid4().hex[:8],
      key=self.key,
      security=security,
    )
    spec.create_topics()
    spec.announce(
      {
        "status": "running",
        "config": config_lib.to_dict(self.cfg),
        "param_dir": str(
          self.param_dir
          if storage.is_remote(self.param_dir)
          else pathlib.Path(self.param_dir).absolute()
        ),
        "partitions": t.partitions,
        "incarnation": spec.incarnation,
      }
    )
    key_note = (
      f" --key-file {self.key_file} (a copy of the run's key)" if self.key is not None else ""
    )
    print(
      f"sao: kafka transport at {bootstrap}, run id {run_id}; more samplers can join with: "
      f"sao-jax sampler --bootstrap {bootstrap} --run-id {run_id}{key_note}",
      flush=True,
    )
    return spec

  def __enter__(self):
    try:
      self.transport = self._make_transport()
      self.learner = self.transport.learner_end()
      self.group.make_spec = self._spec_maker()
      self.group.start()
      if self.learner_cores:
        pin_process(self.learner_cores)
    except BaseException:
      self.__exit__(*sys.exc_info())
      raise
    return self

  def check(self) -> list[bytes] | None:
    """Restarts samplers that died, within `samplers.max_restarts` per run (SamplerError
    beyond that, or on an exception in a sampler).

    On Kafka the dead sampler alone is restarted; the group gives its unacknowledged tasks to
    the others. On the embedded transport a process killed while it held a queue's lock can
    block that queue for everyone, so the sampler group restarts on fresh queues: the live
    samplers finish and send their current call first, and the records still in the old
    queue are returned to the caller. Returns None if nothing died, else those records
    (and the caller's count of tasks in flight starts again from zero).
    """
    dead = self.group.dead()
    if not dead:
      if self.learner is not None:
        self.learner.check()  # the transport itself (Kafka: a lost broker -> BrokerError)
      return None
    if self.cfg.transport.kind != "embedded":
      self.group.restart(dead)
      return []
    self.group.count_restarts(dead)
    old = self.transport
    self.group.drain.set()  # the live samplers send what they have in flight, then exit
    self.group.stop.set()
    stop_processes(self.group.procs, timeout=30)
    leftovers = []
    with contextlib.suppress(queue.Empty):
      while True:
        leftovers.append(old.traj_q.get(timeout=0.2))
    old.close()
    self.transport = EmbeddedSpec(self.ctx)
    self.learner = self.transport.learner_end()
    self.group.replace_all(self._spec_maker())
    return leftovers

  def stop_local(self, meta: dict) -> bool:
    """Stops the local sampler that wrote a record with this meta (pid and host), if it is
    one of ours: `check` then restarts it as a dead sampler (a fresh process, within
    samplers.max_restarts). Returns whether one was stopped."""
    if meta.get("host") != socket.gethostname():
      return False
    for p in self.group.procs:
      if p.pid is not None and p.pid == meta.get("pid") and p.is_alive():
        print(f"sao: stopping quarantined {p.name} (pid {p.pid})", flush=True)
        p.kill()
        p.join(timeout=10)
        return True
    return False

  def __exit__(self, exc_type, *exc):
    broker_lost = exc_type is not None and issubclass(exc_type, BrokerError)
    if isinstance(self.transport, KafkaSpec) and not broker_lost:
      # (After a lost broker the announcement could not arrive, and trying costs the
      # producer's whole blocking budget; remote samplers find the lost broker themselves.)
      with contextlib.suppress(Exception):
        self.transport.announce({"status": "finished"})  # remote samplers stop
    self.group.close()
    if isinstance(self.transport, KafkaSpec) and exc_type is None and self.broker is None:
      # A clean finish: no incarnation's tasks will be read again. (A run's own local broker
      # takes its topics with it anyway.)
      with contextlib.suppress(Exception):
        self.transport.delete_task_topics()
    for closer in (self.learner, self.transport):
      if closer is not None:
        with contextlib.suppress(Exception):
          closer.close()
    if self.broker is not None:
      self.broker.stop()
    if self.learner_cores:
      pin_process(self.allowed_cores)
    return False

  @property
  def restarts(self) -> int:
    return self.group.restarts

  def pids(self) -> list[int]:
    return self.group.pids()
