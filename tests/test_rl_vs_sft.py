"""experiments/rl_vs_sft.py's bookkeeping: per-split accuracies, paired differences to
continued SFT, the flaw's gap and the fraction of it RL recovers. (Its runs are `sao-jax
train` processes and `eval_workdir`, tested where they live.)"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def exp(experiment):
  return experiment("rl_vs_sft")


def _run(sft, cont, grpo, sao, clean, ops3=(0.1, 0.1, 0.2, 0.3, 0.1)):
  arms = dict(sft=sft, sft_continued=cont, grpo=grpo, sao=sao, sft_clean=clean)
  return {
    a: {"splits": {"test": v, "ops3": o}} for (a, v), o in zip(arms.items(), ops3, strict=True)
  }


def test_gap_recovery_and_paired_differences(exp):
  runs = [_run(0.50, 0.60, 0.70, 0.75, 0.80), _run(0.52, 0.58, 0.66, 0.62, 0.78)]
  arms = ["sft_continued", "grpo", "sao", "sft_clean"]
  sm = exp.summarize(runs, arms, ["test", "ops3"])
  assert sm["sft_continued"]["test"]["mean"] == pytest.approx(0.59)
  assert sm["grpo_minus_sft_continued"]["test"]["values"] == pytest.approx([0.10, 0.08])
  assert sm["sao_minus_grpo"]["test"]["values"] == pytest.approx([0.05, -0.04])
  assert sm["sao_minus_sft_continued"]["ops3"]["values"] == pytest.approx([0.2, 0.2])
  assert sm["flaw_gap"]["values"] == pytest.approx([0.20, 0.20])
  assert sm["grpo_recovered_fraction"]["values"] == pytest.approx([0.5, 0.4])
  assert runs[0]["recovered"]["sao"] == pytest.approx(0.75)
  assert "plateau" not in sm  # (starts without an evaluation curve)
  for r, gain in zip(runs, (1.0, -1.0), strict=True):  # --start-eval-every: plateau measures
    r["sft"]["plateau"] = {"gain_points": gain}
    r["sft_clean_start"] = {"plateau": {"gain_points": 2 * gain}}
  sm = exp.summarize(runs, arms, ["test"])
  assert sm["plateau"]["plateaued"] is True and sm["plateau_clean"]["within_noise"] is True
  # No gap (the flaw did not bite in that seed): no fraction to report, not a division by 0.
  runs = [_run(0.5, 0.6, 0.7, 0.7, 0.6)]
  sm = exp.summarize(runs, arms, ["test"])
  assert runs[0]["recovered"]["grpo"] is None and sm["grpo_recovered_fraction"]["n"] == 0


def test_settings_name_what_they_change(repo_root):
  """The comparison and its tuning sweeps train the same setting: one function makes it."""
  from sao_jax.bench.rl_vs_sft import setting_overrides, splits_for

  config = str(repo_root / "experiments" / "configs" / "sao_arith.py")
  sets, cfg = setting_overrides("flawed", ["gave", "used"], config, "tiny", ["seed=3"])
  assert sets == ["task.options.teacher_misreads=('gave', 'used')", "seed=3"]
  assert dict(cfg.task.options)["teacher_misreads"] == ("gave", "used") and cfg.seed == 3
  assert splits_for("flawed", cfg) == {"test": []}
  sets, cfg = setting_overrides("clean", [], config, "tiny", ["seed=3"])
  assert sets == ["seed=3"] and cfg.seed == 3 and splits_for("clean", cfg) == {"test": []}
  sets, cfg = setting_overrides("ood", [], config, "tiny")
  assert sets[0] == "task.n_ops_mix=(1, 2)" and sets[-1] == f"model.max_len={cfg.model.max_len}"
  splits = splits_for("ood", cfg)
  assert list(splits) == ["test", "ops3", "operands20"]
  assert splits["ops3"][0] == "task.n_ops_mix=(3,)" and cfg.model.max_len % 8 == 0
  # The default config's OOD setting makes a train split (1-operation problems are few).
  setting_overrides("ood", [], config, "default")
  with pytest.raises(ValueError, match="unknown setting"):
    setting_overrides("noisy", [], config, "tiny")


def test_training_samples_count_demonstrations_and_trajectories():
  """SFT counts sft.batch_size demonstrations an update; GRPO prompts x group size; SAO the
  running count of trajectories its learner consumed; a row logged every k updates stands
  for all k."""
  from sao_jax.bench.rl_vs_sft import samples_at, training_samples
  from sao_jax.config import Config, apply_overrides

  cfg = apply_overrides(Config(), ["sft.batch_size=4", "rl.prompts_per_step=2", "rl.group_size=3"])
  sft = [{"phase": "sft", "step": s} for s in (1, 2, 3)] + [{"phase": "sft_eval", "step": 3}]
  steps, cum = training_samples(sft, cfg, "sft")
  assert steps.tolist() == [1, 2, 3] and cum.tolist() == [4, 8, 12]
  grpo = [{"phase": "rl", "step": s} for s in (10, 20)]  # log_every=10
  assert training_samples(grpo, cfg, "rl")[1].tolist() == [60, 120]
  sao = [
    {"phase": "rl", "step": 1, "trajectories": 5},
    {"phase": "rl", "step": 2, "trajectories": 12},
  ]
  sao.append({"phase": "rl_event", "step": 2, "trajectories": 99})
  steps, cum = training_samples(sao, cfg, "rl")
  assert cum.tolist() == [5, 12]
  assert samples_at(steps, cum, 0) == 0 and samples_at(steps, cum, 1.5) == pytest.approx(8.5)
  assert samples_at(steps, cum, 3) == pytest.approx(18)  # past the last row: 6 an update


def test_accuracy_at_equal_samples_and_the_diagnosis(exp):
  from sao_jax.bench.rl_vs_sft import accuracy_at, diagnosis

  assert accuracy_at([0, 10, 20], [0.1, 0.3, 0.5], 15) == pytest.approx(0.4)
  assert accuracy_at([0, 10], [0.1, 0.3], 11) is None  # never past the curve's end
  curves = {
    "sft_continued": [[0, 0.5], [100, 0.6]],  # 100 demonstrations
    "grpo": [[0, 0.5], [40, 0.7]],  # the fewest: 40
    "sao": [[0, 0.5], [80, 0.9]],
  }
  run = {a: {"samples": c[-1][0], "sample_curve": c} for a, c in curves.items()}
  eq = exp.equal_samples([run], ["sft_continued", "grpo", "sao", "sft_clean"])
  assert run["equal_samples"]["samples"] == 40
  assert eq["sft_continued"]["mean"] == pytest.approx(0.54)
  assert eq["sao"]["mean"] == pytest.approx(0.7) and eq["grpo"]["mean"] == pytest.approx(0.7)
  assert eq["sao_minus_grpo"]["mean"] == pytest.approx(0.0)
  assert eq["grpo_minus_sft_continued"]["mean"] == pytest.approx(0.16)
  assert exp.equal_samples([{"grpo": {}}], ["grpo"]) is None  # runs without curves
  rows = [
    {
      "phase": "rl",
      "step": 1,
      "reward": 0.0,
      "reward_zero_frac": 1.0,
      "groups_flat": 1.0,
      "adv_abs": 0.0,
    },
    {
      "phase": "rl",
      "step": 2,
      "reward": 0.5,
      "reward_zero_frac": 0.5,
      "groups_flat": 0.5,
      "adv_abs": 0.4,
    },
    {"phase": "rl_eval", "step": 2, "accuracy": 0.3},
  ]
  d = diagnosis(rows)
  assert d["batches"] == 2 and d["all_zero_batch"] == pytest.approx(0.5)
  assert d["reward_zero_frac"] == pytest.approx(0.75) and d["adv_abs"] == pytest.approx(0.2)
  assert d["curve"] == [[1, 0.0, 1.0], [2, 0.5, 0.5]]
  sao_rows = [{k: v for k, v in r.items() if k != "groups_flat"} for r in rows]
  assert "groups_flat" not in diagnosis(sao_rows)  # (GRPO's only)


def test_tuning_sweeps_build_every_variant(repo_root, monkeypatch):
  """Every (setting, arm) variant of the tuning sweeps builds, on the setting the comparison
  trains (the code settings on the code family's config)."""
  from conftest import load_script

  monkeypatch.chdir(repo_root)
  mod = load_script("experiments/sweeps/rl_vs_sft_tuning.py")
  for variant in mod.VARIANTS:
    assert mod.get_sweep(variant).name == f"rl_vs_sft_{variant}"
  code = mod.get_sweep("code-flawed_grpo")
  assert code.config == "experiments/configs/code.py:default"
  assert "task.options.teacher_misreads=('add',)" in code.fixed
  assert mod.get_sweep("code-clean_sao").fixed == ("sft.steps=1500", "rl.steps=0")
  plateau = mod.get_sweep("flawed-plateau_sft_continued")
  assert plateau.fixed[-2:] == ("sft.steps=1500", "rl.steps=0")
  assert mod.get_sweep("flawed_sao").fixed[-1] == "rl.steps=0"  # (the half-trained start)
  with pytest.raises(ValueError, match="unknown variant"):
    mod.get_sweep("noisy_grpo")


def test_notebook_plot_finds_results_by_family_and_draws_both_views(tmp_path):
  import json

  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  from sao_jax.analysis.plots import plot_rl_vs_sft, rl_vs_sft_results

  arm = {"eval_curve": [[10.0, 5, 0.5], [20.0, 9, 0.6]], "sample_curve": [[0, 0.4], [90, 0.6]]}
  doc = {
    "config": {"task": {"family": "code"}},
    "setting": "clean",
    "runs": [{"sft_continued": arm, "grpo": arm, "sao": arm}],
    "summary": {"sft": {"test": {"mean": 0.4}}},
  }
  (tmp_path / "rl_vs_sft" / "code_clean").mkdir(parents=True)
  (tmp_path / "rl_vs_sft" / "code_clean" / "results.json").write_text(json.dumps(doc))
  (tmp_path / "rl_vs_sft" / "broken").mkdir()
  (tmp_path / "rl_vs_sft" / "broken" / "results.json").write_text("{not json")
  assert [n for n, _ in rl_vs_sft_results(tmp_path, family="code")] == ["rl_vs_sft/code_clean"]
  assert rl_vs_sft_results(tmp_path, family="arithmetic") == []
  fig = plot_rl_vs_sft(doc)
  left, right = fig.axes
  assert len(left.lines) == 7 and len(right.lines) == 7  # 3 arms x (seed + mean) + start
  assert list(right.lines[0].get_xdata()) == [0, 90]
  plt.close(fig)


def test_seed_curves_draws_each_seed_and_the_mean(tmp_path):
  """The benchmarks' shared figure piece: thin seeds, bold mean over the common points, an
  s.e. band on request; nothing for no curves. (sync_vs_async's figure draws with it.)"""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  from sao_jax.bench import sync_vs_async
  from sao_jax.bench.figures import seed_curves

  fig, ax = plt.subplots()
  seed_curves(ax, [], "k", "none")
  assert not ax.lines
  curves = [[[0, 1, 0.1], [10, 2, 0.3], [20, 3, 0.5]], [[0, 1, 0.3], [12, 2, 0.5]]]
  seed_curves(ax, curves, "tab:blue", "GRPO", band=True, marker="o")
  assert len(ax.lines) == 3 and len(ax.collections) == 1
  mean = ax.lines[-1]
  assert list(mean.get_xdata()) == [0, 11] and list(mean.get_ydata()) == pytest.approx([20, 40])
  assert mean.get_label() == "GRPO (mean of 2)"
  plt.close(fig)
  r = {"runs": [{"sao": {"eval_curve": curves[0]}}], "summary": {"sft_accuracy": {"mean": 0.1}}}
  sync_vs_async.plot(r, tmp_path / "x.png")
  assert (tmp_path / "x.png").stat().st_size > 0
