"""The learner's door: value checks on trajectory records that passed the format checks.

`sao_jax.buffer.check_trajectory` makes sure a record has the shapes the batch is compiled
for. A record can pass it and still poison an update: a NaN log-prob turns the importance
ratio and every gradient non-finite; a token id outside [0, V) reads past the embedding
table; a reward outside the task's range skews the advantage of the whole batch; a policy
version ahead of anything the learner published gets a negative staleness; a task index the
learner never handed out is nobody's task. `value_problem` names what is wrong with one
record (pure); `RecordGuard` applies it at the learner's door, per sampler:

- a rejected record is copied to the transport's dead-letter channel with its reason,
  counted under `rejected_<reason>` (in the learner's counts, so in every snapshot and in
  summary.json), never journaled or trained on;
- its task, if it was one the learner handed out and still waits for, is handed out again,
  so no task is lost and the loop's count of tasks in flight stays true;
- every sampler process (the random 24-bit prefix of its record ids, `source_of`) has a
  window of its last `window` records; once that window is full and at least `rate` of it
  was rejected, the sampler is quarantined: its records are dropped and counted
  (`rejected_quarantined`), one line is printed, and `on_quarantine` is called with the
  offending record's meta (the SAO learner stops a local sampler there; the pool's restart
  supervision replaces it, within `samplers.max_restarts`, as a fresh process with a
  fresh prefix and a clean window).

Tasks: the guard counts the tasks handed out and not yet answered, per index, and remembers
which indices it ever handed out. A record for an index this learner never handed out is
`unknown_task`. One for an index handed out before but not outstanding now is a task that a
transport gave to two samplers (Kafka hands a sampler's unacknowledged tasks to another on a
group rebalance or a sampler restart): a real trajectory, trained on as before this check
existed, and counted (`task_redelivered`), not charged to its sampler. After a resume,
records finished before this learner started (`t_end < started`) come from tasks an earlier
incarnation handed out; only their index range can be checked. Such a record finished after
the start is accepted only if this learner has handed its index out as well (the resumed
task stream restarts from the snapshot, so it usually has).

What can be checked against the task itself: a record's `task_id` must be the id of the task
at its `task_index` (`task_mismatch`), and where the family's reward is cheap to recompute
(`rescore(index, record)` gives a number; None where it is not: code, multi-step episodes) the
claimed reward must be the reward of the record's own completion (`reward_mismatch`, within
REWARD_TOL): a sampler cannot claim reward 1 for a wrong answer of a verifiable task.

Hand-outs: each task handed out gets a hand-out id (`new_handouts`: random per learner, then
counting) that travels with the task and comes back in the meta of the trajectory that
answers it (`SamplerEnd.handout_for`). A hand-out is answered at most once: a second
trajectory for it, whatever its record id (a transport that gave the task to two samplers, a
trajectory re-sent under a new id), is counted (`duplicate_answers`), dead-lettered and not
trained on; a
hand-out answered with another task's index is `task_mismatch`. Records without one (an
earlier learner's tasks, after a resume) are checked as above.

Versions: `published` keeps the highest version ever published in this workdir in a small
file, so a resumed learner (whose step went back to its snapshot) still accepts records of
the policies its crashed incarnation published, and nothing newer. A policy is named by
(lineage, version) (`sao_jax.lineage`): given `lineage_known`, a record of a lineage this run
never began (every incarnation's are in its lineage log) is `unknown_lineage`. One of a
lineage the run began and then left (a resume or rollback) passes the door; the batch drops
it, counted as `dropped_lineage`: it is stale data, not a fault of its sampler.

Rewards that are costly to recompute (code: a sandbox run per record, `TaskFamily.auditable`)
are audited instead (`RewardAudit`): a fraction `sao.audit_fraction` of the records that
passed the door, picked by a keyed hash of the record id that no sampler can predict, is
held back and re-scored in the learner's own sandbox pool, concurrently with training; a
held record enters the journal and the buffer only once its reward is confirmed, and one
whose claimed reward its completion does not earn is `reward_mismatch` like a cheap one
(`RecordGuard.reject_audited`). The Kafka offsets of held records are not committed, so a
crash re-reads and re-audits them.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import hashlib
import json
import os
import pathlib
import time
from collections.abc import Callable, Sequence

import numpy as np

from sao_jax.config import POISON_KINDS, FaultsConfig
from sao_jax.transport import records

# Reasons, in the order they are checked.
REASONS = (
  "unauthenticated",
  "quarantined",
  "unknown_task",
  "unknown_lineage",
  "future_version",
  "nonfinite",
  "positive_logp",
  "token_oov",
  "reward_range",
  "task_mismatch",
  "reward_mismatch",
  "logp_drift",
)
LOGP_TOL = 1e-3  # a log-probability above this is not one (float32 rounding stays below)
REWARD_TOL = 1e-4  # float32 sums of per-step rewards may overshoot a bound by rounding
MAX_ANSWERED = 1_000_000  # hand-outs remembered as answered (the oldest forgotten first)
SOURCE_SHIFT = 40  # record ids are (random per-process prefix << 40) | counter


def source_of(record_id: int) -> int:
  """The sampler process that wrote a record: its record ids' random prefix."""
  return record_id >> SOURCE_SHIFT


