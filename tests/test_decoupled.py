"""Golden numbers for the staleness corrections: decoupled PPO loss and freshness weights."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao_jax.rl import losses

MASK = jnp.array([True, True, True, False])


class DecoupledLossTest(chex.TestCase):
  @chex.all_variants
  def test_equals_ppo_clip_when_prox_is_behav(self):
    fn = self.variant(losses.decoupled_ppo_loss, static_argnums=(5, 6, 7))
    ppo = self.variant(losses.ppo_clip_loss, static_argnums=(4,))
    old = jnp.array([-1.0, -0.5, -2.0, -1.0])
    logp = old + jnp.log(jnp.array([1.5, 0.5, 1.1, 1.0]))  # ratios against old
    for adv in (2.0, -1.0):
      for level in ("token", "sequence"):
        loss, aux = fn(logp, old, old, jnp.float32(adv), MASK, 0.2, 5.0, level)
        ref_loss, ref_clipped = ppo(logp, old, jnp.float32(adv), MASK, 0.2)
        np.testing.assert_array_equal(loss, ref_loss)
        np.testing.assert_array_equal(aux["clipped_t"], ref_clipped)
        np.testing.assert_array_equal(aux["w_t"], [1.0, 1.0, 1.0, 0.0])
        np.testing.assert_array_equal(aux["truncated_t"], np.zeros(4))

  @chex.all_variants
  def test_token_truncation(self):
    fn = self.variant(losses.decoupled_ppo_loss, static_argnums=(5, 6, 7))
    behav = jnp.zeros(4)
    prox = jnp.log(jnp.array([0.5, 2.0, 4.0, 8.0]))  # w = pi_prox / pi_behav
    # logp == prox: u = 1, so loss_t = -w_t * A with w = min(w, 3) = [.5, 2, 3, masked]
    loss, aux = fn(prox, prox, behav, jnp.float32(2.0), MASK, 0.2, 3.0, "token")
    np.testing.assert_allclose(loss, [-1.0, -4.0, -6.0, 0.0], rtol=1e-6)
    np.testing.assert_allclose(aux["w_t"], [0.5, 2.0, 3.0, 0.0], rtol=1e-6)
    np.testing.assert_array_equal(aux["truncated_t"], [0.0, 0.0, 1.0, 0.0])
    np.testing.assert_array_equal(aux["clipped_t"], np.zeros(4))

  @chex.all_variants
  def test_sequence_truncation(self):
    fn = self.variant(losses.decoupled_ppo_loss, static_argnums=(5, 6, 7))
    behav = jnp.zeros(4)
    prox = jnp.log(jnp.array([0.5, 2.0, 4.0, 8.0]))
    # w = .5 * 2 * 4 = 4 over the valid tokens (the masked 8 is not part of the sequence)
    loss, aux = fn(prox, prox, behav, jnp.float32(2.0), MASK, 0.2, 5.0, "sequence")
    np.testing.assert_allclose(aux["w_t"], [4.0, 4.0, 4.0, 0.0], rtol=1e-5)
    np.testing.assert_allclose(loss, [-8.0, -8.0, -8.0, 0.0], rtol=1e-5)
    np.testing.assert_array_equal(aux["truncated_t"], np.zeros(4))
    # cap 3 < 4: every valid token truncated to 3
    loss, aux = fn(prox, prox, behav, jnp.float32(2.0), MASK, 0.2, 3.0, "sequence")
    np.testing.assert_allclose(aux["w_t"], [3.0, 3.0, 3.0, 0.0], rtol=1e-6)
    np.testing.assert_allclose(loss, [-6.0, -6.0, -6.0, 0.0], rtol=1e-6)
    np.testing.assert_array_equal(aux["truncated_t"], [1.0, 1.0, 1.0, 0.0])

  @chex.all_variants
  def test_sequence_weight_does_not_overflow(self):
    fn = self.variant(losses.decoupled_ppo_loss, static_argnums=(5, 6, 7))
    t = 64
    prox = jnp.full(t, 2.0)  # sum of log-ratios 128: exp overflows float32, the cap must hold
    loss, aux = fn(
      prox, prox, jnp.zeros(t), jnp.float32(1.0), jnp.ones(t, bool), 0.2, 2.0, "sequence"
    )
    np.testing.assert_allclose(aux["w_t"], np.full(t, 2.0))
    np.testing.assert_allclose(loss, np.full(t, -2.0))

  @chex.all_variants
  def test_gradient(self):
    prox = jnp.array([-1.0, -2.0, -0.5, -1.0])
    behav = prox - jnp.log(jnp.array([2.0, 0.5, 1.0, 1.0]))  # w = [2, .5, 1, masked]
    u = jnp.array([1.5, 0.5, 1.1, 1.0])
    logp = prox + jnp.log(u)

    def total(logp_t, prox_t):
      loss, _ = losses.decoupled_ppo_loss(
        logp_t, prox_t, behav, jnp.float32(2.0), MASK, 0.2, 10.0, "token"
      )
      return jnp.sum(loss)

    grad = self.variant(jax.grad(total, argnums=(0, 1)))
    g_logp, g_prox = grad(logp, prox)
    # A = 2 > 0. token 0: u 1.5 > 1.2, clipped branch taken -> 0. token 1: u .5 < .8, the min
    # keeps u*A -> -w*A*u = -.5*2*.5 = -.5. token 2: inside -> -1*2*1.1 = -2.2. token 3: masked.
    np.testing.assert_allclose(g_logp, [0.0, -0.5, -2.2, 0.0], rtol=1e-6)
    np.testing.assert_array_equal(g_prox, np.zeros(4))  # prox (and w) are constants

  @chex.all_variants
  def test_gradient_with_current_as_prox(self):
    behav = jnp.log(jnp.array([0.5, 0.25, 1.0, 1.0]))

    def total(logp_t):
      loss, _ = losses.decoupled_ppo_loss(
        logp_t, logp_t, behav, jnp.float32(-1.0), MASK, 0.2, 10.0, "token"
      )
      return jnp.sum(loss)

    logp = jnp.log(jnp.array([0.5, 0.5, 0.5, 0.5]))  # w = [1, 2, .5, masked], u = 1
    # loss_t = -w_t * u_t * A, d/dlogp = -w * A * u = [1, 2, .5, 0]
    np.testing.assert_allclose(self.variant(jax.grad(total))(logp), [1.0, 2.0, 0.5, 0.0], rtol=1e-6)

  def test_unknown_level(self):
    with pytest.raises(KeyError, match="unknown importance-weight level"):
      losses.decoupled_ppo_loss(
        jnp.zeros(2),
        jnp.zeros(2),
        jnp.zeros(2),
        jnp.float32(1.0),
        jnp.ones(2, bool),
        0.2,
        2.0,
        "batch",
      )

  def test_vmaps_over_batch(self):
    fn = jax.vmap(losses.decoupled_ppo_loss, in_axes=(0, 0, 0, 0, 0, None, None, None))
    loss, aux = fn(
      jnp.zeros((3, 4)),
      jnp.zeros((3, 4)),
      jnp.zeros((3, 4)),
      jnp.ones(3),
      jnp.ones((3, 4), bool),
      0.2,
      2.0,
      "token",
    )
    assert loss.shape == (3, 4) and aux["w_t"].shape == (3, 4)
    np.testing.assert_allclose(loss, -np.ones((3, 4)))


class FreshnessTest(chex.TestCase):
  @chex.all_variants
  def test_freshness_factor(self):
    fn = self.variant(functools.partial(losses.freshness_factor, half_life=2.0, max_staleness=6))
    s = jnp.array([0, 1, 2, 4, 6, 7, -1])
    # 2^(-s/2) up to 6; 7 is beyond max and -1 is invalid -> 0
    np.testing.assert_allclose(fn(s), [1.0, 0.70710678, 0.5, 0.25, 0.125, 0.0, 0.0], rtol=1e-6)

  @chex.all_variants
  def test_freshness_weights(self):
    s = jnp.array([0, 2, 6, 7])
    drop = self.variant(
      functools.partial(losses.freshness_weights, half_life=2.0, max_staleness=6, mode="drop")
    )
    decay = self.variant(
      functools.partial(losses.freshness_weights, half_life=2.0, max_staleness=6, mode="decay")
    )
    np.testing.assert_array_equal(drop(s), [1.0, 1.0, 1.0, 0.0])
    np.testing.assert_allclose(decay(s), [1.0, 0.5, 0.125, 0.0], rtol=1e-6)

  def test_unknown_mode(self):
    with pytest.raises(KeyError, match="unknown freshness mode"):
      losses.freshness_weights(jnp.zeros(2, jnp.int32), 2.0, 4, "linear")
