"""The parts the SAO learner (`sao_jax.runners.sao.SAOLearner`) is made of, each with one
duty and testable without processes: `intake` (samplers, transport, admission, buffer,
journal, ledger; process 0 only), `safety` (non-finite guard, shadow validation, rollback),
`publishing` (parameter versions and snapshots) and `statistics` (counters, transients, the
metric row, the summary)."""
