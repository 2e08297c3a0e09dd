"""Kafka transport over kafka-python: any Kafka-protocol cluster, or the local broker.

Topics of run `R`:
  sao.R.tasks         task records, `partitions` partitions; samplers read them as one
                      consumer group, so tasks spread over samplers on any machine and a
                      sampler's unacknowledged tasks go to the others if it dies;
  sao.R.trajectories  trajectory records; the learner reads every partition and commits
                      offsets only for records whose update it applied (at-least-once;
                      duplicates are dropped by record id on the learner);
  sao.R.dead-letter   records the learner could not decode, copied with the reason;
  sao.R.control       one partition of JSON announcements by the learner: the resolved
                      config and the parameter directory (status "running"), then status
                      "finished". `sao-jax sampler --bootstrap ... --run-id R` needs nothing
                      else to join a run. Parameters themselves are not sent over Kafka:
                      they are versioned .npz files in that directory, which must be on
                      storage the samplers' machines share (NFS, a bucket mount); a
                      1M-parameter policy per version would be a 4 MB record per update.

Client settings (measured on the local broker, see FACTS): producers `linger_ms=0` for
latency; consumers `fetch_max_wait_ms=25` (lower stalled on this broker), group
`session_timeout_ms=6000` / `heartbeat_interval_ms=2000` (joins in 1-3 s, not 23 s).
"""
from __future__ import annotations

import dataclasses

from sao_jax.transport import records

_CLIENT = dict(request_timeout_ms=10_000, retry_backoff_ms=100, reconnect_backoff_max_ms=2000)


