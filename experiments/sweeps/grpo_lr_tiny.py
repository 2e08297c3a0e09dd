"""Learning rates of the tiny SFT -> GRPO run (experiments/configs/arith_grpo.py:tiny): the SFT
step size against the GRPO step size, a 4 x 2 grid, three seeds per point (24 trials of
~15 s each on a quiet 2-core CPU). experiments/sweep_resume_demo.py kills it with -9
halfway and resumes it.

Run:
  sao-jax sweep experiments/sweeps/grpo_lr_tiny.py --dir runs/sweeps/grpo_lr_tiny --parallel 2
Rerun the same command to resume an interrupted sweep.
"""

from sao_jax.sweep import Choice, Sweep


def get_sweep(variant: str = "default") -> Sweep:
  if variant != "default":
    raise ValueError(f"unknown variant {variant!r}; known: default")
  return Sweep(
    name="grpo_lr_tiny",
    config="experiments/configs/arith_grpo.py:tiny",
    strategy="grid",
    axes=(Choice("sft.optim.lr", (1e-3, 3e-3, 1e-2, 3e-2)), Choice("rl.optim.lr", (1e-4, 1e-3))),
    seeds=3,
    metric="rl.accuracy",
    direction="maximize",
    fixed=(
      "rl.steps=2",
      "eval.num_problems=32",
      "eval.batch_size=32",
      "sft.optim.warmup_steps=5",
      "checkpoint_every=5",
    ),
    report=("sft.accuracy", "sft.format_rate", "wall_s"),
  )
