"""Tests for the environment API and the generated arithmetic tasks."""

from __future__ import annotations

import re

import numpy as np
import pytest

from sao_jax.envs.arithmetic import (
  TRAIN_ID_OFFSET,
  ArithmeticEnv,
  ArithmeticSpec,
  extract_answer,
  generate_task,
  make_split,
  spec_for_difficulty,
)
from sao_jax.envs.base import StepResult, Task
from sao_jax.tokenizer import CharTokenizer

_STEP = re.compile(r"^(\d+)([-+*])(\d+)=(\d+)$")
_SPECS = [
  ArithmeticSpec(),
  ArithmeticSpec(n_ops=1, max_operand=5),
  ArithmeticSpec(n_ops=3, max_operand=20, ops="+-*"),
  ArithmeticSpec(n_ops=4, max_operand=99, ops="+-*", reverse_digits=True),
  ArithmeticSpec(n_ops=2, max_operand=20, ops="*", reverse_digits=True),
  ArithmeticSpec(n_ops=4, max_operand=9, ops="-"),
  ArithmeticSpec(n_ops=4, max_operand=4, ops="-"),
]


def _tasks(spec: ArithmeticSpec, n: int, seed: int = 0) -> list[Task]:
  rng = np.random.default_rng(seed)
  return [generate_task(rng, spec, i) for i in range(n)]


def _parse_solution(spec: ArithmeticSpec, solution: str) -> tuple[list[tuple], str]:
  """Steps as forward-order ints (a, op, b, c) and the raw answer text."""
  *steps, final = solution.split(";")
  assert final.startswith("#")
  num = (lambda s: int(s[::-1])) if spec.reverse_digits else int
  parsed = []
  for step in steps:
    m = _STEP.match(step)
    assert m, step
    parsed.append((num(m[1]), m[2], num(m[3]), num(m[4])))
  return parsed, final[1:]


@pytest.mark.parametrize("spec", _SPECS, ids=str)
def test_solution_arithmetic_matches_prompt_and_is_non_negative(spec):
  apply = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
  for task in _tasks(spec, 400):
    steps, answer = _parse_solution(spec, task.solution)
    assert len(steps) == spec.n_ops
    for i, (a, op, b, c) in enumerate(steps):
      assert op in spec.ops
      assert apply[op](a, b) == c
      assert c >= 0
      assert 1 <= b <= spec.max_operand
      if i:
        assert a == steps[i - 1][3]  # the running total carries over
    assert 1 <= steps[0][0] <= spec.max_operand
    final = steps[-1][3]
    assert answer == task.answer == (str(final)[::-1] if spec.reverse_digits else str(final))
    # The prompt states the start value and the operands, in order, and nothing else.
    assert [int(x) for x in re.findall(r"\d+", task.prompt)] == [steps[0][0]] + [
      b for _, _, b, _ in steps
    ]
    assert task.difficulty == spec.difficulty


def test_generation_is_deterministic_by_seed():
  spec = ArithmeticSpec(n_ops=3, max_operand=20, ops="+-*")
  assert _tasks(spec, 50, seed=3) == _tasks(spec, 50, seed=3)
  assert _tasks(spec, 50, seed=3) != _tasks(spec, 50, seed=4)


def test_reverse_digits_reverses_every_solution_number_but_not_the_prompt():
  forward = _tasks(ArithmeticSpec(n_ops=3, max_operand=99, ops="+-*"), 200)
  backward = _tasks(ArithmeticSpec(n_ops=3, max_operand=99, ops="+-*", reverse_digits=True), 200)
  for f, b in zip(forward, backward, strict=True):
    assert f.prompt == b.prompt
    assert b.solution == re.sub(r"\d+", lambda m: m[0][::-1], f.solution)
    assert b.answer == f.answer[::-1]
  assert any(len(f.answer) > 1 and f.answer != f.answer[::-1] for f in forward)


def test_known_task_format():
  task = _tasks(ArithmeticSpec(max_operand=20), 1)[0]
  assert task == Task(
    task_id=0,
    prompt="Ann had 18 eggs, lost 10, got 7. Eggs?",
    solution="18-10=8;8+7=15;#15",
    answer="15",
    difficulty=22,
  )


@pytest.mark.parametrize("ops", ["+-", "+-*", "*", "+", "-"])
def test_two_op_prompts_are_short(ops):
  spec = ArithmeticSpec(n_ops=2, max_operand=20, ops=ops)
  assert max(len(t.prompt) for t in _tasks(spec, 3000)) <= 45


@pytest.mark.parametrize(
  "kwargs",
  [
    dict(n_ops=0),
    dict(n_ops=5),
    dict(n_ops=2.0),
    dict(max_operand=0),
    dict(ops=""),
    dict(ops="+/"),
    dict(ops="++"),
    dict(ops="-", n_ops=4, max_operand=3),
    dict(reverse_digits=1),
  ],
)
def test_spec_validation(kwargs):
  with pytest.raises(ValueError):
    ArithmeticSpec(**kwargs)


