"""Typed, self-validating run configuration.

A config is a tree of frozen dataclasses. Experiment configs are Python files that define
``get_config(variant: str = "default") -> Config``; command-line overrides use dotted keys
(``--set rl.lr=1e-4``). Unknown keys and ill-typed values are errors, never ignored.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import importlib.util
import json
import math
import pathlib
import typing
from typing import Any, Literal

from sao_jax import storage


class ConfigError(ValueError):
  """A config key or value is wrong; the message says which."""


def _check(ok: bool, msg: str):
  if not ok:
    raise ConfigError(msg)


@functools.cache
def _choices(cls) -> dict[str, tuple]:
  """{field: its allowed values} for the `Literal`-typed fields of a config class."""
  hints = typing.get_type_hints(cls)
  return {k: typing.get_args(h) for k, h in hints.items() if typing.get_origin(h) is Literal}


def _check_choices(cfg, prefix: str) -> None:
  """The one check of enum-like settings: every `Literal`-typed field of the section `cfg`
  (named `prefix`, e.g. "rl.") holds one of its values."""
  for name, known in _choices(type(cfg)).items():
    v = getattr(cfg, name)
    _check(v in known, f"{prefix}{name} {v!r} unknown; known: {', '.join(map(str, known))}")


def _check_finite(cfg, prefix: str = "") -> None:
  """Every float in the tree is finite (NaN passes no range check by accident here)."""
  for f in dataclasses.fields(cfg):
    v = getattr(cfg, f.name)
    if dataclasses.is_dataclass(v):
      _check_finite(v, f"{prefix}{f.name}.")
    elif isinstance(v, float):
      _check(math.isfinite(v), f"{prefix}{f.name} must be finite, got {v}")
    elif isinstance(v, int) and not isinstance(v, bool):  # sizes, steps, ids: int32 on device
      _check(-(2**31) <= v < 2**31, f"{prefix}{f.name} {v} does not fit in int32")


# Logical axis -> mesh axis rules: model code names only logical axes; the mapping is config.
DEFAULT_RULES: tuple[tuple[str, Any], ...] = (
  ("batch", ("data", "fsdp")),
  ("embed", "fsdp"),
  ("heads", "tensor"),
  ("kv_heads", "tensor"),
  ("kv", None),
  ("mlp", "tensor"),
  ("vocab", "tensor"),
  ("length", None),
  ("act_embed", None),
  ("norm", None),
)

# Projections that can carry LoRA adapters (model.lora_targets), by their parameter names.
LORA_TARGETS = ("query", "key", "value", "out", "gate", "up", "down")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Decoder-only transformer. `vocab_size` 0 means: take it from the tokenizer.

  `arch` picks the family: "gpt" (sao_jax.models.transformer: learned positions, GELU MLP,
  tied embeddings) or "llama" (sao_jax.models.llama, the Llama/Qwen2 layout: rotary
  positions with base `rope_theta`, SwiGLU MLP of hidden size `mlp_dim`, grouped-query
  attention with `kv_heads` key/value heads, optional q/k/v biases, tied or untied
  embeddings, RMSNorm epsilon `norm_eps`, optional LoRA adapters of rank `lora_rank` on the
  `lora_targets` projections, scaled by lora_alpha / lora_rank). The llama-only fields must
  keep their defaults with "gpt".

  `dtype` is the compute dtype; parameters are float32 either way (the optimizer's master
  copy), cast to `dtype` where they are used. Attention softmax and norm statistics run in
  float32; the unembedding runs in `dtype` and its logits are returned as float32.
  """

  vocab_size: int = 0
  width: int = 128
  depth: int = 2
  heads: int = 4
  mlp_ratio: int = 4
  max_len: int = 128
  memory_slots: int = 0
  memory_dim: int = 0
  value_head: bool = False  # a scalar head on the final hidden state (SAO's learned baseline)
  dtype: Literal["float32", "bfloat16"] = "float32"
  arch: Literal["gpt", "llama"] = "gpt"
  kv_heads: int = 0  # 0: as many as `heads` (plain multi-head attention)
  mlp_dim: int = 0  # 0: width * mlp_ratio
  rope_theta: float = 10000.0
  tie_embeddings: bool = True
  qkv_bias: bool = False
  norm_eps: float = 1e-6
  lora_rank: int = 0  # 0: no adapters
  lora_alpha: float = 16.0
  lora_targets: tuple[str, ...] = LORA_TARGETS

  def __post_init__(self):
    _check(
      self.width > 0 and self.depth > 0 and self.heads > 0 and self.mlp_ratio > 0,
      "model.width, depth, heads and mlp_ratio must be positive",
    )
    _check(self.vocab_size >= 0, "model.vocab_size must be >= 0 (0: the tokenizer's)")
    _check(
      self.width % self.heads == 0, f"model.width {self.width} not divisible by heads {self.heads}"
    )
    _check(self.max_len > 0, "model.max_len must be positive")
    _check(self.memory_slots >= 0 and self.memory_dim >= 0, "memory sizes must be >= 0")
    _check_choices(self, "model.")
    _check(
      self.kv_heads >= 0 and self.mlp_dim >= 0 and self.lora_rank >= 0,
      "model.kv_heads, mlp_dim and lora_rank must be >= 0",
    )
    _check(
      self.heads % self.n_kv_heads == 0,
      f"model.heads {self.heads} not divisible by kv_heads {self.n_kv_heads}",
    )
    _check(
      self.rope_theta > 0 and self.norm_eps > 0 and self.lora_alpha > 0,
      "model.rope_theta, norm_eps and lora_alpha must be > 0",
    )
    _check(
      set(self.lora_targets) <= set(LORA_TARGETS)
      and len(set(self.lora_targets)) == len(self.lora_targets),
      f"model.lora_targets {self.lora_targets} must be distinct names from {LORA_TARGETS}",
    )
    _check(not self.lora_rank or self.lora_targets, "model.lora_rank > 0 needs lora_targets")
    if self.arch == "llama":
      _check(
        self.head_dim % 2 == 0,
        f"model.arch='llama' needs an even head dim (rotary "
        f"pairs), got width / heads = {self.head_dim}",
      )
    else:
      defaults = ModelConfig.__dataclass_fields__
      changed = [
        f
        for f in (
          "kv_heads",
          "mlp_dim",
          "rope_theta",
          "tie_embeddings",
          "qkv_bias",
          "norm_eps",
          "lora_rank",
        )
        if getattr(self, f) != defaults[f].default
        and not (f == "kv_heads" and self.kv_heads == self.heads)
      ]
      _check(not changed, f"model.{', model.'.join(changed)} only apply to arch='llama'")

  @property
  def n_kv_heads(self) -> int:
    return self.kv_heads or self.heads

  @property
  def head_dim(self) -> int:
    return self.width // self.heads

  @property
  def ffn_dim(self) -> int:
    return self.mlp_dim or self.width * self.mlp_ratio


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """Device mesh. One axis may be -1 (takes the remaining devices)."""

  axes: tuple[str, ...] = ("data", "fsdp", "tensor")
  shape: tuple[int, ...] = (-1, 1, 1)
  rules: tuple[tuple[str, Any], ...] = DEFAULT_RULES

  def __post_init__(self):
    _check(len(self.axes) == len(self.shape), "mesh.axes and mesh.shape differ in length")
    _check(
      len(set(self.axes)) == len(self.axes) and all(self.axes),
      f"mesh.axes {self.axes} must be distinct non-empty names",
    )
    _check(
      all(isinstance(s, int) and not isinstance(s, bool) for s in self.shape),
      f"mesh.shape {self.shape} must hold integers",
    )
    _check(sum(s == -1 for s in self.shape) <= 1, "at most one mesh axis may be -1")
    _check(all(s == -1 or s > 0 for s in self.shape), f"bad mesh.shape {self.shape}")


