"""Procedurally generated one-line coding tasks, rewarded by running hidden tests in a sandbox.

Why generated: a small char-level policy on a laptop CPU has to be able to learn the task,
the difficulty must be a knob, and train and test must be provably disjoint. A task is a
composition of `depth` stages of a small DSL over one input `x` (a list of small ints, a
short string, or an int): list and string stages (sort, reverse, slices, maps, filters),
reductions (sum, count) and integer arithmetic. The prompt names the stages in order, as a
docstring, and shows two input/output examples; the policy writes the function body:

  prompt:   def f(x): "sort, first 2, sum" # f([5,1,4])==5; f([2])==2
  solution: return sum(sorted(x)[:2])

Everything is printable ASCII on one line (the char tokenizer has no newline). The program
that runs is `def f(x): ` + the completion; the reward is the fraction of the hidden tests
(5 other inputs, never the shown ones) it passes, each test checking the exact type and
value. Prompts are at most `MAX_PROMPT_CHARS` (72) characters, 54 on average, and canonical
solutions at most `MAX_SOLUTION_CHARS` (47), 20 on average: BOS + prompt padded to 80 tokens
plus solution + EOS fit a 128-token context.

Splits are disjoint by program: a program (canonical body) is a test program iff a hash of
it and the seed falls in the test fraction, so no test program is ever a train program (a
train task may repeat a program with other examples; the test split keeps programs unique
while the space allows). Words such as "sort" or "first 2" therefore appear in training,
but the compositions under test never do.

Hidden tests travel in `Task.answer` as JSON, `[[input, output], ...]` with Python literals.
"""

from __future__ import annotations

import ast
import concurrent.futures
import dataclasses
import json
import re
import warnings
import zlib
from collections.abc import Sequence

import numpy as np

from sao_jax.envs.base import SingleTurnEnv, StepResult, Task, draw_hashed_split
from sao_jax.sandbox import Job, Limits, RunResult, SandboxPool
from sao_jax.tokenizer import Tokenizer

TRAIN_ID_OFFSET = 10**9
MAX_DEPTH = 4
MAX_PROMPT_CHARS = 72
MAX_SOLUTION_CHARS = 47
KINDS = "lsi"  # list of ints, string, int
# A program runs in well under a millisecond; the limits only stop runaway completions.
CODE_LIMITS = Limits(wall_s=2.0, cpu_s=1, memory_mb=256, nproc=8, output_bytes=4096, scratch_mb=1)
# Draws in a row that may miss (a program of the other split, a repeat) before a depth's test
# programs are taken as exhausted. Depth 1 has ~9 test programs among ~45: at 2_000 draws a
# missing one is overlooked with probability about (1 - 1/45)**2000 ~ 1e-20.
_MAX_CONSECUTIVE_REJECTS = 2_000
_HEAD = "def f(x): "
_COMPLETION_FILE = "<completion>"
# Compiling a policy's completion (`precheck`) may raise SyntaxWarnings ("'int' object is not
# callable"): thousands of lines on stderr per run, about code that is scored anyway. Only
# warnings attributed to that pseudo-file are silenced; a filter (unlike catch_warnings) is
# safe while scoring runs in a background thread.
warnings.filterwarnings("ignore", category=SyntaxWarning, module=re.escape(_COMPLETION_FILE) + "$")

# Precedence of an expression's top-level operator; atoms (names, calls, subscripts,
# displays) bind tightest.
_ANY, _ADD, _MUL, _POW, _ATOM = 0, 5, 6, 8, 9


@dataclasses.dataclass(frozen=True)
class _Stage:
  """One DSL operation: `word` for the docstring, `code` a template over the input X.

  `prec` is the precedence of the result; `needs` the least precedence X may have without
  parentheses (an atom before `.m()` or `[...]`, a tighter operator on the left of a
  binary one, anything inside a call or a comprehension).
  """

  word: str
  code: str
  kind_in: str
  kind_out: str
  consts: tuple = (None,)
  prec: int = _ATOM
  needs: int = _ANY

  def render(self, inner: str, inner_prec: int, k) -> tuple[str, str]:
    if inner_prec < self.needs:
      inner = f"({inner})"
    return self.word.format(k=k), self.code.replace("X", inner).format(k=k)


