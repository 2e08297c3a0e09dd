"""Kafka transport over kafka-python: any Kafka-protocol cluster, or the local broker.

Topics of run `R`:
  sao.R.tasks.I       task records of learner incarnation `I` (a fresh id each time a learner
                      starts or resumes), `partitions` partitions; samplers read them as one
                      consumer group (`sao.R.samplers.I`), so tasks spread over samplers on
                      any machine and a sampler's unacknowledged tasks go to the others if it
                      dies. A resumed learner starts a new topic and group rather than
                      reusing the dead one's: its task stream restarts from the snapshot
                      anyway, and on the local broker a group whose members had all left was
                      seen to keep new members waiting in the join for minutes;
  sao.R.trajectories  trajectory records; the learner reads every partition and commits
                      offsets only for records whose update it applied (at-least-once;
                      duplicates are dropped by record id on the learner);
  sao.R.dead-letter   records the learner could not decode, copied with the reason
                      (header `reason`);
  sao.R.control       one partition of JSON announcements by the learner: the resolved
                      config and the parameter directory (status "running"), then status
                      "finished". `sao-jax sampler --bootstrap ... --run-id R` needs nothing
                      else to join a run, and follows a restarted learner to its new
                      incarnation. Parameters themselves are not sent over Kafka:
                      they are versioned .npz files in that directory, which must be on
                      storage the samplers' machines share (NFS, a bucket mount); a
                      1M-parameter policy per version would be a 4 MB record per update.

Client settings (measured on the local broker, see FACTS): producers `linger_ms=0` for
latency; consumers `fetch_max_wait_ms=25` (lower stalled on this broker), group
`session_timeout_ms=6000` / `heartbeat_interval_ms=2000` (joins in 1-3 s, not 23 s).

A lost broker is retried, then reported; no call blocks without bound:
  - the clients reconnect on their own with exponential backoff (`reconnect_backoff_ms` 50 ms
    doubling to 2 s) and retry requests every `retry_backoff_ms`;
  - a flush (tasks sent, trajectories sent before their tasks are acked) or an offset commit
    that has not completed after `broker_timeout_s` raises `BrokerError`, as does a record the
    broker refused; producers give up on a record after about as long (`delivery_timeout_ms`);
  - an end that has received nothing for `idle_probe_s` probes the broker (one metadata
    request) when `check()` is called (the SAO learner does so on every empty poll; a sampler's
    `get_tasks` does it itself). A broker that does not answer is probed again with exponential
    backoff (0.25 s doubling to 4 s) for up to `broker_timeout_s`, then `BrokerError` names its
    address. A sampler's error reaches the learner, which stops the run with it;
  - `close()` waits at most a few seconds for unsent records, then drops them: with the
    broker gone they could never be delivered, and a run that is stopping must not hang.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import time

from sao_jax.transport import auth, kafka_security, records
from sao_jax.transport.base import Handouts
from sao_jax.transport.broker import BrokerError, retry_until_answers

_CLIENT = dict(request_timeout_ms=10_000, retry_backoff_ms=100, reconnect_backoff_max_ms=2000)
_CLOSE_TIMEOUT_S = 5.0


@dataclasses.dataclass
class KafkaSpec:
  bootstrap: str
  run_id: str
  partitions: int = 4
  broker_timeout_s: float = 30.0  # a lost broker is retried this long, then BrokerError
  idle_probe_s: float = 5.0  # nothing received this long: is the broker still there?
  incarnation: str = ""  # the learner's start: names its task topic and sampler group
  # The run's key (`sao_jax.transport.auth`): task records and announcements are sealed
  # with it and checked against it. Never printed (repr) and never announced.
  key: bytes | None = dataclasses.field(default=None, repr=False)
  # TLS / SASL settings of every client (`kafka_security.settings`: no secrets in it).
  security: dict = dataclasses.field(default_factory=dict)

  def topic(self, name: str) -> str:
    if name == "tasks" and self.incarnation:
      return f"sao.{self.run_id}.tasks.{self.incarnation}"
    return f"sao.{self.run_id}.{name}"

  @property
  def sampler_group(self) -> str:
    return f"sao.{self.run_id}.samplers" + (f".{self.incarnation}" if self.incarnation else "")

  def create_topics(self, only: tuple[str, ...] = ()) -> None:
    """Creates the run's topics (or `only` those named) if they do not exist yet."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    admin = KafkaAdminClient(
      bootstrap_servers=self.bootstrap,
      client_id="sao-jax-admin",
      **_CLIENT,
      **kafka_security.with_secrets(self.security),
    )
    try:
      for name, n in (
        ("tasks", self.partitions),
        ("trajectories", self.partitions),
        ("dead-letter", 1),
        ("control", 1),
      ):
        if only and name not in only:
          continue
        try:
          admin.create_topics([NewTopic(self.topic(name), num_partitions=n, replication_factor=1)])
        except TopicAlreadyExistsError:
          pass
    finally:
      admin.close()

  def delete_task_topics(self, settle_s: float = 2.0, timeout_s: float = 20.0) -> list[str]:
    """Deletes the task topics of every incarnation of this run (the run finished: no learner
    will hand out or redeliver those tasks again); returns their names. The trajectories,
    dead-letter and control topics stay (the record of what was produced and rejected).

    A sampler still fetching from a task topic at the moment it is deleted can bring it back:
    the local broker creates a topic on a fetch whatever the client asks (measured: 1 deletion
    in 8 under a polling consumer), and remote samplers stop only once they have read the
    "finished" announcement. So the listing is watched until it has shown none of the topics
    for `settle_s`, deleting again any that came back, for at most `timeout_s`."""
    from kafka import KafkaAdminClient
    from kafka.errors import UnknownTopicOrPartitionError

    admin = KafkaAdminClient(
      bootstrap_servers=self.bootstrap,
      client_id="sao-jax-admin",
      **_CLIENT,
      **kafka_security.with_secrets(self.security),
    )
    try:
      prefix = f"sao.{self.run_id}.tasks"

      def listed() -> list[str]:
        return sorted(t for t in admin.list_topics() if t == prefix or t.startswith(prefix + "."))

      names = listed()
      left, gone_since, deadline = names, None, time.monotonic() + timeout_s
      while time.monotonic() < deadline:
        if left:
          gone_since = None
          with contextlib.suppress(UnknownTopicOrPartitionError):  # deleted meanwhile
            admin.delete_topics(left, timeout_ms=10_000)
        elif gone_since is None:
          gone_since = time.monotonic()
        elif time.monotonic() - gone_since >= settle_s:
          break
        time.sleep(0.25)
        left = listed()
      return names
    finally:
      admin.close()

  def announce(self, payload: dict) -> None:
    """Appends a JSON announcement to the control topic (learner side)."""
    import json

    producer = _producer(self)
    try:
      producer.send(self.topic("control"), value=auth.seal(self.key, json.dumps(payload).encode()))
      producer.flush(timeout=10)
    finally:
      producer.close()

  def read_control(self, timeout: float = 10.0) -> dict | None:
    """The latest announcement on the control topic, or None if there is none yet."""
    import json
    import time

    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
      bootstrap_servers=self.bootstrap,
      enable_auto_commit=False,
      auto_offset_reset="earliest",
      fetch_max_wait_ms=25,
      **_client(self),
    )
    try:
      consumer.assign([TopicPartition(self.topic("control"), 0)])
      latest, deadline, quiet = None, time.time() + timeout, 0
      while time.time() < deadline and quiet < 3:  # read to the end: 3 empty polls in a row
        polled = consumer.poll(timeout_ms=200)
        recs = [r for rs in polled.values() for r in rs]
        quiet = 0 if recs else quiet + (latest is not None)
        for r in recs:
          try:
            latest = json.loads(auth.unseal(self.key, r.value))
          except (ValueError, TypeError):  # (auth.Unauthenticated is a ValueError)
            continue  # not an announcement of this run's learner
      return latest
    finally:
      consumer.close()

  def watch_control(self) -> ControlWatcher:
    """Announcements made on the control topic from now on (see `ControlWatcher`)."""
    return ControlWatcher(self)

  def learner_end(self) -> KafkaLearnerEnd:
    return KafkaLearnerEnd(self)

  def sampler_end(self) -> KafkaSamplerEnd:
    return KafkaSamplerEnd(self)

  def close(self) -> None:
    pass


