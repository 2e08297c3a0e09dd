"""experiments/bench_compression.py --quick runs end to end and writes a consistent result."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import shutil
import subprocess
import sys

import chex
import numpy as np
import pytest
from conftest import subprocess_env


def _run(repo_root, *flags, expect: int) -> subprocess.CompletedProcess:
  """Runs bench_compression.py --quick with `flags`; checks its exit status is `expect`."""
  script = repo_root / "experiments" / "bench_compression.py"
  proc = subprocess.run(
    # one compilation cache for the session's runs (conftest): each run compiles the same
    # programs, so all but the first load them
    [sys.executable, str(script), "--quick", "--compile-cache", "user", *flags],
    cwd=repo_root,
    capture_output=True,
    text=True,
    timeout=600,
    env=subprocess_env(),
  )
  assert proc.returncode == expect, proc.stdout[-3000:] + proc.stderr[-3000:]
  return proc


def _bench(tmp_path, repo_root, *flags, out_name="bench.json") -> tuple[dict, str]:
  """Runs bench_compression.py --quick with `flags`: (its JSON, its stdout)."""
  out = tmp_path / out_name
  proc = _run(repo_root, *flags, "--out", str(out), expect=0)
  return json.loads(out.read_text()), proc.stdout


def _refused(repo_root, capsys, *flags) -> str:
  """A run that refuses `flags`: a usage error, exit status 2, before any training; its
  stderr. In this process: a refusal needs no programs, and a new process would spend longer
  importing JAX than the check takes."""
  sys.path.insert(0, str(repo_root / "experiments"))
  import bench_compression

  capsys.readouterr()
  with pytest.raises(SystemExit) as exit_:
    bench_compression.main(["--quick", *flags])
  assert exit_.value.code == 2
  return capsys.readouterr().err


# The run the --quick tests below start from, made once for the module (its three arms'
# training and every measurement are most of their time): its directory (bench.json, the
# arms' parameters under params/), its JSON and its stdout. Tests that resume from it write
# to copies; they run on one pytest-xdist worker, so that the run is made once.
QUICK = pytest.mark.xdist_group("bench_compression_quick")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory, repo_root):
  where = tmp_path_factory.mktemp("bench_quick")
  r, stdout = _bench(where, repo_root, *_quick_flags(where))
  return where, r, stdout


def _quick_flags(where) -> tuple[str, ...]:
  return ("--uncompressed-control", "--params-dir", str(where / "params"))


def _resume_from(quick_run, name: str) -> pathlib.Path:
  """A copy of the first run's bench.json under `name`, for a run with --resume to write."""
  where = quick_run[0]
  out = where / name
  shutil.copyfile(where / "bench.json", out)
  return out


@pytest.mark.slow
@QUICK
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
    # With the stage-1 control: its memory (every step, float32) costs more than the
    # compressed bank, and eight trajectories a task more than one.
    g1, s1 = lm["grpo_n8_stage1_memory"]["peak"], lm["sao_stage1_memory"]["peak"]
    assert g1 > s1 > lm["sao_compressed"]["peak"]
    assert lm["ratio_sao_over_grpo_stage1"] == pytest.approx(lm["sao_compressed"]["peak"] / g1)


@pytest.mark.slow
@QUICK
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
  assert t2["arms"] == t["arms"] and t2["peak_memory"] == t["peak_memory"]
  la2 = t2["bytes_per_stage"]["long_accuracy"]
  assert la2["compressed"] == full["compressed"]  # kept: the same seconds too
  u, u2 = full["uncompressed_memory"], la2["uncompressed_memory"]
  assert (u2["correct"], u2["accuracy"]) == (u["correct"], u["accuracy"])
  assert la2["vs_uncompressed"] == full["vs_uncompressed"]
  # Other settings are refused, not mixed into the file.
  err = _refused(repo_root, capsys, *flags, "--resume", "--seed", "1", "--out", str(out))
  assert "seed: 0 there, 1 here" in err


@pytest.mark.slow
@QUICK
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
@QUICK
def test_bench_compression_quick_eval_set(quick_run, repo_root, capsys):
  """--eval-set: the same trained arms, the compressed one measured under another
  compression setting (here the trained filter at keep-probability threshold 0). Its
  controls do not read it, so with --resume they are kept as measured and the compressed arm
  is measured again and paired with their kept answers; its bank at threshold 0 is the one
  the earlier run's filter ablation measured at 0, and the ablations now hold the trained
  0.5."""
  where, r, _ = quick_run
  flags = _quick_flags(where)
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
  assert t3["peak_memory"]["long_episodes"]["sao_compressed"]["peak"] > 0  # measured again


