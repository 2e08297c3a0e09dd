"""What a one-at-a-time sensitivity sweep found: per point, final held-out accuracy, training
seconds to the base point's final accuracy, off-policy deviation, staleness, throughput and
the failure counters (non-finite updates, rollbacks, stale drops), each as mean ± s.e. over
seeds; which settings collapse and which reach the target fastest.

  python experiments/sensitivity_report.py runs/sweeps/sao_oat --out results/sweep_sao_sensitivity

Reads the sweep's trials.json and every trial's summary.json and metrics.jsonl (run the sweep
first: see experiments/sweeps/sao_sensitivity.py, variant `oat`). Writes OUT/sensitivity.json
(with the command, commit and machine), OUT/sensitivity.png, and copies the sweep's own
trials.csv, points.csv and sweep.png beside them.

Definitions. Target: the base point's (point 0, the default config's) mean final accuracy.
Seconds to target: the first held-out evaluation of the trial's curve (training seconds,
evaluation excluded) at or above the target; a seed that never gets there is counted in
`missing`. Collapse: a seed whose final accuracy is more than 5 points below its start
(the shared SFT checkpoint's), or that skipped a non-finite update or rolled back.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import shutil
import subprocess

import numpy as np

from sao_jax.metrics import read_jsonl
from sao_jax.results_file import ResultFile
from sao_jax.stats import fmt, summarize

COLLAPSE_DROP = 0.05


def trial_record(sweep_dir: pathlib.Path, row: dict) -> dict | None:
  work = pathlib.Path(row["workdir"])
  work = work if work.is_absolute() else sweep_dir / work
  path = work / "summary.json"
  if row["status"] != "complete" or not path.exists():
    return None
  summary = json.loads(path.read_text())
  rl = summary["rl"]
  rows = [r for r in read_jsonl(work / "metrics.jsonl") if r.get("phase") == "rl" and "loss" in r]
  mean = lambda k: float(np.mean([r[k] for r in rows if k in r])) if rows else None  # noqa: E731
  return {
    "final_accuracy": rl["accuracy"],
    "start_accuracy": summary.get("start", {}).get("accuracy"),
    "curve": rl.get("eval_curve", []),
    "steps": rl["steps"],
    "trajectories_per_s": rl["trajectories_per_s"],
    "learner_busy": rl["learner_busy"],
    "dropped_stale": rl["dropped_stale"],
    "trajectories": rl["trajectories"],
    "nonfinite_skipped": rl["nonfinite_skipped"],
    "rollbacks": rl["rollbacks"],
    "is_dev": mean("is_dev"),
    "is_dev_max": max((r["is_dev"] for r in rows if "is_dev" in r), default=None),
    "staleness_mean": mean("staleness_mean"),
  }


def seconds_to(curve, target: float) -> float | None:
  for seconds, _step, acc in curve:
    if acc >= target - 1e-9:
      return float(seconds)
  return None


def collapsed(t: dict) -> bool:
  start = t["start_accuracy"]
  dropped = start is not None and t["final_accuracy"] < start - COLLAPSE_DROP
  return bool(dropped or t["nonfinite_skipped"] or t["rollbacks"])


def analyse(sweep_dir: pathlib.Path) -> dict:
  data = json.loads((sweep_dir / "trials.json").read_text())
  sweep = data["sweep"]
  axes = [a["key"] for a in sweep["axes"]]
  by_point: dict[int, list[tuple[dict, dict | None]]] = {}
  for row in data["trials"]:
    by_point.setdefault(row["point"], []).append((row, trial_record(sweep_dir, row)))
  base = by_point[0][0][0]
  base_done = [t for _, t in by_point[0] if t is not None]
  target = float(np.mean([t["final_accuracy"] for t in base_done]))
  points = []
  for p, trials in sorted(by_point.items()):
    row0 = trials[0][0]
    done = [t for _, t in trials if t is not None]
    varied = [k for k in axes if row0[k] != base[k]]
    points.append(
      {
        "point": p,
        "setting": {k: row0[k] for k in axes},
        "varied": (
          "base (default config)"
          if not varied
          else ", ".join(
            f"{k}={row0[k]:g}" if isinstance(row0[k], float) else f"{k}={row0[k]}" for k in varied
          )
        ),
        "seeds_complete": len(done),
        "seeds_failed": len(trials) - len(done),
        "final_accuracy": summarize([t["final_accuracy"] for t in done]),
        "seconds_to_target": summarize([seconds_to(t["curve"], target) for t in done]),
        "is_dev": summarize([t["is_dev"] for t in done]),
        "is_dev_max": max((t["is_dev_max"] or 0.0 for t in done), default=None),
        "staleness_mean": summarize([t["staleness_mean"] for t in done]),
        "trajectories_per_s": summarize([t["trajectories_per_s"] for t in done]),
        "learner_busy": summarize([t["learner_busy"] for t in done]),
        "updates": summarize([t["steps"] for t in done]),
        "dropped_stale_fraction": summarize(
          [t["dropped_stale"] / max(t["dropped_stale"] + t["trajectories"], 1) for t in done]
        ),
        "nonfinite_skipped": sum(t["nonfinite_skipped"] for t in done),
        "rollbacks": sum(t["rollbacks"] for t in done),
        "collapsed_seeds": sum(collapsed(t) for t in done),
        "start_accuracy": done[0]["start_accuracy"] if done else None,
      }
    )
  return {"sweep": sweep, "target_accuracy": target, "points": points, "findings": findings(points)}


def findings(points: list[dict]) -> list[str]:
  base = points[0]
  out = []
  b = base["final_accuracy"]
  for p in points[1:]:
    f = p["final_accuracy"]
    if f["mean"] is None or b["mean"] is None:
      out.append(f"{p['varied']}: no completed seed")
      continue
    diff = f["mean"] - b["mean"]
    se = math.sqrt((f["se"] or 0.0) ** 2 + (b["se"] or 0.0) ** 2)
    verdict = "within noise of" if abs(diff) <= 2 * se else ("above" if diff > 0 else "below")
    line = (
      f"{p['varied']}: final accuracy {100 * f['mean']:.1f} ± {100 * (f['se'] or 0):.1f} % vs base "
      f"{100 * b['mean']:.1f} ± {100 * (b['se'] or 0):.1f} % "
      f"({100 * diff:+.1f} points, {verdict} the base)"
    )
    t = p["seconds_to_target"]
    line += f"; reached the target on {t['n']}/{p['seeds_complete']} seeds"
    if t["mean"] is not None:
      line += f" in {t['mean']:.0f} s"
    if p["collapsed_seeds"]:
      line += f"; COLLAPSED on {p['collapsed_seeds']} seed(s)"
    out.append(line)
  return out


def table(result: dict) -> str:
  head = (
    f"target (base point's final accuracy): {100 * result['target_accuracy']:.1f} %\n"
    f"{'setting':<34} {'final acc %':>13} {'s to target':>12} {'reached':>8} "
    f"{'IS dev %':>10} {'staleness':>10} {'traj/s':>11} {'collapsed':>9}"
  )
  lines = [head]
  for p in result["points"]:
    t = p["seconds_to_target"]
    lines.append(
      f"{p['varied'][:34]:<34} {fmt(p['final_accuracy'], '{:.1f}', 100):>13} "
      f"{fmt(t, '{:.0f}'):>12} {t['n']}/{p['seeds_complete']:<6} "
      f"{fmt(p['is_dev'], '{:.2f}', 100):>10} {fmt(p['staleness_mean'], '{:.2f}'):>10} "
      f"{fmt(p['trajectories_per_s'], '{:.0f}'):>11} {p['collapsed_seeds']:>9}"
    )
  return "\n".join(lines)


def plot(result: dict, path: pathlib.Path) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  axes = [a["key"] for a in result["sweep"]["axes"]]
  base = result["points"][0]["setting"]
  fields = (
    ("final_accuracy", "final held-out accuracy (%)", 100),
    ("is_dev", "off-policy deviation (%)", 100),
    ("trajectories_per_s", "trajectories/s", 1),
  )
  fig, grid = plt.subplots(len(fields), len(axes), figsize=(4.0 * len(axes), 9.0), squeeze=False)
  for j, key in enumerate(axes):
    pts = [p for p in result["points"] if all(p["setting"][k] == base[k] for k in axes if k != key)]
    pts.sort(key=lambda p: p["setting"][key])
    xs = [p["setting"][key] for p in pts]
    for i, (field, label, scale) in enumerate(fields):
      ax = grid[i][j]
      ok = [(x, p[field]) for x, p in zip(xs, pts, strict=True) if p[field]["mean"] is not None]
      ax.errorbar(
        [x for x, _ in ok],
        [s["mean"] * scale for _, s in ok],
        yerr=[(s["se"] or 0) * scale for _, s in ok],
        fmt="o-",
        capsize=3,
      )
      for x, p in zip(xs, pts, strict=True):
        vals = [v for v in p[field]["values"] if v is not None]
        ax.scatter([x] * len(vals), [v * scale for v in vals], s=10, color="0.6", zorder=1)
      ax.axvline(base[key], color="C2", lw=0.8, ls=":")
      if i == 0:
        ax.axhline(100 * result["target_accuracy"], color="C3", lw=0.8, ls="--")
      if min(xs) > 0 and max(xs) / min(xs) >= 10:
        ax.set_xscale("log")
      ax.set_xlabel(key)
      ax.set_ylabel(label)
      ax.grid(alpha=0.3)
  fig.suptitle(
    "SAO sensitivity, one knob at a time around the default (dotted); "
    "mean ± s.e. over 3 seeds, grey: seeds",
    fontsize=9,
  )
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main() -> None:
  ap = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  ap.add_argument("sweep_dir")
  ap.add_argument("--out", default="results/sweep_sao_sensitivity")
  args = ap.parse_args()
  sweep_dir, out = pathlib.Path(args.sweep_dir), pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  # The trials' configs are the sweep's (its directory); this file reads their results.
  rf = ResultFile(out / "sensitivity.json", series=f"sensitivity_report/{sweep_dir.name}")
  result = rf.update(analyse(sweep_dir)).doc
  events = sweep_dir / "events.jsonl"
  if events.exists():
    rows = [json.loads(line) for line in events.read_text().splitlines() if line.strip()]
    head = subprocess.run(
      ["git", "-C", str(sweep_dir), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    result["sweep_provenance"] = {
      "sweep_dir": str(sweep_dir),
      # the checkout the sweep ran from, when its directory lies inside one (runs/ does)
      "checkout_commit": head.stdout.strip() if head.returncode == 0 else None,
      "sweep_command": json.loads((sweep_dir / "trials.json").read_text())
      .get("provenance", {})
      .get("command"),
      "first_event": min(r["time"] for r in rows),
      "last_event": max(r["time"] for r in rows),
    }
  rf.finish()
  plot(result, out / "sensitivity.png")
  for name in ("trials.csv", "points.csv", "sweep.png"):
    if (sweep_dir / name).exists():
      shutil.copy(sweep_dir / name, out / name)
  print(table(result))
  print("\n".join(["", *result["findings"]]))
  print(f"\nresults: {out}/sensitivity.json, sensitivity.png")


if __name__ == "__main__":
  main()
