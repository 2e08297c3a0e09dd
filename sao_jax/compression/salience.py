"""A learned salience score for stage 2: which steps later answers need.

The LSTM's surprise says what is *new*, not what *matters*: a rare bit of chit-chat surprises
it as much as a fact, so in a 1,000-step episode the budget fills with both and facts get
evicted. The salience head scores each step from its stage-1 vectors (held fixed: the head
does not reshape the encoder), p_s = sigmoid(head(v_s)), and the filter ranks the steps it
may drop or evict by p instead of surprise (`Compressor.filter_and_store`).

Training signal: the policy's own answer loss through a soft keep mask. In the supervised
phase, a second forward pass of the answer rows (`salience_rows` per trajectory, graded rows
first) lets row t read *every* earlier step's vectors, each step's memory slots weighted by
its p through an additive attention bias log p_s (so attention to step s is scaled by p_s
before renormalisation: p_s = 0 is a dropped step, p_s = 1 a kept one). The policy's
parameters are held fixed in that pass; only the head learns:

    L_salience = NLL(answer | soft memory) + price * mean_s p_s

The NLL term raises p where the answer needs the step; the price lowers it everywhere else.
The hard filter at sampling time and the supervised hard pass use the same head, so what is
trained is what decides. The RL phase does not train the head (its loss gives no gradient
to it); it keeps what the supervised phase learned.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

LOG_EPS = 1e-6


class SalienceHead(nn.Module):
  """[..., D] flattened step vectors -> [...] salience logits."""

  hidden: int

  @nn.compact
  def __call__(self, v_d):
    h = nn.gelu(nn.Dense(self.hidden, name="hidden")(v_d))
    return nn.Dense(1, name="logit")(h)[..., 0]


def soft_memory(v_sed, p_s, step_valid_s, t):
  """Row t's soft memory: every step s < t, its m slots biased by log p_s.

  Returns (vec [S*m, dim], valid [S*m] bool, bias [S*m] float32)."""
  s, m, d = v_sed.shape
  ok_s = step_valid_s & (jnp.arange(s) < t)
  bias_s = jnp.log(p_s + LOG_EPS)
  rep = lambda x: jnp.repeat(x, m)  # noqa: E731
  return v_sed.reshape(s * m, d), rep(ok_s), rep(jnp.where(ok_s, bias_s, 0.0))


def price(p_bs, step_valid_bs) -> jax.Array:
  """Mean keep probability over valid steps (the L1 price of keeping)."""
  w = step_valid_bs.astype(jnp.float32)
  return jnp.sum(p_bs * w) / jnp.maximum(jnp.sum(w), 1.0)
