"""The supervised warm start: teacher-forced cross-entropy on the task family's worked
solutions (text) or expert episodes (compressed memory: plus the compressor's losses), the
batches and the update the run's policy's (`Policy.sft_batches`, `Policy.sft_update`)."""

from __future__ import annotations

import pathlib
import time
import zlib
from collections.abc import Callable

import jax
import numpy as np

from sao_jax import checkpoint as ckpt_lib
from sao_jax.metrics import MetricsWriter
from sao_jax.packing import round_up
from sao_jax.runners.common import (
  PhaseClock,
  defer_dir,
  eval_fn,
  finish_phase,
  log_step,
  phase_manager,
  phase_meta,
  resume_phase,
  sft_programs,
  supervised_row,
)
from sao_jax.runners.compiled import Programs
from sao_jax.setup import Setup
from sao_jax.state import TrainState, copy_tree


def run_sft(
  s: Setup,
  writer: MetricsWriter,
  state: TrainState | None,
  workdir: pathlib.Path,
  *,
  steps: int | None = None,
  max_seconds: float | None = None,
  tag: str = "sft",
  eval_every: float = 0.0,
  eval_every_steps: int = 0,
  keep_opt_state: bool = False,
  held_out: Callable[[object], dict] | None = None,
) -> tuple[TrainState, Programs, dict]:
  """Teacher-forced cross-entropy on worked solutions of random training tasks.

  Starts from `state`'s params (a copy: the caller's state stays valid) and, with
  `keep_opt_state`, its optimizer state too (continuing an SFT run rather than restarting).
  Resumes by itself from the newest snapshot in `workdir/checkpoints/<tag>`. Held-out evals
  (every `eval_every` training seconds and/or `eval_every_steps` steps, and at the end) are
  `held_out(params) -> {"accuracy": ..., ...}`, by default this setup's test split; another
  one evaluates demonstrations-only training on tasks that have none (e.g. harder ones).
  """
  cfg = s.cfg
  steps = cfg.sft.steps if steps is None else steps
  max_seconds = cfg.sft.max_seconds if max_seconds is None else max_seconds
  progs = sft_programs(s)
  fresh = progs.init(jax.random.key(cfg.seed))
  if state is not None:
    state = copy_tree(state) if keep_opt_state else fresh.replace(params=copy_tree(state.params))
  else:
    state = fresh
  next_batch = s.policy.sft_batches(s, round_up(cfg.sft.batch_size, progs.batch_divisor))
  rng = np.random.default_rng((cfg.seed, 1, zlib.crc32(tag.encode())))
  clock = PhaseClock(
    steps,
    max_seconds,
    eval_every,
    held_out or eval_fn(s, progs),
    eval_every_steps,
    defer_dir=defer_dir(cfg, workdir, tag),
  )
  writer.progress(tag, steps or None)
  mngr = phase_manager(cfg, workdir, tag)
  step, tokens = 0, 0
  resumed = resume_phase(mngr, state, clock, rng, tag)
  if resumed is not None:  # a restart: same batches from here as the uninterrupted run
    state, step, _ = resumed
  else:
    clock.maybe_eval(step, state.params, force=bool(eval_every or eval_every_steps))

  def meta():
    return phase_meta(tag, rng, clock)

  while clock.running(step):
    ts = time.time()
    batch, n_tokens = next_batch(rng)
    state, metrics = progs.update(state, progs.shard_batch(batch))
    step += 1
    tokens += n_tokens
    ckpt_lib.save(mngr, state, cfg, meta())
    row = supervised_row(cfg, step, metrics, ts, tokens, clock)
    log_step(writer, clock, cfg, step, state.params, row, tag)
  return state, progs, finish_phase(mngr, state, cfg, clock, step, tag, meta(), progs.packer)
