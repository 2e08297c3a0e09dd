"""The pure update functions `update(state, batch) -> (state, metrics)` and their optimizer.

Nothing here is jitted; `sao_jax.runners.compiled` applies `jax.jit` with shardings.
Batches are the typed dataclasses of `sao_jax.batches`; the state is `sao_jax.state.TrainState`.
"""

from __future__ import annotations

from collections.abc import Callable

import chex
import jax
import jax.numpy as jnp
import optax

from sao_jax.batches import MemorySAOBatch, RLBatch, SAOBatch, SFTBatch
from sao_jax.config import ModelConfig, OptimConfig, RLConfig, SAOConfig
from sao_jax.models.transformer import TransformerLM
from sao_jax.rl import advantages as adv_lib
from sao_jax.rl import losses as loss_lib
from sao_jax.rl import trackers
from sao_jax.rl.losses import masked_mean
from sao_jax.sampling import completion_logprobs
from sao_jax.state import TrainState

Metrics = dict[str, jax.Array]


def make_optimizer(cfg: OptimConfig) -> optax.GradientTransformation:
  """clip_by_global_norm -> AdamW with linear warm-up, then constant (runs stop on a
  wall-clock budget as often as on a step count, so there is no decay to a fixed end)."""
  warmup = max(cfg.warmup_steps, 1)
  schedule = optax.linear_schedule(cfg.lr / warmup, cfg.lr, warmup)
  return optax.chain(
    optax.clip_by_global_norm(cfg.grad_clip),
    optax.adamw(schedule, b2=cfg.b2, weight_decay=cfg.weight_decay),
  )


def init_state_fn(
  model: TransformerLM,
  tx: optax.GradientTransformation,
  prompt_len: int,
  with_ref: bool,
  num_tasks: int = 0,
) -> Callable[[jax.Array], TrainState]:
  """Returns rng -> TrainState with logically-annotated (boxed) params, for eval_shape/jit."""
  cfg: ModelConfig = model.cfg

  def init(rng):
    init_rng, state_rng = jax.random.split(rng)
    tokens = jnp.zeros((1, prompt_len), jnp.int32)
    valid = jnp.ones((1, prompt_len), bool)
    mask = valid[:, None, :] & jnp.tril(jnp.ones((prompt_len, prompt_len), bool))[None]
    memory = None
    if cfg.memory_slots:
      memory = jnp.zeros((1, 0, cfg.memory_dim or cfg.width))
    params = model.init(init_rng, tokens, jnp.zeros_like(tokens), mask, memory)["params"]
    return TrainState(
      step=jnp.zeros((), jnp.int32),
      params=params,
      opt_state=tx.init(params),
      rng=state_rng,
      ref_params=params if with_ref else None,
      tracker=trackers.init_beta_tracker(num_tasks) if num_tasks else None,
      lr_scale=jnp.ones((), jnp.float32),
      nonfinite=jnp.zeros((), jnp.int32),
    )

  return init


def apply_gradients(
  state: TrainState,
  tx,
  grads,
  metrics: Metrics,
  *,
  step_scale: jax.Array | float = 1.0,
  poison_b: jax.Array | None = None,
  advance: bool = True,
  **extra,
) -> tuple[TrainState, Metrics]:
  """Optimizer step scaled by `state.lr_scale * step_scale`, guarded against non-finite values.

  The scale multiplies the optimizer's output, so it is a step size exactly: gradient
  clipping and Adam's normalisation would cancel the same factor applied to the loss.
  If the gradients or `metrics["loss"]` are not finite (or `poison_b`, the fault-injection
  field, holds a NaN, which turns the gradients into NaN), params, optimizer state and `extra`
  (e.g. the SAO tracker) stay exactly as they were; `step` still counts the update and
  `nonfinite` counts the skip. The run never sees a NaN in its parameters. `advance=False`
  (the inner epochs of one update) leaves `step` as it is. Every update function of the
  package goes through here.
  """
  if poison_b is not None:
    poison = jnp.sum(poison_b)  # 0, or NaN on an injected fault
    grads = jax.tree.map(lambda g: g * (1.0 + poison).astype(g.dtype), grads)
  grad_norm = optax.tree.norm(grads)
  finite = jnp.isfinite(grad_norm) & jnp.isfinite(metrics["loss"])
  safe_grads = jax.tree.map(lambda g: jnp.where(finite, g, jnp.zeros_like(g)), grads)
  updates, opt_state = tx.update(safe_grads, state.opt_state, state.params)
  scale = state.lr_scale * step_scale
  updates = jax.tree.map(lambda u: u * scale.astype(u.dtype), updates)
  params = optax.apply_updates(state.params, updates)
  new = {"params": params, "opt_state": opt_state, **extra}
  old = {
    "params": state.params,
    "opt_state": state.opt_state,
    **{k: getattr(state, k) for k in extra},
  }
  kept = jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
  metrics = dict(
    metrics,
    grad_norm=grad_norm,
    nonfinite_skipped=(~finite).astype(jnp.int32),
    lr_scale=state.lr_scale,
  )
  return state.replace(
    step=state.step + int(advance), nonfinite=state.nonfinite + (~finite).astype(jnp.int32), **kept
  ), metrics


