"""The calibrated simulator at the source document's scale: up to 400 sampler nodes, 8 learner
nodes, a 750B-parameter policy; throughput and learner utilisation against the number of
sampler nodes for synchronous GRPO(N=8) and SAO (200 learner steps per point), and the
table at 200 sampler nodes over a 1,000-step horizon.

  python experiments/sim_seed_scale.py                  # ~10 min: results/sim_scale.{json,png}
  python experiments/sim_seed_scale.py --steps 50 --table-steps 50 --nodes 16,200 \
      --out /tmp/s.json                                 # quick

Costs come from results/sim_costs.json (measured on this machine) where they are mechanism
costs, and from a roofline of the seed's hardware where they are compute; every rule is
in `scale_costs` and copied into the JSON (`scaling`):

  decode      per token step of a sampler replica with B live slots:
              max(weight bytes / (GPUs x HBM B/s x eta_mem), 2 N B / (GPUs x FLOP/s x eta_flop))
              (memory-bound at small B, compute-bound at large B). The "model size ratio"
              rule, measured CPU decode x (N_seed / N_ours) x (our matmul FLOP/s / replica
              FLOP/s), is reported beside it as a cross-check.
  prefill     2 N x prompt tokens x rows / (GPUs x FLOP/s x eta_flop)
  update      6 N x tokens per batch / (learner nodes x 8 GPUs x FLOP/s x MFU): the update
              split evenly over the learner nodes (data/FSDP parallel, no pipeline bubble)
  weights     publish: bf16 weights out of the learner nodes' NICs; load: the sampler's
              (8-bit) weights into a replica's NICs, both at datacenter bandwidth
  transport   the seed's Kafka latency (1 ms) and the NIC bandwidth; record bytes per token
              from the calibration
  per record  our measured encode + send time, scaled by tokens per record
  learner     our measured per-step bookkeeping, scaled by rows per batch
  lengths     completion tokens: our measured lengths rescaled to the mean (low variance),
              and a long-tailed log-normal (coefficient of variation 1, capped): coding RL
              has long tails and the group barrier waits for them
GRPO spreads each step's rows evenly over all replicas (the fairest split for a barrier);
SAO runs 64 slots per replica with continuous batching and in-flight weight updates, and
today's sampler (a call waits for its longest row) as a third line.
"""

from __future__ import annotations

import argparse
import math
import os
import pathlib
import platform
import time

import numpy as np

from sao_jax import results_file, sim

SEED = {  # the source document's setting, and the hardware assumptions that fill its gaps
  "model_params": 750e9,
  "learner_nodes": 8,
  "gpus_per_node": 8,
  "gpu": "A100 80GB SXM",
  "gpu_bf16_flops": 312e12,
  "gpu_hbm_bytes_per_s": 2.039e12,
  "sampler_nodes_per_replica": 2,  # 8-bit weights (750 GB) + KV cache need 16 x 80 GB
  "sampling_weight_bytes_per_param": 1.0,
  "training_weight_bytes_per_param": 2.0,
  "eta_mem": 0.6,
  "eta_flop": 0.4,
  "train_mfu": 0.4,
  "nic_bytes_per_s_per_node": 200e9,  # 8 x 200 Gb/s InfiniBand HDR
  "transport_latency_s": 1e-3,  # the seed's Kafka figure
  "prompt_tokens": 1024,
  "mean_completion_tokens": 2000,
  "max_completion_tokens": 16384,
  "prompts_per_step": 64,
  "group_size": 8,
  "slots_per_replica": 64,
  "max_staleness": 4,
  "param_sync_every": 1,
}
SEED_CLAIMS = {
  "throughput_ratio": 2.3,
  "steps_per_s": (1.23, 2.85),
  "step_latency_s": (0.82, 0.35),
  "learner_utilisation_sao": 0.98,
  "delay_s": (1.2, 0.35),
}


def lengths_for(kind: str, measured: tuple[int, ...], seed: int = 0) -> tuple[int, ...]:
  mean, cap = SEED["mean_completion_tokens"], SEED["max_completion_tokens"]
  if kind == "measured_shape":
    a = np.asarray(measured, float)
    return tuple(np.clip(np.round(a * mean / a.mean()), 1, cap).astype(int).tolist())
  if kind == "lognormal_cv1":
    rng = np.random.default_rng(seed)
    sigma2 = math.log(2.0)  # cv^2 + 1 = 2
    x = rng.lognormal(math.log(mean) - sigma2 / 2, math.sqrt(sigma2), 20000)
    return tuple(np.clip(np.round(x), 16, cap).astype(int).tolist())
  raise ValueError(f"unknown length distribution {kind!r}")


