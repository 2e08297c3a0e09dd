"""Sequence packing (`sao_jax.seqpack`): the plan puts every row's span in a packed row once,
and the packed forward pass gives the unpacked log-probs, entropies, values and gradients;
a whole SFT, GRPO and SAO update on a packed batch equals the update on the same rows
unpacked."""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from sao_jax import seqpack
from sao_jax.batches import RLBatch, SAOBatch, SFTBatch
from sao_jax.config import (
  Config,
  ConfigError,
  LearnerConfig,
  MeshConfig,
  ModelConfig,
  OptimConfig,
  RLConfig,
  SAOConfig,
  load_config,
)
from sao_jax.learner import (
  init_state_fn,
  make_rl_update,
  make_sao_update,
  make_sft_update,
)
from sao_jax.models import make_model
from sao_jax.runners.compiled import compile_programs
from sao_jax.sampling import completion_logprobs
from sao_jax.sharding import make_mesh

B, P, T, V = 12, 10, 14, 23


def _rows(seed: int = 0, full: int = 1, empty: int = 1):
  """B rows of varied prompt and completion lengths: `full` rows use every slot, `empty`
  rows none (padding rows), the rest 1..P prompt and 0..T completion tokens."""
  rng = np.random.default_rng(seed)
  plens = rng.integers(1, P + 1, B)
  tlens = rng.integers(0, T + 1, B)
  plens[:full], tlens[:full] = P, T
  plens[B - empty :], tlens[B - empty :] = 0, 0
  pvalid = np.arange(P)[None, :] >= P - plens[:, None]
  tvalid = np.arange(T)[None, :] < tlens[:, None]
  prompt = np.where(pvalid, rng.integers(1, V, (B, P)), 0).astype(np.int32)
  tokens = np.where(tvalid, rng.integers(1, V, (B, T)), 0).astype(np.int32)
  return prompt, pvalid, tokens, tvalid


def test_the_plan_packs_every_span_once_without_mixing_rows():
  prompt, pvalid, tokens, tvalid = _rows()
  plan = seqpack.plan(pvalid, tvalid)
  assert plan is not None and plan.rows < B
  start, end = seqpack.spans(pvalid, tvalid)
  length = P + T
  src, seg, dst = (np.asarray(x) for x in (plan.src_ql, plan.seg_ql, plan.dst_bl))
  for b in range(B):
    slots = np.arange(start[b], end[b])
    where = dst[b, slots]
    # The row's span, in order and contiguous, in one packed row, under its own segment id.
    assert len(set(where // length)) <= 1
    assert np.array_equal(np.diff(where), np.ones(len(slots) - 1)) if len(slots) else True
    assert np.array_equal(src.reshape(-1)[where], b * length + slots)
    assert (seg.reshape(-1)[where] == b + 1).all()
    # The span holds the slot that predicts each valid token and every valid slot before it
    # (the keys it attends to); a row's last token predicts nothing and is left out.
    read = set(P - 1 + np.flatnonzero(tvalid[b]))
    assert read <= set(slots)
    valid = np.flatnonzero(np.concatenate([pvalid[b], tvalid[b]]))
    assert {k for k in valid if k <= max(read, default=P - 1)} <= set(slots)
  # Each packed slot holds at most one row slot; the padding row takes none.
  assert (seg > 0).sum() == (end - start).sum()
  assert start[-1] == end[-1] == 0
  # Longer packed rows hold more spans each; the mapping stays one to one.
  long = seqpack.plan(pvalid, tvalid, factor=3)
  assert long.src_ql.shape == (long.rows, 3 * length) and long.rows < plan.rows
  assert np.array_equal(
    np.asarray(long.src_ql).reshape(-1)[np.asarray(long.dst_bl)[0, : end[0]]], np.arange(end[0])
  )
  # A bucket rounds the packed rows up; full rows leave nothing to save.
  assert seqpack.plan(pvalid, tvalid, bucket=4).rows % 4 == 0
  assert seqpack.plan(np.ones((B, P), bool), np.ones((B, T), bool)) is None


def _model(arch: str, value_head: bool):
  cfg = ModelConfig(
    vocab_size=V,
    width=32,
    depth=2,
    heads=4,
    max_len=P + T,
    arch=arch,
    kv_heads=2 if arch == "llama" else 0,
    value_head=value_head,
  )
  model = make_model(cfg)
  x = jnp.zeros((1, 4), jnp.int32)
  params = model.init(jax.random.key(0), x, x, jnp.tril(jnp.ones((4, 4), bool))[None])
  return model, nn.meta.unbox(params["params"])


@pytest.mark.parametrize("arch,value_head", [("gpt", True), ("llama", False)])
def test_packed_logprobs_and_gradients_equal_the_unpacked(arch, value_head):
  model, params = _model(arch, value_head)
  prompt, pvalid, tokens, tvalid = _rows(seed=1)
  plan = seqpack.plan(pvalid, tvalid, factor=2)  # packed rows twice a row's length
  assert plan is not None and plan.rows < B // 2  # the packing saves something here
  w_bt = jnp.asarray(np.random.default_rng(2).normal(size=(B, T)), jnp.float32)

  def outputs(params, pack):
    lp = completion_logprobs(
      model,
      params,
      prompt,
      pvalid,
      tokens,
      tvalid,
      temperature=0.7,
      with_entropy=True,
      with_value=value_head,
      pack=pack,
    )
    return lp

  def loss(params, pack):
    lp = outputs(params, pack)
    out = jnp.sum(lp.logp_bt * w_bt) + 0.1 * jnp.sum(lp.entropy_bt)
    if value_head:  # the padding row's value is never read (its share is 0)
      out = out + jnp.sum(lp.values_b[:-1] ** 2)
    return out

  want, got = jax.jit(outputs)(params, None), jax.jit(outputs)(params, plan)
  np.testing.assert_allclose(got.logp_bt, want.logp_bt, atol=2e-5)
  np.testing.assert_allclose(got.entropy_bt, want.entropy_bt, atol=2e-5)
  assert (np.asarray(got.logp_bt)[~tvalid] == 0).all()
  if value_head:
    np.testing.assert_allclose(got.values_b[:-1], want.values_b[:-1], atol=2e-5)
  g_want, g_got = (jax.jit(jax.grad(loss))(params, pack) for pack in (None, plan))
  for a, b in zip(jax.tree.leaves(g_got), jax.tree.leaves(g_want), strict=True):
    np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)


def _update_case(kind: str):
  cfg = ModelConfig(vocab_size=V, width=32, depth=1, heads=2, max_len=P + T)
  model = make_model(cfg)
  optim = OptimConfig(lr=1e-2, warmup_steps=1)
  # Plain SGD: the parameters' change is the gradient (Adam's first step is about sign(g), which
  # float noise flips where a gradient is near 0).
  tx = optax.sgd(0.1)
  prompt, pvalid, tokens, tvalid = _rows(seed=3, empty=0)
  rng = np.random.default_rng(4)
  common = dict(prompt_bp=prompt, prompt_valid_bp=pvalid, tokens_bt=tokens, valid_bt=tvalid)
  logp = np.where(tvalid, -rng.uniform(0.5, 3.0, (B, T)), 0.0).astype(np.float32)
  rewards = rng.integers(0, 2, B).astype(np.float32)
  if kind == "sft":
    update = make_sft_update(model, tx)
    batch = SFTBatch(**common, weight_b=np.ones(B, np.float32))
  elif kind == "grpo":
    update = make_rl_update(model, tx, RLConfig(group_size=4, optim=optim))
    batch = RLBatch(**common, logp_bt=logp, rewards_b=rewards)
  else:
    update = make_sao_update(model, tx, RLConfig(ppo_epochs=2, optim=optim), SAOConfig())
    batch = SAOBatch.single_steps(
      **common,
      logp_bt=logp,
      rewards_b=rewards,
      task_b=np.arange(B) % 5,
      staleness_b=rng.integers(0, 3, B),
    )
  init = init_state_fn(model, tx, P, with_ref=False, num_tasks=5)
  state = nn.meta.unbox(init(jax.random.key(0)))
  return jax.jit(update), state, batch


@pytest.mark.parametrize("kind", ["sft", "grpo", "sao"])
def test_an_update_on_a_packed_batch_equals_the_unpacked_update(kind):
  update, state, batch = _update_case(kind)
  plan = seqpack.plan(batch.prompt_valid_bp, batch.valid_bt)
  assert plan is not None
  want_state, want = update(state, batch)
  got_state, got = update(state, dataclasses.replace(batch, pack=plan))
  assert set(got) == set(want)
  for k in want:
    np.testing.assert_allclose(got[k], want[k], atol=1e-5, rtol=1e-4, err_msg=k)
  for a, b in zip(
    jax.tree.leaves(got_state.params), jax.tree.leaves(want_state.params), strict=True
  ):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4)


