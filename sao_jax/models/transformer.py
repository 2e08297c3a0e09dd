"""Decoder-only transformer LM with an explicit KV cache and optional memory prefix.

Layout of one row (all shapes fixed, so sampling and training compile once):

    [ memory slots (M) | prompt, left-padded (P) | completion (T) ]

Memory slots are prefix vectors (the compressed context of long-horizon tasks); they are
projected to the model width and attended to like tokens. Which slots exist is given by
`valid_bk`; a query attends to valid keys at or before its own slot. Token positions count
valid tokens only, so left padding does not shift them. An optional additive key bias
(`key_bias_bk`, e.g. log keep probabilities of memory slots) scales each key's attention weight
by exp(bias) before renormalisation.

Parameters carry logical axis names (batch, embed, heads, kv, mlp, vocab); the mesh rules
in the config map them to mesh axes.
"""

from __future__ import annotations

from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from sao_jax.config import ModelConfig

_NEG_INF = -1e30


class KVCache(NamedTuple):
  """Per-layer keys and values: tuples of [B, K, H, D/H] arrays (K key/value slots)."""

  k: tuple[jax.Array, ...]
  v: tuple[jax.Array, ...]


def init_cache(cfg: ModelConfig, batch: int, length: int, dtype=jnp.float32) -> KVCache:
  shape = (batch, length, cfg.heads, cfg.width // cfg.heads)
  zeros = tuple(jnp.zeros(shape, dtype) for _ in range(cfg.depth))
  return KVCache(k=zeros, v=zeros)


def write_cache(cache_bkhd: jax.Array, new_bthd: jax.Array, index) -> jax.Array:
  """Writes the new keys (or values) of t slots into the cache at slot `index`: one index for
  every row (a scalar), or one per row ([B] int32, continuous batching: each row of the batch
  is at its own position in its own sequence)."""
  new_bthd = new_bthd.astype(cache_bkhd.dtype)
  if jnp.ndim(index) == 0:
    return jax.lax.dynamic_update_slice(cache_bkhd, new_bthd, (0, index, 0, 0))
  return jax.vmap(lambda c, x, i: jax.lax.dynamic_update_slice(c, x, (i, 0, 0)))(
    cache_bkhd, new_bthd, index
  )


def _dense(features, axes, name, dtype, axis=-1):
  return nn.DenseGeneral(
    features=features,
    axis=axis,
    use_bias=False,
    dtype=dtype,
    name=name,
    kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(), axes),
  )


class Attention(nn.Module):
  cfg: ModelConfig

  @nn.compact
  def __call__(self, x_btd, mask_btk, cache_kv=None, index=None, bias_bk=None):
    cfg = self.cfg
    dtype = jnp.dtype(cfg.dtype)
    head_dim = cfg.width // cfg.heads
    qkv = [
      _dense((cfg.heads, head_dim), ("embed", "heads", "kv"), n, dtype)(x_btd)
      for n in ("query", "key", "value")
    ]
    q_bthd, k_bthd, v_bthd = qkv
    new_kv = None
    if cache_kv is not None:
      k_cache, v_cache = cache_kv
      k_bthd, v_bthd = write_cache(k_cache, k_bthd, index), write_cache(v_cache, v_bthd, index)
      new_kv = (k_bthd, v_bthd)
    logits_bhtk = jnp.einsum("bthd,bkhd->bhtk", q_bthd, k_bthd).astype(jnp.float32)
    logits_bhtk = logits_bhtk / jnp.sqrt(head_dim).astype(jnp.float32)
    if bias_bk is not None:
      logits_bhtk = logits_bhtk + bias_bk[:, None, None, :].astype(jnp.float32)
    logits_bhtk = jnp.where(mask_btk[:, None], logits_bhtk, _NEG_INF)
    probs_bhtk = jax.nn.softmax(logits_bhtk, axis=-1).astype(dtype)
    out_bthd = jnp.einsum("bhtk,bkhd->bthd", probs_bhtk, v_bthd)
    out_btd = _dense(cfg.width, ("heads", "kv", "embed"), "out", dtype, axis=(-2, -1))(out_bthd)
    return out_btd, new_kv


