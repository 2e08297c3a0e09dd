"""Continuous batching and in-flight weight updates: a refilled slot decodes exactly what a
fresh batch would, no slot idles while tasks are queued, every token records the version
that produced it and its behaviour log-prob stays exact, and the learner's staleness is per
token."""

import collections
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao_jax import slots as slots_lib
from sao_jax.buffer import Item, batch_rows
from sao_jax.config import ModelConfig
from sao_jax.envs.base import StepResult, Task
from sao_jax.models.transformer import TransformerLM
from sao_jax.packing import encode_prompts
from sao_jax.rollout import ContinuousSampler
from sao_jax.sampling import completion_logprobs, sample
from sao_jax.tokenizer import CharTokenizer
from sao_jax.transport import records

TOK = CharTokenizer()
P, T = 12, 6
LOGP_ATOL = 2e-5  # float32: the same math on caches of other batch sizes


def _model(seed=0):
  cfg = ModelConfig(vocab_size=TOK.vocab_size, width=32, depth=2, heads=2, max_len=32)
  model = TransformerLM(cfg)
  toks = jnp.zeros((1, 4), jnp.int32)
  params = nn.meta.unbox(
    model.init(jax.random.key(seed), toks, toks, jnp.tril(jnp.ones((4, 4), bool))[None])["params"]
  )
  return model, params


def _programs(model, slots, greedy=False, temperature=1.0, max_steps=0):
  fill = jax.jit(functools.partial(slots_lib.fill, model, pad_id=TOK.pad_id))
  refresh = jax.jit(functools.partial(slots_lib.refresh, model))
  decode = jax.jit(
    lambda p, s, v, k, n: slots_lib.decode(
      model,
      p,
      s,
      v,
      k,
      eos_id=TOK.eos_id,
      pad_id=TOK.pad_id,
      greedy=greedy,
      temperature=temperature,
      min_done=n,
      max_steps=max_steps,
    )
  )
  return fill, decode, refresh, slots_lib.empty(model, slots, P, T, TOK.pad_id)


def test_a_refilled_slot_decodes_like_a_fresh_batch():
  model, params = _model()
  fill, decode, _, state = _programs(model, slots=2, greedy=True)
  texts = ["ab", "hello there", "x y z", "q"]
  prompts = [encode_prompts(TOK, [t], P) for t in texts]
  out = {}
  # Slots 0 and 1 start texts 0 and 1; whichever ends first is refilled with text 2, then 3.
  state = fill(params, state, prompts[0][0], prompts[0][1], np.array([0], np.int32))
  state = fill(params, state, prompts[1][0], prompts[1][1], np.array([1], np.int32))
  holder, queue = {0: 0, 1: 1}, [2, 3]
  key = jax.random.key(0)
  while holder:
    state = decode(params, state, np.int32(5), key, 1)
    done = np.asarray(state.done_b)
    for slot in [s for s in holder if done[s]]:
      n = int(state.gen_b[slot])
      out[holder.pop(slot)] = (
        np.asarray(state.tokens_bt[slot, :n]),
        np.asarray(state.logp_bt[slot, :n]),
        np.asarray(state.version_bt[slot, :n]),
      )
      if queue:
        i = queue.pop(0)
        state = fill(params, state, prompts[i][0], prompts[i][1], np.array([slot], np.int32))
        holder[slot] = i
  for i, (prompt, pvalid) in enumerate(prompts):
    ref = sample(
      model,
      params,
      prompt,
      pvalid,
      jax.random.key(1),
      max_new_tokens=T,
      eos_id=TOK.eos_id,
      pad_id=TOK.pad_id,
      greedy=True,
    )
    n = int(ref.lengths_b[0])
    np.testing.assert_array_equal(out[i][0], np.asarray(ref.tokens_bt[0, :n]))
    np.testing.assert_allclose(out[i][1], np.asarray(ref.logp_bt[0, :n]), atol=LOGP_ATOL)
    assert (out[i][2] == 5).all()


