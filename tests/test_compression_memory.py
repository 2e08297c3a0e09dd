"""The composed compressor and the memory policy: sampler and learner see the same memory."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao_jax import sharding
from sao_jax.compression.memory import Compressor, bank_nbytes, graveyard, graveyard_nbytes
from sao_jax.compression.policy import MemoryPolicy, make_memory_update
from sao_jax.compression.rollout import sample_long_horizon, trajectories_to_batch
from sao_jax.config import (
  CompressionConfig,
  Config,
  ConfigError,
  MeshConfig,
  ModelConfig,
  OptimConfig,
)
from sao_jax.envs.longhorizon import LongHorizonEnv, LongHorizonSpec, make_split
from sao_jax.learner import make_optimizer
from sao_jax.models.transformer import TransformerLM
from sao_jax.runners.compiled import compile_programs
from sao_jax.tokenizer import CharTokenizer

TOK = CharTokenizer()
COMP = CompressionConfig(
  enabled=True,
  step_len=16,
  vectors_per_step=2,
  dim=8,
  enc_width=16,
  enc_depth=1,
  enc_heads=2,
  lstm_hidden=16,
  keep_threshold=0.2,
  turning_surprise=1.0,
  budget=3,
  capacity=12,
  visible=3,
  window=16,
  evict=True,
)
MODEL = ModelConfig(
  vocab_size=TOK.vocab_size, width=16, depth=1, heads=2, max_len=64, memory_slots=6, memory_dim=8
)


def test_config_checks_memory_shape_and_size_reduction():
  Config(model=MODEL, compression=COMP)
  with pytest.raises(ConfigError, match="memory_slots"):
    Config(model=dataclasses.replace(MODEL, memory_slots=4), compression=COMP)
  with pytest.raises(ConfigError, match="80%"):
    CompressionConfig(step_len=4, enc_width=16, vectors_per_step=2, dim=8)
  with pytest.raises(ConfigError):
    CompressionConfig(keep_threshold=3.0, turning_surprise=1.0)


def test_stream_steps_equal_the_scan_and_visible_memory_is_the_last_entries():
  comp = Compressor(dataclasses.replace(COMP, keep_threshold=0.0, budget=100), TOK.vocab_size)
  params = comp.init(jax.random.key(0))
  s = 9
  v = jax.random.normal(jax.random.key(1), (s, 2, 8))
  rewards = jnp.zeros(s)
  bnd = jnp.zeros(s, bool)
  final, _ = comp.scan_trajectory(params, v, rewards, bnd, jnp.ones(s, bool))
  st = comp.empty_stream()
  step = jax.jit(comp.filter_and_store)
  for t in range(s):
    st, _ = step(params, st, v[t], rewards[t], bnd[t], t == s - 1)
  for a, b in zip(jax.tree.leaves(st.bank), jax.tree.leaves(final.bank), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert int(final.bank.count) == s  # threshold 0: every step kept
  vec, ok, idx = comp.visible_memory(final.bank, 5)  # entries of steps 2, 3, 4
  np.testing.assert_array_equal(np.asarray(idx), [2, 3, 4])
  assert bool(ok.all())
  np.testing.assert_allclose(
    np.asarray(vec).reshape(3, 2, 8), np.asarray(v[2:5]), atol=float(jnp.max(jnp.abs(v))) / 127
  )
  _, ok, _ = comp.visible_memory(final.bank, 1)  # only step 0 before step 1
  np.testing.assert_array_equal(np.asarray(ok), [False] * 4 + [True] * 2)
  # INT8 + scale + step index per entry, against float32 vectors
  assert bank_nbytes(final.bank) == s * (2 * 8 + 2 * 4 + 2)


def test_replay_from_bank_and_graveyard_is_the_samplers_memory_at_every_step():
  """With eviction, the final bank plus the graveyard give, at every step t, exactly what
  `visible_memory` of the bank the sampler held at t gave: the same entries, in the same
  order, the same values bit for bit; the final bank alone does not."""
  cfg = dataclasses.replace(COMP, keep_threshold=0.0, budget=2, capacity=5, visible=3)
  comp = Compressor(cfg, TOK.vocab_size)
  params = comp.init(jax.random.key(0))
  s = 24
  v = jax.random.normal(jax.random.key(2), (s, 2, 8))
  rewards = jnp.zeros(s).at[jnp.asarray([9, 10, 17])].set(1.0)  # reward changes: structural
  bnd = jnp.zeros(s, bool).at[6].set(True)

  def body(st, xs):
    v_ed, r, b, last = xs
    vec, ok, idx = comp.visible_memory(st.bank, st.step)  # what the policy reads at st.step
    new, info = comp.filter_and_store(params, st, v_ed, r, b, last)
    return new, (vec, ok, jnp.where(ok[:: cfg.vectors_per_step], st.bank.step_c[idx], 0), info)

  def run():
    final, (vec, ok, steps, info) = jax.lax.scan(
      body, comp.empty_stream(), (v, rewards, bnd, jnp.arange(s) == s - 1)
    )
    log = comp.replay_log(final.bank, graveyard(info))
    replay = jax.vmap(lambda t: comp.replay_memory(log, t))(jnp.arange(s))
    old = jax.vmap(lambda t: comp.visible_memory(final.bank, t)[0])(jnp.arange(s))
    return final, (vec, ok, steps), replay, old, info

  final, sampler, replay, old, info = jax.jit(run)()
  assert int(final.evicted) >= 5 and int(np.sum(info["gone_step"] >= 0)) == int(final.evicted)
  for a, b in zip(sampler, replay, strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # Rows before evictions saw entries the final bank lacks.
  assert np.any(np.asarray(old) != np.asarray(sampler[0]))
  # One int16 eviction step more per entry than a bank entry.
  n = int(final.evicted)
  assert graveyard_nbytes(np.zeros((n, 2, 8), np.int8)) == n * (2 * 8 + 2 * 4 + 2 + 2)


def _sampled(model_cfg, comp, spec, n_tasks=3):
  """An RL-mode memory policy of these configs, its initial state, and trajectories it sampled
  (the shipped banks and graveyards, and the sampler's log-probs)."""
  policy = MemoryPolicy(TransformerLM(model_cfg), Compressor(comp, TOK.vocab_size))
  tx = make_optimizer(OptimConfig(lr=1e-3, warmup_steps=1))
  progs = compile_programs(
    Config(model=model_cfg, compression=comp),
    policy,
    tx,
    make_memory_update(policy, tx, mode="rl"),
    max_new_tokens=3,
    temperature=1.0,
    eos_id=TOK.eos_id,
    pad_id=TOK.pad_id,
    mesh=sharding.make_mesh(MeshConfig(shape=(1, 1, 1)), jax.devices()[:1]),
  )
  state = progs.init(jax.random.key(0))
  trajs = _play(progs.sample, policy, progs, state.params, make_split(spec, "test", n_tasks, 0), 1)
  return policy, progs, state, trajs


def _play(sample_fn, policy, progs, params, tasks, seed):
  """`sample_long_horizon` of the tasks on 4 slots with `sample_fn`."""
  comp = policy.comp.cfg
  return sample_long_horizon(
    sample_fn,
    progs.compress,
    policy.empty_streams(4),
    params,
    [LongHorizonEnv(TOK) for _ in tasks],
    tasks,
    TOK,
    slots=4,
    window=comp.window,
    step_len=comp.step_len,
    rng=jax.random.key(seed),
  )


@pytest.fixture(scope="module")
def sampled():
  spec = LongHorizonSpec("navigation", n_steps=12, n_facts=2, min_gap=4, period=5)
  return _sampled(MODEL, COMP, spec)


def test_learner_recomputes_the_sampler_log_probs_from_the_shipped_bank(sampled):
  policy, _, state, trajs = sampled
  assert all(len(t.rewards) == 12 for t in trajs)
  for t in trajs:
    b = t.bank
    n = b["entries"]
    steps = b["step_c"][:n]
    assert 0 < n <= COMP.capacity and b["vec_ced"].dtype == np.int8
    assert np.all(np.diff(steps) > 0) and steps[0] == 0 and steps[-1] == 11  # first, last
    assert np.all(np.isin(np.flatnonzero(t.boundary), steps))  # boundaries always kept
    assert len(b["gone_at_g"]) == b["evicted"] and not np.isin(b["gone_step_g"], steps).any()
  assert sum(t.bank["evicted"] for t in trajs) > 0
  batch = trajectories_to_batch(trajs, 12)
  row_logprobs = jax.jit(lambda p, b: policy.row_logprobs(p, b, stored=True)[0])
  logp = row_logprobs(state.params, batch)
  # Exact for every row, those that saw entries evicted later included.
  mask = batch.valid_brt
  np.testing.assert_allclose(np.asarray(logp)[mask], batch.logp_brt[mask], atol=2e-5)
  # The graveyard matters: without it the rows that saw evicted entries differ.
  no_grave = row_logprobs(
    state.params, batch.replace(gone_step_bs=np.full_like(batch.gone_step_bs, -1))
  )
  assert np.max(np.abs(np.asarray(no_grave)[mask] - batch.logp_brt[mask])) > 1e-3
  # Memory matters: without it the same rows get different log-probs.
  batch0 = batch.replace(
    bank_count_b=np.zeros_like(batch.bank_count_b),
    bank_step_bc=np.full_like(batch.bank_step_bc, -1),
  )
  logp0, _, _ = policy.row_logprobs(state.params, batch0, stored=True)
  assert np.max(np.abs(np.asarray(logp0)[mask] - batch.logp_brt[mask])) > 1e-3


def test_rl_update_on_sampled_trajectories_is_finite_and_changes_the_encoder(sampled):
  _, progs, state, trajs = sampled
  batch = trajectories_to_batch(trajs, 12)
  # A random policy earns nothing; give half the graded rows a reward so advantages differ.
  g = np.flatnonzero(batch.graded_br.reshape(-1))
  rewards = np.zeros_like(batch.rewards_bs)
  rewards.reshape(-1)[g[::2]] = 1.0
  batch = batch.replace(rewards_bs=rewards)
  before = jax.tree.map(np.asarray, state.params)
  new, metrics = progs.update(state, batch)
  assert all(np.isfinite(float(v)) for v in metrics.values())
  for part in ("policy", "encoder", "temporal", "decoder"):
    diff = jax.tree.leaves(
      jax.tree.map(
        lambda a, b: float(np.max(np.abs(a - np.asarray(b)))), before[part], new.params[part]
      )
    )
    assert max(diff) > 0, part


def test_memory_update_skips_non_finite_gradients(sampled):
  """The memory policy's update goes through learner.apply_gradients: a NaN in the batch
  (here the behaviour log-probs) leaves params and optimizer state exactly as they were and
  counts the skip."""
  _, progs, _, trajs = sampled
  state = progs.init(jax.random.key(0))  # the fixture's state may have been donated
  batch = trajectories_to_batch(trajs, 12)
  batch = batch.replace(
    logp_brt=np.full_like(batch.logp_brt, np.nan),
    rewards_bs=np.where(np.arange(12) % 2, 1.0, 0.0)[None].repeat(3, 0).astype(np.float32),
  )
  before = jax.tree.map(np.asarray, (state.params, state.opt_state))
  new, metrics = progs.update(state, batch)
  assert int(metrics["nonfinite_skipped"]) == 1 and int(new.nonfinite) == 1
  assert int(new.step) == 1
  for a, b in zip(
    jax.tree.leaves(before), jax.tree.leaves((new.params, new.opt_state)), strict=True
  ):
    np.testing.assert_array_equal(a, np.asarray(b))


def test_a_bank_shared_across_rows_gives_each_rows_log_probs_and_gradients():
  """Where nothing is evicted and the whole bank is visible (the stage-1 control), the learner
  computes the bank's keys and values once per trajectory (`shared_memory_logprobs`) instead
  of once per row: the sampler's log-probs, and the same log-probs, entropies, salience loss
  and gradients as the per-row memories (rows that read every entry written before them)."""
  comp = dataclasses.replace(
    COMP, evict=False, capacity=12, visible=12, keep_threshold=0.0, salience="learned"
  )
  model = dataclasses.replace(MODEL, memory_slots=24)
  evicting = MemoryPolicy(TransformerLM(MODEL), Compressor(COMP, TOK.vocab_size))
  assert not evicting.shares_bank()
  with pytest.raises(ValueError, match="exact only without eviction"):
    evicting.shares_bank(True)
  spec = LongHorizonSpec("retention", n_steps=12, n_facts=2, min_gap=4, period=5)
  policy, _, state, trajs = _sampled(model, comp, spec)
  assert policy.shares_bank()
  assert all(t.bank["entries"] == 12 and t.bank["evicted"] == 0 for t in trajs)
  batch = trajectories_to_batch(trajs, 12)
  mask = batch.valid_brt
  for stored in (True, False):

    def loss(params, share, stored=stored):
      logp, ent, aux = policy.row_logprobs(
        params, batch, stored=stored, share=share, with_salience=True
      )
      total = -jnp.sum(jnp.where(mask, logp, 0.0)) + aux["salience_nll"] + jnp.sum(ent)
      return total, (logp, ent, aux)

    run = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)
    (_, (logp_s, ent_s, aux_s)), g_s = run(state.params, True)
    (_, (logp_r, ent_r, aux_r)), g_r = run(state.params, False)
    if stored:  # the sampler's own log-probs
      np.testing.assert_allclose(np.asarray(logp_s)[mask], batch.logp_brt[mask], atol=2e-5)
    np.testing.assert_allclose(np.asarray(logp_s), np.asarray(logp_r), atol=2e-5)
    np.testing.assert_allclose(np.asarray(ent_s), np.asarray(ent_r), atol=2e-5)
    for k in aux_r:
      np.testing.assert_allclose(float(aux_s[k]), float(aux_r[k]), rtol=1e-5, atol=1e-6)
    flat_s, flat_r = jax.tree.leaves(g_s), jax.tree.leaves(g_r)
    assert len(flat_s) == len(flat_r)
    for a, b in zip(flat_s, flat_r, strict=True):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
    # Not vacuous: the memory and the salience head both get gradient.
    for part in ("encoder", "salience"):
      assert max(float(jnp.max(jnp.abs(x))) for x in jax.tree.leaves(g_s[part])) > 0, part


