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
import dataclasses
import io
import os
import sys
import time
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from sao_jax.batches import SFTBatch
from sao_jax.config import Config, ModelConfig, OptimConfig
from sao_jax.learner import make_optimizer, make_sft_update
from sao_jax.models import lora, make_model
from sao_jax.provenance import cpu
from sao_jax.results_file import ResultFile
from sao_jax.runners.compiled import compile_programs, make_packer
from sao_jax.tokenizer import CharTokenizer
from sao_jax.transport.params import flatten

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


def _seconds(fn) -> float:
  """Wall seconds of one call of `fn` (which must block until its result is ready)."""
  t0 = time.perf_counter()
  fn()
  return time.perf_counter() - t0


def make_matmul(n: int, dtype):
  """A jitted dense n x n matmul, warmed up: the reachable rate MFU is measured against."""
  ka, kb = jax.random.split(jax.random.key(1))
  a = jax.random.normal(ka, (n, n), dtype)
  b = jax.random.normal(kb, (n, n), dtype)
  mm = jax.jit(jnp.matmul)
  call = lambda: jax.block_until_ready(mm(a, b))
  for _ in range(2):
    call()
  return call


def param_counts(params) -> dict:
  """Total, embedding (token and position tables, untied lm_head) and non-embedding counts."""
  total = sum(int(x.size) for x in jax.tree.leaves(params))
  emb = int(params["embed"]["embedding"].size)
  emb += int(params["pos_embed"].size) if "pos_embed" in params else 0
  emb += int(params["lm_head"]["kernel"].size) if "lm_head" in params else 0
  return {"total": total, "embedding": emb, "non_embedding": total - emb}


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


def npz_bytes(tree) -> int:
  """Bytes of the file the parameter channel (sao_jax.transport.params) writes for `tree`."""
  buf = io.BytesIO()
  np.savez(buf, **flatten(tree))
  return buf.getbuffer().nbytes


def _zero_params(cfg: ModelConfig) -> dict:
  """Zero arrays of the parameter shapes of `cfg`'s model (nothing is computed)."""
  tokens = jnp.zeros((1, 1), jnp.int32)
  shapes = jax.eval_shape(
    make_model(cfg).init, jax.random.key(0), tokens, tokens, jnp.ones((1, 1, 1), bool)
  )["params"]
  return jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), nn.meta.unbox(shapes))


def lora_sync_bytes(model_cfg: ModelConfig, ranks: list[int]) -> dict:
  """Bytes per parameter sync: full parameters against LoRA adapters on every projection.

  Sizes depend only on shapes (np.savez does not compress), so zero arrays are written.
  """
  full = npz_bytes(_zero_params(dataclasses.replace(model_cfg, lora_rank=0)))
  out = {"full_bytes": full, "adapters": {}}
  for rank in ranks:
    cfg = dataclasses.replace(model_cfg, lora_rank=rank)
    adapter = npz_bytes(lora.adapters(_zero_params(cfg)))
    out["adapters"][str(rank)] = {
      "bytes": adapter,
      "fraction_of_full": adapter / full,
      "targets": list(cfg.lora_targets),
    }
  return out


def analytic_flops(
  *, non_emb: int, vocab: int, width: int, depth: int, batch: int, seq_len: int
) -> dict:
  tokens = batch * seq_len
  terms = {
    "dense": 6.0 * non_emb * tokens,
    "logits": 6.0 * vocab * width * tokens,
    "attention": 12.0 * depth * width * seq_len**2 * batch,
  }
  return dict(terms, total=sum(terms.values()))


