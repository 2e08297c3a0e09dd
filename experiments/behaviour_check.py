"""Behaviour unchanged across a refactor: the losses of the first updates, before and after.

  python experiments/behaviour_check.py record --dir runs/behaviour_before     # on the old code
  python experiments/behaviour_check.py check --dir runs/behaviour_before \\
      --out results/behaviour_check.json                                       # on the new code

`record` trains four tiny runs with fixed seeds and keeps their workdirs: SFT (the
arithmetic config's supervised phase), GRPO(N=8) sampling in the learner, SAO through
sampler processes and SAO of the policy with compressed memory (both with their journals
kept), `--updates` updates each, and writes DIR/record.json (each run's loss and gradient
norm per update, and the commit). `check`, run on the changed code:

  sft, grpo          trained again from scratch (both are deterministic on the CPU: the same
                     program on the same data and seeds gives the same numbers);
  sao, memory_sao    asynchronous, so not reproducible by running again: every recorded
                     update is re-executed from the recorded run's journal by `sao-jax replay`
                     with the changed code, on the batches the recorded run formed.

Per run, the largest absolute difference of loss and gradient norm over the updates; all
must be <= --tol (1e-6). Writes --out (and prints the table); exits 1 on a difference.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys

from sao_jax.metrics import read_jsonl
from sao_jax.procs import run_train
from sao_jax.provenance import provenance
from sao_jax.results_file import ResultFile

HERE = pathlib.Path(__file__).resolve().parent
CONFIGS = HERE / "configs"
# name -> (config, overrides, phase whose updates are compared, how `check` re-derives them)
RUNS = {
  "sft": (
    f"{CONFIGS}/sao_arith.py:tiny",
    ["rl.steps=0", "rl.max_seconds=0"],
    "sft",
    "train",
  ),
  "grpo": (
    f"{CONFIGS}/arith_grpo.py:tiny",
    ["rl.sampling='inline'", "sft.steps=20"],
    "rl",
    "train",
  ),
  "sao": (
    f"{CONFIGS}/sao_arith.py:tiny",
    ["recovery.keep_journal=True", "sft.steps=20", "samplers.num=1"],
    "rl",
    "replay",
  ),
  "memory_sao": (
    f"{CONFIGS}/longhorizon.py:tiny",
    [
      "rl.algorithm='sao'",
      "recovery.keep_journal=True",
      "sft.steps=2",
      "task.num_train=8",
      "task.num_test=2",
      "eval.num_problems=2",
      "recovery.shadow_every=0",
      "model.depth=1",
      "compression.enc_depth=1",
    ],
    "rl",
    "replay",
  ),
}
FIELDS = ("loss", "grad_norm")


def _sets(name: str, updates: int, seed: int) -> list[str]:
  _, sets, phase, _ = RUNS[name]
  steps = [f"sft.steps={updates}"] if phase == "sft" else [f"rl.steps={updates}"]
  return [*sets, *steps, f"seed={seed}", "log_every=1"]


def updates_of(workdir: pathlib.Path, phase: str) -> list[dict]:
  """Each update's step, loss and gradient norm, as the run logged them (log_every=1)."""
  rows = [r for r in read_jsonl(workdir / "metrics.jsonl") if r.get("phase") == phase]
  return [{"step": r["step"], **{k: r[k] for k in FIELDS}} for r in rows if "loss" in r]


def record(args) -> int:
  d = pathlib.Path(args.dir)
  d.mkdir(parents=True, exist_ok=True)
  out = {"commit": provenance()["commit"], "updates": args.updates, "seed": args.seed, "runs": {}}
  for name, (config, _, phase, _) in RUNS.items():
    if (d / name).exists():
      raise SystemExit(f"{d / name} exists: record into a new --dir")
    print(f"record {name}", flush=True)
    run_train(config, d / name, _sets(name, args.updates, args.seed))
    out["runs"][name] = updates_of(d / name, phase)
  (d / "record.json").write_text(json.dumps(out, indent=2))
  print(f"recorded {d}/record.json at {out['commit']}")
  return 0


def _diff(want: list[dict], got: list[dict]) -> dict:
  if [r["step"] for r in want] != [r["step"] for r in got]:
    return {"steps_match": False, "recorded": len(want), "rederived": len(got)}
  diff = {
    k: max((abs(a[k] - b[k]) for a, b in zip(want, got, strict=True)), default=0.0) for k in FIELDS
  }
  return {"steps_match": True, "updates": len(want), **{f"max_abs_{k}": v for k, v in diff.items()}}


def check(args) -> int:
  d = pathlib.Path(args.dir)
  rec = json.loads((d / "record.json").read_text())
  work = pathlib.Path(args.workdir)
  work.mkdir(parents=True, exist_ok=True)
  results = {}
  for name, (config, _, phase, how) in RUNS.items():
    print(f"check {name} ({how})", flush=True)
    if how == "train":
      again = work / name
      if again.exists():
        raise SystemExit(f"{again} exists: pass a new --workdir")
      run_train(config, again, _sets(name, rec["updates"], rec["seed"]))
      got = updates_of(again, phase)
    else:
      out_dir = work / f"{name}_replay"
      proc = subprocess.run(
        [
          sys.executable,
          "-m",
          "sao_jax.cli",
          "replay",
          str(d / name),
          "--out",
          str(out_dir),
          "--no-progress",
        ],
        capture_output=True,
        text=True,
      )
      if proc.returncode not in (0, 1):
        raise SystemExit(
          f"replay of {d / name} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        )
      report = json.loads((out_dir / "replay.json").read_text())
      got = [{"step": s["step"], **{k: s["replayed"][k] for k in FIELDS}} for s in report["steps"]]
    results[name] = _diff(rec["runs"][name], got)
  ok = all(
    r["steps_match"] and all(r[f"max_abs_{k}"] <= args.tol for k in FIELDS)
    for r in results.values()
  )
  for name, r in results.items():
    print(f"{name:>11}: {r}")
  print("behaviour unchanged" if ok else f"DIFFERENT beyond {args.tol:g}")
  rf = ResultFile(args.out, series="behaviour_check")
  rf.finish({"recorded_at": rec["commit"], "tol": args.tol, "runs": results, "unchanged": ok})
  return 0 if ok else 1


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  sub = p.add_subparsers(dest="cmd", required=True)
  r = sub.add_parser("record", help="train the four runs and record their updates")
  r.add_argument("--dir", required=True)
  r.add_argument("--updates", type=int, default=20)
  r.add_argument("--seed", type=int, default=0)
  c = sub.add_parser("check", help="re-derive the recorded updates with this code")
  c.add_argument("--dir", required=True, help="what `record` wrote")
  c.add_argument("--workdir", default="runs/behaviour_check")
  c.add_argument("--out", default="results/behaviour_check.json")
  c.add_argument("--tol", type=float, default=1e-6)
  args = p.parse_args(argv)
  return record(args) if args.cmd == "record" else check(args)


if __name__ == "__main__":
  sys.exit(main())
