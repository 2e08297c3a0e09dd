"""How long a supervised warm start the tiny arithmetic policy needs: held-out greedy accuracy
after 50 and after 800 SFT steps, four seeds per point, on a model small enough that the
whole sweep runs in a few minutes on a 2-core CPU (8 trials; the RL phase is off, so the
metric is the SFT start every RL run of this size would begin from).

Four seeds, not three: at 800 steps the policy is still learning fast and its seeds spread
widely (16-30 % in a first run), and with three seeds the 95 % interval of the difference
from 50 steps (Welch, 2 degrees of freedom) still contained 0, so the report named no best.
A middle point (200 steps) could not be told from 50 steps at all.

It is the first sweep to run: its points differ by far more than their seeds do, so the
report names a best point, where a sweep over knobs that do not move the metric at this
budget (experiments/sweeps/sao_sensitivity.py:tiny) reports that no point is
distinguishable.

Run:
  sao-jax sweep experiments/sweeps/warm_start_tiny.py --dir runs/sweeps/warm_start_tiny
Rerun the same command to resume an interrupted sweep.
"""

from sao_jax.sweep import Choice, Sweep


def get_sweep(variant: str = "default") -> Sweep:
  if variant != "default":
    raise ValueError(f"unknown variant {variant!r}; known: default")
  return Sweep(
    name="warm_start_tiny",
    config="experiments/configs/arith_grpo.py:tiny",
    strategy="grid",
    axes=(Choice("sft.steps", (50, 800)),),
    seeds=4,
    metric="sft.accuracy",
    direction="maximize",
    fixed=(
      # Twice the tiny variant's width and depth: the 32-wide, 1-layer model stays near 0 %
      # held-out accuracy for hundreds of steps, so every point would score alike.
      "model.width=64",
      "model.depth=2",
      "sft.batch_size=32",
      "sft.optim.lr=3e-3",
      "sft.optim.warmup_steps=10",
      "rl.steps=0",
      # 256 held-out problems instead of 64: a seed's accuracy moves by 0.4 points a problem.
      "task.num_test=256",
      "eval.num_problems=256",
      "eval.batch_size=128",
      "checkpoint_every=200",
    ),
    report=("sft.format_rate", "wall_s"),
  )
