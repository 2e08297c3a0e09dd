"""Stage 2: the LSTM redundancy filter keeps every turning point, whatever it predicts."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from sao_jax.compression import temporal
from sao_jax.compression.memory import Compressor
from sao_jax.config import CompressionConfig

CFG = CompressionConfig(
  step_len=8,
  vectors_per_step=2,
  dim=4,
  enc_width=16,
  enc_depth=1,
  enc_heads=2,
  lstm_hidden=8,
  keep_threshold=0.1,
  turning_surprise=1.0,
  budget=0,
  capacity=16,
  visible=4,
  evict=True,
)


def _perfect_predictor(comp, params, c_d):
  """Temporal params whose prediction is always `c_d`: zero kernel, bias c."""
  pred = params["temporal"]["predict"]
  params = dict(
    params,
    temporal=dict(
      params["temporal"], predict={"kernel": jnp.zeros_like(pred["kernel"]), "bias": c_d}
    ),
  )
  return params


def test_keep_step_rule():
  kw = dict(keep_threshold=0.5, turning_surprise=2.0, budget=1)
  keep, turn, by = temporal.keep_step(jnp.float32(0.0), jnp.bool_(True), jnp.int32(5), **kw)
  assert bool(keep) and bool(turn) and not bool(by)
  keep, turn, by = temporal.keep_step(jnp.float32(0.6), jnp.bool_(False), jnp.int32(0), **kw)
  assert bool(keep) and not bool(turn) and bool(by)
  keep, *_ = temporal.keep_step(jnp.float32(0.6), jnp.bool_(False), jnp.int32(1), **kw)
  assert not bool(keep)  # over budget
  keep, turn, _ = temporal.keep_step(jnp.float32(2.5), jnp.bool_(False), jnp.int32(1), **kw)
  assert bool(keep) and bool(turn)  # high surprise is a turning point, budget or not
  keep, *_ = temporal.keep_step(jnp.float32(0.4), jnp.bool_(False), jnp.int32(0), **kw)
  assert not bool(keep)
  # salient_turning: high surprise makes a turning point of a salient step only; an
  # unsalient one is an ordinary candidate (kept within budget, not over it).
  gate = dict(kw, salient_turning=True)
  keep, turn, by = temporal.keep_step(
    jnp.float32(2.5), jnp.bool_(False), jnp.int32(1), salient=jnp.bool_(True), **gate
  )
  assert bool(keep) and bool(turn) and not bool(by)
  keep, turn, by = temporal.keep_step(
    jnp.float32(2.5), jnp.bool_(False), jnp.int32(0), salient=jnp.bool_(False), **gate
  )
  assert bool(keep) and not bool(turn) and bool(by)
  keep, *_ = temporal.keep_step(
    jnp.float32(2.5), jnp.bool_(False), jnp.int32(1), salient=jnp.bool_(False), **gate
  )
  assert not bool(keep)
  keep, turn, _ = temporal.keep_step(
    jnp.float32(0.0), jnp.bool_(True), jnp.int32(1), salient=jnp.bool_(False), **gate
  )
  assert bool(keep) and bool(turn)  # structural turning points need no salience


def test_turning_points_kept_under_perfect_prediction_and_zero_budget():
  comp = Compressor(CFG, vocab_size=20)
  params = comp.init(jax.random.key(0))
  c_d = jnp.linspace(-1.0, 1.0, CFG.vectors_per_step * CFG.dim)
  params = _perfect_predictor(comp, params, c_d)
  s = 12
  v_sed = jnp.broadcast_to(
    c_d.reshape(CFG.vectors_per_step, CFG.dim), (s, CFG.vectors_per_step, CFG.dim)
  )
  rewards = jnp.asarray([0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0], jnp.float32)  # change at 3, 4
  boundary = jnp.zeros(s, bool).at[7].set(True)
  valid = jnp.ones(s, bool).at[10:].set(False)  # episode ends at step 9
  final, info = jax.jit(comp.scan_trajectory)(params, v_sed, rewards, boundary, valid)
  surprise = np.asarray(info["surprise"])
  assert np.all(surprise[1:10] < 1e-6)  # the LSTM predicted every step after the first
  kept_steps = np.asarray(final.bank.step_c[: int(final.bank.count)])
  np.testing.assert_array_equal(kept_steps, [0, 3, 4, 7, 9])  # first, reward changes,
  assert bool(np.all(final.bank.turning_c[: int(final.bank.count)]))  # boundary, last


def test_budget_caps_surprise_kept_steps_but_not_turning_points():
  cfg = CompressionConfig(**{**CFG.__dict__, "budget": 2, "keep_threshold": 0.0})
  comp = Compressor(cfg, vocab_size=20)
  params = comp.init(jax.random.key(1))
  s = 10
  v_sed = jax.random.normal(jax.random.key(2), (s, cfg.vectors_per_step, cfg.dim))
  boundary = jnp.zeros(s, bool).at[6].set(True)
  final, info = comp.scan_trajectory(params, v_sed, jnp.zeros(s), boundary, jnp.ones(s, bool))
  turning = np.asarray(info["turning"])
  kept = np.asarray(info["keep"])
  assert turning[0] and turning[6] and turning[9]
  assert np.all(kept[turning])
  # keep_threshold 0: every step a candidate; at most 2 budget entries live in the bank
  n = int(final.bank.count)
  assert int(np.sum(~np.asarray(final.bank.turning_c[:n]))) == 2
  assert n == turning.sum() + 2 and int(final.evicted) == (kept & ~turning).sum() - 2
  # First-come rule (no eviction): the first two candidates, and only they, are written.
  comp = Compressor(dataclasses.replace(cfg, evict=False), vocab_size=20)
  final, info = comp.scan_trajectory(params, v_sed, jnp.zeros(s), boundary, jnp.ones(s, bool))
  kept = np.asarray(info["keep"])
  assert (kept & ~turning).sum() == 2 and int(final.bank.count) == kept.sum()


def test_full_bank_drops_and_counts():
  cfg = CompressionConfig(
    **{
      **CFG.__dict__,
      "capacity": 4,
      "visible": 2,
      "turning_surprise": 0.0,
      "keep_threshold": 0.0,
      "evict": False,
    }
  )  # all turning; first-come (eviction: below)
  comp = Compressor(cfg, vocab_size=20)
  params = comp.init(jax.random.key(0))
  s = 7
  v = jnp.ones((s, cfg.vectors_per_step, cfg.dim))
  final, _ = comp.scan_trajectory(params, v, jnp.zeros(s), jnp.zeros(s, bool), jnp.ones(s, bool))
  assert int(final.bank.count) == 4 and int(final.dropped_full) == 3
  np.testing.assert_array_equal(np.asarray(final.bank.step_c), [0, 1, 2, 3])


def test_prediction_loss_trains_the_lstm_on_a_repeating_pattern():
  comp = Compressor(CFG, vocab_size=20)
  params = comp.init(jax.random.key(0))
  d = CFG.vectors_per_step * CFG.dim
  pattern = jax.random.normal(jax.random.key(3), (3, CFG.vectors_per_step, CFG.dim))
  v = jnp.tile(pattern, (8, 1, 1))
  s = v.shape[0]
  w = jnp.ones(s).at[0].set(0.0)

  def loss(tp):
    p = dict(params, temporal=tp)
    _, info = comp.scan_trajectory(p, v, jnp.zeros(s), jnp.zeros(s, bool), jnp.ones(s, bool))
    return temporal.prediction_loss(info["pred_d"], v.reshape(s, d), w)

  import optax

  tx = optax.adam(3e-2)
  tp = params["temporal"]
  opt = tx.init(tp)
  step = jax.jit(
    lambda tp, opt: (lambda l_g: (l_g[0],) + tx.update(l_g[1], opt, tp))(
      jax.value_and_grad(loss)(tp)
    )
  )
  first = None
  for _ in range(150):
    val, upd, opt = step(tp, opt)
    tp = optax.apply_updates(tp, upd)
    first = float(val) if first is None else first
  assert float(val) < 0.2 * first


def _scan_with_surprises(cfg, surprises, structural_steps=()):
  """Scans steps with given relative surprises: the LSTM always predicts c, and step i is
  a_i * c with (1 - a_i)^2 / a_i^2 = surprises[i] (step 0's prediction is the empty stream's
  zeros, so its surprise is 1 whatever is given; it is structural anyway)."""
  comp = Compressor(cfg, vocab_size=20)
  params = comp.init(jax.random.key(0))
  d = cfg.vectors_per_step * cfg.dim
  c_d = jnp.ones((d,))
  params = _perfect_predictor(comp, params, c_d)
  # v = a * c with (1 - a)^2 / a^2 = surprise  ->  a = 1 / (1 + sqrt(surprise))
  a = 1.0 / (1.0 + np.sqrt(np.asarray(surprises, np.float32)))
  v = jnp.asarray(a)[:, None] * c_d[None]
  s = len(surprises)
  boundary = (
    jnp.zeros(s, bool).at[jnp.asarray(structural_steps, jnp.int32)].set(True)
    if structural_steps
    else jnp.zeros(s, bool)
  )
  final, info = jax.jit(comp.scan_trajectory)(
    params, v.reshape(s, cfg.vectors_per_step, cfg.dim), jnp.zeros(s), boundary, jnp.ones(s, bool)
  )
  return final, info


def test_budget_keeps_the_most_surprising_steps_with_eviction():
  # Step 0 is structural (first). Budget 2: candidates 0.6, 0.7 fill it; 0.9 replaces 0.6;
  # 0.65 replaces nothing (both left are more surprising); 0.95 replaces 0.7.
  cfg = CompressionConfig(
    **{**CFG.__dict__, "budget": 2, "keep_threshold": 0.5, "turning_surprise": 5.0}
  )
  sur = [0.0, 0.6, 0.0, 0.7, 0.9, 0.65, 0.0, 0.95, 0.0]
  final, info = _scan_with_surprises(cfg, sur)
  np.testing.assert_allclose(np.asarray(info["surprise"])[1:], sur[1:], rtol=1e-4, atol=1e-5)
  n = int(final.bank.count)
  # first step, the two most surprising candidates, the last step (structural); step order
  np.testing.assert_array_equal(np.asarray(final.bank.step_c[:n]), [0, 4, 7, 8])
  assert int(final.evicted) == 2 and int(final.dropped_full) == 0
  np.testing.assert_array_equal(np.asarray(info["evict"]), [0, 0, 0, 0, 1, 0, 0, 1, 0])
  # Without eviction the first two candidates keep the budget.
  final, _ = _scan_with_surprises(dataclasses.replace(cfg, evict=False), sur)
  np.testing.assert_array_equal(
    np.asarray(final.bank.step_c[: int(final.bank.count)]), [0, 1, 3, 8]
  )


def test_full_bank_evicts_least_surprising_but_never_structural_turning_points():
  # Capacity 4, every step a turning point (turning_surprise 0.0 < all surprises except
  # structural zeros); boundaries at 3 and 6 are structural and must survive.
  cfg = CompressionConfig(
    **{
      **CFG.__dict__,
      "capacity": 4,
      "visible": 2,
      "budget": 0,
      "keep_threshold": 0.1,
      "turning_surprise": 0.1,
    }
  )
  sur = [0.0, 0.5, 0.3, 0.0, 0.8, 0.2, 0.0, 0.0]
  final, info = _scan_with_surprises(cfg, sur, structural_steps=(3, 6))
  steps = np.asarray(final.bank.step_c)
  # 0,1,2,3 fill the bank; 4 (0.8) evicts 2 (0.3); 5 (0.2) is less surprising than all
  # evictable entries (1: 0.5, 4: 0.8): dropped; 6 (boundary) evicts 1; 7 (last) evicts 4.
  np.testing.assert_array_equal(steps, [0, 3, 6, 7])
  assert bool(np.all(final.bank.turning_c))
  assert int(final.evicted) == 3 and int(final.dropped_full) == 1


def test_eviction_off_matches_first_come_rule():
  cfg = CompressionConfig(
    **{
      **CFG.__dict__,
      "capacity": 4,
      "visible": 2,
      "budget": 0,
      "keep_threshold": 0.1,
      "turning_surprise": 0.1,
      "evict": False,
    }
  )
  final, _ = _scan_with_surprises(
    cfg, [0.0, 0.5, 0.3, 0.0, 0.8, 0.2, 0.0, 0.0], structural_steps=(3, 6)
  )
  np.testing.assert_array_equal(np.asarray(final.bank.step_c), [0, 1, 2, 3])
  assert int(final.evicted) == 0 and int(final.dropped_full) == 4