def make_sft_update(model: TransformerLM, tx) -> Callable[[TrainState, SFTBatch], tuple]:
  """Cross-entropy on completion tokens (the worked solution and its EOS), a mean over the
  batch's tokens in which each row's tokens count weight_b times:
  loss = sum_b w_b sum_t -logp_bt / sum_b w_b n_b   (n_b valid tokens of row b)."""

  def update(state: TrainState, batch: SFTBatch):
    def loss_fn(params):
      lp = completion_logprobs(
        model,
        params,
        batch.prompt_bp,
        batch.prompt_valid_bp,
        batch.tokens_bt,
        batch.valid_bt,
        pack=batch.pack,
      )
      w_bt = batch.weight_b[:, None] * batch.valid_bt
      loss = -jnp.sum(lp.logp_bt * w_bt) / jnp.maximum(jnp.sum(w_bt), 1e-9)
      return loss, {"loss": loss, "tokens": jnp.sum(batch.valid_bt)}

    grads, metrics = jax.grad(loss_fn, has_aux=True)(state.params)
    return apply_gradients(state, tx, grads, metrics)

  return update


def make_rl_update(
  model: TransformerLM, tx, cfg: RLConfig
) -> Callable[[TrainState, RLBatch], tuple]:
  """Group-based policy-gradient update (synchronous GRPO with `cfg.group_size` rows per
  prompt, consecutive); `cfg.ppo_epochs` optimizer steps on the batch make one learner step."""
  loss_fn_tok = loss_lib.LOSSES.get(cfg.loss)
  use_kl = cfg.kl_coef > 0

  def update(state: TrainState, batch: RLBatch):
    adv_b = adv_lib.grouped(cfg.advantage, batch.rewards_b, cfg.group_size)
    mask_bt = batch.valid_bt
    ref_logp_bt = None
    if use_kl:
      ref_logp_bt = jax.lax.stop_gradient(
        completion_logprobs(
          model,
          state.ref_params,
          batch.prompt_bp,
          batch.prompt_valid_bp,
          batch.tokens_bt,
          mask_bt,
          temperature=cfg.temperature,
          pack=batch.pack,
        ).logp_bt
      )

    def loss_fn(params):
      lp = completion_logprobs(
        model,
        params,
        batch.prompt_bp,
        batch.prompt_valid_bp,
        batch.tokens_bt,
        mask_bt,
        temperature=cfg.temperature,
        with_entropy=True,
        pack=batch.pack,
      )
      tok_loss_bt, clipped_bt = jax.vmap(loss_fn_tok, in_axes=(0, 0, 0, 0, None))(
        lp.logp_bt, batch.logp_bt, adv_b, mask_bt, cfg.clip_eps
      )
      pg_loss = loss_lib.aggregate(tok_loss_bt, mask_bt, cfg.loss_agg)
      metrics = {
        "pg_loss": pg_loss,
        "clip_frac": masked_mean(clipped_bt, mask_bt),
        "entropy": masked_mean(lp.entropy_bt, mask_bt),
        "kl_behaviour": masked_mean(loss_lib.kl_k3(lp.logp_bt, batch.logp_bt), mask_bt),
        "ratio_dev": masked_mean(jnp.abs(jnp.exp(lp.logp_bt - batch.logp_bt) - 1), mask_bt),
      }
      loss = pg_loss
      if use_kl:
        kl_bt = jnp.where(mask_bt, loss_lib.kl_k3(lp.logp_bt, ref_logp_bt), 0.0)
        kl = loss_lib.aggregate(kl_bt, mask_bt, cfg.loss_agg)
        loss = loss + cfg.kl_coef * kl
        metrics["kl_ref"] = kl
      metrics["loss"] = loss
      return loss, metrics

    grads, metrics = jax.grad(loss_fn, has_aux=True)(state.params)
    # Further epochs on the same batch: the sampler's policy stays pi_old, so the ratio and
    # its clipping bound how far the later epochs move from it.
    for _ in range(cfg.ppo_epochs - 1):
      state, _ = apply_gradients(state, tx, grads, metrics, advance=False)
      grads, metrics = jax.grad(loss_fn, has_aux=True)(state.params)
    metrics["adv_abs"] = jnp.mean(jnp.abs(adv_b))
    metrics["reward"] = jnp.mean(batch.rewards_b)
    # Groups whose rows all scored the same carry no signal (every advantage 0): the share
    # of the step's prompts that taught nothing (all failed, or all solved).
    r_g = batch.rewards_b.reshape(-1, cfg.group_size)
    metrics["groups_flat"] = jnp.mean(jnp.all(r_g == r_g[:, :1], axis=1).astype(jnp.float32))
    # Reward sparsity: the share of the step's rows that earned nothing (a batch where it is
    # 1 teaches nothing at all).
    metrics["reward_zero_frac"] = jnp.mean((batch.rewards_b == 0).astype(jnp.float32))
    return apply_gradients(state, tx, grads, metrics)

  return update


