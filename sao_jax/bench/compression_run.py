"""experiments/bench_compression.py's run bookkeeping: the series a run belongs to, the
compressed arm's evaluation config (--eval-set) and its guards, its arms trained or restored
(`train_arms`), and what a resumed run keeps of the stopped run's measurements
(`keep_measured`)."""

from __future__ import annotations

import jax

from sao_jax.bench.arm_snapshots import train_arm
from sao_jax.bench.compression import uncompressed_cfg
from sao_jax.compression.arms import LONG_ARM_OF
from sao_jax.config import Config, ConfigError, load_config
from sao_jax.runners import memory_lab as L


def series(tasks, overrides, steps: int, control_steps: int, quick: bool) -> str:
  """The series a run belongs to: its tasks, training budget and --set overrides (the seeds of
  one series differ in nothing else; --eval-set and --arms add to a file, not a series)."""
  parts = ["bench_compression", "+".join(tasks), f"steps{steps}"]
  parts += [f"control{control_steps}"] if control_steps != steps else []
  parts += [",".join(overrides)] if overrides else []
  return "/".join(parts + (["quick"] if quick else []))


def eval_config(cfg_path: str, overrides, eval_overrides, parser) -> Config:
  """The compressed arm's evaluation config: `overrides` (--set) then `eval_overrides`
  (--eval-set), which may only set compression fields (what the sampler's filter and bank do;
  the training is --set's)."""
  bad = [o for o in eval_overrides if not o.split("=", 1)[0].strip().startswith("compression.")]
  if bad:
    parser.error(
      f"--eval-set {bad[0]!r}: only compression.* fields are evaluation settings (the arm is "
      "trained as --set says)"
    )
  try:
    return load_config(cfg_path, overrides=[*overrides, *eval_overrides])
  except ConfigError as e:
    parser.error(f"--eval-set: {e}")


def same_shapes(progs, eval_progs, eval_overrides, parser) -> None:
  """Refuses an --eval-set under which the trained parameters would not fit the policy."""

  def shapes(p):
    return jax.tree.map(lambda x: (x.shape, x.dtype), jax.eval_shape(p.init, jax.random.key(0)))

  try:
    same = shapes(progs).params == shapes(eval_progs).params
  except (TypeError, ValueError):  # other tree structure
    same = False
  if not same:
    parser.error(
      f"--eval-set {' '.join(eval_overrides)} changes the policy's parameters (their shapes): "
      "it is a training setting, pass it with --set"
    )


def train_arms(
  cfg: Config,
  ecfg: Config,
  mem_progs,
  eval_progs,
  run_arms,
  *,
  no_token_control: bool,
  unc_steps: int,
  params_dir: str,
  key: dict,
  train,
  train_kw: dict,
  control_steps: int,
  prov: dict,
):
  """Each arm's parameters, trained or restored with `params_dir` (`train_arm`): (arms,
  trained, the stage-1 control's params or None), arms: name -> (config, programs, policy or
  model, params, memory) with the compressed arm measured under `ecfg` (--eval-set) and
  `eval_progs`, trained: name -> its training record (seconds, last metrics, origin). Only
  the arms in `run_arms`; the stage-1 control with a bank of `unc_steps` steps, trained for
  `control_steps`."""
  arms, trained = {}, {}
  for memory in (True,) if no_token_control else (True, False):
    arm_name = "compressed" if memory else "full_context"
    if arm_name not in run_arms:
      continue
    progs, pol = mem_progs if memory else L.build(cfg, False, full_len=train_kw["length"])
    params, *record = train_arm(
      params_dir, dict(key, arm=arm_name), cfg, progs, memory, train, prov=prov, **train_kw
    )
    if memory:  # trained under cfg, measured under --eval-set
      cfg_m, progs, pol = ecfg, *eval_progs
    else:
      cfg_m = cfg
    arms[arm_name], trained[arm_name] = (cfg_m, progs, pol, params, memory), record
  unc_params = None
  if "uncompressed_memory" in run_arms:
    ucfg = uncompressed_cfg(cfg, unc_steps)
    uprogs, upol = L.build(ucfg, True, mode="sft")
    unc_params, *record = train_arm(
      params_dir,
      dict(key, arm="uncompressed_memory", steps=control_steps),
      ucfg,
      uprogs,
      True,
      train,
      prov=prov,
      **dict(train_kw, steps=control_steps),
    )
    arms["uncompressed_memory"] = (ucfg, uprogs, upol, unc_params, True)
    trained["uncompressed_memory"] = record
  return arms, trained, unc_params


