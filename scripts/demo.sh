#!/usr/bin/env bash
# The main job: set-up from nothing, then the demonstration.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
.venv/bin/python examples/worked_chain.py
