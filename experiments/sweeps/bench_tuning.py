"""Tuning both sides of the SAO-against-synchronous-GRPO benchmark (experiments/
bench_sync_vs_async.py) before it runs: each arm's RL learning rate, and GRPO's prompts per
step, at the benchmark's budget (its SFT warm start, then 240 s of RL), on seeds 100 and 101,
disjoint from the benchmark's 0..4. A variant per (task, arm):

  {arith,chain}_{sao,grpo,grpo_samplers}
    arith: experiments/configs/sao_arith.py (1-2 operations);
    chain: experiments/configs/sao_chain.py (heavy-tailed lengths, a declared law);
    sao: rl.optim.lr in 3e-5, 1e-4, 3e-4, 1e-3 (4 points);
    grpo, grpo_samplers (in the learner / through the sampler processes): rl.optim.lr in
      3e-5, 1e-4, 3e-4 x rl.prompts_per_step in 8, 16, 32 (x 8 rows each; 9 points).

Every trial is one `sao-jax train` of the config scored on the held-out accuracy at the end
of RL; each point is the mean of its two seeds. An arith trial trains its own SFT, as each
benchmark seed trains one; a chain trial (550 SFT steps, a third of its ~9 minutes) starts
from its seed's one shared SFT run (`Sweep.shared_sft`: trained once per seed; SFT is
deterministic on the CPU, so the start is the same). The rule that picks each arm's values,
fixed before any trial ran: the point with the highest mean; where the sweep cannot tell it
from the config's own values (their 95 % Welch interval of the difference contains 0: the
report's `leading` points), the config's own values stay. The benchmark runs each arm with
its chosen values (`--arm-set`), named in its command and JSON; the trials (trials.json,
points.csv, sweep.png) are committed under results/tuning/<variant>/. One trial at a time
(`--parallel 1`): the benchmark's arms have the machine to themselves, so must their tuning
runs.

Run (about 6 min a trial on a 2-core CPU: 8 trials for SAO, 18 for each GRPO arm):
  sao-jax sweep experiments/sweeps/bench_tuning.py:arith_sao --dir runs/sweeps/tune_arith_sao \\
      --parallel 1
"""

import itertools

from sao_jax.sweep import Choice, Sweep

CONFIGS = {"arith": "experiments/configs/sao_arith.py", "chain": "experiments/configs/sao_chain.py"}
ARMS = {  # arm -> (rl.algorithm, rl.sampling)
  "sao": ("sao", "inline"),
  "grpo": ("grpo", "inline"),
  "grpo_samplers": ("grpo", "samplers"),
}
VARIANTS = [f"{t}_{a}" for t, a in itertools.product(CONFIGS, ARMS)]


def get_sweep(variant: str = "arith_sao") -> Sweep:
  task, _, arm = variant.partition("_")
  if task not in CONFIGS or arm not in ARMS:
    raise ValueError(f"unknown variant {variant!r}; known: {', '.join(VARIANTS)}")
  algorithm, sampling = ARMS[arm]
  if arm == "sao":
    axes = (Choice("rl.optim.lr", (3e-5, 1e-4, 3e-4, 1e-3)),)
  else:
    axes = (
      Choice("rl.optim.lr", (3e-5, 1e-4, 3e-4)),
      Choice("rl.prompts_per_step", (8, 16, 32)),
    )
  return Sweep(
    name=f"bench_tuning_{variant}",
    config=f"{CONFIGS[task]}:default",
    strategy="grid",
    axes=axes,
    seeds=2,
    first_seed=100,
    metric="rl.accuracy",
    direction="maximize",
    fixed=(
      f"rl.algorithm={algorithm!r}",
      f"rl.sampling={sampling!r}",
      "rl.steps=0",
      "rl.max_seconds=240.0",
    ),
    report=("sft.accuracy", "rl.steps", "rl.trajectories_per_s", "rl.learner_busy", "wall_s"),
    trial_timeout_s=1800.0,
    shared_sft=task == "chain",
  )
