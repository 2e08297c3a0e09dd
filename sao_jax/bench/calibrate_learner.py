"""The learner side of the simulator's calibration (experiments/calibrate_sim.py), each part
timed in the calibrating process: the inline sampling profile and the jitted updates
(`inline_and_updates`), the learner's per-step bookkeeping, publish and shadow validation
(`learner_overheads`), the transport (`transport_costs`), the sampler process against the
updates on shared cores (`contention`), and the `sim.Costs` they make (`build_costs`). JAX is
imported inside the functions, as in `calibrate_sampler`: the script that imports this module
is also what a spawned sampler child imports first."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing as mp
import os
import pathlib
import platform
import time
from collections.abc import Callable

import numpy as np

from sao_jax.bench.calibrate_sampler import (
  env_seconds_per_row,
  from_child,
  one_token_programs,
  sampler_child,
  two_point,
)


def machine() -> dict:
  import jax

  with open("/proc/loadavg") as f:
    load = f.read().split()[:3]
  return {
    "platform": platform.platform(),
    "cpus": os.cpu_count(),
    "jax": jax.__version__,
    "devices": [str(d) for d in jax.devices()],
    "loadavg_1_5_15": [float(v) for v in load],
  }


@dataclasses.dataclass
class InProcess:
  """What `inline_and_updates` measured, and what the later parts time with: the update
  programs and states, and `batch_for(kind, n)`, an update's batch of n rows."""

  rows: int  # GRPO's rows per step (prompts_per_step x group_size)
  tasks: list  # the tasks of the last sampled batch of `rows`
  lengths: list[int]  # completion lengths of the SFT policy
  inline_compile: float
  inline_fits: dict
  inline_raw: dict
  score_s: float
  update_pts: dict
  update_compile: dict
  uprogs: dict
  ustates: dict
  batch_for: Callable


