"""sao_sampling: one trajectory per task, multi-step episodes, padded slots, the hook."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from sao_jax.config import ModelConfig
from sao_jax.envs.base import StepResult, Task
from sao_jax.models.transformer import TransformerLM
from sao_jax.rollout import sao_sampling
from sao_jax.sampling import sample
from sao_jax.tokenizer import CharTokenizer

TOK = CharTokenizer()


class CountingEnv:
  """Episode of `length` steps; reward 1 at the last step; observation 'ok' between steps."""

  def __init__(self, length):
    self.length, self.max_steps = length, 4

  def reset(self, task):
    self.t = 0
    return np.asarray(TOK.encode(task.prompt), np.int32)

  def step(self, action_tokens):
    self.t += 1
    done = self.t >= self.length
    return StepResult(np.asarray(TOK.encode("ok"), np.int32), float(done), done, {})


def test_multi_step_trajectories_with_padding_slots():
  cfg = ModelConfig(vocab_size=TOK.vocab_size, width=16, depth=1, heads=2, max_len=48)
  model = TransformerLM(cfg)
  toks = jnp.zeros((1, 4), jnp.int32)
  params = nn.meta.unbox(
    model.init(jax.random.key(0), toks, toks, jnp.tril(jnp.ones((4, 4), bool))[None])["params"]
  )
  fn = jax.jit(
    functools.partial(sample, model, max_new_tokens=6, eos_id=TOK.eos_id, pad_id=TOK.pad_id)
  )
  tasks = [Task(i, f"task {i}", "", "", 1) for i in range(3)]
  seen = []

  def hook(traj):
    seen.append(traj.task_index)
    return traj

  trajs = sao_sampling(
    fn,
    params,
    [CountingEnv(n) for n in (1, 3, 2)],
    tasks,
    [10, 11, 12],
    TOK,
    slots=4,
    prompt_len=24,
    max_steps=4,
    rng=jax.random.key(1),
    policy_version=7,
    compress=hook,
  )
  assert seen == [10, 11, 12]
  assert [t.tokens.shape[0] for t in trajs] == [1, 3, 2]
  assert all(t.done and t.policy_version == 7 for t in trajs)
  assert [t.total_reward for t in trajs] == [1.0, 1.0, 1.0]
  t = trajs[1]
  # Step k's context ends with the observation that followed step k-1.
  ok = TOK.encode("ok")
  assert t.prompt[1][-2:].tolist() == ok and t.prompt[2][-2:].tolist() == ok
  assert t.prompt_valid[2].sum() > t.prompt_valid[1].sum() > t.prompt_valid[0].sum()
  assert t.logp.dtype == np.float32 and np.all(t.logp[~t.valid] == 0)
