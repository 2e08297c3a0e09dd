"""A task family defined in this one file, outside the package: reverse a word.

The family (`Reverse`) and the config that trains it live together; `task.family` names the
class by this file's path, so `sao-jax train` (and its sampler processes) load it from here.
Nothing in `sao_jax/` knows about it.

Run (SFT warm start, then SAO; ~3 min on a 2-core CPU):
  sao-jax train --config experiments/configs/reverse.py --workdir runs/reverse
Run the tiny variant (seconds):
  sao-jax train --config experiments/configs/reverse.py:tiny --workdir runs/reverse_tiny
Longer words:
  sao-jax train --config experiments/configs/reverse.py --workdir runs/rev8 \\
      --set task.options.length=8
"""

import dataclasses
import pathlib

import numpy as np

from sao_jax.config import (
  Config,
  EvalConfig,
  ModelConfig,
  OptimConfig,
  RLConfig,
  SamplersConfig,
  SAOConfig,
  SFTConfig,
  TaskConfig,
)
from sao_jax.envs.base import StepResult, Task
from sao_jax.tasks import TaskFamily


@dataclasses.dataclass(frozen=True)
class ReverseOptions:
  length: int = 4  # letters per word
  letters: str = "abcdefgh"

  def __post_init__(self):
    if not 2 <= self.length <= 12 or len(set(self.letters)) < 2:
      raise ValueError("length must be in 2..12 and letters hold at least 2 distinct ones")


class ReverseEnv:
  """One step: reward 1 iff the action is the prompt's word reversed."""

  max_steps = 1

  def __init__(self, tok):
    self.tok, self.answer = tok, None

  def reset(self, task: Task) -> np.ndarray:
    self.answer = task.answer
    return np.asarray(self.tok.encode(task.prompt), np.int32)

  def step(self, action_tokens) -> StepResult:
    if self.answer is None:
      raise RuntimeError("step() before reset()")
    text = self.tok.decode(action_tokens)
    reward, self.answer = float(text == self.answer), None
    return StepResult(np.zeros(0, np.int32), reward, True, {"format_ok": text.isalpha()})


class Reverse(TaskFamily):
  """Words of `length` random letters; train and test hold disjoint words."""

  Options = ReverseOptions

  def tasks(self, split: str) -> list[Task]:
    o, t = self.options, self.cfg
    rng = np.random.default_rng(t.seed)
    need = t.num_train + t.num_test
    words: dict[str, None] = {}
    while len(words) < need:  # distinct words, in a fixed order
      words["".join(rng.choice(list(o.letters), o.length))] = None
    chosen = list(words)[: t.num_train] if split == "train" else list(words)[t.num_train :]
    return [
      Task(task_id=i, prompt=f"rev {w}:", solution=w[::-1], answer=w[::-1], difficulty=o.length)
      for i, w in enumerate(chosen)
    ]

  def make_env(self, tok) -> ReverseEnv:
    return ReverseEnv(tok)


def get_config(variant: str = "default") -> Config:
  cfg = Config(
    name="reverse",
    model=ModelConfig(width=64, depth=2, heads=4, max_len=48),
    task=TaskConfig(
      family=f"{pathlib.Path(__file__).resolve()}:Reverse", num_train=3000, num_test=200
    ),
    sft=SFTConfig(steps=300, batch_size=64, optim=OptimConfig(lr=3e-3, warmup_steps=20)),
    rl=RLConfig(
      algorithm="sao", max_seconds=90, max_new_tokens=8, optim=OptimConfig(lr=3e-4, warmup_steps=10)
    ),
    sao=SAOConfig(sampler_slots=64, batch_size=64),
    samplers=SamplersConfig(num=1, threads=1),
    eval=EvalConfig(num_problems=200, batch_size=200),
  )
  if variant == "default":
    return cfg
  if variant == "tiny":
    return dataclasses.replace(
      cfg,
      name="reverse_tiny",
      model=ModelConfig(width=32, depth=1, heads=2, max_len=48),
      task=dataclasses.replace(cfg.task, num_train=400, num_test=32),
      sft=dataclasses.replace(cfg.sft, steps=20, batch_size=16),
      rl=dataclasses.replace(cfg.rl, steps=4, max_seconds=0),
      sao=dataclasses.replace(cfg.sao, sampler_slots=8, batch_size=16),
      eval=EvalConfig(num_problems=32, batch_size=32),
      log_every=2,
    )
  raise ValueError(f"unknown variant {variant!r}; known: default, tiny")
