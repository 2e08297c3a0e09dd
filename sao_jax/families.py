"""The built-in task families (see `sao_jax.tasks`).

* ``arithmetic``: generated GSM8K-style word problems, one step (`sao_jax.envs.arithmetic`);
  parameters are `task.n_ops`, `task.n_ops_mix`, `task.max_operand`, `task.ops`,
  `task.reverse_digits`, and in `task.options` a flawed teacher of the demonstrations
  (`ArithmeticOptions.teacher_misreads`).
* ``chain``: arithmetic chains whose number of steps follows a declared heavy-tailed law
  (zipf or lognormal over 1..24 steps by default: completions of 12 to ~200 tokens, like
  reasoning traces), one step (`sao_jax.envs.chain`); parameters in `task.options`
  (`ChainSpec`).
* ``code``: one-line Python function bodies from a docstring and two examples, rewarded by
  the fraction of hidden tests passed in the sandbox (`sao_jax.envs.code`); parameters in
  `task.options` (`CodeOptions`). Each process scores its batch of completions concurrently on
  one `SandboxPool`.
* ``longhorizon``: multi-turn retention dialogues or corridor walks of up to 1,000 steps
  (`sao_jax.envs.longhorizon`); parameters in `task.options` (`LongHorizonOptions`). The
  policy sees a raw window of the last `window` tokens of the episode, and with
  `compression.enabled` a compressed memory of the earlier steps
  (`sao_jax.compression.policy.MemoryPolicy`).
* ``gsm8k``: GSM8K word problems from the user's own copy of the published JSONL files
  (`sao_jax.data.gsm8k_tfds`; `task.options.manual_dir`), rewarded by answer extraction
  (`sao_jax.envs.gsm8k`); `task.num_train` / `task.num_test` cap each split (file order).
"""

from __future__ import annotations

import dataclasses

from sao_jax.config import ConfigError
from sao_jax.data import arithmetic_tfds, chain_tfds, code_tfds, gsm8k_tfds, longhorizon_tfds
from sao_jax.envs import code as code_env
from sao_jax.envs.arithmetic import (
  SUBTRACTION_VERBS,
  ArithmeticEnv,
  ArithmeticSpec,
  misread_solution,
  problem_numbers,
)
from sao_jax.envs.base import Task
from sao_jax.envs.chain import ChainSpec
from sao_jax.envs.code import CODE_MISREADS, CodeEnv, CodeSpec
from sao_jax.envs.gsm8k import GSM8KEnv
from sao_jax.envs.longhorizon import SEP, LongHorizonEnv, LongHorizonSpec, graded_steps
from sao_jax.sandbox import SandboxPool
from sao_jax.tasks import SFTExample, TaskFamily, register_family
from sao_jax.tokenizer import Tokenizer


def _interleave(parts: list[list[Task]]) -> list[Task]:
  return [t for group in zip(*parts, strict=True) for t in group]


@dataclasses.dataclass(frozen=True)
class ArithmeticOptions:
  """teacher_misreads: subtraction verbs (of "lost", "sold", "gave", "used") that the
  teacher of the demonstrations reads as additions (`envs.arithmetic.misread_solution`): the
  train split's worked solutions carry that systematic error, so SFT imitates it; answers,
  rewards and the test split stay true. Empty (the default): a perfect teacher.

  test_operand_above: the test split keeps only problems with a number (the start value or
  an operand) above it, e.g. 9 with task.max_operand=20: problems out of the distribution of
  a model trained on operands up to 9, none of which its train split could hold (0: all)."""

  teacher_misreads: tuple[str, ...] = ()
  test_operand_above: int = 0

  def __post_init__(self):
    if not isinstance(self.test_operand_above, int) or self.test_operand_above < 0:
      raise ValueError(f"test_operand_above must be an int >= 0, not {self.test_operand_above!r}")
    bad = sorted(map(str, set(self.teacher_misreads) - set(SUBTRACTION_VERBS)))
    if bad or len(set(self.teacher_misreads)) != len(self.teacher_misreads):
      raise ValueError(
        f"teacher_misreads {self.teacher_misreads} must be distinct verbs of {SUBTRACTION_VERBS}"
      )


