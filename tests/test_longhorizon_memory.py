"""`sao-jax train` of the long-horizon config with compressed memory: supervised warm start,
then GRPO, evaluated with the compression benchmark's metrics."""

from __future__ import annotations

import json
import math
import subprocess

import pytest
from conftest import subprocess_env, train_cmd

# One layer each (compilation dominates the run), a few steps, two held-out episodes.
OVERRIDES = [
  "sft.steps=4",
  "rl.steps=2",
  "rl.prompts_per_step=1",
  "rl.group_size=2",
  "task.num_train=8",
  "task.num_test=2",
  "eval.num_problems=2",
  "log_every=1",
  "model.depth=1",
  "compression.enc_depth=1",
]


@pytest.mark.slow
def test_train_longhorizon_with_compression(tmp_path, repo_root):
  workdir = tmp_path / "run"
  cmd = train_cmd(str(repo_root / "experiments/configs/longhorizon.py:tiny"), workdir, OVERRIDES)
  proc = subprocess.run(
    cmd, cwd=repo_root, capture_output=True, text=True, timeout=600, env=subprocess_env()
  )
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  summary = json.loads((workdir / "summary.json").read_text())
  assert summary["sft"]["steps"] == 4 and summary["rl"]["steps"] == 2
  assert summary["rl"]["trajectories"] == 4
  for phase in ("sft", "rl"):
    ev = summary[phase]
    assert 0.0 <= ev["accuracy"] <= 1.0 and 0.0 <= ev["retention"] <= 1.0
    assert ev["num_problems"] == 2 and ev["questions"] == 4  # 2 episodes x 2 facts
    # Compression was used: the bank holds fewer bytes than every earlier stage, and the
    # filter kept some of the 12 steps (at least the first, last and boundary steps).
    assert 3 <= ev["kept_steps_mean"] <= 12
    assert (
      ev["bytes_full_context"] > ev["bytes_stage1"] >= ev["bytes_stage2"] > ev["bytes_stage3"] > 0
    )
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  train = [r for r in rows if r["phase"] in ("sft", "rl") and "loss" in r]
  assert [r["phase"] for r in train] == ["sft"] * 4 + ["rl"] * 2
  for r in train:
    assert math.isfinite(r["loss"]) and r["nonfinite_skipped"] == 0
    assert r["recon"] > 0 and r["predict"] > 0 and 0 < r["kept_frac"] <= 1
  assert all("reward" in r and "kept_steps_mean" in r for r in train if r["phase"] == "rl")
  assert {"sft_eval", "rl_eval"} <= {r["phase"] for r in rows}
  assert (workdir / "checkpoints" / "sft").is_dir() and (workdir / "checkpoints" / "rl").is_dir()
