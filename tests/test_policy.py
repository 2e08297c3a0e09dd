"""Both kinds of policy implement `sao_jax.policy.Policy` the same way: the shapes the compile
site shards by are those init builds, the state carries a task tracker when asked, and a bare
model is the text policy of its prompt length. Abstract evaluation only: nothing compiles."""

import flax.linen as nn
import jax
import pytest

from sao_jax.compression.memory import Compressor
from sao_jax.compression.policy import MemoryPolicy
from sao_jax.config import CompressionConfig, ModelConfig, OptimConfig
from sao_jax.learner import make_optimizer
from sao_jax.models.transformer import TransformerLM
from sao_jax.policy import Policy, TextPolicy, as_policy
from sao_jax.tokenizer import CharTokenizer

TOK = CharTokenizer()
COMP = CompressionConfig(
  enabled=True, step_len=8, vectors_per_step=2, dim=8, enc_width=16, enc_depth=1, enc_heads=2,
  lstm_hidden=16, budget=3, capacity=6, visible=3, window=8,
)  # fmt: skip


def _text() -> TextPolicy:
  return TextPolicy(TransformerLM(ModelConfig(vocab_size=TOK.vocab_size, width=16, depth=1)), 8)


def _memory() -> MemoryPolicy:
  model = TransformerLM(
    ModelConfig(vocab_size=TOK.vocab_size, width=16, depth=1, memory_slots=6, memory_dim=8)
  )
  return MemoryPolicy(model, Compressor(COMP, TOK.vocab_size))


@pytest.mark.parametrize("make", [_text, _memory], ids=["text", "memory"])
def test_a_policy_builds_the_state_its_shapes_describe(make):
  policy = make()
  assert isinstance(policy, Policy)
  tx = make_optimizer(OptimConfig())
  state = jax.eval_shape(policy.init_state_fn(tx, num_tasks=5), jax.random.key(0))
  spec = lambda tree: jax.tree.map(lambda x: (x.shape, x.dtype), nn.meta.unbox(tree))  # noqa: E731
  assert spec(policy.param_shapes()) == spec(state.params)
  assert state.tracker is not None and state.tracker.alpha_n.shape == (5,)
  assert jax.eval_shape(policy.init_state_fn(tx), jax.random.key(0)).tracker is None


def test_only_the_text_policy_keeps_a_reference():
  tx = make_optimizer(OptimConfig())
  state = jax.eval_shape(_text().init_state_fn(tx, with_ref=True), jax.random.key(0))
  assert state.ref_params is not None
  with pytest.raises(ValueError, match="no reference policy"):
    _memory().init_state_fn(tx, with_ref=True)


def test_a_bare_model_is_the_text_policy_of_its_prompt_length():
  policy = _text()
  got = as_policy(policy.model, 8)
  assert isinstance(got, TextPolicy) and got.model is policy.model and got.prompt_len == 8
  assert as_policy(policy) is policy
  with pytest.raises(ValueError, match="prompt_len"):
    as_policy(policy.model)
