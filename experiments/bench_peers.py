"""A peer side by side: Tunix's GRPO learner against our GRPO(N=8) and SAO, on this CPU, on
our arithmetic tasks, with the same group size, prompts per step, token budget, learning
rates and parameter count, in one run.

  nice -n 10 python experiments/bench_peers.py              # ~17 min on a 2-core CPU
  nice -n 10 python experiments/bench_peers.py --quick      # smoke run (~4 min)

Tunix (google-tunix, JAX-native) is installed by this script into its own virtual
environment, `.venv-tunix` (git-ignored; never a dependency of sao_jax), and runs there as
a subprocess (experiments/peers/tunix_grpo.py). The tasks go to it as text; its tokenizer
is our CharTokenizer's id map, so prompts and completions are the same token sequences.

What is the same: tasks (train/test split of the config), tokens (ids, prompt length,
max_new_tokens), group size and prompts per step, sampling temperature, supervised warm
start (steps, batch, peak learning rate), RL learning rate and warm-up, no KL term, one
policy-gradient epoch per batch, evaluation (greedy, exact final answer, the first
eval problems of the test split). What differs: the model family (Tunix's Qwen3, RMSNorm,
RoPE, SwiGLU, q/k norms; ours: LayerNorm, learned positions, GELU), sized to the same
parameter count; the loss (Tunix's GRPO loss with sequence-mean-token-mean aggregation,
ours PPO-clip with token-mean); the supervised warm start (our SFT loop vs a plain optax
loop over the Tunix model, cosine vs our schedule); so accuracies differ from the start.
Throughput compares the frameworks' sampling + update machinery at equal work per step.

Order: Tunix first (its RL wall-clock for --rl-steps sets the budget), then our benchmark
(experiments/bench_sync_vs_async.py, one seed, arms grpo and sao) with the same RL seconds
per arm. Reported per arm: trajectories/s; held-out greedy accuracy before and after RL;
the training reward per step (mean over the step's sampled rows, at the RL temperature)
against wall-clock, and the RL seconds until its 5-step mean first reaches a target
(default: the best 5-step start of the three arms + 0.05). Writes results/bench_peers.json
and prints the table; our runs' checkpoints and metrics go to --workdir.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import subprocess
import sys
import time

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
TUNIX = ("google-tunix==0.1.7", "jax==0.10.2", "jaxlib==0.10.2")


def ensure_tunix_venv(venv: pathlib.Path) -> pathlib.Path:
  py = venv / "bin" / "python"
  if (
    py.exists()
    and subprocess.run([str(py), "-c", "import tunix"], capture_output=True).returncode == 0
  ):
    return py
  print(f"installing {', '.join(TUNIX)} into {venv} (once, a few minutes)...", flush=True)
  base = (
    "python3.11"
    if subprocess.run(["which", "python3.11"], capture_output=True).returncode == 0
    else sys.executable
  )
  subprocess.run([base, "-m", "venv", str(venv)], check=True)
  subprocess.run([str(py), "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True)
  subprocess.run([str(py), "-m", "pip", "install", "-q", *TUNIX], check=True)
  return py


def _loadavg() -> list[float]:
  with open("/proc/loadavg") as f:
    return [float(x) for x in f.read().split()[:3]]


def qwen3_params(vocab: int, d: int, layers: int, heads: int, head_dim: int, hidden: int) -> int:
  """Parameters of Tunix's Qwen3 with tied embeddings and kv heads = heads."""
  attn = 4 * d * heads * head_dim + 2 * head_dim  # q, k, v, o and the q/k norms
  return vocab * d + layers * (attn + 3 * d * hidden + 2 * d) + d


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--config", default=str(HERE / "configs" / "sao_arith.py"))
  p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
  p.add_argument("--rl-steps", type=int, default=100, help="Tunix GRPO steps (sets the budget)")
  p.add_argument(
    "--target",
    type=float,
    default=0.0,
    help="target training reward, mean of 5 steps (0: the best start + 0.05)",
  )
  p.add_argument("--quick", action="store_true")
  p.add_argument("--venv", default=str(ROOT / ".venv-tunix"))
  p.add_argument("--out", default="results/bench_peers.json")
  p.add_argument(
    "--workdir", default="runs/bench_peers", help="checkpoints and metrics of our arms (large)"
  )
  args = p.parse_args(argv)

  import jax

  from sao_jax import config as config_lib
  from sao_jax.learner import make_sft_update
  from sao_jax.results_file import ResultFile
  from sao_jax.runners.common import programs_for
  from sao_jax.setup import load_config, make_setup

  t0 = time.time()
  cfg = load_config(args.config, "default", args.set)
  if args.quick:
    cfg = config_lib.apply_overrides(cfg, ["sft.steps=60", "eval.num_problems=100"])
  s = make_setup(cfg)
  progs = programs_for(s, cfg.sft.optim, make_sft_update)
  ours_params = int(sum(x.size for x in jax.tree.leaves(progs.init(jax.random.key(0)).params)))
  mc = cfg.model
  head_dim = mc.width // mc.heads
  # SwiGLU has three matrices where our GELU MLP has two: the hidden width that gives the
  # same parameter count
  hidden = min(
    range(8, 8 * mc.width),
    key=lambda h: abs(
      qwen3_params(s.tok.vocab_size, mc.width, mc.depth, mc.heads, head_dim, h) - ours_params
    ),
  )
  rl_steps = 6 if args.quick else args.rl_steps
  out_dir = pathlib.Path(args.out).with_suffix("")
  out_dir.mkdir(parents=True, exist_ok=True)
  rl = cfg.rl
  spec = {
    "model": {
      "num_layers": mc.depth,
      "vocab_size": s.tok.vocab_size,
      "embed_dim": mc.width,
      "hidden_dim": hidden,
      "num_heads": mc.heads,
      "head_dim": head_dim,
    },
    "run": {
      "seed": cfg.seed,
      "sft_steps": cfg.sft.steps,
      "sft_batch": cfg.sft.batch_size,
      "sft_optim": dataclasses.asdict(cfg.sft.optim),
      "rl_optim": dataclasses.asdict(rl.optim),
      "sft_len": s.prompt_len + s.target_len,
      "prompt_len": s.prompt_len,
      "max_new_tokens": rl.max_new_tokens,
      "temperature": rl.temperature,
      "prompts_per_step": rl.prompts_per_step,
      "group_size": rl.group_size,
      "rl_steps": rl_steps,
      "eval_problems": cfg.eval.num_problems,
      "eval_batch": cfg.eval.batch_size,
    },
    "train": [{"prompt": t.prompt, "solution": t.solution, "answer": t.answer} for t in s.train],
    "test": [{"prompt": t.prompt, "solution": t.solution, "answer": t.answer} for t in s.test],
  }
  spec_path = out_dir / "tunix_spec.json"
  spec_path.write_text(json.dumps(spec))
  py = ensure_tunix_venv(pathlib.Path(args.venv))
  tunix_out = out_dir / "tunix.json"
  print("+ tunix GRPO", flush=True)
  load = {"tunix_start": _loadavg()}
  subprocess.run(
    [
      "nice",
      "-n",
      "10",
      str(py),
      str(HERE / "peers" / "tunix_grpo.py"),
      str(spec_path),
      str(tunix_out),
    ],
    check=True,
  )
  load["tunix_end"] = _loadavg()
  tun = json.loads(tunix_out.read_text())

  # ours: the same RL wall-clock per arm, one seed (as Tunix runs one); held-out evaluation
  # only before and after
  from bench_sync_vs_async import main as bench_main

  from sao_jax.metrics import read_jsonl

  seconds = tun["rl_seconds"]
  ours_work = pathlib.Path(args.workdir)
  bench = bench_main(
    [
      "--config",
      args.config,
      *[x for kv in args.set for x in ("--set", kv)],
      *(["--set", "sft.steps=60", "--set", "eval.num_problems=100"] if args.quick else []),
      "--seconds",
      f"{seconds:.1f}",
      "--eval-every",
      "1e9",
      "--seeds",
      "1",
      "--arms",
      "grpo,sao",
      "--out",
      str(out_dir / "ours"),
      "--workdir",
      str(ours_work),
      "--no-progress",
    ]
  )
  ours = bench["runs"][0]
  load["ours_end"] = _loadavg()
  curves = {"tunix_grpo": [(t, rw) for t, _, rw in tun["reward_curve"]]}
  for arm in ("grpo", "sao"):
    rows = [
      r
      for r in read_jsonl(ours_work / f"seed{ours['seed']}" / arm / "metrics.jsonl")
      if r.get("phase") == "rl" and "accuracy" in r and "train_seconds" in r
    ]
    curves[f"ours_{arm}"] = [(r["train_seconds"], r["accuracy"]) for r in rows]

  def rolling(curve, k=5):
    return [
      (curve[i][0], float(np.mean([rw for _, rw in curve[max(0, i - k + 1) : i + 1]])))
      for i in range(len(curve))
    ]

  smooth = {a: rolling(c) for a, c in curves.items()}
  target = args.target or max(c[min(4, len(c) - 1)][1] for c in smooth.values()) + 0.05
  arms = {
    "tunix_grpo": {
      "trajectories_per_s": tun["trajectories_per_s"],
      "trajectories_per_s_steady": tun["trajectories_per_s_steady"],
      "steps": tun["steps"],
      "rl_seconds": tun["rl_seconds"],
      "sft_accuracy": tun["sft_accuracy"],
      "accuracy": tun["accuracy"],
      "model_params": tun["model_params"],
      "sft_seconds": tun["sft_seconds"],
    }
  }
  for arm in ("grpo", "sao"):
    info = ours[arm]
    arms[f"ours_{arm}"] = {
      "trajectories_per_s": info["trajectories_per_s"],
      "steps": info["steps"],
      "rl_seconds": info["seconds"],
      "sft_accuracy": ours["sft"]["accuracy"],
      "accuracy": info["accuracy"],
      "model_params": ours_params,
      "sft_seconds": ours["sft"]["seconds"],
    }
  for a, c in smooth.items():
    t = next((t for t, rw in c if rw >= target - 1e-9), None)
    arms[a]["reward_first_5_steps"] = c[min(4, len(c) - 1)][1]
    arms[a]["reward_last_5_steps"] = c[-1][1]
    arms[a]["time_to_target"] = {
      "rl_s": t,
      "sft_plus_rl_s": None if t is None else arms[a]["sft_seconds"] + t,
    }
    arms[a]["reward_curve"] = curves[a]
  ratios = {
    f"{a}_over_tunix": arms[a]["trajectories_per_s"] / tun["trajectories_per_s"]
    for a in ("ours_grpo", "ours_sao")
  }
  # Our arms' resolved config as they ran (bench_sync_vs_async's, with the peer's seconds).
  series = "bench_peers/tunix" + ("/quick" if args.quick else "")
  rf = ResultFile(args.out, series=series, config=bench["config"])
  result = {
    # the machine's load over the run (its provenance has the rest of the machine)
    "machine": {"loadavg_1_5_15": load},
    "tunix": {
      "version": tun["tunix_version"],
      "jax": tun["jax"],
      "model": tun["model"],
      "hidden_dim": hidden,
    },
    "same": {
      "prompts_per_step": rl.prompts_per_step,
      "group_size": rl.group_size,
      "rows_per_step": rl.prompts_per_step * rl.group_size,
      "max_new_tokens": rl.max_new_tokens,
      "prompt_len": s.prompt_len,
      "temperature": rl.temperature,
      "sft_steps": cfg.sft.steps,
      "rl_lr": rl.optim.lr,
      "eval_problems": cfg.eval.num_problems,
    },
    "target_training_reward": target,
    "arms": arms,
    "throughput_ratios": ratios,
    "wall_s": time.time() - t0,
  }
  rf.finish(result)
  result = rf.doc
  print(f"\n{'':28s}{'Tunix GRPO':>14s}{'ours GRPO':>14s}{'ours SAO':>14s}")
  for key, fmt in (
    ("model_params", "{:d}"),
    ("trajectories_per_s", "{:.1f}"),
    ("sft_accuracy", "{:.1%}"),
    ("accuracy", "{:.1%}"),
    ("reward_first_5_steps", "{:.1%}"),
    ("reward_last_5_steps", "{:.1%}"),
  ):
    print(
      f"{key:28s}"
      + "".join(f"{fmt.format(arms[a][key]):>14s}" for a in ("tunix_grpo", "ours_grpo", "ours_sao"))
    )

  def secs(a):
    t = arms[a]["time_to_target"]["rl_s"]
    return "-" if t is None else f"{t:.1f}"

  print(
    f"{'RL s to reward ' + format(target, '.0%'):28s}"
    + "".join(f"{secs(a):>14s}" for a in ("tunix_grpo", "ours_grpo", "ours_sao"))
  )
  print(
    f"throughput ours/Tunix: GRPO {ratios['ours_grpo_over_tunix']:.2f}x, "
    f"SAO {ratios['ours_sao_over_tunix']:.2f}x\nresults: {args.out}"
  )
  return result


if __name__ == "__main__":
  main()