_POSTFIX = dict(needs=_ATOM)
_STAGES = (
  # list -> list
  _Stage("sort", "sorted(X)", "l", "l"),
  _Stage("reverse", "X[::-1]", "l", "l", **_POSTFIX),
  _Stage("times {k}", "[v*{k} for v in X]", "l", "l", (2, 3)),
  _Stage("add {k}", "[v+{k} for v in X]", "l", "l", (1, 2, 3)),
  _Stage("square", "[v*v for v in X]", "l", "l"),
  _Stage("evens", "[v for v in X if v%2==0]", "l", "l"),
  _Stage("odds", "[v for v in X if v%2]", "l", "l"),
  _Stage("over {k}", "[v for v in X if v>{k}]", "l", "l", (2, 3, 4, 5)),
  _Stage("first {k}", "X[:{k}]", "l", "l", (1, 2, 3), **_POSTFIX),
  _Stage("drop {k}", "X[{k}:]", "l", "l", (1, 2), **_POSTFIX),
  # list -> int
  _Stage("sum", "sum(X)", "l", "i"),
  _Stage("count", "len(X)", "l", "i"),
  # string -> string
  _Stage("upper", "X.upper()", "s", "s", **_POSTFIX),
  _Stage("reverse", "X[::-1]", "s", "s", **_POSTFIX),
  _Stage("sort", "''.join(sorted(X))", "s", "s"),
  _Stage("first {k}", "X[:{k}]", "s", "s", (1, 2, 3), **_POSTFIX),
  _Stage("drop {k}", "X[{k}:]", "s", "s", (1, 2), **_POSTFIX),
  _Stage("twice", "X*2", "s", "s", prec=_MUL, needs=_MUL),
  _Stage("no {k}", "X.replace('{k}','')", "s", "s", ("a", "b", "c"), **_POSTFIX),
  # string -> int
  _Stage("count", "len(X)", "s", "i"),
  _Stage("count {k}", "X.count('{k}')", "s", "i", ("a", "b", "c"), **_POSTFIX),
  # int -> int (all left-associative but '**', whose left operand must bind tighter)
  _Stage("add {k}", "X+{k}", "i", "i", (1, 2, 3, 4, 5), prec=_ADD, needs=_ADD),
  _Stage("minus {k}", "X-{k}", "i", "i", (1, 2, 3), prec=_ADD, needs=_ADD),
  _Stage("times {k}", "X*{k}", "i", "i", (2, 3), prec=_MUL, needs=_MUL),
  _Stage("half", "X//2", "i", "i", prec=_MUL, needs=_MUL),
  _Stage("mod {k}", "X%{k}", "i", "i", (2, 3, 5), prec=_MUL, needs=_MUL),
  _Stage("square", "X**2", "i", "i", prec=_POW, needs=_ATOM),
)
_BY_KIND = {kind: tuple(s for s in _STAGES if s.kind_in == kind) for kind in KINDS}


@dataclasses.dataclass(frozen=True)
class CodeSpec:
  """What kind of coding tasks to generate.

  Attributes:
    min_depth, max_depth: each task composes a depth drawn uniformly from this range of
      stages (1..4); a task's difficulty is its depth.
    kinds: input kinds that may appear, a subset of "lsi" (list of ints, string, int),
      stored in canonical order.
    num_hidden: hidden tests per task (the reward's denominator).
    test_fraction: share of the program space reserved for the test split.
  """

  min_depth: int = 1
  max_depth: int = 3
  kinds: str = KINDS
  num_hidden: int = 5
  test_fraction: float = 0.2

  def __post_init__(self):
    for name in ("min_depth", "max_depth"):
      v = getattr(self, name)
      if not _is_int(v) or not 1 <= v <= MAX_DEPTH:
        raise ValueError(f"{name} must be an int in 1..{MAX_DEPTH}, got {v!r}")
    if self.min_depth > self.max_depth:
      raise ValueError(f"min_depth {self.min_depth} > max_depth {self.max_depth}")
    if (
      not isinstance(self.kinds, str)
      or not self.kinds
      or set(self.kinds) - set(KINDS)
      or (len(set(self.kinds)) != len(self.kinds))
    ):
      raise ValueError(f"kinds must be a non-empty subset of {KINDS!r}, got {self.kinds!r}")
    if not _is_int(self.num_hidden) or not 1 <= self.num_hidden <= 20:
      raise ValueError(f"num_hidden must be an int in 1..20, got {self.num_hidden!r}")
    if not isinstance(self.test_fraction, float) or not 0 < self.test_fraction < 1:
      raise ValueError(f"test_fraction must be a float in (0, 1), got {self.test_fraction!r}")
    object.__setattr__(self, "kinds", "".join(k for k in KINDS if k in self.kinds))


