"""Orbax snapshots of the learner state plus the resolved config (a checkpoint can rebuild its
own run). Params and the rest of the state are separate items so evaluation restores only
params, onto whatever sharding the caller asks for.

A snapshot is written asynchronously into a temporary folder and renamed when complete, so
a crash mid-write leaves no half snapshot behind (leftover temporaries are cleaned up when
the next manager opens). A complete but corrupt snapshot (damaged files) is detected on
restore: `restore_latest_valid` warns and falls back to the previous one. The `meta` item
(JSON) holds the resolved config and the run's stream positions (task sampler state,
journal position, transport offsets, clock), so a resumed run continues where it stopped.
"""
from __future__ import annotations

import pathlib
import warnings
from typing import Any

import jax
import orbax.checkpoint as ocp

from sao_jax import config as config_lib
from sao_jax.learner import TrainState

BEST_METRIC = "val_accuracy"


def manager(directory: str | pathlib.Path, *, every: int = 100, keep: int = 3,
            keep_best: bool = True) -> ocp.CheckpointManager:
  """Saves every `every` steps (asynchronously); keeps the last `keep` snapshots and, with
  `keep_best`, also the one with the highest `val_accuracy` among those saved with metrics."""
  cm = ocp.checkpoint_managers
  policies = [cm.LatestN(n=keep)]
  if keep_best:
    policies.append(cm.BestN(get_metric_fn=lambda m: m[BEST_METRIC], n=1,
                             keep_checkpoints_without_metrics=False))
  options = ocp.CheckpointManagerOptions(
      save_interval_steps=every, enable_async_checkpointing=True, create=True,
      cleanup_tmp_directories=True, preservation_policy=cm.AnyPreservationPolicy(policies))
  return ocp.CheckpointManager(pathlib.Path(directory).absolute(), options=options)


def save(mngr: ocp.CheckpointManager, state: TrainState, cfg: config_lib.Config,
         meta: dict[str, Any] | None = None, *, force: bool = False,
         metrics: dict[str, float] | None = None) -> bool:
  """Snapshot at `state.step` if the manager's interval says so (or `force`)."""
  step = int(jax.device_get(state.step))
  if force and step in mngr.all_steps():
    return False
  if not force and not mngr.should_save(step):
    return False
  rest = _rest(state)
  return mngr.save(step, force=force, metrics=metrics, args=ocp.args.Composite(
      params=ocp.args.StandardSave(state.params),
      rest=ocp.args.StandardSave(rest),
      meta=ocp.args.JsonSave({"config": config_lib.to_dict(cfg), **(meta or {})})))


def _rest(state: TrainState) -> dict:
  """Everything but params: optimizer, step, RNG, step-size scale, skip counter, and the SAO
  value trackers if any."""
  rest = {"step": state.step, "opt_state": state.opt_state, "rng": jax.random.key_data(state.rng),
          "lr_scale": state.lr_scale, "nonfinite": state.nonfinite}
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
                       tracker=rest.get("tracker", like.tracker), lr_scale=rest["lr_scale"],
                       nonfinite=rest["nonfinite"])
  return state, dict(out["meta"])


def restore_latest_valid(mngr: ocp.CheckpointManager, like: TrainState
                         ) -> tuple[TrainState, dict, int, list[int]] | None:
  """The newest snapshot that restores cleanly, newest first: (state, meta, step, skipped).

  A snapshot that fails to restore (truncated or damaged files, unreadable metadata) is
  reported with a warning and skipped; None when there is no readable snapshot at all.
  """
  skipped = []
  for step in sorted(mngr.all_steps(), reverse=True):
    try:
      state, meta = restore_state(mngr, like, step)
      return state, meta, step, skipped
    except Exception as err:  # noqa: BLE001 - any failure to read means: not usable
      skipped.append(step)
      aside = _move_aside(mngr, step)
      warnings.warn(f"snapshot step {step} in {mngr.directory} is unreadable "
                    f"({type(err).__name__}: {str(err)[:200]}); moved to {aside}; falling "
                    "back to an earlier one", RuntimeWarning, stacklevel=2)
  return None


def _move_aside(mngr: ocp.CheckpointManager, step: int) -> pathlib.Path:
  """Takes a damaged snapshot out of the manager's view (kept for inspection under
  `corrupt/`), so the resumed run saves that step again and no later resume trips on it."""
  import time
  src = pathlib.Path(mngr.directory) / str(step)
  dst = pathlib.Path(mngr.directory).parent / f"{pathlib.Path(mngr.directory).name}-corrupt"
  dst.mkdir(exist_ok=True)
  dst = dst / f"{step}-{time.strftime('%Y%m%d%H%M%S')}"
  src.rename(dst)
  mngr.reload()
  return dst


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


class ShadowBank:
  """Historical policy versions (params only) with their validation accuracy, as Orbax
  snapshots under `directory`: the last `keep` plus the best. Used for rollback."""

  def __init__(self, directory: str | pathlib.Path, keep: int):
    cm = ocp.checkpoint_managers
    policy = cm.AnyPreservationPolicy([
        cm.LatestN(n=keep),
        cm.BestN(get_metric_fn=lambda m: m[BEST_METRIC], n=1,
                 keep_checkpoints_without_metrics=False)])
    options = ocp.CheckpointManagerOptions(create=True, cleanup_tmp_directories=True,
                                           enable_async_checkpointing=False,
                                           preservation_policy=policy)
    self.mngr = ocp.CheckpointManager(pathlib.Path(directory).absolute(), options=options)
    self.scores: dict[int, float] = {}

  def reset_to(self, step: int, scores: dict[int, float]) -> None:
    """After a resume at `step`: forget shadows taken after it (they are retaken)."""
    for s in self.mngr.all_steps():
      if s > step or s not in scores:
        self.mngr.delete(s)
    self.scores = {s: v for s, v in scores.items() if s in self.mngr.all_steps()}

  def save(self, step: int, params, val_accuracy: float) -> None:
    if step in self.mngr.all_steps():
      self.mngr.delete(step)
    self.mngr.save(step, metrics={BEST_METRIC: val_accuracy}, force=True, args=ocp.args.Composite(
        params=ocp.args.StandardSave(params)))
    self.mngr.wait_until_finished()
    kept = set(self.mngr.all_steps())
    self.scores = {s: v for s, v in {**self.scores, step: val_accuracy}.items() if s in kept}

  def best(self) -> tuple[int, float] | None:
    if not self.scores:
      return None
    step = max(self.scores, key=lambda s: (self.scores[s], s))
    return step, self.scores[step]

  def restore(self, step: int, like_params):
    out = self.mngr.restore(step, args=ocp.args.Composite(
        params=ocp.args.StandardRestore(_abstract(like_params))))
    return out["params"]

  def close(self) -> None:
    self.mngr.close()


def checkpoint_dir(path: pathlib.Path) -> pathlib.Path:
  """`path` itself if it holds steps; else the newest phase under path/checkpoints."""
  if (path / "checkpoints").is_dir():
    for phase in ("rl", "sft"):
      d = path / "checkpoints" / phase
      if d.is_dir() and any(p.name.isdigit() for p in d.iterdir()):
        return d
    raise FileNotFoundError(f"no checkpoints under {path}/checkpoints")
  return path