def xla_flops(compiled) -> float | None:
  """XLA's flop count of the compiled program, where the backend provides one."""
  try:
    ca = compiled.cost_analysis()
  except Exception:  # optional diagnostic; some backends do not implement it
    return None
  if isinstance(ca, (list, tuple)):
    ca = ca[0] if ca else None
  flops = (ca or {}).get("flops")
  return float(flops) if flops else None


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
    times[i] = _seconds(step)
    mm_times[i] = _seconds(matmul)
  loss = float(jax.device_get(compiled(holder["state"], batch)[1]["loss"]))

  mm_flops = 2.0 * args.matmul_n**3
  peak = {
    "n": args.matmul_n,
    "dtype": jnp.dtype(args.dtype).name,
    "reps": args.reps,
    "time_s_median": float(np.median(mm_times)),
    "time_s_min": float(mm_times.min()),
    "flops_per_s": mm_flops / float(np.median(mm_times)),
    "flops_per_s_best": mm_flops / float(mm_times.min()),
  }
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


def span_flops(non_emb: int, vocab: int, width: int, depth: int, spans) -> float:
  """The FLOPs of real tokens: `analytic_flops` of each row alone at its span's length."""
  model = dict(non_emb=non_emb, vocab=vocab, width=width, depth=depth)
  return sum(analytic_flops(**model, batch=1, seq_len=int(n))["total"] for n in spans)


def _timed(fn, *args) -> Callable[[], None]:
  """`fn(*args)` jitted and warmed up, as a blocking call. The arrays are arguments, never
  closed over: XLA would fold a computation on constants at compile time."""
  jitted = jax.jit(fn)
  jax.block_until_ready(jitted(*args))
  return lambda: jax.block_until_ready(jitted(*args))


def profile_parts(model, params, batch, temperature: float) -> dict[str, tuple[Callable, float]]:
  """Parts of a padded learner update, each a blocking call with its analytic FLOPs (0 where
  not counted): the forward pass (log-probs and entropies), forward + backward (the gradient
  of their sum), and the model's matmuls alone at this batch's shapes, three times each (a
  forward and its two backward products): the dense layers with the logits, and attention's
  scores and weighted values."""
  from sao_jax.sampling import completion_logprobs

  m = model.cfg
  rows = tuple(
    jnp.asarray(x)
    for x in (batch.prompt_bp, batch.prompt_valid_bp, batch.tokens_bt, batch.valid_bt)
  )

  def forward(p, rows):
    lp = completion_logprobs(model, p, *rows, temperature=temperature, with_entropy=True)
    return jnp.sum(lp.logp_bt) + jnp.sum(lp.entropy_bt)

  b, length = batch.prompt_bp.shape[0], batch.prompt_bp.shape[1] + batch.tokens_bt.shape[1]
  n, w, f, hd = b * length, m.width, m.ffn_dim, m.width // m.heads
  rng = np.random.default_rng(0)
  mat = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)  # noqa: E731
  # Distinct operands for every product (XLA would compute repeated identical ones once).
  x, xf, reps = mat(n, w), mat(n, f), 3 * m.depth
  dense_w = [[mat(w, 3 * w), mat(w, w), mat(w, f), mat(f, w)] for _ in range(reps)]
  heads_w = [mat(w, m.vocab_size) for _ in range(3)]
  qs = [mat(b, length, m.heads, hd) for _ in range(reps)]
  ss = [mat(b, m.heads, length, length) for _ in range(reps)]

  def dense(x, xf, dense_w, heads_w):
    outs = [[x @ a, x @ c, x @ d, xf @ e] for a, c, d, e in dense_w]
    return outs + [x @ h for h in heads_w]

  def attention(qs, ss):
    return [
      (jnp.einsum("bqhd,bkhd->bhqk", q, q), jnp.einsum("bhqk,bkhd->bqhd", s_, q))
      for q, s_ in zip(qs, ss, strict=True)
    ]

  dense_flops = 3 * m.depth * 2 * n * (w * 3 * w + w * w + 2 * w * f) + 3 * 2 * n * w * m.vocab_size
  attention_flops = 3 * m.depth * 2 * 2 * b * m.heads * length * length * hd
  return {
    "forward": (_timed(forward, params, rows), 0.0),
    "forward_backward": (_timed(jax.grad(forward), params, rows), 0.0),
    "dense_matmuls": (_timed(dense, x, xf, dense_w, heads_w), float(dense_flops)),
    "attention_matmuls": (_timed(attention, qs, ss), float(attention_flops)),
  }