def apply_sao_gradients(
  state: TrainState,
  tx,
  grads,
  metrics: Metrics,
  batch: SAOBatch | MemorySAOBatch,
  rewards_b: jax.Array,
  rho_b: jax.Array,
  valid_b: jax.Array,
  step_scale: jax.Array,
) -> tuple[TrainState, Metrics]:
  """The end of every SAO update (`make_sao_update`, `compression.sao_update`): the task
  tracker absorbs `rewards_b` of the trajectories where `valid_b` (tasks `batch.task_b`,
  forgetting factors `rho_b`), then `apply_gradients` takes the step scaled by `step_scale`,
  leaving the tracker as it was when it skips a non-finite step."""
  tracker = trackers.update_beta_tracker(state.tracker, batch.task_b, rewards_b, rho_b, valid_b)
  return apply_gradients(
    state,
    tx,
    grads,
    metrics,
    step_scale=step_scale,
    poison_b=batch.poison_b,
    tracker=tracker,
  )


def sao_row_weights(
  traj_b: jax.Array,
  rows_b: jax.Array,
  mask_bt: jax.Array,
  staleness_bt: jax.Array,
  sao: SAOConfig,
) -> dict[str, jax.Array]:
  """Per-row and per-token bookkeeping of an SAO batch of N rows, and the step scale.

  traj_b [N] int, the trajectory of each row; rows_b [N] bool, the rows that carry a
  training signal (a text batch: its valid rows; a memory batch: its graded rows);
  mask_bt [N, T] bool, their tokens that do; staleness_bt [N, T] int, each token's.

  share_b: the row's share of its trajectory (1/S for each of its S signal rows; 0 on the
    others), so that every trajectory counts once in the batch statistics;
  fresh_bt: freshness factor 2^(-s/half_life) (decay) or 1 (drop) of each token's staleness,
    0 beyond max_staleness and outside mask_bt;
  step_scale: the mean of fresh_bt over mask_bt, the step size of this update;
  weight_bt: fresh_bt / step_scale, each token's relative weight in the loss (mean 1).
  """
  chex.assert_rank([traj_b, rows_b, mask_bt, staleness_bt], [1, 1, 2, 2])
  chex.assert_equal_shape([mask_bt, staleness_bt])
  rows = rows_b.shape[0]
  valid_f_b = rows_b.astype(jnp.float32)
  steps_b = jax.ops.segment_sum(valid_f_b, traj_b, rows)[traj_b]
  share_b = valid_f_b / jnp.maximum(steps_b, 1.0)
  fresh_bt = jnp.where(
    mask_bt,
    loss_lib.freshness_weights(
      staleness_bt.reshape(-1), sao.freshness_half_life, sao.max_staleness, sao.staleness_mode
    ).reshape(mask_bt.shape),
    0.0,
  )
  step_scale = masked_mean(fresh_bt, mask_bt)
  return {
    "share_b": share_b,
    "fresh_bt": fresh_bt,
    "step_scale": step_scale,
    "weight_bt": fresh_bt / jnp.maximum(step_scale, 1e-12),
  }


