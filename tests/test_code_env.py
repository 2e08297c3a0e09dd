"""Tests for the procedural code family: generator, splits, TFDS builder, environment."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import time

import numpy as np
import pytest

from sao_jax.data.code_tfds import CodeTasksConfig, load_tasks
from sao_jax.envs.base import Task
from sao_jax.envs.code import (
  MAX_PROMPT_CHARS,
  MAX_SOLUTION_CHARS,
  TRAIN_ID_OFFSET,
  CodeEnv,
  CodeSpec,
  generate_task,
  hidden_tests,
  is_test_program,
  make_split,
  precheck,
  spec_for_difficulty,
  task_job,
)
from sao_jax.sandbox import SandboxPool
from sao_jax.tokenizer import CharTokenizer

TOK = CharTokenizer()


@pytest.fixture(scope="module")
def pool():
  with SandboxPool(2) as p:
    yield p


def _tasks(spec: CodeSpec, n: int, seed: int = 0) -> list[Task]:
  rng = np.random.default_rng(seed)
  return [generate_task(rng, spec, i) for i in range(n)]


def _shown(task: Task) -> list[tuple[str, str]]:
  examples = task.prompt.split(" # ", 1)[1].split("; ")
  return [tuple(e[2:].split(")==", 1)) for e in examples]


def test_tasks_are_one_line_printable_short_and_consistent():
  tasks = _tasks(CodeSpec(min_depth=1, max_depth=4), 600)
  for task in tasks:
    TOK.encode(task.prompt + task.solution)  # printable ASCII, no newline: raises otherwise
    assert len(task.prompt) <= MAX_PROMPT_CHARS and len(task.solution) <= MAX_SOLUTION_CHARS
    assert task.prompt.startswith('def f(x): "') and task.solution.startswith("return ")
    assert task.solution.removeprefix("return ") not in task.prompt
    fn = eval("lambda x: " + task.solution.removeprefix("return "))  # our own DSL code
    shown = _shown(task)
    hidden = json.loads(task.answer)
    assert len(shown) == 2 and len(hidden) == 5
    assert shown[0][1] != shown[1][1]  # the two shown examples differ
    assert not {i for i, _ in shown} & {i for i, _ in hidden}  # hidden inputs are new
    for inp, out in shown + [tuple(h) for h in hidden]:
      assert repr(fn(eval(inp))).replace(", ", ",") == out
    assert task.difficulty == task.prompt.split('"')[1].count(",") + 1
  depths = collections.Counter(t.difficulty for t in tasks)
  assert set(depths) == {1, 2, 3, 4} and min(depths.values()) > 120  # uniform, 150 expected


def test_generation_is_deterministic_and_the_knob_sets_the_depth():
  spec = CodeSpec()
  assert _tasks(spec, 40, seed=3) == _tasks(spec, 40, seed=3)
  assert _tasks(spec, 40, seed=3) != _tasks(spec, 40, seed=4)
  for level in (1, 2, 3, 4):
    assert {t.difficulty for t in _tasks(spec_for_difficulty(level), 30)} == {level}
  strings = _tasks(CodeSpec(kinds="s"), 50)
  assert all(_shown(t)[0][0].startswith("'") for t in strings)


@pytest.mark.parametrize(
  "bad",
  [
    dict(min_depth=0),
    dict(max_depth=5),
    dict(min_depth=3, max_depth=2),
    dict(kinds="x"),
    dict(kinds=""),
    dict(kinds="ll"),
    dict(num_hidden=0),
    dict(test_fraction=1.0),
    dict(test_fraction=0),
  ],
)
def test_spec_validation(bad):
  with pytest.raises(ValueError):
    CodeSpec(**bad)


def test_splits_are_disjoint_by_program_and_prefix_stable():
  spec = CodeSpec()
  test = make_split(spec, "test", 200, seed=0)
  train = make_split(spec, "train", 600, seed=0)
  assert not {t.solution for t in test} & {t.solution for t in train}
  assert all(is_test_program(t.solution, spec, 0) for t in test)
  assert not any(is_test_program(t.solution, spec, 0) for t in train)
  assert [t.task_id for t in test] == list(range(200))
  assert [t.task_id for t in train] == [TRAIN_ID_OFFSET + i for i in range(600)]
  assert make_split(spec, "test", 50, seed=0) == test[:50]
  # Unique within a depth until that depth is used up: depth 3 has thousands of programs.
  deep = [t.solution for t in test if t.difficulty == 3]
  assert len(set(deep)) == len(deep)
  depths = collections.Counter(t.difficulty for t in test)
  assert min(depths.values()) > 45  # uniform over 1..3: 67 expected
  # Another seed is another partition of the program space.
  assert make_split(spec, "test", 50, seed=1) != test[:50]


def test_tfds_builder_round_trips_the_splits(tmp_path):
  spec = CodeSpec(max_depth=2)
  for split, num in (("train", 60), ("test", 20)):
    got = load_tasks(spec, split, 60, 20, seed=5, data_dir=str(tmp_path))
    assert got == make_split(spec, split, num, seed=5)
  assert CodeTasksConfig.create(spec, 60, 20, 5).name == "code_d1-2_lsi_h5_tf0p2_n60_t20_s5"


def _task(answer: list[list[str]]) -> Task:
  return Task(
    task_id=0,
    prompt='def f(x): "reverse" # f([1,2])==[2,1]; f([])==[]',
    solution="return x[::-1]",
    answer=json.dumps(answer),
    difficulty=1,
  )


HAND = _task([["[1,2,3]", "[3,2,1]"], ["[4]", "[4]"], ["[5,6]", "[6,5]"], ["[7,7]", "[7,7]"]])


def _score(env: CodeEnv, task: Task, completion: str):
  env.reset(task)
  return env.step(TOK.encode(completion, add_eos=True) + [TOK.pad_id] * 3)


def test_env_reward_is_the_fraction_of_hidden_tests_passed(pool):
  with CodeEnv(TOK, pool) as env:
    assert _score(env, HAND, "return x[::-1]").reward == 1.0
    res = _score(env, HAND, "return x")  # right on the two palindromes only
    assert (res.reward, res.info["tests_passed"], res.info["status"]) == (0.5, 2, "failed")
    assert res.info["sandboxed"] and res.info["format_ok"]
    # Exact types: True is not 1, a list subclass is not a list.
    ints = _task([["[1,2]", "1"], ["[]", "0"]])
    assert _score(env, ints, "return True if x else 0").reward == 0.5
    sneaky = "return type('L', (list,), {'__eq__': lambda a, b: True})()"
    assert _score(env, HAND, sneaky).reward == 0.0
    # Refused operations earn nothing even when the tests pass.
    blocked = "return x[::-1] if __import__('socket').socket() else 0"
    res = _score(env, HAND, blocked)
    assert (res.reward, res.info["status"]) == (0.0, "blocked")
    res = _score(env, HAND, "while True: pass")
    assert res.info["status"] in ("failed", "timeout") and res.reward == 0.0


def test_env_protocol_and_format_reward(pool):
  env = CodeEnv(TOK, pool, format_weight=0.2)
  with pytest.raises(RuntimeError, match="reset"):
    env.step([1, 2])
  obs = env.reset(HAND)
  assert TOK.decode(obs) == HAND.prompt and obs.dtype == np.int32
  res = env.step(TOK.encode("return x"))
  assert res.done and res.observation.shape == (0,)
  assert res.reward == pytest.approx(0.8 * 0.5 + 0.2)
  with pytest.raises(RuntimeError, match="no episode"):
    env.step([1])
  assert _score(env, HAND, "return (").reward == 0.0  # no format credit either
  env.close()


def test_canonical_solutions_score_one_in_a_batch(pool):
  tasks = make_split(CodeSpec(min_depth=1, max_depth=4), "test", 40, seed=0)
  with CodeEnv(TOK, pool) as env:
    results = env.score_batch(tasks, [TOK.encode(t.solution, add_eos=True) for t in tasks])
  assert [r.reward for r in results] == [1.0] * 40
  assert {r.info["status"] for r in results} == {"passed"}


class _CountingPool:
  def __init__(self, pool):
    self.pool, self.jobs = pool, []

  def map(self, jobs):
    self.jobs += list(jobs)
    return self.pool.map(jobs)


def test_batch_scoring_skips_malformed_and_runs_duplicates_once(pool):
  spy = _CountingPool(pool)
  env = CodeEnv(TOK, spy)
  tasks = [HAND] * 8 + [_task([["[1]", "[1]"]])]
  texts = ["return x[::-1]"] * 4 + ["return x"] * 2 + ["return x[", "x = 1"] + ["return x[::-1]"]
  results = env.score_texts(tasks, texts)
  assert [r.reward for r in results] == [1.0] * 4 + [0.5] * 2 + [0.0, 0.0, 1.0]
  assert len(spy.jobs) == 3  # two distinct programs on HAND, one on the other task
  assert [r.info["sandboxed"] for r in results[6:8]] == [False, False]
  # executions, not scored completions: the copies of a program share its run
  assert [r.info["sandbox_runs"] for r in results] == [1, 0, 0, 0, 1, 0, 0, 0, 1]
  assert results[6].info["detail"].startswith("SyntaxError")
  assert results[7].info["detail"] == "the body returns nothing"
  fut = env.score_batch_async(tasks, [TOK.encode(t) for t in texts])
  assert [r.reward for r in fut.result(timeout=30)] == [r.reward for r in results]
  env.close()


def test_malformed_completions_cost_no_sandbox_run():
  class NoPool:
    def map(self, jobs):
      assert not jobs
      return []

  env = CodeEnv(TOK, NoPool())
  texts = ["return [v for v in x if", "retur x", "", "   ", "return x)", "pass"] * 50
  t0 = time.perf_counter()
  results = env.score_texts([HAND] * len(texts), texts)
  assert time.perf_counter() - t0 < 0.5
  assert {r.reward for r in results} == {0.0}
  assert precheck("return x") == "" and precheck("return x[").startswith("SyntaxError")


def test_precheck_of_suspicious_code_prints_no_syntax_warning():
  # In a fresh process: pytest resets warning filters set while it imports test modules.
  code = (
    "from sao_jax.envs.code import precheck\n"
    "assert precheck('return 1(x)') == ''\n"  # compiles (and fails its tests when run)
    "compile('1(2)', '<elsewhere>', 'eval')\n"
  )  # others' SyntaxWarnings still show
  proc = subprocess.run(
    [sys.executable, "-W", "default", "-c", code],
    capture_output=True,
    text=True,
    timeout=60,
    check=True,
  )
  assert proc.stderr.count("SyntaxWarning") == 1 and "<elsewhere>" in proc.stderr


def test_hidden_tests_and_task_job():
  tests = hidden_tests(HAND)
  assert len(tests) == 4
  assert tests[0] == (
    "r = f([1,2,3])\nassert type(r) is list and all(type(v) is int for v in r) and r == [3,2,1]"
  )
  job = task_job(HAND, "return x[::-1]")
  assert job.program == "def f(x): return x[::-1]" and job.tests == tuple(tests)