@dataclasses.dataclass(frozen=True)
class TaskConfig:
  """Which tasks: a family by name (see sao_jax.tasks: "arithmetic", "longhorizon", or a
  user's `package.module:Class` / `path/to/file.py:Class`), its split sizes and seed, and its
  parameters: the arithmetic family's are the fields below; any other family's go in
  `options` as (key, value) pairs (`--set task.options.n_steps=64`), checked against the
  family's Options dataclass when the run is set up."""

  family: str = "arithmetic"
  options: tuple[tuple[str, Any], ...] = ()
  n_ops: int = 2
  n_ops_mix: tuple[int, ...] = ()  # if set: equal parts of each n_ops (variable lengths)
  max_operand: int = 9
  ops: str = "+-"
  reverse_digits: bool = False
  num_train: int = 20000
  num_test: int = 500
  seed: int = 0
  data_dir: str = ""

  def __post_init__(self):
    _check(bool(self.family), "task.family must name a task family")
    _check(self.num_train > 0 and self.num_test > 0, "task sizes must be positive")
    _check(self.seed >= 0, f"task.seed must be >= 0, got {self.seed}")
    _check(
      all(isinstance(kv, tuple) and len(kv) == 2 and isinstance(kv[0], str) for kv in self.options),
      "task.options must be (key, value) pairs",
    )


@dataclasses.dataclass(frozen=True)
class OptimConfig:
  lr: float = 1e-3
  warmup_steps: int = 50
  weight_decay: float = 0.0
  grad_clip: float = 1.0
  b2: float = 0.98

  def check(self, where: str) -> None:
    """Validates the fields; `where` is the section's dotted name (sft.optim, rl.optim)."""
    _check(self.lr > 0, f"{where}.lr must be > 0, got {self.lr}")
    _check(self.warmup_steps >= 0, f"{where}.warmup_steps must be >= 0")
    _check(self.weight_decay >= 0, f"{where}.weight_decay must be >= 0")
    _check(self.grad_clip > 0, f"{where}.grad_clip must be > 0 (the global-norm bound)")
    _check(0 < self.b2 < 1, f"{where}.b2 must be in (0, 1), got {self.b2}")


@dataclasses.dataclass(frozen=True)
class SFTConfig:
  """Supervised warm start on worked solutions. Stops at `steps` or `max_seconds` (0: none)."""

  steps: int = 0
  batch_size: int = 64
  max_seconds: float = 0.0
  optim: OptimConfig = OptimConfig()

  def __post_init__(self):
    _check(self.steps >= 0 and self.batch_size > 0, "sft.steps >= 0 and sft.batch_size > 0")
    _check(self.max_seconds >= 0, "sft.max_seconds must be >= 0 (0: no limit)")
    self.optim.check("sft.optim")


@dataclasses.dataclass(frozen=True)
class RLConfig:
  """Policy-gradient phase. 'grpo' is the synchronous group baseline; 'sao' the asynchronous
  single-trajectory learner (its own knobs are in `Config.sao`)."""

  algorithm: Literal["grpo", "sao"] = "grpo"
  # Where GRPO samples: "inline" in the learner process, or "samplers": the SAO sampler
  # processes, transport and pinning (sao.*), one synchronous step at a time. SAO always uses
  # samplers.
  sampling: Literal["inline", "samplers"] = "inline"
  steps: int = 0
  max_seconds: float = 0.0
  prompts_per_step: int = 16
  group_size: int = 8
  max_new_tokens: int = 32
  temperature: float = 1.0
  advantage: str = "group_norm"
  loss: str = "ppo_clip"
  loss_agg: Literal["token_mean", "seq_mean"] = "token_mean"
  clip_eps: float = 0.2
  kl_coef: float = 0.0
  ppo_epochs: int = 1
  optim: OptimConfig = OptimConfig(lr=1e-4, warmup_steps=10)

  def __post_init__(self):
    _check_choices(self, "rl.")
    _check(self.group_size >= 1 and self.prompts_per_step >= 1, "rl sizes must be >= 1")
    _check(
      self.steps >= 0 and self.max_seconds >= 0,
      "rl.steps and rl.max_seconds must be >= 0 (0: no limit)",
    )
    _check(self.max_new_tokens >= 1, "rl.max_new_tokens must be >= 1")
    self.optim.check("rl.optim")
    _check(self.temperature > 0, "rl.temperature must be > 0")
    _check(0 < self.clip_eps < 1, "rl.clip_eps must be in (0, 1)")
    _check(self.kl_coef >= 0, "rl.kl_coef must be >= 0")
    # Epochs are unrolled inside the one jitted update: a handful, not hundreds.
    _check(1 <= self.ppo_epochs <= 16, f"rl.ppo_epochs {self.ppo_epochs} not in 1..16")
    # rl.advantage and rl.loss name registry entries: checked by sao_jax.setup.validate.

  @property
  def uses_samplers(self) -> bool:
    """Whether the RL phase samples in sampler processes (SAO always does)."""
    return self.algorithm == "sao" or self.sampling == "samplers"


