"""Tests for the HumanEval harness: TFDS builder, pass@k, sandboxed execution, CLI."""

from __future__ import annotations

import dataclasses
import gzip
import itertools
import math
import subprocess
import sys
from fractions import Fraction

import jax
import numpy as np
import pytest

from sao_jax.config import Config, ModelConfig
from sao_jax.data import humaneval_tfds
from sao_jax.envs.humaneval import evaluate, load_problems, pass_at_k, problem_job
from sao_jax.learner import make_optimizer, make_sft_update
from sao_jax.models.transformer import TransformerLM
from sao_jax.runners.code_eval import make_generate
from sao_jax.runners.compiled import compile_programs
from sao_jax.sandbox import SandboxPool, run_job
from sao_jax.tokenizer import CharTokenizer

WRONG = "    return None\n"  # runs, returns a value, is wrong everywhere


@pytest.fixture(scope="module")
def problems(tmp_path_factory):
  return load_problems(str(tmp_path_factory.mktemp("tfds")))


@pytest.fixture(scope="module")
def pool():
  with SandboxPool() as p:
    yield p


def _fixed(problems, completion_of):
  def generate(prompts, n):
    assert prompts == [p.prompt for p in problems]
    return [[completion_of(p, j) for j in range(n)] for p in problems]

  return generate


def test_builder_reads_the_164_problems_of_the_wheel(problems):
  rows = humaneval_tfds.read_source()
  assert len(problems) == humaneval_tfds.NUM_PROBLEMS == 164
  assert [p.index for p in problems] == list(range(164))
  assert [p.task_id for p in problems] == [f"HumanEval/{i}" for i in range(164)]
  assert [dataclasses.asdict(p) for p in problems] == [dict(r, index=i) for i, r in enumerate(rows)]
  assert problems[0].entry_point == "has_close_elements"


def test_a_modified_source_file_is_refused(tmp_path):
  fake = tmp_path / "HumanEval.jsonl.gz"
  fake.write_bytes(gzip.compress(b'{"task_id": "HumanEval/0"}\n'))
  with pytest.raises(ValueError, match="SHA-256"):
    humaneval_tfds.read_source(fake)


def test_pass_at_k_matches_the_combinatorial_definition():
  for n, c, k in itertools.product(range(1, 12), range(0, 12), range(1, 12)):
    if c <= n and k <= n:
      exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
      assert pass_at_k(n, c, k) == pytest.approx(float(exact), abs=1e-12)
  assert pass_at_k(10, 0, 10) == 0.0 and pass_at_k(10, 1, 10) == 1.0
  assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
  # Stable where the binomials are astronomically large.
  exact = 1 - Fraction(math.comb(1000 - 7, 100), math.comb(1000, 100))
  assert pass_at_k(1000, 7, 100) == pytest.approx(float(exact), rel=1e-12)
  for bad in ((5, 6, 1), (5, 2, 6), (5, 2, 0)):
    with pytest.raises(ValueError):
      pass_at_k(*bad)


SUBSET = slice(0, 164, 12)  # 14 problems, fixed


def test_canonical_solutions_pass_and_wrong_ones_fail_on_a_subset(problems, pool):
  subset = problems[SUBSET]
  right = evaluate(
    _fixed(subset, lambda p, j: p.canonical_solution), subset, n=1, ks=(1,), pool=pool
  )
  assert right["pass@1"] == 1.0 and right["statuses"] == {"passed": 14}
  wrong = evaluate(_fixed(subset, lambda p, j: WRONG), subset, n=1, ks=(1,), pool=pool)
  assert wrong["pass@1"] == 0.0 and wrong["statuses"] == {"failed": 14}


def test_pass_at_1_and_10_from_mixed_samples(problems, pool):
  subset = problems[:4]
  correct = {0: 10, 1: 3, 2: 1, 3: 0}  # samples j < correct[i] are the canonical solution
  res = evaluate(
    _fixed(subset, lambda p, j: p.canonical_solution if j < correct[p.index] else WRONG),
    subset,
    n=10,
    pool=pool,
  )
  assert [r["correct"] for r in res["per_problem"]] == [10, 3, 1, 0]
  assert res["pass@1"] == pytest.approx((1 + 0.3 + 0.1 + 0) / 4)
  assert res["pass@10"] == pytest.approx((1 + 1 + 1 + 0) / 4)
  with pytest.raises(ValueError, match="must return 10 completions"):
    evaluate(lambda prompts, n: [["x"]] * len(prompts), subset, n=10, pool=pool)
  with pytest.raises(ValueError, match="1..n"):
    evaluate(lambda prompts, n: [], subset, n=5, pool=pool)


def test_a_hostile_completion_is_contained(problems):
  res = run_job(problem_job(problems[0], "    import os; os.system('touch /tmp/x')\n"))
  assert res.status == "blocked"


@pytest.mark.slow
def test_all_164_canonical_pass_and_all_164_wrong_fail(problems, pool):
  right = evaluate(
    _fixed(problems, lambda p, j: p.canonical_solution), problems, n=1, ks=(1,), pool=pool
  )
  assert right["pass@1"] == 1.0, [r["task_id"] for r in right["per_problem"] if not r["correct"]]
  wrong = evaluate(_fixed(problems, lambda p, j: WRONG), problems, n=1, ks=(1,), pool=pool)
  assert wrong["pass@1"] == 0.0 and wrong["statuses"] == {"failed": 164}


@pytest.mark.slow
def test_make_generate_samples_n_completions_per_prompt():
  tok = CharTokenizer()
  cfg = Config(model=ModelConfig(width=16, depth=1, heads=2, max_len=32))
  model = TransformerLM(dataclasses.replace(cfg.model, vocab_size=tok.vocab_size))
  tx = make_optimizer(cfg.sft.optim)
  progs = compile_programs(
    cfg,
    model,
    tx,
    make_sft_update(model, tx),
    with_ref=False,
    prompt_len=16,
    max_new_tokens=8,
    temperature=1.0,
    eos_id=tok.eos_id,
    pad_id=tok.pad_id,
  )
  params = progs.init(jax.random.key(0)).params
  generate = make_generate(tok, progs, params, prompt_len=16, batch_size=4)
  out = generate(["def f(x):", "abc", "xyz"], 3)
  assert [len(c) for c in out] == [3, 3, 3]
  assert all(isinstance(t, str) and len(t) <= 8 for c in out for t in c)
  assert len({t for c in out for t in c}) > 1  # sampled, not one greedy string
  assert generate(["def f(x):", "abc", "xyz"], 3) == out  # seeded
  assert np.all([t.isascii() for c in out for t in c])


@pytest.mark.slow
def test_cli_humaneval_explains_a_tokenizer_that_cannot_encode_prompts(tiny_run_dir, repo_root):
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "sao_jax.cli",
      "eval",
      "--suite",
      "humaneval",
      "--workdir",
      str(tiny_run_dir),
    ],
    cwd=repo_root,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 2, proc.stderr
  assert "'char' tokenizer, which cannot encode HumanEval prompts" in proc.stderr
  assert "Traceback" not in proc.stderr
