"""Part 2 of experiments/bench_compression.py: greedy accuracy of the compressed arm and its
controls (full context, stage-1 memory) on the held-out short episodes and on 1,000-step
episodes (by recall distance), with the compressed arm's misses attributed and the paired
relative loss; each arm's per-question answers are kept so that a resumed run (or an arm
measured in another run) is paired without measuring again."""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from sao_jax.bench.compression import uncompressed_cfg
from sao_jax.bench.recall import (
  accuracy_stats,
  attribute_errors,
  error_attribution,
  graded_rewards,
  paired,
  question_facts,
)
from sao_jax.compression.arms import LONG_ARM_NAMES, LONG_ARM_OF
from sao_jax.runners import memory_lab as L

# Recall distance buckets (question step - fact step) of the 1,000-step accuracy.
GAP_EDGES = (32, 64, 128, 256, 512, 1000)


def long_accuracy(arms: dict, tasks, *, length: int, done: dict | None = None, on_arm=None) -> dict:
  """Greedy accuracy on 1,000-step episodes, overall and by recall distance.

  arms: name -> (config, programs, policy or model, params, memory: bool). The full-context control
  trained on the short episodes reads the last `length` tokens (its trained context; the
  whole 1,000-step episode is ~10^4 tokens, past its position table and this machine's
  memory for training): what a control trained at this budget can do at this length.
  Each arm records its per-question rewards (`correct`, in question order), so `done` (this
  dict from a stopped run on the same episodes) keeps its finished arms, and the paired
  comparison still covers them; `on_arm(out)` is called after each arm (to save it). The
  compressed arm also records its banks (entries, evictions) and, question by question,
  whether the fact entered its bank and was seen when asked (`errors`, `error_attribution`;
  a kept arm measured before this was recorded lacks it: drop the arm from the file and run
  `--resume --arms compressed` to measure it again with the same parameters)."""
  gaps = np.asarray([q - f for t in tasks for q, f in question_facts(t)])
  out = {"episodes": len(tasks), "questions": len(gaps), "control_context_tokens": length}
  done = done or {}
  if (done.get("episodes"), done.get("questions")) == (out["episodes"], out["questions"]):
    # Every arm it finished, also those not run here (--arms: one arm a run).
    out.update({k: done[k] for k in LONG_ARM_NAMES if "correct" in done.get(k, {})})

  def pair():  # what stages 2+3 lose against the stage-1 memory, question by question
    if "uncompressed_memory" in out and "compressed" in out:
      control = np.asarray(out["uncompressed_memory"]["correct"])
      out["vs_uncompressed"] = paired(control, np.asarray(out["compressed"]["correct"]))
      errors = out["compressed"].get("errors")
      if errors:  # the lost questions too, now that the control is here
        out["compressed"]["errors"] = attribute_errors(
          errors["per_question"], out["compressed"]["correct"], control
        )

  pair()  # also when every arm was kept
  for name, (cfg, progs, pol, params, memory) in arms.items():
    if name in out:
      continue
    t0 = time.time()
    _, trajs = L.evaluate(cfg, progs, pol, params, tasks, memory, length=length)
    r = graded_rewards(trajs)
    by_gap = {}
    for lo, hi in zip(GAP_EDGES[:-1], GAP_EDGES[1:], strict=True):
      sel = (gaps >= lo) & (gaps < hi)
      if sel.any():
        by_gap[f"{lo}-{hi}"] = {"questions": int(sel.sum()), "accuracy": float(r[sel].mean())}
    out[name] = dict(
      accuracy_stats(trajs), by_gap=by_gap, seconds=time.time() - t0, correct=r.tolist()
    )
    if name == "compressed":
      # Its banks at these lengths, and why it missed what it missed (as on short episodes).
      out[name].update(
        kept_steps_mean=float(np.mean([t.bank["entries"] for t in trajs])),
        evicted_mean=float(np.mean([t.bank["evicted"] for t in trajs])),
        episodes_with_evictions=int(sum(t.bank["evicted"] > 0 for t in trajs)),
        errors=error_attribution(cfg, trajs, tasks, None),
      )
    pair()
    if on_arm:
      on_arm(out)
  return out


