"""SAO's learner update for the policy with compressed memory.

The update of `sao_jax.learner.make_sao_update` (single trajectories from any policy
versions, group-free baseline, decoupled PPO with truncated importance weights, freshness,
the SPO tracker), on the batches of `compression.policy.make_memory_update`: whole
long-horizon trajectories whose rows (graded steps first) see the memory rebuilt from the
shipped bank and graveyard (`MemoryPolicy.row_logprobs(stored=True)`), so that at the
behaviour parameters the recomputed log-probs are the sampler's.

Why not `make_memory_update(mode="rl")`: its advantage is a group normalisation, and SAO has
one trajectory per task. With group_size 1 it would compare a trajectory's questions with
each other (a trajectory answering all of them right, or all wrong, learns nothing); with 0
the baseline is the batch mean, which punishes right answers to hard tasks in a batch of easy
ones. SAO's baseline for text tasks is the per-task SPO tracker (`sao_jax.rl.trackers`); it
is used here the same way, per question: see `make_memory_sao_update`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from sao_jax.batches import MemorySAOBatch
from sao_jax.config import RLConfig, SAOConfig
from sao_jax.learner import apply_sao_gradients, sao_row_weights
from sao_jax.rl import losses as loss_lib
from sao_jax.rl import trackers
from sao_jax.rl.losses import masked_mean
from sao_jax.state import TrainState


def make_memory_sao_update(policy, tx, rl: RLConfig, sao: SAOConfig):
  """update(state, batch: MemorySAOBatch) -> (state, metrics) of `policy` (a
  `compression.policy.MemoryPolicy`, whose `sao_update` this is), `state.tracker` a BetaTracker.

  A row is one step of a trajectory b; a graded row (a question) has the step's reward r in
  {0, 1}; ungraded rows carry no reward signal and get no policy loss.
  1. Baseline: v_b, the tracker value of b's task read before this batch folds in. The
     tracker is fed each trajectory's accuracy_b (its mean reward over graded steps, in [0, 1]),
     so v_b estimates the chance of answering one of the task's questions right, the same
     quantity as r. A = (r - v_b) / max(std, sao.adv_std_floor), the std over the batch's
     graded rows with each trajectory weighted once (`trackers.spo_advantage` with weights
     1/G_b; centred only with sao.adv_center).
  2. Decoupled PPO (`losses.decoupled_ppo_loss`, sao.is_cap, sao.is_level) with pi_prox the
     parameters of this forward pass (rl.ppo_epochs = 1: the trust-region ratio is 1), a token
     mean over the graded rows' tokens, each token weighted by its freshness relative to the
     batch mean; the step is scaled by that mean (`learner.sao_row_weights` over the graded
     rows, a trajectory's staleness on each of its tokens).
  3. + compression.recon_coef * the encoder's reconstruction loss + compression.predict_coef
     * the LSTM's prediction loss, as in `make_memory_update`.
  4. The tracker absorbs the accuracies with SPO's forgetting factor from the drift
     D_b = mean |log pi_behav - log pi_prox| over b's valid row tokens.
  """
  ccfg = policy.comp.cfg
  verify = sao.verify_drift > 0

  def update(state: TrainState, batch: MemorySAOBatch):
    m = batch.memory
    b, r = m.row_valid_br.shape
    graded_br = m.graded_br & m.row_valid_br
    used_brt = m.valid_brt & graded_br[..., None]
    # (`learner.sao_row_weights` over the rows flattened; a trajectory's staleness on each of
    # its tokens)
    flat = sao_row_weights(
      jnp.repeat(jnp.arange(b), r),
      graded_br.reshape(-1),
      used_brt.reshape(b * r, -1),
      jnp.broadcast_to(batch.staleness_b[:, None, None], used_brt.shape).reshape(b * r, -1),
      sao,
    )
    w = {
      "graded_br": graded_br,
      "used_brt": used_brt,
      "share_br": flat["share_b"].reshape(b, r),
      "fresh_brt": flat["fresh_bt"].reshape(used_brt.shape),
      "step_scale": flat["step_scale"],
      "weight_brt": flat["weight_bt"].reshape(used_brt.shape),
    }
    traj_valid_b = jnp.any(m.row_valid_br, -1)
    n_traj = jnp.maximum(jnp.sum(traj_valid_b), 1)
    per_traj = lambda x_b: jnp.sum(jnp.where(traj_valid_b, x_b, 0.0)) / n_traj  # noqa: E731
    mask_brt = m.valid_brt & m.row_valid_br[..., None]
    reward_br = jnp.take_along_axis(m.rewards_bs, m.row_step_br, axis=1)
    values_b = trackers.tracker_value(state.tracker, batch.task_b)
    rows = lambda x: x.reshape((b * r,) + x.shape[2:])  # noqa: E731
    traj_r = jnp.repeat(jnp.arange(b), r)

    def drift(behav_brt, prox_brt):
      d = trackers.trajectory_drift(rows(behav_brt), rows(prox_brt), rows(mask_brt), traj_r)
      return d.reshape(b, r)[:, 0]

    def loss_fn(params):
      logp, ent, aux = policy.row_logprobs(params, m, stored=True, temperature=rl.temperature)
      prox = jax.lax.stop_gradient(logp)
      # Verified rollouts (sao.verify_drift), as in the text policy's update: a trajectory
      # whose claimed log-probs drift further from pi_prox takes no part (weights, advantage
      # statistics, tracker), and its claimed log-probs never enter the arithmetic.
      ok_b = drift(m.logp_brt, prox) <= sao.verify_drift if verify else jnp.ones_like(traj_valid_b)
      ok_brt = mask_brt & ok_b[:, None, None]
      behav = jnp.where(ok_brt, m.logp_brt, prox) if verify else m.logp_brt
      used_brt = w["used_brt"] & ok_b[:, None, None]
      adv_br = trackers.spo_advantage(
        reward_br.reshape(-1),
        jnp.broadcast_to(values_b[:, None], (b, r)).reshape(-1),
        jnp.where(ok_b[:, None], w["share_br"], 0.0).reshape(-1),
        sao.adv_std_floor,
        sao.adv_center,
      ).reshape(b, r)
      tok_loss, ppo = jax.vmap(
        lambda lp, px, bh, a, mk: loss_lib.decoupled_ppo_loss(
          lp, px, bh, a, mk, rl.clip_eps, sao.is_cap, sao.is_level
        )
      )(rows(logp), rows(prox), rows(behav), rows(adv_br), rows(used_brt))
      pol = masked_mean(tok_loss * rows(w["weight_brt"]), rows(used_brt))
      loss = pol + ccfg.recon_coef * aux["recon"] + ccfg.predict_coef * aux["predict"]
      out = dict(aux, prox_brt=prox, entropy=masked_mean(ent, mask_brt), ppo=ppo, pol=pol)
      return loss, dict(out, ok_b=ok_b, behav_brt=behav, adv_br=adv_br, used_brt=used_brt)

    (loss, out), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    prox_brt = out.pop("prox_brt")
    ppo = out.pop("ppo")
    ok_b, behav_brt = out.pop("ok_b"), out.pop("behav_brt")
    adv_br, used_brt = out.pop("adv_br"), out.pop("used_brt")
    drift_b = drift(behav_brt, prox_brt)
    rho_b = trackers.forgetting_factor(
      drift_b, sao.tracker_d_half, sao.tracker_rho_min, sao.tracker_rho_max
    )
    log_ratio_brt = prox_brt - behav_brt
    used = rows(used_brt)
    metrics = {
      "loss": loss,
      "policy_loss": out.pop("pol"),
      **out,
      "reward": per_traj(batch.accuracy_b),
      "graded_reward": masked_mean(reward_br, w["graded_br"]),
      "adv_abs": jnp.sum(jnp.abs(adv_br) * w["share_br"]) / n_traj,
      "adv_neg_frac": jnp.sum((adv_br < 0) * w["share_br"]) / n_traj,
      "value_mean": per_traj(values_b),
      # Off-policy deviation of the sampled tokens (every valid row, graded or not):
      # |pi_prox / pi_behav - 1|, KL(behaviour || current) (k3), and the largest
      # |log pi_prox - log pi_behav| (0 up to rounding for trajectories of the learner's own
      # version: the memory each row saw is replayed exactly).
      "is_dev": masked_mean(jnp.abs(jnp.exp(log_ratio_brt) - 1), mask_brt),
      "kl_behaviour": masked_mean(loss_lib.kl_k3(behav_brt, prox_brt), mask_brt),
      "logp_dev_max": jnp.max(jnp.where(mask_brt, jnp.abs(log_ratio_brt), 0.0)),
      "drift": per_traj(drift_b),
      "drift_max": jnp.max(jnp.where(traj_valid_b & ok_b, drift_b, 0.0)),
      "tracker_rho": per_traj(rho_b),
      "is_truncated_frac": masked_mean(ppo["truncated_t"], used),
      "clip_frac": masked_mean(ppo["clipped_t"], used),
      "freshness_mean": masked_mean(w["fresh_brt"], w["used_brt"]),
      "step_scale": w["step_scale"],
      "tokens_used": jnp.sum(used_brt),
      "trajectories": jnp.sum(traj_valid_b),
      # (per trajectory: which the host charges to their samplers)
      "unverified_b": traj_valid_b & ~ok_b,
    }
    return apply_sao_gradients(
      state,
      tx,
      grads,
      metrics,
      batch,
      batch.accuracy_b,
      rho_b,
      traj_valid_b & ok_b,
      w["step_scale"],
    )

  return update
