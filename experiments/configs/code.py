"""Coding RL: SFT warm start, then SAO (or GRPO) on procedurally generated one-line Python
functions, rewarded by the fraction of hidden tests passed in the sandbox (task family
"code", `sao_jax.envs.code`). Each sampler process scores its completions concurrently on a
pool of sandbox workers; `reward_s_per_trajectory` in the summary is the sandbox's cost.

Run (300 SFT steps, then 240 s of SAO; ~15 min on a 2-core CPU):
  sao-jax train --config experiments/configs/code.py --workdir runs/code_sao
The synchronous GRPO(N=8) arm on the same tasks and budget:
  sao-jax train --config experiments/configs/code.py --workdir runs/code_grpo \\
      --set rl.algorithm=grpo
Run the tiny variant (about a minute):
  sao-jax train --config experiments/configs/code.py:tiny --workdir runs/code_tiny
Harder programs: --set task.options.min_depth=2 --set task.options.max_depth=4
"""

import dataclasses

from sao_jax.config import (
  Config,
  EvalConfig,
  ModelConfig,
  OptimConfig,
  RecoveryConfig,
  RLConfig,
  SamplersConfig,
  SAOConfig,
  SFTConfig,
  TaskConfig,
)


def get_config(variant: str = "default") -> Config:
  cfg = Config(
    name="code",
    model=ModelConfig(width=128, depth=3, heads=4, max_len=136),
    task=TaskConfig(family="code", num_train=20000, num_test=500),
    sft=SFTConfig(steps=300, batch_size=64, optim=OptimConfig(lr=1e-3, warmup_steps=50)),
    rl=RLConfig(
      algorithm="sao",
      max_seconds=240,
      prompts_per_step=16,
      group_size=8,
      max_new_tokens=56,
      optim=OptimConfig(lr=1e-4, warmup_steps=10),
    ),
    sao=SAOConfig(sampler_slots=64, batch_size=128),
    samplers=SamplersConfig(num=1, threads=1),
    eval=EvalConfig(num_problems=500, batch_size=250),
  )
  if variant == "default":
    return cfg
  if variant == "tiny":
    return dataclasses.replace(
      cfg,
      name="code_tiny",
      model=ModelConfig(width=32, depth=1, heads=2, max_len=136),
      task=dataclasses.replace(cfg.task, num_train=400, num_test=32),
      sft=dataclasses.replace(cfg.sft, steps=10, batch_size=16),
      rl=dataclasses.replace(cfg.rl, steps=3, max_seconds=0, prompts_per_step=2),
      sao=dataclasses.replace(cfg.sao, sampler_slots=8, batch_size=16),
      recovery=RecoveryConfig(val_problems=32),
      eval=EvalConfig(num_problems=32, batch_size=32),
      log_every=1,
    )
  raise ValueError(f"unknown variant {variant!r}; known: default, tiny")
