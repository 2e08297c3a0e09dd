"""The memory estimates of `sao_jax.estimates` against XLA's compiled memory analysis.

For Llama-family learner updates (SAO and SFT; bf16 and f32; vocabulary-heavy,
attention-heavy, the layer shapes of Qwen2.5-0.5B; one with LoRA) it compiles the update on
one device, without running it, and compares:
  arguments    XLA's argument bytes (params, optimizer state, batch, tracker) against the
               estimate's params 4N + Adam 8 N_train
  temporaries  XLA's temporary bytes (the gradients and what the backward pass keeps)
               against the estimate's gradients 4N + `activation_bytes`
Ratio = XLA / estimate. On a CPU this checks the formulas against one compiler's choices;
XLA on a GPU or TPU fuses differently.

Run (~8 min on a shared 2-core CPU, all compilation; writes results/check_estimates.json):
  python experiments/check_estimates.py
"""

from __future__ import annotations

import argparse
import pathlib
import time

import jax

from sao_jax import estimates
from sao_jax.batches import SAOBatch, SFTBatch
from sao_jax.config import Config, MeshConfig, ModelConfig, RLConfig, SAOConfig
from sao_jax.learner import make_optimizer, make_sao_update, make_sft_update
from sao_jax.models import lora, make_model
from sao_jax.results_file import ResultFile
from sao_jax.runners.compiled import compile_learner
from sao_jax.sharding import make_mesh

ROOT = pathlib.Path(__file__).resolve().parents[1]
SMALL = dict(width=256, heads=4, kv_heads=2, mlp_dim=768)
QWEN05_LAYER = dict(width=896, heads=14, kv_heads=2, mlp_dim=4864, vocab_size=151936)
# (name, update, model fields, (rows, prompt tokens, completion tokens))
CASES = [
  ("vocab-heavy", "sao", dict(SMALL, vocab_size=32000), (8, 64, 128)),
  ("vocab-heavy f32", "sao", dict(SMALL, vocab_size=32000, dtype="float32"), (8, 64, 128)),
  ("vocab-heavy sft", "sft", dict(SMALL, vocab_size=32000), (8, 64, 128)),
  ("attention-heavy", "sao", dict(SMALL, depth=4, vocab_size=1000), (8, 128, 384)),
  (
    "wide",
    "sao",
    dict(width=512, depth=4, heads=8, kv_heads=2, mlp_dim=1536, vocab_size=2000),
    (8, 128, 256),
  ),
  ("qwen2.5-0.5b layers", "sao", QWEN05_LAYER, (4, 224, 512)),
  ("qwen2.5-0.5b layers, lora 16", "sao", dict(QWEN05_LAYER, lora_rank=16), (4, 224, 512)),
]


def check(name: str, kind: str, fields: dict, shape: tuple[int, int, int]) -> dict:
  rows, prompt, completion = shape
  fields = dict(
    dict(arch="llama", depth=2, qkv_bias=True, dtype="bfloat16", max_len=4096), **fields
  )
  m = ModelConfig(**fields)
  rl = RLConfig(algorithm="sao", steps=1, max_new_tokens=completion)
  cfg = Config(model=m, rl=rl, sao=SAOConfig(batch_size=rows), mesh=MeshConfig(shape=(1, 1, 1)))
  model = make_model(m)
  tx = make_optimizer(rl.optim)
  if m.lora_rank:
    tx = lora.freeze_base(tx)
  update = make_sao_update(model, tx, rl, cfg.sao) if kind == "sao" else make_sft_update(model, tx)
  mesh = make_mesh(cfg.mesh, jax.devices()[:1])
  progs = compile_learner(
    cfg, model, tx, update, with_ref=False, prompt_len=prompt, mesh=mesh, num_tasks=100
  )
  state = jax.eval_shape(progs.init, jax.random.key(0))
  batch = (SAOBatch if kind == "sao" else SFTBatch).abstract(rows, prompt, completion)
  t0 = time.time()
  ma = progs.update.lower(state, batch).compile().memory_analysis()
  compile_s = time.time() - t0
  counts = estimates.param_counts(m)
  act = estimates.activation_bytes(m, rows, prompt, completion, rl=kind == "sao")
  est_args = 4 * counts["total"] + 8 * counts["trainable"]
  est_temp = 4 * counts["total"] + act
  row = {
    "case": name,
    "update": kind,
    "model": fields,
    "rows": rows,
    "prompt_tokens": prompt,
    "completion_tokens": completion,
    "params": counts,
    "xla_argument_bytes": ma.argument_size_in_bytes,
    "estimate_argument_bytes": est_args,
    "argument_ratio": ma.argument_size_in_bytes / est_args,
    "xla_temp_bytes": ma.temp_size_in_bytes,
    "estimate_temp_bytes": est_temp,
    "estimate_activation_bytes": act,
    "temp_ratio": ma.temp_size_in_bytes / est_temp,
    "compile_s": round(compile_s, 1),
  }
  print(
    f"{name:<30} {kind}: temporaries XLA {ma.temp_size_in_bytes / 1e6:8.1f} MB, estimate "
    f"{est_temp / 1e6:8.1f} MB (x{row['temp_ratio']:.2f}); arguments XLA "
    f"{ma.argument_size_in_bytes / 1e6:7.1f} MB, estimate {est_args / 1e6:7.1f} MB "
    f"(x{row['argument_ratio']:.2f})",
    flush=True,
  )
  return row


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--out", default=str(ROOT / "results" / "check_estimates.json"))
  args = p.parse_args(argv)
  rows = [check(*case) for case in CASES]
  temp = [r["temp_ratio"] for r in rows]
  out = {
    "cases": rows,
    "temp_ratio_range": [min(temp), max(temp)],
    "argument_ratio_range": [
      min(r["argument_ratio"] for r in rows),
      max(r["argument_ratio"] for r in rows),
    ],
  }
  path = ResultFile(args.out, series="check_estimates").finish(out)
  print(f"temporaries XLA / estimate: {min(temp):.2f} .. {max(temp):.2f}; results: {path}")


if __name__ == "__main__":
  main()
