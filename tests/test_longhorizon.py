"""Long-horizon tasks: deterministic scripts, gaps, rewards, splits, and the TFDS round trip."""

import numpy as np
import pytest

from sao_jax.data.longhorizon_tfds import load_tasks
from sao_jax.envs.longhorizon import (
  SEP,
  TRAIN_ID_OFFSET,
  LongHorizonEnv,
  LongHorizonSpec,
  generate_task,
  graded_steps,
  make_split,
)
from sao_jax.tokenizer import CharTokenizer

TOK = CharTokenizer()
SPECS = [
  LongHorizonSpec("retention", n_steps=44, n_facts=4, min_gap=32),
  LongHorizonSpec("navigation", n_steps=60, n_facts=3, min_gap=32, period=12),
  LongHorizonSpec("retention", n_steps=1000, n_facts=8, min_gap=32, period=100),
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_scripts_have_gaps_and_the_expert_gets_full_reward(spec):
  rng = np.random.default_rng(0)
  for i in range(5 if spec.n_steps > 100 else 30):
    task = generate_task(rng, spec, i)
    obs = task.prompt.split(SEP)
    acts = task.solution.split(SEP)
    assert len(obs) == len(acts) == spec.n_steps
    graded = graded_steps(task)
    assert len(graded) == spec.n_facts
    for q, ans in graded.items():
      if spec.family == "retention":
        key = obs[q][:-1] + ": "  # "Ann's pin?" -> "Ann's pin: "
      else:
        key = "key " + obs[q].split()[1][:-1] + " code "  # "door 2?" -> "key 2 code "
      facts = [s for s, o in enumerate(obs) if o.startswith(key)]
      assert len(facts) == 1 and q - facts[0] >= spec.min_gap
      assert obs[facts[0]].endswith(ans) and acts[q] == ans
    env = LongHorizonEnv(TOK)
    first = env.reset(task)
    assert TOK.decode(first) == obs[0]
    total = 0.0
    for t, a in enumerate(acts):
      res = env.step(TOK.encode(a, add_eos=True))
      total += res.reward
      assert res.done == (t == len(acts) - 1)
      assert res.info["graded"] == (t in graded)
    assert total == spec.n_facts
    with pytest.raises(RuntimeError):
      env.step([])


def test_wrong_answers_and_boundaries():
  spec = LongHorizonSpec("navigation", n_steps=40, n_facts=2, min_gap=8, period=10)
  task = generate_task(np.random.default_rng(1), spec, 0)
  env = LongHorizonEnv(TOK)
  env.reset(task)
  obs = task.prompt.split(SEP)
  rewards, boundary_next = [], []
  for _ in obs:
    res = env.step(TOK.encode("x"))
    rewards.append(res.reward)
    boundary_next.append(res.info["next_boundary"])
  assert sum(rewards) == 0
  expect = [obs[t + 1] == "stairs." for t in range(len(obs) - 1)] + [False]
  assert boundary_next == expect and sum(expect) >= 2


def test_generation_is_deterministic_and_splits_are_disjoint():
  spec = SPECS[0]
  a, b = make_split(spec, "test", 20, 3), make_split(spec, "test", 20, 3)
  assert a == b
  train = make_split(spec, "train", 50, 3, num_test=20)
  assert train[0].task_id == TRAIN_ID_OFFSET
  assert not {t.prompt for t in train} & {t.prompt for t in a}
  assert make_split(spec, "test", 20, 4) != a
  with pytest.raises(ValueError):
    LongHorizonSpec("retention", n_steps=40, n_facts=4, min_gap=32)  # no room for the gap
  with pytest.raises(ValueError):
    LongHorizonSpec("chess")


def test_tfds_round_trip_equals_the_generator(tmp_path):
  spec = LongHorizonSpec("navigation", n_steps=50, n_facts=2, min_gap=32, period=10)
  for split in ("train", "test"):
    got = load_tasks(spec, split, 12, 5, seed=1, data_dir=str(tmp_path))
    assert got == make_split(spec, split, 12 if split == "train" else 5, 1, num_test=5)
