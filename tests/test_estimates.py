"""sao_jax.estimates: the arithmetic against hand computations and against real parameter
trees."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import pytest

from sao_jax import estimates as E
from sao_jax.config import (
  Config,
  EvalConfig,
  ModelConfig,
  RLConfig,
  SamplersConfig,
  SAOConfig,
  SFTConfig,
)
from sao_jax.models import make_model

# D=8, 1 layer, 2 heads of 4, 1 kv head, MLP 16, vocabulary 10, q/k/v biases, tied.
TINY = ModelConfig(
  arch="llama", vocab_size=10, width=8, depth=1, heads=2, kv_heads=1, mlp_dim=16, qkv_bias=True
)
# embed 10*8, norms 2*8, q 8*8, k 8*4, v 8*4, out 8*8, biases 8+4+4, MLP 3*8*16, final norm 8
TINY_PARAMS = 80 + 16 + 64 + 32 + 32 + 64 + 16 + 384 + 8


def _real_count(m: ModelConfig) -> int:
  model = make_model(m)
  tokens = jnp.zeros((1, 4), jnp.int32)
  mask = jnp.ones((1, 4, 4), bool)
  memory = jnp.zeros((1, 0, m.memory_dim or m.width)) if m.memory_slots else None
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), tokens, tokens, mask, memory))
  return sum(math.prod(x.shape) for x in jax.tree.leaves(shapes))


def test_param_counts_by_hand():
  c = E.param_counts(TINY)
  assert c == {"total": TINY_PARAMS, "lora": 0, "trainable": TINY_PARAMS, "per_token": TINY_PARAMS}
  untied = E.param_counts(dataclasses.replace(TINY, tie_embeddings=False))
  # the output layer adds 8*10; the input lookup (10*8) multiplies nothing
  assert untied["total"] == TINY_PARAMS + 80 and untied["per_token"] == TINY_PARAMS
  # rank 2 on q (8->8) and down (16->8): 2*(8+8) + 2*(16+8)
  lo = E.param_counts(dataclasses.replace(TINY, lora_rank=2, lora_targets=("query", "down")))
  assert lo["lora"] == 80 and lo["trainable"] == 80 and lo["total"] == TINY_PARAMS + 80


@pytest.mark.parametrize(
  "m",
  [
    TINY,
    dataclasses.replace(TINY, depth=2, tie_embeddings=False, qkv_bias=False, value_head=True),
    dataclasses.replace(TINY, lora_rank=3, memory_slots=2, memory_dim=6),
    ModelConfig(vocab_size=20, width=16, depth=2, heads=2, max_len=12, value_head=True),
  ],
  ids=["llama", "llama-untied-value", "llama-lora-memory", "gpt"],
)
def test_param_counts_match_the_models(m):
  assert E.param_counts(m)["total"] == _real_count(m)


def _cfg(**kw) -> Config:
  return Config(
    model=TINY,
    sft=SFTConfig(steps=1, batch_size=4),
    rl=RLConfig(algorithm="sao", steps=1, max_new_tokens=6),
    sao=SAOConfig(sampler_slots=3, refill_rows=3, batch_size=5),
    samplers=SamplersConfig(num=2),
    eval=EvalConfig(num_problems=1, batch_size=7),
    **kw,
  )


def test_estimate_by_hand():
  dev = E.Device("test", 1, peak_flops=1e9, bytes_per_s=1e6, memory_bytes=None, source="test")
  est = E.estimate(_cfg(), TINY, prompt_len=2, target_len=3, device=dev)
  n = TINY_PARAMS
  lrn = est["learner_bytes_per_device"]
  assert (lrn["params"], lrn["grads"], lrn["adam"], lrn["ref_params"]) == (4 * n, 4 * n, 8 * n, 0)
  # KV: rows x (P + T) x layers x (k, v) x kv heads x head dim x 4 bytes
  kv_per_row = (2 + 6) * 1 * 2 * 1 * 4 * 4
  assert lrn["eval_kv_cache"] == 7 * kv_per_row
  # per token and layer 4 (7*8 + 3*4 + 4*16) = 528 bytes, + attention 2 heads x K x 16;
  # logits rows x 10 x (8 K + 8 T) in float32 (SFT computes no entropy: 8 K + 4 T)
  rl_act = 5 * 8 * 1 * (528 + 2 * 8 * 16) + 5 * 10 * (8 * 8 + 8 * 6)
  sft_act = 4 * 5 * 1 * (528 + 2 * 5 * 16) + 4 * 10 * (8 * 5 + 4 * 3)
  assert est["phases"]["rl"]["activations"] == rl_act
  assert est["phases"]["sft"]["activations"] == sft_act
  assert lrn["peak_activations"] == max(rl_act, sft_act)
  assert lrn["total"] == 16 * n + 7 * kv_per_row + max(rl_act, sft_act)
  rl = est["phases"]["rl"]
  assert rl["tokens_per_update"] == 5 * 8 and rl["train_flops_per_update"] == 6 * n * 40
  assert rl["update_s_at_peak"] == pytest.approx(6 * n * 40 / 1e9)
  assert est["train_tokens_per_s_at_peak"] == pytest.approx(1e9 / (6 * n))
  smp = est["sampler_bytes"]
  assert smp["kv_cache"] == 3 * kv_per_row and smp["per_process"] == 4 * n + 3 * kv_per_row
  # decode: FLOPs allow 1e9 / 2n tokens/s; bandwidth 3 slots x 1e6 / (4n + KV) is lower
  assert smp["decode_tokens_per_s_at_peak"] == pytest.approx(3e6 / (4 * n + 3 * kv_per_row))
  assert smp["decode_bound"] == "memory bandwidth"
  assert (smp["published_bytes"], smp["publish_every"]) == (4 * n, 1)
  assert est["shapes"] == {"prompt_tokens": 2, "solution_tokens": 3, "kv_slots": 8}


def test_bf16_lora_kl_and_mesh():
  m = dataclasses.replace(TINY, dtype="bfloat16", lora_rank=2, lora_targets=("query", "down"))
  cfg = dataclasses.replace(
    _cfg(), model=m, rl=dataclasses.replace(_cfg().rl, kl_coef=0.1), sft=SFTConfig()
  )
  cfg = dataclasses.replace(cfg, mesh=dataclasses.replace(cfg.mesh, shape=(-1, 2, 1)))
  dev = E.Device("test", 4, peak_flops=None, bytes_per_s=None, memory_bytes=None, source="?")
  est = E.estimate(cfg, m, prompt_len=2, target_len=3, device=dev)
  n = TINY_PARAMS + 80
  lrn = est["learner_bytes_per_device"]
  # params, grads, reference over fsdp=2; Adam moments for the 80 adapter parameters only
  assert (lrn["params"], lrn["grads"], lrn["ref_params"], lrn["adam"]) == (
    2 * n,
    2 * n,
    2 * n,
    8 * 80 // 2,
  )
  assert list(est["phases"]) == ["rl"]
  # the batch of 5 rows over data 2 x fsdp 2: 2 rows per device; bf16 attention 12 bytes;
  # logits (8 + 2) K + 8 T per row and vocabulary entry
  assert est["phases"]["rl"]["activations"] == 2 * 8 * (528 + 2 * 8 * 12) + 2 * 10 * (
    10 * 8 + 8 * 6
  )
  assert "update_s_at_peak" not in est["phases"]["rl"] and "train_tokens_per_s_at_peak" not in est
  assert "speed     not estimated" in E.format_block(est)


def test_devices():
  h100 = E.device_for("NVIDIA H100 80GB HBM3", 8, "bfloat16", 80 * 2**30)
  assert (h100.peak_flops, h100.bytes_per_s, h100.count) == (989e12, 3.35e12, 8)
  assert E.device_for("NVIDIA H100 80GB HBM3", 1, "float32", None).peak_flops == 494e12
  assert E.device_for("NVIDIA A100-SXM4-40GB", 1, "bfloat16", None).bytes_per_s == 1.56e12
  assert E.device_for("TPU v5 lite", 1, "bfloat16", None).peak_flops == 197e12
  cpu = E.device_for("cpu", 8, "float32", None, cpu_cores=2)
  assert cpu.peak_flops == 2 * E.CPU_FLOPS_PER_CORE / 8 and "rough" in cpu.source
  unknown = E.device_for("Mystery 9000", 1, "bfloat16", None)
  assert unknown.peak_flops is None and "unknown" in unknown.source
  here = E.runtime_device(jax.devices(), "float32", 2)
  assert here.count == len(jax.devices()) and here.kind == jax.devices()[0].device_kind


def test_format_block():
  dev = E.Device("test", 1, peak_flops=1e12, bytes_per_s=1e9, memory_bytes=2 * 10**9, source="t")
  est = E.estimate(_cfg(), TINY, prompt_len=2, target_len=3, device=dev)
  text = E.format_block(est)
  assert text.startswith("estimates (") and "not measured" in text
  assert f"params    {TINY_PARAMS} (trainable {TINY_PARAMS})" in text
  assert "device reports 2.00 GB" in text and "samplers  2 x (" in text
  assert "decoded tokens/s per process (memory bandwidth-bound)" in text
  assert f"publish   {4 * TINY_PARAMS / 1e3:.1f} kB of params written" in text
  assert len(text.splitlines()) == 8