def test_bench_compression_refuses_settings_it_cannot_honour(tmp_path, repo_root, capsys):
  # A training setting, or one that would not fit the trained parameters, is refused.
  err = _refused(repo_root, capsys, "--eval-set", "sft.optim.lr=1", "--out", str(tmp_path / "x"))
  assert "only compression.* fields" in err
  # An arm these flags do not ask for is refused.
  err = _refused(repo_root, capsys, "--arms", "uncompressed_memory", "--out", str(tmp_path / "x"))
  assert "choose from compressed,full_context" in err


@pytest.mark.slow
def test_bench_compression_no_token_control(tmp_path, repo_root):
  """--no-token-control trains the compressed arm only and leaves out every result that pairs
  with the token-level control, rather than writing one against a missing arm."""
  params_dir = tmp_path / "params"
  flags = ("--no-token-control", "--accuracy-only", "--params-dir", str(params_dir))
  r, stdout = _bench(tmp_path, repo_root, *flags)
  t = r["tasks"]["retention"]
  assert r["complete"] and r["done"] == "all"
  assert "params" not in t["arms"]["compressed"]  # trained here
  # --params-dir: a rerun restores the saved parameters instead of training (a stopped run
  # resumes): same accuracy and training record, and it says where they came from. With
  # --resume, a JSON whose arms were not trained as the restored snapshot says (here: other
  # training seconds, as from another --params-dir) is measured again, not kept.
  out = tmp_path / "bench.json"
  other = json.loads(out.read_text())
  other["tasks"]["retention"]["arms"]["compressed"]["train_seconds"] += 1.0
  out.write_text(json.dumps(other))
  r2, stdout2 = _bench(tmp_path, repo_root, *flags, "--resume")
  assert "holds other parameters (or another --eval-set) for compressed: measuring again" in stdout2
  a, a2 = t["arms"]["compressed"], r2["tasks"]["retention"]["arms"]["compressed"]
  assert a2["params"]["restored_from"] == str(params_dir / "retention" / "compressed")
  assert a2["params"]["trained_on_cpu"] == r["provenance"]["machine"]["cpu"]
  assert (a2["accuracy"], a2["train_seconds"]) == (a["accuracy"], a["train_seconds"])
  assert a2["params"]["trained_at_commit"] == r["provenance"]["commit"]
  # Parameters saved under other settings are refused, not silently reused.
  sys.path.insert(0, str(repo_root / "experiments"))
  import bench_compression

  with pytest.raises(SystemExit, match="pass another --params-dir"):
    bench_compression.train_arm(
      str(params_dir), {"task": "retention", "arm": "compressed", "steps": 3}, None, None, True, []
    )
  # ... and so are those trained under another resolved configuration (a config file edited
  # since, under the same path and settings).
  from sao_jax.checkpoint import read_meta
  from sao_jax.config import load_config

  key = read_meta(params_dir / "retention" / "compressed")[1]["bench_key"]
  assert key["config"] == "experiments/configs/longhorizon.py:tiny"  # not where it lay
  cfg = load_config("experiments/configs/longhorizon.py:tiny", overrides=["sft.optim.lr=0.5"])
  with pytest.raises(SystemExit, match=r"another configuration \(differs in \['sft'\]\)"):
    bench_compression.train_arm(str(params_dir), key, cfg, None, True, [])
  # The same file in a copy of the checkout elsewhere passes the settings check (it is the
  # resolved configuration that is compared, and here refused).
  moved = dict(key, config="/elsewhere/experiments/configs/longhorizon.py:tiny")
  with pytest.raises(SystemExit, match="another configuration"):
    bench_compression.train_arm(str(params_dir), moved, cfg, None, True, [])
  assert set(t["arms"]) == {"compressed", "compressed_float_memory"}
  assert not {"relative_loss", "questions_discordant", "vs_uncompressed"} & set(t)
  e = t["compressed_errors"]
  assert "lost" not in e and e["questions"] == 16
  assert e["missed"]["n"] == round(16 * (1 - t["arms"]["compressed"]["accuracy"]))
  assert "| retention | compressed | 16 |" in stdout