def value_problem(
  rec: records.Record, *, vocab_size: int, reward_range: tuple[float, float], max_version: int
) -> tuple[str, str] | None:
  """(reason, detail) for the first thing wrong with a format-checked trajectory record's
  values, or None if it may be trained on.

  Checks, in order: policy version (header, and per-token `version` [S, T] on valid tokens)
  <= `max_version`; every float array finite; `logp` [S, T] <= LOGP_TOL on valid tokens;
  `tokens` [S, T] and `prompt` [S, P] integers in [0, vocab_size) everywhere (padding is fed
  to the model too); meta `reward` within `reward_range` (+- REWARD_TOL)."""
  a, m = rec.arrays, rec.meta
  if rec.policy_version > max_version:
    return "future_version", (
      f"policy version {rec.policy_version} is ahead of the newest published ({max_version})"
    )
  if "version" in a:
    v = a["version"][a["valid"].astype(bool)]
    if v.size and int(v.max()) > max_version:
      return "future_version", (
        f"a token of policy version {int(v.max())} is ahead of the newest published ({max_version})"
      )
  for name, x in a.items():
    if x.dtype.kind == "f" and not np.isfinite(x).all():
      return "nonfinite", f"array {name!r} holds {int((~np.isfinite(x)).sum())} non-finite values"
  logp = a["logp"][a["valid"].astype(bool)]
  if logp.size and float(logp.max()) > LOGP_TOL:
    return "positive_logp", f"log-probability {float(logp.max()):.4g} > 0"
  for name in ("tokens", "prompt"):
    x = a[name]
    if x.dtype.kind not in "iu":
      return "token_oov", f"array {name!r} holds {x.dtype}, not token ids"
    if x.size and (int(x.min()) < 0 or int(x.max()) >= vocab_size):
      return "token_oov", (
        f"array {name!r} holds token ids in [{int(x.min())}, "
        f"{int(x.max())}], outside [0, {vocab_size})"
      )
  lo, hi = reward_range
  r = m["reward"]
  if not lo - REWARD_TOL <= r <= hi + REWARD_TOL:
    return "reward_range", f"reward {r!r} outside the task's range [{lo:g}, {hi:g}]"
  return None


@dataclasses.dataclass
class _Source:
  """One sampler process's record: the last `window` outcomes (True: rejected)."""

  key: int
  recent: collections.deque
  accepted: int = 0
  rejected: int = 0
  quarantined: str = ""  # why, once quarantined
  sampler: object = None  # meta "sampler" of its latest record (local index)


