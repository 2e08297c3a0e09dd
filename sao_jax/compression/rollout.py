"""Host loop of long-horizon sampling with compressed memory, and batch builders.

Like `sao_jax.rollout.sao_sampling` (one trajectory per task, many tasks side by side), but
each step's row is [memory of earlier steps | raw window of the last `window` tokens], and
after the environment step the jitted `compress` program runs all three compression stages
on that step. With `memory=False` it is the full-context control (window = whole context,
no memory) on the same environments.

A step's *segment* is what the step added to the context: its observation and the action
tokens (EOS included), truncated to `step_len`.

The trajectory ships its final bank and its graveyard, the entries eviction removed on the
way (`sao_jax.compression.memory`): after each compress call the stream holds the entry that
step evicted, and the host moves it into the graveyard (`bury`). It is fetched together with
the next step's sample, so collecting it adds no device round trip.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import jax
import numpy as np

from sao_jax.batches import MemoryBatch
from sao_jax.envs.base import Env, Task
from sao_jax.envs.longhorizon import SEP, graded_steps
from sao_jax.packing import left_pad, right_pad
from sao_jax.tokenizer import Tokenizer

BANK_KEYS = ("vec_ced", "scale_ce", "step_c", "turning_c", "count")
# A trajectory's graveyard as shipped, one row per eviction in eviction order: the entry's
# vectors, scales and step, and the step that evicted it.
GRAVE_KEYS = ("gone_vec_ged", "gone_scale_ge", "gone_step_g", "gone_at_g")
# Version of the array layout of `LongTrajectory.arrays` (a record's meta carries it): a
# reader refuses layouts it does not know.
LAYOUT = 1
# A trajectory's per-step arrays as shipped (rows are steps).
STEP_KEYS = (
  "prompt",
  "prompt_valid",
  "tokens",
  "valid",
  "logp",
  "rewards",
  "graded",
  "boundary",
  "seg",
  "seg_valid",
)


@dataclasses.dataclass
class LongTrajectory:
  """Rows are steps. `bank` is the compressed memory as shipped (None for the control)."""

  task_id: int
  prompt: np.ndarray  # [S, P]
  prompt_valid: np.ndarray
  tokens: np.ndarray  # [S, T]
  valid: np.ndarray
  logp: np.ndarray
  rewards: np.ndarray  # [S]
  graded: np.ndarray  # [S] bool, the step carried reward
  boundary: np.ndarray  # [S] bool, env boundary at this step's observation
  seg: np.ndarray  # [S, L]
  seg_valid: np.ndarray
  bank: dict | None
  tokens_total: int = 0  # tokens of the whole episode (BOS, observations, actions)

  @property
  def total_reward(self) -> float:
    return float(self.rewards.sum())

  @property
  def accuracy(self) -> float:
    return float(self.rewards[self.graded].mean()) if self.graded.any() else 0.0

  def arrays(self, policy_version: int) -> dict[str, np.ndarray]:
    """What travels to the learner (a `LONG_TRAJECTORY` record, layout `LAYOUT`): the steps'
    arrays under the names text trajectories use (prompt, tokens, valid, logp, rewards, and
    `version`, the policy version of every valid token, -1 elsewhere), the step flags and
    segments, the bank (`bank_` + `BANK_KEYS`) and the graveyard (`GRAVE_KEYS`). A sampled
    trajectory only: the bank must be there."""
    if self.bank is None:
      raise ValueError("only a trajectory with its bank (the memory policy's) is shipped")
    steps = {k: getattr(self, k) for k in STEP_KEYS}
    version = np.where(self.valid, policy_version, -1).astype(np.int32)
    bank = {f"bank_{k}": np.asarray(self.bank[k]) for k in BANK_KEYS}
    grave = {k: np.asarray(self.bank[k]) for k in GRAVE_KEYS}
    return dict(steps, version=version, **bank, **grave)

  @classmethod
  def from_arrays(cls, arrays: dict, task_id: int, tokens_total: int = 0) -> LongTrajectory:
    """The trajectory `arrays` (its `arrays()`) describe; `bank["entries"]` and
    `bank["evicted"]` follow from the bank's count and the graveyard's length."""
    bank = {k: arrays[f"bank_{k}"] for k in BANK_KEYS}
    bank.update({k: arrays[k] for k in GRAVE_KEYS})
    bank["entries"] = int(bank["count"])
    bank["evicted"] = len(bank["gone_at_g"])
    return cls(
      task_id=task_id,
      **{k: arrays[k] for k in STEP_KEYS},
      bank=bank,
      tokens_total=tokens_total,
    )


def segment(obs: Sequence[int], action: Sequence[int], step_len: int) -> list[int]:
  return (list(obs) + list(action))[:step_len]


def gone_record(streams) -> tuple:
  """What `bury` needs of the slots' streams (device arrays, to fetch)."""
  return (streams.step, streams.gone_step, streams.gone_vec_ed, streams.gone_scale_e)


