"""Learner state and the pure update functions `update(state, batch) -> (state, metrics)`.

Nothing here is jitted; `sao_jax.runners.compiled` applies `jax.jit` with shardings.

Batches share one layout with the sampler: a left-padded prompt [B, P] followed by a
completion [B, T] (for SFT the completion is the worked solution plus EOS).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax

from sao_jax.config import ModelConfig, OptimConfig, RLConfig, SAOConfig
from sao_jax.models.transformer import TransformerLM
from sao_jax.rl import advantages as adv_lib
from sao_jax.rl import losses as loss_lib
from sao_jax.rl import trackers
from sao_jax.sampling import completion_logprobs

Batch = dict[str, jax.Array]
Metrics = dict[str, jax.Array]


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array
  ref_params: Any = None  # frozen reference policy for the KL penalty (None: no KL)
  tracker: Any = None  # SAO: per-task value tracker (checkpointed with the state)
  lr_scale: jax.Array = None  # multiplies every update; lowered on a rollback
  nonfinite: jax.Array = None  # updates skipped because gradients or loss were not finite


def make_optimizer(cfg: OptimConfig, total_steps: int) -> optax.GradientTransformation:
  """clip_by_global_norm -> AdamW with linear warm-up, then constant."""
  del total_steps  # constant after warm-up: runs are stopped by wall-clock as often as by steps
  warmup = max(cfg.warmup_steps, 1)
  schedule = optax.linear_schedule(cfg.lr / warmup, cfg.lr, warmup)
  return optax.chain(
      optax.clip_by_global_norm(cfg.grad_clip),
      optax.adamw(schedule, b2=cfg.b2, weight_decay=cfg.weight_decay))


def init_state_fn(model: TransformerLM, tx: optax.GradientTransformation, prompt_len: int,
                  with_ref: bool, num_tasks: int = 0) -> Callable[[jax.Array], TrainState]:
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
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                      rng=state_rng, ref_params=params if with_ref else None,
                      tracker=trackers.init_beta_tracker(num_tasks) if num_tasks else None,
                      lr_scale=jnp.ones((), jnp.float32), nonfinite=jnp.zeros((), jnp.int32))
  return init


def _apply_grads(state: TrainState, tx, grads, metrics: Metrics, batch: Batch,
                 step_scale: jax.Array | float = 1.0, advance: bool = True,
                 **extra) -> tuple[TrainState, Metrics]:
  """Optimizer step scaled by `state.lr_scale * step_scale`, guarded against non-finite values.

  The scale multiplies the optimizer's output, so it is a step size exactly: gradient
  clipping and Adam's normalisation would cancel the same factor applied to the loss.

  If the gradients or the loss are not finite (or the batch carries the test/soak fault
  `poison`, which turns the gradients into NaN), params, optimizer state and `extra` (e.g.
  the SAO tracker) stay exactly as they were; `step` still counts the update and
  `nonfinite` counts the skip. The run never sees a NaN in its parameters. `advance=False`
  (the inner epochs of one update) leaves `step` as it is.
  """
  if "poison" in batch:
    poison = jnp.sum(batch["poison"])  # 0, or NaN on an injected fault
    grads = jax.tree.map(lambda g: g * (1.0 + poison).astype(g.dtype), grads)
  grad_norm = optax.tree.norm(grads)
  finite = jnp.isfinite(grad_norm) & jnp.isfinite(metrics["loss"])
  safe_grads = jax.tree.map(lambda g: jnp.where(finite, g, jnp.zeros_like(g)), grads)
  updates, opt_state = tx.update(safe_grads, state.opt_state, state.params)
  scale = state.lr_scale * step_scale
  updates = jax.tree.map(lambda u: u * scale.astype(u.dtype), updates)
  params = optax.apply_updates(state.params, updates)
  new = {"params": params, "opt_state": opt_state, **extra}
  old = {"params": state.params, "opt_state": state.opt_state,
         **{k: getattr(state, k) for k in extra}}
  kept = jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
  metrics = dict(metrics, grad_norm=grad_norm, nonfinite_skipped=(~finite).astype(jnp.int32),
                 lr_scale=state.lr_scale)
  return state.replace(step=state.step + int(advance), nonfinite=state.nonfinite + (~finite).astype(
      jnp.int32), **kept), metrics


def make_sft_update(model: TransformerLM, tx) -> Callable[[TrainState, Batch], tuple]:
  """Cross-entropy on completion tokens (the worked solution and its EOS)."""

  def update(state: TrainState, batch: Batch):
    def loss_fn(params):
      logp_bt = completion_logprobs(model, params, batch["prompt"], batch["prompt_valid"],
                                    batch["tokens"], batch["valid"])
      mask_bt = batch["valid"].astype(jnp.float32)
      n_tok = jnp.maximum(jnp.sum(mask_bt), 1.0)
      loss = -jnp.sum(logp_bt) / n_tok
      return loss, {"loss": loss, "tokens": jnp.sum(mask_bt)}

    grads, metrics = jax.grad(loss_fn, has_aux=True)(state.params)
    return _apply_grads(state, tx, grads, metrics, batch)
  return update


def make_rl_update(model: TransformerLM, tx, cfg: RLConfig) -> Callable[[TrainState, Batch], tuple]:
  """Group-based policy-gradient update (synchronous GRPO with `cfg.group_size` rows/prompt);
  `cfg.ppo_epochs` optimizer steps on the batch, one learner step.

  batch: prompt [B,P], prompt_valid [B,P], tokens [B,T], valid [B,T], logp [B,T] (behaviour
  log-probs recorded by the sampler), rewards [B]. Rows of one prompt are consecutive.
  """
  loss_fn_tok = loss_lib.LOSSES.get(cfg.loss)
  use_kl = cfg.kl_coef > 0

  def update(state: TrainState, batch: Batch):
    adv_b = adv_lib.grouped(cfg.advantage, batch["rewards"], cfg.group_size)
    mask_bt = batch["valid"]
    ref_logp_bt = None
    if use_kl:
      ref_logp_bt = jax.lax.stop_gradient(completion_logprobs(
          model, state.ref_params, batch["prompt"], batch["prompt_valid"], batch["tokens"],
          mask_bt, temperature=cfg.temperature))

    def loss_fn(params):
      logp_bt, ent_bt = completion_logprobs(
          model, params, batch["prompt"], batch["prompt_valid"], batch["tokens"], mask_bt,
          temperature=cfg.temperature, with_entropy=True)
      tok_loss_bt, clipped_bt = jax.vmap(loss_fn_tok, in_axes=(0, 0, 0, 0, None))(
          logp_bt, batch["logp"], adv_b, mask_bt, cfg.clip_eps)
      pg_loss = loss_lib.aggregate(tok_loss_bt, mask_bt, cfg.loss_agg)
      n_tok = jnp.maximum(jnp.sum(mask_bt), 1)
      metrics = {
          "pg_loss": pg_loss,
          "clip_frac": jnp.sum(clipped_bt) / n_tok,
          "entropy": jnp.sum(ent_bt) / n_tok,
"kl_behaviour": jnp.sum(jnp.where(mask_bt, loss_lib.kl_k3(logp_bt, batch["logp"]), 0.0))
                          / n_tok,
          "ratio_dev": jnp.sum(jnp.where(mask_bt, jnp.abs(jnp.exp(logp_bt - batch["logp"]) - 1),
                                         0.0)) / n_tok,
      }
      loss = pg_loss
      if use_kl:
        kl_bt = jnp.where(mask_bt, loss_lib.kl_k3(logp_bt, ref_logp_bt), 0.0)
        kl = loss_lib.aggregate(kl_bt, mask_bt, cfg.loss_agg)
        loss = loss + cfg.kl_coef * kl
        metrics["kl_ref"] = kl
      metrics["loss"] = loss
      return loss, metrics

    grads, metrics = jax.grad(loss_fn, has_aux=True)(state.params)
    # Further epochs on the same batch: the sampler's policy stays pi_old, so the ratio and
    # its clipping bound how far the later epochs move from it.
    for _ in range(cfg.ppo_epochs - 1):
      state, _ = _apply_grads(state, tx, grads, metrics, batch, advance=False)
      grads, metrics = jax.grad(loss_fn, has_aux=True)(state.params)
    metrics["adv_abs"] = jnp.mean(jnp.abs(adv_b))
    metrics["reward"] = jnp.mean(batch["rewards"])
    return _apply_grads(state, tx, grads, metrics, batch)
  return update



def make_sao_update(model: TransformerLM, tx, rl: RLConfig, sao: SAOConfig
                    ) -> Callable[[TrainState, Batch], tuple]:
  """SAO update on a batch of single trajectories (from any policy versions).

  batch: prompt [B,P], prompt_valid [B,P], tokens [B,T], valid [B,T], logp [B,T] (behaviour),
  rewards [B] (the trajectory's total reward on each of its rows), task [B] int32 (index
  into the tracker), staleness [B] int32 (learner version - behaviour version), row_valid [B]
  bool (padding rows are False), and for multi-step trajectories (one row per environment
  step) traj [B] int32 (which trajectory of the batch, 0..B-1) and head [B] bool (the
  trajectory's first row); without them every row is its own trajectory.

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
  3. Freshness (sao.staleness_mode='decay'): the step is multiplied by the batch's
     token-weighted mean factor 2^(-s/half_life) (after the optimizer, so it is a step
     size), and each row's factor relative to that mean weights its loss.
  4. rl.kl_coef > 0 adds a k3 KL penalty to the frozen reference policy (state.ref_params).
  5. The tracker absorbs the trajectories' rewards (clipped to [0, 1]) with SPO's forgetting
     factor from the drift D = mean |log pi_behav - log pi_theta| over each trajectory.
  """

  use_value_head = sao.baseline == "value_head"
  use_kl = rl.kl_coef > 0

  def update(state: TrainState, batch: Batch):
    row_valid_b = batch["row_valid"]
    n_rows_total = row_valid_b.shape[0]
    traj_b = batch.get("traj", jnp.arange(n_rows_total, dtype=jnp.int32))
    head_b = batch.get("head", row_valid_b) & row_valid_b
    # Each trajectory counts once in the batch statistics, however many steps it has.
    steps_b = jax.ops.segment_sum(row_valid_b.astype(jnp.float32), traj_b,
                                  n_rows_total)[traj_b]
    share_b = jnp.where(row_valid_b, 1.0 / jnp.maximum(steps_b, 1.0), 0.0)
    n_traj = jnp.maximum(jnp.sum(head_b), 1)
    mask_bt = batch["valid"] & row_valid_b[:, None]
    ntok_b = jnp.sum(mask_bt, -1).astype(jnp.float32)
    tracker_values_b = trackers.tracker_value(state.tracker, batch["task"])
    fresh_b = loss_lib.freshness_weights(batch["staleness"], sao.freshness_half_life,
                                         sao.max_staleness, sao.staleness_mode)
    fresh_b = fresh_b * row_valid_b.astype(jnp.float32)
    # Token-weighted mean freshness: the step size of this update. What is left of each
    # row's factor after dividing by it (mean 1 over the batch's tokens) weights its loss.
    step_scale = jnp.sum(fresh_b * ntok_b) / jnp.maximum(jnp.sum(ntok_b), 1.0)
    weight_b = fresh_b / jnp.maximum(step_scale, 1e-12)
    used_bt = mask_bt & (weight_b[:, None] > 0)
    ref_logp_bt = None
    if use_kl:
      ref_logp_bt = jax.lax.stop_gradient(completion_logprobs(
          model, state.ref_params, batch["prompt"], batch["prompt_valid"], batch["tokens"],
          mask_bt, temperature=rl.temperature))

    def loss_fn(params, prox_logp_bt):
      value_loss = jnp.zeros((), jnp.float32)
      if use_value_head:
        logp_bt, ent_bt, values_b = completion_logprobs(
            model, params, batch["prompt"], batch["prompt_valid"], batch["tokens"], mask_bt,
            temperature=rl.temperature, with_entropy=True, with_value=True)
        value_loss = (jnp.sum(jnp.square(values_b - batch["rewards"]) * share_b)
                      / n_traj)
        values_b = jax.lax.stop_gradient(values_b)
      else:
        logp_bt, ent_bt = completion_logprobs(
            model, params, batch["prompt"], batch["prompt_valid"], batch["tokens"], mask_bt,
            temperature=rl.temperature, with_entropy=True)
        values_b = tracker_values_b
      adv_b = trackers.spo_advantage(batch["rewards"], values_b, share_b, sao.adv_std_floor,
                                     sao.adv_center)
      if prox_logp_bt is None:  # the first step: pi_prox is exactly these parameters
        prox_logp_bt = jax.lax.stop_gradient(logp_bt)
      tok_loss_bt, aux = jax.vmap(
          lambda lp, px, bh, a, m: loss_lib.decoupled_ppo_loss(
              lp, px, bh, a, m, rl.clip_eps, sao.is_cap, sao.is_level))(
                  logp_bt, prox_logp_bt, batch["logp"], adv_b, mask_bt)
      tok_loss_bt = tok_loss_bt * weight_b[:, None]
      pg_loss = loss_lib.aggregate(tok_loss_bt, used_bt, rl.loss_agg)
      loss = pg_loss + sao.value_coef * value_loss
      out = {"aux": aux, "ent_bt": ent_bt, "prox_logp_bt": prox_logp_bt, "adv_b": adv_b,
             "values_b": values_b, "value_loss": value_loss, "pg_loss": pg_loss}
      if use_kl:
        kl = loss_lib.aggregate(jnp.where(used_bt, loss_lib.kl_k3(logp_bt, ref_logp_bt), 0.0),
                                used_bt, rl.loss_agg)
        loss = loss + rl.kl_coef * kl
        out["kl_ref"] = kl
      return loss, out

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    (loss, out), grads = grad_fn(state.params, None)
    prox_logp_bt = out["prox_logp_bt"]
    clip_fracs = []
    first_out, first_loss = out, loss
    for _ in range(rl.ppo_epochs - 1):
      state, _ = _apply_grads(state, tx, grads, {"loss": loss}, batch, step_scale,
                              advance=False)
      (loss, out), grads = grad_fn(state.params, prox_logp_bt)
      clip_fracs.append(out["aux"]["clipped_t"])
    n_tok = jnp.maximum(jnp.sum(mask_bt), 1)
    log_ratio_bt = jnp.where(mask_bt, prox_logp_bt - batch["logp"], 0.0)
    # Tokens were drawn from the behaviour policy, so k3(behaviour, current) estimates
    # KL(behaviour || current) without bias.
    kl_bt = jnp.where(mask_bt, loss_lib.kl_k3(batch["logp"], prox_logp_bt), 0.0)
    drift_b = trackers.trajectory_drift(batch["logp"], prox_logp_bt, mask_bt, traj_b)
    rho_b = trackers.forgetting_factor(drift_b, sao.tracker_d_half, sao.tracker_rho_min,
                                       sao.tracker_rho_max)
    per_traj = lambda x_b: jnp.sum(jnp.where(head_b, x_b, 0.0)) / n_traj
    aux = first_out["aux"]
    metrics = {
        "loss": loss,  # the last epoch's: the one whose gradient this step applies
        "pg_loss": first_out["pg_loss"],
        "value_loss": first_out["value_loss"],
        "reward": per_traj(batch["rewards"]),
        "adv_abs": jnp.sum(jnp.abs(first_out["adv_b"]) * share_b) / n_traj,
        "adv_neg_frac": jnp.sum((first_out["adv_b"] < 0) * share_b) / n_traj,
        "value_mean": jnp.sum(first_out["values_b"] * share_b) / n_traj,
        # Off-policy deviation of the consumed tokens: |pi_prox / pi_behav - 1| and
        # KL(behaviour || current) (k3 estimate), before truncation.
        "is_dev": jnp.sum(jnp.where(mask_bt, jnp.abs(jnp.exp(log_ratio_bt) - 1), 0.0)) / n_tok,
        "kl_behaviour": jnp.sum(kl_bt) / n_tok,
        "drift": per_traj(drift_b),
        "tracker_rho": per_traj(rho_b),
        "is_truncated_frac": jnp.sum(aux["truncated_t"]) / n_tok,
        # Clipping can only bind from the second epoch on (pi_prox = pi_theta at the first).
        "clip_frac": (jnp.mean(jnp.stack([jnp.sum(c) for c in clip_fracs])) / n_tok
                      if clip_fracs else jnp.sum(aux["clipped_t"]) / n_tok),
        "entropy": jnp.sum(first_out["ent_bt"]) / n_tok,
        "freshness_mean": jnp.sum(fresh_b * share_b) / n_traj,
        "step_scale": step_scale,
        "tokens_used": jnp.sum(used_bt),
        "trajectories": jnp.sum(head_b),
    }
    if use_kl:
      metrics["kl_ref"] = first_out["kl_ref"]
    if rl.ppo_epochs > 1:
      metrics["first_loss"] = first_loss
    tracker = trackers.update_beta_tracker(state.tracker, batch["task"], batch["rewards"], rho_b,
                                           head_b)
    return _apply_grads(state, tx, grads, metrics, batch, step_scale, tracker=tracker)
  return update