def make_sao_update(
  model: TransformerLM, tx, rl: RLConfig, sao: SAOConfig
) -> Callable[[TrainState, SAOBatch], tuple]:
  """SAO update on a batch of single trajectories from any policy versions (`SAOBatch`).

  1. Baseline: the task's Beta-tracker value from before this reward (SPO, arXiv
     2509.13232), or with sao.baseline='value_head' a learned V(prompt) trained by squared
     error (weight sao.value_coef); advantage r - baseline divided by the batch std floored
     at sao.adv_std_floor, each trajectory counted once (`trackers.spo_advantage`; centred
     only with sao.adv_center). The tracker is updated either way (it drives prioritised
     task sampling), once per trajectory.
  2. Decoupled PPO with truncated importance weights pi_prox/pi_behav (AReaL, arXiv
     2505.24298, eq. 5). pi_prox is the policy before this update: with rl.ppo_epochs = 1
     its log-probs are this forward pass's, held constant, so the trust-region ratio is 1
     and rl.clip_eps has no effect (AReaL's reuse of the training forward); with
     rl.ppo_epochs = E > 1 the first epoch's log-probs are kept as pi_prox for all E
     optimizer steps, and clipping bounds the later ones.
  3. Freshness (sao.staleness_mode='decay'): the step is multiplied by the mean over the
     batch's tokens of 2^(-s/half_life), s each token's staleness (after the optimizer, so
     it is a step size), and each token's factor relative to that mean weights its loss
     (`sao_row_weights`).
  4. rl.kl_coef > 0 adds a k3 KL penalty to the frozen reference policy (state.ref_params).
  5. The tracker absorbs the trajectories' rewards (clipped to [0, 1]) with SPO's forgetting
     factor from the drift D = mean |log pi_behav - log pi_theta| over each trajectory.
  """
  use_value_head = sao.baseline == "value_head"
  use_kl = rl.kl_coef > 0
  verify = sao.verify_drift > 0

  def update(state: TrainState, batch: SAOBatch):
    mask_bt = batch.valid_bt & batch.row_valid_b[:, None]
    w = sao_row_weights(batch.traj_b, batch.row_valid_b, mask_bt, batch.staleness_bt, sao)
    head_b = batch.head_b & batch.row_valid_b
    n_traj = jnp.maximum(jnp.sum(head_b), 1)
    per_traj = lambda x_b: jnp.sum(jnp.where(head_b, x_b, 0.0)) / n_traj
    per_share = lambda x_b: jnp.sum(x_b * w["share_b"]) / n_traj
    used_bt = mask_bt & (w["weight_bt"] > 0)
    logprobs = lambda params, **kw: completion_logprobs(
      model,
      params,
      batch.prompt_bp,
      batch.prompt_valid_bp,
      batch.tokens_bt,
      mask_bt,
      temperature=rl.temperature,
      pack=batch.pack,
      **kw,
    )
    ref_logp_bt = jax.lax.stop_gradient(logprobs(state.ref_params).logp_bt) if use_kl else None

    def loss_fn(params, prox_logp_bt):
      lp = logprobs(params, with_entropy=True, with_value=use_value_head)
      if prox_logp_bt is None:  # the first step: pi_prox is exactly these parameters
        prox_logp_bt = jax.lax.stop_gradient(lp.logp_bt)
      # Verified rollouts: a trajectory whose claimed log-probs drift further than
      # sao.verify_drift from pi_prox takes no part (weights, advantage statistics, tracker).
      ok_b = jnp.ones_like(batch.row_valid_b)
      if verify:
        drift_now_b = trackers.trajectory_drift(batch.logp_bt, prox_logp_bt, mask_bt, batch.traj_b)
        ok_b = drift_now_b <= sao.verify_drift
      ok_bt = mask_bt & ok_b[:, None]
      # Their claimed log-probs never enter the arithmetic (a forged e^-50 would overflow
      # the importance ratio and turn the zero-weighted gradient into NaN): pi_prox's instead.
      behav_bt = jnp.where(ok_bt, batch.logp_bt, prox_logp_bt) if verify else batch.logp_bt
      if use_value_head:
        value_loss = per_share(jnp.square(lp.values_b - batch.rewards_b))
        values_b = jax.lax.stop_gradient(lp.values_b)
      else:
        value_loss = jnp.zeros((), jnp.float32)
        values_b = trackers.tracker_value(state.tracker, batch.task_b)
      share_b = jnp.where(ok_b, w["share_b"], 0.0)
      adv_b = trackers.spo_advantage(
        batch.rewards_b, values_b, share_b, sao.adv_std_floor, sao.adv_center
      )
      tok_loss_bt, aux = jax.vmap(
        lambda lp_t, px_t, bh_t, a, m_t: loss_lib.decoupled_ppo_loss(
          lp_t, px_t, bh_t, a, m_t, rl.clip_eps, sao.is_cap, sao.is_level
        )
      )(lp.logp_bt, prox_logp_bt, behav_bt, adv_b, mask_bt)
      weight_bt = jnp.where(ok_bt, w["weight_bt"], 0.0)
      pg_loss = loss_lib.aggregate(tok_loss_bt * weight_bt, used_bt & ok_bt, rl.loss_agg)
      loss = pg_loss + sao.value_coef * value_loss
      out = {
        "aux": aux,
        "entropy_bt": lp.entropy_bt,
        "prox_logp_bt": prox_logp_bt,
        "adv_b": adv_b,
        "values_b": values_b,
        "value_loss": value_loss,
        "pg_loss": pg_loss,
        "ok_b": ok_b,
        "behav_bt": behav_bt,
      }
      if use_kl:
        out["kl_ref"] = loss_lib.aggregate(
          jnp.where(used_bt, loss_lib.kl_k3(lp.logp_bt, ref_logp_bt), 0.0), used_bt, rl.loss_agg
        )
        loss = loss + rl.kl_coef * out["kl_ref"]
      return loss, out

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    (loss, first), grads = grad_fn(state.params, None)
    prox_logp_bt = first["prox_logp_bt"]
    clip_fracs = [first["aux"]["clipped_t"]]
    first_loss = loss
    for _ in range(rl.ppo_epochs - 1):
      state, _ = apply_gradients(
        state,
        tx,
        grads,
        {"loss": loss},
        step_scale=w["step_scale"],
        poison_b=batch.poison_b,
        advance=False,
      )
      (loss, out), grads = grad_fn(state.params, prox_logp_bt)
      clip_fracs.append(out["aux"]["clipped_t"])
    behav_bt = first["behav_bt"]  # (the claimed log-probs of the verified trajectories)
    drift_b = trackers.trajectory_drift(behav_bt, prox_logp_bt, mask_bt, batch.traj_b)
    rho_b = trackers.forgetting_factor(
      drift_b, sao.tracker_d_half, sao.tracker_rho_min, sao.tracker_rho_max
    )
    log_ratio_bt = prox_logp_bt - behav_bt
    metrics = {
      "loss": loss,  # the last epoch's: the one whose gradient this step applies
      "pg_loss": first["pg_loss"],
      "value_loss": first["value_loss"],
      "reward": per_traj(batch.rewards_b),
      "reward_zero_frac": per_traj((batch.rewards_b == 0).astype(jnp.float32)),
      "adv_abs": per_share(jnp.abs(first["adv_b"])),
      "adv_neg_frac": per_share((first["adv_b"] < 0).astype(jnp.float32)),
      "value_mean": per_share(first["values_b"]),
      # Off-policy deviation of the consumed tokens: |pi_prox / pi_behav - 1| and
      # KL(behaviour || current) (k3 estimate; tokens were drawn from the behaviour
      # policy, so it is unbiased), before truncation.
      "is_dev": masked_mean(jnp.abs(jnp.exp(log_ratio_bt) - 1), mask_bt),
      "kl_behaviour": masked_mean(loss_lib.kl_k3(behav_bt, prox_logp_bt), mask_bt),
      "drift": per_traj(drift_b),
      # (the largest of the batch's verified trajectories: what sao.verify_drift is set against)
      "drift_max": jnp.max(jnp.where(head_b & first["ok_b"], drift_b, 0.0)),
      "tracker_rho": per_traj(rho_b),
      "is_truncated_frac": masked_mean(first["aux"]["truncated_t"], mask_bt),
      # Clipping can only bind from the second epoch on (pi_prox = pi_theta at the first).
      "clip_frac": jnp.mean(jnp.stack([masked_mean(c, mask_bt) for c in clip_fracs[1:]]))
      if rl.ppo_epochs > 1
      else masked_mean(clip_fracs[0], mask_bt),
      "entropy": masked_mean(first["entropy_bt"], mask_bt),
      "freshness_mean": masked_mean(w["fresh_bt"], mask_bt),
      "step_scale": w["step_scale"],
      "tokens_used": jnp.sum(used_bt),
      "trajectories": jnp.sum(head_b),
      # (per trajectory, by its first row: which the host charges to their samplers)
      "unverified_b": head_b & ~first["ok_b"],
    }
    if use_kl:
      metrics["kl_ref"] = first["kl_ref"]
    if rl.ppo_epochs > 1:
      metrics["first_loss"] = first_loss
    return apply_sao_gradients(
      state,
      tx,
      grads,
      metrics,
      batch,
      batch.rewards_b,
      rho_b,
      head_b & first["ok_b"],
      w["step_scale"],
    )

  return update
