"""Three-stage context compression on long-horizon tasks: bytes, accuracy, peak memory.

1. Bytes per 1,000-step trajectory after each stage (experiments/configs/longhorizon.py
   LONG_TASKS). The episodes are real environment episodes played by the scripted (expert)
   policy, since no policy we can train here plays 1,000 steps; they go step by step through
   the sampler's jitted `compress` program (all three stages in one function) with the
   encoder/LSTM trained in part 2. Reported: the full context as float32 token embeddings at
   the policy width (what a full-context policy holds per layer; its KV cache is 2 x depth
   times that), then stage 1 (m vectors per step, float32), stage 2 (kept steps only),
   stage 3 (INT8 + a float32 scale per vector + an int16 step index per kept step), and on
   their own lines the graveyard that makes the learner's replay exact with eviction (the
   evicted entries, collected as the sampler does, each a stage-3 entry plus an int16
   eviction step; `sao_jax.compression.memory`) and stage 3 with it. Also:
   which facts/keys the final bank kept and which were among the `visible` entries the policy
   saw at their question (replayed with the graveyard), with eviction (the default) and with
   the first-come rule (ablation), and the LSTM's surprise per kind of step.
2. Accuracy at the same training budget: the memory policy (compressed memory + 24-token raw
   window) against the full-context control (same transformer, whole episode as context),
   the same supervised steps on the same expert episodes (teacher forcing; no RL: a policy
   that has to discover recall 32 turns back by RL alone does not learn in minutes on a
   CPU), then greedy rollouts on held-out episodes. The retention task asks every question
   >= 32 turns after its fact: its accuracy is the retention at 32 turns. The memory policy is
   also evaluated with float memory (stage 3 off) to isolate the quantiser's loss. Each
   accuracy comes with its binomial s.e., a 95 % Wilson interval and chance (0.1, a digit);
   the relative loss with the s.e. of the paired per-question difference. Each question the
   compressed arm misses is attributed (`compressed_errors`): was its fact among the
   entries the policy saw when asked (it misread its memory) or not (the filter dropped or
   evicted it); likewise for the questions it lost against the control, with their distance.
   With --uncompressed-control, a third arm: the same memory policy keeping every step's
   stage-1 vectors in float32 (no temporal filter, no INT8; its bank holds the whole
   episode), trained the same way; at 1,000 steps it reads all 1,000 steps. Against it the
   relative loss measures what stages 2 and 3 lose, with a control that trains at this
   budget (the token-level control does not learn many-fact recall here). With
   --no-token-control the token-level control is skipped (e.g. to add this arm to seeds whose
   control is already measured: the compressed arm is the same run, same seed), and so are
   the results that pair with it.
3. Peak memory of one learner update, from XLA's compiled memory analysis
   (`progs.update.lower(...).compile().memory_analysis()`: arguments + outputs + temporaries
   - aliased), for GRPO(N=8) with full context (`sao_jax.learner.make_rl_update`, 8 rows per
   graded step of one task) against SAO with compressed memory (`make_memory_update`, one
   trajectory per task), on the accuracy episodes and on the 1,000-step episodes. Plus the
   stored context bytes of the 8 vs 1 trajectories. It needs no trained parameters:
   --peak-memory-only measures it alone, --skip-peak-memory leaves it out (a later --resume
   run without the flag adds it).

The JSON is written as each part finishes ("complete": false and "done": the last part
finished, until the end), so a run stopped part-way keeps what it measured. With
--params-dir DIR each arm's trained parameters are saved there (Orbax, with checksums) and a
later run with the same settings and DIR restores them instead of training again: a multi-hour
run stopped in its evaluation resumes without retraining (the arm records where its
parameters came from and the CPU they were trained on). With --resume as well, the rerun
also keeps what the stopped run's JSON (--out) already measured, once its settings are
checked to match: a task's short episodes, its bytes and filters, each arm's 1,000-step
accuracy (saved after each arm, with its per-question answers for the paired comparison)
and its peak memory; `resumed_from` records the run it continued.
With --eval-set KEY=VALUE (compression fields only, none that changes the parameters' shapes)
the compressed arm is trained as --set says and measured (short and 1,000-step accuracy, bytes,
filters, peak memory) with the override: e.g. the trained filter at another keep-probability
threshold. With --resume a file measured under other --eval-set values keeps its controls (they
do not read the override) and the compressed arm is measured again, paired with their answers.

Run (default, ~30 min on a shared 2-core CPU; writes results/bench_compression.json):
  python experiments/bench_compression.py
Smoke run (one to two minutes, mostly compilation):
  python experiments/bench_compression.py --config experiments/configs/longhorizon.py:tiny \
      --quick --out /tmp/bench_compression_quick.json
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import platform
import time

import jax

from sao_jax.bench import compression_run as R
from sao_jax.bench.compression import attention_cost, long_bytes_part
from sao_jax.bench.compression_accuracy import long_accuracy_of_arms, short_episodes
from sao_jax.bench.compression_report import print_tables
from sao_jax.bench.peak_memory import peak_memories, peak_memory_task
from sao_jax.config import ConfigError, load_config
from sao_jax.envs.longhorizon import make_split
from sao_jax.results_file import ResultFile, ResultFileError, config_file_id, portable_path
from sao_jax.runners import memory_lab as L
from sao_jax.startup import enable_compile_cache

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _parser():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--config", default=str(ROOT / "experiments/configs/longhorizon.py"))
  p.add_argument("--quick", action="store_true", help="smoke run: few steps, short episodes")
  p.add_argument("--steps", type=int, default=0, help="training steps per arm (0: config)")
  p.add_argument(
    "--control-steps",
    type=int,
    default=0,
    help="training steps for the stage-1-only control alone (0: --steps); more than the "
    "compressed arm's gives the control the larger budget (with --params-dir a snapshot at "
    "fewer steps is trained on, not retrained)",
  )
  p.add_argument("--num-test", type=int, default=0, help="held-out episodes (0: 256, quick 8)")
  p.add_argument("--long-episodes", type=int, default=4)
  p.add_argument(
    "--accuracy-only",
    action="store_true",
    help="train and evaluate only (skip bytes per stage and peak memory)",
  )
  p.add_argument("--tasks", default="", help="comma-separated (default: all; quick: retention)")
  p.add_argument("--seed", type=int, default=0, help="model init and training order")
  p.add_argument(
    "--long-eval-episodes",
    type=int,
    default=32,
    help="1,000-step episodes played greedily by each arm (0: skip; quick 2)",
  )
  p.add_argument(
    "--no-attention-cost", action="store_true", help="skip timing the whole bank vs a window"
  )
  p.add_argument(
    "--uncompressed-control",
    action="store_true",
    help="also train and evaluate the memory policy with every step kept in float32 "
    "(stage 1 only): the control for stages 2 and 3",
  )
  p.add_argument(
    "--no-token-control",
    action="store_true",
    help="skip the token-level full-context control and what pairs with it (the compressed "
    "arm and, with --uncompressed-control, the stage-1-only arm still train)",
  )
  p.add_argument(
    "--arms",
    default="",
    help="comma-separated arms to train and measure in this run (default: every arm the "
    "other flags ask for: compressed, full_context unless --no-token-control, "
    "uncompressed_memory with --uncompressed-control); with --resume the others are kept "
    "from --out, so a seed's arms can run one at a time, in separate runs or on separate "
    "machines, into one file",
  )
  p.add_argument(
    "--set",
    action="append",
    default=[],
    metavar="KEY=VALUE",
    help="config override, as for sao-jax train (e.g. sft.optim.lr=3e-4); recorded in the JSON",
  )
  p.add_argument(
    "--eval-set",
    action="append",
    default=[],
    metavar="KEY=VALUE",
    help="compression override for measuring the compressed arm only, not for training it "
    "(e.g. compression.salience_threshold=0.1: the trained filter at a threshold chosen after "
    "training); recorded in the JSON and on the arm. With --params-dir and --resume, a file "
    "measured under other --eval-set values keeps its controls and measures the compressed "
    "arm again",
  )
  p.add_argument(
    "--peak-memory-only",
    action="store_true",
    help="only part 3, the compiled peak memory of one update (no training; minutes): with "
    "--uncompressed-control also GRPO(N=8) and SAO with the stage-1 memory",
  )
  p.add_argument(
    "--skip-peak-memory",
    action="store_true",
    help="skip part 3, the compiled peak memory (nine compiles: most of a --quick run's "
    "measuring); a later --resume run without this flag adds it to the file",
  )
  p.add_argument(
    "--params-dir",
    default="",
    help="save each arm's trained parameters here; a rerun with the same settings restores "
    "them instead of training (resumes a stopped run)",
  )
  p.add_argument(
    "--compile-cache",
    default="off",
    help="JAX's persistent compilation cache (sao_jax.startup: user, a directory, or off): "
    "runs of the same programs load them instead of compiling; training seconds then exclude "
    "what the cache saved (recorded in the JSON)",
  )
  p.add_argument("--out", default=str(ROOT / "results/bench_compression.json"))
  p.add_argument(
    "--resume",
    action="store_true",
    help="keep the parts --out already holds from a stopped run with the same settings "
    "(needs --params-dir, so that the arms are restored, not retrained): a task's short "
    "episodes, its bytes and filters, each arm's 1,000-step accuracy, its peak memory",
  )
  return p


def main(argv=None) -> dict:
  args = _parser().parse_args(argv)
  variant = "tiny" if args.quick and ":" not in args.config else "default"
  cfg_path = args.config if ":" in args.config else f"{args.config}:{variant}"
  try:
    cfg = load_config(cfg_path, overrides=args.set)
  except ConfigError as e:
    _parser().error(str(e))
  ecfg = R.eval_config(cfg_path, args.set, args.eval_set, _parser())
  cache = enable_compile_cache(args.compile_cache)
  mod = L.config_module(args.config)
  variant = cfg_path.rsplit(":", 1)[1]
  names = (
    args.tasks.split(",")
    if args.tasks
    else (["retention"] if args.quick else list(mod.TASKS[variant]))
  )
  known = {**mod.TASKS[variant], **getattr(mod, "EXTRA_TASKS", {}).get(variant, {})}
  specs = {k: known[k] for k in names}
  long_specs = dict(mod.LONG_TASKS)
  if args.quick:
    long_specs = {k: dataclasses.replace(v, n_steps=120, n_facts=3) for k, v in long_specs.items()}
  if args.peak_memory_only and args.skip_peak_memory:
    _parser().error("--peak-memory-only and --skip-peak-memory leave nothing to measure")
  if args.peak_memory_only and set(specs) - set(long_specs):
    _parser().error(
      f"--peak-memory-only measures 1,000-step episodes; no long episodes for "
      f"{sorted(set(specs) - set(long_specs))} (have {sorted(long_specs)})"
    )
  steps = args.steps or (cfg.sft.steps if not args.quick else 10)
  control_steps = args.control_steps or steps
  if args.control_steps and not args.uncompressed_control:
    _parser().error("--control-steps sets the stage-1 control's steps: add --uncompressed-control")
  long_eval = args.long_eval_episodes if not args.quick else min(args.long_eval_episodes, 2)
  num_test = args.num_test or (8 if args.quick else 256)
  log = print
  t_start = time.time()
  out = pathlib.Path(args.out)

  def save(done: str, complete: bool = False):
    """Writes what is measured so far (a long run stopped part-way keeps its finished parts):
    `complete` false until the end, `done` the last part finished."""
    result["seconds"] = time.time() - t_start
    if complete:
      rf.finish()
    else:
      rf.write(done=done)

  if args.resume and not args.params_dir:
    _parser().error("--resume keeps measurements of restored arms: add --params-dir")
  every_arm, run_arms = R.arms_to_run(args, _parser())
  # What a stopped run must share with its rerun for --resume to keep its measurements (the
  # resolved config too; --eval-set and --arms may differ: they add to the file).
  settings = {
    "config_file": config_file_id(portable_path(cfg_path)),
    "overrides": list(args.set),
    "quick": args.quick,
    "steps": steps,
    "control_steps": control_steps,
    "num_test": num_test,
    "seed": args.seed,
  }
  try:
    rf = ResultFile(
      out,
      series=R.series(names, args.set, steps, control_steps, args.quick),
      config=cfg,
      settings=settings,
      resume=args.resume,
    )
  except ResultFileError as e:
    _parser().error(f"--resume: {e}")
  result = rf.update(
    eval_overrides=list(args.eval_set),
    machine={"platform": platform.platform(), "devices": str(jax.devices())},
    arms_run=run_arms,
    compile_cache=cache,
    tasks={},
  ).doc
  kept_tasks, same_eval = R.note_resumed(rf, args.eval_set)
  for name, spec in specs.items():
    log(f"== {name}: {spec}")
    train = make_split(mod.TRAIN_TASKS[variant][name], "train", 4000, 0, num_test=num_test)
    test = make_split(spec, "test", num_test, 0)
    length = L.full_len(train + test)
    if args.peak_memory_only:
      result["tasks"][name] = peak_memory_task(
        cfg, spec, long_specs[name], test, length, args.uncompressed_control, log
      )
      save(f"{name}: peak memory")
      continue
    mem_progs = L.build(cfg, True, mode="sft")
    eval_progs = mem_progs if ecfg == cfg else L.build(ecfg, True, mode="sft")
    if ecfg != cfg:
      R.same_shapes(mem_progs[0], eval_progs[0], args.eval_set, _parser())
    train_kw = dict(steps=steps, length=length, seed=args.seed, log=log)
    # What determines an arm's trained parameters (checked before --params-dir reuses them).
    key = dict(
      task=name,
      train_spec=dataclasses.asdict(mod.TRAIN_TASKS[variant][name]),
      config=portable_path(cfg_path),
      overrides=list(args.set),
      num_test=num_test,
      **{k: v for k, v in train_kw.items() if k != "log"},
    )
    arms, trained, unc_params = R.train_arms(
      cfg,
      ecfg,
      mem_progs,
      eval_progs,
      run_arms,
      no_token_control=args.no_token_control,
      unc_steps=max(spec.n_steps, mod.TRAIN_TASKS[variant][name].n_steps),
      params_dir=args.params_dir,
      key=key,
      train=train,
      train_kw=train_kw,
      control_steps=control_steps,
      prov=result["provenance"],
    )
    mem_params = arms["compressed"][3] if "compressed" in arms else None
    kept = kept_tasks.get(name, {})
    task = short_episodes(
      arms,
      trained,
      spec,
      mod.TRAIN_TASKS[variant][name],
      test,
      length,
      control_steps,
      log,
      done=kept,
      prov=result["provenance"],
      eval_overrides=args.eval_set,
    )
    # What was measured with the compressed arm's parameters (bytes, filters) or none (peak
    # memory) stays with the file when this run did not measure it again.
    redone = R.keep_measured(task, kept, arms, same_eval)
    result["tasks"][name] = task
    if kept and not redone:
      log(f"  short episodes: kept from {out} (measured before the rerun)")
    save(f"{name}: short episodes" + (f" of {', '.join(sorted(redone))}" if redone else ""))
    if args.accuracy_only or name not in long_specs:
      continue
    task = result["tasks"][name]
    n_long = long_specs[name].n_steps
    long_tasks = make_split(long_specs[name], "test", args.long_episodes, 1)
    stages, measured = long_bytes_part(
      task,
      ecfg,
      eval_progs,
      mem_params,
      long_specs[name],
      long_tasks,
      episodes=args.long_episodes,
      out=out,
      log=log,
    )
    if measured:
      task.update(long_spec=dataclasses.asdict(long_specs[name]), bytes_per_stage=stages)
      save(f"{name}: bytes per stage and filters")
    if long_eval:
      evals = make_split(long_specs[name], "test", long_eval, 2)
      task["bytes_per_stage"] = stages  # holds the long accuracy even without bytes (--arms)
      long_accuracy_of_arms(
        arms,
        cfg,
        unc_params,
        evals,
        stages,
        n_long=n_long,
        length=length,
        label=f"{name}: {n_long}-step accuracy",
        save=save,
        log=log,
      )
    if "peak_memory" not in task and not args.skip_peak_memory:
      task["peak_memory"] = peak_memories(
        ecfg, test, long_tasks, length, args.uncompressed_control, log
      )
    if not (args.no_attention_cost or args.quick) and "attention_cost" not in result:
      result["attention_cost"] = attention_cost(cfg, train, test, length=length)
      log(f"  whole bank vs last 16 entries: {result['attention_cost']['full_bank_over_window']}")
  missing = R.missing_arms(result, every_arm, args.peak_memory_only)
  if missing:  # --arms: the other arms' runs complete the file
    save("all but " + "; ".join(f"{n}: {', '.join(m)}" for n, m in missing.items()))
  else:
    save("all", complete=True)
  print_tables(result)
  print(f"wrote {out} ({result['seconds']:.0f} s)")
  return result


if __name__ == "__main__":
  main()
