"""Per-token policy losses and the KL penalty. Pure and unbatched over the batch axis."""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from sao_jax.rl.registry import LOSSES


@LOSSES.register("ppo_clip")
def ppo_clip_loss(logp_t, old_logp_t, advantage, mask_t, clip_eps: float):
  """PPO clipped surrogate for one sequence, per token.

  ratio_t = exp(logp_t - old_logp_t)
  loss_t  = -min(ratio_t * A, clip(ratio_t, 1-eps, 1+eps) * A)        shapes: [T], [T], [], [T]

  Returns (loss_t [T], clipped_t [T] as float). Schulman et al. 2017 (arXiv 1707.06347),
  applied per token with a sequence-level advantage as in GRPO (arXiv 2402.03300).
  """
  chex.assert_rank([logp_t, old_logp_t, advantage, mask_t], [1, 1, 0, 1])
  ratio_t = jnp.exp(logp_t - old_logp_t)
  unclipped_t = ratio_t * advantage
  clipped_t = jnp.clip(ratio_t, 1 - clip_eps, 1 + clip_eps) * advantage
  loss_t = -jnp.minimum(unclipped_t, clipped_t)
  was_clipped_t = (clipped_t < unclipped_t).astype(jnp.float32)
  return jnp.where(mask_t, loss_t, 0.0), jnp.where(mask_t, was_clipped_t, 0.0)


@LOSSES.register("reinforce")
def reinforce_loss(logp_t, old_logp_t, advantage, mask_t, clip_eps: float):
  """Plain policy gradient: loss_t = -A * logp_t      shapes: [T], [T], [], [T].

  Williams 1992. `old_logp_t` and `clip_eps` are unused (same signature as ppo_clip).
  """
  chex.assert_rank([logp_t, old_logp_t, advantage, mask_t], [1, 1, 0, 1])
  del clip_eps
  loss_t = -advantage * logp_t
  return jnp.where(mask_t, loss_t, 0.0), jnp.zeros_like(logp_t)


def kl_k3(logp_t: jax.Array, ref_logp_t: jax.Array) -> jax.Array:
  """Unbiased, non-negative estimate of KL(current || ref) per token   [T] -> [T].

  k3 = exp(ref - logp) - (ref - logp) - 1     (Schulman 2020, "Approximating KL divergence")
  """
  chex.assert_equal_shape([logp_t, ref_logp_t])
  d_t = ref_logp_t - logp_t
  return jnp.exp(d_t) - d_t - 1.0


def aggregate(loss_bt: jax.Array, mask_bt: jax.Array, how: str) -> jax.Array:
  """Reduces per-token losses to a scalar.

  token_mean: sum over all tokens / number of tokens (DAPO, arXiv 2503.14476);
  seq_mean: mean over sequences of each sequence's token mean (original GRPO).
  """
  mask_bt = mask_bt.astype(jnp.float32)
  if how == "token_mean":
    return jnp.sum(loss_bt) / jnp.maximum(jnp.sum(mask_bt), 1.0)
  if how == "seq_mean":
    per_seq_b = jnp.sum(loss_bt, -1) / jnp.maximum(jnp.sum(mask_bt, -1), 1.0)
    return jnp.mean(per_seq_b)
  raise KeyError(f"unknown loss aggregation {how!r}; known: seq_mean, token_mean")
