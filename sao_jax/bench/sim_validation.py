"""The simulator against the benchmark (experiments/validate_sim.py): each arm of
experiments/bench_sync_vs_async.py read back from its results.json and metrics.jsonl on the
learner loop's own clock (`real_metrics`), the simulator policy and scenario each arm maps to
(`sao_policy_for`, `arm_scenarios`), the simulated means over simulator seeds (`simulated`),
and their relative errors (`compare`); `LoadSampler` records the machine's load meanwhile."""

from __future__ import annotations

import json
import os
import pathlib
import threading

import numpy as np

from sao_jax import sim
from sao_jax.metrics import read_jsonl

METRICS = (
  "trajectories_per_s",
  "learner_steps_per_s",
  "learner_busy",
  "delay_mean_s",
  "delay_p95_s",
  "trajectories_per_s_steady",
  "learner_busy_steady",
  "staleness_mean",
)
STEADY_AFTER = 10
ARMS = ("grpo", "grpo_samplers", "sao")
SAMPLER_ARMS = ("grpo_samplers", "sao")  # arms whose samplers start beside the learner


class LoadSampler:
  """/proc/loadavg every few seconds while a child runs: other people's jobs show up here."""

  def __init__(self, every: float = 5.0):
    self.samples: list[float] = []
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, args=(every,), daemon=True)

  def _run(self, every):
    while not self._stop.wait(every):
      with open("/proc/loadavg") as f:
        self.samples.append(float(f.read().split()[0]))

  def __enter__(self):
    self._thread.start()
    return self

  def __exit__(self, *exc):
    self._stop.set()
    self._thread.join()

  def summary(self) -> dict:
    a = np.asarray(self.samples or [np.nan])
    return {
      "loadavg1_mean": float(np.mean(a)),
      "loadavg1_max": float(np.max(a)),
      "samples": len(self.samples),
      "cpus": os.cpu_count(),
    }


def default_workdir(bench: pathlib.Path) -> pathlib.Path:
  return pathlib.Path("runs") / bench.name


def bench_runs(
  bench: pathlib.Path, workdir: pathlib.Path | None = None
) -> list[dict[str, tuple[dict, pathlib.Path]]]:
  """Per benchmark seed: {arm: (its results.json summary, its metrics.jsonl)}."""
  res = json.loads((bench / "results.json").read_text())
  if "runs" not in res:  # the older layout: one run, arms at the top
    return [{arm: (res[arm], bench / arm / "metrics.jsonl") for arm in ARMS if arm in res}]
  work = workdir or default_workdir(bench)
  return [
    {
      arm: (run[arm], work / f"seed{run['seed']}" / arm / "metrics.jsonl")
      for arm in ARMS
      if arm in run
    }
    for run in res["runs"]
  ]


def real_metrics(
  bench: pathlib.Path,
  arm: str,
  rows_per_step: int,
  run: int = 0,
  workdir: pathlib.Path | None = None,
) -> dict:
  """The arm's metrics in benchmark run `run` on the learner loop's own clock (see the
  module docstring)."""
  info, path = bench_runs(bench, workdir)[run][arm]
  wall = info["trajectories"] / info["trajectories_per_s"]
  out = {
    "wall_s": wall,
    "steps": info["steps"],
    "trajectories_per_s": info["trajectories_per_s"],
    "learner_steps_per_s": info["steps"] / wall,
    "learner_busy": info["learner_busy"],
    "delay_mean_s": info["delay_mean_s"],
    "delay_p95_s": info["delay_p95_s"],
    "preloop_s": max(0.0, info["seconds"] - wall),
  }
  rows = [r for r in read_jsonl(path) if r.get("phase") == "rl" and "learner_busy" in r]
  if len(rows) > STEADY_AFTER:
    offset = rows[-1]["wall_s"] - wall  # writer clock - loop clock

    def at(r):
      w = r["wall_s"] - offset
      traj = r.get("trajectories", r["step"] * rows_per_step)
      return w, r["learner_busy"] * w, traj

    w0, b0, c0 = at(next(r for r in rows if r["step"] == STEADY_AFTER))
    w1, b1, c1 = at(rows[-1])
    out.update(
      learner_busy_steady=(b1 - b0) / (w1 - w0), trajectories_per_s_steady=(c1 - c0) / (w1 - w0)
    )
  stale = [r["staleness_mean"] for r in rows if "staleness_mean" in r]
  if stale:  # every step consumes the same number of rows: the mean of the step means
    out["staleness_mean"] = float(np.mean(stale))
  mean_len = [r["mean_len"] for r in rows if "mean_len" in r]
  if mean_len:
    out["mean_len"] = float(np.mean(mean_len))
  return out


