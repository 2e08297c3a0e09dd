"""The two settings of experiments/rl_vs_sft.py (RL against continued SFT), as overrides of a
config, shared by the comparison and the sweeps that tune its arms
(experiments/sweeps/rl_vs_sft_tuning.py), so both train exactly the same setting:

  flawed  demonstrations from a teacher who reads the subtraction verbs of `misreads` as
          additions (task.options.teacher_misreads: a systematic error); rewards and the
          test split are true.
  ood     everything trains on 1-2 operations with operands up to 9, with 100 test problems
          (50 of each: 1-operation problems number only 126, and a train split must be
          left); the out-of-distribution test splits, each scored on all it holds: 3
          operations (`ops3`, 500), and operands up to 20 with a number above 9
          (`operands20`: ~80 % of 500, none of which can be a train problem); model.max_len
          holds the longest of them.
"""

from __future__ import annotations

import dataclasses

from sao_jax.config import Config, apply_overrides
from sao_jax.setup import load_config, make_setup

SETTINGS = ("flawed", "ood")
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
