"""Part 1 of experiments/bench_compression.py: bytes per trajectory after each stage of the
three-stage compression (expert episodes through the sampler's jitted `compress` program),
which facts each filter keeps and the policy sees, the LSTM's surprise per kind of step, the
cost of reading the whole bank against a window; and the configurations of its arms
(`with_compression`, `uncompressed_cfg`: the stage-1-only control)."""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from sao_jax.bench.recall import memory_log, question_facts, seen_at
from sao_jax.compression.memory import graveyard_nbytes
from sao_jax.compression.rollout import (
  bury,
  episode_tokens,
  gone_record,
  graveyard_arrays,
  script,
  segment,
)
from sao_jax.config import Config
from sao_jax.envs.longhorizon import BOUNDARIES, SEP
from sao_jax.packing import right_pad
from sao_jax.runners import memory_lab as L


def bytes_per_stage(cfg: Config, progs, policy, params, tasks, *, detail: bool = True) -> dict:
  """Runs the expert episodes through the sampler's compress program, all side by side.
  `detail`: also the LSTM's surprise (and the learned salience) per kind of step."""
  c = cfg.compression
  n = len(tasks)
  scripts = [script(t, L.TOK) for t in tasks]
  n_steps = len(scripts[0][0])
  streams = progs.empty_streams(n)
  records = []  # each step's evicted entries, left on the device until the end
  t0 = time.time()
  for s in range(n_steps):
    segs = [segment(obs[s], acts[s], c.step_len) for obs, acts, _ in scripts]
    seg, segv = right_pad(segs, c.step_len, L.TOK.pad_id)
    reward = np.asarray([1.0 if s in g else 0.0 for _, _, g in scripts], np.float32)
    bnd = np.asarray([t.prompt.split(SEP)[s] in BOUNDARIES for t in tasks])
    last = np.full(n, s == n_steps - 1)
    streams = progs.compress(params, streams, seg, segv, reward, bnd, last, np.ones(n, bool))
    records.append(gone_record(streams))
  bank = jax.device_get(streams.bank)
  secs = time.time() - t0
  graves = [{} for _ in range(n)]
  for record in jax.device_get(records):
    bury(graves, record)
  evicted = np.asarray(jax.device_get(streams.evicted))
  if [len(g) for g in graves] != evicted.tolist():
    raise RuntimeError(f"graveyard sizes {[len(g) for g in graves]} != evictions {evicted}")
  gone = [graveyard_arrays(g, bank.vec_ced[i, 0]) for i, g in enumerate(graves)]
  grave_bytes = np.asarray([graveyard_nbytes(x["gone_vec_ged"]) for x in gone], np.float64)
  width = cfg.model.width
  m, d = c.vectors_per_step, c.dim
  tokens = np.asarray([episode_tokens(t, L.TOK) for t in tasks], np.float64)
  kept = bank.count.astype(np.float64)
  fact_kept, fact_visible = [], []
  for i, t in enumerate(tasks):
    steps = bank.step_c[i, : bank.count[i]]
    log = memory_log(steps, gone[i], n_steps)
    for q, f in question_facts(t):
      fact_kept.append(f in steps)
      fact_visible.append(f in seen_at(log, q, c.visible))
  per_stage = {
    "full_context_fp32_embeddings": tokens * width * 4,
    "stage1_semantic_fp32": np.full(n, n_steps * m * d * 4.0),
    "stage2_temporal_fp32": kept * m * d * 4,
    "stage3_int8": kept * (m * d + m * 4 + 2),
    "stage3_graveyard_exact_replay": grave_bytes,
    "stage3_int8_with_graveyard": kept * (m * d + m * 4 + 2) + grave_bytes,
  }
  out = {k: float(v.mean()) for k, v in per_stage.items()}
  full = out["full_context_fp32_embeddings"]
  return {
    "episodes": n,
    "steps": n_steps,
    "tokens_per_episode": float(tokens.mean()),
    "kept_steps_mean": float(kept.mean()),
    "kept_frac": float(kept.mean() / n_steps),
    "facts_kept_frac": float(np.mean(fact_kept)),
    "facts_visible_at_question_frac": float(np.mean(fact_visible)),
    "dropped_bank_full": int(np.sum(jax.device_get(streams.dropped_full))),
    "evicted": int(evicted.sum()),
    "graveyard_over_stage3": float(grave_bytes.mean() / out["stage3_int8"]),
    **(_by_kind(cfg, policy, params, tasks) if detail else {}),
    "bytes": out,
    # Not for the graveyard (not a stage) or 0 bytes.
    "reduction_vs_full": {
      k: full / v for k, v in out.items() if v > 0 and k != "stage3_graveyard_exact_replay"
    },
    "kv_cache_fp32_bytes": float(tokens.mean() * 2 * cfg.model.depth * width * 4),
    "compress_seconds": secs,  # the compress calls; the graveyard is fetched after
  }