def inline_and_updates(s, params, progs, rand_params, rng, reps: int, quick: bool) -> InProcess:
  """Lengths of the SFT policy; the inline profile (`progs.sample` in this process, fit by
  `two_point`) and the SAO and GRPO updates at their rows (and half), timed in rounds: each
  round takes one sample of everything, so load drift on a shared machine falls on all costs
  alike."""
  import jax

  from sao_jax.batches import RLBatch, SAOBatch
  from sao_jax.learner import make_rl_update, make_sao_update
  from sao_jax.packing import encode_prompts
  from sao_jax.runners.common import programs_for
  from sao_jax.state import copy_tree

  cfg = s.cfg
  rl, sao = cfg.rl, cfg.sao
  key = [jax.random.key(0)]

  def sample(pr, b, fn=None):
    idx = rng.integers(0, len(s.train), b)
    tasks = [s.train[i] for i in idx]
    prompt, pvalid = encode_prompts(s.tok, [t.prompt for t in tasks], s.prompt_len)
    key[0], sub = jax.random.split(key[0])
    t0 = time.perf_counter()
    out = jax.device_get((fn or progs.sample)(pr, prompt, pvalid, sub))
    return time.perf_counter() - t0, out, tasks

  # -- lengths of the SFT policy; programs of the inline profile and of the updates ----------
  rows = rl.prompts_per_step * rl.group_size
  t0 = time.perf_counter()
  sample(params, rows)
  inline_compile = time.perf_counter() - t0
  lengths = []
  for _ in range(2 if quick else 16):
    _, out, tasks = sample(params, rows)
    lengths += np.asarray(out.lengths_b).tolist()
  inline_sizes = [rows] if quick else sorted({16, 64, rows, 2 * rows})
  one_tok = one_token_programs(s)
  for b in inline_sizes:
    for pr, fn in (
      (rand_params, progs.sample),
      (rand_params, one_tok.sample),
      (params, progs.sample),
    ):
      sample(pr, b, fn)  # compile + warm
  score_s = env_seconds_per_row(s, tasks, out.tokens_bt, 3)  # as run_grpo scores a step
  rewards = rng.integers(0, 2, rows).astype(np.float32)
  prompt_rows, pvalid_rows = encode_prompts(s.tok, [t.prompt for t in tasks], s.prompt_len)

  def batch_for(kind: str, n: int):
    """An update's batch of n rows (the sampled rows repeated), as its runner builds it."""
    reps_n = -(-n // rows)
    cat = lambda a: np.concatenate([np.asarray(a)] * reps_n)[:n]  # noqa: E731
    fields = dict(
      prompt_bp=cat(prompt_rows),
      prompt_valid_bp=cat(pvalid_rows),
      tokens_bt=cat(out.tokens_bt),
      valid_bt=cat(out.valid_bt),
      logp_bt=cat(out.logp_bt),
      rewards_b=cat(rewards),
    )
    if kind == "sao":
      return SAOBatch.single_steps(
        staleness_b=rng.integers(0, 3, n),
        **fields,
        task_b=rng.integers(0, len(s.train), n).astype(np.int32),
      )
    return RLBatch(**fields)

  with_ref = rl.kl_coef > 0
  makers = {
    "sao": (
      lambda m, tx: make_sao_update(m, tx, rl, sao),
      dict(num_tasks=len(s.train), with_ref=with_ref),
    ),
    "grpo": (lambda m, tx: make_rl_update(m, tx, rl), dict(with_ref=with_ref)),
  }
  update_compile, uprogs, ustates, update_sizes = {}, {}, {}, {}
  bs = sao.batch_size
  for kind, (maker, kw) in makers.items():
    up = programs_for(s, rl.optim, maker, **kw)
    st = up.init(jax.random.key(1)).replace(
      params=copy_tree(params), ref_params=copy_tree(params) if with_ref else None
    )
    n_rows = bs if kind == "sao" else rows
    update_sizes[kind] = [n_rows] if quick else sorted({n_rows // 2, n_rows})
    for n in update_sizes[kind]:
      b = up.shard_batch(batch_for(kind, n))
      t0 = time.perf_counter()
      st, m = up.update(st, b)
      jax.block_until_ready(m)
      if n == n_rows:
        update_compile[kind] = time.perf_counter() - t0
    uprogs[kind], ustates[kind] = up, st

  # -- timed in rounds: each round takes one sample of everything, so load drift on a shared
  # machine falls on all costs alike
  inline_samples = {b: {"full": [], "one": [], "check": []} for b in inline_sizes}
  upd_samples = {(k, n): [] for k in makers for n in update_sizes[k]}
  for _ in range(reps):
    for b in inline_sizes:
      dt, o, _ = sample(rand_params, b)
      inline_samples[b]["full"].append((int(np.asarray(o.lengths_b).max()), dt))
      inline_samples[b]["one"].append(sample(rand_params, b, one_tok.sample)[0])
      dt, o, _ = sample(params, b)
      inline_samples[b]["check"].append((int(np.asarray(o.lengths_b).max()), dt))
    for kind, n in upd_samples:
      up = uprogs[kind]
      b = up.shard_batch(batch_for(kind, n))
      t0 = time.perf_counter()
      ustates[kind], m = up.update(ustates[kind], b)
      jax.device_get(m)
      upd_samples[(kind, n)].append(time.perf_counter() - t0)
  inline_fits = {
    b: two_point(v["full"], v["one"], rl.max_new_tokens, v["check"])
    for b, v in inline_samples.items()
  }
  update_pts = {
    k: {n: float(np.median(upd_samples[(k, n)])) for n in update_sizes[k]} for k in makers
  }
  for kind in makers:
    update_compile[kind] -= update_pts[kind][bs if kind == "sao" else rows]
  return InProcess(
    rows=rows,
    tasks=tasks,
    lengths=lengths,
    inline_compile=inline_compile,
    inline_fits=inline_fits,
    inline_raw=inline_samples,
    score_s=score_s,
    update_pts=update_pts,
    update_compile=update_compile,
    uprogs=uprogs,
    ustates=ustates,
    batch_for=batch_for,
  )


def learner_overheads(s, params, run: InProcess, tmp: pathlib.Path) -> dict:
  """The learner's costs besides its updates: parameter publish (`publish_s`), the per-step
  bookkeeping of SAO (record decode, journal, ledger, metrics row) and of GRPO (prompt
  encoding, metrics row), the shadow validation SAO runs every `recovery.shadow_every`
  updates (`periodic`); and one batch's encoded trajectory records (`recs`)."""
  from sao_jax import recovery
  from sao_jax.evaluation import evaluate
  from sao_jax.metrics import MetricsWriter
  from sao_jax.packing import encode_prompts
  from sao_jax.transport import records
  from sao_jax.transport.params import ParamPublisher

  cfg, rows, bs = s.cfg, run.rows, s.cfg.sao.batch_size
  pub = ParamPublisher(tmp / "params")
  t0 = time.perf_counter()
  for v in range(5):
    pub.publish(v, params)
  publish_s = (time.perf_counter() - t0) / 5
  one = run.batch_for("grpo", rows)

  def traj_arrays(i):  # a one-step trajectory's arrays, as rollout.Trajectory.arrays gives
    valid = np.asarray(one.valid_bt[i])[None]
    return {
      "prompt": np.asarray(one.prompt_bp[i])[None],
      "prompt_valid": np.asarray(one.prompt_valid_bp[i])[None],
      "tokens": np.asarray(one.tokens_bt[i])[None],
      "valid": valid,
      "logp": np.asarray(one.logp_bt[i])[None],
      "rewards": np.ones(1, np.float32),
      "step_seconds": np.ones(1, np.float32),
      "version": np.where(valid, 0, -1).astype(np.int32),
    }

  recs = [
    records.encode(
      records.RecordKind.TRAJECTORY,
      i,
      0,
      traj_arrays(i % rows),
      {"task_index": 0, "task_id": 0, "reward": 1.0, "t_end": 0.0},
    )
    for i in range(bs)
  ]
  journal = recovery.Journal(tmp / "journal")
  ledger = recovery.Ledger(tmp / "ledger.jsonl")
  writer = MetricsWriter(tmp / "metrics", show_progress=False)
  metrics_row = {f"m{i}": 0.5 for i in range(40)}
  t0 = time.perf_counter()
  for step in range(10):  # what SAOLearner does per update besides the update itself
    ids = [records.decode(r).record_id for r in recs]
    journal.append(recs)
    ledger.append(step, ids, [])
    writer.write(step, metrics_row, phase="rl")
  sao_overhead = (time.perf_counter() - t0) / 10
  t0 = time.perf_counter()
  for step in range(10):
    encode_prompts(s.tok, [t.prompt for t in run.tasks], s.prompt_len)
    writer.write(step, metrics_row, phase="rl")
  grpo_overhead = (time.perf_counter() - t0) / 10
  writer.close()
  journal.close()
  ledger.close()
  n_val = cfg.recovery.val_problems if cfg.recovery.shadow_every else 0
  periodic = {"sao": [], "grpo": []}
  if n_val:
    val_tasks = s.train[len(s.train) - n_val :]
    up = run.uprogs["sao"]
    evaluate(s, up, params, batch_divisor=up.batch_divisor, tasks=val_tasks)
    t0 = time.perf_counter()
    evaluate(s, up, params, batch_divisor=up.batch_divisor, tasks=val_tasks)
    periodic["sao"].append(
      ["shadow_validation", cfg.recovery.shadow_every, time.perf_counter() - t0]
    )
  return {
    "publish_s": publish_s,
    "recs": recs,
    "sao_overhead": sao_overhead,
    "grpo_overhead": grpo_overhead,
    "periodic": periodic,
  }


def transport_costs(transport_json: str, record: bytes) -> tuple[float, float, str]:
  """(latency s, bandwidth bytes/s, where they came from) of the embedded queue for a record
  like `record`: from bench_transport's result file when there is one, else measured here."""
  transport_src = transport_json
  tj = pathlib.Path(transport_json)
  if tj.exists():
    emb = json.loads(tj.read_text())["embedded"]
    size = "1KB" if len(record) < 32 * 1024 else "64KB"
    latency_s = emb[size]["latency_p50_ms"] / 1e3
    bandwidth = emb["1MB"]["throughput_mb_per_s"] * 2**20
  else:
    transport_src = "measured here: spawn-context queue, one process"
    q = mp.get_context("spawn").Queue()
    lat = []
    for _ in range(200):
      t0 = time.perf_counter()
      q.put(record)
      q.get()
      lat.append(time.perf_counter() - t0)
    q.close()
    latency_s, bandwidth = float(np.median(lat)), len(record) / float(np.median(lat))
  return latency_s, bandwidth, transport_src


def contention(s, run: InProcess, param_dir: pathlib.Path, reps: int, quick: bool) -> dict:
  """The sampler process (`sampler_child`, spawned, reading the parameters published under
  `param_dir`): its solo report, then windows of the sampler alone / both / the SAO update
  alone, in rounds, so that drift in the machine's other load falls on all three alike.
  Returns the solo report (`solo`), each window kind's sampler calls and update times, and the
  slowdowns (each one's median in "both" over its median alone)."""
  import jax

  from sao_jax import config as config_lib

  cfg = s.cfg
  sao, bs = cfg.sao, cfg.sao.batch_size
  ctx = mp.get_context("spawn")
  out_q, window, run_flag = ctx.Queue(), ctx.Value("i", 0), ctx.Value("i", 0)
  sizes = (
    [sao.sampler_slots] if quick else sorted({1, 8, 32, sao.sampler_slots, 2 * sao.sampler_slots})
  )
  child = ctx.Process(
    target=sampler_child,
    args=(
      config_lib.to_dict(cfg),
      str(param_dir),
      sizes,
      reps,
      quick,
      time.time(),
      out_q,
      window,
      run_flag,
    ),
    daemon=True,
  )
  child.start()
  kinds = ("sampler", "both", "update")
  win_s = 1.0 if quick else 6.0
  upd_times: dict[str, list[float]] = {"both": [], "update": []}
  try:
    solo = from_child(out_q, child, 1800)
    st, up = run.ustates["sao"], run.uprogs["sao"]
    for rnd in range(1 if quick else 3):
      for k, kind in enumerate(kinds):
        window.value = 3 * rnd + k
        run_flag.value = int(kind != "update")
        t_end = time.time() + win_s
        while time.time() < t_end:
          if kind == "sampler":
            time.sleep(0.05)
            continue
          b = up.shard_batch(run.batch_for("sao", bs))
          t0 = time.perf_counter()
          st, m = up.update(st, b)
          jax.device_get(m)
          upd_times[kind].append(time.perf_counter() - t0)
    run_flag.value = 0
    window.value = -1
    calls = from_child(out_q, child, 600)["calls"]
  finally:
    window.value = -1
    child.join(timeout=60)
    if child.is_alive():
      child.kill()
      child.join()
  by_kind = {kind: [dt for w, dt in calls if kinds[w % 3] == kind] for kind in kinds[:2]}
  return {
    "solo": solo,
    "sampler_calls": by_kind,
    "updates": upd_times,
    "sampling_slowdown": float(np.median(by_kind["both"]) / np.median(by_kind["sampler"])),
    "update_slowdown": float(np.median(upd_times["both"]) / np.median(upd_times["update"])),
    "update_contended": float(np.median(upd_times["both"])),
  }


def _points(d: dict) -> tuple:
  return tuple((float(k), float(v)) for k, v in sorted(d.items(), key=lambda kv: int(kv[0])))


def build_costs(
  run: InProcess,
  overheads: dict,
  contended: dict,
  *,
  latency_s: float,
  bandwidth: float,
):
  """The simulator's `Costs` from the measured parts: the sampler process's profile (its
  batch fits, continuous programs, start-up, load and emit: `contended["solo"]`), the inline
  profile and updates (`run`), the learner's overheads, the transport and the contention
  slowdowns (at least 1)."""
  from sao_jax.sim import Costs, Profile

  solo = contended["solo"]

  def profile(fits, **kw):
    return Profile(
      decode_s=tuple((float(b), f["decode_s"]) for b, f in sorted(fits.items())),
      prefill_s=tuple((float(b), f["prefill_s"]) for b, f in sorted(fits.items())),
      **kw,
    )

  cont = solo["continuous"]
  return Costs(
    profiles={
      # the batch fit leaves out the environment steps, charged per row (score_s)
      "sampler": profile(
        solo["fits"],
        score_s=cont["score_s"],
        emit_s=solo["emit_s"],
        start_s=solo["start_s"],
        fill_s=_points(cont["fill_s"]),
        slot_decode_s=_points(cont["slot_decode_s"]),
        slot_rows=cont["slots"],
        decode_call_s=cont["decode_call_s"],
        refresh_s=((float(cont["slots"]), cont["refresh_s"]),),
      ),
      "inline": profile(run.inline_fits, score_s=run.score_s, start_s=run.inline_compile),
    },
    update_s={
      k: tuple((float(n), t) for n, t in sorted(v.items())) for k, v in run.update_pts.items()
    },
    lengths=tuple(int(n) for n in run.lengths),
    first_update_extra_s=run.update_compile,
    step_overhead_s={"sao": overheads["sao_overhead"], "grpo": overheads["grpo_overhead"]},
    periodic={k: tuple(tuple(x) for x in v) for k, v in overheads["periodic"].items()},
    publish_s=overheads["publish_s"],
    load_s=solo["load_s"],
    transport_latency_s=latency_s,
    transport_bytes_per_s=bandwidth,
    record_bytes=float(solo["record_bytes"]),
    update_with_sampling=max(1.0, contended["update_slowdown"]),
    sampling_with_update=max(1.0, contended["sampling_slowdown"]),
  )


def matmul_rate(quick: bool) -> float:
  """The matmul rate of this CPU (float32 FLOP/s), for scaling the costs to other hardware."""
  import jax
  import jax.numpy as jnp

  n = 512 if quick else 1024
  a = jnp.ones((n, n), jnp.float32)
  mm = jax.jit(lambda x: x @ x)
  mm(a).block_until_ready()
  t0 = time.perf_counter()
  for _ in range(10):
    mm(a).block_until_ready()
  return 2 * n**3 * 10 / (time.perf_counter() - t0)
