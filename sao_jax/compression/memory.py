"""The three stages composed: a trajectory's compressed memory and what the policy sees of it.

Online (sampler), after each environment step, `stream_step` runs all three stages on that
step: encode it (stage 1), score it against the LSTM's prediction and decide to keep it
(stage 2), quantise it to INT8 and append it to the trajectory's `Bank` (stage 3). At step t
the policy sees `visible_memory(bank_t, t)`, bank_t being the bank after steps 0..t-1: its
last `visible` entries (all have step < t), i.e. a bounded number of vectors, plus its raw
window of recent tokens.

Without eviction the bank is append-only (entries in step order), so the final bank alone
gives every row's memory: bank_t is the final bank's entries with step < t. What travels to
the learner is the compressed bank, once per trajectory, not a copy per step. The learner
conditions on the stored (dequantised) values bit for bit and routes gradients to the
encoder through its fresh output for the same steps (`quant.straight_through`).

Eviction (`cfg.evict`, see `filter_and_store`) removes entries, so the final bank lacks
entries that earlier rows saw. For exact replay an evicted entry is not lost but moved to the
trajectory's *graveyard*, tagged with the step k that evicted it, and ships with the bank.
Every entry e ever written (step e.step) is then either in the final bank or in the
graveyard, and lies in bank_t exactly when e.step < t <= k (written while processing step
e.step, removed while processing step k; a final-bank entry has k = infinity). bank_t keeps
its entries in step order (eviction shifts later entries down) and each step writes at most
one entry, so bank_t, in order, is the union of bank and graveyard filtered by that interval
and sorted by step, and its last `visible` entries are those of `visible_memory` at t, in the
same order and bit for bit (`replay_log`, `replay_memory`). The graveyard holds one entry
per eviction, each the size of a bank entry plus its eviction step (`graveyard_nbytes`):
the bank's bytes are bounded by its capacity, the graveyard's by the trajectory's evictions.
Why this and not the alternatives: replaying the bank's step-by-step updates in the learner
would need the sampler's keep/evict decisions (its parameters have moved on) and still the
evicted vectors (the learner cannot recompute the INT8 values the sampler stored), so it
ships the same vectors plus more; shipping bank_t per row costs `visible` entries a row.

On the sampler the graveyard costs no device memory beyond one entry per slot: the stream
holds the entry its latest step evicted (`Stream.gone_*`), and the host sampling loop moves
it into the trajectory's graveyard (`sao_jax.compression.rollout`). In-graph (`scan_trajectory`,
supervised training) the graveyard is the scan's per-step `gone_*` output.

`scan_trajectory` is the same per-step logic as a `lax.scan` over a whole trajectory (used for
supervised training on scripted episodes, and to measure bytes per stage).
"""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp

from sao_jax.compression import quant, temporal
from sao_jax.compression.encoder import StepDecoder, StepEncoder
from sao_jax.compression.salience import SalienceHead
from sao_jax.config import CompressionConfig


@flax.struct.dataclass
class Bank:
  """Kept steps of one trajectory (leading axes may add a batch)."""

  vec_ced: jax.Array  # int8 when quantised, else float32
  scale_ce: jax.Array  # float32 per-vector scale (1 when not quantised)
  step_c: jax.Array  # int32 step index of each entry, -1 where empty
  turning_c: jax.Array  # bool, entry was a turning point
  count: jax.Array  # int32 entries written


@flax.struct.dataclass
class Stream:
  """Online compressor state of one trajectory."""

  bank: Bank
  carry: Any  # LSTM (c, h), each [hidden]
  pred_d: jax.Array  # LSTM prediction of the next step's flattened vectors
  prev_reward: jax.Array
  budget_used: jax.Array
  step: jax.Array
  dropped_full: jax.Array  # steps that should have been kept but the bank was full
  # Sampler-side bookkeeping for eviction (not shipped): each entry's priority (its surprise,
  # or its learned salience;
  # +inf for structural turning points, which are never evicted), and evictions so far.
  prio_c: jax.Array
  evicted: jax.Array
  # The entry the latest step evicted (gone_step -1 if none), for the host to move into the
  # trajectory's graveyard: its vectors, scales and step.
  gone_vec_ed: jax.Array
  gone_scale_e: jax.Array
  gone_step: jax.Array


