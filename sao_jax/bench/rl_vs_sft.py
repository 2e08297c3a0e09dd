"""The two settings of experiments/rl_vs_sft.py (RL against continued SFT), as overrides of a
config, shared by the comparison and the sweeps that tune its arms
(experiments/sweeps/rl_vs_sft_tuning.py), so both train exactly the same setting:

  clean   the config as it is: perfect, in-distribution demonstrations (the code family's
          comparison, and the control the other two settings depart from).
  flawed  demonstrations from a teacher who misreads the words of `misreads` the same way
          every time (task.options.teacher_misreads: a systematic error; arithmetic reads
          subtraction verbs as additions, code misreads a stage); rewards and the test split
          are true.
  ood     everything trains on 1-2 operations with operands up to 9, with 100 test problems
          (50 of each: 1-operation problems number only 126, and a train split must be
          left); the out-of-distribution test splits, each scored on all it holds: 3
          operations (`ops3`, 500), and operands up to 20 with a number above 9
          (`operands20`: ~80 % of 500, none of which can be a train problem); model.max_len
          holds the longest of them.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from sao_jax.config import Config, apply_overrides
from sao_jax.setup import load_config, make_setup

SETTINGS = ("clean", "flawed", "ood")
OOD_TRAIN = ["task.n_ops_mix=(1, 2)", "task.num_test=100", "eval.num_problems=100"]
_SPLIT = ["task.num_test=500"]  # (then eval.num_problems: all the split keeps)


def ood_splits(base: Config) -> dict[str, list[str]]:
  """The out-of-distribution test splits of the ood setting: name -> overrides."""
  return {
    "ops3": ["task.n_ops_mix=(3,)", *_SPLIT],
    "operands20": [
      "task.max_operand=20",
      f"task.options.test_operand_above={base.task.max_operand}",
      *_SPLIT,
    ],
  }


def setting_overrides(
  setting: str, misreads: list[str], config: str, variant: str, extra: list[str] = ()
) -> tuple[list[str], Config]:
  """The setting's overrides (then `extra`) of `config:variant`, and the config they make."""
  if setting not in SETTINGS:
    raise ValueError(f"unknown setting {setting!r}; known: {', '.join(SETTINGS)}")
  if setting == "clean":
    return list(extra), load_config(config, variant, list(extra))
  if setting == "flawed":
    sets = [f"task.options.teacher_misreads={tuple(misreads)!r}", *extra]
    return sets, load_config(config, variant, sets)
  sets = [*OOD_TRAIN, *extra]
  base = load_config(config, variant, sets)  # (a bad config fails here, at once)
  sets.append(f"model.max_len={ood_max_len(base)}")
  return sets, load_config(config, variant, sets)


def splits_for(setting: str, base: Config) -> dict[str, list[str]]:
  """Test splits every arm is scored on at the end: name -> overrides of the trained config
  (each decodes up to its own longest solution)."""
  out = {"test": []}
  if setting == "ood":
    for name, sets in ood_splits(base).items():
      s = make_setup(_roomy(apply_overrides(base, sets)))
      new_tokens = max(s.target_len, base.rl.max_new_tokens)
      out[name] = [*sets, f"eval.num_problems={len(s.test)}", f"rl.max_new_tokens={new_tokens}"]
  return out


