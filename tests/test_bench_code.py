"""experiments/bench_code.py: its free-reward control family, and a --quick run end to end."""

from __future__ import annotations

import json

import pytest

from sao_jax.config import TaskConfig
from sao_jax.tasks import family_class
from sao_jax.tokenizer import CharTokenizer

TOK = CharTokenizer()


@pytest.fixture(scope="module")
def bench(experiment):
  return experiment("bench_code")


def test_free_family_is_the_code_tasks_scored_by_exact_match_without_a_sandbox(bench):
  cls = family_class(bench.FREE_FAMILY)  # by path, as the sampler processes load it
  fam = cls(TaskConfig(family=bench.FREE_FAMILY, num_train=8, num_test=4))
  task = fam.tasks("test")[0]
  code_task = family_class("code")(TaskConfig(family="code", num_train=8, num_test=4))
  assert task == code_task.tasks("test")[0]  # the same tasks as the code family
  envs = [fam.make_env(TOK) for _ in range(4)]
  for env in envs:
    assert env.reset(task).tolist() == TOK.encode(task.prompt)
  body = task.solution.removeprefix("return ")
  actions = [
    TOK.encode(task.solution, add_eos=True),
    TOK.encode(f"return ({body})"),
    TOK.encode("y = x"),
    TOK.encode(" " + task.solution),
  ]
  results = fam.step_many(envs, actions)
  # equivalent code that is not the reference earns nothing: exact match, not execution
  assert [r.reward for r in results] == [1.0, 0.0, 0.0, 1.0]
  assert [r.info["format_ok"] for r in results] == [True, True, False, True]
  assert all(r.done for r in results) and fam._pool is None  # no sandbox was started
  with pytest.raises(RuntimeError, match="no episode"):
    envs[0].step(actions[0])


@pytest.mark.slow
def test_bench_code_quick(bench, tmp_path):
  # The SAO arm is left out to save a sampler start-up (~20 s): the busy pair runs SAO on
  # the code reward the same way, and on the free one.
  out = tmp_path / "bench.json"
  bench.main(
    [
      "--quick",
      "--arms",
      "grpo,sft_continued",
      "--out",
      str(out),
      "--plot",
      str(tmp_path / "bench.png"),
      "--workdir",
      str(tmp_path / "runs"),
      "--no-progress",
    ]
  )
  r = json.loads(out.read_text())
  assert (tmp_path / "bench.png").stat().st_size > 0
  assert r["provenance"]["commit"] and len(r["load_average_start"]) == 3
  run = r["runs"][0]
  assert "sao" not in run
  for arm in ("grpo", "sft_continued", "busy_code", "busy_free"):
    assert run[arm]["steps"] >= bench.QUICK_UPDATES, arm
    assert 0.0 <= run[arm]["pass_rate"] <= 1.0
  for arm in ("grpo", "busy_code", "busy_free"):
    assert run[arm]["trajectories"] > 0 and 0.0 < run[arm]["learner_busy"] <= 1.0
    assert run[arm]["sandbox_runs"] >= 0 and run[arm]["reward_s_per_trajectory"] >= 0.0
  # the free arm ran no sandbox; its pass rate is re-scored by the hidden tests
  assert run["busy_free"]["sandbox_runs"] == 0 and "exact_match_rate" in run["busy_free"]
  assert run["sft_continued"]["seconds"] >= 0.9 * run["grpo"]["seconds"]
  assert run["grpo"]["gain_points"] == pytest.approx(
    100 * (run["grpo"]["pass_rate"] - run["sft"]["pass_rate"])
  )
  assert run["grpo"]["minus_control_points"] == pytest.approx(
    100 * (run["grpo"]["pass_rate"] - run["sft_continued"]["pass_rate"])
  )
  sm = r["summary"]
  assert sm["grpo"]["pass_rate"]["n"] == 1 and "sao" not in sm
  assert sm["busy_ratio_code_over_free"]["learner_busy"]["n"] == 1
