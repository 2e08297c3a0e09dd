"""Checks the cluster simulator against real runs on this machine: the benchmark's GRPO and
SAO arms next to the simulator's prediction from the calibrated costs, metric by metric.

One command measures everything afresh (benchmark, then calibration from the benchmark's
SFT checkpoint, then the comparison; ~12 min on a shared 2-core CPU):
  nice -n 10 python experiments/validate_sim.py --run-bench --calibrate --seconds 120
From existing JSONs (seconds):
  python experiments/validate_sim.py --bench results/bench_sync_vs_async_val \\
      --costs results/sim_costs.json
After continuous batching lands in the sampler, name the policy the SAO arm ran:
  ... --sao-policy sao_inflight      (or sao_continuous: refill without in-flight updates)

Real metrics come from the benchmark's results.json and metrics.jsonl, recomputed on one
clock: wall = the learner loop's seconds (trajectories / trajectories_per_s), so steps/s
and trajectories/s share a denominator; "steady" leaves out the first 10 updates (start-up,
compilation). The benchmark runs with held-out evaluation only before and after the loop
(--eval-every beyond the run), since the simulator has no evaluation pauses. The sampler's
start-up in the simulation is shortened by the learner's own pre-loop seconds (the real
sampler starts while the learner snapshots and validates), estimated as the phase's
training seconds minus the loop's wall. Writes results/sim_validation.json.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import subprocess
import sys
import threading

import numpy as np

from sao_jax import sim
from sao_jax.metrics import read_jsonl

HERE = pathlib.Path(__file__).resolve().parent
METRICS = ("trajectories_per_s", "learner_steps_per_s", "learner_busy", "delay_mean_s",
           "delay_p95_s", "trajectories_per_s_steady", "learner_busy_steady", "staleness_mean")
STEADY_AFTER = 10


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
    return {"loadavg1_mean": float(np.mean(a)), "loadavg1_max": float(np.max(a)),
            "samples": len(self.samples), "cpus": os.cpu_count()}


def _run(cmd: list[str]) -> dict:
  print("+", " ".join(cmd), flush=True)
  with LoadSampler() as load:
    subprocess.run(cmd, check=True)
  return load.summary()


def real_metrics(bench: pathlib.Path, arm: str, rows_per_step: int) -> dict:
  """The arm's metrics on the learner loop's own clock (see the module docstring)."""
  info = json.loads((bench / "results.json").read_text())[arm]
  wall = info["trajectories"] / info["trajectories_per_s"]
  out = {"wall_s": wall, "steps": info["steps"], "trajectories_per_s": info["trajectories_per_s"],
         "learner_steps_per_s": info["steps"] / wall, "learner_busy": info["learner_busy"],
         "delay_mean_s": info["delay_mean_s"], "delay_p95_s": info["delay_p95_s"],
         "preloop_s": max(0.0, info["seconds"] - wall)}
  rows = [r for r in read_jsonl(bench / arm / "metrics.jsonl") if r.get("phase") == "rl"
          and "learner_busy" in r]
  if len(rows) > STEADY_AFTER:
    offset = rows[-1]["wall_s"] - wall  # writer clock - loop clock
    def at(r):
      w = r["wall_s"] - offset
      traj = r.get("trajectories", r["step"] * rows_per_step)
      return w, r["learner_busy"] * w, traj
    w0, b0, c0 = at(next(r for r in rows if r["step"] == STEADY_AFTER))
    w1, b1, c1 = at(rows[-1])
    out.update(learner_busy_steady=(b1 - b0) / (w1 - w0),
               trajectories_per_s_steady=(c1 - c0) / (w1 - w0))
  stale = [r["staleness_mean"] for r in rows if "staleness_mean" in r]
  if stale:  # every step consumes the same number of rows: the mean of the step means
    out["staleness_mean"] = float(np.mean(stale))
  mean_len = [r["mean_len"] for r in rows if "mean_len" in r]
  if mean_len:
    out["mean_len"] = float(np.mean(mean_len))
  return out


def simulated(costs: sim.Costs, scenario: sim.Scenario, seeds: int) -> dict:
  runs = [sim.simulate(costs, sim.Scenario(**{**scenario.__dict__, "seed": k}))
          for k in range(seeds)]
  out = {}
  for key in (*METRICS, "staleness_mean", "steps", "wall_s", "sampler_busy",
              "decode_row_efficiency"):
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


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--bench", default="results/bench_sync_vs_async_val")
  p.add_argument("--costs", default="results/sim_costs.json")
  p.add_argument("--run-bench", action="store_true", help="run the benchmark first")
  p.add_argument("--calibrate", action="store_true",
                 help="calibrate first (from the benchmark's SFT checkpoint)")
  p.add_argument("--seconds", type=float, default=120.0, help="benchmark seconds per arm")
  p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                 help="config overrides for the benchmark and the calibration")
  p.add_argument("--sao-policy", default="sao_batch", choices=sorted(sim.PRESETS),
                 help="the simulator policy that matches the sampler the SAO arm ran")
  p.add_argument("--seeds", type=int, default=3, help="simulator seeds (mean reported)")
  p.add_argument("--out", default="results/sim_validation.json")
  args = p.parse_args(argv)
  bench = pathlib.Path(args.bench)
  sets = [x for kv in args.set for x in ("--set", kv)]
  load = {}
  if args.run_bench:
    load["bench"] = _run([sys.executable, str(HERE / "bench_sync_vs_async.py"), "--seconds",
                          str(args.seconds), "--eval-every", "1e9", "--out", str(bench),
                          "--no-progress", *sets])
  if args.calibrate:
    load["calibrate"] = _run([sys.executable, str(HERE / "calibrate_sim.py"), "--sft-from",
                              str(bench / "sft"), "--out", args.costs, *sets])
  prev = pathlib.Path(args.out)
  if not load and prev.exists():  # a re-comparison keeps the load recorded when measured
    old = json.loads(prev.read_text())
    if old.get("bench") == str(bench):
      load = old.get("load_during", {})
  bres = json.loads((bench / "results.json").read_text())
  cal = json.loads(pathlib.Path(args.costs).read_text())
  costs = sim.Costs.from_dict(cal["costs"])
  cfg = bres["config"]
  rl, sao = cfg["rl"], cfg["sao"]
  diffs = {k: (cal["config"][s][k], cfg[s][k]) for s in ("model", "rl", "sao", "task")
           for k in cfg[s] if cal["config"][s].get(k) != cfg[s][k] and k not in
           ("max_seconds", "steps", "algorithm")}
  rows = rl["prompts_per_step"] * rl["group_size"]
  report = {"command": " ".join([sys.executable.split("/")[-1], *sys.argv]),
            "commit": cal.get("commit"), "bench": str(bench), "costs": args.costs,
            "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
            "load_during": load, "config_differences_bench_vs_calibration": diffs,
            "calibration_machine": cal.get("machine"), "arms": {}}
  arms = {"grpo": ("grpo_inline", dict(batch_size=rows)),
          "sao": (args.sao_policy, dict(num_samplers=sao["num_samplers"],
                                        slots=sao["sampler_slots"],
                                        batch_size=sao["batch_size"],
                                        max_staleness=sao["max_staleness"],
                                        param_sync_every=sao["param_sync_every"],
                                        colocated=True))}
  for arm, (policy, kw) in arms.items():
    if arm not in bres:
      continue
    real = real_metrics(bench, arm, rows)
    c = costs
    if arm == "sao":  # the real sampler starts while the learner is still before its loop
      prof = costs.profiles["sampler"]
      c = costs.replace(profiles={**costs.profiles, "sampler": sim.Profile(
          **{**prof.__dict__, "start_s": max(0.0, prof.start_s - real["preloop_s"])})})
    scen = sim.preset(policy, sim.Scenario(seconds=real["wall_s"], **kw))
    predicted = simulated(c, scen, args.seeds)
    errs = compare(real, predicted)
    report["arms"][arm] = {"policy": policy, "scenario": scen.__dict__, "real": real,
                           "simulated": predicted, "relative_error": errs,
                           "within_10pct": {k: abs(v) <= 0.10 for k, v in errs.items()}}
  # Diagnostic: the same simulation with the update cost the GRPO arm itself logged (median
  # learner_time after its first step) in place of the calibrated one, both update kinds
  # scaled alike: what is left of the error is not the update's cost level.
  if "grpo" in bres:
    rows_g = [r for r in read_jsonl(bench / "grpo" / "metrics.jsonl")
              if r.get("phase") == "rl" and "learner_time" in r][1:]
    if rows_g:
      in_run = float(np.median([r["learner_time"] for r in rows_g]))
      f = in_run / costs.update("grpo", rows)
      scaled = costs.replace(update_s={k: tuple((n, t * f) for n, t in v)
                                       for k, v in costs.update_s.items()})
      diag = {"update_scale": f, "grpo_update_in_run_s": in_run, "arms": {}}
      for arm, r in report["arms"].items():
        c = scaled
        if arm == "sao":
          prof = scaled.profiles["sampler"]
          c = scaled.replace(profiles={**scaled.profiles, "sampler": sim.Profile(
              **{**prof.__dict__, "start_s": max(0.0, prof.start_s - r["real"]["preloop_s"])})})
        pred = simulated(c, sim.Scenario(**r["scenario"]), args.seeds)
        diag["arms"][arm] = {"simulated": pred, "relative_error": compare(r["real"], pred)}
      report["diagnostic_in_run_update_cost"] = diag
  if len(report["arms"]) == 2:
    g, a = report["arms"]["grpo"], report["arms"]["sao"]
    report["ratios_sao_over_grpo"] = {
        key: {"real": a["real"][key] / g["real"][key],
              "simulated": a["simulated"][key] / g["simulated"][key]}
        for key in ("trajectories_per_s", "learner_busy", "delay_mean_s")
        if g["real"].get(key) and g["simulated"].get(key)}
  out = pathlib.Path(args.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  out.write_text(json.dumps(report, indent=2, default=float))
  print(f"\n{'metric':30s} {'arm':5s} {'real':>10s} {'simulated':>10s} {'error':>8s}")
  for arm, r in report["arms"].items():
    for key, err in r["relative_error"].items():
      print(f"{key:30s} {arm:5s} {r['real'][key]:10.3f} {r['simulated'][key]:10.3f} "
            f"{err:+8.1%}")
  diag = report.get("diagnostic_in_run_update_cost")
  if diag:
    print(f"\nwith the update cost logged in the GRPO arm (x{diag['update_scale']:.2f}):")
    for arm, r in diag["arms"].items():
      print("  " + arm + ": " + ", ".join(f"{k} {v:+.1%}" for k, v in r["relative_error"].items()))
  print(f"results: {out}")
  return report


if __name__ == "__main__":
  main()
