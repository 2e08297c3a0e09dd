"""SAO for the policy with compressed memory: the long-trajectory record (bank and graveyard
through the wire format and back), and `sao-jax train` with rl.algorithm=sao through real
sampler processes."""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import subprocess

import numpy as np
import pytest
from conftest import subprocess_env, train_cmd

from sao_jax import setup
from sao_jax.buffer import Item, decode_trajectory
from sao_jax.compression.rollout import LAYOUT, LongTrajectory, trajectories_to_batch
from sao_jax.config import ConfigError
from sao_jax.runners.memory_sao import LongRecordCheck, memory_sao_batch
from sao_jax.transport import records

S, P, T, L, C, E, D = 5, 6, 3, 4, 4, 2, 3  # steps, window, completion, segment, bank


def _trajectory(seed: int = 0) -> LongTrajectory:
  """A sampled-looking trajectory whose bank evicted two entries (at steps 2 and 4)."""
  rng = np.random.default_rng(seed)
  bank = {
    "vec_ced": rng.integers(-127, 128, (C, E, D)).astype(np.int8),
    "scale_ce": rng.random((C, E)).astype(np.float32),
    "step_c": np.asarray([0, 1, 3, 4], np.int32),
    "turning_c": np.asarray([True, False, False, True]),
    "count": np.asarray(4, np.int32),
    "gone_vec_ged": rng.integers(-127, 128, (2, E, D)).astype(np.int8),
    "gone_scale_ge": rng.random((2, E)).astype(np.float32),
    "gone_step_g": np.asarray([1, 2], np.int32),
    "gone_at_g": np.asarray([2, 4], np.int32),
    "entries": 4,
    "evicted": 2,
  }
  return LongTrajectory(
    task_id=17,
    prompt=rng.integers(0, 50, (S, P)).astype(np.int32),
    prompt_valid=rng.random((S, P)) > 0.3,
    tokens=rng.integers(0, 50, (S, T)).astype(np.int32),
    valid=np.asarray([[True, True, False]] * S),
    logp=-rng.random((S, T)).astype(np.float32),
    rewards=np.asarray([0, 1, 0, 0, 1], np.float32),
    graded=np.asarray([False, True, False, True, True]),
    boundary=np.asarray([False, False, True, False, False]),
    seg=rng.integers(0, 50, (S, L)).astype(np.int32),
    seg_valid=rng.random((S, L)) > 0.2,
    bank=bank,
    tokens_total=99,
  )


def _record(traj: LongTrajectory, version: int = 3, **meta) -> bytes:
  m = dict(layout=LAYOUT, task_index=2, task_id=traj.task_id, reward=2.0, accuracy=2 / 3)
  m.update(t_end=1.0, **meta)
  return records.encode(records.RecordKind.LONG_TRAJECTORY, 7, version, traj.arrays(version), m)


CHECK = LongRecordCheck(
  prompt_len=P,
  completion_len=T,
  step_len=L,
  steps=8,
  capacity=C,
  vectors=E,
  dim=D,
  quantized=True,
  num_tasks=4,
)


class _Learner:
  def __init__(self):
    self.dead = []

  def dead_letter(self, data, reason):
    self.dead.append(reason)


def test_long_trajectory_round_trips_through_a_record_with_its_graveyard():
  traj = _trajectory()
  counts = collections.Counter()
  rec = decode_trajectory(_record(traj), _Learner(), counts, CHECK)
  assert rec is not None and counts["bad_records"] == 0
  assert rec.kind == records.RecordKind.LONG_TRAJECTORY and rec.policy_version == 3
  assert Item(rec, 0, None).num_rows == 1  # a whole trajectory is one row of the batch
  back = LongTrajectory.from_arrays(
    rec.arrays, rec.meta["task_id"], rec.meta.get("tokens_total", 0)
  )
  for f in dataclasses.fields(LongTrajectory):
    a, b = getattr(traj, f.name), getattr(back, f.name)
    if f.name == "bank":
      assert a.keys() == b.keys()
      for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
        assert np.asarray(a[k]).dtype == np.asarray(b[k]).dtype, k
    elif f.name != "tokens_total":
      np.testing.assert_array_equal(a, b, err_msg=f.name)
  np.testing.assert_array_equal(rec.arrays["version"], np.where(traj.valid, 3, -1))
  # The learner's batch from the record equals the one from the sampler's trajectory, the
  # graveyard scattered to the steps that evicted its entries.
  want = trajectories_to_batch([traj], 8, 3, seed=5, completion_len=T)
  batch, staleness, orphans = memory_sao_batch(
    [Item(rec, 0, None)], 4, steps=8, rows=3, completion_len=T, max_staleness=4, seed=5
  )
  for k in want.__dataclass_fields__:
    np.testing.assert_array_equal(getattr(want, k), getattr(batch.memory, k), err_msg=k)
  assert batch.memory.gone_step_bs[0].tolist() == [-1, -1, 1, -1, 2, -1, -1, -1]
  np.testing.assert_array_equal(batch.memory.gone_vec_bsed[0, 4], traj.bank["gone_vec_ged"][1])
  assert staleness.tolist() == [1] and orphans == 0
  assert batch.task_b.tolist() == [2] and batch.accuracy_b.tolist() == [np.float32(2 / 3)]