@dataclasses.dataclass(frozen=True)
class SAOConfig:
  """Single-trajectory asynchronous optimisation (used when rl.algorithm == 'sao').

  K sampler processes each decode `sampler_slots` different tasks per jitted call (one
  trajectory per task) and pick up new parameters every `param_sync_every` learner steps;
  the learner updates as soon as `batch_size` rows have arrived (a row per environment step:
  one trajectory of a one-step task, whole trajectories only, never split across updates).
  Freshness scales the step by 2^(-staleness / freshness_half_life) (token-weighted over the
  batch); `rl.ppo_epochs`, `rl.clip_eps` and `rl.kl_coef` apply as in the decoupled loss of
  `sao_jax.learner.make_sao_update` (clip_eps binds only from the second epoch).
  """

  sampler_slots: int = 32
  batch_size: int = 128
  param_sync_every: int = 1
  max_staleness: int = 4
  # "decay": freshness factor 2^(-s/half_life); "drop": 1 up to max
  staleness_mode: Literal["decay", "drop"] = "decay"
  freshness_half_life: float = 4.0
  is_cap: float = 2.0
  is_level: Literal["token", "sequence"] = "token"
  # "value_head": a learned V(prompt) (needs model.value_head)
  baseline: Literal["tracker", "value_head"] = "tracker"
  value_coef: float = 0.5  # weight of the value head's squared error in the loss
  # Advantage r - baseline over the batch std, floored (see sao_jax.rl.trackers.spo_advantage);
  # adv_center also subtracts the batch mean (the SPO recipe; collapses on saturated rewards).
  adv_std_floor: float = 0.1
  adv_center: bool = False
  tracker_d_half: float = 0.06  # SPO's recipe values
  tracker_rho_min: float = 0.875
  tracker_rho_max: float = 0.96
  prioritized: bool = True
  priority_eps: float = 0.05
  # Continuous batching: a slot whose completion ends is refilled at once (its episode's next
  # step or a new task), `refill_rows` prompts per prefill call; off: a call decodes its
  # batch until the slowest slot ends. inflight: when a sampler takes new parameters:
  # "tokens" at once (tokens record their version), "steps" between environment steps,
  # "off" between trajectories (see sao_jax.rollout.ContinuousSampler).
  continuous: bool = True
  refill_rows: int = 8
  inflight: Literal["off", "steps", "tokens"] = "tokens"
  # Backpressure: work ahead of the learner (tasks outstanding + records buffered) bounded
  # by one batch plus samplers.num x sampler_slots in flight, topped up as each batch leaves
  # the buffer; False: the earlier bound (one batch plus two calls per sampler outstanding,
  # buffered records not counted). See Intake.work_ahead_room (runners.learner_parts).
  backpressure: bool = True
  # Verified rollouts: a trajectory whose claimed behaviour log-probs lie further than this
  # from the current policy's (its drift, the mean over its tokens of |log pi_behav - log
  # pi_theta|, nats) is not trained on and counted (`rejected.logp_drift`); 0: off. Clean
  # trajectories drift by what the policy moved since they were sampled plus rounding.
  # Calibrated on clean runs (experiments/poison.py, default arithmetic config, 3 seeds x 2
  # transports, 80 updates): the largest per-update drift_max was 0.088; the bound is 10x
  # that, rounded up (the rule declared in experiments/claims/f_recovery.toml). Log-probs
  # forged far from the policy's (e^-50) are above it; a claim of certainty on a policy
  # that is nearly certain anyway is not (and only down-weights its own trajectory).
  verify_drift: float = 0.9
  # Records of a discarded policy lineage (a branch that a resume or rollback left, see
  # sao_jax.lineage): "drop" (counted, `dropped_lineage`) or "weight": trained on at their
  # true distance from the current policy along the lineage tree (up the discarded branch,
  # down the current path), freshness-weighted and importance-corrected like any record of
  # that age, dropped beyond max_staleness (counted as `weighted_lineage` when trained on).
  discarded_lineage: Literal["drop", "weight"] = "drop"
  # Reward audits: of a family whose reward is costly to recompute (code: a sandbox run;
  # `TaskFamily.auditable`), this fraction of the admitted records, drawn by a keyed hash no
  # sampler can predict, is re-scored in the learner's own sandbox pool (`audit_workers`
  # threads feeding it) before it is trained on; a claimed reward its completion does not
  # earn is rejected (`rejected.reward_mismatch`). Cheap families re-score every record.
  audit_fraction: float = 0.05
  audit_workers: int = 2

  def __post_init__(self):
    _check(self.verify_drift >= 0, "sao.verify_drift must be >= 0 (0: off)")
    _check(0 <= self.audit_fraction <= 1, "sao.audit_fraction must be in [0, 1] (0: off)")
    _check(self.audit_workers >= 1, "sao.audit_workers must be >= 1")
    _check(
      self.sampler_slots >= 1 and self.batch_size >= 1,
      "sao.sampler_slots and sao.batch_size must be >= 1",
    )
    _check(self.param_sync_every >= 1, "sao.param_sync_every must be >= 1")
    _check(self.max_staleness >= 0, "sao.max_staleness must be >= 0")
    _check(self.priority_eps > 0, "sao.priority_eps must be > 0")
    _check(self.tracker_d_half > 0, "sao.tracker_d_half must be > 0")
    _check_choices(self, "sao.")
    _check(self.value_coef >= 0, "sao.value_coef must be >= 0")
    _check(
      1 <= self.refill_rows <= self.sampler_slots,
      f"sao.refill_rows {self.refill_rows} not in 1..sampler_slots {self.sampler_slots}",
    )
    _check(self.adv_std_floor > 0, "sao.adv_std_floor must be > 0")
    _check(self.is_cap >= 1.0 and self.freshness_half_life > 0, "sao.is_cap >= 1, half_life > 0")
    _check(
      0 < self.tracker_rho_min <= self.tracker_rho_max <= 1,
      "sao: need 0 < tracker_rho_min <= tracker_rho_max <= 1",
    )


