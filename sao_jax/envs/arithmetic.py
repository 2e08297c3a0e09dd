"""Procedurally generated GSM8K-style multi-step arithmetic word problems.

Why generated instead of GSM8K itself: a small char-level policy on a laptop CPU has to be
able to learn the task in minutes, the difficulty must be a knob (operations, operand size),
and train/test must be provably disjoint. Prompts are kept short (about 45 characters for
two operations on operands up to 20) because every prompt character is a decode-context
token.

A problem is a running total: a start value, then `n_ops` operations, e.g.

  prompt:   "Ann had 7 eggs, got 5, sold 3. Eggs?"
  solution: "7+5=12;12-3=9;#9"

The solution is the chain of steps `a{op}b=c` joined by `;`, then `;#` and the answer. With
`reverse_digits=True` every number in the solution is written least-significant digit first
("12" -> "21"), which makes carries left-to-right for an autoregressive model; the prompt
stays human-readable. The reward is exact match on the text after the last `#`.
"""

from __future__ import annotations

import dataclasses
import re
import zlib
from collections.abc import Sequence

import numpy as np

from sao_jax.envs.base import SingleTurnEnv, StepResult, Task

_ALL_OPS = "+-*"
_MAX_OPS = 4
# Draws in a row that may fail (duplicate test problem, train problem that is in the test
# set) before the problem space is declared exhausted. At 10_000 a space with 1% of it still
# free is misjudged with probability 0.99**10_000 ~ 1e-44.
_MAX_CONSECUTIVE_REJECTS = 10_000
# Train ids start here so ids from the two splits never collide in one value tracker.
TRAIN_ID_OFFSET = 10**9

# Short words on purpose: the longest two-op prompt with operands up to 20 is 44 characters.
_NAMES = ("Ann", "Bob", "Sam", "Kim", "Tom", "Eve", "Max", "Zoe")
_ITEMS = ("eggs", "pens", "cards", "coins", "books", "cups", "keys")
_CLAUSES = {
  "+": ("got {}", "found {}", "won {}", "made {}"),
  "-": ("lost {}", "sold {}", "gave {}", "used {}"),
  "*": ("then x{}",),
}


@dataclasses.dataclass(frozen=True)
class ArithmeticSpec:
  """What kind of problems to generate.

  Attributes:
    n_ops: operations after the start value, 1..4.
    max_operand: the start value and every operand are drawn from 1..max_operand.
    ops: which operations may appear, a subset of "+-*"; stored in canonical order so
      "-+" and "+-" are the same spec (and generate the same problems).
    reverse_digits: write every number of the solution least-significant digit first.
  """

  n_ops: int = 2
  max_operand: int = 9
  ops: str = "+-"
  reverse_digits: bool = False

  def __post_init__(self):
    if not _is_int(self.n_ops) or not 1 <= self.n_ops <= _MAX_OPS:
      raise ValueError(f"n_ops must be an int in 1..{_MAX_OPS}, got {self.n_ops!r}")
    if not _is_int(self.max_operand) or self.max_operand < 1:
      raise ValueError(f"max_operand must be an int >= 1, got {self.max_operand!r}")
    if not isinstance(self.ops, str) or not self.ops:
      raise ValueError(f"ops must be a non-empty subset of {_ALL_OPS!r}, got {self.ops!r}")
    if set(self.ops) - set(_ALL_OPS) or len(set(self.ops)) != len(self.ops):
      raise ValueError(f"ops must be a subset of {_ALL_OPS!r} without repeats, got {self.ops!r}")
    if self.ops == "-" and self.max_operand < self.n_ops:
      # Each subtraction removes at least 1 and the total may not go negative, so the start
      # value (at most max_operand) must cover n_ops subtractions.
      raise ValueError(
        f"ops='-' needs max_operand >= n_ops, got max_operand={self.max_operand}, "
        f"n_ops={self.n_ops}"
      )
    if not isinstance(self.reverse_digits, bool):
      raise ValueError(f"reverse_digits must be a bool, got {self.reverse_digits!r}")
    object.__setattr__(self, "ops", "".join(op for op in _ALL_OPS if op in self.ops))

  @property
  def difficulty(self) -> int:
    """Orders specs: operations dominate, then operand digits (2 ops, max 20 -> 22)."""
    return self.n_ops * 10 + len(str(self.max_operand))


