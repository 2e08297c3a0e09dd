"""SFT -> GRPO(N=8) on arithmetic word problems, against the control that matters: simply
continuing SFT for the same training wall-clock.

  python experiments/sft_grpo_arith.py                      # 3 seeds, ~30 min on 2 CPU cores
  python experiments/sft_grpo_arith.py --variant tiny --seeds 2   # seconds, a smoke test
  python experiments/sft_grpo_arith.py --set rl.max_seconds=300 --out results/arith_300s

Each seed (`--seeds N`: seeds 0..N-1 of the model, SFT data order and RL sampling; the tasks
are the same) trains its own SFT checkpoint, then GRPO from it and the control from it. Each
figure is reported as mean ± standard error over seeds, with a 95 % t-interval in the JSON
(`sao_jax.stats.summarize`). Writes OUT/results.json (per-seed runs, the summary over seeds,
command, commit and machine), OUT/curves.png and OUT/seed<k>/{sft,grpo,sft_continued}/
metrics.jsonl; prints a table. Held-out accuracy is greedy exact-match on the first
`eval.num_problems` test problems, disjoint from training.

By default (`--setting default`) the SFT start is half-trained (300 steps), where continuing
SFT on perfect demonstrations is hard to beat. Two settings test where RL should earn its
keep (times measured on a 2-core CPU, 3 seeds; results/sft_grpo_arith_plateau/ and
results/sft_grpo_arith_nodemos/):

  # SFT trained to (nearly) its plateau first (25 min)
  python experiments/sft_grpo_arith.py --setting plateau --set sft.steps=1500 \
      --set rl.max_seconds=60
  # no demonstrations of the hard problems (15 min)
  python experiments/sft_grpo_arith.py --setting no-demos --set rl.max_seconds=90

`--setting plateau` evaluates SFT every `--sft-eval-every` K steps (default sft.steps // 12)
and records its curve and its plateau measure: the last-third gain, i.e. the rise in points
of the least-squares line through the last third of SFT's evaluations over their step span.
SFT counts as plateaued when that gain averages below 3 points over seeds and its 95 %
t-interval over seeds contains 0 (with one seed: undefined). GRPO and the control then start
from that checkpoint as above. If it says SFT is still rising, give it a larger sft.steps
(600 steps rose 15 points over their last third; 1500 steps: ~25 min).

`--setting no-demos` trains SFT on easy problems only (1-2 operations: the demonstrations
that exist), GRPO on the hard ones (3-4 operations) where only the reward exists, and the
control continues SFT on the easy demonstrations for GRPO's training seconds. Every arm is
evaluated on the hard test split (the RL tasks'), and also on the easy one (did RL on hard
problems cost anything on easy ones?). What the setting sets, before --set / --sft-set /
--rl-set (later overrides win):
  --set   model.max_len=104 rl.max_new_tokens=40  (4-step solutions are 35 tokens with EOS,
          hard prompts pad to 64: one model and one decode length for both phases)
  --sft-set task.n_ops_mix=(1,2) task.num_test=100 eval.num_problems=100  (a one-operation
          problem is one of 126 sums and differences; the train split excludes every test
          problem, so a 250-problem one-operation test split would leave none to train on)
  --rl-set  task.n_ops_mix=(3,4)
`--sft-set` / `--rl-set` KEY=VALUE override the SFT phase's (SFT and control) and the RL
phase's config; they may not touch model, tokenizer, mesh or seed (one set of weights). A
tuple is written in Python syntax and quoted for the shell: --rl-set 'task.n_ops_mix=(4,)'.
The SFT phases train on (and pad prompts to) the easy setup, GRPO on the hard one; each
setup's held-out evaluation runs programs compiled for that setup.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import shutil
import time

from sao_jax import config as config_lib
from sao_jax.bench.arith_report import plateau_gain, plateau_summary, plot, print_table, summary
from sao_jax.learner import make_sft_update
from sao_jax.metrics import MetricsWriter, peak_memory_mb
from sao_jax.results_file import ResultFile
from sao_jax.runners.common import eval_fn, programs_for
from sao_jax.runners.grpo import run_grpo
from sao_jax.runners.sft import run_sft
from sao_jax.setup import Setup, make_setup

HERE = pathlib.Path(__file__).resolve().parent
SETTINGS = ("default", "plateau", "no-demos")
OUT = {
  "default": "results/sft_grpo_arith",
  "plateau": "results/sft_grpo_arith_plateau",
  "no-demos": "results/sft_grpo_arith_nodemos",
}
NODEMOS_SET = ("model.max_len=104", "rl.max_new_tokens=40")
NODEMOS_SFT_SET = ("task.n_ops_mix=(1,2)", "task.num_test=100", "eval.num_problems=100")
NODEMOS_RL_SET = ("task.n_ops_mix=(3,4)",)
SHARED = ("model", "tokenizer", "mesh", "seed")  # one set of weights across the phases
PLATEAU_EVALS = 12  # default SFT evaluations (every sft.steps // 12 steps, plus step 0)


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--config", default=str(HERE / "configs" / "arith_grpo.py"))
  p.add_argument("--variant", default="default")
  p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
  p.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 (default 3)")
  p.add_argument("--setting", choices=SETTINGS, default="default")
  p.add_argument(
    "--out", default=None, help="by --setting: " + ", ".join(f"{k} {v}" for k, v in OUT.items())
  )
  p.add_argument(
    "--eval-every",
    type=float,
    default=None,
    help="held-out eval every N training seconds (default: rl.max_seconds / 8)",
  )
  p.add_argument(
    "--sft-eval-every",
    type=int,
    default=None,
    metavar="K",
    help=f"plateau: held-out eval every K SFT steps (default sft.steps // {PLATEAU_EVALS})",
  )
  p.add_argument(
    "--sft-set", action="append", default=[], metavar="KEY=VALUE", help="no-demos: SFT phases"
  )
  p.add_argument("--rl-set", action="append", default=[], metavar="KEY=VALUE", help="no-demos: RL")
  p.add_argument("--no-progress", action="store_true")
  args = p.parse_args(argv)
  if args.seeds < 1:
    raise SystemExit("--seeds must be >= 1")
  nodemos = args.setting == "no-demos"
  if (args.sft_set or args.rl_set) and not nodemos:
    raise SystemExit("--sft-set / --rl-set are for --setting no-demos")
  if args.sft_eval_every is not None and args.setting != "plateau":
    raise SystemExit("--sft-eval-every is for --setting plateau")
  for pair in args.sft_set + args.rl_set:
    if pair.partition("=")[0].strip().split(".")[0] in SHARED:
      raise SystemExit(
        f"--sft-set/--rl-set {pair!r}: {', '.join(SHARED)} are shared by both phases (use --set)"
      )

  try:
    cfg = config_lib.load_config(
      args.config, args.variant, (list(NODEMOS_SET) if nodemos else []) + args.set
    )
    sft_set = list(NODEMOS_SFT_SET) + args.sft_set if nodemos else []
    rl_set = list(NODEMOS_RL_SET) + args.rl_set if nodemos else []
    cfg_sft = config_lib.apply_overrides(cfg, sft_set)
    cfg_rl = config_lib.apply_overrides(cfg, rl_set)
    # fail on a bad task or length before any training
    s_sft0 = make_setup(cfg_sft)
    s_rl0 = make_setup(cfg_rl) if nodemos else s_sft0
  except config_lib.ConfigError as err:
    raise SystemExit(f"config: {err}") from None
  if not cfg_sft.sft.steps or not (cfg_rl.rl.max_seconds or cfg_rl.rl.steps):
    raise SystemExit("the experiment needs sft.steps > 0 and an RL budget")
  sft_every = 0
  if args.setting == "plateau":
    sft_every = args.sft_eval_every or max(1, cfg.sft.steps // PLATEAU_EVALS)
    if sft_every < 1 or cfg.sft.steps // sft_every < 3:
      raise SystemExit(
        f"--sft-eval-every {sft_every} gives fewer than 4 SFT evaluations over "
        f"sft.steps={cfg.sft.steps}: too few for a last-third trend"
      )
  # no-demos: each setup's held-out eval with programs compiled for it (its prompt length)
  hard = easy = None
  if nodemos:
    hard, easy = _evaluator(s_rl0), _evaluator(s_sft0)

  out = pathlib.Path(args.out or OUT[args.setting])
  if out.exists():
    shutil.rmtree(out)
  out.mkdir(parents=True)
  (out / "config.json").write_text(config_lib.to_json(cfg))
  rf = ResultFile(out / "results.json", series=f"sft_grpo_arith/{args.setting}", config=cfg)
  t_start = time.time()
  eval_every = args.eval_every
  if eval_every is None:
    eval_every = (cfg_rl.rl.max_seconds or 60.0) / 8
  runs = []
  for seed in range(args.seeds):
    s_sft = make_setup(dataclasses.replace(cfg_sft, seed=seed))
    s_rl = s_sft if not nodemos else make_setup(dataclasses.replace(cfg_rl, seed=seed))
    runs.append(
      _one_seed(
        s_sft,
        s_rl,
        out / f"seed{seed}",
        eval_every,
        args,
        held_out=hard,
        easy=easy,
        sft_eval_every_steps=sft_every,
      )
    )
  results = {
    "setting": args.setting,
    "seeds": [r["seed"] for r in runs],
    "num_test_problems": runs[0]["sft"]["num_problems"],
    "runs": runs,
    "summary": summary(runs),
    "wall_s": time.time() - t_start,
    "peak_memory_mb": peak_memory_mb(),
  }
  if args.setting == "plateau":
    results["plateau"] = {"sft_eval_every_steps": sft_every, **plateau_summary(runs)}
  if nodemos:
    results["no_demos"] = {
      "sft_set": sft_set,
      "rl_set": rl_set,
      "sft_tasks": config_lib.to_dict(cfg_sft.task),
      "rl_tasks": config_lib.to_dict(cfg_rl.task),
      "sft_config": config_lib.to_dict(cfg_sft),
      "rl_config": config_lib.to_dict(cfg_rl),
      "hard_test_problems": runs[0]["sft"]["num_problems"],
      "easy_test_problems": runs[0]["sft"]["easy_num_problems"],
      "trained_on": {
        "sft": "demonstrations of the SFT tasks (easy)",
        "grpo": "reward on the RL tasks (hard), from the SFT checkpoint",
        "sft_continued": "demonstrations of the SFT tasks (easy), from the SFT checkpoint",
      },
      "accuracy": "held-out on the RL tasks' test split (hard); easy_*: the SFT tasks' one",
    }
  rf.finish(results)
  results = rf.doc
  print_table(results)
  plot(results, out / "curves.png")
  print(f"results: {out}/results.json, {out}/curves.png")
  return results


def _evaluator(s: Setup):
  """params -> held-out metrics on `s`'s test split, with a greedy program for `s`'s shapes."""
  return eval_fn(s, programs_for(s, s.cfg.sft.optim, make_sft_update))


def _one_seed(
  s_sft: Setup,
  s_rl: Setup,
  work: pathlib.Path,
  eval_every: float,
  args,
  *,
  held_out=None,
  easy=None,
  sft_eval_every_steps: int = 0,
) -> dict:
  """SFT on `s_sft`, then GRPO on `s_rl` and the continued-SFT control on `s_sft`, both from
  the same SFT checkpoint. `held_out` (default: each setup's own test split) evaluates the
  SFT phases where GRPO's setup is another one; `easy(params)` adds easy_* metrics."""
  seed = s_sft.cfg.seed

  def writer(name):
    return MetricsWriter(work / name, show_progress=not args.no_progress)

  def done(name, state, info):
    print(
      f"seed {seed}: {name} {info['steps']} steps, {info['seconds']:.0f} s, held-out "
      f"accuracy {info['accuracy']:.3f}",
      flush=True,
    )
    if easy is not None:
      info.update({f"easy_{k}": v for k, v in easy(state.params).items()})

  w = writer("sft")
  sft_state, _, sft = run_sft(
    s_sft, w, None, work / "sft", eval_every_steps=sft_eval_every_steps, held_out=held_out
  )
  w.close()
  done("SFT", sft_state, sft)
  if sft_eval_every_steps:
    sft["plateau"] = plateau_gain(sft["eval_curve"], sft["num_problems"])

  w = writer("grpo")
  grpo_state, _, grpo = run_grpo(s_rl, w, sft_state, work / "grpo", eval_every=eval_every)
  w.close()
  done("GRPO", grpo_state, grpo)

  # Control: the same training seconds spent on more SFT (optimizer state carried over).
  w = writer("sft_continued")
  ctrl_state, _, ctrl = run_sft(
    s_sft,
    w,
    sft_state,
    work / "sft_continued",
    steps=0,
    max_seconds=grpo["seconds"],
    tag="sft_continued",
    eval_every=eval_every,
    keep_opt_state=True,
    held_out=held_out,
  )
  w.close()
  done("SFT continued", ctrl_state, ctrl)
  for prefix in ("", "easy_") if easy is not None else ("",):
    acc = prefix + "accuracy"
    for arm in (grpo, ctrl):
      arm[prefix + "gain_points"] = 100 * (arm[acc] - sft[acc])
    grpo[prefix + "minus_control_points"] = 100 * (grpo[acc] - ctrl[acc])
  return {"seed": seed, "sft": sft, "grpo": grpo, "sft_continued": ctrl}


if __name__ == "__main__":
  main()