@dataclasses.dataclass(frozen=True)
class SamplersConfig:
  """The sampler processes of a run that samples outside the learner (SAO, or GRPO with
  rl.sampling='samplers'): how many, how they run and how they are supervised. Process
  settings, not the algorithm's (`sao.*`): changing them changes how fast, not what is
  computed.

  num: local sampler processes (0: only samplers that join, `sao-jax sampler`); threads: XLA
  intra-op threads per sampler process (0: XLA's default); pin_cores: the learner on core 0
  and the samplers on the others (needs >= 2 cores); max_restarts: a sampler that dies is
  restarted this many times per run; a sampler process is quarantined (its records dropped;
  a local one stopped and restarted by that supervision) once `quarantine_rate` of its last
  `quarantine_window` records were rejected at the learner's door (sao_jax.admission);
  window 0: never.
  """

  num: int = 2
  threads: int = 0
  pin_cores: bool = False
  max_restarts: int = 5
  quarantine_window: int = 50
  quarantine_rate: float = 0.5

  def __post_init__(self):
    _check(self.num >= 0, "samplers.num must be >= 0 (0: only samplers that join)")
    _check(self.threads >= 0, "samplers.threads must be >= 0 (0: XLA default)")
    _check(self.max_restarts >= 0, "samplers.max_restarts must be >= 0")
    _check(self.quarantine_window >= 0, "samplers.quarantine_window must be >= 0 (0: never)")
    _check(
      0 < self.quarantine_rate <= 1,
      f"samplers.quarantine_rate {self.quarantine_rate} not in (0, 1]",
    )


# Keys moved between sections (old -> new): refused by name on the command line, mapped when
# a config saved before the move is read back (`upgrade`).
MOVED = {
  "sao.num_samplers": "samplers.num",
  "sao.sampler_threads": "samplers.threads",
  "sao.pin_cores": "samplers.pin_cores",
  "sao.max_sampler_restarts": "samplers.max_restarts",
  "sao.quarantine_window": "samplers.quarantine_window",
  "sao.quarantine_rate": "samplers.quarantine_rate",
}


@dataclasses.dataclass(frozen=True)
class TransportConfig:
  """How SAO trajectories and tasks travel. 'embedded': multiprocessing queues (one machine,
  no server). 'kafka': topics on `bootstrap_servers`, or on a local broker started for the
  run when that is empty."""

  kind: Literal["embedded", "kafka"] = "embedded"
  bootstrap_servers: str = ""
  run_id: str = ""  # topic namespace; empty: derived from the config name and start time
  partitions: int = 4
  broker_timeout_s: float = 30.0  # a lost broker is retried this long, then a clear error
  # TLS / SASL for every Kafka client (sao_jax.transport.kafka_security); the passwords come
  # from the environment only (SAO_JAX_KAFKA_PASSWORD, SAO_JAX_KAFKA_SSL_PASSWORD).
  security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
  ssl_cafile: str = ""  # CA bundle that signed the broker's certificate ("": the system's)
  ssl_certfile: str = ""  # a client certificate, for brokers that require one
  ssl_keyfile: str = ""
  sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = "PLAIN"
  sasl_username: str = ""

  def __post_init__(self):
    _check_choices(self, "transport.")
    _check(self.partitions >= 1, "transport.partitions must be >= 1")
    _check(self.broker_timeout_s > 0, "transport.broker_timeout_s must be > 0")
    _check(
      all(c.isalnum() or c in "-_" for c in self.run_id),
      f"transport.run_id {self.run_id!r}: letters, digits, - and _ only",
    )


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  """Held-out greedy evaluation: `num_problems` test problems in batches of `batch_size`,
  every `every_seconds` of training (0: only at phase ends). With `deferred`, a periodic
  eval saves the parameters and they are evaluated after the phase (nothing runs beside the
  learner while its clock is stopped for an eval: benchmarks of SAO against GRPO); one
  learner process only."""

  num_problems: int = 500
  batch_size: int = 250
  every_seconds: float = 0.0
  deferred: bool = False

  def __post_init__(self):
    _check(
      self.num_problems >= 1 and self.batch_size >= 1,
      "eval.num_problems and eval.batch_size must be >= 1",
    )
    _check(self.every_seconds >= 0, "eval.every_seconds must be >= 0 (0: only at phase ends)")


@dataclasses.dataclass(frozen=True)
class RecoveryConfig:
  """Snapshots, resume, shadow models and rollback (see sao_jax.recovery).

  Snapshots (Orbax) are taken every `Config.checkpoint_every` updates; the last `keep` are
  kept, plus the best by validation accuracy. Every `shadow_every` updates (0: never) the
  policy is validated greedily on `val_problems` held-out problems (the tail of the train
  split, never sampled in RL) and kept as a shadow (the last `shadow_keep`). The run rolls
  back to the best shadow, with the step size multiplied by `lr_decay`, when validation
  accuracy falls more than `regress_threshold` below the best shadow's, or when
  `nonfinite_limit` of the last `nonfinite_window` updates had non-finite gradients.
  """

  keep: int = 3
  shadow_every: int = 50
  shadow_keep: int = 4
  val_problems: int = 128
  regress_threshold: float = 0.15
  nonfinite_limit: int = 3
  nonfinite_window: int = 20
  lr_decay: float = 0.5
  max_rollbacks: int = 20
  keep_journal: bool = False  # keep every journal segment (for sao_jax.recovery.audit)
  # JAX's persistent compilation cache, so a restart loads its programs instead of compiling
  # them: "user" (~/.cache/sao_jax/xla, or $SAO_JAX_CACHE), "workdir", "off", or a directory
  # (see sao_jax.startup).
  compile_cache: str = "user"

  def __post_init__(self):
    _check(self.keep >= 1 and self.shadow_keep >= 1, "recovery.keep/shadow_keep must be >= 1")
    _check(self.shadow_every >= 0, "recovery.shadow_every must be >= 0 (0: no shadows)")
    _check(self.val_problems >= 1, "recovery.val_problems must be >= 1")
    _check(0 < self.regress_threshold <= 1, "recovery.regress_threshold must be in (0, 1]")
    _check(
      1 <= self.nonfinite_limit <= self.nonfinite_window,
      "recovery: need 1 <= nonfinite_limit <= nonfinite_window",
    )
    _check(0 < self.lr_decay <= 1, "recovery.lr_decay must be in (0, 1]")
    _check(self.max_rollbacks >= 0, "recovery.max_rollbacks must be >= 0")
    _check(
      bool(self.compile_cache.strip()),
      "recovery.compile_cache must be 'user', 'workdir', 'off' or a directory",
    )