class RecordGuard:
  """Value checks, task and version bookkeeping, and per-sampler quarantine (module doc).

  `counts` is the learner's counter (saved with its snapshots); `reward_range(i)` gives task
  i's (low, high) total reward; task indices handed out are in [0, num_tasks).
  `state_path` keeps the highest published version across restarts of the learner."""

  def __init__(
    self,
    *,
    vocab_size: int,
    num_tasks: int,
    reward_range: Callable[[int], tuple[float, float]],
    counts: collections.Counter,
    state_path: str | pathlib.Path | None = None,
    window: int = 50,
    rate: float = 0.5,
    resumed: bool = False,
    started: float | None = None,
    lineage_known: Callable[[int], bool] | None = None,
    task_id_of: Callable[[int], int] | None = None,
    rescore: Callable[[int, records.Record], float | None] | None = None,
  ):
    if window < 0 or not 0 < rate <= 1:
      raise ValueError(f"quarantine window {window} must be >= 0 and rate {rate} in (0, 1]")
    self.vocab_size, self.num_tasks = vocab_size, num_tasks
    self._reward_range = reward_range
    self._ranges: dict[int, tuple[float, float]] = {}
    self.counts = counts
    self.window, self.rate = window, rate
    self.resumed = resumed
    self.started = time.time() if started is None else started
    self.outstanding: collections.Counter = collections.Counter()
    self.pending: dict[int, int] = {}  # hand-out id -> task index, not yet answered
    self.answered: collections.OrderedDict = collections.OrderedDict()  # the newest MAX_ANSWERED
    self._handout_base = int.from_bytes(os.urandom(3), "little") << 32
    self._handouts = 0
    self.ever = np.zeros(num_tasks, bool)  # handed out at least once by this learner
    self.rejected_ids: set[int] = set()
    self.sources: dict[int, _Source] = {}
    self.on_quarantine: Callable[[dict], None] | None = None
    self.lineage_known = lineage_known
    self.task_id_of, self.rescore = task_id_of, rescore
    self.state_path = pathlib.Path(state_path) if state_path is not None else None
    self.max_version = -1
    if self.state_path is not None and self.state_path.exists():
      try:
        self.max_version = int(json.loads(self.state_path.read_text())["max_published"])
      except (ValueError, KeyError, TypeError):
        print(
          f"sao: {self.state_path} is unreadable; newest published version starts "
          "from this learner's",
          flush=True,
        )

  # What the learner tells the guard -----------------------------------------------------------
  def new_handouts(self, n: int) -> list[int]:
    """`n` fresh hand-out ids (unique within this learner; random across learners)."""
    first, self._handouts = self._handouts, self._handouts + n
    return [self._handout_base | (first + k) for k in range(n)]

  def handed_out(self, indices: Sequence[int], handouts: Sequence[int] | None = None) -> None:
    indices = [int(i) for i in indices]
    if handouts is not None:
      self.pending.update(zip((int(h) for h in handouts), indices, strict=True))
    self.outstanding.update(indices)
    self.ever[[i for i in indices if 0 <= i < self.num_tasks]] = True

  def tasks_dropped(self) -> None:
    """The task queue was replaced (embedded sampler restart): nothing is outstanding."""
    self.outstanding.clear()

  def published(self, version: int) -> None:
    if version <= self.max_version:
      return
    self.max_version = version
    if self.state_path is not None:
      tmp = self.state_path.with_name(self.state_path.name + ".tmp")
      tmp.write_text(json.dumps({"max_published": version}))
      os.replace(tmp, self.state_path)

  # The door -----------------------------------------------------------------------------------
  def is_redelivery(self, record_id: int) -> bool:
    """A record already refused once (a transport redelivered it): counted as a duplicate."""
    return record_id in self.rejected_ids

  def admit(self, rec: records.Record, data: bytes, learner) -> bool:
    """Whether `rec` (format-checked, not a duplicate) may be trained on. A refused record
    is dead-lettered on `learner` (a transport LearnerEnd) with its reason and counted; its
    outstanding task is handed out again through `learner.put_tasks`."""
    src = self._source(rec)
    index = rec.meta["task_index"]
    known = self.outstanding[index] > 0
    if src.quarantined:
      problem = ("quarantined", f"sampler quarantined ({src.quarantined})")
    elif not (known or self._handed_out_before(index) or self._from_earlier_learner(rec, index)):
      problem = ("unknown_task", f"task {index} was never handed out")
    elif self.lineage_known is not None and not self.lineage_known(rec.meta.get("lineage", -1)):
      lineage = rec.meta.get("lineage")
      problem = ("unknown_lineage", f"policy lineage {lineage!r} was never begun by this run")
    else:
      problem = value_problem(
        rec,
        vocab_size=self.vocab_size,
        max_version=self.max_version,
        reward_range=self._range(index),
      ) or self._task_problem(rec, index)
    handout = rec.meta.get("handout")
    handout = handout if isinstance(handout, int) and not isinstance(handout, bool) else None
    if problem is None and handout is not None:
      if handout in self.answered:  # answered already: real data maybe, but not twice
        self.counts["duplicate_answers"] += 1
        # (dead-lettered, not refused: no sampler is charged, and an audit of the topic
        # finds it accounted for)
        learner.dead_letter(data, f"duplicate_answer: hand-out {handout} was answered already")
        self.rejected_ids.add(rec.record_id)  # its own redelivery: a plain duplicate
        return False
      if handout in self.pending and self.pending[handout] != index:
        problem = ("task_mismatch", f"hand-out of task {self.pending[handout]}, not {index}")
    if handout is not None and self.pending.pop(handout, None) is not None and problem is None:
      self.answered[handout] = None
      while len(self.answered) > MAX_ANSWERED:
        self.answered.popitem(last=False)
    if known:
      self.outstanding[index] -= 1
    if problem is None:
      if not known:
        self.counts["task_redelivered"] += 1
      self._charge(src, rec, False)
      return True
    self._refuse(rec, data, problem, learner, reissue=known)
    if problem[0] != "quarantined":
      self._charge(src, rec, True)
    return False

  def reject_audited(
    self, rec: records.Record, data: bytes, true: float, learner, reissue: bool
  ) -> None:
    """A record the door admitted whose reward audit (`RewardAudit`) found that its
    completion does not earn the reward it claims: `reward_mismatch`, dead-lettered, charged
    to its sampler, and (`reissue`: a task this learner handed out) its task handed out
    again, its answer having been counted at the door."""
    claimed = rec.meta["reward"]
    problem = ("reward_mismatch", f"claimed reward {claimed!r}, its completion earns {true:g}")
    self._refuse(rec, data, problem, learner, reissue=reissue)
    self._charge(self._source(rec), rec, True)

  def _refuse(self, rec, data: bytes, problem: tuple[str, str], learner, reissue: bool) -> None:
    reason, detail = problem
    self.counts[f"rejected_{reason}"] += 1
    self.counts["rejected"] += 1
    self.rejected_ids.add(rec.record_id)
    if self.counts[f"rejected_{reason}"] == 1:
      print(
        f"sao: rejected a trajectory record ({reason}: {detail}); further ones are only "
        f"counted (rejected_{reason}) and dead-lettered",
        flush=True,
      )
    learner.dead_letter(data, f"{reason}: {detail}")
    if reissue:  # its task is still to be done
      index = rec.meta["task_index"]
      again = self.new_handouts(1)
      learner.put_tasks([index], again)
      self.pending[again[0]] = index
      self.outstanding[index] += 1
      self.counts["reissued_tasks"] += 1

  def reject_unauthenticated(self, data: bytes, detail: str, learner) -> None:
    """A message without a valid tag under the run's key (`sao_jax.transport.auth`), refused
    before anything in it was read: dead-lettered and counted. Nothing in it can be trusted,
    so no sampler is charged and no task handed out again (the run's own samplers seal
    every record, so it is not one of theirs)."""
    self.counts["rejected_unauthenticated"] += 1
    self.counts["rejected"] += 1
    if self.counts["rejected_unauthenticated"] == 1:
      print(
        f"sao: rejected a message without the run's key ({detail}); further ones are only "
        "counted (rejected_unauthenticated) and dead-lettered",
        flush=True,
      )
    learner.dead_letter(data, f"unauthenticated: {detail}")

  def reject_unverified(self, rec: records.Record, bound: float) -> None:
    """A trajectory the update left out because its claimed behaviour log-probs drift more
    than `bound` nats a token from the policy's (`sao.verify_drift`): counted and charged to
    its sampler. (It was admitted and journaled before the update could check it: the
    journal and ledger keep it, with weight 0 in that update.)"""
    self.counts["rejected_logp_drift"] += 1
    self.counts["rejected"] += 1
    if self.counts["rejected_logp_drift"] == 1:
      print(
        f"sao: left a trajectory out of an update: its behaviour log-probs drift more than "
        f"{bound:g} nats a token from the policy's; further ones are only counted "
        "(rejected_logp_drift)",
        flush=True,
      )
    self._charge(self._source(rec), rec, True)

  def charge_malformed(self, data: bytes) -> None:
    """A record that failed decoding or the format checks counts against its sampler when
    its header names one (unverified: a damaged header charges some other id, once)."""
    try:
      header = records.peek_header(data)
    except records.RecordError:
      return
    src = self.sources.get(source_of(header.record_id))
    if src is not None and not src.quarantined:
      self._charge(src, None, True)

  def summary(self) -> dict:
    """What summary.json reports: rejected records by reason, reissued tasks, and each
    sampler that had records rejected."""
    c = self.counts
    return {
      "rejected": {r: c[f"rejected_{r}"] for r in REASONS},
      "rejected_total": c["rejected"],
      "reissued_tasks": c["reissued_tasks"],
      "task_redelivered": c["task_redelivered"],
      "quarantined_samplers": c["quarantined_samplers"],
      "samplers_with_rejects": {
        f"{k:06x}": {
          "accepted": s.accepted,
          "rejected": s.rejected,
          "quarantined": s.quarantined or None,
          "sampler": s.sampler,
        }
        for k, s in self.sources.items()
        if s.rejected or s.quarantined
      },
    }

  # Internals ----------------------------------------------------------------------------------
  def _task_problem(self, rec: records.Record, index: int) -> tuple[str, str] | None:
    """The record against its task: the task id at its index, and its reward recomputed."""
    if self.task_id_of is not None and "task_id" in rec.meta and 0 <= index < self.num_tasks:
      want = self.task_id_of(index)
      if rec.meta["task_id"] != want:
        return "task_mismatch", f"task id {rec.meta['task_id']!r} at index {index} is {want}'s"
    if self.rescore is not None and 0 <= index < self.num_tasks:
      true = self.rescore(index, rec)
      if true is not None and abs(float(rec.meta["reward"]) - true) > REWARD_TOL:
        return "reward_mismatch", (
          f"claimed reward {rec.meta['reward']!r}, its completion earns {true:g}"
        )
    return None

  def _source(self, rec: records.Record) -> _Source:
    key = source_of(rec.record_id)
    src = self.sources.get(key)
    if src is None:
      src = self.sources[key] = _Source(key, collections.deque(maxlen=max(self.window, 1)))
    src.sampler = rec.meta.get("sampler")
    return src

  def _handed_out_before(self, index: int) -> bool:
    return 0 <= index < self.num_tasks and bool(self.ever[index])

  def _from_earlier_learner(self, rec: records.Record, index: int) -> bool:
    return self.resumed and rec.meta["t_end"] < self.started and 0 <= index < self.num_tasks

  def _range(self, index: int) -> tuple[float, float]:
    if index not in self._ranges:
      self._ranges[index] = self._reward_range(index)
    return self._ranges[index]

  def _charge(self, src: _Source, rec: records.Record | None, rejected: bool) -> None:
    if rejected:
      src.rejected += 1
    else:
      src.accepted += 1
    if not self.window:
      return
    src.recent.append(rejected)
    bad = sum(src.recent)
    if len(src.recent) == self.window and bad >= self.rate * self.window:
      src.quarantined = f"{bad} of its last {self.window} records rejected"
      self.counts["quarantined_samplers"] += 1
      meta = rec.meta if rec is not None else {}
      where = (
        f"local sampler {meta.get('sampler')}, pid {meta.get('pid')}"
        if "pid" in meta
        else f"sampler {meta.get('sampler', '?')}"
      )
      print(
        f"sao: quarantined sampler {src.key:06x} ({where}): {src.quarantined}; its records "
        "are dropped from now on (rejected_quarantined)",
        flush=True,
      )
      if self.on_quarantine is not None:
        self.on_quarantine(dict(meta))


