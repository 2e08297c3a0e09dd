"""The plot a claim's notebook shows: per analysis, each unit's value (a seed's, coloured by
host), the estimate with its interval or bound, and the goal line."""

from __future__ import annotations

import math

from sao_jax.analysis.render import Evaluated


def plot_claim(ev: Evaluated, columns: int = 3):
  """One small panel per analysis that has values; returns the matplotlib figure (None when
  no analysis has data)."""
  import matplotlib.pyplot as plt

  by_analysis: dict[str, list] = {}
  for r in ev.rows:
    if r.estimate.values:
      by_analysis.setdefault(r.analysis.id, []).append(r)
  if not by_analysis:
    return None
  n = len(by_analysis)
  cols = min(columns, n)
  fig, axes = plt.subplots(
    math.ceil(n / cols), cols, figsize=(4.2 * cols, 3.2 * math.ceil(n / cols)), squeeze=False
  )
  for ax, rows in zip(axes.flat, by_analysis.values(), strict=False):
    a = rows[0].analysis
    s = a.format.scale
    for i, r in enumerate(rows):
      e = r.estimate
      ax.scatter([i] * len(e.values), [v * s for v in e.values], s=18, alpha=0.7)
      if e.estimate is not None:
        lo = e.ci_low if e.ci_low is not None else e.estimate
        hi = e.bound if e.bound is not None else e.ci_high if e.ci_high is not None else e.estimate
        ax.errorbar(
          [i + 0.15],
          [e.estimate * s],
          yerr=[[(e.estimate - lo) * s], [(hi - e.estimate) * s]],
          fmt="D",
          color="black",
          capsize=3,
        )
    if a.goal is not None:
      ax.axhline(a.goal.value * s, color="tab:red", ls="--", lw=1, label=f"goal {a.goal.op}")
      ax.legend(fontsize=7, loc="best")
    ax.set_xticks(
      range(len(rows)),
      [("expl. " if r.exploratory else "") + r.host.split(" (")[0][:18] for r in rows],
      fontsize=7,
      rotation=15,
    )
    ax.set_title(a.id + (" (primary)" if a.primary else ""), fontsize=9)
    ax.set_ylabel(a.format.suffix.strip() or "value", fontsize=8)
  for ax in list(axes.flat)[n:]:
    ax.axis("off")
  fig.suptitle(f"({ev.claim.key}) {ev.claim.title}: each dot a seed, diamond the estimate")
  fig.tight_layout()
  return fig


ARM_COLORS = {"grpo": "tab:blue", "grpo_samplers": "tab:green", "sao": "tab:orange"}


def length_histograms(results_root) -> list[tuple[str, dict]]:
  """(name, results document) of every benchmark result under `results_root` whose arms carry
  a histogram of completion lengths (`summary.<arm>.length_hist`: experiments/
  bench_sync_vs_async.py), sorted by path."""
  import json
  import pathlib

  root = pathlib.Path(results_root)
  found = []
  for path in sorted(root.glob("**/results.json")):
    try:
      doc = json.loads(path.read_text())
    except (OSError, ValueError):
      continue
    summary = doc.get("summary") if isinstance(doc, dict) else None
    if isinstance(summary, dict) and any(
      isinstance(v, dict) and "length_hist" in v for v in summary.values()
    ):
      found.append((str(path.parent.relative_to(root)), doc))
  return found


