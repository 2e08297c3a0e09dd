"""Measures on this machine the costs that drive the cluster simulator (`sao_jax.sim`) and
writes them to results/sim_costs.json, with the command, commit and machine.

  python experiments/calibrate_sim.py --sft-from runs/bench_sync_vs_async/seed0/sft  # ~7 min
  python experiments/calibrate_sim.py                 # trains the config's SFT start first
  python experiments/calibrate_sim.py --quick --out /tmp/c.json   # smoke run (tests)

Everything is timed with the library's own jitted programs and code paths, on the config
that the benchmark runs (`experiments/bench_sync_vs_async.py`, same --config/--set):

  inline profile   `progs.sample` in this process (default XLA threads): GRPO samples its
                   batch in the learner process. Per compiled batch B, the median call of a
                   random-init policy (it almost never emits EOS, so every call runs the
                   full T = rl.max_new_tokens steps) and the median call of the same program
                   compiled for 1 token give decode(B) = (t_T - t_1) / (T - 1) and
                   prefill(B) = t_1 - decode(B). Calls of the SFT policy (natural lengths)
                   check the line: `check_rel_err` is its prediction's error on them.
  sampler profile  the same for `sao_sampling` (the batch sampler's call: padding, the
                   jitted sample; its environment steps are taken out and charged per row
                   as `score_s`: make, reset and step an environment) inside a spawned
                   process configured as a sampler process is (`samplers.threads`); plus
                   its start-up (spawn to the end of its first call), parameter load (poll +
                   unflatten + device_put) and per-record encode + queue put.
  continuous       in the same process, the continuous-batching programs of
                   `compile_slots` over `sao.sampler_slots` slots (`sao_jax.slots`): `fill`
                   of `sao.refill_rows` prompts (padding, the jitted prefill into free
                   slots); a `decode` call as the sampler makes it (the call, then the
                   host's reads of the finished rows) on an empty state (decode_call_s) and
                   with A slots decoding a random-init policy until all end, giving the
                   step cost as a function of A: (t_A - t_empty) / steps; `refresh` of every
                   slot's cache after a parameter swap. A `ContinuousSampler` loop of the
                   SFT policy (natural lengths) checks them: `check_rel_err` is the decode
                   calls' predicted time over their real time - 1, `loop_rel_err` the same
                   for the whole loop (fills, decode calls, environments; the rest of its
                   host work is not in the model).
  contention       windows of a few seconds, in rounds: the sampler process alone (full-length
                   batch calls), both (calls and SAO updates), the updates alone; the slowdown of
                   each is its median in "both" over its median alone (they share the cores).
Everything timed in this process is timed in rounds (one sample of each cost per round),
so that drift in the machine's other load falls on all costs alike.
  update           the jitted SAO and GRPO updates at the benchmark's rows (and half of them),
                   the first call's compilation, parameter publish, the learner's per-step
                   bookkeeping (record decode, journal, ledger, metrics row), the shadow-model
                   validation that SAO runs every `recovery.shadow_every` updates.
  transport        latency and bandwidth of the embedded queue for a record of this size,
                   from results/bench_transport.json (else measured here).
  lengths          completion lengths of the SFT policy at the RL temperature.
"""

from __future__ import annotations

import argparse
import pathlib
import tempfile
import time

import numpy as np

# No JAX at the top: the spawned sampler child imports this script before it configures its
# threads (the library modules import JAX inside their functions, too).
from sao_jax.bench.calibrate_learner import (
  build_costs,
  contention,
  inline_and_updates,
  learner_overheads,
  machine,
  matmul_rate,
  transport_costs,
)

HERE = pathlib.Path(__file__).resolve().parent


def main(argv=None) -> dict:
  """Runs the calibration in a scratch folder (its SFT run, parameter files, journal and
  metrics), removed at the end, also when the run fails."""
  with tempfile.TemporaryDirectory(prefix="calib_") as tmp:
    return _calibrate(argv, pathlib.Path(tmp))


