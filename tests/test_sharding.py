"""Sharded learner == single-device learner, on a fake 8-device CPU mesh; traces once."""

import chex
import jax
import numpy as np
import optax
import pytest

from sao_jax.batches import RLBatch, SAOBatch, SFTBatch
from sao_jax.config import Config, ConfigError, MeshConfig, ModelConfig, RLConfig
from sao_jax.learner import make_optimizer, make_rl_update, make_sao_update, make_sft_update
from sao_jax.models.transformer import TransformerLM
from sao_jax.packing import encode_prompts, encode_targets
from sao_jax.runners.compiled import compile_programs
from sao_jax.sharding import make_mesh
from sao_jax.tokenizer import CharTokenizer

TOK = CharTokenizer()
# Different device counts change reduction order (all-reduce of partial sums): f32 error only.
LOSS_RTOL = 1e-5
PARAM_ATOL = 1e-6  # after one SGD step at lr 0.1: 0.1 * (gradient error ~1e-6 relative)
MESHES = [
  (("data", "fsdp", "tensor"), (4, 2, 1)),
  (("data", "fsdp", "tensor"), (4, 1, 2)),
  (("data", "fsdp", "tensor"), (8, 1, 1)),
  (("data", "fsdp", "tensor"), (2, 4, 1)),
]

pytestmark = pytest.mark.skipif(len(jax.devices()) < 8, reason="needs the fake 8-device mesh")


def _cfg(axes, shape):
  return Config(
    model=ModelConfig(vocab_size=TOK.vocab_size, width=32, depth=2, heads=2, max_len=64),
    mesh=MeshConfig(axes=axes, shape=shape),
    rl=RLConfig(group_size=4, prompts_per_step=4, max_new_tokens=14),
  )


def _rl_batch():
  rng = np.random.default_rng(0)
  texts = [f"Ann had {i} eggs, got {i + 2}. Eggs?" for i in range(16)]
  prompt, pvalid = encode_prompts(TOK, texts, 40)
  tokens, valid = encode_targets(
    TOK, [f"{i}+{i + 2}={2 * i + 2};#{2 * i + 2}" for i in range(16)], 14
  )
  logp = np.where(valid, -rng.uniform(0.1, 3.0, valid.shape), 0.0).astype(np.float32)
  rewards = rng.integers(0, 2, 16).astype(np.float32)
  return RLBatch(
    prompt_bp=prompt,
    prompt_valid_bp=pvalid,
    tokens_bt=tokens,
    valid_bt=valid,
    logp_bt=logp,
    rewards_b=rewards,
  )


def _sft_batch(rl: RLBatch) -> SFTBatch:
  return SFTBatch(
    prompt_bp=rl.prompt_bp,
    prompt_valid_bp=rl.prompt_valid_bp,
    tokens_bt=rl.tokens_bt,
    valid_bt=rl.valid_bt,
    weight_b=np.ones(16, np.float32),
  )


def _sao_batch(rl: RLBatch) -> SAOBatch:
  """Single-step trajectories of 5 tasks, staleness 0..3, the last two rows padding."""
  return SAOBatch.single_steps(
    **{f: getattr(rl, f) for f in RLBatch.DTYPES},
    task_b=np.arange(16, dtype=np.int32) % 5,
    staleness_b=np.arange(16, dtype=np.int32) % 4,
    row_valid_b=np.arange(16) < 14,
  )


def _one_update(cfg, mesh, tx, batch, make_update, num_tasks=0):
  model = TransformerLM(cfg.model)
  progs = compile_programs(
    cfg,
    model,
    tx,
    make_update(model, tx),
    with_ref=False,
    prompt_len=40,
    max_new_tokens=14,
    temperature=1.0,
    eos_id=TOK.eos_id,
    pad_id=TOK.pad_id,
    mesh=mesh,
    num_tasks=num_tasks,
  )
  state = progs.init(jax.random.key(0))
  state, metrics = progs.update(state, progs.shard_batch(batch))
  return progs, jax.device_get(state.params), jax.device_get(metrics)


# Every mesh for the GRPO update; the two issue meshes (4x2, 8x1) for the others.
CASES = [("rl",) + m for m in MESHES] + [
  (k,) + m for k in ("sft", "sao") for m in (MESHES[0], MESHES[2])
]


