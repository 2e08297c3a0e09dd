"""Tuning every arm of experiments/rl_vs_sft.py before it runs: each arm's learning rate, in
the comparison's own setting and budget (the config's SFT start, then 240 s of the arm), on
seeds 100 and 101, disjoint from the comparison's 0..2. A variant per (setting, arm):

  {flawed,flawed-plateau,ood,code-clean,code-flawed}_{sft_continued,grpo,sao}
    flawed: arithmetic, the teacher misreads "gave" (18 % of demonstrations flawed; the
      ρ = 0.2 setting; the ρ ≈ 0.35 setting, "gave,used", runs with the values chosen here);
    flawed-plateau: the same from an SFT start trained to its plateau (1,500 steps, as the
      plateau setting of experiments/sft_grpo_arith.py), not the half-trained 300;
    ood: arithmetic, 1-2 operations, operands up to 9 (sao_jax.bench.rl_vs_sft);
    code-clean: the code family (experiments/configs/code.py), its start trained for 1,500
      SFT steps (the config's 300 are far from converged);
    code-flawed: the same, the teacher misreads "add" (writes k subtracted);
    sft_continued: sft.optim.lr in 1e-4, 3e-4, 1e-3, 3e-3 (the config's SFT uses 1e-3);
    grpo, sao: rl.optim.lr in 3e-5, 1e-4, 3e-4, 1e-3 (the config's RL uses 1e-4).

Each trial starts from its seed's one shared SFT run (`Sweep.shared_sft`; SFT is
deterministic on the CPU) and trains its arm for 240 s (`Sweep.trial_fixed`): continued SFT
on the same (flawed) demonstrations, GRPO(N=8) sampling in the learner, or SAO. It is scored
on the held-out accuracy (code: mean pass rate) of the setting's in-distribution test split
at the end (never on
an out-of-distribution split: those stay unseen until the comparison). The rule that picks
each arm's value, fixed before any trial ran: the point with the highest mean of its two
seeds; where the sweep cannot tell it from the config's own value (their 95 % Welch interval
of the difference contains 0: the report's `leading` points), the config's own value stays.
The comparison runs each arm with its chosen value (`--arm-set ARM:KEY=VALUE`; the sft_clean
reference arm takes continued SFT's), named in its command and JSON; the trials are
committed under results/tuning/rl_vs_sft_<variant>/. One trial at a time (`--parallel 1`).

Run (about 5 min a trial on a 2-core CPU, 8 trials a variant):
  sao-jax sweep experiments/sweeps/rl_vs_sft_tuning.py:flawed_sao \\
      --dir runs/sweeps/rl_vs_sft_flawed_sao --parallel 1
"""

import itertools

from sao_jax.bench.rl_vs_sft import setting_overrides
from sao_jax.sweep import Choice, Sweep

ARITH, CODE = "experiments/configs/sao_arith.py", "experiments/configs/code.py"
SECONDS = 240.0
PLATEAU = ["sft.steps=1500"]  # the SFT start trained to its plateau (sft_grpo_arith's)
SETTINGS = {  # variant's setting -> (config, rl_vs_sft setting, misreads, extra overrides)
  "flawed": (ARITH, "flawed", ["gave"], []),
  "flawed-plateau": (ARITH, "flawed", ["gave"], PLATEAU),
  "ood": (ARITH, "ood", [], []),
  "code-clean": (CODE, "clean", [], PLATEAU),
  "code-flawed": (CODE, "flawed", ["add"], PLATEAU),
}
ARMS = {  # arm -> (axis key, values, what the trial trains after the start, metric)
  "sft_continued": (
    "sft.optim.lr",
    (1e-4, 3e-4, 1e-3, 3e-3),
    (f"sft.max_seconds={SECONDS}", "rl.max_seconds=0.0"),
    "sft.accuracy",
  ),
  "grpo": (
    "rl.optim.lr",
    (3e-5, 1e-4, 3e-4, 1e-3),
    ("rl.algorithm='grpo'", "rl.sampling='inline'", f"rl.max_seconds={SECONDS}"),
    "rl.accuracy",
  ),
  "sao": (
    "rl.optim.lr",
    (3e-5, 1e-4, 3e-4, 1e-3),
    ("rl.algorithm='sao'", f"rl.max_seconds={SECONDS}"),
    "rl.accuracy",
  ),
}
VARIANTS = [f"{s}_{a}" for s, a in itertools.product(SETTINGS, ARMS)]


def get_sweep(variant: str = "flawed_sao") -> Sweep:
  setting, _, arm = variant.partition("_")
  if setting not in SETTINGS or arm not in ARMS:
    raise ValueError(f"unknown variant {variant!r}; known: {', '.join(VARIANTS)}")
  key, values, trial_fixed, metric = ARMS[arm]
  config, kind, misreads, extra = SETTINGS[setting]
  sets, _ = setting_overrides(kind, misreads, config, "default", extra)
  return Sweep(
    name=f"rl_vs_sft_{variant}",
    config=f"{config}:default",
    strategy="grid",
    axes=(Choice(key, values),),
    seeds=2,
    first_seed=100,
    metric=metric,
    direction="maximize",
    fixed=(*sets, "rl.steps=0"),
    trial_fixed=trial_fixed,
    report=("sft.accuracy", "rl.steps", "sft.steps", "wall_s"),
    trial_timeout_s=1800.0,
    shared_sft=True,
  )
