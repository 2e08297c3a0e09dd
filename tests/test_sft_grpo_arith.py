"""experiments/sft_grpo_arith.py: its summary over seeds, and a tiny two-seed run end to end."""

from __future__ import annotations

import importlib.util
import json

import pytest


@pytest.fixture(scope="module")
def arith(repo_root):
  spec = importlib.util.spec_from_file_location(
    "sft_grpo_arith", repo_root / "experiments" / "sft_grpo_arith.py"
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _run(seed: int, sft: float, grpo: float, ctrl: float) -> dict:
  arm = lambda acc, **kw: {"accuracy": acc, "steps": 10, "seconds": 5.0, **kw}  # noqa: E731
  return {
    "seed": seed,
    "sft": arm(sft),
    "grpo": arm(grpo, gain_points=100 * (grpo - sft), minus_control_points=100 * (grpo - ctrl)),
    "sft_continued": arm(ctrl, gain_points=100 * (ctrl - sft)),
  }


def test_summary_is_mean_se_and_t_interval_over_seeds(arith, capsys):
  runs = [_run(0, 0.4, 0.5, 0.6), _run(1, 0.6, 0.9, 0.6)]
  sm = arith.summary(runs)
  assert set(sm) == {"sft", "grpo", "sft_continued"}
  assert "gain_points" not in sm["sft"] and "minus_control_points" not in sm["sft_continued"]
  g = sm["grpo"]["gain_points"]  # +10 and +30 points
  assert g["n"] == 2 and g["mean"] == pytest.approx(20.0) and g["se"] == pytest.approx(10.0)
  # t_{0.975, 1} = 12.706: two seeds give a wide interval, as they should
  assert g["ci95"] == pytest.approx([20 - 127.06, 20 + 127.06], abs=0.01)
  assert sm["grpo"]["minus_control_points"]["values"] == pytest.approx([-10.0, 30.0])
  assert sm["sft"]["accuracy"]["mean"] == pytest.approx(0.5)
  arith.print_table({"summary": sm, "seeds": [0, 1], "num_test_problems": 64})
  text = capsys.readouterr().out
  assert "20.0 ± 10.0" in text and "50.0 ± 10.0" in text
  assert "GRPO - control: 10.0 ± 20.0 points (95 % CI -244.1 .. +264.1)" in text


@pytest.mark.slow
def test_tiny_two_seed_run(arith, tmp_path):
  out = tmp_path / "arith"
  r = arith.main(
    [
      "--variant",
      "tiny",
      "--seeds",
      "2",
      "--set",
      "rl.steps=2",
      "--eval-every",
      "1e9",
      "--out",
      str(out),
      "--no-progress",
    ]
  )
  assert json.loads((out / "results.json").read_text()) == json.loads(json.dumps(r))
  assert r["seeds"] == [0, 1] and r["provenance"]["commit"]
  for run in r["runs"]:
    assert run["grpo"]["steps"] == 2
    assert run["grpo"]["gain_points"] == pytest.approx(
      100 * (run["grpo"]["accuracy"] - run["sft"]["accuracy"])
    )
    for arm in ("sft", "grpo", "sft_continued"):
      assert (out / f"seed{run['seed']}" / arm / "metrics.jsonl").stat().st_size > 0
  acc = r["summary"]["grpo"]["accuracy"]
  assert acc["n"] == 2 and acc["values"] == [run["grpo"]["accuracy"] for run in r["runs"]]
  assert (out / "curves.png").stat().st_size > 0
