"""The two ends of a transport between the SAO learner and its samplers.

Tasks go learner -> samplers (whoever asks first gets the next task: load balancing);
trajectory records (bytes, `sao_jax.transport.records`) go samplers -> learner. The
embedded transport uses multiprocessing queues on one machine; the Kafka transport uses
topics on a broker, so samplers on other machines can join.
"""

from __future__ import annotations

import queue
from collections.abc import Sequence
from typing import Protocol


class LearnerEnd(Protocol):
  def put_tasks(self, indices: Sequence[int], handouts: Sequence[int] | None = None) -> None:
    """Hands tasks out, each with its hand-out id when given (a trajectory answers one
    hand-out: `SamplerEnd.handout_for`); may return before they are delivered (`flush`)."""
    ...

  def flush(self) -> None:
    """Every task handed out so far is delivered (or an error is raised)."""
    ...

  def get_trajectories(self, max_n: int, timeout: float) -> list[bytes]:
    """Up to `max_n` records; waits at most `timeout` seconds for the first one."""
    ...

  def commit(self) -> None:
    """Everything returned so far is consumed (applied to the learner state)."""
    ...

  def get_records(self, max_n: int, timeout: float) -> list[tuple[bytes, object]]:
    """Like get_trajectories, with each record's transport position (None if it has none)."""
    ...

  def positions(self) -> dict[int, int]:
    """The next position to read per partition ({} when the transport has none)."""
    ...

  def commit_positions(self, positions: dict[int, int]) -> None:
    """Commits these positions: a restarted learner reads on from them."""
    ...

  def dead_letter(self, data: bytes, reason: str) -> None: ...

  def check(self) -> None:
    """Raises if the transport is lost for good (called when nothing arrives for a while)."""
    ...

  def close(self) -> None: ...


class SamplerEnd(Protocol):
  def get_tasks(self, max_n: int, timeout: float) -> list[int]: ...

  def handout_for(self, index: int) -> int | None:
    """The hand-out id of the oldest task `index` taken and not yet answered (it is answered
    now); None when the learner gave none."""
    ...

  def put_trajectory(self, data: bytes) -> None: ...

  def ack_tasks(self, n: int | None = None) -> None:
    """The first `n` tasks not yet acknowledged, in the order `get_tasks` returned them (all
    taken so far when None), are done once the trajectories put so far are delivered (the
    redelivery point on a crash). May return before that is confirmed (see `flush`)."""
    ...

  def flush(self) -> None:
    """Every trajectory put so far is delivered and every ack_tasks confirmed."""
    ...

  def close(self) -> None: ...


class Handouts:
  """A sampler end's hand-out ids of the tasks it took and has not answered, per task index
  (a sampler may hold the same task twice: oldest first)."""

  def __init__(self):
    import collections

    self._by_index: dict[int, collections.deque] = collections.defaultdict(collections.deque)

  def took(self, index: int, handout: int | None) -> None:
    if handout is not None:
      self._by_index[index].append(handout)

  def answer(self, index: int) -> int | None:
    q = self._by_index.get(index)
    if not q:
      return None
    h = q.popleft()
    if not q:
      del self._by_index[index]
    return h


def _drain(q, max_n: int, timeout: float) -> list:
  """Waits up to `timeout` for the first item, then takes what is there, up to `max_n`."""
  out = []
  try:
    out.append(q.get(timeout=timeout))
    while len(out) < max_n:
      out.append(q.get_nowait())
  except queue.Empty:
    pass
  return out


class EmbeddedSpec:
  """Multiprocessing queues; created by the learner, handed to spawned samplers."""

  def __init__(self, ctx):
    self.task_q = ctx.Queue()
    self.traj_q = ctx.Queue()
    self.dead_letters = 0

  def learner_end(self) -> EmbeddedLearnerEnd:
    return EmbeddedLearnerEnd(self)

  def sampler_end(self) -> EmbeddedSamplerEnd:
    return EmbeddedSamplerEnd(self)

  def close(self) -> None:
    for q in (self.task_q, self.traj_q):
      q.cancel_join_thread()
      q.close()


class EmbeddedLearnerEnd:
  def __init__(self, spec: EmbeddedSpec):
    self.spec = spec

  def put_tasks(self, indices, handouts=None):
    for k, i in enumerate(indices):
      self.spec.task_q.put(int(i) if handouts is None else (int(i), int(handouts[k])))

  def get_trajectories(self, max_n, timeout):
    return _drain(self.spec.traj_q, max_n, timeout)

  def get_records(self, max_n, timeout):
    return [(data, None) for data in self.get_trajectories(max_n, timeout)]

  def positions(self):
    return {}

  def commit_positions(self, positions):
    pass  # queues hold nothing once read (the learner's journal is what replays)

  def commit(self):
    pass  # queues hold nothing once read

  def flush(self):
    pass

  def dead_letter(self, data, reason):
    self.spec.dead_letters += 1  # nowhere durable to copy it to: counted

  def check(self):
    pass  # the queues live as long as the learner; a dead sampler is caught by its exit code

  def close(self):
    pass


class EmbeddedSamplerEnd:
  def __init__(self, spec: EmbeddedSpec):
    self.spec = spec
    self.handouts = Handouts()

  def get_tasks(self, max_n, timeout):
    out = []
    for item in _drain(self.spec.task_q, max_n, timeout):
      index, handout = item if isinstance(item, tuple) else (item, None)
      self.handouts.took(index, handout)
      out.append(index)
    return out

  def handout_for(self, index):
    return self.handouts.answer(index)

  def put_trajectory(self, data):
    self.spec.traj_q.put(data)

  def ack_tasks(self, n: int | None = None):
    pass  # a task taken off the queue is gone; a crashed sampler's tasks are not redelivered

  def flush(self):
    pass  # a queue put is delivered once it returns (the feeder thread sends it)

  def close(self):
    # Do not block exit on undelivered records: the learner treats what it got as final.
    self.spec.traj_q.cancel_join_thread()