def test_foreign_or_misshapen_long_records_are_dropped_and_counted():
  traj = _trajectory()
  counts, learner = collections.Counter(), _Learner()
  bad = [
    _record(traj, layout=LAYOUT + 1),  # another layout version
    _record(dataclasses.replace(traj, seg=traj.seg[:, :2])),  # another step_len
    _record(traj, task_index=9),  # a task the learner does not have
  ]
  grave = dict(traj.bank, gone_at_g=np.asarray([2, 5], np.int32))  # evicted past the end
  bad.append(_record(dataclasses.replace(traj, bank=grave)))
  assert [decode_trajectory(b, learner, counts, CHECK) for b in bad] == [None] * 4
  assert counts["bad_records"] == 4 and len(learner.dead) == 4
  # A text learner refuses the long kind; the long check refuses a text record.
  assert decode_trajectory(_record(traj), learner, counts, ((P, T), 4, 8)) is None
  text = records.encode(records.RecordKind.TRAJECTORY, 1, 0, {"tokens": np.zeros((1, T))}, {})
  assert decode_trajectory(text, learner, counts, CHECK) is None
  assert counts["bad_records"] == 6


def test_config_validation_names_what_memory_sao_cannot_do(repo_root):
  path = str(repo_root / "experiments/configs/longhorizon.py")
  assert setup.load_config(path, "tiny", ["rl.algorithm=sao"]).rl.algorithm == "sao"
  for override, key in [
    ("sao.continuous=True", "sao.continuous"),
    ("sao.baseline=value_head", "sao.baseline"),
    ("rl.ppo_epochs=2", "rl.ppo_epochs"),
    ("rl.kl_coef=0.1", "rl.kl_coef"),
    ("faults.poison_records=1", "faults.poison_records"),
  ]:
    with pytest.raises(ConfigError, match=key):
      setup.load_config(path, "tiny", ["rl.algorithm=sao", override])
  with pytest.raises(ConfigError, match="rl.sampling='inline'"):
    setup.load_config(path, "tiny", ["rl.sampling=samplers"])


@pytest.mark.slow
def test_sao_trains_the_memory_policy_through_sampler_processes(tmp_path, repo_root):
  workdir = tmp_path / "run"
  overrides = [
    "rl.algorithm=sao",
    "sft.steps=1",
    "rl.steps=3",
    "task.num_train=8",
    "task.num_test=2",
    "eval.num_problems=2",
    "recovery.shadow_every=0",
    "log_every=1",
    "model.depth=1",
    "compression.enc_depth=1",
    "compression.capacity=6",  # fewer than the 12 steps the untrained filter keeps: evictions
    "compression.visible=6",  # the whole bank, as the config reads it
    "model.memory_slots=12",
  ]
  cmd = train_cmd(str(repo_root / "experiments/configs/longhorizon.py:tiny"), workdir, overrides)
  proc = subprocess.run(
    cmd, cwd=repo_root, capture_output=True, text=True, timeout=900, env=subprocess_env()
  )
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  rl = json.loads((workdir / "summary.json").read_text())["rl"]
  assert rl["steps"] == 3 and rl["trajectories"] == 12  # sao.batch_size 4 per update
  assert rl["bad_records"] == 0 and rl["rejected_total"] == 0 and rl["nonfinite_skipped"] == 0
  assert 0.0 <= rl["retention"] <= 1.0 and rl["num_problems"] == 2  # held-out memory eval
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  upd = [r for r in rows if r["phase"] == "rl"]
  assert [r["step"] for r in upd] == [1, 2, 3]
  for r in upd:
    assert math.isfinite(r["loss"]) and r["recon"] > 0 and r["tokens_used"] > 0
    for key in ("is_dev", "kl_behaviour", "is_truncated_frac", "staleness_hist", "tracker_rho"):
      assert key in r, key
  first = upd[0]
  # Every trajectory of the first update was played by the policy the learner holds
  # (version 0), and their banks evicted entries: the learner's log-probs, recomputed from
  # the shipped bank and graveyard, are the sampler's.
  assert first["staleness_hist"][0] == 4 and first["evicted_mean"] > 0
  assert first["logp_dev_max"] < 2e-5
  # Later updates consume trajectories of older versions (one sampler, one batch per call).
  assert any(r["staleness_max"] > 0 for r in upd[1:])
  assert (workdir / "checkpoints" / "rl").is_dir() and (workdir / "journal").is_dir()
