"""experiments/bench_compression.py --quick end to end: one run with every arm (without the
compiled peak memory, part 3), then reruns that resume from it (adding the peak memory, a
stopped run, its arms one run at a time, another --eval-set). In a module of their own,
which pytest-xdist runs on one worker: they share the first run, and the compilation cache
makes their programs once (only the rerun that adds the peak memory measures it)."""

from __future__ import annotations

import json
import pathlib
import shutil

import numpy as np
import pytest
from test_bench_compression import _bench, _refused


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory, repo_root):
  """The run the tests here start from, made once (its three arms' training and every
  measurement but the peak memory are most of their time): its directory (bench.json, the
  arms' parameters under params/), its JSON and its stdout. Tests that resume from it write
  to copies."""
  where = tmp_path_factory.mktemp("bench_quick")
  r, stdout = _bench(where, repo_root, *_quick_flags(where))
  return where, r, stdout


def _quick_flags(where, peak_memory: bool = False) -> tuple[str, ...]:
  flags = ("--uncompressed-control", "--params-dir", str(where / "params"))
  return flags if peak_memory else (*flags, "--skip-peak-memory")


def _resume_from(quick_run, name: str) -> pathlib.Path:
  """A copy of the first run's bench.json under `name`, for a run with --resume to write."""
  where = quick_run[0]
  out = where / name
  shutil.copyfile(where / "bench.json", out)
  return out


@pytest.mark.slow
def test_bench_compression_quick(quick_run):
  _, r, stdout = quick_run
  assert "SAO / GRPO" in stdout
  assert r["quick"] and r["tasks"]
  assert r["complete"] and r["done"] == "all"  # partial writes along the way say otherwise
  for t in r["tasks"].values():
    b = t["bytes_per_stage"]["bytes"]
    # Each stage shrinks what the previous one kept.
    assert (
      b["full_context_fp32_embeddings"]
      > b["stage1_semantic_fp32"]
      >= b["stage2_temporal_fp32"]
      > b["stage3_int8"]
      > 0
    )
    s = t["bytes_per_stage"]
    assert 0 <= s["facts_kept_frac"] <= 1 and s["evicted"] >= 0
    # The graveyard for exact replay: one entry (INT8, scales, step) + eviction step each.
    assert b["stage3_graveyard_exact_replay"] == pytest.approx(
      s["evicted"] / s["episodes"] * (b["stage3_int8"] / s["kept_steps_mean"] + 2)
    )
    assert b["stage3_int8_with_graveyard"] == pytest.approx(
      b["stage3_int8"] + b["stage3_graveyard_exact_replay"]
    )
    f = s["filters"]
    assert set(f) == {
      "learned_salience_full_bank",
      "learned_salience_last_16",
      "learned_salience_at_0.25_full_bank",
      "learned_salience_at_0.1_full_bank",
      "learned_salience_at_0_full_bank",
      "surprise_full_bank",
      "surprise_last_16",
      "surprise_first_come_last_16",
    }
    for v in f.values():
      assert 0 <= v["facts_kept_frac"] <= 1 and 0 <= v["facts_visible_at_question_frac"] <= 1
      assert v["int8_with_graveyard_reduction"] > 1
    at = [f[f"learned_salience_at_{t}_full_bank"] for t in ("0.25", "0.1", "0")]
    assert [v["salience_threshold"] for v in at] == [0.25, 0.1, 0.0]
    # The trained filter is the first row: the same numbers as the main measurement.
    assert f["learned_salience_full_bank"]["facts_kept_frac"] == s["facts_kept_frac"]
    assert f["surprise_first_come_last_16"]["evicted"] == 0
    assert {"fact", "question", "filler"} <= set(s["surprise_by_kind"])
    assert set(s["salience_by_kind"]) == set(s["surprise_by_kind"])
    la = s["long_accuracy"]
    assert la["episodes"] == 2 and la["questions"] == 6  # 2 episodes x 3 facts
    for arm in ("compressed", "full_context_window"):
      assert sum(g["questions"] for g in la[arm]["by_gap"].values()) == 6
    assert t["chance"] == 0.1 and t["relative_loss_stderr_paired"] >= 0
    for arm in ("compressed", "full_context", "compressed_float_memory"):
      a = t["arms"][arm]
      assert 0.0 <= a["accuracy"] <= 1.0 and a["questions"] == 16  # 8 episodes x 2 facts
      assert a["stderr"] == pytest.approx((a["accuracy"] * (1 - a["accuracy"]) / 16) ** 0.5)
      assert a["wilson95"][0] <= a["accuracy"] <= a["wilson95"][1]
      assert a["wilson95"][1] - a["wilson95"][0] > 0.1  # never a zero-width interval
    assert t["arms"]["compressed"]["episodes_with_evictions"] >= 0
    # Every miss of the compressed arm is attributed: fact seen when asked, or not; the lost
    # ones (control right) are the discordant questions, each with its distance.
    e, acc = t["compressed_errors"], t["arms"]["compressed"]["accuracy"]
    assert e["questions"] == 16 and e["missed"]["n"] == round(16 * (1 - acc))
    assert e["lost"]["n"] == t["questions_discordant"]["full_right_compressed_wrong"]
    assert len(e["lost"]["gaps"]) == e["lost"]["n"]
    assert all(g >= t["spec"]["min_gap"] for g in e["lost"]["gaps"])
    for k in ("missed", "lost"):
      assert 0 <= e[k]["fact_seen"] <= e[k]["n"]
    assert 0 <= e["fact_seen_frac"] <= 1
    # The stage-1-only control keeps every step of its 12-step episodes; its paired counts
    # against the compressed arm match the two accuracies, short and at the long episodes.
    u = t["arms"]["uncompressed_memory"]
    assert u["bank_capacity"] == 12 and u["kept_steps_mean"] == 12 and u["questions"] == 16
    vu = t["vs_uncompressed"]
    assert vu["control_right_other_wrong"] - vu["other_right_control_wrong"] == round(
      16 * (u["accuracy"] - t["arms"]["compressed"]["accuracy"])
    )
    lu = la["vs_uncompressed"]
    # The compressed arm's long misses are attributed as the short ones: fact kept, seen.
    lc = la["compressed"]
    le, pq = lc["errors"], lc["errors"]["per_question"]
    assert le["questions"] == 6 and len(pq["fact_kept"]) == len(pq["fact_seen"]) == 6
    assert le["missed"]["n"] == round(6 * (1 - lc["accuracy"]))
    assert le["lost"]["n"] == lu["control_right_other_wrong"]
    assert all(k >= v for k, v in zip(pq["fact_kept"], pq["fact_seen"], strict=True))
    assert lc["kept_steps_mean"] > 0 and lc["evicted_mean"] >= 0
    assert 0 <= lc["episodes_with_evictions"] <= 2
    assert sum(g["questions"] for g in la["uncompressed_memory"]["by_gap"].values()) == 6
    assert lu["control_right_other_wrong"] - lu["other_right_control_wrong"] == round(
      6 * (la["uncompressed_memory"]["accuracy"] - la["compressed"]["accuracy"])
    )
    assert "peak_memory" not in t  # --skip-peak-memory: the next test adds it


