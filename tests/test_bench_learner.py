"""experiments/bench_learner.py --tiny runs and writes a sane result.

Run as a subprocess, the way the benchmark is meant to be run, so that its own process
measures the reference matmul it divides by."""

from __future__ import annotations

import json
import math
import subprocess
import sys

from conftest import subprocess_env


def test_bench_learner_tiny(tmp_path, repo_root):
  out = tmp_path / "x.json"
  cmd = [
    sys.executable,
    str(repo_root / "experiments" / "bench_learner.py"),
    "--tiny",
    "--out",
    str(out),
  ]
  proc = subprocess.run(
    cmd, cwd=repo_root, capture_output=True, text=True, timeout=300, env=subprocess_env()
  )
  assert proc.returncode == 0, proc.stderr
  assert "MFU" in proc.stdout
  r = json.loads(out.read_text())

  c = r["bench"]
  assert (
    r["config"]["model"]["width"] == c["width"] and r["series"] == "bench_learner/gpt-float32/tiny"
  )
  assert c["tiny"] and c["seq_len"] == c["prompt_len"] + c["completion_len"]
  assert r["tokens_per_step"] == c["batch"] * c["seq_len"]
  assert 0 < r["params"]["non_embedding"] < r["params"]["total"]
  assert r["tokens_per_s"] > 0 and math.isfinite(r["final_loss"])
  assert 0 < r["step_time_s_median"] <= r["step_time_s_p90"]
  assert len(r["step_times_s"]) == c["reps"]
  assert r["achieved_flops_per_s"] > 0 and r["matmul_peak_flops_per_s"] > 0
  assert 0 < r["mfu"] < 1.5
  terms = r["flops_per_step_terms"]
  assert math.isclose(sum(terms.values()), r["flops_per_step_analytic"])
  if r["flops_per_step_xla"] is not None:
    # XLA also counts softmax, norms and the optimizer; the matmuls dominate either way.
    assert 0.5 < r["flops_per_step_xla"] / r["flops_per_step_analytic"] < 2.0
    assert 0 < r["mfu_xla"] < 1.5
  assert r["jax_version"] and r["cpu_count"] >= 1 and r["device"]


def test_bench_learner_variants_tiny(tmp_path, repo_root):
  """The Llama-style variant through the repeats/summary path, and the LoRA sync sizes."""
  out = tmp_path / "v.json"
  cmd = [
    sys.executable,
    str(repo_root / "experiments" / "bench_learner.py"),
    "--tiny",
    "--variants",
    "llama-f32",
    "--repeats",
    "2",
    "--reps",
    "2",
    "--lora-ranks",
    "2,4",
    "--out",
    str(out),
  ]
  proc = subprocess.run(
    cmd, cwd=repo_root, capture_output=True, text=True, timeout=300, env=subprocess_env()
  )
  assert proc.returncode == 0, proc.stderr
  r = json.loads(out.read_text())
  v = r["variants"]["llama-f32"]
  assert v["bench"]["arch"] == "llama" and v["bench"]["dtype"] == "float32"
  assert v["bench"]["kv_heads"] == 1 and v["bench"]["mlp_dim"] == 192  # 2/3 * 4 * 64 -> 192
  assert len(v["runs"]) == 2 and v["mfu"]["n"] == 2 and v["mfu"]["se"] is not None
  assert 0 < v["mfu"]["mean"] < 1.5
  sync = r["lora_sync"]
  small, big = sync["adapters"]["2"]["bytes"], sync["adapters"]["4"]["bytes"]
  assert 0 < small < big < 0.2 * sync["full_bytes"]
  assert r["provenance"]["commit"] and r["provenance"]["command"] and r["cpu_count"] >= 1
