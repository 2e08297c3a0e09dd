"""Learner throughput: achieved FLOP/s and MFU of the jitted SFT update on this machine.

A CPU has no datasheet peak that XLA can reach, so "MFU" here is the update's achieved
FLOP/s divided by the FLOP/s of a large dense f32 matmul timed IN THE SAME PROCESS, one
matmul after each timed update (same threads, same clocks, same load, same XLA build). It
says how much of the reachable matmul rate the learner step turns into model FLOPs; it is
not comparable to accelerator MFU figures.

Run (default size: width 512, depth 4, batch 16 x (64 prompt + 64 completion) tokens;
about a minute on a 2-core CPU):
  python experiments/bench_learner.py
Smoke run (seconds):
  python experiments/bench_learner.py --tiny --out /tmp/bench_learner_tiny.json

Writes a result file (`sao_jax.results_file`; default results/bench_learner.json) and prints a
short table.

Variants side by side (f32 GPT, bf16 GPT, Llama-style f32 and bf16, each run `--repeats`
times in this process; mean and standard error over the repeats), plus the bytes one
parameter sync would publish with LoRA adapters against full parameters (about 15 minutes
on a 2-core CPU):
  python experiments/bench_learner.py --variants gpt-f32,gpt-bf16,llama-f32,llama-bf16 \
      --repeats 3 --out results/bench_learner_variants.json
The learner of a training config, padded rows against packed (`learner.pack`, sao_jax.seqpack):
its RL update (SAO's, or GRPO's for rl.algorithm='grpo') on a batch of the config's real rows
(prompts of its train split, completions as long as their worked solutions plus EOS), timed
unpacked and packed side by side, for each of `--seeds` a batch (a few minutes on a 2-core CPU
for the main job's config):
  python experiments/bench_learner.py --config experiments/configs/sao_arith.py \
      --repeats 3 --out results/bench_learner_packing.json
Its MFU counts only the FLOPs of real tokens (each row's span, from its first token to the last
one the loss reads, with attention over the span); the padded update's MFU over every slot (the
definition above) is reported next to it.
On XLA:CPU the bf16 reference matmul ran slower than the model's own bf16 matmuls (MFU
above 100% was measured), so on a CPU compare the bf16 variants by tokens/s. On a GPU pass
`--matmul-n 8192`: a 2048^3 product is too small to approach the device's peak.
The Llama-style variant (sao_jax.models.llama) has `--kv-heads` key/value heads (default
heads / 4) and a SwiGLU MLP of hidden size `--llama-mlp-dim` (default 2/3 * mlp_ratio *
width rounded up to a multiple of 64: its three matrices then hold about the parameters of
the GPT MLP's two; 1408 at width 512).

FLOPs per update, counted analytically (forward + backward = 3x forward):
  6 * non_embedding_params * tokens          dense layers (Kaplan et al.'s 6N per token)
  + 6 * vocab * width * tokens               logits: the unembedding (tied to the token
                                             embedding, or an untied lm_head) is not in
                                             non_embedding_params
  + 12 * depth * width * L^2 * batch         attention scores and weighted values; the model
                                             computes the full L x L matrix, so no causal 1/2
with tokens = batch * L and L = prompt_len + completion_len (every position is computed).
XLA's own count (`compiled.cost_analysis()["flops"]`) is reported next to it; it also
includes the softmaxes, norms and the AdamW update.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from sao_jax.batches import SFTBatch
from sao_jax.bench.learner_report import format_config, format_table, format_variants
from sao_jax.bench.mfu import (
  analytic_flops,
  lora_sync_bytes,
  make_matmul,
  matmul_peak,
  param_counts,
  repeats_summary,
  seconds,
  xla_flops,
)
from sao_jax.bench.packing import padded_vs_packed
from sao_jax.config import Config, ModelConfig, OptimConfig
from sao_jax.learner import make_optimizer, make_sft_update
from sao_jax.models import make_model
from sao_jax.provenance import cpu
from sao_jax.results_file import ResultFile
from sao_jax.runners.compiled import compile_programs
from sao_jax.tokenizer import CharTokenizer

# --variants: name -> (arch, dtype).
VARIANTS = {
  "gpt-f32": ("gpt", "float32"),
  "gpt-bf16": ("gpt", "bfloat16"),
  "llama-f32": ("llama", "float32"),
  "llama-bf16": ("llama", "bfloat16"),
}

# --tiny: a seconds-long smoke run of the same code path (used by tests).
TINY = dict(
  width=64,
  depth=1,
  heads=2,
  batch=4,
  prompt_len=16,
  completion_len=16,
  reps=3,
  warmup=1,
  matmul_n=512,
)


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--width", type=int, default=512)
  p.add_argument("--depth", type=int, default=4)
  p.add_argument("--heads", type=int, default=8)
  p.add_argument("--mlp-ratio", type=int, default=4)
  p.add_argument("--vocab", type=int, default=0, help="0: the char tokenizer's vocabulary")
  p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
  p.add_argument("--arch", default="gpt", choices=("gpt", "llama"))
  p.add_argument("--kv-heads", type=int, default=0, help="llama: 0 means heads / 4")
  p.add_argument(
    "--llama-mlp-dim",
    type=int,
    default=0,
    help="llama SwiGLU hidden size; 0: 2/3 * mlp_ratio * width, rounded up to 64",
  )
  p.add_argument(
    "--variants",
    default="",
    help=f"comma-separated, from {', '.join(VARIANTS)}: run each (overrides "
    "--arch/--dtype) --repeats times and write one JSON",
  )
  p.add_argument("--repeats", type=int, default=1, help="runs per variant (with --variants)")
  p.add_argument(
    "--lora-ranks",
    default="8,64",
    help="with --variants: LoRA ranks whose per-sync bytes are reported",
  )
  p.add_argument("--batch", type=int, default=16)
  p.add_argument("--prompt-len", type=int, default=64)
  p.add_argument("--completion-len", type=int, default=64)
  p.add_argument(
    "--reps",
    type=int,
    default=10,
    help="timed rounds, each one update step and one reference matmul",
  )
  p.add_argument("--warmup", type=int, default=2, help="untimed steps after compilation")
  p.add_argument("--matmul-n", type=int, default=2048, help="n of the n x n @ n x n reference")
  p.add_argument(
    "--config",
    default="",
    help="PATH[:VARIANT] of a training config: time its RL update on its real rows, padded "
    "and packed (the model flags are ignored)",
  )
  p.add_argument("--seeds", default="0,1,2", help="with --config: one batch of rows per seed")
  p.add_argument(
    "--profile",
    action="store_true",
    help="with --config: also time the padded update's parts (forward, forward + backward) "
    "and its dense and attention matmuls alone, in the same rounds",
  )
  p.add_argument(
    "--set",
    action="append",
    default=[],
    metavar="KEY=VALUE",
    help="with --config: a config override, as for sao-jax train (repeatable)",
  )
  p.add_argument("--out", default="results/bench_learner.json")
  p.add_argument("--tiny", action="store_true", help="seconds-long smoke run; flags still win")
  return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  p = _parser()
  if p.parse_known_args(argv)[0].tiny:
    p.set_defaults(**TINY)  # explicit flags still override the tiny sizes
  return p.parse_args(argv)


def model_config(args: argparse.Namespace, vocab: int, seq_len: int) -> ModelConfig:
  kw = {}
  if args.arch == "llama":
    mlp = args.llama_mlp_dim or -(-(2 * args.mlp_ratio * args.width // 3) // 64) * 64
    kw = dict(arch="llama", kv_heads=args.kv_heads or max(args.heads // 4, 1), mlp_dim=mlp)
  return ModelConfig(
    vocab_size=vocab,
    width=args.width,
    depth=args.depth,
    heads=args.heads,
    mlp_ratio=args.mlp_ratio,
    max_len=seq_len,
    dtype=args.dtype,
    **kw,
  )


def bench_config(args: argparse.Namespace) -> Config:
  """The resolved config of one run: the model the flags describe."""
  vocab = args.vocab or CharTokenizer().vocab_size
  seq_len = args.prompt_len + args.completion_len
  return Config(name="bench_learner", model=model_config(args, vocab, seq_len))


def run(args: argparse.Namespace) -> dict:
  cfg = bench_config(args)
  model_cfg, vocab = cfg.model, cfg.model.vocab_size
  seq_len = args.prompt_len + args.completion_len
  model = make_model(model_cfg)
  tx = make_optimizer(OptimConfig(lr=1e-4, warmup_steps=10))
  progs = compile_programs(
    cfg,
    model,
    tx,
    make_sft_update(model, tx),
    with_ref=False,
    prompt_len=args.prompt_len,
    max_new_tokens=args.completion_len,
    temperature=1.0,
    eos_id=2,
    pad_id=0,
  )
  state = progs.init(jax.random.key(0))
  params = param_counts(state.params)

  # Random tokens, every slot valid: the learner's cost does not depend on the values.
  rng = np.random.default_rng(0)
  b, p, t = args.batch, args.prompt_len, args.completion_len
  batch = progs.shard_batch(
    SFTBatch(
      prompt_bp=rng.integers(3, vocab, (b, p), dtype=np.int32),
      prompt_valid_bp=np.ones((b, p), bool),
      tokens_bt=rng.integers(3, vocab, (b, t), dtype=np.int32),
      valid_bt=np.ones((b, t), bool),
      weight_b=np.ones(b, np.float32),
    )
  )

  t0 = time.perf_counter()
  compiled = progs.update.lower(state, batch).compile()
  compile_s = time.perf_counter() - t0
  flops_xla = xla_flops(compiled)

  holder = {"state": state}

  def step():
    # The compiled update donates its state argument, so thread it through.
    holder["state"], metrics = compiled(holder["state"], batch)
    jax.block_until_ready((holder["state"], metrics))

  matmul = make_matmul(args.matmul_n, jnp.dtype(args.dtype))
  for _ in range(args.warmup):
    step()
  # Interleaved, so that both see the same clocks and the same load from other processes
  # (on a shared or virtual CPU both drift by tens of percent within a minute).
  times, mm_times = np.zeros(args.reps), np.zeros(args.reps)
  for i in range(args.reps):
    times[i] = seconds(step)
    mm_times[i] = seconds(matmul)
  loss = float(jax.device_get(compiled(holder["state"], batch)[1]["loss"]))

  peak = matmul_peak(args.matmul_n, jnp.dtype(args.dtype).name, mm_times)
  step_med = float(np.median(times))
  tokens = b * seq_len
  flops = analytic_flops(
    non_emb=params["non_embedding"],
    vocab=vocab,
    width=args.width,
    depth=args.depth,
    batch=b,
    seq_len=seq_len,
  )
  achieved = flops["total"] / step_med
  achieved_xla = flops_xla / step_med if flops_xla else None
  dev = jax.devices()[0]
  return {
    # the benchmark's shape (the resolved config is the result file's `config`)
    "bench": {
      "arch": args.arch,
      "width": args.width,
      "depth": args.depth,
      "heads": args.heads,
      "kv_heads": model_cfg.n_kv_heads,
      "mlp_dim": model_cfg.ffn_dim,
      "mlp_ratio": args.mlp_ratio,
      "vocab": vocab,
      "dtype": args.dtype,
      "batch": b,
      "prompt_len": p,
      "completion_len": t,
      "seq_len": seq_len,
      "reps": args.reps,
      "warmup": args.warmup,
      "tiny": args.tiny,
    },
    "params": params,
    "tokens_per_step": tokens,
    "compile_s": compile_s,
    "step_time_s_median": step_med,
    "step_time_s_p90": float(np.percentile(times, 90)),
    "step_time_s_min": float(times.min()),
    "step_times_s": [float(x) for x in times],
    "tokens_per_s": tokens / step_med,
    "final_loss": loss,
    "flops_per_step_analytic": flops["total"],
    "flops_per_step_terms": {k: v for k, v in flops.items() if k != "total"},
    "flops_per_step_xla": flops_xla,
    "achieved_flops_per_s": achieved,
    "achieved_flops_per_s_xla": achieved_xla,
    "matmul": peak,
    "matmul_peak_flops_per_s": peak["flops_per_s"],
    "mfu": achieved / peak["flops_per_s"],
    "mfu_xla": achieved_xla / peak["flops_per_s"] if achieved_xla else None,
    "jax_version": jax.__version__,
    "backend": jax.default_backend(),
    "device": f"{dev.platform}:{dev.device_kind} ({cpu()['model']})",
    "num_devices": jax.device_count(),
    "cpu_count": os.cpu_count(),
    "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
  }


def load_bench_config(args: argparse.Namespace) -> Config:
  """The --config file's config (PATH[:VARIANT]) with the --set overrides, validated."""
  from sao_jax.setup import load_config

  path, _, variant = args.config.partition(":")
  return load_config(path, variant or "default", args.set)


