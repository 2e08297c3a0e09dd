"""Advantage estimators. Small, pure, unbatched where possible; callers vmap."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from sao_jax.rl.registry import ADVANTAGES


@ADVANTAGES.register("group_norm")
def group_norm_advantage(rewards_g: jax.Array, eps: float = 1e-6) -> jax.Array:
  """GRPO advantage of one group of G samples of the same prompt.

  A_i = (r_i - mean(r)) / (std(r) + eps)       shapes: [G] -> [G]

  A group whose rewards are all equal gets zero advantage (no signal).
  Shao et al. 2024, DeepSeekMath (arXiv 2402.03300), eq. for outcome supervision.
  """
  chex.assert_rank(rewards_g, 1)
  centered_g = rewards_g - jnp.mean(rewards_g)
  return centered_g / (jnp.std(rewards_g) + eps)


@ADVANTAGES.register("group_center")
def group_center_advantage(rewards_g: jax.Array) -> jax.Array:
  """Dr. GRPO advantage: A_i = r_i - mean(r), no std division   [G] -> [G].

  Liu et al. 2025, Understanding R1-Zero-Like Training (arXiv 2503.20783): the std division
  up-weights groups that are nearly all right or all wrong.
  """
  chex.assert_rank(rewards_g, 1)
  return rewards_g - jnp.mean(rewards_g)


def grouped(name: str, rewards_b: jax.Array, group_size: int) -> jax.Array:
  """Applies a group estimator to consecutive groups of `group_size` rows: [B] -> [B]."""
  chex.assert_rank(rewards_b, 1)
  fn = ADVANTAGES.get(name)
  return jax.vmap(fn)(rewards_b.reshape(-1, group_size)).reshape(-1)