def test_the_samplers_memory_cache_samples_as_the_whole_memory(sampled):
  """Where the bank is append-only and all visible (the stage-1 control), the sampler keeps
  the memory's keys and values between steps (`MemoryPolicy.sample_cached`): at every step
  the same tokens and log-probs as `sample` running the whole memory through the model. One
  cache serves two rounds of episodes: the second round's slots start with the first round's
  entries cached, which the cache must detect and recompute."""
  evicting, evicting_progs, *_ = sampled
  assert evicting_progs.sample_cached is None and evicting_progs.empty_memory_cache is None
  with pytest.raises(ValueError, match="append-only"):
    evicting.update_memory_cache(None, evicting.empty_streams(1), None)
  comp = dataclasses.replace(COMP, evict=False, capacity=12, visible=12, keep_threshold=0.0)
  spec = LongHorizonSpec("retention", n_steps=12, n_facts=2, min_gap=4, period=5)
  policy, progs, state, _ = _sampled(dataclasses.replace(MODEL, memory_slots=24), comp, spec, 1)
  cache, seen = [progs.empty_memory_cache(4)], []

  def both(params, streams, prompt, pvalid, key):
    ref = progs.sample(params, streams, prompt, pvalid, key)
    out, cache[0] = progs.sample_cached(params, streams, cache[0], prompt, pvalid, key)
    seen.append(jax.device_get((ref, out, streams.bank.count, cache[0].ok_bc)))
    return ref

  for seed in (0, 1):
    _play(both, policy, progs, state.params, make_split(spec, "test", 3, seed), seed)
  for ref, out, count, held in seen:
    np.testing.assert_array_equal(out.tokens_bt, ref.tokens_bt)
    np.testing.assert_array_equal(out.valid_bt, ref.valid_bt)
    np.testing.assert_allclose(out.logp_bt, ref.logp_bt, atol=1e-5)
    np.testing.assert_array_equal(held.sum(-1), count)  # every entry of the bank, no more
  counts = [int(s[2].max()) for s in seen]
  assert max(counts) == spec.n_steps - 1  # every step but the current one kept
  # A fresh round after a full one: the cache held a full memory and met empty banks.
  assert any(a == spec.n_steps - 1 and b == 0 for a, b in zip(counts[:-1], counts[1:], strict=True))


