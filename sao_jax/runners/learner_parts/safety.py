"""The SAO learner's safety: the non-finite guard, shadow validation and rollback.

It decides and restores; the learner acts on the decision (a new lineage, publishing, the
event). Its only file is the shadow bank it is given, so it is tested with a tiny state alone
(tests/test_learner_safety.py)."""

from __future__ import annotations

import collections
from collections.abc import Callable

import jax
import jax.numpy as jnp

from sao_jax import checkpoint as ckpt_lib
from sao_jax import config as config_lib
from sao_jax.state import TrainState


class Safety:
  """Shadows of the policy with their validation accuracy (`shadows`), kept every
  `recovery.shadow_every` updates when there are `n_val` validation tasks, and the recent
  updates' non-finite skips. `counts` is the learner's counter (`nonfinite_skipped`,
  `rollbacks`)."""

  def __init__(
    self,
    rcfg: config_lib.RecoveryConfig,
    shadows: ckpt_lib.ShadowBank,
    validate_fn: Callable[[object], dict],
    n_val: int,
    counts: collections.Counter,
  ):
    self.rcfg, self.shadows, self.validate_fn = rcfg, shadows, validate_fn
    self.n_val, self.counts = n_val, counts
    self.nonfinite_recent: collections.deque = collections.deque(maxlen=rcfg.nonfinite_window)

  def first_shadow(self, params, lineage: int | None) -> None:
    """A new run's shadow at step 0 (with validation tasks)."""
    if self.n_val:
      self.shadows.save(0, params, self.validate_fn(params)["accuracy"], lineage)

  def note(self, metrics) -> None:
    """Counts an update's non-finite skip (0 or 1) into the window that triggers a rollback."""
    skipped = int(metrics["nonfinite_skipped"])
    self.counts["nonfinite_skipped"] += skipped
    self.nonfinite_recent.append(skipped)

  def validation_due(self, step: int) -> bool:
    return bool(self.n_val) and step % self.rcfg.shadow_every == 0

  def judge(self, step: int, params, lineage: int | None) -> tuple[float, str | None]:
    """(greedy validation accuracy, why to roll back or None). Without a fall of more than
    recovery.regress_threshold below the best shadow, `params` become the shadow of `step`."""
    thr = self.rcfg.regress_threshold
    val_acc = self.validate_fn(params)["accuracy"]
    best = self.shadows.best()
    if best is not None and val_acc < best[1] - thr:
      return val_acc, (
        f"validation accuracy {val_acc:.3f} fell below the best shadow's "
        f"{best[1]:.3f} by more than {thr}"
      )
    self.shadows.save(step, params, val_acc, lineage)
    return val_acc, None

  def nonfinite_reason(self) -> str | None:
    """Why to roll back when too many recent updates were non-finite (with shadows), else
    None."""
    recent = self.nonfinite_recent
    if self.n_val and sum(recent) >= self.rcfg.nonfinite_limit:
      return f"{sum(recent)} of the last {len(recent)} updates had non-finite gradients"
    return None

  def rollback(
    self, state: TrainState, reason: str, fresh: Callable[[int], TrainState]
  ) -> tuple[TrainState, dict]:
    """(`state` with the best shadow's params, a fresh optimizer from `fresh(rollbacks)` and
    the step size times recovery.lr_decay; the rollback event). Raises RuntimeError past
    recovery.max_rollbacks or with no readable shadow left."""
    rcfg, counts = self.rcfg, self.counts
    if counts["rollbacks"] >= rcfg.max_rollbacks:
      raise RuntimeError(
        f"SAO learner: {reason}, and the run already rolled back "
        f"{counts['rollbacks']} times (recovery.max_rollbacks); stopping"
      )
    best = self.shadows.restore_best(state.params)
    if best is None:
      raise RuntimeError(f"SAO learner: {reason}, and no shadow is left to roll back to")
    counts["rollbacks"] += 1
    lr_scale = float(jax.device_get(state.lr_scale)) * rcfg.lr_decay
    reset = fresh(counts["rollbacks"])
    restored = reset.replace(
      step=state.step,
      params=best[2],
      tracker=state.tracker,
      rng=state.rng,
      nonfinite=state.nonfinite,
      ref_params=state.ref_params,
      lr_scale=jnp.asarray(lr_scale, jnp.float32),
    )
    self.nonfinite_recent.clear()
    event = {
      "event": "rollback",
      "reason": reason,
      "to_shadow_step": best[0],
      "shadow_val_accuracy": best[1],
      "lr_scale": lr_scale,
      "rollbacks": counts["rollbacks"],
    }
    return restored, event
