"""What the benchmark scripts under experiments/ measure, as library code: the scripts parse
their command line, call these functions and write their result files; the measurements,
the bookkeeping of resumable runs and the tables they print live here, where tests and other
scripts import them by name.

  recall               which facts a long-horizon episode's memory held and saw; accuracy stats
  compression          bytes per compression stage, filter ablations, attention cost
  compression_accuracy accuracy of the compressed arm and its controls, short and 1,000-step
  peak_memory          XLA's compiled peak memory of one GRPO(N=8) or SAO update
  arm_snapshots        an arm's training, saved and restored under --params-dir
  compression_run      bench_compression's settings, overrides and resumed parts
  compression_report   bench_compression's closing tables
  calibrate_sampler    the simulator's costs measured in a sampler process (calibrate_sim)
  calibrate_learner    ... and in the learner's process; the `sim.Costs` they make
  mfu                  FLOP counts, the reference matmul, an update's parts (bench_learner)
  packing              a config's learner update, padded rows against packed
  learner_report       bench_learner's printed tables
  sync_vs_async        bench_sync_vs_async's arms, statistics over seeds, table and figure
  code_report          bench_code's arms, statistics over seeds, table and figure
  arith_report         sft_grpo_arith's statistics, plateau criterion, table and figure
  sim_validation       validate_sim's real metrics, scenarios, simulated means and errors
"""