def ood_max_len(base: Config) -> int:
  """The context every OOD split's prompt + solution fits in (a multiple of 8). Learned
  positions past the training lengths stay untrained: part of what out of distribution
  means for this model."""
  need = 0
  for sets in [[], *ood_splits(base).values()]:
    s = make_setup(_roomy(apply_overrides(base, sets)))
    need = max(need, s.prompt_len + max(s.target_len, base.rl.max_new_tokens))
  return -(-need // 8) * 8


def _roomy(cfg: Config) -> Config:
  """Room for anything: only to measure a split's lengths."""
  return dataclasses.replace(
    cfg,
    model=dataclasses.replace(cfg.model, max_len=4096),
    rl=dataclasses.replace(cfg.rl, max_new_tokens=1024),
  )


def training_samples(rows: list[dict], cfg: Config, phase: str) -> tuple[np.ndarray, np.ndarray]:
  """(steps, the training samples consumed up to each) of one arm's metric rows of `phase`:
  demonstrations for "sft" (sft.batch_size an update), trajectories for "rl": a learner that
  samples through sampler processes (SAO) writes its running count of consumed trajectories
  in each row (`trajectories`), taken as it is; synchronous GRPO in the learner trains
  prompts_per_step x group_size an update. Exact when every update was logged
  (log_every=1); otherwise a logged row stands for the updates since the one before it."""
  steps, cum, total, last = [], [], 0.0, 0
  for r in sorted((r for r in rows if r.get("phase") == phase), key=lambda r: r["step"]):
    if r["step"] <= last:
      continue
    if phase == "rl" and "trajectories" in r:
      total = float(r["trajectories"])
    else:
      per = cfg.sft.batch_size if phase == "sft" else cfg.rl.prompts_per_step * cfg.rl.group_size
      total += float(per) * (r["step"] - last)
    last = r["step"]
    steps.append(last)
    cum.append(total)
  return np.asarray(steps, np.int64), np.asarray(cum, np.float64)


def samples_at(steps: np.ndarray, cum: np.ndarray, step: float) -> float:
  """Training samples consumed after `step` updates: 0 at step 0, linear between logged rows,
  and past the last logged row at the run's mean samples per update (the updates after it)."""
  if len(steps) and step > steps[-1]:
    return float(cum[-1] + cum[-1] / steps[-1] * (step - steps[-1]))
  return float(np.interp(step, np.r_[0, steps], np.r_[0.0, cum]))


def accuracy_at(xs, accs, x: float) -> float | None:
  """Held-out accuracy at `x` (seconds or samples) on a curve of (x, accuracy) points,
  linear between them; None past the curve's end (no extrapolation)."""
  xs, accs = np.asarray(xs, np.float64), np.asarray(accs, np.float64)
  if not len(xs) or x > xs[-1] + 1e-9:
    return None
  return float(np.interp(x, xs, accs))


DIAGNOSIS = (
  "reward",
  "reward_zero_frac",
  "all_zero_batch",
  "groups_flat",
  "adv_abs",
  "adv_neg_frac",
)


def diagnosis(rows: list[dict], points: int = 60) -> dict:
  """Why an RL arm learns or does not, from its logged update rows (phase "rl"; every
  log_every-th update, a sample of its batches): the mean batch
  reward; reward sparsity (the share of a batch's trajectories that earned 0, and the share
  of batches where every one did: those teach nothing); the share of GRPO groups whose
  rewards were all equal (no signal; GRPO only); the mean |advantage| and, for SAO, the share
  of negative advantages (its baseline is the task tracker's value, so a batch where every
  trajectory failed pushes each one down, where GRPO's flat group gives 0); and the batch
  reward against updates (`curve`: at most `points` rows of [step, reward, reward_zero_frac]).
  Keys a run did not log are left out."""
  upd = [r for r in rows if r.get("phase") == "rl" and "reward" in r]
  upd.sort(key=lambda r: r["step"])
  values: dict[str, list[float]] = {k: [] for k in DIAGNOSIS}
  for r in upd:
    if "reward_zero_frac" in r:
      values["all_zero_batch"].append(float(r["reward_zero_frac"] >= 1.0 - 1e-9))
    for k in DIAGNOSIS:
      if k in r:
        values[k].append(float(r[k]))
  out: dict = {"batches": len(upd)}
  out.update({k: float(np.mean(v)) for k, v in values.items() if v})
  keep = upd[:: max(1, -(-len(upd) // points))]
  out["curve"] = [[r["step"], r["reward"], r.get("reward_zero_frac")] for r in keep]
  return out
