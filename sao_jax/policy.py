"""The policy protocol: what the compile site, the runners, the sampler processes and
evaluation ask of a kind of policy, so that none of them branches on which kind it is.

Two kinds implement it: `TextPolicy` (the transformer on a left-padded context window) and
`compression.policy.MemoryPolicy` (the same transformer conditioned on a compressed memory
of earlier steps). Both play *episodes*: a text trajectory is an episode whose steps carry
no memory from one to the next, so its sampler takes no per-slot state and its programs are
exactly the plain transformer's (the memory policy's streams, bank and compressor never
enter a text run). `Setup.policy` is the run's policy; a new kind is one new class.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import flax.linen as nn
import jax
import numpy as np

from sao_jax import sampling
from sao_jax.batches import SFTBatch
from sao_jax.config import Config
from sao_jax.envs.base import Task
from sao_jax.learner import init_state_fn, make_rl_update, make_sao_update, make_sft_update
from sao_jax.models import lora
from sao_jax.packing import left_pad, right_pad
from sao_jax.rollout import Trajectory, sao_sampling
from sao_jax.state import TrainState


@runtime_checkable
class Policy(Protocol):
  """A kind of policy. Nothing here is jitted: `runners.compiled` jits `sample` (params, then
  `sample_inputs` arrays split over the batch axis, then the rng; keyword arguments
  max_new_tokens, eos_id, pad_id, temperature, greedy) and the state `init_state_fn` builds.
  """

  # State -----------------------------------------------------------------------------
  def param_shapes(self) -> Any:
    """The params as logically annotated (boxed) shapes and dtypes: nothing computed."""

  def init_state_fn(
    self, tx, *, with_ref: bool = False, num_tasks: int = 0
  ) -> Callable[[jax.Array], TrainState]:
    """rng -> TrainState with boxed params (a reference copy with `with_ref`, SAO's task
    tracker over `num_tasks` tasks when > 0)."""

  def trainable(self, tx) -> Any:
    """`tx` restricted to the parameters this policy trains."""

  # Sampler ---------------------------------------------------------------------------
  sample_inputs: int  # arrays `sample` takes between params and the rng

  def sample(self, params, *inputs, **kw) -> sampling.SampleOutput:
    """One step of every slot: (params, *inputs, rng) -> SampleOutput."""

  def play(
    self,
    s,
    progs,
    params,
    tasks: Sequence[Task],
    indices: Sequence[int],
    *,
    slots: int,
    rng: jax.Array,
    greedy: bool = False,
    version: int = 0,
    lineage: int = -1,
  ) -> list:
    """One episode per task (at most `slots`) of setup `s`'s environments, stepped side by
    side with `progs`'s sampler (its greedy one with `greedy`) under policy `version`."""

  def episode_metrics(self, s, episodes: list) -> dict[str, float]:
    """What held-out evaluation reports of greedy episodes besides their accuracy."""

  # Learner ---------------------------------------------------------------------------
  # What this kind's update makers take first (`make_*_update(learner_model, tx, ...)`).
  learner_model: Any

  def sft_batches(self, s, batch_size: int) -> Callable[[np.random.Generator], tuple[Any, int]]:
    """rng -> (the supervised batch of `batch_size` random training tasks of setup `s`, its
    target tokens), the draws taken from rng."""

  def sft_update(self, tx, cfg: Config) -> Callable:
    """update(state, batch) -> (state, metrics): supervised training on expert steps."""

  def grpo_update(self, tx, cfg: Config) -> Callable:
    """update(state, batch) -> (state, metrics): one synchronous GRPO(N=rl.group_size) step."""

  def sao_update(self, tx, cfg: Config) -> Callable:
    """update(state, batch) -> (state, metrics): one SAO step on single trajectories."""


def param_shapes(model: nn.Module, length: int = 1):
  """The model's parameters as logically annotated (boxed) shapes and dtypes, from an
  abstract init on `length` tokens (the parameters do not depend on it): nothing computed."""
  tokens = jax.ShapeDtypeStruct((1, length), jax.numpy.int32)
  mask = jax.ShapeDtypeStruct((1, length, length), jax.numpy.bool_)
  memory = None
  if model.cfg.memory_slots:
    memory = jax.ShapeDtypeStruct(
      (1, 0, model.cfg.memory_dim or model.cfg.width), jax.numpy.float32
    )
  return jax.eval_shape(
    lambda rng, t, m, mem: model.init(rng, t, t, m, mem)["params"],
    jax.random.key(0),
    tokens,
    mask,
    memory,
  )