def with_compression(cfg: Config, **comp) -> Config:
  """cfg with compression fields replaced (the model's memory slots follow `visible`)."""
  c = dataclasses.replace(cfg.compression, **comp)
  model = dataclasses.replace(cfg.model, memory_slots=c.visible * c.vectors_per_step)
  return dataclasses.replace(cfg, compression=c, model=model)


def uncompressed_cfg(cfg: Config, n_steps: int) -> Config:
  """The memory policy's configuration with stage 1 only: every step of an `n_steps` episode
  kept (keep threshold 0, budget = capacity = visible = n_steps, no eviction, no learned
  salience, so no salient turning points) in float32 (no INT8). The trained parameters do not
  depend on n_steps, so one trained policy runs at any episode length with the matching
  `n_steps`."""
  return with_compression(
    cfg,
    keep_threshold=0.0,
    budget=n_steps,
    capacity=n_steps,
    visible=n_steps,
    evict=False,
    quantize=False,
    salience="none",
    salient_turning=False,
  )


# Keep-probability thresholds the learned filter is also measured at (besides the measured
# configuration's `compression.salience_threshold`): facts kept and bytes, same parameters.
SALIENCE_THRESHOLDS = (0.5, 0.25, 0.1, 0.0)


def filter_ablations(cfg: Config, params, tasks, *, window: int = 16) -> dict:
  """Facts kept / visible at their question on the 1,000-step episodes, same trained
  parameters, for each filter (learned salience, surprise only, surprise first-come) and
  what the policy reads (the whole bank, or the last `window` entries); the learned filter
  also at the keep-probability thresholds of `SALIENCE_THRESHOLDS` (a diagnostic of the
  trained head: the policy was trained on banks of the configured threshold)."""
  c = cfg.compression
  variants = {}
  if c.salience == "learned":
    variants["learned_salience_full_bank"] = {"visible": c.capacity}
    variants[f"learned_salience_last_{window}"] = {"visible": window}
    for t in SALIENCE_THRESHOLDS:
      if t != c.salience_threshold:
        variants[f"learned_salience_at_{t:g}_full_bank"] = {
          "visible": c.capacity,
          "salience_threshold": t,
        }
  variants["surprise_full_bank"] = {"salience": "none", "visible": c.capacity}
  variants[f"surprise_last_{window}"] = {"salience": "none", "visible": window}
  variants[f"surprise_first_come_last_{window}"] = {
    "salience": "none",
    "visible": window,
    "evict": False,
  }
  return {name: filter_row(cfg, params, tasks, **over) for name, over in variants.items()}


def filter_row(cfg: Config, params, tasks, **over) -> dict:
  """The bank of `cfg` with compression fields `over` replaced (same trained parameters) on
  `tasks`: `over` itself, entries, facts kept / visible at their question, evictions, steps
  dropped with the bank full, and the INT8 + graveyard reduction."""
  vcfg = with_compression(cfg, **over)
  progs, pol = L.build(vcfg, True)
  # Without a salience head the policy's parameters have no "salience" part.
  vparams = {k: v for k, v in params.items() if k != "salience" or pol.comp.salience}
  r = bytes_per_stage(vcfg, progs, pol, vparams, tasks, detail=False)
  return dict(
    over,
    **{
      k: r[k]
      for k in (
        "kept_steps_mean",
        "facts_kept_frac",
        "facts_visible_at_question_frac",
        "evicted",
        "dropped_bank_full",
      )
    },
    int8_with_graveyard_reduction=r["reduction_vs_full"]["stage3_int8_with_graveyard"],
  )


def attention_cost(cfg: Config, train, test, *, length: int, window: int = 16) -> dict:
  """Measured cost of reading the whole bank against the last `window` entries: seconds per
  supervised update (batch of cfg.sft.batch_size episodes) and per sampling step (32
  episodes side by side: sample + compress), compile excluded, same machine, one after the
  other."""
  out = {}
  for visible in (window, cfg.compression.capacity):
    vcfg = with_compression(cfg, visible=visible)
    progs, pol = L.build(vcfg, True, mode="sft")
    L.train(vcfg, progs, True, train, steps=1, length=length)  # compiles
    _, t1, _ = L.train(vcfg, progs, True, train, steps=1, length=length)
    _, t6, _ = L.train(vcfg, progs, True, train, steps=6, length=length)
    state = progs.init(jax.random.key(0))
    L.evaluate(vcfg, progs, pol, state.params, test[:32], True, length=length)  # compiles
    t0 = time.time()
    _, trajs = L.evaluate(vcfg, progs, pol, state.params, test[:32], True, length=length)
    steps = max(len(t.rewards) for t in trajs)
    out[f"visible_{visible}"] = {
      "memory_slots": visible * cfg.compression.vectors_per_step,
      "update_seconds": (t6 - t1) / 5,
      "sample_step_seconds": (time.time() - t0) / steps,
    }
  a, b = out[f"visible_{window}"], out[f"visible_{cfg.compression.capacity}"]
  out["full_bank_over_window"] = {
    "update": b["update_seconds"] / a["update_seconds"],
    "sample_step": b["sample_step_seconds"] / a["sample_step_seconds"],
  }
  return out


