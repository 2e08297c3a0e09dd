"""sao_jax: single-trajectory asynchronous optimisation (SAO) for RL post-training in JAX.

Layers, top to bottom (a module imports only its own layer, acyclically, and those below;
`python scripts/import_graph.py --check` verifies it):

  cli                                     the `sao-jax` command
  runners, bench                          loops that own processes, clocks and files
                                          (sft, grpo, sao, run, samplers, compiled: the one
                                          place where jax.jit is applied); what the
                                          experiment scripts measure (bench)
  learner, rollout, evaluation, setup,    pure or single-purpose pieces
  tasks, families, buffer, checkpoint,
  recovery, compression.{policy,rollout}
  models, rl, envs, data, transport,      components
  compression, sampling, packing, seqpack,
  state, batches
  config, tokenizer, procs, metrics,      foundations
  sharding, stats, provenance, startup

Dimension key of array names (`logp_bt`, `x_btd`, `mem_bmd`): each letter one meaning.
  B batch rows           T completion tokens     P prompt tokens
  L tokens of a whole sequence (a full row, or one environment step's segment)
  K key/value slots      S environment steps     M memory slots (prefix vectors)
  C compressed-memory entries                    E vectors per entry
  D model width / feature size                   F MLP hidden size       H heads
  V vocabulary           N tasks                 G group members (GRPO)
  R training rows taken from each trajectory (a subset of its S steps)
  Q packed rows (several rows' tokens in one sequence, `sao_jax.seqpack`)
Suffixes mark arrays; a scalar named `..._s` is in seconds.
"""

import time as _time

PROCESS_T0 = _time.time()  # when this process loaded sao_jax: restart -> first update timing