def bury(graves: list[dict], record) -> None:
  """Moves the entries the last compress call evicted (a fetched `gone_record`) into the
  graveyards of the first len(graves) slots, keyed by the step that evicted them: a slot
  that did not step keeps its stream, and so its record, unchanged, and is not counted
  twice."""
  step, gone, vec, scale = record
  for i, grave in enumerate(graves):
    if gone[i] >= 0:
      grave[int(step[i]) - 1] = (int(gone[i]), np.asarray(vec[i]), np.asarray(scale[i]))


def graveyard_arrays(grave: dict, vec_ed: np.ndarray) -> dict[str, np.ndarray]:
  """One slot's graveyard (`bury`) as the shipped arrays (`GRAVE_KEYS`), in eviction order;
  `vec_ed` gives the entry shape and dtype (one of the bank's entries)."""
  at = sorted(grave)
  m, d = vec_ed.shape
  return {
    "gone_vec_ged": np.asarray([grave[k][1] for k in at], vec_ed.dtype).reshape(-1, m, d),
    "gone_scale_ge": np.asarray([grave[k][2] for k in at], np.float32).reshape(-1, m),
    "gone_step_g": np.asarray([grave[k][0] for k in at], np.int32),
    "gone_at_g": np.asarray(at, np.int32),
  }


