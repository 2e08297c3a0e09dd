"""The SAO learner's statistics part (runners.learner_parts.statistics) on tiny inputs: no
process, no broker, no model."""

import json
import types

import numpy as np
import pytest

from sao_jax import recovery
from sao_jax.buffer import Item
from sao_jax.runners.learner_parts import statistics
from sao_jax.runners.learner_parts.statistics import STEADY_AFTER, TRANSIENT_UPDATES, Statistics


class _Writer:
  def __init__(self):
    self.rows = []

  def write(self, step, row, phase, advance=1):
    self.rows.append((step, dict(row), phase, advance))


class _Events:
  def __init__(self):
    self.rows = []

  def write(self, event, **fields):
    self.rows.append(dict(fields, event=event))

  def close(self):
    self.rows.append({"event": "closed"})


def _item(tokens, t_end, replayed=False, **meta):
  valid = np.arange(6)[None] < tokens
  rec = types.SimpleNamespace(meta=dict(meta, t_end=t_end), arrays={"valid": valid})
  return Item(rec, seq=0, pos=None, replayed=replayed)


def test_count_deltas_are_what_this_incarnation_added():
  st = Statistics(_Writer())
  st.counts.update(consumed=5, resumes=1)  # restored from a snapshot
  st.begin(step=7)
  assert st.steady_from == 7 and st.count_deltas() == {}
  st.counts["consumed"] += 3
  st.counts["rollbacks"] += 1
  st.counts["resumes"] += 0
  assert st.count_deltas() == {"consumed": 3, "rollbacks": 1}


def test_events_go_to_the_log_only_where_there_is_one():
  quiet = Statistics(_Writer())
  quiet.event("counts", step=1)  # another process: nothing, no error
  quiet.close()
  ev = _Events()
  st = Statistics(_Writer(), ev)
  st.event("counts", step=1, counts={"a": 1})
  st.close()
  assert ev.rows == [{"step": 1, "counts": {"a": 1}, "event": "counts"}, {"event": "closed"}]


def test_a_transient_averages_its_first_updates_then_reports_once():
  w, ev = _Writer(), _Events()
  st = Statistics(w, ev)
  st.watch_transient(1, {}, np.array([1]), 0, 0, 0, 0)  # no lineage begun: nothing
  assert ev.rows == []
  st.begin_transient("resume", 4, "00000000000a")
  for k in range(TRANSIENT_UPDATES + 3):
    metrics = {"is_dev": 0.1 * (k % 2), "kl_behaviour": 0.2}
    st.watch_transient(5 + k, metrics, np.array([k % 3, 2]), 1, 2, 0, 1)
  t = st.transients[-1]
  assert t["updates"] == TRANSIENT_UPDATES and t["why"] == "resume" and t["step"] == 4
  # staleness means per update: (0+2)/2, (1+2)/2, (2+2)/2 repeating over 20 updates
  want = np.mean([np.mean([k % 3, 2]) for k in range(TRANSIENT_UPDATES)])
  assert t["staleness_mean"] == pytest.approx(want)
  assert t["staleness_max"] == 2 and t["is_dev_max"] == pytest.approx(0.1)
  assert t["is_dev_mean"] == pytest.approx(0.05) and t["kl_behaviour_mean"] == pytest.approx(0.2)
  assert (t["dropped_stale"], t["dropped_lineage"], t["orphan_version"]) == (20, 40, 20)
  assert len(ev.rows) == TRANSIENT_UPDATES  # written as it goes, then no more
  assert ev.rows[-1]["updates"] == TRANSIENT_UPDATES
  # the metrics get it once, complete, at the update that completed it
  assert [(r[0], r[2], r[1]["event"]) for r in w.rows] == [
    (5 + TRANSIENT_UPDATES - 1, "rl_event", "transient")
  ]


def test_busy_time_and_the_steady_mark():
  st = Statistics(_Writer())
  st.begin(step=3)
  st.t_loop = 100.0
  for k in range(1, STEADY_AFTER + 2):
    st.timed(3 + k, tu=10.0 * k, t_done=10.0 * k + 0.5)
    if k < STEADY_AFTER:
      assert st.steady_mark is None
  assert st.busy == pytest.approx(0.5 * (STEADY_AFTER + 1))
  assert st.steady_mark[0] == pytest.approx(0.5 * STEADY_AFTER)


def test_consumed_counts_tokens_delays_and_reward_time():
  st = Statistics(_Writer())
  items = [
    _item(3, t_end=9.0, reward_s=0.5, sandbox_runs=2),
    _item(5, t_end=8.0, replayed=True),  # waited through a crash: no delay
  ]
  st.consumed(items, t_done=10.0)
  assert st.counts["consumed"] == 2 and st.counts["tokens"] == 8
  assert st.lengths == [3, 5] and st.delays == [1.0]
  assert st.reward_s == 0.5 and st.sandbox_runs == 2


