"""Fixed-shape KV-cache sampling and per-token log-probs of given sequences.

Pure functions of (params, arrays); the runner jits them once. A batch row is

    [ memory (M) | prompt left-padded to P | completion (T) ]

Every row is a different task's single trajectory or a group member; rows finish at their
own EOS and are masked from then on, and the loop exits early once all rows are done.

The recorded log-prob of a sampled token is log softmax(logits / temperature) at that
token: the full (untruncated) distribution at the sampling temperature. With top-k/top-p
the behaviour distribution is the truncated one, so RL configs keep both off; the recorded
values then equal `sequence_logprobs(..., temperature)` exactly up to float error.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from sao_jax import seqpack
from sao_jax.models import KVCache, init_cache
from sao_jax.models.transformer import TransformerLM, causal_mask, positions_from_valid


class SampleOutput(NamedTuple):
  tokens_bt: jax.Array  # int32, PAD after EOS
  logp_bt: jax.Array  # f32 log-prob of each sampled token, 0 where invalid
  valid_bt: jax.Array  # bool, True up to and including EOS
  lengths_b: jax.Array  # int32 number of valid completion tokens


def _filter_logits(logits_bv, top_k: int, top_p: float):
  if top_k > 0:
    kth_b1 = jax.lax.top_k(logits_bv, top_k)[0][:, -1:]
    logits_bv = jnp.where(logits_bv < kth_b1, -jnp.inf, logits_bv)
  if top_p < 1.0:
    sorted_bv = jnp.sort(logits_bv, axis=-1)[:, ::-1]
    cum_bv = jnp.cumsum(jax.nn.softmax(sorted_bv, axis=-1), axis=-1)
    # Smallest logit that is still inside the nucleus (the top token is always kept).
    keep_bv = (cum_bv - jax.nn.softmax(sorted_bv, axis=-1)) < top_p
    cutoff_b1 = jnp.min(jnp.where(keep_bv, sorted_bv, jnp.inf), axis=-1, keepdims=True)
    logits_bv = jnp.where(logits_bv < cutoff_b1, -jnp.inf, logits_bv)
  return logits_bv


def sample(
  model: TransformerLM,
  params,
  prompt_bp,
  prompt_valid_bp,
  rng,
  *,
  max_new_tokens: int,
  eos_id: int,
  pad_id: int,
  temperature: float = 1.0,
  top_k: int = 0,
  top_p: float = 1.0,
  greedy: bool = False,
  memory_bmd=None,
  memory_valid_bm=None,
  memory_cache: KVCache | None = None,
) -> SampleOutput:
  """Samples up to `max_new_tokens` tokens after each left-padded prompt.

  Args:
    prompt_bp: int32 [B, P], prompts right-aligned (left padding), at least one valid token.
    prompt_valid_bp: bool [B, P].
    memory_bmd / memory_valid_bm: optional prefix memory and its validity.
    memory_cache: instead of `memory_bmd`, the memory's keys and values already computed
      ([B, M, ...] per layer, e.g. `MemoryPolicy.update_memory_cache`); `memory_valid_bm`
      says which of its M slots are valid. The same tokens and log-probs as passing the
      memory itself, up to float rounding.
  """
  batch, plen = prompt_bp.shape
  cfg = model.cfg
  if memory_cache is not None:
    n_mem = memory_cache.k[0].shape[1]
  else:
    n_mem = 0 if memory_bmd is None else memory_bmd.shape[1]
  total = n_mem + plen + max_new_tokens
  cache = init_cache(cfg, batch, total, jnp.dtype(cfg.dtype))
  valid_bk = jnp.zeros((batch, total), bool)
  if n_mem:
    valid_bk = valid_bk.at[:, :n_mem].set(memory_valid_bm)
  valid_bk = valid_bk.at[:, n_mem : n_mem + plen].set(prompt_valid_bp)
  pos_bp = positions_from_valid(prompt_valid_bp)
  if memory_cache is None:
    mask = causal_mask(valid_bk, jnp.arange(n_mem + plen))
    logits_bpv, cache = model.apply(
      {"params": params}, prompt_bp, pos_bp, mask, memory_bmd=memory_bmd, cache=cache, index=0
    )
  else:
    cache = jax.tree.map(lambda c, m: c.at[:, :n_mem].set(m.astype(c.dtype)), cache, memory_cache)
    empty = jnp.zeros((batch, 0, cfg.memory_dim or cfg.width), jnp.dtype(cfg.dtype))
    logits_bpv, cache = model.apply(
      {"params": params},
      prompt_bp,
      pos_bp,
      causal_mask(valid_bk, n_mem + jnp.arange(plen)),
      memory_bmd=empty,
      cache=cache,
      index=n_mem,
    )
  next_pos_b = jnp.sum(prompt_valid_bp, axis=-1).astype(jnp.int32)

  def choose(logits_bv, key):
    scaled_bv = logits_bv / temperature
    logp_bv = jax.nn.log_softmax(scaled_bv, axis=-1)
    if greedy:
      tok_b = jnp.argmax(logits_bv, axis=-1)
    else:
      tok_b = jax.random.categorical(key, _filter_logits(scaled_bv, top_k, top_p), axis=-1)
    tok_b = tok_b.astype(jnp.int32)
    return tok_b, jnp.take_along_axis(logp_bv, tok_b[:, None], axis=-1)[:, 0]

  tokens_bt = jnp.full((batch, max_new_tokens), pad_id, jnp.int32)
  logp_bt = jnp.zeros((batch, max_new_tokens), jnp.float32)
  done_b = jnp.zeros((batch,), bool)
  init = (0, logits_bpv[:, -1], cache, valid_bk, next_pos_b, tokens_bt, logp_bt, done_b, rng)

  def cond(carry):
    i, *_, done_b, _ = carry
    return (i < max_new_tokens) & ~jnp.all(done_b)

  def body(carry):
    i, logits_bv, cache, valid_bk, pos_b, tokens_bt, logp_bt, done_b, rng = carry
    rng, key = jax.random.split(rng)
    tok_b, lp_b = choose(logits_bv, key)
    tok_b = jnp.where(done_b, pad_id, tok_b)
    lp_b = jnp.where(done_b, 0.0, lp_b)
    tokens_bt = tokens_bt.at[:, i].set(tok_b)
    logp_bt = logp_bt.at[:, i].set(lp_b)
    slot = n_mem + plen + i
    valid_bk = valid_bk.at[:, slot].set(~done_b)
    done_b = done_b | (tok_b == eos_id)
    mask = causal_mask(valid_bk, slot[None])
    logits_b1v, cache = model.apply(
      {"params": params}, tok_b[:, None], pos_b[:, None], mask, cache=cache, index=slot
    )
    return (i + 1, logits_b1v[:, 0], cache, valid_bk, pos_b + 1, tokens_bt, logp_bt, done_b, rng)

  _, _, _, valid_bk, _, tokens_bt, logp_bt, _, _ = jax.lax.while_loop(cond, body, init)
  valid_bt = valid_bk[:, n_mem + plen :]
  return SampleOutput(tokens_bt, logp_bt, valid_bt, jnp.sum(valid_bt, axis=-1).astype(jnp.int32))


def sequence_logits(
  model: TransformerLM,
  params,
  tokens_bl,
  valid_bl,
  memory_bmd=None,
  memory_valid_bm=None,
  with_values: bool = False,
  memory_bias_bm=None,
):
  """Full-row forward: logits [B, L, V] predicting the token after each slot (and the value
  head's outputs [B, L] with `with_values`). `memory_bias_bm`: optional additive attention
  bias of the memory slots (0 on token slots)."""
  valid_bk = valid_bl
  if memory_bmd is not None:
    valid_bk = jnp.concatenate([memory_valid_bm, valid_bl], axis=1)
  extra = {}  # only the GPT-style model takes a key bias; other architectures never get one
  if memory_bias_bm is not None:
    zeros = jnp.zeros(valid_bl.shape, jnp.float32)
    extra["key_bias_bk"] = jnp.concatenate([memory_bias_bm, zeros], axis=1)
  mask = causal_mask(valid_bk, jnp.arange(valid_bk.shape[1]))
  out = model.apply(
    {"params": params},
    tokens_bl,
    positions_from_valid(valid_bl),
    mask,
    memory_bmd=memory_bmd,
    with_values=with_values,
    **extra,
  )
  return (out[0], out[2]) if with_values else out[0]


class LogProbs(NamedTuple):
  """Per-token log-probs of given completions, and what was asked for with them."""

  logp_bt: jax.Array  # f32, 0 where invalid
  entropy_bt: jax.Array | None = None  # f32 entropy of each token's distribution (0 invalid)
  values_b: jax.Array | None = None  # value head at the last prompt token


def completion_logprobs(
  model: TransformerLM,
  params,
  prompt_bp,
  prompt_valid_bp,
  tokens_bt,
  valid_bt,
  *,
  temperature: float = 1.0,
  memory_bmd=None,
  memory_valid_bm=None,
  with_entropy: bool = False,
  with_value: bool = False,
  memory_bias_bm=None,
  pack: seqpack.PackPlan | None = None,
) -> LogProbs:
  """Per-token log-probs [B, T] of `tokens_bt` following each prompt (0 where invalid).

  Formula: logp[b, t] = log softmax(logits[b, P-1+t] / temperature)[tokens[b, t]], where
  logits come from one forward pass over [memory | prompt | completion]. With
  `with_entropy` also the per-token entropy of that distribution; with `with_value` the value
  head's output V(prompt) at the last prompt token. With `pack` (`sao_jax.seqpack.plan` of
  these rows; no memory) the forward pass runs over the packed rows instead: the same values,
  computed on the rows' real tokens only.
  """
  plen = prompt_bp.shape[1]
  tokens_bl = jnp.concatenate([prompt_bp, tokens_bt], axis=1)
  valid_bl = jnp.concatenate([prompt_valid_bp, valid_bt], axis=1)
  if pack is not None:
    if memory_bmd is not None:
      raise ValueError("sequence packing is for rows without a memory prefix")
    return _packed_logprobs(
      model,
      params,
      pack,
      tokens_bl,
      valid_bl,
      plen,
      valid_bt,
      temperature,
      with_entropy,
      with_value,
    )
  out = sequence_logits(
    model,
    params,
    tokens_bl,
    valid_bl,
    memory_bmd,
    memory_valid_bm,
    with_values=with_value,
    memory_bias_bm=memory_bias_bm,
  )
  logits_blv = out[0] if with_value else out
  logp = _completion_logprobs(logits_blv, plen, tokens_bt, valid_bt, temperature, with_entropy)
  return logp._replace(values_b=out[1][:, plen - 1] if with_value else None)


def _packed_logprobs(
  model, params, pack, tokens_bl, valid_bl, plen, valid_bt, temperature, with_entropy, with_value
) -> LogProbs:
  """`completion_logprobs` through the packed rows of `pack`: each packed slot predicts the
  token that follows its row slot in the row (the same target as unpacked), and its outputs
  are gathered back to the row slots P-1+t (and P-1 for the value)."""
  mask_qlk = seqpack.packed_attention(pack, valid_bl)
  positions_bl = positions_from_valid(valid_bl)
  out = model.apply(
    {"params": params},
    seqpack.gather(pack, tokens_bl),
    seqpack.gather(pack, positions_bl),
    mask_qlk,
    with_values=with_value,
  )
  next_bl = jnp.concatenate([tokens_bl[:, 1:], tokens_bl[:, :1]], axis=1)  # last: never read
  logp_ql, ent_ql = _token_logprobs(
    out[0] / temperature, seqpack.gather(pack, next_bl), with_entropy
  )
  tlen = valid_bt.shape[1]
  # Back to the row slots; slot P-1+t predicts completion token t.
  read = (
    lambda x_ql: jnp.where(  # noqa: E731
      valid_bt, seqpack.scatter_back(pack, x_ql)[:, plen - 1 : plen - 1 + tlen], 0.0
    )
  )
  entropy_bt = read(ent_ql) if with_entropy else None
  values_b = seqpack.scatter_back(pack, out[2])[:, plen - 1] if with_value else None
  return LogProbs(read(logp_ql), entropy_bt, values_b)


def _token_logprobs(logits_xv, targets_x, with_entropy: bool):
  """log softmax(logits)[target] at every position, and the distribution's entropy (None
  without `with_entropy`)."""
  logp_xv = jax.nn.log_softmax(logits_xv, axis=-1)
  logp_x = jnp.take_along_axis(logp_xv, targets_x[..., None], axis=-1)[..., 0]
  entropy_x = -jnp.sum(jnp.exp(logp_xv) * logp_xv, axis=-1) if with_entropy else None
  return logp_x, entropy_x


def _completion_logprobs(logits_blv, plen, tokens_bt, valid_bt, temperature, with_entropy):
  """LogProbs of the completion `tokens_bt` from the logits of [prompt (plen) | completion]."""
  logp_bt, entropy_bt = _token_logprobs(
    logits_blv[:, plen - 1 : -1] / temperature, tokens_bt, with_entropy
  )
  if with_entropy:
    entropy_bt = jnp.where(valid_bt, entropy_bt, 0.0)
  return LogProbs(jnp.where(valid_bt, logp_bt, 0.0), entropy_bt)


def shared_memory_logprobs(
  model: TransformerLM,
  params,
  prompt_brp,
  prompt_valid_brp,
  tokens_brt,
  valid_brt,
  *,
  memory_bmd,
  memory_valid_bm,
  row_memory_valid_brm,
  temperature: float = 1.0,
  with_entropy: bool = False,
  memory_bias_bm=None,
) -> LogProbs:
  """`completion_logprobs` of R rows per trajectory ([B, R, ...] -> LogProbs of [B*R, T])
  whose memories are views of one memory per trajectory (`memory_bmd` [B, M, dim], its valid
  slots `memory_valid_bm`): row r reads the slots `row_memory_valid_brm[b, r]` of it. The
  memory slots' keys and values go through the model once per trajectory instead of once per
  row; each row's prompt and completion then attend to them (with the optional per-slot
  `memory_bias_bm`) and to their own tokens.

  Exact (up to the order of float sums) where each row's valid slots are, in slot order, a
  prefix of the trajectory's valid slots: a memory slot attends to the valid slots before it,
  and memory slots carry no position, so a slot's keys and values are then the same in every
  row that reads it. That holds when rows read every entry written before their step (a bank
  that never evicts and is all visible, or every earlier step's vectors), not for a window of
  the last few entries or a bank that evicts (`MemoryPolicy.row_logprobs` chooses)."""
  b, r, plen = prompt_brp.shape
  m = memory_bmd.shape[1]
  extra = {} if memory_bias_bm is None else {"key_bias_bk": memory_bias_bm}
  # The memory alone, causal over its valid slots, written into a cache of M slots.
  cache = init_cache(model.cfg, b, m, jnp.dtype(model.cfg.dtype))
  none = jnp.zeros((b, 0), jnp.int32)
  _, cache = model.apply(
    {"params": params},
    none,
    none,
    causal_mask(memory_valid_bm, jnp.arange(m)),
    memory_bmd=memory_bmd,
    cache=cache,
    index=0,
    **extra,
  )
  # Each row's tokens after its view of that cache.
  flat = lambda x: x.reshape((b * r,) + x.shape[2:])  # noqa: E731
  tokens_bl = flat(jnp.concatenate([prompt_brp, tokens_brt], axis=2))
  valid_bl = flat(jnp.concatenate([prompt_valid_brp, valid_brt], axis=2))
  n = tokens_bl.shape[1]

  def rows(x):  # [B, M, ...] -> [B*R, M + n, ...]: each row's copy, room for its tokens
    x = jnp.repeat(x, r, axis=0)
    return jnp.concatenate([x, jnp.zeros((b * r, n) + x.shape[2:], x.dtype)], axis=1)

  cache = jax.tree.map(rows, cache)
  valid_bk = jnp.concatenate([flat(row_memory_valid_brm), valid_bl], axis=1)
  if memory_bias_bm is not None:
    extra["key_bias_bk"] = rows(memory_bias_bm.astype(jnp.float32))
  empty = jnp.zeros((b * r, 0, memory_bmd.shape[2]), memory_bmd.dtype)
  logits_blv, _ = model.apply(
    {"params": params},
    tokens_bl,
    positions_from_valid(valid_bl),
    causal_mask(valid_bk, m + jnp.arange(n)),
    memory_bmd=empty,
    cache=cache,
    index=m,
    **extra,
  )
  return _completion_logprobs(
    logits_blv, plen, flat(tokens_brt), flat(valid_brt), temperature, with_entropy
  )