def scale_costs(cal: dict, lengths: tuple[int, ...]) -> tuple[sim.Costs, dict]:
  """The seed-scale Costs and the record of how each was derived."""
  c = sim.Costs.from_dict(cal["costs"])
  det = cal["details"]
  n, g = SEED["model_params"], SEED["gpus_per_node"]
  rep_gpus = g * SEED["sampler_nodes_per_replica"]
  flops, hbm = SEED["gpu_bf16_flops"], SEED["gpu_hbm_bytes_per_s"]
  w_samp = n * SEED["sampling_weight_bytes_per_param"]

  def decode(b):
    return max(
      w_samp / (rep_gpus * hbm * SEED["eta_mem"]), 2 * n * b / (rep_gpus * flops * SEED["eta_flop"])
    )

  slots = SEED["slots_per_replica"]
  sizes = sorted({1, 8, 16, 32, 64, 128, 256, slots})
  prof = c.profiles["sampler"]
  tokens_ours = float(np.mean(c.lengths))
  tokens_seed = float(np.mean(lengths))
  rec_tokens_ours = tokens_ours + cal["config"]["model"]["max_len"]
  per_token_bytes = c.record_bytes / rec_tokens_ours
  rows = SEED["prompts_per_step"] * SEED["group_size"]
  tok_per_row = SEED["prompt_tokens"] + tokens_seed
  learner_flops = SEED["learner_nodes"] * g * flops * SEED["train_mfu"]
  upd = {r: 6 * n * r * tok_per_row / learner_flops for r in (rows // 2, rows, 2 * rows)}
  nic = SEED["nic_bytes_per_s_per_node"]
  emit = prof.emit_s * (SEED["prompt_tokens"] + tokens_seed) / rec_tokens_ours
  interp_ratio = (
    sim.interp(prof.decode_s, slots)
    * (n / det["model_params"])
    * det["matmul_flops_per_s"]
    / (rep_gpus * flops)
  )
  costs = sim.Costs(
    profiles={
      "sampler": sim.Profile(
        decode_s=tuple((float(b), decode(b)) for b in sizes),
        prefill_s=tuple(
          (float(b), 2 * n * SEED["prompt_tokens"] * b / (rep_gpus * flops * SEED["eta_flop"]))
          for b in sizes
        ),
        score_s=0.0,
        emit_s=emit,
        start_s=w_samp / (SEED["sampler_nodes_per_replica"] * nic) + 30.0,
      )
    },
    update_s={k: tuple((float(r), t) for r, t in upd.items()) for k in ("sao", "grpo")},
    lengths=lengths,
    step_overhead_s={
      k: v * rows / cal["config"]["sao"]["batch_size"] for k, v in c.step_overhead_s.items()
    },
    publish_s=n * SEED["training_weight_bytes_per_param"] / (SEED["learner_nodes"] * nic),
    load_s=w_samp / (SEED["sampler_nodes_per_replica"] * nic),
    transport_latency_s=SEED["transport_latency_s"],
    transport_bytes_per_s=nic,
    record_bytes=0.0,
    record_bytes_per_token=per_token_bytes,
  )
  how = {
    "decode_s_per_step": {str(b): decode(b) for b in sizes},
    "decode_rule": "max(W_8bit / (16 GPUs x HBM x eta_mem), 2 N B / (16 GPUs x FLOP/s x eta_flop))",
    "decode_at_slots_by_model_size_ratio": interp_ratio,
    "decode_at_slots_roofline": decode(slots),
    "prefill_rule": "2 N x prompt_tokens x rows / (16 GPUs x FLOP/s x eta_flop)",
    "update_s": {str(r): t for r, t in upd.items()},
    "update_rule": "6 N x rows x (prompt + mean completion tokens) / (8 nodes x 8 GPUs x "
    "FLOP/s x MFU)",
    "publish_rule": "bf16 weights / (8 learner nodes x NIC)",
    "load_rule": "8-bit weights / (2 replica nodes x NIC)",
    "emit_rule": "measured encode+send per record x tokens per record ratio",
    "step_overhead_rule": "measured per-step bookkeeping x rows ratio",
    "record_bytes_per_token": per_token_bytes,
    "lengths": sim.costs.lengths_summary(lengths),
    "ours": {
      "model_params": det["model_params"],
      "matmul_flops_per_s": det["matmul_flops_per_s"],
      "decode_at_slots_s": sim.interp(prof.decode_s, slots),
    },
  }
  return costs, how


def scenarios(
  replicas: int, steps: int, seed: int, depth_batches: float = 2.0
) -> dict[str, sim.Scenario]:
  rows = SEED["prompts_per_step"] * SEED["group_size"]
  common = dict(
    num_samplers=replicas,
    batch_size=rows,
    max_staleness=SEED["max_staleness"],
    param_sync_every=SEED["param_sync_every"],
    steps=steps,
    seed=seed,
  )
  # Tasks in flight, in batches: the runner's default (batch + 2 x samplers x slots) would be
  # 25 batches at 200 nodes, all of them aging in the queue of a learner-bound pipeline.
  depth = int(depth_batches * rows)
  return {
    "grpo": sim.preset("grpo", sim.Scenario(slots=math.ceil(rows / replicas), **common)),
    "sao_inflight": sim.preset(
      "sao_inflight", sim.Scenario(slots=SEED["slots_per_replica"], target_depth=depth, **common)
    ),
    "sao_batch": sim.preset(
      "sao_batch", sim.Scenario(slots=SEED["slots_per_replica"], target_depth=depth, **common)
    ),
  }


KEYS = (
  "trajectories_per_s",
  "learner_steps_per_s",
  "learner_busy",
  "learner_busy_steady",
  "step_latency_s",
  "delay_mean_s",
  "delay_p95_s",
  "delay_own_mean_s",
  "delay_own_p95_s",
  "staleness_mean",
  "staleness_hist",
  "dropped_stale",
  "sampler_busy",
  "decode_row_efficiency",
)


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--costs", default="results/sim_costs.json")
  p.add_argument(
    "--nodes",
    default="2,4,8,16,32,64,128,200,400",
    help="sampler node counts (a replica is 2 nodes)",
  )
  p.add_argument("--steps", type=int, default=200, help="learner steps per sweep point")
  p.add_argument(
    "--table-steps",
    type=int,
    default=1000,
    help="learner steps of the table's runs (at 200 sampler nodes)",
  )
  p.add_argument("--lengths", default="lognormal_cv1,measured_shape")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--out", default="results/sim_scale.json")
  args = p.parse_args(argv)
  t0 = time.time()
  cal = results_file.load(args.costs)
  nodes = [int(x) for x in args.nodes.split(",")]
  # The calibrated run's resolved config: the one the simulation scales up.
  rf = results_file.ResultFile(
    args.out, series="sim_seed_scale", config=cal["config"], devices=False
  )
  result = {
    "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
    "costs_from": args.costs,
    "calibration_commit": cal["provenance"].get("commit"),
    "seed_setting": SEED,
    "seed_claims": SEED_CLAIMS,
    "runs": {},
    "scaling": {},
  }
  for dist in args.lengths.split(","):
    lengths = lengths_for(dist, sim.Costs.from_dict(cal["costs"]).lengths, args.seed)
    costs, how = scale_costs(cal, lengths)
    result["scaling"][dist] = how
    runs = result["runs"][dist] = {}
    for k in nodes:
      replicas = max(1, k // SEED["sampler_nodes_per_replica"])
      for name, sc in scenarios(replicas, args.steps, args.seed).items():
        m = sim.simulate(costs, sc)
        runs.setdefault(name, []).append(
          {"sampler_nodes": k, "replicas": replicas, **{key: m[key] for key in KEYS}}
        )
        print(
          f"{dist:15s} {k:4d} nodes {name:13s} {m['trajectories_per_s']:8.3f} traj/s "
          f"busy {m['learner_busy']:.3f} step {m['step_latency_s']:.1f} s",
          flush=True,
        )
    sat = next(
      (r["sampler_nodes"] for r in runs["sao_inflight"] if r["learner_busy"] >= 0.95), None
    )
    result.setdefault("learner_saturates_at_nodes", {})[dist] = sat
    ref = 200 if 200 in nodes else nodes[-1]
    ref_runs = {
      name: sim.simulate(costs, sc)
      for name, sc in scenarios(
        ref // SEED["sampler_nodes_per_replica"], args.table_steps, args.seed
      ).items()
    }
    result.setdefault("table_runs", {})[dist] = {
      name: {key: m[key] for key in KEYS} for name, m in ref_runs.items()
    }
    # the queue depth trades learner idling against how long records wait for it
    result.setdefault("depth_sensitivity", {})[dist] = {
      str(db): {
        key: m[key]
        for key in (
          "learner_busy",
          "trajectories_per_s",
          "delay_mean_s",
          "delay_own_mean_s",
          "staleness_mean",
        )
      }
      for db in (1.25, 2.0, 3.0)
      for m in [
        sim.simulate(
          costs,
          scenarios(ref // SEED["sampler_nodes_per_replica"], args.steps, args.seed, db)[
            "sao_inflight"
          ],
        )
      ]
    }
    g, a = ref_runs["grpo"], ref_runs["sao_inflight"]
    result.setdefault("table", {})[dist] = {
      "sampler_nodes": ref,
      "steps": args.table_steps,
      "grpo": {
        k: g[k]
        for k in (
          "learner_steps_per_s",
          "trajectories_per_s",
          "step_latency_s",
          "learner_busy",
          "delay_mean_s",
          "delay_own_mean_s",
        )
      },
      "sao": {
        k: a[k]
        for k in (
          "learner_steps_per_s",
          "trajectories_per_s",
          "step_latency_s",
          "learner_busy",
          "delay_mean_s",
          "delay_own_mean_s",
        )
      },
      "throughput_ratio": a["trajectories_per_s"] / g["trajectories_per_s"],
      "delay_own_ratio": a["delay_own_mean_s"] / g["delay_own_mean_s"],
    }
  result["wall_s"] = time.time() - t0
  out = rf.finish(result)
  result = rf.doc
  plot(result, out.with_suffix(".png"))
  for dist, t in result["table"].items():
    print(
      f"\n{dist}: at {t['sampler_nodes']} sampler nodes, SAO/GRPO throughput "
      f"{t['throughput_ratio']:.2f}x (seed 2.3x); SAO learner busy "
      f"{t['sao']['learner_busy']:.1%} (seed 98%); GRPO {t['grpo']['learner_busy']:.1%}"
    )
  print(f"results: {out}, {out.with_suffix('.png')}")
  return result


def plot(result: dict, path: pathlib.Path):
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  dists = list(result["runs"])
  fig, axes = plt.subplots(2, len(dists), figsize=(6 * len(dists), 7), squeeze=False)
  styles = {
    "grpo": ("GRPO(N=8), synchronous", "C0", "o"),
    "sao_inflight": ("SAO, continuous + in-flight", "C1", "s"),
    "sao_batch": ("SAO, today's sampler", "C2", "^"),
  }
  for j, dist in enumerate(dists):
    for name, rows in result["runs"][dist].items():
      label, color, marker = styles[name]
      x = [r["sampler_nodes"] for r in rows]
      axes[0, j].plot(
        x, [r["learner_steps_per_s"] * 3600 for r in rows], marker=marker, color=color, label=label
      )
      axes[1, j].plot(
        x, [100 * r["learner_busy"] for r in rows], marker=marker, color=color, label=label
      )
    sat = result["learner_saturates_at_nodes"][dist]
    for ax in axes[:, j]:
      if sat:
        ax.axvline(sat, color="gray", ls="--", lw=1)
      ax.set_xscale("log")
      ax.set_xlabel("sampler nodes (2 per replica)")
    note = f"\nSAO learner saturates (busy >= 95 %) at {sat} nodes" if sat else ""
    axes[0, j].set_title(f"completion lengths: {dist}{note}")
    axes[0, j].set_ylabel("learner steps per hour")
    axes[1, j].set_ylabel("learner busy (%)")
    axes[1, j].set_ylim(0, 105)
    axes[0, j].legend(fontsize=8)
  fig.suptitle(
    "Simulated at the seed's scale: 750B policy, 8 learner nodes, "
    f"{SEED['prompts_per_step']}x{SEED['group_size']} trajectories per step"
  )
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


if __name__ == "__main__":
  main()
