"""Synchronous GRPO(N=group_size): the 'Traditional' baseline SAO is compared with."""

from __future__ import annotations

import pathlib
import time

import jax
import numpy as np

from sao_jax import checkpoint as ckpt_lib
from sao_jax import config as config_lib
from sao_jax import interrupt
from sao_jax.batches import RLBatch
from sao_jax.learner import make_rl_update
from sao_jax.metrics import MetricsWriter, peak_memory_mb
from sao_jax.packing import encode_prompts
from sao_jax.runners.common import (
  PhaseClock,
  defer_dir,
  delay_stats,
  eval_fn,
  finish_phase,
  length_stats,
  log_step,
  phase_manager,
  phase_meta,
  programs_for,
  resume_phase,
)
from sao_jax.runners.compiled import Programs
from sao_jax.runners.learner_parts.intake import Intake
from sao_jax.runners.sao import SAOLearner
from sao_jax.setup import Setup
from sao_jax.state import TrainState, copy_tree


def run_grpo(
  s: Setup,
  writer: MetricsWriter,
  state: TrainState,
  workdir: pathlib.Path,
  *,
  max_seconds: float | None = None,
  eval_every: float = 0.0,
) -> tuple[TrainState, Programs, dict]:
  """Sample G completions for each of `prompts_per_step` prompts, wait for all of them,
  score, one update; repeat. One-step task families only (`sao_jax.setup` checks)."""
  cfg, rl = s.cfg, s.cfg.rl
  max_seconds = rl.max_seconds if max_seconds is None else max_seconds
  with_ref = rl.kl_coef > 0
  progs = programs_for(s, rl.optim, lambda m, tx: make_rl_update(m, tx, rl), with_ref=with_ref)
  fresh = progs.init(jax.random.key(cfg.seed + 1))
  state = fresh.replace(
    params=copy_tree(state.params), ref_params=copy_tree(state.params) if with_ref else None
  )
  rows = rl.prompts_per_step * rl.group_size
  if rows % progs.batch_divisor:
    raise config_lib.ConfigError(
      f"prompts_per_step*group_size = {rows} must divide over {progs.batch_divisor} batch shards"
    )
  rng = np.random.default_rng((cfg.seed, 2))
  key = jax.random.key(cfg.seed + 2)
  mngr = phase_manager(cfg, workdir, "rl")
  clock = PhaseClock(
    rl.steps, max_seconds, eval_every, eval_fn(s, progs), defer_dir=defer_dir(cfg, workdir, "rl")
  )
  writer.progress("grpo", rl.steps or None)
  step, busy, tokens, delays, reward_s, lengths = 0, 0.0, 0, [], 0.0, []
  sandbox_runs = 0
  resumed = resume_phase(mngr, state, clock, rng, "grpo", with_key=True)
  if resumed is not None:
    state, step, key = resumed
  else:
    clock.maybe_eval(step, state.params, force=bool(eval_every))

  def meta():
    return phase_meta("rl", rng, clock, key)

  t_loop = time.time()
  while clock.running(step):
    ts = time.time()
    idx = rng.integers(0, len(s.train), rl.prompts_per_step)
    tasks = [s.train[i] for i in idx for _ in range(rl.group_size)]
    prompt, pvalid = encode_prompts(s.tok, [t.prompt for t in tasks], s.prompt_len)
    key, sub = jax.random.split(key)
    out = jax.device_get(progs.sample(state.params, prompt, pvalid, sub))
    t_decoded = time.time()
    envs = [s.family.make_env(s.tok) for _ in tasks]
    for env, task in zip(envs, tasks, strict=True):
      env.reset(task)
    results = s.family.step_many(envs, list(out.tokens_bt))
    rewards = np.asarray([r.reward for r in results], np.float32)
    fmt = [r.info["format_ok"] for r in results if "format_ok" in r.info]
    t_sampled = time.time()
    reward_s += t_sampled - t_decoded
    sandbox_runs += sum(r.info.get("sandbox_runs", 0) for r in results)
    batch = RLBatch(
      prompt_bp=prompt,
      prompt_valid_bp=pvalid,
      tokens_bt=out.tokens_bt,
      valid_bt=out.valid_bt,
      logp_bt=out.logp_bt,
      rewards_b=rewards,
    )
    tu = time.time()
    state, metrics = progs.update(state, progs.shard_batch(batch))
    metrics = jax.device_get(metrics)
    busy += time.time() - tu
    tokens += int(out.lengths_b.sum())
    lengths.extend(out.lengths_b.tolist())
    delays.append(time.time() - t_sampled)  # every row of the group waited for the last one
    step += 1
    ckpt_lib.save(mngr, state, cfg, meta())
    t_end = time.time()
    row = dict(
      metrics,
      accuracy=float(rewards.mean()),
      step_time=t_end - ts,
      sampling_time=t_sampled - ts,
      reward_time=t_sampled - t_decoded,
      learner_time=t_end - t_sampled,
      tokens_per_s=float(out.lengths_b.sum()) / (t_end - ts),
      mean_len=float(out.lengths_b.mean()),
      train_seconds=clock.elapsed,
      learner_busy=busy / (time.time() - t_loop),
      peak_memory_mb=peak_memory_mb(),
    )
    if fmt:
      row["format_rate"] = float(np.mean(fmt))
    log_step(writer, clock, cfg, step, state.params, row, "rl")
  wall = time.time() - t_loop
  info = finish_phase(mngr, state, cfg, clock, step, "rl", meta(), progs.packer)
  return (
    state,
    progs,
    dict(
      info,
      trajectories=step * rows,
      trajectories_per_s=step * rows / wall,
      tokens_per_s=tokens / wall,
      learner_busy=busy / wall,
      reward_s_per_trajectory=reward_s / max(step * rows, 1),
      learner_peak_mb=peak_memory_mb(),
      seconds_per_step=info["seconds"] / max(step, 1),
      **length_stats(lengths),
      sandbox_runs=sandbox_runs,
      sandbox_runs_per_s=sandbox_runs / wall,
      peak_rss_all_mb=peak_memory_mb(),
      **delay_stats(delays),
    ),
  )


