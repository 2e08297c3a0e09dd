"""A sampler process: policy copy + environments, tasks in, trajectory records out.

Started with the `spawn` method by `sao_jax.runners.samplers.SamplerGroup`. JAX is imported
only inside `sampler_main`, after this process has set its own XLA flags and CPU affinity.
"""
from __future__ import annotations

import dataclasses
import os
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


def _configure_process(spec: SamplerSpec):
  import faulthandler
  import logging
  import signal
  faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 PID`: stacks to stderr
  logging.getLogger("kafka").setLevel(logging.ERROR)  # reconnect chatter; errors still show
  flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
           if not f.startswith("--xla_force_host_platform_device_count")]
  if spec.threads:
    flags += ["--xla_cpu_multi_thread_eigen=false",
              f"intra_op_parallelism_threads={spec.threads}"]
  os.environ["XLA_FLAGS"] = " ".join(flags)
  if spec.cores:
    os.sched_setaffinity(0, spec.cores)


def sampler_main(spec: SamplerSpec, stop, errors) -> None:
  """Loop: newest params -> up to `sampler_slots` tasks -> one batch of trajectories."""
  _configure_process(spec)
  end = None
  try:
    end = spec.transport.sampler_end()
    _run(spec, end, stop)
  except KeyboardInterrupt:
    pass
  except BaseException:
    errors.put(f"sampler {spec.sampler_id}:\n{traceback.format_exc()}")
  finally:
    if end is not None:
      end.close()


def _run(spec: SamplerSpec, end, stop) -> None:
  import multiprocessing

  import jax

  from sao_jax import config as config_lib
  from sao_jax.config import MeshConfig
  from sao_jax.rollout import sao_sampling
  from sao_jax.runners.compiled import compile_sampler
  from sao_jax.setup import make_setup
  from sao_jax.sharding import make_mesh
  from sao_jax.transport import records
  from sao_jax.transport.params import ParamSubscriber, unflatten

  cfg = config_lib.from_dict(spec.config)
  s = make_setup(cfg)
  mesh = make_mesh(MeshConfig(shape=(1, 1, 1)), jax.devices()[:1])
  slots = cfg.sao.sampler_slots
  progs = compile_sampler(cfg, s.model, prompt_len=s.prompt_len,
                          max_new_tokens=cfg.rl.max_new_tokens, temperature=cfg.rl.temperature,
                          eos_id=s.tok.eos_id, pad_id=s.tok.pad_id, mesh=mesh)
  sub = ParamSubscriber(spec.param_dir)
  version, params = -1, None
  key = jax.random.key(spec.seed)
  parent = multiprocessing.parent_process()
  # Record ids must be unique across samplers on any machine: a random prefix per process.
  id_prefix = int.from_bytes(os.urandom(3), "little") << 40
  counter = 0
  while not stop.is_set():
    if parent is not None and not parent.is_alive():
      return  # learner gone (e.g. kill -9): nothing to deliver to
    got = sub.poll(version)
    if got is not None:
      version, flat = got
      params = jax.device_put(unflatten(progs.abstract_params, flat), progs.params_sharding)
    if params is None:
      time.sleep(0.05)
      continue
    indices = end.get_tasks(slots, timeout=0.2)
    if not indices:
      continue
    tasks = [s.train[i] for i in indices]
    envs = [s.family.make_env(s.tok) for _ in tasks]
    key, sub_key = jax.random.split(key)
    trajs = sao_sampling(progs.sample, params, envs, tasks, indices, s.tok, slots=slots,
                         prompt_len=s.prompt_len, max_steps=s.max_steps, rng=sub_key,
                         policy_version=version, step_many=s.family.step_many)
    for traj in trajs:
      counter += 1
      meta = {"task_index": traj.task_index, "task_id": traj.task_id, "reward": traj.total_reward,
              "t_end": traj.t_end, "sampler": spec.sampler_id, "done": traj.done,
              "reward_s": traj.reward_seconds,
              "sandbox_runs": sum(info.get("sandbox_runs", 0) for info in traj.infos)}
      end.put_trajectory(records.encode(records.RecordKind.TRAJECTORY,
                                        id_prefix | counter, traj.policy_version,
                                        traj.arrays(), meta))
    end.ack_tasks()
