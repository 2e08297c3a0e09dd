"""Golden numbers for the pure RL functions, under all chex variants (jit, no-jit, ...)."""

import chex
import jax.numpy as jnp
import numpy as np
import pytest

from sao_jax.rl import advantages, losses


class RLMathTest(chex.TestCase):
  @chex.all_variants
  def test_group_norm(self):
    fn = self.variant(advantages.group_norm_advantage)
    r = jnp.array([1.0, 0.0, 0.0, 1.0])
    np.testing.assert_allclose(fn(r), [1.0, -1.0, -1.0, 1.0], atol=1e-5)
    np.testing.assert_allclose(fn(jnp.ones(8)), np.zeros(8), atol=1e-6)
    r = jnp.array([1.0, 0.0, 0.0, 0.0])  # mean .25, std sqrt(3)/4
    np.testing.assert_allclose(
      fn(r), [0.75 / 0.4330127, -0.25 / 0.4330127, -0.5773503, -0.5773503], rtol=1e-5
    )

  @chex.all_variants
  def test_group_center(self):
    fn = self.variant(advantages.group_center_advantage)
    np.testing.assert_allclose(fn(jnp.array([1.0, 0.0, 0.0, 0.0])), [0.75, -0.25, -0.25, -0.25])

  def test_grouped_keeps_groups_apart(self):
    r = jnp.array([1.0, 0.0, 1.0, 1.0])
    np.testing.assert_allclose(advantages.grouped("group_center", r, 2), [0.5, -0.5, 0.0, 0.0])

  @chex.all_variants
  def test_a_mask_leaves_the_invalid_entries_out(self):
    # The masked estimators on a group equal the plain ones on its valid entries alone, and
    # give the others 0 (whatever their reward): the memory policy's ungraded rows.
    r = jnp.array([1.0, 7.0, 0.0, 0.0, -3.0, 1.0])
    v = jnp.array([True, False, True, True, False, True])
    for name in ("group_norm", "group_center"):
      fn = self.variant(lambda r, v, name=name: advantages.grouped(name, r, 6, v))
      want = np.zeros(6)
      want[np.asarray(v)] = advantages.grouped(name, r[v], 4)
      np.testing.assert_allclose(fn(r, v), want, rtol=1e-5, atol=1e-6)
      # All valid: the unmasked estimator; none valid: all 0 (no signal, not NaN).
      np.testing.assert_allclose(
        fn(r, jnp.ones(6, bool)), advantages.grouped(name, r, 6), rtol=1e-5, atol=1e-6
      )
      np.testing.assert_array_equal(fn(r, jnp.zeros(6, bool)), np.zeros(6))

  def test_a_mask_of_another_shape_is_refused(self):
    r = jnp.zeros(4)
    for name in ("group_norm", "group_center"):
      with pytest.raises(AssertionError):
        advantages.ADVANTAGES.get(name)(r, valid_g=jnp.ones(3, bool))
      with pytest.raises(AssertionError):
        advantages.grouped(name, r, 2, jnp.ones(6, bool))

  def test_grouped_refuses_an_estimator_that_is_not_one_of_groups(self):
    with pytest.raises(ValueError, match="not a group estimator"):
      advantages.grouped("spo_tracker", jnp.zeros(4), 2)

  @chex.all_variants
  def test_ppo_clip(self):
    fn = self.variant(losses.ppo_clip_loss, static_argnums=(4,))
    logp = jnp.log(jnp.array([1.5, 0.5, 1.1, 1.0]))  # ratios vs old_logp=0
    old = jnp.zeros(4)
    mask = jnp.array([True, True, True, False])
    loss, clipped = fn(logp, old, jnp.float32(2.0), mask, 0.2)
    # A>0: min(r*A, clip(r)*A) -> 1.2*2, 0.5*2, 1.1*2; masked token is 0.
    np.testing.assert_allclose(loss, [-2.4, -1.0, -2.2, 0.0], rtol=1e-6)
    np.testing.assert_allclose(clipped, [1.0, 0.0, 0.0, 0.0])
    loss, clipped = fn(logp, old, jnp.float32(-1.0), mask, 0.2)
    # A<0: -min(-r, -clip(r)) = max(r, clip(r)) -> 1.5, 0.8, 1.1
    np.testing.assert_allclose(loss, [1.5, 0.8, 1.1, 0.0], rtol=1e-6)
    np.testing.assert_allclose(clipped, [0.0, 1.0, 0.0, 0.0])

  @chex.all_variants
  def test_reinforce(self):
    fn = self.variant(losses.reinforce_loss, static_argnums=(4,))
    loss, _ = fn(
      jnp.array([-1.0, -2.0]), jnp.zeros(2), jnp.float32(0.5), jnp.array([True, True]), 0.2
    )
    np.testing.assert_allclose(loss, [0.5, 1.0])

  @chex.all_variants
  def test_kl_k3(self):
    fn = self.variant(losses.kl_k3)
    logp = jnp.log(jnp.array([0.5, 0.25]))
    ref = jnp.log(jnp.array([0.25, 0.25]))
    # d = ref - logp = [-log 2, 0] -> exp(d) - d - 1 = [0.5 + log 2 - 1, 0]
    np.testing.assert_allclose(fn(logp, ref), [0.5 + np.log(2) - 1, 0.0], atol=1e-7)


@pytest.mark.parametrize("how, expected", [("token_mean", 6.0 / 3), ("seq_mean", (1.5 + 3) / 2)])
def test_aggregate(how, expected):
  loss = jnp.array([[1.0, 2.0, 9.0], [3.0, 0.0, 0.0]])
  mask = jnp.array([[True, True, False], [True, False, False]])
  loss = jnp.where(mask, loss, 0.0)
  np.testing.assert_allclose(losses.aggregate(loss, mask, how), expected, rtol=1e-6)


def test_aggregate_unknown():
  with pytest.raises(KeyError, match="unknown loss aggregation"):
    losses.aggregate(jnp.zeros((1, 1)), jnp.ones((1, 1), bool), "max")


def test_grouped_rows_of_trajectories_match_the_reference_formula():
  """The memory policy's GRPO advantage (`make_memory_update`): rows [B, R] of B trajectories,
  groups of `k` consecutive trajectories, only graded rows in the statistics. The registry's
  masked estimator over the flattened rows equals the direct formula."""
  rng = np.random.default_rng(0)
  b, r_, k = 8, 5, 4
  r = jnp.asarray(rng.integers(0, 2, (b, r_)).astype(np.float32))
  g = jnp.asarray(rng.random((b, r_)) < 0.6)
  got = advantages.grouped("group_norm", r.reshape(-1), k * r_, g.reshape(-1)).reshape(b, r_)
  rg, gg = np.asarray(r).reshape(b // k, -1), np.asarray(g).reshape(b // k, -1)
  n = np.maximum(gg.sum(-1, keepdims=True), 1)
  mean = (rg * gg).sum(-1, keepdims=True) / n
  std = np.sqrt((np.square(rg - mean) * gg).sum(-1, keepdims=True) / n)
  want = np.where(gg, (rg - mean) / (std + 1e-6), 0.0).reshape(b, r_)
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
