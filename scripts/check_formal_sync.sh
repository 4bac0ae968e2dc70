#!/usr/bin/env bash
# The fast formal sync check (no Lean run, a few seconds): exits non-zero when Python and the
# committed Lean artifacts have drifted apart. Two halves, each reported by name:
#
#   1. generated checks: `scripts/gen_lean_checks.py --check` regenerates
#      formal/WitCert/GeneratedChecks.lean from the library's real code (composition, tiers,
#      telescoping, pooling, selection, the bridges' transfer coefficients, the meters' cores)
#      and compares it with the committed file. A changed Python formula changes the file; the
#      Lean build (scripts/lean_build.sh) then proves the committed values against Lean's own
#      definitions. After the comparison it evaluates the meters' log A / log A- and retention
#      form, and every rounding margin against the error it claims to cover
#      (scripts/margin_checks.py), in 50-digit arithmetic.
#   2. statement lock: `scripts/statement_lock.py` compares the committed lock
#      formal/statements.lock.json with the shipped export witcert_calculus/lean/lean_export.json.
#   3. schemas: `scripts/check_schemas.py` compares each built-in schema (the claim a theorem
#      certifies, witcert_calculus/schemas.py) with its theorem's statement in the lock.
#
# Usage: bash scripts/check_formal_sync.sh        (PYTHON=... selects the interpreter)
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
    if [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"; else PY="python3"; fi
fi
# The library of this tree, not an installed copy of another one.
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

failed=()
if ! "$PY" scripts/gen_lean_checks.py --check; then
    echo "formal-sync: FAILED: generated checks: formal/WitCert/GeneratedChecks.lean differs from" \
         "a fresh generation from the Python library (a formula Python evaluates changed, or the" \
         "file is stale); if deliberate, run python scripts/gen_lean_checks.py and rebuild Lean" >&2
    failed+=("generated checks")
fi
if ! "$PY" scripts/statement_lock.py; then
    echo "formal-sync: FAILED: statement lock: formal/statements.lock.json differs from the" \
         "shipped export witcert_calculus/lean/lean_export.json" >&2
    failed+=("statement lock")
fi
if ! "$PY" scripts/check_schemas.py; then
    echo "formal-sync: FAILED: schemas: a built-in schema's theorem no longer states its claim" \
         "in formal/statements.lock.json" >&2
    failed+=("schemas")
fi
if [ "${#failed[@]}" -ne 0 ]; then
    echo "formal-sync: drift in: $(IFS=,; echo "${failed[*]}" | sed 's/,/, /g')" >&2
    exit 1
fi
echo "formal-sync: ok (generated checks fresh, statement lock matches the export, schemas state their theorems)"
