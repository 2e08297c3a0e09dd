"""Memory and throughput estimates of a run, from its config's shapes alone (nothing measured).

`estimate(cfg, ...)` is pure arithmetic over the config, the run's token budget and a
`Device` (its assumed peak FLOP/s and memory bandwidth); `format_block` is the compact text
the runner prints before training starts. Every number is an estimate; `ASSUMPTIONS` and the
result's "assumptions" say what it assumes.

Counts (N: parameters; D width, L layers, H heads, KV key/value heads, Dh head dim, F MLP
width, V vocabulary, r LoRA rank; B rows of a learner batch, P prompt tokens, T completion
tokens, K = P + T cache slots per row):
  parameters        exact for both model families, from the config (see `param_counts`)
  learner memory    params f32 4N + gradients f32 4N + Adam moments f32 8 N_train
                    (+ reference params 4N with a KL term) + activations + eval KV cache
  activations       what the update's backward pass keeps, per token and layer:
                    4 (7D + 3 KV Dh + 4F) bytes for Llama (float32 intermediates of the norms
                    and rotary embeddings, q/k/v, gate/up/silu/product), 4 (6D + 2 KV Dh + 2F)
                    for GPT, plus H K (8 + 2e) for attention scores and probabilities (e:
                    bytes of the compute dtype); plus the logits B V (K (8 + e') + 4T x):
                    the [B, K, V] logits in float32 and their float32 gradient (e' = 2: the
                    bf16 logits too, when computing in bf16; else 0), the float32
                    log-softmax of the T completion positions and, in RL updates (which
                    report the entropy), its exponential (x = 2; SFT: x = 1). Fitted to the
                    temporaries (less the gradients) that XLA's CPU compiler allocates for
                    the SAO and SFT updates of Llama-family models (the ratios are what
                    experiments/check_estimates.py measures); XLA
                    on a GPU or TPU fuses differently
  KV cache          rows x K x L x 2 x KV x Dh x e (keys and values)
  training FLOPs    6 N_tok per token of the B x K each update processes (N_tok: parameters
                    that multiply each token, i.e. all but the input embedding lookup)
  decode            a token costs 2 N_tok FLOPs; one decode step of S slots also reads the
                    f32 params (4 N_tok bytes) and the slots' KV cache: tokens/s <=
                    min(peak / 2 N_tok, S x bandwidth / (4 N_tok + KV bytes))
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from sao_jax.config import Config, ModelConfig

ASSUMPTIONS = (
  "estimates from the config's shapes, not measurements",
  "activations as XLA's CPU compiler holds them (no rematerialisation); a GPU or TPU "
  "compiler fuses differently",
  "LoRA: Adam moments for the adapters only, but gradients of the frozen base are still "
  "computed (the update's gradient norm and finiteness check read every gradient), so "
  "gradient bytes and training FLOPs are those of full fine-tuning",
  "parameters and optimizer state split over the mesh's fsdp x tensor axes, batches over "
  "data x fsdp; every device holds the rest",
  "training FLOPs 6 N per token, attention-score FLOPs (12 L D K per token) not counted; "
  "decode 2 N per token; prefill not counted",
  "tokens/s at the assumed peak are upper bounds: well-tuned training reaches 30-50 % of it",
  "samplers: each process holds the f32 params and its slots' KV cache",
  "publishing: the whole float32 parameter tree goes through a file, LoRA runs included",
)

# Peak dense FLOP/s per device (bf16; float32 compute: TF32 on NVIDIA GPUs, which XLA uses
# for float32 matmuls by default; TPUs run float32 matmuls as bf16 passes at the bf16 peak)
# and HBM bandwidth in bytes/s, from the vendors' data sheets. Matched by substring of
# `device_kind`, most specific first.
_PEAKS: tuple[tuple[str, float, float, float], ...] = (
  # (device_kind substring, bf16 FLOP/s, float32 FLOP/s, bytes/s)
  ("h200", 989e12, 494e12, 4.8e12),
  ("h100 pcie", 756e12, 378e12, 2.0e12),
  ("h100", 989e12, 494e12, 3.35e12),
  ("a100-sxm4-40gb", 312e12, 156e12, 1.56e12),
  ("a100-pcie-40gb", 312e12, 156e12, 1.56e12),
  ("a100", 312e12, 156e12, 2.0e12),
  ("l4", 121e12, 60e12, 0.3e12),
  ("tpu v6", 918e12, 918e12, 1.64e12),
  ("tpu v5 lite", 197e12, 197e12, 0.82e12),
  ("tpu v5", 459e12, 459e12, 2.76e12),
  ("tpu v4", 275e12, 275e12, 1.2e12),
)
# A CPU has no data sheet number that means much here: a rough per-core figure.
CPU_FLOPS_PER_CORE = 50e9
CPU_BYTES_PER_S = 20e9

_BYTES = {"float32": 4, "bfloat16": 2}


@dataclasses.dataclass(frozen=True)
class Device:
  """What the estimates assume of the learner's devices. `peak_flops` and `bytes_per_s` are
  per device, None when the kind is unknown (no throughput estimate then); `memory_bytes`
  is what the runtime reports per device (None: not reported)."""

  kind: str
  count: int
  peak_flops: float | None
  bytes_per_s: float | None
  memory_bytes: int | None
  source: str


def device_for(kind: str, count: int, dtype: str, memory_bytes: int | None, cpu_cores: int = 1):
  """The `Device` of `count` devices of `kind` (jax's `device_kind`) computing in `dtype`."""
  low = kind.lower()
  if low == "cpu":
    return Device(
      kind,
      count,
      CPU_FLOPS_PER_CORE * cpu_cores / count,
      CPU_BYTES_PER_S / count,
      memory_bytes,
      f"CPU: a rough {CPU_FLOPS_PER_CORE / 1e9:.0f} GFLOP/s per core x {cpu_cores} cores and "
      f"{CPU_BYTES_PER_S / 1e9:.0f} GB/s, shared by the {count} device(s)",
    )
  for key, bf16, f32, bw in _PEAKS:
    if key in low:
      peak = bf16 if dtype == "bfloat16" else f32
      return Device(
        kind, count, peak, bw, memory_bytes, f"data-sheet peak of {key!r} ({dtype}), dense"
      )
  return Device(kind, count, None, None, memory_bytes, f"unknown device kind {kind!r}: no peak")


def runtime_device(devices: list, dtype: str, cpu_cores: int) -> Device:
  """`device_for` the first of `devices` (jax devices), with the memory it reports."""
  first = devices[0]
  memory = None
  try:
    stats = first.memory_stats() or {}
    memory = stats.get("bytes_limit")
  except (NotImplementedError, RuntimeError):
    pass
  return device_for(first.device_kind, len(devices), dtype, memory, cpu_cores)


def param_counts(m: ModelConfig) -> dict[str, int]:
  """Parameter counts of the model `m` describes (vocab_size resolved): total, the LoRA
  adapters, trainable (the adapters when LoRA is on, else all) and per_token (those that
  multiply each token: all but the input embedding lookup; a tied embedding counts once, as
  the output layer)."""
  d, v, f, depth = m.width, m.vocab_size, m.ffn_dim, m.depth
  h, kv, dh = m.heads, m.n_kv_heads, m.head_dim
  embed = v * d
  if m.arch == "gpt":
    block = 2 * d + 4 * d * d + 2 * d * f
    extra = m.max_len * d  # learned positions
    untied = 0
  else:
    block = 2 * d + d * h * dh + 2 * d * kv * dh + h * dh * d + 3 * d * f
    block += (h + 2 * kv) * dh if m.qkv_bias else 0
    extra = 0
    untied = 0 if m.tie_embeddings else d * v
  heads = (d if m.value_head else 0) + ((m.memory_dim or d) * d if m.memory_slots else 0)
  total = embed + untied + extra + depth * block + d + heads
  lora = 0
  if m.lora_rank:
    shapes = {
      "query": (d, h * dh),
      "key": (d, kv * dh),
      "value": (d, kv * dh),
      "out": (h * dh, d),
      "gate": (d, f),
      "up": (d, f),
      "down": (f, d),
    }
    lora = depth * sum(m.lora_rank * sum(shapes[t]) for t in m.lora_targets)
  per_token = total + lora - extra - (embed if untied else 0)
  return {
    "total": total + lora,
    "lora": lora,
    "trainable": lora if m.lora_rank else total,
    "per_token": per_token,
  }


def _mesh_split(cfg: Config, count: int) -> tuple[int, int]:
  """(parameter shards, batch shards) of the mesh over `count` devices."""
  shape = list(cfg.mesh.shape)
  if -1 in shape:
    known = math.prod(s for s in shape if s != -1)
    shape[shape.index(-1)] = max(count // known, 1)
  size = dict(zip(cfg.mesh.axes, shape, strict=True))
  return size.get("fsdp", 1) * size.get("tensor", 1), size.get("data", 1) * size.get("fsdp", 1)


def kv_bytes(m: ModelConfig, rows: int, slots: int) -> int:
  """KV cache of `rows` rows of `slots` positions each, in the compute dtype."""
  return rows * slots * m.depth * 2 * m.n_kv_heads * m.head_dim * _BYTES[m.dtype]


def activation_bytes(
  m: ModelConfig, rows: int, prompt: int, completion: int, *, rl: bool = True
) -> int:
  """What one learner batch of `rows` x (prompt + completion) tokens keeps for the backward
  pass (see the module docstring for the formula); `rl`: a policy-gradient update (it also
  computes the entropy), else supervised."""
  e, d, f = _BYTES[m.dtype], m.width, m.ffn_dim
  kvd = m.n_kv_heads * m.head_dim
  k = prompt + completion
  if m.arch == "llama":
    per_token = 4 * (7 * d + 3 * kvd + 4 * f)
  else:
    per_token = 4 * (6 * d + 2 * kvd + 2 * f)
  per_token += m.heads * k * (8 + 2 * e)
  logits = rows * m.vocab_size * (k * (8 + (e if e < 4 else 0)) + (8 if rl else 4) * completion)
  return rows * k * m.depth * per_token + logits


def _phases(cfg: Config, prompt_len: int, target_len: int) -> dict[str, tuple[int, int]]:
  """Learner phases that run: name -> (rows per update, completion tokens per row)."""
  out = {}
  if cfg.sft.steps or cfg.sft.max_seconds:
    out["sft"] = (cfg.sft.batch_size, target_len)
  if cfg.rl.steps or cfg.rl.max_seconds:
    rows = (
      cfg.sao.batch_size
      if cfg.rl.algorithm == "sao"
      else cfg.rl.prompts_per_step * cfg.rl.group_size
    )
    out["rl"] = (rows, cfg.rl.max_new_tokens)
  return out


def estimate(
  cfg: Config, m: ModelConfig, *, prompt_len: int, target_len: int, device: Device
) -> dict[str, Any]:
  """Estimates of a run of `cfg` whose policy is `m` (cfg.model with vocab_size resolved),
  for prompts of `prompt_len` tokens and worked solutions of up to `target_len` tokens, on
  `device`. Bytes are per device."""
  counts = param_counts(m)
  n, n_train, n_tok = counts["total"], counts["trainable"], counts["per_token"]
  param_shards, batch_shards = _mesh_split(cfg, device.count)
  k_rl = prompt_len + cfg.rl.max_new_tokens
  static = {
    "params": 4 * n,
    "grads": 4 * n,
    "adam": 8 * n_train,
    "ref_params": 4 * n if cfg.rl.kl_coef > 0 and (cfg.rl.steps or cfg.rl.max_seconds) else 0,
  }
  static = {k: v // param_shards for k, v in static.items()}
  eval_kv = kv_bytes(m, -(-cfg.eval.batch_size // batch_shards), k_rl)
  phases = {}
  for name, (rows, completion) in _phases(cfg, prompt_len, target_len).items():
    tokens = rows * (prompt_len + completion)
    phase = {
      "rows": rows,
      "tokens_per_update": tokens,
      "activations": activation_bytes(
        m, -(-rows // batch_shards), prompt_len, completion, rl=name == "rl"
      ),
      "train_flops_per_update": 6 * n_tok * tokens,
    }
    if not cfg.rl.uses_samplers and name == "rl" and cfg.rl.algorithm == "grpo":
      phase["sampling_kv_cache"] = kv_bytes(m, -(-rows // batch_shards), k_rl)
    if device.peak_flops:
      phase["update_s_at_peak"] = phase["train_flops_per_update"] / (
        device.peak_flops * device.count
      )
    phases[name] = phase
  peak = max((p["activations"] + p.get("sampling_kv_cache", 0) for p in phases.values()), default=0)
  learner = dict(static, eval_kv_cache=eval_kv, peak_activations=peak)
  learner["total"] = sum(static.values()) + eval_kv + peak
  out: dict[str, Any] = {
    "note": "estimates, not measurements; see assumptions",
    "device": dataclasses.asdict(device),
    "params": counts,
    "shapes": {"prompt_tokens": prompt_len, "solution_tokens": target_len, "kv_slots": k_rl},
    "learner_bytes_per_device": learner,
    "phases": phases,
    "assumptions": list(ASSUMPTIONS),
  }
  if cfg.compression.enabled:
    out["assumptions"].append("the compression modules (encoder, LSTM filter) are not counted")
  if cfg.rl.uses_samplers and (cfg.rl.steps or cfg.rl.max_seconds):
    slots = cfg.sao.sampler_slots
    cache = kv_bytes(m, slots, k_rl)
    sampler = {
      "processes": cfg.samplers.num,
      "slots": slots,
      "params": 4 * n,
      "kv_cache": cache,
      "per_process": 4 * n + cache,
      # the learner writes every float32 parameter (adapters and base alike) to a file that
      # each sampler reads, every sao.param_sync_every updates
      "published_bytes": 4 * n,
      "publish_every": cfg.sao.param_sync_every,
    }
    if device.peak_flops and device.bytes_per_s:
      flop_bound = device.peak_flops / (2 * n_tok)
      bw_bound = slots * device.bytes_per_s / (4 * n_tok + cache)
      sampler["decode_tokens_per_s_at_peak"] = min(flop_bound, bw_bound)
      sampler["decode_bound"] = "memory bandwidth" if bw_bound < flop_bound else "FLOPs"
    out["sampler_bytes"] = sampler
  if device.peak_flops:
    out["train_tokens_per_s_at_peak"] = device.peak_flops * device.count / (6 * n_tok)
  return out


def _gb(x: float) -> str:
  """Bytes in GB, or MB / kB when smaller (a tiny model's estimates are not all 0.00 GB)."""
  for unit, size in (("GB", 1e9), ("MB", 1e6)):
    if x >= size / 10:
      return f"{x / size:.2f} {unit}"
  return f"{x / 1e3:.1f} kB"


def _count(x: int) -> str:
  return f"{x / 1e9:.2f}B" if x >= 1e9 else f"{x / 1e6:.1f}M" if x >= 1e5 else str(x)


def format_block(est: dict[str, Any]) -> str:
  """The compact text block the runner prints (the JSON holds every number)."""
  p, dev, lrn = est["params"], est["device"], est["learner_bytes_per_device"]
  lines = ["estimates (from the config's shapes, not measured; assumptions in estimates.json):"]
  lora = f", LoRA adapters {_count(p['lora'])}" if p["lora"] else ""
  lines.append(
    f"  params    {_count(p['total'])} (trainable {_count(p['trainable'])}{lora}); per token "
    f"{_count(p['per_token'])}"
  )
  mem = (
    f"params {_gb(lrn['params'])} + grads {_gb(lrn['grads'])} + Adam {_gb(lrn['adam'])}"
    + (f" + ref {_gb(lrn['ref_params'])}" if lrn["ref_params"] else "")
    + f" + activations {_gb(lrn['peak_activations'])} + eval KV {_gb(lrn['eval_kv_cache'])}"
    + f" = {_gb(lrn['total'])} per device"
  )
  if dev["memory_bytes"]:
    mem += f" (device reports {_gb(dev['memory_bytes'])})"
  lines.append(f"  learner   {mem}")
  for name, ph in est["phases"].items():
    t = f"  {name:<9} {ph['rows']} rows, {ph['tokens_per_update']} tokens/update"
    t += f", activations {_gb(ph['activations'])}"
    if "update_s_at_peak" in ph:
      t += f", >= {ph['update_s_at_peak']:.3g} s/update at peak"
    lines.append(t)
  if "sampler_bytes" in est:
    sb = est["sampler_bytes"]
    t = (
      f"  samplers  {sb['processes']} x (params {_gb(sb['params'])} + KV {_gb(sb['kv_cache'])} "
      f"for {sb['slots']} slots) = {_gb(sb['processes'] * sb['per_process'])}"
    )
    if "decode_tokens_per_s_at_peak" in sb:
      t += (
        f"; <= {sb['decode_tokens_per_s_at_peak']:.3g} decoded tokens/s per process "
        f"({sb['decode_bound']}-bound)"
      )
    lines.append(t)
    lines.append(
      f"  publish   {_gb(sb['published_bytes'])} of params written for the samplers every "
      f"{sb['publish_every']} update(s)"
    )
  if "train_tokens_per_s_at_peak" in est:
    lines.append(
      f"  speed     <= {est['train_tokens_per_s_at_peak']:.3g} training tokens/s at peak on "
      f"{dev['count']} x {dev['kind']} ({dev['source']})"
    )
  else:
    lines.append(f"  speed     not estimated: {dev['source']}")
  return "\n".join(lines)