def test_sampled_logprobs_equal_recomputed():
  model, params = _model()
  fill, decode, _, state = _programs(model, slots=3, temperature=0.8)
  prompt, pvalid = encode_prompts(TOK, ["a b", "cd", "efg h"], P)
  state = fill(params, state, prompt, pvalid, np.arange(3, dtype=np.int32))
  state = decode(params, state, np.int32(0), jax.random.key(4), 3)
  gen = np.asarray(state.gen_b)
  valid = np.arange(T)[None] < gen[:, None]
  lp = completion_logprobs(
    model, params, prompt, pvalid, np.asarray(state.tokens_bt), valid, temperature=0.8
  ).logp_bt
  np.testing.assert_allclose(np.asarray(state.logp_bt), np.asarray(lp), atol=LOGP_ATOL)


class CountingEnv:
  """`length` steps; observation 'ok' between steps; reward 1 at the end."""

  max_steps = 3

  def reset(self, task):
    self.t, self.length = 0, task.difficulty
    return np.asarray(TOK.encode(task.prompt), np.int32)

  def step(self, action_tokens):
    self.t += 1
    done = self.t >= self.length
    return StepResult(np.asarray(TOK.encode("ok"), np.int32), float(done), done, {})


def _sampler(model, params, *, slots=4, refill_rows=2, inflight="tokens", max_steps=0):
  fill, decode, refresh, state = _programs(model, slots, max_steps=max_steps)
  s = ContinuousSampler(
    fill,
    decode,
    refresh,
    state,
    TOK,
    slots=slots,
    refill_rows=refill_rows,
    prompt_len=P,
    max_steps=3,
    make_env=CountingEnv,
    inflight=inflight,
  )
  s.offer_params(0, params)
  return s


def test_no_slot_idles_while_tasks_are_queued_and_episodes_complete():
  model, params = _model()
  s = _sampler(model, params)
  queue = collections.deque((i, Task(i, f"t{i}", "", "", 1 + i % 3)) for i in range(20))

  def take(n):
    return [queue.popleft() for _ in range(min(n, len(queue)))]

  got = []
  for _ in range(400):
    got += s.step(take)
    if queue:  # every free slot was refilled at every refill so far
      assert s.idle_slot_steps == 0
    if len(got) == 20:
      break
  assert sorted(t.task_index for t in got) == list(range(20))
  for t in got:
    assert len(t.tokens) == 1 + t.task_index % 3 and t.done and t.total_reward == 1.0
    for k in range(1, len(t.tokens)):  # step k's context ends with the observation 'ok'
      assert t.prompt[k][-2:].tolist() == TOK.encode("ok")
    assert (t.version[t.valid] == 0).all() and (t.version[~t.valid] == -1).all()


@pytest.mark.parametrize("inflight", ["tokens", "steps", "off"])
def test_inflight_updates_record_versions_and_keep_logprobs_exact(inflight):
  model, params0 = _model(0)
  _, params1 = _model(1)
  # At most 2 tokens per decode call, so that the new version arrives mid-completion.
  s = _sampler(model, params0, slots=2, refill_rows=1, inflight=inflight, max_steps=2)
  tasks = collections.deque((i, Task(i, f"task {i}", "", "", 3)) for i in range(6))
  take = lambda n: [tasks.popleft() for _ in range(min(n, len(tasks)))]  # noqa: E731
  got = s.step(take)  # a first decode call on version 0 ...
  s.offer_params(1, params1)  # ... then a new version arrives mid-flight
  for _ in range(200):
    got += s.step(take)
    if len(got) == 6:
      break
  assert len(got) == 6
  by_version = {0: params0, 1: params1}
  mixed_step = mixed_traj = False
  for t in got:
    versions = [set(v[ok].tolist()) for v, ok in zip(t.version, t.valid, strict=True)]
    mixed_step |= any(len(v) > 1 for v in versions)
    mixed_traj |= len(set().union(*versions)) > 1
    # Each token's recorded log-prob is exactly that of the version which produced it.
    for k in range(len(t.tokens)):
      for v, p in by_version.items():
        lp = completion_logprobs(
          model,
          p,
          t.prompt[k : k + 1],
          t.prompt_valid[k : k + 1],
          t.tokens[k : k + 1],
          t.valid[k : k + 1],
        ).logp_bt[0]
        sel = t.version[k] == v
        np.testing.assert_allclose(t.logp[k][sel], np.asarray(lp)[sel], atol=LOGP_ATOL)
  used = set().union(*(set(t.version[t.valid].tolist()) for t in got))
  assert used == {0, 1}  # both versions produced tokens
  if inflight == "steps":
    assert not mixed_step
  if inflight == "off":
    assert not mixed_traj and not mixed_step
  if inflight == "tokens":
    assert mixed_step  # taken mid-completion


