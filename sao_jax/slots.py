"""Continuous batching: a fixed-shape decode state of B slots, refilled between decode steps.

Each slot decodes one completion at its own position: its KV cache holds [prompt (P, left-
padded) | completion (T)], and per-row write positions (`gen_b`) let rows of different
lengths share one jitted decode step. When a completion ends (EOS or T tokens) its slot is
free; the host reads the completion out and `fill` prefills a new prompt into it (a new
task, or the next step of a multi-step episode) while the other slots keep their caches.
Every shape is fixed, so `fill` and `decode` compile once.

`decode` runs decode steps until `min_done` completions are waiting to be read (or none is
active, or `max_steps`): the host is involved once per batch of finished slots, not once per
token. Every token records the policy version that produced it (`version_bt`), so the
sampler may switch parameters between calls without dropping the completions in flight.

`refresh` recomputes the caches when parameters change mid-completion, so that a token's
recorded version names the policy it was drawn from exactly. Greedy decoding of a refilled
slot gives the tokens that `sampling.sample` gives for that
prompt alone, and the recorded log-probs equal `sampling.completion_logprobs` up to float
error: a slot sees only its own cache rows, and positions count valid tokens.
"""

from __future__ import annotations

import flax
import jax
import jax.numpy as jnp

from sao_jax.models import init_cache
from sao_jax.models.transformer import KVCache, causal_mask
from sao_jax.models.transformer import positions_from_valid as _positions


@flax.struct.dataclass
class Slots:
  """Decode state of B slots (K = P + T cache slots per row)."""

  cache: KVCache
  prompt_bp: jax.Array  # int32 the row's prompt (left-padded), to recompute its cache
  valid_bk: jax.Array  # bool: which cache slots hold a token of the row's sequence
  pos_b: jax.Array  # int32 position id of the next token
  gen_b: jax.Array  # int32 completion tokens generated so far
  active_b: jax.Array  # bool: a completion is in progress
  done_b: jax.Array  # bool: a completion ended and waits to be read (until the next fill)
  logits_bv: jax.Array  # f32 logits of the next token
  tokens_bt: jax.Array  # int32 completion so far (pad after it)
  logp_bt: jax.Array  # f32 behaviour log-prob of each token (0 where none)
  version_bt: jax.Array  # int32 policy version that produced each token (-1 where none)


def empty(model, rows: int, prompt_len: int, max_new_tokens: int, pad_id: int) -> Slots:
  cfg = model.cfg
  k = prompt_len + max_new_tokens
  return Slots(
    cache=init_cache(cfg, rows, k, jnp.dtype(cfg.dtype)),
    prompt_bp=jnp.full((rows, prompt_len), pad_id, jnp.int32),
    valid_bk=jnp.zeros((rows, k), bool),
    pos_b=jnp.zeros((rows,), jnp.int32),
    gen_b=jnp.zeros((rows,), jnp.int32),
    active_b=jnp.zeros((rows,), bool),
    done_b=jnp.zeros((rows,), bool),
    logits_bv=jnp.zeros((rows, cfg.vocab_size), jnp.float32),
    tokens_bt=jnp.full((rows, max_new_tokens), pad_id, jnp.int32),
    logp_bt=jnp.zeros((rows, max_new_tokens), jnp.float32),
    version_bt=jnp.full((rows, max_new_tokens), -1, jnp.int32),
  )


def fill(model, params, slots: Slots, prompt_rp, prompt_valid_rp, slot_r, *, pad_id: int) -> Slots:
  """Prefills R prompts (left-padded [R, P]) into slots `slot_r` [R] int32; an index >= B
  marks an unused row (dropped). Those slots start a new completion; the others are
  unchanged."""
  rows, k = slots.valid_bk.shape
  plen = prompt_rp.shape[1]
  t = k - plen
  r = prompt_rp.shape[0]
  cache_r = init_cache(model.cfg, r, k, slots.cache.k[0].dtype)
  valid_rk = jnp.concatenate([prompt_valid_rp, jnp.zeros((r, t), bool)], axis=1)
  mask = causal_mask(valid_rk, jnp.arange(plen))
  logits_rpv, cache_r = model.apply(
    {"params": params}, prompt_rp, _positions(prompt_valid_rp), mask, cache=cache_r, index=0
  )

  def put(dst, src):
    return dst.at[slot_r].set(src.astype(dst.dtype), mode="drop")

  return Slots(
    cache=KVCache(
      tuple(put(a, b) for a, b in zip(slots.cache.k, cache_r.k, strict=True)),
      tuple(put(a, b) for a, b in zip(slots.cache.v, cache_r.v, strict=True)),
    ),
    prompt_bp=put(slots.prompt_bp, prompt_rp),
    valid_bk=put(slots.valid_bk, valid_rk),
    pos_b=put(slots.pos_b, jnp.sum(prompt_valid_rp, axis=-1).astype(jnp.int32)),
    gen_b=put(slots.gen_b, jnp.zeros((r,), jnp.int32)),
    active_b=put(slots.active_b, jnp.ones((r,), bool)),
    done_b=put(slots.done_b, jnp.zeros((r,), bool)),
    logits_bv=put(slots.logits_bv, logits_rpv[:, -1]),
    tokens_bt=put(slots.tokens_bt, jnp.full((r, t), pad_id, jnp.int32)),
    logp_bt=put(slots.logp_bt, jnp.zeros((r, t), jnp.float32)),
    version_bt=put(slots.version_bt, jnp.full((r, t), -1, jnp.int32)),
  )


