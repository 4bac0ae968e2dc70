#!/usr/bin/env bash
# The whole test suite: set-up from nothing, the Lean development, pytest,
# and both type checkers on the packages and the examples.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
if [ -f scripts/lean_build.sh ]; then
    bash scripts/lean_build.sh
fi
.venv/bin/python -m pytest "$@"
.venv/bin/mypy
.venv/bin/pyright
