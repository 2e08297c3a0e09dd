"""experiments/bench_sync_vs_async.py's method, piece by piece: time to a target interpolated
between evaluations, the best synchronous baseline, per-seed ratios with censoring and a
bootstrap interval; and the pieces of the library it relies on: the memory of a process tree
and deferred held-out evaluation. (Its end-to-end runs are the benchmark itself: each arm is a
`sao-jax train` process, which the end-to-end tests of those runs cover.)"""

from __future__ import annotations

import json
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from sao_jax import procs, stats
from sao_jax.bench import sync_vs_async
from sao_jax.runners.common import PhaseClock


@pytest.fixture(scope="module")
def bench(experiment):
  return experiment("bench_sync_vs_async")


def test_time_to_target_is_interpolated_between_evaluations():
  curve = [(0.0, 0, 0.40), (10.0, 5, 0.50), (20.0, 9, 0.70), (30.0, 14, 0.65)]
  assert sync_vs_async.time_to(curve, 0.60) == pytest.approx(15.0)  # halfway from 0.50 to 0.70
  assert sync_vs_async.time_to(curve, 0.70) == pytest.approx(20.0)
  assert sync_vs_async.time_to(curve, 0.30) == 0.0  # already there at the first evaluation
  assert sync_vs_async.time_to(curve, 0.71) is None  # never


def _run(seed, sao_steps, grpo_steps, samplers_steps, sao_curve, acc=0.6):
  def arm(steps, curve, accuracy):
    return {
      "steps": steps,
      "seconds": 100.0,
      "learner_steps_per_s": steps / 100.0,
      "trajectories_per_s": 1.28 * steps,
      "accuracy": accuracy,
      "eval_curve": curve,
    }

  grpo_curve = [(0.0, 0, 0.4), (100.0, 10, acc)]
  return {
    "seed": seed,
    "sft": {"accuracy": 0.4},
    "sao": arm(sao_steps, sao_curve, sao_curve[-1][2]),
    "grpo": arm(grpo_steps, grpo_curve, acc),
    "grpo_samplers": arm(samplers_steps, grpo_curve, acc),
  }


def test_baseline_is_the_faster_grpo_and_ratios_carry_a_bootstrap_interval():
  runs = [
    _run(0, 30, 10, 12, [(0.0, 0, 0.4), (50.0, 15, 0.6), (100.0, 30, 0.7)]),
    _run(1, 33, 11, 12, [(0.0, 0, 0.4), (40.0, 13, 0.6), (100.0, 33, 0.7)]),
    _run(2, 27, 9, 13, [(0.0, 0, 0.4), (60.0, 16, 0.6), (100.0, 27, 0.7)]),
  ]
  sm = sync_vs_async.summarize(runs, ["grpo", "grpo_samplers", "sao"])
  assert sm["baseline"]["arm"] == "grpo_samplers"  # 0.123 steps/s against 0.1
  r = sm["ratio"]
  assert (r["numerator"], r["denominator"]) == ("sao", "grpo_samplers")
  assert r["learner_steps_per_s"]["values"] == pytest.approx([30 / 12, 33 / 12, 27 / 13])
  # The baseline reaches its own final accuracy at its last evaluation (100 s); SAO at 50,
  # 40 and 60 s.
  assert r["time_to_target_s"]["values"] == pytest.approx([0.5, 0.4, 0.6])
  assert r["time_to_target_s"]["censored"] == 0
  lo, hi = r["time_to_target_s"]["bootstrap95"]
  assert 0.4 <= lo < 0.5 < hi <= 0.6
  assert sm["ratio_vs_grpo"]["learner_steps_per_s"]["values"] == pytest.approx([3.0, 3.0, 3.0])
  assert sm["ratio_vs_grpo"]["learner_steps_per_s"]["bootstrap95"] is None  # no spread
  # Each seed carries its own ratios, the unit a declared analysis reads.
  assert runs[1]["vs_baseline"]["arm"] == "grpo_samplers"
  assert runs[1]["vs_baseline"]["time_to_target_s"] == pytest.approx(0.4)


