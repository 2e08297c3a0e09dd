"""Sweeps (sao_jax.sweep, sao_jax.sweep_report) and seed statistics (sao_jax.stats).

Fast tests: validation, the axis -> Optuna mapping, the report writers on synthetic rows, and
the driver with a stand-in trainer (tests/sweep_fake_train.py, no JAX): statuses, pruning,
process groups, and resume after `kill -9`. The slow end-to-end test with real `sao-jax
train` trials is in test_sweep_e2e.py.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest
from conftest import REPO_ROOT, subprocess_env
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from sao_jax import config as config_lib
from sao_jax import stats, sweep_report
from sao_jax.config import ConfigError
from sao_jax.sweep import (
  Choice,
  IntRange,
  LogUniform,
  Pruning,
  Sweep,
  SweepRunner,
  Uniform,
  check_against_base,
  kill_leftovers,
  load_sweep,
  lookup,
  trial_overrides,
  trial_processes,
)

BASE = "experiments/configs/arith_grpo.py:tiny"
FAKE = str(pathlib.Path(__file__).with_name("sweep_fake_train.py"))


def _sweep(**kw) -> Sweep:
  kw = {
    "name": "t",
    "config": BASE,
    "axes": (Choice("rl.optim.lr", (0.1, 0.2)),),
    "strategy": "grid",
    **kw,
  }
  return Sweep(**kw)


# -- statistics ----------------------------------------------------------------------------------


def test_seed_stats_values():
  s = stats.seed_stats([1.0, 2.0, 3.0])
  assert s.n == 3 and s.mean == 2.0
  assert s.se == pytest.approx(1 / math.sqrt(3))
  t = 4.302652729911275  # t_{0.975, 2}
  assert s.ci_low == pytest.approx(2 - t / math.sqrt(3))
  assert s.ci_high == pytest.approx(2 + t / math.sqrt(3))
  assert stats.t_quantile(0.95, 1000) == pytest.approx(1.962, abs=1e-3)
  assert stats.t_quantile(0.90, 4) == pytest.approx(2.131847, abs=1e-6)
  one = stats.seed_stats([0.5])
  assert one.mean == 0.5 and math.isnan(one.se) and math.isnan(one.ci_low)
  assert stats.seed_stats([]).n == 0
  assert "n=3" in str(s) and "95%" in str(s)
  with pytest.raises(ValueError, match="finite"):
    stats.seed_stats([1.0, float("nan")])
  # A signed format signs the mean, never the standard error.
  assert stats.fmt(stats.summarize([-1.0, 1.0, 3.0]), "{:+.1f}") == "+1.0 ± 1.2"
  assert stats.fmt(stats.summarize([])) == "-"


# -- the sweep file ------------------------------------------------------------------------------


@pytest.mark.parametrize(
  "make, message",
  [
    (lambda: {"name": "a b"}, "letters, digits"),
    (lambda: {"axes": (Choice("x", (1,)), Choice("x", (2,)))}, "repeat a key"),
    (lambda: {"axes": (Choice("seed", (1, 2)),)}, "seed is not an axis"),
    (lambda: {"fixed": ("seed=3",)}, "seed cannot be fixed"),
    (lambda: {"fixed": ("rl.optim.lr=1.0",)}, "both fixed and an axis"),
    (lambda: {"fixed": ("rl.steps",)}, "key=value"),
    (lambda: {"axes": (Uniform("rl.optim.lr", 0.1, 0.2),)}, "no grid"),
    (lambda: {"strategy": "tpe"}, "needs a budget"),
    (lambda: {"strategy": "bayes", "points": 3}, "unknown"),
    (lambda: {"points": 3}, "> the grid's 2 points"),
    (lambda: {"direction": "up"}, "maximize or minimize"),
    (lambda: {"metric": "rl..accuracy"}, "dotted path"),
    (lambda: {"seeds": 0}, "seeds must be >= 1"),
    (lambda: {"axes": (Choice("x", ()),)}, "at least one value"),
    (lambda: {"axes": (Choice("x", (1, 1)),)}, "repeat"),
    (lambda: {"axes": (Choice("x", ([1],)),)}, "numbers, strings"),
    (lambda: {"axes": (Uniform("x", 1.0, 1.0),), "strategy": "random", "points": 2}, "low < high"),
    (lambda: {"axes": (LogUniform("x", 0.0, 1.0),), "strategy": "random", "points": 2}, "low > 0"),
    (lambda: {"axes": (IntRange("x", 1, 4, step=2),)}, "multiple of step"),
    (lambda: {"axes": (IntRange("x", 0, 4, log=True),)}, "low >= 1"),
    (lambda: {"pruning": Pruning(kind="hyper")}, "pruning.kind"),
    (lambda: {"report": ("status",)}, "clash with the table's own columns"),
    (lambda: {"shared_sft": True, "axes": (Choice("sft.steps", (1, 2)),)}, "change the SFT"),
    (lambda: {"shared_sft": True, "fixed": ("init_from='x'",)}, "do not fix it"),
    (lambda: {"trial_fixed": ("sft.max_seconds=5",)}, "for shared_sft sweeps"),
    (lambda: {"shared_sft": True, "trial_fixed": ("init_from='x'",)}, "cannot set init_from"),
    (lambda: {"shared_sft": True, "trial_fixed": ("rl.optim.lr=1",)}, "both trial_fixed and"),
    (
      lambda: {
        "shared_sft": True,
        "trial_fixed": ("rl.max_seconds=5",),
        "axes": (Choice("sft.optim.lr", (1e-4, 3e-4)),),
      },
      "change the SFT",
    ),
  ],
)
def test_sweep_validation(make, message):
  """Each bad sweep (or axis: built inside `make`) fails on construction, naming the problem."""
  with pytest.raises(ConfigError, match=message):
    _sweep(**make())


def test_axes_map_to_optuna_distributions():
  axes = (
    Choice("sao.is_cap", (1.5, 2.0)),
    Uniform("rl.temperature", 0.5, 1.5),
    LogUniform("rl.optim.lr", 1e-5, 1e-3),
    IntRange("sao.max_staleness", 0, 8, step=2),
    IntRange("sft.steps", 1, 100, log=True),
  )
  s = Sweep(name="m", config=BASE, axes=axes, strategy="tpe", points=3)
  d = s.distributions()
  assert d["sao.is_cap"] == CategoricalDistribution((1.5, 2.0))
  assert d["rl.temperature"] == FloatDistribution(0.5, 1.5, log=False)
  assert d["rl.optim.lr"] == FloatDistribution(1e-5, 1e-3, log=True)
  assert d["sao.max_staleness"] == IntDistribution(0, 8, step=2)
  assert d["sft.steps"] == IntDistribution(1, 100, log=True)
  assert axes[3].grid() == (0, 2, 4, 6, 8)
  assert [type(a).__name__ for a in s.axes] == [x["kind"] for x in s.to_dict()["axes"]]
  g = Sweep(
    name="g",
    config=BASE,
    strategy="grid",
    seeds=3,
    axes=(Choice("sao.is_cap", (1.5, 2.0)), IntRange("sao.max_staleness", 1, 3)),
  )
  assert g.grid_size() == 6 and g.num_trials == 18
  assert g.grid()[:2] == [
    {"sao.is_cap": 1.5, "sao.max_staleness": 1},
    {"sao.is_cap": 1.5, "sao.max_staleness": 2},
  ]


def test_one_at_a_time_varies_one_axis_from_the_base_point():
  o = Sweep(
    name="o",
    config=BASE,
    strategy="oat",
    seeds=3,
    axes=(Choice("sao.is_cap", (2.0, 1.5, 4.0)), IntRange("sao.max_staleness", 4, 6)),
  )
  base = {"sao.is_cap": 2.0, "sao.max_staleness": 4}
  assert o.grid_size() == 1 + 2 + 2 and o.num_trials == 15
  assert o.grid() == [
    base,
    dict(base, **{"sao.is_cap": 1.5}),
    dict(base, **{"sao.is_cap": 4.0}),
    dict(base, **{"sao.max_staleness": 5}),
    dict(base, **{"sao.max_staleness": 6}),
  ]
  with pytest.raises(ConfigError, match="> the grid's 5 points"):
    dataclasses.replace(o, points=6)
  with pytest.raises(ConfigError, match="'oat' needs at least one axis"):
    dataclasses.replace(o, axes=())


def test_overrides_round_trip_through_the_config(repo_root, monkeypatch):
  monkeypatch.chdir(repo_root)
  s = Sweep(
    name="o",
    config=BASE,
    fixed=("rl.steps=3",),
    strategy="grid",
    axes=(
      Choice("tokenizer", ("char",)),
      Choice("rl.optim.lr", (3e-4,)),
      Choice("task.reverse_digits", (True,)),
    ),
  )
  params = {"tokenizer": "char", "rl.optim.lr": 3e-4, "task.reverse_digits": True}
  o = trial_overrides(s, params, seed=2)
  assert o == [
    "rl.steps=3",
    "tokenizer='char'",
    "rl.optim.lr=0.0003",
    "task.reverse_digits=True",
    "seed=2",
  ]
  cfg = config_lib.load_config(BASE, overrides=o)
  assert (cfg.rl.steps, cfg.rl.optim.lr, cfg.task.reverse_digits, cfg.seed) == (3, 3e-4, True, 2)
  # Seeds disjoint from another experiment's: the run's seed is first_seed + the index.
  assert trial_overrides(dataclasses.replace(s, first_seed=100), params, seed=2)[-1] == "seed=102"
  assert lookup({"rl": {"accuracy": 0.5}}, "rl.accuracy") == 0.5
  with pytest.raises(KeyError, match="no 'acc'"):
    lookup({"rl": {}}, "rl.acc")


def test_check_against_base_names_the_problem(repo_root, monkeypatch):
  monkeypatch.chdir(repo_root)
  base = repo_root / "experiments/configs/arith_grpo.py"
  with pytest.raises(ConfigError, match="axis rl.bogus value 1: unknown config key 'rl.bogus'"):
    check_against_base(_sweep(axes=(Choice("rl.bogus", (1,)),)), base, "tiny")
  with pytest.raises(ConfigError, match="axis sft.steps value 1.0: steps expects int"):
    check_against_base(
      Sweep(
        name="t", config=BASE, strategy="random", points=2, axes=(Uniform("sft.steps", 1.0, 5.0),)
      ),
      base,
      "tiny",
    )
  with pytest.raises(ConfigError, match="fixed overrides: .*nope"):
    check_against_base(_sweep(fixed=("nope=1",)), base, "tiny")
  with pytest.raises(ConfigError, match="eval.every_seconds > 0"):
    check_against_base(_sweep(pruning=Pruning()), base, "tiny")
  cfg = check_against_base(
    _sweep(fixed=("eval.every_seconds=2.0",), pruning=Pruning()), base, "tiny"
  )
  assert cfg.eval.every_seconds == 2.0


def test_load_sweep_errors(tmp_path):
  f = tmp_path / "s.py"
  f.write_text("X = 1\n")
  with pytest.raises(ConfigError, match="defines no get_sweep"):
    load_sweep(str(f))
  f.write_text("def get_sweep(variant='default'):\n  return {'name': variant}\n")
  with pytest.raises(ConfigError, match="returned dict, not Sweep"):
    load_sweep(f"{f}:tiny")
  with pytest.raises(ConfigError, match="not found"):
    load_sweep(str(tmp_path / "missing.py"))


def test_example_sweep_file_is_valid(repo_root, monkeypatch):
  monkeypatch.chdir(repo_root)
  for variant, trials in (("default", 72), ("oat", 33), ("tiny", 18)):
    s, file = load_sweep(f"experiments/sweeps/sao_sensitivity.py:{variant}")
    assert s.seeds == 3 and s.num_trials == trials
    assert {a.key for a in s.axes} == {
      "sao.max_staleness",
      "sao.freshness_half_life",
      "sao.is_cap",
      "rl.optim.lr",
    }
    if variant == "oat":  # its shared SFT start is made by the command in the sweep file
      assert "init_from='runs/sft_start_arith'" in s.fixed
      s = dataclasses.replace(
        s, fixed=tuple(f for f in s.fixed if not f.startswith(("init_from", "sft.steps")))
      )
    path, _, config_variant = s.config.partition(":")
    cfg = check_against_base(s, repo_root / path, config_variant)
    assert cfg.rl.algorithm == "sao"


# -- reports -------------------------------------------------------------------------------------


def _rows():
  s = Sweep(
    name="r",
    config=BASE,
    strategy="grid",
    seeds=3,
    axes=(Choice("rl.optim.lr", (1e-4, 1e-3, 1e-2)), Choice("tokenizer", ("char",))),
  )
  vals = {0: [0.5, 0.6, 0.7], 1: [0.8, 0.9, 1.0], 2: [0.95, None, None]}
  status = {2: ["complete", "diverged", "failed"]}
  rows = []
  for p, lr in enumerate((1e-4, 1e-3, 1e-2)):
    for seed in range(3):
      st = status.get(p, ["complete"] * 3)[seed]
      rows.append(
        {
          "trial": 3 * p + seed,
          "point": p,
          "seed": seed,
          "status": st,
          "rl.optim.lr": lr,
          "tokenizer": "char",
          "rl.accuracy": vals[p][seed],
          "attempts": 1,
          "trial_wall_s": 1.0,
          "reason": "",
          "workdir": f"trials/{3 * p + seed}",
        }
      )
  return s, rows


def test_points_and_best():
  s, rows = _rows()
  points = sweep_report.point_rows(s, rows)
  assert [p["n_complete"] for p in points] == [3, 3, 1]
  assert points[2]["n_diverged"] == 1 and points[2]["n_failed"] == 1
  assert points[1]["mean"] == pytest.approx(0.9)
  assert points[1]["se"] == pytest.approx(0.1 / math.sqrt(3))
  half = 4.302652729911275 * 0.1 / math.sqrt(3)
  assert points[1]["ci_low"] == pytest.approx(0.9 - half)
  # Point 2 has the best single value but not all its seeds: not eligible.
  assert sweep_report.best_point(s, points)["point"] == 1
  s_min = dataclasses.replace(s, direction="minimize")
  assert sweep_report.best_point(s_min, points)["point"] == 0


def _points(values: dict[int, list[float | None]], seeds: int) -> tuple[Sweep, list[dict]]:
  """Point rows over one learning-rate axis from {point: per-seed metric (None: failed)}."""
  lrs = tuple(10.0 ** -(p + 1) for p in values)
  s = Sweep(name="v", config=BASE, strategy="grid", seeds=seeds, axes=(Choice("rl.optim.lr", lrs),))
  rows = [
    {
      "point": p,
      "seed": k,
      "status": "failed" if v is None else "complete",
      "rl.optim.lr": lrs[p],
      "rl.accuracy": v,
    }
    for p, vs in values.items()
    for k, v in enumerate(vs)
  ]
  return s, sweep_report.point_rows(s, rows)


def test_ranking_names_a_best_only_when_points_can_be_told_apart():
  # Every trial scored the same (a sweep that learned nothing): no best, and the verdict says so.
  s, pts = _points({0: [0.0, 0.0], 1: [0.0, 0.0], 2: [0.0, 0.0]}, seeds=2)
  r = sweep_report.ranking(s, pts)
  assert r["best"] is None and r["leading"] == [0, 1, 2]
  assert "no point is distinguishable from the others at 2 seeds" in r["verdict"]
  # Different means, overlapping spreads: still no best.
  s, pts = _points({0: [0.50, 0.70], 1: [0.55, 0.75], 2: [0.45, 0.72]}, seeds=2)
  assert sweep_report.ranking(s, pts)["best"] is None
  # Clearly separated: the best is named, and its difference excludes 0 against every point.
  s, pts = _points({0: [0.10, 0.12, 0.11], 1: [0.60, 0.62, 0.61], 2: [0.30, 0.33, 0.31]}, seeds=3)
  r = sweep_report.ranking(s, pts)
  assert r["best"]["point"] == 1 and r["leading"] == [1] and "point 1 is best" in r["verdict"]
  s_min = dataclasses.replace(s, direction="minimize")
  assert sweep_report.ranking(s_min, pts)["best"]["point"] == 0
  # Two leaders tied, a third clearly worse: no single best, the tie is named.
  s, pts = _points({0: [0.60, 0.64], 1: [0.61, 0.65], 2: [0.10, 0.11]}, seeds=2)
  r = sweep_report.ranking(s, pts)
  assert r["best"] is None and r["leading"] == [0, 1]
  assert "no single best at 2 seeds: points 0, 1" in r["verdict"]
  # Constant within each point but different between them: told apart with no spread at all.
  s, pts = _points({0: [0.5, 0.5], 1: [0.25, 0.25]}, seeds=2)
  assert sweep_report.ranking(s, pts)["best"]["point"] == 0
  # One seed per point: no spread to judge by, whatever the values.
  s, pts = _points({0: [0.9], 1: [0.1]}, seeds=1)
  r = sweep_report.ranking(s, pts)
  assert r["best"] is None and "one seed per point" in r["verdict"]
  # A point with a failed seed does not compete; the only complete point is named as such.
  s, pts = _points({0: [0.2, None], 1: [0.1, 0.1]}, seeds=2)
  r = sweep_report.ranking(s, pts)
  assert r["best"]["point"] == 1 and "only point" in r["verdict"]
  s, pts = _points({0: [0.2, None]}, seeds=2)
  assert sweep_report.ranking(s, pts) == {
    "best": None,
    "leading": [],
    "verdict": "no point has all its 2 seed(s) complete",
  }


def test_welch_interval():
  a, b = stats.seed_stats([0.60, 0.62, 0.61]), stats.seed_stats([0.10, 0.12, 0.11])
  low, high = stats.welch_interval(a, b)
  # Equal spreads and sizes: Welch's degrees of freedom equal the pooled test's,
  # n_a + n_b - 2 = 4, so the half-width is t_{0.975, 4} * sqrt(2) * se.
  half = stats.t_quantile(0.95, 4) * math.sqrt(2) * a.se
  assert (low, high) == (pytest.approx(0.5 - half), pytest.approx(0.5 + half))
  assert stats.welch_interval(a, stats.seed_stats([0.1])) == (
    pytest.approx(math.nan, nan_ok=True),
    pytest.approx(math.nan, nan_ok=True),
  )


def test_writers(tmp_path, repo_root, monkeypatch):
  monkeypatch.chdir(repo_root)
  s, rows = _rows()
  points = sweep_report.point_rows(s, rows)
  best = sweep_report.best_point(s, points)
  sweep_report.write_table_files(tmp_path, s, rows, points, best)
  with open(tmp_path / "trials.csv") as f:
    table = list(csv.DictReader(f))
  assert len(table) == 9 and table[7]["status"] == "diverged" and table[7]["rl.accuracy"] == ""
  assert list(table[0])[:5] == ["trial", "point", "seed", "status", "rl.optim.lr"]
  data = json.loads((tmp_path / "trials.json").read_text())
  assert data["best"]["point"] == 1 and data["sweep"]["name"] == "r"
  assert math.isnan(points[2]["se"]) and data["points"][2]["se"] is None
  assert sweep_report.write_plot(tmp_path / "sweep.png", s, rows, points)
  assert (tmp_path / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  base = repo_root / "experiments/configs/arith_grpo.py"
  out = tmp_path / "best"
  out.mkdir()
  src = sweep_report.best_config_source(s, base, "tiny", best, out)
  (out / "best_config.py").write_text(src)
  assert "sao-jax train --config" in src and "0.9 +- 0.058 s.e." in src
  cfg = config_lib.load_config(str(out / "best_config.py"))
  assert cfg.rl.optim.lr == 1e-3 and cfg.name == "arith_grpo_tiny"
  other = config_lib.load_config(str(out / "best_config.py"), "tiny")
  assert other == cfg


# -- the driver, with a stand-in trainer ---------------------------------------------------------


def _runner(s: Sweep, d: pathlib.Path, parallel: int = 2) -> SweepRunner:
  return SweepRunner(
    s,
    REPO_ROOT / "experiments" / "sweeps" / "x.py",
    d,
    parallel=parallel,
    show_progress=False,
    poll_s=0.05,
    train_cmd=(sys.executable, FAKE),
  )


def _alive(pid: int) -> bool:
  try:
    return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
  except OSError:
    return False


def test_statuses_table_and_best(tmp_path, repo_root, monkeypatch):
  """A failing, a diverging and a metric-less point do not stop the sweep; each is recorded
  with its status; every trial's process group is gone at the end."""
  monkeypatch.chdir(repo_root)
  s = _sweep(
    axes=(Choice("rl.optim.lr", (0.1, 0.5, 0.6, 0.7, 0.3)),), seeds=2, report=("rl.steps", "wall_s")
  )
  summary = _runner(s, tmp_path / "d").run()
  assert summary["status"] == {"complete": 4, "failed": 4, "diverged": 2}
  rows = json.loads((tmp_path / "d" / "trials.json").read_text())["trials"]
  by = {(r["point"], r["seed"]): r for r in rows}
  assert len(by) == 10 and {r["trial"] for r in rows} == set(range(10))
  assert by[(1, 0)]["status"] == "failed" and "exit code 3" in by[(1, 0)]["reason"]
  assert by[(2, 1)]["status"] == "diverged" and by[(2, 1)]["rl.accuracy"] is None
  assert "missing from summary.json" in by[(3, 0)]["reason"]
  assert by[(4, 1)]["rl.accuracy"] == pytest.approx(0.31) and by[(4, 1)]["rl.steps"] >= 1
  assert by[(4, 1)]["wall_s"] == 0.1 and by[(4, 1)]["trial_wall_s"] > 0.1  # summary's, ours
  assert summary["best"]["point"] == 4 and summary["best"]["mean"] == pytest.approx(0.305)
  files = sorted(p.name for p in (tmp_path / "d").iterdir())
  for f in ("best_config.py", "points.csv", "sweep.png", "trials.csv", "trials.json"):
    assert f in files
  for r in rows:
    child = int((tmp_path / "d" / r["workdir"] / "child.pid").read_text())
    assert not _alive(child)
  # The same DIR with a different sweep is refused; the same sweep is already complete.
  with pytest.raises(ConfigError, match="holds a different sweep"):
    _runner(_sweep(seeds=3), tmp_path / "d").run()
  again = _runner(s, tmp_path / "d").run()
  assert again["trials"] == 10
  assert all(
    len((tmp_path / "d" / r["workdir"] / "starts.txt").read_text().split()) == 1 for r in rows
  )


