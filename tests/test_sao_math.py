"""What SAO's update promises, checked through `make_sao_update` itself: the advantage keeps
the sign of r - v on saturated batches, freshness scales the step, the tracker forgets when
the policy drifts, multi-step trajectories count once, and epochs/KL/clipping act."""

import dataclasses
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao_jax.batches import SAOBatch
from sao_jax.buffer import Item, TrajectoryBuffer, batch_rows
from sao_jax.config import (
  Config,
  MeshConfig,
  ModelConfig,
  OptimConfig,
  RLConfig,
  SamplersConfig,
  SAOConfig,
)
from sao_jax.envs.base import StepResult, Task
from sao_jax.learner import make_optimizer, make_sao_update, sao_row_weights
from sao_jax.models.transformer import TransformerLM
from sao_jax.rl import trackers
from sao_jax.rollout import sao_sampling
from sao_jax.runners.compiled import compile_programs
from sao_jax.sampling import sample
from sao_jax.sharding import make_mesh
from sao_jax.tokenizer import CharTokenizer
from sao_jax.transport import records

TOK = CharTokenizer()
B, P, T = 8, 8, 4


class AdvantageTest(chex.TestCase):
  @chex.all_variants
  def test_saturated_batches_keep_the_sign_of_r_minus_v(self):
    fn = self.variant(trackers.spo_advantage)
    values = jnp.asarray(np.random.default_rng(0).uniform(0.05, 0.95, 64), jnp.float32)
    rows = jnp.ones(64, bool)
    assert (fn(jnp.ones(64), values, rows) >= 0).all()  # all right: nothing is pushed down
    assert (fn(jnp.zeros(64), values, rows) <= 0).all()  # all wrong: nothing is pushed up
    adv = fn(jnp.ones(64).at[17].set(0.0), values, rows)
    assert np.flatnonzero(np.asarray(adv) < 0).tolist() == [17]

  @chex.all_variants
  def test_floor_and_recipe_centring(self):
    fn = self.variant(trackers.spo_advantage, static_argnums=(3, 4))
    r, v = jnp.array([1.0, 1.0, 0.0, 1.0]), jnp.array([0.9, 0.95, 0.9, 0.0])
    w = jnp.array([1.0, 1.0, 1.0, 0.0])  # the last row is padding
    # A = [.1, .05, -.9]: mean -.25, std sqrt((.35^2 + .3^2 + .65^2) / 3) = .4600725
    np.testing.assert_allclose(
      fn(r, v, w, 0.1, False), [0.2173571, 0.1086785, -1.9562136, 0], rtol=1e-5
    )
    np.testing.assert_allclose(
      fn(r, v, w, 0.1, True), [0.7607497, 0.6520712, -1.4128209, 0], rtol=1e-5
    )
    # identical A: std 0, the floor divides (no blow-up of A = .05 to unit size)
    np.testing.assert_allclose(
      fn(jnp.ones(3), jnp.full(3, 0.95), jnp.ones(3), 0.1, False), [0.5, 0.5, 0.5], rtol=1e-5
    )


def _programs(**sao_kw):
  # The batches here carry made-up behaviour log-probs, not a sampler's: no verification
  # unless a test asks for it (test_forged_log_probs_take_no_part_in_the_update).
  sao_kw.setdefault("verify_drift", 0.0)
  rl_kw = {k: sao_kw.pop(k) for k in ("ppo_epochs", "kl_coef", "lr") if k in sao_kw}
  lr = rl_kw.pop("lr", 1e-2)
  cfg = Config(
    model=ModelConfig(vocab_size=TOK.vocab_size, width=16, depth=1, heads=2, max_len=16),
    mesh=MeshConfig(shape=(1, 1, 1)),
    rl=RLConfig(max_new_tokens=T, optim=OptimConfig(lr=lr, warmup_steps=1), **rl_kw),
    sao=SAOConfig(batch_size=B, **sao_kw),
  )
  model = TransformerLM(cfg.model)
  tx = make_optimizer(cfg.rl.optim)
  progs = compile_programs(
    cfg,
    model,
    tx,
    make_sao_update(model, tx, cfg.rl, cfg.sao),
    with_ref=cfg.rl.kl_coef > 0,
    prompt_len=P,
    max_new_tokens=T,
    temperature=1.0,
    eos_id=TOK.eos_id,
    pad_id=TOK.pad_id,
    mesh=make_mesh(cfg.mesh, jax.devices()[:1]),
    num_tasks=B,
  )
  return progs, model


