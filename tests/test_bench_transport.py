"""experiments/bench_transport.py --quick runs end to end against the real local broker,
including the two SAO arms (embedded and Kafka) from one SFT warm start."""

import json
import subprocess
import sys

import pytest
from conftest import subprocess_env


@pytest.mark.slow
def test_bench_transport_quick(tmp_path, repo_root):
  out = tmp_path / "t.json"
  proc = subprocess.run(
    [sys.executable, "experiments/bench_transport.py", "--quick", "--out", str(out)],
    cwd=repo_root,
    env=subprocess_env(),
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert proc.returncode == 0, proc.stderr
  r = json.loads(out.read_text())
  for name in ("embedded", "kafka"):
    for size in ("1KB", "64KB", "1MB"):
      row = r[name][size]
      assert row["lost"] == 0, (name, size)
      assert 0 < row["latency_p50_ms"] <= row["latency_p99_ms"]
      assert row["throughput_mb_per_s"] > 0
  sao = r["sao"]
  assert sao["steps_per_arm"] == 4 and 0 <= sao["sft_accuracy"] <= 1
  for name in ("embedded", "kafka"):
    arm = sao[name]
    assert arm["steps"] == 4 and arm["trajectories"] >= 4 * 16 and arm["bad_records"] == 0
    assert 0 < arm["learner_busy"] <= 1 and arm["trajectories_per_s"] > 0
    assert 0 < arm["delay_mean_s"] <= arm["delay_p95_s"]
  assert sao["busy_kafka_over_embedded"] > 0