def run_variants(args: argparse.Namespace) -> dict:
  """Each variant `args.repeats` times (interleaved, so drifting machine load is shared)."""
  names = [v.strip() for v in args.variants.split(",") if v.strip()]
  unknown = [n for n in names if n not in VARIANTS]
  if unknown:
    raise SystemExit(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
  runs: dict[str, list[dict]] = {n: [] for n in names}
  for _ in range(args.repeats):
    for name in names:
      arch, dtype = VARIANTS[name]
      runs[name].append(run(argparse.Namespace(**dict(vars(args), arch=arch, dtype=dtype))))
  summary = {name: repeats_summary(rs) for name, rs in runs.items()}
  first = next(iter(runs.values()))[0]
  llama_args = argparse.Namespace(**dict(vars(args), arch="llama", dtype="float32"))
  ranks = [int(r) for r in args.lora_ranks.split(",") if r.strip()]
  return {
    "variants": summary,
    "lora_sync": dict(
      lora_sync_bytes(
        model_config(llama_args, first["bench"]["vocab"], first["bench"]["seq_len"]), ranks
      ),
      model="llama-f32 of this run",
    ),
    "repeats": args.repeats,
    **{k: first[k] for k in ("jax_version", "backend", "device", "num_devices")},
    **{k: first[k] for k in ("cpu_count", "cpu_affinity")},
  }


def main(argv: list[str] | None = None) -> int:
  args = parse_args(argv)
  if args.config:
    try:
      cfg = load_bench_config(args)
    except ValueError as e:  # ConfigError and the config file's own refusals
      _parser().error(str(e))
    rf = ResultFile(args.out, series=f"bench_learner/packing/{cfg.name}", config=cfg)
    seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    result = padded_vs_packed(
      cfg,
      config_file=args.config,
      overrides=args.set,
      seeds=seeds,
      reps=args.reps,
      warmup=args.warmup,
      matmul_n=args.matmul_n,
      profile=args.profile,
    )
    out = rf.finish(result)
    print(format_config(result))
    print(f"wrote {out}")
    return 0
  # One run has one resolved config; each variant's differs (arch, dtype).
  series = f"bench_learner/{args.variants or args.arch + '-' + args.dtype}"
  series += "/tiny" if args.tiny else ""
  rf = ResultFile(args.out, series=series, config=None if args.variants else bench_config(args))
  result = run_variants(args) if args.variants else run(args)
  out = rf.finish(result)
  print(format_variants(result) if args.variants else format_table(result))
  print(f"wrote {out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
