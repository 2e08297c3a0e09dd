"""Produce -> consume latency and throughput of trajectory records: the embedded transport
(multiprocessing queue) against Kafka on the local broker, side by side in one run; then the
SAO learner's busy fraction with each transport, in two otherwise identical runs.

  python experiments/bench_transport.py               # ~4 min (2 x 60 s of SAO)
  python experiments/bench_transport.py --quick       # ~1 min (smoke test)
  python experiments/bench_transport.py --sao-seconds 90 --sao-repeats 2 --sao-config \
      experiments/configs/sao_arith.py                # the full-size SAO config (~10 min)

A producer process encodes records (`sao_jax.transport.records`, with its send time) and
sends them; this process receives, decodes, and takes the time. Latency: records sent one
every `--gap-ms`, p50/p99 over `--latency-n`. Throughput: a burst of records as fast as the
producer can, MB/s of payload received. Client settings (from the module docstring of
sao_jax.transport.kafka): producer linger_ms=0, acks=1; consumer fetch_max_wait_ms=25.

SAO arms (`sao` in OUT): one SFT-only run of `--sao-config` makes the warm start; then, one
after the other, `sao-jax train` runs RL from it (`init_from`) for `--sao-seconds` each, same
config and seed, with `transport.kind` embedded, then kafka (the run's own local broker, same
client settings; the samplers' task consumer group uses session_timeout_ms=6000,
heartbeat_interval_ms=2000); `--sao-repeats N` alternates the two N times and reports each
run and the means. Each arm reports its `summary.json` `rl` numbers: learner_busy
(time in the jitted update / RL wall time), learner_busy_steady (the same after the first 10
updates: sampler start-up, first compilations and the Kafka group join are paid once),
trajectories/s, tokens/s, sampling->training delay mean and p95 (trajectory end to the end
of the update that used it), steps, bad records,
held-out accuracy. Runs are subprocesses, so each arm starts from a cold JAX process.
Writes OUT (default results/bench_transport.json) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import pathlib
import platform
import subprocess
import tempfile
import time
import uuid

import numpy as np

from sao_jax.procs import train_argv
from sao_jax.results_file import ResultFile
from sao_jax.transport import records
from sao_jax.transport.base import EmbeddedSpec
from sao_jax.transport.broker import LocalBroker
from sao_jax.transport.kafka import KafkaSpec

SIZES = {"1KB": 1 << 10, "64KB": 64 << 10, "1MB": 1 << 20}
REPO = pathlib.Path(__file__).resolve().parents[1]
SAO_KEYS = (
  "learner_busy",
  "learner_busy_steady",
  "trajectories_per_s",
  "tokens_per_s",
  "delay_mean_s",
  "delay_p95_s",
  "steps",
  "trajectories",
  "bad_records",
  "accuracy",
)


def _record(i: int, nbytes: int) -> bytes:
  payload = np.zeros(max(nbytes - 200, 1) // 4, np.float32)
  return records.encode(
    records.RecordKind.TRAJECTORY, i, 0, {"x": payload}, {"t_send": time.monotonic()}
  )


def _produce(spec, nbytes: int, n: int, gap_s: float, ready, done) -> None:
  end = spec.sampler_end()
  ready.wait()
  for i in range(n):
    end.put_trajectory(_record(i, nbytes))
    if gap_s:
      time.sleep(gap_s)
  end.ack_tasks()
  end.flush()  # every record delivered
  done.wait(120)  # a queue's feeder thread must outlive the last put until it is read
  end.close()


def _measure(ctx, spec, nbytes: int, n: int, gap_s: float, timeout: float = 120.0) -> dict:
  learner = spec.learner_end()
  ready, done = ctx.Event(), ctx.Event()
  proc = ctx.Process(target=_produce, args=(spec, nbytes, n, gap_s, ready, done), daemon=True)
  proc.start()
  try:
    # Kafka: let the consumer's first (empty) fetch settle before timing starts.
    learner.get_trajectories(1, timeout=0.5)
    ready.set()
    lat, got, total, t0 = [], 0, 0, None
    deadline = time.monotonic() + timeout
    while got < n and time.monotonic() < deadline:
      for data in learner.get_trajectories(n - got, timeout=0.5):
        now = time.monotonic()
        rec = records.decode(data)
        lat.append(now - rec.meta["t_send"])
        t0 = t0 or rec.meta["t_send"]
        got += 1
        total += len(data)
    elapsed = time.monotonic() - t0 if t0 else float("nan")
  finally:
    done.set()
    proc.join(timeout=30)
    if proc.is_alive():
      proc.kill()
    learner.close()
  lat_ms = 1000 * np.asarray(lat or [np.nan])
  return {
    "received": got,
    "sent": n,
    "p50_ms": float(np.percentile(lat_ms, 50)),
    "p99_ms": float(np.percentile(lat_ms, 99)),
    "mb_per_s": total / 2**20 / elapsed,
  }


def _spec(name: str, ctx, broker):
  """A fresh transport (a new queue, or new topics) for each measurement."""
  if name == "embedded":
    return EmbeddedSpec(ctx)
  spec = KafkaSpec(broker.bootstrap, f"bench-{uuid.uuid4().hex[:8]}", partitions=1)
  spec.create_topics()
  return spec


def _train(config: str, workdir: pathlib.Path, sets: list[str]) -> dict:
  """One `sao-jax train` subprocess; its summary.json."""
  cmd = train_argv(config, workdir, sets)
  t0 = time.monotonic()
  proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
  if proc.returncode != 0:
    raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
  return dict(
    json.loads((workdir / "summary.json").read_text()), process_wall_s=time.monotonic() - t0
  )


def sao_arms(config: str, seconds: float, steps: int = 0, repeats: int = 1) -> dict:
  """The same SAO run over each transport, from one shared SFT warm start. With `repeats` > 1
  the arms alternate (embedded, kafka, embedded, kafka, ...), so that a change in the
  machine's load during the benchmark falls on both transports alike."""
  out: dict = {
    "config": config,
    "seconds_per_arm": seconds,
    "steps_per_arm": steps,
    "repeats": repeats,
    "order": [],
  }
  runs: dict[str, list[dict]] = {"embedded": [], "kafka": []}
  with tempfile.TemporaryDirectory(prefix="bench-sao-") as tmp:
    tmp = pathlib.Path(tmp)
    sft = _train(config, tmp / "sft", ["rl.steps=0", "rl.max_seconds=0"])
    out["sft_accuracy"] = sft["sft"]["accuracy"]
    for rep in range(repeats):
      for kind in ("embedded", "kafka"):
        summary = _train(
          config,
          tmp / f"{kind}{rep}",
          [
            f"init_from={tmp / 'sft'}",
            "sft.steps=0",
            "sft.max_seconds=0",
            f"rl.max_seconds={seconds}",
            f"rl.steps={steps}",
            f"transport.kind={kind}",
          ],
        )
        r = dict({k: summary["rl"][k] for k in SAO_KEYS}, process_wall_s=summary["process_wall_s"])
        runs[kind].append(r)
        out["order"].append(kind)
        steady = r["learner_busy_steady"]
        print(
          f"sao over {kind:8s} (run {rep + 1}/{repeats}) busy {r['learner_busy']:6.1%} "
          f"(steady {'-' if steady is None else format(steady, '.1%')})  "
          f"{r['trajectories_per_s']:7.1f} traj/s  delay mean {r['delay_mean_s']:6.3f} s "
          f"p95 {r['delay_p95_s']:6.3f} s  steps {r['steps']}  bad {r['bad_records']}",
          flush=True,
        )
  for kind, rs in runs.items():
    # The arm's numbers: the mean over its runs (each run's own numbers are kept in `runs`).
    out[kind] = {
      k: float(np.mean([r[k] for r in rs]))
      for k in rs[0]
      if all(isinstance(r[k], (int, float)) for r in rs)
    }
    out[kind]["runs"] = rs
  out["busy_kafka_over_embedded"] = out["kafka"]["learner_busy"] / max(
    out["embedded"]["learner_busy"], 1e-9
  )
  for key, name in (("learner_busy", "busy_points"), ("learner_busy_steady", "steady_busy_points")):
    if any(r[key] is None for rs in runs.values() for r in rs):
      continue  # too few updates for a steady state (--quick)
    out[f"{name}_kafka_minus_embedded"] = 100 * (out["kafka"][key] - out["embedded"][key])
    out[f"{name}_per_pair"] = [
      100 * (k[key] - e[key]) for e, k in zip(runs["embedded"], runs["kafka"], strict=True)
    ]
    print(
      f"{key}, kafka - embedded: {out[f'{name}_kafka_minus_embedded']:+.1f} points "
      f"(per pair: {', '.join(f'{d:+.1f}' for d in out[f'{name}_per_pair'])})",
      flush=True,
    )
  return out


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--latency-n", type=int, default=300)
  p.add_argument("--throughput-mb", type=float, default=64.0)
  p.add_argument("--gap-ms", type=float, default=5.0)
  p.add_argument(
    "--sao-config",
    default="experiments/configs/sao_arith.py:tiny",
    help="config of the SAO arms (path[:variant])",
  )
  p.add_argument(
    "--sao-seconds", type=float, default=60.0, help="RL seconds per SAO arm (0: skip the SAO arms)"
  )
  p.add_argument(
    "--sao-repeats", type=int, default=1, help="runs per SAO arm, alternating embedded and kafka"
  )
  p.add_argument("--quick", action="store_true")
  p.add_argument("--out", default="results/bench_transport.json")
  args = p.parse_args(argv)
  if args.quick:
    args.latency_n, args.throughput_mb = 30, 4.0
  sao_steps = 0
  if args.quick and args.sao_seconds:
    sao_steps, args.sao_seconds = 4, 0.0  # a few steps: the arms run, nothing is measured
  ctx = mp.get_context("spawn")
  results: dict = {
    "settings": vars(args),
    "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
  }
  with LocalBroker() as broker:
    for name in ("embedded", "kafka"):
      for size, nbytes in SIZES.items():
        lat = _measure(ctx, _spec(name, ctx, broker), nbytes, args.latency_n, args.gap_ms / 1000)
        burst_n = max(10, int(args.throughput_mb * 2**20 / nbytes))
        thr = _measure(ctx, _spec(name, ctx, broker), nbytes, burst_n, 0.0)
        results.setdefault(name, {})[size] = {
          "latency_p50_ms": lat["p50_ms"],
          "latency_p99_ms": lat["p99_ms"],
          "throughput_mb_per_s": thr["mb_per_s"],
          "lost": (lat["sent"] - lat["received"]) + (thr["sent"] - thr["received"]),
        }
        print(
          f"{name:9s} {size:5s} p50 {lat['p50_ms']:7.2f} ms  p99 {lat['p99_ms']:7.2f} ms  "
          f"{thr['mb_per_s']:8.1f} MB/s  lost {results[name][size]['lost']}",
          flush=True,
        )
  if args.sao_seconds or sao_steps:
    results["sao"] = sao_arms(args.sao_config, args.sao_seconds, sao_steps, args.sao_repeats)
  # opened after the runs: reading the machine starts a JAX backend, not wanted while measuring
  rf = ResultFile(args.out, series="bench_transport" + ("/quick" if args.quick else ""))
  print(f"results: {rf.finish(results)}")
  return rf.doc


if __name__ == "__main__":
  main()
