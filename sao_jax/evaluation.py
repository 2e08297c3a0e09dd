"""Held-out evaluation: greedy episodes on test tasks, scored by the task family."""

from __future__ import annotations

import jax
import numpy as np

from sao_jax.envs.base import Task
from sao_jax.packing import round_up
from sao_jax.setup import Setup


def evaluate(
  s: Setup,
  progs,
  params,
  *,
  batch_divisor: int = 1,
  num: int | None = None,
  tasks: list[Task] | None = None,
) -> dict[str, float]:
  """Greedy accuracy of the run's policy (`s.policy`) on the first `num` test tasks (default
  `eval.num_problems`), or on `tasks` (e.g. the validation problems of shadow models).

  accuracy: mean over tasks of (episode reward / the family's maximum reward);
  solved_rate: fraction of tasks whose episode earned the maximum reward (code: every hidden
  test passed); then what the policy reports of its episodes (`Policy.episode_metrics`:
  format_rate for text, retention and bytes per stage for compressed memory). `progs` holds
  the sampler programs (`runners.compiled.compile_sampler`); episodes run `eval.batch_size`
  side by side (`Policy.play`).
  """
  tasks = s.test[: num or s.cfg.eval.num_problems] if tasks is None else tasks
  slots = round_up(min(s.cfg.eval.batch_size, len(tasks)), batch_divisor)
  episodes = []
  for i in range(0, len(tasks), slots):
    chunk = tasks[i : i + slots]
    episodes += s.policy.play(
      s,
      progs,
      params,
      chunk,
      list(range(i, i + len(chunk))),
      slots=slots,
      rng=jax.random.key(0),
      greedy=True,
    )
  scores = np.asarray(
    [t.total_reward / s.family.max_reward(task) for task, t in zip(tasks, episodes, strict=True)]
  )
  return {
    "accuracy": float(np.mean(scores)),
    "num_problems": len(tasks),
    "solved_rate": float(np.mean(scores >= 1.0 - 1e-6)),
    **s.policy.episode_metrics(s, episodes),
  }
