"""The simulator's experiment scripts: validation arithmetic, seed-scale cost rules, and a
smoke run of the calibration."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import sim_seed_scale
import validate_sim
from conftest import REPO_ROOT, subprocess_env

from sao_jax.bench import sim_validation
from sao_jax.sim import Costs, Profile, Scenario, preset, simulate


def _costs() -> Costs:
  prof = Profile(
    decode_s=((8, 0.002), (64, 0.01)), prefill_s=((8, 0.01), (64, 0.02)), emit_s=1e-4, start_s=1.0
  )
  return Costs(
    profiles={"sampler": prof, "inline": prof},
    update_s={"sao": ((128, 0.6),), "grpo": ((128, 0.6),)},
    lengths=(10, 14, 20),
    record_bytes=700.0,
    step_overhead_s={"sao": 0.01, "grpo": 0.002},
  )


def test_real_metrics_share_one_clock(tmp_path):
  """wall = trajectories / trajectories_per_s; steady rates from the metrics rows."""
  arm = tmp_path / "grpo"
  arm.mkdir()
  info = {
    "trajectories": 128 * 40,
    "trajectories_per_s": 128 * 40 / 80.0,
    "steps": 40,
    "seconds": 82.0,
    "learner_busy": 0.5,
    "delay_mean_s": 0.6,
    "delay_p95_s": 0.7,
  }
  (tmp_path / "results.json").write_text(json.dumps({"grpo": info}))
  # one step per 2 s from t=3 (writer clock) = t=1 (loop clock); busy 1 s per step
  rows = [
    {"phase": "rl", "step": k, "wall_s": 2.0 + 2 * k, "learner_busy": k / (2 * k)}
    for k in range(1, 41)
  ]
  (arm / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
  real = sim_validation.real_metrics(tmp_path, "grpo", 128)
  assert real["learner_steps_per_s"] == pytest.approx(0.5)
  assert real["preloop_s"] == pytest.approx(2.0)
  assert real["trajectories_per_s_steady"] == pytest.approx(64.0)
  assert real["learner_busy_steady"] == pytest.approx(0.5)
  errs = sim_validation.compare(real, {"learner_steps_per_s": 0.55, "learner_busy": 0.5})
  assert errs == pytest.approx({"learner_steps_per_s": 0.1, "learner_busy": 0.0})


def test_validation_reads_the_seeded_benchmark_and_simulates_each_arm(tmp_path):
  """bench_sync_vs_async's layout (runs[i][arm], metrics under the workdir): per-seed real
  metrics averaged, each arm simulated with the policy its config ran."""
  cfg = {
    "model": {},
    "task": {},
    "rl": {"prompts_per_step": 16, "group_size": 8},
    "sao": {
      "num_samplers": 1,
      "sampler_slots": 8,
      "batch_size": 128,
      "max_staleness": 4,
      "param_sync_every": 1,
      "continuous": True,
      "refill_rows": 4,
      "inflight": "tokens",
    },
  }
  bench, work = tmp_path / "bench", tmp_path / "work"
  bench.mkdir()
  runs = []
  for seed, rate in ((0, 64.0), (1, 96.0)):
    run = {"seed": seed}
    for arm in ("grpo", "grpo_samplers", "sao"):
      run[arm] = {
        "trajectories": 128 * 20,
        "trajectories_per_s": rate,
        "steps": 20,
        "seconds": 128 * 20 / rate + 1.0,
        "learner_busy": 0.5,
        "delay_mean_s": 0.6,
        "delay_p95_s": 0.7,
      }
      d = work / f"seed{seed}" / arm
      d.mkdir(parents=True)
      (d / "metrics.jsonl").write_text(
        "\n".join(
          json.dumps(
            {
              "phase": "rl",
              "step": k,
              "wall_s": 2.0 * k,
              "learner_busy": 0.5,
              "learner_time": 0.6 * k,
            }
          )
          for k in (1, 2, 3)
        )
      )  # the first step is left out
    runs.append(run)
  (bench / "results.json").write_text(json.dumps({"config": cfg, "runs": runs}))
  costs = tmp_path / "costs.json"
  costs.write_text(json.dumps({"costs": _costs().to_dict(), "config": cfg}))
  r = validate_sim.main(
    [
      "--bench",
      str(bench),
      "--workdir",
      str(work),
      "--costs",
      str(costs),
      "--seeds",
      "1",
      "--out",
      str(tmp_path / "val.json"),
    ]
  )
  arms = r["arms"]
  assert {a: arms[a]["policy"] for a in arms} == {
    "grpo": "grpo_inline",
    "grpo_samplers": "grpo_continuous",
    "sao": "sao_inflight",
  }
  assert arms["sao"]["scenario"]["refill_rows"] == 4 and arms["sao"]["scenario"]["inflight"]
  assert arms["sao"]["real"]["trajectories_per_s"] == pytest.approx(80.0)
  assert arms["sao"]["real_se"]["trajectories_per_s"] == pytest.approx(16.0)
  assert [s["seconds"] for s, _ in arms["sao"]["scenarios"]] == pytest.approx([40, 128 * 20 / 96])
  assert arms["sao"]["simulated"]["trajectories_per_s"] > 0
  # logged 1.2 and 1.8 s (median 1.5) against 0.6 s calibrated at 128 rows
  assert r["diagnostic_in_run_update_cost"]["update_scale"] == pytest.approx(1.5 / 0.6)
  assert set(r["ratios_sao_over_grpo_samplers"]) >= {"trajectories_per_s", "learner_busy"}
  assert r["provenance"]["commit"] and r["provenance"]["command"]


def test_seed_scale_costs_follow_the_stated_rules():
  cal = {
    "costs": _costs().to_dict(),
    "details": {"model_params": 6e5, "matmul_flops_per_s": 1e11},
    "config": {"model": {"max_len": 96}, "sao": {"batch_size": 128}},
  }
  lengths = sim_seed_scale.lengths_for("measured_shape", (10, 14, 20))
  assert sum(lengths) / len(lengths) == pytest.approx(2000, rel=0.01)
  costs, how = sim_seed_scale.scale_costs(cal, lengths)
  seed = sim_seed_scale.SEED
  rows = seed["prompts_per_step"] * seed["group_size"]
  tokens = rows * (seed["prompt_tokens"] + sum(lengths) / len(lengths))
  flops = seed["learner_nodes"] * seed["gpus_per_node"] * seed["gpu_bf16_flops"] * seed["train_mfu"]
  assert costs.update("sao", rows) == pytest.approx(6 * seed["model_params"] * tokens / flops)
  dec = dict(costs.profiles["sampler"].decode_s)
  mem_bound = seed["model_params"] / (16 * seed["gpu_hbm_bytes_per_s"] * seed["eta_mem"])
  assert dec[1.0] == pytest.approx(mem_bound)  # one row: weight streaming dominates
  assert dec[256.0] > dec[64.0] > mem_bound * 0.99  # many rows: compute dominates
  assert how["decode_at_slots_by_model_size_ratio"] > 0


def test_seed_scale_sweep_runs_and_marks_saturation(tmp_path):
  cal = {
    "costs": _costs().to_dict(),
    "details": {"model_params": 6e5, "matmul_flops_per_s": 1e11},
    "config": {"model": {"max_len": 96}, "sao": {"batch_size": 128}},
    "commit": "x",
  }
  path = tmp_path / "cal.json"
  path.write_text(json.dumps(cal))
  out = tmp_path / "scale.json"
  r = sim_seed_scale.main(
    [
      "--costs",
      str(path),
      "--nodes",
      "16,400",
      "--steps",
      "12",
      "--table-steps",
      "12",
      "--lengths",
      "measured_shape",
      "--out",
      str(out),
    ]
  )
  runs = r["runs"]["measured_shape"]
  assert [x["sampler_nodes"] for x in runs["grpo"]] == [16, 400]
  sao_big = runs["sao_inflight"][-1]
  assert sao_big["learner_busy"] > runs["grpo"][-1]["learner_busy"]
  assert out.with_suffix(".png").stat().st_size > 0
  assert json.loads(out.read_text())["table"]["measured_shape"]["sampler_nodes"] == 400


@pytest.mark.slow
def test_calibrate_sim_tiny_writes_loadable_costs(tmp_path):
  out = tmp_path / "costs.json"
  cmd = [
    sys.executable,
    str(REPO_ROOT / "experiments" / "calibrate_sim.py"),
    "--variant",
    "tiny",
    "--quick",
    "--out",
    str(out),
  ]
  scratch = tmp_path / "tmp"  # its scratch folder goes here, and is removed at the end
  scratch.mkdir()
  proc = subprocess.run(
    cmd,
    cwd=REPO_ROOT,
    capture_output=True,
    text=True,
    timeout=600,
    env=dict(subprocess_env(), TMPDIR=str(scratch)),
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert not list(scratch.glob("calib_*"))
  r = json.loads(out.read_text())
  costs = Costs.from_dict(r["costs"])
  assert costs.update("sao", 16) > 0 and costs.publish_s > 0 and costs.load_s > 0
  assert costs.profiles["sampler"].start_s > 0 and len(costs.lengths) > 0
  assert (
    r["provenance"]["commit"] and r["machine"]["cpus"] >= 1 and r["details"]["model_params"] > 0
  )
  prof = costs.profiles["sampler"]  # the continuous sampler's programs, measured
  assert prof.slot_rows == 8 and prof.decode_call_s > 0 and prof.score_s > 0
  assert all(sec > 0 for pts in (prof.fill_s, prof.slot_decode_s, prof.refresh_s) for _, sec in pts)
  m = simulate(
    costs, preset("sao_inflight", Scenario(slots=8, refill_rows=8, batch_size=16, steps=20))
  )
  assert m["steps"] == 20 and m["trajectories_per_s"] > 0