def sample_long_horizon(
  sample_fn: Callable,
  compress_fn: Callable | None,
  empty_streams,
  params,
  envs: Sequence[Env],
  tasks: Sequence[Task],
  tok: Tokenizer,
  *,
  slots: int,
  window: int,
  step_len: int,
  rng: jax.Array,
) -> list[LongTrajectory]:
  """One trajectory per task (at most `slots`), all episodes stepped side by side.

  sample_fn: memory policy `(params, streams, prompt, prompt_valid, rng)` or control
  `(params, prompt, prompt_valid, rng)` (when compress_fn is None), over `slots` rows.
  """
  n = len(tasks)
  if not 0 < n <= slots or len(envs) != n:
    raise ValueError(f"need 1..{slots} tasks with one env each")
  obs = [env.reset(t).tolist() for env, t in zip(envs, tasks, strict=True)]
  contexts = [[tok.bos_id] + o for o in obs]
  boundary = np.zeros(n, bool)
  rows: list[list[tuple]] = [[] for _ in range(n)]
  active = np.ones(n, bool)
  streams = empty_streams
  graves: list[dict] = [{} for _ in range(n)]
  max_steps = max(e.max_steps for e in envs)
  for _ in range(max_steps):
    if not active.any():
      break
    prompt, pvalid = left_pad(
      [c[-window:] for c in contexts] + [[tok.bos_id]] * (slots - n), window, tok.pad_id
    )
    rng, key = jax.random.split(rng)
    if compress_fn is None:
      out = jax.device_get(sample_fn(params, prompt, pvalid, key))
    else:
      out, record = jax.device_get(
        (sample_fn(params, streams, prompt, pvalid, key), gone_record(streams))
      )
      bury(graves, record)
    segs, rew, bnd, last = (
      [[]] * slots,
      np.zeros(slots, np.float32),
      np.zeros(slots, bool),
      np.zeros(slots, bool),
    )
    stepped = np.zeros(slots, bool)
    for i in np.flatnonzero(active):
      action = out.tokens_bt[i][out.valid_bt[i]].tolist()
      res = envs[i].step(out.tokens_bt[i])
      rows[i].append(
        (
          prompt[i],
          pvalid[i],
          out.tokens_bt[i],
          out.valid_bt[i],
          out.logp_bt[i],
          res.reward,
          bool(res.info.get("graded", False)),
          boundary[i],
          segment(obs[i], action, step_len),
        )
      )
      segs[i], rew[i], bnd[i], last[i], stepped[i] = (
        rows[i][-1][-1],
        res.reward,
        boundary[i],
        res.done,
        True,
      )
      boundary[i] = bool(res.info.get("next_boundary", False))
      if res.done:
        active[i] = False
      else:
        obs[i] = res.observation.tolist()
        contexts[i] += action + obs[i]
    if compress_fn is not None:
      seg, segv = right_pad(segs, step_len, tok.pad_id)
      streams = compress_fn(params, streams, seg, segv, rew, bnd, last, stepped)
  banks = evicted = None
  if compress_fn is not None:
    banks, evicted, record = jax.device_get((streams.bank, streams.evicted, gone_record(streams)))
    bury(graves, record)  # the last step's
  trajs = []
  for i in range(n):
    c = list(zip(*rows[i], strict=True))
    seg, segv = right_pad(c[8], step_len, tok.pad_id)
    bank = None
    if banks is not None:
      k = int(banks.count[i])
      bank = {key: np.asarray(getattr(banks, key)[i]) for key in BANK_KEYS}
      bank.update(graveyard_arrays(graves[i], bank["vec_ced"][0]))
      bank["entries"] = k
      bank["evicted"] = int(evicted[i])
    trajs.append(
      LongTrajectory(
        task_id=tasks[i].task_id,
        prompt=np.stack(c[0]),
        prompt_valid=np.stack(c[1]),
        tokens=np.stack(c[2]),
        valid=np.stack(c[3]),
        logp=np.stack(c[4]).astype(np.float32),
        rewards=np.asarray(c[5], np.float32),
        graded=np.asarray(c[6]),
        boundary=np.asarray(c[7]),
        seg=seg,
        seg_valid=segv,
        bank=bank,
        tokens_total=len(contexts[i]) + int(c[3][-1].sum()),
      )
    )  # + the last action
  return trajs


