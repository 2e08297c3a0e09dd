"""Measures on this machine the costs that drive the cluster simulator (`sao_jax.sim`) and
writes them to results/sim_costs.json, with the command, commit and machine.

  python experiments/calibrate_sim.py --sft-from results/bench_sync_vs_async/sft   # ~4 min
  python experiments/calibrate_sim.py                 # trains the config's SFT start first
  python experiments/calibrate_sim.py --quick --out /tmp/c.json   # smoke run (tests)

Everything is timed with the library's own jitted programs and code paths, on the config
that the benchmark runs (`experiments/bench_sync_vs_async.py`, same --config/--set):

  inline profile   `progs.sample` in this process (default XLA threads): GRPO samples its
                   batch in the learner process. Per compiled batch B, the median call of a
                   random-init policy (it almost never emits EOS, so every call runs the
                   full T = rl.max_new_tokens steps) and the median call of the same program
                   compiled for 1 token give decode(B) = (t_T - t_1) / (T - 1) and
                   prefill(B) = t_1 - decode(B). Calls of the SFT policy (natural lengths)
                   check the line: `check_rel_err` is its prediction's error on them.
  sampler profile  the same for `sao_sampling` (the sampler's whole call: padding, the jitted
                   sample, environment steps) inside a spawned process configured as a
                   sampler process is (`sao.sampler_threads`); plus its start-up (spawn to
                   the end of its first call), parameter load (poll + unflatten + device_put)
                   and per-record encode + queue put.
  contention       windows of a few seconds, in rounds: the sampler process alone (full-length
                   calls), both (calls and SAO updates), the updates alone; the slowdown of
                   each is its median in "both" over its median alone (they share the cores).
Everything timed in this process is timed in rounds (one sample of each cost per round),
so that drift in the machine's other load falls on all costs alike.
  update           the jitted SAO and GRPO updates at the benchmark's rows (and half of them),
                   the first call's compilation, parameter publish, the learner's per-step
                   bookkeeping (record decode, journal, metrics row), and the shadow-model
                   validation that SAO runs every `recovery.shadow_every` updates.
  transport        latency and bandwidth of the embedded queue for a record of this size,
                   from results/bench_transport.json (else measured here).
  lengths          completion lengths of the SFT policy at the RL temperature.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent


def _two_point(full: list[tuple[int, float]], one: list[float], t_max: int,
               check: list[tuple[int, float]]) -> dict:
  """decode and prefill from full-length calls (those that ran all `t_max` steps) and
  1-token calls, by medians; `check`: (steps, seconds) of natural-length calls."""
  t_full = float(np.median([dt for n, dt in full if n == t_max] or [dt for _, dt in full]))
  t_one = float(np.median(one))
  decode = max(0.0, (t_full - t_one) / (t_max - 1))
  prefill = max(0.0, t_one - decode)
  pred = np.array([prefill + decode * n for n, _ in check])
  real = np.array([dt for _, dt in check])
  return {"prefill_s": prefill, "decode_s": decode, "t_full_s": t_full, "t_one_s": t_one,
          "full_length_calls": sum(n == t_max for n, _ in full), "n": len(full) + len(one),
          "check_rel_err": float(np.median(pred / real) - 1.0) if len(check) else None}


def _machine() -> dict:
  import jax
  with open("/proc/loadavg") as f:
    load = f.read().split()[:3]
  return {"platform": platform.platform(), "cpus": os.cpu_count(), "jax": jax.__version__,
          "devices": [str(d) for d in jax.devices()], "loadavg_1_5_15": [float(v) for v in load]}


def _commit() -> str:
  try:
    return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                          cwd=HERE, check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return "unknown"


def _setup(cfg_dict: dict):
  from sao_jax import config as config_lib
  from sao_jax.runners import train
  return train.make_setup(config_lib.from_dict(cfg_dict))


def _one_token_programs(s, mesh=None):
  """The sampling program compiled for a 1-token completion (prefill + one step)."""
  from sao_jax.learner import make_optimizer, make_sft_update
  from sao_jax.runners.compiled import compile_programs
  tx = make_optimizer(s.cfg.sft.optim, 0)
  return compile_programs(s.cfg, s.model, tx, make_sft_update(s.model, tx), with_ref=False,
                          prompt_len=s.prompt_len, max_new_tokens=1,
                          temperature=s.cfg.rl.temperature, eos_id=s.tok.eos_id,
                          pad_id=s.tok.pad_id, mesh=mesh)


def _sampler_child(cfg_dict, param_dir, sizes, reps, t_spawn, out_q, window, run):
  """Runs in a process configured like a sampler process; reports through `out_q`."""
  from sao_jax.runners.sampler_proc import SamplerSpec, _configure_process
  cfg_threads = cfg_dict["sao"]["sampler_threads"]
  _configure_process(SamplerSpec(sampler_id=0, config=cfg_dict, param_dir=param_dir,
                                 transport=None, seed=0, threads=cfg_threads))
  import jax

  from sao_jax.config import MeshConfig
  from sao_jax.learner import make_sft_update
  from sao_jax.rollout import sao_sampling
  from sao_jax.runners import train
  from sao_jax.sharding import make_mesh
  from sao_jax.transport import records
  from sao_jax.transport.params import ParamSubscriber, unflatten

  s = _setup(cfg_dict)
  mesh = make_mesh(MeshConfig(shape=(1, 1, 1)), jax.devices()[:1])
  progs = train.programs_for(s, s.cfg.sft.optim, make_sft_update, mesh=mesh)
  one_tok = _one_token_programs(s, mesh)
  like = progs.init(jax.random.key(0)).params
  rand_params = like
  rng = np.random.default_rng(0)
  key = [jax.random.key(1)]

  def load():
    version, flat = ParamSubscriber(param_dir).poll(-1)
    return jax.block_until_ready(jax.device_put(unflatten(like, flat),
                                                progs.state_sharding.params))

  def call(params, slots, fn=None):
    idx = rng.integers(0, len(s.train), slots)
    tasks = [s.train[i] for i in idx]
    envs = [train.make_env(s) for _ in tasks]
    key[0], sub = jax.random.split(key[0])
    t0 = time.perf_counter()
    trajs = sao_sampling(fn or progs.sample, params, envs, tasks, idx.tolist(), s.tok, slots=slots,
                         prompt_len=s.prompt_len, max_steps=envs[0].max_steps, rng=sub,
                         policy_version=0)
    dt = time.perf_counter() - t0
    return dt, int(max(t.valid.sum() for t in trajs)), trajs

  params = load()
  slots = s.cfg.sao.sampler_slots
  call(params, slots)
  start_s = time.time() - t_spawn
  loads = []
  for _ in range(5):
    t0 = time.perf_counter()
    load()
    loads.append(time.perf_counter() - t0)
  fits, raw = {}, {}
  t_max = s.cfg.rl.max_new_tokens
  for b in sizes:
    for pr, fn in ((rand_params, progs.sample), (rand_params, one_tok.sample),
                   (params, progs.sample)):
      call(pr, b, fn)  # compile + warm
  samples = {b: {"full": [], "one": [], "check": []} for b in sizes}
  for _ in range(reps):  # rounds over all sizes: load drift on a shared machine hits each alike
    for b in sizes:
      dt, steps, _ = call(rand_params, b)
      samples[b]["full"].append((steps, dt))
      samples[b]["one"].append(call(rand_params, b, one_tok.sample)[0])
      dt, steps, _ = call(params, b)
      samples[b]["check"].append((steps, dt))
  for b in sizes:
    fits[b] = _two_point(samples[b]["full"], samples[b]["one"], t_max, samples[b]["check"])
    raw[b] = samples[b]
  _, _, trajs = call(params, slots)
  q = mp.get_context("spawn").Queue()
  enc = []
  for i, t in enumerate(trajs):
    t0 = time.perf_counter()
    data = records.encode(records.RecordKind.TRAJECTORY, i, 0, t.arrays(),
                          {"task_index": t.task_index, "task_id": t.task_id,
                           "reward": t.total_reward, "t_end": t.t_end, "sampler": 0,
                           "done": t.done})
    q.put(data)
    enc.append(time.perf_counter() - t0)
  record_bytes = len(data)
  for _ in trajs:
    q.get()
  q.close()
  out_q.put({"start_s": start_s, "load_s": float(np.median(loads)), "fits": fits, "raw": raw,
             "emit_s": float(np.median(enc)), "record_bytes": record_bytes})
  calls = []  # (window, seconds) of full-length calls while the parent says "run"
  while window.value >= 0:
    if run.value:
      w = window.value
      calls.append((w, call(rand_params, slots)[0]))
    else:
      time.sleep(0.01)
  out_q.put({"calls": calls})


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--config", default=str(HERE / "configs" / "sao_arith.py"))
  p.add_argument("--variant", default="default")
  p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
  p.add_argument("--sft-from", default="", help="workdir or checkpoint folder of an SFT run "
                 "(e.g. the benchmark's OUT/sft); default: train the config's SFT here")
  p.add_argument("--transport-json", default="results/bench_transport.json")
  p.add_argument("--reps", type=int, default=10, help="timed calls per batch size")
  p.add_argument("--quick", action="store_true", help="smoke run: few sizes and reps")
  p.add_argument("--out", default="results/sim_costs.json")
  args = p.parse_args(argv)

  import jax
  from sao_jax.runners.batching import encode_prompts

  from sao_jax import config as config_lib
  from sao_jax import recovery
  from sao_jax.learner import make_rl_update, make_sao_update, make_sft_update
  from sao_jax.metrics import MetricsWriter
  from sao_jax.runners import train
  from sao_jax.sim import Costs, Profile
  from sao_jax.transport import records
  from sao_jax.transport.params import ParamPublisher

  t_start = time.time()
  machine_before = _machine()
  cfg = config_lib.load_config(args.config, args.variant, args.set)
  s = train.make_setup(cfg)
  rl, sao = cfg.rl, cfg.sao
  reps = 2 if args.quick else args.reps
  tmp = pathlib.Path(tempfile.mkdtemp(prefix="calib_"))
  if args.sft_from:
    state = train.restore_init(s, args.sft_from)
  else:
    w = MetricsWriter(tmp / "sft", show_progress=False)
    state, _, _ = train.run_sft(s, w, None, tmp / "sft")
    w.close()
  params = state.params
  n_params = int(sum(x.size for x in jax.tree.leaves(params)))
  progs = train.programs_for(s, cfg.sft.optim, make_sft_update)
  rand_params = progs.init(jax.random.key(123)).params
  rng = np.random.default_rng(0)
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
  for _ in range(2 if args.quick else 16):
    _, out, tasks = sample(params, rows)
    lengths += np.asarray(out.lengths_b).tolist()
  inline_sizes = [rows] if args.quick else sorted({16, 64, rows, 2 * rows})
  one_tok = _one_token_programs(s)
  for b in inline_sizes:
    for pr, fn in ((rand_params, progs.sample), (rand_params, one_tok.sample),
                   (params, progs.sample)):
      sample(pr, b, fn)  # compile + warm
  t0 = time.perf_counter()
  for _ in range(3):
    train.score(s, tasks, np.asarray(out.tokens_bt))
  score_s = (time.perf_counter() - t0) / (3 * rows)
  rewards = rng.integers(0, 2, rows).astype(np.float32)
  prompt_rows, pvalid_rows = encode_prompts(s.tok, [t.prompt for t in tasks], s.prompt_len)

  def batch_for(kind: str, n: int) -> dict:
    reps_n = -(-n // rows)
    cat = lambda a: np.concatenate([np.asarray(a)] * reps_n)[:n]  # noqa: E731
    b = {"prompt": cat(prompt_rows), "prompt_valid": cat(pvalid_rows),
         "tokens": cat(out.tokens_bt), "valid": cat(out.valid_bt), "logp": cat(out.logp_bt),
         "rewards": cat(rewards)}
    if kind == "sao":
      b.update(task=rng.integers(0, len(s.train), n).astype(np.int32),
               staleness=rng.integers(0, 3, n).astype(np.int32), row_valid=np.ones(n, bool),
               poison=np.zeros(n, np.float32))
    return b

  makers = {"sao": (lambda m, tx: make_sao_update(m, tx, rl, sao), dict(num_tasks=len(s.train))),
            "grpo": (lambda m, tx: make_rl_update(m, tx, rl), dict(with_ref=rl.kl_coef > 0))}
  update_compile, uprogs, ustates, update_sizes = {}, {}, {}, {}
  bs = sao.batch_size
  for kind, (maker, kw) in makers.items():
    up = train.programs_for(s, rl.optim, maker, **kw)
    st = up.init(jax.random.key(1)).replace(params=train.copy_tree(params))
    n_rows = bs if kind == "sao" else rows
    update_sizes[kind] = [n_rows] if args.quick else sorted({n_rows // 2, n_rows})
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
  inline_fits = {b: _two_point(v["full"], v["one"], rl.max_new_tokens, v["check"])
                 for b, v in inline_samples.items()}
  inline_raw = inline_samples
  update_pts = {k: {n: float(np.median(upd_samples[(k, n)])) for n in update_sizes[k]}
                for k in makers}
  for kind in makers:
    update_compile[kind] -= update_pts[kind][bs if kind == "sao" else rows]
  per_step = {b: round(f["decode_s"], 5) for b, f in inline_fits.items()}
  print(f"inline profile: {per_step} s/step; lengths mean {np.mean(lengths):.2f}", flush=True)
  print(f"updates: {update_pts}", flush=True)

  # -- the learner's bookkeeping per step, publish, shadow validation --------------------------
  pub = ParamPublisher(tmp / "params")
  t0 = time.perf_counter()
  for v in range(5):
    pub.publish(v, params)
  publish_s = (time.perf_counter() - t0) / 5
  one = batch_for("grpo", rows)
  recs = [records.encode(records.RecordKind.TRAJECTORY, i, 0,
                         {k: np.asarray(one[k])[i % rows][None]
                          for k in ("prompt", "prompt_valid", "tokens", "valid", "logp")},
                         {"task_index": 0, "task_id": 0, "reward": 1.0, "t_end": 0.0})
          for i in range(bs)]
  journal = recovery.Journal(tmp / "journal")
  writer = MetricsWriter(tmp / "metrics", show_progress=False)
  metrics_row = {f"m{i}": 0.5 for i in range(40)}
  t0 = time.perf_counter()
  for step in range(10):
    for r in recs:
      records.decode(r)
    journal.append(recs)
    writer.write(step, metrics_row, phase="rl")
  sao_overhead = (time.perf_counter() - t0) / 10
  t0 = time.perf_counter()
  for step in range(10):
    encode_prompts(s.tok, [t.prompt for t in tasks], s.prompt_len)
    writer.write(step, metrics_row, phase="rl")
  grpo_overhead = (time.perf_counter() - t0) / 10
  writer.close()
  journal.close()
  n_val = cfg.recovery.val_problems if cfg.recovery.shadow_every else 0
  periodic = {"sao": [], "grpo": []}
  if n_val:
    val_tasks = s.train[len(s.train) - n_val:]
    train.evaluate(s, uprogs["sao"], params, tasks=val_tasks)
    t0 = time.perf_counter()
    train.evaluate(s, uprogs["sao"], params, tasks=val_tasks)
    periodic["sao"].append(["shadow_validation", cfg.recovery.shadow_every,
                            time.perf_counter() - t0])

  # -- transport ------------------------------------------------------------------------------
  transport_src = args.transport_json
  tj = pathlib.Path(args.transport_json)
  if tj.exists():
    emb = json.loads(tj.read_text())["embedded"]
    size = "1KB" if len(recs[0]) < 32 * 1024 else "64KB"
    latency_s = emb[size]["latency_p50_ms"] / 1e3
    bandwidth = emb["1MB"]["throughput_mb_per_s"] * 2**20
  else:
    transport_src = "measured here: spawn-context queue, one process"
    q = mp.get_context("spawn").Queue()
    lat = []
    for _ in range(200):
      t0 = time.perf_counter()
      q.put(recs[0])
      q.get()
      lat.append(time.perf_counter() - t0)
    q.close()
    latency_s, bandwidth = float(np.median(lat)), len(recs[0]) / float(np.median(lat))

  # -- the sampler process: solo, then contended with updates ----------------------------------
  ctx = mp.get_context("spawn")
  out_q, window, run = ctx.Queue(), ctx.Value("i", 0), ctx.Value("i", 0)
  sizes = [sao.sampler_slots] if args.quick else sorted({1, 8, 32, sao.sampler_slots,
                                                         2 * sao.sampler_slots})
  child = ctx.Process(target=_sampler_child, args=(config_lib.to_dict(cfg), str(tmp / "params"),
                                                   sizes, reps, time.time(), out_q, window, run),
                      daemon=True)
  child.start()
  # Contention: windows of sampler alone / both / update alone, in rounds, so that drift in
  # the machine's other load falls on all three alike.
  kinds = ("sampler", "both", "update")
  win_s = 1.0 if args.quick else 6.0
  upd_times: dict[str, list[float]] = {"both": [], "update": []}
  try:
    solo = out_q.get(timeout=1800)
    st, up = ustates["sao"], uprogs["sao"]
    for rnd in range(1 if args.quick else 3):
      for k, kind in enumerate(kinds):
        window.value = 3 * rnd + k
        run.value = int(kind != "update")
        t_end = time.time() + win_s
        while time.time() < t_end:
          if kind == "sampler":
            time.sleep(0.05)
            continue
          b = up.shard_batch(batch_for("sao", bs))
          t0 = time.perf_counter()
          st, m = up.update(st, b)
          jax.device_get(m)
          upd_times[kind].append(time.perf_counter() - t0)
    run.value = 0
    window.value = -1
    calls = out_q.get(timeout=600)["calls"]
  finally:
    window.value = -1
    child.join(timeout=60)
    if child.is_alive():
      child.kill()
      child.join()
  by_kind = {kind: [dt for w, dt in calls if kinds[w % 3] == kind] for kind in kinds[:2]}
  sampling_slowdown = float(np.median(by_kind["both"]) / np.median(by_kind["sampler"]))
  update_slowdown = float(np.median(upd_times["both"]) / np.median(upd_times["update"]))
  update_contended = float(np.median(upd_times["both"]))
  contended = {"sampler_calls": by_kind, "updates": upd_times}
  print(f"contention: update x{update_slowdown:.2f}, sampling x{sampling_slowdown:.2f} "
        f"({len(by_kind['both'])} contended sampler calls)", flush=True)

  def profile(fits, **kw):
    return Profile(decode_s=tuple((float(b), f["decode_s"]) for b, f in sorted(fits.items())),
                   prefill_s=tuple((float(b), f["prefill_s"]) for b, f in sorted(fits.items())),
                   **kw)

  costs = Costs(
      profiles={
          # sao_sampling's fit already holds the environment steps: score_s is 0 there
          "sampler": profile(solo["fits"], score_s=0.0, emit_s=solo["emit_s"],
                             start_s=solo["start_s"]),
          "inline": profile(inline_fits, score_s=score_s, start_s=inline_compile),
      },
      update_s={k: tuple((float(n), t) for n, t in sorted(v.items()))
                for k, v in update_pts.items()},
      lengths=tuple(int(n) for n in lengths),
      first_update_extra_s=update_compile,
      step_overhead_s={"sao": sao_overhead, "grpo": grpo_overhead},
      periodic={k: tuple(tuple(x) for x in v) for k, v in periodic.items()},
      publish_s=publish_s, load_s=solo["load_s"],
      transport_latency_s=latency_s, transport_bytes_per_s=bandwidth,
      record_bytes=float(solo["record_bytes"]),
      update_with_sampling=max(1.0, update_slowdown),
      sampling_with_update=max(1.0, sampling_slowdown))
  # the matmul rate of this CPU, for scaling the costs to other hardware
  import jax.numpy as jnp
  n = 512 if args.quick else 1024
  a = jnp.ones((n, n), jnp.float32)
  mm = jax.jit(lambda x: x @ x)
  mm(a).block_until_ready()
  t0 = time.perf_counter()
  for _ in range(10):
    mm(a).block_until_ready()
  matmul_flops = 2 * n ** 3 * 10 / (time.perf_counter() - t0)

  result = {
      "command": " ".join([sys.executable.split("/")[-1], *sys.argv]),
      "commit": _commit(), "machine": machine_before, "machine_after": _machine(),
      "config": config_lib.to_dict(cfg), "calibration_s": time.time() - t_start,
      "costs": costs.to_dict(),
      "details": {
          "model_params": n_params, "matmul_flops_per_s": matmul_flops,
          "sampler_fits": solo["fits"], "inline_fits": inline_fits,
          "sampler_raw": solo["raw"], "inline_raw": inline_raw,
          "update_contended_s": update_contended, "contention_windows": contended,
          "transport_source": transport_src, "sft_from": args.sft_from or "trained here",
          "lengths": {"mean": float(np.mean(lengths)), "max": int(np.max(lengths)),
                      "cv": float(np.std(lengths) / np.mean(lengths))},
          "unmodelled": ["Orbax snapshots every checkpoint_every updates (asynchronous)",
                         "held-out evaluations inside the loop (benchmark: --eval-every "
                         "beyond the run)", "other processes on the machine"]}}
  path = pathlib.Path(args.out)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(result, indent=1, default=float))
  print(f"calibration: {time.time() - t_start:.0f} s -> {path}", flush=True)
  return result


if __name__ == "__main__":
  main()
