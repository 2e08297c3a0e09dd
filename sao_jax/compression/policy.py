"""The policy with compressed memory, and its learner losses.

`MemoryPolicy` pairs the decoder-only `TransformerLM` (with `model.memory_slots =
visible * vectors_per_step` prefix slots) with a `Compressor`. Parameters are one pytree
{"policy", "encoder", "decoder", "temporal"}, trained together by one optimiser.

Sampler: `sample` conditions row t on `visible_memory(bank, t)` plus the raw window;
`compress` runs the three stages on the step just taken. Learner: `row_logprobs` rebuilds
every row's memory from the trajectory's final bank and graveyard of evicted entries
(`memory.Compressor.replay_memory`) and recomputes the log-probs of the sampled tokens. With
`stored=True` (RL on sampler data) it uses the shipped INT8 bank and graveyard, so every
row's memory is exactly what the sampler saw, eviction or not (encoder gradients flow
straight-through); with `stored=False` (supervised training on scripted episodes) both are
built in-graph by the same per-step logic.

Both update functions go through `sao_jax.learner.apply_gradients` (non-finite guard,
`lr_scale`) like every other update. Losses (`make_memory_update`): the policy term
(cross-entropy on scripted actions for "sft"; the decoupled PPO surrogate on graded steps
for "rl") + `recon_coef` * the encoder's
reconstruction loss + `predict_coef` * the LSTM's next-step prediction loss; with a learned
salience head, in the supervised phase, + `salience_coef` * the answer loss through the soft
keep mask + `salience_price` * the mean keep probability (`sao_jax.compression.salience`).

`make_full_context_sft_update` is the control: the same transformer without memory, trained
on whole episodes as one causal sequence (identical to conditioning each step on its full
context).
"""

from __future__ import annotations

import flax
import jax
import jax.numpy as jnp
import numpy as np

from sao_jax import sampling
from sao_jax.batches import MemoryBatch
from sao_jax.compression import quant, salience, temporal
from sao_jax.compression.encoder import reconstruction_loss
from sao_jax.compression.memory import (
  Bank,
  Compressor,
  Graveyard,
  Stream,
  bank_nbytes,
  graveyard,
  graveyard_nbytes,
)
from sao_jax.compression.rollout import (
  BANK_KEYS,
  FILLER_ROWS,
  ExpertEpisodes,
  LongTrajectory,
  expert_memory_batch,
  sample_long_horizon,
)
from sao_jax.compression.sao_update import make_memory_sao_update
from sao_jax.config import Config
from sao_jax.learner import apply_gradients
from sao_jax.models import KVCache, init_cache
from sao_jax.models.transformer import TransformerLM
from sao_jax.rl import advantages as adv_lib
from sao_jax.rl import losses as loss_lib
from sao_jax.rl import trackers
from sao_jax.state import TrainState


@flax.struct.dataclass
class MemoryCache:
  """The sampler's keys and values of each slot's bank entries (`update_memory_cache`)."""

  kv: KVCache  # per layer [B, C*m, heads, head_dim]; entry c at slots c*m .. c*m+m-1
  vec_bced: jax.Array  # float32 the entries they were computed from (0 where not held)
  ok_bc: jax.Array  # bool, entry c is held


