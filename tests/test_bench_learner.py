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


def test_bench_learner_config_padded_against_packed(tmp_path, repo_root):
  """--config: the config's SAO update on its real rows, padded and packed, from one state:
  the same first loss, fewer rows packed, MFU counted over real tokens."""
  out = tmp_path / "p.json"
  config = repo_root / "experiments" / "configs" / "sao_arith.py"
  cmd = [
    sys.executable,
    str(repo_root / "experiments" / "bench_learner.py"),
    "--config",
    f"{config}:tiny",
    *("--seeds", "0,1", "--reps", "2", "--warmup", "0", "--matmul-n", "128"),
    # 16 rows of 51-60-slot spans in 72-slot rows: 3 packed rows of 5 x 72 hold them.
    *("--set", "learner.pack_factor=5", "--set", "learner.pack_bucket=1"),
    *("--out", str(out)),
  ]
  proc = subprocess.run(
    cmd, cwd=repo_root, capture_output=True, text=True, timeout=300, env=subprocess_env()
  )
  assert proc.returncode == 0, proc.stderr
  assert "speed-up" in proc.stdout
  r = json.loads(out.read_text())
  assert r["series"] == "bench_learner/packing/sao_arith_tiny" and r["update"] == "sao"
  assert r["config"]["sao"]["batch_size"] == r["rows"] == 16
  assert r["pack_factor"] == r["config"]["learner"]["pack_factor"] == 5
  assert [s["seed"] for s in r["seeds"]] == [0, 1]
  for s in r["seeds"]:
    assert s["packed_rows"] % r["pack_bucket"] == 0
    assert s["packed_slots"] == s["packed_rows"] * 5 * r["row_slots"] < r["rows"] * r["row_slots"]
    assert 0 < s["real_slot_frac"] < 1 and s["span_max"] <= r["row_slots"]
    assert s["first_loss_rel_diff"] < 1e-5
    assert 0 < s["flops_real_tokens"] < r["flops_all_slots"]
    for a in s["arms"].values():
      assert len(a["step_times_s"]) == 2 and a["mfu_real_tokens"] > 0
  assert r["arms"]["padded"]["mfu_all_slots"]["n"] == 2 and r["speedup_packed"]["mean"] > 0