@dataclasses.dataclass
class KafkaSpec:
  bootstrap: str
  run_id: str
  partitions: int = 4

  def topic(self, name: str) -> str:
    return f"sao.{self.run_id}.{name}"

  def create_topics(self, only: tuple[str, ...] = ()) -> None:
    """Creates the run's topics (or `only` those named) if they do not exist yet."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, client_id="sao-jax-admin",
                             **_CLIENT)
    try:
      for name, n in (("tasks", self.partitions), ("trajectories", self.partitions),
                      ("dead-letter", 1), ("control", 1)):
        if only and name not in only:
          continue
        try:
          admin.create_topics([NewTopic(self.topic(name), num_partitions=n,
                                        replication_factor=1)])
        except TopicAlreadyExistsError:
          pass
    finally:
      admin.close()

  def announce(self, payload: dict) -> None:
    """Appends a JSON announcement to the control topic (learner side)."""
    import json
    producer = _producer(self.bootstrap)
    try:
      producer.send(self.topic("control"), value=json.dumps(payload).encode())
      producer.flush(timeout=10)
    finally:
      producer.close()

  def read_control(self, timeout: float = 10.0) -> dict | None:
    """The latest announcement on the control topic, or None if there is none yet."""
    import json
    import time

    from kafka import KafkaConsumer, TopicPartition
    consumer = KafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False,
                             auto_offset_reset="earliest", fetch_max_wait_ms=25, **_CLIENT)
    try:
      consumer.assign([TopicPartition(self.topic("control"), 0)])
      latest, deadline, quiet = None, time.time() + timeout, 0
      while time.time() < deadline and quiet < 3:  # read to the end: 3 empty polls in a row
        polled = consumer.poll(timeout_ms=200)
        recs = [r for rs in polled.values() for r in rs]
        quiet = 0 if recs else quiet + (latest is not None)
        for r in recs:
          try:
            latest = json.loads(r.value)
          except (ValueError, TypeError):
            continue  # not an announcement
      return latest
    finally:
      consumer.close()

  def learner_end(self) -> KafkaLearnerEnd:
    return KafkaLearnerEnd(self)

  def sampler_end(self) -> KafkaSamplerEnd:
    return KafkaSamplerEnd(self)

  def close(self) -> None:
    pass


def _producer(bootstrap):
  from kafka import KafkaProducer
  return KafkaProducer(bootstrap_servers=bootstrap, linger_ms=0, acks=1,
                       max_request_size=records.DEFAULT_MAX_BYTES + 4096, **_CLIENT)


class KafkaLearnerEnd:
  def __init__(self, spec: KafkaSpec):
    from kafka import KafkaConsumer, TopicPartition

    self.spec = spec
    self.producer = _producer(spec.bootstrap)
    self.consumer = KafkaConsumer(
        bootstrap_servers=spec.bootstrap, group_id=f"sao.{spec.run_id}.learner",
        enable_auto_commit=False, auto_offset_reset="earliest", fetch_max_wait_ms=25,
        max_partition_fetch_bytes=records.DEFAULT_MAX_BYTES + 4096, **_CLIENT)
    topic = spec.topic("trajectories")
    self.consumer.assign([TopicPartition(topic, p) for p in range(spec.partitions)])
    self._sent = 0

  def put_tasks(self, indices):
    for i in indices:
      self._sent += 1
      self.producer.send(self.spec.topic("tasks"), key=str(self._sent).encode(),
                         value=records.encode(records.RecordKind.TASK, int(i), 0, {},
                                              {"task_index": int(i)}))
    self.producer.flush()

  def get_trajectories(self, max_n, timeout):
    return [data for data, _ in self.get_records(max_n, timeout)]

  def get_records(self, max_n, timeout) -> list[tuple[bytes, tuple[int, int]]]:
    """Like get_trajectories, with each record's (partition, offset)."""
    polled = self.consumer.poll(timeout_ms=int(timeout * 1000), max_records=max_n)
    return [(r.value, (r.partition, r.offset)) for recs in polled.values() for r in recs
            if r.value is not None]

  def positions(self) -> dict[int, int]:
    """Next offset to read, per partition."""
    return {tp.partition: self.consumer.position(tp) for tp in self.consumer.assignment()}

  def commit_positions(self, positions: dict[int, int]) -> None:
    """Commits these offsets for the learner's group: a restarted learner reads on from them."""
    from kafka import TopicPartition
    from kafka.structs import OffsetAndMetadata
    topic = self.spec.topic("trajectories")
    self.consumer.commit({TopicPartition(topic, p): OffsetAndMetadata(o, "", -1)
                          for p, o in positions.items()})

  def commit(self):
    self.consumer.commit()

  def dead_letter(self, data, reason):
    self.producer.send(self.spec.topic("dead-letter"), value=data,
                       headers=[("reason", reason.encode()[:500])])

  def close(self):
    self.producer.flush()
    self.producer.close()
    self.consumer.close()


class KafkaSamplerEnd:
  def __init__(self, spec: KafkaSpec):
    from kafka import KafkaConsumer

    self.spec = spec
    self.producer = _producer(spec.bootstrap)
    self.consumer = KafkaConsumer(
        spec.topic("tasks"), bootstrap_servers=spec.bootstrap,
        group_id=f"sao.{spec.run_id}.samplers", enable_auto_commit=False,
        auto_offset_reset="earliest", fetch_max_wait_ms=25, session_timeout_ms=6000,
        heartbeat_interval_ms=2000, **_CLIENT)

  def get_tasks(self, max_n, timeout):
    polled = self.consumer.poll(timeout_ms=int(timeout * 1000), max_records=max_n)
    out = []
    for recs in polled.values():
      for r in recs:
        try:
          out.append(int(records.decode(r.value).meta["task_index"]))
        except (records.RecordError, TypeError, KeyError, ValueError):
          continue  # not a task record: nothing to do with it
    return out

  def put_trajectory(self, data):
    self.producer.send(self.spec.topic("trajectories"), value=data)

  def ack_tasks(self):
    self.producer.flush()  # the trajectories are on the broker before the tasks are acked
    self.consumer.commit()

  def close(self):
    self.producer.flush()
    self.producer.close()
    self.consumer.close()
