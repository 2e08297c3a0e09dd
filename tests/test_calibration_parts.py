"""The pure parts of the simulator's calibration (`sao_jax.bench.calibrate_*`, driven by
experiments/calibrate_sim.py): the two-point decode/prefill fit, the transport costs read from
bench_transport's file, and the `sim.Costs` the measured parts make, without timing anything."""

from __future__ import annotations

import json

import pytest

from sao_jax.bench.calibrate_learner import InProcess, build_costs, transport_costs
from sao_jax.bench.calibrate_sampler import two_point


def test_two_point_fits_decode_and_prefill():
  # 10-token calls take 0.1 + 0.02 * 10 s, 1-token ones 0.1 + 0.02 s.
  full = [(10, 0.3), (10, 0.3), (7, 0.2)]  # the short call is left out of the median
  f = two_point(full, [0.12, 0.12], 10, check=[(5, 0.2), (10, 0.3)])
  assert f["decode_s"] == pytest.approx(0.02) and f["prefill_s"] == pytest.approx(0.1)
  assert f["full_length_calls"] == 2 and f["n"] == 5
  assert f["check_rel_err"] == pytest.approx(0.0, abs=1e-9)
  assert two_point(full, [0.12], 10, check=[])["check_rel_err"] is None


def test_transport_costs_from_the_transport_benchmark(tmp_path):
  path = tmp_path / "bench_transport.json"
  emb = {"1KB": {"latency_p50_ms": 0.5}, "64KB": {"latency_p50_ms": 2.0}}
  emb["1MB"] = {"throughput_mb_per_s": 100.0}
  path.write_text(json.dumps({"embedded": emb}))
  assert transport_costs(str(path), b"x" * 100) == (0.0005, 100.0 * 2**20, str(path))
  assert transport_costs(str(path), b"x" * 40_000)[0] == 0.002


def test_build_costs_from_measured_parts():
  fit = {"decode_s": 0.01, "prefill_s": 0.1}
  run = InProcess(
    rows=16,
    tasks=[],
    lengths=[3, 5],
    inline_compile=2.0,
    inline_fits={16: fit, 64: {"decode_s": 0.02, "prefill_s": 0.2}},
    inline_raw={},
    score_s=1e-4,
    update_pts={"sao": {8: 0.5, 16: 0.9}, "grpo": {16: 1.0}},
    update_compile={"sao": 3.0, "grpo": 4.0},
    uprogs={},
    ustates={},
    batch_for=None,
  )
  cont = {
    "score_s": 2e-4,
    "fill_s": {"8": 0.01},
    "slot_decode_s": {"1": 0.001, "8": 0.002},
    "slots": 8,
    "decode_call_s": 0.003,
    "refresh_s": 0.05,
  }
  solo = {"fits": {8: fit}, "emit_s": 1e-3, "start_s": 5.0, "load_s": 0.2, "record_bytes": 900}
  contended = {"solo": dict(solo, continuous=cont), "update_slowdown": 0.9}
  contended["sampling_slowdown"] = 1.5
  periodic = {"sao": [["shadow_validation", 10, 0.4]], "grpo": []}
  overheads = {"sao_overhead": 0.01, "grpo_overhead": 0.02, "periodic": periodic}
  overheads["publish_s"] = 0.03
  c = build_costs(run, overheads, contended, latency_s=1e-3, bandwidth=1e8)
  assert c.profiles["inline"].decode_s == ((16.0, 0.01), (64.0, 0.02))
  assert c.profiles["inline"].start_s == 2.0
  s = c.profiles["sampler"]
  assert s.slot_decode_s == ((1.0, 0.001), (8.0, 0.002)) and s.refresh_s == ((8.0, 0.05),)
  assert c.update_s["sao"] == ((8.0, 0.5), (16.0, 0.9)) and c.lengths == (3, 5)
  assert c.update_with_sampling == 1.0 and c.sampling_with_update == 1.5  # at least 1
  assert c.periodic["sao"] == (("shadow_validation", 10, 0.4),)
