"""experiments/backpressure.py: what it reads of a run, and that bad arguments stop it before
anything runs (the experiment itself is minutes of training: run by hand, not here)."""

from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="module")
def bp(experiment):
  return experiment("backpressure")


def test_arm_metrics_shares_and_staleness(bp, tmp_path):
  rows = [
    {"phase": "sft", "step": 1},
    {"phase": "rl", "step": 1, "staleness_mean": 1.0},
    {"phase": "rl", "step": 2, "staleness_mean": 2.0},
  ]
  path = tmp_path / "metrics.jsonl"
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  rl = {
    "steps": 2,
    "seconds": 10.0,
    "trajectories": 200,
    "dropped_stale": 30,
    "dropped_lineage": 10,
    "trajectories_per_s": 20.0,
    "learner_busy": 0.9,
    "delay_mean_s": 1.5,
  }
  m = bp.arm_metrics(rl, path)
  assert m["stale_share"] == pytest.approx(0.15) and m["lineage_share"] == pytest.approx(0.05)
  assert m["used_per_s"] == pytest.approx(20.0 * 160 / 200)
  assert m["staleness_mean"] == pytest.approx(1.5)
  assert m["learner_busy"] == 0.9 and m["task_redelivered"] is None


@pytest.mark.parametrize(
  "argv",
  [["--arms", "kafka_bounded,nope"], ["--seeds", "0"], ["--hog", "-1"]],
)
def test_bad_arguments_stop_before_any_run(bp, tmp_path, argv):
  with pytest.raises(SystemExit):
    bp.main([*argv, "--out", str(tmp_path / "o"), "--workdir", str(tmp_path / "w")])
  assert not (tmp_path / "o").exists() and not (tmp_path / "w").exists()