def _client(spec: KafkaSpec) -> dict:
  """Client settings for an end of this run: a broker that is not there at construction fails
  within `broker_timeout_s` too (kafka-python's own bootstrap wait is 30 s). Topics are made
  only by `create_topics`: a client's metadata request never creates one (else a sampler
  still subscribed when the finished run deletes its task topic would bring it back)."""
  return dict(
    _CLIENT,
    bootstrap_timeout_ms=int(spec.broker_timeout_s * 1000),
    allow_auto_create_topics=False,
    **kafka_security.with_secrets(spec.security),
  )


def _producer(spec: KafkaSpec):
  from kafka import KafkaProducer

  budget_ms = int(spec.broker_timeout_s * 1000)
  # kafka-python requires delivery_timeout_ms >= request_timeout_ms + linger_ms.
  return KafkaProducer(
    bootstrap_servers=spec.bootstrap,
    linger_ms=0,
    acks=1,
    max_request_size=records.DEFAULT_MAX_BYTES + 4096,
    max_block_ms=budget_ms,
    delivery_timeout_ms=max(budget_ms, _CLIENT["request_timeout_ms"] + 1000),
    **_client(spec),
  )


class _BrokerWatch:
  """Tells a quiet broker from a lost one: probes only after `idle_probe_s` without traffic,
  so a busy run never pays for it."""

  def __init__(self, spec: KafkaSpec, role: str):
    self.spec, self.role = spec, role
    self.last_ok = time.monotonic()
    self.lost = False  # a BrokerError was raised: closing need not wait for the broker

  def alive(self) -> None:
    self.last_ok = time.monotonic()

  def check(self) -> None:
    if time.monotonic() - self.last_ok < self.spec.idle_probe_s:
      return
    try:
      retry_until_answers(
        self.spec.bootstrap,
        self.spec.broker_timeout_s,
        what=f" ({self.role} of run {self.spec.run_id})",
        security=self.spec.security,
      )
    except BrokerError:
      self.lost = True
      raise
    self.alive()

  def flush(self, producer, futures: list, what: str) -> None:
    """Every record in `futures` is on the broker, or BrokerError within the budget."""
    from kafka.errors import KafkaTimeoutError

    try:
      producer.flush(timeout=self.spec.broker_timeout_s)
    except KafkaTimeoutError as err:
      self.lost = True
      raise BrokerError(
        f"lost the Kafka broker at {self.spec.bootstrap} ({self.role} of run "
        f"{self.spec.run_id}): {what} not delivered within "
        f"{self.spec.broker_timeout_s:.0f} s ({err!r})"
      ) from err
    self.raise_failed(futures, what)  # all done now: raises or empties the list
    self.alive()

  def raise_failed(self, futures: list, what: str) -> None:
    """Drops finished sends from `futures`; BrokerError if the broker refused one or the
    producer gave up on it (after `delivery_timeout_ms`, about `broker_timeout_s`)."""
    done = [f for f in futures if f.is_done]
    for f in done:
      if f.failed():
        raise BrokerError(
          f"the Kafka broker at {self.spec.bootstrap} did not take {what} "
          f"({self.role} of run {self.spec.run_id}): {f.exception!r}"
        )
    if done:
      futures[:] = [f for f in futures if not f.is_done]

  def commit(self, consumer, offsets=None) -> None:
    """Commits the consumer's offsets (or `offsets`), retrying retriable errors (connection lost, no
    coordinator) with exponential backoff for up to the budget, then BrokerError."""
    from kafka.errors import KafkaError

    budget = self.spec.broker_timeout_s
    deadline = time.monotonic() + budget
    wait = 0.25
    while True:
      try:
        consumer.commit(offsets, timeout_ms=max(1, int((deadline - time.monotonic()) * 1000)))
        break
      except KafkaError as err:
        if not err.retriable:
          raise  # e.g. CommitFailedError: the group rebalanced; not the broker's health
        if time.monotonic() + wait >= deadline:
          self.lost = True
          raise BrokerError(
            f"lost the Kafka broker at {self.spec.bootstrap} ({self.role} of run "
            f"{self.spec.run_id}): offset commit failed for {budget:.0f} s "
            f"({err!r})"
          ) from err
        time.sleep(wait)
        wait = min(2 * wait, 4.0)
    self.alive()


