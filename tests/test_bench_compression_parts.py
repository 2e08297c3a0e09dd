"""The pure parts of experiments/bench_compression.py's library side (`sao_jax.bench`): recall
bookkeeping, paired statistics, and what a resumed run keeps of the stopped run's file."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from sao_jax.bench import compression_run as R
from sao_jax.bench.recall import attribute_errors, memory_log, paired, seen_at
from sao_jax.results_file import portable_path


def test_memory_log_and_seen_at():
  # Steps 3 and 7 kept to the end of a 10-step episode; step 5 evicted at step 8.
  gone = {"gone_step_g": np.asarray([5]), "gone_at_g": np.asarray([8])}
  log = memory_log(np.asarray([7, 3]), gone, 10)
  assert log == [(3, 11), (5, 9), (7, 11)]
  assert seen_at(log, 8, visible=8) == [3, 5, 7]
  assert seen_at(log, 9, visible=8) == [3, 7]  # 5 no longer seen after its eviction
  assert seen_at(log, 8, visible=1) == [7]  # only the last `visible`
  assert seen_at(log, 4, visible=8) == [3]  # an entry is seen after its own step


def test_paired_and_attribute_errors():
  control = np.asarray([1.0, 1.0, 1.0, 0.0])
  other = np.asarray([1.0, 0.0, 1.0, 1.0])
  p = paired(control, other)
  assert p["relative_loss"] == pytest.approx(0.0)
  assert (p["control_right_other_wrong"], p["other_right_control_wrong"]) == (1, 1)
  per_q = {"fact_seen": [1, 0, 1, 0], "fact_kept": [1, 1, 1, 0], "gap": [40, 70, 33, 90]}
  e = attribute_errors(per_q, other, control)
  assert e["missed"] == {"n": 1, "fact_seen": 0, "fact_kept": 1}
  assert e["lost"] == {"n": 1, "fact_seen": 0, "fact_kept": 1, "gaps": [70]}
  assert e["fact_seen_frac"] == 0.5 and e["per_question"] is per_q
  old = {k: v for k, v in per_q.items() if k != "fact_kept"}  # records before it was kept
  assert "fact_kept" not in attribute_errors(old, other, None)["missed"]


def _args(**kw):
  base = dict(no_token_control=False, uncompressed_control=False, arms="")
  return argparse.Namespace(**{**base, **kw})


def test_arms_to_run_and_missing_arms():
  parser = argparse.ArgumentParser()
  assert R.arms_to_run(_args(), parser) == (["compressed", "full_context"],) * 2
  every, run = R.arms_to_run(
    _args(no_token_control=True, uncompressed_control=True, arms="uncompressed_memory"), parser
  )
  assert (every, run) == (["compressed", "uncompressed_memory"], ["uncompressed_memory"])
  with pytest.raises(SystemExit):
    R.arms_to_run(_args(arms="uncompressed_memory"), parser)
  result = {"tasks": {"a": {"arms": {"compressed": {}}}, "b": {"arms": {"compressed": {}}}}}
  result["tasks"]["b"]["arms"]["full_context"] = {}
  assert R.missing_arms(result, ["compressed", "full_context"], False) == {"a": ["full_context"]}
  assert R.missing_arms(result, ["compressed", "full_context"], True) == {}


def test_keep_measured_drops_what_an_arm_measured_again_makes_stale():
  same = {"accuracy": 0.5}
  kept = {
    "arms": {"compressed": same, "uncompressed_memory": {"accuracy": 0.7}},
    "long_spec": {"n_steps": 1000},
    "peak_memory": {"x": 1},
    "bytes_per_stage": {
      "bytes": {"stage3_int8": 10.0},
      "long_accuracy": {"compressed": 1, "uncompressed_memory": 2, "vs_uncompressed": 3},
    },
  }
  arms = {"compressed": None, "uncompressed_memory": None}
  # Compressed kept as it was (same object), the stage-1 control measured again.
  task = {"arms": {"compressed": same, "uncompressed_memory": {"accuracy": 0.8}}}
  assert R.keep_measured(task, kept, arms, same_eval=True) == {"uncompressed_memory"}
  assert task["peak_memory"] == {"x": 1} and task["long_spec"] == {"n_steps": 1000}
  assert task["bytes_per_stage"] == {
    "bytes": {"stage3_int8": 10.0},
    "long_accuracy": {"compressed": 1},
  }
  # The compressed arm measured again (under another --eval-set): its bytes and the peak
  # memory go, the other arms' long accuracy stays.
  task = {"arms": {"compressed": {"accuracy": 0.4}, "uncompressed_memory": {}}}
  arms = {"compressed": None}
  assert R.keep_measured(task, dict(kept, arms={}), arms, same_eval=False) == {"compressed"}
  assert "peak_memory" not in task
  assert task["bytes_per_stage"] == {
    "long_accuracy": {"uncompressed_memory": 2, "vs_uncompressed": 3}
  }


def test_portable_path(repo_root):
  inside = repo_root / "experiments" / "configs" / "longhorizon.py"
  assert portable_path(str(inside)) == "experiments/configs/longhorizon.py"
  assert portable_path("/elsewhere/x.py") == "/elsewhere/x.py"
