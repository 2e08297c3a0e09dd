"""Task families by config: the registry, options, the long-horizon family's supervised rows,
and a family defined in this file trained by `sao-jax train` with no edit to the package."""

import dataclasses
import json
import pathlib
import subprocess

import numpy as np
import pytest

from sao_jax.config import Config as RunConfig
from sao_jax.config import ConfigError, TaskConfig, apply_overrides
from sao_jax.envs.base import StepResult, Task
from sao_jax.families import LongHorizon
from sao_jax.setup import validate
from sao_jax.tasks import FAMILIES, TaskFamily, family_class
from sao_jax.tokenizer import CharTokenizer

TOK = CharTokenizer()
HERE = pathlib.Path(__file__).resolve()


class EchoEnv:
  max_steps = 1

  def reset(self, task):
    self.want = task.answer
    return np.asarray(TOK.encode(task.prompt), np.int32)

  def step(self, action_tokens):
    return StepResult(
      np.zeros(0, np.int32), float(TOK.decode(action_tokens) == self.want), True, {}
    )


class Echo(TaskFamily):
  """A toy family that lives in this test file: repeat a two-digit number."""

  def tasks(self, split):
    nums = range(10, 60) if split == "train" else range(60, 100)
    return [Task(i, f"say {n}:", str(n), str(n), 1) for i, n in enumerate(nums)]

  def make_env(self, tok):
    return EchoEnv()


def test_builtin_families_and_clear_errors():
  validate(RunConfig())  # the default family resolves
  assert {"arithmetic", "longhorizon"} <= set(FAMILIES.names())
  with pytest.raises(ConfigError, match="task.family 'nope' unknown; known: arithmetic"):
    family_class("nope")
  with pytest.raises(ConfigError, match="not a TaskFamily subclass"):
    family_class(f"{HERE}:EchoEnv")
  with pytest.raises(ConfigError, match="cannot import"):
    family_class("no_such_module_xyz:Thing")
  assert family_class(f"{HERE}:Echo").__name__ == "Echo"


def test_options_are_typed_overridable_and_checked():
  cfg = apply_overrides(
    RunConfig(task=TaskConfig(family="longhorizon")),
    ["task.options.n_steps=48", "task.options.kind=navigation", "task.options.n_steps=40"],
  )
  assert dict(cfg.task.options) == {"n_steps": 40, "kind": "navigation"}
  fam = validate(cfg)
  assert fam.options.n_steps == 40 and fam.options.kind == "navigation"
  bad = [
    ("task.options.n_step=40", "unknown option .* known: graded_weight, kind"),
    ("task.options.n_steps=4.5", "expects int"),
    ("task.options.n_steps=5", "n_steps must be in"),
  ]
  for override, message in bad:
    with pytest.raises(ConfigError, match=message):
      validate(apply_overrides(cfg, [override]))
  with pytest.raises(ConfigError, match="unknown option"):  # a family without options
    validate(apply_overrides(RunConfig(), ["task.options.x=1"]))


def test_compression_is_refused_where_the_runners_cannot_honour_it():
  """GRPO (`runners.grpo.MemoryGroups`) and SAO (`runners.memory_sao`, episodes per call) run with
  compressed memory; the RL options neither update implements are refused by name, never run
  without compression."""
  from sao_jax.config import CompressionConfig, ModelConfig, RLConfig

  cfg = RunConfig(
    model=ModelConfig(memory_slots=8, memory_dim=32),
    compression=CompressionConfig(enabled=True, visible=4, vectors_per_step=2, dim=32),
    rl=RLConfig(steps=1),
  )
  validate(cfg)
  for override, message in [
    ("rl.algorithm=sao", "sao.continuous=True is not supported"),
    ("rl.sampling=samplers", "rl.sampling='samplers'"),
    ("rl.kl_coef=0.1", "rl.kl_coef=0.1 is not supported"),
    ("rl.ppo_epochs=2", "rl.ppo_epochs=2 is not supported"),
  ]:
    with pytest.raises(ConfigError, match=message):
      validate(apply_overrides(cfg, [override]))
  validate(apply_overrides(cfg, ["rl.algorithm=sao", "rl.steps=0"]))  # no RL phase
  validate(apply_overrides(cfg, ["rl.algorithm=sao", "sao.continuous=False"]))


