"""How trained compressed policies answer on 1,000-step validation episodes, by how full their
bank was when each question came, and what their banks hold, under the filter as trained or
with `compression.salient_turning` set otherwise.

Validation episodes: the long-episode spec of the task drawn with another generator seed
(default 7) than bench_compression's 1,000-step test episodes (2) and bytes episodes (1), so
a filter decided on them is not chosen on the test episodes. Parameters: those
`bench_compression.py --params-dir DIR` saved (DIR/<task>/compressed/<steps>), one DIR per
seed; the seed is read from each snapshot's metadata.

  python experiments/bank_occupancy.py --task navigation8 --steps 1200 \
      --params-dir DIR0,DIR1,DIR2 --salient-turning off,on \
      --out results/bank_occupancy_navigation8.json

Per (parameters, filter): accuracy, the questions by bank entries when asked (buckets of the
capacity) with their accuracy, entries and evictions per episode, and the final banks' steps
by kind (the facts, the questions, else each observation's text: "hall.", "stairs.", ...).
Each filter setting is evaluated on the same parameters: a setting other than the one they
trained under is a change at evaluation time, and says so (`trained_salient_turning`).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import pathlib
import sys
import time

import jax
import numpy as np

from sao_jax import checkpoint as ckpt
from sao_jax import config as config_lib
from sao_jax.bench.recall import memory_log, question_facts, seen_at
from sao_jax.config import load_config
from sao_jax.envs.longhorizon import SEP, make_split
from sao_jax.results_file import ResultFile
from sao_jax.runners import memory_lab as L
from sao_jax.runners.memory_lab import snapshot_long_spec

ROOT = pathlib.Path(__file__).resolve().parents[1]

SETTINGS = {"trained": None, "off": False, "on": True}


def _parser():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  L.add_snapshot_args(p, task="navigation8", episodes=16, gen_seed=7, what="validation")
  p.add_argument(
    "--salient-turning",
    default="trained",
    help="comma-separated filter settings: trained (as the snapshot's config), off, on",
  )
  p.add_argument("--out", default="", help="JSON results (default: print only)")
  return p


def _kinds(task, steps) -> collections.Counter:
  pairs = question_facts(task)
  facts, questions = {f for _, f in pairs}, {q for q, _ in pairs}
  obs = task.prompt.split(SEP)
  return collections.Counter(
    "fact" if s in facts else "question" if s in questions else obs[s] for s in steps
  )


def measure(cfg, tasks, params) -> dict:
  progs, pol = L.build(cfg, True, mode="sft")
  t0 = time.time()
  _, trajs = L.evaluate(cfg, progs, pol, params, tasks, True, length=0)
  cap = cfg.compression.capacity
  edges = [0, cap // 2, 3 * cap // 4, cap - 4, cap + 1]
  right, occ, kinds = [], [], collections.Counter()
  for t, task in zip(trajs, tasks, strict=True):
    kept = np.asarray(t.bank["step_c"])[: t.bank["entries"]]
    log = memory_log(kept, t.bank, len(t.rewards))
    for q in np.flatnonzero(t.graded):
      right.append(float(t.rewards[q]))
      occ.append(len(seen_at(log, int(q), cfg.compression.visible)))  # visible = capacity: all held
    kinds += _kinds(task, kept)
  right, occ = np.asarray(right), np.asarray(occ)
  by = {}
  for lo, hi in zip(edges[:-1], edges[1:], strict=True):
    sel = (occ >= lo) & (occ < hi)
    if sel.any():
      by[f"{lo}-{hi - 1}"] = {"questions": int(sel.sum()), "accuracy": float(right[sel].mean())}
  n = len(tasks)
  return {
    "accuracy": float(right.mean()),
    "questions": len(right),
    "wrong": int((right < 1).sum()),
    "by_entries_when_asked": by,
    "entries_mean": float(np.mean([t.bank["entries"] for t in trajs])),
    "evicted_mean": float(np.mean([t.bank["evicted"] for t in trajs])),
    "final_bank_per_episode": {k: v / n for k, v in kinds.most_common()},
    "seconds": time.time() - t0,
  }


def main(argv=None) -> dict:
  args = _parser().parse_args(argv)
  settings = args.salient_turning.split(",")
  if set(settings) - set(SETTINGS):
    _parser().error(f"--salient-turning: choose from {', '.join(SETTINGS)}")
  cfg_path, _, spec = snapshot_long_spec(args, _parser())
  base = load_config(cfg_path)
  tasks = make_split(spec, "test", args.episodes, args.gen_seed)
  rf = ResultFile(args.out, series=f"bank_occupancy/{args.task}/steps{args.steps}", config=base)
  result = {
    "command": "python experiments/bank_occupancy.py " + " ".join(argv or sys.argv[1:]),
    "task": args.task,
    "long_spec": dataclasses.asdict(spec),
    "episodes": args.episodes,
    "gen_seed": args.gen_seed,
    "steps": args.steps,
    "runs": [],
  }
  like = L.build(base, True, mode="sft")[0].init(jax.random.key(0))  # the parameters' shapes
  for d in args.params_dir.split(","):
    where = pathlib.Path(d) / args.task / "compressed"
    params, step, meta = ckpt.restore_params(where, like.params, args.steps)
    # a snapshot from before the gate existed trained without it (its default)
    trained = config_lib.upgrade(meta.get("config") or {})["compression"]["salient_turning"]
    seed = (meta.get("bench_key") or {}).get("seed")
    for setting in settings:
      gate = trained if SETTINGS[setting] is None else SETTINGS[setting]
      comp = dataclasses.replace(base.compression, salient_turning=gate)
      cfg = dataclasses.replace(base, compression=comp)
      out = measure(cfg, tasks, params)
      out.update(
        params=str(where),
        seed=seed,
        step=step,
        trained_salient_turning=trained,
        salient_turning=gate,
      )
      result["runs"].append(out)
      print(
        f"seed {seed} (trained gate {trained}) gate {gate}: accuracy {out['accuracy']:.3f} "
        f"({out['wrong']} wrong of {out['questions']}), entries {out['entries_mean']:.1f}, "
        f"evicted {out['evicted_mean']:.1f}, by entries {out['by_entries_when_asked']}",
        flush=True,
      )
  if rf.finish(result):
    print(f"wrote {args.out}")
  return rf.doc


if __name__ == "__main__":
  main()