@dataclasses.dataclass(frozen=True)
class StorageConfig:
  """Where parameter versions and snapshots live. "" (the default): files in the workdir,
  `WORKDIR/params` and `WORKDIR/checkpoints` (samplers on other machines then need the
  workdir mounted at the same path). A bucket, `s3://BUCKET/PREFIX` or `gs://BUCKET/PREFIX`:
  parameter versions are published only there (`URL/params`), and every finished snapshot is
  committed there (`URL/checkpoints/<phase>`), which is where a resume reads them from; the
  workdir keeps the run's books (journal, ledger, events, key). Credentials and endpoint come
  from the environment only (`sao_jax.storage`), never from this config."""

  url: str = ""

  def __post_init__(self):
    if self.url:
      _check(storage.url_problem(self.url) is None, f"storage.url: {storage.url_problem(self.url)}")


# What a poisoned trajectory record can carry (each named by the reason the learner rejects it
# with); defined here for validation, made by sao_jax.admission.poison.
POISON_KINDS = (
  "nonfinite",
  "token_oov",
  "reward_range",
  "future_version",
  "unknown_task",
  "task_mismatch",
  "reward_mismatch",
  "logp_certain",
  "logp_far",
  "resent",
  "wrong_shape",
)
# The counter that each poison kind is caught by (the learner cannot tell some kinds apart:
# both forged log-prob kinds drift from the policy's): `rejected_<kind>` unless named here.
POISON_CAUGHT_BY = {
  "logp_certain": "rejected_logp_drift",
  "logp_far": "rejected_logp_drift",
  "resent": "duplicate_answers",
  "wrong_shape": "bad_records",
}


@dataclasses.dataclass(frozen=True)
class FaultsConfig:
  """Fault injection for tests and the soak run; all off by default. Poisoned updates get
  NaN gradients inside the jitted update (update numbers in `nan_steps`, or each with
  probability `nan_prob`, decided by (seed, update number) so a resumed run poisons the same
  updates)."""

  nan_steps: tuple[int, ...] = ()
  nan_prob: float = 0.0
  # Sampler 0 sends `poison_records` poisoned trajectory records of each kind in
  # `poison_kinds` (sao_jax.admission.POISON_KINDS), one with every `poison_every`-th record
  # it sends, for the learner to reject (see sao_jax.admission.poison).
  poison_kinds: tuple[str, ...] = ()
  poison_records: int = 0
  poison_every: int = 3

  def __post_init__(self):
    _check(0 <= self.nan_prob <= 1, "faults.nan_prob must be in [0, 1]")
    _check(
      all(isinstance(n, int) and n >= 0 for n in self.nan_steps),
      "faults.nan_steps must be update numbers >= 0",
    )
    _check(
      all(isinstance(k, str) for k in self.poison_kinds),
      f"faults.poison_kinds must be kind names, got {self.poison_kinds!r}",
    )
    unknown = set(self.poison_kinds) - set(POISON_KINDS)
    _check(
      not unknown,
      f"faults.poison_kinds {sorted(unknown)} unknown; known: {', '.join(POISON_KINDS)}",
    )
    _check(
      self.poison_records >= 0 and self.poison_every >= 1,
      "faults.poison_records must be >= 0 and faults.poison_every >= 1",
    )


@dataclasses.dataclass(frozen=True)
class LearnerConfig:
  """How the learner computes its updates, not what they compute.

  pack: "on" runs each text batch's forward and backward pass over packed rows
    (`sao_jax.seqpack`: several rows' real tokens per row of the same length, attention kept
    within each), so padding stops costing; the updates equal the unpacked ones up to the
    order of float sums. For one learner process (rows are packed over the whole batch) and
    the text policy (the compressed-memory policy's batches are not packed).
  pack_factor: a packed row holds this many times a batch row's slots, so that several rows
    share one even where each fills most of a row; its attention costs grow with it
    (`sao_jax.seqpack`).
  pack_bucket: packed rows are a multiple of this (and of the mesh's batch divisor), so a
    run compiles a few packed programs (one per multiple its batches need), not one per batch.
  """

  pack: Literal["off", "on"] = "off"
  pack_factor: int = 4
  pack_bucket: int = 2

  def __post_init__(self):
    _check_choices(self, "learner.")
    _check(self.pack_factor >= 1, f"learner.pack_factor must be >= 1, got {self.pack_factor}")
    _check(self.pack_bucket >= 1, f"learner.pack_bucket must be >= 1, got {self.pack_bucket}")