_MAX_PENDING_SENDS = 10_000  # beyond this many undelivered sends, wait for the broker


def _close(producer, consumer, watch: _BrokerWatch) -> None:
  from kafka.errors import KafkaError

  try:
    producer.close(timeout=0 if watch.lost else _CLOSE_TIMEOUT_S)
  except KafkaError:
    # kafka-python has no public "close now, drop the rest"; the forced sender aborts the
    # pending records at once, so this second close returns in milliseconds.
    producer._sender.force_close()
    producer.close(timeout=_CLOSE_TIMEOUT_S)
  consumer.close(timeout_ms=int(_CLOSE_TIMEOUT_S * 1000))


class ControlWatcher:
  """Follows the control topic from its end: `poll()` returns the announcements made since
  the last call (JSON objects; anything else on the topic is skipped)."""

  def __init__(self, spec: KafkaSpec):
    from kafka import KafkaConsumer, TopicPartition

    self.key = spec.key
    self._consumer = KafkaConsumer(
      bootstrap_servers=spec.bootstrap,
      enable_auto_commit=False,
      auto_offset_reset="latest",
      fetch_max_wait_ms=200,
      **_CLIENT,
      **kafka_security.with_secrets(spec.security),
    )
    self._consumer.assign([TopicPartition(spec.topic("control"), 0)])

  def poll(self, timeout_s: float = 1.0) -> list[dict]:
    import json

    out = []
    for recs in self._consumer.poll(timeout_ms=int(timeout_s * 1000)).values():
      for r in recs:
        try:
          news = json.loads(auth.unseal(self.key, r.value))
        except (ValueError, TypeError):  # not an announcement of this run's learner
          continue
        if isinstance(news, dict):
          out.append(news)
    return out

  def close(self) -> None:
    self._consumer.close()


