"""A sampler process: policy copy + environments, tasks in, trajectory records out.

Started with the `spawn` method by `sao_jax.runners.samplers.SamplerGroup`. JAX is imported
only inside `sampler_main`, after this process has set its own XLA flags and CPU affinity.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time
import traceback
from typing import Any


class SamplerError(RuntimeError):
  """A sampler process failed or died; the run was stopped."""


@dataclasses.dataclass
class SamplerSpec:
  sampler_id: int
  config: dict  # resolved Config as a dict
  param_dir: str
  transport: Any  # EmbeddedSpec or KafkaSpec: builds this sampler's end of the transport
  seed: int
  threads: int = 0  # XLA intra-op threads (0: default)
  cores: tuple[int, ...] = ()  # CPU affinity (empty: inherit)
  compile_cache: str = "off"  # see sao_jax.startup.enable_compile_cache
  tasks: tuple | None = None  # (train, test) as the learner loaded them; None: load here
  # The run's key (sao_jax.transport.auth): records sealed with it, published parameters
  # checked against it. Held in memory only; never in `config`.
  key: bytes | None = dataclasses.field(default=None, repr=False)


def _configure_process(spec: SamplerSpec):
  import faulthandler
  import logging
  import signal

  faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 PID`: stacks to stderr
  logging.getLogger("kafka").setLevel(logging.ERROR)  # reconnect chatter; errors still show
  flags = [
    f
    for f in os.environ.get("XLA_FLAGS", "").split()
    if not f.startswith("--xla_force_host_platform_device_count")
  ]
  if spec.threads:
    flags += ["--xla_cpu_multi_thread_eigen=false", f"intra_op_parallelism_threads={spec.threads}"]
  os.environ["XLA_FLAGS"] = " ".join(flags)
  if spec.cores:
    from sao_jax.procs import pin_process

    pin_process(spec.cores)


# A sampler asked to drain finishes its in-flight trajectories within this long (the group
# waits 30 s before it terminates a sampler).
DRAIN_S = 20.0


def sampler_main(spec: SamplerSpec, stop, errors, drain=None) -> None:
  """Loop: newest params -> up to `sampler_slots` tasks -> one batch of trajectories.
  When `stop` is set the sampler exits; if `drain` is set too, it first finishes and sends
  the trajectories it has in flight."""
  _configure_process(spec)
  end = None
  try:
    end = spec.transport.sampler_end()
    _run(spec, end, stop, drain)
  except KeyboardInterrupt:
    pass
  except BaseException:
    errors.put(f"sampler {spec.sampler_id}:\n{traceback.format_exc()}")
  finally:
    if end is not None:
      end.close()


def _run(spec: SamplerSpec, end, stop, drain=None) -> None:
  import multiprocessing

  import jax

  from sao_jax import config as config_lib
  from sao_jax.config import MeshConfig
  from sao_jax.runners.compiled import compile_sampler, compile_slots
  from sao_jax.setup import make_setup
  from sao_jax.sharding import make_mesh
  from sao_jax.startup import enable_compile_cache
  from sao_jax.transport.params import ParamSubscriber, unflatten

  cfg = config_lib.from_dict(spec.config)
  enable_compile_cache(spec.compile_cache)
  s = make_setup(cfg, tasks=spec.tasks)
  mesh = make_mesh(MeshConfig(shape=(1, 1, 1)), jax.devices()[:1])
  kw = dict(
    max_new_tokens=cfg.rl.max_new_tokens,
    temperature=cfg.rl.temperature,
    eos_id=s.tok.eos_id,
    pad_id=s.tok.pad_id,
  )
  progs = compile_sampler(cfg, s.policy, mesh=mesh, **kw)
  sub = ParamSubscriber(spec.param_dir, key=spec.key)
  parent = multiprocessing.parent_process()
  poisoner = None
  if spec.sampler_id == 0 and cfg.faults.poison_records and cfg.faults.poison_kinds:
    from sao_jax.admission import Poisoner

    poisoner = Poisoner(
      cfg.faults,
      vocab_size=s.model.cfg.vocab_size,
      reward_high=lambda i: s.family.reward_range(s.train[i])[1],
      unknown_task=len(s.train) - 1,
    )  # the validation tail's last
  out = _Outbox(spec, end, poisoner)
  current = (-1, -1)  # (lineage, version) of the parameters held

  def poll():
    """(lineage, version, params) of a policy other than the one held, or None."""
    nonlocal current
    got = sub.poll(current)
    if got is None:
      return None
    lineage, version, flat = got
    current = (lineage, version)
    params = jax.device_put(unflatten(progs.abstract_params, flat), progs.params_sharding)
    return lineage, version, params

  def learner_alive() -> bool:
    return parent is None or parent.is_alive()

  def alive() -> bool:
    # The learner gone (e.g. kill -9): nothing to deliver to.
    return not stop.is_set() and learner_alive()

  def draining() -> bool:
    return drain is not None and drain.is_set() and learner_alive()

  if cfg.sao.continuous:  # (text policies only: `sao_jax.setup` refuses it with memory)
    progs = compile_slots(
      cfg, s.model, progs, slots=cfg.sao.sampler_slots, prompt_len=s.prompt_len, **kw
    )
    _run_continuous(spec, cfg, s, progs, poll, alive, end, out, draining)
  else:
    _run_batches(spec, cfg, s, progs, poll, alive, end, out)


class _Outbox:
  """Encodes finished trajectories as records (ids unique across samplers on any machine:
  a random prefix per process) and puts them on the transport."""

  def __init__(self, spec: SamplerSpec, end, poisoner=None):
    self.spec, self.end = spec, end
    self.key = spec.key
    self.id_prefix = int.from_bytes(os.urandom(3), "little") << 40
    self.counter = 0
    self.poisoner = poisoner  # fault injection (sao_jax.admission.Poisoner) or None

  def _meta(self, **meta) -> dict:
    return dict(meta, sampler=self.spec.sampler_id, pid=os.getpid(), host=socket.gethostname())

  def send(self, traj) -> None:
    from sao_jax.transport import records

    meta = self._meta(
      lineage=traj.lineage,
      task_index=traj.task_index,
      task_id=traj.task_id,
      handout=self.end.handout_for(traj.task_index),
      reward=traj.total_reward,
      t_end=traj.t_end,
      done=traj.done,
      reward_s=traj.reward_seconds,
      sandbox_runs=sum(info.get("sandbox_runs", 0) for info in traj.infos),
    )  # who, should it misbehave
    out = [(traj.arrays(), meta, traj.policy_version)]
    if self.poisoner is not None:
      out = self.poisoner(*out[0])
    for arrays, m, version in out:
      self._put(records.RecordKind.TRAJECTORY, version, arrays, m)

  def send_episode(self, traj, task_index: int, version: int, t_end: float, lineage: int):
    """An episode of either policy as its record kind (a text `Trajectory` carries its own
    task, version, lineage and end time)."""
    from sao_jax.rollout import Trajectory

    if isinstance(traj, Trajectory):
      self.send(traj)
    else:
      self.send_long(traj, task_index, version, t_end, lineage)

  def send_long(self, traj, task_index: int, version: int, t_end: float, lineage: int) -> None:
    """A `LongTrajectory` of the policy with compressed memory (bank and graveyard
    included), as a LONG_TRAJECTORY record of its layout."""
    from sao_jax.compression.rollout import LAYOUT
    from sao_jax.transport import records

    meta = self._meta(
      lineage=lineage,
      layout=LAYOUT,
      task_index=task_index,
      task_id=traj.task_id,
      handout=self.end.handout_for(task_index),
      reward=float(traj.rewards.sum()),
      accuracy=traj.accuracy,
      t_end=t_end,
      done=True,
      tokens_total=traj.tokens_total,
    )
    self._put(records.RecordKind.LONG_TRAJECTORY, version, traj.arrays(version), meta)

  def _put(self, kind, version: int, arrays: dict, meta: dict) -> None:
    from sao_jax.transport import auth, records

    self.counter += 1
    data = records.encode(kind, self.id_prefix | self.counter, version, arrays, meta)
    self.end.put_trajectory(auth.seal(self.key, data))


class _Held:
  """The policy a batch sampler holds: (lineage, version, params), updated by `refresh`."""

  def __init__(self, poll):
    self.poll = poll
    self.lineage, self.version, self.params = -1, -1, None

  def refresh(self) -> bool:
    """Takes the announced policy if it is another one; True when its lineage changed."""
    got = self.poll()
    if got is None:
      return False
    moved = self.params is not None and got[0] != self.lineage
    self.lineage, self.version, self.params = got
    return moved


def _calls(slots: int, held: _Held, alive, end, sample) -> None:
  """The calls of a batch sampler: up to `slots` tasks each, taken once parameters have
  arrived, sampled by `sample(held, indices)` (-> what to send, sent by the caller) with the
  newest parameters published by then. A call during which the learner began a new lineage
  (resumed or rolled back) is sampled again under it before anything of it is sent
  (`sao_jax.lineage`). Yields (held, indices, what to send); the caller sends it and
  acknowledges the call's tasks before asking for the next."""
  while alive():
    held.refresh()
    if held.params is None:
      time.sleep(0.05)
      continue
    indices = end.get_tasks(slots, timeout=0.2)
    if not indices:
      continue
    held.refresh()  # a learner that publishes before handing out tasks is seen at once
    out = sample(held, indices)
    while held.refresh() and alive():  # of a discarded lineage: never sent
      out = sample(held, indices)
    yield held, indices, out