def spec_for_difficulty(level: int, **kw) -> CodeSpec:
  """Tasks of exactly `level` stages (1..4)."""
  return CodeSpec(min_depth=level, max_depth=level, **kw)


def _sample_input(rng: np.random.Generator, kind: str):
  if kind == "l":
    return [int(v) for v in rng.integers(0, 10, rng.integers(0, 5))]
  if kind == "s":
    return "".join("abcde"[i] for i in rng.integers(0, 5, rng.integers(1, 7)))
  return int(rng.integers(0, 21))


def _lit(value) -> str:
  """A compact Python literal: `[1,2]`, `'ab'`, `7`."""
  return repr(value).replace(", ", ",")


def _sample_program(rng: np.random.Generator, spec: CodeSpec, depth: int) -> tuple[str, str, str]:
  """(input kind, docstring, body expression) of `depth` stages; consecutive stages differ."""
  kind = spec.kinds[rng.integers(len(spec.kinds))]
  words, expr, prec, last = [], "x", _ATOM, None
  cur = kind
  for _ in range(depth):
    options = [s for s in _BY_KIND[cur] if s is not last]
    stage = options[rng.integers(len(options))]
    k = stage.consts[rng.integers(len(stage.consts))]
    word, expr = stage.render(expr, prec, k)
    words.append(word)
    prec, cur, last = stage.prec, stage.kind_out, stage
  return kind, ", ".join(words), expr


def generate_task(
  rng: np.random.Generator, spec: CodeSpec, task_id: int, depth: int | None = None
) -> Task:
  """Draws one task (of `depth` stages, else a depth drawn from the spec's range); the same
  rng state always gives the same task.

  Redraws the program (keeping the depth, so depths stay uniform) when the two shown
  examples have the same output (they would say little, and a program that is constant,
  e.g. "evens, odds", never gets past this), and when the prompt or the solution is over
  its length cap.
  """
  if depth is None:
    depth = int(rng.integers(spec.min_depth, spec.max_depth + 1))
  while True:
    kind, doc, expr = _sample_program(rng, spec, depth)
    fn = eval(f"lambda x: {expr}")  # our own DSL expression, never a policy's output
    inputs = _distinct_inputs(rng, kind, 2 + spec.num_hidden)
    if inputs is None:
      continue
    outputs = [fn(x) for x in inputs]
    if _lit(outputs[0]) == _lit(outputs[1]):
      continue
    shown = "; ".join(
      f"f({_lit(i)})=={_lit(o)}" for i, o in zip(inputs[:2], outputs[:2], strict=True)
    )
    prompt = f'{_HEAD}"{doc}" # {shown}'
    solution = f"return {expr}"
    if len(prompt) > MAX_PROMPT_CHARS or len(solution) > MAX_SOLUTION_CHARS:
      continue
    hidden = [[_lit(i), _lit(o)] for i, o in zip(inputs[2:], outputs[2:], strict=True)]
    return Task(
      task_id=int(task_id),
      prompt=prompt,
      solution=solution,
      answer=json.dumps(hidden, separators=(",", ":")),
      difficulty=depth,
    )


def _distinct_inputs(rng: np.random.Generator, kind: str, n: int) -> list | None:
  seen, out = set(), []
  for _ in range(50 * n):
    x = _sample_input(rng, kind)
    if _lit(x) not in seen:
      seen.add(_lit(x))
      out.append(x)
      if len(out) == n:
        return out
  return None


def is_test_program(solution: str, spec: CodeSpec, seed: int) -> bool:
  """Whether the program `solution` belongs to the test split (a fixed hash partition)."""
  bucket = zlib.crc32(f"{seed}:{solution}".encode()) / 2**32
  return bucket < spec.test_fraction