def trajectories_to_batch(
  trajs: Sequence[LongTrajectory], steps: int, rows: int = 0, seed: int = 0, completion_len: int = 0
) -> MemoryBatch:
  """Stacks trajectories into the learner's `MemoryBatch`: per step [B, S=steps, ...] and per
  row [B, R, ...]. rows=0: every step is a row (R = steps); rows>0: the graded steps first,
  then other steps drawn at random (seeded), R = rows. Completions are padded (or cut) to
  `completion_len` tokens (0: as sampled). Row weights are 1; the bank and its graveyard
  (scattered to the steps that evicted its entries) come along when the trajectories carry
  one."""
  rng = np.random.default_rng(seed)

  def pad(x, n, fill=0):
    out = np.full((n,) + x.shape[1:], fill, x.dtype)
    out[: len(x)] = x[:n]
    return out

  def width(x, n):
    if not n or x.shape[-1] == n:
      return x
    out = np.zeros(x.shape[:-1] + (n,), x.dtype)
    k = min(n, x.shape[-1])
    out[..., :k] = x[..., :k]
    return out

  per_step = {
    k: np.stack([pad(getattr(t, k), steps) for t in trajs])
    for k in ("rewards", "boundary", "seg", "seg_valid")
  }
  step_valid = np.stack([pad(np.ones(len(t.rewards), bool), steps) for t in trajs])
  n_rows = rows or steps
  picks = []
  for t in trajs:
    if rows:
      g = np.flatnonzero(t.graded)
      other = rng.permutation(np.flatnonzero(~t.graded))
      picks.append(np.concatenate([g, other])[:rows])
    else:
      picks.append(np.arange(len(t.rewards)))
  per_row = {
    k: np.stack([pad(getattr(t, k)[p], n_rows) for t, p in zip(trajs, picks, strict=True)])
    for k in ("prompt", "prompt_valid", "tokens", "valid", "logp", "graded")
  }
  row_valid = np.stack([pad(np.ones(len(p), bool), n_rows) for p in picks])
  per_row["prompt_valid"][..., -1] |= ~row_valid  # padding rows: 1 token
  bank = {}
  if trajs[0].bank is not None:
    bank = {
      name: np.stack([t.bank[key] for t in trajs])
      for key, name in zip(
        BANK_KEYS,
        ("bank_vec_bced", "bank_scale_bce", "bank_step_bc", "bank_turning_bc", "bank_count_b"),
        strict=True,
      )
    }
    m, d = trajs[0].bank["vec_ced"].shape[-2:]
    gone_vec = np.zeros((len(trajs), steps, m, d), trajs[0].bank["vec_ced"].dtype)
    gone_scale = np.zeros((len(trajs), steps, m), np.float32)
    gone_step = np.full((len(trajs), steps), -1, np.int32)
    for i, t in enumerate(trajs):
      at = t.bank["gone_at_g"]
      if len(at) and at.max() >= steps:
        raise ValueError(f"trajectory {i} evicted an entry at step {at.max()} >= steps {steps}")
      gone_vec[i, at], gone_scale[i, at] = t.bank["gone_vec_ged"], t.bank["gone_scale_ge"]
      gone_step[i, at] = t.bank["gone_step_g"]
    bank.update(gone_vec_bsed=gone_vec, gone_scale_bse=gone_scale, gone_step_bs=gone_step)
    bank["logp_brt"] = width(per_row["logp"], completion_len)
  return MemoryBatch(
    seg_bsl=per_step["seg"],
    seg_valid_bsl=per_step["seg_valid"],
    rewards_bs=per_step["rewards"],
    boundary_bs=per_step["boundary"],
    step_valid_bs=step_valid,
    row_step_br=np.stack([pad(p.astype(np.int32), n_rows) for p in picks]),
    row_valid_br=row_valid,
    row_weight_br=row_valid.astype(np.float32),
    graded_br=per_row["graded"],
    prompt_brp=per_row["prompt"],
    prompt_valid_brp=per_row["prompt_valid"],
    tokens_brt=width(per_row["tokens"], completion_len),
    valid_brt=width(per_row["valid"], completion_len),
    **bank,
  )


def expert_trajectory(
  env: Env,
  task: Task,
  actions: Sequence[Sequence[int]],
  tok: Tokenizer,
  *,
  window: int,
  step_len: int,
  completion_len: int,
) -> LongTrajectory:
  """The expert's episode played through the environment, in the sampler's layout: row t
  sees the last `window` tokens of [BOS, obs_0, act_0, obs_1, ...] (as `sample_long_horizon`
  builds them) and its completion is actions[t] (EOS included); rewards, graded steps and
  boundaries are the environment's."""
  obs = env.reset(task).tolist()
  context = [tok.bos_id] + obs
  items, boundary = [], False
  for t, action in enumerate(actions):
    res = env.step(np.asarray(action, np.int32))
    items.append(
      (
        context[-window:],
        list(action),
        res.reward,
        bool(res.info.get("graded", False)),
        boundary,
        segment(obs, action, step_len),
      )
    )
    boundary = bool(res.info.get("next_boundary", False))
    if res.done:
      if t != len(actions) - 1:
        raise ValueError(
          f"task {task.task_id}: the episode ended at step {t} of {len(actions)} expert actions"
        )
      break
    obs = res.observation.tolist()
    context = context + list(action) + obs
  prompt, pvalid = left_pad([r[0] for r in items], window, tok.pad_id)
  toks, valid = right_pad([r[1] for r in items], completion_len, tok.pad_id)
  seg, segv = right_pad([r[5] for r in items], step_len, tok.pad_id)
  return LongTrajectory(
    task.task_id,
    prompt,
    pvalid,
    toks,
    valid,
    np.zeros(toks.shape, np.float32),
    np.asarray([r[2] for r in items], np.float32),
    np.asarray([r[3] for r in items]),
    np.asarray([r[4] for r in items]),
    seg,
    segv,
    None,
    tokens_total=len(context) + len(actions[-1]),
  )


