"""Restart -> first update after kill -9: how long a crashed SAO run takes to train again.

  python experiments/recovery_time.py                      # 20 kills with the compile cache,
                                                           # 10 without (control)
  python experiments/recovery_time.py --kills 3 --control-kills 0      # smoke test

One `sao-jax train` run of the tiny SAO config (embedded transport, 2 sampler processes) is
killed with SIGKILL (its whole process group: learner and samplers) at a random moment of
its RL phase (uniform in [--min-run, --max-run] seconds after its first update) and started
again with the same command, `--kills` times. Each restart resumes from its newest snapshot
and replays its journal; the resumed learner logs the time from its process start to its
first update and where it went (imports, task load, compiling, restoring, sampler start,
first batch; `sao_jax.runners.learner_parts.statistics.STARTUP_STAGES`). Arm "cache" uses
the persistent compilation cache (recovery.compile_cache=workdir: empty at the first start,
so the first start compiles and fills it); arm "no_cache" turns it off: the control that
shows what the cache buys. Writes OUT/recovery_time.json (per restart and median/max per
arm) and a plot.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import statistics
import subprocess
import sys
import time

from sao_jax.config import load_config
from sao_jax.procs import kill_and_wait
from sao_jax.results_file import ResultFile, config_file_id
from sao_jax.stats import summarize

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
CONFIG = str(HERE / "configs" / "sao_arith.py") + ":tiny"


def _start(workdir: pathlib.Path, overrides: list[str], log) -> subprocess.Popen:
  cmd = [
    sys.executable,
    "-m",
    "sao_jax.cli",
    "train",
    "--config",
    CONFIG,
    "--workdir",
    str(workdir),
    "--no-progress",
  ]
  for o in overrides:
    cmd += ["--set", o]
  return subprocess.Popen(
    cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
  )


def _wait_for(log_path: pathlib.Path, offset: int, needle: str, proc, timeout: float) -> str:
  """The first line containing `needle` written after `offset`, or '' on timeout/exit."""
  deadline = time.time() + timeout
  while time.time() < deadline:
    text = log_path.read_text(errors="replace")[offset:]
    for line in text.splitlines():
      if needle in line:
        return line
    if proc.poll() is not None:
      return ""
    time.sleep(0.1)
  return ""


def _wait_rl(workdir: pathlib.Path, proc, timeout: float) -> bool:
  """Waits until the run has logged an RL update."""
  deadline = time.time() + timeout
  metrics = workdir / "metrics.jsonl"
  while time.time() < deadline and proc.poll() is None:
    if metrics.exists() and '"phase": "rl"' in metrics.read_text():
      return True
    time.sleep(0.5)
  return False


def _resume_events(workdir: pathlib.Path) -> list[dict]:
  out = []
  for line in (workdir / "metrics.jsonl").read_text().splitlines():
    row = json.loads(line)
    if row.get("phase") == "rl_event" and row.get("event") == "resume":
      out.append(row)
  return out


def run_arm(
  name: str,
  kills: int,
  workdir: pathlib.Path,
  overrides: list[str],
  rng,
  min_run: float,
  max_run: float,
) -> list[dict]:
  workdir.mkdir(parents=True, exist_ok=True)
  log_path = workdir.parent / f"{name}.log"
  restarts = []
  with open(log_path, "ab") as log:
    offset = log_path.stat().st_size
    proc = _start(workdir, overrides, log)
    try:
      # The first start: SFT, then RL (its first update marks "running").
      if not _wait_rl(workdir, proc, 900):
        raise RuntimeError(f"{name}: the run did not reach its RL phase; see {log_path}")
      for k in range(kills):
        time.sleep(rng.uniform(min_run, max_run))
        if proc.poll() is not None:
          raise RuntimeError(f"{name}: the run exited before kill {k}; see {log_path}")
        kill_and_wait(proc, whole_group=True, timeout=10)
        offset = log_path.stat().st_size
        t0 = time.time()
        proc = _start(workdir, overrides, log)
        line = _wait_for(log_path, offset, "after the restart", proc, 300)
        if not line:
          raise RuntimeError(f"{name}: restart {k} never updated; see {log_path}")
        outside = time.time() - t0
        event = _resume_events(workdir)[-1]
        restarts.append(
          {
            "kill": k,
            "recovery_s": event["recovery_s"],
            "observed_s": round(outside, 3),
            "from_step": event["from_step"],
            "replay_records": event["replay_records"],
            "breakdown_s": event.get("breakdown_s", {}),
            "loadavg_1m": os.getloadavg()[0],
          }
        )
        print(
          f"{name} kill {k + 1}/{kills}: first update {event['recovery_s']:.1f} s after the "
          f"restart {event.get('breakdown_s', {})}",
          flush=True,
        )
    finally:
      kill_and_wait(proc, whole_group=True, timeout=10)
  return restarts


def _summary(restarts: list[dict]) -> dict:
  rec = [r["recovery_s"] for r in restarts]
  stages = sorted(
    {k for r in restarts for k in r["breakdown_s"]},
    key=lambda k: min(list(r["breakdown_s"]).index(k) for r in restarts if k in r["breakdown_s"]),
  )
  return {
    "restarts": len(rec),
    "median_s": statistics.median(rec) if rec else None,
    "max_s": max(rec) if rec else None,
    "recovery_s": summarize(rec),
    "breakdown_median_s": {
      k: statistics.median(r["breakdown_s"].get(k, 0.0) for r in restarts) for k in stages
    },
  }


def plot(result: dict, path: pathlib.Path) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(7, 3.2))
  arms = [a for a in result["arms"] if result["arms"][a]["restarts"]]
  for i, arm in enumerate(arms):
    left = 0.0
    for j, (stage, sec) in enumerate(result["arms"][arm]["summary"]["breakdown_median_s"].items()):
      ax.barh(i, sec, left=left, color=f"C{j}", label=stage if i == 0 else None)
      left += sec
    vals = [r["recovery_s"] for r in result["arms"][arm]["restarts"]]
    ax.plot(vals, [i + 0.3] * len(vals), "k|", ms=8)
  ax.axvline(10, color="gray", ls="--", lw=1)
  ax.set_yticks(range(len(arms)), arms)
  ax.set_xlabel("process start -> first update after kill -9 (s); bars: median per stage")
  ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.3))
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--kills", type=int, default=20)
  p.add_argument("--control-kills", type=int, default=10, help="kills without the cache")
  p.add_argument("--min-run", type=float, default=3.0)
  p.add_argument("--max-run", type=float, default=12.0)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--set", action="append", default=[], help="extra config overrides")
  p.add_argument("--workdir", default="runs/recovery_time")
  p.add_argument("--out", default="results/recovery_time")
  args = p.parse_args(argv)
  rng = random.Random(args.seed)
  root = pathlib.Path(args.workdir)
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  base = ["rl.steps=1000000", "rl.max_seconds=0", "checkpoint_every=20"] + args.set
  arms = {
    "cache": (args.kills, base + ["recovery.compile_cache=workdir"]),
    "no_cache": (args.control_kills, base + ["recovery.compile_cache=off"]),
  }
  # The runs' resolved config but for `recovery.compile_cache`, which each arm sets.
  rf = ResultFile(
    out / "recovery_time.json",
    series="recovery_time",
    config=load_config(CONFIG, overrides=base),
    argv=sys.argv if argv is None else argv,
  )
  result = rf.update(config_file=config_file_id(CONFIG), overrides=base, arms={}).doc
  for name, (kills, overrides) in arms.items():
    if not kills:
      continue
    wd = root / name
    if wd.exists():
      raise SystemExit(f"{wd} exists: pass a new --workdir")
    restarts = run_arm(name, kills, wd, overrides, rng, args.min_run, args.max_run)
    result["arms"][name] = {
      "overrides": overrides,
      "restarts": restarts,
      "summary": _summary(restarts),
    }
    rf.write(done=name)
  plot(result, out / "recovery_time.png")
  for name, arm in result["arms"].items():
    s = arm["summary"]
    print(
      f"{name}: {s['restarts']} restarts, median {s['median_s']:.1f} s, max "
      f"{s['max_s']:.1f} s; median per stage {s['breakdown_median_s']}"
    )
  rf.finish()
  print(f"wrote {out / 'recovery_time.json'}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
