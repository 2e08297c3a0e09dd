"""Recall on the long-horizon tasks: which fact each question asks about, which bank entries
the memory policy held and saw when it was asked, why it missed what it missed, and the
accuracy statistics (binomial s.e., Wilson interval, paired relative loss) of a set of greedy
rollouts. Pure functions of episodes and rollouts: no programs, no training."""

from __future__ import annotations

import numpy as np

from sao_jax.config import Config
from sao_jax.envs.longhorizon import SEP, graded_steps
from sao_jax.stats import wilson


def memory_log(kept_steps, gone: dict, n_steps: int) -> list[tuple[int, int]]:
  """Every entry a bank held, as (its step, the first step it was no longer seen at), sorted:
  the kept ones (`kept_steps`) to the end, the evicted ones (`gone`, a trajectory's graveyard
  arrays: `gone_step_g` evicted at `gone_at_g`) to the step after their eviction (memory.py)."""
  evicted = zip(gone["gone_step_g"], gone["gone_at_g"], strict=True)
  return sorted(
    [(int(k), n_steps + 1) for k in kept_steps] + [(int(k), int(at) + 1) for k, at in evicted]
  )


def seen_at(log: list[tuple[int, int]], q: int, visible: int) -> list[int]:
  """Steps of the entries the policy saw when it acted at step q: the last `visible` of
  those the bank held then."""
  return [k for k, until in log if k < q < until][-visible:]


def question_facts(task) -> list[tuple[int, int]]:
  """(question step, step of the fact it asks about) of each graded step, in step order:
  "Ann's pin?" <- "Ann's pin: 7", "door 2?" <- "key 2 ..."."""
  obs = task.prompt.split(SEP)
  out = []
  for q in sorted(graded_steps(task)):
    key = obs[q][:-1] + ":" if obs[q].endswith("pin?") else "key " + obs[q].split()[1][:-1]
    f = next(k for k, o in enumerate(obs) if o.startswith(key + " ") or o.startswith(key + ":"))
    out.append((q, f))
  return out


def error_attribution(cfg: Config, trajs, tasks, control_rewards: np.ndarray | None) -> dict:
  """Why the compressed arm missed the questions it missed, on its own greedy rollouts
  (`trajs` of `tasks`, their graded steps in order; `control_rewards` the control's on the
  same questions, or None): was the fact among the entries the policy saw when asked (then
  the policy misread its memory) or not (the filter dropped or evicted it first)? For every
  miss, and for the `lost` ones (the control right); with each lost question's distance.
  Keeps, question by question, whether the fact was seen and its distance (`per_question`),
  so that a control measured in a later run (`--arms`) is paired without the rollouts."""
  seen, kept, gaps = [], [], []
  for traj, task in zip(trajs, tasks, strict=True):
    b = traj.bank
    log = memory_log(b["step_c"][: b["entries"]], b, len(traj.rewards))
    qf = question_facts(task)
    if len(qf) != int(traj.graded.sum()):
      raise RuntimeError(f"{task.task_id}: {len(qf)} questions, {traj.graded.sum()} graded")
    ever = {k for k, _ in log}
    for q, f in qf:
      seen.append(f in seen_at(log, q, cfg.compression.visible))
      kept.append(f in ever)
      gaps.append(q - f)
  per_question = {
    "fact_seen": [int(x) for x in seen],
    "fact_kept": [int(x) for x in kept],
    "gap": [int(g) for g in gaps],
  }
  return attribute_errors(per_question, graded_rewards(trajs), control_rewards)


def attribute_errors(
  per_question: dict, rewards: np.ndarray, control_rewards: np.ndarray | None
) -> dict:
  """`error_attribution`'s counts from its per-question record and the arms' rewards:
  of each set of questions, how many had their fact among the entries seen when asked
  (`fact_seen`) and, where recorded, how many had it enter the bank at all (`fact_kept`: kept
  but not seen = evicted, or out of the visible entries, before the question)."""
  seen = np.asarray(per_question["fact_seen"], dtype=bool)
  kept = per_question.get("fact_kept")  # records before it was kept lack it
  kept = None if kept is None else np.asarray(kept, dtype=bool)
  gaps = np.asarray(per_question["gap"])
  right = np.asarray(rewards) > 0.5

  def count(sel):
    c = {"n": int(sel.sum()), "fact_seen": int((sel & seen).sum())}
    if kept is not None:
      c["fact_kept"] = int((sel & kept).sum())
    return c

  out = {"questions": len(seen), "fact_seen_frac": float(seen.mean()), "missed": count(~right)}
  if control_rewards is not None:
    lost = ~right & (np.asarray(control_rewards) > 0.5)
    out["lost"] = dict(count(lost), gaps=sorted(int(g) for g in gaps[lost]))
  out["per_question"] = per_question
  return out


def paired(control: np.ndarray, other: np.ndarray) -> dict:
  """Relative loss (control - other) / control over the same questions, the s.e. of the
  paired per-question difference over the control's accuracy, and the discordant counts."""
  acc = float(control.mean())
  diff = control - other
  se = float(diff.std(ddof=1) / np.sqrt(len(diff))) if len(diff) > 1 else float("nan")
  return {
    "relative_loss": (acc - float(other.mean())) / max(acc, 1e-9),
    "relative_loss_stderr_paired": se / max(acc, 1e-9),
    "control_right_other_wrong": int(np.sum(diff > 0)),
    "other_right_control_wrong": int(np.sum(diff < 0)),
  }


def graded_rewards(trajs) -> np.ndarray:
  return np.concatenate([t.rewards[t.graded] for t in trajs]).astype(np.float64)


def accuracy_stats(trajs) -> dict:
  """Accuracy over graded questions with its binomial standard error and a 95 % Wilson
  interval (the s.e. is 0 at 0 or 1; the interval is not)."""
  r = graded_rewards(trajs)
  n, p = len(r), float(r.mean())
  return {
    "accuracy": p,
    "questions": n,
    "stderr": float(np.sqrt(p * (1 - p) / n)),
    "wilson95": list(wilson(p, n, z=1.96)),
  }
