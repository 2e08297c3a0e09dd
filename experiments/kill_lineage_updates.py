"""Killed vs uninterrupted at equal kept updates: where a killed run's time went.

  python experiments/kill_lineage_updates.py results/kill_lineage/fit \\
      --out results/kill_lineage/equal_updates

Reads the runs behind each finished result file of experiments/kill_lineage.py (their
workdirs, from the file's command: WORKDIR/<name of --out>/sft<S>_seed<k>/<arm>/run, relative
to --root) and writes, per seed and start, OUT/sft<S>_seed<k>.json:

  kept_updates     the updates of the policy the run ended with (a resume goes back to the
                   last snapshot: for each step, the row its last incarnation wrote);
  startup_s        training seconds the kept lineage spent between a (re)start and its
                   first update, beyond an ordinary update's time: what restarts cost it
                   on the RL clock (each incarnation that reached a snapshot carries one);
  batch_accuracy   the mean share of correct trajectories in the update batches of the
                   kill arm's last WINDOW kept steps, and for the uninterrupted arm over the
                   same steps (`same_steps`) and over its own last WINDOW (`last`).

Both arms train for the same RL seconds (`rl.max_seconds`), so a killed run ends with fewer
kept updates, the difference spent on restarts. The batches are sampled from training tasks
at the sampling temperature (not the held-out test): a proxy for how well the policy does at
a given number of updates, measured on ~WINDOW x 128 trajectories. Chosen after seeing the
"fit" series (exploratory, experiments/claims/f_recovery.toml).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shlex
import sys

import numpy as np

from sao_jax.metrics import read_jsonl
from sao_jax.results_file import ResultFile, load

WINDOW = 20


def workdir_of(doc: dict, arm: str, root: pathlib.Path) -> pathlib.Path:
  """The arm's run directory, from the result file's command (kill_lineage.py's layout)."""
  argv = shlex.split(doc["provenance"]["command"])
  opt = lambda name, default: argv[argv.index(name) + 1] if name in argv else default  # noqa: E731
  runs = root / opt("--workdir", "runs/kill_lineage") / pathlib.Path(opt("--out", "")).name
  return runs / f"sft{doc['sft_steps']}_seed{doc['seed']}" / arm / "run"


def kept_rows(workdir: pathlib.Path, final_step: int) -> list[dict]:
  """The update rows of the lineage the run ended with (at `final_step`), by step: a step's
  last row written (a later incarnation that re-took a step replaced the earlier one's);
  steps past the end were taken by an incarnation whose updates were all discarded."""
  by_step: dict[int, dict] = {}
  for r in read_jsonl(workdir / "metrics.jsonl"):
    if r.get("phase") == "rl" and "loss" in r and int(r["step"]) <= final_step:
      by_step[int(r["step"])] = r
  return [by_step[s] for s in sorted(by_step)]


def startup_seconds(rows: list[dict]) -> float:
  """Training seconds spent before first updates: each step's clock time beyond the median
  update's, where it is over three times that (a (re)start's transient; the first step's
  time counts from the phase's start)."""
  t = np.array([0.0] + [r["train_seconds"] for r in rows])
  dt = np.diff(t)
  med = float(np.median(dt))
  slow = dt > 3 * med
  return float(np.sum(dt[slow] - med))


def arm_numbers(rows: list[dict], steps: range) -> dict:
  acc = {int(r["step"]): r["accuracy"] for r in rows}
  same = [acc[s] for s in steps if s in acc]
  return {
    "kept_updates": int(rows[-1]["step"]) if rows else 0,
    "train_seconds": float(rows[-1]["train_seconds"]) if rows else 0.0,
    "startup_s": startup_seconds(rows),
    "batch_accuracy_same_steps": float(np.mean(same)) if same else None,
    "batch_accuracy_last": float(np.mean([r["accuracy"] for r in rows[-WINDOW:]])),
  }


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("results", help="a kill_lineage.py result folder (its finished files)")
  p.add_argument("--out", required=True)
  p.add_argument("--root", default=".", help="where the runs' commands ran (relative paths)")
  args = p.parse_args(argv)
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  for path in sorted(pathlib.Path(args.results).glob("sft*_seed*.json")):
    doc = load(path)
    if not doc.get("complete") or not {"killed", "uninterrupted"} <= set(doc["arms"]):
      continue
    rows = {}
    for arm in ("killed", "uninterrupted"):
      work = workdir_of(doc, arm, pathlib.Path(args.root))
      if not (work / "metrics.jsonl").exists():
        raise SystemExit(f"{path}: the {arm} run's workdir {work} is gone")
      rows[arm] = kept_rows(work, doc["arms"][arm]["final_step"])
    n = int(rows["killed"][-1]["step"])
    steps = range(n - WINDOW + 1, n + 1)  # the killed run's last kept steps
    arms = {arm: arm_numbers(rs, steps) for arm, rs in rows.items()}
    for arm, a in arms.items():
      a["accuracy"] = doc["arms"][arm]["accuracy"]  # (held-out, at the end: the file's)
    rf = ResultFile(
      out / path.name,
      series=f"kill_lineage/sft{doc['sft_steps']}/equal_updates",
      argv=sys.argv if argv is None else argv,
      settings={"window": WINDOW, "from": str(path)},
      devices=False,
    )
    rf.finish({"sft_steps": doc["sft_steps"], "seed": doc["seed"], "arms": arms})
    k, u = arms["killed"], arms["uninterrupted"]
    print(
      f"{path.name}: kept updates {k['kept_updates']} vs {u['kept_updates']}; startup "
      f"{k['startup_s']:.0f} vs {u['startup_s']:.0f} s; batch accuracy at steps "
      f"{steps.start}-{n}: {100 * k['batch_accuracy_same_steps']:.1f} vs "
      f"{100 * u['batch_accuracy_same_steps']:.1f} %"
    )
  print(json.dumps({"wrote": str(out)}))
  return 0


if __name__ == "__main__":
  sys.exit(main())
