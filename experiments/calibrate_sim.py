"""Measures on this machine the costs that drive the cluster simulator (`sao_jax.sim`) and
writes them to results/sim_costs.json, with the command, commit and machine.

  python experiments/calibrate_sim.py --sft-from runs/bench_sync_vs_async/seed0/sft  # ~7 min
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
  sampler profile  the same for `sao_sampling` (the batch sampler's call: padding, the
                   jitted sample; its environment steps are taken out and charged per row
                   as `score_s`: make, reset and step an environment) inside a spawned
                   process configured as a sampler process is (`samplers.threads`); plus
                   its start-up (spawn to the end of its first call), parameter load (poll +
                   unflatten + device_put) and per-record encode + queue put.
  continuous       in the same process, the continuous-batching programs of
                   `compile_slots` over `sao.sampler_slots` slots (`sao_jax.slots`): `fill`
                   of `sao.refill_rows` prompts (padding, the jitted prefill into free
                   slots); a `decode` call as the sampler makes it (the call, then the
                   host's reads of the finished rows) on an empty state (decode_call_s) and
                   with A slots decoding a random-init policy until all end, giving the
                   step cost as a function of A: (t_A - t_empty) / steps; `refresh` of every
                   slot's cache after a parameter swap. A `ContinuousSampler` loop of the
                   SFT policy (natural lengths) checks them: `check_rel_err` is the decode
                   calls' predicted time over their real time - 1, `loop_rel_err` the same
                   for the whole loop (fills, decode calls, environments; the rest of its
                   host work is not in the model).
  contention       windows of a few seconds, in rounds: the sampler process alone (full-length
                   batch calls), both (calls and SAO updates), the updates alone; the slowdown of
                   each is its median in "both" over its median alone (they share the cores).
Everything timed in this process is timed in rounds (one sample of each cost per round),
so that drift in the machine's other load falls on all costs alike.
  update           the jitted SAO and GRPO updates at the benchmark's rows (and half of them),
                   the first call's compilation, parameter publish, the learner's per-step
                   bookkeeping (record decode, journal, ledger, metrics row), the shadow-model
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
import queue
import tempfile
import time

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent


def _from_child(q, child, timeout: float):
  """The child's next report; fails at once (not at the timeout) if the child has died."""
  deadline = time.time() + timeout
  while True:
    try:
      return q.get(timeout=1.0)
    except queue.Empty:
      if not child.is_alive():
        raise RuntimeError(
          f"the sampler process exited (code {child.exitcode}) before it reported; its "
          "traceback is above"
        ) from None
      if time.time() > deadline:
        raise TimeoutError(f"no report from the sampler process in {timeout:.0f} s") from None


def _two_point(
  full: list[tuple[int, float]], one: list[float], t_max: int, check: list[tuple[int, float]]
) -> dict:
  """decode and prefill from full-length calls (those that ran all `t_max` steps) and
  1-token calls, by medians; `check`: (steps, seconds) of natural-length calls."""
  t_full = float(np.median([dt for n, dt in full if n == t_max] or [dt for _, dt in full]))
  t_one = float(np.median(one))
  decode = max(0.0, (t_full - t_one) / (t_max - 1))
  prefill = max(0.0, t_one - decode)
  pred = np.array([prefill + decode * n for n, _ in check])
  real = np.array([dt for _, dt in check])
  return {
    "prefill_s": prefill,
    "decode_s": decode,
    "t_full_s": t_full,
    "t_one_s": t_one,
    "full_length_calls": sum(n == t_max for n, _ in full),
    "n": len(full) + len(one),
    "check_rel_err": float(np.median(pred / real) - 1.0) if len(check) else None,
  }


def _machine() -> dict:
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


def _setup(cfg_dict: dict):
  from sao_jax import config as config_lib
  from sao_jax.setup import make_setup

  return make_setup(config_lib.from_dict(cfg_dict))


def _sampler_kw(s, max_new_tokens: int | None = None) -> dict:
  """The shapes and sampling constants a sampler process compiles its programs with."""
  return dict(
    prompt_len=s.prompt_len,
    max_new_tokens=max_new_tokens or s.cfg.rl.max_new_tokens,
    temperature=s.cfg.rl.temperature,
    eos_id=s.tok.eos_id,
    pad_id=s.tok.pad_id,
  )


