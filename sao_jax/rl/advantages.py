"""Advantage estimators. Small, pure, unbatched where possible; callers vmap."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from sao_jax.rl.registry import ADVANTAGES


def _masked_mean(x_g: jax.Array, valid_g: jax.Array) -> jax.Array:
  """Mean of x over the valid entries of a group (0 where none is valid)   [G], [G] -> []."""
  v = valid_g.astype(x_g.dtype)
  return jnp.sum(x_g * v) / jnp.maximum(jnp.sum(v), 1)


@ADVANTAGES.register("group_norm")
def group_norm_advantage(
  rewards_g: jax.Array, eps: float = 1e-6, valid_g: jax.Array | None = None
) -> jax.Array:
  """GRPO advantage of one group of G samples of the same prompt.

  A_i = (r_i - mean(r)) / (std(r) + eps)       shapes: [G] -> [G]

  A group whose rewards are all equal gets zero advantage (no signal). valid_g [G] bool: the
  mean and (population) std over the valid entries only, and A = 0 on the others (e.g. the
  memory policy's rows of a group that are not graded).
  Shao et al. 2024, DeepSeekMath (arXiv 2402.03300), eq. for outcome supervision.
  """
  chex.assert_rank(rewards_g, 1)
  if valid_g is None:
    centered_g = rewards_g - jnp.mean(rewards_g)
    return centered_g / (jnp.std(rewards_g) + eps)
  chex.assert_equal_shape([rewards_g, valid_g])
  centered_g = rewards_g - _masked_mean(rewards_g, valid_g)
  std = jnp.sqrt(_masked_mean(jnp.square(centered_g), valid_g))
  return jnp.where(valid_g, centered_g / (std + eps), 0.0)


@ADVANTAGES.register("group_center")
def group_center_advantage(rewards_g: jax.Array, valid_g: jax.Array | None = None) -> jax.Array:
  """Dr. GRPO advantage: A_i = r_i - mean(r), no std division   [G] -> [G].

  valid_g [G] bool: the mean over the valid entries only, and A = 0 on the others.
  Liu et al. 2025, Understanding R1-Zero-Like Training (arXiv 2503.20783): the std division
  up-weights groups that are nearly all right or all wrong.
  """
  chex.assert_rank(rewards_g, 1)
  if valid_g is None:
    return rewards_g - jnp.mean(rewards_g)
  chex.assert_equal_shape([rewards_g, valid_g])
  return jnp.where(valid_g, rewards_g - _masked_mean(rewards_g, valid_g), 0.0)


# The estimators `grouped` applies: one group of rewards in, one advantage per entry out.
GROUP_ESTIMATORS = ("group_norm", "group_center")


def grouped(
  name: str, rewards_b: jax.Array, group_size: int, valid_b: jax.Array | None = None
) -> jax.Array:
  """Applies a group estimator to consecutive groups of `group_size` rows: [B] -> [B].
  valid_b [B] bool (optional): entries that take part in their group's statistics; the others
  get advantage 0."""
  chex.assert_rank(rewards_b, 1)
  if valid_b is not None:
    chex.assert_equal_shape([rewards_b, valid_b])
  if name not in GROUP_ESTIMATORS:
    raise ValueError(f"advantage {name!r} is not a group estimator; known: {GROUP_ESTIMATORS}")
  fn = ADVANTAGES.get(name)
  groups = lambda x: x.reshape(-1, group_size)  # noqa: E731
  if valid_b is None:
    return jax.vmap(fn)(groups(rewards_b)).reshape(-1)
  return jax.vmap(lambda r, v: fn(r, valid_g=v))(groups(rewards_b), groups(valid_b)).reshape(-1)
