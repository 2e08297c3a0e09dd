#!/usr/bin/env bash
# The test suite: sets up .venv if needed, lints, then runs pytest (extra args go to pytest,
# e.g. scripts/test.sh -m "not slow" for the fast half).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
ruff check sao_jax experiments tests scripts
ruff format --check sao_jax experiments tests scripts  # the house style, 2-space indent
python -m pytest -q --durations=25 "$@"  # the slowest, to keep the suite in budget