def test_shared_sft_trains_each_seeds_start_once(tmp_path, repo_root, monkeypatch):
  """With shared_sft, one SFT run per seed (before that seed's first trial, never again on
  a resume), and every trial of the seed starts from it and reports its SFT as its own."""
  monkeypatch.chdir(repo_root)
  s = _sweep(seeds=2, first_seed=100, shared_sft=True, report=("sft.accuracy",))
  o = trial_overrides(s, {"rl.optim.lr": 0.1}, 1, tmp_path / "d")
  start = tmp_path / "d" / "sft" / "seed101" / "checkpoints" / "sft"
  assert o[-4:] == ["seed=101", f"init_from={str(start)!r}", "sft.steps=0", "sft.max_seconds=0.0"]
  summary = _runner(s, tmp_path / "d", parallel=1).run()
  assert summary["status"] == {"complete": 4}
  events = [json.loads(x) for x in (tmp_path / "d" / "events.jsonl").read_text().splitlines()]
  assert [e["seed"] for e in events if e["event"] == "sft_start"] == [100, 101]
  rows = json.loads((tmp_path / "d" / "trials.json").read_text())["trials"]
  assert {(r["seed"], r["sft.accuracy"]) for r in rows} == {(100, 0.1), (101, 0.101)}
  for r in rows:
    cmd = json.loads((tmp_path / "d" / r["workdir"] / "command.json").read_text())
    start = tmp_path / "d" / "sft" / f"seed{r['seed']}" / "checkpoints" / "sft"
    assert f"init_from={str(start)!r}" in cmd
  _runner(s, tmp_path / "d", parallel=1).run()  # resumed: nothing trained again
  events = (tmp_path / "d" / "events.jsonl").read_text().count('"sft_start"')
  assert events == 2
  # A DIR written before the field existed reads it as its default (False), not a change.
  plain = _sweep(seeds=2)
  _runner(plain, tmp_path / "p", parallel=1).run()
  pinned = json.loads((tmp_path / "p" / "sweep.json").read_text())
  del pinned["shared_sft"]
  (tmp_path / "p" / "sweep.json").write_text(json.dumps(pinned))
  assert _runner(plain, tmp_path / "p", parallel=1).run()["trials"] == 4


