#!/usr/bin/env bash
# Creates .venv (Python 3.11) and installs the pinned requirements and sao_jax itself, once;
# reruns only when requirements.txt or setup.cfg change. Also .venv-s3, the local S3 endpoint
# of the object-storage tests (requirements-s3.txt), once. Sourced by main.sh and test.sh.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
py="${PYTHON:-}"
if [[ -z "$py" ]]; then
  for candidate in python3.11 python3; do
    if command -v "$candidate" >/dev/null; then py="$candidate"; break; fi
  done
fi
if ! "$py" -c 'import sys; assert sys.version_info[:2] == (3, 11)' 2>/dev/null; then
  echo "sao_jax needs Python 3.11 (the pinned jax 0.10.2 wheels); found: $("$py" --version 2>&1)." \
       "Set PYTHON=/path/to/python3.11." >&2
  exit 1
fi
[[ -x .venv/bin/python ]] || "$py" -m venv .venv
# shellcheck disable=SC1091
source .venv/bin/activate
stamp=".venv/.installed-$(cat requirements.txt setup.cfg | sha1sum | cut -c1-12)"
if [[ ! -f "$stamp" ]]; then
  echo "installing requirements into .venv (about a minute, once)..." >&2
  python -m pip install -q --upgrade pip
  python -m pip install -q -r requirements.txt
  python -m pip install -q --no-deps -e .
  rm -f .venv/.installed-*
  touch "$stamp"
fi
s3stamp=".venv-s3/.installed-$(sha1sum requirements-s3.txt | cut -c1-12)"
if [[ ! -f "$s3stamp" ]]; then
  echo "installing the local S3 test endpoint into .venv-s3 (once)..." >&2
  [[ -x .venv-s3/bin/python ]] || "$py" -m venv .venv-s3
  .venv-s3/bin/python -m pip install -q -r requirements-s3.txt
  rm -f .venv-s3/.installed-*
  touch "$s3stamp"
fi
