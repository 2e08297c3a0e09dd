#!/usr/bin/env bash
# The main job: SFT warm start then synchronous GRPO(N=8) on generated arithmetic word
# problems (experiments/configs/arith_grpo.py). Extra arguments go to `sao-jax train`,
# e.g. scripts/main.sh --set rl.max_seconds=60. WORKDIR and CONFIG may be set.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
workdir="${WORKDIR:-runs/arith_grpo_$(date +%Y%m%d_%H%M%S)}"
config="${CONFIG:-experiments/configs/arith_grpo.py}"
sao-jax train --config "$config" --workdir "$workdir" "$@"
sao-jax eval --workdir "$workdir"
