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


def decoupled_ppo_loss(
  logp_t,
  prox_logp_t,
  behav_logp_t,
  advantage,
  mask_t,
  clip_eps: float,
  is_cap: float,
  level: str = "token",
):
  """Decoupled PPO surrogate for one possibly stale sequence, per token.

  Three policies: behaviour pi_behav (sampled the tokens, maybe several versions ago),
  proximal pi_prox (recent params the update is kept close to), current pi_theta.
    w_t     = min(pi_prox / pi_behav, is_cap)           importance weight, truncated, constant
    u_t     = exp(logp_t - prox_logp_t)                 trust-region ratio against pi_prox
    loss_t  = -w_t * min(u_t * A, clip(u_t, 1-eps, 1+eps) * A)
  shapes: logp_t, prox_logp_t, behav_logp_t, mask_t [T]; advantage []; level static.

  AReaL's decoupled objective (Fu et al. 2025, arXiv 2505.24298, eq. 5): clipping against
  pi_prox instead of pi_behav bounds each step by the recent policy however stale the data,
  while w_t corrects for having sampled from pi_behav.
  level "token": w_t = min(exp(prox_t - behav_t), is_cap), per token (as in AReaL);
  level "sequence": w = min(exp(sum_t (prox_t - behav_t)), is_cap) over valid tokens, the exact
  likelihood ratio of the whole sequence (not GSPO's per-token geometric mean), the same for
  every token. It is unbiased before truncation but high-variance, so the cap binds more.
  Truncation at is_cap (>= 1) follows truncated IS (IMPALA's V-trace, arXiv 1802.01561);
  AReaL's code instead zeroes tokens whose weight exceeds the cap. With prox == behav and
  is_cap >= 1 this is exactly `ppo_clip_loss`.

  w is stop-gradiented, and so are prox_logp_t and behav_logp_t: they are data. Passing the
  current log-probs as prox_logp_t (one step per batch, prox = current params) therefore
  gives u_t = 1 with the gradient of logp_t, as it should.

  Returns (loss_t [T], aux) with aux float [T] arrays, all zero where mask_t is False:
  clipped_t (the clipped branch was taken), truncated_t (w hit is_cap), w_t (truncated w).

  Not registered in LOSSES: that registry's contract is the (logp_t, old_logp_t, advantage,
  mask_t, clip_eps) -> (loss_t, clipped_t) signature that `make_rl_update` vmaps and that
  RLConfig.loss is validated against, so listing this there would let a config pick a loss
  the synchronous learner cannot call. The asynchronous learner calls it directly; a registry
  of decoupled losses is worth adding once there is a second one.
  """
  chex.assert_rank([logp_t, prox_logp_t, behav_logp_t, advantage, mask_t], [1, 1, 1, 0, 1])
  chex.assert_equal_shape([logp_t, prox_logp_t, behav_logp_t, mask_t])
  prox_logp_t = jax.lax.stop_gradient(prox_logp_t)
  log_w_t = prox_logp_t - jax.lax.stop_gradient(behav_logp_t)
  if level == "sequence":
    log_w_t = jnp.broadcast_to(jnp.sum(jnp.where(mask_t, log_w_t, 0.0)), log_w_t.shape)
  elif level != "token":
    raise KeyError(f"unknown importance-weight level {level!r}; known: sequence, token")
  log_cap = jnp.log(jnp.asarray(is_cap, log_w_t.dtype))
  truncated_t = log_w_t > log_cap
  # min in log space: exp of a long sequence's summed log-ratio may overflow, its min can't.
  w_t = jax.lax.stop_gradient(jnp.exp(jnp.minimum(log_w_t, log_cap)))
  u_t = jnp.exp(logp_t - prox_logp_t)
  unclipped_t = u_t * advantage
  clipped_t = jnp.clip(u_t, 1 - clip_eps, 1 + clip_eps) * advantage
  loss_t = -w_t * jnp.minimum(unclipped_t, clipped_t)
  masked = lambda x_t: jnp.where(mask_t, x_t, 0.0)
  aux = {
    "clipped_t": masked((clipped_t < unclipped_t).astype(jnp.float32)),
    "truncated_t": masked(truncated_t.astype(jnp.float32)),
    "w_t": masked(w_t),
  }
  return masked(loss_t), aux


def freshness_factor(staleness: jax.Array, half_life: float, max_staleness: int) -> jax.Array:
  """Freshness step-size factor of a trajectory `staleness` policy versions old (elementwise).

  f(s) = 2^(-s / half_life)  for 0 <= s <= max_staleness,   0 otherwise

  f(0) = 1, f(half_life) = 1/2; trajectories older than max_staleness get 0, i.e. are
  dropped (so are negative staleness values, which only a bookkeeping bug produces).
  The learner multiplies each trajectory's loss weight by f, which scales the step that
  trajectory contributes, so older samples move the policy less. With SGD that is its step
  size exactly; with Adam a uniformly stale batch is partly renormalised by the second-moment
  estimate, so the factor acts chiefly as a relative weight between old and fresh
  trajectories. half_life = inf gives hard dropping only.
  """
  s = jnp.asarray(staleness, jnp.float32)
  return jnp.where((s >= 0) & (s <= max_staleness), jnp.exp2(-s / half_life), 0.0)


def freshness_weights(
  staleness_b: jax.Array, half_life: float, max_staleness: int, mode: str
) -> jax.Array:
  """Per-trajectory loss weights from staleness   [B] int -> [B] float32.

  mode "drop":  w = 1 if 0 <= s <= max_staleness else 0   (bounded staleness only)
  mode "decay": w = freshness_factor(s)                   (bounded, and older counts less)
  """
  chex.assert_rank(staleness_b, 1)
  if mode == "drop":
    return freshness_factor(staleness_b, jnp.inf, max_staleness)
  if mode == "decay":
    return freshness_factor(staleness_b, half_life, max_staleness)
  raise KeyError(f"unknown freshness mode {mode!r}; known: decay, drop")


def kl_k3(logp_t: jax.Array, ref_logp_t: jax.Array) -> jax.Array:
  """Unbiased, non-negative estimate of KL(current || ref) per token   [T] -> [T].

  k3 = exp(ref - logp) - (ref - logp) - 1     (Schulman 2020, "Approximating KL divergence")
  """
  chex.assert_equal_shape([logp_t, ref_logp_t])
  d_t = ref_logp_t - logp_t
  return jnp.exp(d_t) - d_t - 1.0


def masked_mean(x: jax.Array, mask: jax.Array, axis=None) -> jax.Array:
  """Mean of x over the positions where mask is True (0 where nothing is masked in).

  sum(x * mask) / max(sum(mask), 1) over `axis` (all axes by default); x and mask broadcast.
  """
  m = jnp.broadcast_to(mask, jnp.shape(x)).astype(jnp.float32)
  return jnp.sum(jnp.where(m > 0, x, 0.0), axis) / jnp.maximum(jnp.sum(m, axis), 1.0)


def aggregate(loss_bt: jax.Array, mask_bt: jax.Array, how: str) -> jax.Array:
  """Reduces per-token losses to a scalar.

  token_mean: sum over all tokens / number of tokens (DAPO, arXiv 2503.14476);
  seq_mean: mean over sequences of each sequence's token mean (original GRPO).
  """
  if how == "token_mean":
    return masked_mean(loss_bt, mask_bt)
  if how == "seq_mean":
    return jnp.mean(masked_mean(loss_bt, mask_bt, axis=-1))
  raise KeyError(f"unknown loss aggregation {how!r}; known: seq_mean, token_mean")
