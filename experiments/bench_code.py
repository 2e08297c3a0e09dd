"""Coding RL, measured: SFT -> SAO, SFT -> GRPO(N=8) and SFT -> more SFT on the code family.

  python experiments/bench_code.py                  # 3 seeds x 180 s per arm (~60 min, 2 CPUs)
  python experiments/bench_code.py --seeds 5 --seconds 300
  python experiments/bench_code.py --quick          # smoke test: tiny model, 1 seed,
                                                    # 2 updates per run (~2 min)

For each seed (`--seeds N`: seeds first..first+N-1 of the model, SFT data order and RL
sampling; the tasks are the same for all) the SFT warm start is trained once, and from that
same checkpoint three arms each train for `--seconds` of training wall-clock (held-out
evaluation excluded):

  sao            asynchronous SAO, one trajectory per task, sandbox-scored (code reward)
  grpo           synchronous GRPO(N=8), the same model, tasks, update rows and reward
  sft_continued  the control: as many seconds as the longest RL arm took, spent on more SFT
                 (optimizer state kept)

An arm's training seconds include its own start-up (compilation; SAO: starting its sampler
process), as a user pays it.

Held-out pass rate is greedy decoding on the first `eval.num_problems` test tasks (programs
never seen in training), scored by the hidden tests: `pass_rate` is the mean fraction of
hidden tests passed, `solved_rate` the fraction of tasks with every hidden test passed.

Then (`--busy-seconds`, 0 to skip) the pipeline question: does the sandbox keep up? From the
same SFT checkpoint, two SAO runs without periodic evaluation, alike in everything but the
cost of the reward: `busy_code` scores by running the hidden tests in the sandbox,
`busy_free` by exact match of the completion with the reference body (no sandbox: a free
reward on the very same prompts, shapes and policy, a tighter control than another task
family). Their learner busy fractions and trajectories/s, side by side, show what the
sandbox costs the pipeline.

Every figure is mean ± standard error over seeds with a 95 % t-interval in the JSON, which
also carries the command, commit, machine and the load average at start and end (the
machine is shared). Writes `--out` (JSON) and `--plot` (pass rate vs training seconds).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import shutil
import time

import numpy as np

from sao_jax import config as config_lib
from sao_jax.bench.code_report import ARMS, plot, print_table, summarize
from sao_jax.envs.base import StepResult, Task
from sao_jax.envs.code import precheck
from sao_jax.evaluation import evaluate
from sao_jax.families import Code
from sao_jax.metrics import MetricsWriter, peak_memory_mb
from sao_jax.results_file import ResultFile
from sao_jax.runners.grpo import run_grpo
from sao_jax.runners.sao import run_sao
from sao_jax.runners.sft import run_sft
from sao_jax.setup import load_config, make_setup
from sao_jax.tasks import TaskFamily
from sao_jax.tokenizer import Tokenizer

HERE = pathlib.Path(__file__).resolve().parent
QUICK_UPDATES = 2
FREE_FAMILY = f"{pathlib.Path(__file__).resolve()}:CodeExactMatch"


class ExactMatchEnv:
  """The code tasks with a free reward: 1 when the completion is the reference body, else 0;
  nothing runs. One step per episode (the `Env` protocol)."""

  max_steps = 1

  def __init__(self, tokenizer: Tokenizer):
    self._tokenizer = tokenizer
    self._task: Task | None = None

  def reset(self, task: Task) -> np.ndarray:
    self._task = task
    return np.asarray(self._tokenizer.encode(task.prompt), dtype=np.int32)

  def step(self, action_tokens) -> StepResult:
    if self._task is None:
      raise RuntimeError("ExactMatchEnv.step() with no episode in progress; call reset(task)")
    text, task, self._task = self._tokenizer.decode(action_tokens), self._task, None
    return StepResult(
      np.zeros((0,), np.int32),
      float(text.strip() == task.solution),
      True,
      {"format_ok": not precheck(text)},
    )


class CodeExactMatch(Code):
  """Task family "code" (same tasks and options) rewarded by `ExactMatchEnv`: no sandbox."""

  step_many = TaskFamily.step_many  # one env at a time: nothing to overlap

  def make_env(self, tok: Tokenizer) -> ExactMatchEnv:
    return ExactMatchEnv(tok)


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--config", default=str(HERE / "configs" / "code.py"))
  p.add_argument("--variant", default="default")
  p.add_argument(
    "--set",
    action="append",
    default=[],
    metavar="KEY=VALUE",
    help="config overrides for every run (e.g. rl.optim.lr=3e-4)",
  )
  p.add_argument("--seeds", type=int, default=3, help="number of seeds (default 3)")
  p.add_argument(
    "--first-seed",
    type=int,
    default=0,
    help="seeds first..first+N-1 (pilots use other seeds than reported runs)",
  )
  p.add_argument("--seconds", type=float, default=180.0, help="training seconds per arm")
  p.add_argument(
    "--evals", type=int, default=1, help="held-out evals inside each arm besides its start and end"
  )
  p.add_argument(
    "--busy-seconds",
    type=float,
    default=90.0,
    help="seconds of each busy-fraction run (0: skip that comparison)",
  )
  p.add_argument("--arms", default=",".join(ARMS), help=f"subset of {','.join(ARMS)}")
  p.add_argument(
    "--quick", action="store_true", help="smoke test: tiny variant, 1 seed, a few seconds per run"
  )
  p.add_argument("--out", default="results/bench_code.json")
  p.add_argument("--plot", default="results/bench_code.png")
  p.add_argument("--workdir", default="runs/bench_code", help="checkpoints and metrics (large)")
  p.add_argument(
    "--reuse-sft",
    action="store_true",
    help="keep the SFT checkpoints in --workdir (same config and seeds: e.g. a "
    "pilot of RL settings) and retrain only what follows them",
  )
  p.add_argument("--no-progress", action="store_true")
  args = p.parse_args(argv)
  if args.quick:  # every run stops after QUICK_UPDATES updates (the seconds are a cap)
    args.variant, args.seeds, args.seconds, args.busy_seconds = "tiny", 1, 120.0, 120.0
  arm_names = [a for a in args.arms.split(",") if a]
  if not arm_names or set(arm_names) - set(ARMS):
    raise SystemExit(f"--arms takes a subset of {','.join(ARMS)}, got {args.arms!r}")
  if args.seeds < 1 or args.seconds <= 0 or args.evals < 0 or args.busy_seconds < 0:
    raise SystemExit("need --seeds >= 1, --seconds > 0, --evals >= 0, --busy-seconds >= 0")

  load_start = os.getloadavg()
  base = load_config(args.config, args.variant, args.set)
  if base.task.family != "code":
    raise SystemExit(
      f"this benchmark is about the code family, the config has {base.task.family!r}"
    )
  base = dataclasses.replace(
    base,
    rl=dataclasses.replace(
      base.rl, steps=QUICK_UPDATES if args.quick else 0, max_seconds=args.seconds
    ),
    log_every=1,
  )
  out, plot_path, work = pathlib.Path(args.out), pathlib.Path(args.plot), pathlib.Path(args.workdir)
  keep = {"sft"} if args.reuse_sft else set()
  for d in sorted(work.glob("seed*/*")) if work.exists() else []:
    if d.name not in keep:
      shutil.rmtree(d)
  work.mkdir(parents=True, exist_ok=True)
  t0 = time.time()
  runs = []
  for seed in range(args.first_seed, args.first_seed + args.seeds):
    runs.append(
      _one_seed(dataclasses.replace(base, seed=seed), arm_names, args, work / f"seed{seed}")
    )
  rf = ResultFile(out, series=f"bench_code/{base.name}/{'+'.join(arm_names)}", config=base)
  results = {
    "seeds": [r["seed"] for r in runs],
    "seconds_per_arm": args.seconds,
    "evals_per_arm": args.evals,
    "busy_seconds": args.busy_seconds,
    "load_average_start": list(load_start),
    "load_average_end": list(os.getloadavg()),
    "runs": runs,
    "summary": summarize(runs, arm_names, bool(args.busy_seconds)),
    "wall_s": time.time() - t0,
    "bench_peak_memory_mb": peak_memory_mb(),
  }
  rf.finish(results)
  results = rf.doc
  print_table(results)
  plot(results, plot_path)
  print(f"results: {out}, {plot_path}")
  return results


def _one_seed(cfg: config_lib.Config, arm_names: list[str], args, work: pathlib.Path) -> dict:
  s = make_setup(cfg)
  seconds, show = args.seconds, not args.no_progress
  eval_every = seconds / (args.evals + 1) if args.evals else 0.0

  def writer(name):
    return MetricsWriter(work / name, show_progress=show)

  w = writer("sft")
  sft_state, _, sft = run_sft(s, w, None, work / "sft")
  w.close()
  sft = _arm_summary(sft, None)
  print(
    f"seed {cfg.seed}: SFT {sft['steps']} steps, pass rate {sft['pass_rate']:.3f}, "
    f"solved {sft['solved_rate']:.3f}",
    flush=True,
  )
  arms = {}
  for name in arm_names:
    w = writer(name)
    if name == "sao":
      _, _, info = run_sao(s, w, sft_state, work / name, max_seconds=seconds, eval_every=eval_every)
    elif name == "grpo":
      s_grpo = dataclasses.replace(
        s, cfg=dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl, algorithm="grpo"))
      )
      _, _, info = run_grpo(
        s_grpo, w, sft_state, work / name, max_seconds=seconds, eval_every=eval_every
      )
    else:  # as many training seconds as the longest RL arm took (they overshoot a little)
      budget = max([arms[a]["seconds"] for a in arms] or [seconds])
      _, _, info = run_sft(
        s,
        w,
        sft_state,
        work / name,
        steps=0,
        max_seconds=budget,
        tag="sft_continued",
        eval_every=eval_every,
        keep_opt_state=True,
      )
    w.close()
    arms[name] = _arm_summary(info, sft)
    print(
      f"seed {cfg.seed}: {name} {info['steps']} steps in {info['seconds']:.0f} s, pass rate "
      f"{arms[name]['pass_rate']:.3f} ({arms[name]['gain_points']:+.1f} points)",
      flush=True,
    )
  if "sft_continued" in arms:
    for name in arms:
      arms[name]["minus_control_points"] = 100 * (
        arms[name]["pass_rate"] - arms["sft_continued"]["pass_rate"]
      )
  run = {"seed": cfg.seed, "sft": sft, **arms}
  if args.busy_seconds:
    run["busy_code"], run["busy_free"] = _busy_pair(s, sft_state, args.busy_seconds, work, show)
  return run


def _arm_summary(info: dict, sft: dict | None) -> dict:
  """The runner's summary with the benchmark's names: pass_rate (mean fraction of hidden tests
  passed) and the gain over the SFT start in points."""
  out = dict(info, pass_rate=info["accuracy"])
  if sft is not None:
    out["gain_points"] = 100 * (info["accuracy"] - sft["pass_rate"])
  return out


def _busy_pair(s, sft_state, seconds: float, work: pathlib.Path, show: bool) -> tuple[dict, dict]:
  """Two SAO runs from the SFT params without periodic evaluation, one scored in the sandbox,
  one by exact match (free). The free one's final params are also scored by the hidden tests
  afterwards, so that its pass rate is comparable."""
  cfg = s.cfg
  s_free = make_setup(
    dataclasses.replace(cfg, task=dataclasses.replace(cfg.task, family=FREE_FAMILY))
  )
  out = []
  for name, setup in (("busy_code", s), ("busy_free", s_free)):
    w = MetricsWriter(work / name, show_progress=show)
    state, progs, info = run_sao(setup, w, sft_state, work / name, max_seconds=seconds)
    w.close()
    if setup is s_free:
      info["exact_match_rate"] = info["accuracy"]
      info["accuracy"] = evaluate(s, progs, state.params, batch_divisor=progs.batch_divisor)[
        "accuracy"
      ]
    out.append(_arm_summary(info, None))
    print(
      f"seed {cfg.seed}: {name} {info['steps']} updates, learner busy "
      f"{info['learner_busy']:.1%}, {info['trajectories_per_s']:.1f} trajectories/s, "
      f"{info['reward_s_per_trajectory'] * 1e3:.1f} ms reward per trajectory",
      flush=True,
    )
  return out[0], out[1]


if __name__ == "__main__":
  main()