def make_split(spec: CodeSpec, split: str, num: int, seed: int) -> list[Task]:
  """`num` tasks of `split` ("train" or "test"); no program is in both (see module doc).

  Depths are uniform over the spec's range in both splits. The test split keeps its
  programs unique within each depth until that depth's test programs look exhausted (depth
  1 has few), then repeats them with new examples. Task ids are `0..num-1` for test and
  `TRAIN_ID_OFFSET + i` for train. A split of size n is a prefix of one of size m > n.
  """
  if split not in ("train", "test"):
    raise ValueError(f"split must be 'train' or 'test', got {split!r}")
  if not _is_int(num) or num < 0:
    raise ValueError(f"num must be an int >= 0, got {num!r}")
  rng = np.random.default_rng(np.random.SeedSequence([seed, zlib.crc32(split.encode())]))
  offset = 0 if split == "test" else TRAIN_ID_OFFSET
  return draw_hashed_split(
    num,
    want_test=split == "test",
    draw_kind=lambda: int(rng.integers(spec.min_depth, spec.max_depth + 1)),
    generate=lambda i, depth: generate_task(rng, spec, offset + i, depth),
    is_test=lambda solution: is_test_program(solution, spec, seed),
    kinds=range(spec.min_depth, spec.max_depth + 1),
    max_rejects=_MAX_CONSECUTIVE_REJECTS,
    what=lambda depth: f"program of depth {depth} for {spec}",
  )


# A flawed teacher's systematic misreadings of stage words (`misread_solution`): a weaker
# coder's confusions, each a textual rewrite of the canonical code that keeps its length
# within a character (the context budget) and its style.
CODE_MISREADS = {
  "evens": ("if v%2==0]", "if v%2]"),  # keeps the odd values instead
  "first": (re.compile(r"\[:(\d)\]"), r"[-\1:]"),  # takes the last k instead
  "add": ("+", "-"),  # subtracts instead ("add k" is the only stage that writes '+')
  "reverse": ("[::-1]", ""),  # forgets to reverse
  "upper": (".upper()", ".lower()"),  # lower-cases instead
}


def misread_solution(task: Task, misreads: Sequence[str]) -> str:
  """The solution a flawed teacher writes for `task`: every stage word in `misreads` (keys
  of CODE_MISREADS) is read the wrong way, the same way every time ("evens" keeps the odd
  values, "first k" takes the last k), so that imitation learns the flaw; tasks without such
  a stage keep their true solution. Hidden tests (the reward) stay true. Raises ValueError
  on an unknown word."""
  bad = sorted(set(misreads) - set(CODE_MISREADS))
  if bad:
    raise ValueError(f"code misreads {bad} unknown; known: {', '.join(CODE_MISREADS)}")
  out = task.solution
  for word in misreads:
    old, new = CODE_MISREADS[word]
    out = old.sub(new, out) if isinstance(old, re.Pattern) else out.replace(old, new)
  return out


def hidden_tests(task: Task) -> list[str]:
  """The task's hidden tests as Python statements: exact type (no bool for int, no
  subclass with a forgiving __eq__) and exact value."""
  tests = []
  for inp, out in json.loads(task.answer):
    want = type(ast.literal_eval(out)).__name__
    elems = " and all(type(v) is int for v in r)" if want == "list" else ""
    tests.append(f"r = f({inp})\nassert type(r) is {want}{elems} and r == {out}")
  return tests


def task_job(task: Task, completion: str, limits: Limits = CODE_LIMITS) -> Job:
  """The sandbox job that scores `completion` (a one-line function body) on `task`."""
  return Job(program=_HEAD + completion, tests=tuple(hidden_tests(task)), limits=limits)


def precheck(completion: str) -> str:
  """Why `completion` cannot pass without running it, or "" when it has to be run.

  Compiling costs microseconds; a sandbox run costs tens of milliseconds. A body that does
  not compile, or never returns, passes no test (no expected output is None).
  """
  if not completion.strip():
    return "empty completion"
  try:
    compile(_HEAD + completion, _COMPLETION_FILE, "exec")
  except (SyntaxError, ValueError) as err:
    return f"{type(err).__name__}: {err}"
  if "return" not in completion:
    return "the body returns nothing"
  return ""


