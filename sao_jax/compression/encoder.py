"""Stage 1: a bidirectional (BERT-style) transformer that pools each step into m vectors.

A step is the tokens that step added to the context (its observation and the policy's
action), truncated/padded to `step_len`. The encoder is a post-LayerNorm BERT block stack
(token + position embeddings, full bidirectional self-attention over the step's valid tokens,
GELU MLP); `enc_width/enc_depth/enc_heads` go from tiny (default 64/2/4) up to BERT-base
(768/12/12). Pooling uses m learned queries attending over the step's token states (a
Perceiver/Set-Transformer "PMA" pool), then a projection to `dim` and a LayerNorm, so memory
vectors have a bounded, stable range for the INT8 stage.

Why m vectors of size `dim` and not the [CLS] state: the memory is what the policy attends
to, so its size (m * dim, >= 80% below step_len * width of the token embeddings, checked by
the config) is the compression knob, independent of the encoder's width.

The auxiliary loss (`reconstruction_loss`) decodes the step's tokens back from its m vectors
(one linear map per token position): it forces the vectors to keep the step's content before
the RL signal, which is sparse (a reward 32+ steps later), has learned anything.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from sao_jax.config import CompressionConfig


class _BertLayer(nn.Module):
  width: int
  heads: int
  mlp_ratio: int

  @nn.compact
  def __call__(self, x_bld, mask_b11l):
    h = nn.MultiHeadDotProductAttention(
      num_heads=self.heads, qkv_features=self.width, name="attention"
    )(x_bld, x_bld, mask=mask_b11l)
    x_bld = nn.LayerNorm(name="attention_norm")(x_bld + h)
    h = nn.Dense(self.width * self.mlp_ratio, name="intermediate")(x_bld)
    h = nn.Dense(self.width, name="output")(nn.gelu(h, approximate=False))
    return nn.LayerNorm(name="output_norm")(x_bld + h)


class StepEncoder(nn.Module):
  """tokens [B, L] int32, valid [B, L] bool -> memory vectors [B, m, dim] float32."""

  cfg: CompressionConfig
  vocab_size: int

  @nn.compact
  def __call__(self, tokens_bl, valid_bl):
    cfg = self.cfg
    length = tokens_bl.shape[-1]
    x = nn.Embed(self.vocab_size, cfg.enc_width, name="word_embeddings")(tokens_bl)
    pos = self.param(
      "position_embeddings", nn.initializers.normal(0.02), (cfg.step_len, cfg.enc_width)
    )
    x = nn.LayerNorm(name="embeddings_norm")(x + pos[None, :length])
    mask = valid_bl[:, None, None, :]
    for i in range(cfg.enc_depth):
      x = _BertLayer(cfg.enc_width, cfg.enc_heads, cfg.enc_mlp_ratio, name=f"layer_{i}")(x, mask)
    queries = self.param(
      "pool_queries", nn.initializers.normal(0.02), (cfg.vectors_per_step, cfg.enc_width)
    )
    q = jnp.broadcast_to(queries[None], (x.shape[0],) + queries.shape)
    pooled = nn.MultiHeadDotProductAttention(num_heads=cfg.enc_heads, name="pool")(q, x, mask=mask)
    return nn.LayerNorm(name="out_norm")(nn.Dense(cfg.dim, name="out")(pooled))


class StepDecoder(nn.Module):
  """Auxiliary decoder: m vectors [B, m, dim] -> token logits [B, L, vocab]."""

  cfg: CompressionConfig
  vocab_size: int

  @nn.compact
  def __call__(self, vec_bmd):
    flat = vec_bmd.reshape(vec_bmd.shape[0], -1)
    h = nn.gelu(nn.Dense(self.cfg.enc_width, name="hidden")(flat))
    logits = nn.Dense(self.cfg.step_len * self.vocab_size, name="logits")(h)
    return logits.reshape(flat.shape[0], self.cfg.step_len, self.vocab_size)


def reconstruction_loss(
  logits_blv: jax.Array, tokens_bl: jax.Array, valid_bl: jax.Array, weight_b: jax.Array
) -> jax.Array:
  """Mean token cross-entropy of decoding each step from its vectors (valid tokens, rows
  weighted by `weight_b`, e.g. 0 for padding steps)."""
  logp = jax.nn.log_softmax(logits_blv, axis=-1)
  nll_bl = -jnp.take_along_axis(logp, tokens_bl[..., None], axis=-1)[..., 0]
  w_bl = valid_bl * weight_b[:, None]
  return jnp.sum(nll_bl * w_bl) / jnp.maximum(jnp.sum(w_bl), 1.0)