def expert_memory_batch(
  trajs: Sequence[LongTrajectory],
  weights: Sequence[Sequence[float]],
  *,
  steps: int,
  rows: int = 0,
  seed: int = 0,
) -> MemoryBatch:
  """Teacher-forced rows of expert episodes (`expert_trajectory`), each row weighted by its
  step's weight (`weights[i][t]`, e.g. the family's `SFTExample.weight`).

  With rows > 0 the ungraded rows are a sample of the ungraded steps: they are weighed up to
  stand for all of them (weight * ungraded steps / ungraded rows), so the objective matches
  training on every step (the full-context control's)."""
  batch = trajectories_to_batch(trajs, steps, rows, seed)
  w_bs = np.stack([np.pad(np.asarray(w, np.float32), (0, steps - len(w))) for w in weights])
  w_br = np.take_along_axis(w_bs, batch.row_step_br, axis=1)
  filler = batch.row_valid_br & ~batch.graded_br
  n_filler = np.asarray([len(t.graded) - t.graded.sum() for t in trajs], np.float32)
  up = n_filler / np.maximum(filler.sum(1), 1)
  w_br = np.where(batch.graded_br, w_br, w_br * up[:, None]) * batch.row_valid_br
  return batch.replace(row_weight_br=w_br.astype(np.float32))


# Ungraded rows per episode in the supervised phase, besides every graded one: the filler
# steps ("ok" after chit-chat) are easy, and a sample of them weighed up keeps the objective
# while the rows stay few (the encoder and LSTM still see every step).
FILLER_ROWS = 4
# Expert episodes that size the rows per episode (R = their most graded steps + FILLER_ROWS).
SIZING_EPISODES = 64


class ExpertEpisodes:
  """The training tasks' expert episodes in the sampler's layout, played once through the
  environment (the family's `sft_examples` give each step's action and weight) of setup
  `s`."""

  def __init__(self, s):  # a `sao_jax.setup.Setup`
    self.s = s
    self._cache: dict[int, tuple[LongTrajectory, np.ndarray]] = {}

  def get(self, i: int) -> tuple[LongTrajectory, np.ndarray]:
    if i not in self._cache:
      s, c = self.s, self.s.cfg.compression
      task = s.train[i]
      examples = s.family.sft_examples(task, s.tok, c.window)
      traj = expert_trajectory(
        s.family.make_env(s.tok),
        task,
        [e.target for e in examples],
        s.tok,
        window=c.window,
        step_len=c.step_len,
        completion_len=s.target_len,
      )
      self._cache[i] = traj, np.asarray([e.weight for e in examples], np.float32)
    return self._cache[i]

  def max_graded(self) -> int:
    n = min(SIZING_EPISODES, len(self.s.train))
    return max(int(self.get(i)[0].graded.sum()) for i in range(n))


def script(task: Task, tok: Tokenizer) -> tuple[list[list[int]], list[list[int]], dict]:
  """Observation and expert action tokens (EOS included) of every step, and graded steps."""
  obs = [tok.encode(o) for o in task.prompt.split(SEP)]
  acts = [tok.encode(a, add_eos=True) for a in task.solution.split(SEP)]
  return obs, acts, graded_steps(task)


def scripted_full_batch(
  tasks: Sequence[Task], tok: Tokenizer, *, length: int, graded_weight: float
) -> dict[str, np.ndarray]:
  """Control: whole episodes as one sequence each; action tokens weighted like the memory
  policy's rows (a row's weight spread evenly over its tokens)."""
  toks, weights = [], []
  for task in tasks:
    obs, acts, graded = script(task, tok)
    seq, w = [tok.bos_id], [0.0]
    for t, (o, a) in enumerate(zip(obs, acts, strict=True)):
      seq += o + a
      rw = graded_weight if t in graded else 1.0
      w += [0.0] * len(o) + [rw / len(a)] * len(a)
    toks.append(seq)
    weights.append(w)
  ids, valid = right_pad(toks, length, tok.pad_id)
  lw = np.zeros(ids.shape, np.float32)
  for i, w in enumerate(weights):
    lw[i, : len(w)] = w
  return {"tokens": ids, "valid": valid, "loss_weight": lw}


def episode_tokens(task: Task, tok: Tokenizer) -> int:
  obs, acts, _ = script(task, tok)
  return 1 + sum(len(o) + len(a) for o, a in zip(obs, acts, strict=True))
