"""Group-free baseline of Single-stream Policy Optimization (SPO; Xu & Ding 2025, arXiv 2509.13232).

One persistent Beta(alpha_i, beta_i) per task i tracks that task's success probability under
the (changing) policy. A trajectory's advantage is its reward minus the task's tracked value,
normalised over the whole batch instead of over a group of samples of the same prompt; the
same tracker drives a curriculum that favours tasks the policy solves about half the time.
The reference recipe is verl-recipe `spo/spo_ray_trainer.py`; differences are noted below.

Shapes: N tasks in the training set, B trajectories in a batch. Everything is jit-able with
fixed shapes; padded batch rows are marked by `valid_b` and change nothing.
"""
from __future__ import annotations

import chex
import flax
import jax
import jax.numpy as jnp

from sao_jax.rl.registry import ADVANTAGES


@flax.struct.dataclass
class BetaTracker:
  alpha_n: jax.Array  # float32 [N]: discounted pseudo-count of successes
  beta_n: jax.Array  # float32 [N]: discounted pseudo-count of failures


def init_beta_tracker(num_tasks: int, alpha0=1.0, beta0=1.0) -> BetaTracker:
  """A tracker for `num_tasks` tasks with prior Beta(alpha0, beta0) on every task.

  The default Beta(1, 1) is the uniform prior: value 0.5, worth 2 pseudo-samples, so the first
  few real rewards dominate it. SPO instead initialises each task from n0 offline samples
  with s0 successes, alpha0 = N0 (s0 + 1/2) / (n0 + 1), beta0 = N0 (n0 - s0 + 1/2) / (n0 + 1),
  N0 = 1 / (1 - rho_min) (and Beta(1/2, 1/2) when n0 = 0); callers who have such estimates
  pass them here as [N] arrays. We default to the weak prior because it costs no sampling.
  alpha0 and beta0 must be positive.
  """
  shape = (num_tasks,)
  return BetaTracker(alpha_n=jnp.broadcast_to(jnp.asarray(alpha0, jnp.float32), shape),
                     beta_n=jnp.broadcast_to(jnp.asarray(beta0, jnp.float32), shape))


def tracker_value(tracker: BetaTracker, task_b: jax.Array) -> jax.Array:
  """Posterior-mean success probability of each row's task   [B] int -> [B].

  p_b = alpha[task_b] / (alpha[task_b] + beta[task_b])

  Read this BEFORE `update_beta_tracker` folds in the batch's rewards: the baseline of a
  trajectory must not depend on its own reward (SPO's v_hat_{-1}(x)).
  """
  chex.assert_rank([tracker.alpha_n, tracker.beta_n, task_b], [1, 1, 1])
  chex.assert_type(task_b, int)
  alpha_b = tracker.alpha_n[task_b]
  return alpha_b / (alpha_b + tracker.beta_n[task_b])


def forgetting_factor(kl: jax.Array, d_half: float, rho_min: float, rho_max: float) -> jax.Array:
  """KL-adaptive forgetting factor of SPO's tracker   (any shape, elementwise).

  rho = clip(2^(-kl / d_half), rho_min, rho_max)

  `kl` measures how far the policy moved since the task was last seen: no change keeps rho at
  rho_max (a long memory of 1 / (1 - rho_max) samples), a change of `d_half` halves the old
  evidence, and large changes are floored at rho_min so the tracker never forgets everything.
  SPO measures D on the task's previous response (per-token mean |log pi_then - log pi_now|;
  the recipe uses d_half = 0.06, rho_max = 0.96 and a configurable rho_min). That needs an
  extra forward pass per task; our callers pass the KL between the trajectory's behaviour
  policy and the current policy instead, a cheap proxy that the learner already computes.
  """
  rho = jnp.exp2(-jnp.asarray(kl, jnp.float32) / d_half)
  return jnp.clip(rho, rho_min, rho_max)


