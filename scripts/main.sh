#!/usr/bin/env bash
# The main job: SFT warm start, then asynchronous SAO (one trajectory per task, sampler
# processes feeding the learner over Kafka on a local broker that the run starts and stops)
# on generated arithmetic word problems (experiments/configs/sao_arith.py). Extra arguments
# go to `sao-jax train`, e.g. scripts/main.sh --set rl.max_seconds=60. WORKDIR and CONFIG
# may be set; rerunning with the same WORKDIR resumes an interrupted run.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
workdir="${WORKDIR:-runs/sao_kafka_$(date +%Y%m%d_%H%M%S)}"
config="${CONFIG:-experiments/configs/sao_arith.py}"
sao-jax train --config "$config" --workdir "$workdir" --set transport.kind=kafka "$@"
sao-jax eval --workdir "$workdir"
