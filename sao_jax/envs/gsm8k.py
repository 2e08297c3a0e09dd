"""GSM8K (Cobbe et al. 2021, "Training Verifiers to Solve Math Word Problems") as tasks and a
single-turn environment with the standard answer-extraction reward.

A published record is `{"question": ..., "answer": "...<<48/2=24>>24 ...\\n#### 72"}`: worked
steps with calculator annotations in `<<...>>`, then `#### ` and the final number. A
:class:`Task` keeps the question as its prompt (in a plain-text template: no chat template),
the steps without annotations as its solution, and the final number, normalised, as its
answer.

Reward: 1.0 iff the completion's answer equals the task's, where the completion's answer is
the number after its last `####` if it has one, else the last number anywhere in it
(lm-evaluation-harness's "strict" and "flexible" extraction in one), both normalised: commas,
a leading `$` and trailing zeros after a decimal point are dropped ("1,000.50" == "1000.5",
"72.0" == "72").
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation

import numpy as np

from sao_jax.envs.base import SingleTurnEnv, StepResult, Task

PROMPT_TEMPLATE = "Question: {question}\nAnswer:"
TRAIN_ID_OFFSET = 10**9
_NUMBER = re.compile(r"-?\$?\d[\d,]*(?:\.\d+)?|-?\$?\.\d+")
_ANNOTATION = re.compile(r"<<[^>]*>>")


def normalise_number(text: str) -> str | None:
  """Canonical string of the number `text` ("$1,000.50" -> "1000.5", "-3.0" -> "-3"), or
  None when it is not a number."""
  cleaned = text.strip().replace(",", "").replace("$", "").rstrip(".")
  try:
    value = Decimal(cleaned)
  except InvalidOperation:
    return None
  if not value.is_finite():
    return None
  if value == value.to_integral_value():
    return str(int(value))
  return format(value.normalize(), "f")


def extract_answer(completion: str) -> str | None:
  """The normalised number after the last '####', else the last number in the text."""
  _, sep, tail = completion.rpartition("####")
  if sep:
    found = _NUMBER.search(tail)
    return normalise_number(found.group()) if found else None
  numbers = _NUMBER.findall(completion)
  return normalise_number(numbers[-1]) if numbers else None


def parse_record(task_id: int, question: str, answer: str, template: str = PROMPT_TEMPLATE) -> Task:
  """A Task from one published record; ValueError if its answer has no '#### <number>'."""
  steps, sep, final = answer.rpartition("####")
  target = normalise_number(final) if sep else None
  if target is None:
    raise ValueError(f"GSM8K answer without a final '#### <number>': {answer[-60:]!r}")
  lines = [ln.strip() for ln in _ANNOTATION.sub("", steps).strip().splitlines() if ln.strip()]
  solution = "\n".join(lines + [f"#### {target}"])
  return Task(
    task_id=int(task_id),
    prompt=template.format(question=question.strip()),
    solution=solution,
    answer=target,
    difficulty=len(lines),
  )


class GSM8KEnv(SingleTurnEnv):
  """Single-turn: show the question, reward 1.0 iff the extracted answer is the target."""

  def _grade(self, task: Task, action_tokens: Sequence[int] | np.ndarray) -> StepResult:
    text = self._tokenizer.decode(action_tokens)
    predicted = extract_answer(text)
    return StepResult(
      observation=np.zeros((0,), np.int32),
      reward=float(predicted is not None and predicted == task.answer),
      done=True,
      info={"answer": predicted, "target": task.answer, "format_ok": "####" in text},
    )
