"""experiments/bench_compression.py --quick runs end to end and writes a consistent result."""

from __future__ import annotations

import dataclasses
import json
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
  import bench_compression

  capsys.readouterr()
  with pytest.raises(SystemExit) as exit_:
    bench_compression.main(["--quick", *flags])
  assert exit_.value.code == 2
  return capsys.readouterr().err


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
  from sao_jax.bench.arm_snapshots import train_arm

  with pytest.raises(SystemExit, match="pass another --params-dir"):
    train_arm(
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
    train_arm(str(params_dir), key, cfg, None, True, [])
  # The same file in a copy of the checkout elsewhere passes the settings check (it is the
  # resolved configuration that is compared, and here refused).
  moved = dict(key, config="/elsewhere/experiments/configs/longhorizon.py:tiny")
  with pytest.raises(SystemExit, match="another configuration"):
    train_arm(str(params_dir), moved, cfg, None, True, [])
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
  from sao_jax.bench.arm_snapshots import train_arm
  from sao_jax.config import load_config
  from sao_jax.envs.longhorizon import make_split
  from sao_jax.runners import memory_lab as L

  mod = L.config_module(str(repo_root / "experiments/configs/longhorizon.py"))
  cfg = load_config(str(repo_root / "experiments/configs/longhorizon.py:tiny"))
  cfg = dataclasses.replace(cfg, sft=dataclasses.replace(cfg.sft, batch_size=8))  # 8 devices
  train = make_split(mod.TRAIN_TASKS["tiny"]["retention"], "train", 16, 0, num_test=8)
  length = L.full_len(train)
  progs, _ = L.build(cfg, True, full_len=length)
  key = {"task": "retention", "arm": "compressed", "seed": 0}
  kw = dict(length=length, seed=0)

  def arm(steps):
    k = dict(key, steps=steps)
    return train_arm(str(tmp_path), k, cfg, progs, True, train, steps=steps, **kw)

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
  train_arm(str(stopped), k, cfg, progs, True, train, every=3, steps=4, **kw)
  where = stopped / "retention" / "compressed"
  assert sorted(int(p.name) for p in where.iterdir() if p.name.isdigit()) == [3, 4]
  shutil.rmtree(where / "4")
  p4c, _, _, o = train_arm(str(stopped), k, cfg, progs, True, train, every=3, steps=4, **kw)
  assert o["from_step"] == 3 and [x["steps"] for x in o["continued"]] == [3, 4]
  chex.assert_trees_all_close(p4c, p4, rtol=1e-6, atol=1e-7)


def test_snapshot_config_gains_new_fields_at_their_defaults(repo_root):
  """A snapshot saved before a config field existed is the same configuration as the field
  at its default (it trained as the default does), and another with the field set."""
  from sao_jax import config as config_lib
  from sao_jax.bench.compression import uncompressed_cfg
  from sao_jax.config import load_config

  cfg = load_config(str(repo_root / "experiments/configs/longhorizon.py:tiny"))
  resolved = json.loads(json.dumps(config_lib.to_dict(cfg)))
  assert resolved["compression"]["salient_turning"] is True
  old = json.loads(json.dumps(resolved))
  del old["compression"]["salient_turning"]
  assert config_lib.upgrade(old) != resolved  # trained without the gate
  unc = json.loads(json.dumps(config_lib.to_dict(uncompressed_cfg(cfg, 12))))
  old_unc = json.loads(json.dumps(unc))
  del old_unc["compression"]["salient_turning"]
  assert config_lib.upgrade(old_unc) == unc  # the control never had it
  assert config_lib.upgrade(dict(old, model={"width": 7}))["model"]["width"] == 7


def test_long_accuracy_keeps_finished_arms(repo_root):
  """A resumed 1,000-step accuracy keeps the arms a stopped run finished (no evaluation: the
  arms here could not run) and still pairs them question by question; a `done` of other
  episodes keeps nothing."""
  from sao_jax.bench.compression_accuracy import long_accuracy
  from sao_jax.bench.recall import question_facts
  from sao_jax.envs.longhorizon import LongHorizonSpec, make_split

  spec = LongHorizonSpec("retention", n_steps=40, n_facts=2, min_gap=8, p_noise=0.1, period=0)
  tasks = make_split(spec, "test", 2, 2)
  n = sum(len(question_facts(t)) for t in tasks)
  arms = {k: (None, None, None, None, True) for k in ("compressed", "uncompressed_memory")}
  done = {"episodes": 2, "questions": n, "control_context_tokens": 8}
  done["compressed"] = {"accuracy": 1.0, "correct": [1.0] * n, "seconds": 3.0}
  done["uncompressed_memory"] = {"accuracy": 0.5, "correct": [1.0, 0.0] * (n // 2)}
  calls = []
  out = long_accuracy(arms, tasks, length=8, done=done, on_arm=calls.append)
  assert out["compressed"] == done["compressed"] and not calls
  v = out["vs_uncompressed"]
  assert (v["control_right_other_wrong"], v["other_right_control_wrong"]) == (0, n // 2)
  with pytest.raises((AttributeError, TypeError)):  # other episodes: measured, not kept
    long_accuracy(arms, tasks[:1], length=8, done=done)


def test_growing_window_and_cached_memory_greedy_equal_the_whole_window(repo_root):
  """A policy that keeps every step (the stage-1 control) run with windows that grow with
  its bank (`memory_lab.growing_greedy`), and with its memory's keys and values kept between
  steps (`memory_lab.cached_greedy`, the default for such a bank), plays the same episodes as
  with every slot from step 0: the same tokens and rewards, log-probs equal up to float
  summation order."""
  import jax

  from sao_jax.bench.compression import uncompressed_cfg
  from sao_jax.config import load_config
  from sao_jax.envs.longhorizon import LongHorizonSpec, make_split
  from sao_jax.runners import memory_lab as L

  n = 32
  spec = LongHorizonSpec("retention", n_steps=n, n_facts=4, min_gap=8, p_noise=0.1, period=10)
  tasks = make_split(spec, "test", 3, 1)
  cfg = uncompressed_cfg(load_config(str(repo_root / "experiments/configs/longhorizon.py:tiny")), n)
  progs, pol = L.build(cfg, True)
  params = progs.init(jax.random.key(0)).params
  kw = dict(length=64)
  whole = L.evaluate(cfg, progs, pol, params, tasks, True, greedy=progs.greedy, **kw)
  grown = L.growing_greedy(cfg, progs, bucket=8)
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
  assert L.growing_greedy(uncompressed_cfg(cfg, 8), progs, bucket=8) is progs.greedy


def test_table_prints_a_control_only_run(repo_root, capsys):
  """The closing tables of a run of the stage-1 control alone (`--arms uncompressed_memory`
  with the 1,000-step accuracy: no bytes, those need the compressed arm) print what it has."""
  from sao_jax.bench.compression_report import print_tables

  by_gap = {"32-64": {"questions": 2, "accuracy": 0.5}}
  arm = {"accuracy": 0.5, "questions": 2, "stderr": 0.35, "wilson95": [0.1, 0.9]}
  la = {"episodes": 1, "questions": 2, "uncompressed_memory": dict(arm, by_gap=by_gap)}
  t = {"chance": 0.1, "arms": {"uncompressed_memory": arm}}
  t["bytes_per_stage"] = {"steps": 1000, "long_accuracy": la}
  print_tables({"tasks": {"navigation8": t}})
  out = capsys.readouterr().out
  assert "| navigation8 | uncompressed_memory | 0.500 +- 0.350 | 32-64: 0.50 (2) |" in out
  assert "| navigation8 | uncompressed_memory | 2 | 0.10 | 0.500 +- 0.350 [0.100, 0.900] |" in out


@pytest.mark.slow
def test_bank_occupancy_reads_saved_parameters_under_both_filters(tmp_path, repo_root):
  """experiments/bank_occupancy.py on a snapshot bench_compression saved: per filter setting,
  every question counted once by the bank entries when asked, and the final banks' kinds
  adding up to their entries. experiments/salience_threshold.py on the same snapshot: each
  threshold's bank from the snapshot's own configuration, and the rule's choice."""
  import bank_occupancy

  from sao_jax.bench.arm_snapshots import train_arm
  from sao_jax.config import load_config
  from sao_jax.envs.longhorizon import make_split
  from sao_jax.runners import memory_lab as L

  config = str(repo_root / "experiments/configs/longhorizon.py:tiny")
  mod = L.config_module(config)
  cfg = load_config(config)
  cfg = dataclasses.replace(cfg, sft=dataclasses.replace(cfg.sft, batch_size=8))  # 8 devices
  train = make_split(mod.TRAIN_TASKS["tiny"]["retention"], "train", 16, 0, num_test=8)
  progs, _ = L.build(cfg, True)
  key = {"task": "retention", "arm": "compressed", "seed": 3, "steps": 2}
  train_arm(str(tmp_path), key, cfg, progs, True, train, steps=2, length=0, seed=3)
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
