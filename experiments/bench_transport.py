"""Produce -> consume latency and throughput of trajectory records: the embedded transport
(multiprocessing queue) against Kafka on the local broker, side by side in one run.

  python experiments/bench_transport.py               # ~1 min
  python experiments/bench_transport.py --quick       # seconds (smoke test)

A producer process encodes records (`sao_jax.transport.records`, with its send time) and
sends them; this process receives, decodes, and takes the time. Latency: records sent one
every `--gap-ms`, p50/p99 over `--latency-n`. Throughput: a burst of records as fast as the
producer can, MB/s of payload received. Client settings (from the module docstring of
sao_jax.transport.kafka): producer linger_ms=0, acks=1; consumer fetch_max_wait_ms=25.
Writes OUT (default results/bench_transport.json) and prints a table.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import pathlib
import platform
import time
import uuid

import numpy as np

from sao_jax.transport import records
from sao_jax.transport.base import EmbeddedSpec
from sao_jax.transport.broker import LocalBroker
from sao_jax.transport.kafka import KafkaSpec

SIZES = {"1KB": 1 << 10, "64KB": 64 << 10, "1MB": 1 << 20}


def _record(i: int, nbytes: int) -> bytes:
  payload = np.zeros(max(nbytes - 200, 1) // 4, np.float32)
  return records.encode(records.RecordKind.TRAJECTORY, i, 0, {"x": payload},
                        {"t_send": time.monotonic()})


def _produce(spec, nbytes: int, n: int, gap_s: float, ready, done) -> None:
  end = spec.sampler_end()
  ready.wait()
  for i in range(n):
    end.put_trajectory(_record(i, nbytes))
    if gap_s:
      time.sleep(gap_s)
  end.ack_tasks()  # flushes the Kafka producer
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
  return {"received": got, "sent": n, "p50_ms": float(np.percentile(lat_ms, 50)),
          "p99_ms": float(np.percentile(lat_ms, 99)), "mb_per_s": total / 2**20 / elapsed}


def _spec(name: str, ctx, broker):
  """A fresh transport (a new queue, or new topics) for each measurement."""
  if name == "embedded":
    return EmbeddedSpec(ctx)
  spec = KafkaSpec(broker.bootstrap, f"bench-{uuid.uuid4().hex[:8]}", partitions=1)
  spec.create_topics()
  return spec


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--latency-n", type=int, default=300)
  p.add_argument("--throughput-mb", type=float, default=64.0)
  p.add_argument("--gap-ms", type=float, default=5.0)
  p.add_argument("--quick", action="store_true")
  p.add_argument("--out", default="results/bench_transport.json")
  args = p.parse_args(argv)
  if args.quick:
    args.latency_n, args.throughput_mb = 30, 4.0
  ctx = mp.get_context("spawn")
  results: dict = {"settings": vars(args), "machine": {"platform": platform.platform(),
                                                       "cpus": os.cpu_count()}}
  with LocalBroker() as broker:
    for name in ("embedded", "kafka"):
      for size, nbytes in SIZES.items():
        lat = _measure(ctx, _spec(name, ctx, broker), nbytes, args.latency_n,
                       args.gap_ms / 1000)
        burst_n = max(10, int(args.throughput_mb * 2**20 / nbytes))
        thr = _measure(ctx, _spec(name, ctx, broker), nbytes, burst_n, 0.0)
        results.setdefault(name, {})[size] = {
            "latency_p50_ms": lat["p50_ms"], "latency_p99_ms": lat["p99_ms"],
            "throughput_mb_per_s": thr["mb_per_s"],
            "lost": (lat["sent"] - lat["received"]) + (thr["sent"] - thr["received"])}
        print(f"{name:9s} {size:5s} p50 {lat['p50_ms']:7.2f} ms  p99 {lat['p99_ms']:7.2f} ms  "
              f"{thr['mb_per_s']:8.1f} MB/s  lost {results[name][size]['lost']}", flush=True)
  out = pathlib.Path(args.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  out.write_text(json.dumps(results, indent=2))
  print(f"results: {out}")
  return results


if __name__ == "__main__":
  main()
