"""Synchronous GRPO(N=group_size): the 'Traditional' baseline SAO is compared with, for
either policy (`GROUPS`: what a round samples and reports of each kind)."""

from __future__ import annotations

import pathlib
import time

import jax
import numpy as np

from sao_jax import checkpoint as ckpt_lib
from sao_jax import config as config_lib
from sao_jax import interrupt
from sao_jax.batches import MemoryBatch, RLBatch
from sao_jax.compression.policy import MemoryPolicy
from sao_jax.compression.rollout import ExpertEpisodes, trajectories_to_batch
from sao_jax.metrics import MetricsWriter, peak_memory_mb
from sao_jax.packing import encode_prompts
from sao_jax.policy import TextPolicy
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


class TextGroups:
  """GRPO rounds of the text policy: one-step tasks, every completion of the round decoded in
  one sampler call and scored by the task family; besides accuracy, the step's log row gets
  reward time, tokens/s, mean length and format rate, and the summary the length, delay and
  sandbox statistics."""

  def __init__(self, s: Setup, progs: Programs, n: int):
    self.s, self.progs = s, progs
    self.tokens, self.lengths, self.delays = 0, [], []
    self.reward_s, self.sandbox_runs = 0.0, 0

  def sample(self, params, indices: list[int], key, rng) -> RLBatch:
    """The round's batch: training tasks `indices` sampled with `key` (and `rng`)."""
    s = self.s
    tasks = [s.train[i] for i in indices]
    prompt, pvalid = encode_prompts(s.tok, [t.prompt for t in tasks], s.prompt_len)
    out = jax.device_get(self.progs.sample(params, prompt, pvalid, key))
    t_decoded = time.time()
    envs = [s.family.make_env(s.tok) for _ in tasks]
    for env, task in zip(envs, tasks, strict=True):
      env.reset(task)
    results = s.family.step_many(envs, list(out.tokens_bt))
    rewards = np.asarray([r.reward for r in results], np.float32)
    self.t_sampled = time.time()
    self.reward_time = self.t_sampled - t_decoded
    self.reward_s += self.reward_time
    self.sandbox_runs += sum(r.info.get("sandbox_runs", 0) for r in results)
    self.fmt = [r.info["format_ok"] for r in results if "format_ok" in r.info]
    self.out, self.rewards = out, rewards
    return RLBatch(
      prompt_bp=prompt,
      prompt_valid_bp=pvalid,
      tokens_bt=out.tokens_bt,
      valid_bt=out.valid_bt,
      logp_bt=out.logp_bt,
      rewards_b=rewards,
    )

  def updated(self) -> None:
    lengths_b = self.out.lengths_b
    self.tokens += int(lengths_b.sum())
    self.lengths.extend(lengths_b.tolist())
    self.delays.append(time.time() - self.t_sampled)  # every row waited for the last one

  def row(self, ts: float, t_end: float) -> dict:
    lengths_b = self.out.lengths_b
    row = dict(
      accuracy=float(self.rewards.mean()),
      reward_time=self.reward_time,
      tokens_per_s=float(lengths_b.sum()) / (t_end - ts),
      mean_len=float(lengths_b.mean()),
    )
    if self.fmt:
      row["format_rate"] = float(np.mean(self.fmt))
    return row

  def summary(self, trajectories: int, wall: float) -> dict:
    return dict(
      tokens_per_s=self.tokens / wall,
      reward_s_per_trajectory=self.reward_s / max(trajectories, 1),
      **length_stats(self.lengths),
      sandbox_runs=self.sandbox_runs,
      sandbox_runs_per_s=self.sandbox_runs / wall,
      peak_rss_all_mb=peak_memory_mb(),
      **delay_stats(self.delays),
    )


class MemoryGroups:
  """GRPO rounds of the policy with compressed memory: every task of the round played as a
  whole episode side by side, each slot compressing its own in-graph; the graded steps are
  the rows (R: the most graded steps of the first expert episodes). Besides accuracy (over
  graded steps), the step's log row gets the bank entries per episode."""

  def __init__(self, s: Setup, progs: Programs, n: int):
    self.s, self.progs, self.n = s, progs, n
    self.rows = max(ExpertEpisodes(s).max_graded(), 1)

  def sample(self, params, indices: list[int], key, rng) -> MemoryBatch:
    s = self.s
    tasks = [s.train[i] for i in indices]
    self.trajs = s.policy.play(s, self.progs, params, tasks, indices, slots=self.n, rng=key)
    self.t_sampled = time.time()
    return trajectories_to_batch(self.trajs, s.max_steps, self.rows, seed=int(rng.integers(2**31)))

  def updated(self) -> None:
    pass

  def row(self, ts: float, t_end: float) -> dict:
    graded = np.concatenate([t.rewards[t.graded] for t in self.trajs])
    return dict(
      accuracy=float(graded.mean()) if len(graded) else 0.0,
      kept_steps_mean=float(np.mean([t.bank["entries"] for t in self.trajs])),
    )

  def summary(self, trajectories: int, wall: float) -> dict:
    return {}


