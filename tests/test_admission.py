"""Poisoned trajectory records at the learner's door (sao_jax.admission): each kind is
rejected by reason, dead-lettered, never buffered, its task handed out again; a sampler that
keeps sending them is quarantined. The ingest path is the SAO learner's own
(`Intake.ingest`, runners.learner_parts), over the embedded and the Kafka transport."""

import collections
import multiprocessing as mp
import socket
import threading
import time
import types
import uuid

import numpy as np
import pytest

from sao_jax import admission, config, recovery
from sao_jax.buffer import TrajectoryBuffer
from sao_jax.runners.learner_parts.intake import Intake
from sao_jax.transport import records
from sao_jax.transport.base import EmbeddedSpec
from sao_jax.transport.kafka import KafkaSpec

S, P, T, V, N_TASKS = 1, 8, 6, 20, 10
EXPECT = ((P, T), N_TASKS + 2, 16)  # two more tasks than are sampled: a validation tail


def _clean(task=3, version=2):
  arrays = {
    "prompt": np.full((S, P), 4, np.int32),
    "prompt_valid": np.ones((S, P), bool),
    "tokens": np.full((S, T), 5, np.int32),
    "valid": np.arange(T)[None] < 4,
    "logp": np.full((S, T), -0.5, np.float32),
    "rewards": np.ones(S, np.float32),
    "step_seconds": np.zeros(S, np.float32),
  }
  arrays["logp"][:, 4:] = 0.0
  arrays["version"] = np.where(arrays["valid"], version, -1).astype(np.int32)
  return arrays, {"task_index": task, "reward": 1.0, "t_end": time.time(), "sampler": 0}, version


class _Source:
  """Encodes records as one sampler process would (its own random id prefix)."""

  def __init__(self, prefix):
    self.prefix, self.n = prefix << admission.SOURCE_SHIFT, 0

  def encode(self, arrays, meta, version):
    self.n += 1
    return records.encode(
      records.RecordKind.TRAJECTORY, self.prefix | self.n, version, arrays, meta
    )


def _poisoned(kind, task=3):
  return admission.poison(
    kind, *_clean(task), vocab_size=V, reward_high=1.0, unknown_task=N_TASKS + 1
  )


def _learner(end, tmp_path, window=0, rate=0.5):
  """The SAO learner's intake with a real guard, buffer, journal and counters, reading from
  the transport end `end`."""
  counts = collections.Counter()
  guard = admission.RecordGuard(
    vocab_size=V,
    num_tasks=N_TASKS,
    counts=counts,
    reward_range=lambda i: (0.0, 1.0),
    window=window,
    rate=rate,
    state_path=tmp_path / "published.json",
  )
  guard.published(2)
  intake = Intake(
    config.Config(),
    tmp_path,
    guard=guard,
    buffer=TrajectoryBuffer(16, 4),
    journal=recovery.Journal(tmp_path / "journal"),
    ledger=recovery.Ledger(tmp_path / "ledger.jsonl"),
    counts=counts,
    n_sample=N_TASKS,
    expect=EXPECT,
  )
  intake.pool = types.SimpleNamespace(learner=end)
  return intake


def test_value_problem_names_each_poison_and_passes_a_clean_record():
  kw = dict(vocab_size=V, reward_range=(0.0, 1.0), max_version=2)
  rec = records.decode(_Source(1).encode(*_clean()))
  assert admission.value_problem(rec, **kw) is None
  for kind in ("nonfinite", "token_oov", "reward_range", "future_version"):
    bad = records.decode(_Source(1).encode(*_poisoned(kind)))
    assert admission.value_problem(bad, **kw)[0] == kind
  a, m, v = _clean()
  a["logp"][0, 1] = 0.7  # a log-probability above zero
  assert (
    admission.value_problem(records.decode(_Source(1).encode(a, m, v)), **kw)[0] == "positive_logp"
  )
  a, m, v = _clean()
  a["prompt"][0, 0] = -1  # padding positions are checked too: the model embeds them
  assert admission.value_problem(records.decode(_Source(1).encode(a, m, v)), **kw)[0] == "token_oov"
  m["reward"] = 1.0 + admission.REWARD_TOL / 2  # float32 rounding of a sum is not poison
  a["prompt"][0, 0] = 0
  assert admission.value_problem(records.decode(_Source(1).encode(a, m, v)), **kw) is None


