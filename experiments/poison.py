"""Poisoned trajectory records in a live SAO run: are they all rejected, and does training
notice them?

Per seed, one supervised warm start, then two SAO runs from it on the same tasks and seed:
a clean control, and one whose sampler 0 sends `--per-kind` poisoned records of each kind
(`faults.poison_kinds`, see sao_jax.admission: a NaN behaviour log-prob, a token id past the
vocabulary, a reward above the task's range, a policy version from the future, a task index
never handed out), one with every third record it sends. The learner must reject every one
by its reason, reject nothing in the clean run, take no non-finite update and roll back no
more than the control does; held-out accuracy is compared between the two.

  python experiments/poison.py                                   # 3 seeds, embedded transport
  python experiments/poison.py --transport kafka                 # through a local Kafka broker
  python experiments/poison.py --seeds 1 --updates 30 --sft-steps 60 --per-kind 3   # smoke test

Writes results/poison.json: per kind, injected and rejected (summed over seeds) and per
seed; accuracy clean vs poisoned (mean ± s.e. over seeds, sao_jax.stats); provenance.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import shutil
import time

from sao_jax import config as config_lib
from sao_jax import stats
from sao_jax.metrics import MetricsWriter
from sao_jax.results_file import ResultFile
from sao_jax.runners.sao import run_sao
from sao_jax.runners.sft import run_sft
from sao_jax.setup import load_config, make_setup

HERE = pathlib.Path(__file__).resolve().parent
# One-operation sums of numbers up to 20 (441 problems, 100 held out): a short warm start
# already solves some, so that a damaged update would show in held-out accuracy.
TASK = (
  "task.n_ops=1",
  "task.ops=+",
  "task.max_operand=20",
  "eval.num_problems=100",
  "task.num_test=100",
  "recovery.val_problems=64",
)
KINDS = config_lib.POISON_KINDS
ARMS = ("clean", "poisoned")


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--config", default=str(HERE / "configs" / "sao_arith.py"))
  p.add_argument("--variant", default="tiny")
  p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
  p.add_argument("--transport", choices=("embedded", "kafka"), default="embedded")
  p.add_argument("--seeds", type=int, default=3)
  p.add_argument("--updates", type=int, default=80)
  p.add_argument("--sft-steps", type=int, default=300)
  p.add_argument("--per-kind", type=int, default=5, help="poisoned records of each kind")
  p.add_argument("--out", default="results/poison.json")
  p.add_argument("--workdir", default="runs/poison")
  p.add_argument("--no-progress", action="store_true")
  args = p.parse_args(argv)
  base = load_config(
    args.config, args.variant, [*TASK, f"transport.kind={args.transport}", *args.set]
  )
  base = dataclasses.replace(
    base,
    rl=dataclasses.replace(base.rl, steps=args.updates, max_seconds=0),
    sft=dataclasses.replace(base.sft, steps=args.sft_steps, max_seconds=0),
  )
  if not base.recovery.shadow_every:
    raise SystemExit(
      "the unknown_task poison uses a validation-tail task (never handed out): "
      "recovery.shadow_every must be > 0"
    )
  poison = config_lib.FaultsConfig(poison_kinds=KINDS, poison_records=args.per_kind)
  work = pathlib.Path(args.workdir)
  shutil.rmtree(work, ignore_errors=True)
  t0 = time.time()
  runs = []
  for seed in range(args.seeds):
    cfg = dataclasses.replace(base, seed=seed)
    s = make_setup(cfg)
    w = MetricsWriter(work / f"seed{seed}" / "sft", show_progress=not args.no_progress)
    sft_state, _, sft = run_sft(s, w, None, work / f"seed{seed}" / "sft")
    w.close()
    run = {"seed": seed, "sft_accuracy": sft["accuracy"]}
    for arm in ARMS:
      acfg = dataclasses.replace(cfg, faults=poison) if arm == "poisoned" else cfg
      d = work / f"seed{seed}" / arm
      w = MetricsWriter(d, show_progress=not args.no_progress)
      _, _, info = run_sao(dataclasses.replace(s, cfg=acfg), w, sft_state, d)
      w.close()
      run[arm] = {
        k: info[k]
        for k in (
          "steps",
          "accuracy",
          "rejected",
          "rejected_total",
          "reissued_tasks",
          "task_redelivered",
          "quarantined_samplers",
          "nonfinite_skipped",
          "rollbacks",
          "trajectories",
          "bad_records",
          "sampler_restarts",
        )
      }
      print(
        f"seed {seed} {arm}: accuracy {sft['accuracy']:.3f} -> {info['accuracy']:.3f}, "
        f"rejected {info['rejected_total']} {info['rejected']}, non-finite updates "
        f"{info['nonfinite_skipped']}, rollbacks {info['rollbacks']}",
        flush=True,
      )
    runs.append(run)
  per_kind = {}
  for k in KINDS:
    per_kind[k] = {
      "injected": args.per_kind * args.seeds,
      "rejected": sum(r["poisoned"]["rejected"][k] for r in runs),
      "rejected_per_seed": [r["poisoned"]["rejected"][k] for r in runs],
      "rejected_in_clean_runs": sum(r["clean"]["rejected"][k] for r in runs),
    }
  summary = {"sft_accuracy": stats.summarize([r["sft_accuracy"] for r in runs])}
  for arm in ARMS:
    summary[arm] = {
      "accuracy": stats.summarize([r[arm]["accuracy"] for r in runs]),
      "nonfinite_skipped": sum(r[arm]["nonfinite_skipped"] for r in runs),
      "rollbacks": sum(r[arm]["rollbacks"] for r in runs),
      "rejected_total": sum(r[arm]["rejected_total"] for r in runs),
    }
  summary["accuracy_poisoned_minus_clean"] = stats.summarize(
    [r["poisoned"]["accuracy"] - r["clean"]["accuracy"] for r in runs]
  )
  summary["all_rejected"] = all(v["rejected"] == v["injected"] for v in per_kind.values())
  rf = ResultFile(args.out, series=f"poison/{base.name}/{args.transport}", config=base)
  result = {
    "transport": args.transport,
    "updates": args.updates,
    "seeds": args.seeds,
    "per_kind_injected_per_seed": args.per_kind,
    "kinds": per_kind,
    "summary": summary,
    "runs": runs,
    "wall_s": time.time() - t0,
    "loadavg_end": [round(x, 2) for x in os.getloadavg()],
  }
  out = rf.finish(result)
  result = rf.doc
  for k, v in per_kind.items():
    print(
      f"{k:>15}: injected {v['injected']}, rejected {v['rejected']} (clean runs: "
      f"{v['rejected_in_clean_runs']})"
    )
  print(
    f"held-out accuracy: clean {stats.fmt(summary['clean']['accuracy'])}, poisoned "
    f"{stats.fmt(summary['poisoned']['accuracy'])}, difference "
    f"{stats.fmt(summary['accuracy_poisoned_minus_clean'])}; non-finite updates "
    f"{summary['poisoned']['nonfinite_skipped']}, rollbacks clean "
    f"{summary['clean']['rollbacks']} / poisoned {summary['poisoned']['rollbacks']}"
  )
  print(f"results: {out}")
  return result


if __name__ == "__main__":
  main()