def spec_for_difficulty(
  level: int, *, ops: str = "+-", reverse_digits: bool = False
) -> ArithmeticSpec:
  """A monotone difficulty knob for curricula.

  Levels 1..4 are 1..4 operations on single-digit operands; each level above 4 keeps four
  operations and adds an operand digit (5 -> up to 99, 6 -> up to 999, ...). `difficulty`
  rises strictly with `level`.
  """
  if not _is_int(level) or level < 1:
    raise ValueError(f"level must be an int >= 1, got {level!r}")
  if level <= _MAX_OPS:
    return ArithmeticSpec(n_ops=level, max_operand=9, ops=ops, reverse_digits=reverse_digits)
  return ArithmeticSpec(
    n_ops=_MAX_OPS,
    max_operand=10 ** (level - _MAX_OPS + 1) - 1,
    ops=ops,
    reverse_digits=reverse_digits,
  )


def generate_task(rng: np.random.Generator, spec: ArithmeticSpec, task_id: int) -> Task:
  """Draws one problem; the same rng state always gives the same task."""
  start, steps = _sample_chain(rng, spec)
  name = _NAMES[rng.integers(len(_NAMES))]
  item = _ITEMS[rng.integers(len(_ITEMS))]
  clauses = []
  for op, operand in steps:
    templates = _CLAUSES[op]
    clauses.append(templates[rng.integers(len(templates))].format(operand))
  prompt = f"{name} had {start} {item}, {', '.join(clauses)}. {item.capitalize()}?"

  num = _reversed if spec.reverse_digits else str
  total, lines = start, []
  for op, operand in steps:
    new_total = _apply(total, op, operand)
    lines.append(f"{num(total)}{op}{num(operand)}={num(new_total)}")
    total = new_total
  answer = num(total)
  return Task(
    task_id=int(task_id),
    prompt=prompt,
    solution=";".join(lines) + ";#" + answer,
    answer=answer,
    difficulty=spec.difficulty,
  )


_STEP = re.compile(r"(\d+)([-+*])(\d+)=")


def problem_numbers(solution: str, reverse_digits: bool = False) -> list[int]:
  """The start value and the operands of a worked solution ("7+5=12;12-3=9;#9" -> [7, 5, 3])."""
  steps = _STEP.findall(solution)
  if not steps:
    raise ValueError(f"not a worked solution: {solution!r}")
  num = (lambda x: int(x[::-1])) if reverse_digits else int
  return [num(steps[0][0]), *(num(b) for _, _, b in steps)]


# The verb of each clause template, and the operation it stands for.
VERBS = {t.split()[0]: op for op, templates in _CLAUSES.items() for t in templates}
SUBTRACTION_VERBS = tuple(v for v, op in VERBS.items() if op == "-")
_PROMPT = re.compile(r"\w+ had (\d+) \w+, (.+)\. \w+\?")


def _steps_of(prompt: str) -> tuple[int, list[tuple[str, str, int]]]:
  """(start, [(verb, op, operand), ...]) read back from a generated prompt."""
  m = _PROMPT.fullmatch(prompt)
  if m is None:
    raise ValueError(f"not a generated arithmetic prompt: {prompt!r}")
  steps = []
  for clause in m.group(2).split(", "):
    verb, _, number = clause.partition(" ")
    steps.append((verb, VERBS[verb], int(number.removeprefix("x"))))
  return int(m.group(1)), steps


def misread_solution(task: Task, misreads: Sequence[str], reverse_digits: bool = False) -> str:
  """The worked solution a flawed teacher writes for `task`: it reads every subtraction verb
  in `misreads` (of SUBTRACTION_VERBS, e.g. "gave") as an addition, and carries the chain on
  from the wrong total, so that its final answer is wrong too. A systematic error of the kind
  a weaker model makes, tied to the words of the prompt, so that imitation learns it rather
  than averaging it out. Problems without such a verb keep their true solution.

  Raises ValueError on a verb that is not a subtraction verb, or a prompt or solution this
  module did not generate."""
  bad = sorted(set(misreads) - set(SUBTRACTION_VERBS))
  if bad:
    raise ValueError(f"misreads {bad} are not subtraction verbs {SUBTRACTION_VERBS}")
  start, steps = _steps_of(task.prompt)
  num = _reversed if reverse_digits else str

  def write(flawed: bool) -> str:
    total, lines = start, []
    for verb, op, operand in steps:
      op = "+" if flawed and verb in misreads else op
      new_total = _apply(total, op, operand)
      lines.append(f"{num(total)}{op}{num(operand)}={num(new_total)}")
      total = new_total
    return ";".join(lines) + ";#" + num(total)

  if write(False) != task.solution:
    raise ValueError(f"task {task.task_id}: its solution is not the one its prompt gives")
  return write(True)


def extract_answer(text: str) -> str | None:
  """The text after the last '#', stripped; None when there is no '#' at all."""
  _, sep, tail = text.rpartition("#")
  return tail.strip() if sep else None