@pytest.fixture(params=["embedded", "kafka"])
def transport(request):
  """(learner end, sampler end, dead(n): the dead-letter reasons, once n are there) of a fresh
  transport (Kafka: one partition, so records arrive in the order sent, as on the embedded
  queue)."""
  if request.param == "embedded":
    spec = EmbeddedSpec(mp.get_context("spawn"))
    learner, sampler, dead = spec.learner_end(), spec.sampler_end(), []
    real = learner.dead_letter

    def dead_letter(data, reason):
      dead.append(reason)
      real(data, reason)

    learner.dead_letter = dead_letter
    yield learner, sampler, lambda n: dead
    spec.close()
    return
  from kafka import KafkaConsumer, TopicPartition

  broker = request.getfixturevalue("kafka_broker")
  spec = KafkaSpec(bootstrap=broker.bootstrap, run_id=uuid.uuid4().hex[:8], partitions=1)
  spec.create_topics()
  learner, sampler = spec.learner_end(), spec.sampler_end()
  dlq = KafkaConsumer(
    bootstrap_servers=broker.bootstrap,
    auto_offset_reset="earliest",
    fetch_max_wait_ms=25,
    enable_auto_commit=False,
  )
  dlq.assign([TopicPartition(spec.topic("dead-letter"), 0)])
  got = []

  def dead(n):
    learner.producer.flush()
    deadline = time.time() + 10
    while len(got) < n and time.time() < deadline:
      got.extend(
        dict(r.headers)["reason"].decode() for recs in dlq.poll(200).values() for r in recs
      )
    got.extend(
      dict(r.headers)["reason"].decode()  # and any more than expected
      for recs in dlq.poll(300).values()
      for r in recs
    )
    return got

  try:
    yield learner, sampler, dead
  finally:
    dlq.close()
    sampler.close()
    learner.close()


def _deliver(learner, sampler, datas):
  for d in datas:
    sampler.put_trajectory(d)
  sampler.flush()
  got, deadline = [], time.time() + 20
  while len(got) < len(datas) and time.time() < deadline:
    got += learner.get_records(100, timeout=0.2)
  assert len(got) == len(datas)
  return got


def test_each_poison_kind_is_rejected_by_reason_and_its_task_handed_out_again(transport, tmp_path):
  end, sampler, dead = transport
  self = _learner(end, tmp_path)
  self.hand_out(list(range(N_TASKS)))
  src = _Source(7)
  kinds = ["nonfinite", "token_oov", "reward_range", "future_version", "unknown_task"]
  datas = [src.encode(*_poisoned(k, task=i)) for i, k in enumerate(kinds)]
  # Task 6 answered twice (a transport gave it to two samplers): both are real trajectories.
  datas += [src.encode(*_clean(task=6)), src.encode(*_clean(task=6))]
  got = _deliver(end, sampler, datas)
  self.ingest(got)
  self.ingest(got[:2])  # redelivered by the transport: duplicates, not re-checked
  c = self.counts
  assert [c[f"rejected_{k}"] for k in kinds] == [1] * 5 and c["rejected"] == 5
  assert c["duplicates"] == 2 and c["bad_records"] == 0 and c["task_redelivered"] == 1
  # Only the clean records reach the buffer (and the journal).
  assert [it.rec.meta["task_index"] for it in self.buffer] == [6, 6]
  assert self.journal.next_seq == 2
  assert sorted(r.split(":")[0] for r in dead(5)) == sorted(kinds)
  # Tasks 0..3 (refused records of handed-out tasks) are out again; the never-handed-out
  # task of the unknown_task record is not; task 6 is answered.
  assert c["reissued_tasks"] == 4
  assert self.guard.outstanding == collections.Counter({i: 1 for i in range(N_TASKS) if i != 6})
  # The loop's count frees one place per task answered: task 6's second answer is extra data
  # and frees none (else every redelivered record would hand out one more task).
  assert self.outstanding == N_TASKS - 1
  tasks, deadline = [], time.time() + 20
  while len(tasks) < N_TASKS + 4 and time.time() < deadline:
    tasks += sampler.get_tasks(20, 0.5)
  assert collections.Counter(tasks) == collections.Counter(list(range(N_TASKS)) + [0, 1, 2, 3])
  summary = self.guard.summary()
  assert summary["rejected"]["unknown_task"] == 1 and summary["rejected_total"] == 5