def _batch(staleness=0, logp=None, seed=0):
  rng = np.random.default_rng(seed)
  return SAOBatch.single_steps(
    prompt_bp=rng.integers(3, 40, (B, P)).astype(np.int32),
    prompt_valid_bp=np.ones((B, P), bool),
    tokens_bt=rng.integers(3, 40, (B, T)).astype(np.int32),
    valid_bt=np.ones((B, T), bool),
    logp_bt=np.full((B, T), -3.0, np.float32) if logp is None else logp,
    rewards_b=(np.arange(B) % 2).astype(np.float32),
    task_b=np.arange(B, dtype=np.int32),
    staleness_b=np.full(B, staleness, np.int32),
  )


def _policy_logp(model, state, batch) -> np.ndarray:
  """The current policy's own log-probs of the batch's tokens [B, T] (temperature 1)."""
  from sao_jax.learner import completion_logprobs

  params = jax.device_get(state.params)
  args = (batch.prompt_bp, batch.prompt_valid_bp, batch.tokens_bt, batch.valid_bt)
  return np.asarray(completion_logprobs(model, params, *args).logp_bt)


def _copy(state):
  """Fresh buffers of a state (the jitted update donates its input)."""
  return jax.tree.map(jnp.copy, state)


def _step_norm(progs, state, batch) -> float:
  before = jax.device_get(state.params)
  state, _ = progs.update(state, progs.shard_batch(batch))
  after = jax.device_get(state.params)
  return float(
    np.sqrt(
      sum(
        np.sum((np.asarray(a) - b) ** 2)
        for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(before), strict=True)
      )
    )
  )


@pytest.mark.parametrize("warm_updates", [0, 20])
def test_freshness_factor_scales_the_step(warm_updates):
  """Same batch, all rows at staleness s, one update from identical states: the parameter
  change is 2^(-s / half_life) times the fresh batch's (Adam and global-norm clipping would
  cancel the factor if it only scaled the loss)."""
  progs, _ = _programs(freshness_half_life=4.0, max_staleness=8)
  state = progs.init(jax.random.key(0))
  for i in range(warm_updates):
    state, _ = progs.update(state, progs.shard_batch(_batch(seed=100 + i)))
  snapshot = jax.device_get(state)
  norms = {s: _step_norm(progs, _copy(snapshot), _batch(staleness=s)) for s in (0, 4, 8)}
  assert norms[0] > 0
  np.testing.assert_allclose(norms[4] / norms[0], 0.5, atol=1e-3)
  np.testing.assert_allclose(norms[8] / norms[0], 0.25, atol=1e-3)


def test_lr_scale_scales_the_step_after_warm_updates():
  progs, _ = _programs()
  state = progs.init(jax.random.key(0))
  for i in range(5):
    state, _ = progs.update(state, progs.shard_batch(_batch(seed=100 + i)))
  snapshot = jax.device_get(state)
  full = _step_norm(progs, _copy(snapshot), _batch())
  half = _step_norm(progs, _copy(snapshot.replace(lr_scale=np.float32(0.5))), _batch())
  np.testing.assert_allclose(half / full, 0.5, rtol=1e-4)


