"""The heavy-tailed chain family (sao_jax.envs.chain): its declared laws, its generator, its
splits, its TFDS copy and the config that declares the benchmark's law."""

from __future__ import annotations

import re

import numpy as np
import pytest

from sao_jax import setup
from sao_jax.config import ConfigError, TaskConfig
from sao_jax.data.chain_tfds import ChainTasksConfig, load_tasks
from sao_jax.envs.arithmetic import ArithmeticEnv
from sao_jax.envs.chain import ChainSpec, generate_task, length_summary, make_split
from sao_jax.tasks import get_family
from sao_jax.tokenizer import CharTokenizer

TOK = CharTokenizer()


def test_zipf_law_is_a_truncated_power_law():
  s = ChainSpec(law="zipf", alpha=2.0, min_steps=1, max_steps=24)
  p = s.step_pmf()
  assert s.steps().tolist() == list(range(1, 25)) and p.sum() == pytest.approx(1.0)
  assert p[0] / p[1] == pytest.approx(4.0) and p[0] / p[23] == pytest.approx(576.0)
  m = s.step_moments()
  h1, h2 = (sum(k**-a for k in range(1, 25)) for a in (1, 2))
  assert m["mean"] == pytest.approx(h1 / h2)
  assert m["cv"] == pytest.approx(np.sqrt(24 / h2 - (h1 / h2) ** 2) / (h1 / h2))
  assert m["max_over_mean"] == pytest.approx(24 / m["mean"])


def test_lognormal_law_is_the_discretised_lognormal():
  s = ChainSpec(law="lognormal", mu=0.7, sigma=0.9, min_steps=2, max_steps=20)
  x = np.ceil(np.random.default_rng(0).lognormal(0.7, 0.9, 400_000))
  x = x[(x >= 2) & (x <= 20)]
  empirical = np.bincount(x.astype(int), minlength=21)[2:] / x.size
  np.testing.assert_allclose(s.step_pmf(), empirical, atol=3e-3)


@pytest.mark.parametrize(
  "kwargs, match",
  [
    (dict(law="pareto"), "law must be one of"),
    (dict(alpha=0.0), "alpha and sigma must be > 0"),
    (dict(min_steps=5, max_steps=4), "min_steps <= max_steps"),
    (dict(max_steps=65), "<= 64"),
    (dict(max_total=50, max_start=99), "max_total 50 must be >="),
    (dict(test_fraction=1.0), "test_fraction"),
    (dict(max_operand=True), "max_operand must be an int"),
    (dict(law="lognormal", mu=-40.0, min_steps=30, max_steps=40), "puts no weight"),
  ],
)
def test_bad_specs_are_refused(kwargs, match):
  with pytest.raises(ValueError, match=match):
    ChainSpec(**kwargs)


def _check_solution(task, spec):
  """The solution is the prompt's expression worked step by step, the total in range."""
  nums = [int(n) for n in re.findall(r"\d+", task.prompt)]
  ops = re.findall(r"[+-]", task.prompt)
  assert task.prompt.endswith("=?") and len(ops) == task.difficulty == len(nums) - 1
  total, lines = nums[0], []
  for op, n in zip(ops, nums[1:], strict=True):
    new = total + n if op == "+" else total - n
    assert 0 <= new <= spec.max_total and 1 <= n <= spec.max_operand
    lines.append(f"{total}{op}{n}={new}")
    total = new
  assert task.solution == ";".join(lines) + f";#{total}" and task.answer == str(total)


def test_generated_chains_are_right_and_bounded():
  spec = ChainSpec(max_start=20, max_operand=9, max_total=25)
  rng = np.random.default_rng(0)
  for k in (1, 2, 7, 24):
    for i in range(50):
      _check_solution(generate_task(rng, spec, i, k), spec)
  # The same rng state, the same task.
  a = generate_task(np.random.default_rng(3), spec, 0, 5)
  assert a == generate_task(np.random.default_rng(3), spec, 0, 5)