def test_a_costly_reward_is_audited_before_it_is_trained_on(transport, tmp_path):
  """Code-like rewards (a sandbox run each): the audited records wait outside the journal and
  the buffer (and their Kafka offsets are not committed past) until their re-score is in;
  one whose completion does not earn its claimed reward is rejected like a cheap one and its
  task handed out again; a failed audit lets its record through, counted."""
  end, sampler, dead = transport
  self = _learner(end, tmp_path)
  gate = threading.Event()

  def score(rec):  # odd tasks' completions earn nothing; task 4's audit itself fails
    gate.wait(30)
    if rec.meta["task_index"] == 4:
      raise RuntimeError("the sandbox pool is gone")
    return float(rec.meta["task_index"] % 2 == 0)

  self.audit = admission.RewardAudit(1.0, score, workers=2)
  try:
    self.hand_out(list(range(5)))
    src = _Source(5)
    got = _deliver(end, sampler, [src.encode(*_clean(task=i)) for i in range(5)])
    self.ingest(got)
    assert len(self.buffer) == 0 and self.journal.next_seq == 0  # all five held
    assert self.outstanding == 5 and len(self.audit.held()) == 5
    if got[0][1] is not None:  # Kafka: the commit stops before the oldest held record
      held = [pos for _, pos, _ in self.audit.held()]
      assert self.buffer.safe_positions({0: 5}, also=held) == {0: got[0][1][1]}
    gate.set()
    assert self.audit.wait(30)
    self.ingest([])  # releases what the audit finished
    c = self.counts
    assert sorted(it.rec.meta["task_index"] for it in self.buffer) == [0, 2, 4]
    assert self.journal.next_seq == 3
    assert c["rejected_reward_mismatch"] == 2 and c["audited"] == 2 and c["audit_errors"] == 1
    assert c["reissued_tasks"] == 2 and self.outstanding == 2
    assert self.guard.outstanding == collections.Counter({1: 1, 3: 1})
    assert sorted(r.split(":")[0] for r in dead(2)) == ["reward_mismatch"] * 2
    self.ingest(got[1:2])  # its redelivery: a duplicate, not audited again
    assert c["duplicates"] == 1 and not self.audit.held()
  finally:
    gate.set()
    self.audit.close()


def test_the_audit_draws_an_unpredictable_fraction():
  def score(rec):
    return 1.0

  a, b = admission.RewardAudit(0.1, score), admission.RewardAudit(0.1, score)
  ids = range(1 << 40, (1 << 40) + 20_000)
  picked_a = {i for i in ids if a.picks(i)}
  picked_b = {i for i in ids if b.picks(i)}
  assert 1700 < len(picked_a) < 2300 and 1700 < len(picked_b) < 2300
  assert len(picked_a & picked_b) < 600  # another learner's key: another sample
  assert picked_a == {i for i in ids if a.picks(i)}  # the same key: the same decision
  assert not any(admission.RewardAudit(0.0, score).picks(i) for i in ids)
  assert all(admission.RewardAudit(1.0, score).picks(i) for i in range(100))
  with pytest.raises(ValueError, match="audit fraction"):
    admission.RewardAudit(1.5, score)
  for x in (a, b):
    x.close()


