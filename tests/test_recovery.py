"""Pieces of crash recovery, without processes: the journal and ledger, deterministic batch
formation, the non-finite guard in the jitted update, snapshot fall-back, shadow models."""

import pathlib
import warnings

import jax
import numpy as np
import pytest

from sao_jax import checkpoint as ckpt
from sao_jax import recovery
from sao_jax.batches import SAOBatch
from sao_jax.buffer import Item, TrajectoryBuffer
from sao_jax.config import Config, MeshConfig, ModelConfig, OptimConfig, RLConfig, SAOConfig
from sao_jax.learner import make_optimizer, make_sao_update
from sao_jax.models.transformer import TransformerLM
from sao_jax.runners.compiled import compile_programs
from sao_jax.sharding import make_mesh
from sao_jax.transport import records


def test_journal_appends_reopens_and_drops_a_half_written_tail(tmp_path):
  j = recovery.Journal(tmp_path / "j")
  assert j.append([b"a", b"bb"]) == 0
  j.rotate()
  assert j.append([b"ccc"]) == 2
  j.close()
  seg = max((tmp_path / "j").glob("*.log"))
  with open(seg, "ab") as f:  # a crash in the middle of the next entry
    f.write(b"\x10\x00\x00\x00\x01\x02")
  j2 = recovery.Journal(tmp_path / "j")
  assert j2.truncated_tail == 6 and j2.next_seq == 3
  assert list(j2.read_from(1)) == [(1, b"bb"), (2, b"ccc")]
  assert j2.append([b"dddd"]) == 3
  assert [s for s, _ in j2.read_from(0)] == [0, 1, 2, 3]
  j2.rotate()
  j2.prune(2)  # the first segment (entries 0, 1) is no longer needed
  assert j2.first_available() == 2
  assert [d for _, d in j2.read_from(0)] == [b"ccc", b"dddd"]


def test_ledger_cut_back_to_the_snapshot(tmp_path):
  led = recovery.Ledger(tmp_path / "ledger.jsonl")
  for step in range(1, 6):
    led.append(step, [step * 10, step * 10 + 1], [step * 100] if step == 3 else [])
  led.close()
  with open(tmp_path / "ledger.jsonl", "a") as f:
    f.write('{"step": 6, "appl')  # half-written line from a crash
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    ids = recovery.Ledger(tmp_path / "ledger.jsonl").cut_to(3)
  assert ids == {10, 11, 20, 21, 30, 31, 300}
  assert [r["step"] for r in recovery.Ledger(tmp_path / "ledger.jsonl").rows()] == [1, 2, 3]


def _item(seq, version, pos=None, steps=1):
  rec = records.Record(
    kind=records.RecordKind.TRAJECTORY,
    record_id=seq,
    policy_version=version,
    arrays={"tokens": np.zeros((steps, 2), np.int32)},
    meta={},
    nbytes=0,
  )
  return Item(rec, seq, pos)


def test_batches_depend_only_on_the_record_sequence():
  versions = [5, 1, 6, 6, 2, 7, 7, 7]  # at step 7 with max_staleness 4: versions 1, 2 stale
  buf = TrajectoryBuffer(rows=3, max_staleness=4)
  buf.extend(_item(i, v, (i % 2, 100 + i)) for i, v in enumerate(versions))
  assert buf.ready(7)
  batch, stale = buf.take_batch(7)
  assert [it.seq for it in batch] == [0, 2, 3] and [it.seq for it in stale] == [1]
  assert [it.seq for it in buf] == [4, 5, 6, 7]  # untouched: a prefix was consumed
  # Kafka commit positions: the first record still waiting, per partition.
  assert buf.safe_positions({0: 108, 1: 108}) == {0: 104, 1: 105}
  batch, stale = buf.take_batch(7)
  assert [it.seq for it in batch] == [5, 6, 7] and [it.seq for it in stale] == [4]
  assert not buf.ready(7) and buf.first_seq(99) == 99