# What a GRPO round of each kind of policy samples, trains on and reports: built with
# (setup, programs, rows per round); `sample(params, task indices, key, rng)` -> the batch
# (setting `t_sampled`), `updated()` after its update, `row(ts, t_end)` -> the step's own log
# entries, `summary(trajectories, wall seconds)` -> the phase summary's.
GROUPS = {TextPolicy: TextGroups, MemoryPolicy: MemoryGroups}


def run_grpo(
  s: Setup,
  writer: MetricsWriter,
  state: TrainState,
  workdir: pathlib.Path,
  *,
  max_seconds: float | None = None,
  eval_every: float = 0.0,
) -> tuple[TrainState, Programs, dict]:
  """Sample G = group_size episodes of each of `prompts_per_step` training tasks, wait for
  all of them, one update (the policy's `grpo_update`: advantages within each task's group);
  repeat. Text: one-step task families only (`sao_jax.setup` checks)."""
  cfg, rl = s.cfg, s.cfg.rl
  max_seconds = rl.max_seconds if max_seconds is None else max_seconds
  with_ref = rl.kl_coef > 0
  progs = programs_for(s, rl.optim, lambda _, tx: s.policy.grpo_update(tx, cfg), with_ref=with_ref)
  fresh = progs.init(jax.random.key(cfg.seed + 1))
  state = fresh.replace(
    params=copy_tree(state.params), ref_params=copy_tree(state.params) if with_ref else None
  )
  rows = rl.prompts_per_step * rl.group_size
  if rows % progs.batch_divisor:
    raise config_lib.ConfigError(
      f"prompts_per_step*group_size = {rows} must divide over {progs.batch_divisor} batch shards"
    )
  groups = GROUPS[type(s.policy)](s, progs, rows)
  rng = np.random.default_rng((cfg.seed, 2))
  key = jax.random.key(cfg.seed + 2)
  mngr = phase_manager(cfg, workdir, "rl")
  clock = PhaseClock(
    rl.steps, max_seconds, eval_every, eval_fn(s, progs), defer_dir=defer_dir(cfg, workdir, "rl")
  )
  writer.progress("grpo", rl.steps or None)
  step, busy = 0, 0.0
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
    indices = [int(i) for i in idx for _ in range(rl.group_size)]
    key, sub = jax.random.split(key)
    batch = groups.sample(state.params, indices, sub, rng)
    state, metrics = progs.update(state, progs.shard_batch(batch))
    metrics = jax.device_get(metrics)
    busy += time.time() - groups.t_sampled
    groups.updated()
    step += 1
    ckpt_lib.save(mngr, state, cfg, meta())
    t_end = time.time()
    row = dict(
      metrics,
      **groups.row(ts, t_end),
      step_time=t_end - ts,
      sampling_time=groups.t_sampled - ts,
      learner_time=t_end - groups.t_sampled,
      train_seconds=clock.elapsed,
      learner_busy=busy / (time.time() - t_loop),
      peak_memory_mb=peak_memory_mb(),
    )
    log_step(writer, clock, cfg, step, state.params, row, "rl")
  wall = max(time.time() - t_loop, 1e-9)
  info = finish_phase(mngr, state, cfg, clock, step, "rl", meta(), progs.packer)
  return (
    state,
    progs,
    dict(
      info,
      trajectories=step * rows,
      trajectories_per_s=step * rows / wall,
      learner_busy=busy / wall,
      learner_peak_mb=peak_memory_mb(),
      seconds_per_step=info["seconds"] / max(step, 1),
      **groups.summary(step * rows, wall),
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
    s = self.s
    return programs_for(
      s, s.cfg.rl.optim, lambda _, tx: s.policy.grpo_update(tx, s.cfg), with_ref=self.with_ref
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
