"""The run's key (sao_jax.transport.auth): messages sealed with it pass, anything else is
refused before it is read, over each channel: trajectory records at the learner's door, task
records and announcements over Kafka, published parameter versions."""

from __future__ import annotations

import json
import stat
import types
import uuid

import numpy as np
import pytest
from test_admission import _clean, _learner, _Source

from sao_jax.transport import auth
from sao_jax.transport.kafka import KafkaSpec
from sao_jax.transport.params import ParamPublisher, ParamSubscriber


def test_seal_and_unseal():
  key, other = auth.new_key(), auth.new_key()
  data = b"SAOR some record bytes"
  sealed = auth.seal(key, data)
  assert len(sealed) == len(data) + auth.TAG_BYTES and auth.unseal(key, sealed) == data
  with pytest.raises(auth.Unauthenticated, match="does not match"):
    auth.unseal(other, sealed)
  with pytest.raises(auth.Unauthenticated, match="does not match"):
    auth.unseal(key, data + bytes(auth.TAG_BYTES))  # a tag of the right size, forged
  flipped = bytearray(sealed)
  flipped[3] ^= 1
  with pytest.raises(auth.Unauthenticated):
    auth.unseal(key, bytes(flipped))
  with pytest.raises(auth.Unauthenticated, match="cannot carry"):
    auth.unseal(key, b"short")
  assert auth.seal(None, data) == data == auth.unseal(None, data)  # no key: nothing to check


def test_the_key_file_is_private_kept_and_read_back(tmp_path, monkeypatch):
  key = auth.load_or_create(tmp_path / "run")
  path = tmp_path / "run" / auth.KEY_FILE
  assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(key) == auth.KEY_BYTES
  assert auth.load_or_create(tmp_path / "run") == key  # a resumed run keeps its key
  assert auth.key_from(str(path)) == key
  monkeypatch.setenv(auth.KEY_ENV, key.hex())
  assert auth.key_from() == key
  monkeypatch.setenv(auth.KEY_ENV, "abc")
  with pytest.raises(ValueError, match="SAO_JAX_RUN_KEY: not a run key"):
    auth.key_from()
  monkeypatch.delenv(auth.KEY_ENV)
  assert auth.key_from() is None
  with pytest.raises(ValueError, match="run key file .*nowhere"):
    auth.key_from(str(tmp_path / "nowhere"))


def test_only_the_learners_parameter_versions_are_taken(tmp_path):
  """Someone who can write the parameter directory but lacks the key cannot hand the
  samplers a policy: a forged newest version (file and announcement) is skipped for the
  newest one the learner published."""
  key = auth.new_key()
  pub = ParamPublisher(tmp_path, key=key)
  pub.publish(3, {"w": np.ones(2, np.float32)}, lineage=7)
  forged = dict(json.loads((tmp_path / "LATEST").read_text()))
  np.savez(tmp_path / "evil.npz", w=np.full(2, 9.0, np.float32))
  entry = {"lineage": 7, "version": 4, "file": "evil.npz"}
  (tmp_path / "LATEST").write_text(json.dumps(dict(entry, previous=[forged])))
  with pytest.warns(RuntimeWarning, match="no valid tag under the run's key"):
    got = ParamSubscriber(tmp_path, key=key).poll((-1, -1))
  assert got[:2] == (7, 3) and got[2]["['w']"].tolist() == [1.0, 1.0]
  assert ParamSubscriber(tmp_path).poll((-1, -1))[:2] == (7, 4)  # a reader without the key


def test_the_door_refuses_a_record_without_the_runs_tag(tmp_path):
  """Sealed records from a holder of the key are admitted; a well-formed record without the
  tag, or with another key's, is refused before it is decoded, dead-lettered and counted,
  and charges no sampler."""
  dead = []
  end = types.SimpleNamespace(
    dead_letter=lambda data, reason: dead.append(reason),
    put_tasks=lambda indices, handouts=None: None,
  )
  self = _learner(end, tmp_path)
  self.key = auth.new_key()
  self.hand_out(list(range(4)))
  src = _Source(9)
  good = [auth.seal(self.key, src.encode(*_clean(task=i))) for i in range(2)]
  forged = [src.encode(*_clean(task=2)), auth.seal(auth.new_key(), src.encode(*_clean(task=3)))]
  self.ingest([(d, None) for d in [*good, *forged]])
  c = self.counts
  assert [it.rec.meta["task_index"] for it in self.buffer] == [0, 1]
  assert c["rejected_unauthenticated"] == 2 and c["rejected"] == 2 and c["bad_records"] == 0
  assert [r.split(":")[0] for r in dead] == ["unauthenticated"] * 2
  assert self.guard.summary()["rejected"]["unauthenticated"] == 2
  assert self.guard.sources[9].rejected == 0 and self.guard.sources[9].accepted == 2
  assert self.journal.next_seq == 2