def test_forgetting_factor_moves_with_a_realistic_drift():
  """Behaviour log-probs 0.02 nats from the current policy's per token (mean |log ratio| in
  real runs at staleness 1-2 is of this order): the tracker must forget faster than at
  rho_max. On the k3 KL estimate (~2e-4 here) it stayed at rho_max for any such drift."""
  progs, model = _programs(tracker_d_half=0.06, tracker_rho_min=0.5, tracker_rho_max=0.96)
  state = progs.init(jax.random.key(0))
  batch = _batch()
  current = _policy_logp(model, state, batch)
  sign = np.where(np.random.default_rng(1).uniform(size=current.shape) < 0.5, -1.0, 1.0)
  batch = batch.replace(logp_bt=(current + 0.02 * sign).astype(np.float32))
  state, metrics = progs.update(state, progs.shard_batch(batch))
  counts = np.asarray(state.tracker.alpha_n + state.tracker.beta_n)
  rho = (counts - 1.0) / 2.0  # from the Beta(1, 1) prior: rho * 2 + one trajectory
  expected = 2 ** (-0.02 / 0.06)  # 0.794
  np.testing.assert_allclose(rho, expected, rtol=2e-3)
  np.testing.assert_allclose(float(metrics["drift"]), 0.02, rtol=2e-3)
  np.testing.assert_allclose(float(metrics["tracker_rho"]), expected, rtol=2e-3)


class ThreeStepEnv:
  """Three steps per episode, reward 1 at every step (a summed reward of 3)."""

  max_steps = 3

  def reset(self, task):
    self.t = 0
    return np.asarray(TOK.encode(task.prompt), np.int32)

  def step(self, action_tokens):
    self.t += 1
    return StepResult(np.asarray(TOK.encode("k"), np.int32), 1.0, self.t >= 3, {})


def _three_step_items(params, model, n=3, version=0):
  fn = jax.jit(
    functools.partial(sample, model, max_new_tokens=T, eos_id=TOK.eos_id, pad_id=TOK.pad_id)
  )
  tasks = [Task(i, f"t{i}", "", "", 1) for i in range(n)]
  trajs = sao_sampling(
    fn,
    params,
    [ThreeStepEnv() for _ in tasks],
    tasks,
    list(range(n)),
    TOK,
    slots=n,
    prompt_len=P,
    max_steps=3,
    rng=jax.random.key(3),
    policy_version=version,
  )
  items = []
  for i, tr in enumerate(trajs):
    data = records.encode(
      records.RecordKind.TRAJECTORY,
      i,
      tr.policy_version,
      tr.arrays(),
      {"task_index": tr.task_index, "reward": tr.total_reward, "t_end": 0.0},
    )
    items.append(Item(records.decode(data), i, None))
  return items


def test_multi_step_trajectories_fill_batches_by_rows_and_count_once():
  progs, model = _programs()
  state = progs.init(jax.random.key(0))
  items = _three_step_items(jax.device_get(state.params), model)
  buf = TrajectoryBuffer(rows=B, max_staleness=4)
  buf.extend(items)
  assert buf.ready(0)
  first, stale = buf.take_batch(0)
  assert [it.seq for it in first] == [0, 1] and not stale  # 6 rows; a third would be 9 > 8
  assert [it.seq for it in buf] == [2] and not buf.ready(0)  # left in the buffer, not dropped
  batch, orphans = batch_rows(first, 0, B, 4)
  assert orphans == 0
  np.testing.assert_array_equal(batch.row_valid_b, [True] * 6 + [False] * 2)
  np.testing.assert_array_equal(batch.traj_b[:6], [0, 0, 0, 1, 1, 1])
  np.testing.assert_array_equal(batch.head_b, [1, 0, 0, 1, 0, 0, 0, 0])
  np.testing.assert_array_equal(batch.rewards_b[:6], 3.0)  # the trajectory's total, per row
  for k, f in (("tokens", "tokens_bt"), ("logp", "logp_bt"), ("prompt", "prompt_bp")):
    np.testing.assert_array_equal(
      getattr(batch, f)[:6],  # every step's row, in order
      np.concatenate([it.rec.arrays[k] for it in first]),
    )
  state, metrics = progs.update(state, progs.shard_batch(batch))
  alpha, beta = np.asarray(state.tracker.alpha_n), np.asarray(state.tracker.beta_n)
  # Tasks 0 and 1: one trajectory each, its summed reward 3 clipped to one success:
  # alpha = rho * 1 + 1, beta = rho * 1 + 0 (never negative); the other tasks untouched.
  # (Folding in each of the 3 rows with r = 3 gave beta = rho^3 - 2 rho^2 - 2 rho - 2 < 0.)
  assert (beta >= 0).all()
  np.testing.assert_allclose(alpha[:2] - beta[:2], 1.0, rtol=1e-5)
  np.testing.assert_array_equal(alpha[2:], 1.0)
  np.testing.assert_allclose(beta[:2], float(metrics["tracker_rho"]), rtol=1e-5)
  assert int(metrics["trajectories"]) == 2 and float(metrics["reward"]) == 3.0
  second, _ = buf.take_batch(1)
  assert [it.seq for it in second] == [2]