class GroupIntake(Intake):
  """The intake of `SyncGRPOLearner`: a step's tasks go out as groups, once the policy they
  need exists, and only when the previous step's have all come back."""

  def top_up_before_update(self, step: int, probs) -> None:
    """Nothing: a step's tasks are handed out by `fill`, once the policy they need exists."""

  def fill(self, step: int, probs) -> None:
    rl = self.cfg.rl
    self.check_samplers()
    if self.outstanding == 0 and not self.buffer.ready(step):
      prompts = self.task_rng.integers(0, self.n_sample, rl.prompts_per_step)
      self.hand_out(np.repeat(prompts, rl.group_size).tolist())
    while not self.buffer.ready(step):
      interrupt.check()  # a Ctrl-C stops here, between passes
      got = self.pool.learner.get_records(self.rows, timeout=0.05)
      if got:
        self.ingest(got)
      else:
        self.check_samplers()
      self.report_stall(step)


class SyncGRPOLearner(SAOLearner):
  """Synchronous GRPO(N=group_size) through the same sampler processes, transport, buffer,
  snapshots and metrics as the SAO learner: the comparison in which the algorithm is the only
  difference. Each step hands out `prompts_per_step` tasks `group_size` times, waits for all
  of their trajectories (staleness 0: samplers take the new policy before starting a step's
  tasks), takes one GRPO update on them and publishes; the samplers idle meanwhile."""

  batch_cls = RLBatch
  intake_cls = GroupIntake

  def refresh_priorities(self) -> None:
    """Prompts are drawn uniformly: no priorities."""

  def make_programs(self):
    rl = self.cfg.rl
    return programs_for(
      self.s, rl.optim, lambda m, tx: make_rl_update(m, tx, rl), with_ref=self.with_ref
    )

  def batch_rows(self) -> int:
    return self.cfg.rl.prompts_per_step * self.cfg.rl.group_size

  def max_staleness(self) -> int:
    return 0

  def batch_from(self, items, step):
    # A group's rows are consecutive: sort by task (stable, so arrival order within a task).
    items = sorted(items, key=lambda it: it.rec.meta["task_index"])
    arrays = [it.rec.arrays for it in items]
    batch = RLBatch(
      prompt_bp=np.stack([a["prompt"][0] for a in arrays]),
      prompt_valid_bp=np.stack([a["prompt_valid"][0] for a in arrays]),
      tokens_bt=np.stack([a["tokens"][0] for a in arrays]),
      valid_bt=np.stack([a["valid"][0] for a in arrays]),
      logp_bt=np.stack([a["logp"][0] for a in arrays]).astype(np.float32),
      rewards_b=np.asarray([it.rec.meta["reward"] for it in items], np.float32),
    )
    return batch, np.zeros(len(items), np.int64)


def run_grpo_samplers(
  s: Setup,
  writer: MetricsWriter,
  state: TrainState,
  workdir: pathlib.Path,
  *,
  max_seconds: float | None = None,
  eval_every: float = 0.0,
) -> tuple:
  """`rl.algorithm='grpo'` with `rl.sampling='samplers'` (see SyncGRPOLearner)."""
  learner = SyncGRPOLearner(s, writer, workdir, max_seconds=max_seconds, eval_every=eval_every)
  state, info = learner.run(state)
  return state, learner.progs, info
