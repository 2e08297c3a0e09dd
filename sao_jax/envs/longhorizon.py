"""Long-horizon, multi-step text tasks whose context grows with the episode (up to 1,000 steps).

Two families, both deterministic generators with a length knob, both served through the
:class:`~sao_jax.envs.base.Env` API (and TFDS, see `sao_jax.data.longhorizon_tfds`):

* ``retention`` — a multi-turn dialogue. Early turns tell facts ("Ann's pin: 7"), most turns
  are chit-chat, and at least `min_gap` (default 32) turns after a fact the user asks about
  it ("Ann's pin?"); reward 1 for the right digit. Chit-chat is mostly one repeated phrase, so
  it is predictable (redundant) while facts are not.
* ``navigation`` — a long corridor walk. Nearly every step is the same "hall." (action "f");
  a few decisive steps show a key with a code ("key 2 code 7"), and at least `min_gap` steps
  later a door asks for it ("door 2?"); reward 1 for the code. Stairs (a new level) every
  `level_len` steps are episode-internal boundaries.

Why generated: the policy must learn in minutes on a CPU, the horizon must be a knob, and the
steps that matter must be known, so the benchmark can check that compression keeps them.

A task stores its whole script in the plain :class:`Task` fields, so it round-trips through
TFDS unchanged: `prompt` holds the observation of every step, `solution` the expected action
of every step (both joined by newlines, which the char tokenizer cannot encode, so they never
collide with text), and `answer` the graded steps as "step=answer" pairs joined by commas.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Sequence

import numpy as np

from sao_jax.envs.base import StepResult, Task
from sao_jax.tokenizer import Tokenizer

TRAIN_ID_OFFSET = 10**9
FAMILIES = ("retention", "navigation")
SEP = "\n"
_NAMES = ("Ann", "Bob", "Sam", "Kim", "Tom", "Eve", "Max", "Zoe")
# Chit-chat: the first phrase most of the time (redundant), the others now and then.
_CHAT = ("Go on.", "Nice day.", "I agree.", "Tell me more.", "Ha, ok.")
_GREETING = "Hi again."  # opens a new session: a turn boundary
_HALL, _LAMP, _STAIRS = "hall.", "hall, lamp.", "stairs."
BOUNDARIES = frozenset({_GREETING, _STAIRS})


@dataclasses.dataclass(frozen=True)
class LongHorizonSpec:
  """What kind of episodes to generate.

  Attributes:
    family: "retention" or "navigation".
    n_steps: episode length in steps (turns), min_gap+1..1000.
    n_facts: facts (retention) or keys (navigation) per episode; each is asked exactly once,
      at least `min_gap` steps after it was given. At most 8.
    min_gap: steps between a fact and its question (retention is measured at 32+).
    p_noise: probability that a redundant step is a less common variant (chat phrase, lamp).
    period: a boundary step (new session / stairs) every `period` steps; 0: none.
  """

  family: str = "retention"
  n_steps: int = 44
  n_facts: int = 4
  min_gap: int = 32
  p_noise: float = 0.1
  period: int = 0

  def __post_init__(self):
    if self.family not in FAMILIES:
      raise ValueError(f"family {self.family!r} unknown; known: {FAMILIES}")
    if not 1 <= self.n_facts <= len(_NAMES):
      raise ValueError(f"n_facts must be in 1..{len(_NAMES)}, got {self.n_facts}")
    if self.min_gap < 1:
      raise ValueError(f"min_gap must be >= 1, got {self.min_gap}")
    if not 3 * self.n_facts + self.min_gap <= self.n_steps <= 1000:
      raise ValueError(
        f"n_steps must be in {3 * self.n_facts + self.min_gap}..1000 for "
        f"{self.n_facts} facts at gap {self.min_gap}, got {self.n_steps}"
      )
    if not 0.0 <= self.p_noise <= 1.0 or self.period < 0:
      raise ValueError("p_noise must be in [0, 1] and period >= 0")

  @property
  def name(self) -> str:
    return (
      f"{self.family}_n{self.n_steps}_f{self.n_facts}_g{self.min_gap}"
      f"_p{int(round(self.p_noise * 100))}_b{self.period}"
    )


def generate_task(rng: np.random.Generator, spec: LongHorizonSpec, task_id: int) -> Task:
  """Draws one episode script; the same rng state always gives the same task."""
  n, k, gap = spec.n_steps, spec.n_facts, spec.min_gap
  # Fact steps first (distinct, early enough), then each fact's question on a free step at
  # >= fact + gap; facts end before n - gap - 2k, so each question has >= 2k + 1 candidate
  # steps of which at most 2k - 1 are taken.
  facts = np.sort(rng.choice(n - gap - 2 * k, size=k, replace=False))
  used = set(facts.tolist())
  questions = []
  for f in facts:
    free = [s for s in range(int(f) + gap, n) if s not in used]
    q = int(free[rng.integers(len(free))])
    used.add(q)
    questions.append(q)
  names = rng.permutation(len(_NAMES))[:k]
  values = rng.integers(0, 10, size=k)
  obs, acts, graded = [], [], []
  default = "ok" if spec.family == "retention" else "f"
  for s in range(n):
    if spec.period and s > 0 and s % spec.period == 0:
      o = _GREETING if spec.family == "retention" else _STAIRS
    elif spec.family == "retention":
      o = _CHAT[0] if rng.random() >= spec.p_noise else _CHAT[1 + rng.integers(len(_CHAT) - 1)]
    else:
      o = _LAMP if rng.random() < spec.p_noise else _HALL
    obs.append(o)
    acts.append(default)
  for i, (f, q) in enumerate(zip(facts.tolist(), questions, strict=True)):
    name, value = _NAMES[names[i]], str(int(values[i]))
    if spec.family == "retention":
      obs[f], obs[q] = f"{name}'s pin: {value}", f"{name}'s pin?"
    else:
      obs[f], obs[q] = f"key {i} code {value}", f"door {i}?"
    acts[q] = value
    graded.append((q, value))
  graded.sort()
  return Task(
    task_id=int(task_id),
    prompt=SEP.join(obs),
    solution=SEP.join(acts),
    answer=",".join(f"{q}={a}" for q, a in graded),
    difficulty=n,
  )


def make_split(
  spec: LongHorizonSpec, split: str, num: int, seed: int, *, num_test: int | None = None
) -> list[Task]:
  """`num` tasks of `split`, disjoint from the other split (same contract as arithmetic's).

  Test ids are 0..num-1, train ids TRAIN_ID_OFFSET + i; train rejects any episode whose script
  is in the test split of size `num_test` (needed for "train").
  """
  if split not in ("train", "test"):
    raise ValueError(f"split must be 'train' or 'test', got {split!r}")
  rng = np.random.default_rng(
    np.random.SeedSequence([seed, zlib.crc32(split.encode()), zlib.crc32(spec.name.encode())])
  )
  if split == "test":
    return [generate_task(rng, spec, i) for i in range(num)]
  if num_test is None or num_test < 0:
    raise ValueError("split='train' needs num_test (an int >= 0) to exclude")
  test = frozenset(t.prompt for t in make_split(spec, "test", num_test, seed))
  tasks: list[Task] = []
  while len(tasks) < num:
    task = generate_task(rng, spec, TRAIN_ID_OFFSET + len(tasks))
    if task.prompt not in test:
      tasks.append(task)
  return tasks


def graded_steps(task: Task) -> dict[int, str]:
  """Step index -> expected answer for the steps that carry reward."""
  pairs = (p.split("=") for p in task.answer.split(",") if p)
  return {int(s): a for s, a in pairs}


class LongHorizonEnv:
  """Plays a task's script step by step.

  Each step shows the step's observation; the action is graded (reward 1 iff the decoded
  action equals the expected answer) only on question/door steps, and ignored elsewhere.
  `info["boundary"]` marks episode-internal boundaries (new session, stairs), which the
  temporal filter always keeps.
  """

  def __init__(self, tokenizer: Tokenizer, max_steps: int = 1000):
    self._tok = tokenizer
    self.max_steps = max_steps
    self._obs: list[str] = []
    self._graded: dict[int, str] = {}
    self._t = -1

  def reset(self, task: Task) -> np.ndarray:
    self._obs = task.prompt.split(SEP)
    if len(self._obs) > self.max_steps:
      raise ValueError(f"task has {len(self._obs)} steps > env.max_steps {self.max_steps}")
    self._graded = graded_steps(task)
    self._t = 0
    return self.observation(0)

  def observation(self, t: int) -> np.ndarray:
    return np.asarray(self._tok.encode(self._obs[t]), np.int32)

  def step(self, action_tokens: Sequence[int] | np.ndarray) -> StepResult:
    if not 0 <= self._t < len(self._obs):
      raise RuntimeError("LongHorizonEnv.step() with no episode in progress; call reset(task)")
    t = self._t
    expected = self._graded.get(t)
    text = self._tok.decode(action_tokens).strip()
    reward = float(expected is not None and text == expected)
    self._t += 1
    done = self._t >= len(self._obs)
    nxt = np.zeros((0,), np.int32) if done else self.observation(self._t)
    boundary = (not done) and self._obs[self._t] in BOUNDARIES
    return StepResult(
      observation=nxt,
      reward=reward,
      done=done,
      info={
        "step": t,
        "graded": expected is not None,
        "expected": expected,
        "answer": text,
        "next_boundary": boundary,
      },
    )