def test_trial_fixed_continues_sft_from_the_shared_start(tmp_path):
  """A continued-SFT baseline tuned on its own learning rate: the trials start from the
  seed's shared SFT run and train SFT again for a budget (trial_fixed, after the start's
  overrides); the start is trained without the axis."""
  s = _sweep(
    shared_sft=True,
    axes=(Choice("sft.optim.lr", (1e-4, 3e-4)),),
    trial_fixed=("sft.max_seconds=5.0", "rl.max_seconds=0.0"),
  )
  o = trial_overrides(s, {"sft.optim.lr": 3e-4}, 0, tmp_path)
  assert o.index("sft.optim.lr=0.0003") < o.index("sft.max_seconds=0.0")
  assert o[-2:] == ["sft.max_seconds=5.0", "rl.max_seconds=0.0"]  # (the last value wins)
  cfg = config_lib.apply_overrides(config_lib.Config(), [x for x in o if "init_from" not in x])
  assert cfg.sft.max_seconds == 5.0 and cfg.sft.optim.lr == 3e-4 and cfg.sft.steps == 0


def test_pruning_stops_the_trial_group(tmp_path, repo_root, monkeypatch):
  monkeypatch.chdir(repo_root)
  s = _sweep(
    axes=(Choice("rl.optim.lr", (0.3, 0.2, 0.1, 0.01)),),
    fixed=("eval.every_seconds=1.0", "rl.max_seconds=1.0"),
    pruning=Pruning(kind="median", startup_trials=2, warmup_evals=1),
  )
  summary = _runner(s, tmp_path / "d", parallel=1).run()
  rows = json.loads((tmp_path / "d" / "trials.json").read_text())["trials"]
  assert [r["status"] for r in rows] == ["complete", "complete", "pruned", "pruned"]
  # One seed per point: the report names no best, whatever the values.
  assert summary["best"] is None and summary["leading"] == [0, 1]
  assert not (tmp_path / "d" / "best_config.py").exists()
  for r in rows[2:]:
    wd = tmp_path / "d" / r["workdir"]
    assert not (wd / "summary.json").exists() and "pruned at eval" in r["reason"]
    assert not _alive(int((wd / "child.pid").read_text()))


