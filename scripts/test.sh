#!/usr/bin/env bash
# The test suite: set-up from nothing, the Lean development, pytest, and both type checkers on
# the packages and the examples.
#
#   bash scripts/test.sh                   everything; what CI runs (.ci/run)
#   bash scripts/test.sh --quick           the inner loop (a few minutes): no Lean build and no
#                                          test marked `lean`, `slow` (models, notebooks, soaks,
#                                          long interpreter runs) or `engine` (SGLang, vLLM);
#                                          mypy and pyright run beside pytest
#   bash scripts/test.sh [--quick] ARGS    ARGS go to pytest (e.g. -x, -k EXPR, a test file)
#
# The whole run builds Lean in the background (scripts/lean_build.sh, its output in
# out/lean_build.log) while pytest runs every test not marked `lean` and then the type checkers
# run: one Lean process beside them on a two-core machine, two once they are done (the count
# is read from out/lean_build.jobs before each module starts). Then it waits for the build,
# showing its log if it failed, and runs the tests marked `lean`: they read the build's outputs
# (formal/build/, the toolchain in .cache/lean) and fail, never skip, when those are missing.
# Every part runs even when an earlier one failed; the exit status is nonzero when any did, and
# the last line names them.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
QUICK=0
if [ "${1:-}" = "--quick" ]; then
    QUICK=1
    shift
fi
bash scripts/setup.sh || exit 1

FAILED=()
# pytest exits 5 when it collected nothing: ARGS that select only the other part's tests.
pytest_part() {
    local name="$1" rc
    shift
    echo "== pytest: $name"
    .venv/bin/python -m pytest "$@"
    rc=$?
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then FAILED+=("pytest ($name)"); fi
}
checkers() {
    echo "== mypy"
    .venv/bin/mypy || FAILED+=("mypy")
    echo "== pyright"
    .venv/bin/pyright || FAILED+=("pyright")
}
finish() {
    if [ "${#FAILED[@]}" -ne 0 ]; then
        local joined
        joined="$(printf '%s; ' "${FAILED[@]}")"
        echo "test.sh: FAILED: ${joined%; }" >&2
        exit 1
    fi
    echo "test.sh: ok"
    exit 0
}

if [ "$QUICK" -eq 1 ]; then
    # The type checkers on the second core beside pytest; their output follows pytest's.
    mkdir -p out
    CHECK_LOG="out/checkers.log"
    ( FAILED=(); checkers; exit "${#FAILED[@]}" ) >"$CHECK_LOG" 2>&1 &
    CHECK_PID=$!
    pytest_part "quick" -m "not lean and not slow and not engine" "$@"
    wait "$CHECK_PID"
    rc=$?
    cat "$CHECK_LOG"
    if [ "$rc" -ne 0 ]; then FAILED+=("mypy or pyright (see above)"); fi
    finish
fi

LEAN_PID=""
LEAN_LOG="out/lean_build.log"
LEAN_JOBS="out/lean_build.jobs"
stop_lean() {
    # The build runs in its own session (setsid), so its Lean processes go with it.
    if [ -n "$LEAN_PID" ]; then kill -TERM -- "-$LEAN_PID" 2>/dev/null || kill "$LEAN_PID" 2>/dev/null; fi
}
trap stop_lean EXIT
trap 'exit 130' INT TERM
if [ -f scripts/lean_build.sh ]; then
    mkdir -p out
    echo 1 >"$LEAN_JOBS"
    echo "== Lean build in the background (log: $LEAN_LOG)"
    LEAN=(bash scripts/lean_build.sh --jobs 2 --jobs-file "$LEAN_JOBS")
    if command -v setsid >/dev/null; then
        setsid "${LEAN[@]}" >"$LEAN_LOG" 2>&1 &
    else
        "${LEAN[@]}" >"$LEAN_LOG" 2>&1 &
    fi
    LEAN_PID=$!
fi
pytest_part "not lean" -m "not lean" "$@"
checkers
LEAN_OK=1
if [ -n "$LEAN_PID" ]; then
    echo 2 >"$LEAN_JOBS"
    echo "== waiting for the Lean build"
    wait "$LEAN_PID"
    rc=$?
    LEAN_PID=""
    if [ "$rc" -ne 0 ]; then
        LEAN_OK=0
        cat "$LEAN_LOG"
        echo "lean-build: FAILED (exit $rc); the log above is $LEAN_LOG" >&2
        FAILED+=("Lean build")
    else
        tail -n 3 "$LEAN_LOG"
    fi
fi
if [ "$LEAN_OK" -eq 1 ]; then
    pytest_part "lean" -m "lean" "$@"
else
    FAILED+=("pytest (lean: not run, the Lean build failed)")
fi
finish