def plot_lengths(results_root, columns: int = 2):
  """Completion lengths per benchmark: the fraction of trajectories in each power-of-two bin
  of tokens, each arm's generated completions (all seeds pooled) as a line and the task's own
  worked solutions (the declared law in data, `target_lengths`) as grey bars. Returns the
  matplotlib figure, None when no result carries a length histogram."""
  import matplotlib.pyplot as plt

  found = length_histograms(results_root)
  if not found:
    return None
  cols = min(columns, len(found))
  rows = math.ceil(len(found) / cols)
  fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.4 * rows), squeeze=False)
  for ax, (name, doc) in zip(axes.flat, found, strict=False):
    series = {}
    law = doc.get("target_lengths") or {}
    if law.get("histogram"):
      series["solutions (law)"] = law["histogram"]
    for arm, v in doc["summary"].items():
      if isinstance(v, dict) and "length_hist" in v:
        series[arm] = v["length_hist"]
    lows = sorted({lo for h in series.values() for lo in h["edges"][:-1]})
    top = max(h["edges"][-1] for h in series.values())
    x = range(len(lows))
    for label, h in series.items():
      frac = dict(zip(h["edges"][:-1], h["counts"], strict=True))
      total = sum(h["counts"]) or 1
      y = [frac.get(lo, 0) / total for lo in lows]
      if label == "solutions (law)":
        ax.bar(x, y, color="lightgray", label=label)
      else:
        ax.step(x, y, where="mid", color=ARM_COLORS.get(label), lw=1.8, label=label)
    ax.set_yscale("log")
    ticks = [f"{lo}-{hi - 1}" for lo, hi in zip(lows, [*lows[1:], top], strict=True)]
    ax.set_xticks(list(x), ticks, fontsize=7, rotation=30)
    ax.set_xlabel("completion tokens", fontsize=8)
    ax.set_ylabel("fraction of trajectories", fontsize=8)
    sub = ""
    if law.get("n"):
      sub = (
        f"\nlaw: mean {law['mean']:.1f}, CV {law['cv']:.2f}, max/mean {law['max_over_mean']:.1f}"
      )
    ax.set_title(name + sub, fontsize=8)
    ax.legend(fontsize=7)
  for ax in list(axes.flat)[len(found) :]:
    ax.axis("off")
  fig.suptitle("Completion lengths: what each arm generated against the task's solutions")
  fig.tight_layout()
  return fig


RL_VS_SFT_ARMS = {  # arm -> (label, colour)
  "sft_continued": ("continued SFT", "tab:gray"),
  "grpo": ("GRPO(N=8)", "tab:blue"),
  "sao": ("SAO", "tab:orange"),
  "sft_clean": ("SFT on clean demonstrations (reference)", "tab:green"),
}


def rl_vs_sft_results(results_root, family: str | None = None) -> list[tuple[str, dict]]:
  """(name, results document) of every experiments/rl_vs_sft.py result under
  `results_root`/rl_vs_sft, sorted by path; only those of task family `family` if given."""
  import json
  import pathlib

  root = pathlib.Path(results_root)
  found = []
  for path in sorted(root.glob("rl_vs_sft/**/results.json")):
    try:
      doc = json.loads(path.read_text())
    except (OSError, ValueError):
      continue
    fam = ((doc.get("config") or {}).get("task") or {}).get("family")
    if "runs" in doc and (family is None or fam == family):
      found.append((str(path.parent.relative_to(root)), doc))
  return found


def plot_rl_vs_sft(doc: dict, title: str | None = None):
  """One experiments/rl_vs_sft.py result: in-distribution held-out accuracy against training
  seconds after the SFT start (left) and against training samples, demonstrations or
  trajectories (right); each seed thin, the mean over seeds bold, the SFT start dashed.
  Returns the matplotlib figure."""
  import matplotlib.pyplot as plt

  from sao_jax.bench.figures import seed_curves

  fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
  views = (("eval_curve", 0, 2, "training seconds after the SFT start"),)
  views += (("sample_curve", 0, 1, "training samples (demonstrations / trajectories)"),)
  for ax, (key, xi, yi, xlabel) in zip(axes, views, strict=True):
    for arm, (label, color) in RL_VS_SFT_ARMS.items():
      curves = [run[arm][key] for run in doc["runs"] if key in run.get(arm, {})]
      seed_curves(ax, curves, color, label, x=xi, y=yi)
    start = doc["summary"]["sft"]["test"]["mean"]
    ax.axhline(100 * start, color="k", ls="--", label="SFT start")
    ax.set_xlabel(xlabel)
  axes[0].set_ylabel("held-out greedy accuracy (%)")
  axes[0].set_title(title or f"RL against continued SFT: {doc.get('setting')}", fontsize=9)
  axes[0].legend(fontsize=7)
  fig.tight_layout()
  return fig
