"""A sweep's reports, written into its DIR from the Optuna journal:

* trials.csv / trials.json: one row per trial (point x seed): its parameters, seed, status
  (complete, failed, diverged, pruned; running/waiting while the sweep is unfinished),
  metrics, attempts (2+ after a restart), trial_wall_s (wall time of the finishing attempt),
  reason;
  trials.json also holds the sweep, the per-point statistics and the best point;
* points.csv: one row per point: the metric's mean, standard error and 95 % t-interval over
  the seeds that completed (sao_jax.stats), and how many seeds ended how;
* sweep.png: the metric against each axis, every seed as a dot and each point's mean with
  its 95 % interval;
* best_config.py: the best point as a config file that `sao-jax train --config` runs,
  written only when the points can be told apart (`ranking`: the best mean among points
  whose seeds all completed, its difference from every other such point outside a 95 %
  interval); otherwise the report's verdict says that no point is distinguishable.

The writers take plain rows, so notebooks can rebuild any of them from trials.json.
"""

from __future__ import annotations

import csv
import json
import math
import os
import pathlib
import textwrap
from typing import Any

from sao_jax import stats
from sao_jax.provenance import provenance

_STATE_STATUS = {
  "COMPLETE": "complete",
  "PRUNED": "pruned",
  "RUNNING": "running",
  "WAITING": "waiting",
  "FAIL": "failed",
}


def _clean(v: Any) -> Any:
  """JSON-safe: non-finite floats become None (status and reason say what happened)."""
  if isinstance(v, float) and not math.isfinite(v):
    return None
  if isinstance(v, dict):
    return {k: _clean(x) for k, x in v.items()}
  if isinstance(v, (list, tuple)):
    return [_clean(x) for x in v]
  return v


def trial_rows(study, sweep) -> list[dict]:
  """One dict per trial of `study`, in trial order."""
  rows = []
  for t in study.get_trials(deepcopy=False):
    attrs = t.user_attrs
    params = dict(t.params or t.system_attrs.get("fixed_params", {}))
    status = _STATE_STATUS[t.state.name]
    if status == "failed":
      status = attrs.get("status", "failed")
    metrics = attrs.get("metrics", {})
    row = {
      "trial": t.number,
      "point": attrs.get("point"),
      "seed": None if attrs.get("seed") is None else sweep.first_seed + attrs["seed"],
      "status": status,
    }
    row.update({a.key: params.get(a.key) for a in sweep.axes})
    row.update({m: metrics.get(m) for m in (sweep.metric, *sweep.report)})
    row.update(
      {
        "attempts": attrs.get("attempts", 0),
        "trial_wall_s": attrs.get("wall_s"),
        "reason": attrs.get("reason", ""),
        "workdir": f"trials/{t.number}",
      }
    )
    rows.append(row)
  return rows


def point_rows(sweep, rows: list[dict]) -> list[dict]:
  """Per point: its parameters, the count of seeds by status, and the metric's statistics
  over the seeds that completed."""
  by_point: dict[int, list[dict]] = {}
  for r in rows:
    if r["point"] is not None:
      by_point.setdefault(r["point"], []).append(r)
  out = []
  for p, rs in sorted(by_point.items()):
    done = [r[sweep.metric] for r in rs if r["status"] == "complete"]
    s = stats.seed_stats(done)
    row = {"point": p, **{a.key: rs[0][a.key] for a in sweep.axes}, "seeds": sweep.seeds}
    for status in ("complete", "failed", "diverged", "pruned"):
      row[f"n_{status}"] = sum(r["status"] == status for r in rs)
    row.update({"mean": s.mean, "se": s.se, "ci_low": s.ci_low, "ci_high": s.ci_high})
    out.append(row)
  return out


def best_point(sweep, points: list[dict]) -> dict | None:
  """The point with the best mean among those whose every seed completed (None if none).
  The highest mean, not yet a verdict: `ranking` says whether it is told apart."""
  full = [p for p in points if p["n_complete"] == sweep.seeds]
  if not full:
    return None
  sign = 1.0 if sweep.direction == "maximize" else -1.0
  return max(full, key=lambda p: (sign * p["mean"], -p["point"]))


