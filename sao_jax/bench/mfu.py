"""What experiments/bench_learner.py counts and times: the analytic FLOPs of an update
(dense layers, logits, attention; of real tokens only with `span_flops`), XLA's own count, the
reference matmul MFU is measured against, the parts of a padded update timed alone
(`profile_parts`), parameter counts and the bytes one parameter sync publishes, full or LoRA
adapters only."""

from __future__ import annotations

import dataclasses
import io
import time
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from sao_jax.config import ModelConfig
from sao_jax.models import lora, make_model
from sao_jax.transport.params import flatten


def seconds(fn) -> float:
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


def npz_bytes(tree) -> int:
  """Bytes of the file the parameter channel (sao_jax.transport.params) writes for `tree`."""
  buf = io.BytesIO()
  np.savez(buf, **flatten(tree))
  return buf.getbuffer().nbytes


def zero_params(cfg: ModelConfig) -> dict:
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
  full = npz_bytes(zero_params(dataclasses.replace(model_cfg, lora_rank=0)))
  out = {"full_bytes": full, "adapters": {}}
  for rank in ranks:
    cfg = dataclasses.replace(model_cfg, lora_rank=rank)
    adapter = npz_bytes(lora.adapters(zero_params(cfg)))
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


def span_flops(non_emb: int, vocab: int, width: int, depth: int, spans) -> float:
  """The FLOPs of real tokens: `analytic_flops` of each row alone at its span's length."""
  model = dict(non_emb=non_emb, vocab=vocab, width=width, depth=depth)
  return sum(analytic_flops(**model, batch=1, seq_len=int(n))["total"] for n in spans)


def timed(fn, *args) -> Callable[[], None]:
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
    "forward": (timed(forward, params, rows), 0.0),
    "forward_backward": (timed(jax.grad(forward), params, rows), 0.0),
    "dense_matmuls": (timed(dense, x, xf, dense_w, heads_w), float(dense_flops)),
    "attention_matmuls": (timed(attention, qs, ss), float(attention_flops)),
  }


def mean_se(xs: list[float]) -> dict:
  a = np.asarray(xs, float)
  se = float(a.std(ddof=1) / np.sqrt(len(a))) if len(a) > 1 else None
  return {"mean": float(a.mean()), "se": se, "n": len(a), "values": a.tolist()}


def matmul_peak(n: int, dtype: str, mm_times: np.ndarray) -> dict:
  """The reference matmul's rate from its timed calls (`mm_times`, seconds, one a round): by
  the median call (`flops_per_s`, what MFU divides by) and the fastest."""
  mm_flops = 2.0 * n**3
  return {
    "n": n,
    "dtype": dtype,
    "reps": len(mm_times),
    "time_s_median": float(np.median(mm_times)),
    "time_s_min": float(mm_times.min()),
    "flops_per_s": mm_flops / float(np.median(mm_times)),
    "flops_per_s_best": mm_flops / float(mm_times.min()),
  }


def repeats_summary(rs: list[dict]) -> dict:
  """One variant's repeated runs (bench_learner's `run` results): their shape and parameters,
  and the mean and s.e. of each rate over the repeats, with the runs themselves."""
  return {
    "bench": rs[0]["bench"],
    "params": rs[0]["params"],
    "mfu": mean_se([r["mfu"] for r in rs]),
    "mfu_xla": mean_se([r["mfu_xla"] for r in rs]) if rs[0]["mfu_xla"] else None,
    "tokens_per_s": mean_se([r["tokens_per_s"] for r in rs]),
    "step_time_s_median": mean_se([r["step_time_s_median"] for r in rs]),
    "matmul_peak_flops_per_s": mean_se([r["matmul_peak_flops_per_s"] for r in rs]),
    "runs": rs,
  }
