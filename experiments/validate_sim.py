"""Checks the cluster simulator against real runs on this machine: the benchmark's arms
(experiments/bench_sync_vs_async.py: `grpo`, `grpo_samplers`, `sao`) next to the simulator's
prediction from the calibrated costs, metric by metric.

One command measures everything afresh (benchmark, then calibration from the benchmark's
SFT checkpoint of its first seed, then the comparison; ~20 min with one seed on a shared
2-core CPU):
  nice -n 10 python experiments/validate_sim.py --run-bench --calibrate --seconds 120
From existing JSONs (seconds; metrics come from the benchmark's --workdir,
default runs/<name of --bench>):
  python experiments/validate_sim.py --bench results/bench_sync_vs_async_val \\
      --costs results/sim_costs.json

The simulated policy of each arm follows the benchmark's config: `grpo` is `grpo_inline`
(the learner samples); `grpo_samplers` is `grpo_continuous` (or `grpo` without
sao.continuous); `sao` (--sao-policy auto) is `sao_inflight` with sao.continuous and
sao.inflight='tokens', `sao_continuous` with another in-flight mode, `sao_batch` without
continuous batching. Sampler arms run with the config's samplers, slots and refill_rows, on
the learner's cores.

Real metrics come from the benchmark's results.json and metrics.jsonl, recomputed on one
clock: wall = the learner loop's seconds (trajectories / trajectories_per_s), so steps/s
and trajectories/s share a denominator; "steady" leaves out the first 10 updates (start-up,
compilation). The benchmark runs with held-out evaluation only before and after the loop
(--eval-every beyond the run), since the simulator has no evaluation pauses. The sampler's
start-up in the simulation is shortened by the learner's own pre-loop seconds (the real
sampler starts while the learner snapshots and validates), estimated as the phase's
training seconds minus the loop's wall. With several benchmark seeds, each seed is
simulated on its own wall and start-up and the means over seeds are compared. Also reads
the benchmark's older layout (one run: results.json with the arms at the top, metrics in
the bench folder). Writes results/sim_validation.json.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import subprocess
import sys

import numpy as np

from sao_jax import config as config_lib
from sao_jax import results_file, sim
from sao_jax.bench.sim_validation import (
  ARMS,
  SAMPLER_ARMS,
  LoadSampler,
  arm_scenarios,
  bench_runs,
  compare,
  default_workdir,
  mean_over_runs,
  real_metrics,
  sao_policy_for,
  simulated,
)
from sao_jax.metrics import read_jsonl

HERE = pathlib.Path(__file__).resolve().parent


def _run(cmd: list[str]) -> dict:
  print("+", " ".join(cmd), flush=True)
  with LoadSampler() as load:
    subprocess.run(cmd, check=True)
  return load.summary()


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument(
    "--bench",
    default="results/bench_sync_vs_async_val",
    help="the benchmark's --out (results.json)",
  )
  p.add_argument(
    "--workdir",
    default="",
    help="the benchmark's --workdir (metrics, SFT checkpoints); default runs/<name of --bench>",
  )
  p.add_argument("--costs", default="results/sim_costs.json")
  p.add_argument("--run-bench", action="store_true", help="run the benchmark first")
  p.add_argument(
    "--calibrate",
    action="store_true",
    help="calibrate first (from the benchmark's first SFT checkpoint)",
  )
  p.add_argument("--seconds", type=float, default=120.0, help="benchmark seconds per arm")
  p.add_argument("--bench-seeds", type=int, default=1, help="benchmark seeds (--run-bench)")
  p.add_argument("--arms", default=",".join(ARMS), help="benchmark arms (--run-bench)")
  p.add_argument(
    "--set",
    action="append",
    default=[],
    metavar="KEY=VALUE",
    help="config overrides for the benchmark and the calibration",
  )
  p.add_argument(
    "--sao-policy",
    default="auto",
    choices=["auto", *sorted(sim.PRESETS)],
    help="the simulator policy of the SAO arm (auto: from the benchmark's config)",
  )
  p.add_argument("--seeds", type=int, default=3, help="simulator seeds (mean reported)")
  p.add_argument("--out", default="results/sim_validation.json")
  args = p.parse_args(argv)
  bench = pathlib.Path(args.bench)
  work = pathlib.Path(args.workdir) if args.workdir else default_workdir(bench)
  sets = [x for kv in args.set for x in ("--set", kv)]
  load = {}
  if args.run_bench:
    load["bench"] = _run(
      [
        sys.executable,
        str(HERE / "bench_sync_vs_async.py"),
        "--seconds",
        str(args.seconds),
        "--seeds",
        str(args.bench_seeds),
        "--arms",
        args.arms,
        "--eval-every",
        "1e9",
        "--out",
        str(bench),
        "--workdir",
        str(work),
        "--no-progress",
        *sets,
      ]
    )
  bres = results_file.load(bench / "results.json")
  if args.calibrate:
    sft = work / f"seed{bres['runs'][0]['seed']}" / "sft" if "runs" in bres else bench / "sft"
    load["calibrate"] = _run(
      [
        sys.executable,
        str(HERE / "calibrate_sim.py"),
        "--sft-from",
        str(sft),
        "--out",
        args.costs,
        *sets,
      ]
    )
  prev = pathlib.Path(args.out)
  if not load and prev.exists():  # a re-comparison keeps the load recorded when measured
    old = json.loads(prev.read_text())
    if old.get("bench") == str(bench):
      load = old.get("load_during", {})
  cal = results_file.load(args.costs)
  costs = sim.Costs.from_dict(cal["costs"])
  # (both in today's schema: a result written before a key moved has it at its old place)
  cfg, cal_cfg = config_lib.upgrade(bres["config"]), config_lib.upgrade(cal["config"])
  rl = cfg["rl"]
  diffs = {
    k: (cal_cfg[s][k], cfg[s][k])
    for s in ("model", "rl", "sao", "samplers", "task")
    for k in cfg[s]
    if cal_cfg[s].get(k) != cfg[s][k] and k not in ("max_seconds", "steps", "algorithm")
  }
  rows = rl["prompts_per_step"] * rl["group_size"]
  runs = bench_runs(bench, work)
  sao_policy = sao_policy_for(cfg) if args.sao_policy == "auto" else args.sao_policy
  # The bench run's resolved config: what the simulation reproduces.
  rf = results_file.ResultFile(args.out, series=f"validate_sim/{cfg['name']}", config=cfg)
  report = {
    "commit": cal["provenance"].get("commit"),  # the calibration's; this run's is in provenance
    "bench": str(bench),
    "workdir": str(work),
    "bench_runs": len(runs),
    "costs": args.costs,
    "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
    "load_during": load,
    "config_differences_bench_vs_calibration": diffs,
    "calibration_machine": cal.get("machine"),
    "arms": {},
  }
  for arm, (policy, kw) in arm_scenarios(cfg, sao_policy).items():
    if arm not in runs[0]:
      continue
    per_run = [real_metrics(bench, arm, rows, k, work) for k in range(len(runs))]
    real, real_se = mean_over_runs(per_run)
    scenarios = [
      (
        sim.preset(policy, sim.Scenario(seconds=r["wall_s"], **kw)),
        r["preloop_s"] if arm in SAMPLER_ARMS else 0.0,
      )
      for r in per_run
    ]
    predicted = simulated(costs, scenarios, args.seeds)
    errs = compare(real, predicted)
    report["arms"][arm] = {
      "policy": policy,
      "scenario": scenarios[0][0].__dict__,
      "scenarios": [[sc.__dict__, pre] for sc, pre in scenarios],
      "real": real,
      "real_se": real_se,
      "real_runs": per_run,
      "simulated": predicted,
      "relative_error": errs,
      "within_10pct": {k: abs(v) <= 0.10 for k, v in errs.items()},
    }
  # Diagnostic: the same simulation with the update cost a GRPO arm itself logged (median
  # learner_time after its first step) in place of the calibrated one, both update kinds
  # scaled alike: what is left of the error is not the update's cost level.
  ref = next((a for a in ("grpo", "grpo_samplers") if a in runs[0]), None)
  logged = (
    []
    if ref is None
    else [
      r["learner_time"]
      for run in runs
      for r in [
        r for r in read_jsonl(run[ref][1]) if r.get("phase") == "rl" and "learner_time" in r
      ][1:]
    ]
  )
  if logged:
    in_run = float(np.median(logged))
    f = in_run / costs.update("grpo", rows)
    scaled = costs.replace(
      update_s={k: tuple((n, t * f) for n, t in v) for k, v in costs.update_s.items()}
    )
    diag = {"update_scale": f, "update_logged_by": ref, "grpo_update_in_run_s": in_run, "arms": {}}
    for arm, r in report["arms"].items():
      scenarios = [(sim.Scenario(**sc), pre) for sc, pre in r["scenarios"]]
      pred = simulated(scaled, scenarios, args.seeds)
      diag["arms"][arm] = {"simulated": pred, "relative_error": compare(r["real"], pred)}
    report["diagnostic_in_run_update_cost"] = diag
  for base in ("grpo", "grpo_samplers"):
    if base in report["arms"] and "sao" in report["arms"]:
      g, a = report["arms"][base], report["arms"]["sao"]
      report[f"ratios_sao_over_{base}"] = {
        key: {
          "real": a["real"][key] / g["real"][key],
          "simulated": a["simulated"][key] / g["simulated"][key],
        }
        for key in ("trajectories_per_s", "learner_busy", "delay_mean_s")
        if g["real"].get(key) and g["simulated"].get(key)
      }
  out = rf.finish(report)
  report = rf.doc
  print(f"\n{'metric':30s} {'arm':13s} {'real':>10s} {'simulated':>10s} {'error':>8s}")
  for arm, r in report["arms"].items():
    for key, err in r["relative_error"].items():
      print(f"{key:30s} {arm:13s} {r['real'][key]:10.3f} {r['simulated'][key]:10.3f} {err:+8.1%}")
  diag = report.get("diagnostic_in_run_update_cost")
  if diag:
    print(
      f"\nwith the update cost logged in the {diag['update_logged_by']} arm "
      f"(x{diag['update_scale']:.2f}):"
    )
    for arm, r in diag["arms"].items():
      print("  " + arm + ": " + ", ".join(f"{k} {v:+.1%}" for k, v in r["relative_error"].items()))
  print(f"results: {out}")
  return report


if __name__ == "__main__":
  main()