def test_a_sampler_that_keeps_failing_is_quarantined_and_stopped(transport, tmp_path):
  end, sampler, dead = transport
  self = _learner(end, tmp_path, window=4, rate=0.5)
  stopped = []
  self.guard.on_quarantine = stopped.append
  self.hand_out(list(range(N_TASKS)) * 2)
  rogue, good = _Source(11), _Source(12)
  datas = []
  for i in range(4):  # two of the rogue's first four records are poisoned: quarantined
    a, m, v = _poisoned("nonfinite", task=i) if i % 2 else _clean(task=i)
    datas.append(rogue.encode(a, dict(m, pid=4321, host="elsewhere"), v))
  datas += [rogue.encode(*_clean(task=5)), good.encode(*_clean(task=6))]
  for i in range(3):  # one rejection in four keeps a sampler in the run
    datas.append(good.encode(*(_poisoned("token_oov", task=7) if i == 0 else _clean(task=8))))
  self.ingest(_deliver(end, sampler, datas))
  c = self.counts
  assert c["quarantined_samplers"] == 1 and c["rejected_quarantined"] == 1
  assert c["rejected_nonfinite"] == 2 and c["rejected_token_oov"] == 1
  assert [m.get("pid") for m in stopped] == [4321]  # told once, with the record's meta
  buffered = [
    (admission.source_of(it.rec.record_id), it.rec.meta["task_index"]) for it in self.buffer
  ]
  assert buffered == [(11, 0), (11, 2), (12, 6), (12, 8), (12, 8)]
  s = self.guard.summary()["samplers_with_rejects"]
  assert s[f"{11:06x}"]["quarantined"] and s[f"{12:06x}"]["quarantined"] is None
  assert len(dead(4)) == 4


def test_a_resumed_learner_keeps_the_published_high_water_and_earlier_tasks(tmp_path):
  counts = collections.Counter()
  kw = dict(
    vocab_size=V,
    num_tasks=N_TASKS,
    reward_range=lambda i: (0.0, 1.0),
    state_path=tmp_path / "published.json",
  )
  first = admission.RecordGuard(counts=counts, **kw)
  for v in (0, 5, 9):
    first.published(v)
  # Resumed from the snapshot of step 5: the crashed learner had published up to 9.
  t0 = time.time()
  second = admission.RecordGuard(counts=counts, resumed=True, started=t0, **kw)
  second.published(5)
  assert second.max_version == 9

  class End:
    def dead_letter(self, data, reason):
      pass

    def put_tasks(self, indices, handouts=None):
      raise AssertionError("not this learner's task")

  def rec(task, version, t_end):
    a, m, _ = _clean(task, version)
    data = _Source(3).encode(a, dict(m, t_end=t_end), version)
    return records.decode(data), data

  # Made by the crashed incarnation before this one started: only the range is checked.
  assert second.admit(*rec(4, 9, t0 - 1), End())
  assert not second.admit(*rec(4, 10, t0 - 1), End())  # newer than anything published
  assert not second.admit(*rec(4, 9, t0 + 1), End())  # finished after the start: not ours
  assert not second.admit(*rec(N_TASKS, 1, t0 - 1), End())  # the validation tail: never out
  assert counts["rejected_future_version"] == 1 and counts["rejected_unknown_task"] == 2


def test_stop_local_kills_only_our_own_quarantined_sampler():
  from sao_jax.runners.samplers import SamplerPool

  ctx = mp.get_context("spawn")
  p = ctx.Process(target=time.sleep, args=(60,), daemon=True)
  p.start()
  try:
    pool = SamplerPool.__new__(SamplerPool)
    pool.group = types.SimpleNamespace(procs=[p])
    assert not pool.stop_local({"pid": p.pid, "host": "another-machine"})
    assert not pool.stop_local({"pid": -5, "host": socket.gethostname()})
    assert p.is_alive()
    assert pool.stop_local({"pid": p.pid, "host": socket.gethostname()})
    assert not p.is_alive() and p.exitcode == -9  # a dead sampler: supervision restarts it
  finally:
    if p.is_alive():
      p.kill()
    p.join()


def test_poisoner_sends_each_kind_as_configured():
  faults = config.FaultsConfig(
    poison_kinds=("nonfinite", "unknown_task"), poison_records=2, poison_every=2
  )
  pz = admission.Poisoner(faults, vocab_size=V, reward_high=lambda i: 1.0, unknown_task=N_TASKS + 1)
  out = [pz(*_clean(task=i)) for i in range(12)]
  assert [len(o) for o in out] == [1, 1, 1, 2, 1, 1, 1, 2, 1, 1, 1, 1]
  assert pz.sent == {"nonfinite": 2, "unknown_task": 2}
  assert np.isnan(out[1][0][0]["logp"]).any() and out[3][1][1]["task_index"] == N_TASKS + 1
  with pytest.raises(config.ConfigError, match="poison_kinds"):
    config.FaultsConfig(poison_kinds=("typo",))
  with pytest.raises(config.ConfigError, match="quarantine_rate"):
    config.SamplersConfig(quarantine_rate=0.0)
  with pytest.raises(config.ConfigError, match="quarantine_window"):
    config.SamplersConfig(quarantine_window=-1)


