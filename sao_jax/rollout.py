"""SAO sampling: one trajectory per task, many tasks decoded side by side.

`sao_sampling` runs a batch of slots (each slot a different task's single trajectory)
through up to `max_steps` environment steps. Each step is one fixed-shape jitted sampler
call over all slots; slots whose episode ended are masked and their rows skipped. The
context of step k is the task's observation tokens plus all earlier actions and
observations, left-padded to the prompt length (the most recent tokens are kept when it
overflows: the raw window; the compressed memory of a later stage covers the rest).
Finished trajectories go through a compression hook (identity for now).
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

import jax
import numpy as np

from sao_jax.envs.base import Env, Task
from sao_jax.packing import left_pad
from sao_jax.tokenizer import Tokenizer


@dataclasses.dataclass
class Trajectory:
  """Rows are environment steps: the context the policy saw, what it emitted, and reward."""

  task_index: int
  task_id: int
  policy_version: int
  prompt: np.ndarray  # [S, P] int32
  prompt_valid: np.ndarray  # [S, P] bool
  tokens: np.ndarray  # [S, T] int32
  valid: np.ndarray  # [S, T] bool
  logp: np.ndarray  # [S, T] f32, behaviour log-probs
  rewards: np.ndarray  # [S] f32
  step_seconds: np.ndarray  # [S] f32
  done: bool
  t_end: float  # time.time() when the trajectory finished
  infos: list[dict]  # each step's StepResult.info (diagnostics; not shipped to the learner)
  reward_seconds: float = 0.0  # this trajectory's share of the environment-step time

  @property
  def total_reward(self) -> float:
    return float(self.rewards.sum())

  def arrays(self) -> dict[str, np.ndarray]:
    return {k: getattr(self, k) for k in ("prompt", "prompt_valid", "tokens", "valid", "logp",
                                         "rewards", "step_seconds")}


def _step_each(envs, actions):
  return [env.step(a) for env, a in zip(envs, actions, strict=True)]


def identity_compression(traj: Trajectory) -> Trajectory:
  return traj


def sao_sampling(sample_fn: Callable, params, envs: Sequence[Env], tasks: Sequence[Task],
                 task_indices: Sequence[int], tok: Tokenizer, *, slots: int, prompt_len: int,
                 max_steps: int, rng: jax.Array, policy_version: int,
                 compress: Callable[[Trajectory], Trajectory] = identity_compression,
                 step_many: Callable | None = None) -> list[Trajectory]:
  """Samples one trajectory for each of `tasks` (at most `slots`), in one batch of slots.

  Args:
    sample_fn: jitted `(params, prompt_bp, prompt_valid_bp, rng) -> SampleOutput` over
      exactly `slots` rows.
    envs: one environment per task (episodes run side by side).
    step_many: `(envs, actions) -> [StepResult]` for the active slots of one decode call
      (default: each env's `step` in turn); a task family's `step_many` scores them at once.
  """
  n = len(tasks)
  if not 0 < n <= slots or len(envs) != n or len(task_indices) != n:
    raise ValueError(f"need 1..{slots} tasks with one env each, got {n} tasks, {len(envs)} envs")
  contexts = [list(tok.encode("", add_bos=True)) + env.reset(t).tolist()
              for env, t in zip(envs, tasks, strict=True)]
  steps: list[list[tuple]] = [[] for _ in range(n)]
  reward_s = 0.0  # host time in the environments' steps (rewards), all slots together
  active = np.ones(n, bool)
  for _ in range(max_steps):
    if not active.any():
      break
    t0 = time.time()
    rows = [c[-prompt_len:] for c in contexts] + [[tok.bos_id]] * (slots - n)
    prompt, pvalid = left_pad(rows, prompt_len, tok.pad_id)
    rng, key = jax.random.split(rng)
    out = jax.device_get(sample_fn(params, prompt, pvalid, key))
    dt = time.time() - t0
    live = np.flatnonzero(active)
    t_env = time.time()
    results = (step_many or _step_each)([envs[i] for i in live], [out.tokens_bt[i] for i in live])
    reward_s += time.time() - t_env
    for i, res in zip(live, results, strict=True):
      steps[i].append((prompt[i], pvalid[i], out.tokens_bt[i], out.valid_bt[i], out.logp_bt[i],
                       res.reward, dt, res.info))
      if res.done:
        active[i] = False
      else:
        action = out.tokens_bt[i][out.valid_bt[i]].tolist()
        contexts[i] += action + res.observation.tolist()
  now = time.time()
  trajs = []
  for i in range(n):
    cols = list(zip(*steps[i], strict=True))
    trajs.append(compress(Trajectory(
        task_index=int(task_indices[i]), task_id=tasks[i].task_id, policy_version=policy_version,
        prompt=np.stack(cols[0]), prompt_valid=np.stack(cols[1]), tokens=np.stack(cols[2]),
        valid=np.stack(cols[3]), logp=np.stack(cols[4]).astype(np.float32),
        rewards=np.asarray(cols[5], np.float32), step_seconds=np.asarray(cols[6], np.float32),
        done=not active[i], t_end=now, infos=list(cols[7]), reward_seconds=reward_s / n)))
  return trajs