def test_the_metric_row():
  st = Statistics(_Writer())
  st.t_loop = 0.0  # (wall: the time since the epoch; rates are tiny but defined)
  st.counts.update(consumed=6, dropped_stale=1, rollbacks=2)
  st.delays = [1.0, 2.0, 3.0, 4.0]
  staleness = np.array([0, 1, 1, 9])
  row = st.row(
    {"reward": np.float32(0.25), "loss": 1.5},
    staleness,
    tu=1.0,
    t_done=1.25,
    val_acc=0.75,
    rows=2,
    queue_depth=5,
    outstanding=7,
    train_seconds=12.0,
  )
  assert row["loss"] == 1.5 and row["accuracy"] == 0.25
  assert row["staleness_hist"] == [1, 2, 0, 0, 0, 0, 0, 1]  # 9 in the last bucket
  assert row["staleness_mean"] == pytest.approx(2.75) and row["staleness_max"] == 9
  assert row["delay_mean"] == 3.5  # the last `rows` delays
  assert row["learner_time"] == 0.25 and row["queue_depth"] == 5
  assert row["outstanding_tasks"] == 7 and row["train_seconds"] == 12.0
  assert (row["trajectories"], row["dropped_stale"], row["rollbacks"]) == (6, 1, 2)
  assert row["val_accuracy"] == 0.75 and row["peak_rss_all_mb"] > 0
  no_val = st.row(
    {"reward": 0.0},
    staleness,
    0,
    0,
    None,
    rows=2,
    **dict.fromkeys(("queue_depth", "outstanding", "train_seconds"), 0),
  )
  assert "val_accuracy" not in no_val


def test_the_first_update_after_a_resume_is_reported_once(monkeypatch):
  monkeypatch.setattr(statistics.startup, "MARKS", {"imports": 1.0, "restore": 3.0})
  monkeypatch.setattr(statistics.startup.sao_jax, "PROCESS_T0", 100.0)
  w, ev = _Writer(), _Events()
  st = Statistics(w, ev)
  st.first_update(1, t_done=104.5, compile_cache=None)  # not a resume: nothing
  assert w.rows == [] and ev.rows == []
  st.resume_info = {"event": "resume", "from_step": 6}
  st.first_update(7, t_done=104.5, compile_cache="/cache")
  st.first_update(8, t_done=109.0, compile_cache="/cache")  # once
  info = st.resume_info
  assert info["recovery_s"] == 4.5 and info["compile_cache"] == "/cache"
  assert info["breakdown_s"] == {"imports": 1.0, "restore": 2.0, "first_update": 1.5}
  assert st.counts["recovery_ms_total"] == 4500
  assert [(r[0], r[2]) for r in w.rows] == [(7, "rl_event")]
  assert [r["event"] for r in ev.rows] == ["resume"] and ev.rows[0]["from_step"] == 6


def test_the_summary(tmp_path):
  log = recovery.EventLog(tmp_path / "events.jsonl", "rl")
  st = Statistics(_Writer(), log)
  st.counts.update(consumed=10, tokens=40, audited=3, resumes=1)
  st.begin(step=2)
  st.busy, st.steady_mark = 6.0, (1.0, 2.0)
  st.sandbox_runs, st.reward_s = 4, 5.0
  st.lengths, st.delays = [4, 4], [0.5, 1.5]
  st.resume_info = {"recovery_s": 3.0}
  st.event("start", resumed=True, from_step=2)
  st.event("finish", step=12, counts=st.count_deltas())
  st.close()
  guard = {"rejected_total": 2, "reissued_tasks": 1}
  info = st.summary(
    {"seconds": 20.0, "steps": 12},
    wall=10.0,
    step=12,
    unused_at_end=3,
    audit_held=1,
    guard=guard,
    lineage="00000000000b",
    events_path=tmp_path / "events.jsonl",
  )
  assert info["steps"] == 12 and info["trajectories"] == 10 and info["unused_at_end"] == 3
  assert info["audited"] == 3 and info["audit_held_at_end"] == 1 and info["resumes"] == 1
  assert info["learner_busy"] == 0.6 and info["learner_busy_steady"] == pytest.approx(5 / 8)
  assert info["tokens_per_s"] == 4.0 and info["trajectories_per_s"] == 1.0
  assert info["seconds_per_step"] == 2.0  # 20 s over the 10 steps since step 2
  assert info["reward_s_per_trajectory"] == 0.5 and info["sandbox_runs_per_s"] == 0.4
  assert info["rejected_total"] == 2 and info["reissued_tasks"] == 1
  assert info["delay_mean_s"] == 1.0 and info["length_mean"] == 4.0
  assert info["lineage"] == "00000000000b" and info["recovery_s"] == 3.0
  assert "transients" in info and "transients" not in info["lifetime"]
  json.dumps(info)  # summary.json takes it as it is