def test_over_kafka_tasks_and_announcements_need_the_key(kafka_broker):
  """A client with the broker's address but not the key: its task records are not taken as
  tasks (counted), its announcement is not read as the learner's, and a sampler without the
  key does not see the learner's announcement at all."""
  key, run = auth.new_key(), uuid.uuid4().hex[:8]
  spec = KafkaSpec(bootstrap=kafka_broker.bootstrap, run_id=run, partitions=1, key=key)
  spec.create_topics()
  spec.announce({"status": "running", "who": "learner"})
  intruder = KafkaSpec(bootstrap=kafka_broker.bootstrap, run_id=run, partitions=1)
  intruder.announce({"status": "running", "who": "intruder"})
  assert spec.read_control(timeout=5)["who"] == "learner"  # the intruder's is skipped
  # Without the key the learner's (sealed) announcement is unreadable: only its own is seen.
  assert intruder.read_control(timeout=3)["who"] == "intruder"
  learner, fake, sampler = spec.learner_end(), intruder.learner_end(), spec.sampler_end()
  try:
    fake.put_tasks([5, 6])
    learner.put_tasks([1, 2])
    for end in (fake, learner):
      end.flush()
    got, tries = [], 0
    while len(got) < 2 and tries < 50:
      got += sampler.get_tasks(10, 0.2)
      tries += 1
    assert sorted(got) == [1, 2] and sampler.unauthenticated == 2
    sampler.ack_tasks()
    sampler.flush()
  finally:
    for end in (sampler, fake, learner):
      end.close()
  assert "key" not in repr(spec) and key.hex() not in repr(spec)  # never printed


def test_every_kafka_client_speaks_tls_when_told(tls_broker, monkeypatch):
  """transport.security_protocol='SSL' with the CA file: topics made, tasks and trajectories
  through, the liveness probe answered; a plain-TCP client at the same address gets nothing.
  SASL settings are checked and their password is taken from the environment only."""
  from sao_jax.transport import kafka_security
  from sao_jax.transport.broker import probe

  address, cert = tls_broker
  security = kafka_security.settings("SSL", cafile=str(cert))
  assert probe(address, security=security) is None
  assert probe(address, timeout=1.0) is not None  # plain TCP to a TLS port
  key = auth.new_key()
  spec = KafkaSpec(
    bootstrap=address, run_id=uuid.uuid4().hex[:8], partitions=1, key=key, security=security
  )
  spec.create_topics()
  learner, sampler = spec.learner_end(), spec.sampler_end()
  try:
    learner.put_tasks([3], [77])
    learner.flush()
    got = []
    for _ in range(50):
      got += sampler.get_tasks(1, 0.2)
      if got:
        break
    assert got == [3] and sampler.handout_for(3) == 77 and sampler.handout_for(3) is None
    sampler.put_trajectory(auth.seal(key, b"a record"))
    sampler.ack_tasks()
    sampler.flush()
    data = []
    for _ in range(50):
      data += learner.get_trajectories(1, 0.2)
      if data:
        break
    assert auth.unseal(key, data[0]) == b"a record"
  finally:
    sampler.close()
    learner.close()
  # SASL: a username is needed, the password only ever from the environment.
  with pytest.raises(kafka_security.SecurityError, match="needs sasl_username"):
    kafka_security.settings("SASL_SSL", cafile=str(cert))
  sasl = kafka_security.settings(
    "SASL_SSL", cafile=str(cert), username="u", mechanism="SCRAM-SHA-512"
  )
  monkeypatch.delenv(kafka_security.PASSWORD_ENV, raising=False)
  with pytest.raises(kafka_security.SecurityError, match="SAO_JAX_KAFKA_PASSWORD"):
    kafka_security.with_secrets(sasl)
  monkeypatch.setenv(kafka_security.PASSWORD_ENV, "s3cret")
  assert kafka_security.with_secrets(sasl)["sasl_plain_password"] == "s3cret"
  assert "s3cret" not in repr(sasl)
  with pytest.raises(kafka_security.SecurityError, match="no such file"):
    kafka_security.settings("SSL", cafile="/nowhere/ca.pem")
  with pytest.raises(kafka_security.SecurityError, match="PLAINTEXT"):
    kafka_security.settings("PLAINTEXT", cafile=str(cert))