def test_learner_pack_on_packs_in_shard_batch_and_counts(repo_root):
  """learner.pack='on': the learner's programs pack each text batch on its way to the device
  (the same update as unpacked) and count what they packed; the compressed-memory policy's
  batches are refused at config time."""
  model_cfg = ModelConfig(vocab_size=V, width=32, depth=1, heads=2, max_len=P + T)
  model = make_model(model_cfg)
  tx = optax.sgd(0.1)
  prompt, pvalid, tokens, tvalid = _rows(seed=3, empty=0)
  batch = SFTBatch(
    prompt_bp=prompt,
    prompt_valid_bp=pvalid,
    tokens_bt=tokens,
    valid_bt=tvalid,
    weight_b=np.ones(B, np.float32),
  )
  progs = {}
  for pack in ("off", "on"):
    cfg = Config(
      model=model_cfg, mesh=MeshConfig(shape=(1, 1, 1)), learner=LearnerConfig(pack=pack)
    )
    progs[pack] = compile_programs(
      cfg,
      model,
      tx,
      make_sft_update(model, tx),
      with_ref=False,
      prompt_len=P,
      max_new_tokens=T,
      temperature=1.0,
      eos_id=1,
      pad_id=0,
      mesh=make_mesh(cfg.mesh, jax.devices()[:1]),
    )
  assert progs["off"].packer is None
  packer = progs["on"].packer
  sent = progs["on"].shard_batch(batch)
  # The defaults: packed rows of 4 x (P + T) slots, an even number of them.
  assert sent.pack is not None and sent.pack.rows % 2 == 0 and packer.counts["packed"] == 1
  assert sent.pack.src_ql.shape[1] == 4 * (P + T)
  assert packer.counts["slots"] == sent.pack.src_ql.size < packer.counts["padded_slots"]
  got, got_m = progs["on"].update(progs["on"].init(jax.random.key(0)), sent)
  want, want_m = progs["off"].update(
    progs["off"].init(jax.random.key(0)), progs["off"].shard_batch(batch)
  )
  np.testing.assert_allclose(got_m["loss"], want_m["loss"], rtol=1e-5)
  for a, b in zip(jax.tree.leaves(got.params), jax.tree.leaves(want.params), strict=True):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4)
  longhorizon = repo_root / "experiments" / "configs" / "longhorizon.py"
  with pytest.raises(ConfigError, match="compressed-memory"):
    load_config(str(longhorizon), "tiny", ["learner.pack=on"])