def _by_kind(cfg: Config, policy, params, tasks) -> dict:
  """The LSTM's relative surprise per kind of step (fact/key, question/door, boundary,
  common filler, less common filler): min / median / max over the episodes; and the learned
  salience (keep probability) likewise when the filter has one. Shows how far apart the
  steps worth keeping and the chit-chat are by each score."""
  c = cfg.compression
  scan = jax.jit(policy.comp.scan_trajectory)
  kinds: dict[str, list] = {}
  sal_kinds: dict[str, list] = {}
  for t in tasks:
    obs, acts, graded = script(t, L.TOK)
    seg, segv = right_pad(
      [segment(o, a, c.step_len) for o, a in zip(obs, acts, strict=True)], c.step_len, L.TOK.pad_id
    )
    text = t.prompt.split(SEP)
    v = policy.comp.encode(params, jnp.asarray(seg), jnp.asarray(segv))
    rew = jnp.asarray([1.0 if s in graded else 0.0 for s in range(len(obs))])
    bnd = jnp.asarray([o in BOUNDARIES for o in text])
    _, info = scan(params, v, rew, bnd, jnp.ones(len(obs), bool))
    sur = np.asarray(info["surprise"])
    sal = np.asarray(info["salience"])
    for k, o in enumerate(text[1:], start=1):  # step 0 has no prediction
      kind = (
        "fact"
        if (":" in o or "code" in o)
        else "question"
        if o.endswith("?")
        else "boundary"
        if o in BOUNDARIES
        else "filler"
        if o in ("Go on.", "hall.")
        else "filler_variant"
      )
      kinds.setdefault(kind, []).append(float(sur[k]))
      sal_kinds.setdefault(kind, []).append(float(sal[k]))

  def table(by):
    return {
      k: {"n": len(x), "min": min(x), "median": float(np.median(x)), "max": max(x)}
      for k, x in by.items()
    }

  out = {"surprise_by_kind": table(kinds)}
  if c.salience == "learned":
    out["salience_by_kind"] = table(sal_kinds)
  return out


def long_bytes_and_filters(
  cfg: Config, progs, policy, params, long_tasks, *, n_steps: int, log, kept_long=None
) -> dict:
  """`bytes_per_stage` on the 1,000-step episodes (`n_steps` steps) and `filter_ablations`
  with the same trained parameters, logged; `kept_long`: the long accuracy a resumed file
  holds of other arms (a run with --arms), carried over."""
  stages = bytes_per_stage(cfg, progs, policy, params, long_tasks)
  if kept_long:
    stages["long_accuracy"] = kept_long
  log(
    f"  {n_steps}-step bytes: "
    + ", ".join(f"{k} {v / 1e3:.1f} kB" for k, v in stages["bytes"].items())
  )
  log(
    f"  facts kept {stages['facts_kept_frac']:.3f}, visible at their question "
    f"{stages['facts_visible_at_question_frac']:.3f}, evictions {stages['evicted']}, "
    f"dropped (bank full) {stages['dropped_bank_full']}"
  )
  # Ablations with the same trained parameters: each filter, whole bank vs a window.
  stages["filters"] = filter_ablations(cfg, params, long_tasks)
  for k, v in stages["filters"].items():
    log(
      f"  {k}: facts kept {v['facts_kept_frac']:.3f}, visible at their question "
      f"{v['facts_visible_at_question_frac']:.3f}"
    )
  return stages


def long_bytes_part(
  task: dict, cfg: Config, progs_policy, params, long_spec, long_tasks, *, episodes: int, out, log
) -> tuple[dict, bool]:
  """A task's bytes per stage and filters on its `episodes` long episodes (`long_tasks` of
  `long_spec`; `long_bytes_and_filters` with the compressed arm's (programs, policy) and
  `params` under `cfg`), unless the task (as the file `out` holds it) has them for as many
  episodes already, or the compressed arm is not in this run (`params` None): (its
  bytes_per_stage, whether measured here); logged."""
  n_long = long_spec.n_steps
  stages = task.get("bytes_per_stage") or {}
  if stages.get("episodes") == episodes and "filters" in stages:
    log(f"  {n_long}-step bytes and filters: kept from {out}")
  elif params is None:
    log(
      f"  {n_long}-step bytes and filters need the compressed arm: not in "
      f"this run (--arms) nor kept in {out}"
    )
  else:
    # Other arms' long accuracy (a run with --arms), if any, stays.
    stages = long_bytes_and_filters(
      cfg,
      *progs_policy,
      params,
      long_tasks,
      n_steps=n_long,
      log=log,
      kept_long=stages.get("long_accuracy"),
    )
    return stages, True
  return stages, False
