"""Orbax snapshots: exact round trip, restore onto another mesh, config travels along."""

import jax
import numpy as np
import pytest

from sao_jax import checkpoint as ckpt
from sao_jax.batches import SAOBatch, SFTBatch
from sao_jax.config import Config, MeshConfig, ModelConfig
from sao_jax.learner import make_optimizer, make_sft_update
from sao_jax.models.transformer import TransformerLM
from sao_jax.runners.compiled import compile_programs
from sao_jax.sharding import make_mesh

pytestmark = pytest.mark.skipif(len(jax.devices()) < 8, reason="needs the fake 8-device mesh")


def _programs(cfg, mesh):
  model = TransformerLM(cfg.model)
  tx = make_optimizer(cfg.sft.optim)
  return compile_programs(
    cfg,
    model,
    tx,
    make_sft_update(model, tx),
    with_ref=False,
    prompt_len=8,
    max_new_tokens=8,
    temperature=1.0,
    eos_id=2,
    pad_id=0,
    mesh=mesh,
  )


def _cfg(shape):
  return Config(
    model=ModelConfig(vocab_size=98, width=32, depth=1, heads=2, max_len=32),
    mesh=MeshConfig(shape=shape),
  )


def _equal(a, b):
  jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), a, b)


def test_roundtrip_and_restore_on_another_mesh(tmp_path):
  cfg8 = _cfg((4, 2, 1))
  progs8 = _programs(cfg8, make_mesh(cfg8.mesh))
  state = progs8.init(jax.random.key(3))
  batch = SFTBatch(
    prompt_bp=np.full((8, 8), 5, np.int32),
    prompt_valid_bp=np.ones((8, 8), bool),
    tokens_bt=np.full((8, 8), 7, np.int32),
    valid_bt=np.ones((8, 8), bool),
    weight_b=np.ones(8, np.float32),
  )
  state, _ = progs8.update(state, progs8.shard_batch(batch))
  mngr = ckpt.manager(tmp_path / "ck", every=1)
  assert ckpt.save(mngr, state, cfg8, {"phase": "sft"})
  mngr.wait_until_finished()

  restored, meta = ckpt.restore_state(mngr, progs8.init(jax.random.key(9)))
  mngr.close()
  _equal(restored.params, state.params)
  _equal(restored.opt_state, state.opt_state)
  assert int(restored.step) == 1 and meta["phase"] == "sft"
  assert meta["config"]["mesh"]["shape"] == [4, 2, 1]
  kernel = restored.params["block_0"]["mlp_in"]["kernel"]
  assert kernel.sharding == state.params["block_0"]["mlp_in"]["kernel"].sharding

  cfg1 = _cfg((1, 1, 1))
  progs1 = _programs(cfg1, make_mesh(cfg1.mesh, jax.devices()[:1]))
  params1, step, _ = ckpt.restore_params(tmp_path / "ck", progs1.init(jax.random.key(0)).params)
  assert step == 1
  _equal(params1, state.params)
  assert len(params1["block_0"]["mlp_in"]["kernel"].sharding.device_set) == 1


def test_missing_checkpoint_is_a_clear_error(tmp_path):
  (tmp_path / "empty").mkdir()
  with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
    ckpt.read_meta(tmp_path / "empty")
  # A directory that is not there: said so, and readers do not create it.
  for read in (ckpt.read_meta, lambda d: ckpt.restore_params(d, {})):
    with pytest.raises(FileNotFoundError, match="no checkpoint directory"):
      read(tmp_path / "absent")
  assert not (tmp_path / "absent").exists()


def test_sao_value_trackers_are_checkpointed(tmp_path):
  import dataclasses

  from sao_jax.learner import make_sao_update

  cfg = _cfg((8, 1, 1))
  # (made-up behaviour log-probs below: not a sampler's, so no verification)
  cfg = dataclasses.replace(cfg, sao=dataclasses.replace(cfg.sao, verify_drift=0.0))
  model = TransformerLM(cfg.model)
  tx = make_optimizer(cfg.rl.optim)
  progs = compile_programs(
    cfg,
    model,
    tx,
    make_sao_update(model, tx, cfg.rl, cfg.sao),
    with_ref=False,
    prompt_len=8,
    max_new_tokens=8,
    temperature=1.0,
    eos_id=2,
    pad_id=0,
    num_tasks=10,
  )
  state = progs.init(jax.random.key(0))
  batch = SAOBatch.single_steps(
    prompt_bp=np.full((8, 8), 5, np.int32),
    prompt_valid_bp=np.ones((8, 8), bool),
    tokens_bt=np.full((8, 8), 7, np.int32),
    valid_bt=np.ones((8, 8), bool),
    logp_bt=np.full((8, 8), -1.0, np.float32),
    rewards_b=np.linspace(0, 1, 8, dtype=np.float32),
    task_b=np.arange(8, dtype=np.int32),
    staleness_b=np.zeros(8, np.int32),
  )
  state, _ = progs.update(state, progs.shard_batch(batch))
  assert not np.allclose(np.asarray(state.tracker.alpha_n), 1.0)  # the update moved them
  mngr = ckpt.manager(tmp_path / "ck", every=1)
  ckpt.save(mngr, state, cfg)
  mngr.wait_until_finished()
  restored, _ = ckpt.restore_state(mngr, progs.init(jax.random.key(1)))
  mngr.close()
  _equal(restored.tracker, state.tracker)
