#!/usr/bin/env bash
# The main job: set-up from nothing, then the demonstration.
#   1. the typed contract algebra on the storage -> selection chain;
#   2. SmolLM2-135M's attention memory observed through the WitCert meters under several
#      KV-cache compression schemes: one line per request, the measured table and the operating
#      point in the terminal; the full report (a block per request), JSON, entry traces and
#      plot in out/demo/ (python -m witcert_adapters.demo --verbose also prints the blocks).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
.venv/bin/python examples/worked_chain.py
echo
.venv/bin/python -m witcert_adapters.demo --out out/demo