def test_learner_staleness_is_per_token():
  t, s = 4, 2
  version = np.array([[3, 3, 5, 5], [5, 5, 5, -1]], np.int32)
  valid = version >= 0
  arrays = {
    "prompt": np.ones((s, 3), np.int32),
    "prompt_valid": np.ones((s, 3), bool),
    "tokens": np.ones((s, t), np.int32),
    "valid": valid,
    "logp": np.zeros((s, t), np.float32),
    "version": version,
  }
  data = records.encode(
    records.RecordKind.TRAJECTORY, 1, 3, arrays, {"task_index": 0, "reward": 1.0, "t_end": 0.0}
  )
  batch, orphans = batch_rows(
    [Item(records.decode(data), 0, None)], step=6, rows=4, max_staleness=4
  )
  assert orphans == 0
  np.testing.assert_array_equal(batch.staleness_bt[:2], [[3, 3, 1, 1], [1, 1, 1, 3]])


def test_kafka_sampler_acknowledges_tasks_in_taken_order():
  """ack_tasks(n) commits past the first n tasks taken (and the non-task records among
  them), never past a task still being worked on."""
  from sao_jax.transport.kafka import KafkaSamplerEnd

  end = object.__new__(KafkaSamplerEnd)
  end._taken = collections.deque(
    [("p0", 10, True), ("p1", 4, True), ("p0", 11, False), ("p0", 12, True), ("p1", 5, True)]
  )
  assert end._pop_taken(2) == {"p0": 12, "p1": 5}  # tasks 10 and 4, and the non-task 11
  assert [e[1] for e in end._taken] == [12, 5]
  assert end._pop_taken(None) == {"p0": 13, "p1": 6}
  assert end._pop_taken(3) == {} and not end._taken


@pytest.mark.parametrize("inflight", ["tokens", "off"])
def test_a_new_lineage_restarts_the_episodes_in_flight_under_it(inflight):
  """The learner resumed (or rolled back) and announces version 0 again under a new lineage:
  the sampler takes it at once, whatever `inflight` says, and every episode in flight starts
  again from its first prompt; no token of the old lineage is sent, and every task comes back
  once."""
  model, params_a = _model(0)
  _, params_b = _model(1)
  s = _sampler(model, params_a, slots=2, refill_rows=1, inflight=inflight, max_steps=2)
  s.lineage = 0xA  # (what offer_params(..., lineage=0xA) would have set at the start)
  tasks = collections.deque((i, Task(i, f"task {i}", "", "", 3)) for i in range(4))
  take = lambda n: [tasks.popleft() for _ in range(min(n, len(tasks)))]  # noqa: E731
  got = s.step(take)  # decoding under lineage A, version 0 ...
  assert not got and s.active() == 2
  s.offer_params(0, params_b, lineage=0xB)  # ... then lineage B's version 0
  assert s.params is params_b and s.lineage == 0xB and s.pending is None
  assert s.restarted_episodes == 2 and s.active() == 0 and len(s.waiting) == 2
  for _ in range(200):
    got += s.step(take)
    if len(got) == 4:
      break
  assert sorted(t.task_index for t in got) == [0, 1, 2, 3]
  for t in got:
    assert t.lineage == 0xB and len(t.tokens) == 3  # all three steps, all under B
    lp = completion_logprobs(model, params_b, t.prompt, t.prompt_valid, t.tokens, t.valid)
    np.testing.assert_allclose(t.logp[t.valid], np.asarray(lp.logp_bt)[t.valid], atol=LOGP_ATOL)
    assert t.prompt[0][-len(TOK.encode(f"task {t.task_index}")) :].tolist() == TOK.encode(
      f"task {t.task_index}"
    )