def long_accuracy_of_arms(
  arms: dict,
  cfg,
  unc_params,
  evals,
  stages: dict,
  *,
  n_long: int,
  length: int,
  label: str,
  save,
  log,
) -> dict:
  """`long_accuracy` of the trained `arms` (bench_compression's: name -> (config, programs,
  policy or model, params, memory)) on the `n_long`-step episodes `evals`, into `stages` (its
  task's bytes_per_stage, whose kept `long_accuracy` it continues): the stage-1 control
  (`unc_params`, trained under `cfg`) runs with a bank as long as the episodes. `save(done)`
  writes the file after each arm (`label` of ...) and at the end (`label`); logged."""
  long_arms = {LONG_ARM_OF.get(a, a): arms[a] for a in ("compressed", "full_context") if a in arms}
  if "uncompressed_memory" in arms:
    lcfg = uncompressed_cfg(cfg, n_long)
    lprogs, lpol = L.build(lcfg, True, mode="sft")
    long_arms["uncompressed_memory"] = (lcfg, lprogs, lpol, unc_params, True)

  def saved(la):
    stages["long_accuracy"] = la
    save(f"{label} of " + ", ".join(k for k in long_arms if k in la))

  stages["long_accuracy"] = la = long_accuracy(
    long_arms, evals, length=length, done=stages.get("long_accuracy"), on_arm=saved
  )
  save(label)
  log(
    f"  {n_long}-step accuracy ({la['questions']} questions): "
    + ", ".join(
      f"{LONG_ARM_NAMES[k].format(length=length)} {la[k]['accuracy']:.3f}"
      for k in LONG_ARM_NAMES
      if k in la
    )
  )
  return la