class CodeEnv(SingleTurnEnv):
  """Single-turn coding environment; reward = fraction of hidden tests passed.

  `reset`/`step` implement the `Env` protocol one episode at a time. Samplers that hold a
  batch of finished slots call `score_batch` (or `score_batch_async`, to overlap scoring
  with their next decode call): completions that fail `precheck` are scored at once
  without a sandbox, identical (task, completion) pairs run once, and the rest run
  concurrently on the `SandboxPool`. A run the sandbox reports "blocked" earns 0. Each
  result's info says whether a sandbox scored it (`sandboxed`) and how many sandbox runs it
  cost (`sandbox_runs`: 1 for the first of identical pairs, 0 for the copies and for
  completions `precheck` rejected), so that summing `sandbox_runs` counts executions.

  Reward: (1 - format_weight) * passed / hidden + format_weight * format_ok, where
  format_ok means the body compiles and returns something.

  The pool is the caller's if given (shared by several envs), else created on first use
  and closed by `close()` (or at exit).
  """

  def __init__(
    self,
    tokenizer: Tokenizer,
    pool: SandboxPool | None = None,
    *,
    limits: Limits = CODE_LIMITS,
    format_weight: float = 0.0,
  ):
    if not 0.0 <= format_weight < 1.0:
      raise ValueError(f"format_weight must be in [0, 1), got {format_weight!r}")
    super().__init__(tokenizer)
    self._pool, self._owns_pool = pool, pool is None
    self._limits, self._format_weight = limits, format_weight
    self._bg: concurrent.futures.ThreadPoolExecutor | None = None

  @property
  def pool(self) -> SandboxPool:
    if self._pool is None:
      self._pool = SandboxPool()
    return self._pool

  def _grade(self, task: Task, action_tokens: Sequence[int] | np.ndarray) -> StepResult:
    return self.score_batch([task], [action_tokens])[0]

  @staticmethod
  def step_many(
    envs: Sequence[CodeEnv], actions: Sequence[Sequence[int] | np.ndarray]
  ) -> list[StepResult]:
    """`step` of several episodes at once (each env mid-episode), scored concurrently on the
    first env's pool: what a sampler does with a batch of finished slots."""
    for env in envs:
      if env._done:
        raise RuntimeError("CodeEnv.step_many() on an env with no episode in progress")
      env._done = True
    return envs[0].score_batch([env._task for env in envs], actions)

  def score_batch(
    self, tasks: Sequence[Task], actions: Sequence[Sequence[int] | np.ndarray]
  ) -> list[StepResult]:
    """One StepResult per (task, action tokens) pair; independent of reset/step state."""
    return self.score_texts(tasks, [self._tokenizer.decode(a) for a in actions])

  def score_batch_async(
    self, tasks: Sequence[Task], actions: Sequence[Sequence[int] | np.ndarray]
  ) -> concurrent.futures.Future[list[StepResult]]:
    """`score_batch` in the background; the future holds its list."""
    if self._bg is None:
      self._bg = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="code-score")
    texts = [self._tokenizer.decode(a) for a in actions]
    return self._bg.submit(self.score_texts, list(tasks), texts)

  def score_texts(self, tasks: Sequence[Task], completions: Sequence[str]) -> list[StepResult]:
    if len(tasks) != len(completions):
      raise ValueError(f"{len(tasks)} tasks but {len(completions)} completions")
    results: list[StepResult | None] = [None] * len(tasks)
    pending: dict[tuple[str, str], list[int]] = {}
    for i, (task, text) in enumerate(zip(tasks, completions, strict=True)):
      why = precheck(text)
      if why:
        results[i] = self._result(task, text, None, why)
      else:
        pending.setdefault((task.answer, text), []).append(i)
    keys = list(pending)
    runs = self.pool.map([task_job(tasks[pending[k][0]], k[1], self._limits) for k in keys])
    for key, run in zip(keys, runs, strict=True):
      for i in pending[key]:
        results[i] = self._result(tasks[i], key[1], run, "", executed=i == pending[key][0])
    return results

  def _result(
    self, task: Task, text: str, run: RunResult | None, why: str, executed: bool = False
  ) -> StepResult:
    total = len(json.loads(task.answer))
    if run is None:
      passed, status, detail, fmt = 0, "failed", why, False
    else:
      passed, status, detail, fmt = run.tests_passed, run.status, run.detail, True
    frac = 0.0 if status == "blocked" else passed / total
    reward = (1 - self._format_weight) * frac + self._format_weight * float(fmt)
    return StepResult(
      observation=np.zeros((0,), np.int32),
      reward=float(reward),
      done=True,
      info={
        "status": status,
        "tests_passed": passed,
        "tests_total": total,
        "format_ok": fmt,
        "sandboxed": run is not None,
        "sandbox_runs": int(executed),
        "detail": detail,
        "completion": text,
      },
    )

  def close(self) -> None:
    if self._bg is not None:
      self._bg.shutdown(wait=True)
      self._bg = None
    if self._owns_pool and self._pool is not None:
      self._pool.close()
      self._pool = None

  def __enter__(self) -> CodeEnv:
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def _is_int(x) -> bool:
  return isinstance(x, (int, np.integer)) and not isinstance(x, bool)
