"""SAO post-training of a Qwen2-style Hugging Face checkpoint on GSM8K from the user's copy.

The checkpoint is a directory as published (config.json, model.safetensors or shards with
model.safetensors.index.json, tokenizer.json, tokenizer_config.json), e.g. Qwen2.5-0.5B or
Qwen2.5-1.5B; the environment variable SAO_JAX_HF_MODEL names it when the config is built.
Its config.json fixes the model (`sao_jax.models.hf.model_config`; the compute dtype, LoRA
and context length are this config's), its tokenizer.json the tokenizer (BOS: the
<|endoftext|> document separator, as Qwen models have no BOS token of their own), and the
weights load from it (`init_from`). GSM8K's published train.jsonl and test.jsonl lie in one
directory, given with `--set task.options.manual_dir=DIR`; nothing is downloaded (the TFDS
build goes to $SAO_JAX_DATA_DIR or ~/.cache/sao_jax/tfds, or `--set task.data_dir=...`).

Run (one GPU; XLA_PYTHON_CLIENT_PREALLOCATE=false lets the learner and its sampler process
share the device: each would otherwise reserve 75 % of its memory at start-up):
  XLA_PYTHON_CLIENT_PREALLOCATE=false SAO_JAX_HF_MODEL=/models/Qwen2.5-0.5B \
    sao-jax train --config experiments/configs/gsm8k_qwen.py \
    --set task.options.manual_dir=/data/gsm8k --workdir runs/gsm8k_qwen
LoRA (rank 16 on every projection, only the adapters train, 10-20x the step sizes):
  ... --config experiments/configs/gsm8k_qwen.py:lora ...
RL straight from the checkpoint, without the supervised warm start:
  ... --set sft.steps=0
Held-out accuracy of the latest checkpoint (greedy, the test split):
  sao-jax eval --workdir runs/gsm8k_qwen
Tiny variant (the fixture Qwen2-style model tests/fixtures/hf/qwen2_tiny and a directory with
a few problems in GSM8K's format; about a minute on an idle 2-core CPU):
  sao-jax train --config experiments/configs/gsm8k_qwen.py:tiny \
    --set task.options.manual_dir=DIR --workdir runs/gsm8k_tiny

What runs: a short supervised warm start on the train split's worked solutions (it teaches
the "#### <answer>" line and the stop token; a base model otherwise writes on past its answer,
into the next made-up question), then SAO: one sampled completion per problem, reward 1 iff
the answer extracted from it (the number after its last "####", else its last number) equals
the reference (`sao_jax.envs.gsm8k`), held-out greedy accuracy on the test split before RL
and at the end. Prompts are "Question: ...\\nAnswer:" in plain text (no chat template).

The defaults are starting points for a 0.5B-1.5B model on one GPU, not tuned: bf16 compute
over float32 master weights; learner batches of 8 trajectories (the learner has no gradient
accumulation, and its [rows, tokens, 151936] float32 logits dominate its memory); up to 512
new tokens (a worked solution longer than that stops the run at start-up, naming the
length); full fine-tuning at 1e-5 (SFT) and 1e-6 (RL), LoRA at 1e-4 and 2e-5; one sampler
process of 32 slots (more slots per learner batch means staler trajectories); new parameters
for the sampler every 4 updates (the learner writes all float32 parameters, 2 GB for
Qwen2.5-0.5B, to a file each time) and trajectories up to 8 versions old; 200 SFT steps,
then 1000 SAO updates (about one pass over the 7,473 training problems). Every run prints
its memory and throughput estimates before it starts (also WORKDIR/estimates.json): for
Qwen2.5-0.5B they put the full fine-tune's learner near 55 GB; Qwen2.5-1.5B needs :lora or
a device larger than 80 GB. Raise sao.batch_size where the estimate leaves room.
"""

import dataclasses
import os
import pathlib

from sao_jax.config import (
  Config,
  ConfigError,
  EvalConfig,
  OptimConfig,
  RLConfig,
  SamplersConfig,
  SAOConfig,
  SFTConfig,
  TaskConfig,
)
from sao_jax.models import hf

ENV = "SAO_JAX_HF_MODEL"
FIXTURE = pathlib.Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "hf" / "qwen2_tiny"


def _from_checkpoint(path: pathlib.Path, **model) -> dict:
  """The config fields a Hugging Face checkpoint directory decides."""
  try:
    model_cfg = hf.model_config(path, **model)
  except hf.CheckpointError as err:
    raise ConfigError(f"{ENV}={str(path)!r}: {err}") from None
  return dict(
    model=model_cfg,
    tokenizer=f"hf:{path / 'tokenizer.json'}?bos=<|endoftext|>",
    init_from=str(path),
  )


def get_config(variant: str = "default") -> Config:
  if variant not in ("default", "lora", "tiny"):
    raise ValueError(f"unknown variant {variant!r}; known: default, lora, tiny")
  lora = dict(lora_rank=16, lora_alpha=32.0) if variant == "lora" else {}
  if variant == "tiny":
    ckpt = _from_checkpoint(FIXTURE, dtype="bfloat16")
  elif os.environ.get(ENV):
    ckpt = _from_checkpoint(pathlib.Path(os.environ[ENV]), dtype="bfloat16", **lora)
  else:
    raise ConfigError(
      f"experiments/configs/gsm8k_qwen.py: set {ENV} to a Qwen2-style Hugging Face checkpoint "
      "directory (config.json, *.safetensors, tokenizer.json)"
    )
  cfg = Config(
    name=f"gsm8k_qwen_{variant}",
    **ckpt,
    task=TaskConfig(family="gsm8k", num_train=7473, num_test=1319),
    sft=SFTConfig(steps=200, batch_size=8, optim=OptimConfig(lr=1e-5, warmup_steps=20)),
    rl=RLConfig(
      algorithm="sao",
      steps=1000,
      max_new_tokens=512,
      temperature=1.0,
      optim=OptimConfig(lr=1e-6, warmup_steps=10),
    ),
    sao=SAOConfig(sampler_slots=32, batch_size=8, param_sync_every=4, max_staleness=8),
    samplers=SamplersConfig(num=1),
    eval=EvalConfig(num_problems=1319, batch_size=64),
  )
  if variant == "lora":
    return dataclasses.replace(
      cfg,
      sft=dataclasses.replace(cfg.sft, optim=OptimConfig(lr=1e-4, warmup_steps=20)),
      rl=dataclasses.replace(cfg.rl, optim=OptimConfig(lr=2e-5, warmup_steps=10)),
    )
  if variant == "tiny":
    # Enough supervised steps at a large step size that the fixture model learns the few
    # training solutions by heart, so that RL sees rewards of both kinds.
    return dataclasses.replace(
      cfg,
      task=dataclasses.replace(cfg.task, num_train=64, num_test=64),
      sft=SFTConfig(steps=30, batch_size=8, optim=OptimConfig(lr=5e-3, warmup_steps=3)),
      rl=dataclasses.replace(
        cfg.rl, steps=4, max_new_tokens=80, optim=OptimConfig(lr=1e-4, warmup_steps=1)
      ),
      sao=SAOConfig(sampler_slots=4, refill_rows=4, batch_size=4),
      eval=EvalConfig(num_problems=2, batch_size=2),
      recovery=dataclasses.replace(cfg.recovery, val_problems=1, shadow_every=2),
      log_every=1,
    )
  return cfg
