"""Learner update time of the memory policy: the memory run through the model once per row
(the reference) against once per trajectory where every row reads a prefix of it.

A row's memory is the bank as it stood at the row's step. Where the bank never evicts and is
all visible (the stage-1 control of bench_compression.py: every step kept), row t reads the
entries written before t, a prefix of the trajectory's final bank; likewise the salience
pass reads every step before t. Memory slots attend causally to earlier slots and carry no
position, so their keys and values are the same in every row that reads them: the learner
computes them once per trajectory (`sampling.shared_memory_logprobs`) and each row's tokens
attend to its prefix. The compressed arm evicts, so only its salience pass shares.

For each arm (the compressed arm and the stage-1 control of `--task`), the same supervised
updates on the same expert episodes, timed per step after compilation, with the memory per
row and shared; the two modes alternate within each repeat so both see the same load. Also
the first update's loss in each mode from the same initial state (the same up to float
rounding: the two paths compute the same function).

The sampler's side (`sampler` in the JSON): the stage-1 control's greedy episodes of
`--eval-steps` steps (`--eval-episodes` side by side, its initial parameters), with the
memory's keys and values kept between steps (`MemoryPolicy.sample_cached`, what evaluation
uses for such a bank) against the whole memory through the model every step in windows that
grow with the bank (`memory_lab.growing_greedy`, the previous evaluation path): seconds per
episode step in each mode (after one untimed round that compiles both), the speedup per
repeat, and whether both modes played the same tokens.

Run (about 15 minutes on a 2-core CPU; writes results/bench_memory_update.json):
  python experiments/bench_memory_update.py
Smoke run (a minute):
  python experiments/bench_memory_update.py --quick --out /tmp/bench_memory_update.json
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import time

import jax
import numpy as np

from sao_jax.bench.compression import uncompressed_cfg
from sao_jax.config import ConfigError, load_config
from sao_jax.envs.longhorizon import make_split
from sao_jax.results_file import ResultFile, config_file_id, portable_path
from sao_jax.runners import memory_lab as L
from sao_jax.stats import summarize

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODES = {"per_row": False, "shared": None}  # `make_memory_update(share=...)`


# The compressed policy, and its stage-1 control (`uncompressed_cfg`: every step kept, float32).
ARMS = ("compressed", "uncompressed_memory")


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--config", default=str(ROOT / "experiments/configs/longhorizon.py"))
  p.add_argument("--task", default="retention8", help="a task of the config's TRAIN_TASKS")
  p.add_argument("--steps", type=int, default=5, help="timed updates per arm, mode and repeat")
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument(
    "--eval-steps", type=int, default=300, help="steps of the sampler's episodes (0: skip)"
  )
  p.add_argument("--eval-episodes", type=int, default=8)
  p.add_argument("--quick", action="store_true", help="tiny config, 2 steps, 2 repeats")
  p.add_argument(
    "--arms",
    default=",".join(ARMS),
    help=f"comma-separated, from {', '.join(ARMS)} (each compiles its update in both modes)",
  )
  p.add_argument(
    "--set",
    action="append",
    default=[],
    metavar="KEY=VALUE",
    help="config override, as for sao-jax train (e.g. model.depth=1); recorded in the JSON",
  )
  p.add_argument("--out", default=str(ROOT / "results/bench_memory_update.json"))
  return p


def main(argv=None) -> dict:
  args = _parser().parse_args(argv)
  variant = "tiny" if args.quick else "default"
  try:
    cfg = load_config(f"{args.config}:{variant}", overrides=args.set)
  except ConfigError as e:
    _parser().error(str(e))
  mod = L.config_module(args.config)
  task = "retention" if args.quick else args.task
  steps, repeats = (2, 2) if args.quick else (args.steps, args.repeats)
  if task not in mod.TRAIN_TASKS[variant] or min(steps, repeats) < 1:
    _parser().error(
      f"--task {task!r} (known: {', '.join(mod.TRAIN_TASKS[variant])}), --steps and --repeats >= 1"
    )
  chosen = [a.strip() for a in args.arms.split(",") if a.strip()]
  if not chosen or set(chosen) - set(ARMS):
    _parser().error(f"--arms {args.arms!r}: known {', '.join(ARMS)}")
  spec = mod.TRAIN_TASKS[variant][task]
  train = make_split(spec, "train", 64, 0, num_test=0)
  arms = {"compressed": cfg, "uncompressed_memory": uncompressed_cfg(cfg, spec.n_steps)}
  arms = {k: v for k, v in arms.items() if k in chosen}
  kw = dict(length=L.full_len(train), seed=0)
  series = f"bench_memory_update/{task}" + ("/quick" if args.quick else "")
  rf = ResultFile(args.out, series=series, config=cfg)
  result = rf.update(
    config_file=config_file_id(f"{portable_path(args.config)}:{variant}"),
    task=task,
    overrides=args.set,
    spec=dict(vars(spec)),
    batch_size=cfg.sft.batch_size,
    steps=steps,
    repeats=repeats,
    arms={},
  ).doc
  runs = {}
  for arm, acfg in arms.items():
    for mode, share in MODES.items():
      progs, policy = L.build(acfg, True, mode="sft", share=share)
      # One update from the initial state: compiles, and gives the loss the modes compare.
      state, _, metrics = L.train(acfg, progs, True, train, steps=1, **kw)
      runs[arm, mode] = [progs, state, []]
      result["arms"].setdefault(arm, {"shares_bank": policy.shares_bank()})
      result["arms"][arm].setdefault("first_update_loss", {})[mode] = metrics["loss"]
      print(f"{arm} {mode}: compiled, first loss {metrics['loss']:.6f}", flush=True)
  for r in range(repeats):
    for (arm, mode), run in runs.items():
      progs, state, times = run
      start = int(jax.device_get(state.step))
      run[1], secs, _ = L.train(
        arms[arm], progs, True, train, steps=start + steps, state=state, **kw
      )
      times.append(secs / steps)
      print(f"repeat {r}: {arm} {mode} {times[-1]:.3f} s/step", flush=True)
  for arm, a in result["arms"].items():
    for mode in MODES:
      a[mode] = summarize(runs[arm, mode][2])  # s per step, over the repeats
    ratios = np.asarray(runs[arm, "per_row"][2]) / np.asarray(runs[arm, "shared"][2])
    a["speedup"] = summarize(ratios.tolist())  # per repeat, side by side
    loss = a["first_update_loss"]
    a["first_update_loss_rel_diff"] = abs(loss["shared"] - loss["per_row"]) / abs(loss["per_row"])
    print(
      f"{arm}: per row {a['per_row']['mean']:.3f} s/step, shared {a['shared']['mean']:.3f} "
      f"s/step, speedup {a['speedup']['mean']:.2f}x (se {a['speedup']['se'] or 0:.2f})"
    )
  if args.eval_steps:
    n = 24 if args.quick else args.eval_steps
    result["sampler"] = sampler_bench(cfg, spec, n, args.eval_episodes, repeats)
  rf.finish()
  return result


def sampler_bench(cfg, spec, n: int, episodes: int, repeats: int) -> dict:
  """The stage-1 control's greedy episodes of n steps, cached memory against growing windows
  (module docstring)."""
  acfg = uncompressed_cfg(cfg, n)
  tasks = make_split(dataclasses.replace(spec, n_steps=n), "test", episodes, 0)
  progs, policy = L.build(acfg, True)
  params = progs.init(jax.random.key(0)).params
  modes = {
    "growing": lambda: L.growing_greedy(acfg, progs),
    "cached": lambda: L.cached_greedy(progs, episodes),
  }
  times = {mode: [] for mode in modes}
  same = []
  for r in range(repeats + 1):  # round 0 compiles
    played = {}
    for mode, make in modes.items():
      t0 = time.time()
      _, played[mode] = L.evaluate(
        acfg, progs, policy, params, tasks, True, length=0, slots=episodes, greedy=make()
      )
      if r:
        times[mode].append((time.time() - t0) / n)
        print(f"sampler repeat {r - 1}: {mode} {times[mode][-1]:.4f} s/step", flush=True)
    same.append(
      all(
        np.array_equal(a.tokens, b.tokens)
        for a, b in zip(played["growing"], played["cached"], strict=True)
      )
    )
  ratios = np.asarray(times["growing"]) / np.asarray(times["cached"])
  out = {
    "steps": n,
    "episodes": episodes,
    "params": "initial",
    "same_tokens": all(same),
    **{mode: summarize(t) for mode, t in times.items()},
    "speedup": summarize(ratios.tolist()),
  }
  print(
    f"sampler at {n} steps: growing {out['growing']['mean']:.4f} s/step, cached "
    f"{out['cached']['mean']:.4f} s/step, speedup {out['speedup']['mean']:.2f}x, "
    f"same tokens {out['same_tokens']}"
  )
  return out


if __name__ == "__main__":
  main()
