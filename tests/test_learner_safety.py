"""The SAO learner's safety part (runners.learner_parts.safety): non-finite guard, shadow
validation and rollback on a tiny state and a real shadow bank; no process, no model."""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao_jax import checkpoint as ckpt_lib
from sao_jax.config import RecoveryConfig
from sao_jax.runners.learner_parts.safety import Safety
from sao_jax.state import TrainState


def _state(w, step=5, lr_scale=1.0):
  return TrainState(
    step=jnp.asarray(step, jnp.int32),
    params={"w": jnp.full(3, w, jnp.float32)},
    opt_state={"m": jnp.full(3, 9.0, jnp.float32)},
    rng=jax.random.key(1),
    tracker={"a": jnp.ones(2)},
    lr_scale=jnp.asarray(lr_scale, jnp.float32),
    nonfinite=jnp.asarray(2, jnp.int32),
  )


def _fresh(n):  # what the learner's programs.init gives: a new optimizer (marked by n)
  return _state(0.0, step=0).replace(opt_state={"m": jnp.full(3, float(n), jnp.float32)})


def _safety(tmp_path, accuracy, **kw):
  """Validation accuracy is read off the params: accuracy(w)."""
  rcfg = RecoveryConfig(**kw)
  bank = ckpt_lib.ShadowBank(tmp_path / "shadows", rcfg.shadow_keep)
  validate = lambda params: {"accuracy": accuracy(float(params["w"][0]))}  # noqa: E731
  n_val = rcfg.val_problems if rcfg.shadow_every else 0
  return Safety(rcfg, bank, validate, n_val, collections.Counter())


def test_non_finite_updates_in_the_window_call_for_a_rollback(tmp_path):
  safety = _safety(tmp_path, lambda w: w, nonfinite_limit=2, nonfinite_window=3)
  reasons = []
  for skipped in [1, 0, 0, 1, 0, 1]:
    safety.note({"nonfinite_skipped": np.int32(skipped)})
    reasons.append(safety.nonfinite_reason())
  assert safety.counts["nonfinite_skipped"] == 3
  # windows of the last 3: [1] [1,0] [1,0,0] [0,0,1] [0,1,0] [1,0,1]
  assert reasons[:5] == [None] * 5
  assert reasons[5] == "2 of the last 3 updates had non-finite gradients"
  off = _safety(tmp_path / "off", lambda w: w, shadow_every=0, nonfinite_limit=1)
  off.note({"nonfinite_skipped": 1})
  assert off.nonfinite_reason() is None  # no shadows: nothing to roll back to
  assert not off.validation_due(0) and off.counts["nonfinite_skipped"] == 1


def test_validation_keeps_shadows_and_flags_a_fall(tmp_path):
  safety = _safety(tmp_path, lambda w: w / 10, shadow_every=4, regress_threshold=0.15)
  assert [safety.validation_due(s) for s in (3, 4, 8, 9)] == [False, True, True, False]
  safety.first_shadow({"w": jnp.full(3, 2.0)}, lineage=7)
  assert safety.shadows.scores == {0: pytest.approx(0.2)} and safety.shadows.lineages == {0: 7}
  acc, why = safety.judge(4, {"w": jnp.full(3, 5.0)}, lineage=7)
  assert acc == pytest.approx(0.5) and why is None
  acc, why = safety.judge(8, {"w": jnp.full(3, 4.0)}, lineage=7)  # 0.4: within 0.15 of 0.5
  assert why is None and sorted(safety.shadows.scores) == [0, 4, 8]
  acc, why = safety.judge(12, {"w": jnp.full(3, 3.0)}, lineage=7)  # 0.3: a fall
  assert acc == pytest.approx(0.3) and "fell below the best shadow's 0.500" in why
  assert sorted(safety.shadows.scores) == [0, 4, 8]  # the fallen policy is no shadow
  safety.shadows.close()


def test_rollback_restores_the_best_shadow_with_a_fresh_optimizer(tmp_path):
  safety = _safety(tmp_path, lambda w: w / 10, lr_decay=0.5, max_rollbacks=1)
  safety.first_shadow({"w": jnp.full(3, 6.0)}, lineage=3)
  safety.judge(4, {"w": jnp.full(3, 5.0)}, lineage=4)
  safety.note({"nonfinite_skipped": 1})
  state, event = safety.rollback(_state(1.0, lr_scale=0.5), "a reason", _fresh)
  assert event == {
    "event": "rollback",
    "reason": "a reason",
    "to_shadow_step": 0,
    "shadow_val_accuracy": pytest.approx(0.6),
    "lr_scale": 0.25,
    "rollbacks": 1,
  }
  np.testing.assert_array_equal(state.params["w"], [6.0] * 3)  # the best shadow's
  np.testing.assert_array_equal(state.opt_state["m"], [1.0] * 3)  # fresh(1)
  assert float(state.lr_scale) == 0.25 and state.lr_scale.dtype == jnp.float32
  assert int(state.step) == 5 and int(state.nonfinite) == 2  # kept from the state
  np.testing.assert_array_equal(state.tracker["a"], [1.0, 1.0])
  assert safety.counts["rollbacks"] == 1 and not safety.nonfinite_recent
  with pytest.raises(RuntimeError, match="already rolled back 1 times"):
    safety.rollback(state, "again", _fresh)
  safety.shadows.close()


def test_rollback_without_a_shadow_stops_the_run(tmp_path):
  safety = _safety(tmp_path, lambda w: w)
  safety.shadows.reset_to(0, {})
  with pytest.raises(RuntimeError, match="no shadow is left"):
    safety.rollback(_state(1.0), "why", _fresh)
  assert safety.counts["rollbacks"] == 0
  safety.shadows.close()