@pytest.mark.slow
def test_train_arm_continues_a_shorter_snapshot_exactly(tmp_path, repo_root):
  """--params-dir with more steps than a saved snapshot: the snapshot's state (optimizer and
  RNG included) is trained on with the batches a single run would have had, so 2 steps then 2
  more give the parameters of 4 steps in one go; both snapshots stay and restore; and a run
  stopped in its training resumes from its last periodic snapshot."""
  sys.path.insert(0, str(repo_root / "experiments"))
  import bench_compression as B
  import lh_common as L

  from sao_jax.config import load_config
  from sao_jax.envs.longhorizon import make_split

  mod = B._config_module(str(repo_root / "experiments/configs/longhorizon.py"))
  cfg = load_config(str(repo_root / "experiments/configs/longhorizon.py:tiny"))
  cfg = dataclasses.replace(cfg, sft=dataclasses.replace(cfg.sft, batch_size=8))  # 8 devices
  train = make_split(mod.TRAIN_TASKS["tiny"]["retention"], "train", 16, 0, num_test=8)
  length = L.full_len(train)
  progs, _ = L.build(cfg, True, full_len=length)
  key = {"task": "retention", "arm": "compressed", "seed": 0}
  kw = dict(length=length, seed=0)

  def arm(steps):
    k = dict(key, steps=steps)
    return B.train_arm(str(tmp_path), k, cfg, progs, True, train, steps=steps, **kw)

  _, secs2, _, origin = arm(2)
  assert origin is None  # trained from the start
  p4, secs4, metrics4, origin = arm(4)
  assert origin["from_step"] == 2 and [p["steps"] for p in origin["continued"]] == [2, 4]
  assert secs4 > secs2
  direct, _, metrics = L.train(cfg, progs, True, train, steps=4, **kw)
  chex.assert_trees_all_close(p4, direct.params, rtol=1e-6, atol=1e-7)
  assert metrics4 == pytest.approx(metrics, rel=1e-5)
  # Both stay: each step count restores its own parameters, not retrained.
  p4b, secs4b, _, o4 = arm(4)
  assert o4["step"] == 4 and secs4b == secs4 and len(o4["continued"]) == 2
  chex.assert_trees_all_equal(p4b, p4)
  _, _, _, o2 = arm(2)
  assert o2["step"] == 2 and "continued" not in o2
  # Snapshots every `every` steps too: a run stopped after step 3 trains on from there.
  stopped, k = tmp_path / "stopped", dict(key, steps=4)
  B.train_arm(str(stopped), k, cfg, progs, True, train, every=3, steps=4, **kw)
  where = stopped / "retention" / "compressed"
  assert sorted(int(p.name) for p in where.iterdir() if p.name.isdigit()) == [3, 4]
  shutil.rmtree(where / "4")
  p4c, _, _, o = B.train_arm(str(stopped), k, cfg, progs, True, train, every=3, steps=4, **kw)
  assert o["from_step"] == 3 and [x["steps"] for x in o["continued"]] == [3, 4]
  chex.assert_trees_all_close(p4c, p4, rtol=1e-6, atol=1e-7)


def test_snapshot_config_gains_new_fields_at_their_defaults(repo_root):
  """A snapshot saved before a config field existed is the same configuration as the field
  at its default (it trained as the default does), and another with the field set."""
  sys.path.insert(0, str(repo_root / "experiments"))
  import bench_compression as B

  from sao_jax import config as config_lib
  from sao_jax.config import load_config

  cfg = load_config(str(repo_root / "experiments/configs/longhorizon.py:tiny"))
  resolved = json.loads(json.dumps(config_lib.to_dict(cfg)))
  assert resolved["compression"]["salient_turning"] is True
  old = json.loads(json.dumps(resolved))
  del old["compression"]["salient_turning"]
  assert B._with_new_defaults(old) != resolved  # trained without the gate
  unc = json.loads(json.dumps(config_lib.to_dict(B.uncompressed_cfg(cfg, 12))))
  old_unc = json.loads(json.dumps(unc))
  del old_unc["compression"]["salient_turning"]
  assert B._with_new_defaults(old_unc) == unc  # the control never had it
  assert B._with_new_defaults(dict(old, model={"width": 7}))["model"]["width"] == 7


