"""The environment API every task family implements.

Samplers, the learner and the evaluation code only see :class:`Task`, :class:`StepResult`
and the :class:`Env` protocol, so task families (generated arithmetic, code, dialogue) can be
swapped by config without touching the RL code. Observations and actions are token ids
rather than text so the decode loop never round-trips through strings except at the reward.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

import numpy as np

from sao_jax.tokenizer import Tokenizer


@dataclasses.dataclass(frozen=True)
class Task:
  """One problem, with everything needed to sample, reward and warm-start on it.

  Attributes:
    task_id: unique within its split; the key value trackers and the task queue use.
    prompt: what the policy is shown.
    solution: the full worked solution, ending with the final answer; the supervised warm
      start trains on `prompt -> solution`, RL never sees it.
    answer: the final answer exactly as the reward function expects to read it.
    difficulty: larger is harder; lets curricula and reports bucket tasks.
  """

  task_id: int
  prompt: str
  solution: str
  answer: str
  difficulty: int


class StepResult(NamedTuple):
  """What one environment step returns.

  Attributes:
    observation: int32 token ids appended to the context (a user turn, tool output); empty
      when the episode is done or the environment has nothing to say.
    reward: scalar reward for this step.
    done: True on the episode's last step; stepping again is an error.
    info: diagnostics for logging (parsed answer, format checks); never read by the loss.
  """

  observation: np.ndarray
  reward: float
  done: bool
  info: dict[str, Any]


class Env(Protocol):
  """A (possibly multi-step) text environment over token ids.

  An episode is `reset(task)` followed by one or more `step(action_tokens)` calls. Single-turn
  tasks are one-step episodes (`max_steps == 1`). Every episode ends with `done=True` at step
  `max_steps` at the latest, so samplers can size their buffers up front; a `step` after
  `done`, or before any `reset`, raises `RuntimeError`.
  """

  max_steps: int

  def reset(self, task: Task) -> np.ndarray:
    """Starts an episode on `task`; returns the first observation as int32 token ids."""
    ...

  def step(self, action_tokens: Sequence[int] | np.ndarray) -> StepResult:
    """Applies the policy's generated tokens (EOS-terminated or not)."""
    ...


class SingleTurnEnv:
  """The one-step episode of a single-turn family: `reset` shows the task's prompt, `step`
  grades one completion with :meth:`_grade` and ends the episode (`max_steps == 1`).

  Subclasses implement `_grade`; `self._tokenizer` decodes the completion.
  """

  max_steps = 1

  def __init__(self, tokenizer: Tokenizer):
    self._tokenizer = tokenizer
    self._task: Task | None = None
    self._done = True

  def reset(self, task: Task) -> np.ndarray:
    self._task, self._done = task, False
    return np.asarray(self._tokenizer.encode(task.prompt), dtype=np.int32)

  def step(self, action_tokens: Sequence[int] | np.ndarray) -> StepResult:
    if self._done:
      raise RuntimeError(
        f"{type(self).__name__}.step() called with no episode in progress: episodes are one "
        "step (max_steps=1); call reset(task) first"
      )
    self._done = True
    return self._grade(self._task, action_tokens)

  def _grade(self, task: Task, action_tokens: Sequence[int] | np.ndarray) -> StepResult:
    """The final StepResult (done=True, empty observation) of `action_tokens` on `task`."""
    raise NotImplementedError(f"{type(self).__name__} must define _grade")


def draw_hashed_split(
  num: int,
  *,
  want_test: bool,
  draw_kind: Callable[[], int],
  generate: Callable[[int, int], Task],
  is_test: Callable[[str], bool],
  kinds: Sequence[int],
  max_rejects: int,
  what: Callable[[int], str],
) -> list[Task]:
  """`num` tasks of one split of a family whose splits are disjoint by a hash of the
  solution (`is_test`): for each task a kind is drawn first (`draw_kind`: a depth, a number
  of steps), then tasks of that kind (`generate(index, kind)`) until one lies in the wanted
  split. The test split keeps each kind's tasks unique until `max_rejects` draws in a row
  find no new one (that kind looks exhausted), then repeats them; `what(kind)` names the
  tasks in the error raised when a kind has no task of the split at all."""
  unique = dict.fromkeys(kinds, want_test)
  seen: set[str] = set()
  tasks: list[Task] = []
  split = "test" if want_test else "train"
  while len(tasks) < num:
    kind = draw_kind()
    for _ in range(max_rejects):
      task = generate(len(tasks), kind)
      if is_test(task.solution) == want_test and not (unique[kind] and task.solution in seen):
        break
    else:
      if not unique[kind]:
        raise ValueError(f"no {split} {what(kind)} found in {max_rejects} draws")
      unique[kind] = False  # this kind's test tasks look exhausted: repeat them
      continue
    seen.add(task.solution)
    tasks.append(task)
  return tasks
