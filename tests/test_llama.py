"""Llama-family model behind the common interface: config selection, sampler/learner log-prob
agreement (f32 and bf16), memory prefix, GQA cache, sharded forward, LoRA adapters."""

from __future__ import annotations

import dataclasses
import functools
import io

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from test_sampling import LOGP_ATOL

from sao_jax.batches import SFTBatch
from sao_jax.config import Config, ConfigError, MeshConfig, ModelConfig
from sao_jax.learner import make_optimizer, make_sft_update
from sao_jax.models import init_cache, lora, make_model
from sao_jax.models.llama import LlamaLM
from sao_jax.models.transformer import TransformerLM
from sao_jax.packing import encode_prompts, encode_targets
from sao_jax.runners.compiled import compile_programs
from sao_jax.sampling import completion_logprobs, sample
from sao_jax.sharding import logical_shardings, make_mesh
from sao_jax.tokenizer import CharTokenizer
from sao_jax.transport.params import flatten

TOK = CharTokenizer()
# One layer keeps compile times small; the two-layer fixtures in test_hf.py cover stacking.
CFG = ModelConfig(
  vocab_size=TOK.vocab_size,
  width=32,
  depth=1,
  heads=4,
  kv_heads=2,
  mlp_dim=48,
  max_len=64,
  arch="llama",
  qkv_bias=True,
  tie_embeddings=False,
  rope_theta=500.0,
  norm_eps=1e-5,
)


def _init_args(cfg):
  tokens = jnp.zeros((1, 4), jnp.int32)
  mask = jnp.tril(jnp.ones((4, 4), bool))[None]
  memory = jnp.zeros((1, 0, cfg.memory_dim)) if cfg.memory_slots else None
  return tokens, tokens, mask, memory


def _init(cfg, seed=0):
  model = make_model(cfg)
  params = jax.jit(model.init)(jax.random.key(seed), *_init_args(cfg))["params"]
  return model, nn.meta.unbox(params)


def _prompts(n=4):
  texts = ["Ann had 7 eggs, got 5. Eggs?", "1+1", "Tom had 12 keys, lost 3, won 4. Keys?", "x"]
  return encode_prompts(TOK, texts[:n], 40)


def test_config_selects_the_family_and_validates():
  assert isinstance(make_model(ModelConfig()), TransformerLM)  # default: unchanged GPT model
  assert isinstance(make_model(CFG), LlamaLM)
  assert CFG.n_kv_heads == 2 and CFG.head_dim == 8 and CFG.ffn_dim == 48
  for bad, msg in [
    (dict(kv_heads=2), "only apply to arch='llama'"),
    (dict(lora_rank=4), "only apply to arch='llama'"),
    (dict(arch="mamba"), "model.arch 'mamba' unknown"),
    (dict(arch="llama", kv_heads=3), "not divisible by kv_heads 3"),
    (dict(arch="llama", heads=8, width=24), "even head dim"),
    (dict(arch="llama", lora_rank=2, lora_targets=("qkv",)), "lora_targets"),
  ]:
    with pytest.raises(ConfigError, match=msg):
      ModelConfig(**bad)
  cache = init_cache(CFG, 3, 10, jnp.bfloat16)
  assert len(cache.k) == 1 and cache.k[0].shape == (3, 10, 2, 8)  # kv heads, not heads
  assert cache.k[0].dtype == jnp.bfloat16


def test_recorded_logprobs_equal_recomputed():
  """With a memory prefix (partly invalid) and the value head. (bf16: the GPT model's test in
  test_sampling.py, and bf16 logits of a real checkpoint in test_hf.py.)"""
  cfg = dataclasses.replace(CFG, memory_slots=4, memory_dim=8, value_head=True)
  model, params = _init(cfg)
  assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(params))
  prompt, pvalid = _prompts()
  kw = dict(
    memory_bmd=jax.random.normal(jax.random.key(1), (4, 4, 8)),
    memory_valid_bm=np.array([[True] * 4, [True, True, False, False], [False] * 4, [True] * 4]),
  )
  out = jax.jit(
    functools.partial(
      sample, model, max_new_tokens=16, eos_id=TOK.eos_id, pad_id=TOK.pad_id, temperature=0.8
    )
  )(params, prompt, pvalid, jax.random.key(2), **kw)
  out = jax.device_get(out)
  logprobs = jax.jit(
    functools.partial(completion_logprobs, model, temperature=0.8, with_value=True)
  )
  result = logprobs(params, prompt, pvalid, out.tokens_bt, out.valid_bt, **kw)
  np.testing.assert_allclose(out.logp_bt, result.logp_bt, atol=LOGP_ATOL)
  assert result.values_b.shape == (4,)
  kw["memory_bmd"] = jax.random.normal(jax.random.key(3), (4, 4, 8))  # (a scale would be
  # normalised away by the one layer's RMSNorm)
  other = logprobs(params, prompt, pvalid, out.tokens_bt, out.valid_bt, **kw).logp_bt
  moved = np.abs(np.asarray(other) - np.asarray(result.logp_bt)).max(axis=1)
  assert moved[0] > 1e-3 and moved[2] < 1e-6  # row 2 has no valid memory: unaffected


