"""SAO's sensitivity to its off-policy knobs and the RL step size, on the arithmetic SAO
config (experiments/configs/sao_arith.py): max staleness (updates a trajectory may lag the
learner), freshness half-life (the decay 2^(-s/half_life) of a stale trajectory's weight),
the importance-ratio cap, and rl.optim.lr. Three seeds per point; TPE after 8 random points.

Run (default: 24 points x 3 seeds of the default SAO config, ~6 min each on a 2-core CPU;
hours: run it on a bigger machine or shrink `points`):
  sao-jax sweep experiments/sweeps/sao_sensitivity.py --dir runs/sweeps/sao_sensitivity
Run the tiny variant (6 points x 3 seeds of the tiny config, a few minutes):
  sao-jax sweep experiments/sweeps/sao_sensitivity.py:tiny --dir runs/sweeps/sao_tiny
Rerun the same command to resume an interrupted sweep. Results: DIR/trials.csv, points.csv,
sweep.png, best_config.py.
"""

from sao_jax.sweep import Choice, IntRange, LogUniform, Pruning, Sweep

AXES = (
  IntRange("sao.max_staleness", 0, 8),
  Choice("sao.freshness_half_life", (1.0, 2.0, 4.0, 8.0)),
  Choice("sao.is_cap", (1.5, 2.0, 4.0)),
  LogUniform("rl.optim.lr", 3e-5, 1e-3),
)


def get_sweep(variant: str = "default") -> Sweep:
  if variant == "default":
    return Sweep(
      name="sao_sensitivity",
      config="experiments/configs/sao_arith.py:default",
      axes=AXES,
      seeds=3,
      metric="rl.accuracy",
      direction="maximize",
      strategy="tpe",
      points=24,
      startup_points=8,
      fixed=("eval.every_seconds=30.0",),
      pruning=Pruning(
        kind="median", phase="rl", key="eval_accuracy", startup_trials=12, warmup_evals=2
      ),
      report=("sft.accuracy", "rl.trajectories_per_s", "rl.learner_busy", "wall_s"),
    )
  if variant == "tiny":
    return Sweep(
      name="sao_sensitivity_tiny",
      config="experiments/configs/sao_arith.py:tiny",
      axes=AXES,
      seeds=3,
      metric="rl.accuracy",
      direction="maximize",
      strategy="tpe",
      points=6,
      startup_points=4,
      fixed=("sft.steps=10", "rl.steps=6", "eval.num_problems=32"),
      report=("sft.accuracy", "rl.trajectories_per_s", "wall_s"),
    )
  raise ValueError(f"unknown variant {variant!r}; known: default, tiny")