def short_episodes(
  arms: dict,
  trained: dict,
  spec,
  train_spec,
  test,
  length,
  control_steps,
  log,
  done=None,
  prov=None,
  eval_overrides=(),
):
  """Part 2 on the held-out short episodes: each arm's greedy accuracy with its training
  record (`trained`: name -> (seconds, last metrics, origin)), the compressed arm with float
  memory (stage 3 off), its misses attributed, and its paired loss against each control.

  Each arm records its per-question rewards (`correct`, in question order), so `done` (this
  dict from an earlier run with the same settings) keeps the arms it measured: those not run
  here (`--arms`: one arm per run, merged into one file), and those run here whose training
  record is the restored snapshot's (the compressed arm's also measured under the same
  `eval_overrides`, the --eval-set it records); the paired comparisons are made from the kept
  answers."""
  done = done or {}
  kept_arms = done.get("arms", {})
  n_questions = sum(len(question_facts(t)) for t in test)
  stats, rewards = {}, {}
  for name, a in kept_arms.items():
    if name == "compressed_float_memory":
      continue
    answers = len(a.get("correct") or ()) == n_questions
    if name not in arms:  # not run here: kept as measured (paired only if it has answers)
      stats[name] = a
    elif answers and a.get("train_seconds") == trained[name][0]:
      if name != "compressed" or a.get("eval_overrides", []) == list(eval_overrides):
        stats[name] = a
    if name in stats and answers:
      rewards[name] = np.asarray(a["correct"], dtype=np.float64)
  other = [n for n in arms if n in kept_arms and n not in stats]
  if other:
    log(
      f"  the kept file holds other parameters (or another --eval-set) for {', '.join(other)}: "
      "measuring again"
    )
  mem_trajs = None
  for name, (acfg, progs, pol, params, memory) in arms.items():
    if name in stats:
      continue
    secs, metrics, origin = trained[name]
    acc, trajs = L.evaluate(acfg, progs, pol, params, test, memory, length=length)
    a = stats[name] = dict(accuracy_stats(trajs), train_seconds=secs, final_metrics=metrics)
    rewards[name] = graded_rewards(trajs)
    a["correct"] = rewards[name].tolist()
    a["measured_at"] = measured_at(prov or {})
    if memory:
      a["kept_steps_mean"] = float(np.mean([t.bank["entries"] for t in trajs]))
    if name == "compressed":
      a["eval_overrides"] = list(eval_overrides)
      # Episodes whose learner replay needs the graveyard (memory.py).
      a["episodes_with_evictions"] = int(sum(t.bank["evicted"] > 0 for t in trajs))
      mem_trajs = trajs
      log(f"  compressed: accuracy {acc:.3f} +- {a['stderr']:.3f} ({secs:.0f} s training)")
    elif name == "full_context":
      log(f"  full context: accuracy {acc:.3f} +- {a['stderr']:.3f} ({secs:.0f} s training)")
    else:
      a.update(bank_capacity=acfg.compression.capacity, steps=control_steps)
      log(
        f"  uncompressed memory (stage 1 only): accuracy {acc:.3f} ({control_steps} steps, "
        f"{secs:.0f} s training)"
      )
    if origin:
      a["params"] = origin
  task = {
    "spec": dataclasses.asdict(spec),
    "train_spec": dataclasses.asdict(train_spec),
    "chance": 0.1,  # a uniform guess of the answer digit
  }
  if mem_trajs is not None:
    # Stage 3 ablation: the same trained parameters with float memory.
    cfg, _, _, mem_params, _ = arms["compressed"]
    fcfg = dataclasses.replace(
      cfg, compression=dataclasses.replace(cfg.compression, quantize=False)
    )
    fprogs, fpol = L.build(fcfg, True)
    acc_f, ftrajs = L.evaluate(fcfg, fprogs, fpol, mem_params, test, True, length=length)
    stats["compressed_float_memory"] = accuracy_stats(ftrajs)
    log(f"  float memory: {acc_f:.3f}")
    errors = error_attribution(cfg, mem_trajs, test, rewards.get("full_context"))
    log(
      f"  compressed missed {errors['missed']['n']} (fact seen when asked: "
      f"{errors['missed']['fact_seen']})"
      + (
        f"; lost vs the control {errors['lost']['n']} (fact seen: {errors['lost']['fact_seen']})"
        if "lost" in errors
        else ""
      )
    )
    task["compressed_errors"] = errors
  elif "compressed" in stats:  # kept: so are the parts measured with its parameters
    if "compressed_float_memory" in kept_arms:
      stats["compressed_float_memory"] = kept_arms["compressed_float_memory"]
    errors = done.get("compressed_errors")
    if errors and "per_question" in errors and "compressed" in rewards:
      # Attributed again from the kept record: a control measured here is paired too.
      errors = attribute_errors(
        errors["per_question"], rewards["compressed"], rewards.get("full_context")
      )
    if errors:
      task["compressed_errors"] = errors
  task["arms"] = stats
  if "full_context" in rewards and "compressed" in rewards:
    # Paired over the same held-out questions: s.e. of the mean per-question difference.
    vs_full = paired(rewards["full_context"], rewards["compressed"])
    log(
      f"  relative loss vs full context {100 * vs_full['relative_loss']:.1f}% "
      f"+- {100 * vs_full['relative_loss_stderr_paired']:.1f}%"
    )
    task.update(
      relative_loss=vs_full["relative_loss"],
      relative_loss_stderr_paired=vs_full["relative_loss_stderr_paired"],
      questions_discordant={
        "full_right_compressed_wrong": vs_full["control_right_other_wrong"],
        "compressed_right_full_wrong": vs_full["other_right_control_wrong"],
      },
    )
  if "uncompressed_memory" in rewards and "compressed" in rewards:
    # Against the stage-1-only memory: what the temporal filter and INT8 lose.
    task["vs_uncompressed"] = paired(rewards["uncompressed_memory"], rewards["compressed"])
    log(
      "  relative loss of compressed vs the stage-1 memory "
      f"{100 * task['vs_uncompressed']['relative_loss']:.1f}%"
    )
  return task


def measured_at(prov: dict) -> dict:
  """When, at which commit and on which CPU an arm was measured (arms of one file may come
  from runs on different machines: `--arms`); `prov` is the run's provenance, read once at
  its start."""
  return {
    "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    "commit": prov.get("commit"),
    "cpu": (prov.get("machine") or {}).get("cpu"),
  }