@pytest.mark.slow
def test_bench_compression_quick_adds_the_peak_memory(quick_run, repo_root):
  """--resume without --skip-peak-memory on a complete file: every measurement is kept (the
  arms restored, not retrained nor measured again) and part 3 is added: the compiled peak
  memory of one update, GRPO(N=8) against SAO, with the controls."""
  where, r, _ = quick_run
  out = _resume_from(quick_run, "peak.json")
  r2, stdout = _bench(
    where, repo_root, *_quick_flags(where, peak_memory=True), "--resume", out_name=out.name
  )
  assert "bytes and filters: kept from" in stdout and r2["complete"]
  t0, t = r["tasks"]["retention"], r2["tasks"]["retention"]
  assert t["arms"] == t0["arms"] and t["bytes_per_stage"] == t0["bytes_per_stage"]
  la = t["bytes_per_stage"]["long_accuracy"]
  for pm in t["peak_memory"].values():
    assert pm["grpo_n8_full_context"]["peak"] > pm["single_trajectory_full_context"]["peak"]
    assert 0 < pm["ratio_sao_over_grpo"] < 1
  # Long episodes: also GRPO(N=8) on the window the control was trained on, which is
  # shorter than the whole episode and so needs less than full attention over it.
  lm = t["peak_memory"]["long_episodes"]
  assert lm["steps"] == 120 and lm["control_window_tokens"] == la["control_context_tokens"]
  assert lm["grpo_n8_window_control"]["peak"] < lm["grpo_n8_full_context"]["peak"]
  assert lm["ratio_sao_over_grpo_window"] == pytest.approx(
    lm["sao_compressed"]["peak"] / lm["grpo_n8_window_control"]["peak"]
  )
  # With the stage-1 control: eight trajectories a task cost more than one, with either
  # memory. (Whether the stage-1 bank costs more than the compressed one shows at 1,000
  # steps, in the committed results; at 120 steps of the tiny policy the two single-
  # trajectory updates are within 1 % of each other, either way round.)
  g1, s1 = lm["grpo_n8_stage1_memory"]["peak"], lm["sao_stage1_memory"]["peak"]
  assert g1 > 4 * max(s1, lm["sao_compressed"]["peak"])
  assert s1 == pytest.approx(lm["sao_compressed"]["peak"], rel=0.05)
  assert lm["ratio_sao_over_grpo_stage1"] == pytest.approx(lm["sao_compressed"]["peak"] / g1)