_DRIVER = """
import faulthandler, pathlib, signal, sys
faulthandler.register(signal.SIGUSR1, all_threads=True)  # a hung stop shows where it hangs
from sao_jax.sweep import SweepRunner, Sweep, Choice
s = Sweep(name="k", config="experiments/configs/arith_grpo.py:tiny", strategy="grid", seeds=2,
          axes=(Choice("rl.optim.lr", (0.1, 0.2, 0.3)),), fixed=("rl.max_seconds=SECS",))
r = SweepRunner(s, pathlib.Path(sys.argv[0]), sys.argv[1], parallel=2, show_progress=False,
                poll_s=0.05, train_cmd=(sys.executable, sys.argv[2]))
try:
  r.run()
except KeyboardInterrupt:
  sys.exit(130)
"""


def _wait_running(d: pathlib.Path, ended: int, running: int, proc) -> set[int]:
  deadline = time.time() + 60
  while time.time() < deadline:
    ev = _events(d)
    done = {e["trial"] for e in ev if e["event"] == "end"}
    live = {e["trial"] for e in ev if e["event"] == "start"} - done
    if len(done) >= ended and len(live) >= running:
      return live
    assert proc.poll() is None, proc.stdout.read().decode()[-2000:]
    time.sleep(0.05)
  pytest.fail(f"sweep never reached {ended} ended + {running} running: {_events(d)}")


