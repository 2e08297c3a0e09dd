"""experiments/bench_learner.py's printed tables: one model's MFU (`format_table`), the
variants side by side with the LoRA sync bytes (`format_variants`), a config's learner padded
against packed (`format_config`)."""

from __future__ import annotations


def format_config(r: dict) -> str:
  pm = lambda m, k=1.0, f=".1f": f"{k * m['mean']:{f}} +- {k * (m['se'] or 0):{f}}"  # noqa: E731
  lines = [
    f"{r['config_file']} ({r['update']} update): {r['rows']} rows x {r['row_slots']} slots, "
    f"real slots {pm(r['real_slot_frac'], 100)}%; {len(r['seeds'])} seeds x {r['reps']} rounds",
    f"{'arm':<8} {'step (ms)':>16} {'real tok/s':>18} {'MFU real tokens':>16}",
  ]
  for arm, a in r["arms"].items():
    lines.append(
      f"{arm:<8} {pm(a['step_time_s_median'], 1e3):>16} {pm(a['real_tokens_per_s'], 1, '.0f'):>18} "
      f"{pm(a['mfu_real_tokens'], 100):>15}%"
    )
  lines.append(
    f"padded MFU over every slot {pm(r['arms']['padded']['mfu_all_slots'], 100)}%; packed "
    f"speed-up {pm(r['speedup_packed'], 1, '.2f')}x; first loss rel. diff <= "
    f"{r['first_loss_rel_diff_max']:.1e}"
  )
  prof = r["seeds"][0].get("profile_padded")
  if prof:
    lines.append(
      "padded update's parts (seed 0): "
      + ", ".join(
        f"{k} {1e3 * v['seconds_median']:.0f} ms ({100 * v['share_of_update']:.0f} %"
        + (f", {100 * v['fraction_of_matmul_peak']:.0f} % of peak)" if v["flops"] else ")")
        for k, v in prof.items()
      )
    )
  lines.append(f"device: {r['device']}, {r['cpu_count']} CPUs, jax {r['jax_version']}")
  return "\n".join(lines)


def format_variants(r: dict) -> str:
  pct = lambda m: (
    "n/a"
    if m is None
    else (f"{100 * m['mean']:.1f}%" + (f" +- {100 * m['se']:.1f}" if m["se"] is not None else ""))
  )
  lines = [
    f"{'variant':<12} {'params':>8} {'tokens/s':>10} {'MFU (analytic)':>18} {'MFU (XLA)':>16}"
  ]
  for name, v in r["variants"].items():
    lines.append(
      f"{name:<12} {v['params']['total'] / 1e6:>7.2f}M "
      f"{v['tokens_per_s']['mean']:>10.0f} {pct(v['mfu']):>18} "
      f"{pct(v['mfu_xla']):>16}"
    )
  sync = r["lora_sync"]
  for rank, a in sync["adapters"].items():
    lines.append(
      f"LoRA rank {rank}: {a['bytes'] / 1e6:.2f} MB per sync vs "
      f"{sync['full_bytes'] / 1e6:.2f} MB full ({100 * a['fraction_of_full']:.2f}%)"
    )
  lines.append(f"device: {r['device']}, {r['cpu_count']} CPUs, jax {r['jax_version']}")
  return "\n".join(lines)


def format_table(r: dict) -> str:
  c = r["bench"]
  gf = lambda x: "n/a" if x is None else f"{x / 1e9:.2f} GFLOP/s"
  pct = lambda x: "n/a" if x is None else f"{100 * x:.1f}%"
  rows = [
    (
      "model",
      f"{c['arch']} width {c['width']} depth {c['depth']} heads {c['heads']} "
      f"kv {c['kv_heads']} mlp {c['mlp_dim']} vocab {c['vocab']} {c['dtype']}",
    ),
    (
      "params",
      f"{r['params']['total'] / 1e6:.2f}M total, "
      f"{r['params']['non_embedding'] / 1e6:.2f}M non-embedding",
    ),
    (
      "batch",
      f"{c['batch']} x ({c['prompt_len']} + {c['completion_len']}) = "
      f"{r['tokens_per_step']} tokens/step",
    ),
    ("compile", f"{r['compile_s']:.2f} s"),
    (
      "step time",
      f"median {1e3 * r['step_time_s_median']:.1f} ms, "
      f"p90 {1e3 * r['step_time_s_p90']:.1f} ms ({c['reps']} reps)",
    ),
    ("tokens/s", f"{r['tokens_per_s']:.0f}"),
    (
      "FLOPs/step",
      f"analytic {r['flops_per_step_analytic'] / 1e9:.2f} G, XLA "
      + ("n/a" if r["flops_per_step_xla"] is None else f"{r['flops_per_step_xla'] / 1e9:.2f} G"),
    ),
    (
      "achieved",
      f"analytic {gf(r['achieved_flops_per_s'])}, XLA {gf(r['achieved_flops_per_s_xla'])}",
    ),
    (
      "matmul peak",
      f"{gf(r['matmul_peak_flops_per_s'])} ({r['matmul']['n']}^3 {r['matmul']['dtype']})",
    ),
    ("MFU", f"analytic {pct(r['mfu'])}, XLA {pct(r['mfu_xla'])}"),
    ("device", f"{r['device']}, {r['cpu_count']} CPUs, jax {r['jax_version']}"),
  ]
  w = max(len(k) for k, _ in rows)
  return "\n".join(f"{k:<{w}}  {v}" for k, v in rows)