def test_longhorizon_sft_rows_are_what_the_sampler_shows():
  """Each supervised row is the window the sampler's context holds at that step when the
  expert acts: [BOS, obs_0, act_0 + EOS, obs_1, ...][-window:] -> act_t + EOS."""
  cfg = TaskConfig(
    family="longhorizon",
    num_train=4,
    num_test=2,
    options=(
      ("n_steps", 12),
      ("n_facts", 2),
      ("min_gap", 4),
      ("window", 16),
      ("graded_weight", 50.0),
    ),
  )
  fam = LongHorizon(cfg)
  task = fam.tasks("train")[0]
  rows = fam.sft_examples(task, TOK, 16)
  env = fam.make_env(TOK)
  context = [TOK.bos_id] + env.reset(task).tolist()
  graded = 0
  for row, act in zip(rows, task.solution.split("\n"), strict=True):
    assert row.context == context[-16:]
    assert row.target == TOK.encode(act, add_eos=True)
    res = env.step(np.asarray(row.target))
    graded += row.weight == 50.0
    assert res.reward == (1.0 if row.weight == 50.0 else 0.0)  # the expert answers right
    context += row.target + res.observation.tolist()
  assert res.done and graded == 2 == fam.max_reward(task)


@pytest.mark.slow
def test_a_family_from_this_file_trains_through_the_cli(repo_root, tmp_path):
  # imported here: the run imports this file without pytest's path
  from conftest import subprocess_env, train_cmd

  workdir = tmp_path / "w"
  proc = subprocess.run(
    train_cmd(
      "experiments/configs/reverse.py:tiny",
      workdir,
      [
        f"task.family={HERE}:Echo",
        "task.num_train=50",
        "task.num_test=40",
        "eval.num_problems=40",
        "recovery.val_problems=10",
      ],
    ),
    cwd=repo_root,
    env=subprocess_env(),
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  summary = json.loads((workdir / "summary.json").read_text())
  assert summary["train_problems"] == 50 and summary["test_problems"] == 40
  assert summary["sft"]["steps"] == 20 and summary["rl"]["steps"] == 4
  assert summary["rl"]["trajectories"] >= 4 * 16 and summary["rl"]["bad_records"] == 0
  assert json.loads((workdir / "config.json").read_text())["task"]["family"] == f"{HERE}:Echo"


def test_a_flawed_teacher_misreads_its_verbs_in_the_demonstrations_only(tmp_path):
  """task.options.teacher_misreads: the train split's worked solutions do the misread
  subtraction verbs as additions (the chain carried on from the wrong total); answers, rewards
  and the test split stay true."""
  from sao_jax.envs.arithmetic import ArithmeticEnv, make_split, misread_solution
  from sao_jax.tasks import get_family

  task = Task(7, "Max had 5 keys, gave 5, got 5. Keys?", "5-5=0;0+5=5;#5", "5", 20)
  assert misread_solution(task, ("gave",)) == "5+5=10;10+5=15;#15"
  assert misread_solution(task, ("sold",)) == task.solution  # no such verb in this prompt
  rev = Task(8, "Ann had 9 eggs, sold 3, then x4. Eggs?", "9-3=6;6*4=42;#42", "42", 20)
  assert misread_solution(rev, ("sold",), reverse_digits=True) == "9+3=21;21*4=84;#84"
  with pytest.raises(ValueError, match="not subtraction verbs"):
    misread_solution(task, ("got",))
  with pytest.raises(ValueError, match="not the one its prompt gives"):
    misread_solution(Task(9, task.prompt, "5-5=1;1+5=6;#6", "6", 20), ("gave",))

  def family(*misreads):
    opts = (("teacher_misreads", misreads),)
    return get_family(TaskConfig(options=opts, num_train=400, num_test=50, data_dir=str(tmp_path)))

  clean, flawed = family(), family("gave", "used")
  train, flawed_train = clean.tasks("train"), flawed.tasks("train")
  assert flawed.tasks("test") == clean.tasks("test") == make_split(clean.specs()[0], "test", 50, 0)
  assert [t.answer for t in flawed_train] == [t.answer for t in train]  # the truth
  changed = [(a, b) for a, b in zip(train, flawed_train, strict=True) if a.solution != b.solution]
  assert all(" gave " in a.prompt or " used " in a.prompt for a, _ in changed)
  assert flawed.teacher_flaw_rate() == len(changed) / 400 and 0.25 < len(changed) / 400 < 0.45
  assert clean.teacher_flaw_rate() == 0.0 and 0.1 < family("gave").teacher_flaw_rate() < 0.3
  # Imitating the teacher earns nothing where it is wrong: the reward reads the true answer.
  tok = CharTokenizer()
  env = ArithmeticEnv(tok)
  a, b = changed[0]
  env.reset(b)
  assert env.step(np.asarray(tok.encode(b.solution, add_eos=True))).reward == 0.0
  with pytest.raises(ConfigError, match="teacher_misreads"):
    family("got")


def test_a_flawed_code_teacher_misreads_stage_words_the_same_way_every_time(tmp_path):
  from sao_jax.envs.base import Task
  from sao_jax.envs.code import CODE_MISREADS, hidden_tests, misread_solution
  from sao_jax.tasks import get_family

  task = Task(
    1, 'def f(x): "evens, first 2, sum"', "return sum([v for v in x if v%2==0][:2])", "", 0
  )
  assert misread_solution(task, ("evens",)) == "return sum([v for v in x if v%2][:2])"
  assert misread_solution(task, ("first",)) == "return sum([v for v in x if v%2==0][-2:])"
  both = misread_solution(task, ("evens", "first"))
  assert both == "return sum([v for v in x if v%2][-2:])"
  srt = Task(2, 'def f(x): "sort, count"', "return len(sorted(x))", "", 0)
  assert misread_solution(srt, tuple(CODE_MISREADS)) == srt.solution  # no such stage
  rev = Task(3, 'def f(x): "reverse, add 2"', "return [v+2 for v in x[::-1]]", "", 0)
  assert misread_solution(rev, ("reverse", "add")) == "return [v-2 for v in x]"
  with pytest.raises(ValueError, match="unknown"):
    misread_solution(task, ("sort",))

  def family(*misreads):
    opts = (("teacher_misreads", misreads),)
    cfg = TaskConfig(
      family="code", options=opts, num_train=300, num_test=40, data_dir=str(tmp_path)
    )
    return get_family(cfg)

  clean, flawed = family(), family("evens", "first")
  train, flawed_train = clean.tasks("train"), flawed.tasks("train")
  assert flawed.tasks("test") == clean.tasks("test")
  assert [hidden_tests(t) for t in flawed_train] == [hidden_tests(t) for t in train]  # the truth
  changed = [(a, b) for a, b in zip(train, flawed_train, strict=True) if a.solution != b.solution]
  assert changed and all("evens" in a.prompt or "first" in a.prompt for a, _ in changed)
  assert flawed.teacher_flaw_rate() == len(changed) / 300 and clean.teacher_flaw_rate() == 0.0
  with pytest.raises(ConfigError, match="teacher_misreads"):
    family("sort")


def test_arithmetic_test_split_beyond_the_train_operands(tmp_path):
  """test_operand_above keeps test problems a model trained on smaller operands never saw:
  every kept problem has a number above the bound; the train split is untouched."""
  from sao_jax.envs.arithmetic import problem_numbers
  from sao_jax.tasks import get_family

  assert problem_numbers("7+5=12;12-3=9;#9") == [7, 5, 3]
  assert problem_numbers("7+51=85;#85", reverse_digits=True) == [7, 15]
  cfg = TaskConfig(
    n_ops_mix=(1, 2),
    max_operand=20,
    num_train=64,
    num_test=200,
    options=(("test_operand_above", 9),),
    data_dir=str(tmp_path),
  )
  test = get_family(cfg).tasks("test")
  assert 100 < len(test) < 200
  assert all(max(problem_numbers(t.solution)) > 9 for t in test)
  plain = get_family(dataclasses.replace(cfg, options=()))
  assert get_family(cfg).tasks("train") == plain.tasks("train")
  kept = [t for t in plain.tasks("test") if max(problem_numbers(t.solution)) > 9]
  assert kept == test
  with pytest.raises(ConfigError, match="no test problem has a number above"):
    get_family(dataclasses.replace(cfg, max_operand=9)).tasks("test")