class MemoryPolicy:
  def __init__(self, model: TransformerLM, comp: Compressor):
    cfg = comp.cfg
    if (
      model.cfg.memory_slots != cfg.visible * cfg.vectors_per_step
      or model.cfg.memory_dim != cfg.dim
    ):
      raise ValueError("model.memory_slots/memory_dim do not match the compression config")
    self.model, self.comp = model, comp

  def shares_bank(self, share: bool | None = None) -> bool:
    """Whether the learner computes the bank's keys and values once per trajectory: asked
    for (`share`), or by default wherever that is exact: no eviction (the bank is append-only,
    so a row reads the entries written before its step) and every entry visible (not a window
    of the last few, whose first entries differ from row to row)."""
    cfg = self.comp.cfg
    exact = not cfg.evict and cfg.visible >= cfg.capacity
    if share and not exact:
      raise ValueError(
        "a shared bank is exact only without eviction and with every entry visible "
        f"(compression.evict {cfg.evict}, visible {cfg.visible}, capacity {cfg.capacity})"
      )
    return exact if share is None else share

  def init(self, rng: jax.Array) -> dict:
    r1, r2 = jax.random.split(rng)
    w = self.comp.cfg.window
    tokens = jnp.zeros((1, w), jnp.int32)
    mask = jnp.tril(jnp.ones((w, w), bool))[None]
    memory = jnp.zeros((1, 0, self.comp.cfg.dim))
    policy = self.model.init(r1, tokens, tokens, mask, memory)["params"]
    return {"policy": policy, **self.comp.init(r2)}

  @property
  def learner_model(self) -> MemoryPolicy:
    """Its updates need the compressor as well as the transformer: the policy itself."""
    return self

  def trainable(self, tx):
    """Every parameter trains, the compressor's with the transformer's."""
    return tx

  def sft_update(self, tx, cfg: Config):
    """`make_memory_update` of mode "sft"."""
    return make_memory_update(self, tx, mode="sft", temperature=cfg.rl.temperature)

  def grpo_update(self, tx, cfg: Config):
    """`make_memory_update` of mode "rl", advantages within each task's group."""
    rl = cfg.rl
    return make_memory_update(
      self,
      tx,
      mode="rl",
      temperature=rl.temperature,
      clip_eps=rl.clip_eps,
      is_cap=cfg.sao.is_cap,
      group_size=rl.group_size,
      advantage=rl.advantage,
    )

  def sft_batches(self, s, batch_size: int):
    """Expert episodes of random training tasks (`compression.rollout.ExpertEpisodes`), their
    graded steps and FILLER_ROWS ungraded ones as rows (R sized from the first episodes)."""
    experts = ExpertEpisodes(s)
    rows = min(s.max_steps, experts.max_graded() + FILLER_ROWS)

    def next_batch(rng):
      picked = [experts.get(int(i)) for i in rng.integers(0, len(s.train), batch_size)]
      batch = expert_memory_batch(
        [p[0] for p in picked],
        [p[1] for p in picked],
        steps=s.max_steps,
        rows=rows,
        seed=int(rng.integers(2**31)),
      )
      return batch, int(batch.valid_brt.sum())

    return next_batch

  def sao_update(self, tx, cfg: Config):
    """`compression.sao_update.make_memory_sao_update`."""
    return make_memory_sao_update(self, tx, cfg.rl, cfg.sao)

  def param_shapes(self):
    """The params as logically annotated (boxed) shapes and dtypes: nothing computed."""
    return jax.eval_shape(self.init, jax.random.key(0))

  def init_state_fn(self, tx, *, with_ref: bool = False, num_tasks: int = 0):
    """rng -> TrainState of these params (the policy's logically annotated) and `tx`, with
    SAO's task tracker over `num_tasks` tasks when > 0. No reference policy: no update of
    this policy has a KL term (`sao_jax.setup` refuses rl.kl_coef > 0)."""
    if with_ref:
      raise ValueError("the policy with compressed memory keeps no reference policy")

    def init(rng):
      init_rng, state_rng = jax.random.split(rng)
      params = self.init(init_rng)
      return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=tx.init(params),
        rng=state_rng,
        tracker=trackers.init_beta_tracker(num_tasks) if num_tasks else None,
        lr_scale=jnp.ones((), jnp.float32),
        nonfinite=jnp.zeros((), jnp.int32),
      )

    return init

  def empty_streams(self, n: int) -> Stream:
    return jax.tree.map(lambda x: jnp.broadcast_to(x, (n,) + x.shape), self.comp.empty_stream())

  # Sampler -------------------------------------------------------------------------------
  sample_inputs = 3  # streams, prompt_bp, prompt_valid_bp

  def play(
    self,
    s,
    progs,
    params,
    tasks,
    indices,
    *,
    slots,
    rng,
    greedy=False,
    version=0,
    lineage=-1,
  ) -> list[LongTrajectory]:
    """Whole episodes, every slot compressing its own in-graph after each step
    (`compression.rollout.sample_long_horizon`); the caller ships them under `version`."""
    c = s.cfg.compression
    return sample_long_horizon(
      progs.greedy if greedy else progs.sample,
      progs.compress,
      progs.empty_streams(slots),
      params,
      [s.family.make_env(s.tok) for _ in tasks],
      tasks,
      s.tok,
      slots=slots,
      window=c.window,
      step_len=c.step_len,
      rng=rng,
    )

  def episode_metrics(self, s, episodes: list[LongTrajectory]) -> dict[str, float]:
    """What the compression benchmark reports of greedy episodes:

    retention: fraction of graded steps answered right (over all questions; on retention
    dialogues whose questions come n+ turns after their fact, the retention at n turns), with
    its binomial standard error `retention_stderr` over `questions`;
    kept_steps_mean: bank entries per episode; episodes_with_evictions;
    bytes_*: mean bytes per episode of its context, uncompressed (float32 token embeddings at
    the model width) and after each stage: stage 1 (every step's vectors, float32), stage 2
    (kept steps only), stage 3 (the bank as shipped: INT8 vectors, scales, step index), and
    bytes_graveyard: the evicted entries shipped next to the bank for exact replay."""
    c, trajs = s.cfg.compression, episodes
    graded = np.concatenate([t.rewards[t.graded] for t in trajs])
    retention = float(graded.mean()) if len(graded) else 0.0
    kept = np.asarray([t.bank["entries"] for t in trajs], np.float64)
    steps = np.asarray([len(t.rewards) for t in trajs], np.float64)
    per_entry = c.vectors_per_step * c.dim
    stage3 = [bank_nbytes(Bank(**{k: t.bank[k] for k in BANK_KEYS})) for t in trajs]
    gone = [graveyard_nbytes(t.bank["gone_vec_ged"]) for t in trajs]
    return {
      "retention": retention,
      "questions": len(graded),
      "retention_stderr": float(np.sqrt(retention * (1 - retention) / max(len(graded), 1))),
      "kept_steps_mean": float(kept.mean()),
      "episodes_with_evictions": int(sum(t.bank["evicted"] > 0 for t in trajs)),
      "bytes_full_context": float(np.mean([t.tokens_total for t in trajs]) * s.cfg.model.width * 4),
      "bytes_stage1": float(steps.mean() * per_entry * 4),
      "bytes_stage2": float(kept.mean() * per_entry * 4),
      "bytes_stage3": float(np.mean(stage3)),
      "bytes_graveyard": float(np.mean(gone)),
    }

  def sample(self, params, streams: Stream, prompt_bp, prompt_valid_bp, rng, **kw):
    mem, mvalid, _ = jax.vmap(self.comp.visible_memory)(streams.bank, streams.step)
    return sampling.sample(
      self.model,
      params["policy"],
      prompt_bp,
      prompt_valid_bp,
      rng,
      memory_bmd=mem,
      memory_valid_bm=mvalid,
      **kw,
    )

  def compress(
    self, params, streams: Stream, seg_bl, segv_bl, reward_b, boundary_b, last_b, active_b
  ) -> Stream:
    """All three stages on the step each active slot just took (inactive slots unchanged)."""
    new = jax.vmap(self.comp.stream_step, in_axes=(None, 0, 0, 0, 0, 0, 0))(
      params, streams, seg_bl, segv_bl, reward_b, boundary_b, last_b
    )
    return jax.tree.map(
      lambda a, b: jnp.where(active_b.reshape(active_b.shape + (1,) * (a.ndim - 1)), a, b),
      new,
      streams,
    )

  def empty_memory_cache(self, n: int) -> MemoryCache:
    """The memory cache of n slots, holding nothing (`update_memory_cache`)."""
    cfg, mcfg = self.comp.cfg, self.model.cfg
    c, m = cfg.capacity, cfg.vectors_per_step
    return MemoryCache(
      kv=init_cache(mcfg, n, c * m, jnp.dtype(mcfg.dtype)),
      vec_bced=jnp.zeros((n, c, m, cfg.dim), jnp.float32),
      ok_bc=jnp.zeros((n, c), bool),
    )

  def update_memory_cache(self, params, streams: Stream, mc: MemoryCache) -> MemoryCache:
    """The keys and values of every slot's memory at its current step, from those `mc`
    already holds: the sampler-side counterpart of the learner's shared bank
    (`shares_bank`: no eviction, every entry visible). The bank is then append-only and a
    slot's memory is its entries with step < its step, in slot order; a memory slot attends
    to the slots before it and carries no position, so an entry's keys and values do not
    change once written and only entries new since the last call go through the model (one
    step's worth a call in a sampling loop), instead of the whole memory every step.

    Entries the cache holds are checked against the bank (values and order): a slot whose
    bank no longer starts with them (a new episode in that slot, or a cache from another
    run) is recomputed from the first difference. So the result is the same whatever `mc`
    holds, including `empty_memory_cache`; it is only cheaper when `mc` is this stream's."""
    if not self.shares_bank():
      raise ValueError(
        "a memory cache needs an append-only, all-visible bank (shares_bank): "
        f"compression.evict {self.comp.cfg.evict}, visible {self.comp.cfg.visible}, "
        f"capacity {self.comp.cfg.capacity}"
      )
    cfg = self.comp.cfg
    c, m = cfg.capacity, cfg.vectors_per_step
    bank = streams.bank
    vec_bced = jax.vmap(self.comp.entry_vectors)(bank)
    ok_bc = (bank.step_c >= 0) & (bank.step_c < streams.step[:, None])
    vec_bced = jnp.where(ok_bc[..., None, None], vec_bced, 0.0)
    n_b = jnp.sum(ok_bc, -1).astype(jnp.int32)
    same_bc = mc.ok_bc & ok_bc & jnp.all(mc.vec_bced == vec_bced, axis=(-1, -2))
    have_b = jnp.sum(jnp.cumprod(same_bc, axis=-1), -1).astype(jnp.int32)
    slots = jnp.arange(c * m)

    def more(carry):
      _, have_b = carry
      return jnp.any(have_b < n_b)

    def add_one(carry):  # entry have_b of every slot that lacks some (others unchanged)
      kv, have_b = carry
      add_b = have_b < n_b
      idx_b = jnp.minimum(have_b, c - 1)
      new_bmd = jnp.take_along_axis(vec_bced, idx_b[:, None, None, None], axis=1)[:, 0]
      query_bq = idx_b[:, None] * m + jnp.arange(m)
      mask = (slots[None, None, :] < (idx_b[:, None, None] + 1) * m) & (
        slots[None, None, :] <= query_bq[..., None]
      )
      none = jnp.zeros((n_b.shape[0], 0), jnp.int32)
      _, new_kv = self.model.apply(
        {"params": params["policy"]},
        none,
        none,
        mask,
        memory_bmd=new_bmd,
        cache=kv,
        index=idx_b * m,
      )
      keep = lambda new, old: jnp.where(add_b[:, None, None, None], new, old)  # noqa: E731
      return jax.tree.map(keep, new_kv, kv), have_b + add_b

    kv, have_b = jax.lax.while_loop(more, add_one, (mc.kv, have_b))
    held_bc = jnp.arange(c)[None] < have_b[:, None]
    return MemoryCache(
      kv=kv, vec_bced=jnp.where(held_bc[..., None, None], vec_bced, 0.0), ok_bc=held_bc
    )

  def sample_cached(
    self, params, streams: Stream, mc: MemoryCache, prompt_bp, prompt_valid_bp, rng, **kw
  ):
    """`sample` with the memory's keys and values from the cache, brought up to date first:
    (SampleOutput, the updated cache). The same tokens and log-probs as `sample` up to float
    rounding (the memory's sums in another order), at a fraction of the cost when the memory
    is long (tests/test_compression_memory.py)."""
    mc = self.update_memory_cache(params, streams, mc)
    out = sampling.sample(
      self.model,
      params["policy"],
      prompt_bp,
      prompt_valid_bp,
      rng,
      memory_valid_bm=jnp.repeat(mc.ok_bc, self.comp.cfg.vectors_per_step, axis=1),
      memory_cache=mc.kv,
      **kw,
    )
    return out, mc

  # Learner -------------------------------------------------------------------------------
  def row_logprobs(
    self,
    params,
    batch: MemoryBatch,
    *,
    stored: bool,
    temperature: float = 1.0,
    with_salience: bool = False,
    share: bool | None = None,
  ):
    """Log-probs [B, R, T] (and entropy, and the compressor's losses) of the batch's rows
    under the memory they saw.

    With `stored` the memory values are the shipped bank's and graveyard's (`batch.bank_*`,
    `batch.gone_*`); without, both are built in-graph by the same per-step logic from the
    batch's segments. `with_salience` (a learned salience head only) adds the head's loss
    terms to aux (`salience_loss`).

    `share` (default: where exact, `shares_bank`) computes the memory's keys and values once
    per trajectory rather than once per row (`sampling.shared_memory_logprobs`): the same
    log-probs up to float rounding, for a fraction of the cost when the bank is large; False
    builds each row's memory as `replay_memory` does (the reference the tests compare with).
    The salience pass always shares (every row reads every earlier step).
    """
    comp = self.comp
    b, s = batch.step_valid_bs.shape
    r = batch.row_step_br.shape[1]
    seg = batch.seg_bsl.reshape(b * s, -1)
    v_bsed = comp.encode(params, seg, batch.seg_valid_bsl.reshape(b * s, -1))
    v_bsed = v_bsed.reshape((b, s) + v_bsed.shape[1:])
    final, info = jax.vmap(comp.scan_trajectory, in_axes=(None, 0, 0, 0, 0))(
      params, v_bsed, batch.rewards_bs, batch.boundary_bs, batch.step_valid_bs
    )
    bank, grave = final.bank, graveyard(info)
    if stored:
      bank = bank.replace(
        vec_ced=batch.bank_vec_bced,
        scale_ce=batch.bank_scale_bce,
        step_c=batch.bank_step_bc,
        turning_c=batch.bank_turning_bc,
        count=batch.bank_count_b,
      )
      grave = Graveyard(
        vec_sed=batch.gone_vec_bsed, scale_se=batch.gone_scale_bse, step_s=batch.gone_step_bs
      )

    def row_memory(log, v_sed, t):
      vec, ok, step_v = comp.replay_memory(log, t)
      fresh = v_sed[step_v].reshape(vec.shape)
      return quant.straight_through(vec, jnp.where(ok[:, None], fresh, 0.0)), ok

    def rows_memory(bank_one, grave_one, v_sed, t_r):
      log = comp.replay_log(bank_one, grave_one)
      return jax.vmap(lambda t: row_memory(log, v_sed, t))(t_r)

    def bank_memory(bank_one, v_sed, t_r):
      # The whole bank (append-only: entries in step order) and, per row, the entries
      # written before its step: what `replay_memory` gives a row when nothing is evicted
      # and every entry is visible, as one memory per trajectory.
      step_c = bank_one.step_c
      ok_c = step_c >= 0
      if comp.cfg.quantize:
        vec_ced = quant.dequantize(bank_one.vec_ced, bank_one.scale_ce)
      else:
        vec_ced = bank_one.vec_ced.astype(jnp.float32)
      fresh = jnp.where(ok_c[:, None, None], v_sed[jnp.maximum(step_c, 0)], 0.0)
      vec_ced = quant.straight_through(jnp.where(ok_c[:, None, None], vec_ced, 0.0), fresh)
      m = comp.cfg.vectors_per_step
      row_ok_rc = ok_c[None] & (step_c[None] < t_r[:, None])
      return (
        vec_ced.reshape(-1, vec_ced.shape[-1]),
        jnp.repeat(ok_c, m),
        jnp.repeat(row_ok_rc, m, axis=-1),
      )

    flat = lambda x: x.reshape((b * r,) + x.shape[2:])  # noqa: E731
    if self.shares_bank(share):
      mem, mvalid, row_ok = jax.vmap(bank_memory)(bank, v_bsed, batch.row_step_br)
      logp, ent, _ = sampling.shared_memory_logprobs(
        self.model,
        params["policy"],
        batch.prompt_brp,
        batch.prompt_valid_brp,
        batch.tokens_brt,
        batch.valid_brt,
        memory_bmd=mem,
        memory_valid_bm=mvalid,
        row_memory_valid_brm=row_ok,
        temperature=temperature,
        with_entropy=True,
      )
    else:
      mem, mvalid = jax.vmap(rows_memory)(bank, grave, v_bsed, batch.row_step_br)
      logp, ent, _ = sampling.completion_logprobs(
        self.model,
        params["policy"],
        flat(batch.prompt_brp),
        flat(batch.prompt_valid_brp),
        flat(batch.tokens_brt),
        flat(batch.valid_brt),
        temperature=temperature,
        memory_bmd=flat(mem),
        memory_valid_bm=flat(mvalid),
        with_entropy=True,
      )
    logits = comp.decoder.apply(
      {"params": params["decoder"]}, v_bsed.reshape((b * s,) + v_bsed.shape[2:])
    )
    sv = batch.step_valid_bs
    recon = reconstruction_loss(
      logits, seg, batch.seg_valid_bsl.reshape(b * s, -1), sv.reshape(-1).astype(jnp.float32)
    )
    # The prediction made after step s-1 is scored against step s (step 0 has none).
    pred_w = (sv & (jnp.arange(s)[None] > 0)).astype(jnp.float32)
    predict = temporal.prediction_loss(info["pred_d"], v_bsed.reshape(b, s, -1), pred_w)
    kept = info["keep"] & sv
    extra = {}
    if with_salience:
      extra = self.salience_loss(params, batch, v_bsed, temperature, share=share is not False)
    aux = {
      **extra,
      "recon": recon,
      "predict": predict,
      "kept_frac": jnp.sum(kept) / jnp.maximum(jnp.sum(sv), 1),
      "surprise": jnp.sum(info["surprise"] * pred_w) / jnp.maximum(jnp.sum(pred_w), 1),
    }
    shape = (b, r, -1)
    return logp.reshape(shape), ent.reshape(shape), aux

  def salience_loss(
    self, params, batch: MemoryBatch, v_bsed, temperature: float, share: bool = True
  ) -> dict:
    """The salience head's training terms (`sao_jax.compression.salience`): the weighted
    answer NLL of the first `salience_rows` rows of each trajectory (graded rows come first)
    when each reads every earlier step through the soft keep mask, with the policy and the
    encoder held fixed; and the mean keep probability (its price). Every row reads a prefix
    of its trajectory's steps, so with `share` the steps' keys and values are computed once
    per trajectory (`sampling.shared_memory_logprobs`); without, once per row."""
    comp = self.comp
    b, s = batch.step_valid_bs.shape
    k = min(comp.cfg.salience_rows, batch.row_step_br.shape[1])
    v_bsed = jax.lax.stop_gradient(v_bsed)
    p_bs = comp.salience_prob(params, v_bsed.reshape(b, s, -1))
    rows = lambda x: x[:, :k].reshape((b * k,) + x.shape[2:])  # noqa: E731
    policy = jax.lax.stop_gradient(params["policy"])
    if share:
      m = v_bsed.shape[2]
      sv = batch.step_valid_bs
      row_ok = sv[:, None, :] & (jnp.arange(s)[None, None, :] < batch.row_step_br[:, :k, None])
      bias = jnp.where(sv, jnp.log(p_bs + salience.LOG_EPS), 0.0)
      logp, _, _ = sampling.shared_memory_logprobs(
        self.model,
        policy,
        batch.prompt_brp[:, :k],
        batch.prompt_valid_brp[:, :k],
        batch.tokens_brt[:, :k],
        batch.valid_brt[:, :k],
        memory_bmd=v_bsed.reshape(b, s * m, -1),
        memory_valid_bm=jnp.repeat(sv, m, axis=1),
        row_memory_valid_brm=jnp.repeat(row_ok, m, axis=-1),
        memory_bias_bm=jnp.repeat(bias, m, axis=1),
        temperature=temperature,
      )
    else:
      mem, ok, bias = jax.vmap(
        lambda v, p, sv, t_k: jax.vmap(lambda t: salience.soft_memory(v, p, sv, t))(t_k)
      )(v_bsed, p_bs, batch.step_valid_bs, batch.row_step_br[:, :k])
      flat = lambda x: x.reshape((b * k,) + x.shape[2:])  # noqa: E731
      logp, _, _ = sampling.completion_logprobs(
        self.model,
        policy,
        rows(batch.prompt_brp),
        rows(batch.prompt_valid_brp),
        rows(batch.tokens_brt),
        rows(batch.valid_brt),
        temperature=temperature,
        memory_bmd=flat(mem),
        memory_valid_bm=flat(ok),
        memory_bias_bm=flat(bias),
      )
    mask = rows(batch.valid_brt) & rows(batch.row_valid_br)[:, None]
    w = rows(batch.row_weight_br * batch.row_valid_br)
    nll = -jnp.sum(jnp.where(mask, logp, 0.0), -1) / jnp.maximum(jnp.sum(mask, -1), 1)
    return {
      "salience_nll": jnp.sum(nll * w) / jnp.maximum(jnp.sum(w), 1e-6),
      "salience_keep": salience.price(p_bs, batch.step_valid_bs),
    }


