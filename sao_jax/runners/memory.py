"""The phases of the policy with compressed memory (`compression.enabled`): the supervised
warm start on expert episodes, then synchronous GRPO on sampled episodes.

Both phases train all of the policy's parameters (transformer, encoder, LSTM filter,
auxiliary decoder) with `compression.policy.make_memory_update`, compiled by
`compile_memory_programs` (the learner through `compile_learner`, the sampler with its
`compress` program), and evaluate with `evaluation.evaluate_memory`. Snapshots, resumption,
clock and logging are those of the other phases (`runners.common`).

A training row is one environment step seen as [memory of earlier kept steps | raw window];
every step of an episode runs through the compressor, but only R steps per episode are rows:
the graded ones first (they carry the task), then ungraded ones drawn at random (weighed up
to stand for all of them, `compression.rollout.expert_memory_batch`).
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
import time
import zlib

import jax
import numpy as np

from sao_jax import checkpoint as ckpt_lib
from sao_jax import config as config_lib
from sao_jax.compression.policy import MemoryPolicy, make_memory_update
from sao_jax.compression.rollout import (
  LongTrajectory,
  expert_memory_batch,
  expert_trajectory,
  sample_long_horizon,
  trajectories_to_batch,
)
from sao_jax.config import Config, OptimConfig
from sao_jax.evaluation import evaluate_memory
from sao_jax.learner import make_optimizer
from sao_jax.metrics import MetricsWriter, peak_memory_mb
from sao_jax.packing import round_up
from sao_jax.runners.common import (
  PhaseClock,
  defer_dir,
  finish_phase,
  log_step,
  phase_manager,
  phase_meta,
  resume_phase,
  supervised_row,
)
from sao_jax.runners.compiled import (
  Programs,
  SamplerPrograms,
  compile_learner,
  compile_memory_sampler,
)
from sao_jax.setup import Setup
from sao_jax.state import TrainState, copy_tree

# Ungraded rows per episode in the supervised phase, besides every graded one: the filler
# steps ("ok" after chit-chat) are easy, and a sample of them weighed up keeps the objective
# while the rows stay few (the encoder and LSTM still see every step).
FILLER_ROWS = 4
# Expert episodes that size the rows per episode (R = their most graded steps + FILLER_ROWS).
SIZING_EPISODES = 64


def memory_programs(s: Setup, optim: OptimConfig, *, mode: str, group_size: int = 0) -> Programs:
  """Learner (init, update of `mode` "sft" or "rl") and sampler (sample, greedy, compress,
  empty_streams); the sampler is compiled once per run and shared by its phases."""
  tx = make_optimizer(optim)
  rl = s.cfg.rl
  update = make_memory_update(
    s.memory,
    tx,
    mode=mode,
    temperature=rl.temperature,
    clip_eps=rl.clip_eps,
    is_cap=s.cfg.sao.is_cap,
    group_size=group_size,
    advantage=rl.advantage,
  )
  learner = compile_learner(
    s.cfg, None, tx, update, with_ref=False, prompt_len=0, init_fn=s.memory.init_state_fn(tx)
  )
  smp = memory_sampler(s.cfg, s.memory, s.tok.eos_id, s.tok.pad_id)
  return Programs(
    **{f.name: getattr(learner, f.name) for f in dataclasses.fields(learner)},
    sample=smp.sample,
    greedy=smp.greedy,
    compress=smp.compress,
    empty_streams=smp.empty_streams,
  )


@functools.lru_cache(maxsize=2)
def memory_sampler(cfg: Config, policy: MemoryPolicy, eos_id: int, pad_id: int) -> SamplerPrograms:
  """The memory policy's sampler programs, compiled once per run and shared by its phases."""
  return compile_memory_sampler(
    cfg,
    policy,
    max_new_tokens=cfg.rl.max_new_tokens,
    temperature=cfg.rl.temperature,
    eos_id=eos_id,
    pad_id=pad_id,
  )


