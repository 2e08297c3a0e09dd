"""Part 3 of experiments/bench_compression.py: the peak memory of one learner update, from
XLA's compiled memory analysis (arguments + outputs + temporaries - aliased), for GRPO(N=8)
with full context against SAO with compressed memory (and, optionally, the stage-1 memory),
on abstract batches: no trained parameters, no data."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from sao_jax.batches import MemoryBatch, RLBatch
from sao_jax.bench.compression import uncompressed_cfg
from sao_jax.config import Config, RLConfig
from sao_jax.envs.longhorizon import SEP, make_split
from sao_jax.learner import make_optimizer, make_rl_update
from sao_jax.models.transformer import TransformerLM
from sao_jax.runners import memory_lab as L
from sao_jax.runners.compiled import compile_programs


def compiled_memory(compiled) -> dict:
  ma = compiled.memory_analysis()
  total = (
    ma.argument_size_in_bytes
    + ma.output_size_in_bytes
    + ma.temp_size_in_bytes
    - ma.alias_size_in_bytes
  )
  return {
    "argument": ma.argument_size_in_bytes,
    "output": ma.output_size_in_bytes,
    "temp": ma.temp_size_in_bytes,
    "alias": ma.alias_size_in_bytes,
    "peak": total,
  }


def peak_memory(
  cfg: Config, tasks, *, group: int = 8, window: int | None = None, stage1: bool = False
) -> dict:
  """Compiled memory of one learner update on `tasks` (one trajectory each for SAO).

  window: the full-context control's trained context (tokens). Where the episodes are longer,
  GRPO(N=8) with full attention over that window is measured too: the control that trains
  at this length. stage1: also the memory policy with stage 1 only (every step kept in
  float32, `uncompressed_cfg`, the control that trains at 1,000 steps), as a GRPO(N=8)-shaped
  update (8 trajectories per task; group-relative advantages are computed before the update
  and cost it nothing) and as SAO (one)."""
  c = cfg.compression
  n_steps = len(tasks[0].prompt.split(SEP))
  graded = len(tasks[0].answer.split(","))
  ctx = L.full_len(tasks)
  tx = make_optimizer(cfg.sft.optim)
  mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:1]).reshape(1, 1, 1), cfg.mesh.axes)

  def full_context_update(n, tokens):
    # GRPO(N=n): every graded step of each of the n trajectories is a row whose prompt is the
    # context up to that step (its last `tokens` tokens, left-padded to the longest).
    model_cfg = dataclasses.replace(
      L.model_cfg(cfg, False, tokens + L.MAX_NEW), max_len=tokens + L.MAX_NEW
    )
    grpo_cfg = dataclasses.replace(
      cfg, model=model_cfg, compression=dataclasses.replace(c, enabled=False)
    )
    model = TransformerLM(model_cfg)
    rl = RLConfig(group_size=n, prompts_per_step=len(tasks) * graded)
    gp = compile_programs(
      grpo_cfg,
      model,
      tx,
      make_rl_update(model, tx, rl),
      with_ref=False,
      prompt_len=tokens,
      max_new_tokens=L.MAX_NEW,
      temperature=1.0,
      eos_id=L.TOK.eos_id,
      pad_id=L.TOK.pad_id,
      mesh=mesh,
    )
    rows = len(tasks) * graded * n
    gbatch = RLBatch.abstract(rows, tokens, L.MAX_NEW)
    return compiled_memory(
      gp.update.lower(jax.eval_shape(gp.init, jax.random.key(0)), gbatch).compile()
    )

  grpo = full_context_update(group, ctx)
  # Decomposition: one trajectory per task with full context (the group factor alone).
  single_full = full_context_update(1, ctx)

  def memory_update(mcfg, n):
    # n trajectories per task; rows = each one's graded steps; per-step segments for the
    # encoder and LSTM; the shipped bank (INT8 unless the config turns stage 3 off).
    mc = mcfg.compression
    mprogs, _ = L.build(mcfg, True, mode="rl")
    sbatch = MemoryBatch.abstract(
      len(tasks) * n,
      n_steps,
      graded,
      mc.window,
      L.MAX_NEW,
      step_len=mc.step_len,
      capacity=mc.capacity,
      vectors=mc.vectors_per_step,
      dim=mc.dim,
      sampled=True,
    )
    sstate = jax.eval_shape(mprogs.init, jax.random.key(0))
    return compiled_memory(mprogs.update.lower(sstate, sbatch).compile())

  sao = memory_update(cfg, 1)
  out = {
    "tasks": len(tasks),
    "steps": n_steps,
    "graded_rows_per_trajectory": graded,
    "full_context_tokens": ctx,
    "grpo_n8_full_context": grpo,
    "sao_compressed": sao,
    "single_trajectory_full_context": single_full,
    "ratio_sao_over_grpo": sao["peak"] / grpo["peak"],
  }
  if window is not None and window < ctx:
    windowed = full_context_update(group, window)
    out.update(
      control_window_tokens=window,
      grpo_n8_window_control=windowed,
      ratio_sao_over_grpo_window=sao["peak"] / windowed["peak"],
    )
  if stage1:
    ucfg = uncompressed_cfg(cfg, n_steps)
    g1 = memory_update(ucfg, group)
    out.update(
      grpo_n8_stage1_memory=g1,
      sao_stage1_memory=memory_update(ucfg, 1),
      ratio_sao_over_grpo_stage1=sao["peak"] / g1["peak"],
    )
  return out


def peak_memories(cfg: Config, test, long_tasks, length: int, stage1: bool, log) -> dict:
  """`peak_memory` on the accuracy episodes and on the 1,000-step ones (with the control's
  trained window, and with `stage1` the stage-1 memory), logged."""
  memory = {
    "accuracy_episodes": peak_memory(cfg, test[:1]),
    "long_episodes": peak_memory(cfg, long_tasks[:1], window=length, stage1=stage1),
  }
  for k, v in memory.items():
    log(
      f"  peak memory ({k}): GRPO(N=8) {v['grpo_n8_full_context']['peak'] / 1e6:.1f} MB, "
      f"SAO {v['sao_compressed']['peak'] / 1e6:.1f} MB, ratio {v['ratio_sao_over_grpo']:.4f}"
    )
    if "grpo_n8_stage1_memory" in v:
      log(
        f"  ... GRPO(N=8) with stage-1 memory (every step, float32) "
        f"{v['grpo_n8_stage1_memory']['peak'] / 1e6:.1f} MB, ratio SAO / that "
        f"{v['ratio_sao_over_grpo_stage1']:.4f}"
      )
    if "grpo_n8_window_control" in v:
      log(
        f"  ... GRPO(N=8) on the control's last {v['control_window_tokens']} tokens "
        f"{v['grpo_n8_window_control']['peak'] / 1e6:.1f} MB, ratio SAO / that "
        f"{v['ratio_sao_over_grpo_window']:.3f}"
      )
  return memory


def peak_memory_task(cfg: Config, spec, long_spec, test, length: int, stage1: bool, log) -> dict:
  """A task's entry of a --peak-memory-only run: its specs and `peak_memories` on one held-out
  episode of `long_spec`."""
  long_tasks = make_split(long_spec, "test", 1, 1)
  return {
    "spec": dataclasses.asdict(spec),
    "long_spec": dataclasses.asdict(long_spec),
    "peak_memory": peak_memories(cfg, test, long_tasks, length, stage1, log),
  }