def _seed_stats(p: dict) -> stats.SeedStats:
  return stats.SeedStats(p["n_complete"], p["mean"], p["se"], p["ci_low"], p["ci_high"])


def _tied(a: dict, b: dict) -> bool:
  low, high = stats.welch_interval(_seed_stats(a), _seed_stats(b))
  return low <= 0.0 <= high


def ranking(sweep, points: list[dict]) -> dict:
  """Whether the sweep names a best point, and why (or why not).

  Among the points whose every seed completed, the leader has the best mean. Another such
  point is tied with it when the 95 % Welch interval of the difference of their means
  (sao_jax.stats.welch_interval) contains 0, and always when there is one seed per point
  (no spread to judge by). The leader is named best only when nothing is tied with it:
  a sweep of indistinguishable points otherwise names an arbitrary one, and its
  best_config.py would look like a finding.

  Returns {"best": the point's row or None, "leading": the leader and the points tied with
  it, "verdict": one sentence for the console and trials.json}.
  """
  n = sweep.seeds
  full = [p for p in points if p["n_complete"] == n]
  leader = best_point(sweep, points)
  if leader is None:
    return {"best": None, "leading": [], "verdict": f"no point has all its {n} seed(s) complete"}
  if len(full) == 1:
    verdict = f"point {leader['point']} is the only point whose {n} seed(s) all completed"
    return {"best": leader, "leading": [leader["point"]], "verdict": verdict}
  if n == 1:
    return {
      "best": None,
      "leading": [p["point"] for p in full],
      "verdict": "one seed per point: no spread, so no point is distinguishable from the "
      "others; set seeds >= 2 to name a best",
    }
  tied = [p["point"] for p in full if p is not leader and _tied(leader, p)]
  if not tied:
    verdict = (
      f"point {leader['point']} is best: the 95 % interval of its difference from every "
      f"other point excludes 0 ({n} seeds)"
    )
    return {"best": leader, "leading": [leader["point"]], "verdict": verdict}
  leading = sorted([leader["point"], *tied])
  if len(leading) == len(full):
    verdict = (
      f"no point is distinguishable from the others at {n} seeds (the highest mean, point "
      f"{leader['point']}, is within the 95 % interval of every difference): no best"
    )
  else:
    verdict = (
      f"no single best at {n} seeds: points {', '.join(map(str, leading))} cannot be told "
      "apart (95 % interval of each difference contains 0); the other points are worse"
    )
  return {"best": None, "leading": leading, "verdict": verdict}


def _write_csv(path: pathlib.Path, rows: list[dict]) -> None:
  columns: list[str] = []
  for r in rows:
    columns += [k for k in r if k not in columns]
  tmp = path.with_suffix(".tmp")
  with open(tmp, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=columns)
    w.writeheader()
    for r in rows:
      w.writerow(
        {
          k: "" if v is None or (isinstance(v, float) and not math.isfinite(v)) else v
          for k, v in r.items()
        }
      )
  os.replace(tmp, path)


def _write_json(path: pathlib.Path, obj: Any) -> None:
  tmp = path.with_suffix(".tmp")
  tmp.write_text(json.dumps(_clean(obj), indent=2))
  os.replace(tmp, path)


def write_table_files(
  sweep_dir: pathlib.Path,
  sweep,
  rows: list[dict],
  points: list[dict],
  best: dict | None,
  extra: dict | None = None,
) -> None:
  _write_csv(sweep_dir / "trials.csv", rows)
  _write_csv(sweep_dir / "points.csv", points)
  _write_json(
    sweep_dir / "trials.json",
    {"sweep": sweep.to_dict(), **(extra or {}), "trials": rows, "points": points, "best": best},
  )


