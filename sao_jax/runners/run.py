"""A whole run, as `sao-jax train` does it: supervised warm start, then the RL phase that
`rl.algorithm` names, in one workdir that a rerun of the same command resumes.

The workdir gets metrics.jsonl (phase-tagged rows), tb/, checkpoints/{sft,rl}/,
config.json, progress.json (finished phases) and summary.json.
"""

from __future__ import annotations

import json
import os
import pathlib
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from sao_jax import checkpoint as ckpt_lib
from sao_jax import config as config_lib
from sao_jax import distributed, estimates, sharding, startup, storage
from sao_jax.config import Config
from sao_jax.evaluation import evaluate
from sao_jax.metrics import MetricsWriter, SilentWriter, peak_memory_mb, write_summary
from sao_jax.models import hf
from sao_jax.runners.common import eval_fn, sft_programs
from sao_jax.runners.compiled import compile_sampler
from sao_jax.runners.grpo import run_grpo
from sao_jax.runners.memory_sao import learner_class
from sao_jax.runners.sao import run_sao
from sao_jax.runners.sft import run_sft
from sao_jax.setup import Setup, make_setup
from sao_jax.startup import enable_compile_cache
from sao_jax.state import TrainState


def run_in_samplers(
  s: Setup,
  writer: MetricsWriter,
  state: TrainState,
  workdir: pathlib.Path,
  *,
  max_seconds: float | None = None,
  eval_every: float = 0.0,
) -> tuple:
  """An RL phase sampled in sampler processes (`run_sao`) by the learner of `rl.algorithm` and
  the run's policy (`learner_class`); resumes by itself from `workdir/checkpoints/rl` and the
  journal."""
  return run_sao(
    s,
    writer,
    state,
    workdir,
    max_seconds=max_seconds,
    eval_every=eval_every,
    learner_cls=learner_class(s.cfg.rl.algorithm, s.policy),
  )


# (rl.algorithm, in sampler processes?) -> the RL phase, for either kind of policy:
# (setup, writer, start state, workdir, *, eval_every) -> (state, programs, summary).
# `sao_jax.setup.validate` refuses the combinations missing here and what a policy cannot do.
RL_PHASES = {
  ("grpo", False): run_grpo,
  ("grpo", True): run_in_samplers,
  ("sao", True): run_in_samplers,
}


def restore_init(s: Setup, path: str) -> TrainState:
  """Params from another run's latest checkpoint (a workdir or a checkpoint folder), or from
  a Hugging Face checkpoint directory (`setup.validate` has checked that it is `s.model`'s
  architecture; adapters and heads it lacks start fresh). The phases take only the params."""
  if hf.is_checkpoint(path):
    rng = jax.random.key(s.cfg.seed)
    mesh = sharding.make_mesh(s.cfg.mesh)
    params = hf.load_params(path, s.model.cfg, mesh=mesh, rules=s.cfg.mesh.rules, rng=rng)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=None, rng=rng)
  directory = ckpt_lib.checkpoint_dir(pathlib.Path(path))
  progs = sft_programs(s)
  like = progs.init(jax.random.key(0))
  params, _, _ = ckpt_lib.restore_params(directory, like.params)
  return like.replace(params=params)


def _eval_row(info: dict) -> dict:
  return {
    f"eval_{k}": info[k]
    for k in ("accuracy", "format_rate", "num_problems", "retention", "bytes_stage3")
    if k in info
  }


def _check_resume(cfg: Config, workdir: pathlib.Path) -> dict | None:
  """None for a new workdir; for one that holds this run: the phases it finished (rerunning
  the same command resumes). A different config in the same workdir is an error."""
  old_path = workdir / "config.json"
  if not old_path.exists() or not (
    (workdir / "checkpoints").exists() or _bucket_has_snapshots(cfg)
  ):
    return None
  try:  # keys added to the code since (absent from the file) take their defaults: upgrade
    old_cfg = config_lib.read_saved(old_path)
  except (config_lib.ConfigError, TypeError, ValueError) as err:
    raise config_lib.ConfigError(
      f"{workdir} holds a run whose config.json this code cannot read ({err}); pass a new --workdir"
    ) from None
  old = _flat(json.loads(config_lib.to_json(old_cfg)))
  new = _flat(json.loads(config_lib.to_json(cfg)))
  # The process layout may change between runs: snapshots restore onto any mesh.
  diff = sorted(
    k
    for k in old.keys() | new.keys()
    if old.get(k) != new.get(k) and not k.startswith("distributed.")
  )
  if diff:
    shown = "; ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in diff[:5])
    raise config_lib.ConfigError(
      f"{workdir} already holds a run with a different config ({shown}); rerun with the same "
      "config to resume it, or pass a new --workdir"
    )
  path = workdir / "progress.json"
  progress = json.loads(path.read_text()) if path.exists() else {}
  return progress


def _bucket_has_snapshots(cfg: Config) -> bool:
  """With `storage.url`: whether the bucket holds any committed snapshot of this run (the
  learner's local staging folder may be gone: a resume on a fresh disk)."""
  if not cfg.storage.url:
    return False
  store = storage.open_store(storage.join(cfg.storage.url, "checkpoints"))
  return any(name.endswith(".commit") for name in store.list())