def poison(
  kind: str,
  arrays: dict[str, np.ndarray],
  meta: dict,
  policy_version: int,
  *,
  vocab_size: int,
  reward_high: float,
  unknown_task: int,
) -> tuple[dict[str, np.ndarray], dict, int]:
  """A copy of a trajectory record's (arrays, meta, policy version) that passes the format
  checks and is rejected at the door with reason `kind` (one of POISON_KINDS): a NaN
  behaviour log-prob, a token id past the vocabulary, a total reward above the task's range,
  a policy version 10^6 ahead, task index `unknown_task` (one never handed out, e.g. in
  the validation tail), another task's id, or the opposite of the reward its completion
  earned (the top of the range for a 0, 0 otherwise: caught where the family's reward is
  re-scored at the door, `TaskFamily.verifiable`). Caught later or elsewhere
  (`config.POISON_CAUGHT_BY`): behaviour log-probs that claim certainty (0) or e^-50 on
  every token (the update's verification, `sao.verify_drift`), the same trajectory again
  (it answers a hand-out answered already: `duplicate_answers`) and a prompt 8 tokens wider
  than the run's (another config's: the format check, `bad_records`)."""
  a, m = {k: np.array(v) for k, v in arrays.items()}, dict(meta)
  if kind == "nonfinite":
    a["logp"][0, 0] = np.nan
  elif kind == "token_oov":
    a["tokens"][0, 0] = vocab_size + 7
  elif kind == "reward_range":
    m["reward"] = float(reward_high) + 1.0
  elif kind == "future_version":
    policy_version += 10**6
    if "version" in a:
      a["version"] = np.where(a["valid"], a["version"] + 10**6, a["version"])
  elif kind == "unknown_task":
    m["task_index"] = int(unknown_task)
  elif kind == "task_mismatch":
    m["task_id"] = int(m.get("task_id", 0)) + 1
  elif kind == "reward_mismatch":
    m["reward"] = float(reward_high) if float(m["reward"]) < float(reward_high) / 2 else 0.0
  elif kind in ("logp_certain", "logp_far"):
    claim = 0.0 if kind == "logp_certain" else -50.0
    a["logp"] = np.where(a["valid"], claim, a["logp"]).astype(a["logp"].dtype)
  elif kind == "resent":
    pass  # the same arrays and meta, sent again (under a new record id by the sender)
  elif kind == "wrong_shape":
    for k in ("prompt", "prompt_valid"):
      a[k] = np.pad(a[k], ((0, 0), (0, 8)))
  else:
    raise ValueError(f"unknown poison kind {kind!r}; known: {', '.join(POISON_KINDS)}")
  return a, m, policy_version


