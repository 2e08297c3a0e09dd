"""The one place where `jax.jit` is applied, with explicit shardings and donation.

Library code (model, sampler, learner) stays pure; this module binds it to a mesh.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax

from sao_jax import distributed, seqpack, sharding
from sao_jax import slots as slots_lib
from sao_jax.compression.policy import MemoryPolicy
from sao_jax.config import Config, ConfigError
from sao_jax.models.transformer import TransformerLM
from sao_jax.policy import as_policy
from sao_jax.state import TrainState, tree_digest


@dataclasses.dataclass
class LearnerPrograms:
  """The learner's jitted functions of one training phase, all on `mesh`."""

  mesh: jax.sharding.Mesh
  state_sharding: TrainState
  batch_sharding: jax.sharding.NamedSharding
  init: Callable[[jax.Array], TrainState]
  update: Callable[[TrainState, Any], tuple[TrainState, dict]]
  batch_divisor: int
  digest: Callable[[Any], jax.Array]  # params -> uint32 fingerprint of their bits (replay)
  packer: seqpack.Packer | None = None  # learner.pack='on': packs each text batch first

  def shard_batch(self, batch, *, local: bool = False):
    """The batch (packed, with learner.pack='on') split over the batch axis; with several
    processes, `local` says the batch holds only this process's rows (`process_rows`), else
    each process keeps its own."""
    if self.packer is not None:
      batch = self.packer(batch)
    return sharding.put_batch(batch, self.batch_sharding, local=local)

  def process_rows(self, rows: int) -> slice:
    """The rows of a `rows`-row global batch that this process feeds."""
    return sharding.process_rows(self.batch_sharding, rows)


@dataclasses.dataclass
class SamplerPrograms:
  """The sampler's jitted functions: what a sampler process and evaluation build."""

  mesh: jax.sharding.Mesh
  params_sharding: Any
  abstract_params: Any  # shapes and dtypes of the params (what published files unflatten to)
  sample: Callable  # (params, prompt, prompt_valid, rng) -> SampleOutput
  greedy: Callable  # (params, prompt, prompt_valid, rng) -> SampleOutput
  batch_divisor: int
  # Continuous batching (sao_jax.slots), built by `compile_slots`:
  fill: Callable | None = None  # (params, slots, prompt_rp, prompt_valid_rp, slot_r) -> slots
  decode: Callable | None = None  # (params, slots, version, rng, min_done) -> slots
  refresh: Callable | None = None  # (params, slots) -> slots, caches under new params
  empty_slots: Callable | None = None  # () -> an empty slot state
  # The policy with compressed memory (`compile_sampler` of a MemoryPolicy): sample and greedy take
  # (params, streams, prompt, prompt_valid, rng), and compress runs the three stages on the
  # step each slot just took: (params, streams, seg, seg_valid, reward, boundary, last,
  # active) -> streams; empty_streams(n) the streams of n slots, sharded as compress returns
  # them (so that the programs compile once, not again for a first call's layout).
  compress: Callable | None = None
  empty_streams: Callable | None = None
  # A policy whose bank is append-only and all visible (`MemoryPolicy.shares_bank`) also
  # gets sample/greedy that keep the memory's keys and values between steps:
  # (params, streams, cache, prompt, prompt_valid, rng) -> (SampleOutput, cache), and
  # empty_memory_cache(n) (`MemoryPolicy.update_memory_cache`).
  sample_cached: Callable | None = None
  greedy_cached: Callable | None = None
  empty_memory_cache: Callable | None = None


@dataclasses.dataclass
class Programs(LearnerPrograms):
  """Both halves, for a runner that trains and evaluates in one process."""

  sample: Callable = None
  greedy: Callable = None
  compress: Callable | None = None
  empty_streams: Callable | None = None
  sample_cached: Callable | None = None
  greedy_cached: Callable | None = None
  empty_memory_cache: Callable | None = None


def _with_rules(fn, rules):
  @functools.wraps(fn)
  def wrapped(*args):
    with nn.logical_axis_rules(list(rules)):
      return fn(*args)

  return wrapped