def _sao_programs():
  cfg = Config(
    model=ModelConfig(vocab_size=16, width=16, depth=1, heads=2, max_len=16),
    mesh=MeshConfig(shape=(1, 1, 1)),
    rl=RLConfig(optim=OptimConfig(lr=1e-2, warmup_steps=1)),
    sao=SAOConfig(batch_size=4),
  )
  model = TransformerLM(cfg.model)
  tx = make_optimizer(cfg.rl.optim)
  return compile_programs(
    cfg,
    model,
    tx,
    make_sao_update(model, tx, cfg.rl, cfg.sao),
    with_ref=False,
    prompt_len=4,
    max_new_tokens=4,
    temperature=1.0,
    eos_id=2,
    pad_id=0,
    mesh=make_mesh(cfg.mesh, jax.devices()[:1]),
    num_tasks=8,
  )


def _sao_batch(poison=0.0):
  rng = np.random.default_rng(0)
  return SAOBatch.single_steps(
    prompt_bp=rng.integers(3, 16, (4, 4)).astype(np.int32),
    prompt_valid_bp=np.ones((4, 4), bool),
    tokens_bt=rng.integers(3, 16, (4, 4)).astype(np.int32),
    valid_bt=np.ones((4, 4), bool),
    logp_bt=np.full((4, 4), -2.0, np.float32),
    rewards_b=np.array([1, 0, 1, 0], np.float32),
    task_b=np.arange(4, dtype=np.int32),
    staleness_b=np.zeros(4, np.int32),
    poison_b=np.array([poison, 0, 0, 0], np.float32),
  )


def test_nonfinite_gradients_leave_the_state_unchanged():
  progs = _sao_programs()
  state = progs.init(jax.random.key(0))
  before = jax.device_get(state)
  state, m = progs.update(state, progs.shard_batch(_sao_batch(np.nan)))
  after = jax.device_get(state)
  assert int(m["nonfinite_skipped"]) == 1 and not np.isfinite(float(m["grad_norm"]))
  assert int(after.step) == 1 and int(after.nonfinite) == 1
  for name in ("params", "opt_state", "tracker"):
    jax.tree.map(np.testing.assert_array_equal, getattr(before, name), getattr(after, name))
  state, m = progs.update(state, progs.shard_batch(_sao_batch(0.0)))  # a normal step moves on
  after2 = jax.device_get(state)
  assert int(m["nonfinite_skipped"]) == 0 and int(after2.nonfinite) == 1
  diff = jax.tree.map(lambda a, b: float(np.abs(a - b).max()), after.params, after2.params)
  assert max(jax.tree.leaves(diff)) > 0
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(after2.params))


def test_lr_scale_scales_the_step():
  progs = _sao_programs()
  s1 = progs.init(jax.random.key(0))
  p0 = jax.device_get(s1.params)
  s2 = progs.init(jax.random.key(0)).replace(lr_scale=np.float32(0.5))
  s1, _ = progs.update(s1, progs.shard_batch(_sao_batch()))
  s2, _ = progs.update(s2, progs.shard_batch(_sao_batch()))
  d1 = jax.tree.map(lambda a, b: np.asarray(a) - b, jax.device_get(s1.params), p0)
  d2 = jax.tree.map(lambda a, b: np.asarray(a) - b, jax.device_get(s2.params), p0)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(b, 0.5 * a, rtol=1e-4, atol=1e-7), d1, d2)


def _corrupt(step_dir: pathlib.Path):
  """Damages every data file of a snapshot (as a disk fault would)."""
  n = 0
  for f in step_dir.rglob("*"):
    if f.is_file() and f.stat().st_size > 0 and "params" in str(f):
      f.write_bytes(b"\0garbage" * 4)
      n += 1
  assert n


