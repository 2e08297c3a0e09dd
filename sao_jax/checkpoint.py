"""Orbax snapshots of the learner state plus the resolved config (a checkpoint can rebuild its
own run). Params and the rest of the state are separate items so evaluation restores only
params, onto whatever sharding the caller asks for."""
from __future__ import annotations

import pathlib
from typing import Any

import jax
import orbax.checkpoint as ocp

from sao_jax import config as config_lib
from sao_jax.learner import TrainState


def manager(directory: str | pathlib.Path, *, every: int = 100, keep: int = 3
            ) -> ocp.CheckpointManager:
  options = ocp.CheckpointManagerOptions(save_interval_steps=every, max_to_keep=keep,
                                         enable_async_checkpointing=True, create=True)
  return ocp.CheckpointManager(pathlib.Path(directory).absolute(), options=options)


def save(mngr: ocp.CheckpointManager, state: TrainState, cfg: config_lib.Config,
         meta: dict[str, Any] | None = None, *, force: bool = False) -> bool:
  step = int(jax.device_get(state.step))
  if force and step in mngr.all_steps():
    return False
  rest = _rest(state)
  return mngr.save(step, force=force, args=ocp.args.Composite(
      params=ocp.args.StandardSave(state.params),
      rest=ocp.args.StandardSave(rest),
      meta=ocp.args.JsonSave({"config": config_lib.to_dict(cfg), **(meta or {})})))


def _rest(state: TrainState) -> dict:
  """Everything but params: optimizer, step, RNG, and the SAO value trackers if any."""
  rest = {"step": state.step, "opt_state": state.opt_state, "rng": jax.random.key_data(state.rng)}
  if state.tracker is not None:
    rest["tracker"] = state.tracker
  return rest


def _abstract(tree):
  return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)


def restore_state(mngr: ocp.CheckpointManager, like: TrainState, step: int | None = None
                  ) -> tuple[TrainState, dict]:
  """Restores onto the shardings of `like` (an initialised state of the same run)."""
  step = mngr.latest_step() if step is None else step
  out = mngr.restore(step, args=ocp.args.Composite(
      params=ocp.args.StandardRestore(_abstract(like.params)),
      rest=ocp.args.StandardRestore(_abstract(_rest(like))),
      meta=ocp.args.JsonRestore()))
  rest = out["rest"]
  state = like.replace(step=rest["step"], params=out["params"], opt_state=rest["opt_state"],
                       rng=jax.random.wrap_key_data(rest["rng"]),
                       tracker=rest.get("tracker", like.tracker))
  return state, dict(out["meta"])


def read_meta(directory: str | pathlib.Path, step: int | None = None) -> tuple[int, dict]:
  mngr = manager(directory)
  step = mngr.latest_step() if step is None else step
  if step is None:
    raise FileNotFoundError(f"no complete checkpoint in {directory}")
  meta = mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
  mngr.close()
  return step, dict(meta)


def restore_params(directory: str | pathlib.Path, like_params, step: int | None = None):
  """Params only, onto the shardings of `like_params`; returns (params, step, meta)."""
  mngr = manager(directory)
  step = mngr.latest_step() if step is None else step
  if step is None:
    raise FileNotFoundError(f"no complete checkpoint in {directory}")
  out = mngr.restore(step, args=ocp.args.Composite(
      params=ocp.args.StandardRestore(_abstract(like_params)), meta=ocp.args.JsonRestore()))
  mngr.close()
  return out["params"], step, dict(out["meta"])
