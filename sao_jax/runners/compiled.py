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

from sao_jax import distributed, sampling, seqpack, sharding
from sao_jax import slots as slots_lib
from sao_jax.config import Config, ConfigError
from sao_jax.learner import init_state_fn
from sao_jax.models.transformer import TransformerLM
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
  # The policy with compressed memory (`compile_memory_sampler`): sample and greedy take
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
  model: TransformerLM | None,
  tx,
  update_fn,
  *,
  with_ref: bool,
  prompt_len: int,
  mesh: jax.sharding.Mesh | None = None,
  num_tasks: int = 0,
  init_fn: Callable | None = None,
) -> LearnerPrograms:
  """init and update (state donated) with the state sharded by the logical-axis rules and
  every batch field split over the batch axis. `init_fn` (rng -> TrainState with logically
  annotated params) replaces the model's own (`learner.init_state_fn`), e.g. for the policy
  with compressed memory."""
  mesh = mesh or sharding.make_mesh(cfg.mesh)
  rules = cfg.mesh.rules
  init_boxed = init_fn or init_state_fn(model, tx, prompt_len, with_ref, num_tasks)
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


def param_shapes(model, length: int = 1):
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


def compile_sampler(
  cfg: Config,
  model: TransformerLM,
  *,
  prompt_len: int,
  max_new_tokens: int,
  temperature: float,
  eos_id: int,
  pad_id: int,
  mesh: jax.sharding.Mesh | None = None,
) -> SamplerPrograms:
  """sample and greedy over a batch of rows, params sharded like the learner's."""
  mesh = mesh or sharding.make_mesh(cfg.mesh)
  rules = cfg.mesh.rules
  boxed = param_shapes(model, prompt_len)
  params_sh = sharding.logical_shardings(boxed, mesh, rules)
  batch_sh = sharding.batch_sharding(mesh, rules)
  repl = sharding.replicated(mesh)

  def sampler(greedy):
    fn = functools.partial(
      sampling.sample,
      model,
      max_new_tokens=max_new_tokens,
      eos_id=eos_id,
      pad_id=pad_id,
      temperature=temperature,
      greedy=greedy,
    )
    return _across_processes(
      jax.jit(
        _with_rules(fn, rules),
        in_shardings=(params_sh, batch_sh, batch_sh, repl),
        out_shardings=batch_sh,
      ),
      batch_sh,
    )

  return SamplerPrograms(
    mesh=mesh,
    params_sharding=params_sh,
    abstract_params=nn.meta.unbox(boxed),
    sample=sampler(False),
    greedy=sampler(True),
    batch_divisor=sharding.batch_divisor(mesh, rules),
  )


def _across_processes(sample, batch_sh):
  """With several processes, `sample(params, prompt, prompt_valid, rng)` as callers use it in
  one: host prompt arrays (the same in every process; each feeds its own rows) in, the whole
  output on the host out (gathered: every process must make the same call)."""
  if jax.process_count() == 1:
    return sample

  @functools.wraps(sample)
  def wrapped(params, prompt, prompt_valid, rng):
    prompt, prompt_valid = sharding.put_batch((prompt, prompt_valid), batch_sh)
    return distributed.host_value(sample(params, prompt, prompt_valid, rng))

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
  model: TransformerLM,
  tx,
  update_fn,
  *,
  with_ref: bool,
  prompt_len: int,
  max_new_tokens: int,
  temperature: float,
  eos_id: int,
  pad_id: int,
  mesh: jax.sharding.Mesh | None = None,
  num_tasks: int = 0,
) -> Programs:
  mesh = mesh or sharding.make_mesh(cfg.mesh)
  learner = compile_learner(
    cfg,
    model,
    tx,
    update_fn,
    with_ref=with_ref,
    prompt_len=prompt_len,
    mesh=mesh,
    num_tasks=num_tasks,
  )
  smp = compile_sampler(
    cfg,
    model,
    prompt_len=prompt_len,
    max_new_tokens=max_new_tokens,
    temperature=temperature,
    eos_id=eos_id,
    pad_id=pad_id,
    mesh=mesh,
  )
  return Programs(
    **{f.name: getattr(learner, f.name) for f in dataclasses.fields(learner)},
    sample=smp.sample,
    greedy=smp.greedy,
  )


def compile_memory_sampler(
  cfg: Config,
  policy,
  *,
  max_new_tokens: int,
  temperature: float,
  eos_id: int,
  pad_id: int,
  mesh: jax.sharding.Mesh | None = None,
) -> SamplerPrograms:
  """`compile_sampler` for a `compression.policy.MemoryPolicy`: sample and greedy condition
  on the slots' banks, and compress runs all three stages (encoder, LSTM filter, INT8) in one
  jitted call. Params sharded like the learner's, streams split over the batch axis."""
  mesh = mesh or sharding.make_mesh(cfg.mesh)
  rules = cfg.mesh.rules
  boxed = jax.eval_shape(policy.init, jax.random.key(0))
  params_sh = sharding.logical_shardings(boxed, mesh, rules)
  batch_sh = sharding.batch_sharding(mesh, rules)
  repl = sharding.replicated(mesh)

  def sampler(method, greedy, n_batch=3):
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

  cached = {}
  if policy.shares_bank():
    cached = dict(
      sample_cached=sampler(policy.sample_cached, False, 4),
      greedy_cached=sampler(policy.sample_cached, True, 4),
      empty_memory_cache=jax.jit(
        policy.empty_memory_cache, static_argnums=0, out_shardings=batch_sh
      ),
    )
  return SamplerPrograms(
    **cached,
    mesh=mesh,
    params_sharding=params_sh,
    abstract_params=nn.meta.unbox(boxed),
    sample=sampler(policy.sample, False),
    greedy=sampler(policy.sample, True),
    batch_divisor=sharding.batch_divisor(mesh, rules),
    compress=jax.jit(
      _with_rules(policy.compress, rules),
      in_shardings=(params_sh,) + (batch_sh,) * 7,
      out_shardings=batch_sh,
    ),
    empty_streams=jax.jit(policy.empty_streams, static_argnums=0, out_shardings=batch_sh),
  )


def compile_memory_programs(
  cfg: Config,
  policy,
  tx,
  update_fn,
  *,
  max_new_tokens: int,
  temperature: float,
  eos_id: int,
  pad_id: int,
  mesh: jax.sharding.Mesh | None = None,
) -> Programs:
  """Learner (`compile_learner` with the policy's state) and sampler
  (`compile_memory_sampler`) of the policy with compressed memory."""
  mesh = mesh or sharding.make_mesh(cfg.mesh)
  learner = compile_learner(
    cfg,
    None,
    tx,
    update_fn,
    with_ref=False,
    prompt_len=0,
    mesh=mesh,
    init_fn=policy.init_state_fn(tx),
  )
  smp = compile_memory_sampler(
    cfg,
    policy,
    max_new_tokens=max_new_tokens,
    temperature=temperature,
    eos_id=eos_id,
    pad_id=pad_id,
    mesh=mesh,
  )
  return Programs(
    **{f.name: getattr(learner, f.name) for f in dataclasses.fields(learner)},
    sample=smp.sample,
    greedy=smp.greedy,
    compress=smp.compress,
    empty_streams=smp.empty_streams,
    sample_cached=smp.sample_cached,
    greedy_cached=smp.greedy_cached,
    empty_memory_cache=smp.empty_memory_cache,
  )