def _calibrate(argv, tmp: pathlib.Path) -> dict:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--config", default=str(HERE / "configs" / "sao_arith.py"))
  p.add_argument("--variant", default="default")
  p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
  p.add_argument(
    "--sft-from",
    default="",
    help="workdir or checkpoint folder of an SFT run "
    "(e.g. the benchmark's OUT/sft); default: train the config's SFT here",
  )
  p.add_argument("--transport-json", default="results/bench_transport.json")
  p.add_argument("--reps", type=int, default=10, help="timed calls per batch size")
  p.add_argument("--quick", action="store_true", help="smoke run: few sizes and reps")
  p.add_argument("--out", default="results/sim_costs.json")
  args = p.parse_args(argv)

  import jax

  from sao_jax.learner import make_sft_update
  from sao_jax.metrics import MetricsWriter
  from sao_jax.results_file import ResultFile
  from sao_jax.runners.common import programs_for
  from sao_jax.runners.run import restore_init
  from sao_jax.runners.sft import run_sft
  from sao_jax.setup import load_config, make_setup

  t_start = time.time()
  machine_before = machine()
  cfg = load_config(args.config, args.variant, args.set)
  rf = ResultFile(args.out, series=f"calibrate_sim/{cfg.name}", config=cfg)
  s = make_setup(cfg)
  reps = 2 if args.quick else args.reps
  if args.sft_from:
    state = restore_init(s, args.sft_from)
  else:
    w = MetricsWriter(tmp / "sft", show_progress=False)
    state, _, _ = run_sft(s, w, None, tmp / "sft")
    w.close()
  params = state.params
  n_params = int(sum(x.size for x in jax.tree.leaves(params)))
  progs = programs_for(s, cfg.sft.optim, make_sft_update)
  rand_params = progs.init(jax.random.key(123)).params
  rng = np.random.default_rng(0)

  # The inline profile and the updates, timed in rounds (one sample of everything a round).
  run = inline_and_updates(s, params, progs, rand_params, rng, reps, args.quick)
  lengths = run.lengths
  per_step = {b: round(f["decode_s"], 5) for b, f in run.inline_fits.items()}
  print(f"inline profile: {per_step} s/step; lengths mean {np.mean(lengths):.2f}", flush=True)
  print(f"updates: {run.update_pts}", flush=True)
  # The learner's bookkeeping per step, publish, shadow validation; the transport.
  overheads = learner_overheads(s, params, run, tmp)
  latency_s, bandwidth, transport_src = transport_costs(args.transport_json, overheads["recs"][0])
  # The sampler process: solo, then contended with updates.
  contended = contention(s, run, tmp / "params", reps, args.quick)
  by_kind = contended["sampler_calls"]
  print(
    f"contention: update x{contended['update_slowdown']:.2f}, sampling "
    f"x{contended['sampling_slowdown']:.2f} ({len(by_kind['both'])} contended sampler calls)",
    flush=True,
  )
  costs = build_costs(run, overheads, contended, latency_s=latency_s, bandwidth=bandwidth)
  matmul_flops = matmul_rate(args.quick)
  solo = contended["solo"]
  result = {
    # the machine's load before and after (its provenance has the rest of the machine)
    "machine": machine_before,
    "machine_after": machine(),
    "calibration_s": time.time() - t_start,
    "costs": costs.to_dict(),
    "details": {
      "model_params": n_params,
      "matmul_flops_per_s": matmul_flops,
      "sampler_fits": solo["fits"],
      "inline_fits": run.inline_fits,
      "continuous": solo["continuous"],
      "sampler_raw": solo["raw"],
      "inline_raw": run.inline_raw,
      "update_contended_s": contended["update_contended"],
      "contention_windows": {"sampler_calls": by_kind, "updates": contended["updates"]},
      "transport_source": transport_src,
      "sft_from": args.sft_from or "trained here",
      "lengths": {
        "mean": float(np.mean(lengths)),
        "max": int(np.max(lengths)),
        "cv": float(np.std(lengths) / np.mean(lengths)),
      },
      "unmodelled": [
        "Orbax snapshots every checkpoint_every updates (asynchronous)",
        "held-out evaluations inside the loop (benchmark: --eval-every beyond the run)",
        "other processes on the machine",
      ],
    },
  }
  path = rf.finish(result)
  print(f"calibration: {time.time() - t_start:.0f} s -> {path}", flush=True)
  return rf.doc


if __name__ == "__main__":
  main()