def make_split(
  spec: ArithmeticSpec, split: str, num: int, seed: int, *, num_test: int | None = None
) -> list[Task]:
  """`num` tasks of `split` ("train" or "test"), disjoint from the other split by construction.

  The test split is drawn from a stream seeded by (seed, "test") and kept unique while the
  problem space allows (once it looks exhausted, duplicates are accepted). The train split is
  drawn from a stream seeded by (seed, "train") and rejects every problem whose arithmetic
  (its solution, which names the numbers and operations but not the story) is in the test
  split of size `num_test` for the same spec and seed; that test split is regenerated here,
  which is why `num_test` is required for "train". When the space is small the train split
  may repeat problems among itself, but it never overlaps the test split. A test split of
  size n is a prefix of one of size m > n.

  Task ids are `0..num-1` for test and `TRAIN_ID_OFFSET + i` for train.

  Raises:
    ValueError: on a bad split or size, or when the test split leaves (practically) no
      problem for train.
  """
  if split not in ("train", "test"):
    raise ValueError(f"split must be 'train' or 'test', got {split!r}")
  if not _is_int(num) or num < 0:
    raise ValueError(f"num must be an int >= 0, got {num!r}")
  if split == "test":
    return _draw(
      spec, _split_rng(seed, "test"), num, id_offset=0, excluded=frozenset(), unique=True
    )
  if not _is_int(num_test) or num_test < 0:
    raise ValueError(f"split='train' needs num_test (an int >= 0) to exclude, got {num_test!r}")
  test_keys = frozenset(t.solution for t in make_split(spec, "test", num_test, seed))
  return _draw(
    spec,
    _split_rng(seed, "train"),
    num,
    id_offset=TRAIN_ID_OFFSET,
    excluded=test_keys,
    unique=False,
  )


class ArithmeticEnv(SingleTurnEnv):
  """Single-turn environment: show the prompt, reward 1.0 iff the '#' answer is exact."""

  def _grade(self, task: Task, action_tokens: Sequence[int] | np.ndarray) -> StepResult:
    predicted = extract_answer(self._tokenizer.decode(action_tokens))
    return StepResult(
      observation=np.zeros((0,), np.int32),
      reward=float(predicted == task.answer),
      done=True,
      info={"answer": predicted, "target": task.answer, "format_ok": predicted is not None},
    )


def _is_int(x) -> bool:
  return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _reversed(n: int) -> str:
  return str(n)[::-1]


def _apply(total: int, op: str, operand: int) -> int:
  if op == "+":
    return total + operand
  if op == "-":
    return total - operand
  return total * operand


def _sample_chain(
  rng: np.random.Generator, spec: ArithmeticSpec
) -> tuple[int, list[tuple[str, int]]]:
  """Start value and (op, operand) steps whose running total never goes negative.

  A subtraction is only offered while the total is positive and never takes more than the
  total; if nothing is possible (only '-' allowed and the total hit 0) the chain restarts.
  `ArithmeticSpec` validation guarantees a restart can succeed.
  """
  while True:
    start = int(rng.integers(1, spec.max_operand + 1))
    total, steps = start, []
    for _ in range(spec.n_ops):
      allowed = [op for op in spec.ops if op != "-" or total > 0]
      if not allowed:
        break
      op = allowed[rng.integers(len(allowed))]
      high = min(total, spec.max_operand) if op == "-" else spec.max_operand
      operand = int(rng.integers(1, high + 1))
      steps.append((op, operand))
      total = _apply(total, op, operand)
    else:
      return start, steps


def _split_rng(seed: int, split: str) -> np.random.Generator:
  return np.random.default_rng(np.random.SeedSequence([seed, zlib.crc32(split.encode())]))


def _draw(
  spec: ArithmeticSpec,
  rng: np.random.Generator,
  num: int,
  *,
  id_offset: int,
  excluded: frozenset[str],
  unique: bool,
) -> list[Task]:
  """Draws `num` tasks, rejecting `excluded` problems and, while feasible, repeats."""
  tasks: list[Task] = []
  seen: set[str] = set()
  rejects_in_a_row = 0
  while len(tasks) < num:
    task = generate_task(rng, spec, id_offset + len(tasks))
    if task.solution in excluded:
      rejects_in_a_row += 1
      if rejects_in_a_row > _MAX_CONSECUTIVE_REJECTS:
        raise ValueError(
          f"the test split covers (almost) all problems of {spec}; no train problem found "
          f"in {_MAX_CONSECUTIVE_REJECTS} draws. Use a smaller num_test or a larger spec."
        )
      continue
    if unique and task.solution in seen:
      rejects_in_a_row += 1
      if rejects_in_a_row > _MAX_CONSECUTIVE_REJECTS:
        unique = False  # the space looks exhausted; accept repeats from here on
      continue
    rejects_in_a_row = 0
    seen.add(task.solution)
    tasks.append(task)
  return tasks