class KafkaLearnerEnd:
  def __init__(self, spec: KafkaSpec):
    from kafka import KafkaConsumer, TopicPartition

    self.spec = spec
    self.producer = _producer(spec)
    self.consumer = KafkaConsumer(
      bootstrap_servers=spec.bootstrap,
      group_id=f"sao.{spec.run_id}.learner",
      enable_auto_commit=False,
      auto_offset_reset="earliest",
      fetch_max_wait_ms=25,
      max_partition_fetch_bytes=records.DEFAULT_MAX_BYTES + 4096,
      **_client(spec),
    )
    topic = spec.topic("trajectories")
    self.consumer.assign([TopicPartition(topic, p) for p in range(spec.partitions)])
    self._sent = 0
    self._task_sends: list = []  # futures of task records not yet known to be delivered
    self._watch = _BrokerWatch(spec, "learner")

  def put_tasks(self, indices, handouts=None):
    """Sends task records without waiting for the broker: the learner's loop must not pay a
    round trip per top-up. A send the broker refused, or one still undelivered after
    `broker_timeout_s`, raises BrokerError on a later call (`flush` waits for all)."""
    self._watch.raise_failed(self._task_sends, "task records")
    for k, i in enumerate(indices):
      self._sent += 1
      meta = {"task_index": int(i)}
      if handouts is not None:
        meta["handout"] = int(handouts[k])
      rid = meta.get("handout", int(i))
      self._task_sends.append(
        self.producer.send(
          self.spec.topic("tasks"),
          key=str(self._sent).encode(),
          value=auth.seal(self.spec.key, records.encode(records.RecordKind.TASK, rid, 0, {}, meta)),
        )
      )
    if len(self._task_sends) > _MAX_PENDING_SENDS:
      self.flush()

  def flush(self) -> None:
    """Every task record sent so far is on the broker, or BrokerError within the budget."""
    self._watch.flush(self.producer, self._task_sends, f"{len(self._task_sends)} task records")

  def get_trajectories(self, max_n, timeout):
    return [data for data, _ in self.get_records(max_n, timeout)]

  def get_records(self, max_n, timeout) -> list[tuple[bytes, tuple[int, int]]]:
    """Like get_trajectories, with each record's (partition, offset)."""
    polled = self.consumer.poll(timeout_ms=int(timeout * 1000), max_records=max_n)
    if polled:
      self._watch.alive()
    return [
      (r.value, (r.partition, r.offset))
      for recs in polled.values()
      for r in recs
      if r.value is not None
    ]

  def positions(self) -> dict[int, int]:
    """Next offset to read, per partition."""
    return {tp.partition: self.consumer.position(tp) for tp in self.consumer.assignment()}

  def commit_positions(self, positions: dict[int, int]) -> None:
    """Commits these offsets for the learner's group: a restarted learner reads on from them.
    Dead letters of the records they cover are flushed to the broker first, so a bad record
    is never both past the committed offset and missing from the dead-letter topic."""
    from kafka import TopicPartition
    from kafka.structs import OffsetAndMetadata

    self._watch.flush(self.producer, [], "dead-letter records")
    topic = self.spec.topic("trajectories")
    self._watch.commit(
      self.consumer,
      {TopicPartition(topic, p): OffsetAndMetadata(o, "", -1) for p, o in positions.items()},
    )

  def check(self):
    """After `idle_probe_s` with no records: raises BrokerError if the broker stays gone."""
    self._watch.raise_failed(self._task_sends, "task records")
    self._watch.check()

  def commit(self):
    self._watch.commit(self.consumer)

  def dead_letter(self, data, reason):
    self.producer.send(
      self.spec.topic("dead-letter"), value=data, headers=[("reason", reason.encode()[:500])]
    )

  def close(self):
    _close(self.producer, self.consumer, self._watch)


