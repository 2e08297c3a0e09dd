"""SAO's sensitivity to its off-policy knobs and the RL step size, on the arithmetic SAO
config (experiments/configs/sao_arith.py): max staleness (updates a trajectory may lag the
learner), freshness half-life (the decay 2^(-s/half_life) of a stale trajectory's weight),
the importance-ratio cap, and rl.optim.lr. Three seeds per point; TPE after 8 random points.

Run (default: 24 points x 3 seeds of the default SAO config, ~6 min each on a 2-core CPU;
hours: run it on a bigger machine or shrink `points`):
  sao-jax sweep experiments/sweeps/sao_sensitivity.py --dir runs/sweeps/sao_sensitivity
Run the tiny variant (6 points x 3 seeds of the tiny config, a few minutes), a smoke test of
the machinery: at that budget the tiny policy scores 0 held-out accuracy at every point, and
the report says that no point is distinguishable (experiments/sweeps/warm_start_tiny.py is
the small sweep whose points differ):
  sao-jax sweep experiments/sweeps/sao_sensitivity.py:tiny --dir runs/sweeps/sao_tiny
Rerun the same command to resume an interrupted sweep. Results: DIR/trials.csv, points.csv,
sweep.png, best_config.py.

The sensitivity analysis that fits a 2-core CPU (variant `oat`, one knob at a time around the
default SAO config; 11 points x 3 seeds = 33 trials of 60 s of SAO each, ~50 min with
--parallel 1, so that no trial shares the cores and staleness is what the config makes it).
Every trial starts from one shared SFT checkpoint (seed 0), so the seeds vary the RL phase:
  sao-jax train --config experiments/configs/sao_arith.py --set rl.max_seconds=0 \
      --workdir runs/sft_start_arith
  sao-jax sweep experiments/sweeps/sao_sensitivity.py:oat --dir runs/sweeps/sao_oat --parallel 1
  python experiments/sensitivity_report.py runs/sweeps/sao_oat --out results/sweep_sao_sensitivity
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
  if variant == "oat":
    # The first value of each axis is the default config's: the base point.
    return Sweep(
      name="sao_sensitivity_oat",
      config="experiments/configs/sao_arith.py:default",
      axes=(
        Choice("sao.max_staleness", (4, 0, 1, 16)),
        Choice("sao.freshness_half_life", (4.0, 1.0, 16.0)),
        Choice("sao.is_cap", (2.0, 1.2, 8.0)),
        Choice("rl.optim.lr", (1e-4, 3e-5, 3e-4, 1e-3)),
      ),
      seeds=3,
      metric="rl.accuracy",
      direction="maximize",
      strategy="oat",
      fixed=(
        "init_from='runs/sft_start_arith'",
        "sft.steps=0",
        "rl.max_seconds=60.0",
        "eval.every_seconds=15.0",
      ),
      report=(
        "start.accuracy",
        "rl.steps",
        "rl.trajectories_per_s",
        "rl.learner_busy",
        "rl.dropped_stale",
        "rl.nonfinite_skipped",
        "rl.rollbacks",
        "wall_s",
      ),
      trial_timeout_s=900.0,
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
  raise ValueError(f"unknown variant {variant!r}; known: default, oat, tiny")
