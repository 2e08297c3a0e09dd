"""The sampler side of the simulator's calibration (experiments/calibrate_sim.py): the batch
sampler's decode and prefill per compiled batch size (`two_point` of full-length and 1-token
calls), the continuous-batching programs' costs (`continuous_costs`), and `sampler_child`, the
process configured as a sampler process is that measures them and its start-up, parameter
load and record emit. JAX is imported inside the functions: a spawned sampler child configures
its threads before JAX loads."""

from __future__ import annotations

import multiprocessing as mp
import queue
import time

import numpy as np


def from_child(q, child, timeout: float):
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


def two_point(
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


def setup_from_dict(cfg_dict: dict):
  from sao_jax import config as config_lib
  from sao_jax.setup import make_setup

  return make_setup(config_lib.from_dict(cfg_dict))


def sampler_kw(s, max_new_tokens: int | None = None) -> dict:
  """The shapes and sampling constants a sampler process compiles its programs with."""
  return dict(
    prompt_len=s.prompt_len,
    max_new_tokens=max_new_tokens or s.cfg.rl.max_new_tokens,
    temperature=s.cfg.rl.temperature,
    eos_id=s.tok.eos_id,
    pad_id=s.tok.pad_id,
  )


def one_token_programs(s, mesh=None):
  """The sampling program compiled for a 1-token completion (prefill + one step)."""
  from sao_jax.runners.compiled import compile_sampler

  return compile_sampler(s.cfg, s.model, mesh=mesh, **sampler_kw(s, max_new_tokens=1))


def env_seconds_per_row(s, tasks, actions, reps: int) -> float:
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


def continuous_costs(s, progs, rand_params, params, rng, reps: int, quick: bool) -> dict:
  """Costs of the continuous-batching programs (see the module docstring), in rounds."""
  import jax

  from sao_jax.packing import left_pad
  from sao_jax.rollout import ContinuousSampler
  from sao_jax.runners.compiled import compile_slots
  from sao_jax.sim import interp

  sao = s.cfg.sao
  slots, refill = sao.sampler_slots, sao.refill_rows
  cont = compile_slots(s.cfg, s.model, progs, slots=slots, **sampler_kw(s))
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
  score_s = env_seconds_per_row(
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


def sampler_child(cfg_dict, param_dir, sizes, reps, quick, t_spawn, out_q, window, run):
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

  s = setup_from_dict(cfg_dict)
  mesh = make_mesh(MeshConfig(shape=(1, 1, 1)), jax.devices()[:1])
  progs = compile_sampler(s.cfg, s.model, mesh=mesh, **sampler_kw(s))
  one_tok = one_token_programs(s, mesh)
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
    fits[b] = two_point(samples[b]["full"], samples[b]["one"], t_max, samples[b]["check"])
    raw[b] = samples[b]
  continuous = continuous_costs(s, progs, rand_params, params, rng, reps, quick)
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
