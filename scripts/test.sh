#!/usr/bin/env bash
# The test suite: sets up .venv if needed, lints, then runs pytest (extra args go to pytest,
# e.g. scripts/test.sh -m "not slow" for the fast half, or -n 0 for one process). About 18-21
# minutes on 2 cores from a fresh clone, setup included (32-43 minutes before the tests ran on
# two workers), most of it compiling the end-to-end runs' programs (tests/conftest.py sets the
# compiler flags that keep that short).
# Two pytest-xdist workers, one module at a time each (a module's fixtures are made once), the
# modules with the most end-to-end runs first (tests/conftest.py orders them; xdist's own
# reordering by number of tests is off).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
ruff check sao_jax experiments tests scripts
ruff format --check sao_jax experiments tests scripts  # the house style, 2-space indent
python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=25 "$@"  # the slowest, to keep the suite in budget