@dataclasses.dataclass(frozen=True)
class CompressionConfig:
  """Three-stage context compression for long-horizon tasks (see sao_jax.compression).

  At step t the policy sees the last `visible` kept steps before t (each `vectors_per_step`
  vectors of size `dim`, INT8 with a per-vector scale when `quantize`) plus a raw window of
  the last `window` tokens. Stage 1 encodes each step's first `step_len` tokens; stage 2 keeps
  turning points always and other steps with relative surprise >= `keep_threshold` while
  fewer than `budget` of those are kept; the bank stores at most `capacity` steps.
  With `evict`, the budget holds the `budget` most surprising such steps rather than the
  first ones, and a full bank makes room by evicting its least surprising entry that is not a
  structural turning point (see `Compressor.filter_and_store`); without it, late steps are
  dropped once the budget or the bank is used up. Evicted entries ship with the trajectory
  (its graveyard: one bank entry plus an eviction step each), so the learner still rebuilds
  exactly what the sampler saw at every step (`sao_jax.compression.memory`).

  `salience` "learned" adds a learned salience score to stage 2
  (`sao_jax.compression.salience`): a small head on each step's vectors, trained in the
  supervised phase through a soft keep mask from the policy's answer loss (weight
  `salience_coef`, with an L1 price `salience_price` on keeping). A step is then a keep
  candidate when it surprises the LSTM (as before) or when its salience probability is >=
  `salience_threshold` (default 0.5), and the budget and eviction rank the non-structural
  entries by salience instead of surprise. A lower threshold makes more steps candidates; the
  budget still keeps only the most salient of them (0: every step is one, and the budget
  holds the `budget` most salient steps so far). The hard filter reads it wherever it runs
  (sampling, the supervised phase's hard pass); the soft-mask pass that trains the head does
  not, so a policy trained under one threshold can be measured under another
  (`experiments/bench_compression.py`, filters), though it then reads banks it was not
  trained on.
  "none": surprise alone (the LSTM rule above). Full-bank attention is `visible = capacity`.
  `salient_turning` (with a learned head only; ignored without): a step surprising enough to
  be a turning point (>= `turning_surprise`) is one only if its salience is >=
  `salience_threshold` too;
  otherwise it is an ordinary candidate for the budget.
  """

  enabled: bool = False
  step_len: int = 20
  vectors_per_step: int = 2
  dim: int = 32
  enc_width: int = 64  # BERT-base: 768 / 12 layers / 12 heads
  enc_depth: int = 2
  enc_heads: int = 4
  enc_mlp_ratio: int = 4
  lstm_hidden: int = 64
  keep_threshold: float = 0.5
  turning_surprise: float = 2.0
  budget: int = 64
  capacity: int = 128
  visible: int = 8
  window: int = 32
  quantize: bool = True
  evict: bool = False
  recon_coef: float = 1.0
  predict_coef: float = 1.0
  salience: Literal["none", "learned"] = "none"
  salience_hidden: int = 32
  salience_coef: float = 1.0
  salience_price: float = 0.05
  salience_rows: int = 4  # rows per trajectory (graded first) in the soft-mask pass
  salient_turning: bool = False
  salience_threshold: float = 0.5

  def __post_init__(self):
    _check_choices(self, "compression.")
    _check(
      min(self.salience_hidden, self.salience_rows) > 0
      and self.salience_coef >= 0
      and self.salience_price >= 0,
      "compression: salience sizes must be positive and its coefs >= 0",
    )
    _check(
      0.0 <= self.salience_threshold <= 1.0,
      f"compression.salience_threshold {self.salience_threshold} is not a probability in [0, 1]",
    )
    _check(
      min(
        self.step_len,
        self.vectors_per_step,
        self.dim,
        self.enc_width,
        self.enc_depth,
        self.enc_heads,
        self.enc_mlp_ratio,
        self.lstm_hidden,
        self.capacity,
        self.visible,
        self.window,
      )
      > 0,
      "compression sizes must be positive",
    )
    _check(
      self.enc_width % self.enc_heads == 0,
      f"compression.enc_width {self.enc_width} not divisible by enc_heads {self.enc_heads}",
    )
    _check(
      self.vectors_per_step * self.dim * 5 <= self.step_len * self.enc_width,
      "compression: a step's vectors must be >= 80% smaller than its token embeddings "
      "(vectors_per_step * dim <= step_len * enc_width / 5)",
    )
    _check(
      0 <= self.keep_threshold <= self.turning_surprise,
      "compression: need 0 <= keep_threshold <= turning_surprise",
    )
    _check(
      0 <= self.budget and self.visible <= self.capacity,
      "compression: need budget >= 0 and visible <= capacity",
    )
    _check(self.recon_coef >= 0 and self.predict_coef >= 0, "compression coefs must be >= 0")


@dataclasses.dataclass(frozen=True)
class LoggingConfig:
  """Metric sinks besides metrics.jsonl and TensorBoard, which are always written.

  `wandb`: also log to Weights & Biases (needs the `wandb` package, e.g. the `sao_jax[wandb]`
  extra; asking for it without the package is a clear error). Mode 'offline' writes the run
  under the workdir with no network (`wandb sync` uploads it later); 'online' uploads as it
  goes. The run's id derives from the workdir, so a resumed run continues the same W&B run.
  `sao-jax sweep` sets `wandb_group` to the sweep's name and `wandb_name` per trial.
  """

  wandb: bool = False
  wandb_mode: Literal["offline", "online"] = "offline"
  wandb_project: str = "sao_jax"
  wandb_entity: str = ""
  wandb_group: str = ""
  wandb_name: str = ""  # empty: the workdir's folder name

  def __post_init__(self):
    _check_choices(self, "logging.")
    _check(bool(self.wandb_project), "logging.wandb_project must not be empty")


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
  """A learner over several processes (one per host) with JAX's multi-controller runtime.

  Every process runs the same command; `sao_jax.distributed.initialize` joins them before
  any JAX computation, and the mesh then spans every process's devices. Each field left at
  its default is read from the environment, so one command line serves all hosts:
  `coordinator` ($SAO_JAX_COORDINATOR) is process 0's "host:port", or "auto" for JAX's
  cluster detection (TPU pods, SLURM, Open MPI, Kubernetes); `num_processes`
  ($SAO_JAX_NUM_PROCESSES; 0: 1, or detected with "auto"); `process_id`
  ($SAO_JAX_PROCESS_ID; -1: 0, or detected with "auto"). No coordinator anywhere: a single
  process, and nothing is initialized.
  """

  coordinator: str = ""
  num_processes: int = 0
  process_id: int = -1
  init_timeout_s: int = 300  # how long processes wait for each other at start-up

  def __post_init__(self):
    host, _, port = self.coordinator.rpartition(":")
    _check(
      self.coordinator in ("", "auto")
      or (
        host.strip() == host != "" and port.isascii() and port.isdigit() and 0 < int(port) < 65536
      ),
      f"distributed.coordinator {self.coordinator!r} must be 'host:port', 'auto' or empty",
    )
    _check(
      self.num_processes >= 0,
      "distributed.num_processes must be >= 0 (0: from $SAO_JAX_NUM_PROCESSES or detected)",
    )
    _check(
      self.process_id >= -1,
      "distributed.process_id must be >= 0 (-1: from $SAO_JAX_PROCESS_ID or detected)",
    )
    _check(
      not self.num_processes or self.process_id < self.num_processes,
      f"distributed.process_id {self.process_id} must be < num_processes {self.num_processes}",
    )
    _check(self.init_timeout_s > 0, "distributed.init_timeout_s must be > 0")


