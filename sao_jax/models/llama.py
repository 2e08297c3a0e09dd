"""Llama/Qwen2-family decoder: RMSNorm, rotary positions, SwiGLU MLP, grouped-query attention.

Same interface and row layout as `sao_jax.models.transformer.TransformerLM` (memory prefix,
KV cache, value head), so the sampler, the learner and the sharding rules take either:

    [ memory slots (M) | prompt, left-padded (P) | completion (T) ]

One block (Touvron et al. 2023, "LLaMA"; Qwen2 adds biases to q/k/v):

    h = x + Attn(RMSNorm(x))        q, k rotated by position (RoPE, base rope_theta)
    y = h + W_down (silu(W_gate RMSNorm(h)) * W_up RMSNorm(h))

Attention has H query heads and KV <= H key/value heads; query head h reads key/value head
h // (H / KV), the grouping Hugging Face's `repeat_kv` uses, so imported checkpoints need no
head permutation. The cache stores KV heads only. Rotary embeddings use the "rotate half"
pairing (dimension i with i + Dh/2), as Hugging Face checkpoints are laid out. Memory slots
have position 0, the identity rotation: their keys carry no position.

Every parameter is float32 and carries logical axis names (batch, embed, heads, kv_heads, kv,
mlp, vocab, norm); compute runs in `cfg.dtype`, with softmax, norms and logits in float32.
With `cfg.lora_rank > 0` the projections named in `cfg.lora_targets` carry LoRA adapters
(Hu et al. 2021): W x + (alpha / r) B A x with A [in, r] and B [r, out] (B starts at zero,
so a fresh adapter leaves the model unchanged); see `sao_jax.models.lora`.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from sao_jax.config import ModelConfig
from sao_jax.models.transformer import KVCache, write_cache

_NEG_INF = -1e30


def init_cache(cfg: ModelConfig, batch: int, length: int, dtype=jnp.float32) -> KVCache:
  """Zero cache of [B, S, KV, Dh] per layer (key/value heads only)."""
  shape = (batch, length, cfg.n_kv_heads, cfg.head_dim)
  zeros = tuple(jnp.zeros(shape, dtype) for _ in range(cfg.depth))
  return KVCache(k=zeros, v=zeros)


def rope(x_bthd: jax.Array, positions_bt: jax.Array, theta: float) -> jax.Array:
  """Rotary embedding, "rotate half" pairing, computed in float32.

  Formula: with f_i = theta^(-2i/Dh) and a = pos * f (i < Dh/2),
    out[:Dh/2] = x1 cos a - x2 sin a,   out[Dh/2:] = x2 cos a + x1 sin a.
  """
  half = x_bthd.shape[-1] // 2
  inv_freq = 1.0 / (theta ** (jnp.arange(0, 2 * half, 2, dtype=jnp.float32) / (2 * half)))
  angle_bti = positions_bt.astype(jnp.float32)[..., None] * inv_freq
  cos, sin = jnp.cos(angle_bti)[:, :, None], jnp.sin(angle_bti)[:, :, None]
  x = x_bthd.astype(jnp.float32)
  x1, x2 = x[..., :half], x[..., half:]
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).astype(x_bthd.dtype)


class RMSNorm(nn.Module):
  """y = scale * x / sqrt(mean(x^2) + eps), statistics in float32."""

  eps: float
  dtype: Any

  @nn.compact
  def __call__(self, x):
    scale = self.param(
      "scale",
      nn.with_logical_partitioning(nn.initializers.ones, ("norm",)),
      (x.shape[-1],),
      jnp.float32,
    )
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + self.eps)
    return (scale * y).astype(self.dtype)


def _contract(x, w, n: int):
  """Contracts the last n axes of x with the first n axes of w."""
  return jax.lax.dot_general(x, w, ((tuple(range(x.ndim - n, x.ndim)), tuple(range(n))), ((), ())))


class Linear(nn.Module):
  """y = x W (+ b) (+ (alpha / r) (x A) B), contracting the last `n_in` axes of x.

  `axes` names W's axes, inputs then outputs; A [in..., r] and B [r, out...] keep the
  input/output names and leave the rank axis unsharded.
  """

  out_shape: tuple[int, ...]
  axes: tuple[str | None, ...]
  n_in: int = 1
  use_bias: bool = False
  dtype: Any = jnp.float32
  lora_rank: int = 0
  lora_alpha: float = 1.0

  @nn.compact
  def __call__(self, x):
    n_in, n_out = self.n_in, len(self.out_shape)
    in_shape = x.shape[-n_in:]
    init = nn.initializers.lecun_normal(
      in_axis=tuple(range(n_in)), out_axis=tuple(range(n_in, n_in + n_out))
    )
    kernel = self.param(
      "kernel",
      nn.with_logical_partitioning(init, self.axes),
      in_shape + tuple(self.out_shape),
      jnp.float32,
    )
    x = x.astype(self.dtype)
    y = _contract(x, kernel.astype(self.dtype), n_in)
    if self.use_bias:
      bias = self.param(
        "bias",
        nn.with_logical_partitioning(nn.initializers.zeros, self.axes[n_in:]),
        tuple(self.out_shape),
        jnp.float32,
      )
      y = y + bias.astype(self.dtype)
    if self.lora_rank:
      a_init = nn.initializers.variance_scaling(
        1.0, "fan_in", "normal", in_axis=tuple(range(n_in)), out_axis=n_in
      )
      lora_a = self.param(
        "lora_a",
        nn.with_logical_partitioning(a_init, self.axes[:n_in] + (None,)),
        in_shape + (self.lora_rank,),
        jnp.float32,
      )
      lora_b = self.param(
        "lora_b",
        nn.with_logical_partitioning(nn.initializers.zeros, (None,) + self.axes[n_in:]),
        (self.lora_rank,) + tuple(self.out_shape),
        jnp.float32,
      )
      scale = self.lora_alpha / self.lora_rank
      h = _contract(x, lora_a.astype(self.dtype), n_in)
      y = y + scale * _contract(h, lora_b.astype(self.dtype), 1)
    return y


def _linear(cfg: ModelConfig, name: str, out_shape, axes, n_in=1, use_bias=False) -> Linear:
  rank = cfg.lora_rank if name in cfg.lora_targets else 0
  return Linear(
    tuple(out_shape),
    tuple(axes),
    n_in=n_in,
    use_bias=use_bias,
    dtype=jnp.dtype(cfg.dtype),
    lora_rank=rank,
    lora_alpha=cfg.lora_alpha,
    name=name,
  )


class Attention(nn.Module):
  cfg: ModelConfig

  @nn.compact
  def __call__(self, x_btd, positions_bt, mask_bts, cache_kv=None, index=None):
    cfg = self.cfg
    dtype = jnp.dtype(cfg.dtype)
    h, kv, dh = cfg.heads, cfg.n_kv_heads, cfg.head_dim
    q_bthd = _linear(cfg, "query", (h, dh), ("embed", "heads", "kv"), use_bias=cfg.qkv_bias)(x_btd)
    k_btkd = _linear(cfg, "key", (kv, dh), ("embed", "kv_heads", "kv"), use_bias=cfg.qkv_bias)(
      x_btd
    )
    v_btkd = _linear(cfg, "value", (kv, dh), ("embed", "kv_heads", "kv"), use_bias=cfg.qkv_bias)(
      x_btd
    )
    q_bthd = rope(q_bthd, positions_bt, cfg.rope_theta)
    k_btkd = rope(k_btkd, positions_bt, cfg.rope_theta)
    new_kv = None
    if cache_kv is not None:
      k_cache, v_cache = cache_kv
      k_btkd, v_btkd = write_cache(k_cache, k_btkd, index), write_cache(v_cache, v_btkd, index)
      new_kv = (k_btkd, v_btkd)
    b, t = q_bthd.shape[:2]
    q_btkgd = q_bthd.reshape(b, t, kv, h // kv, dh)
    logits_bkgts = jnp.einsum("btkgd,bskd->bkgts", q_btkgd, k_btkd.astype(dtype)).astype(
      jnp.float32
    ) / jnp.sqrt(dh).astype(jnp.float32)
    logits_bkgts = jnp.where(mask_bts[:, None, None], logits_bkgts, _NEG_INF)
    probs_bkgts = jax.nn.softmax(logits_bkgts, axis=-1).astype(dtype)
    out_bthd = jnp.einsum("bkgts,bskd->btkgd", probs_bkgts, v_btkd.astype(dtype)).reshape(
      b, t, h, dh
    )
    out_btd = _linear(cfg, "out", (cfg.width,), ("heads", "kv", "embed"), n_in=2)(out_bthd)
    return out_btd, new_kv


class Block(nn.Module):
  cfg: ModelConfig

  @nn.compact
  def __call__(self, x_btd, positions_bt, mask_bts, cache_kv=None, index=None):
    cfg = self.cfg
    dtype = jnp.dtype(cfg.dtype)
    h_btd, new_kv = Attention(cfg, name="attn")(
      RMSNorm(cfg.norm_eps, dtype, name="norm_attn")(x_btd), positions_bt, mask_bts, cache_kv, index
    )
    x_btd = x_btd + h_btd
    h_btd = RMSNorm(cfg.norm_eps, dtype, name="norm_mlp")(x_btd)
    f = cfg.ffn_dim
    gate_btf = _linear(cfg, "gate", (f,), ("embed", "mlp"))(h_btd)
    up_btf = _linear(cfg, "up", (f,), ("embed", "mlp"))(h_btd)
    h_btd = _linear(cfg, "down", (cfg.width,), ("mlp", "embed"))(nn.silu(gate_btf) * up_btf)
    x_btd = nn.with_logical_constraint(x_btd + h_btd, ("batch", "length", "act_embed"))
    return x_btd, new_kv


class LlamaLM(nn.Module):
  """Next-token logits [B, t, V] for the t new token slots, and the updated cache.

  Args (of __call__): as `TransformerLM.__call__`. `positions_bt` are the rotary positions
  of the new tokens (memory slots, if given, come first and are not rotated).
  """

  cfg: ModelConfig

  @nn.compact
  def __call__(
    self,
    tokens_bt,
    positions_bt,
    mask_bts,
    memory_bmd=None,
    cache=None,
    index=0,
    with_values: bool = False,
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
    x_btd = embed(tokens_bt)
    n_mem = 0
    if cfg.memory_slots:
      # As in TransformerLM: the projection always exists, so memory is always given (rows
      # without memory pass zero or all-invalid slots).
      mem_dim = cfg.memory_dim or cfg.width
      if memory_bmd is None:
        memory_bmd = jnp.zeros((tokens_bt.shape[0], 0, mem_dim), dtype)
      mem_bmd = Linear((cfg.width,), (None, "embed"), dtype=dtype, name="memory_in")(memory_bmd)
      n_mem = mem_bmd.shape[1]
      x_btd = jnp.concatenate([mem_bmd, x_btd], axis=1)
      # Position 0 is the identity rotation: memory keys carry no position.
      positions_bt = jnp.concatenate(
        [jnp.zeros((tokens_bt.shape[0], n_mem), positions_bt.dtype), positions_bt], axis=1
      )
    elif memory_bmd is not None:
      raise ValueError("memory given but model.memory_slots == 0")
    x_btd = nn.with_logical_constraint(x_btd, ("batch", "length", "act_embed"))
    new_k, new_v = [], []
    for i in range(cfg.depth):
      layer_kv = None if cache is None else (cache.k[i], cache.v[i])
      x_btd, kv = Block(cfg, name=f"block_{i}")(x_btd, positions_bt, mask_bts, layer_kv, index)
      if kv is not None:
        new_k.append(kv[0])
        new_v.append(kv[1])
    x_btd = RMSNorm(cfg.norm_eps, dtype, name="norm_out")(x_btd[:, n_mem:])
    if cfg.tie_embeddings:
      logits_btv = embed.attend(x_btd)
    else:
      logits_btv = Linear((cfg.vocab_size,), ("embed", "vocab"), dtype=dtype, name="lm_head")(x_btd)
    logits_btv = logits_btv.astype(jnp.float32)
    new_cache = KVCache(tuple(new_k), tuple(new_v)) if cache is not None else None
    if cfg.value_head:
      values_bt = Linear((1,), ("embed", None), dtype=dtype, name="value_head")(x_btd)[..., 0]
      if with_values:
        return logits_btv, new_cache, values_bt.astype(jnp.float32)
    elif with_values:
      raise ValueError("values asked for, but model.value_head is False")
    return logits_btv, new_cache
