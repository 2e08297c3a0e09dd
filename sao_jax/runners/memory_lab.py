"""Training and evaluating the policy with compressed memory and its full-context control on
the long-horizon tasks outside `sao-jax train`: scripted supervised updates, greedy
evaluation at any episode length, snapshot arguments. What the compression experiments
(experiments/bench_compression.py, bench_memory_update.py, bank_occupancy.py,
salience_threshold.py) share."""

from __future__ import annotations

import dataclasses
import importlib.util
import pathlib
import time

import jax
import numpy as np

from sao_jax.compression.memory import Compressor
from sao_jax.compression.policy import (
  MemoryPolicy,
  make_full_context_sft_update,
  make_memory_update,
)
from sao_jax.compression.rollout import (
  episode_tokens,
  expert_memory_batch,
  expert_trajectory,
  sample_long_horizon,
  script,
  scripted_full_batch,
)
from sao_jax.config import Config
from sao_jax.envs.longhorizon import LongHorizonEnv
from sao_jax.learner import make_optimizer
from sao_jax.models.transformer import TransformerLM
from sao_jax.packing import round_up
from sao_jax.runners.compiled import (
  compile_programs,
  compile_sampler,
)
from sao_jax.tokenizer import CharTokenizer

TOK = CharTokenizer()
MAX_NEW = 4  # answers are one digit or "ok"/"f", then EOS
# Loss weight of a graded step (the answer digit) against 1 for each filler step ("ok"/"f"
# after chit-chat or a corridor step). A 36-step episode has 35 filler steps: at weight 10 the
# digit was 22 % of the objective and the control reached 0.58 recall in 300 steps, at 100
# (74 %) 0.98 (lr 1e-3, retention). Both arms use the same weights.
GRADED_WEIGHT = 100.0
# Greedy programs of a memory policy that sees more than this many bank entries are also
# compiled for windows of every multiple of it (`growing_greedy`).
VISIBLE_BUCKET = 128


def add_snapshot_args(p, *, task: str, episodes: int, gen_seed: int, what: str) -> None:
  """The arguments of the scripts that measure the compressed arms bench_compression saved
  under --params-dir, one directory per seed, on `what` 1,000-step episodes."""
  root = pathlib.Path(__file__).resolve().parents[2]  # (the repository: sao_jax/runners/..)
  p.add_argument("--config", default=str(root / "experiments/configs/longhorizon.py"))
  p.add_argument("--task", default=task, help="a task with LONG_TASKS in the config")
  p.add_argument("--params-dir", required=True, help="comma-separated, one per seed")
  p.add_argument("--steps", type=int, required=True, help="the snapshot's training steps")
  p.add_argument("--episodes", type=int, default=episodes, help=f"{what} episodes")
  p.add_argument("--gen-seed", type=int, default=gen_seed, help="the episodes' generator seed")
  p.add_argument(
    "--long-steps", type=int, default=0, help="episode length (0: the config's LONG_TASKS)"
  )


def config_module(path: str):
  """The long-horizon config file at `path` (a `:variant` suffix ignored) as a module: its
  TASKS, TRAIN_TASKS, LONG_TASKS (and EXTRA_TASKS) by variant."""
  file = path.rsplit(":", 1)[0] if ":" in path and not pathlib.Path(path).exists() else path
  spec = importlib.util.spec_from_file_location("lh_config", file)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def snapshot_long_spec(args, parser):
  """For the scripts over bench_compression's snapshots (`add_snapshot_args`): the config path
  (its `default` unless one is named), the config module, and --task's long episodes with
  --long-steps applied; a task without long episodes is a usage error."""
  cfg_path = args.config if ":" in args.config else f"{args.config}:default"
  mod = config_module(cfg_path)
  if args.task not in mod.LONG_TASKS:
    parser.error(f"--task {args.task!r}: no long episodes (have {sorted(mod.LONG_TASKS)})")
  spec = mod.LONG_TASKS[args.task]
  if args.long_steps:
    spec = dataclasses.replace(spec, n_steps=args.long_steps)
  return cfg_path, mod, spec


def model_cfg(cfg: Config, memory: bool, full_len: int = 0):
  m = dataclasses.replace(cfg.model, vocab_size=TOK.vocab_size)
  if memory:
    return m
  # Positions beyond max_len would read past the position table.
  return dataclasses.replace(m, memory_slots=0, memory_dim=0, max_len=max(m.max_len, full_len))