def memory_eval_fn(s: Setup, progs: Programs, tasks=None):
  """params -> held-out metrics (`evaluate_memory`) on `tasks` (default: the test split's
  first eval.num_problems)."""
  return lambda params: evaluate_memory(
    s, progs, params, batch_divisor=progs.batch_divisor, tasks=tasks
  )


class ExpertEpisodes:
  """The training tasks' expert episodes in the sampler's layout, played once through the
  environment (the family's `sft_examples` give each step's action and weight)."""

  def __init__(self, s: Setup):
    self.s = s
    self._cache: dict[int, tuple[LongTrajectory, np.ndarray]] = {}

  def get(self, i: int) -> tuple[LongTrajectory, np.ndarray]:
    if i not in self._cache:
      s, c = self.s, self.s.cfg.compression
      task = s.train[i]
      examples = s.family.sft_examples(task, s.tok, c.window)
      traj = expert_trajectory(
        s.family.make_env(s.tok),
        task,
        [e.target for e in examples],
        s.tok,
        window=c.window,
        step_len=c.step_len,
        completion_len=s.target_len,
      )
      self._cache[i] = traj, np.asarray([e.weight for e in examples], np.float32)
    return self._cache[i]

  def max_graded(self) -> int:
    n = min(SIZING_EPISODES, len(self.s.train))
    return max(int(self.get(i)[0].graded.sum()) for i in range(n))


def run_memory_sft(
  s: Setup,
  writer: MetricsWriter,
  state: TrainState | None,
  workdir: pathlib.Path,
  *,
  steps: int | None = None,
  max_seconds: float | None = None,
  tag: str = "sft",
  eval_every: float = 0.0,
) -> tuple[TrainState, Programs, dict]:
  """Teacher-forced cross-entropy on expert episodes of random training tasks (each row
  weighted by its step's weight), plus the encoder's reconstruction and the LSTM's
  prediction losses. Starts from `state`'s params (a copy) or fresh ones; resumes by itself
  from the newest snapshot in `workdir/checkpoints/<tag>`."""
  cfg = s.cfg
  steps = cfg.sft.steps if steps is None else steps
  max_seconds = cfg.sft.max_seconds if max_seconds is None else max_seconds
  progs = memory_programs(s, cfg.sft.optim, mode="sft")
  fresh = progs.init(jax.random.key(cfg.seed))
  state = fresh if state is None else fresh.replace(params=copy_tree(state.params))
  bs = round_up(cfg.sft.batch_size, progs.batch_divisor)
  experts = ExpertEpisodes(s)
  rows = min(s.max_steps, experts.max_graded() + FILLER_ROWS)
  rng = np.random.default_rng((cfg.seed, 1, zlib.crc32(tag.encode())))
  clock = PhaseClock(
    steps,
    max_seconds,
    eval_every,
    memory_eval_fn(s, progs),
    defer_dir=defer_dir(cfg, workdir, tag),
  )
  writer.progress(tag, steps or None)
  mngr = phase_manager(cfg, workdir, tag)
  step, tokens = 0, 0
  resumed = resume_phase(mngr, state, clock, rng, tag)
  if resumed is not None:
    state, step, _ = resumed
  else:
    clock.maybe_eval(step, state.params, force=bool(eval_every))

  def meta():
    return phase_meta(tag, rng, clock)

  while clock.running(step):
    ts = time.time()
    picked = [experts.get(int(i)) for i in rng.integers(0, len(s.train), bs)]
    batch = expert_memory_batch(
      [p[0] for p in picked],
      [p[1] for p in picked],
      steps=s.max_steps,
      rows=rows,
      seed=int(rng.integers(2**31)),
    )
    state, metrics = progs.update(state, progs.shard_batch(batch))
    step += 1
    tokens += int(batch.valid_brt.sum())
    ckpt_lib.save(mngr, state, cfg, meta())
    row = supervised_row(cfg, step, metrics, ts, tokens, clock)
    log_step(writer, clock, cfg, step, state.params, row, tag)
  return state, progs, finish_phase(mngr, state, cfg, clock, step, tag, meta())


