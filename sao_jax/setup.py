"""What a run is made of before it starts: the validated config, the tokenizer, the model,
the task family and its tasks, and the shapes the programs are compiled for."""

from __future__ import annotations

import dataclasses
import pathlib

from sao_jax import config as config_lib
from sao_jax import families  # noqa: F401  (registers the built-in task families)
from sao_jax.compression.memory import Compressor
from sao_jax.compression.policy import MemoryPolicy
from sao_jax.config import Config, ConfigError
from sao_jax.envs.base import Task
from sao_jax.models import hf, make_model
from sao_jax.models.transformer import TransformerLM
from sao_jax.policy import Policy, TextPolicy
from sao_jax.rl import advantages, losses, trackers  # noqa: F401  (fill the registries)
from sao_jax.rl.advantages import GROUP_ESTIMATORS
from sao_jax.rl.registry import ADVANTAGES, LOSSES
from sao_jax.tasks import TaskFamily, get_family
from sao_jax.tokenizer import Tokenizer, get_tokenizer


@dataclasses.dataclass
class Setup:
  """Everything a phase needs that does not change during the run."""

  cfg: Config
  tok: Tokenizer
  model: object  # a flax module of `sao_jax.models` (by model.arch)
  family: TaskFamily
  train: list[Task]
  test: list[Task]
  prompt_len: int
  target_len: int
  max_steps: int  # environment steps per episode (1: single-turn tasks)
  memory: MemoryPolicy | None = None  # the policy with compressed memory (compression.enabled)

  @property
  def policy(self) -> Policy:
    """The run's policy: the one with compressed memory, else the text policy of `model`.
    The one place that tells the two kinds apart."""
    return self.memory if self.memory is not None else TextPolicy(self.model, self.prompt_len)


def validate(cfg: Config) -> TaskFamily:
  """Checks what a config's own dataclasses cannot: names that registries resolve, the task
  family and its options, and what the runners can honour. Returns the task family."""
  if cfg.rl.advantage not in ADVANTAGES.names():
    raise ConfigError(f"rl.advantage {cfg.rl.advantage!r} unknown; known: {ADVANTAGES.names()}")
  if cfg.rl.loss not in LOSSES.names():
    raise ConfigError(f"rl.loss {cfg.rl.loss!r} unknown; known: {LOSSES.names()}")
  if cfg.rl.algorithm == "grpo" and cfg.rl.advantage not in GROUP_ESTIMATORS:
    raise ConfigError(
      f"rl.advantage {cfg.rl.advantage!r} is not a group estimator, which GRPO needs; "
      f"known: {', '.join(GROUP_ESTIMATORS)}"
    )
  if cfg.compression.enabled:
    _check_memory_rl(cfg)
  if cfg.eval.deferred and (cfg.distributed.num_processes > 1 or cfg.distributed.coordinator):
    raise ConfigError(
      "eval.deferred saves the parameters from one learner process, which a learner of "
      "several (distributed.*) does not hold: set eval.deferred=False"
    )
  if cfg.init_from and not pathlib.Path(cfg.init_from).is_dir():
    raise ConfigError(f"init_from {cfg.init_from!r}: no such checkpoint directory")
  if cfg.init_from and hf.is_checkpoint(cfg.init_from):
    _check_hf_init(cfg)
  return get_family(cfg.task)


def _check_hf_init(cfg: Config) -> None:
  """A Hugging Face checkpoint in `init_from` fixes the architecture: `model` must be the one
  its config.json describes (`hf.model_config`); only the fields in `hf.OVERRIDABLE` (compute
  dtype, context length, LoRA, value head, memory) are the config's own."""
  try:
    want = hf.model_config(cfg.init_from, **{k: getattr(cfg.model, k) for k in hf.OVERRIDABLE})
  except hf.CheckpointError as err:
    raise ConfigError(f"init_from {cfg.init_from!r}: {err}") from None
  diff = [
    f.name for f in dataclasses.fields(want) if getattr(want, f.name) != getattr(cfg.model, f.name)
  ]
  if diff:
    shown = ", ".join(f"model.{k}={getattr(cfg.model, k)!r} ({getattr(want, k)!r})" for k in diff)
    raise ConfigError(
      f"init_from {cfg.init_from!r} is a Hugging Face checkpoint whose config.json gives "
      f"another model ({shown}); take `model` from sao_jax.models.hf.model_config(path)"
    )