def test_clip_eps_binds_from_the_second_epoch():
  """rl.ppo_epochs: pi_prox is the policy before the update, kept over the epochs, so the PPO
  clip (inert on one epoch, where pi_theta = pi_prox) bounds the later epochs."""
  one, _ = _programs(lr=0.3)
  two, _ = _programs(lr=0.3, ppo_epochs=2)
  batch = _batch()
  _, m1 = one.update(one.init(jax.random.key(0)), one.shard_batch(batch))
  s2, m2 = two.update(two.init(jax.random.key(0)), two.shard_batch(batch))
  assert float(m1["clip_frac"]) == 0.0
  assert float(m2["clip_frac"]) > 0.05
  assert int(s2.step) == 1  # one learner step, two optimizer steps
  assert float(m2["first_loss"]) != float(m2["loss"])


def test_kl_penalty_pulls_towards_the_reference():
  progs, model = _programs(kl_coef=1.0, lr=0.05)
  state = progs.init(jax.random.key(0))
  ref = jax.device_get(state.ref_params)
  batch = _batch()
  kls = []
  for _ in range(3):
    state, m = progs.update(state, progs.shard_batch(batch))
    kls.append(float(m["kl_ref"]))
  assert kls[0] == pytest.approx(0.0, abs=1e-7) and kls[-1] > 0  # moves away, and measures it
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(state.ref_params), ref)  # frozen
  far, _ = _programs(kl_coef=0.0, lr=0.05)
  s = far.init(jax.random.key(0))
  for _ in range(3):
    s, _ = far.update(s, far.shard_batch(batch))
  dist = lambda p: sum(
    float(np.sum((np.asarray(a) - b) ** 2))
    for a, b in zip(jax.tree.leaves(jax.device_get(p)), jax.tree.leaves(ref), strict=True)
  )
  assert dist(state.params) < dist(s.params)  # the penalty holds the policy closer


@pytest.mark.parametrize("bad", ["rl.ppo_epochs=0", "rl.ppo_epochs=17", "sao.adv_std_floor=0"])
def test_bad_epoch_and_floor_settings_are_config_errors(bad):
  from sao_jax.config import ConfigError, apply_overrides

  with pytest.raises(ConfigError):
    apply_overrides(Config(), [bad])


@pytest.mark.parametrize("backpressure", [True, False])
def test_work_ahead_of_the_learner_is_bounded(backpressure):
  """With backpressure, tasks outstanding plus records buffered that a batch will still take
  stay within one batch plus what the samplers hold in flight; without it (the earlier
  bound) only the outstanding tasks are bounded, by one batch plus two calls per sampler."""
  import types

  from sao_jax.runners.learner_parts.intake import Intake

  def waiting(version, n):  # n records of policy `version` (only their age matters here)
    rec = types.SimpleNamespace(policy_version=version, meta={}, arrays={})
    return [Item(rec, seq=k, pos=None) for k in range(n)]

  cfg = Config(
    sao=SAOConfig(sampler_slots=8, backpressure=backpressure), samplers=SamplersConfig(num=2)
  )
  parts = dict(guard=None, journal=None, ledger=None, counts=None, n_sample=16, expect=None)
  intake = Intake(cfg, None, buffer=TrajectoryBuffer(16, max_staleness=4), **parts)
  assert intake.work_ahead_room(10) == (32 if backpressure else 48)
  intake.outstanding = 20
  intake.buffer.extend(waiting(9, 10))  # ten fresh records waiting
  assert intake.work_ahead_room(10) == (2 if backpressure else 28)
  intake.buffer.extend(waiting(9, 10))
  assert intake.work_ahead_room(10) == (0 if backpressure else 28)
  # Records no batch will take (too stale: 10 - 2 > 4) count for nothing: after a rollback
  # or a resume a buffer full of them must not stop the hand-out.
  intake.buffer = TrajectoryBuffer(16, max_staleness=4)
  intake.buffer.extend(waiting(2, 40))
  intake.outstanding = 0
  assert intake.work_ahead_room(10) == (32 if backpressure else 48)