def keep_measured(task: dict, kept: dict, arms, same_eval: bool) -> set:
  """Adds to a task's new short-episode results (`task`) what the stopped run's file holds
  of it (`kept`) and this run did not measure again: its long spec and peak memory (only if
  measured under the same --eval-set: `same_eval`), its bytes and filters (measured with the
  compressed arm's parameters) and the 1,000-step accuracy of the arms not measured again.
  Returns the arms measured again here (trained anew, or other parameters): what the file
  holds of them on the long episodes is stale, and dropped."""
  redone = {a for a in arms if task["arms"].get(a) is not kept.get("arms", {}).get(a)}
  task.update({k: kept[k] for k in ("long_spec", "peak_memory") if k in kept})
  if not same_eval:
    task.pop("peak_memory", None)
  if "bytes_per_stage" in kept:
    stages = dict(kept["bytes_per_stage"])
    if "long_accuracy" in stages:
      stale = {LONG_ARM_OF.get(a, a) for a in redone}
      stale |= {"vs_uncompressed"} if "uncompressed_memory" in stale else set()
      stages["long_accuracy"] = {k: v for k, v in stages["long_accuracy"].items() if k not in stale}
    if "compressed" in redone:  # its bytes and filters are measured again; other arms'
      stages = {k: v for k, v in stages.items() if k == "long_accuracy"}  # accuracy stays
    if stages:
      task["bytes_per_stage"] = stages
  return redone


def arms_to_run(args, parser) -> tuple[list[str], list[str]]:
  """(every arm the flags ask for, the arms this run trains and measures: --arms, default
  all); an --arms outside the first is a usage error."""
  every_arm = ["compressed"]
  every_arm += [] if args.no_token_control else ["full_context"]
  every_arm += ["uncompressed_memory"] if args.uncompressed_control else []
  run_arms = args.arms.split(",") if args.arms else every_arm
  if not run_arms or set(run_arms) - set(every_arm):
    parser.error(
      f"--arms {args.arms!r}: choose from {','.join(every_arm)} (the arms these flags ask for)"
    )
  return every_arm, run_arms


def note_resumed(rf, eval_overrides) -> tuple[dict, bool]:
  """For a run that resumes a stopped run's file (`rf`, a `ResultFile`): records in its
  `resumed_from` the stopped run's seconds, arms and --eval-set; returns (the tasks it
  measured, whether it evaluated under the same --eval-set as this run: parts measured with
  the compressed arm's evaluation config, the peak memory, are kept only then)."""
  result = rf.doc
  if "resumed_from" in result:
    result["resumed_from"].update(
      {k: rf.kept.get(k) for k in ("seconds", "arms_run")},
      eval_overrides=rf.kept.get("eval_overrides", []),
    )
  same_eval = (result.get("resumed_from") or {}).get("eval_overrides", []) == eval_overrides
  return rf.kept.get("tasks") or {}, same_eval


def missing_arms(result: dict, every_arm, peak_memory_only: bool) -> dict:
  """Task -> the arms of `every_arm` the file does not hold yet (--arms: the other arms' runs
  complete it); empty when it is complete."""
  missing = {
    n: [a for a in every_arm if a not in t.get("arms", {})]
    for n, t in result["tasks"].items()
    if not peak_memory_only
  }
  return {n: m for n, m in missing.items() if m}