def build(
  cfg: Config, memory: bool, *, full_len: int = 0, mode: str = "sft", share: bool | None = None
):
  """(programs, policy-or-model) for the memory policy or the full-context control (`share`:
  `make_memory_update`'s)."""
  tx = make_optimizer(cfg.sft.optim)
  model = TransformerLM(model_cfg(cfg, memory, full_len))
  if memory:
    policy = MemoryPolicy(model, Compressor(cfg.compression, TOK.vocab_size))
    progs = compile_programs(
      cfg,
      policy,
      tx,
      make_memory_update(policy, tx, mode=mode, share=share),
      max_new_tokens=MAX_NEW,
      temperature=1.0,
      eos_id=TOK.eos_id,
      pad_id=TOK.pad_id,
    )
    return progs, policy
  progs = compile_programs(
    cfg,
    model,
    tx,
    make_full_context_sft_update(model, tx),
    with_ref=False,
    prompt_len=full_len,
    max_new_tokens=MAX_NEW,
    temperature=1.0,
    eos_id=TOK.eos_id,
    pad_id=TOK.pad_id,
  )
  return progs, model


def full_len(tasks) -> int:
  n = max(episode_tokens(t, TOK) for t in tasks)
  return -(-n // 32) * 32


def train(
  cfg: Config,
  progs,
  memory: bool,
  train_tasks,
  *,
  steps: int,
  length: int,
  seed: int = 0,
  log=None,
  state=None,
  every: int = 0,
  on_snapshot=None,
):
  """Supervised (teacher-forced) training on expert scripts; the same tasks in the same order
  and the same number of steps for both arms. Returns (state, seconds, last metrics).

  `state`: a restored training state of the same run at step k < `steps` (optimizer, RNG and
  step included): training continues from step k with the batches steps k.. would have had,
  so k steps then the rest equal `steps` steps in one go. `on_snapshot(state, step, seconds,
  metrics)` is called every `every` steps before the last (to save a snapshot)."""
  start = 0 if state is None else int(jax.device_get(state.step))
  if start > steps:
    raise ValueError(f"the state is at step {start}, past the {steps} steps asked for")
  state = progs.init(jax.random.key(seed)) if state is None else state
  rng = np.random.default_rng(seed)
  bs = cfg.sft.batch_size
  for _ in range(start):  # the batches already trained on
    rng.integers(len(train_tasks), size=bs)
  c = cfg.compression
  n_steps = max(len(t.prompt.split("\n")) for t in train_tasks)
  # Rows the memory policy trains on per episode: every graded step and 4 filler steps.
  rows = max(len(t.answer.split(",")) for t in train_tasks) + 4
  cache = {}

  def expert(task):
    if task.task_id not in cache:
      cache[task.task_id] = expert_trajectory(
        LongHorizonEnv(TOK),
        task,
        script(task, TOK)[1],
        TOK,
        window=c.window,
        step_len=c.step_len,
        completion_len=MAX_NEW,
      )
    return cache[task.task_id]

  t0, metrics = time.time(), {}
  for i in range(start, steps):
    batch_tasks = [train_tasks[j] for j in rng.integers(len(train_tasks), size=bs)]
    if memory:
      trajs = [expert(t) for t in batch_tasks]
      weights = [np.where(t.graded, GRADED_WEIGHT, 1.0) for t in trajs]
      batch = expert_memory_batch(trajs, weights, steps=n_steps, rows=rows, seed=i)
    else:
      batch = scripted_full_batch(batch_tasks, TOK, length=length, graded_weight=GRADED_WEIGHT)
    state, metrics = progs.update(state, batch)
    if on_snapshot and every and (i + 1) % every == 0 and i + 1 < steps:
      m = {k: float(v) for k, v in jax.device_get(metrics).items()}
      on_snapshot(state, i + 1, time.time() - t0, m)
    if log and (i % 50 == 0 or i == steps - 1):
      log(
        f"  step {i} " + " ".join(f"{k}={float(v):.3f}" for k, v in jax.device_get(metrics).items())
      )
  jax.block_until_ready(state)
  return state, time.time() - t0, {k: float(v) for k, v in jax.device_get(metrics).items()}


def evaluate(
  cfg: Config,
  progs,
  policy,
  params,
  tasks,
  memory: bool,
  *,
  length: int,
  slots: int = 32,
  seed: int = 0,
  greedy=None,
):
  """Greedy rollouts on `tasks`, at most `slots` side by side (fewer tasks run on fewer rows,
  rounded up to the mesh's batch divisor: greedy rows do not depend on each other, and a
  1,000-step episode costs per row); returns (accuracy over graded steps, trajectories).

  `greedy`: the memory policy's greedy program (default: with the memory's keys and values
  kept between steps where its bank allows, `cached_greedy`, else `growing_greedy`; all
  give the same episodes)."""
  slots = min(slots, round_up(len(tasks), getattr(progs, "batch_divisor", 1)))
  trajs = []
  rng = jax.random.key(seed)
  c = cfg.compression
  if not memory:
    greedy = progs.greedy
  elif greedy is None:
    greedy = cached_greedy(progs, slots) if policy.shares_bank() else growing_greedy(cfg, progs)
  for start in range(0, len(tasks), slots):
    chunk = tasks[start : start + slots]
    envs = [LongHorizonEnv(TOK) for _ in chunk]
    if memory:
      trajs += sample_long_horizon(
        greedy,
        progs.compress,
        progs.empty_streams(slots),
        params,
        envs,
        chunk,
        TOK,
        slots=slots,
        window=c.window,
        step_len=c.step_len,
        rng=rng,
      )
    else:
      trajs += sample_long_horizon(
        progs.greedy,
        None,
        None,
        params,
        envs,
        chunk,
        TOK,
        slots=slots,
        window=length,
        step_len=c.step_len,
        rng=rng,
      )
  rewards = np.concatenate([t.rewards[t.graded] for t in trajs])
  return float(rewards.mean()), trajs


def cached_greedy(progs, slots: int):
  """progs.greedy of a memory policy whose bank is append-only and all visible (the stage-1
  control), with the memory's keys and values kept between steps
  (`MemoryPolicy.update_memory_cache`): each step runs only its new entry through the model,
  not the whole memory (at 1,000 steps, up to 2,000 slots a step). Same tokens as
  progs.greedy up to float rounding (tests/test_compression_memory.py). The cache checks
  itself against each slot's bank, so one cache serves every chunk of an evaluation."""
  cache = [progs.empty_memory_cache(slots)]

  def greedy(params, streams, prompt, pvalid, key):
    out, cache[0] = progs.greedy_cached(params, streams, cache[0], prompt, pvalid, key)
    return out

  return greedy


def growing_greedy(cfg: Config, progs, bucket: int = VISIBLE_BUCKET):
  """progs.greedy of a memory policy, run with a shorter window while the bank is short.

  The policy sees the last `visible` bank entries older than its step (invalid slots
  masked). While no bank holds more than b entries, the last b entries are all it holds, so
  the program compiled with visible = b gives the same tokens and log-probs as the one with
  all `visible` (a masked slot's attention weight is exactly 0) at ~(b / visible)^2 of the
  attention cost: a policy that keeps every step of a 1,000-step episode (the stage-1
  control) pays for the entries it has, not for 1,000 from step 0. b: the smallest multiple
  of `bucket` that holds the fullest bank of the batch (one program per multiple, compiled
  when first needed; the parameters do not depend on `visible`). Policies that see at most
  `bucket` entries run progs.greedy unchanged. tests/test_bench_compression.py checks the
  equality."""
  c = cfg.compression
  if c.visible <= bucket:
    return progs.greedy
  programs = {c.visible: progs.greedy}

  def program(b: int):
    if b not in programs:
      cb = dataclasses.replace(c, visible=b)
      bcfg = dataclasses.replace(
        cfg,
        compression=cb,
        model=dataclasses.replace(cfg.model, memory_slots=b * c.vectors_per_step),
      )
      policy = MemoryPolicy(TransformerLM(model_cfg(bcfg, True)), Compressor(cb, TOK.vocab_size))
      programs[b] = compile_sampler(
        bcfg,
        policy,
        max_new_tokens=MAX_NEW,
        temperature=1.0,
        eos_id=TOK.eos_id,
        pad_id=TOK.pad_id,
      ).greedy
    return programs[b]

  def greedy(params, streams, prompt, pvalid, key):
    held = int(np.max(jax.device_get(streams.bank.count)))
    b = min(c.visible, max(bucket, -(-held // bucket) * bucket))
    return program(b)(params, streams, prompt, pvalid, key)

  greedy.programs = programs  # visible -> program (what ran)
  return greedy
