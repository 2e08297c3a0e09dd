"""Task families by name: where tasks, environments and supervised examples come from.

`task.family` in the config names a registered family ("arithmetic", "longhorizon", ...) or a
user's own, as `package.module:Attr` or `path/to/file.py:Attr`, where Attr is a `TaskFamily`
subclass. The runners only ever talk to a `TaskFamily`, never to a family by name. The built-in
families register themselves in `sao_jax.families` (imported by `sao_jax.setup`).

Adding a family takes one file (see `experiments/configs/reverse.py`):

    from sao_jax.tasks import TaskFamily
    class Reverse(TaskFamily):
      def tasks(self, split): ...          # list[Task] of "train" / "test"
      def make_env(self, tok): ...         # an Env (sao_jax.envs.base)

and a config with `task=TaskConfig(family="path/to/reverse.py:Reverse")`. A family's own
parameters go in `task.options` (`--set task.options.length=8`), validated against its
`Options` dataclass.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import pathlib
import typing
from typing import NamedTuple

from sao_jax.config import ConfigError, TaskConfig, coerce
from sao_jax.envs.base import Env, Task
from sao_jax.rl.registry import Registry
from sao_jax.tokenizer import Tokenizer

FAMILIES = Registry("task family")


def register_family(name: str):
  """Class decorator: makes a TaskFamily subclass selectable as task.family=name."""

  def deco(cls):
    cls.name = name
    return FAMILIES.register(name)(cls)

  return deco


@dataclasses.dataclass(frozen=True)
class NoOptions:
  """A family without options of its own."""


class SFTExample(NamedTuple):
  """One teacher-forced row: the context the policy sees, the target it should emit (EOS
  included) and the row's weight in the loss."""

  context: list[int]
  target: list[int]
  weight: float = 1.0


class TaskFamily:
  """Tasks, environment and supervised examples of one kind of problem.

  Subclasses implement `tasks` and `make_env`; the defaults of the others fit one-step tasks
  whose `Task.prompt` is the observation and `Task.solution` the expert action.
  """

  name = ""
  Options: type = NoOptions
  # The reward of a one-step completion is cheap to recompute exactly (string checks, no
  # sandbox): the learner's door re-scores every record's claimed reward (`rescore`).
  verifiable: bool = False
  # The reward can be recomputed, but at a cost (code: a sandbox run): the SAO learner
  # re-scores a sampled fraction of the records (`sao.audit_fraction`, admission.RewardAudit).
  auditable: bool = False

  def __init__(self, cfg: TaskConfig):
    self.cfg = cfg
    self.options = parse_options(self.Options, cfg.options, cfg.family)

  def tasks(self, split: str) -> list[Task]:
    """Every task of "train" or "test" (disjoint), in a fixed order."""
    raise NotImplementedError

  def make_env(self, tok: Tokenizer) -> Env:
    raise NotImplementedError

  def _generated(self, split: str) -> list[Task]:
    """The split as generated, with true demonstrations (families whose options give the
    train split a flawed teacher override this and `tasks`)."""
    return self.tasks(split)

  def teacher_flaw_rate(self) -> float:
    """The fraction of the train split's demonstrations that the teacher's flaw changed
    (0 for a perfect teacher)."""
    flawed, true = self.tasks("train"), self._generated("train")
    return sum(a.solution != b.solution for a, b in zip(flawed, true, strict=True)) / len(true)

  def step_many(self, envs: list[Env], actions: list) -> list:
    """One environment step of several episodes side by side (`rollout.sao_sampling` calls
    it for every active slot at once); families whose reward is costly (code execution)
    override it to score the batch concurrently."""
    return [env.step(a) for env, a in zip(envs, actions, strict=True)]

  def rescore(self, task: Task, tok: Tokenizer, completion, costly: bool = False) -> float | None:
    """The reward of `completion` (the token ids a sampler generated for `task`, padding
    removed) recomputed here, or None where this family does not (not `verifiable`; with
    `costly`, not `auditable` either)."""
    if not (self.verifiable or (costly and self.auditable)):
      return None
    env = self.make_env(tok)
    env.reset(task)
    return float(env.step(completion).reward)

  def max_steps(self, tok: Tokenizer) -> int:
    return self.make_env(tok).max_steps

  def max_reward(self, task: Task) -> float:
    """The reward of a perfect episode: held-out accuracy is total reward / this."""
    return 1.0

  def reward_range(self, task: Task) -> tuple[float, float]:
    """(low, high) bounds of an episode's total reward: the learner rejects a trajectory
    outside them (sao_jax.admission). Override for rewards that can be negative."""
    return 0.0, self.max_reward(task)

  def sft_examples(self, task: Task, tok: Tokenizer, prompt_len: int) -> list[SFTExample]:
    """Rows of the supervised warm start (one per step for multi-step families)."""
    return [
      SFTExample(tok.encode(task.prompt, add_bos=True), tok.encode(task.solution, add_eos=True))
    ]

  def budget(self, tasks: list[Task], tok: Tokenizer) -> tuple[int, int]:
    """(prompt length, target length) in tokens that every task's rows fit: the shapes the
    programs are compiled for."""
    prompt = max(len(tok.encode(t.prompt, add_bos=True)) for t in tasks)
    target = max(len(tok.encode(t.solution, add_eos=True)) for t in tasks)
    return -(-prompt // 8) * 8, target


def parse_options(options_cls: type, pairs: tuple, family: str):
  """The family's Options dataclass from `task.options` pairs; unknown keys and ill-typed
  values are ConfigErrors naming the family and its known keys."""
  fields = {f.name: f for f in dataclasses.fields(options_cls)}
  hints = typing.get_type_hints(options_cls)
  kwargs = {}
  for key, value in pairs:
    if key not in fields:
      raise ConfigError(
        f"task.options.{key}: unknown option of task family {family!r}; known: "
        f"{', '.join(sorted(fields)) or 'none'}"
      )
    kwargs[key] = coerce(value, hints[key], f"task.options.{key}")
  try:
    return options_cls(**kwargs)
  except (TypeError, ValueError) as err:
    raise ConfigError(f"task.options of family {family!r}: {err}") from None


def get_family(cfg: TaskConfig) -> TaskFamily:
  """The family `cfg.family` names, constructed from `cfg` (its options validated)."""
  return family_class(cfg.family)(cfg)


def family_class(name: str) -> type[TaskFamily]:
  if ":" not in name:
    if name not in FAMILIES.names():
      raise ConfigError(
        f"task.family {name!r} unknown; known: {', '.join(FAMILIES.names())}, "
        "or package.module:Class / path/to/file.py:Class"
      )
    return FAMILIES.get(name)
  where, _, attr = name.rpartition(":")
  if where.endswith(".py"):
    path = pathlib.Path(where)
    if not path.is_file():
      raise ConfigError(f"task.family {name!r}: file {where} not found")
    spec = importlib.util.spec_from_file_location(f"sao_jax_family_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
  else:
    try:
      module = importlib.import_module(where)
    except ImportError as err:
      raise ConfigError(f"task.family {name!r}: cannot import {where} ({err})") from None
  cls = getattr(module, attr, None)
  if not (isinstance(cls, type) and issubclass(cls, TaskFamily)):
    raise ConfigError(f"task.family {name!r}: {attr} in {where} is not a TaskFamily subclass")
  return cls