def _events(d: pathlib.Path) -> list[dict]:
  p = d / "events.jsonl"
  return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


def test_kill_9_and_resume_with_stand_in_trials(tmp_path, repo_root):
  """kill -9 of the sweep while trials run: the trial processes die with it (their children
  are stopped by the next run), and the rerun completes every trial exactly once."""
  d = tmp_path / "d"
  driver = tmp_path / "driver.py"
  driver.write_text(_DRIVER.replace("SECS", "1.0"))
  cmd = [sys.executable, str(driver), str(d), FAKE]
  proc = subprocess.Popen(
    cmd, cwd=repo_root, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT
  )
  try:
    _wait_running(d, 2, 2, proc)
    time.sleep(0.3)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    ev = _events(d)
    done_before = {e["trial"] for e in ev if e["event"] == "end"}
    live = {e["trial"] for e in ev if e["event"] == "start"} - done_before
    assert live
    leaders = [e["pid"] for e in ev if e["event"] == "start" and e["trial"] in live]
    t0 = time.time()
    while any(_alive(p) for p in leaders) and time.time() - t0 < 5:
      time.sleep(0.05)
    assert not any(_alive(p) for p in leaders), "a trial outlived the killed sweep"
    children = [
      int(p.read_text()) for n in live if (p := d / "trials" / str(n) / "child.pid").exists()
    ]
    assert set(children) <= set(trial_processes(d.resolve()))  # orphans, found by env
    out = subprocess.run(
      cmd, cwd=repo_root, env=subprocess_env(), capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert not any(_alive(p) for p in children)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
    kill_leftovers(d.resolve())
  rows = json.loads((d / "trials.json").read_text())["trials"]
  assert sorted((r["point"], r["seed"]) for r in rows) == [
    (p, s) for p in range(3) for s in range(2)
  ]
  assert all(r["status"] == "complete" for r in rows)
  ev = _events(d)
  for r in rows:
    n = r["trial"]
    starts = [e for e in ev if e["event"] == "start" and e["trial"] == n]
    ends = [e for e in ev if e["event"] == "end" and e["trial"] == n]
    assert len(ends) == 1, (n, ends)
    assert len(starts) == (1 if n in done_before else r["attempts"])
    assert r["attempts"] == (1 if n in done_before or n not in live else 2)
  assert sorted(int(p.name) for p in (d / "trials").iterdir()) == list(range(6))


@pytest.mark.parametrize("strategy", ["random", "tpe"])
def test_sampled_points_share_params_across_seeds(tmp_path, repo_root, monkeypatch, strategy):
  monkeypatch.chdir(repo_root)
  s = Sweep(
    name="r",
    config=BASE,
    strategy=strategy,
    points=3,
    seeds=2,
    startup_points=2,
    axes=(LogUniform("rl.optim.lr", 0.01, 0.4), IntRange("rl.steps", 1, 5)),
  )
  summary = _runner(s, tmp_path / "d", parallel=2).run()
  assert summary["status"] == {"complete": 6}
  rows = json.loads((tmp_path / "d" / "trials.json").read_text())["trials"]
  points: dict[int, set] = {}
  for r in rows:
    assert 0.01 <= r["rl.optim.lr"] <= 0.4 and r["rl.steps"] in range(1, 6)
    assert r["rl.accuracy"] == pytest.approx(r["rl.optim.lr"] + r["seed"] / 100)
    points.setdefault(r["point"], set()).add((r["rl.optim.lr"], r["rl.steps"], r["seed"]))
  assert sorted(points) == [0, 1, 2]
  assert all(len({p[:2] for p in v}) == 1 and {p[2] for p in v} == {0, 1} for v in points.values())
  assert len({next(iter(v))[:2] for v in points.values()}) == 3


def test_ctrl_c_stops_every_trial_process(tmp_path, repo_root):
  """SIGINT (Ctrl-C) to the sweep: it stops each running trial's whole process group, exits
  130, and leaves the interrupted trials to be re-run."""
  d = tmp_path / "d"
  driver = tmp_path / "driver.py"
  driver.write_text(_DRIVER.replace("SECS", "30.0"))
  proc = subprocess.Popen(
    [sys.executable, str(driver), str(d), FAKE],
    cwd=repo_root,
    env=subprocess_env(),
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
  )
  try:
    live = _wait_running(d, 0, 2, proc)
    deadline = time.time() + 10
    while not all((d / "trials" / str(n) / "child.pid").exists() for n in live):
      assert time.time() < deadline
      time.sleep(0.05)
    pids = [int((d / "trials" / str(n) / "child.pid").read_text()) for n in live]
    pids += [e["pid"] for e in _events(d) if e["event"] == "start"]
    # (what the driver blocks and ignores, for the failure message: a SIGINT ignored by
    # inheritance once kept a sweep running; SweepRunner.run now handles it explicitly)
    masks = [
      line
      for line in pathlib.Path(f"/proc/{proc.pid}/status").read_text().splitlines()
      if line.startswith(("SigBlk", "SigIgn", "SigCgt"))
    ]
    proc.send_signal(signal.SIGINT)
    try:
      code = proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
      proc.send_signal(signal.SIGUSR1)  # every thread's stack to the output, then fail
      time.sleep(2)
      proc.kill()
      pytest.fail(
        f"the sweep did not stop within 30 s ({'; '.join(masks)}):\n"
        + proc.communicate()[0].decode()[-6000:]
      )
    assert code == 130
    assert not any(_alive(p) for p in pids) and not trial_processes(d.resolve())
    assert {e["trial"] for e in _events(d) if e["event"] == "stopped"} == live
    rows = json.loads((d / "trials.json").read_text())["trials"]
    assert {r["trial"] for r in rows if r["status"] == "running"} == live
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
    kill_leftovers(d.resolve())


def test_one_sweep_per_dir(tmp_path, repo_root, monkeypatch):
  import fcntl

  monkeypatch.chdir(repo_root)
  d = tmp_path / "d"
  d.mkdir()
  with open(d / "sweep.lock", "w") as held:
    held.write("4242")
    held.flush()
    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with pytest.raises(ConfigError, match=r"another sweep \(pid 4242\) is running in"):
      _runner(_sweep(), d).run()


def test_resume_repairs_a_point_cut_short(tmp_path, repo_root, monkeypatch):
  """A sweep killed between sampling a point and queueing its other seeds: the rerun runs
  that trial (RUNNING in the journal) and the missing seed, then the rest of the budget."""
  monkeypatch.chdir(repo_root)
  s = Sweep(
    name="c",
    config=BASE,
    strategy="random",
    points=2,
    seeds=2,
    axes=(LogUniform("rl.optim.lr", 0.01, 0.4),),
  )
  first = _runner(s, tmp_path / "d")
  first._acquire()
  first._check_same_sweep()
  first.study = first._open_study()
  cut = first.study.ask(s.distributions())
  cut.set_user_attr("point", 0)  # ... and killed here: no seed, no queued seed 1
  first._release()
  summary = _runner(s, tmp_path / "d").run()
  assert summary["status"] == {"complete": 4}
  rows = json.loads((tmp_path / "d" / "trials.json").read_text())["trials"]
  assert sorted((r["point"], r["seed"]) for r in rows) == [(0, 0), (0, 1), (1, 0), (1, 1)]
  p0 = [r for r in rows if r["point"] == 0]
  assert {r["rl.optim.lr"] for r in p0} == {cut.params["rl.optim.lr"]}
  assert [r["trial"] for r in p0 if r["seed"] == 0] == [cut.number]


def test_shared_sft_start_budget_from_fixed(tmp_path):
  """fixed may set the shared start's SFT budget (e.g. a start trained to its plateau); the
  trials still run with sft.steps=0 from it."""
  s = _sweep(shared_sft=True, fixed=("sft.steps=7",))
  o = trial_overrides(s, {"rl.optim.lr": 0.1}, 0, tmp_path)
  cfg = config_lib.apply_overrides(config_lib.Config(), [x for x in o if "init_from" not in x])
  assert o[0] == "sft.steps=7" and cfg.sft.steps == 0