def _one_token_programs(s, mesh=None):
  """The sampling program compiled for a 1-token completion (prefill + one step)."""
  from sao_jax.runners.compiled import compile_sampler

  return compile_sampler(s.cfg, s.model, mesh=mesh, **_sampler_kw(s, max_new_tokens=1))


def _env_seconds_per_row(s, tasks, actions, reps: int) -> float:
  """Host seconds per row of the environment: make, reset and step (the task family's
  `step_many` over the rows at once), the median of `reps` batches."""
  out = []
  for _ in range(reps):
    t0 = time.perf_counter()
    envs = [s.family.make_env(s.tok) for _ in tasks]
    for env, task in zip(envs, tasks, strict=True):
      env.reset(task)
    s.family.step_many(envs, list(actions))
    out.append((time.perf_counter() - t0) / len(tasks))
  return float(np.median(out))


def _continuous(s, progs, rand_params, params, rng, reps: int, quick: bool) -> dict:
  """Costs of the continuous-batching programs (see the module docstring), in rounds."""
  import jax

  from sao_jax.packing import left_pad
  from sao_jax.rollout import ContinuousSampler
  from sao_jax.runners.compiled import compile_slots
  from sao_jax.sim import interp

  sao = s.cfg.sao
  slots, refill = sao.sampler_slots, sao.refill_rows
  cont = compile_slots(s.cfg, s.model, progs, slots=slots, **_sampler_kw(s))
  key = [jax.random.key(7)]

  def prompts(n):
    """n task prompts as a continuous sampler builds them: [bos] + observation, left-padded."""
    rows = []
    for i in rng.integers(0, len(s.train), n):
      env = s.family.make_env(s.tok)
      rows.append(([s.tok.bos_id] + env.reset(s.train[i]).tolist())[-s.prompt_len :])
    return rows

  def fill(pr, st, rows, first):
    """One fill call of len(rows) prompts into slots first..; (state, seconds)."""
    t0 = time.perf_counter()
    prompt, pvalid = left_pad(rows, s.prompt_len, s.tok.pad_id)
    slot_r = np.arange(first, first + len(rows), dtype=np.int32)
    st = jax.block_until_ready(cont.fill(pr, st, prompt, pvalid, slot_r))
    return st, time.perf_counter() - t0

  def decode(pr, st, min_done):
    """One decode call and the host's reads after it, as ContinuousSampler.step makes them."""
    key[0], sub = jax.random.split(key[0])
    t0 = time.perf_counter()
    st = cont.decode(pr, st, np.int32(0), sub, min_done)
    jax.device_get(st.done_b)
    jax.device_get((st.tokens_bt, st.logp_bt, st.version_bt, st.gen_b))
    return st, time.perf_counter() - t0

  def filled(pr, live):
    st = cont.empty_slots()
    for first in range(0, live, refill):
      st, _ = fill(pr, st, prompts(min(refill, live - first)), first)
    return st

  live_counts = sorted({1, slots}) if quick else sorted({1, refill, max(1, slots // 2), slots})
  fill_rows = [refill] if quick else sorted({1, refill, slots})
  for a in live_counts:  # compile + warm
    decode(rand_params, decode(rand_params, filled(rand_params, a), a)[0], 1)
  for r in fill_rows:
    fill(rand_params, cont.empty_slots(), prompts(r), 0)
  jax.block_until_ready(cont.refresh(params, filled(rand_params, slots)))
  samples = {
    "empty_call": [],
    "refresh": [],
    **{f"fill_{r}": [] for r in fill_rows},
    **{f"live_{a}": [] for a in live_counts},
  }  # live_a: (steps, seconds) per call
  for _ in range(reps):
    for a in live_counts:
      st = filled(rand_params, a)
      st, dt = decode(rand_params, st, a)  # until every row ends: T steps unless EOS
      steps = int(np.asarray(jax.device_get(st.gen_b)).max())
      samples[f"live_{a}"].append((steps, dt))
      samples["empty_call"].append(decode(rand_params, st, 1)[1])
    for r in fill_rows:
      samples[f"fill_{r}"].append(fill(rand_params, cont.empty_slots(), prompts(r), 0)[1])
    st = filled(rand_params, slots)
    t0 = time.perf_counter()
    jax.block_until_ready(cont.refresh(params, st))
    samples["refresh"].append(time.perf_counter() - t0)
  call_s = float(np.median(samples["empty_call"]))
  step_s = {
    a: float(np.median([max(0.0, dt - call_s) / n for n, dt in samples[f"live_{a}"] if n > 0]))
    for a in live_counts
  }
  fill_s = {r: float(np.median(samples[f"fill_{r}"])) for r in fill_rows}
  refresh_s = float(np.median(samples["refresh"]))
  step_pts = tuple((float(a), v) for a, v in step_s.items())

  # The check: a ContinuousSampler of the SFT policy, its decode calls timed one by one.
  calls, extra = [], [0.0]

  def timed_decode(pr, st, version, k, min_done):
    jax.block_until_ready(st)  # pending fills finish here (their time stays in the loop's)
    t0 = time.perf_counter()
    act, gen0 = (np.asarray(x) for x in jax.device_get((st.active_b, st.gen_b)))
    extra[0] += time.perf_counter() - t0
    t0 = time.perf_counter()
    st = cont.decode(pr, st, version, k, min_done)
    jax.device_get(st.done_b)
    gen1 = np.asarray(jax.device_get((st.tokens_bt, st.logp_bt, st.version_bt, st.gen_b))[3])
    dt = time.perf_counter() - t0
    inc = (gen1 - gen0)[act]
    pred = call_s + sum(
      interp(step_pts, int((inc > j).sum())) for j in range(int(inc.max(initial=0)))
    )
    calls.append((pred, dt))
    return st

  fills = [0]

  def counted_fill(*a):
    fills[0] += 1
    return cont.fill(*a)

  sampler = ContinuousSampler(
    counted_fill,
    timed_decode,
    cont.refresh,
    cont.empty_slots(),
    s.tok,
    slots=slots,
    refill_rows=refill,
    prompt_len=s.prompt_len,
    max_steps=s.max_steps,
    make_env=lambda: s.family.make_env(s.tok),
    step_many=s.family.step_many,
    inflight=sao.inflight,
    seed=0,
  )
  sampler.offer_params(0, params)
  budget = [(2 if quick else 8) * slots]

  def take(n):
    n = min(n, budget[0])
    budget[0] -= n
    return [(int(i), s.train[i]) for i in rng.integers(0, len(s.train), n)]

  trajs = []
  sampler.step(take)  # compile the ContinuousSampler path's shapes, if any are new
  calls.clear()
  fills[0], extra[0] = 0, 0.0
  t0 = time.perf_counter()
  while budget[0] > 0 or sampler.active() or sampler.waiting:
    trajs += sampler.step(take)
  loop_s = time.perf_counter() - t0 - extra[0]
  some = [trajs[i % len(trajs)] for i in range(slots)]
  score_s = _env_seconds_per_row(
    s, [s.train[t.task_index] for t in some], [t.tokens[0] for t in some], reps
  )
  pred_calls = np.array([p for p, _ in calls])
  real_calls = np.array([dt for _, dt in calls])
  pred_loop = fills[0] * fill_s[refill] + pred_calls.sum() + len(trajs) * score_s
  return {
    "decode_call_s": call_s,
    "slot_decode_s": step_s,
    "fill_s": fill_s,
    "refresh_s": refresh_s,
    "score_s": score_s,
    "slots": slots,
    "refill_rows": refill,
    "check_rel_err": float(np.median(pred_calls / real_calls) - 1.0) if len(calls) else None,
    "loop_rel_err": float(pred_loop / loop_s - 1.0),
    "loop_s": loop_s,
    "loop_trajectories": len(trajs),
    "loop_decode_calls": len(calls),
    "loop_fill_calls": fills[0],
    "raw": samples,
  }


def _sampler_child(cfg_dict, param_dir, sizes, reps, quick, t_spawn, out_q, window, run):
  """Runs in a process configured like a sampler process; reports through `out_q`."""
  from sao_jax.runners.sampler_proc import SamplerSpec, _configure_process

  cfg_threads = cfg_dict["samplers"]["threads"]
  _configure_process(
    SamplerSpec(
      sampler_id=0,
      config=cfg_dict,
      param_dir=param_dir,
      transport=None,
      seed=0,
      threads=cfg_threads,
    )
  )
  import jax

  from sao_jax.config import MeshConfig
  from sao_jax.learner import make_sft_update
  from sao_jax.rollout import sao_sampling
  from sao_jax.runners.common import programs_for
  from sao_jax.runners.compiled import compile_sampler
  from sao_jax.sharding import make_mesh
  from sao_jax.transport import records
  from sao_jax.transport.params import ParamSubscriber, unflatten

  s = _setup(cfg_dict)
  mesh = make_mesh(MeshConfig(shape=(1, 1, 1)), jax.devices()[:1])
  progs = compile_sampler(s.cfg, s.model, mesh=mesh, **_sampler_kw(s))
  one_tok = _one_token_programs(s, mesh)
  init = programs_for(s, s.cfg.sft.optim, make_sft_update, mesh=mesh).init
  rand_params = jax.device_put(init(jax.random.key(0)).params, progs.params_sharding)
  rng = np.random.default_rng(0)
  key = [jax.random.key(1)]

  def load():
    _, _, flat = ParamSubscriber(param_dir).poll((-1, -1))
    return jax.block_until_ready(
      jax.device_put(unflatten(progs.abstract_params, flat), progs.params_sharding)
    )

  def call(params, slots, fn=None):
    """One batch call; (seconds without its environment steps, longest row, trajectories)."""
    idx = rng.integers(0, len(s.train), slots)
    tasks = [s.train[i] for i in idx]
    envs = [s.family.make_env(s.tok) for _ in tasks]
    key[0], sub = jax.random.split(key[0])
    t0 = time.perf_counter()
    trajs = sao_sampling(
      fn or progs.sample,
      params,
      envs,
      tasks,
      idx.tolist(),
      s.tok,
      slots=slots,
      prompt_len=s.prompt_len,
      max_steps=s.max_steps,
      rng=sub,
      policy_version=0,
      step_many=s.family.step_many,
    )
    dt = time.perf_counter() - t0 - sum(t.reward_seconds for t in trajs)
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
    for pr, fn in (
      (rand_params, progs.sample),
      (rand_params, one_tok.sample),
      (params, progs.sample),
    ):
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
  continuous = _continuous(s, progs, rand_params, params, rng, reps, quick)
  _, _, trajs = call(params, slots)
  q = mp.get_context("spawn").Queue()
  enc = []
  for i, t in enumerate(trajs):
    t0 = time.perf_counter()
    data = records.encode(
      records.RecordKind.TRAJECTORY,
      i,
      0,
      t.arrays(),
      {
        "task_index": t.task_index,
        "task_id": t.task_id,
        "reward": t.total_reward,
        "t_end": t.t_end,
        "sampler": 0,
        "done": t.done,
        "reward_s": t.reward_seconds,
      },
    )
    q.put(data)
    enc.append(time.perf_counter() - t0)
  record_bytes = len(data)
  for _ in trajs:
    q.get()
  q.close()
  out_q.put(
    {
      "start_s": start_s,
      "load_s": float(np.median(loads)),
      "fits": fits,
      "raw": raw,
      "emit_s": float(np.median(enc)),
      "record_bytes": record_bytes,
      "continuous": continuous,
    }
  )
  calls = []  # (window, seconds) of full-length calls while the parent says "run"
  while window.value >= 0:
    if run.value:
      w = window.value
      calls.append((w, call(rand_params, slots)[0]))
    else:
      time.sleep(0.01)
  out_q.put({"calls": calls})


def main(argv=None) -> dict:
  """Runs the calibration in a scratch folder (its SFT run, parameter files, journal and
  metrics), removed at the end, also when the run fails."""
  with tempfile.TemporaryDirectory(prefix="calib_") as tmp:
    return _calibrate(argv, pathlib.Path(tmp))


def _calibrate(argv, tmp: pathlib.Path) -> dict:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--config", default=str(HERE / "configs" / "sao_arith.py"))
  p.add_argument("--variant", default="default")
  p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
  p.add_argument(
    "--sft-from",
    default="",
    help="workdir or checkpoint folder of an SFT run "
    "(e.g. the benchmark's OUT/sft); default: train the config's SFT here",
  )
  p.add_argument("--transport-json", default="results/bench_transport.json")
  p.add_argument("--reps", type=int, default=10, help="timed calls per batch size")
  p.add_argument("--quick", action="store_true", help="smoke run: few sizes and reps")
  p.add_argument("--out", default="results/sim_costs.json")
  args = p.parse_args(argv)

  import jax

  from sao_jax import config as config_lib
  from sao_jax import recovery
  from sao_jax.batches import RLBatch, SAOBatch
  from sao_jax.evaluation import evaluate
  from sao_jax.learner import make_rl_update, make_sao_update, make_sft_update
  from sao_jax.metrics import MetricsWriter
  from sao_jax.packing import encode_prompts
  from sao_jax.results_file import ResultFile
  from sao_jax.runners.common import programs_for
  from sao_jax.runners.run import restore_init
  from sao_jax.runners.sft import run_sft
  from sao_jax.setup import load_config, make_setup
  from sao_jax.sim import Costs, Profile
  from sao_jax.state import copy_tree
  from sao_jax.transport import records
  from sao_jax.transport.params import ParamPublisher

  t_start = time.time()
  machine_before = _machine()
  cfg = load_config(args.config, args.variant, args.set)
  rf = ResultFile(args.out, series=f"calibrate_sim/{cfg.name}", config=cfg)
  s = make_setup(cfg)
  rl, sao = cfg.rl, cfg.sao
  reps = 2 if args.quick else args.reps
  if args.sft_from:
    state = restore_init(s, args.sft_from)
  else:
    w = MetricsWriter(tmp / "sft", show_progress=False)
    state, _, _ = run_sft(s, w, None, tmp / "sft")
    w.close()
  params = state.params
  n_params = int(sum(x.size for x in jax.tree.leaves(params)))
  progs = programs_for(s, cfg.sft.optim, make_sft_update)
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
    for pr, fn in (
      (rand_params, progs.sample),
      (rand_params, one_tok.sample),
      (params, progs.sample),
    ):
      sample(pr, b, fn)  # compile + warm
  score_s = _env_seconds_per_row(s, tasks, out.tokens_bt, 3)  # as run_grpo scores a step
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
  inline_fits = {
    b: _two_point(v["full"], v["one"], rl.max_new_tokens, v["check"])
    for b, v in inline_samples.items()
  }
  inline_raw = inline_samples
  update_pts = {
    k: {n: float(np.median(upd_samples[(k, n)])) for n in update_sizes[k]} for k in makers
  }
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
    encode_prompts(s.tok, [t.prompt for t in tasks], s.prompt_len)
    writer.write(step, metrics_row, phase="rl")
  grpo_overhead = (time.perf_counter() - t0) / 10
  writer.close()
  journal.close()
  ledger.close()
  n_val = cfg.recovery.val_problems if cfg.recovery.shadow_every else 0
  periodic = {"sao": [], "grpo": []}
  if n_val:
    val_tasks = s.train[len(s.train) - n_val :]
    up = uprogs["sao"]
    evaluate(s, up.greedy, params, batch_divisor=up.batch_divisor, tasks=val_tasks)
    t0 = time.perf_counter()
    evaluate(s, up.greedy, params, batch_divisor=up.batch_divisor, tasks=val_tasks)
    periodic["sao"].append(
      ["shadow_validation", cfg.recovery.shadow_every, time.perf_counter() - t0]
    )

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
  sizes = (
    [sao.sampler_slots]
    if args.quick
    else sorted({1, 8, 32, sao.sampler_slots, 2 * sao.sampler_slots})
  )
  child = ctx.Process(
    target=_sampler_child,
    args=(
      config_lib.to_dict(cfg),
      str(tmp / "params"),
      sizes,
      reps,
      args.quick,
      time.time(),
      out_q,
      window,
      run,
    ),
    daemon=True,
  )
  child.start()
  # Contention: windows of sampler alone / both / update alone, in rounds, so that drift in
  # the machine's other load falls on all three alike.
  kinds = ("sampler", "both", "update")
  win_s = 1.0 if args.quick else 6.0
  upd_times: dict[str, list[float]] = {"both": [], "update": []}
  try:
    solo = _from_child(out_q, child, 1800)
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
    calls = _from_child(out_q, child, 600)["calls"]
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
  print(
    f"contention: update x{update_slowdown:.2f}, sampling x{sampling_slowdown:.2f} "
    f"({len(by_kind['both'])} contended sampler calls)",
    flush=True,
  )

  def profile(fits, **kw):
    return Profile(
      decode_s=tuple((float(b), f["decode_s"]) for b, f in sorted(fits.items())),
      prefill_s=tuple((float(b), f["prefill_s"]) for b, f in sorted(fits.items())),
      **kw,
    )

  def points(d):
    return tuple((float(k), float(v)) for k, v in sorted(d.items(), key=lambda kv: int(kv[0])))

  cont = solo["continuous"]
  costs = Costs(
    profiles={
      # the batch fit leaves out the environment steps, charged per row (score_s)
      "sampler": profile(
        solo["fits"],
        score_s=cont["score_s"],
        emit_s=solo["emit_s"],
        start_s=solo["start_s"],
        fill_s=points(cont["fill_s"]),
        slot_decode_s=points(cont["slot_decode_s"]),
        slot_rows=cont["slots"],
        decode_call_s=cont["decode_call_s"],
        refresh_s=((float(cont["slots"]), cont["refresh_s"]),),
      ),
      "inline": profile(inline_fits, score_s=score_s, start_s=inline_compile),
    },
    update_s={k: tuple((float(n), t) for n, t in sorted(v.items())) for k, v in update_pts.items()},
    lengths=tuple(int(n) for n in lengths),
    first_update_extra_s=update_compile,
    step_overhead_s={"sao": sao_overhead, "grpo": grpo_overhead},
    periodic={k: tuple(tuple(x) for x in v) for k, v in periodic.items()},
    publish_s=publish_s,
    load_s=solo["load_s"],
    transport_latency_s=latency_s,
    transport_bytes_per_s=bandwidth,
    record_bytes=float(solo["record_bytes"]),
    update_with_sampling=max(1.0, update_slowdown),
    sampling_with_update=max(1.0, sampling_slowdown),
  )
  # the matmul rate of this CPU, for scaling the costs to other hardware
  import jax.numpy as jnp

  n = 512 if args.quick else 1024
  a = jnp.ones((n, n), jnp.float32)
  mm = jax.jit(lambda x: x @ x)
  mm(a).block_until_ready()
  t0 = time.perf_counter()
  for _ in range(10):
    mm(a).block_until_ready()
  matmul_flops = 2 * n**3 * 10 / (time.perf_counter() - t0)

  result = {
    # the machine's load before and after (its provenance has the rest of the machine)
    "machine": machine_before,
    "machine_after": _machine(),
    "calibration_s": time.time() - t_start,
    "costs": costs.to_dict(),
    "details": {
      "model_params": n_params,
      "matmul_flops_per_s": matmul_flops,
      "sampler_fits": solo["fits"],
      "inline_fits": inline_fits,
      "continuous": cont,
      "sampler_raw": solo["raw"],
      "inline_raw": inline_raw,
      "update_contended_s": update_contended,
      "contention_windows": contended,
      "transport_source": transport_src,
      "sft_from": args.sft_from or "trained here",
      "lengths": {
        "mean": float(np.mean(lengths)),
        "max": int(np.max(lengths)),
        "cv": float(np.std(lengths) / np.mean(lengths)),
      },
      "unmodelled": [
        "Orbax snapshots every checkpoint_every updates (asynchronous)",
        "held-out evaluations inside the loop (benchmark: --eval-every beyond the run)",
        "other processes on the machine",
      ],
    },
  }
  path = rf.finish(result)
  print(f"calibration: {time.time() - t_start:.0f} s -> {path}", flush=True)
  return rf.doc


if __name__ == "__main__":
  main()