def test_long_accuracy_keeps_finished_arms(repo_root):
  """A resumed 1,000-step accuracy keeps the arms a stopped run finished (no evaluation: the
  arms here could not run) and still pairs them question by question; a `done` of other
  episodes keeps nothing."""
  sys.path.insert(0, str(repo_root / "experiments"))
  import bench_compression as B

  from sao_jax.envs.longhorizon import LongHorizonSpec, make_split

  spec = LongHorizonSpec("retention", n_steps=40, n_facts=2, min_gap=8, p_noise=0.1, period=0)
  tasks = make_split(spec, "test", 2, 2)
  n = sum(len(B.question_facts(t)) for t in tasks)
  arms = {k: (None, None, None, None, True) for k in ("compressed", "uncompressed_memory")}
  done = {"episodes": 2, "questions": n, "control_context_tokens": 8}
  done["compressed"] = {"accuracy": 1.0, "correct": [1.0] * n, "seconds": 3.0}
  done["uncompressed_memory"] = {"accuracy": 0.5, "correct": [1.0, 0.0] * (n // 2)}
  calls = []
  out = B.long_accuracy(arms, tasks, length=8, done=done, on_arm=calls.append)
  assert out["compressed"] == done["compressed"] and not calls
  v = out["vs_uncompressed"]
  assert (v["control_right_other_wrong"], v["other_right_control_wrong"]) == (0, n // 2)
  with pytest.raises((AttributeError, TypeError)):  # other episodes: measured, not kept
    B.long_accuracy(arms, tasks[:1], length=8, done=done)


def test_growing_window_and_cached_memory_greedy_equal_the_whole_window(repo_root):
  """A policy that keeps every step (the stage-1 control) run with windows that grow with
  its bank (`lh_common._growing_greedy`), and with its memory's keys and values kept between
  steps (`lh_common._cached_greedy`, the default for such a bank), plays the same episodes as
  with every slot from step 0: the same tokens and rewards, log-probs equal up to float
  summation order."""
  sys.path.insert(0, str(repo_root / "experiments"))
  import bench_compression as B
  import jax
  import lh_common as L
  import numpy as np

  from sao_jax.config import load_config
  from sao_jax.envs.longhorizon import LongHorizonSpec, make_split

  n = 32
  spec = LongHorizonSpec("retention", n_steps=n, n_facts=4, min_gap=8, p_noise=0.1, period=10)
  tasks = make_split(spec, "test", 3, 1)
  cfg = B.uncompressed_cfg(
    load_config(str(repo_root / "experiments/configs/longhorizon.py:tiny")), n
  )
  progs, pol = L.build(cfg, True)
  params = progs.init(jax.random.key(0)).params
  kw = dict(length=64)
  whole = L.evaluate(cfg, progs, pol, params, tasks, True, greedy=progs.greedy, **kw)
  grown = L._growing_greedy(cfg, progs, bucket=8)
  growing = L.evaluate(cfg, progs, pol, params, tasks, True, greedy=grown, **kw)
  assert pol.shares_bank() and progs.greedy_cached is not None
  cached = L.evaluate(cfg, progs, pol, params, tasks, True, **kw)  # the default here
  assert sorted(grown.programs) == [8, 16, 24, 32]  # 32 = visible: progs.greedy
  for other in (growing, cached):
    assert other[0] == whole[0]
    for a, b in zip(whole[1], other[1], strict=True):
      np.testing.assert_array_equal(a.tokens, b.tokens)
      np.testing.assert_array_equal(a.rewards, b.rewards)
      np.testing.assert_allclose(a.logp, b.logp, atol=1e-5)
  assert L._growing_greedy(B.uncompressed_cfg(cfg, 8), progs, bucket=8) is progs.greedy


def test_table_prints_a_control_only_run(repo_root, capsys):
  """The closing tables of a run of the stage-1 control alone (`--arms uncompressed_memory`
  with the 1,000-step accuracy: no bytes, those need the compressed arm) print what it has."""
  sys.path.insert(0, str(repo_root / "experiments"))
  import bench_compression as B

  by_gap = {"32-64": {"questions": 2, "accuracy": 0.5}}
  arm = {"accuracy": 0.5, "questions": 2, "stderr": 0.35, "wilson95": [0.1, 0.9]}
  la = {"episodes": 1, "questions": 2, "uncompressed_memory": dict(arm, by_gap=by_gap)}
  t = {"chance": 0.1, "arms": {"uncompressed_memory": arm}}
  t["bytes_per_stage"] = {"steps": 1000, "long_accuracy": la}
  B._table({"tasks": {"navigation8": t}})
  out = capsys.readouterr().out
  assert "| navigation8 | uncompressed_memory | 0.500 +- 0.350 | 32-64: 0.50 (2) |" in out
  assert "| navigation8 | uncompressed_memory | 2 | 0.10 | 0.500 +- 0.350 [0.100, 0.900] |" in out


@pytest.mark.slow
def test_bank_occupancy_reads_saved_parameters_under_both_filters(tmp_path, repo_root):
  """experiments/bank_occupancy.py on a snapshot bench_compression saved: per filter setting,
  every question counted once by the bank entries when asked, and the final banks' kinds
  adding up to their entries. experiments/salience_threshold.py on the same snapshot: each
  threshold's bank from the snapshot's own configuration, and the rule's choice."""
  sys.path.insert(0, str(repo_root / "experiments"))
  import bank_occupancy
  import bench_compression as B
  import lh_common as L

  from sao_jax.config import load_config
  from sao_jax.envs.longhorizon import make_split

  config = str(repo_root / "experiments/configs/longhorizon.py:tiny")
  mod = B._config_module(config)
  cfg = load_config(config)
  cfg = dataclasses.replace(cfg, sft=dataclasses.replace(cfg.sft, batch_size=8))  # 8 devices
  train = make_split(mod.TRAIN_TASKS["tiny"]["retention"], "train", 16, 0, num_test=8)
  progs, _ = L.build(cfg, True)
  key = {"task": "retention", "arm": "compressed", "seed": 3, "steps": 2}
  B.train_arm(str(tmp_path), key, cfg, progs, True, train, steps=2, length=0, seed=3)
  out = tmp_path / "occ.json"
  argv = ["--config", config, "--task", "retention", "--params-dir", str(tmp_path)]
  argv += ["--steps", "2", "--episodes", "2", "--long-steps", "60"]
  r = bank_occupancy.main(argv + ["--salient-turning", "trained,off", "--out", str(out)])
  assert json.loads(out.read_text())["runs"] == json.loads(json.dumps(r["runs"]))
  trained, off = r["runs"]
  assert trained["trained_salient_turning"] is True and trained["salient_turning"] is True
  assert off["salient_turning"] is False and trained["seed"] == 3
  for run in r["runs"]:
    assert run["questions"] == 2 * 8 and run["step"] == 2
    assert sum(b["questions"] for b in run["by_entries_when_asked"].values()) == 16
    assert run["accuracy"] == pytest.approx(1 - run["wrong"] / 16)
    assert 0 < run["entries_mean"] <= cfg.compression.capacity
    assert sum(run["final_bank_per_episode"].values()) == pytest.approx(run["entries_mean"])
  # salience_threshold.py: the same snapshot at the trained threshold and at 0 (every step a
  # candidate, ranked): the bank at 0 holds at least as many entries; the choice is the largest
  # threshold meeting --min-kept in every seed, none when none does.
  import salience_threshold

  argv = ["--config", config, "--task", "retention", "--params-dir", str(tmp_path)]
  argv += ["--steps", "2", "--episodes", "8", "--long-steps", "60", "--thresholds", "0.5,0"]
  out = tmp_path / "thr.json"
  r = salience_threshold.main(argv + ["--min-kept", "0", "--out", str(out)])
  assert json.loads(out.read_text())["rows"] == r["rows"]
  at5, at0 = r["rows"]
  assert (at5["seed"], at5["step"], at5["trained_threshold"]) == (3, 2, 0.5)
  assert (at5["salience_threshold"], at0["salience_threshold"]) == (0.5, 0.0)
  assert at0["kept_steps_mean"] >= at5["kept_steps_mean"] > 0
  assert r["chosen"] == 0.5 and r["split"] == "train"
  assert salience_threshold.choose(r["rows"], 1.01) is None
  rows = [
    {"salience_threshold": 0.5, "facts_kept_frac": 1.0},
    {"salience_threshold": 0.5, "facts_kept_frac": 0.9},  # another seed
    {"salience_threshold": 0.1, "facts_kept_frac": 1.0},
    {"salience_threshold": 0.1, "facts_kept_frac": 1.0},
  ]
  assert salience_threshold.choose(rows, 1.0) == 0.1 and salience_threshold.choose(rows, 0.9) == 0.5