def make_memory_update(
  policy: MemoryPolicy,
  tx,
  *,
  mode: str,
  temperature: float = 1.0,
  clip_eps: float = 0.2,
  is_cap: float = 2.0,
  group_size: int = 0,
  advantage: str = "group_norm",
  share: bool | None = None,
):
  """update(state, batch: MemoryBatch) -> (state, metrics) for the memory policy.

  mode "sft": loss = mean over rows of the row's token cross-entropy weighted by
  row_weight_br (graded steps weigh more than filler steps: they carry the task).
  mode "rl": the batch carries behaviour log-probs and the shipped bank; the advantage of a
  graded row is the registered group estimator `advantage` (`rl.advantages.grouped`) over the
  graded rows of `group_size` consecutive trajectories (one task each; 0: the whole batch);
  ungraded rows carry no reward signal and get zero advantage and weight;
  loss: the decoupled PPO surrogate (`rl.losses.decoupled_ppo_loss`), a token mean over the
  graded rows.
  `share`: `MemoryPolicy.row_logprobs`'s (None: the memory computed once per trajectory
  wherever that is exact; False: once per row, the reference).
  """
  if mode not in ("sft", "rl"):
    raise ValueError(f"mode {mode!r} unknown; known: rl, sft")
  ccfg = policy.comp.cfg
  # The salience head learns from supervised answers (sao_jax.compression.salience).
  learn_salience = mode == "sft" and policy.comp.salience is not None

  def update(state: TrainState, batch: MemoryBatch):
    sv = batch.row_valid_br
    mask = batch.valid_brt & sv[..., None]

    def loss_fn(params):
      logp, ent, aux = policy.row_logprobs(
        params,
        batch,
        stored=mode == "rl",
        temperature=temperature,
        with_salience=learn_salience,
        share=share,
      )
      n_tok = jnp.maximum(jnp.sum(mask, -1), 1)
      extra = {}
      if mode == "sft":
        w = batch.row_weight_br * sv
        row_nll = -jnp.sum(jnp.where(mask, logp, 0.0), -1) / n_tok
        pol = jnp.sum(row_nll * w) / jnp.maximum(jnp.sum(w), 1e-6)
      else:
        g = batch.graded_br & sv
        r = jnp.take_along_axis(batch.rewards_bs, batch.row_step_br, axis=1)  # per row
        k = (group_size or r.shape[0]) * r.shape[1]  # a group: its trajectories' rows
        adv = adv_lib.grouped(advantage, r.reshape(-1), k, g.reshape(-1)).reshape(r.shape)
        rows = lambda x: x.reshape((-1,) + x.shape[2:])  # noqa: E731
        tok_loss, _ = jax.vmap(
          lambda lp, bh, a, m: loss_lib.decoupled_ppo_loss(
            lp, jax.lax.stop_gradient(lp), bh, a, m, clip_eps, is_cap
          )
        )(rows(logp), rows(batch.logp_brt), rows(adv), rows(mask & g[..., None]))
        pol = jnp.sum(tok_loss) / jnp.maximum(jnp.sum(mask & g[..., None]), 1)
        extra = {
          "reward": jnp.sum(r * g) / jnp.maximum(jnp.sum(g), 1),
          "adv_abs": jnp.sum(jnp.abs(adv)) / jnp.maximum(jnp.sum(g), 1),
        }
      loss = pol + ccfg.recon_coef * aux["recon"] + ccfg.predict_coef * aux["predict"]
      if learn_salience:
        loss = loss + ccfg.salience_coef * aux["salience_nll"]
        loss = loss + ccfg.salience_price * aux["salience_keep"]
      ent_mean = jnp.sum(jnp.where(mask, ent, 0.0)) / jnp.maximum(jnp.sum(mask), 1)
      return loss, dict(aux, loss=loss, policy_loss=pol, entropy=ent_mean, **extra)

    grads, metrics = jax.grad(loss_fn, has_aux=True)(state.params)
    return apply_gradients(state, tx, grads, metrics)

  return update


def make_full_context_sft_update(model: TransformerLM, tx):
  """Control: whole episodes [B, L] as one causal sequence; loss on action tokens weighted by
  `loss_weight` [B, L] (the weight of the token predicted at each position's next slot)."""

  def update(state: TrainState, batch: dict):
    def loss_fn(params):
      logits = sampling.sequence_logits(model, params, batch["tokens"], batch["valid"])
      logp = jax.nn.log_softmax(logits[:, :-1], -1)
      nll = -jnp.take_along_axis(logp, batch["tokens"][:, 1:, None], -1)[..., 0]
      w = batch["loss_weight"][:, 1:]
      loss = jnp.sum(nll * w) / jnp.maximum(jnp.sum(w), 1e-6)
      return loss, {"loss": loss, "policy_loss": loss}

    grads, metrics = jax.grad(loss_fn, has_aux=True)(state.params)
    return apply_gradients(state, tx, grads, metrics)

  return update