def load_bench_config(args: argparse.Namespace) -> Config:
  """The --config file's config (PATH[:VARIANT]) with the --set overrides, validated."""
  from sao_jax.setup import load_config

  path, _, variant = args.config.partition(":")
  return load_config(path, variant or "default", args.set)


def run_config(args: argparse.Namespace, cfg: Config) -> dict:
  """The config's RL update on its real rows, padded and packed: for each of `--seeds` a
  batch of its rows, timed `--reps` rounds (each round one padded update, one packed, one
  reference matmul, so both arms see the same clocks and load); per seed the medians, then
  the mean and standard error over the seeds."""
  from sao_jax import seqpack
  from sao_jax.batches import RLBatch, SAOBatch
  from sao_jax.learner import make_rl_update, make_sao_update
  from sao_jax.runners.common import sft_batch
  from sao_jax.setup import make_setup

  s = make_setup(cfg)
  model = s.model  # the config's model with the tokenizer's vocabulary filled in
  tx = make_optimizer(cfg.rl.optim)
  sao = cfg.rl.algorithm == "sao"
  update = make_sao_update(model, tx, cfg.rl, cfg.sao) if sao else make_rl_update(model, tx, cfg.rl)
  progs = compile_programs(
    cfg,
    model,
    tx,
    update,
    with_ref=cfg.rl.kl_coef > 0,
    prompt_len=s.prompt_len,
    max_new_tokens=cfg.rl.max_new_tokens,
    temperature=cfg.rl.temperature,
    eos_id=s.tok.eos_id,
    pad_id=s.tok.pad_id,
    num_tasks=len(s.train),
  )
  rows = cfg.sao.batch_size if sao else cfg.rl.prompts_per_step * cfg.rl.group_size
  length = s.prompt_len + cfg.rl.max_new_tokens
  packer = make_packer(cfg, progs.mesh)  # as learner.pack=on would pack
  counts = param_counts(jax.eval_shape(progs.init, jax.random.key(0)).params)
  m = model.cfg
  all_slots = analytic_flops(
    non_emb=counts["non_embedding"],
    vocab=m.vocab_size,
    width=m.width,
    depth=m.depth,
    batch=rows,
    seq_len=length,
  )["total"]
  matmul = make_matmul(args.matmul_n, jnp.dtype(m.dtype))
  mm_flops = 2.0 * args.matmul_n**3
  compiled: dict = {}  # (arm, packed rows) -> program: a seed whose plan has other rows compiles

  def one_seed(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    picked = [s.train[i] for i in rng.integers(0, len(s.train), rows)]
    demo = sft_batch(s, picked, rng, rows, cfg.rl.max_new_tokens)
    fields = dict(
      prompt_bp=demo.prompt_bp,
      prompt_valid_bp=demo.prompt_valid_bp,
      tokens_bt=demo.tokens_bt,
      valid_bt=demo.valid_bt,
      logp_bt=np.where(demo.valid_bt, -0.5, 0.0).astype(np.float32),
      rewards_b=rng.integers(0, 2, rows).astype(np.float32),
    )
    if sao:
      batch = SAOBatch.single_steps(
        **fields, task_b=rng.integers(0, len(s.train), rows), staleness_b=np.zeros(rows)
      )
    else:
      batch = RLBatch(**fields)
    packed = packer(batch)
    plan = packed.pack
    if plan is None:
      raise SystemExit(f"{args.config}: packing saves no row of its {rows}-row batch")
    batches = {"padded": batch, "packed": packed}
    compile_s, states = {}, {}
    for arm, b in batches.items():
      batches[arm] = progs.shard_batch(b)
      key = (arm, plan.rows if arm == "packed" else rows)
      t0 = time.perf_counter()
      if key not in compiled:
        state = jax.eval_shape(progs.init, jax.random.key(0))
        compiled[key] = progs.update.lower(state, batches[arm]).compile()
      compile_s[arm] = time.perf_counter() - t0
      states[arm] = (compiled[key], progs.init(jax.random.key(seed)))

    def step(arm):
      fn, state = states[arm]
      state, metrics = fn(state, batches[arm])
      jax.block_until_ready((state, metrics))
      states[arm] = (fn, state)
      return metrics

    # The same update: the first step's loss from the same state, padded and packed.
    first_loss = {arm: float(step(arm)["loss"]) for arm in batches}
    for _ in range(args.warmup):
      for arm in batches:
        step(arm)
    parts = {}
    if args.profile:
      params = jax.device_get(states["padded"][1].params)
      parts = profile_parts(model, params, batch, cfg.rl.temperature)
    times = {arm: np.zeros(args.reps) for arm in batches}
    part_times = {k: np.zeros(args.reps) for k in parts}
    mm_times = np.zeros(args.reps)
    for i in range(args.reps):
      for arm in batches:
        times[arm][i] = _seconds(lambda arm=arm: step(arm))
      for k, (call, _) in parts.items():
        part_times[k][i] = _seconds(call)
      mm_times[i] = _seconds(matmul)
    start, end = seqpack.spans(np.asarray(batch.prompt_valid_bp), np.asarray(batch.valid_bt))
    span = end - start
    real = span_flops(counts["non_embedding"], m.vocab_size, m.width, m.depth, span)
    peak = mm_flops / float(np.median(mm_times))
    out = {
      "seed": seed,
      "packed_rows": plan.rows,
      "packed_slots": int(plan.src_ql.size),
      "real_slots": int(span.sum()),
      "real_slot_frac": float(span.sum()) / (rows * length),
      "span_mean": float(span.mean()),
      "span_max": int(span.max()),
      "flops_real_tokens": real,
      "matmul_flops_per_s": peak,
      "first_loss_rel_diff": abs(first_loss["packed"] - first_loss["padded"])
      / max(abs(first_loss["padded"]), 1e-12),
      "speedup_packed": float(np.median(times["padded"] / times["packed"])),
      "arms": {},
    }
    for arm in batches:
      med = float(np.median(times[arm]))
      out["arms"][arm] = {
        "compile_s": compile_s[arm],
        "step_time_s_median": med,
        "step_times_s": times[arm].tolist(),
        "real_tokens_per_s": float(span.sum()) / med,
        "mfu_real_tokens": real / med / peak,
      }
    out["arms"]["padded"]["mfu_all_slots"] = (
      all_slots / out["arms"]["padded"]["step_time_s_median"] / peak
    )
    if parts:
      update_s = out["arms"]["padded"]["step_time_s_median"]
      out["profile_padded"] = {
        k: {
          "seconds_median": float(np.median(part_times[k])),
          "share_of_update": float(np.median(part_times[k])) / update_s,
          "flops": flops,
          "fraction_of_matmul_peak": flops / float(np.median(part_times[k])) / peak
          if flops
          else None,
        }
        for k, (_, flops) in parts.items()
      }
    print(
      f"seed {seed}: padded {1e3 * out['arms']['padded']['step_time_s_median']:.0f} ms, packed "
      f"{1e3 * out['arms']['packed']['step_time_s_median']:.0f} ms ({plan.rows} rows)",
      flush=True,
    )
    return out

  seeds = [one_seed(int(x)) for x in args.seeds.split(",") if x.strip()]
  over = lambda f: _mean_se([f(r) for r in seeds])  # noqa: E731
  summary = {
    arm: {
      "step_time_s_median": over(lambda r, a=arm: r["arms"][a]["step_time_s_median"]),
      "real_tokens_per_s": over(lambda r, a=arm: r["arms"][a]["real_tokens_per_s"]),
      "mfu_real_tokens": over(lambda r, a=arm: r["arms"][a]["mfu_real_tokens"]),
    }
    for arm in ("padded", "packed")
  }
  summary["padded"]["mfu_all_slots"] = over(lambda r: r["arms"]["padded"]["mfu_all_slots"])
  dev = jax.devices()[0]
  return {
    "config_file": args.config,
    "overrides": args.set,
    "update": "sao" if sao else "grpo",
    "rows": rows,
    "row_slots": length,
    "pack_bucket": packer.bucket,
    "pack_factor": cfg.learner.pack_factor,
    "params": counts,
    "flops_all_slots": all_slots,
    "matmul_n": args.matmul_n,
    "reps": args.reps,
    "warmup": args.warmup,
    "real_slot_frac": over(lambda r: r["real_slot_frac"]),
    "speedup_packed": over(lambda r: r["speedup_packed"]),
    "first_loss_rel_diff_max": max(r["first_loss_rel_diff"] for r in seeds),
    "arms": summary,
    "seeds": seeds,
    "jax_version": jax.__version__,
    "backend": jax.default_backend(),
    "device": f"{dev.platform}:{dev.device_kind} ({cpu()['model']})",
    "cpu_count": os.cpu_count(),
  }


def _fmt_config(r: dict) -> str:
  pm = lambda m, k=1.0, f=".1f": f"{k * m['mean']:{f}} +- {k * (m['se'] or 0):{f}}"  # noqa: E731
  lines = [
    f"{r['config_file']} ({r['update']} update): {r['rows']} rows x {r['row_slots']} slots, "
    f"real slots {pm(r['real_slot_frac'], 100)}%; {len(r['seeds'])} seeds x {r['reps']} rounds",
    f"{'arm':<8} {'step (ms)':>16} {'real tok/s':>18} {'MFU real tokens':>16}",
  ]
  for arm, a in r["arms"].items():
    lines.append(
      f"{arm:<8} {pm(a['step_time_s_median'], 1e3):>16} {pm(a['real_tokens_per_s'], 1, '.0f'):>18} "
      f"{pm(a['mfu_real_tokens'], 100):>15}%"
    )
  lines.append(
    f"padded MFU over every slot {pm(r['arms']['padded']['mfu_all_slots'], 100)}%; packed "
    f"speed-up {pm(r['speedup_packed'], 1, '.2f')}x; first loss rel. diff <= "
    f"{r['first_loss_rel_diff_max']:.1e}"
  )
  prof = r["seeds"][0].get("profile_padded")
  if prof:
    lines.append(
      "padded update's parts (seed 0): "
      + ", ".join(
        f"{k} {1e3 * v['seconds_median']:.0f} ms ({100 * v['share_of_update']:.0f} %"
        + (f", {100 * v['fraction_of_matmul_peak']:.0f} % of peak)" if v["flops"] else ")")
        for k, v in prof.items()
      )
    )
  lines.append(f"device: {r['device']}, {r['cpu_count']} CPUs, jax {r['jax_version']}")
  return "\n".join(lines)


def _mean_se(xs: list[float]) -> dict:
  a = np.asarray(xs, float)
  se = float(a.std(ddof=1) / np.sqrt(len(a))) if len(a) > 1 else None
  return {"mean": float(a.mean()), "se": se, "n": len(a), "values": a.tolist()}


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
  summary = {}
  for name, rs in runs.items():
    summary[name] = {
      "bench": rs[0]["bench"],
      "params": rs[0]["params"],
      "mfu": _mean_se([r["mfu"] for r in rs]),
      "mfu_xla": _mean_se([r["mfu_xla"] for r in rs]) if rs[0]["mfu_xla"] else None,
      "tokens_per_s": _mean_se([r["tokens_per_s"] for r in rs]),
      "step_time_s_median": _mean_se([r["step_time_s_median"] for r in rs]),
      "matmul_peak_flops_per_s": _mean_se([r["matmul_peak_flops_per_s"] for r in rs]),
      "runs": rs,
    }
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
    **{
      k: first[k]
      for k in (
        "jax_version",
        "backend",
        "device",
        "num_devices",
        "cpu_count",
        "cpu_affinity",
      )
    },
  }


