"""Policy models, chosen by `ModelConfig.arch`.

Both families share one interface (see `TransformerLM.__call__`) and one KV-cache type, so
the sampler and the learner never name a family; they call `make_model` and `init_cache`.
"""

from __future__ import annotations

import jax.numpy as jnp

from sao_jax.config import ModelConfig
from sao_jax.models import llama, transformer
from sao_jax.models.transformer import KVCache

_FAMILIES = {"gpt": (transformer, transformer.TransformerLM), "llama": (llama, llama.LlamaLM)}


def make_model(cfg: ModelConfig):
  """The flax module of `cfg.arch`: TransformerLM ("gpt") or LlamaLM ("llama")."""
  return _FAMILIES[cfg.arch][1](cfg)


def init_cache(cfg: ModelConfig, batch: int, length: int, dtype=jnp.float32) -> KVCache:
  """Zero KV cache of the model `cfg` describes (a Llama-family cache holds kv_heads heads)."""
  return _FAMILIES[cfg.arch][0].init_cache(cfg, batch, length, dtype)