@flax.struct.dataclass
class Graveyard:
  """Entries evicted from one trajectory's bank, indexed by the step s that evicted them (at
  most one per step; leading axes may add a batch)."""

  vec_sed: jax.Array  # like Bank.vec_ced
  scale_se: jax.Array
  step_s: jax.Array  # int32 step of the entry evicted at step s, -1 where none


@flax.struct.dataclass
class Log:
  """Every entry one trajectory's bank ever held, sorted by step (`Compressor.replay_log`):
  entry u was in the bank the policy read at step t iff step_u < t < until_u."""

  vec_ued: jax.Array
  scale_ue: jax.Array
  step_u: jax.Array  # -1 where empty (never visible)
  until_u: jax.Array  # the step that evicted the entry + 1; int32 max for the final bank


class Compressor:
  """Holds the stage modules; all methods are pure functions of (params, arrays)."""

  def __init__(self, cfg: CompressionConfig, vocab_size: int):
    self.cfg = cfg
    self.encoder = StepEncoder(cfg, vocab_size)
    self.decoder = StepDecoder(cfg, vocab_size)
    self.flat = cfg.vectors_per_step * cfg.dim
    self.temporal = temporal.TemporalPredictor(cfg.lstm_hidden, self.flat)
    self.salience = SalienceHead(cfg.salience_hidden) if cfg.salience == "learned" else None

  def init(self, rng: jax.Array) -> dict:
    r1, r2, r3, r4 = jax.random.split(rng, 4)
    seg = jnp.zeros((1, self.cfg.step_len), jnp.int32)
    vec = jnp.zeros((1, self.cfg.vectors_per_step, self.cfg.dim))
    extra = {}
    if self.salience is not None:
      extra["salience"] = self.salience.init(r4, vec.reshape(1, -1))["params"]
    return {
      **extra,
      "encoder": self.encoder.init(r1, seg, seg > -1)["params"],
      "decoder": self.decoder.init(r2, vec)["params"],
      "temporal": self.temporal.init(r3, self.temporal.initial_carry(1), vec.reshape(1, -1))[
        "params"
      ],
    }

  # Stage 1 ------------------------------------------------------------------------------
  def encode(self, params, seg_nl, segv_nl) -> jax.Array:
    """[N, L] step tokens -> [N, m, dim] vectors."""
    return self.encoder.apply({"params": params["encoder"]}, seg_nl, segv_nl)

  def salience_prob(self, params, v_d) -> jax.Array:
    """Learned keep probability of step vectors [..., m*dim] (the encoder held fixed); zeros
    without a salience head."""
    if self.salience is None:
      return jnp.zeros(v_d.shape[:-1])
    logit = self.salience.apply({"params": params["salience"]}, jax.lax.stop_gradient(v_d))
    return jax.nn.sigmoid(logit)

  # Stages 2 and 3, one step ----------------------------------------------------------------
  def empty_stream(self) -> Stream:
    c, m, d = self.cfg.capacity, self.cfg.vectors_per_step, self.cfg.dim
    dtype = jnp.int8 if self.cfg.quantize else jnp.float32
    bank = Bank(
      vec_ced=jnp.zeros((c, m, d), dtype),
      scale_ce=jnp.zeros((c, m), jnp.float32),
      step_c=jnp.full((c,), -1, jnp.int32),
      turning_c=jnp.zeros((c,), bool),
      count=jnp.zeros((), jnp.int32),
    )
    carry = jax.tree.map(lambda x: x[0], self.temporal.initial_carry(1))
    return Stream(
      bank=bank,
      carry=carry,
      pred_d=jnp.zeros((self.flat,)),
      prev_reward=jnp.zeros(()),
      budget_used=jnp.zeros((), jnp.int32),
      step=jnp.zeros((), jnp.int32),
      dropped_full=jnp.zeros((), jnp.int32),
      prio_c=jnp.full((c,), jnp.inf, jnp.float32),
      evicted=jnp.zeros((), jnp.int32),
      gone_vec_ed=jnp.zeros((m, d), dtype),
      gone_scale_e=jnp.zeros((m,), jnp.float32),
      gone_step=jnp.full((), -1, jnp.int32),
    )

  def filter_and_store(self, params, s: Stream, v_ed, reward, boundary, last):
    """Stage 2 (keep or drop) and stage 3 (INT8 into the bank) for one encoded step.

    With `cfg.evict` the budget holds the `budget` *most surprising* non-turning steps seen so
    far, not the first ones: a budget candidate over budget replaces the least surprising
    budget entry if it is more surprising; and a keep-worthy step meeting a full bank replaces
    the least surprising entry that is not a structural turning point (first step, boundary,
    reward change, last step: never evicted) if it has a higher priority. Eviction removes the
    entry and shifts the later ones down, so the bank stays in step order.

    With a learned salience head (`cfg.salience`), a step whose keep probability is >=
    `cfg.salience_threshold` is a candidate too, and the priority of a non-structural entry
    (what budget replacement and eviction rank by) is that probability instead of the
    surprise; with `cfg.salient_turning` also, a surprising step is a turning point only if
    salient (`temporal.keep_step`).

    Returns (stream, info) with info: surprise, salience (keep probability, 0 without a
    head), keep, turning, pred_d (the prediction that was compared against this step), evict
    (this step evicted an entry), and the evicted entry as in `Stream.gone_*` (gone_step -1
    if none).
    """
    cfg = self.cfg
    v_d = v_ed.reshape(-1)
    surprise = temporal.relative_surprise(s.pred_d, v_d)
    sal = self.salience_prob(params, v_d)
    learned = self.salience is not None
    salient = (sal >= cfg.salience_threshold) if learned else jnp.zeros((), bool)
    structural = (s.step == 0) | last | boundary | (reward != s.prev_reward)
    keep, is_turning, by_surprise = temporal.keep_step(
      surprise,
      structural,
      s.budget_used,
      keep_threshold=cfg.keep_threshold,
      turning_surprise=cfg.turning_surprise,
      budget=cfg.budget,
      salient=salient,
      salient_turning=cfg.salient_turning and learned,
    )
    b = s.bank
    live_c = jnp.arange(cfg.capacity) < b.count
    room = b.count < cfg.capacity
    new_prio = jnp.where(structural, jnp.inf, sal if learned else surprise)
    # Over budget: may replace a budget entry (live, not a turning point) of lower priority.
    over_budget = ((surprise >= cfg.keep_threshold) | salient) & ~is_turning & ~keep
    pool_c = jnp.where(over_budget, live_c & ~b.turning_c, live_c)
    prio_c = jnp.where(pool_c, s.prio_c, jnp.inf)
    victim = jnp.argmin(prio_c)
    evict = ((keep & ~room) | over_budget) & (prio_c[victim] < new_prio)
    if not cfg.evict:
      evict = jnp.zeros((), bool)
    gone_step = jnp.where(evict, b.step_c[victim], -1)
    gone_vec_ed = jnp.where(evict, b.vec_ced[victim], jnp.zeros_like(b.vec_ced[victim]))
    gone_scale_e = jnp.where(evict, b.scale_ce[victim], 0.0)
    write = (keep & room) | evict
    if cfg.quantize:
      q_ed, scale_e = quant.quantize(v_ed)
    else:
      q_ed, scale_e = v_ed.astype(jnp.float32), jnp.ones(v_ed.shape[:1], jnp.float32)
    # Remove the victim (shift later entries down by one), then append at the end.
    src_c = jnp.arange(cfg.capacity)
    src_c = jnp.where(evict & (src_c >= victim), jnp.minimum(src_c + 1, cfg.capacity - 1), src_c)
    count = b.count - evict.astype(jnp.int32)
    idx = jnp.minimum(count, cfg.capacity - 1)

    def put(arr, val):
      arr = arr[src_c]
      return arr.at[idx].set(jnp.where(write, val, arr[idx]))

    bank = Bank(
      vec_ced=put(b.vec_ced, q_ed),
      scale_ce=put(b.scale_ce, scale_e),
      step_c=put(b.step_c, s.step),
      turning_c=put(b.turning_c, is_turning),
      count=count + write.astype(jnp.int32),
    )
    prio_c = put(s.prio_c, new_prio)
    # Entries past the count are empty (step -1) after a shift.
    empty_c = jnp.arange(cfg.capacity) >= bank.count
    bank = bank.replace(step_c=jnp.where(empty_c, -1, bank.step_c))
    prio_c = jnp.where(empty_c, jnp.inf, prio_c)
    budget_used = jnp.sum(~empty_c & ~bank.turning_c).astype(jnp.int32)
    carry, pred = self.temporal.apply(
      {"params": params["temporal"]}, jax.tree.map(lambda x: x[None], s.carry), v_d[None]
    )
    new = Stream(
      bank=bank,
      carry=jax.tree.map(lambda x: x[0], carry),
      pred_d=pred[0],
      prev_reward=jnp.asarray(reward, jnp.float32),
      budget_used=budget_used,
      step=s.step + 1,
      dropped_full=s.dropped_full + (keep & ~write).astype(jnp.int32),
      prio_c=prio_c,
      evicted=s.evicted + evict.astype(jnp.int32),
      gone_vec_ed=gone_vec_ed,
      gone_scale_e=gone_scale_e,
      gone_step=gone_step,
    )
    info = {
      "surprise": surprise,
      "salience": sal,
      "keep": write,
      "turning": is_turning,
      "pred_d": s.pred_d,
      "evict": evict,
      "gone_vec_ed": gone_vec_ed,
      "gone_scale_e": gone_scale_e,
      "gone_step": gone_step,
    }
    return new, info

  def stream_step(self, params, s: Stream, seg_l, segv_l, reward, boundary, last) -> Stream:
    """All three stages for one step of one trajectory (vmap over slots; jit once)."""
    v_ed = self.encode(params, seg_l[None], segv_l[None])[0]
    return self.filter_and_store(params, s, v_ed, reward, boundary, last)[0]

  def scan_trajectory(self, params, v_sed, rewards_s, boundary_s, step_valid_s):
    """The online logic over a whole (encoded) trajectory; padding steps change nothing.

    Returns (final stream, info with [S] / [S, D] arrays). `graveyard(info)` is the
    trajectory's graveyard (nothing evicted on padding steps).
    """
    last_s = step_valid_s & ~jnp.concatenate([step_valid_s[1:], jnp.zeros((1,), bool)])

    def body(s, xs):
      v_ed, r, bnd, last, ok = xs
      new, info = self.filter_and_store(params, s, v_ed, r, bnd, last)
      new = jax.tree.map(lambda a, b: jnp.where(ok, a, b), new, s)
      return new, dict(info, gone_step=jnp.where(ok, info["gone_step"], -1))

    return jax.lax.scan(
      body, self.empty_stream(), (v_sed, rewards_s, boundary_s, last_s, step_valid_s)
    )

  # What the policy sees ------------------------------------------------------------------
  def visible_memory(self, bank: Bank, t):
    """Memory of row t: the last `visible` entries with step < t.

    Returns (vec [V*m, dim] float32, valid [V*m] bool, entry index [V] int32 (clipped)).
    """
    cfg = self.cfg
    n_before = jnp.sum((bank.step_c >= 0) & (bank.step_c < t)).astype(jnp.int32)
    idx_c = n_before - cfg.visible + jnp.arange(cfg.visible)
    ok_c = idx_c >= 0
    idx_c = jnp.maximum(idx_c, 0)
    vis_ced = jnp.where(ok_c[:, None, None], self.entry_vectors(bank, idx_c), 0.0)
    m = cfg.vectors_per_step
    return (vis_ced.reshape(cfg.visible * m, cfg.dim), jnp.repeat(ok_c, m), idx_c)

  def entry_vectors(self, bank: Bank, idx_c=None) -> jax.Array:
    """The bank's entries (those at `idx_c`, or all) as the policy reads them: [C, m, dim]
    float32, dequantised when the bank is INT8."""
    vec, scale = bank.vec_ced, bank.scale_ce
    if idx_c is not None:
      vec, scale = vec[idx_c], scale[idx_c]
    return quant.dequantize(vec, scale) if self.cfg.quantize else vec.astype(jnp.float32)

  # What the learner rebuilds ---------------------------------------------------------------
  @staticmethod
  def replay_log(bank: Bank, grave: Graveyard) -> Log:
    """The final bank [C] and the graveyard [S] as one log of U = C + S entries in step order
    (each step writes at most one entry, so steps are unique; empty slots, step -1, first)."""
    s = grave.step_s.shape[0]
    step_u = jnp.concatenate([bank.step_c, grave.step_s])
    never = jnp.full(bank.step_c.shape, jnp.iinfo(jnp.int32).max, jnp.int32)
    until_u = jnp.concatenate([never, jnp.arange(s, dtype=jnp.int32) + 1])
    order_u = jnp.argsort(step_u)
    return Log(
      vec_ued=jnp.concatenate([bank.vec_ced, grave.vec_sed])[order_u],
      scale_ue=jnp.concatenate([bank.scale_ce, grave.scale_se])[order_u],
      step_u=step_u[order_u],
      until_u=until_u[order_u],
    )

  def replay_memory(self, log: Log, t):
    """Memory of row t as the sampler's `visible_memory(bank_t, t)` gave it: the last
    `visible` entries of the log with step < t < until (module docstring).

    Returns (vec [V*m, dim] float32, valid [V*m] bool, entry step [V] int32, 0 where invalid).
    """
    cfg = self.cfg
    seen_u = (log.step_u >= 0) & (log.step_u < t) & (t < log.until_u)
    rank_u = jnp.cumsum(seen_u.astype(jnp.int32))  # 1-based rank of each seen entry
    want_v = rank_u[-1] - cfg.visible + 1 + jnp.arange(cfg.visible)
    ok_v = want_v >= 1
    # The first position reaching a rank is the seen entry of that rank.
    idx_v = jnp.searchsorted(rank_u, jnp.maximum(want_v, 1))
    idx_v = jnp.where(ok_v, idx_v, 0)
    if cfg.quantize:
      vis_ved = quant.dequantize(log.vec_ued[idx_v], log.scale_ue[idx_v])
    else:
      vis_ved = log.vec_ued[idx_v].astype(jnp.float32)
    vis_ved = jnp.where(ok_v[:, None, None], vis_ved, 0.0)
    m = cfg.vectors_per_step
    step_v = jnp.where(ok_v, log.step_u[idx_v], 0)
    return (vis_ved.reshape(cfg.visible * m, cfg.dim), jnp.repeat(ok_v, m), step_v)