@dataclasses.dataclass(frozen=True)
class Config:
  name: str = "run"
  seed: int = 0
  tokenizer: str = "char"
  model: ModelConfig = ModelConfig()
  mesh: MeshConfig = MeshConfig()
  task: TaskConfig = TaskConfig()
  sft: SFTConfig = SFTConfig()
  rl: RLConfig = RLConfig()
  sao: SAOConfig = SAOConfig()
  samplers: SamplersConfig = SamplersConfig()
  transport: TransportConfig = TransportConfig()
  eval: EvalConfig = EvalConfig()
  recovery: RecoveryConfig = RecoveryConfig()
  storage: StorageConfig = StorageConfig()
  faults: FaultsConfig = FaultsConfig()
  compression: CompressionConfig = CompressionConfig()
  learner: LearnerConfig = LearnerConfig()
  logging: LoggingConfig = LoggingConfig()
  distributed: DistributedConfig = DistributedConfig()
  log_every: int = 10
  checkpoint_every: int = 100
  init_from: str = ""

  def __post_init__(self):
    _check_finite(self)
    _check(bool(self.name), "name must not be empty")
    _check(self.seed >= 0, f"seed must be >= 0, got {self.seed}")
    _check(bool(self.tokenizer), "tokenizer must name a tokenizer")
    _check(
      self.log_every > 0 and self.checkpoint_every > 0, "log_every and checkpoint_every must be > 0"
    )
    _check(
      self.samplers.num > 0 or self.transport.kind == "kafka",
      "samplers.num=0 (remote samplers only) needs transport.kind=kafka",
    )
    _check(
      not (self.rl.algorithm == "grpo" and self.rl.sampling == "samplers")
      or self.sao.param_sync_every == 1,
      "rl.sampling='samplers' (synchronous GRPO) publishes every update: "
      "sao.param_sync_every must be 1",
    )
    _check(
      self.sao.baseline != "value_head" or self.model.value_head,
      "sao.baseline='value_head' needs model.value_head=True",
    )
    _check(
      self.eval.num_problems <= self.task.num_test,
      f"eval.num_problems {self.eval.num_problems} > task.num_test {self.task.num_test}",
    )
    c = self.compression
    _check(
      self.learner.pack == "off" or not c.enabled,
      "learner.pack='on' packs text rows; the compressed-memory policy's batches "
      "(compression.enabled) are not packed",
    )
    _check(
      not c.enabled
      or (
        self.model.memory_slots == c.visible * c.vectors_per_step and self.model.memory_dim == c.dim
      ),
      "compression.enabled needs model.memory_slots == visible * vectors_per_step and "
      "model.memory_dim == compression.dim",
    )


def override(cfg, key: str, value: Any):
  """Returns `cfg` with dotted `key` replaced by `value` (type-checked), validated anew."""
  return apply_overrides(cfg, [(key, value)])


def config_keys(cls=None, prefix: str = "") -> list[str]:
  """Every settable dotted key of a config class (`Config` by default), sections expanded."""
  out = []
  for name, hint in typing.get_type_hints(cls or Config).items():
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
      out += config_keys(hint, f"{prefix}{name}.")
    else:
      out.append(f"{prefix}{name}")
  return out


def suggest_key(key: str, cls=None) -> str:
  """The nearest known key to a mistyped one (`rl.lr` -> `rl.optim.lr`), or ''."""
  keys = config_keys(cls)
  head, leaf = key.split(".")[0], key.split(".")[-1]
  # Same last name: prefer the key in the same section (rl.lr -> rl.optim.lr, not sft.optim.lr).
  same_leaf = [k for k in keys if k.split(".")[-1] == leaf]
  for k in same_leaf:
    if k.split(".")[0] == head:
      return k
  close = difflib.get_close_matches(key, keys, n=1, cutoff=0.75)
  return close[0] if close else (same_leaf[0] if len(same_leaf) == 1 else "")


def _set_path(d: dict, cls, key: str, value: Any, full: str = "", root=None) -> None:
  """Sets dotted `key` in `d` (the `to_dict` form of a `cls`), checking the key against the
  dataclass fields and coercing the value to the field's type."""
  full, root = full or key, root or cls
  head, _, rest = key.partition(".")
  hints = typing.get_type_hints(cls)
  if full in MOVED and root is Config:
    raise ConfigError(f"config key {full!r} moved: it is {MOVED[full]!r} now")
  if head not in hints:
    near = suggest_key(full, root)
    hint = f"did you mean {near!r}? " if near else ""
    raise ConfigError(
      f"unknown config key {full!r} in {cls.__name__}; {hint}known: {', '.join(sorted(hints))}"
    )
  hint = hints[head]
  section = isinstance(hint, type) and dataclasses.is_dataclass(hint)
  if rest and head == "options":  # free-form (key, value) pairs, checked by their owner
    d[head] = tuple((k, v) for k, v in d[head] if k != rest) + ((rest, _literal(value)),)
  elif rest:
    if not section:
      raise ConfigError(f"config key {head!r} is a value, not a section (got {key!r})")
    _set_path(d[head], hint, rest, value, full, root)
  elif section:
    raise ConfigError(f"config key {head!r} is a section: set its keys ({head}.KEY=VALUE)")
  else:
    d[head] = coerce(value, hint, head)


