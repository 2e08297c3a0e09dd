"""Poisoned trajectory records in a live SAO run: are they all rejected, and does training
notice them?

Per seed, one supervised warm start, then two SAO runs from it on the same tasks and seed:
a clean control, and one whose sampler 0 sends `--per-kind` poisoned records of each kind
(`faults.poison_kinds`, see sao_jax.admission.poison: a NaN behaviour log-prob, a token id
past the vocabulary, a reward above the task's range, a policy version from the future, a
task index never handed out, another task's id, a reward its completion does not earn,
behaviour log-probs claiming certainty or e^-50, the same trajectory sent again, another
config's prompt width), one with every third record it sends. Over Kafka, a producer that
has the broker's address but not the run's key also writes `--forge` well-formed records
into the run's trajectories topic. The learner must catch every one by its counter
(`config.POISON_CAUGHT_BY`: the forged log-probs when its update verifies them, a resent
trajectory as a duplicate answer, a misshapen one at the format check; the keyless ones
as unauthenticated), catch nothing in the clean run (its false rejections: target 0, at
most 0.1 % of its records), take no non-finite update and roll back no more than the
control does; held-out accuracy is compared between the two. The clean runs' largest
per-update drift of verified trajectories (`drift_max`) is what `sao.verify_drift` is set
against.

  python experiments/poison.py                                   # 3 seeds, embedded transport
  python experiments/poison.py --transport kafka                 # through a local Kafka broker
  python experiments/poison.py --seeds 1 --updates 30 --sft-steps 60 --per-kind 3   # smoke test

Writes results/poison.json: per catching counter, injected and caught (summed over seeds)
and per seed, and the same counters in the clean runs; accuracy clean vs poisoned (mean ±
s.e. over seeds, sao_jax.stats); the clean runs' drift; provenance.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import pathlib
import shutil
import threading
import time

import numpy as np

from sao_jax import config as config_lib
from sao_jax import stats
from sao_jax.metrics import MetricsWriter, read_jsonl
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
CAUGHT_BY = {k: config_lib.POISON_CAUGHT_BY.get(k, f"rejected_{k}") for k in KINDS}
FORGED = "rejected_unauthenticated"  # the keyless producer's records


def forge(stop: threading.Event, workdir: pathlib.Path, bootstrap: str, n: int, s, out: dict):
  """A producer with the broker's address and nothing else: once the run has updated, `n`
  well-formed trajectory records of the run's shapes, sealed under a key of its own (how
  many it sent: out["sent"])."""
  from kafka import KafkaProducer

  from sao_jax.transport import auth, records

  out["sent"] = 0
  while not (workdir / "ledger.jsonl").exists():  # its first update: the topics exist
    if stop.wait(0.2):
      return
  topic = f"sao.{(workdir / 'run_id').read_text().strip()}.trajectories"
  p, t = s.prompt_len, s.cfg.rl.max_new_tokens
  arrays = {
    "prompt": np.full((1, p), 3, np.int32),
    "prompt_valid": np.ones((1, p), bool),
    "tokens": np.full((1, t), 5, np.int32),
    "valid": np.arange(t)[None] < 4,
    "logp": np.full((1, t), -0.5, np.float32),
    "rewards": np.ones(1, np.float32),
    "step_seconds": np.zeros(1, np.float32),
  }
  key = auth.new_key()  # not the run's
  producer = KafkaProducer(bootstrap_servers=bootstrap)
  try:
    for i in range(n):
      meta = {"task_index": i % 10, "task_id": i % 10, "reward": 1.0, "t_end": time.time()}
      data = records.encode(records.RecordKind.TRAJECTORY, (0xBAD << 40) | i, 0, arrays, meta)
      producer.send(topic, value=auth.seal(key, data))
      out["sent"] += 1
      if stop.wait(0.05):
        break
    producer.flush()
  finally:
    producer.close()


def drift_stats(workdir: pathlib.Path) -> dict:
  """The largest per-update drift of verified trajectories (`drift_max`) over a run."""
  xs = [r["drift_max"] for r in read_jsonl(workdir / "metrics.jsonl") if "drift_max" in r]
  if not xs:
    return {"updates": 0}
  return {
    "updates": len(xs),
    "max": float(np.max(xs)),
    "p99": float(np.percentile(xs, 99)),
    "median": float(np.median(xs)),
  }


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
  p.add_argument(
    "--forge", type=int, default=50, help="records a keyless producer writes (Kafka only)"
  )
  p.add_argument("--out", default="results/poison.json")
  p.add_argument("--workdir", default="runs/poison")
  p.add_argument("--no-progress", action="store_true")
  args = p.parse_args(argv)
  broker = None
  sets = [*TASK, f"transport.kind={args.transport}", *args.set]
  if args.transport == "kafka":  # an external broker: the keyless producer needs its address
    from sao_jax.transport.broker import LocalBroker

    broker = LocalBroker(log_dir=str(pathlib.Path(args.workdir).absolute() / "broker")).start()
    sets.append(f"transport.bootstrap_servers={broker.bootstrap!r}")
  try:
    return _run(args, sets, broker)
  finally:
    if broker is not None:
      broker.stop()


def _run(args, sets: list[str], broker) -> dict:
  base = load_config(args.config, args.variant, sets)
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
  for old in work.glob("seed*"):
    shutil.rmtree(old, ignore_errors=True)
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
      stop, forged = threading.Event(), {}
      forger = None
      if broker is not None and arm == "poisoned" and args.forge:
        forger = threading.Thread(
          target=forge, args=(stop, d, broker.bootstrap, args.forge, s, forged), daemon=True
        )
        forger.start()
      try:
        _, _, info = run_sao(dataclasses.replace(s, cfg=acfg), w, sft_state, d)
      finally:
        stop.set()
        if forger is not None:
          forger.join(30)
      w.close()
      counts = (info.get("lifetime") or {}).get("counts", {})
      run[arm] = {
        "caught": {c: counts.get(c, 0) for c in sorted({*CAUGHT_BY.values(), FORGED})},
        "forged_sent": forged.get("sent", 0),
        "consumed": counts.get("consumed", 0),
        "drift": drift_stats(d),
        **{
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
        },
      }
      print(
        f"seed {seed} {arm}: accuracy {sft['accuracy']:.3f} -> {info['accuracy']:.3f}, "
        f"rejected {info['rejected_total']} {info['rejected']}, non-finite updates "
        f"{info['nonfinite_skipped']}, rollbacks {info['rollbacks']}",
        flush=True,
      )
    runs.append(run)
  # Per catching counter (two kinds share one): what was injected and what it caught.
  injected = collections.Counter({c: 0 for c in CAUGHT_BY.values()})
  for k in KINDS:
    injected[CAUGHT_BY[k]] += args.per_kind
  per_kind = {}
  for c in sorted(injected):
    per_kind[c] = {
      "kinds": [k for k in KINDS if CAUGHT_BY[k] == c],
      "injected": injected[c] * args.seeds,
      "rejected": sum(r["poisoned"]["caught"][c] for r in runs),
      "rejected_per_seed": [r["poisoned"]["caught"][c] for r in runs],
      "rejected_in_clean_runs": sum(r["clean"]["caught"][c] for r in runs),
    }
  if broker is not None and args.forge:
    per_kind[FORGED] = {
      "kinds": ["keyless producer"],
      "injected": sum(r["poisoned"]["forged_sent"] for r in runs),
      "rejected": sum(r["poisoned"]["caught"][FORGED] for r in runs),
      "rejected_per_seed": [r["poisoned"]["caught"][FORGED] for r in runs],
      "rejected_in_clean_runs": sum(r["clean"]["caught"][FORGED] for r in runs),
    }
  for v in per_kind.values():
    v["missed"] = v["injected"] - v["rejected"]
  clean_consumed = sum(r["clean"]["consumed"] for r in runs)
  false_rejections = sum(v["rejected_in_clean_runs"] for v in per_kind.values())
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
  summary["false_rejections"] = false_rejections
  summary["false_rejection_rate"] = false_rejections / max(clean_consumed, 1)
  summary["clean_consumed"] = clean_consumed
  summary["clean_drift_max"] = max((r["clean"]["drift"].get("max", 0.0) for r in runs), default=0)
  summary["verify_drift"] = base.sao.verify_drift
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
      f"{k:>26} ({', '.join(v['kinds'])}): injected {v['injected']}, caught {v['rejected']} "
      f"(clean runs: {v['rejected_in_clean_runs']})"
    )
  print(
    f"false rejections: {false_rejections} of {clean_consumed} clean records; clean drift_max "
    f"{summary['clean_drift_max']:.3g} (sao.verify_drift {base.sao.verify_drift:g})"
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