def test_an_arm_that_never_reaches_the_target_is_censored_at_its_budget():
  runs = [
    _run(0, 30, 10, 12, [(0.0, 0, 0.4), (100.0, 30, 0.5)]),  # SAO stays below 0.6
    _run(1, 30, 10, 12, [(0.0, 0, 0.4), (50.0, 15, 0.6), (100.0, 30, 0.6)]),
  ]
  sm = sync_vs_async.summarize(runs, ["grpo", "sao"])
  assert sm["baseline"]["arm"] == "grpo"
  t = sm["ratio"]["time_to_target_s"]
  assert t["values"] == pytest.approx([1.0, 0.5]) and t["censored"] == 1
  assert runs[0]["sao"]["reached_target"] is False and runs[1]["sao"]["reached_target"]


def test_bootstrap_interval_of_the_mean():
  ci = stats.bootstrap_ci([0.5, 0.6, 0.55, 0.7, 0.52])
  assert ci == stats.bootstrap_ci([0.5, 0.6, 0.55, 0.7, 0.52])  # a fixed generator
  assert 0.5 <= ci[0] < np.mean([0.5, 0.6, 0.55, 0.7, 0.52]) < ci[1] <= 0.7
  assert stats.bootstrap_ci([0.5]) is None


def test_tree_memory_counts_every_process_of_the_tree_once():
  """A parent holding ~80 MiB with a child holding ~40 MiB: the tree's peak PSS holds both;
  pages they share (the interpreter, numpy) count once."""
  code = (
    "import numpy as np, subprocess, sys, time; a = np.ones(10_000_000); "
    "c = subprocess.Popen([sys.executable, '-c', 'import numpy as np, time; "
    "b = np.ones(5_000_000); time.sleep(2.5)']); c.wait()"
  )
  proc = subprocess.Popen([sys.executable, "-c", code])
  peak = procs.TreeMemoryPeak(proc.pid, interval=0.1).start()
  proc.wait()
  m = peak.stop()
  assert m["processes_peak"] == 2 and m["samples"] >= 5
  assert 120 < m["pss_peak_mb"] < m["rss_peak_mb"] < 400, m
  assert procs.tree_memory_mb(proc.pid)["processes"] == 0  # gone


def test_deferred_evals_save_the_parameters_and_run_after_the_phase(tmp_path):
  seen = []

  def eval_fn(params):
    seen.append(float(params["w"][0]))
    return {"accuracy": float(params["w"][0]) / 10}

  clock = PhaseClock(0, 0.0, 1e-9, eval_fn, defer_dir=tmp_path / "d")
  for step in range(3):
    assert clock.maybe_eval(step, {"w": jnp.full((2,), float(step))}, force=True) == {}
  assert seen == [] and len(list((tmp_path / "d").iterdir())) == 3
  assert clock.eval_seconds > 0  # saving is not training time either
  clock.run_deferred({"w": jnp.zeros((2,))})
  final = clock.maybe_eval(3, {"w": jnp.full((2,), 3.0)}, final=True)
  assert seen == [0.0, 1.0, 2.0, 3.0] and final["eval_accuracy"] == pytest.approx(0.3)
  assert [round(a, 2) for _, _, a in clock.curve] == [0.0, 0.1, 0.2, 0.3]
  assert [s for _, s, _ in clock.curve] == [0, 1, 2, 3]
  assert not list((tmp_path / "d").iterdir())  # removed once evaluated
  # One saved at the phase's last step is left to the closing eval: evaluated once.
  seen.clear()
  clock.maybe_eval(4, {"w": jnp.full((2,), 4.0)}, force=True)
  clock.run_deferred({"w": jnp.zeros((2,))}, skip_step=4)
  clock.maybe_eval(4, {"w": jnp.full((2,), 4.0)}, final=True)
  assert seen == [4.0] and [s for _, s, _ in clock.curve] == [0, 1, 2, 3, 4]
  assert not list((tmp_path / "d").iterdir())