def test_memory_sao_leaves_forged_log_probs_out_of_the_update(sampled):
  """sao.verify_drift for the policy with compressed memory: a trajectory whose claimed
  log-probs are far from the policy's (certainty, 0) is flagged and takes no part: the update
  equals the one without it, tracker included; the clean ones pass."""
  from sao_jax.batches import MemorySAOBatch
  from sao_jax.compression.sao_update import make_memory_sao_update
  from sao_jax.config import RLConfig, SAOConfig
  from sao_jax.rl import trackers

  policy, progs, _, trajs = sampled
  state = progs.init(jax.random.key(0))  # (the params that played them: the fixture's own
  # state may have been donated to another test's update)
  tx = make_optimizer(OptimConfig(lr=1e-3, warmup_steps=1))
  update = jax.jit(
    make_memory_sao_update(policy, tx, RLConfig(algorithm="sao"), SAOConfig(verify_drift=1.0))
  )
  state = state.replace(tracker=trackers.init_beta_tracker(4))
  n = len(trajs)

  def sao_batch(memory):
    return MemorySAOBatch(
      memory=memory,
      task_b=np.arange(n, dtype=np.int32),
      accuracy_b=np.full(n, 0.5, np.float32),
      staleness_b=np.zeros(n, np.int32),
      poison_b=np.zeros(n, np.float32),
    )

  clean = trajectories_to_batch(trajs, 12)
  claims_certainty = (np.arange(n)[:, None, None] == 1) & clean.valid_brt  # trajectory 1
  forged = clean.replace(
    logp_brt=np.where(claims_certainty, 0.0, clean.logp_brt).astype(np.float32)
  )
  left_out = clean.replace(row_valid_br=clean.row_valid_br & (np.arange(n) != 1)[:, None])
  copy = lambda s: jax.tree.map(jnp.copy, s)  # noqa: E731
  a, ma = update(copy(state), sao_batch(forged))
  b, _ = update(copy(state), sao_batch(left_out))
  assert np.asarray(ma["unverified_b"]).tolist() == [i == 1 for i in range(n)]
  got, want = jax.tree.leaves((a.params, a.tracker)), jax.tree.leaves((b.params, b.tracker))
  for x, y in zip(got, want, strict=True):
    np.testing.assert_allclose(np.asarray(x, np.float64), np.asarray(y, np.float64), atol=1e-6)
  _, mc = update(copy(state), sao_batch(clean))
  assert not np.asarray(mc["unverified_b"]).any() and float(mc["drift_max"]) < 1e-3
