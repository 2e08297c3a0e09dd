"""Chooses the learned filter's keep-probability threshold (`compression.salience_threshold`)
after training, on training episodes, for the trained compressed arms of several seeds.

The salience head is trained with its threshold at the configured value (0.5); at 1,000 steps
it misses a few facts whose keep probability falls just under it. This script runs the
scripted 1,000-step episodes of the task's *training* split (never the test episodes
bench_compression measures accuracy on) through each seed's trained filter at each threshold
of --thresholds, and records the facts the final bank kept, those visible when asked, the
entries and the INT8 + graveyard reduction. The threshold chosen is the largest one at which
the kept fraction of facts is >= --min-kept in every seed (one threshold for all seeds, so that
it is a setting of the method, not of a seed); the policy's accuracy under it is then measured
on the held-out episodes with `bench_compression.py --eval-set
compression.salience_threshold=T` (the same trained parameters, the controls unchanged).

Parameters: those `bench_compression.py --params-dir DIR` saved (DIR/<task>/compressed/<steps>),
one DIR per seed; each snapshot's own resolved configuration is the one measured (with its
threshold replaced), its seed read from the snapshot's metadata.

  python experiments/salience_threshold.py --task retention8 --steps 800 \
      --params-dir DIR0,DIR1,DIR2,DIR3 --out results/salience_threshold_retention8.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys

import jax
from tqdm import tqdm

from sao_jax import checkpoint as ckpt
from sao_jax import config as config_lib
from sao_jax.bench.compression import filter_row
from sao_jax.envs.longhorizon import make_split
from sao_jax.results_file import ResultFile, dumps
from sao_jax.runners import memory_lab as L
from sao_jax.runners.memory_lab import snapshot_long_spec

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _parser():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  L.add_snapshot_args(p, task="retention8", episodes=32, gen_seed=11, what="training-split")
  p.add_argument(
    "--thresholds",
    default="0.5,0.25,0.1,0",
    help="comma-separated keep-probability thresholds to measure, each in [0, 1]",
  )
  p.add_argument(
    "--min-kept",
    type=float,
    default=1.0,
    help="the chosen threshold keeps at least this fraction of the facts in every seed",
  )
  p.add_argument("--out", default="")
  return p


def choose(rows: list[dict], min_kept: float) -> float | None:
  """The largest threshold whose facts-kept fraction is >= `min_kept` for every seed's
  parameters (`rows`: one per (seed, threshold)); None if no threshold is."""
  ok = {}
  for r in rows:
    t = r["salience_threshold"]
    ok[t] = ok.get(t, True) and r["facts_kept_frac"] >= min_kept
  good = [t for t, v in ok.items() if v]
  return max(good) if good else None


def main(argv=None) -> dict:
  args = _parser().parse_args(argv)
  try:
    thresholds = [float(t) for t in args.thresholds.split(",")]
  except ValueError:
    _parser().error(f"--thresholds {args.thresholds!r}: comma-separated numbers")
  if not thresholds or any(not 0 <= t <= 1 for t in thresholds):
    _parser().error(f"--thresholds {args.thresholds!r}: each in [0, 1]")
  _, _, spec = snapshot_long_spec(args, _parser())
  # Training-split episodes (disjoint from the test split's first `episodes` by construction).
  tasks = make_split(spec, "train", args.episodes, args.gen_seed, num_test=args.episodes)
  # Each snapshot's own resolved config is measured (recorded by its `params` path).
  rf = ResultFile(args.out, series=f"salience_threshold/{args.task}/steps{args.steps}")
  result = {
    "command": "python experiments/salience_threshold.py " + " ".join(argv or sys.argv[1:]),
    "task": args.task,
    "long_spec": dataclasses.asdict(spec),
    "split": "train",
    "episodes": args.episodes,
    "gen_seed": args.gen_seed,
    "steps": args.steps,
    "thresholds": thresholds,
    "min_kept": args.min_kept,
    "rule": "the largest threshold keeping >= min_kept of the facts in every seed",
    "rows": [],
  }
  dirs = [d for d in args.params_dir.split(",") if d]
  bar = tqdm(total=len(dirs) * len(thresholds), desc="seeds x thresholds", unit="run")
  for d in dirs:
    where = pathlib.Path(d) / args.task / "compressed"
    _, meta = ckpt.read_meta(where, args.steps)
    if not meta.get("config"):
      raise SystemExit(f"{where} step {args.steps}: no resolved configuration in its metadata")
    cfg = config_lib.from_saved(meta["config"])
    if cfg.compression.salience != "learned":
      raise SystemExit(f"{where}: trained without the learned salience head (nothing to set)")
    like = L.build(cfg, True, mode="sft")[0].init(jax.random.key(0))  # the parameters' shapes
    params, step, meta = ckpt.restore_params(where, like.params, args.steps)
    seed = (meta.get("bench_key") or {}).get("seed")
    for t in thresholds:
      row = filter_row(cfg, params, tasks, visible=cfg.compression.capacity, salience_threshold=t)
      row.update(
        params=str(where),
        seed=seed,
        step=step,
        trained_threshold=cfg.compression.salience_threshold,
      )
      result["rows"].append(row)
      bar.update()
      bar.write(
        f"seed {seed} threshold {t:g}: facts kept {row['facts_kept_frac']:.4f}, visible "
        f"{row['facts_visible_at_question_frac']:.4f}, entries {row['kept_steps_mean']:.1f}, "
        f"reduction {row['int8_with_graveyard_reduction']:.0f}x"
      )
  bar.close()
  result["chosen"] = choose(result["rows"], args.min_kept)
  print(
    f"chosen threshold: {result['chosen']} ({result['rule']}, min_kept {args.min_kept})"
    if result["chosen"] is not None
    else f"no threshold of {thresholds} keeps {args.min_kept} of the facts in every seed"
  )
  if rf.finish(result):
    print(f"wrote {args.out}")
  return json.loads(dumps(rf.doc))


if __name__ == "__main__":
  main()
