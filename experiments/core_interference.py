"""Are this machine's cores separate hardware? The same single-threaded XLA work (a dense f32
matmul, and a memory-bound elementwise pass over a large array) timed on core 0 alone, then
on core 0 while core 1 runs the same work. On two physical cores with private caches the
rate stays near 1x; on two hyperthreads of one core (what a 2-vCPU virtual machine may be
given, and cannot see: lscpu reports what the hypervisor presents) or under a shared memory
bottleneck it falls well below.

This is the limit of "roles on separate cores" here: the learner's update slows by this
factor whenever the samplers decode at the same time, which SAO makes them do and
synchronous GRPO does not.

  python experiments/core_interference.py --out results/bench_longtail_pinned/core_interference.json

Each measurement runs in fresh processes pinned with os.sched_setaffinity, XLA on one thread;
3 rounds, mean and standard error. Needs a quiet machine (about 1 minute).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from sao_jax.results_file import ResultFile
from sao_jax.stats import fmt, summarize

WORKER = r"""
import os, sys, time
os.sched_setaffinity(0, {int(sys.argv[1])})
import jax, jax.numpy as jnp
kind, seconds = sys.argv[2], float(sys.argv[3])
if kind == "matmul":
  n = 512
  x = jnp.ones((n, n), jnp.float32)
  f = jax.jit(lambda a: (a @ a) * 1e-3)
  work = 2 * n**3
else:  # memory-bound: 64 MiB read + written per pass
  x = jnp.ones((16 * 2**20,), jnp.float32)
  f = jax.jit(lambda a: a * 1.0001 + 1e-6)
  work = x.size
y = f(x).block_until_ready()
sys.stdout.write("ready\n"); sys.stdout.flush()
sys.stdin.readline()
t0, n_done = time.perf_counter(), 0
while time.perf_counter() - t0 < seconds:
  y = f(y if kind != "matmul" else x).block_until_ready()
  n_done += 1
print(n_done * work / (time.perf_counter() - t0))
"""


def run(cores: list[int], kind: str, seconds: float) -> list[float]:
  """Starts one pinned worker per core, releases them together, returns their rates."""
  env = dict(
    os.environ,
    XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
    OMP_NUM_THREADS="1",
  )
  procs = [
    subprocess.Popen(
      [sys.executable, "-c", WORKER, str(c), kind, str(seconds)],
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      text=True,
      env=env,
    )
    for c in cores
  ]
  try:
    for p in procs:
      assert p.stdout.readline().strip() == "ready"
    for p in procs:
      p.stdin.write("go\n")
      p.stdin.flush()
    return [float(p.communicate(timeout=seconds + 120)[0].strip()) for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()


def main() -> None:
  ap = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  ap.add_argument("--seconds", type=float, default=5.0)
  ap.add_argument("--rounds", type=int, default=3)
  ap.add_argument("--out", default="results/bench_longtail_pinned/core_interference.json")
  args = ap.parse_args()
  if len(os.sched_getaffinity(0)) < 2:
    raise SystemExit("needs at least two cores")
  a, b = sorted(os.sched_getaffinity(0))[:2]
  rf = ResultFile(args.out, series="core_interference")
  out = {"cores": [a, b], "seconds": args.seconds, "kinds": {}}
  for kind in ("matmul", "memory"):
    solo, shared = [], []
    for _ in range(args.rounds):
      solo.append(run([a], kind, args.seconds)[0])
      shared.append(run([a, b], kind, args.seconds)[0])
    ratio = [s / x for s, x in zip(shared, solo, strict=True)]
    out["kinds"][kind] = {
      "unit": "FLOP/s" if kind == "matmul" else "elements/s",
      "solo": summarize(solo),
      "with_other_core_busy": summarize(shared),
      "rate_ratio": summarize(ratio),
    }
    print(
      f"{kind}: core {a} alone {fmt(summarize(solo))}, with core {b} busy "
      f"{fmt(summarize(shared))}: {fmt(summarize(ratio), '{:.2f}')}x"
    )
  path = rf.finish(out)
  print(f"results: {path}")


if __name__ == "__main__":
  main()