def test_spec_ops_are_canonical():
  assert ArithmeticSpec(ops="*-+") == ArithmeticSpec(ops="+-*")
  assert ArithmeticSpec(ops="*-+").ops == "+-*"


def test_spec_for_difficulty_is_monotone():
  specs = [spec_for_difficulty(level) for level in range(1, 8)]
  assert (specs[0].n_ops, specs[0].max_operand) == (1, 9)
  assert [s.n_ops for s in specs[:4]] == [1, 2, 3, 4]
  assert [s.max_operand for s in specs[3:]] == [9, 99, 999, 9999]
  difficulties = [s.difficulty for s in specs]
  assert difficulties == sorted(set(difficulties))
  assert spec_for_difficulty(2, ops="+-*", reverse_digits=True).reverse_digits
  with pytest.raises(ValueError):
    spec_for_difficulty(0)


@pytest.mark.parametrize(
  "text, expected",
  [
    ("7+5=12;#12", "12"),
    ("#1 #2", "2"),
    ("# 42 ", "42"),
    ("#", ""),
    ("no answer", None),
    ("", None),
  ],
)
def test_extract_answer(text, expected):
  assert extract_answer(text) == expected


def test_splits_are_disjoint_on_a_small_space():
  spec = ArithmeticSpec(n_ops=1, max_operand=5)  # 25 sums + 15 differences = 40 problems
  test = make_split(spec, "test", 10, seed=0)
  train = make_split(spec, "train", 2000, seed=0, num_test=10)
  test_keys = {t.solution for t in test}
  assert len(test_keys) == 10  # unique while the space allows
  assert not test_keys & {t.solution for t in train}
  assert len({t.solution for t in train}) == 30  # everything else, with repeats
  assert [t.task_id for t in test] == list(range(10))
  assert [t.task_id for t in train] == [TRAIN_ID_OFFSET + i for i in range(2000)]


def test_splits_are_disjoint_on_a_larger_space():
  spec = ArithmeticSpec(n_ops=2, max_operand=20)
  test = make_split(spec, "test", 500, seed=7)
  train = make_split(spec, "train", 5000, seed=7, num_test=500)
  test_keys = {t.solution for t in test}
  assert len(test_keys) == 500
  assert not test_keys & {t.solution for t in train}
  assert not {t.prompt for t in test} & {t.prompt for t in train}
  assert make_split(spec, "test", 500, seed=7) == test
  assert make_split(spec, "test", 200, seed=7) == test[:200]  # smaller test = prefix
  assert make_split(spec, "test", 500, seed=8) != test


def test_exhausted_space():
  spec = ArithmeticSpec(n_ops=1, max_operand=5)
  test = make_split(spec, "test", 60, seed=0)
  assert len(test) == 60 and len({t.solution for t in test}) == 40
  with pytest.raises(ValueError, match="covers"):
    make_split(spec, "train", 10, seed=0, num_test=60)


def test_make_split_argument_errors():
  spec = ArithmeticSpec()
  with pytest.raises(ValueError, match="num_test"):
    make_split(spec, "train", 10, seed=0)
  with pytest.raises(ValueError, match="split"):
    make_split(spec, "validation", 10, seed=0)
  with pytest.raises(ValueError, match="num"):
    make_split(spec, "test", -1, seed=0)


def test_env_rewards_exact_answers_only():
  tok = CharTokenizer()
  env = ArithmeticEnv(tok)
  task = _tasks(ArithmeticSpec(max_operand=20), 1)[0]
  assert env.max_steps == 1

  obs = env.reset(task)
  assert obs.dtype == np.int32
  np.testing.assert_array_equal(obs, tok.encode(task.prompt))
  # Tokens after EOS are ignored, as a fixed-length decode buffer would have them.
  result = env.step(np.array(tok.encode(task.solution, add_eos=True) + tok.encode("#99"), np.int32))
  assert isinstance(result, StepResult)
  assert (result.reward, result.done) == (1.0, True)
  assert result.observation.shape == (0,) and result.observation.dtype == np.int32
  assert result.info == {"answer": "15", "target": "15", "format_ok": True}

  env.reset(task)
  result = env.step(tok.encode("18-10=8;8+7=14;#14", add_eos=True))
  assert result.reward == 0.0 and result.info["format_ok"]

  env.reset(task)
  result = env.step(tok.encode("18-10=8;8+7=15;15", add_eos=True))
  assert result.reward == 0.0
  assert result.info == {"answer": None, "target": "15", "format_ok": False}


def test_env_step_outside_an_episode_raises():
  tok = CharTokenizer()
  env = ArithmeticEnv(tok)
  with pytest.raises(RuntimeError, match="reset"):
    env.step(tok.encode("#1"))
  task = _tasks(ArithmeticSpec(), 1)[0]
  env.reset(task)
  env.step(tok.encode("#1"))
  with pytest.raises(RuntimeError, match="reset"):
    env.step(tok.encode("#1"))