class KafkaSamplerEnd:
  """A sampler's end. Acknowledging a call's tasks does not stall the sampler: the
  trajectories go out in the producer's background thread while the next call is generated,
  and the tasks' offsets are committed (asynchronously) once every trajectory sent before
  them is on the broker. So a crash redelivers at most the last `_MAX_UNSETTLED` calls'
  tasks, and never acknowledges a task whose trajectory is not on the broker."""

  _MAX_UNSETTLED = 2  # calls whose acknowledgement may be pending; beyond that, wait

  def __init__(self, spec: KafkaSpec):
    from kafka import KafkaConsumer

    self.spec = spec
    self.producer = _producer(spec)
    self.consumer = KafkaConsumer(
      spec.topic("tasks"),
      bootstrap_servers=spec.bootstrap,
      group_id=spec.sampler_group,
      enable_auto_commit=False,
      auto_offset_reset="earliest",
      fetch_max_wait_ms=25,
      session_timeout_ms=6000,
      heartbeat_interval_ms=2000,
      **_client(spec),
    )
    self._watch = _BrokerWatch(spec, "sampler")
    self._pending: list = []  # send futures of trajectories not yet acknowledged
    # Every record taken, in the order taken: [TopicPartition, offset, is a task]. Tasks are
    # acknowledged in this order (a prefix at a time), so a committed offset never covers a
    # task whose trajectory is still being generated.
    self._taken: collections.deque = collections.deque()
    self._acks: collections.deque = collections.deque()  # (send futures, offsets) per call
    self.commit_failures = 0  # async commits refused (e.g. a rebalance): tasks redelivered
    self.unauthenticated = 0  # task records without a valid tag under the run's key
    self.handouts = Handouts()  # hand-out ids of the tasks taken, not yet answered

  def get_tasks(self, max_n, timeout):
    from kafka.errors import KafkaError

    self._settle(keep=None)
    try:
      polled = self.consumer.poll(timeout_ms=int(timeout * 1000), max_records=max_n)
    except KafkaError:  # a lost connection: probed below, BrokerError once the budget is spent
      polled = {}
    if not polled:
      self._watch.check()  # no tasks for a while: idle learner, or a lost broker?
      return []
    self._watch.alive()
    out = []
    for tp, recs in polled.items():
      for r in recs:
        try:
          task = records.decode(auth.unseal(self.spec.key, r.value))
          index = int(task.meta["task_index"])
          handout = task.meta.get("handout")
          self.handouts.took(index, None if handout is None else int(handout))
          out.append(index)
          self._taken.append((tp, r.offset, True))
        except auth.Unauthenticated:
          self.unauthenticated += 1  # not from this run's learner: not done, and counted
          self._taken.append((tp, r.offset, False))
        except (records.RecordError, TypeError, KeyError, ValueError):
          self._taken.append((tp, r.offset, False))  # not a task record: nothing to do
    return out

  def put_trajectory(self, data):
    self._pending.append(self.producer.send(self.spec.topic("trajectories"), value=data))

  def handout_for(self, index):
    return self.handouts.answer(index)

  def ack_tasks(self, n: int | None = None):
    """The first `n` tasks not yet acknowledged, in the order `get_tasks` returned them (all
    taken so far when None), are done: their offsets are committed once every trajectory
    put before this call is on the broker. Returns at once unless more than
    `_MAX_UNSETTLED` acknowledgements are still unconfirmed."""
    self._acks.append((self._pending, self._pop_taken(n)))
    self._pending = []
    self._settle(keep=self._MAX_UNSETTLED)

  def _pop_taken(self, n: int | None) -> dict:
    """Offsets to commit (per partition, one past the last record) for the first n tasks
    taken, with the other records taken before and between them."""
    offsets, tasks = {}, 0
    while self._taken and (n is None or tasks < n or not self._taken[0][2]):
      tp, offset, is_task = self._taken[0]
      if is_task and n is not None and tasks >= n:
        break
      self._taken.popleft()
      tasks += is_task
      offsets[tp] = offset + 1
    return offsets

  def flush(self):
    """Every trajectory sent is on the broker and every acknowledgement committed (sync);
    tasks still in progress stay unacknowledged."""
    self._acks.append((self._pending, {}))
    self._pending = []
    self._settle(keep=0, sync=True)

  def _settle(self, keep: int | None, sync: bool = False) -> None:
    """Commits the acknowledgements, oldest first, whose trajectories are all delivered
    (asynchronously unless `sync`); waits for the oldest while more than `keep` are
    unconfirmed (None: never waits). BrokerError if a record was refused or not delivered
    within `broker_timeout_s`."""
    latest: dict = {}
    while self._acks:
      futures, offsets = self._acks[0]
      what = f"{len(futures)} trajectory records"
      if all(f.is_done for f in futures):
        self._watch.raise_failed(list(futures), what)
      elif keep is None or len(self._acks) <= keep:
        break
      else:
        self._watch.flush(self.producer, list(futures), what)  # waits, then checks them
      self._acks.popleft()
      latest.update(offsets)  # per partition, later acknowledgements reach further
    if not latest:
      return
    self._watch.alive()
    if sync:
      self._watch.commit(self.consumer, self._offsets(latest))
    else:
      self.consumer.commit_async(self._offsets(latest), callback=self._committed)

  @staticmethod
  def _offsets(taken: dict) -> dict:
    from kafka.structs import OffsetAndMetadata

    return {tp: OffsetAndMetadata(o, "", -1) for tp, o in taken.items()}

  def _committed(self, offsets, response) -> None:
    if isinstance(response, Exception):
      self.commit_failures += 1  # the tasks are redelivered: work repeated, nothing lost

  def close(self):
    if not self._watch.lost:
      with contextlib.suppress(BrokerError, Exception):
        self.flush()  # what was generated is delivered and acknowledged before leaving
    _close(self.producer, self.consumer, self._watch)