def _sft_batch():
  texts = [f"Ann had {i} eggs, got {i + 2}. Eggs?" for i in range(8)]
  prompt, pvalid = encode_prompts(TOK, texts, 40)
  tokens, valid = encode_targets(
    TOK, [f"{i}+{i + 2}={2 * i + 2};#{2 * i + 2}" for i in range(8)], 14
  )
  return SFTBatch(
    prompt_bp=prompt,
    prompt_valid_bp=pvalid,
    tokens_bt=tokens,
    valid_bt=valid,
    weight_b=np.ones(8, np.float32),
  )


def _sft_steps(cfg: Config, tx, steps):
  model = make_model(cfg.model)
  progs = compile_programs(
    cfg,
    model,
    tx,
    make_sft_update(model, tx),
    with_ref=False,
    prompt_len=40,
    max_new_tokens=14,
    temperature=1.0,
    eos_id=TOK.eos_id,
    pad_id=TOK.pad_id,
  )
  state = progs.init(jax.random.key(0))
  init_params = jax.device_get(state.params)
  batch = progs.shard_batch(_sft_batch())
  losses = []
  for _ in range(steps):
    state, metrics = progs.update(state, batch)
    losses.append(float(metrics["loss"]))
  return init_params, state, losses


@pytest.mark.skipif(len(jax.devices()) < 8, reason="needs the fake 8-device mesh")
def test_sharded_forward_equals_single_device():
  """heads and kv_heads split over 'tensor', embed over 'fsdp', batch over 'data'."""
  mesh_cfg = MeshConfig(shape=(2, 2, 2))
  mesh = make_mesh(mesh_cfg)
  model = make_model(CFG)
  boxed = jax.eval_shape(lambda: model.init(jax.random.key(0), *_init_args(CFG))["params"])
  shardings = logical_shardings(boxed, mesh, mesh_cfg.rules)
  _, params = _init(CFG)
  sharded = jax.device_put(params, shardings)
  assert sharded["block_0"]["attn"]["key"]["kernel"].sharding.spec == P("fsdp", "tensor", None)
  prompt, pvalid = _prompts()
  tokens, valid = encode_targets(TOK, ["1+1=2;#2", "3", "7-2=5;#5", "#0"], 10)

  def fn(params, prompt, pvalid, tokens, valid):
    with nn.logical_axis_rules(list(mesh_cfg.rules)):
      return completion_logprobs(model, params, prompt, pvalid, tokens, valid).logp_bt

  rows = NamedSharding(mesh, P(("data", "fsdp")))
  out = jax.jit(fn, in_shardings=(shardings,) + (rows,) * 4)(sharded, prompt, pvalid, tokens, valid)
  np.testing.assert_allclose(
    np.asarray(out), np.asarray(jax.jit(fn)(params, prompt, pvalid, tokens, valid)), atol=1e-5
  )


def test_lora_trains_only_adapters_and_merges_exactly():
  cfg = Config(
    model=dataclasses.replace(
      CFG, lora_rank=4, lora_alpha=8.0, lora_targets=("query", "value", "down")
    )
  )
  tx = lora.freeze_base(make_optimizer(cfg.sft.optim))
  init_params, state, losses = _sft_steps(cfg, tx, 3)
  assert losses[-1] < losses[0]
  params = jax.device_get(state.params)
  labels = lora.adapter_labels(params)
  n_adapters = 0
  for (path, new), old, label in zip(
    jax.tree_util.tree_leaves_with_path(params),
    jax.tree.leaves(init_params),
    jax.tree.leaves(labels),
    strict=True,
  ):
    if label == "frozen":
      np.testing.assert_array_equal(new, old, err_msg=jax.tree_util.keystr(path))
    else:
      n_adapters += 1
      assert not np.array_equal(new, old), jax.tree_util.keystr(path)
  assert n_adapters == 2 * 3 * CFG.depth
  # Optimizer moments exist for the adapters only.
  adapter_size = sum(x.size for x in jax.tree.leaves(lora.adapters(params)))
  assert sum(x.size for x in jax.tree.leaves(state.opt_state) if x.ndim) == 2 * adapter_size

  # Publishing adapters only: a small fraction of the bytes, and it rebuilds the tree.
  def npz_bytes(tree):
    buf = io.BytesIO()
    np.savez(buf, **flatten(tree))
    return buf.getbuffer().nbytes

  sub = lora.adapters(params)
  assert npz_bytes(sub) < 0.2 * npz_bytes(params)
  rebuilt = lora.with_adapters(init_params, sub)
  for a, b in zip(jax.tree.leaves(rebuilt), jax.tree.leaves(params), strict=True):
    np.testing.assert_array_equal(a, b)
  with pytest.raises(KeyError, match="lacks"):
    lora.with_adapters(init_params, {})

  # Merging (checked against outputs in test_hf.test_export_merges_lora) drops the adapters.
  merged = lora.merge(params, cfg.model)
  assert not lora.has_adapters(merged)
  assert jax.tree.structure(merged) == jax.tree.structure(
    jax.eval_shape(lambda: _init(dataclasses.replace(cfg.model, lora_rank=0))[1])
  )
