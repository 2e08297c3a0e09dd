"""Arithmetic chains whose length follows a declared heavy-tailed law, like reasoning traces.

Real reasoning traces are heavy-tailed: most are short, a few run ten or more times the mean
(coefficient of variation >= 1). That tail is what a synchronous step waits for (every row of
a step waits for its longest) and what continuous batching does not pay for. Arithmetic word
problems of 1..4 operations (`sao_jax.envs.arithmetic`) vary by 2-3x at most; here the number
of steps k of a problem is drawn from a law over 1..24 (by default), so the worked solution
(about 8 characters a step) runs from 12 to about 200 tokens.

A problem is a running total written as one expression, its solution the chain of steps:

  prompt:   "57+8-3=?"
  solution: "57+8=65;65-3=62;#62"

The start value is drawn from 1..max_start, each operand from 1..max_operand, and the total
stays in 0..max_total (an addition or subtraction that would leave it is not drawn), so every
step is short and the same kind of work: what grows with k is the length alone. The reward is
exact match on the text after the last '#' (`sao_jax.envs.arithmetic.ArithmeticEnv`).

Laws (`ChainSpec.law`), over k in min_steps..max_steps, renormalised there:
  * "zipf": P(k) proportional to k**-alpha (a discrete Pareto law);
  * "lognormal": P(k) = P(k - 1 < X <= k), X lognormal with log-mean mu and log-sd sigma.

Splits: a problem is in test when a hash of (seed, solution) falls below `test_fraction`, so
no problem is in both splits whatever their sizes. In both, k is drawn from the law first and
a problem of that k after it, so each split follows the law exactly; within each k the test
split keeps its problems unique until that k's test problems look exhausted (short chains have
few), then repeats them.
"""

from __future__ import annotations

import dataclasses
import math
import zlib

import numpy as np

from sao_jax.envs.base import Task, draw_hashed_split
from sao_jax.stats import length_summary  # noqa: F401 (re-exported: the law in data)

LAWS = ("zipf", "lognormal")
_OPS = "+-"
# Draws in a row that may fail (a train problem in test, or a test problem already drawn)
# before a step count's problems are declared exhausted (as in sao_jax.envs.arithmetic).
_MAX_CONSECUTIVE_REJECTS = 10_000
TRAIN_ID_OFFSET = 10**9  # train ids start here, so ids of the two splits never collide


@dataclasses.dataclass(frozen=True)
class ChainSpec:
  """What kind of chains to generate, and the law of their number of steps.

  Attributes:
    law: "zipf" or "lognormal" (see the module doc).
    alpha: the zipf law's exponent (> 0); larger puts more weight on short chains.
    mu, sigma: the lognormal law's log-mean and log-sd (sigma > 0).
    min_steps, max_steps: the range of the number of steps, 1 <= min <= max <= 64.
    max_start: the start value is drawn from 1..max_start.
    max_operand: every operand is drawn from 1..max_operand.
    max_total: the running total stays in 0..max_total (>= max_start, >= max_operand).
    test_fraction: share of the problem space reserved for the test split, in (0, 1).
  """

  law: str = "zipf"
  alpha: float = 2.0
  mu: float = 0.5
  sigma: float = 1.0
  min_steps: int = 1
  max_steps: int = 24
  max_start: int = 99
  max_operand: int = 9
  max_total: int = 99
  test_fraction: float = 0.2

  def __post_init__(self):
    if self.law not in LAWS:
      raise ValueError(f"law must be one of {LAWS}, got {self.law!r}")
    for name in ("alpha", "mu", "sigma", "test_fraction"):
      if not isinstance(getattr(self, name), (int, float)) or isinstance(getattr(self, name), bool):
        raise ValueError(f"{name} must be a number, got {getattr(self, name)!r}")
    if self.alpha <= 0 or self.sigma <= 0:
      raise ValueError(f"alpha and sigma must be > 0, got {self.alpha}, {self.sigma}")
    for name in ("min_steps", "max_steps", "max_start", "max_operand", "max_total"):
      v = getattr(self, name)
      if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
        raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    if not self.min_steps <= self.max_steps <= 64:
      raise ValueError(
        f"need 1 <= min_steps <= max_steps <= 64, got {self.min_steps}..{self.max_steps}"
      )
    if self.max_total < max(self.max_start, self.max_operand):
      raise ValueError(
        f"max_total {self.max_total} must be >= max_start {self.max_start} and max_operand "
        f"{self.max_operand}"
      )
    if not 0 < self.test_fraction < 1:
      raise ValueError(f"test_fraction must be in (0, 1), got {self.test_fraction!r}")
    if self.step_pmf().sum() == 0 or not np.isfinite(self.step_pmf()).all():
      raise ValueError(f"the {self.law} law puts no weight on {self.min_steps}..{self.max_steps}")

  def steps(self) -> np.ndarray:
    """The possible numbers of steps, min_steps..max_steps."""
    return np.arange(self.min_steps, self.max_steps + 1)

  def step_pmf(self) -> np.ndarray:
    """P(k) for each k of `steps()` (sums to 1)."""
    k = self.steps().astype(np.float64)
    if self.law == "zipf":
      w = k**-self.alpha
    else:

      def cdf(x: float) -> float:
        return (
          0.0 if x <= 0 else 0.5 * (1 + math.erf((math.log(x) - self.mu) / (self.sigma * 2**0.5)))
        )

      w = np.array([cdf(x) - cdf(x - 1) for x in k])
    total = w.sum()
    return w / total if total > 0 else w

  def step_moments(self) -> dict[str, float]:
    """Mean, coefficient of variation and max/mean of the number of steps, from the law."""
    k, p = self.steps(), self.step_pmf()
    mean = float(np.sum(k * p))
    sd = float(np.sqrt(np.sum(p * (k - mean) ** 2)))
    return {"mean": mean, "cv": sd / mean, "max_over_mean": self.max_steps / mean}

  @property
  def difficulty(self) -> int:
    return self.max_steps