@register_family("arithmetic")
class Arithmetic(TaskFamily):
  """Reward 1 for the right final answer (and a well-formed solution), else 0."""

  Options = ArithmeticOptions
  verifiable = True

  def __init__(self, cfg):
    super().__init__(cfg)
    try:
      self.specs()
    except ValueError as err:  # the generator's own checks, named as config keys
      raise ConfigError(f"task.{err}") from None
    if not all(isinstance(n, int) for n in cfg.n_ops_mix):
      raise ConfigError(f"task.n_ops_mix {cfg.n_ops_mix} must be operation counts")

  def specs(self) -> list[ArithmeticSpec]:
    t = self.cfg
    return [
      ArithmeticSpec(n_ops=n, max_operand=t.max_operand, ops=t.ops, reverse_digits=t.reverse_digits)
      for n in (t.n_ops_mix or (t.n_ops,))
    ]

  def _generated(self, split: str) -> list[Task]:
    """The split as generated: true solutions."""
    t, specs = self.cfg, self.specs()
    kw = dict(
      num_train=t.num_train // len(specs),
      num_test=t.num_test // len(specs),
      seed=t.seed,
      data_dir=t.data_dir or None,
    )
    # A mixture interleaves its parts, so any prefix of the test split (eval.num_problems)
    # holds every part in equal measure.
    return _interleave([arithmetic_tfds.load_tasks(spec, split, **kw) for spec in specs])

  def tasks(self, split: str) -> list[Task]:
    tasks = self._generated(split)
    above = self.options.test_operand_above
    if split == "test" and above:
      rev = self.cfg.reverse_digits
      tasks = [t for t in tasks if max(problem_numbers(t.solution, rev)) > above]
      if not tasks:
        raise ConfigError(
          f"task.options.test_operand_above={above}: no test problem has a number above it "
          f"(task.max_operand={self.cfg.max_operand})"
        )
    misreads = self.options.teacher_misreads
    if split == "train" and misreads:  # the teacher's demonstrations; answers stay true
      rev = self.cfg.reverse_digits
      tasks = [dataclasses.replace(t, solution=misread_solution(t, misreads, rev)) for t in tasks]
    return tasks

  def make_env(self, tok: Tokenizer) -> ArithmeticEnv:
    return ArithmeticEnv(tok)


@register_family("chain")
class Chain(TaskFamily):
  """Reward 1 for the right final answer (after '#'), else 0; the number of steps of each
  problem follows the law its options declare (`ChainSpec`: the options are the spec)."""

  Options = ChainSpec
  verifiable = True

  def tasks(self, split: str) -> list[Task]:
    t = self.cfg
    return chain_tfds.load_tasks(
      self.options, split, t.num_train, t.num_test, t.seed, data_dir=t.data_dir or None
    )

  def make_env(self, tok: Tokenizer) -> ArithmeticEnv:
    return ArithmeticEnv(tok)


@dataclasses.dataclass(frozen=True)
class CodeOptions:
  """min_depth/max_depth: stages per program (difficulty, 1..4); kinds: input kinds ("lsi":
  lists, strings, ints); num_hidden: hidden tests per task; test_fraction: share of the
  program space held out; format_weight: reward share for a body that compiles and returns;
  teacher_misreads: stage words (of `envs.code.CODE_MISREADS`: "evens", "first", "add",
  "reverse", "upper") that the
  teacher of the demonstrations reads the wrong way, the same way every time
  (`envs.code.misread_solution`): the train split's solutions carry that systematic flaw,
  hidden tests and the test split stay true. Empty (the default): a perfect teacher."""

  min_depth: int = 1
  max_depth: int = 3
  kinds: str = "lsi"
  num_hidden: int = 5
  test_fraction: float = 0.2
  format_weight: float = 0.0
  teacher_misreads: tuple[str, ...] = ()

  def __post_init__(self):
    self.spec()  # validates the generator's parameters
    if not 0.0 <= self.format_weight < 1.0:
      raise ValueError("format_weight must be in [0, 1)")
    bad = sorted(map(str, set(self.teacher_misreads) - set(CODE_MISREADS)))
    if bad or len(set(self.teacher_misreads)) != len(self.teacher_misreads):
      raise ValueError(
        f"teacher_misreads {self.teacher_misreads} must be distinct words of {tuple(CODE_MISREADS)}"
      )

  def spec(self) -> CodeSpec:
    return CodeSpec(
      min_depth=self.min_depth,
      max_depth=self.max_depth,
      kinds=self.kinds,
      num_hidden=self.num_hidden,
      test_fraction=self.test_fraction,
    )