def topic_record_ids(
  bootstrap: str,
  topic: str,
  partitions: int,
  quiet_polls: int = 10,
  security: dict | None = None,
) -> list[tuple[int, int, int | None]]:
  """(partition, offset, record id) of every record on `topic`, read from the broker by a
  consumer of its own (no group): what was produced, independent of any learner. A record
  that does not decode has id None. `security`: `kafka_security.settings(...)` of a TLS or
  SASL broker (the passwords are read from the environment, as for a run's clients)."""
  from kafka import KafkaConsumer, TopicPartition

  c = KafkaConsumer(
    bootstrap_servers=bootstrap,
    enable_auto_commit=False,
    auto_offset_reset="earliest",
    fetch_max_wait_ms=25,
    **_CLIENT,
    **kafka_security.with_secrets(security or {}),
  )
  c.assign([TopicPartition(topic, p) for p in range(partitions)])
  out, quiet = [], 0
  try:
    while quiet < quiet_polls:
      got = [r for rs in c.poll(timeout_ms=300).values() for r in rs]
      quiet = 0 if got else quiet + 1
      for r in got:
        rid = None
        # (sealed records carry their tag after the record: read, not verified, here)
        for data in (r.value, r.value[: -auth.TAG_BYTES]):
          with contextlib.suppress(records.RecordError):
            rid = records.decode(data).record_id
            break
        out.append((r.partition, r.offset, rid))
  finally:
    c.close()
  return out


def committed_offsets(
  bootstrap: str, group: str, topic: str, partitions: int, security: dict | None = None
) -> dict[int, int]:
  """The consumer group's committed offset per partition of `topic` (0 where none);
  `security` as for `topic_record_ids`."""
  from kafka import KafkaConsumer, TopicPartition

  c = KafkaConsumer(
    bootstrap_servers=bootstrap,
    group_id=group,
    enable_auto_commit=False,
    **_CLIENT,
    **kafka_security.with_secrets(security or {}),
  )
  try:
    return {p: c.committed(TopicPartition(topic, p)) or 0 for p in range(partitions)}
  finally:
    c.close()
