"""Long-horizon tasks with three-stage context compression.

The policy: a tiny decoder-only transformer that sees every kept step of its bank
(`compression.visible` = `capacity`, 2 INT8 vectors of 32 each per step) plus a raw window of
24 tokens; a learned salience score decides, with the LSTM's surprise, what the bank keeps.
The full-context control is the same transformer (memory slots unused) conditioned on the
whole episode.

Train and evaluate with `sao-jax train` (supervised warm start on expert episodes, then GRPO
with compressed memory; `task` holds the retention dialogues of `TASKS[variant]`, navigation
with `--set task.options.kind=navigation`):
  sao-jax train --config experiments/configs/longhorizon.py:tiny --workdir /tmp/lh_tiny
  sao-jax train --config experiments/configs/longhorizon.py --workdir runs/lh
(tiny: about two minutes on a 2-core CPU, mostly compilation.)
SAO instead of GRPO after the warm start: sampler processes play one episode per task with
the same compressed memory and ship it (bank and graveyard included) to the learner, which
updates on `sao.batch_size` whole episodes at a time (`sao_jax.runners.memory_sao`):
  sao-jax train --config experiments/configs/longhorizon.py:tiny --workdir /tmp/lh_sao \
    --set rl.algorithm=sao

`TASKS[variant]` are the held-out long-horizon specs the benchmark evaluates on (short
enough to train in minutes), `TRAIN_TASKS[variant]` what it trains on, `LONG_TASKS` the
1,000-step episodes whose bytes and peak memory it measures.

The benchmark (memory policy against the full-context control, bytes per stage, peak
memory) trains on `TRAIN_TASKS` (questions from 4 turns after their fact) and evaluates on
`TASKS`. Run (default, ~15 min on a 2-core CPU):
  python experiments/bench_compression.py --config experiments/configs/longhorizon.py
Run the tiny variant (one to two minutes on a 2-core CPU):
  python experiments/bench_compression.py --config experiments/configs/longhorizon.py:tiny --quick
"""

import dataclasses

from sao_jax.config import (
  CompressionConfig,
  Config,
  EvalConfig,
  ModelConfig,
  OptimConfig,
  RecoveryConfig,
  RLConfig,
  SamplersConfig,
  SAOConfig,
  SFTConfig,
  TaskConfig,
)
from sao_jax.envs.longhorizon import LongHorizonSpec

TASKS = {
  "default": {
    "retention": LongHorizonSpec("retention", n_steps=36, n_facts=1, min_gap=32, p_noise=0.1),
    "navigation": LongHorizonSpec(
      "navigation", n_steps=36, n_facts=1, min_gap=32, p_noise=0.1, period=12
    ),
  },
  "tiny": {
    "retention": LongHorizonSpec("retention", n_steps=12, n_facts=2, min_gap=4, period=5),
    "navigation": LongHorizonSpec("navigation", n_steps=12, n_facts=2, min_gap=4, period=5),
  },
}
# Not in the default run (select with --tasks retention4; accuracy only, no 1,000-step
# bytes): four facts per dialogue, so recall must bind a name to its pin, not copy the one
# digit seen. A prototype (64 episodes, 400 steps) gave full context 0.27, compressed 0.94.
# retention8: eight facts in 128-step dialogues, the bank closer to what 1,000 steps fill (the
# one-fact 36-step policy recalled 25 % at 1,000 steps): recall at 32-128 turns, then the
# same 1,000-step measurements as retention (LONG_TASKS). navigation8: the same for corridor
# keys (eight keys in 128 steps, stairs every 12).
EXTRA_TASKS = {
  "default": {
    "retention4": LongHorizonSpec("retention", n_steps=44, n_facts=4, min_gap=32, p_noise=0.1),
    "retention8": LongHorizonSpec("retention", n_steps=128, n_facts=8, min_gap=32, p_noise=0.1),
    "navigation8": LongHorizonSpec(
      "navigation", n_steps=128, n_facts=8, min_gap=32, p_noise=0.1, period=12
    ),
  },
  "tiny": {},
}
# Training episodes: the same families and lengths, but questions may come >= 4 steps after
# their fact (so gaps from 4 to ~34 occur); held-out episodes keep >= 32, so their accuracy
# is recall 32+ turns back on gaps mostly longer than those trained on. (Chosen when both arms
# failed to learn at lr 1e-2; not re-tested with only 32+ gaps since.)
TRAIN_TASKS = {
  v: {
    k: dataclasses.replace(s, min_gap=min(4, s.min_gap)) for k, s in {**t, **EXTRA_TASKS[v]}.items()
  }
  for v, t in TASKS.items()
}
LONG_TASKS = {
  "retention": LongHorizonSpec(
    "retention", n_steps=1000, n_facts=8, min_gap=32, p_noise=0.1, period=100
  ),
  "retention8": LongHorizonSpec(
    "retention", n_steps=1000, n_facts=8, min_gap=32, p_noise=0.1, period=100
  ),
  "navigation": LongHorizonSpec(
    "navigation", n_steps=1000, n_facts=8, min_gap=32, p_noise=0.1, period=100
  ),
}
LONG_TASKS["navigation8"] = LONG_TASKS["navigation"]