@pytest.mark.slow
def test_bench_compression_quick_resumes_a_stopped_run(quick_run, repo_root, capsys):
  """--resume after a run stopped in its 1,000-step accuracy (one arm done): the finished
  parts are kept as measured, the missing arm is measured (the same greedy episodes, so the
  same numbers), and its paired comparison with the kept arm is made from the kept answers."""
  where, r, _ = quick_run
  flags = _quick_flags(where)
  out = _resume_from(quick_run, "stopped.json")
  stopped = json.loads(out.read_text())
  la = stopped["tasks"]["retention"]["bytes_per_stage"]["long_accuracy"]
  full = dict(la)
  for k in ("uncompressed_memory", "vs_uncompressed"):
    del la[k]
  stopped.update(complete=False, done="retention: 120-step accuracy of compressed")
  out.write_text(json.dumps(stopped))
  r2, stdout2 = _bench(where, repo_root, *flags, "--resume", out_name=out.name)
  assert "short episodes: kept from" in stdout2 and "bytes and filters: kept from" in stdout2
  assert r2["complete"] and r2["resumed_from"]["done"] == stopped["done"]
  t, t2 = r["tasks"]["retention"], r2["tasks"]["retention"]
  assert t2["arms"] == t["arms"] and "peak_memory" not in t2  # still skipped
  la2 = t2["bytes_per_stage"]["long_accuracy"]
  assert la2["compressed"] == full["compressed"]  # kept: the same seconds too
  u, u2 = full["uncompressed_memory"], la2["uncompressed_memory"]
  assert (u2["correct"], u2["accuracy"]) == (u["correct"], u["accuracy"])
  assert la2["vs_uncompressed"] == full["vs_uncompressed"]
  # Other settings are refused, not mixed into the file.
  err = _refused(repo_root, capsys, *flags, "--resume", "--seed", "1", "--out", str(out))
  assert "seed: 0 there, 1 here" in err


@pytest.mark.slow
def test_bench_compression_quick_arms_one_at_a_time(quick_run, repo_root):
  """--arms: the first run's arms measured again, each in a run of its own, into one file."""
  where, r, _ = quick_run
  flags = _quick_flags(where)
  t = r["tasks"]["retention"]
  full = t["bytes_per_stage"]["long_accuracy"]
  # --arms: a seed's arms run one at a time into one file (runs that each fit a session, or
  # on other machines). Restored from --params-dir here, so each arm's numbers are the one
  # run's; the file is incomplete until the last arm, and its pairings and error attribution
  # are made from the kept answers, the same as when the arms ran together. Here the control
  # runs first (a seed whose control trains on alone): no bytes without the compressed arm,
  # and its 1,000-step accuracy stays when the compressed arm's bytes are measured after it.
  s1, out1 = _bench(
    where, repo_root, *flags, "--arms", "uncompressed_memory", out_name="split.json"
  )
  assert not s1["complete"] and s1["done"].startswith("all but retention: compressed")
  assert "| retention | uncompressed_memory |" in out1  # the closing tables print what it has
  t1 = s1["tasks"]["retention"]
  assert set(t1["arms"]) == {"uncompressed_memory"} and "compressed_errors" not in t1
  assert "bytes" not in t1["bytes_per_stage"]
  assert set(t1["bytes_per_stage"]["long_accuracy"]) & set(full) == {
    "episodes",
    "questions",
    "control_context_tokens",
    "uncompressed_memory",
  }
  s2, out2 = _bench(
    where,
    repo_root,
    *flags,
    "--resume",
    "--arms",
    "compressed,full_context",
    out_name="split.json",
  )
  assert "bytes and filters: kept from" not in out2  # measured here, with the compressed arm
  assert s2["complete"] and s2["resumed_from"]["arms_run"] == ["uncompressed_memory"]
  t2 = s2["tasks"]["retention"]
  for arm in t["arms"]:
    for k in ("accuracy", "questions", "correct", "train_seconds"):
      assert t2["arms"][arm].get(k) == t["arms"][arm].get(k), (arm, k)
  for k in ("vs_uncompressed", "relative_loss", "questions_discordant", "compressed_errors"):
    assert t2[k] == t[k], k
  la2, la = t2["bytes_per_stage"]["long_accuracy"], t["bytes_per_stage"]["long_accuracy"]
  assert la2["uncompressed_memory"] == t1["bytes_per_stage"]["long_accuracy"]["uncompressed_memory"]
  assert la2["vs_uncompressed"] == la["vs_uncompressed"]
  assert la2["compressed"]["errors"] == la["compressed"]["errors"]  # lost: paired in the merge
  for arm in ("compressed", "full_context_window", "uncompressed_memory"):
    assert la2[arm]["correct"] == la[arm]["correct"], arm
  assert t2["bytes_per_stage"]["bytes"] == t["bytes_per_stage"]["bytes"]
  # Each arm says which run measured it: the control the first, the others the second
  # (the commit and CPU of that run's provenance, the time when the arm was measured).
  for arm, run in {"compressed": s2, "full_context": s2, "uncompressed_memory": s1}.items():
    m = t2["arms"][arm]["measured_at"]
    assert m["commit"] == run["provenance"]["commit"], arm
    assert m["cpu"] and m["cpu"] == run["provenance"]["machine"]["cpu"], arm
  u1 = t1["arms"]["uncompressed_memory"]["measured_at"]
  assert t2["arms"]["uncompressed_memory"]["measured_at"] == u1
  assert t2["arms"]["full_context"]["measured_at"]["time"] >= s2["provenance"]["time"]