def test_poisons_caught_past_the_value_checks_look_as_described():
  a, m, v = _clean()
  for kind, claim in (("logp_certain", 0.0), ("logp_far", -50.0)):
    pa, pm, pv = admission.poison(kind, a, m, v, vocab_size=V, reward_high=1.0, unknown_task=0)
    assert (pa["logp"][a["valid"]] == claim).all() and (pa["logp"][~a["valid"]] == 0.0).all()
    assert (pm, pv) == (m, v)
  pa, pm, _ = admission.poison("resent", a, m, v, vocab_size=V, reward_high=1.0, unknown_task=0)
  assert pm == m and all((pa[k] == a[k]).all() for k in a)
  pa, *_ = admission.poison("wrong_shape", a, m, v, vocab_size=V, reward_high=1.0, unknown_task=0)
  assert pa["prompt"].shape == (S, P + 8) and pa["prompt_valid"].shape == (S, P + 8)
  counts, dead = collections.Counter(), []
  learner = types.SimpleNamespace(dead_letter=lambda d, r: dead.append(r))
  from sao_jax.buffer import decode_trajectory

  assert decode_trajectory(_Source(2).encode(pa, m, v), learner, counts, EXPECT) is None
  assert counts["bad_records"] == 1 and len(dead) == 1  # the format check: another config's


@pytest.mark.slow
def test_a_live_run_rejects_every_injected_poison_and_trains(repo_root, tmp_path, monkeypatch):
  """Sampler 0 of a tiny SAO run sends a poisoned record of each kind among its real ones
  (faults.poison_*): the run finishes, rejects exactly those by reason, and never takes a
  non-finite update or rolls back. Then 16 bytes flipped inside the newest snapshot's
  weights: a restore detects it and falls back to the older snapshot."""
  import json
  import math
  import subprocess

  from conftest import subprocess_env, train_cmd

  from sao_jax.metrics import read_jsonl

  kinds = config.POISON_KINDS
  cmd = train_cmd(
    "experiments/configs/sao_arith.py:tiny",
    tmp_path / "w",
    [
      "rl.steps=6",
      f"faults.poison_kinds={kinds!r}",
      "faults.poison_records=1",
      "log_every=1",
      "sft.steps=2",
      "eval.num_problems=16",
      "samplers.num=1",
    ],
  )
  proc = subprocess.run(
    cmd, cwd=repo_root, env=subprocess_env(), capture_output=True, text=True, timeout=600
  )
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  rl = json.loads((tmp_path / "w" / "summary.json").read_text())["rl"]
  assert rl["steps"] == 6
  # Each kind by the counter that catches it (both forged log-prob kinds: logp_drift).
  caught = collections.Counter(config.POISON_CAUGHT_BY.get(k, f"rejected_{k}") for k in kinds)
  counts = rl["lifetime"]["counts"]
  assert {c: counts.get(c, 0) for c in caught} == dict(caught), counts
  at_door = [k for k in kinds if k not in config.POISON_CAUGHT_BY]
  assert rl["rejected_total"] == len(at_door) + 2 and rl["quarantined_samplers"] == 0
  # Those refused at the door that replaced their clean record: their tasks out again.
  assert rl["reissued_tasks"] == len([k for k in at_door if k not in admission.Poisoner.EXTRA])
  assert rl["nonfinite_skipped"] == 0 and rl["rollbacks"] == 0
  rows = [
    r for r in read_jsonl(tmp_path / "w" / "metrics.jsonl") if r["phase"] == "rl" and "loss" in r
  ]
  assert len(rows) == 6 and all(
    math.isfinite(r[k]) for r in rows for k in ("loss", "grad_norm", "reward")
  )
  assert "rejected a trajectory record (nonfinite" in proc.stdout + proc.stderr

  import jax
  from test_integrity import _flip_silently

  from sao_jax import checkpoint as ckpt
  from sao_jax.learner import make_sao_update
  from sao_jax.runners.common import programs_for
  from sao_jax.setup import make_setup

  directory = tmp_path / "w" / "checkpoints" / "rl"
  steps = ckpt.manager(directory).all_steps()
  assert sorted(steps) == [0, 6]
  _, meta = ckpt.read_meta(directory, 0)
  cfg = config.from_dict(meta["config"])
  s = make_setup(cfg)
  progs = programs_for(
    s, cfg.rl.optim, lambda m, tx: make_sao_update(m, tx, cfg.rl, cfg.sao), num_tasks=len(s.train)
  )
  intact = jax.device_get(
    ckpt.restore_state(ckpt.manager(directory), progs.init(jax.random.key(0)), 6)[0].params
  )

  def orbax_alone_restores_other_values() -> bool:
    with monkeypatch.context() as m:
      m.setattr(ckpt, "verify", lambda *a: None)
      back, _ = ckpt.restore_state(ckpt.manager(directory), progs.init(jax.random.key(0)), 6)
    pairs = zip(jax.tree.leaves(jax.device_get(back.params)), jax.tree.leaves(intact), strict=True)
    return not all(np.array_equal(a, b) for a, b in pairs)

  _flip_silently(directory / "6", orbax_alone_restores_other_values)
  with pytest.warns(RuntimeWarning, match="snapshot step 6 .*DamagedSnapshot"):
    _, _, step, skipped = ckpt.restore_latest_valid(
      ckpt.manager(directory), progs.init(jax.random.key(0))
    )
  assert step == 0 and skipped == [6]


