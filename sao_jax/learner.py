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
                 **extra) -> tuple[TrainState, Metrics]:
  """Optimizer step scaled by `state.lr_scale`, guarded against non-finite values.

  If the gradients or the loss are not finite (or the batch carries the test/soak fault
  `poison`, which turns the gradients into NaN), params, optimizer state and `extra` (e.g.
  the SAO tracker) stay exactly as they were; `step` still counts the update and
  `nonfinite` counts the skip. The run never sees a NaN in its parameters.
  """
  if "poison" in batch:
    poison = jnp.sum(batch["poison"])  # 0, or NaN on an injected fault
    grads = jax.tree.map(lambda g: g * (1.0 + poison).astype(g.dtype), grads)
  grad_norm = optax.tree.norm(grads)
  finite = jnp.isfinite(grad_norm) & jnp.isfinite(metrics["loss"])
  safe_grads = jax.tree.map(lambda g: jnp.where(finite, g, jnp.zeros_like(g)), grads)
  updates, opt_state = tx.update(safe_grads, state.opt_state, state.params)
  updates = jax.tree.map(lambda u: u * state.lr_scale.astype(u.dtype), updates)
  params = optax.apply_updates(state.params, updates)
  new = {"params": params, "opt_state": opt_state, **extra}
  old = {"params": state.params, "opt_state": state.opt_state,
         **{k: getattr(state, k) for k in extra}}
  kept = jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
  metrics = dict(metrics, grad_norm=grad_norm, nonfinite_skipped=(~finite).astype(jnp.int32),
                 lr_scale=state.lr_scale)
  return state.replace(step=state.step + 1, nonfinite=state.nonfinite + (~finite).astype(
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
  """Group-based policy-gradient update (synchronous GRPO with `cfg.group_size` rows/prompt).

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
    metrics["adv_abs"] = jnp.mean(jnp.abs(adv_b))
    metrics["reward"] = jnp.mean(batch["rewards"])
    return _apply_grads(state, tx, grads, metrics, batch)
  return update



def make_sao_update(model: TransformerLM, tx, rl: RLConfig, sao: SAOConfig
                    ) -> Callable[[TrainState, Batch], tuple]:
  """SAO update on a batch of single trajectories (one row each, from any policy version).

  batch: prompt, prompt_valid, tokens, valid, logp (behaviour), rewards [B], task [B] int32
  (index into the tracker), staleness [B] int32 (learner version - behaviour version),
  row_valid [B] bool (padding rows are False).

  1. Baseline: the task's Beta-tracker value from before this reward (SPO, arXiv
     2509.13232), or with sao.baseline='value_head' a learned V(prompt) trained by squared
     error (weight sao.value_coef); advantage r - baseline, normalised over the batch. The
     tracker is updated either way (it drives prioritised task sampling).
  2. Proximal policy = these parameters before the update; decoupled PPO with truncated
     importance weights pi_prox/pi_behav (AReaL, arXiv 2505.24298, eq. 5).
  3. Freshness: each trajectory's loss is scaled by a factor of its staleness (and dropped
     beyond `max_staleness`), i.e. stale samples take smaller steps.
  4. The tracker absorbs the rewards with a KL-adaptive forgetting factor.
  """

  use_value_head = sao.baseline == "value_head"

  def update(state: TrainState, batch: Batch):
    row_valid_b = batch["row_valid"]
    n_rows = jnp.maximum(jnp.sum(row_valid_b), 1)
    mask_bt = batch["valid"] & row_valid_b[:, None]
    tracker_values_b = trackers.tracker_value(state.tracker, batch["task"])
    fresh_b = loss_lib.freshness_weights(batch["staleness"], sao.freshness_half_life,
                                         sao.max_staleness, sao.staleness_mode)
    weight_b = fresh_b * row_valid_b.astype(jnp.float32)

    def loss_fn(params):
      value_loss = jnp.zeros((), jnp.float32)
      if use_value_head:
        logp_bt, ent_bt, values_b = completion_logprobs(
            model, params, batch["prompt"], batch["prompt_valid"], batch["tokens"], mask_bt,
            temperature=rl.temperature, with_entropy=True, with_value=True)
        value_loss = jnp.sum(jnp.square(values_b - batch["rewards"]) * row_valid_b) / n_rows
        values_b = jax.lax.stop_gradient(values_b)
      else:
        logp_bt, ent_bt = completion_logprobs(
            model, params, batch["prompt"], batch["prompt_valid"], batch["tokens"], mask_bt,
            temperature=rl.temperature, with_entropy=True)
        values_b = tracker_values_b
      adv_b = trackers.spo_advantage(batch["rewards"], values_b, row_valid_b)
      # One gradient step per batch: the proximal policy is exactly these parameters, so
      # its log-probs are this forward pass's, held constant (no second forward pass).
      prox_logp_bt = jax.lax.stop_gradient(logp_bt)
      tok_loss_bt, aux = jax.vmap(
          lambda lp, px, bh, a, m: loss_lib.decoupled_ppo_loss(
              lp, px, bh, a, m, rl.clip_eps, sao.is_cap, sao.is_level))(
                  logp_bt, prox_logp_bt, batch["logp"], adv_b, mask_bt)
      tok_loss_bt = tok_loss_bt * weight_b[:, None]
      used_bt = mask_bt & (weight_b[:, None] > 0)
      pg_loss = loss_lib.aggregate(tok_loss_bt, used_bt, rl.loss_agg)
      loss = pg_loss + sao.value_coef * value_loss
      return loss, (aux, ent_bt, used_bt, prox_logp_bt, adv_b, values_b, value_loss)

    (loss, (aux, ent_bt, used_bt, prox_logp_bt, adv_b, values_b, value_loss)), grads = (
        jax.value_and_grad(loss_fn, has_aux=True)(state.params))
    n_tok = jnp.maximum(jnp.sum(mask_bt), 1)
    log_ratio_bt = jnp.where(mask_bt, prox_logp_bt - batch["logp"], 0.0)
    # Tokens were drawn from the behaviour policy, so k3(behaviour, current) estimates
    # KL(behaviour || current) without bias.
    kl_b = jnp.sum(jnp.where(mask_bt, loss_lib.kl_k3(batch["logp"], prox_logp_bt), 0.0), -1)
    metrics = {
        "loss": loss,
        "value_loss": value_loss,
        "reward": jnp.sum(batch["rewards"] * row_valid_b) / n_rows,
        "adv_abs": jnp.sum(jnp.abs(adv_b) * row_valid_b) / n_rows,
        "value_mean": jnp.sum(values_b * row_valid_b) / n_rows,
        # Off-policy deviation of the consumed tokens: |pi_prox / pi_behav - 1| and
        # KL(behaviour || current) (k3 estimate), before truncation.
        "is_dev": jnp.sum(jnp.where(mask_bt, jnp.abs(jnp.exp(log_ratio_bt) - 1), 0.0)) / n_tok,
        "kl_behaviour": jnp.sum(kl_b) / n_tok,
        "is_truncated_frac": jnp.sum(aux["truncated_t"]) / n_tok,
        "clip_frac": jnp.sum(aux["clipped_t"]) / n_tok,
        "entropy": jnp.sum(ent_bt) / n_tok,
        "freshness_mean": jnp.sum(weight_b) / n_rows,
        "tokens_used": jnp.sum(used_bt),
    }
    n_valid_b = jnp.maximum(jnp.sum(mask_bt, -1), 1)
    rho_b = trackers.forgetting_factor(kl_b / n_valid_b, sao.tracker_d_half,
                                       sao.tracker_rho_min, sao.tracker_rho_max)
    tracker = trackers.update_beta_tracker(state.tracker, batch["task"], batch["rewards"], rho_b,
                                           row_valid_b)
    return _apply_grads(state, tx, grads, metrics, batch, tracker=tracker)
  return update