def _literal(value: Any) -> Any:
  """A command-line value as a Python literal where it parses as one, else the string."""
  if isinstance(value, str):
    try:
      return ast.literal_eval(value)
    except (ValueError, SyntaxError):
      return value
  return value


def coerce(value: Any, hint, name: str):
  """`value` (a command-line string or a Python value) as type `hint`, or a ConfigError."""
  # An enum-like field (a Literal of strings) reads as a string; its value is checked by the
  # section (`_check_choices`), with the values it knows.
  is_str = hint is str or (
    typing.get_origin(hint) is Literal and all(isinstance(a, str) for a in typing.get_args(hint))
  )
  if (
    isinstance(value, str)
    and is_str
    and len(value) >= 2
    and value[0] in "'\""
    and value[0] == value[-1]
  ):
    try:
      value = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      raise ConfigError(f"cannot parse {value!r} for {name}") from None
  elif isinstance(value, str) and not is_str:
    try:
      value = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      raise ConfigError(f"cannot parse {value!r} for {name}") from None
  origin = typing.get_origin(hint) or hint
  if origin is float and isinstance(value, int) and not isinstance(value, bool):
    value = float(value)
  if origin is tuple and isinstance(value, list):
    value = tuple(value)
  if is_str and origin is Literal and not isinstance(value, str):
    raise ConfigError(f"{name} expects one of {', '.join(typing.get_args(hint))}, got {value!r}")
  if origin in (int, float, str, bool, tuple) and not isinstance(value, origin):
    raise ConfigError(f"{name} expects {origin.__name__}, got {value!r}")
  if origin is int and isinstance(value, bool):
    raise ConfigError(f"{name} expects int, got {value!r}")
  return value


def apply_overrides(cfg: Config, pairs) -> Config:
  """`cfg` with every `key=value` override applied (or `(key, value)` pairs), then validated
  once as a whole: the order of the overrides does not matter, and a combination that is
  only valid together (e.g. task.num_test and eval.num_problems) is accepted."""
  d = to_dict(cfg)
  for pair in pairs:
    if isinstance(pair, tuple):
      key, value = pair
    else:
      key, sep, value = pair.partition("=")
      if not sep:
        raise ConfigError(f"--set expects key=value, got {pair!r}")
      key, value = key.strip(), value.strip()
    _set_path(d, type(cfg), key, value)
  return from_dict(d, type(cfg))


def load_config(path: str, variant: str = "default", overrides: list[str] = ()) -> Config:
  """Loads `get_config(variant)` from a Python config file, then applies overrides.

  `path` may carry the variant after a colon: ``experiments/configs/arith.py:tiny``.
  """
  if ":" in path and not pathlib.Path(path).exists():
    path, variant = path.rsplit(":", 1)
  file = pathlib.Path(path)
  if not file.is_file():
    raise ConfigError(f"config file {path!r} not found")
  spec = importlib.util.spec_from_file_location(f"sao_jax_config_{file.stem}", file)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  if not hasattr(module, "get_config"):
    raise ConfigError(f"{path} defines no get_config(variant)")
  try:
    cfg = module.get_config(variant)
  except ConfigError:
    raise
  except (ValueError, KeyError) as err:  # e.g. a variant the file does not define
    msg = err.args[0] if isinstance(err, KeyError) and err.args else err
    raise ConfigError(f"{path}:{variant}: {msg}") from None
  if not isinstance(cfg, Config):
    raise ConfigError(f"{path}:get_config returned {type(cfg).__name__}, not Config")
  return apply_overrides(cfg, list(overrides))


def to_dict(cfg) -> dict:
  return dataclasses.asdict(cfg)


def upgrade(d: dict, cls=Config) -> dict:
  """A serialised config (`to_dict` output, read back from JSON) written by an older version of
  this code, in today's schema, JSON-shaped (lists for tuples): every field added to `cls`
  since it was written is filled in at its default, in sections nested at any depth.

  That is a faithful upgrade because every new field defaults to the behaviour before it (the
  rule for adding one), so a checkpoint or result from before the field ran as its default
  does, and compares equal to a config resolved today with the field at its default. A field
  moved between sections is taken to its new place (MOVED: the sampler-process settings left
  `sao` for `samplers`). Keys unknown today are kept, for `from_dict` to refuse by name."""
  default = json.loads(json.dumps(to_dict(cls())))
  saved = json.loads(json.dumps(d))
  if cls is Config:
    for old, new in MOVED.items():
      (old_sec, old_key), (new_sec, new_key) = old.split("."), new.split(".")
      if isinstance(saved.get(old_sec), dict) and old_key in saved[old_sec]:
        saved.setdefault(new_sec, {})[new_key] = saved[old_sec].pop(old_key)
  return _fill(saved, default)


def _fill(saved: dict, default: dict) -> dict:
  out = dict(saved)
  for k, v in default.items():
    if k not in out:
      out[k] = v
    elif isinstance(v, dict) and isinstance(out[k], dict):
      out[k] = _fill(out[k], v)
  return out


def from_dict(d: dict, cls=Config):
  """Rebuilds a config from `to_dict` output (e.g. from a checkpoint); unknown keys fail."""
  hints = typing.get_type_hints(cls)
  kwargs = {}
  for k, v in d.items():
    if k not in hints:
      raise ConfigError(f"unknown config key {k!r} in {cls.__name__}")
    hint = hints[k]
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
      kwargs[k] = from_dict(v, hint)
    else:
      kwargs[k] = _freeze(v)
  return cls(**kwargs)


def from_saved(d: dict) -> Config:
  """A config saved by any version of this code (a checkpoint's metadata, a results file, a
  workdir's config.json, read back from JSON): `upgrade`d to today's schema, then rebuilt;
  keys unknown today fail by name."""
  return from_dict(upgrade(d))


def read_saved(path) -> Config:
  """`from_saved` of a JSON file, e.g. a workdir's config.json."""
  return from_saved(json.loads(pathlib.Path(path).read_text()))


def _freeze(v):
  if isinstance(v, list):
    return tuple(_freeze(x) for x in v)
  return v


def to_json(cfg) -> str:
  return json.dumps(to_dict(cfg), indent=2, sort_keys=True)