def run_memory_grpo(
  s: Setup,
  writer: MetricsWriter,
  state: TrainState,
  workdir: pathlib.Path,
  *,
  max_seconds: float | None = None,
  eval_every: float = 0.0,
) -> tuple[TrainState, Programs, dict]:
  """Synchronous GRPO(N=group_size) with compressed memory: `prompts_per_step` tasks, each
  played `group_size` times side by side (every slot compresses its own episode in-graph),
  then one update on the whole episodes, whose graded steps are the rows; advantages are
  normalised within each task's group (`rl.advantage`, a registered group estimator)."""
  cfg, rl = s.cfg, s.cfg.rl
  c = cfg.compression
  max_seconds = rl.max_seconds if max_seconds is None else max_seconds
  progs = memory_programs(s, rl.optim, mode="rl", group_size=rl.group_size)
  fresh = progs.init(jax.random.key(cfg.seed + 1))
  state = fresh.replace(params=copy_tree(state.params))
  n = rl.prompts_per_step * rl.group_size
  if n % progs.batch_divisor:
    raise config_lib.ConfigError(
      f"prompts_per_step*group_size = {n} must divide over {progs.batch_divisor} batch shards"
    )
  rows = max(ExpertEpisodes(s).max_graded(), 1)
  rng = np.random.default_rng((cfg.seed, 2))
  key = jax.random.key(cfg.seed + 2)
  mngr = phase_manager(cfg, workdir, "rl")
  clock = PhaseClock(
    rl.steps,
    max_seconds,
    eval_every,
    memory_eval_fn(s, progs),
    defer_dir=defer_dir(cfg, workdir, "rl"),
  )
  writer.progress("grpo", rl.steps or None)
  step, busy, trajectories = 0, 0.0, 0
  resumed = resume_phase(mngr, state, clock, rng, "grpo", with_key=True)
  if resumed is not None:
    state, step, key = resumed
  else:
    clock.maybe_eval(step, state.params, force=bool(eval_every))

  def meta():
    return phase_meta("rl", rng, clock, key)

  t_loop = time.time()
  while clock.running(step):
    ts = time.time()
    idx = rng.integers(0, len(s.train), rl.prompts_per_step)
    tasks = [s.train[i] for i in idx for _ in range(rl.group_size)]
    key, sub = jax.random.split(key)
    trajs = sample_long_horizon(
      progs.sample,
      progs.compress,
      progs.empty_streams(n),
      state.params,
      [s.family.make_env(s.tok) for _ in tasks],
      tasks,
      s.tok,
      slots=n,
      window=c.window,
      step_len=c.step_len,
      rng=sub,
    )
    t_sampled = time.time()
    batch = trajectories_to_batch(trajs, s.max_steps, rows, seed=int(rng.integers(2**31)))
    state, metrics = progs.update(state, progs.shard_batch(batch))
    metrics = jax.device_get(metrics)
    busy += time.time() - t_sampled
    trajectories += n
    step += 1
    ckpt_lib.save(mngr, state, cfg, meta())
    t_end = time.time()
    graded = np.concatenate([t.rewards[t.graded] for t in trajs])
    row = dict(
      metrics,
      accuracy=float(graded.mean()) if len(graded) else 0.0,
      kept_steps_mean=float(np.mean([t.bank["entries"] for t in trajs])),
      step_time=t_end - ts,
      sampling_time=t_sampled - ts,
      learner_time=t_end - t_sampled,
      train_seconds=clock.elapsed,
      learner_busy=busy / (time.time() - t_loop),
      peak_memory_mb=peak_memory_mb(),
    )
    log_step(writer, clock, cfg, step, state.params, row, "rl")
  wall = time.time() - t_loop
  info = finish_phase(mngr, state, cfg, clock, step, "rl", meta())
  return (
    state,
    progs,
    dict(
      info,
      trajectories=trajectories,
      trajectories_per_s=trajectories / max(wall, 1e-9),
      learner_busy=busy / max(wall, 1e-9),
      seconds_per_step=info["seconds"] / max(step, 1),
      learner_peak_mb=peak_memory_mb(),
    ),
  )