def write_plot(
  path: pathlib.Path, sweep, rows: list[dict], points: list[dict], verdict: str = ""
) -> bool:
  """Metric against each axis; False (and no file) when matplotlib is not installed. Under
  strategy 'oat' each axis's panel shows only the points that vary that axis alone (the
  others at the base point), so a panel reads as that knob's effect."""
  try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    return False
  axes = list(sweep.axes) or [None]
  fig, grid = plt.subplots(1, len(axes), figsize=(4.2 * len(axes), 3.6), squeeze=False, sharey=True)
  all_done = [r for r in rows if r["status"] == "complete"]
  base = sweep.grid()[0] if sweep.strategy == "oat" else None
  for ax, axis in zip(grid[0], axes, strict=True):
    x = _x_of(ax, axis)
    on = _on_panel(base, axis)
    done = [r for r in all_done if on(r)]
    ax.scatter(
      [x(r) for r in done],
      [r[sweep.metric] for r in done],
      s=12,
      color="0.55",
      alpha=0.7,
      label="one seed",
      zorder=2,
    )
    ok = [p for p in points if math.isfinite(p["mean"]) and on(p)]
    err = [
      [p["mean"] - p["ci_low"] if math.isfinite(p["ci_low"]) else 0 for p in ok],
      [p["ci_high"] - p["mean"] if math.isfinite(p["ci_high"]) else 0 for p in ok],
    ]
    ax.errorbar(
      [x(p) for p in ok],
      [p["mean"] for p in ok],
      yerr=err,
      fmt="o",
      color="C0",
      ms=5,
      capsize=3,
      label="point mean, 95 % CI",
      zorder=3,
    )
    for status, marker in (("diverged", "x"), ("failed", "v"), ("pruned", "s")):
      bad = [p for p in points if p[f"n_{status}"] and on(p)]
      if bad:
        ax.scatter(
          [x(p) for p in bad],
          [ax.get_ylim()[0]] * len(bad),
          marker=marker,
          color="C3",
          label=f"has {status} seeds",
          zorder=4,
        )
    key = axis.key if axis is not None else None
    ax.set_xlabel(key or "all trials")
    ax.grid(alpha=0.3)
  grid[0][0].set_ylabel(f"{sweep.metric} ({sweep.direction})")
  grid[0][-1].legend(fontsize=7, loc="best")
  title = (
    f"sweep {sweep.name}: {len(all_done)} complete trials, {len(points)} points, "
    f"{sweep.seeds} seed(s) each. {verdict}"
  )
  # Wrapped to the figure's width (about 64 characters a panel at this size).
  fig.suptitle(textwrap.fill(title, 64 * len(axes)), fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return True


def _on_panel(base: dict | None, axis):
  """Row -> whether it belongs on `axis`'s panel: every row, or under 'oat' those whose other
  axes sit at the base point."""
  if base is None or axis is None:
    return lambda row: True
  return lambda row: all(row[k] == v for k, v in base.items() if k != axis.key)


def _x_of(ax, axis):
  """Row -> x position on `ax` for `axis` (numeric: the value, log-scaled where apt;
  categorical: the index of the value among the axis' values). No axes: one column."""
  if axis is None:
    return lambda row: 0
  if axis.numeric:
    if axis.log or _spans_decades(axis):
      ax.set_xscale("log")
      values = getattr(axis, "values", ())
      if values:  # a few choices: label them, not the log axis's crowded minor ticks
        ax.set_xticks(values, [f"{v:g}" for v in values])
        ax.minorticks_off()
    return lambda row: row[axis.key]
  labels = [str(v) for v in axis.values]
  ax.set_xticks(range(len(labels)), labels)
  return lambda row: labels.index(str(row[axis.key]))


def _spans_decades(axis) -> bool:
  """Positive choices a decade or more apart (learning rates) read better on a log axis."""
  values = getattr(axis, "values", ())
  return bool(values) and min(values) > 0 and max(values) / min(values) >= 10


def best_config_source(
  sweep, base: pathlib.Path, variant: str, best: dict, out_dir: pathlib.Path
) -> str:
  """A config file: the base config's `variant` (or any other variant of it) with the
  sweep's fixed overrides and the best point's values."""
  overrides = [*sweep.fixed, *(f"{a.key}={best[a.key]!r}" for a in sweep.axes)]
  # Relative to this file when both live in the working tree (the repo moves as a whole),
  # absolute otherwise.
  cwd = pathlib.Path.cwd().resolve()
  inside = all(p.resolve().is_relative_to(cwd) for p in (base, out_dir))
  rel = os.path.relpath(base, out_dir) if inside else str(base)
  here = out_dir / "best_config.py"
  ci = (
    f"95 % CI {best['ci_low']:.4g} .. {best['ci_high']:.4g}"
    if math.isfinite(best["ci_low"])
    else "one seed: no interval"
  )
  mean_se = f"{best['mean']:.4g}" + (
    f" +- {best['se']:.2g} s.e." if math.isfinite(best["se"]) else ""
  )
  sets = " ".join(f"--set {o!r}" if " " in o else f"--set {o}" for o in overrides)
  lines = [
    f'"""Best point of sweep {sweep.name}: {sweep.metric} ({sweep.direction}) = {mean_se}',
    f"({ci}, over {sweep.seeds} seed(s)); point {best['point']}.",
    "",
    f"Variant 'default' is the swept one ({variant!r} of the base config); any other name",
    "is that variant of the base config with the same values. Run it (seed 0; add",
    "--set seed=N for others):",
    f"  sao-jax train --config {here} --workdir runs/{sweep.name}_best",
    "The same values on the base config directly (any variant):",
    f"  sao-jax train --config {base}:{variant} {sets} --workdir runs/{sweep.name}_best",
    '"""',
    "import pathlib",
    "",
    "from sao_jax import config as config_lib",
    "",
    f"BASE = pathlib.Path(__file__).parent / {rel!r}",
    f"BASE_VARIANT = {variant!r}",
    "OVERRIDES = [",
    *(f"    {o!r}," for o in overrides),
    "]",
    "",
    "",
    'def get_config(variant: str = "default") -> config_lib.Config:',
    '  base_variant = BASE_VARIANT if variant == "default" else variant',
    "  return config_lib.load_config(str(BASE), base_variant, overrides=OVERRIDES)",
    "",
  ]
  return "\n".join(lines)


def write_tables(runner) -> tuple[list[dict], list[dict], dict]:
  if getattr(runner, "provenance", None) is None:  # once per sweep process
    runner.provenance = provenance(devices=False)  # the trials record their own devices
  rows = trial_rows(runner.study, runner.sweep)
  points = point_rows(runner.sweep, rows)
  rank = ranking(runner.sweep, points)
  write_table_files(
    runner.dir,
    runner.sweep,
    rows,
    points,
    rank["best"],
    {
      "base_config": str(runner.base),
      "base_variant": runner.variant,
      # the sweep command, its commit and machine (a resumed sweep: the latest invocation)
      "provenance": runner.provenance,
      "verdict": rank["verdict"],
      "leading": rank["leading"],
    },
  )
  return rows, points, rank


def write_all(runner) -> dict:
  """Tables, plot and best config; returns a short summary for the console."""
  rows, points, rank = write_tables(runner)
  best = rank["best"]
  sweep, out = runner.sweep, runner.dir
  files = ["trials.csv", "trials.json", "points.csv"]
  if write_plot(out / "sweep.png", sweep, rows, points, rank["verdict"]):
    files.append("sweep.png")
  else:
    print("sweep.png not written: matplotlib is not installed (pip install matplotlib)")
  if best is not None:
    (out / "best_config.py").write_text(
      best_config_source(sweep, runner.base, runner.variant, best, out)
    )
    files.append("best_config.py")
  else:
    # A resumed sweep whose earlier report named a best may no longer have one.
    (out / "best_config.py").unlink(missing_ok=True)
  counts: dict[str, int] = {}
  for r in rows:
    counts[r["status"]] = counts.get(r["status"], 0) + 1
  summary = {
    "sweep": sweep.name,
    "dir": str(out),
    "trials": len(rows),
    "status": counts,
    "points": len(points),
    "files": files,
    "verdict": rank["verdict"],
    "best": None,
  }
  if best is None:
    summary["leading"] = rank["leading"]
  else:
    summary["best"] = {
      "point": best["point"],
      **{a.key: best[a.key] for a in sweep.axes},
      "mean": best["mean"],
      "se": best["se"],
      "ci_low": best["ci_low"],
      "ci_high": best["ci_high"],
    }
  return _clean(summary)
