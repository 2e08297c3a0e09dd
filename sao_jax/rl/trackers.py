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
  return BetaTracker(
    alpha_n=jnp.broadcast_to(jnp.asarray(alpha0, jnp.float32), shape),
    beta_n=jnp.broadcast_to(jnp.asarray(beta0, jnp.float32), shape),
  )


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


def forgetting_factor(drift: jax.Array, d_half: float, rho_min: float, rho_max: float) -> jax.Array:
  """KL-adaptive forgetting factor of SPO's tracker   (any shape, elementwise).

  rho = clip(2^(-D / d_half), rho_min, rho_max)

  D measures how far the policy moved: no change keeps rho at rho_max (a long memory of
  1 / (1 - rho_max) samples), a change of `d_half` halves the old evidence, and large
  changes are floored at rho_min so the tracker never forgets everything. SPO's D is the
  per-token mean |log pi_then - log pi_now| on the task's previous response, with
  d_half = 0.06 and rho_max = 0.96 (`trajectory_drift` computes it between the behaviour
  policy that sampled a trajectory and the current one). D must be that mean absolute
  log-ratio, not a KL estimate: the per-token KL of a small drift delta is about delta^2 / 2,
  two orders of magnitude below d_half, which would leave rho at rho_max for any drift a
  run shows.
  """
  rho = jnp.exp2(-jnp.asarray(drift, jnp.float32) / d_half)
  return jnp.clip(rho, rho_min, rho_max)


def trajectory_drift(
  logp_bt: jax.Array, ref_logp_bt: jax.Array, mask_bt: jax.Array, traj_b: jax.Array
) -> jax.Array:
  """Per-token mean |logp - ref_logp| over each row's whole trajectory   -> [B].

  D_j = sum_{rows b of j, t} |logp[b,t] - ref[b,t]| mask[b,t] / sum_{rows b of j, t} mask[b,t]

  Rows are environment steps; `traj_b` int [B] says which trajectory (0..B-1) a row belongs
  to, so every row of a multi-step trajectory gets the same D. Shapes: [B, T] x3, [B].
  """
  chex.assert_equal_shape([logp_bt, ref_logp_bt, mask_bt])
  chex.assert_rank(traj_b, 1)
  m_bt = mask_bt.astype(jnp.float32)
  num = traj_b.shape[0]
  abs_j = jax.ops.segment_sum(jnp.sum(jnp.abs(logp_bt - ref_logp_bt) * m_bt, -1), traj_b, num)
  tok_j = jax.ops.segment_sum(jnp.sum(m_bt, -1), traj_b, num)
  return (abs_j / jnp.maximum(tok_j, 1.0))[traj_b]


def update_beta_tracker(
  tracker: BetaTracker,
  task_b: jax.Array,
  rewards_b: jax.Array,
  rho_b: jax.Array,
  valid_b: jax.Array | None = None,
) -> BetaTracker:
  """Folds a batch of rewards into the tracker; returns the new tracker.

  The tracker is a Beta over success in [0, 1]: rewards are clipped to [0, 1] first (a
  summed multi-step reward of 3 counts as one success, never as a negative failure count).

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
  chex.assert_rank(
    [tracker.alpha_n, tracker.beta_n, task_b, rewards_b, rho_b, valid_b], [1, 1, 1, 1, 1, 1]
  )
  chex.assert_equal_shape([task_b, rewards_b, rho_b, valid_b])
  chex.assert_type(task_b, int)
  num_tasks = tracker.alpha_n.shape[0]
  rho_b = jnp.where(valid_b, rho_b, 1.0)
  r_b = jnp.where(valid_b, jnp.clip(rewards_b, 0.0, 1.0), 0.0)
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
  return BetaTracker(
    alpha_n=decay_n * tracker.alpha_n + add_alpha_n, beta_n=decay_n * tracker.beta_n + add_beta_n
  )


@ADVANTAGES.register("spo_tracker")
def spo_advantage(
  rewards_b: jax.Array,
  values_b: jax.Array,
  weight_b: jax.Array,
  std_floor: float = 0.1,
  center: bool = False,
  eps: float = 1e-6,
) -> jax.Array:
  """SPO advantage of a batch of single trajectories   [B], [B], [B] -> [B].

  A_b = r_b - v_b;                      (center: A_b <- A_b - mean(A))
  A_b <- A_b / max(std(A), std_floor)   (mean, std over rows, weighted by weight_b)

  `values_b` is the baseline of each row, read before this reward folds in (the tracker
  value `tracker_value`, or a learned V): it is already a baseline, so by default the
  advantage is not centred again. Centring over the batch (the SPO recipe,
  verl-recipe `spo`) breaks in the regimes an RL run passes through: when nearly every
  answer is right, correct answers of tasks with a high value get a negative advantage of
  unit size (their A = 1 - v is below the batch mean), which drives a run that already
  solves its tasks into collapse; when nearly every answer is wrong, wrong answers of
  low-value tasks get positive ones. Without centring the sign of A is the sign of r - v:
  a reward at or above its baseline is never pushed down.

  Dividing by the batch std keeps the step size independent of the reward scale; the floor
  stops a batch of near-identical A (everything solved as expected) from blowing tiny
  differences up to unit size. std is the population std (ddof 0) around the weighted mean.

  `weight_b` (float or bool) is each row's share of the batch statistics: 0 for padding, 1
  for a one-step trajectory, 1/S for each of the S rows of an S-step trajectory (so every
  trajectory counts once). Rows with weight 0 get A = 0.
  """
  chex.assert_rank([rewards_b, values_b, weight_b], [1, 1, 1])
  chex.assert_equal_shape([rewards_b, values_b, weight_b])
  w_b = weight_b.astype(jnp.float32)
  total = jnp.maximum(jnp.sum(w_b), eps)
  adv_b = rewards_b - values_b
  mean = jnp.sum(adv_b * w_b) / total
  std = jnp.sqrt(jnp.sum(w_b * (adv_b - mean) ** 2) / total)
  if center:
    adv_b = adv_b - mean
  return jnp.where(w_b > 0, adv_b / jnp.maximum(std, max(std_floor, eps)), 0.0)


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