def test_a_record_of_a_lineage_the_run_never_began_is_refused():
  """Policy identity is (lineage, version): a record naming a lineage that is not in the
  run's tree (a forged or foreign one, or none at all) is unknown_lineage; one of a lineage
  the run began, even one a resume has since left, passes the door (the batch drops those)."""
  from sao_jax.lineage import LineageTree

  tree = LineageTree()
  lost = tree.begin(0, "start").id
  now = tree.begin(2, "resume").id
  counts, dead = collections.Counter(), []
  end = types.SimpleNamespace(
    dead_letter=lambda data, reason: dead.append(reason),
    put_tasks=lambda indices, handouts=None: None,
  )
  guard = admission.RecordGuard(
    vocab_size=V,
    num_tasks=N_TASKS,
    counts=counts,
    reward_range=lambda i: (0.0, 1.0),
    window=0,
    lineage_known=tree.known,
  )
  guard.published(2)
  src = _Source(3)
  for lineage, admitted in [(now, True), (lost, True), (12345, False), (None, False)]:
    guard.handed_out([3])
    arrays, meta, version = _clean()
    if lineage is not None:
      meta["lineage"] = lineage
    data = src.encode(arrays, meta, version)
    assert guard.admit(records.decode(data), data, end) is admitted, lineage
  assert counts["rejected_unknown_lineage"] == 2 and counts["rejected"] == 2
  assert [r.split(":")[0] for r in dead] == ["unknown_lineage"] * 2
  assert "12345 was never begun" in dead[0]


