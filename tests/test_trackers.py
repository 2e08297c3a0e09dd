"""Golden numbers for SPO's Beta value tracker, advantage and task priorities (all variants)."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao_jax.rl import trackers
from sao_jax.rl.registry import ADVANTAGES


class TrackerTest(chex.TestCase):
  def test_init_prior(self):
    t = trackers.init_beta_tracker(3)
    np.testing.assert_array_equal(t.alpha_n, [1.0, 1.0, 1.0])
    np.testing.assert_array_equal(t.beta_n, [1.0, 1.0, 1.0])
    assert t.alpha_n.dtype == jnp.float32
    t = trackers.init_beta_tracker(2, alpha0=jnp.array([3.0, 0.5]), beta0=0.5)
    np.testing.assert_array_equal(t.alpha_n, [3.0, 0.5])
    np.testing.assert_array_equal(t.beta_n, [0.5, 0.5])

  @chex.all_variants
  def test_value(self):
    fn = self.variant(trackers.tracker_value)
    t = trackers.BetaTracker(
      alpha_n=jnp.array([1.0, 3.0, 1.0, 2.0]), beta_n=jnp.array([1.0, 1.0, 3.0, 2.0])
    )
    # alpha / (alpha + beta) of tasks 1, 2, 0, 1 -> 3/4, 1/4, 1/2, 3/4
    np.testing.assert_allclose(fn(t, jnp.array([1, 2, 0, 1])), [0.75, 0.25, 0.5, 0.75])

  @chex.all_variants
  def test_update_duplicates_and_padding(self):
    fn = self.variant(trackers.update_beta_tracker)
    t = trackers.init_beta_tracker(4)  # Beta(1, 1) everywhere
    task = jnp.array([2, 2, 0, 2, 1])
    rewards = jnp.array([1.0, 1.0, 0.0, 0.0, 1.0])
    rho = jnp.array([0.5, 0.1, 0.8, 0.9, 1.0])
    valid = jnp.array([True, False, True, True, True])  # row 1: padding on a real task
    new = fn(t, task, rewards, rho, valid)
    # task 2, rows 0 then 3 (row 1 ignored):
    #   alpha: 1 -> .5*1 + 1 = 1.5 -> .9*1.5 + 0 = 1.35
    #   beta:  1 -> .5*1 + 0 = .5  -> .9*.5 + 1 = 1.45
    # task 0, row 2: alpha .8*1 + 0 = .8, beta .8*1 + 1 = 1.8;  task 1, row 4: alpha 2, beta 1
    # task 3: not in the batch, unchanged.
    np.testing.assert_allclose(new.alpha_n, [0.8, 2.0, 1.35, 1.0], rtol=1e-6)
    np.testing.assert_allclose(new.beta_n, [1.8, 1.0, 1.45, 1.0], rtol=1e-6)

  @chex.all_variants
  def test_update_all_padding_is_noop(self):
    fn = self.variant(trackers.update_beta_tracker)
    t = trackers.BetaTracker(alpha_n=jnp.array([2.0, 3.0]), beta_n=jnp.array([5.0, 7.0]))
    new = fn(t, jnp.array([0, 1, 1]), jnp.ones(3), jnp.full(3, 0.1), jnp.zeros(3, bool))
    np.testing.assert_array_equal(new.alpha_n, t.alpha_n)
    np.testing.assert_array_equal(new.beta_n, t.beta_n)

  @chex.variants(with_jit=True, without_jit=True)
  def test_batch_update_equals_row_by_row(self):
    fn = self.variant(trackers.update_beta_tracker)
    rng = np.random.default_rng(0)
    b, n = 16, 5
    task = jnp.asarray(rng.integers(0, n, b), jnp.int32)  # 16 rows on 5 tasks: duplicates
    rewards = jnp.asarray(rng.uniform(size=b), jnp.float32)
    rho = jnp.asarray(rng.uniform(0.5, 1.0, b), jnp.float32)
    valid = jnp.asarray(rng.uniform(size=b) < 0.8)
    t0 = trackers.BetaTracker(
      alpha_n=jnp.asarray(rng.uniform(0.5, 3, n), jnp.float32),
      beta_n=jnp.asarray(rng.uniform(0.5, 3, n), jnp.float32),
    )
    alpha, beta = np.array(t0.alpha_n), np.array(t0.beta_n)
    for i in range(b):
      if valid[i]:
        k = int(task[i])
        alpha[k] = rho[i] * alpha[k] + rewards[i]
        beta[k] = rho[i] * beta[k] + 1 - rewards[i]
    new = fn(t0, task, rewards, rho, valid)
    np.testing.assert_allclose(new.alpha_n, alpha, rtol=1e-5)
    np.testing.assert_allclose(new.beta_n, beta, rtol=1e-5)

  def test_update_default_all_valid(self):
    t = trackers.init_beta_tracker(2)
    new = trackers.update_beta_tracker(
      t, jnp.array([1, 1]), jnp.array([1.0, 1.0]), jnp.array([0.5, 0.5])
    )
    # task 1: alpha 1 -> 1.5 -> 1.75, beta 1 -> .5 -> .25
    np.testing.assert_allclose(new.alpha_n, [1.0, 1.75])
    np.testing.assert_allclose(new.beta_n, [1.0, 0.25])

  @chex.all_variants
  def test_forgetting_factor(self):
    kl = jnp.array([0.0, 0.03, 0.06, 100.0])
    fn = self.variant(
      functools.partial(trackers.forgetting_factor, d_half=0.06, rho_max=0.96, rho_min=0.25)
    )
    # 2^(-kl/.06) = 1, 2^-.5, 1/2, ~0  -> clipped to [.25, .96]
    np.testing.assert_allclose(fn(kl), [0.96, 0.70710678, 0.5, 0.25], rtol=1e-6)
    fn = self.variant(
      functools.partial(trackers.forgetting_factor, d_half=0.06, rho_max=0.96, rho_min=0.875)
    )
    np.testing.assert_allclose(fn(kl), [0.96, 0.875, 0.875, 0.875], rtol=1e-6)

  @chex.all_variants
  def test_spo_advantage_recipe_centring(self):
    """With center=True and a negligible floor: the SPO recipe's batch z-score."""
    fn = self.variant(functools.partial(trackers.spo_advantage, std_floor=1e-6, center=True))
    rewards = jnp.array([1.0, 0.0, 0.0, 0.0, 1.0])
    values = jnp.array([0.5, 0.5, 0.5, 0.5, 0.0])
    valid = jnp.array([True, True, True, True, False])
    adv = fn(rewards, values, valid)
    # A = [.5, -.5, -.5, -.5], mean -.25 -> [.75, -.25, -.25, -.25], std sqrt(.75/4) = .4330127
    np.testing.assert_allclose(adv, [1.7320508, -0.5773503, -0.5773503, -0.5773503, 0.0], rtol=1e-5)
    np.testing.assert_allclose(jnp.mean(adv[:4]), 0.0, atol=1e-6)
    np.testing.assert_allclose(jnp.std(adv[:4]), 1.0, rtol=1e-5)
    # rewards [1, 0, 1, 0] against values [.5, .5, .25, .75]: A = [.5, -.5, .75, -.75], mean 0,
    # std sqrt((.25 + .25 + .5625 + .5625) / 4) = .6373774
    adv = fn(jnp.array([1.0, 0.0, 1.0, 0.0]), jnp.array([0.5, 0.5, 0.25, 0.75]), jnp.ones(4, bool))
    np.testing.assert_allclose(adv, [0.7844645, -0.7844645, 1.1766968, -1.1766968], rtol=1e-5)
    # identical advantages (e.g. a single valid row) carry no signal
    np.testing.assert_allclose(
      fn(jnp.ones(3), jnp.zeros(3), jnp.ones(3, bool)), np.zeros(3), atol=1e-6
    )

  def test_spo_advantage_registered(self):
    assert ADVANTAGES.get("spo_tracker") is trackers.spo_advantage

  @chex.all_variants
  def test_priority_weights(self):
    fn = self.variant(trackers.priority_weights)
    # p = [1/2, 1/4, 9/10, 3/4]
    t = trackers.BetaTracker(
      alpha_n=jnp.array([1.0, 1.0, 9.0, 3.0]), beta_n=jnp.array([1.0, 3.0, 1.0, 1.0])
    )
    probs = fn(t)
    # sqrt(p(1-p)) + .05 = [.55, .4830127, .35, .4830127], sum 1 + sqrt(3)/2 = 1.8660254
    np.testing.assert_allclose(probs, [0.2947441, 0.2588457, 0.1875644, 0.2588457], rtol=1e-5)
    np.testing.assert_allclose(jnp.sum(probs), 1.0, rtol=1e-6)
    assert int(jnp.argmax(probs)) == 0  # the p = 0.5 task

  def test_priority_peaks_at_half(self):
    p = jnp.linspace(0.01, 0.99, 99)
    probs = trackers.priority_weights(trackers.BetaTracker(alpha_n=p, beta_n=1.0 - p))
    np.testing.assert_allclose(p[jnp.argmax(probs)], 0.5, atol=1e-6)
    np.testing.assert_allclose(jnp.sum(probs), 1.0, rtol=1e-5)


def test_tracker_is_a_pytree():
  t = trackers.init_beta_tracker(3)
  doubled = jax.tree.map(lambda x: 2 * x, t)
  assert isinstance(doubled, trackers.BetaTracker)
  np.testing.assert_array_equal(doubled.beta_n, [2.0, 2.0, 2.0])


def test_value_rejects_float_tasks():
  with pytest.raises(AssertionError):
    trackers.tracker_value(trackers.init_beta_tracker(2), jnp.array([0.0, 1.0]))