def test_a_corrupt_latest_snapshot_falls_back_to_the_previous(tmp_path):
  progs = _sao_programs()
  state = progs.init(jax.random.key(0))
  mngr = ckpt.manager(tmp_path / "ck", every=1, keep=3)
  cfg = Config(model=ModelConfig(vocab_size=16, width=16, depth=1, heads=2, max_len=16))
  saved = {}
  for _ in range(2):
    state, _ = progs.update(state, progs.shard_batch(_sao_batch()))
    saved[int(state.step)] = jax.device_get(state.params)
    ckpt.save(mngr, state, cfg, {"stream": {"n": int(state.step)}})
  mngr.wait_until_finished()
  _corrupt(tmp_path / "ck" / "2")
  like = progs.init(jax.random.key(1))
  mngr2 = ckpt.manager(tmp_path / "ck", every=1, keep=3)
  with pytest.warns(RuntimeWarning, match="snapshot step 2 .* unreadable"):
    restored, meta, step, skipped = ckpt.restore_latest_valid(mngr2, like)
  assert step == 1 and skipped == [2] and meta["stream"]["n"] == 1
  # Moved out of the manager's view: the resumed run saves step 2 again, no later resume
  # trips on it, and the damaged files are kept for inspection.
  assert mngr2.all_steps() == [1] and list((tmp_path / "ck-corrupt").iterdir())
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored.params), saved[1])


def test_shadow_bank_keeps_the_best_and_the_latest(tmp_path):
  progs = _sao_programs()
  params = progs.init(jax.random.key(0)).params
  bank = ckpt.ShadowBank(tmp_path / "shadows", keep=2)
  for step, acc in [(0, 0.3), (10, 0.6), (20, 0.4), (30, 0.5)]:
    scaled = jax.tree.map(lambda x, s=step: x + s, params)
    bank.save(step, scaled, acc)
  assert bank.best() == (10, 0.6)
  assert sorted(bank.mngr.all_steps()) == [10, 20, 30]
  back = bank.restore(10, params)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b) + 10), back, params
  )
  bank.reset_to(20, bank.scores)  # a resume at step 20 forgets the shadow of step 30
  assert sorted(bank.scores) == [10, 20]
  bank.close()


def test_event_log_adds_up_incarnations_killed_ones_included(tmp_path):
  path = tmp_path / "events.jsonl"
  first = recovery.EventLog(path, "rl")
  first.write("start", resumed=False, from_step=0)
  first.write("counts", step=10, counts={"consumed": 40, "bad_records": 2})
  first.write("counts", step=20, counts={"consumed": 80, "bad_records": 3, "rollbacks": 1})
  first.write("rollback", step=18, reason="x")
  first.write("transient", why="rollback", lineage="b", step=18, updates=2)  # killed mid-way
  # killed here: no "finish"; its last counts stand
  second = recovery.EventLog(path, "rl")
  second.write("start", resumed=True, from_step=10)
  second.write("resume", step=11, recovery_s=7.5)
  for n in (1, 2):  # rewritten as it goes: the newest row of each lineage stands
    second.write("transient", why="resume", lineage="c", step=10, updates=n)
  second.write("finish", step=30, counts={"consumed": 90, "sampler_restarts": 1})
  other = recovery.EventLog(path, "sft")
  other.write("start", resumed=False, from_step=0)
  for log in (first, second, other):
    log.close()
  with open(path, "a") as f:
    f.write('{"phase": "rl", "incarnation": "half-writ')  # a crash mid-line
  life = recovery.EventLog.lifetime(path, "rl")
  assert life == {
    "incarnations": 2,
    "killed": 1,
    "resumes": 1,
    "recovery_s": [7.5],
    "rollbacks": 1,
    "counts": {"consumed": 170, "bad_records": 3, "rollbacks": 1, "sampler_restarts": 1},
    "transients": [
      {"why": "rollback", "lineage": "b", "step": 18, "updates": 2},
      {"why": "resume", "lineage": "c", "step": 10, "updates": 2},
    ],
  }