def test_splits_follow_the_law_and_are_disjoint():
  spec = ChainSpec()
  train, test = make_split(spec, "train", 6000, 0), make_split(spec, "test", 400, 0)
  assert [t.task_id for t in test] == list(range(400))
  assert train[0].task_id == 10**9 and not {t.solution for t in train} & {t.solution for t in test}
  for t in test[:50]:
    _check_solution(t, spec)
  # The share of each step count is the law's, within 4 standard errors.
  k = np.array([t.difficulty for t in train])
  counts = np.bincount(k, minlength=spec.max_steps + 1)[spec.min_steps :]
  p = spec.step_pmf()
  assert np.all(np.abs(counts / k.size - p) <= 4 * np.sqrt(p * (1 - p) / k.size) + 1e-3)
  # Test keeps its problems unique while it can; one-step problems are too few for 400 x
  # 0.62 of them to be unique in a 20 % share, so they repeat once exhausted.
  assert make_split(spec, "test", 100, 0) == test[:100]  # a prefix of a longer split
  assert make_split(spec, "test", 100, 1) != test[:100]
  with pytest.raises(ValueError, match="split must be"):
    make_split(spec, "dev", 1, 0)


def test_the_env_rewards_the_final_answer():
  spec = ChainSpec()
  task = make_split(spec, "test", 3, 0)[2]
  env = ArithmeticEnv(TOK)
  assert env.reset(task).tolist() == TOK.encode(task.prompt)
  assert env.step(TOK.encode(task.solution, add_eos=True)).reward == 1.0
  env.reset(task)
  wrong = task.solution.rpartition("#")[0] + f"#{int(task.answer) + 1}"
  assert env.step(TOK.encode(wrong)).reward == 0.0


def test_length_summary():
  s = length_summary([10, 10, 10, 10, 60])
  assert s["n"] == 5 and s["mean"] == 20 and s["max"] == 60 and s["max_over_mean"] == 3
  assert s["cv"] == pytest.approx(20 / 20) and s["p50"] == 10
  h = s["histogram"]
  assert sum(h["counts"]) == 5 and h["edges"][0] == 0 and h["edges"][-1] > 60
  assert length_summary([]) == {"n": 0}


def test_tfds_copy_equals_the_generator(tmp_path):
  spec = ChainSpec(alpha=1.5, max_steps=12)
  name = ChainTasksConfig.create(spec, 300, 50, 2).name
  assert name == "chain_zipf_a1p5_k1-12_s99_o9_m99_tf0p2_n300_t50_s2"
  for split, num in (("train", 300), ("test", 50)):
    got = load_tasks(spec, split, 300, 50, seed=2, data_dir=str(tmp_path))
    assert got == make_split(spec, split, num, 2)


def test_family_options_are_the_spec():
  fam = get_family(TaskConfig(family="chain", options=(("max_steps", 6),), num_test=8))
  assert fam.options == ChainSpec(max_steps=6)
  with pytest.raises(ConfigError, match="unknown option of task family 'chain'"):
    get_family(TaskConfig(family="chain", options=(("steps", 6),)))
  with pytest.raises(ConfigError, match="law must be one of"):
    get_family(TaskConfig(family="chain", options=(("law", "cauchy"),)))


def test_the_declared_benchmark_law_is_heavy_tailed(repo_root):
  """experiments/configs/sao_chain.py: completions heavy-tailed as reasoning traces (CV >= 1,
  max/mean >= 8, up to ~256 tokens), and the rows fit the model."""
  cfg = setup.load_config(str(repo_root / "experiments/configs/sao_chain.py"))
  s = setup.make_setup(cfg)
  lengths = [len(TOK.encode(t.solution, add_eos=True)) for t in s.train]
  law = length_summary(lengths)
  assert law["cv"] >= 1 and law["max_over_mean"] >= 8 and law["max"] <= 256, law
  assert s.prompt_len + cfg.rl.max_new_tokens <= cfg.model.max_len
  assert cfg.rl.max_new_tokens >= s.target_len == law["max"]