def test_a_record_is_checked_against_its_task_id_and_its_rescored_reward():
  """task_mismatch: a task id that is not the one at the record's index; reward_mismatch:
  a claimed reward that the record's own completion does not earn (a wrong answer claiming
  1). Both are charged to their sampler and the task handed out again."""
  from sao_jax.envs.base import Task
  from sao_jax.families import Arithmetic
  from sao_jax.tokenizer import CharTokenizer

  tok = CharTokenizer()
  tasks = [
    Task(100 + i, f"Ann had {i} eggs, got 1. Eggs?", f"{i}+1={i + 1};#{i + 1}", str(i + 1), 1)
    for i in range(N_TASKS)
  ]
  family = Arithmetic(config.TaskConfig())
  counts, dead, again = collections.Counter(), [], []
  end = types.SimpleNamespace(
    dead_letter=lambda data, reason: dead.append(reason),
    put_tasks=lambda indices, handouts=None: again.extend(indices),
  )

  def rescore(i, rec):
    a = rec.arrays
    return family.rescore(tasks[i], tok, a["tokens"][0][a["valid"][0]])

  guard = admission.RecordGuard(
    vocab_size=tok.vocab_size,
    num_tasks=N_TASKS,
    counts=counts,
    reward_range=lambda i: (0.0, 1.0),
    window=0,
    task_id_of=lambda i: tasks[i].task_id,
    rescore=rescore,
  )
  guard.published(2)
  src = _Source(5)

  def record(answer: str, reward: float, task_id: int = 103):
    ids = tok.encode(f"3+1={answer};#{answer}", add_eos=True)
    arrays, meta, version = _clean()
    arrays["tokens"] = np.zeros((S, len(ids) + 2), np.int32)
    arrays["tokens"][0, : len(ids)] = ids
    arrays["valid"] = np.arange(len(ids) + 2)[None] < len(ids)
    arrays["logp"] = np.where(arrays["valid"], -0.5, 0.0).astype(np.float32)
    arrays["version"] = np.where(arrays["valid"], version, -1).astype(np.int32)
    meta.update(task_id=task_id, reward=reward)
    data = src.encode(arrays, meta, version)
    return records.decode(data), data

  for answer, reward, task_id, admitted in [
    ("4", 1.0, 103, True),  # right and honest
    ("5", 0.0, 103, True),  # wrong and honest
    ("5", 1.0, 103, False),  # wrong, claims 1
    ("4", 0.0, 103, False),  # right, claims 0 (no reason to trust either way)
    ("4", 1.0, 104, False),  # another task's id
  ]:
    guard.handed_out([3])
    assert guard.admit(*record(answer, reward, task_id), end) is admitted, (answer, reward)
  assert counts["rejected_reward_mismatch"] == 2 and counts["rejected_task_mismatch"] == 1
  assert "its completion earns 0" in dead[0] and "104" in dead[2]
  assert again == [3, 3, 3] and guard.summary()["samplers_with_rejects"]


def test_a_hand_out_is_answered_once_whatever_the_record_id():
  """A trajectory for a hand-out already answered (the transport gave the task to two
  samplers, or a record was re-sent under a new id) is counted, not trained on; a hand-out
  answered with another task's index is task_mismatch; a refused record's task goes out
  again under a new hand-out. The embedded transport carries the ids to the sampler."""
  counts, again = collections.Counter(), []
  end = types.SimpleNamespace(
    dead_letter=lambda data, reason: None,
    put_tasks=lambda indices, handouts=None: again.append((list(indices), list(handouts))),
  )
  guard = admission.RecordGuard(
    vocab_size=V, num_tasks=N_TASKS, counts=counts, reward_range=lambda i: (0.0, 1.0), window=0
  )
  guard.published(2)
  h = guard.new_handouts(3)
  assert len(set(h)) == 3 and guard.new_handouts(1)[0] not in h
  guard.handed_out([3, 4, 5], h)
  src = _Source(4)

  def record(task, handout):
    arrays, meta, version = _clean(task=task)
    meta["handout"] = handout
    data = src.encode(arrays, meta, version)  # a new record id each time
    return records.decode(data), data

  assert guard.admit(*record(3, h[0]), end)
  assert not guard.admit(*record(3, h[0]), end)  # the same hand-out again
  assert counts["duplicate_answers"] == 1 and counts["rejected"] == 0
  assert not guard.admit(*record(5, h[1]), end)  # task 4's hand-out, answered for task 5
  assert counts["rejected_task_mismatch"] == 1
  assert again and again[0][0] == [5] and again[0][1][0] not in h  # task 5 out again, new id
  assert guard.admit(*record(5, h[2]), end)
  # The embedded transport: each task's id comes back, oldest first for a repeated task.
  spec = EmbeddedSpec(mp.get_context("spawn"))
  try:
    spec.learner_end().put_tasks([7, 8, 7], [70, 80, 71])
    sampler = spec.sampler_end()
    got = []
    while len(got) < 3:
      got += sampler.get_tasks(3, 1.0)
    assert got == [7, 8, 7]
    assert [sampler.handout_for(i) for i in (7, 7, 8, 8)] == [70, 71, 80, None]
  finally:
    spec.close()