@dataclasses.dataclass(frozen=True, eq=False)
class TextPolicy:
  """A model of `sao_jax.models` on contexts left-padded to `prompt_len` tokens."""

  model: nn.Module
  prompt_len: int
  sample_inputs = 2  # prompt_bp, prompt_valid_bp

  @property
  def learner_model(self) -> nn.Module:
    return self.model

  def trainable(self, tx):
    """With LoRA adapters (model.lora_rank > 0) only the adapters train."""
    return lora.freeze_base(tx) if self.model.cfg.lora_rank else tx

  def sft_update(self, tx, cfg: Config):
    return make_sft_update(self.model, tx)

  def grpo_update(self, tx, cfg: Config):
    return make_rl_update(self.model, tx, cfg.rl)

  def sao_update(self, tx, cfg: Config):
    return make_sao_update(self.model, tx, cfg.rl, cfg.sao)

  def sft_batches(self, s, batch_size: int):
    def next_batch(rng):
      tasks = [s.train[i] for i in rng.integers(0, len(s.train), batch_size)]
      batch = sft_batch(s, tasks, rng, batch_size, s.target_len)
      return batch, int(batch.valid_bt.sum())

    return next_batch

  def param_shapes(self):
    return param_shapes(self.model, self.prompt_len)

  def init_state_fn(self, tx, *, with_ref: bool = False, num_tasks: int = 0):
    return init_state_fn(self.model, tx, self.prompt_len, with_ref, num_tasks)

  def sample(self, params, prompt_bp, prompt_valid_bp, rng, **kw) -> sampling.SampleOutput:
    return sampling.sample(self.model, params, prompt_bp, prompt_valid_bp, rng, **kw)

  def play(
    self,
    s,
    progs,
    params,
    tasks,
    indices,
    *,
    slots,
    rng,
    greedy=False,
    version=0,
    lineage=-1,
  ) -> list[Trajectory]:
    return sao_sampling(
      progs.greedy if greedy else progs.sample,
      params,
      [s.family.make_env(s.tok) for _ in tasks],
      tasks,
      indices,
      s.tok,
      slots=slots,
      prompt_len=s.prompt_len,
      max_steps=s.max_steps,
      rng=rng,
      policy_version=version,
      step_many=s.family.step_many,
      lineage=lineage,
    )

  def episode_metrics(self, s, episodes: list[Trajectory]) -> dict[str, float]:
    """format_rate: the fraction of steps whose output the environment could parse, where it
    says (`info["format_ok"]`)."""
    fmt = [info["format_ok"] for t in episodes for info in t.infos if "format_ok" in info]
    return {"format_rate": float(np.mean(fmt))} if fmt else {}


def sft_batch(
  s, tasks: list[Task], rng: np.random.Generator, rows: int, target_len: int
) -> SFTBatch:
  """One teacher-forced row per task of setup `s`. A multi-step task contributes one of its
  steps, drawn with probability proportional to the step's weight (so that in expectation the
  loss is the weighted one); a one-step task its only row."""
  contexts, targets = [], []
  for task in tasks:
    examples = s.family.sft_examples(task, s.tok, s.prompt_len)
    if len(examples) > 1:
      w = np.asarray([e.weight for e in examples], np.float64)
      ex = examples[rng.choice(len(examples), p=w / w.sum())]
    else:
      ex = examples[0]
    contexts.append(ex.context)
    targets.append(ex.target)
  prompt, pvalid = left_pad(contexts, s.prompt_len, s.tok.pad_id)
  target, tvalid = right_pad(targets, target_len, s.tok.pad_id)
  return SFTBatch(
    prompt_bp=prompt,
    prompt_valid_bp=pvalid,
    tokens_bt=target,
    valid_bt=tvalid,
    weight_b=np.ones(rows, np.float32),
  )


def as_policy(model_or_policy, prompt_len: int | None = None) -> Policy:
  """A bare model is the text policy on `prompt_len`-token contexts; a policy is itself."""
  if isinstance(model_or_policy, nn.Module):
    if prompt_len is None:
      raise ValueError("a model needs prompt_len to be a text policy")
    return TextPolicy(model_or_policy, prompt_len)
  return model_or_policy