class Block(nn.Module):
  cfg: ModelConfig

  @nn.compact
  def __call__(self, x_btd, mask_btk, cache_kv=None, index=None, bias_bk=None):
    cfg = self.cfg
    dtype = jnp.dtype(cfg.dtype)
    h_btd, new_kv = Attention(cfg, name="attn")(
      nn.RMSNorm(dtype=dtype, name="norm_attn")(x_btd), mask_btk, cache_kv, index, bias_bk
    )
    x_btd = x_btd + h_btd
    h_btd = nn.RMSNorm(dtype=dtype, name="norm_mlp")(x_btd)
    h_btf = _dense(cfg.width * cfg.mlp_ratio, ("embed", "mlp"), "mlp_in", dtype)(h_btd)
    h_btd = _dense(cfg.width, ("mlp", "embed"), "mlp_out", dtype)(nn.gelu(h_btf))
    x_btd = nn.with_logical_constraint(x_btd + h_btd, ("batch", "length", "act_embed"))
    return x_btd, new_kv


class TransformerLM(nn.Module):
  """Returns next-token logits [B, t, V] for the t new token slots, and the updated cache.

  Args (of __call__):
    tokens_bt: int32 token ids of the new token slots.
    positions_bt: int32 position of each token (counting valid tokens of its row).
    mask_btk: bool, query t may attend key slot k (k spans the cache, or the full row
      when no cache is used).
    memory_bmd: optional [B, M, memory_dim] prefix vectors, placed before the tokens.
    cache: optional KVCache; new keys/values are written at slot `index` (a scalar, or [B]
      int32 for a different slot in every row).
    with_values: also return the value head's output [B, t] (model.value_head only).
    key_bias_bk: optional float [B, K] added to every query's attention logits for key k
      (no cache: K spans the full row, memory slots first).
  """

  cfg: ModelConfig

  @nn.compact
  def __call__(
    self,
    tokens_bt,
    positions_bt,
    mask_btk,
    memory_bmd=None,
    cache=None,
    index=0,
    with_values: bool = False,
    key_bias_bk=None,
  ):
    cfg = self.cfg
    dtype = jnp.dtype(cfg.dtype)
    embed = nn.Embed(
      cfg.vocab_size,
      cfg.width,
      dtype=dtype,
      name="embed",
      embedding_init=nn.with_logical_partitioning(nn.initializers.normal(0.02), ("vocab", "embed")),
    )
    pos_embed = self.param(
      "pos_embed",
      nn.with_logical_partitioning(nn.initializers.normal(0.02), (None, "embed")),
      (cfg.max_len, cfg.width),
    )
    x_btd = embed(tokens_bt) + jnp.take(pos_embed, positions_bt, axis=0).astype(dtype)
    n_mem = 0
    if cfg.memory_slots:
      # Memory must be given whenever the model has memory slots (init included), so that its
      # projection always exists; rows without memory pass all-invalid slots.
      mem_dim = cfg.memory_dim or cfg.width
      if memory_bmd is None:
        memory_bmd = jnp.zeros((tokens_bt.shape[0], 0, mem_dim), dtype)
      mem_in_bmd = _dense(cfg.width, (None, "embed"), "memory_in", dtype)(memory_bmd.astype(dtype))
      n_mem = mem_in_bmd.shape[1]
      x_btd = jnp.concatenate([mem_in_bmd, x_btd], axis=1)
    elif memory_bmd is not None:
      raise ValueError("memory given but model.memory_slots == 0")
    x_btd = nn.with_logical_constraint(x_btd, ("batch", "length", "act_embed"))
    new_k, new_v = [], []
    for i in range(cfg.depth):
      layer_kv = None if cache is None else (cache.k[i], cache.v[i])
      x_btd, kv = Block(cfg, name=f"block_{i}")(x_btd, mask_btk, layer_kv, index, key_bias_bk)
      if kv is not None:
        new_k.append(kv[0])
        new_v.append(kv[1])
    x_btd = nn.RMSNorm(dtype=dtype, name="norm_out")(x_btd[:, n_mem:])
    logits_btv = embed.attend(x_btd).astype(jnp.float32)
    new_cache = KVCache(tuple(new_k), tuple(new_v)) if cache is not None else None
    if cfg.value_head:
      values_bt = _dense(1, ("embed", None), "value_head", dtype)(x_btd)[..., 0]
      if with_values:
        return logits_btv, new_cache, values_bt.astype(jnp.float32)
    elif with_values:
      raise ValueError("values asked for, but model.value_head is False")
    return logits_btv, new_cache


def positions_from_valid(valid_bk: jax.Array) -> jax.Array:
  """Position of each slot = number of valid slots before it (0 for the first valid)."""
  return jnp.maximum(jnp.cumsum(valid_bk.astype(jnp.int32), axis=-1) - 1, 0)


def causal_mask(valid_bk: jax.Array, query_slots_t: jax.Array) -> jax.Array:
  """[B, T, K]: query at slot q sees valid key slots k <= q."""
  s = jnp.arange(valid_bk.shape[-1])
  return valid_bk[:, None, :] & (s[None, None, :] <= query_slots_t[None, :, None])