def refresh(model, params, slots: Slots) -> Slots:
  """Recomputes every slot's cache and next-token logits under `params`: what a sampler does
  when it takes new parameters mid-completion, so that each later token is drawn from the
  new policy given its whole prefix (not from new weights over keys and values that the old
  ones computed) and its log-prob is that policy's."""
  rows, k = slots.valid_bk.shape
  plen = slots.prompt_bp.shape[1]
  seq_bk = jnp.concatenate([slots.prompt_bp, slots.tokens_bt], axis=1)
  cache = init_cache(model.cfg, rows, k, slots.cache.k[0].dtype)
  logits_bkv, cache = model.apply(
    {"params": params},
    seq_bk,
    _positions(slots.valid_bk),
    causal_mask(slots.valid_bk, jnp.arange(k)),
    cache=cache,
    index=0,
  )
  last_b = plen - 1 + slots.gen_b  # the slot of the row's last token so far
  logits_bv = jnp.take_along_axis(logits_bkv, last_b[:, None, None], axis=1)[:, 0]
  return slots.replace(
    cache=cache, logits_bv=jnp.where(slots.active_b[:, None], logits_bv, slots.logits_bv)
  )


def decode(
  model,
  params,
  slots: Slots,
  version,
  rng,
  *,
  eos_id: int,
  pad_id: int,
  temperature: float = 1.0,
  greedy: bool = False,
  min_done: int = 1,
  max_steps: int = 0,
) -> Slots:
  """Decode steps for every active slot until at least `min_done` completions ended in this
  call, no slot is active, or `max_steps` steps (0: T). `version` (int32 scalar) is recorded
  for every token produced here. Ended slots have `done_b` set until they are refilled."""
  rows, k = slots.valid_bk.shape
  t = slots.tokens_bt.shape[1]
  plen = k - t
  max_steps = max_steps or t
  row = jnp.arange(rows)

  def cond(carry):
    i, n_ended, s, _ = carry
    return (i < max_steps) & jnp.any(s.active_b) & (n_ended < min_done)

  def body(carry):
    i, n_ended, s, rng = carry
    rng, key = jax.random.split(rng)
    scaled_bv = s.logits_bv / temperature
    logp_bv = jax.nn.log_softmax(scaled_bv, axis=-1)
    if greedy:
      tok_b = jnp.argmax(s.logits_bv, axis=-1)
    else:
      tok_b = jax.random.categorical(key, scaled_bv, axis=-1)
    tok_b = tok_b.astype(jnp.int32)
    lp_b = jnp.take_along_axis(logp_bv, tok_b[:, None], axis=-1)[:, 0]
    act = s.active_b
    col = jnp.minimum(s.gen_b, t - 1)
    slot_b = plen + col
    tokens_bt = s.tokens_bt.at[row, col].set(jnp.where(act, tok_b, s.tokens_bt[row, col]))
    logp_bt = s.logp_bt.at[row, col].set(jnp.where(act, lp_b, s.logp_bt[row, col]))
    version_bt = s.version_bt.at[row, col].set(jnp.where(act, version, s.version_bt[row, col]))
    valid_bk = s.valid_bk.at[row, slot_b].set(s.valid_bk[row, slot_b] | act)
    ended = act & ((tok_b == eos_id) | (s.gen_b + 1 >= t))
    # Inactive rows run too (fixed shapes) but only touch their own unused cache slot.
    mask = valid_bk[:, None, :] & (jnp.arange(k)[None, None, :] <= slot_b[:, None, None])
    logits_b1v, cache = model.apply(
      {"params": params},
      jnp.where(act, tok_b, pad_id)[:, None],
      s.pos_b[:, None],
      mask,
      cache=s.cache,
      index=slot_b,
    )
    s = s.replace(
      cache=cache,
      valid_bk=valid_bk,
      pos_b=s.pos_b + act,
      gen_b=s.gen_b + act,
      active_b=act & ~ended,
      done_b=s.done_b | ended,
      logits_bv=jnp.where(act[:, None], logits_b1v[:, 0], s.logits_bv),
      tokens_bt=tokens_bt,
      logp_bt=logp_bt,
      version_bt=version_bt,
    )
    return i + 1, n_ended + jnp.sum(ended), s, rng

  _, _, slots, _ = jax.lax.while_loop(cond, body, (0, 0, slots, rng))
  return slots