def test_forged_log_probs_take_no_part_in_the_update():
  """sao.verify_drift: rows whose claimed behaviour log-probs are the policy's own are
  trained on; rows claiming certainty (0) or e^-50 are flagged and take no part: the update
  equals the one on the batch with those rows left out (invalid), tracker included."""
  progs, model = _programs(verify_drift=1.0)
  state = progs.init(jax.random.key(0))
  batch = _batch()
  true = _policy_logp(model, state, batch)
  forged = np.array(true)
  forged[1], forged[3] = 0.0, -50.0
  flagged = dataclasses.replace(batch, logp_bt=forged)
  left_out = dataclasses.replace(
    batch,
    logp_bt=true,
    row_valid_b=~np.isin(np.arange(B), [1, 3]),  # rows 1 and 3 out
  )
  a, ma = progs.update(_copy(state), progs.shard_batch(flagged))
  b, _ = progs.update(_copy(state), progs.shard_batch(left_out))
  assert np.flatnonzero(np.asarray(ma["unverified_b"])).tolist() == [1, 3]
  for x, y in zip(
    jax.tree.leaves(jax.device_get((a.params, a.tracker, a.opt_state))),
    jax.tree.leaves(jax.device_get((b.params, b.tracker, b.opt_state))),
    strict=True,
  ):
    np.testing.assert_allclose(np.asarray(x, np.float64), np.asarray(y, np.float64), atol=1e-6)
  _, mc = progs.update(_copy(state), progs.shard_batch(dataclasses.replace(batch, logp_bt=true)))
  assert not np.asarray(mc["unverified_b"]).any()


def test_row_weights_of_an_episode_batch_are_per_trajectory():
  """`sao_row_weights` over a memory batch's rows flattened (B trajectories x R rows, the
  graded ones carrying the signal, one staleness per trajectory), as the memory policy's SAO
  update calls it: each graded row 1/G_b of its trajectory, freshness the trajectory's."""
  rng = np.random.default_rng(0)
  b, r, t = 4, 3, 5
  graded = rng.random((b, r)) < 0.6
  graded[0] = False  # a trajectory with no graded row gets no share
  used = graded[..., None] & (rng.random((b, r, t)) < 0.8)
  stale = np.asarray([0, 1, 3, 9], np.int32)
  sao = SAOConfig(staleness_mode="decay", freshness_half_life=2.0, max_staleness=4)
  w = sao_row_weights(
    jnp.repeat(jnp.arange(b), r),
    jnp.asarray(graded.reshape(-1)),
    jnp.asarray(used.reshape(b * r, t)),
    jnp.broadcast_to(jnp.asarray(stale)[:, None, None], (b, r, t)).reshape(b * r, t),
    sao,
  )
  share = graded / np.maximum(graded.sum(-1, keepdims=True), 1)
  np.testing.assert_array_equal(np.asarray(w["share_b"]).reshape(b, r), share.astype(np.float32))
  fresh_b = np.where(stale <= 4, 2.0 ** (-stale / 2.0), 0.0)
  fresh = np.where(used, fresh_b[:, None, None], 0.0)
  np.testing.assert_allclose(np.asarray(w["fresh_bt"]).reshape(b, r, t), fresh, rtol=1e-6)
  scale = fresh[used].mean()
  np.testing.assert_allclose(float(w["step_scale"]), scale, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(w["weight_bt"]).reshape(b, r, t), fresh / scale, rtol=1e-6)
