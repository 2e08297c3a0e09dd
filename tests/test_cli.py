"""The `sao-jax` command line as a user runs it (subprocesses, real files)."""

import json
import subprocess
import sys

from conftest import subprocess_env

CFG = "experiments/configs/arith_grpo.py"


def _cli(*args, cwd):
  return subprocess.run(
    [sys.executable, "-m", "sao_jax.cli", *args],
    cwd=cwd,
    capture_output=True,
    text=True,
    timeout=300,
    env=subprocess_env(),
  )


def test_train_wrote_everything(tiny_run_dir):
  summary = json.loads((tiny_run_dir / "summary.json").read_text())
  assert summary["sft"]["steps"] == 20 and summary["rl"]["steps"] == 4
  assert summary["sft"]["num_problems"] == 64
  rows = [json.loads(x) for x in (tiny_run_dir / "metrics.jsonl").read_text().splitlines()]
  phases = {r["phase"] for r in rows}
  assert {"sft", "sft_eval", "rl", "rl_eval"} <= phases
  rl = [r for r in rows if r["phase"] == "rl"]
  for key in (
    "loss",
    "reward",
    "accuracy",
    "kl_behaviour",
    "grad_norm",
    "step_time",
    "sampling_time",
    "learner_time",
    "tokens_per_s",
    "peak_memory_mb",
  ):
    assert key in rl[0], key
  assert list((tiny_run_dir / "tb").iterdir())
  assert json.loads((tiny_run_dir / "config.json").read_text())["name"] == "arith_grpo_tiny"


def test_eval_rebuilds_from_checkpoint(tiny_run_dir, repo_root):
  proc = _cli("eval", "--workdir", str(tiny_run_dir), "--num", "16", cwd=repo_root)
  assert proc.returncode == 0, proc.stderr
  result = json.loads(proc.stdout)
  assert result["num_problems"] == 16 and 0.0 <= result["accuracy"] <= 1.0
  assert result["checkpoint"].endswith("checkpoints/rl") and result["step"] == 4


def test_errors_are_clear(tiny_run_dir, repo_root, tmp_path):
  proc = _cli(
    "train",
    "--config",
    f"{CFG}:tiny",
    "--workdir",
    str(tmp_path / "w"),
    "--set",
    "rl.bogus=1",
    cwd=repo_root,
  )
  assert proc.returncode == 2 and "unknown config key 'rl.bogus'" in proc.stderr
  proc = _cli(
    "train",
    "--config",
    f"{CFG}:tiny",
    "--workdir",
    str(tiny_run_dir),
    "--set",
    "rl.steps=5",
    cwd=repo_root,
  )
  assert proc.returncode == 2 and "already holds a run with a different config" in proc.stderr
  assert "rl.steps: 4 -> 5" in proc.stderr
  proc = _cli("train", "--config", f"{CFG}:tiny", "--workdir", str(tiny_run_dir), cwd=repo_root)
  assert proc.returncode == 0 and "already finished" in proc.stdout
  proc = _cli("eval", "--workdir", str(tmp_path), cwd=repo_root)
  assert proc.returncode == 2 and "no complete checkpoint" in proc.stderr
  assert "Traceback" not in proc.stderr  # (Orbax's clean-up thread printed one at exit)
  # A directory that does not exist: said so, and not created.
  proc = _cli("eval", "--workdir", str(tmp_path / "nowhere"), cwd=repo_root)
  assert proc.returncode == 2 and "no such directory" in proc.stderr, proc.stderr
  assert "Traceback" not in proc.stderr and not (tmp_path / "nowhere").exists()
  # A variant the config file does not define: its own message, no traceback.
  proc = _cli("train", "--config", f"{CFG}:huge", "--workdir", str(tmp_path / "h"), cwd=repo_root)
  assert proc.returncode == 2 and "unknown variant 'huge'" in proc.stderr, proc.stderr
  assert "Traceback" not in proc.stderr and not (tmp_path / "h").exists()