def test_deferred_evals_need_one_learner_process(repo_root):
  from sao_jax.config import ConfigError
  from sao_jax.setup import load_config

  sets = ["distributed.coordinator=127.0.0.1:1234", "distributed.num_processes=2"]
  with pytest.raises(ConfigError, match="eval.deferred saves the parameters from one"):
    load_config(
      str(repo_root / "experiments/configs/sao_arith.py"), "tiny", ["eval.deferred=True", *sets]
    )


def test_per_arm_overrides_are_checked_before_any_run(bench, tmp_path):
  from sao_jax.config import ConfigError

  out = ["--out", str(tmp_path / "o"), "--workdir", str(tmp_path / "w"), "--variant", "tiny"]
  with pytest.raises(SystemExit, match="--arm-set takes ARM:KEY=VALUE"):
    bench.main([*out, "--arm-set", "ppo:rl.optim.lr=1e-4"])
  with pytest.raises(ConfigError, match="nope"):
    bench.main([*out, "--arm-set", "sao:rl.nope=1"])
  assert not (tmp_path / "o").exists() and not (tmp_path / "w").exists()  # nothing started


def test_length_histograms_pool_over_seeds_and_the_notebook_plots_them(tmp_path):
  """Each arm's completion lengths, every seed pooled (their bins end at different
  lengths), in the summary; the claim notebook's plot finds them under a results root."""
  from sao_jax.analysis import plots

  runs = [
    _run(0, 30, 10, 12, [(0.0, 0, 0.4), (100.0, 30, 0.7)]),
    _run(1, 30, 10, 12, [(0.0, 0, 0.4), (100.0, 30, 0.7)]),
  ]
  runs[0]["sao"]["length_hist"] = stats.length_histogram([3, 9, 9, 40])
  runs[1]["sao"]["length_hist"] = stats.length_histogram([5, 20, 100])
  assert runs[0]["sao"]["length_hist"]["edges"] == [0, 8, 16, 32, 64]
  sm = sync_vs_async.summarize(runs, ["grpo", "sao"])
  assert sm["sao"]["length_hist"] == {
    "edges": [0, 8, 16, 32, 64, 128],
    "counts": [2, 2, 1, 1, 1],
  }
  assert "length_hist" not in sm["grpo"]  # no arm invents one
  assert stats.merge_length_histograms([]) == {"edges": [], "counts": []}

  law = stats.length_summary([10, 10, 10, 10, 60])
  assert law["max_over_mean"] == pytest.approx(3.0) and sum(law["histogram"]["counts"]) == 5
  (tmp_path / "bench_x").mkdir()
  doc = {"summary": sm, "target_lengths": law, "runs": runs}
  (tmp_path / "bench_x" / "results.json").write_text(json.dumps(doc))
  (tmp_path / "other").mkdir()
  (tmp_path / "other" / "results.json").write_text('{"summary": {"sao": {}}}')
  assert [name for name, _ in plots.length_histograms(tmp_path)] == ["bench_x"]
  fig = plots.plot_lengths(tmp_path)
  ax = fig.axes[0]
  assert {t.get_text() for t in ax.get_legend().get_texts()} == {"solutions (law)", "sao"}
  assert plots.plot_lengths(tmp_path / "other") is None


def test_target_lengths_are_the_declared_law_in_data(bench, repo_root):
  from sao_jax.setup import load_config

  cfg = load_config(str(repo_root / "experiments/configs/sao_chain.py"), "tiny")
  law = bench.target_lengths(cfg)
  assert law["n"] == cfg.task.num_train
  assert law["max"] >= 8 * 9 and sum(law["histogram"]["counts"]) == law["n"]