def _flat(d: dict, prefix: str = "") -> dict:
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(_flat(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def _save_progress(workdir: pathlib.Path, phase: str, info: dict) -> None:
  path = workdir / "progress.json"
  progress = json.loads(path.read_text()) if path.exists() else {}
  progress[phase] = {k: v for k, v in info.items() if k != "eval_curve"}
  tmp = path.with_suffix(".tmp")
  tmp.write_text(json.dumps(progress, default=float))
  os.replace(tmp, path)


def run(cfg: Config, workdir: str | pathlib.Path, *, show_progress: bool = True) -> dict[str, Any]:
  workdir = pathlib.Path(workdir)
  distributed.initialize(cfg.distributed)  # before any JAX computation; only process 0 writes
  primary = distributed.is_primary()
  progress = _check_resume(cfg, workdir)
  t_start = time.time()
  startup.mark("imports")
  s = make_setup(cfg)  # before anything is written: a config it refuses leaves no trace
  startup.mark("setup")
  enable_compile_cache(cfg.recovery.compile_cache, workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  est = estimates.estimate(
    cfg,
    s.model.cfg,
    prompt_len=s.prompt_len,
    target_len=s.target_len,
    device=estimates.runtime_device(jax.devices(), cfg.model.dtype, len(os.sched_getaffinity(0))),
  )
  if primary:
    (workdir / "config.json").write_text(config_lib.to_json(cfg))
    (workdir / "estimates.json").write_text(json.dumps(est, indent=2) + "\n")
    print(estimates.format_block(est), flush=True)
  writer = (
    MetricsWriter(
      workdir, show_progress=show_progress, logging=cfg.logging, run_config=config_lib.to_dict(cfg)
    )
    if primary
    else SilentWriter()
  )
  summary: dict[str, Any] = {
    "name": cfg.name,
    "devices": [str(d) for d in jax.devices()],
    "train_problems": len(s.train),
    "test_problems": len(s.test),
  }
  if progress is not None:
    print(
      f"resuming the run in {workdir} (finished phases: {', '.join(progress) or 'none'})",
      flush=True,
    )
    if (workdir / "summary.json").exists() and (
      "rl" in progress or not (cfg.rl.steps or cfg.rl.max_seconds)
    ):
      writer.close()
      print("the run had already finished; its summary is unchanged", flush=True)
      return json.loads((workdir / "summary.json").read_text())
  progress = progress or {}
  state = restore_init(s, cfg.init_from) if cfg.init_from else None
  try:
    if "sft" in progress:  # finished before the restart: its final snapshot is the start
      if cfg.storage.url:  # the bucket's snapshots, not what the local folder may hold
        ckpt_lib.Mirror(workdir / "checkpoints" / "sft", ckpt_lib.snapshot_url(cfg, "sft"))
      state = restore_init(s, str(workdir / "checkpoints" / "sft"))
      summary["sft"] = progress["sft"]
      startup.mark("restore_init")
    elif cfg.sft.steps or cfg.sft.max_seconds:
      state, progs, info = run_sft(s, writer, state, workdir, eval_every=cfg.eval.every_seconds)
      summary["sft"] = info
      writer.write(info["steps"], _eval_row(info), phase="sft_eval", advance=0)
      if primary:
        _save_progress(workdir, "sft", info)
    if state is None:
      raise config_lib.ConfigError("nothing to train from: set sft.steps/max_seconds or init_from")
    if cfg.rl.steps or cfg.rl.max_seconds:
      if "sft" not in summary:
        summary["start"] = eval_fn(s, sft_programs(s))(state.params)
      rl_phase = RL_PHASES[cfg.rl.algorithm, cfg.rl.uses_samplers]
      state, progs, info = rl_phase(s, writer, state, workdir, eval_every=cfg.eval.every_seconds)
      summary["rl"] = info
      writer.write(info["steps"], _eval_row(info), phase="rl_eval", advance=0)
      if primary:
        _save_progress(workdir, "rl", info)
  finally:
    writer.close()
  summary["wall_s"] = time.time() - t_start
  summary["peak_memory_mb"] = peak_memory_mb()
  if primary:
    write_summary(workdir, summary)
  return summary


def eval_workdir(
  workdir: str | pathlib.Path, num: int | None = None, overrides: Sequence[str] = ()
) -> dict[str, Any]:
  """Held-out greedy accuracy of the newest readable checkpoint in `workdir`, rebuilt from its
  config, with `overrides` ("key=value") applied first: the same policy on another test
  split (e.g. "task.n_ops=3"; the model's own fields must stay the checkpoint's). A damaged
  snapshot is skipped for the one before it (`skipped` names them), as a resumed run does,
  but nothing in the workdir is moved or created."""
  directory = ckpt_lib.checkpoint_dir(pathlib.Path(workdir))
  built: dict[str, Any] = {}

  def like_for(meta: dict):
    cfg = config_lib.from_saved(meta["config"])
    new = config_lib.apply_overrides(cfg, list(overrides))
    if new.model != cfg.model or new.tokenizer != cfg.tokenizer:
      raise config_lib.ConfigError("eval overrides may not change the checkpoint's model")
    s = make_setup(new)
    progs = compile_sampler(
      new,
      s.policy,
      max_new_tokens=new.rl.max_new_tokens,
      temperature=new.rl.temperature,
      eos_id=s.tok.eos_id,
      pad_id=s.tok.pad_id,
    )
    built.update(s=s, progs=progs)
    return progs.abstract_params

  params, step, _, skipped = ckpt_lib.restore_params_readable(directory, like_for)
  s, progs = built["s"], built["progs"]
  result = evaluate(s, progs, params, batch_divisor=progs.batch_divisor, num=num)
  return dict(result, checkpoint=str(directory), step=step, skipped=skipped)