def _run_batches(spec, cfg, s, progs, poll, alive, end, out) -> None:
  """Calls of `sampler_slots` tasks, each decoded until its slowest slot is done
  (`Policy.play`: a whole episode per slot, one policy version throughout), then sent."""
  import jax

  key = jax.random.key(spec.seed)
  slots = cfg.sao.sampler_slots

  def sample(held, indices):
    nonlocal key
    key, sub_key = jax.random.split(key)
    tasks = [s.train[i] for i in indices]
    return s.policy.play(
      s,
      progs,
      held.params,
      tasks,
      indices,
      slots=slots,
      rng=sub_key,
      version=held.version,
      lineage=held.lineage,
    )

  for held, indices, trajs in _calls(slots, _Held(poll), alive, end, sample):
    t_end = time.time()
    for i, traj in zip(indices, trajs, strict=True):
      out.send_episode(traj, i, held.version, t_end, held.lineage)
    end.ack_tasks()


def _run_continuous(spec, cfg, s, progs, poll, alive, end, out, draining=lambda: False) -> None:
  """Continuous batching: slots refilled as completions end, trajectories sent as they
  finish; tasks acknowledged in the order they were taken, as soon as every earlier one is
  done, so a crash redelivers exactly the unfinished ones."""
  import collections

  from sao_jax.rollout import ContinuousSampler

  sampler = ContinuousSampler(
    lambda p, st, pr, pv, sl: progs.fill(p, st, pr, pv, sl),
    lambda p, st, v, k, n: progs.decode(p, st, v, k, n),
    progs.refresh,
    progs.empty_slots(),
    s.tok,
    slots=cfg.sao.sampler_slots,
    refill_rows=cfg.sao.refill_rows,
    prompt_len=s.prompt_len,
    max_steps=s.max_steps,
    make_env=lambda: s.family.make_env(s.tok),
    step_many=s.family.step_many,
    inflight=cfg.sao.inflight,
    seed=spec.seed,
  )
  taken: collections.deque = collections.deque()  # [task index, finished?] in taken order
  while alive():
    got = poll()
    if got is not None:
      _offer(sampler, got)
    if sampler.params is None:
      time.sleep(0.05)
      continue

    def take(n: int):
      # Block briefly only when nothing is in flight (else keep decoding what is there).
      indices = end.get_tasks(n, timeout=0.0 if sampler.active() else 0.2)
      taken.extend([i, False] for i in indices)
      got = poll() if indices else None  # a learner that publishes before handing out tasks
      if got is not None:  # (synchronous GRPO) is seen before they start
        _offer(sampler, got)
      return [(i, s.train[i]) for i in indices]

    _deliver(sampler.step(take), taken, end, out)
  # Stopped for a restart of the group: finish what is in flight, take nothing new.
  if not draining() or sampler.params is None:
    return
  deadline, sent, left = time.time() + DRAIN_S, out.counter, sampler.active()
  while sampler.active() and draining() and time.time() < deadline:
    _deliver(sampler.step(lambda n: []), taken, end, out)
  print(
    f"sampler {spec.sampler_id}: sent {out.counter - sent} of {left} in-flight "
    "trajectories before the restart",
    flush=True,
  )


def _offer(sampler, got) -> None:
  lineage, version, params = got
  sampler.offer_params(version, params, lineage=lineage)


def _deliver(finished, taken, end, out) -> None:
  """Sends finished trajectories and acknowledges the tasks taken before every unfinished
  one."""
  for traj in finished:
    out.send(traj)
    for entry in taken:  # the oldest unfinished entry of this task
      if entry[0] == traj.task_index and not entry[1]:
        entry[1] = True
        break
  n = 0
  while taken and taken[0][1]:
    taken.popleft()
    n += 1
  if n:
    end.ack_tasks(n)