def get_config(variant: str = "default") -> Config:
  if variant not in TASKS:
    raise ValueError(f"unknown variant {variant!r}; known: {', '.join(TASKS)}")
  comp = CompressionConfig(
    enabled=True,
    step_len=20,
    vectors_per_step=2,
    dim=32,
    enc_width=64,
    enc_depth=2,
    enc_heads=4,
    lstm_hidden=64,
    keep_threshold=0.5,
    turning_surprise=1.0,
    budget=8,
    capacity=64,
    # The policy reads the whole bank (every kept entry), not the last few: the bank is
    # small, which is the point of compressing (cost measured by bench_compression.py).
    visible=64,
    window=24,
    # eviction: at 1,000 steps it keeps more facts (87.5 % against
    # 78 % first-come); the evicted entries ship in the trajectory's
    # graveyard so that the learner's replay stays exact
    evict=True,
    # A learned salience score ranks what to keep (sao_jax.compression.salience): the LSTM's
    # surprise alone does not tell a fact from rare chit-chat.
    salience="learned",
    # and gates the LSTM's turning points: a surprising step is kept for good only if salient.
    # Without it, at 1,000 steps the steps after rare ones (a "hall." after a lamp or stairs)
    # surprise the LSTM, stay as turning points and fill the bank (64 of 64 entries, ~25 of
    # them plain halls), a bank 2x fuller than any the policy trained on (~33 entries in
    # 128-step episodes), and one of three navigation8 seeds misread it (92 % at 1,000 steps,
    # every missed key in the bank). With it, the same policies' banks hold ~34 entries and
    # they answer all questions (diagnosed on validation episodes, not the test ones).
    salient_turning=True,
  )
  model = ModelConfig(
    width=64,
    depth=2,
    heads=4,
    max_len=512,
    memory_slots=comp.visible * comp.vectors_per_step,
    memory_dim=comp.dim,
  )
  # lr 1e-3: at 1e-2 neither arm learned recall (full context 0.109 after 300 steps with the
  # graded weight of 100; chance 0.1); at 1e-3 both did (notes in the README). 400 steps:
  # the full-context control's recall appears between steps 250 and 300 and was 0.94-0.98 at
  # 300; 100 more steps so that neither arm is compared mid-transition.
  steps = 400 if variant == "default" else 20
  sft = SFTConfig(steps=steps, batch_size=16, optim=OptimConfig(lr=1e-3, warmup_steps=30))
  # GRPO after the warm start: each step plays `prompts_per_step` tasks `group_size` times
  # (answers are a digit or "ok"/"f" and EOS: 4 tokens).
  rl = RLConfig(
    algorithm="grpo",
    steps=100,
    prompts_per_step=4,
    group_size=8,
    max_new_tokens=4,
    optim=OptimConfig(lr=1e-4, warmup_steps=10),
  )
  # rl.algorithm='sao': each update takes 32 whole episodes (GRPO's 4 tasks x 8), played
  # one per task by 2 sampler processes of 16 slots; a memory sampler plays whole episodes
  # per call (no continuous batching).
  sao = SAOConfig(sampler_slots=16, batch_size=32, continuous=False)
  samplers = SamplersConfig(num=2)
  recovery = RecoveryConfig()
  num_train, num_test = 4000, 256
  if variant == "tiny":
    # One layer in the policy and the step encoder, as the other configs' tiny variants:
    # the same programs, compiled in about three quarters of the time (the tests' runs).
    comp = dataclasses.replace(comp, capacity=16, budget=4, visible=16, enc_depth=1)
    model = dataclasses.replace(model, width=32, depth=1, heads=2, max_len=128, memory_slots=32)
    sft = dataclasses.replace(sft, batch_size=4)
    rl = dataclasses.replace(rl, steps=3, prompts_per_step=2, group_size=4)
    sao = dataclasses.replace(sao, sampler_slots=4, batch_size=4, refill_rows=4)
    samplers = SamplersConfig(num=1)
    num_train, num_test = 64, 8
    recovery = RecoveryConfig(val_problems=num_test)  # (SAO's shadows: the train tail)
  spec = TASKS[variant]["retention"]
  task = TaskConfig(
    family="longhorizon",
    num_train=num_train,
    num_test=num_test,
    options=(
      ("kind", spec.family),
      ("n_steps", spec.n_steps),
      ("n_facts", spec.n_facts),
      ("min_gap", spec.min_gap),
      ("p_noise", spec.p_noise),
      ("period", spec.period),
      ("window", comp.window),
      ("graded_weight", 100.0),
    ),
  )
  return Config(
    name=f"longhorizon_{variant}",
    model=model,
    compression=comp,
    sft=sft,
    rl=rl,
    sao=sao,
    samplers=samplers,
    recovery=recovery,
    task=task,
    eval=EvalConfig(num_problems=num_test, batch_size=32),
  )
