"""experiments/sft_grpo_arith.py: its summary over seeds, and a tiny two-seed run end to end."""

from __future__ import annotations

import json

import pytest

from sao_jax.bench import arith_report


@pytest.fixture(scope="module")
def arith(experiment):
  return experiment("sft_grpo_arith")


def _run(seed: int, sft: float, grpo: float, ctrl: float) -> dict:
  arm = lambda acc, **kw: {"accuracy": acc, "steps": 10, "seconds": 5.0, **kw}  # noqa: E731
  return {
    "seed": seed,
    "sft": arm(sft),
    "grpo": arm(grpo, gain_points=100 * (grpo - sft), minus_control_points=100 * (grpo - ctrl)),
    "sft_continued": arm(ctrl, gain_points=100 * (ctrl - sft)),
  }


def test_summary_is_mean_se_and_t_interval_over_seeds(capsys):
  runs = [_run(0, 0.4, 0.5, 0.6), _run(1, 0.6, 0.9, 0.6)]
  sm = arith_report.summary(runs)
  assert set(sm) == {"sft", "grpo", "sft_continued"}
  assert "gain_points" not in sm["sft"] and "minus_control_points" not in sm["sft_continued"]
  g = sm["grpo"]["gain_points"]  # +10 and +30 points
  assert g["n"] == 2 and g["mean"] == pytest.approx(20.0) and g["se"] == pytest.approx(10.0)
  # t_{0.975, 1} = 12.706: two seeds give a wide interval, as they should
  assert g["ci95"] == pytest.approx([20 - 127.06, 20 + 127.06], abs=0.01)
  assert sm["grpo"]["minus_control_points"]["values"] == pytest.approx([-10.0, 30.0])
  assert sm["sft"]["accuracy"]["mean"] == pytest.approx(0.5)
  arith_report.print_table({"summary": sm, "seeds": [0, 1], "num_test_problems": 64})
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


def test_plateau_gain_is_the_least_squares_rise_over_the_last_third():
  # 7 evaluations: ceil(7/3) = 3 in the last third, steps 40..60, accuracy 50, 56, 53 %
  curve = [[0.0, 10 * i, a] for i, a in enumerate([0.1, 0.3, 0.4, 0.45, 0.5, 0.56, 0.53])]
  curve.append([9.9, 60, 0.53])  # the final step evaluated twice: counted once
  g = arith_report.plateau_gain(curve, num_problems=100)
  assert (g["from_step"], g["to_step"], g["evaluations"]) == (40, 60, 3)
  assert g["gain_points"] == pytest.approx(3.0)  # slope 0.15 points/step over 20 steps
  assert g["eval_se_points"] == pytest.approx(100 * (0.53 * 0.47 / 100) ** 0.5)
  runs = [{"sft": {"plateau": {"gain_points": x}}} for x in (3.0, -1.0)]
  pl = arith_report.plateau_summary(runs)
  assert pl["last_third_gain_points"]["mean"] == pytest.approx(1.0)
  assert pl["within_noise"] is True and pl["plateaued"] is True and "contains 0" in pl["criterion"]
  runs = [{"sft": {"plateau": {"gain_points": x}}} for x in (3.0, 3.2, 2.8)]
  assert arith_report.plateau_summary(runs)["within_noise"] is False
  assert arith_report.plateau_summary(runs)["plateaued"] is False
  assert arith_report.plateau_summary(runs[:1])["plateaued"] is None  # one seed: no spread
  # A steady rise of 15 points within noise of 0 over 3 seeds has not plateaued.
  runs = [{"sft": {"plateau": {"gain_points": x}}} for x in (8.2, 21.9, 15.6)]
  pl = arith_report.plateau_summary(runs)
  assert pl["within_noise"] is True and pl["plateaued"] is False


def _tiny(arith, out, *extra):
  return arith.main(
    ["--variant", "tiny", "--seeds", "2", "--set", "rl.steps=1", "--eval-every", "1e9"]
    + ["--out", str(out), "--no-progress", *extra]
  )


@pytest.mark.slow
def test_tiny_plateau_run(arith, tmp_path):
  r = _tiny(arith, tmp_path / "plateau", "--setting", "plateau", "--sft-eval-every", "5")
  assert r["setting"] == "plateau" and r["plateau"]["sft_eval_every_steps"] == 5
  for run in r["runs"]:
    sft = run["sft"]
    # evaluations at steps 0, 5, 10, 15 and the final 20 (once), the last third is 15..20
    assert [step for _, step, _ in sft["eval_curve"]] == [0, 5, 10, 15, 20]
    assert sft["eval_curve"][-1][2] == sft["accuracy"]
    assert (sft["plateau"]["from_step"], sft["plateau"]["to_step"]) == (15, 20)
    assert run["grpo"]["steps"] == 1 and "minus_control_points" in run["grpo"]
  g = r["plateau"]["last_third_gain_points"]
  assert g["values"] == [run["sft"]["plateau"]["gain_points"] for run in r["runs"]]
  assert r["plateau"]["within_noise"] == (g["ci95"][0] <= 0 <= g["ci95"][1])
  assert r["plateau"]["plateaued"] == (r["plateau"]["within_noise"] and g["mean"] < 3.0)
  saved = json.loads((tmp_path / "plateau" / "results.json").read_text())
  assert saved["plateau"] == json.loads(json.dumps(r["plateau"]))
  with pytest.raises(SystemExit, match="fewer than 4 SFT evaluations"):
    _tiny(arith, tmp_path / "x", "--setting", "plateau", "--sft-eval-every", "10")


@pytest.mark.slow
def test_tiny_no_demos_run_evaluates_every_arm_on_the_hard_split(arith, tmp_path):
  easy = ["--sft-set", "task.num_test=32", "--sft-set", "eval.num_problems=32"]
  _tiny(arith, tmp_path / "nodemos", "--setting", "no-demos", *easy)
  r = json.loads((tmp_path / "nodemos" / "results.json").read_text())
  nd = r["no_demos"]
  assert nd["sft_tasks"]["n_ops_mix"] == [1, 2] and nd["rl_tasks"]["n_ops_mix"] == [3, 4]
  # tiny: 64 hard test problems (the RL setup's eval.num_problems), 32 easy ones
  assert nd["hard_test_problems"] == r["num_test_problems"] == 64
  assert nd["easy_test_problems"] == 32
  assert nd["rl_config"]["eval"]["num_problems"] == 64
  for run in r["runs"]:
    for arm in ("sft", "grpo", "sft_continued"):
      a = run[arm]
      assert a["num_problems"] == 64 and a["easy_num_problems"] == 32, arm
      assert a["eval_curve"][-1][2] == a["accuracy"], arm
    for arm in ("grpo", "sft_continued"):  # step 0 is the SFT checkpoint, evaluated alike
      assert run[arm]["eval_curve"][0][2] == run["sft"]["accuracy"], arm
    for prefix in ("", "easy_"):
      assert run["grpo"][prefix + "minus_control_points"] == pytest.approx(
        100 * (run["grpo"][prefix + "accuracy"] - run["sft_continued"][prefix + "accuracy"])
      )
  sm = r["summary"]
  assert sm["grpo"]["easy_gain_points"]["n"] == 2 and "easy_accuracy" in sm["sft"]
  with pytest.raises(SystemExit, match="shared by both phases"):
    _tiny(arith, tmp_path / "x", "--setting", "no-demos", "--rl-set", "model.width=64")
  with pytest.raises(SystemExit, match="are for --setting no-demos"):
    _tiny(arith, tmp_path / "x", "--rl-set", "task.n_ops=3")
