"""Held-out evaluation: greedy episodes on test tasks, scored by the task family."""
from __future__ import annotations

from collections.abc import Callable

import jax
import numpy as np

from sao_jax.envs.base import Task
from sao_jax.packing import round_up
from sao_jax.rollout import sao_sampling
from sao_jax.setup import Setup


def evaluate(s: Setup, greedy: Callable, params, *, batch_divisor: int = 1,
             num: int | None = None, tasks: list[Task] | None = None) -> dict[str, float]:
  """Greedy accuracy on the first `num` test tasks (default `eval.num_problems`), or on
  `tasks` (e.g. the validation problems of shadow models).

  accuracy: mean over tasks of (episode reward / the family's maximum reward);
  solved_rate: fraction of tasks whose episode earned the maximum reward (code: every hidden
  test passed);
  format_rate: fraction of steps whose output the environment could parse, where it says
  (`info["format_ok"]`). `greedy` is the sampler program `(params, prompt, prompt_valid,
  rng) -> SampleOutput`; episodes run `eval.batch_size` side by side.
  """
  tasks = s.test[:num or s.cfg.eval.num_problems] if tasks is None else tasks
  slots = round_up(min(s.cfg.eval.batch_size, len(tasks)), batch_divisor)
  scores, fmt = [], []
  for i in range(0, len(tasks), slots):
    chunk = tasks[i:i + slots]
    trajs = sao_sampling(greedy, params, [s.family.make_env(s.tok) for _ in chunk], chunk,
                         list(range(i, i + len(chunk))), s.tok, slots=slots,
                         prompt_len=s.prompt_len, max_steps=s.max_steps,
                         rng=jax.random.key(0), policy_version=0,
                         step_many=s.family.step_many)
    for task, traj in zip(chunk, trajs, strict=True):
      scores.append(traj.total_reward / s.family.max_reward(task))
      fmt += [info["format_ok"] for info in traj.infos if "format_ok" in info]
  out = {"accuracy": float(np.mean(scores)), "num_problems": len(tasks),
         "solved_rate": float(np.mean(np.asarray(scores) >= 1.0 - 1e-6))}
  if fmt:
    out["format_rate"] = float(np.mean(fmt))
  return out
