"""The one place where `jax.jit` is applied, with explicit shardings and donation.

Library code (model, sampler, learner) stays pure; this module binds it to a mesh.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import flax.linen as nn
import jax

from sao_jax import sampling, sharding
from sao_jax.config import Config
from sao_jax.learner import TrainState, init_state_fn
from sao_jax.models.transformer import TransformerLM


@dataclasses.dataclass
class Programs:
  """Jitted functions of one training phase, all on `mesh`."""

  mesh: jax.sharding.Mesh
  state_sharding: TrainState
  batch_sharding: jax.sharding.NamedSharding
  init: Callable[[jax.Array], TrainState]
  update: Callable[[TrainState, dict], tuple[TrainState, dict]]
  sample: Callable  # (params, prompt, prompt_valid, rng) -> SampleOutput
  greedy: Callable  # (params, prompt, prompt_valid, rng) -> SampleOutput
  batch_divisor: int

  def shard_batch(self, batch: dict) -> dict:
    return jax.device_put(batch, self.batch_sharding)


def _with_rules(fn, rules):
  @functools.wraps(fn)
  def wrapped(*args):
    with nn.logical_axis_rules(list(rules)):
      return fn(*args)
  return wrapped


def compile_programs(cfg: Config, model: TransformerLM, tx, update_fn, *, with_ref: bool,
                     prompt_len: int, max_new_tokens: int, temperature: float,
                     eos_id: int, pad_id: int, mesh: jax.sharding.Mesh | None = None,
                     num_tasks: int = 0) -> Programs:
  mesh = mesh or sharding.make_mesh(cfg.mesh)
  rules = cfg.mesh.rules
  init_boxed = init_state_fn(model, tx, prompt_len, with_ref, num_tasks)
  abstract = jax.eval_shape(init_boxed, jax.random.key(0))
  state_sh = sharding.logical_shardings(abstract, mesh, rules)
  batch_sh = sharding.batch_sharding(mesh, rules)
  repl = sharding.replicated(mesh)

  init = jax.jit(lambda rng: nn.meta.unbox(init_boxed(rng)), out_shardings=state_sh)
  update = jax.jit(_with_rules(update_fn, rules), in_shardings=(state_sh, batch_sh),
                   out_shardings=(state_sh, repl), donate_argnums=(0,))

  def sampler(greedy):
    fn = functools.partial(sampling.sample, model, max_new_tokens=max_new_tokens, eos_id=eos_id,
                           pad_id=pad_id, temperature=temperature, greedy=greedy)
    return jax.jit(_with_rules(fn, rules), in_shardings=(state_sh.params, batch_sh, batch_sh, repl),
                   out_shardings=batch_sh)

  return Programs(mesh=mesh, state_sharding=state_sh, batch_sharding=batch_sh, init=init,
                  update=update, sample=sampler(False), greedy=sampler(True),
                  batch_divisor=sharding.batch_divisor(mesh, rules))


@dataclasses.dataclass
class MemoryPrograms:
  """Jitted programs of the long-horizon policy with compressed memory (sao_jax.compression).

  `compress` is the sampler's one jitted function with all three stages (encoder, LSTM
  filter, INT8) for the step every slot just took; `sample`/`greedy` condition on the banks.
  """

  mesh: jax.sharding.Mesh
  init: Callable[[jax.Array], TrainState]
  update: Callable[[TrainState, dict], tuple[TrainState, dict]]
  sample: Callable  # (params, streams, prompt, prompt_valid, rng) -> SampleOutput
  greedy: Callable
  compress: Callable  # (params, streams, seg, seg_valid, reward, boundary, last, active)


def compile_memory_programs(cfg: Config, policy, tx, update_fn, *, max_new_tokens: int,
                            temperature: float, eos_id: int, pad_id: int,
                            mesh: jax.sharding.Mesh | None = None) -> MemoryPrograms:
  """Parameters replicated, everything with a leading batch/slot axis split over 'batch'."""
  mesh = mesh or sharding.make_mesh(cfg.mesh)
  rules = cfg.mesh.rules
  repl = sharding.replicated(mesh)
  batch_sh = sharding.batch_sharding(mesh, rules)

  def init_fn(rng):
    params = nn.meta.unbox(policy.init(rng))
    return TrainState(step=jax.numpy.zeros((), jax.numpy.int32), params=params,
                      opt_state=tx.init(params), rng=rng)

  def sampler(greedy):
    fn = functools.partial(policy.sample, max_new_tokens=max_new_tokens, eos_id=eos_id,
                           pad_id=pad_id, temperature=temperature, greedy=greedy)
    return jax.jit(_with_rules(fn, rules), in_shardings=(repl, batch_sh, batch_sh, batch_sh, repl),
                   out_shardings=batch_sh)

  return MemoryPrograms(
      mesh=mesh, init=jax.jit(init_fn, out_shardings=repl),
      update=jax.jit(_with_rules(update_fn, rules), in_shardings=(repl, batch_sh),
                     out_shardings=(repl, repl), donate_argnums=(0,)),
      sample=sampler(False), greedy=sampler(True),
      compress=jax.jit(_with_rules(policy.compress, rules),
                       in_shardings=(repl,) + (batch_sh,) * 7, out_shardings=batch_sh))


def compile_full_context_programs(cfg: Config, model: TransformerLM, tx, update_fn, *,
                                  prompt_len: int, max_new_tokens: int, temperature: float,
                                  eos_id: int, pad_id: int, mesh: jax.sharding.Mesh | None = None
                                  ) -> MemoryPrograms:
  """The full-context control of `compile_memory_programs` (no memory; `compress` is None)."""
  mesh = mesh or sharding.make_mesh(cfg.mesh)
  rules = cfg.mesh.rules
  repl = sharding.replicated(mesh)
  batch_sh = sharding.batch_sharding(mesh, rules)
  init_boxed = init_state_fn(model, tx, prompt_len, with_ref=False)

  def sampler(greedy):
    fn = functools.partial(sampling.sample, model, max_new_tokens=max_new_tokens, eos_id=eos_id,
                           pad_id=pad_id, temperature=temperature, greedy=greedy)
    return jax.jit(_with_rules(fn, rules), in_shardings=(repl, batch_sh, batch_sh, repl),
                   out_shardings=batch_sh)

  return MemoryPrograms(
      mesh=mesh, init=jax.jit(lambda rng: nn.meta.unbox(init_boxed(rng)), out_shardings=repl),
      update=jax.jit(_with_rules(update_fn, rules), in_shardings=(repl, batch_sh),
                     out_shardings=(repl, repl), donate_argnums=(0,)),
      sample=sampler(False), greedy=sampler(True), compress=None)