@pytest.mark.parametrize("kind, axes, shape", CASES)
def test_sharded_update_equals_single_device(kind, axes, shape):
  cfg = _cfg(axes, shape)
  tx = optax.sgd(0.1)
  batch = _rl_batch()
  num_tasks = 0
  if kind == "rl":
    make = lambda m, t: make_rl_update(m, t, cfg.rl)
  elif kind == "sao":
    make = lambda m, t: make_sao_update(m, t, cfg.rl, cfg.sao)
    num_tasks = 5
    batch = _sao_batch(batch)
  else:
    make = make_sft_update
    batch = _sft_batch(batch)
  one = make_mesh(MeshConfig(axes=axes, shape=(1, 1, 1)), jax.devices()[:1])
  many = make_mesh(cfg.mesh)
  assert many.devices.size == 8
  progs8, params8, m8 = _one_update(cfg, many, tx, batch, make, num_tasks)
  _, params1, m1 = _one_update(cfg, one, tx, batch, make, num_tasks)
  np.testing.assert_allclose(m8["loss"], m1["loss"], rtol=LOSS_RTOL)
  np.testing.assert_allclose(m8["grad_norm"], m1["grad_norm"], rtol=LOSS_RTOL)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=PARAM_ATOL), params8, params1)
  # Parameters really are split: the attention query kernel (embed, heads, kv).
  spec = progs8.state_sharding.params["block_0"]["attn"]["query"]["kernel"].spec
  assert spec == jax.sharding.PartitionSpec("fsdp", "tensor", None)


def test_params_and_optimizer_state_are_sharded():
  cfg = _cfg(("data", "fsdp", "tensor"), (2, 2, 2))
  model = TransformerLM(cfg.model)
  tx = make_optimizer(cfg.rl.optim)
  progs = compile_programs(
    cfg,
    model,
    tx,
    make_rl_update(model, tx, cfg.rl),
    with_ref=False,
    prompt_len=40,
    max_new_tokens=14,
    temperature=1.0,
    eos_id=TOK.eos_id,
    pad_id=TOK.pad_id,
  )
  state = progs.init(jax.random.key(0))
  kernel = state.params["block_0"]["mlp_in"]["kernel"]  # (embed, mlp) -> (fsdp, tensor)
  assert kernel.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor")
  assert kernel.addressable_shards[0].data.shape == (16, 64)
  adam_mu = state.opt_state[1][0].mu["block_0"]["mlp_in"]["kernel"]
  assert adam_mu.sharding == kernel.sharding


def test_update_traces_once_across_steps():
  cfg = _cfg(("data", "fsdp", "tensor"), (4, 2, 1))
  model = TransformerLM(cfg.model)
  tx = make_optimizer(cfg.rl.optim)
  traced = chex.assert_max_traces(make_rl_update(model, tx, cfg.rl), n=1)
  progs = compile_programs(
    cfg,
    model,
    tx,
    traced,
    with_ref=False,
    prompt_len=40,
    max_new_tokens=14,
    temperature=1.0,
    eos_id=TOK.eos_id,
    pad_id=TOK.pad_id,
  )
  state = progs.init(jax.random.key(0))
  batch = _rl_batch()
  losses = []
  for i in range(4):
    batch = batch.replace(rewards_b=np.roll(batch.rewards_b, i))  # new values, same shapes
    state, metrics = progs.update(state, progs.shard_batch(batch))
    losses.append(float(metrics["loss"]))
  assert int(state.step) == 4 and len(set(losses)) > 1  # chex raised had it traced twice


def test_indivisible_mesh_is_a_config_error_naming_the_dimension():
  cfg = _cfg(("data", "fsdp", "tensor"), (1, 1, 8))  # 2 heads cannot split over 8 devices
  with pytest.raises(
    ConfigError,
    match=r"heads dimension of size 2 cannot be split over mesh "
    r"axes \('tensor',\) of 8 devices",
  ):
    _one_update(cfg, make_mesh(cfg.mesh), optax.sgd(0.1), _rl_batch(), make_sft_update)
