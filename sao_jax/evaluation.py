"""Held-out evaluation: greedy episodes on test tasks, scored by the task family."""

from __future__ import annotations

from collections.abc import Callable

import jax
import numpy as np

from sao_jax.compression.memory import Bank, bank_nbytes, graveyard_nbytes
from sao_jax.compression.rollout import BANK_KEYS, sample_long_horizon
from sao_jax.envs.base import Task
from sao_jax.packing import round_up
from sao_jax.rollout import sao_sampling
from sao_jax.setup import Setup


def evaluate(
  s: Setup,
  greedy: Callable,
  params,
  *,
  batch_divisor: int = 1,
  num: int | None = None,
  tasks: list[Task] | None = None,
) -> dict[str, float]:
  """Greedy accuracy on the first `num` test tasks (default `eval.num_problems`), or on
  `tasks` (e.g. the validation problems of shadow models).

  accuracy: mean over tasks of (episode reward / the family's maximum reward);
  solved_rate: fraction of tasks whose episode earned the maximum reward (code: every hidden
  test passed);
  format_rate: fraction of steps whose output the environment could parse, where it says
  (`info["format_ok"]`). `greedy` is the sampler program `(params, prompt, prompt_valid,
  rng) -> SampleOutput`; episodes run `eval.batch_size` side by side.
  """
  tasks = s.test[: num or s.cfg.eval.num_problems] if tasks is None else tasks
  slots = round_up(min(s.cfg.eval.batch_size, len(tasks)), batch_divisor)
  scores, fmt = [], []
  for i in range(0, len(tasks), slots):
    chunk = tasks[i : i + slots]
    trajs = sao_sampling(
      greedy,
      params,
      [s.family.make_env(s.tok) for _ in chunk],
      chunk,
      list(range(i, i + len(chunk))),
      s.tok,
      slots=slots,
      prompt_len=s.prompt_len,
      max_steps=s.max_steps,
      rng=jax.random.key(0),
      policy_version=0,
      step_many=s.family.step_many,
    )
    for task, traj in zip(chunk, trajs, strict=True):
      scores.append(traj.total_reward / s.family.max_reward(task))
      fmt += [info["format_ok"] for info in traj.infos if "format_ok" in info]
  out = {
    "accuracy": float(np.mean(scores)),
    "num_problems": len(tasks),
    "solved_rate": float(np.mean(np.asarray(scores) >= 1.0 - 1e-6)),
  }
  if fmt:
    out["format_rate"] = float(np.mean(fmt))
  return out


def evaluate_memory(
  s: Setup,
  progs,
  params,
  *,
  batch_divisor: int = 1,
  num: int | None = None,
  tasks: list[Task] | None = None,
) -> dict[str, float]:
  """Greedy episodes of the policy with compressed memory (`s.memory`), the metrics of
  `evaluate` plus what the compression benchmark reports:

  retention: fraction of graded steps answered right (over all questions; on retention
  dialogues whose questions come n+ turns after their fact, the retention at n turns), with
  its binomial standard error `retention_stderr` over `questions`;
  kept_steps_mean: bank entries per episode; episodes_with_evictions;
  bytes_*: mean bytes per episode of its context, uncompressed (float32 token embeddings at
  the model width) and after each stage: stage 1 (every step's vectors, float32), stage 2
  (kept steps only), stage 3 (the bank as shipped: INT8 vectors, scales, step index), and
  bytes_graveyard: the evicted entries shipped next to the bank for exact replay.

  `progs` holds the sampler programs `greedy`, `compress` and `empty_streams`
  (`compile_memory_sampler`).
  """
  c = s.cfg.compression
  tasks = s.test[: num or s.cfg.eval.num_problems] if tasks is None else tasks
  slots = round_up(min(s.cfg.eval.batch_size, len(tasks)), batch_divisor)
  trajs = []
  for i in range(0, len(tasks), slots):
    chunk = tasks[i : i + slots]
    trajs += sample_long_horizon(
      progs.greedy,
      progs.compress,
      progs.empty_streams(slots),
      params,
      [s.family.make_env(s.tok) for _ in chunk],
      chunk,
      s.tok,
      slots=slots,
      window=c.window,
      step_len=c.step_len,
      rng=jax.random.key(0),
    )
  scores = np.asarray(
    [
      float(t.rewards.sum()) / s.family.max_reward(task)
      for task, t in zip(tasks, trajs, strict=True)
    ]
  )
  graded = np.concatenate([t.rewards[t.graded] for t in trajs])
  retention = float(graded.mean()) if len(graded) else 0.0
  kept = np.asarray([t.bank["entries"] for t in trajs], np.float64)
  steps = np.asarray([len(t.rewards) for t in trajs], np.float64)
  per_entry = c.vectors_per_step * c.dim
  stage3 = [bank_nbytes(Bank(**{k: t.bank[k] for k in BANK_KEYS})) for t in trajs]
  return {
    "accuracy": float(scores.mean()),
    "num_problems": len(tasks),
    "solved_rate": float(np.mean(scores >= 1.0 - 1e-6)),
    "retention": retention,
    "questions": len(graded),
    "retention_stderr": float(np.sqrt(retention * (1 - retention) / max(len(graded), 1))),
    "kept_steps_mean": float(kept.mean()),
    "episodes_with_evictions": int(sum(t.bank["evicted"] > 0 for t in trajs)),
    "bytes_full_context": float(np.mean([t.tokens_total for t in trajs]) * s.cfg.model.width * 4),
    "bytes_stage1": float(steps.mean() * per_entry * 4),
    "bytes_stage2": float(kept.mean() * per_entry * 4),
    "bytes_stage3": float(np.mean(stage3)),
    "bytes_graveyard": float(np.mean([graveyard_nbytes(t.bank["gone_vec_ged"]) for t in trajs])),
  }