@pytest.mark.slow
def test_bench_compression_quick_eval_set(quick_run, repo_root, capsys):
  """--eval-set: the same trained arms, the compressed one measured under another
  compression setting (here the trained filter at keep-probability threshold 0). Its
  controls do not read it, so with --resume they are kept as measured and the compressed arm
  is measured again and paired with their kept answers; its bank at threshold 0 is the one
  the earlier run's filter ablation measured at 0, and the ablations now hold the trained
  0.5."""
  where, r, _ = quick_run
  flags = _quick_flags(where)  # the peak memory skipped: the test before measures it on resume
  t2 = r["tasks"]["retention"]
  la2 = t2["bytes_per_stage"]["long_accuracy"]
  out = _resume_from(quick_run, "eval_set.json")
  s3, out3 = _bench(
    where,
    repo_root,
    *flags,
    "--resume",
    "--eval-set",
    "compression.salience_threshold=0",
    out_name=out.name,
  )
  assert "measured with compression.salience_threshold=0 (trained without)" in out3
  assert s3["complete"] and s3["eval_overrides"] == ["compression.salience_threshold=0"]
  assert s3["resumed_from"]["eval_overrides"] == []
  t3 = s3["tasks"]["retention"]
  assert t3["arms"]["compressed"]["eval_overrides"] == s3["eval_overrides"]
  assert t3["arms"]["compressed"]["measured_at"]["commit"] == s3["provenance"]["commit"]
  for arm in ("uncompressed_memory", "full_context"):
    assert t3["arms"][arm] == t2["arms"][arm], arm  # kept, measured_at included
  b3, b2 = t3["bytes_per_stage"], t2["bytes_per_stage"]
  assert (
    b3["facts_kept_frac"] == b2["filters"]["learned_salience_at_0_full_bank"]["facts_kept_frac"]
  )
  assert (
    b3["filters"]["learned_salience_at_0.5_full_bank"]["facts_kept_frac"] == b2["facts_kept_frac"]
  )
  assert "learned_salience_at_0_full_bank" not in b3["filters"]
  la3 = b3["long_accuracy"]
  assert la3["uncompressed_memory"] == la2["uncompressed_memory"]
  c3, u3 = (np.asarray(la3[k]["correct"]) for k in ("compressed", "uncompressed_memory"))
  assert la3["vs_uncompressed"]["control_right_other_wrong"] == int(np.sum(u3 > c3))
  assert t3["vs_uncompressed"]["control_right_other_wrong"] == int(
    np.sum(
      np.asarray(t3["arms"]["uncompressed_memory"]["correct"])
      > np.asarray(t3["arms"]["compressed"]["correct"])
    )
  )
  assert "peak_memory" not in t3
