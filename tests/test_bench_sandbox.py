"""experiments/bench_sandbox.py --quick runs and writes a sane result."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_bench_sandbox_quick(tmp_path, experiment):
  bench = experiment("bench_sandbox")
  out = tmp_path / "bench.json"
  bench.main(["--quick", "--out", str(out)])
  r = json.loads(out.read_text())
  assert r["isolation"] in ("bwrap", "rlimits") and r["machine"]["cpus"] >= 1
  for workload in ("code", "humaneval"):
    arms = r["executions_per_s"][workload]
    assert {"no_pool", "pool_1"} <= set(arms) and len(arms) == 4
    for arm in arms.values():
      assert arm["mean"] > 0 and arm["statuses"] == ["passed"]