def _step(rng: np.random.Generator, spec: ChainSpec, total: int) -> tuple[str, int]:
  """One (op, operand) that keeps the total in 0..max_total (one always exists)."""
  room = {"+": min(spec.max_operand, spec.max_total - total), "-": min(spec.max_operand, total)}
  ops = [op for op in _OPS if room[op] >= 1]
  op = ops[int(rng.integers(len(ops)))]
  return op, int(rng.integers(1, room[op] + 1))


def generate_task(rng: np.random.Generator, spec: ChainSpec, task_id: int, n_steps: int) -> Task:
  """One chain of `n_steps` steps; the same rng state always gives the same task."""
  total = start = int(rng.integers(1, spec.max_start + 1))
  prompt, lines = [str(start)], []
  for _ in range(n_steps):
    op, operand = _step(rng, spec, total)
    new = total + operand if op == "+" else total - operand
    prompt.append(f"{op}{operand}")
    lines.append(f"{total}{op}{operand}={new}")
    total = new
  answer = str(total)
  return Task(
    task_id=int(task_id),
    prompt="".join(prompt) + "=?",
    solution=";".join(lines) + ";#" + answer,
    answer=answer,
    difficulty=n_steps,
  )


def is_test_problem(solution: str, spec: ChainSpec, seed: int) -> bool:
  """Whether a problem (named by its solution) belongs to the test split."""
  return zlib.crc32(f"{seed}:{solution}".encode()) / 2**32 < spec.test_fraction


def make_split(spec: ChainSpec, split: str, num: int, seed: int) -> list[Task]:
  """`num` tasks of `split` ("train" or "test"); no problem is in both (see module doc).

  Task ids are `0..num-1` for test and `TRAIN_ID_OFFSET + i` for train. A split of size n is
  a prefix of one of size m > n.
  """
  if split not in ("train", "test"):
    raise ValueError(f"split must be 'train' or 'test', got {split!r}")
  if not isinstance(num, (int, np.integer)) or isinstance(num, bool) or num < 0:
    raise ValueError(f"num must be an int >= 0, got {num!r}")
  rng = np.random.default_rng(np.random.SeedSequence([seed, zlib.crc32(split.encode())]))
  offset = 0 if split == "test" else TRAIN_ID_OFFSET
  steps, pmf = spec.steps(), spec.step_pmf()
  return draw_hashed_split(
    num,
    want_test=split == "test",
    draw_kind=lambda: int(rng.choice(steps, p=pmf)),
    generate=lambda i, k: generate_task(rng, spec, offset + i, k),
    is_test=lambda solution: is_test_problem(solution, spec, seed),
    kinds=steps.tolist(),
    max_rejects=_MAX_CONSECUTIVE_REJECTS,
    what=lambda k: f"problem of {k} steps",
  )
