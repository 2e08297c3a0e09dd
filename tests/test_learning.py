"""End-to-end: the real sampler + jitted GRPO update learn; SFT learns the arithmetic format."""

import dataclasses

import jax
import numpy as np
import pytest

from sao_jax.batches import RLBatch, SAOBatch
from sao_jax.config import Config, MeshConfig, ModelConfig, OptimConfig, RLConfig
from sao_jax.learner import make_optimizer, make_rl_update
from sao_jax.models.transformer import TransformerLM
from sao_jax.packing import encode_prompts
from sao_jax.runners.compiled import compile_programs
from sao_jax.sharding import make_mesh
from sao_jax.tokenizer import CharTokenizer

TOK = CharTokenizer()
DIGITS = {TOK.encode(str(d))[0] for d in range(10)}


def test_grpo_learns_a_bandit():
  """Reward 1 when the first sampled character is a digit (10 of 98 tokens at the start)."""
  cfg = Config(
    model=ModelConfig(vocab_size=TOK.vocab_size, width=32, depth=1, heads=2, max_len=16),
    mesh=MeshConfig(shape=(1, 1, 1)),
    rl=RLConfig(
      prompts_per_step=8, group_size=8, max_new_tokens=2, optim=OptimConfig(lr=3e-3, warmup_steps=1)
    ),
  )
  model = TransformerLM(cfg.model)
  tx = make_optimizer(cfg.rl.optim)
  progs = compile_programs(
    cfg,
    model,
    tx,
    make_rl_update(model, tx, cfg.rl),
    with_ref=False,
    prompt_len=4,
    max_new_tokens=2,
    temperature=1.0,
    eos_id=TOK.eos_id,
    pad_id=TOK.pad_id,
    mesh=make_mesh(cfg.mesh, jax.devices()[:1]),
  )
  state = progs.init(jax.random.key(0))
  prompt, pvalid = encode_prompts(TOK, ["Q?"] * 64, 4)
  key = jax.random.key(1)
  rates = []
  for _ in range(40):
    key, sub = jax.random.split(key)
    out = jax.device_get(progs.sample(state.params, prompt, pvalid, sub))
    rewards = np.isin(out.tokens_bt[:, 0], list(DIGITS)).astype(np.float32)
    rates.append(rewards.mean())
    batch = RLBatch(
      prompt_bp=prompt,
      prompt_valid_bp=pvalid,
      tokens_bt=out.tokens_bt,
      valid_bt=out.valid_bt,
      logp_bt=out.logp_bt,
      rewards_b=rewards,
    )
    state, metrics = progs.update(state, progs.shard_batch(batch))
    assert np.isfinite(metrics["loss"])
    flat = np.mean([len(set(g)) == 1 for g in rewards.reshape(-1, 8)])  # no-signal groups
    assert float(metrics["groups_flat"]) == pytest.approx(flat)
    assert float(metrics["reward_zero_frac"]) == pytest.approx(np.mean(rewards == 0))
  assert np.mean(rates[:3]) < 0.3
  assert np.mean(rates[-5:]) > 0.8, rates


@pytest.mark.slow
def test_sft_then_grpo_runner_learns_arithmetic(tmp_path):
  """The trainer itself: SFT on one-digit sums (57 train facts, 24 held out) reaches well
  above chance (answers span 2..18), and the GRPO phase runs on it and keeps the skill."""
  from sao_jax.config import EvalConfig, SFTConfig, TaskConfig
  from sao_jax.runners.run import run

  cfg = Config(
    model=ModelConfig(width=64, depth=2, heads=4, max_len=64),
    task=TaskConfig(
      n_ops=1, max_operand=9, ops="+", num_train=2000, num_test=24, data_dir=str(tmp_path / "data")
    ),
    sft=SFTConfig(steps=250, batch_size=32, optim=OptimConfig(lr=3e-3)),
    rl=RLConfig(steps=10, prompts_per_step=4, max_new_tokens=16),
    eval=EvalConfig(num_problems=24, batch_size=24),
    log_every=5,
  )
  cfg = dataclasses.replace(cfg, name="learn")
  summary = run(cfg, tmp_path / "run", show_progress=False)
  # Held-out facts are never seen in training (disjoint splits): chance is about 1/17.
  assert summary["sft"]["accuracy"] > 0.2, summary
  assert summary["sft"]["format_rate"] > 0.9
  assert summary["rl"]["accuracy"] > 0.15, summary
  assert (tmp_path / "run" / "checkpoints" / "rl").is_dir()