def update_beta_tracker(tracker: BetaTracker, task_b: jax.Array, rewards_b: jax.Array,
                        rho_b: jax.Array, valid_b: jax.Array | None = None) -> BetaTracker:
  """Folds a batch of rewards in [0, 1] into the tracker; returns the new tracker.

  Per row, in batch order:   alpha <- rho * alpha + r,   beta <- rho * beta + (1 - r).

  A task that appears k times in the batch (rows i_1 < ... < i_k) gets all k updates applied
  in row order, i.e. it decays once per occurrence:
    alpha' = alpha * prod_j rho_ij + sum_j r_ij * prod_{l > j} rho_il      (same for beta)
  so a batch gives the same tracker as feeding its rows one at a time. (The SPO recipe
  computes every row from the old value and keeps the last write, so a task repeated in a
  batch keeps only one of its rewards.) Rows with valid_b False (default: all valid) are
  ignored. Fractional rewards act as fractional pseudo-counts.

  Cost: a [B, B] same-task mask for the within-batch order, then scatters into [N]; fine
  for the batch sizes of a learner step (B = 1024 is 4 MB).
  """
  if valid_b is None:
    valid_b = jnp.ones(task_b.shape, bool)
  chex.assert_rank([tracker.alpha_n, tracker.beta_n, task_b, rewards_b, rho_b, valid_b],
                   [1, 1, 1, 1, 1, 1])
  chex.assert_equal_shape([task_b, rewards_b, rho_b, valid_b])
  chex.assert_type(task_b, int)
  num_tasks = tracker.alpha_n.shape[0]
  rho_b = jnp.where(valid_b, rho_b, 1.0)
  r_b = jnp.where(valid_b, rewards_b, 0.0)
  n_b = valid_b.astype(jnp.float32)  # the pseudo-count each row adds to alpha + beta
  rows = jnp.arange(task_b.shape[0])
  # later_bb[i, l]: row l is a later valid occurrence of row i's task, so it decays row i.
  later_bb = (task_b[:, None] == task_b[None, :]) & (rows[None, :] > rows[:, None])
  later_bb &= valid_b[None, :]
  decay_after_b = jnp.prod(jnp.where(later_bb, rho_b[None, :], 1.0), axis=1)
  task_b = jnp.where(valid_b, task_b, num_tasks)  # out of range: dropped by the segment ops
  decay_n = jax.ops.segment_prod(rho_b, task_b, num_tasks)  # 1 for tasks not in the batch
  add_alpha_n = jax.ops.segment_sum(r_b * decay_after_b, task_b, num_tasks)
  add_beta_n = jax.ops.segment_sum((n_b - r_b) * decay_after_b, task_b, num_tasks)
  return BetaTracker(alpha_n=decay_n * tracker.alpha_n + add_alpha_n,
                     beta_n=decay_n * tracker.beta_n + add_beta_n)


@ADVANTAGES.register("spo_tracker")
def spo_advantage(rewards_b: jax.Array, values_b: jax.Array, valid_b: jax.Array,
                  eps: float = 1e-6) -> jax.Array:
  """SPO advantage of a batch of single trajectories   [B], [B], [B] bool -> [B].

  A_b = r_b - v_b;   A_b <- (A_b - mean(A)) / (std(A) + eps)   (mean, std over valid rows)

  `values_b` is the tracker value of each row's task read before the update
  (`tracker_value`). Normalising over the whole batch rather than within a group is what
  makes SPO group-free: every trajectory gets a signal even when its task is always solved.
  std is the population std (ddof 0), so valid rows come out with mean 0 and std 1; the SPO
  recipe uses torch's unbiased std and eps 1e-8, a factor sqrt((n - 1) / n) apart. Padded
  rows get 0. A batch with one valid row, or identical A, gets 0 everywhere.

  Registered as "spo_tracker" so configs can select it by name, but its signature is not the
  group estimators' `rewards_g -> [G]`: the learner calls it directly, not via `grouped`.
  """
  chex.assert_rank([rewards_b, values_b, valid_b], [1, 1, 1])
  chex.assert_equal_shape([rewards_b, values_b, valid_b])
  n_b = valid_b.astype(jnp.float32)
  count = jnp.maximum(jnp.sum(n_b), 1.0)
  adv_b = rewards_b - values_b
  mean = jnp.sum(adv_b * n_b) / count
  centered_b = (adv_b - mean) * n_b
  std = jnp.sqrt(jnp.sum(centered_b**2) / count)
  return centered_b / (std + eps)


def priority_weights(tracker: BetaTracker, eps: float = 0.05) -> jax.Array:
  """SPO's prioritised task-sampling distribution   -> [N], sums to 1.

  P(i) ∝ sqrt(p_i (1 - p_i)) + eps,   p_i = alpha_i / (alpha_i + beta_i)

  sqrt(p (1 - p)) is the reward std of task i, the scale of the learning signal it can give:
  largest at p = 0.5, zero for tasks always or never solved; eps (0.05 in SPO) keeps every
  task sampled now and then so that a changed policy is noticed.
  """
  chex.assert_rank([tracker.alpha_n, tracker.beta_n], [1, 1])
  p_n = tracker.alpha_n / (tracker.alpha_n + tracker.beta_n)
  w_n = jnp.sqrt(p_n * (1.0 - p_n)) + eps
  return w_n / jnp.sum(w_n)