class Poisoner:
  """Fault injection in a sampler (`faults.poison_*`): with every `poison_every`-th record,
  one poisoned record of the next kind (round robin) until `poison_records` of each are sent.
  A poisoned record replaces the clean one (its task is handed out again when it is refused),
  except the kinds in EXTRA, sent beside it (the clean record answers the task)."""

  EXTRA = ("unknown_task", "resent", "wrong_shape")

  def __init__(
    self,
    faults: FaultsConfig,
    *,
    vocab_size: int,
    reward_high: Callable[[int], float],
    unknown_task: int,
  ):
    self.kinds, self.every = tuple(faults.poison_kinds), faults.poison_every
    self.left = {k: faults.poison_records for k in self.kinds}
    self.vocab_size, self.reward_high, self.unknown_task = vocab_size, reward_high, unknown_task
    self.seen = 0
    self.sent: collections.Counter = collections.Counter()

  def __call__(self, arrays: dict, meta: dict, version: int) -> list[tuple[dict, dict, int]]:
    """What to send in place of this clean record: [(arrays, meta, policy version)]."""
    self.seen += 1
    todo = [k for k in self.kinds if self.left[k]]
    if not todo or self.seen % self.every:
      return [(arrays, meta, version)]
    kind = todo[self.sent.total() % len(todo)]
    self.left[kind] -= 1
    self.sent[kind] += 1
    bad = poison(
      kind,
      arrays,
      meta,
      version,
      vocab_size=self.vocab_size,
      reward_high=self.reward_high(meta["task_index"]),
      unknown_task=self.unknown_task,
    )
    return [(arrays, meta, version), bad] if kind in self.EXTRA else [bad]


