"""The learned salience filter (sao_jax.compression.salience): what it decides, and that the
soft keep mask trains it from the policy's answer loss and nothing else."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from test_compression_memory import COMP, MODEL, TOK

from sao_jax.compression.memory import Compressor
from sao_jax.compression.policy import MemoryPolicy, make_memory_update
from sao_jax.compression.rollout import expert_memory_batch, expert_trajectory, script
from sao_jax.compression.salience import soft_memory
from sao_jax.config import CompressionConfig, ConfigError
from sao_jax.envs.longhorizon import LongHorizonEnv, LongHorizonSpec, make_split
from sao_jax.models.transformer import TransformerLM
from sao_jax.sampling import completion_logprobs

SAL = dataclasses.replace(COMP, salience="learned")


def _set_salience(params, logit: float):
  """Salience head that outputs `logit` everywhere (zero weights, the bias set)."""
  head = jax.tree.map(jnp.zeros_like, params["salience"])
  head["logit"]["bias"] = jnp.full_like(head["logit"]["bias"], logit)
  return dict(params, salience=head)


def test_config_rejects_unknown_salience():
  with pytest.raises(ConfigError, match="salience"):
    CompressionConfig(salience="oracle")
  assert "salience" not in Compressor(COMP, TOK.vocab_size).init(jax.random.key(0))


def test_salient_steps_are_kept_and_rank_eviction_instead_of_surprise():
  # No step is a candidate by surprise (threshold above any surprise), nothing is a turning
  # point by surprise; budget 2, capacity 4.
  cfg = dataclasses.replace(
    SAL, keep_threshold=50.0, turning_surprise=100.0, budget=2, capacity=4, visible=2
  )
  comp = Compressor(cfg, TOK.vocab_size)
  s = 10
  v = jax.random.normal(jax.random.key(2), (s, 2, 8))
  zeros = jnp.zeros(s)
  ok = jnp.ones(s, bool)
  params = comp.init(jax.random.key(0))
  # Salience 0 everywhere: only the structural first and last steps are kept.
  final, _ = comp.scan_trajectory(_set_salience(params, -10.0), v, zeros, ok & False, ok)
  assert np.asarray(final.bank.step_c)[: int(final.bank.count)].tolist() == [0, 9]
  # Salience 1 everywhere: steps are candidates; the budget keeps 2 of them.
  final, info = comp.scan_trajectory(_set_salience(params, 10.0), v, zeros, ok & False, ok)
  assert int(final.bank.count) == 4  # first, 2 budget entries, last
  assert float(info["salience"][3]) > 0.99
  # Every step a candidate by surprise (threshold 0): the budget's first two are steps 1, 2.
  # A head that scores step 5 (by its vector) above the rest: step 5 replaces a budget entry,
  # and no later, less salient step replaces it, whatever their surprise.
  v = v.at[:, :, 0].set(0.0).at[5, 0, 0].set(3.0)
  hidden = jnp.zeros((16, cfg.salience_hidden)).at[0, 0].set(1.0)
  head = {
    "hidden": {"kernel": hidden, "bias": jnp.zeros((cfg.salience_hidden,))},
    "logit": {
      "kernel": jnp.zeros((cfg.salience_hidden, 1)).at[0].set(10.0),
      "bias": -5.0 + jnp.zeros(1),
    },
  }
  comp0 = Compressor(dataclasses.replace(cfg, keep_threshold=0.0), TOK.vocab_size)
  final, info = comp0.scan_trajectory(dict(params, salience=head), v, zeros, ok & False, ok)
  sal = np.asarray(info["salience"])
  assert sal[5] > 0.99 and np.all(np.delete(sal, 5) < 0.01)
  kept = np.asarray(final.bank.step_c)[: int(final.bank.count)].tolist()
  assert len(kept) == 4 and 5 in kept and kept[0] == 0 and kept[-1] == 9
  assert int(final.evicted) == 1


def test_salience_threshold_decides_which_keep_probabilities_are_candidates():
  # Keep probability sigmoid(-1) = 0.27 everywhere and no candidate by surprise: not salient at
  # the default 0.5 (first and last step only), salient at 0.25 (the budget's two as well).
  cfg = dataclasses.replace(
    SAL, keep_threshold=50.0, turning_surprise=100.0, budget=2, capacity=4, visible=2
  )
  s = 10
  v = jax.random.normal(jax.random.key(2), (s, 2, 8))
  zeros, ok = jnp.zeros(s), jnp.ones(s, bool)
  params = _set_salience(Compressor(cfg, TOK.vocab_size).init(jax.random.key(0)), -1.0)

  def kept(threshold):
    comp = Compressor(dataclasses.replace(cfg, salience_threshold=threshold), TOK.vocab_size)
    final, info = comp.scan_trajectory(params, v, zeros, ok & False, ok)
    assert np.allclose(np.asarray(info["salience"]), 1 / (1 + np.e))
    return np.asarray(final.bank.step_c)[: int(final.bank.count)].tolist()

  assert kept(0.5) == [0, 9]
  assert kept(0.25) == [0, 1, 2, 9]
  assert CompressionConfig().salience_threshold == 0.5
  for bad in (-0.1, 1.5):
    with pytest.raises(ConfigError, match="salience_threshold"):
      CompressionConfig(salience_threshold=bad)


def test_salient_turning_keeps_only_salient_surprises_for_good():
  # Every step surprises the LSTM past the turning threshold (threshold 0). Without the gate
  # all ten are turning points; with it an unsalient step competes for the budget (2) and a
  # salient one is still a turning point, outside the budget.
  cfg = dataclasses.replace(
    SAL, keep_threshold=0.0, turning_surprise=0.0, budget=2, capacity=8, visible=8, evict=True
  )
  s = 10
  v = jax.random.normal(jax.random.key(2), (s, 2, 8))
  zeros, ok = jnp.zeros(s), jnp.ones(s, bool)
  params = Compressor(cfg, TOK.vocab_size).init(jax.random.key(0))

  def kept(gate, logit):
    comp = Compressor(dataclasses.replace(cfg, salient_turning=gate), TOK.vocab_size)
    final, info = comp.scan_trajectory(_set_salience(params, logit), v, zeros, ok & False, ok)
    bank = final.bank
    return int(bank.count), int(np.sum(np.asarray(bank.turning_c)[: int(bank.count)]))

  assert kept(False, -10.0) == (8, 8)  # all turning points: the bank fills, nothing evicts
  assert kept(True, -10.0) == (4, 2)  # first and last, and the budget's two
  assert kept(True, 10.0) == (8, 8)  # salient surprises are turning points as before
  # Without a learned head the gate does nothing.
  plain = dataclasses.replace(cfg, salience="none", salient_turning=True)
  final, _ = Compressor(plain, TOK.vocab_size).scan_trajectory(
    Compressor(plain, TOK.vocab_size).init(jax.random.key(0)), v, zeros, ok & False, ok
  )
  assert int(final.bank.count) == 8


def test_soft_memory_biases_earlier_steps_by_log_keep_probability():
  v = jnp.arange(4 * 2 * 3, dtype=jnp.float32).reshape(4, 2, 3)
  p = jnp.asarray([1.0, 0.5, 0.25, 1.0])
  vec, ok, bias = soft_memory(v, p, jnp.asarray([True, True, False, True]), 3)
  assert vec.shape == (8, 3)
  np.testing.assert_array_equal(np.asarray(ok), [1, 1, 1, 1, 0, 0, 0, 0])
  np.testing.assert_allclose(
    np.asarray(bias)[:4], np.log(np.repeat([1.0, 0.5], 2) + 1e-6), atol=1e-6
  )
  # A key biased by log p gets its attention weight scaled by p before renormalisation.
  model = TransformerLM(dataclasses.replace(MODEL, memory_slots=2))
  mem = jax.random.normal(jax.random.key(0), (1, 2, 8))
  prompt = jnp.ones((1, 4), jnp.int32)
  pv = jnp.ones((1, 4), bool)
  toks, tv = jnp.ones((1, 2), jnp.int32), jnp.ones((1, 2), bool)
  params = model.init(jax.random.key(1), prompt, prompt, jnp.ones((1, 6, 6), bool), memory_bmd=mem)[
    "params"
  ]

  def logp(mem_valid, bias=None):
    return completion_logprobs(
      model,
      params,
      prompt,
      pv,
      toks,
      tv,
      memory_bmd=mem,
      memory_valid_bm=mem_valid,
      memory_bias_bm=bias,
    ).logp_bt

  both = jnp.ones((1, 2), bool)
  one = jnp.asarray([[True, False]])
  # Bias -inf-like on slot 1 is dropping it; bias 0 is keeping it.
  np.testing.assert_allclose(logp(both, jnp.asarray([[0.0, -1e4]])), logp(one), atol=1e-5)
  np.testing.assert_allclose(logp(both, jnp.zeros((1, 2))), logp(both), atol=1e-6)


def test_supervised_update_trains_the_head_through_the_soft_mask_only():
  policy = MemoryPolicy(TransformerLM(MODEL), Compressor(SAL, TOK.vocab_size))
  spec = LongHorizonSpec("retention", n_steps=12, n_facts=2, min_gap=4, period=5)
  trajs = [
    expert_trajectory(
      LongHorizonEnv(TOK),
      t,
      script(t, TOK)[1],
      TOK,
      window=SAL.window,
      step_len=SAL.step_len,
      completion_len=3,
    )
    for t in make_split(spec, "train", 4, 0, num_test=4)
  ]
  batch = expert_memory_batch(
    trajs, [np.where(t.graded, 100.0, 1.0) for t in trajs], steps=12, rows=4, seed=0
  )
  # Plain SGD at step 1: the parameter change is minus the gradient (read under jit).
  sgd = optax.sgd(1.0)
  state = policy.init_state_fn(sgd)(jax.random.key(0))

  def grads(coef, price):
    cfg = dataclasses.replace(SAL, salience_coef=coef, salience_price=price)
    pol = MemoryPolicy(policy.model, Compressor(cfg, TOK.vocab_size))
    new, metrics = jax.jit(make_memory_update(pol, sgd, mode="sft"))(state, batch)
    return jax.tree.map(lambda a, b: a - b, state.params, new.params), metrics

  g1, metrics = grads(1.0, 0.05)
  g0, _ = grads(0.0, 0.0)
  assert {"salience_nll", "salience_keep"} <= set(metrics)
  assert np.isfinite(float(metrics["salience_nll"]))
  norm = lambda t: float(sum(jnp.sum(x**2) for x in jax.tree.leaves(t)))  # noqa: E731
  assert norm(g1["salience"]) > 0 and norm(g0["salience"]) == 0
  # The soft pass holds the policy and the encoder fixed: their gradients do not change.
  for part in ("policy", "encoder", "temporal", "decoder"):
    for a, b in zip(jax.tree.leaves(g1[part]), jax.tree.leaves(g0[part]), strict=True):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=1e-5)