def compile_learner(
  cfg: Config,
  policy,
  tx,
  update_fn,
  *,
  with_ref: bool = False,
  prompt_len: int | None = None,
  mesh: jax.sharding.Mesh | None = None,
  num_tasks: int = 0,
) -> LearnerPrograms:
  """init and update (state donated) of `policy` (a `sao_jax.policy.Policy`, or a model: the
  text policy on `prompt_len`-token contexts) with the state sharded by the logical-axis rules
  and every batch field split over the batch axis."""
  policy = as_policy(policy, prompt_len)
  mesh = mesh or sharding.make_mesh(cfg.mesh)
  rules = cfg.mesh.rules
  init_boxed = policy.init_state_fn(tx, with_ref=with_ref, num_tasks=num_tasks)
  abstract = jax.eval_shape(init_boxed, jax.random.key(0))
  state_sh = sharding.logical_shardings(abstract, mesh, rules)
  batch_sh = sharding.batch_sharding(mesh, rules)
  repl = sharding.replicated(mesh)
  return LearnerPrograms(
    mesh=mesh,
    state_sharding=state_sh,
    batch_sharding=batch_sh,
    init=jax.jit(lambda rng: nn.meta.unbox(init_boxed(rng)), out_shardings=state_sh),
    update=jax.jit(
      _with_rules(update_fn, rules),
      in_shardings=(state_sh, batch_sh),
      out_shardings=(state_sh, repl),
      donate_argnums=(0,),
    ),
    batch_divisor=sharding.batch_divisor(mesh, rules),
    digest=jax.jit(tree_digest, in_shardings=(state_sh.params,), out_shardings=repl),
    packer=make_packer(cfg, mesh) if cfg.learner.pack == "on" else None,
  )


def make_packer(cfg: Config, mesh: jax.sharding.Mesh) -> seqpack.Packer:
  """The packer of `cfg.learner`'s settings on `mesh` (whether or not learner.pack is on):
  packed rows a multiple of learner.pack_bucket and of the mesh's batch divisor."""
  if jax.process_count() > 1:
    raise ConfigError(
      "learner.pack='on' packs rows over the whole batch, which one learner process of "
      f"{jax.process_count()} does not hold: set learner.pack=off"
    )
  bucket = math.lcm(cfg.learner.pack_bucket, sharding.batch_divisor(mesh, cfg.mesh.rules))
  return seqpack.Packer(bucket, cfg.learner.pack_factor)


def compile_sampler(
  cfg: Config,
  policy,
  *,
  prompt_len: int | None = None,
  max_new_tokens: int,
  temperature: float,
  eos_id: int,
  pad_id: int,
  mesh: jax.sharding.Mesh | None = None,
) -> SamplerPrograms:
  """sample and greedy of `policy` (a `sao_jax.policy.Policy`, or a model: the text policy on
  `prompt_len`-token contexts) over a batch of rows, params sharded like the learner's. The
  policy with compressed memory also gets compress, which runs all three stages (encoder,
  LSTM filter, INT8) in one call, and empty_streams; with an append-only, all-visible bank
  the cached sample and greedy too. Streams are split over the batch axis."""
  policy = as_policy(policy, prompt_len)
  mesh = mesh or sharding.make_mesh(cfg.mesh)
  rules = cfg.mesh.rules
  boxed = policy.param_shapes()
  params_sh = sharding.logical_shardings(boxed, mesh, rules)
  batch_sh = sharding.batch_sharding(mesh, rules)
  repl = sharding.replicated(mesh)

  def sampler(method, greedy, n_batch=policy.sample_inputs):
    """`method` jitted: params, then `n_batch` batch-split arguments, then the rng."""
    fn = functools.partial(
      method,
      max_new_tokens=max_new_tokens,
      eos_id=eos_id,
      pad_id=pad_id,
      temperature=temperature,
      greedy=greedy,
    )
    return jax.jit(
      _with_rules(fn, rules),
      in_shardings=(params_sh,) + (batch_sh,) * n_batch + (repl,),
      out_shardings=batch_sh,
    )

  progs = SamplerPrograms(
    mesh=mesh,
    params_sharding=params_sh,
    abstract_params=nn.meta.unbox(boxed),
    sample=_across_processes(sampler(policy.sample, False), batch_sh),
    greedy=_across_processes(sampler(policy.sample, True), batch_sh),
    batch_divisor=sharding.batch_divisor(mesh, rules),
  )
  if not isinstance(policy, MemoryPolicy):
    return progs
  if policy.shares_bank():
    progs = dataclasses.replace(
      progs,
      sample_cached=sampler(policy.sample_cached, False, 4),
      greedy_cached=sampler(policy.sample_cached, True, 4),
      empty_memory_cache=jax.jit(
        policy.empty_memory_cache, static_argnums=0, out_shardings=batch_sh
      ),
    )
  return dataclasses.replace(
    progs,
    compress=jax.jit(
      _with_rules(policy.compress, rules),
      in_shardings=(params_sh,) + (batch_sh,) * 7,
      out_shardings=batch_sh,
    ),
    empty_streams=jax.jit(policy.empty_streams, static_argnums=0, out_shardings=batch_sh),
  )


