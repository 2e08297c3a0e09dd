"""The phases of the policy with compressed memory (`compression.enabled`): the supervised
warm start on expert episodes, then synchronous GRPO on sampled episodes.

Both phases train all of the policy's parameters (transformer, encoder, LSTM filter,
auxiliary decoder) with `compression.policy.make_memory_update`, compiled by
`runners.common.programs_for` like every phase (the sampler with its `compress` program),
and evaluate with `evaluation.evaluate`. Snapshots, resumption,
clock and logging are those of the other phases (`runners.common`).

A training row is one environment step seen as [memory of earlier kept steps | raw window];
every step of an episode runs through the compressor, but only R steps per episode are rows:
the graded ones first (they carry the task), then ungraded ones drawn at random (weighed up
to stand for all of them, `compression.rollout.expert_memory_batch`).
"""

from __future__ import annotations

import pathlib
import time

import jax
import numpy as np

from sao_jax import checkpoint as ckpt_lib
from sao_jax import config as config_lib
from sao_jax.compression.rollout import (
  ExpertEpisodes,
  sample_long_horizon,
  trajectories_to_batch,
)
from sao_jax.metrics import MetricsWriter, peak_memory_mb
from sao_jax.runners.common import (
  PhaseClock,
  defer_dir,
  eval_fn,
  finish_phase,
  log_step,
  phase_manager,
  phase_meta,
  programs_for,
  resume_phase,
)
from sao_jax.runners.compiled import Programs
from sao_jax.setup import Setup
from sao_jax.state import TrainState, copy_tree


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
  progs = programs_for(s, rl.optim, lambda _, tx: s.policy.grpo_update(tx, cfg))
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
    eval_fn(s, progs),
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