class RewardAudit:
  """Re-scores a sampled fraction of admitted records whose reward is costly to recompute
  (module docstring): `picks` by a keyed hash of the record id (the key random per learner:
  a sampler cannot tell which of its records will be checked), `hold` starts the re-score
  on a thread pool (the scoring function runs the learner's own sandbox pool), `released`
  returns the held records whose score is in: (record, payload, true reward or None when
  the family gave none, the error if scoring failed). `held` is what still waits."""

  def __init__(
    self,
    fraction: float,
    score: Callable[[records.Record], float | None],
    workers: int = 2,
    key: bytes | None = None,
  ):
    if not 0.0 <= fraction <= 1.0:
      raise ValueError(f"audit fraction {fraction} not in [0, 1]")
    self.fraction, self.score = fraction, score
    self.key = key or os.urandom(16)
    self._threshold = int(fraction * 2**64)
    self._pool = concurrent.futures.ThreadPoolExecutor(
      max(1, workers), thread_name_prefix="reward-audit"
    )
    self._held: list[tuple[records.Record, object, concurrent.futures.Future]] = []

  def picks(self, record_id: int) -> bool:
    if self.fraction >= 1.0:
      return True
    h = hashlib.blake2b(int(record_id).to_bytes(8, "little"), key=self.key, digest_size=8)
    return int.from_bytes(h.digest(), "little") < self._threshold

  def hold(self, rec: records.Record, payload) -> None:
    self._held.append((rec, payload, self._pool.submit(self.score, rec)))

  def released(self) -> list[tuple[records.Record, object, float | None, BaseException | None]]:
    out, still = [], []
    for rec, payload, fut in self._held:
      if not fut.done():
        still.append((rec, payload, fut))
        continue
      err = fut.exception()
      out.append((rec, payload, None if err else fut.result(), err))
    self._held = still
    return out

  def wait(self, timeout: float | None = None) -> bool:
    """Blocks until every held record's re-score is in (or `timeout`); whether all are."""
    _, not_done = concurrent.futures.wait([f for *_, f in self._held], timeout)
    return not not_done

  def held(self) -> list:
    """The payloads of the records still being re-scored, oldest first."""
    return [payload for _, payload, _ in self._held]

  def close(self) -> None:
    self._pool.shutdown(wait=False, cancel_futures=True)
