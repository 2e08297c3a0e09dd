"""Stage 2: an LSTM over step vectors that predicts the next step; predictable steps are dropped.

After step t-1 the LSTM has read the vectors of steps 0..t-1 and predicts step t's vector.
Step t's relative surprise is ||pred - v_t||^2 / (||v_t||^2 + eps): near 0 for a step the
history made obvious (another "hall."), near 1 or more for news ("key 2 code 7").

Keep rule (`keep_step`):
* turning points are always kept: the episode's first and last step, an environment
  boundary (new session, stairs), a reward change from the previous step, and surprise
  >= `turning_surprise` (with `salient_turning`, only a step the learned salience also
  keeps: see `keep_step`);
* any other step is kept if its surprise >= `keep_threshold` and fewer than `budget` such
  steps are kept so far (the memory budget);
* nothing is written once the bank holds `capacity` steps (the caller reports it).

`keep_step` is the first-come rule. `Compressor.filter_and_store` (with `evict`, the default)
refines it with priorities: an over-budget candidate replaces the least surprising budget
entry if it is more surprising, and a full bank evicts its least surprising entry that is not
a structural turning point. Why: a first-come budget is spent on the first unusual chit-chat
of a long episode, and a fact told later (less surprising than the LSTM's turning threshold,
more than any chit-chat) was then dropped.

The LSTM is trained online from the sampler's trajectories with `prediction_loss` (the same
relative error, target held fixed), next to the policy's loss.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

_EPS = 1e-6


class TemporalPredictor(nn.Module):
  """One step: (carry, v [B, D]) -> (carry, prediction of the next step's v [B, D])."""

  hidden: int
  out_dim: int

  @nn.compact
  def __call__(self, carry, v_bd):
    carry, h_bh = nn.OptimizedLSTMCell(self.hidden, name="lstm")(carry, v_bd)
    return carry, nn.Dense(self.out_dim, name="predict")(h_bh)

  def initial_carry(self, batch: int):
    zeros = jnp.zeros((batch, self.hidden), jnp.float32)
    return (zeros, zeros)


def relative_surprise(pred_d: jax.Array, v_d: jax.Array) -> jax.Array:
  """||pred - v||^2 / (||v||^2 + eps) over the last axis."""
  return jnp.sum(jnp.square(pred_d - v_d), -1) / (jnp.sum(jnp.square(v_d), -1) + _EPS)


def keep_step(
  surprise: jax.Array,
  turning: jax.Array,
  budget_used: jax.Array,
  *,
  keep_threshold: float,
  turning_surprise: float,
  budget: int,
  salient=False,
  salient_turning: bool = False,
):
  """Scalar keep decision. `salient`: the learned salience also makes the step a candidate
  (`sao_jax.compression.salience`). `salient_turning`: a surprise >= `turning_surprise` makes
  a turning point only of a salient step; an unsalient one is an ordinary candidate (it
  competes for the budget). Why: the LSTM is surprised by the step after any rare one (the
  "hall." after a lamp), and in a 1,000-step episode such steps, kept as turning points, fill
  the bank with what no answer needs. Returns (keep, is_turning_point, counts_against_budget)."""
  news = surprise >= turning_surprise
  is_turning = turning | ((news & salient) if salient_turning else news)
  candidate = (surprise >= keep_threshold) | salient
  by_surprise = candidate & (budget_used < budget) & ~is_turning
  return is_turning | by_surprise, is_turning, by_surprise


def prediction_loss(pred_sd: jax.Array, v_sd: jax.Array, weight_s: jax.Array) -> jax.Array:
  """Mean relative surprise of predictions pred[s] (made after step s-1) for targets v[s]."""
  err_s = relative_surprise(pred_sd, jax.lax.stop_gradient(v_sd))
  return jnp.sum(err_s * weight_s) / jnp.maximum(jnp.sum(weight_s), 1.0)
