"""experiments/bench_compression.py's closing tables (Markdown, printed): bytes per stage,
filters, accuracy on the long and the short episodes, relative loss and peak memory."""

from __future__ import annotations

from sao_jax.compression.arms import LONG_ARM_NAMES


def print_tables(r: dict) -> None:
  """Prints the tables of a bench_compression result (as its JSON holds them)."""
  if r.get("eval_overrides"):
    print(f"\nthe compressed arm measured with {' '.join(r['eval_overrides'])} (trained without)")
  print("\n| task | stage | bytes / trajectory | reduction |")
  print("|---|---|---:|---:|")
  for name, t in r["tasks"].items():
    if "bytes" not in t.get("bytes_per_stage", {}):  # --arms without the compressed arm
      continue
    s = t["bytes_per_stage"]
    for k, v in s["bytes"].items():
      red = s["reduction_vs_full"].get(k)
      red = f"{red:.1f}x" if red else "-"
      print(f"| {name} ({s['steps']} steps) | {k} | {v:,.0f} | {red} |")
  print("\n| task | filter, what the policy reads | facts kept | facts visible at question |")
  print("|---|---|---:|---:|")
  for name, t in r["tasks"].items():
    s = t.get("bytes_per_stage")
    for k, v in (s or {}).get("filters", {}).items():
      print(
        f"| {name} ({s['steps']} steps) | {k} | {v['facts_kept_frac']:.3f} | "
        f"{v['facts_visible_at_question_frac']:.3f} |"
      )
  print("\n| task | arm | accuracy on the long episodes | by recall distance (steps) |")
  print("|---|---|---:|---|")
  for name, t in r["tasks"].items():
    la = (t.get("bytes_per_stage") or {}).get("long_accuracy")
    for arm in [k for k in LONG_ARM_NAMES if k in la] if la else ():
      a = la[arm]
      gaps = ", ".join(
        f"{g}: {v['accuracy']:.2f} ({v['questions']})" for g, v in a["by_gap"].items()
      )
      print(f"| {name} | {arm} | {a['accuracy']:.3f} +- {a['stderr']:.3f} | {gaps} |")
  print("\n| task | arm | questions | chance | accuracy +- s.e. [Wilson 95 %] |")
  print("|---|---|---:|---:|---:|")
  for name, t in r["tasks"].items():
    for arm, a in t.get("arms", {}).items():
      print(
        f"| {name} | {arm} | {a['questions']} | {t['chance']:.2f} | {a['accuracy']:.3f} +- "
        f"{a['stderr']:.3f} [{a['wilson95'][0]:.3f}, {a['wilson95'][1]:.3f}] |"
      )
  print("\n| task | compressed against | relative loss (paired s.e.) |")
  print("|---|---|---:|")
  for name, t in r["tasks"].items():
    if "relative_loss" in t:
      print(
        f"| {name} | full context | {100 * t['relative_loss']:.1f}% "
        f"(+- {100 * t['relative_loss_stderr_paired']:.1f}%) |"
      )
    if "vs_uncompressed" in t:
      v = t["vs_uncompressed"]
      print(
        f"| {name} | uncompressed memory | {100 * v['relative_loss']:.1f}% "
        f"(+- {100 * v['relative_loss_stderr_paired']:.1f}%) |"
      )
  print("\n| task | episodes | GRPO(N=8) full context | SAO compressed | SAO / GRPO |")
  print("|---|---|---:|---:|---:|")
  for name, t in r["tasks"].items():
    for k, v in t.get("peak_memory", {}).items():
      print(
        f"| {name} | {k} ({v['steps']} steps) | {v['grpo_n8_full_context']['peak'] / 1e6:,.1f}"
        f" MB | {v['sao_compressed']['peak'] / 1e6:,.1f} MB | {v['ratio_sao_over_grpo']:.4f} |"
      )
