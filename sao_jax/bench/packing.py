"""A training config's learner update, padded rows against packed (`learner.pack`,
`sao_jax.seqpack`), timed side by side on batches of the config's real rows with the MFU of
their real tokens: experiments/bench_learner.py --config."""

from __future__ import annotations

import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from sao_jax.bench.mfu import (
  analytic_flops,
  make_matmul,
  mean_se,
  param_counts,
  profile_parts,
  seconds,
  span_flops,
)
from sao_jax.config import Config
from sao_jax.learner import make_optimizer
from sao_jax.provenance import cpu
from sao_jax.runners.compiled import compile_programs, make_packer


def padded_vs_packed(
  cfg: Config,
  *,
  config_file: str,
  overrides: list[str],
  seeds: list[int],
  reps: int,
  warmup: int,
  matmul_n: int,
  profile: bool = False,
) -> dict:
  """The config's RL update on its real rows, padded and packed: for each of `seeds` a
  batch of its rows, timed `reps` rounds (each round one padded update, one packed, one
  reference matmul of `matmul_n`, so both arms see the same clocks and load) after `warmup`
  untimed steps; per seed the medians, then the mean and standard error over the seeds.
  `profile`: also the padded update's parts (`profile_parts`), in the same rounds.
  `config_file` (PATH[:VARIANT]) and `overrides` are recorded."""
  from sao_jax import seqpack
  from sao_jax.batches import RLBatch, SAOBatch
  from sao_jax.learner import make_rl_update, make_sao_update
  from sao_jax.policy import sft_batch
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
  matmul = make_matmul(matmul_n, jnp.dtype(m.dtype))
  mm_flops = 2.0 * matmul_n**3
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
      raise SystemExit(f"{config_file}: packing saves no row of its {rows}-row batch")
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
    for _ in range(warmup):
      for arm in batches:
        step(arm)
    parts = {}
    if profile:
      params = jax.device_get(states["padded"][1].params)
      parts = profile_parts(model, params, batch, cfg.rl.temperature)
    times = {arm: np.zeros(reps) for arm in batches}
    part_times = {k: np.zeros(reps) for k in parts}
    mm_times = np.zeros(reps)
    for i in range(reps):
      for arm in batches:
        times[arm][i] = seconds(lambda arm=arm: step(arm))
      for k, (call, _) in parts.items():
        part_times[k][i] = seconds(call)
      mm_times[i] = seconds(matmul)
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

  seeds = [one_seed(int(x)) for x in seeds]
  over = lambda f: mean_se([f(r) for r in seeds])  # noqa: E731
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
    "config_file": config_file,
    "overrides": overrides,
    "update": "sao" if sao else "grpo",
    "rows": rows,
    "row_slots": length,
    "pack_bucket": packer.bucket,
    "pack_factor": cfg.learner.pack_factor,
    "params": counts,
    "flops_all_slots": all_slots,
    "matmul_n": matmul_n,
    "reps": reps,
    "warmup": warmup,
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
