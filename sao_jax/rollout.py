"""SAO sampling: one trajectory per task, many tasks decoded side by side.

Two ways. `ContinuousSampler` (continuous batching, the default of SAO samplers) refills a
slot the moment its completion ends, with that episode's next step or a new task. The older
`sao_sampling` (also used for greedy evaluation) runs a batch of slots (each slot a
different task's single trajectory) through up to `max_steps` environment steps, each step
one fixed-shape jitted sampler call over all slots, until the slowest slot is done.

The context of step k is the task's observation tokens plus all earlier actions and
observations, left-padded to the prompt length (the most recent tokens are kept when it
overflows: the raw window; the compressed memory of a later stage covers the rest).
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable, Sequence

import jax
import numpy as np

from sao_jax.envs.base import Env, Task
from sao_jax.packing import left_pad
from sao_jax.tokenizer import Tokenizer


@dataclasses.dataclass
class Trajectory:
  """Rows are environment steps: the context the policy saw, what it emitted, and reward."""

  task_index: int
  task_id: int
  policy_version: int
  prompt: np.ndarray  # [S, P] int32
  prompt_valid: np.ndarray  # [S, P] bool
  tokens: np.ndarray  # [S, T] int32
  valid: np.ndarray  # [S, T] bool
  logp: np.ndarray  # [S, T] f32, behaviour log-probs
  rewards: np.ndarray  # [S] f32
  step_seconds: np.ndarray  # [S] f32
  done: bool
  t_end: float  # time.time() when the trajectory finished
  infos: list[dict]  # each step's StepResult.info (diagnostics; not shipped to the learner)
  reward_seconds: float = 0.0  # this trajectory's share of the environment-step time
  version: np.ndarray | None = None  # [S, T] int32 policy version of each token (-1: none)
  lineage: int = -1  # the lineage of every token's policy (sao_jax.lineage; -1: none)

  @property
  def total_reward(self) -> float:
    return float(self.rewards.sum())

  def arrays(self) -> dict[str, np.ndarray]:
    """What travels to the learner. `version` is the per-token policy version (a sampler that
    never switches parameters mid-trajectory writes policy_version on every valid token)."""
    version = self.version
    if version is None:
      version = np.where(self.valid, self.policy_version, -1).astype(np.int32)
    return dict(
      {
        k: getattr(self, k)
        for k in ("prompt", "prompt_valid", "tokens", "valid", "logp", "rewards", "step_seconds")
      },
      version=version,
    )


def _step_each(envs, actions):
  return [env.step(a) for env, a in zip(envs, actions, strict=True)]


def identity_compression(traj: Trajectory) -> Trajectory:
  return traj


def sao_sampling(
  sample_fn: Callable,
  params,
  envs: Sequence[Env],
  tasks: Sequence[Task],
  task_indices: Sequence[int],
  tok: Tokenizer,
  *,
  slots: int,
  prompt_len: int,
  max_steps: int,
  rng: jax.Array,
  policy_version: int,
  compress: Callable[[Trajectory], Trajectory] = identity_compression,
  step_many: Callable | None = None,
  lineage: int = -1,
) -> list[Trajectory]:
  """Samples one trajectory for each of `tasks` (at most `slots`), in one batch of slots.

  Args:
    sample_fn: jitted `(params, prompt_bp, prompt_valid_bp, rng) -> SampleOutput` over
      exactly `slots` rows.
    envs: one environment per task (episodes run side by side).
    step_many: `(envs, actions) -> [StepResult]` for the active slots of one decode call
      (default: each env's `step` in turn); a task family's `step_many` scores them at once.
  """
  n = len(tasks)
  if not 0 < n <= slots or len(envs) != n or len(task_indices) != n:
    raise ValueError(f"need 1..{slots} tasks with one env each, got {n} tasks, {len(envs)} envs")
  contexts = [
    list(tok.encode("", add_bos=True)) + env.reset(t).tolist()
    for env, t in zip(envs, tasks, strict=True)
  ]
  steps: list[list[tuple]] = [[] for _ in range(n)]
  reward_s = 0.0  # host time in the environments' steps (rewards), all slots together
  active = np.ones(n, bool)
  for _ in range(max_steps):
    if not active.any():
      break
    t0 = time.time()
    rows = [c[-prompt_len:] for c in contexts] + [[tok.bos_id]] * (slots - n)
    prompt, pvalid = left_pad(rows, prompt_len, tok.pad_id)
    rng, key = jax.random.split(rng)
    out = jax.device_get(sample_fn(params, prompt, pvalid, key))
    dt = time.time() - t0
    live = np.flatnonzero(active)
    t_env = time.time()
    results = (step_many or _step_each)([envs[i] for i in live], [out.tokens_bt[i] for i in live])
    reward_s += time.time() - t_env
    for i, res in zip(live, results, strict=True):
      steps[i].append(
        (
          prompt[i],
          pvalid[i],
          out.tokens_bt[i],
          out.valid_bt[i],
          out.logp_bt[i],
          res.reward,
          dt,
          res.info,
        )
      )
      if res.done:
        active[i] = False
      else:
        action = out.tokens_bt[i][out.valid_bt[i]].tolist()
        contexts[i] += action + res.observation.tolist()
  now = time.time()
  trajs = []
  for i in range(n):
    cols = list(zip(*steps[i], strict=True))
    trajs.append(
      compress(
        Trajectory(
          task_index=int(task_indices[i]),
          task_id=tasks[i].task_id,
          policy_version=policy_version,
          lineage=lineage,
          prompt=np.stack(cols[0]),
          prompt_valid=np.stack(cols[1]),
          tokens=np.stack(cols[2]),
          valid=np.stack(cols[3]),
          logp=np.stack(cols[4]).astype(np.float32),
          rewards=np.asarray(cols[5], np.float32),
          step_seconds=np.asarray(cols[6], np.float32),
          done=not active[i],
          t_end=now,
          infos=list(cols[7]),
          reward_seconds=reward_s / n,
        )
      )
    )
  return trajs


@dataclasses.dataclass
class _Episode:
  """A task in progress in a continuous sampler: its env, context and finished steps."""

  index: int  # task index (what the learner handed out)
  task: Task
  env: Env
  context: list[int]
  steps: list[tuple] = dataclasses.field(default_factory=list)
  prompt: tuple | None = None  # (prompt row, valid row) of the step being decoded
  t_fill: float = 0.0
  reward_s: float = 0.0  # its share of the environment-step time


INFLIGHT_MODES = ("off", "steps", "tokens")


class ContinuousSampler:
  """Host side of continuous batching (`sao_jax.slots`): B slots decode side by side, each
  holding one step of one task's trajectory; when a completion ends, the environment steps
  and the slot is refilled at once with that episode's next step or a new task, so no slot
  waits for the slowest row of a batch. Trajectories are emitted the moment they end.

  New parameters are taken between decode calls according to `inflight`:
    "tokens": at once; a completion may then mix versions, and every token records its own;
    "steps":  once no completion is in flight (refilling pauses until then), so each step's
              tokens come from one version (a multi-step trajectory may still mix);
    "off":    once no trajectory is in flight (new tasks wait), one version per trajectory.
  Parameters of another lineage (the learner resumed or rolled back: `sao_jax.lineage`) are
  taken at once whatever `inflight` says, and every episode in flight starts again from its
  task's first prompt under them: no token of a discarded lineage is sent on. A trajectory's
  tokens are therefore all of one lineage (`Trajectory.lineage`).

  Programs (jitted by the caller over exactly `slots` rows and `refill_rows` prompts):
    fill(params, slots, prompt_rp, prompt_valid_rp, slot_r) -> slots
    decode(params, slots, version, rng, min_done) -> slots
    refresh(params, slots) -> slots: the caches recomputed under new params ("tokens")
  """

  def __init__(
    self,
    fill: Callable,
    decode: Callable,
    refresh: Callable,
    empty,
    tok: Tokenizer,
    *,
    slots: int,
    refill_rows: int,
    prompt_len: int,
    max_steps: int,
    make_env: Callable,
    step_many: Callable | None = None,
    inflight: str = "tokens",
    seed: int = 0,
  ):
    if inflight not in INFLIGHT_MODES:
      raise ValueError(f"inflight {inflight!r} unknown; known: {', '.join(INFLIGHT_MODES)}")
    self.fill_fn, self.decode_fn, self.refresh_fn, self.state = fill, decode, refresh, empty
    self.tok, self.slots, self.refill_rows = tok, slots, refill_rows
    self.prompt_len, self.max_steps = prompt_len, max_steps
    self.make_env, self.step_many = make_env, step_many or _step_each
    self.inflight = inflight
    self.rng = jax.random.key(seed)
    self.occupant: list[_Episode | None] = [None] * slots
    self.waiting: collections.deque[_Episode] = collections.deque()  # next steps to decode
    self.params, self.version, self.pending = None, -1, None
    self.lineage = -1
    self.idle_slot_steps = 0  # decode steps x free slots while tasks were short (diagnostic)
    self.restarted_episodes = 0  # episodes started again under a new lineage (diagnostic)

  # Parameters -------------------------------------------------------------------------------
  def offer_params(self, version: int, params, lineage: int = -1) -> None:
    """A new policy version; taken now or once the in-flight work allows (see `inflight`).
    One of another lineage is taken at once, and the episodes in flight start again."""
    if self.params is None:
      self.params, self.version, self.lineage = params, version, lineage
    elif lineage != self.lineage:
      self.params, self.version, self.lineage, self.pending = params, version, lineage, None
      self._restart_in_flight()
    else:
      self.pending = (version, params)
    self._maybe_swap()

  def _restart_in_flight(self) -> None:
    """Every episode in flight back to its task's first prompt, queued to refill first (its
    task stays taken: the caller's acknowledgements are unchanged)."""
    eps = [e for e in self.occupant if e is not None] + list(self.waiting)
    self.occupant = [None] * self.slots
    self.waiting.clear()
    for ep in eps:
      env = self.make_env()
      context = [self.tok.bos_id] + env.reset(ep.task).tolist()
      self.waiting.append(_Episode(ep.index, ep.task, env, context))
    self.restarted_episodes += len(eps)

  def _in_flight(self) -> tuple[bool, bool]:
    decoding = any(e is not None for e in self.occupant)
    return decoding, decoding or bool(self.waiting)

  def _maybe_swap(self) -> None:
    if self.pending is None:
      return
    decoding, episodes = self._in_flight()
    if self.inflight == "tokens" or (self.inflight == "steps" and not decoding) or not episodes:
      (self.version, self.params), self.pending = self.pending, None
      if decoding:  # completions in flight go on under the new policy, prefix recomputed
        self.state = self.refresh_fn(self.params, self.state)

  # The loop ---------------------------------------------------------------------------------
  def step(self, take_tasks: Callable[[int], list[tuple[int, Task]]]) -> list[Trajectory]:
    """Refills free slots (next steps first, then new tasks from `take_tasks(n)`), runs one
    decode call, steps the environments of the completions that ended, and returns the
    trajectories that finished. Returns [] without decoding when nothing is in flight."""
    self._maybe_swap()
    self._refill(take_tasks)
    live = [i for i, e in enumerate(self.occupant) if e is not None]
    if not live:
      return []
    self.rng, key = jax.random.split(self.rng)
    self.state = self.decode_fn(
      self.params, self.state, np.int32(self.version), key, min(self.refill_rows, len(live))
    )
    done = np.asarray(jax.device_get(self.state.done_b))
    ended = [i for i in live if done[i]]
    if not ended:
      return []
    st = jax.device_get(
      (self.state.tokens_bt, self.state.logp_bt, self.state.version_bt, self.state.gen_b)
    )
    tokens_bt, logp_bt, version_bt, gen_b = (np.asarray(x) for x in st)
    eps = [self.occupant[i] for i in ended]
    t_env = time.time()
    results = self.step_many([e.env for e in eps], [tokens_bt[i] for i in ended])
    now = time.time()
    for ep in eps:
      ep.reward_s += (now - t_env) / len(eps)
    finished = []
    for i, ep, res in zip(ended, eps, results, strict=True):
      self.occupant[i] = None
      valid = np.arange(tokens_bt.shape[1]) < gen_b[i]
      ep.steps.append(
        (
          ep.prompt[0],
          ep.prompt[1],
          tokens_bt[i],
          valid,
          logp_bt[i],
          np.where(valid, version_bt[i], -1),
          res.reward,
          now - ep.t_fill,
          res.info,
        )
      )
      if res.done or len(ep.steps) >= self.max_steps:
        finished.append(self._trajectory(ep, res.done, now))
      else:
        ep.context += tokens_bt[i][valid].tolist() + res.observation.tolist()
        self.waiting.append(ep)
    return finished

  def _refill(self, take_tasks) -> None:
    free = [i for i, e in enumerate(self.occupant) if e is None]
    if not free:
      return
    decoding, episodes = self._in_flight()
    if self.pending is not None and self.inflight == "steps" and decoding:
      return  # drain the completions in flight, then swap
    batch = [self.waiting.popleft() for _ in range(min(len(free), len(self.waiting)))]
    if len(batch) < len(free) and not (self.pending is not None and self.inflight == "off"):
      for index, task in take_tasks(len(free) - len(batch)):
        env = self.make_env()
        batch.append(_Episode(index, task, env, [self.tok.bos_id] + env.reset(task).tolist()))
    self.idle_slot_steps += len(free) - len(batch)
    for start in range(0, len(batch), self.refill_rows):
      chunk = batch[start : start + self.refill_rows]
      slots_used = free[start : start + len(chunk)]
      rows = [e.context[-self.prompt_len :] for e in chunk]
      pad = self.refill_rows - len(chunk)
      prompt, pvalid = left_pad(rows + [[self.tok.bos_id]] * pad, self.prompt_len, self.tok.pad_id)
      slot_r = np.asarray(slots_used + [self.slots] * pad, np.int32)  # >= slots: dropped
      self.state = self.fill_fn(self.params, self.state, prompt, pvalid, slot_r)
      now = time.time()
      for j, (i, ep) in enumerate(zip(slots_used, chunk, strict=True)):
        ep.prompt, ep.t_fill = (prompt[j], pvalid[j]), now
        self.occupant[i] = ep

  def _trajectory(self, ep: _Episode, done: bool, now: float) -> Trajectory:
    cols = list(zip(*ep.steps, strict=True))
    version = np.stack(cols[5]).astype(np.int32)
    used = version[version >= 0]
    return Trajectory(
      task_index=ep.index,
      task_id=ep.task.task_id,
      policy_version=int(used.min()) if used.size else self.version,
      lineage=self.lineage,
      prompt=np.stack(cols[0]),
      prompt_valid=np.stack(cols[1]),
      tokens=np.stack(cols[2]),
      valid=np.stack(cols[3]),
      logp=np.stack(cols[4]).astype(np.float32),
      rewards=np.asarray(cols[6], np.float32),
      step_seconds=np.asarray(cols[7], np.float32),
      done=done,
      t_end=now,
      infos=list(cols[8]),
      reward_seconds=ep.reward_s,
      version=version,
    )

  def active(self) -> int:
    return sum(e is not None for e in self.occupant)