def _fmt_variants(r: dict) -> str:
  pct = lambda m: (
    "n/a"
    if m is None
    else (f"{100 * m['mean']:.1f}%" + (f" +- {100 * m['se']:.1f}" if m["se"] is not None else ""))
  )
  lines = [
    f"{'variant':<12} {'params':>8} {'tokens/s':>10} {'MFU (analytic)':>18} {'MFU (XLA)':>16}"
  ]
  for name, v in r["variants"].items():
    lines.append(
      f"{name:<12} {v['params']['total'] / 1e6:>7.2f}M "
      f"{v['tokens_per_s']['mean']:>10.0f} {pct(v['mfu']):>18} "
      f"{pct(v['mfu_xla']):>16}"
    )
  sync = r["lora_sync"]
  for rank, a in sync["adapters"].items():
    lines.append(
      f"LoRA rank {rank}: {a['bytes'] / 1e6:.2f} MB per sync vs "
      f"{sync['full_bytes'] / 1e6:.2f} MB full ({100 * a['fraction_of_full']:.2f}%)"
    )
  lines.append(f"device: {r['device']}, {r['cpu_count']} CPUs, jax {r['jax_version']}")
  return "\n".join(lines)


def _fmt_table(r: dict) -> str:
  c = r["bench"]
  gf = lambda x: "n/a" if x is None else f"{x / 1e9:.2f} GFLOP/s"
  pct = lambda x: "n/a" if x is None else f"{100 * x:.1f}%"
  rows = [
    (
      "model",
      f"{c['arch']} width {c['width']} depth {c['depth']} heads {c['heads']} "
      f"kv {c['kv_heads']} mlp {c['mlp_dim']} vocab {c['vocab']} {c['dtype']}",
    ),
    (
      "params",
      f"{r['params']['total'] / 1e6:.2f}M total, "
      f"{r['params']['non_embedding'] / 1e6:.2f}M non-embedding",
    ),
    (
      "batch",
      f"{c['batch']} x ({c['prompt_len']} + {c['completion_len']}) = "
      f"{r['tokens_per_step']} tokens/step",
    ),
    ("compile", f"{r['compile_s']:.2f} s"),
    (
      "step time",
      f"median {1e3 * r['step_time_s_median']:.1f} ms, "
      f"p90 {1e3 * r['step_time_s_p90']:.1f} ms ({c['reps']} reps)",
    ),
    ("tokens/s", f"{r['tokens_per_s']:.0f}"),
    (
      "FLOPs/step",
      f"analytic {r['flops_per_step_analytic'] / 1e9:.2f} G, XLA "
      + ("n/a" if r["flops_per_step_xla"] is None else f"{r['flops_per_step_xla'] / 1e9:.2f} G"),
    ),
    (
      "achieved",
      f"analytic {gf(r['achieved_flops_per_s'])}, XLA {gf(r['achieved_flops_per_s_xla'])}",
    ),
    (
      "matmul peak",
      f"{gf(r['matmul_peak_flops_per_s'])} ({r['matmul']['n']}^3 {r['matmul']['dtype']})",
    ),
    ("MFU", f"analytic {pct(r['mfu'])}, XLA {pct(r['mfu_xla'])}"),
    ("device", f"{r['device']}, {r['cpu_count']} CPUs, jax {r['jax_version']}"),
  ]
  w = max(len(k) for k, _ in rows)
  return "\n".join(f"{k:<{w}}  {v}" for k, v in rows)


def main(argv: list[str] | None = None) -> int:
  args = parse_args(argv)
  if args.config:
    try:
      cfg = load_bench_config(args)
    except ValueError as e:  # ConfigError and the config file's own refusals
      _parser().error(str(e))
    rf = ResultFile(args.out, series=f"bench_learner/packing/{cfg.name}", config=cfg)
    result = run_config(args, cfg)
    out = rf.finish(result)
    print(_fmt_config(result))
    print(f"wrote {out}")
    return 0
  # One run has one resolved config; each variant's differs (arch, dtype).
  series = f"bench_learner/{args.variants or args.arch + '-' + args.dtype}"
  series += "/tiny" if args.tiny else ""
  rf = ResultFile(args.out, series=series, config=None if args.variants else bench_config(args))
  result = run_variants(args) if args.variants else run(args)
  out = rf.finish(result)
  print(_fmt_variants(result) if args.variants else _fmt_table(result))
  print(f"wrote {out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