@pytest.mark.parametrize("baseline", ["tracker", "value_head"])
def test_sao_update_learns_a_bandit_and_tracks_values(baseline):
  """Same bandit through the SAO update: one trajectory per task (64 tasks), tracker or
  learned-value baseline, behaviour log-probs from one version back (staleness 1)."""
  from sao_jax.config import SAOConfig
  from sao_jax.learner import make_sao_update

  cfg = Config(
    model=ModelConfig(
      vocab_size=TOK.vocab_size,
      width=32,
      depth=1,
      heads=2,
      max_len=16,
      value_head=baseline == "value_head",
    ),
    mesh=MeshConfig(shape=(1, 1, 1)),
    rl=RLConfig(max_new_tokens=2, optim=OptimConfig(lr=3e-3, warmup_steps=1)),
    sao=SAOConfig(batch_size=64, baseline=baseline),
  )
  model = TransformerLM(cfg.model)
  tx = make_optimizer(cfg.rl.optim)
  progs = compile_programs(
    cfg,
    model,
    tx,
    make_sao_update(model, tx, cfg.rl, cfg.sao),
    with_ref=False,
    prompt_len=4,
    max_new_tokens=2,
    temperature=1.0,
    eos_id=TOK.eos_id,
    pad_id=TOK.pad_id,
    mesh=make_mesh(cfg.mesh, jax.devices()[:1]),
    num_tasks=64,
  )
  state = progs.init(jax.random.key(0))
  prompt, pvalid = encode_prompts(TOK, ["Q?"] * 64, 4)
  key = jax.random.key(1)
  rates, devs, value_means, rhos = [], [], [], []
  behaviour = jax.device_get(state.params)  # samplers lag one version behind
  for _ in range(60):
    key, sub = jax.random.split(key)
    out = jax.device_get(progs.sample(behaviour, prompt, pvalid, sub))
    behaviour = jax.device_get(state.params)
    rewards = np.isin(out.tokens_bt[:, 0], list(DIGITS)).astype(np.float32)
    rates.append(rewards.mean())
    batch = SAOBatch.single_steps(
      prompt_bp=prompt,
      prompt_valid_bp=pvalid,
      tokens_bt=out.tokens_bt,
      valid_bt=out.valid_bt,
      logp_bt=out.logp_bt,
      rewards_b=rewards,
      task_b=np.arange(64, dtype=np.int32),
      staleness_b=np.ones(64, np.int32),
    )
    state, metrics = progs.update(state, progs.shard_batch(batch))
    devs.append(float(metrics["is_dev"]))
    value_means.append(float(metrics["value_mean"]))
    rhos.append(float(metrics["tracker_rho"]))
  assert np.mean(rates[:3]) < 0.3
  assert np.mean(rates[-5:]) > 0.7, rates  # from ~0.1
  values = np.asarray(state.tracker.alpha_n / (state.tracker.alpha_n + state.tracker.beta_n))
  # Each task's tracker is a discounted count of its rewards, forgetting by each step's rho
  # (from the policy's drift): its mean follows the batch success rate, discounted the same way.
  alpha = beta = 1.0
  for rate, rho in zip(rates, rhos, strict=True):
    alpha, beta = rho * alpha + rate, rho * beta + 1 - rate
  assert min(rhos) < 0.96  # a policy that learns this fast drifts: the tracker forgets faster
  assert abs(values.mean() - alpha / (alpha + beta)) < 0.05
  assert max(devs) > 0  # one version of lag shows up as importance-weight deviation
  if baseline == "value_head":  # the learned V(prompt) follows the success rate too
    assert abs(np.mean(value_means[-5:]) - np.mean(rates[-5:])) < 0.15, (value_means, rates)