def graveyard(info: dict) -> Graveyard:
  """The graveyard in `scan_trajectory`'s per-step info (leading axes may add a batch)."""
  return Graveyard(
    vec_sed=info["gone_vec_ed"], scale_se=info["gone_scale_e"], step_s=info["gone_step"]
  )


def valid_entries(bank: Bank) -> int:
  return int(bank.count)


def _entry_nbytes(vec_ed) -> int:
  """One entry as shipped: vectors, per-vector scales (only when quantised), an int16 step."""
  m, d = vec_ed.shape[-2:]
  per = m * d * vec_ed.dtype.itemsize + 2
  if vec_ed.dtype == jnp.int8:
    per += m * 4
  return per


def bank_nbytes(bank: Bank, n: int | None = None) -> int:
  """Bytes of the first `n` (default: all written) entries as shipped (`_entry_nbytes`)."""
  n = int(bank.count) if n is None else n
  return n * _entry_nbytes(bank.vec_ced)


def graveyard_nbytes(vec_ged) -> int:
  """Bytes of a trajectory's evicted entries [G, m, dim] as shipped for exact replay: each a
  bank entry (`_entry_nbytes`) plus the int16 step that evicted it."""
  return vec_ged.shape[0] * (_entry_nbytes(vec_ged) + 2)
