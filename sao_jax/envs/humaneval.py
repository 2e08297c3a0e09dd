"""HumanEval as an evaluation harness: sandboxed execution and unbiased pass@k.

A completion is scored the way HumanEval's reference harness scores it: the program is the
problem's prompt followed by the completion, then the problem's `check` function is called
on the entry point; the completion passes iff that raises nothing within the limits. Here
the program runs in `sao_jax.sandbox` (namespaces and rlimits) instead of the reference
harness's in-process `exec`, concurrently on a `SandboxPool`.

pass@k is Chen et al. (2021)'s unbiased estimator from n >= k samples per problem, c of
them correct:

  pass@k = 1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n - c + 1}^{n} (1 - k / i)

(the product form avoids the huge binomials), averaged over problems.

The harness takes any `generate(prompts, n) -> list[list[str]]`, so a user who brings a real
model (one whose tokenizer covers newlines and indentation) gets pass@1 and pass@10 with one
call; `sao-jax eval --suite humaneval` wires in a workdir's model.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

from sao_jax.data.humaneval_tfds import load_rows
from sao_jax.sandbox import Job, Limits, SandboxPool

# Reference harness: 3 s per problem on a fast machine; this leaves room for a loaded one.
HUMANEVAL_LIMITS = Limits(wall_s=10.0, cpu_s=10, memory_mb=1024, nproc=8, output_bytes=1 << 16)

Generate = Callable[[list[str], int], list[list[str]]]


@dataclasses.dataclass(frozen=True)
class Problem:
  """One HumanEval problem (field names as in HumanEval.jsonl)."""

  index: int
  task_id: str
  prompt: str
  canonical_solution: str
  test: str
  entry_point: str


def load_problems(data_dir: str | None = None) -> list[Problem]:
  """The 164 problems in HumanEval order (read through the TFDS builder)."""
  return [Problem(**row) for row in load_rows(data_dir)]


def problem_job(problem: Problem, completion: str, limits: Limits = HUMANEVAL_LIMITS) -> Job:
  """The sandbox job that checks `completion` (the text after the prompt)."""
  return Job(
    program=problem.prompt + completion,
    tests=(f"{problem.test}\ncheck({problem.entry_point})\n",),
    limits=limits,
  )


def pass_at_k(n: int, c: int, k: int) -> float:
  """Unbiased pass@k of one problem with n samples, c correct (formula in the module doc)."""
  if not 0 <= c <= n or not 1 <= k <= n:
    raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
  if n - c < k:
    return 1.0
  return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def evaluate(
  generate: Generate,
  problems: Sequence[Problem] | None = None,
  *,
  n: int = 10,
  ks: Sequence[int] = (1, 10),
  pool: SandboxPool | None = None,
  limits: Limits = HUMANEVAL_LIMITS,
) -> dict[str, Any]:
  """pass@k of `generate`'s completions on `problems` (default: all 164).

  Args:
    generate: `generate(prompts, n)` returns n completions per prompt, in order; each is
      the text that follows the prompt (the function body), as in HumanEval's samples.
    n: samples per problem; every k in `ks` must be <= n.
    pool: sandbox pool to run on (default: a new one for this call).

  Returns a JSON-friendly dict: `pass@k` for each k, `num_problems`, `n`, `statuses` (run
  outcomes counted over all samples) and `per_problem` (task_id, correct out of n, statuses).
  """
  problems = list(load_problems() if problems is None else problems)
  if not all(1 <= k <= n for k in ks):
    raise ValueError(f"every k in {tuple(ks)} must be in 1..n={n}")
  completions = generate([p.prompt for p in problems], n)
  if len(completions) != len(problems) or any(len(c) != n for c in completions):
    raise ValueError(
      f"generate(prompts, {n}) must return {n} completions for each of the {len(problems)} prompts"
    )
  jobs = [
    problem_job(p, c, limits) for p, cs in zip(problems, completions, strict=True) for c in cs
  ]
  if pool is None:
    with SandboxPool() as own:
      runs = own.map(jobs)
  else:
    runs = pool.map(jobs)
  per_problem, statuses = [], collections.Counter()
  for i, p in enumerate(problems):
    mine = runs[i * n : (i + 1) * n]
    counts = collections.Counter(r.status for r in mine)
    statuses.update(counts)
    per_problem.append(
      {"task_id": p.task_id, "correct": counts["passed"], "n": n, "statuses": dict(counts)}
    )
  out: dict[str, Any] = {
    f"pass@{k}": sum(pass_at_k(n, r["correct"], k) for r in per_problem) / len(problems) for k in ks
  }
  out.update(num_problems=len(problems), n=n, statuses=dict(statuses), per_problem=per_problem)
  return out