def mean_over_runs(runs: list[dict]) -> tuple[dict, dict]:
  """(mean, standard error) of each metric over benchmark runs (s.e. only with >= 2)."""
  mean, se = {}, {}
  for key in sorted({k for r in runs for k in r}):
    vals = [r[key] for r in runs if r.get(key) is not None]
    if vals:
      mean[key] = float(np.mean(vals))
      if len(vals) > 1:
        se[key] = float(np.std(vals, ddof=1) / np.sqrt(len(vals)))
  return mean, se


def sao_policy_for(cfg: dict) -> str:
  """The simulator policy that matches the sampler the benchmark's SAO arm ran."""
  sao = cfg["sao"]
  if not sao.get("continuous", False):
    return "sao_batch"
  return "sao_inflight" if sao.get("inflight") == "tokens" else "sao_continuous"


def arm_scenarios(cfg: dict, sao_policy: str) -> dict[str, tuple[str, dict]]:
  """arm -> (simulator policy, scenario fields) from the benchmark's config."""
  rl, sao = cfg["rl"], cfg["sao"]  # (cfg in today's schema: config.upgrade)
  rows = rl["prompts_per_step"] * rl["group_size"]
  continuous = sao.get("continuous", False)
  samplers = dict(
    num_samplers=cfg["samplers"]["num"],
    slots=sao["sampler_slots"],
    refill_rows=sao.get("refill_rows", 0) if continuous else 0,
    colocated=True,
  )
  return {
    "grpo": ("grpo_inline", dict(batch_size=rows)),
    "grpo_samplers": (
      "grpo_continuous" if continuous else "grpo",
      dict(samplers, batch_size=rows, update_kind="grpo"),
    ),
    "sao": (
      sao_policy,
      dict(
        samplers,
        batch_size=sao["batch_size"],
        max_staleness=sao["max_staleness"],
        param_sync_every=sao["param_sync_every"],
      ),
    ),
  }


def with_start(costs: sim.Costs, preloop_s: float) -> sim.Costs:
  """`costs` with the sampler's start-up shortened by the learner's pre-loop seconds."""
  prof = costs.profiles["sampler"]
  return costs.replace(
    profiles={
      **costs.profiles,
      "sampler": sim.Profile(**{**prof.__dict__, "start_s": max(0.0, prof.start_s - preloop_s)}),
    }
  )


def simulated(costs: sim.Costs, scenarios: list[tuple[sim.Scenario, float]], seeds: int) -> dict:
  """Mean (and sd) over `seeds` simulator seeds of each (scenario, pre-loop seconds)."""
  runs = [
    sim.simulate(with_start(costs, preloop), sim.Scenario(**{**scenario.__dict__, "seed": k}))
    for scenario, preloop in scenarios
    for k in range(seeds)
  ]
  out = {}
  for key in (
    *METRICS,
    "staleness_mean",
    "steps",
    "wall_s",
    "sampler_busy",
    "decode_row_efficiency",
  ):
    vals = [r[key] for r in runs if r.get(key) is not None]
    if vals:
      out[key] = float(np.mean(vals))
      out[key + "_sd"] = float(np.std(vals))
  out["staleness_hist"] = runs[0]["staleness_hist"]
  return out


def compare(real: dict, simulated_: dict) -> dict:
  errs = {}
  for key in METRICS:
    if real.get(key) and simulated_.get(key) is not None:
      errs[key] = (simulated_[key] - real[key]) / real[key]
  return errs