def _across_processes(sample, batch_sh):
  """With several processes, `sample(params, *inputs, rng)` as callers use it in one: host
  input arrays (the same in every process; each feeds its own rows) in, the whole output on
  the host out (gathered: every process must make the same call)."""
  if jax.process_count() == 1:
    return sample

  @functools.wraps(sample)
  def wrapped(params, *inputs_and_rng):
    *inputs, rng = inputs_and_rng
    inputs = sharding.put_batch(tuple(inputs), batch_sh)
    return distributed.host_value(sample(params, *inputs, rng))

  return wrapped


def compile_slots(
  cfg: Config,
  model: TransformerLM,
  progs: SamplerPrograms,
  *,
  slots: int,
  prompt_len: int,
  max_new_tokens: int,
  temperature: float,
  eos_id: int,
  pad_id: int,
) -> SamplerPrograms:
  """`progs` with the continuous-batching programs over `slots` rows: fill (its prompt
  rows replicated) and decode, the slot state split over the batch axis and donated."""
  rules, mesh = cfg.mesh.rules, progs.mesh
  batch_sh = sharding.batch_sharding(mesh, rules)
  repl = sharding.replicated(mesh)
  fill = functools.partial(slots_lib.fill, model, pad_id=pad_id)
  decode = functools.partial(
    slots_lib.decode, model, eos_id=eos_id, pad_id=pad_id, temperature=temperature
  )

  def decode_fn(params, state, version, rng, min_done):
    return decode(params, state, version, rng, min_done=min_done)

  empty = jax.jit(
    lambda: slots_lib.empty(model, slots, prompt_len, max_new_tokens, pad_id),
    out_shardings=batch_sh,
  )
  return dataclasses.replace(
    progs,
    empty_slots=empty,
    refresh=jax.jit(
      _with_rules(functools.partial(slots_lib.refresh, model), rules),
      in_shardings=(progs.params_sharding, batch_sh),
      out_shardings=batch_sh,
      donate_argnums=(1,),
    ),
    fill=jax.jit(
      _with_rules(fill, rules),
      in_shardings=(progs.params_sharding, batch_sh, repl, repl, repl),
      out_shardings=batch_sh,
      donate_argnums=(1,),
    ),
    decode=jax.jit(
      _with_rules(decode_fn, rules),
      in_shardings=(progs.params_sharding, batch_sh, repl, repl, repl),
      out_shardings=batch_sh,
      donate_argnums=(1,),
    ),
  )


def compile_programs(
  cfg: Config,
  policy,
  tx,
  update_fn,
  *,
  with_ref: bool = False,
  prompt_len: int | None = None,
  max_new_tokens: int,
  temperature: float,
  eos_id: int,
  pad_id: int,
  mesh: jax.sharding.Mesh | None = None,
  num_tasks: int = 0,
) -> Programs:
  """Learner (`compile_learner`) and sampler (`compile_sampler`) of `policy` on one mesh."""
  policy = as_policy(policy, prompt_len)
  mesh = mesh or sharding.make_mesh(cfg.mesh)
  learner = compile_learner(
    cfg, policy, tx, update_fn, with_ref=with_ref, mesh=mesh, num_tasks=num_tasks
  )
  smp = compile_sampler(
    cfg,
    policy,
    max_new_tokens=max_new_tokens,
    temperature=temperature,
    eos_id=eos_id,
    pad_id=pad_id,
    mesh=mesh,
  )
  return programs_of(learner, smp)


def programs_of(learner: LearnerPrograms, smp: SamplerPrograms) -> Programs:
  """One `Programs` of a learner and a sampler compiled on the same mesh."""
  own = {f.name for f in dataclasses.fields(LearnerPrograms)}
  return Programs(
    **{f.name: getattr(learner, f.name) for f in dataclasses.fields(learner)},
    **{f.name: getattr(smp, f.name) for f in dataclasses.fields(Programs) if f.name not in own},
  )
