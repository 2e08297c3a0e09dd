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
  sets, cfg = setting_overrides("ood", [], config, "tiny")
  assert sets[0] == "task.n_ops_mix=(1, 2)" and sets[-1] == f"model.max_len={cfg.model.max_len}"
  splits = splits_for("ood", cfg)
  assert list(splits) == ["test", "ops3", "operands20"]
  assert splits["ops3"][0] == "task.n_ops_mix=(3,)" and cfg.model.max_len % 8 == 0
  # The default config's OOD setting makes a train split (1-operation problems are few).
  setting_overrides("ood", [], config, "default")
  with pytest.raises(ValueError, match="unknown setting"):
    setting_overrides("noisy", [], config, "tiny")