@register_family("code")
class Code(TaskFamily):
  """Reward: fraction of hidden tests the completion passes (0 for a blocked run)."""

  Options = CodeOptions
  auditable = True  # a sandbox run per completion: the learner re-scores a sampled fraction

  def __init__(self, cfg):
    super().__init__(cfg)
    self._pool = None

  def _generated(self, split: str) -> list[Task]:
    t = self.cfg
    return code_tfds.load_tasks(
      self.options.spec(), split, t.num_train, t.num_test, t.seed, data_dir=t.data_dir or None
    )

  def tasks(self, split: str) -> list[Task]:
    tasks = self._generated(split)
    misreads = self.options.teacher_misreads
    if split == "train" and misreads:  # the teacher's demonstrations; hidden tests stay true
      flawed = code_env.misread_solution
      tasks = [dataclasses.replace(t, solution=flawed(t, misreads)) for t in tasks]
    return tasks

  def make_env(self, tok: Tokenizer) -> CodeEnv:
    if self._pool is None:  # one pool per process, shared by all of its envs
      self._pool = SandboxPool()
    return CodeEnv(tok, pool=self._pool, format_weight=self.options.format_weight)

  def max_steps(self, tok: Tokenizer) -> int:
    return CodeEnv.max_steps

  def step_many(self, envs: list[CodeEnv], actions: list) -> list:
    return CodeEnv.step_many(envs, actions)


@dataclasses.dataclass(frozen=True)
class LongHorizonOptions:
  """kind: "retention" or "navigation"; n_steps, n_facts, min_gap, p_noise, period as in
  `LongHorizonSpec`; window: raw context tokens the policy sees at each step;
  graded_weight: supervised weight of a graded step against 1 for each filler step (a
  36-step episode has 35 filler steps: the answers must dominate the objective)."""

  kind: str = "retention"
  n_steps: int = 36
  n_facts: int = 1
  min_gap: int = 32
  p_noise: float = 0.1
  period: int = 0
  window: int = 24
  graded_weight: float = 100.0

  def __post_init__(self):
    self.spec()  # validates the episode parameters
    if self.window < 8 or self.graded_weight <= 0:
      raise ValueError("window must be >= 8 and graded_weight > 0")

  def spec(self) -> LongHorizonSpec:
    return LongHorizonSpec(
      self.kind,
      n_steps=self.n_steps,
      n_facts=self.n_facts,
      min_gap=self.min_gap,
      p_noise=self.p_noise,
      period=self.period,
    )


@register_family("longhorizon")
class LongHorizon(TaskFamily):
  """One step per turn; reward 1 at each graded step answered right (accuracy: the
  fraction of graded steps)."""

  Options = LongHorizonOptions

  def tasks(self, split: str) -> list[Task]:
    t = self.cfg
    return longhorizon_tfds.load_tasks(
      self.options.spec(), split, t.num_train, t.num_test, t.seed, data_dir=t.data_dir or None
    )

  def make_env(self, tok: Tokenizer) -> LongHorizonEnv:
    return LongHorizonEnv(tok, max_steps=self.options.n_steps)

  def max_reward(self, task: Task) -> float:
    return float(len(graded_steps(task)))

  def sft_examples(self, task: Task, tok: Tokenizer, prompt_len: int) -> list[SFTExample]:
    """Every step of the expert script, each seeing the last `prompt_len` tokens of the
    episode so far (as the sampler's rows do)."""
    graded = graded_steps(task)
    ctx, out = [tok.bos_id], []
    for t, (obs, act) in enumerate(
      zip(task.prompt.split(SEP), task.solution.split(SEP), strict=True)
    ):
      ctx = ctx + tok.encode(obs)
      target = tok.encode(act, add_eos=True)
      out.append(
        SFTExample(ctx[-prompt_len:], target, self.options.graded_weight if t in graded else 1.0)
      )
      ctx = ctx + target  # the action with its EOS, as sao_sampling appends it
    return out

  def budget(self, tasks: list[Task], tok: Tokenizer) -> tuple[int, int]:
    target = max(len(tok.encode(a, add_eos=True)) for t in tasks for a in t.solution.split(SEP))
    return self.options.window, target


@dataclasses.dataclass(frozen=True)
class GSM8KOptions:
  """manual_dir: the directory holding GSM8K's published train.jsonl and test.jsonl (nothing
  is downloaded; see `sao_jax.data.gsm8k_tfds`)."""

  manual_dir: str = ""

  def __post_init__(self):
    if not self.manual_dir:
      raise ValueError(
        "manual_dir must name the directory with GSM8K's train.jsonl and test.jsonl "
        "(--set task.options.manual_dir=/path/to/gsm8k)"
      )


@register_family("gsm8k")
class GSM8K(TaskFamily):
  """Reward 1 iff the answer extracted from the completion equals the reference answer."""

  Options = GSM8KOptions
  verifiable = True

  def tasks(self, split: str) -> list[Task]:
    t = self.cfg
    tasks = gsm8k_tfds.load_tasks(self.options.manual_dir, split, data_dir=t.data_dir or None)
    return tasks[: t.num_train if split == "train" else t.num_test]

  def make_env(self, tok: Tokenizer) -> GSM8KEnv:
    return GSM8KEnv(tok)