def _check_memory_rl(cfg: Config) -> None:
  """What the RL phase of the policy with compressed memory honours: GRPO sampled in the
  learner process (`runners.grpo.MemoryGroups`: one epoch, group-normalised advantages, the
  clipped surrogate with a token mean, no KL term), or SAO in sampler processes
  (`runners.memory_sao`: whole episodes per sampler call, the tracker baseline, one epoch,
  a token mean, no KL term, one learner process, no poisoned records)."""
  rl = cfg.rl
  if not (rl.steps or rl.max_seconds):
    return
  if rl.algorithm == "grpo" and rl.uses_samplers:
    raise ConfigError(
      "compression.enabled with rl.algorithm='grpo', rl.sampling='samplers': synchronous "
      "GRPO of the policy with compressed memory samples in the learner; use "
      "rl.sampling='inline' (or rl.algorithm='sao' for sampler processes)"
    )
  if rl.algorithm == "sao":
    sao = cfg.sao
    unsupported = {
      "sao.continuous": (sao.continuous, False, "its samplers play whole episodes per call"),
      "sao.baseline": (sao.baseline, "tracker", "the memory policy has no value head"),
      "rl.ppo_epochs": (rl.ppo_epochs, 1, ""),
      "rl.kl_coef": (rl.kl_coef, 0.0, ""),
      "rl.loss_agg": (rl.loss_agg, "token_mean", ""),
      "faults.poison_records": (cfg.faults.poison_records, 0, "no poisoner for its records"),
    }
    if cfg.distributed.num_processes > 1 or cfg.distributed.coordinator:
      raise ConfigError(
        "compression.enabled with rl.algorithm='sao': distributed.num_processes > 1 (or a "
        "coordinator) is not supported; the SAO learner of the memory policy runs in one process"
      )
    what = "SAO learner of the policy with compressed memory"
  else:
    unsupported = {
      "rl.loss": (rl.loss, "ppo_clip", ""),
      "rl.loss_agg": (rl.loss_agg, "token_mean", ""),
      "rl.ppo_epochs": (rl.ppo_epochs, 1, ""),
      "rl.kl_coef": (rl.kl_coef, 0.0, ""),
    }
    what = "compressed-memory GRPO update"
  for key, (value, only, why) in unsupported.items():
    if value != only:
      raise ConfigError(
        f"compression.enabled: {key}={value!r} is not supported by the {what} "
        f"(only {only!r}{': ' + why if why else ''})"
      )


def load_config(path: str, variant: str = "default", overrides: list[str] = ()) -> Config:
  """A config file's `get_config(variant)` with overrides, validated as a whole."""
  cfg = config_lib.load_config(path, variant, overrides)
  validate(cfg)
  return cfg


def make_setup(cfg: Config, tasks: tuple[list[Task], list[Task]] | None = None) -> Setup:
  """`tasks`: (train, test) already loaded for this config (a sampler gets the learner's);
  None loads them from the family."""
  family = validate(cfg)
  try:
    tok = get_tokenizer(cfg.tokenizer)
  except (ValueError, OSError) as err:
    raise ConfigError(f"tokenizer {cfg.tokenizer!r}: {err}") from None
  try:
    train, test = tasks or (family.tasks("train"), family.tasks("test"))
  except ValueError as err:  # e.g. a task space too small for the splits
    raise ConfigError(f"task family {cfg.task.family!r}: {err}") from None
  if len(test) < cfg.eval.num_problems:
    raise ConfigError(f"eval.num_problems {cfg.eval.num_problems} > the {len(test)} test tasks")
  prompt_len, target_len = family.budget(train + test, tok)
  if prompt_len + max(target_len, cfg.rl.max_new_tokens) > cfg.model.max_len:
    raise ConfigError(
      f"model.max_len {cfg.model.max_len} < prompt {prompt_len} + completion "
      f"{max(target_len, cfg.rl.max_new_tokens)} tokens"
    )
  if cfg.rl.max_new_tokens < target_len:
    raise ConfigError(
      f"rl.max_new_tokens {cfg.rl.max_new_tokens} cannot hold the longest "
      f"solution ({target_len} tokens with EOS)"
    )
  n_val = cfg.recovery.val_problems if cfg.recovery.shadow_every else 0
  if cfg.rl.uses_samplers and n_val >= len(train):
    raise ConfigError(
      f"recovery.val_problems {n_val} >= the {len(train)} training tasks (the "
      "SAO learner validates its shadow models on the tail of the train split)"
    )
  max_steps = family.max_steps(tok)
  c = cfg.compression
  if c.enabled and prompt_len != c.window:
    raise ConfigError(
      f"compression.window {c.window} != the {prompt_len}-token raw window the "
      "task family's rows are built for (its budget)"
    )
  if (
    max_steps > 1
    and cfg.rl.algorithm == "grpo"
    and (cfg.rl.steps or cfg.rl.max_seconds)
    and not c.enabled
  ):
    # (the synchronous learner's batches hold one row per trajectory)
    raise ConfigError(
      f"task family {cfg.task.family!r} has episodes of up to {max_steps} "
      "steps; rl.algorithm='grpo' samples one step per task (use 'sao')"
    )
  if cfg.model.vocab_size and cfg.model.vocab_size < tok.vocab_size:
    raise ConfigError(
      f"model.vocab_size {cfg.model.vocab_size} < the tokenizer's "
      f"{tok.vocab_size} (0: take the tokenizer's)"
    )
  model_cfg = dataclasses.replace(cfg.model, vocab_size=cfg.model.vocab_size or tok.vocab_size)
  model = make_model(model_cfg)
  memory = None
  if c.enabled:
    if not isinstance(model, TransformerLM):
      raise ConfigError(
        f"compression.enabled needs model.arch 'gpt' (its memory prefix "
        f"slots), not {cfg.model.arch!r}"
      )
    memory = MemoryPolicy(model, Compressor(c, model_cfg.vocab_size))
  return Setup(
    cfg=cfg,
    tok=tok,
    model=model,
    family=family,
    train=train,
    test=test,
    prompt_len=prompt_len,
    target_len=target_len,
    max_steps=max_steps,
    memory=memory,
  )
