"""SFT warm start, then synchronous GRPO(N=8), on generated arithmetic word problems.

Run (default: 300 SFT steps, then 240 s of GRPO; ~6 min on a 2-core CPU):
  sao-jax train --config experiments/configs/arith_grpo.py --workdir runs/arith_grpo
Run the tiny variant (seconds):
  sao-jax train --config experiments/configs/arith_grpo.py:tiny --workdir runs/arith_tiny
Evaluate the latest checkpoint:
  sao-jax eval --workdir runs/arith_grpo
"""

import dataclasses

from sao_jax.config import (
  Config,
  EvalConfig,
  ModelConfig,
  OptimConfig,
  RLConfig,
  SFTConfig,
  TaskConfig,
)


def get_config(variant: str = "default") -> Config:
  cfg = Config(
    name="arith_grpo",
    model=ModelConfig(width=128, depth=3, heads=4, max_len=96),
    task=TaskConfig(n_ops=2, max_operand=9, ops="+-", num_train=20000, num_test=500),
    sft=SFTConfig(steps=300, batch_size=64, optim=OptimConfig(lr=1e-3, warmup_steps=50)),
    rl=RLConfig(
      max_seconds=240,
      prompts_per_step=16,
      group_size=8,
      max_new_tokens=24,
      optim=OptimConfig(lr=1e-4, warmup_steps=10),
    ),
    eval=EvalConfig(num_problems=500, batch_size=250),
  )
  if variant == "default":
    return cfg
  if variant == "tiny":
    return dataclasses.replace(
      cfg,
      name="arith_grpo_tiny",
      model=ModelConfig(width=32, depth=1, heads=2, max_len=96),
      task=dataclasses.replace(cfg.task, num_train=500, num_test=64),
      sft=dataclasses.replace(cfg.sft, steps=20, batch_size=16),
      rl=dataclasses.replace(cfg.rl, steps=4, max_seconds=0, prompts_per_step=2),
      eval=EvalConfig(num_problems=64, batch_size=64),
      log_every=2,
    )
  raise ValueError(f"unknown variant {variant!r}; known: default, tiny")
