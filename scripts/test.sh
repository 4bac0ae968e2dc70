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
#   bash scripts/test.sh --lean-and-checkers [ARGS]
#                                          the Lean build, the tests marked `lean`, mypy, pyright
#
# The whole run puts the --lean-and-checkers part (its output in out/lean_and_checkers.log,
# shown after pytest's; the build's own log in out/lean_build.log) beside pytest running every
# test not marked `lean`: one Lean process while pytest runs, two after it (the count is read
# from out/lean_build.jobs before each module starts). The tests marked `lean` read the build's
# outputs (formal/build/, the toolchain in .cache/lean) and fail, never skip, when those are
# missing; they do not run when the build failed.
# Every part runs even when an earlier one failed; the exit status is nonzero when any did, and
# the last line names them.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
RUN="test.sh"
QUICK=0
LEAN_AND_CHECKERS=0
FAILED_FILE=""
JOBS_FILE=()
case "${1:-}" in
    --quick) QUICK=1; shift ;;
    --lean-and-checkers)
        LEAN_AND_CHECKERS=1; RUN="test.sh --lean-and-checkers"; shift
        # Set by the whole run: where to list the failed parts, the Lean jobs file.
        while [ "${1:-}" = "--failed-file" ] || [ "${1:-}" = "--jobs-file" ]; do
            case "$1" in
                --failed-file) FAILED_FILE="${2:?--failed-file needs a file}" ;;
                --jobs-file) JOBS_FILE=(--jobs-file "${2:?--jobs-file needs a file}") ;;
            esac
            shift 2
        done ;;
esac
[ "${WITCERT_SETUP_DONE:-0}" = 1 ] || bash scripts/setup.sh || exit 1

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
    if [ -n "$FAILED_FILE" ]; then
        printf '%s\n' ${FAILED[@]+"${FAILED[@]}"} >"$FAILED_FILE"
    fi
    if [ "${#FAILED[@]}" -ne 0 ]; then
        local joined
        joined="$(printf '%s; ' "${FAILED[@]}")"
        echo "$RUN: FAILED: ${joined%; }" >&2
        exit 1
    fi
    echo "$RUN: ok"
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

LEAN_LOG="out/lean_build.log"
LEAN_JOBS="out/lean_build.jobs"
lean_and_checkers() {
    # The Lean build (its log in $LEAN_LOG; shown when it failed), the tests that read its
    # outputs, then the type checkers.
    local rc
    if [ -f scripts/lean_build.sh ]; then
        echo "== Lean build (log: $LEAN_LOG)"
        bash scripts/lean_build.sh --jobs 2 ${JOBS_FILE[@]+"${JOBS_FILE[@]}"} >"$LEAN_LOG" 2>&1
        rc=$?
        if [ "$rc" -ne 0 ]; then
            cat "$LEAN_LOG"
            echo "lean-build: FAILED (exit $rc); the log above is $LEAN_LOG" >&2
            FAILED+=("Lean build" "pytest (lean: not run, the Lean build failed)")
        else
            tail -n 3 "$LEAN_LOG"
            pytest_part "lean" -m "lean" "$@"
        fi
    fi
    checkers
}

mkdir -p out
if [ "$LEAN_AND_CHECKERS" -eq 1 ]; then
    lean_and_checkers "$@"
    finish
fi

# The whole run: pytest on one core; the Lean build (one Lean process while pytest runs, two
# after it), the tests marked `lean` and the type checkers on the other, their output shown
# after pytest's.
BESIDE_PID=""
BESIDE_LOG="out/lean_and_checkers.log"
BESIDE_FAILED="out/lean_and_checkers.failed"
stop_beside() {
    # The part beside pytest runs in its own session (setsid), so its Lean processes go with it.
    if [ -n "$BESIDE_PID" ]; then
        kill -TERM -- "-$BESIDE_PID" 2>/dev/null || kill "$BESIDE_PID" 2>/dev/null
    fi
}
trap stop_beside EXIT
trap 'exit 130' INT TERM
echo 1 >"$LEAN_JOBS"
rm -f "$BESIDE_FAILED"
echo "== beside pytest: the Lean build, the tests marked lean, mypy and pyright (log: $BESIDE_LOG)"
BESIDE=(bash scripts/test.sh --lean-and-checkers --failed-file "$BESIDE_FAILED"
        --jobs-file "$LEAN_JOBS" "$@")
if command -v setsid >/dev/null; then
    WITCERT_SETUP_DONE=1 setsid "${BESIDE[@]}" >"$BESIDE_LOG" 2>&1 &
else
    WITCERT_SETUP_DONE=1 "${BESIDE[@]}" >"$BESIDE_LOG" 2>&1 &
fi
BESIDE_PID=$!
pytest_part "not lean" -m "not lean" "$@"
echo 2 >"$LEAN_JOBS"
echo "== waiting for the part beside pytest"
wait "$BESIDE_PID"
rc=$?
BESIDE_PID=""
cat "$BESIDE_LOG"
if [ -f "$BESIDE_FAILED" ]; then
    while IFS= read -r part; do
        [ -n "$part" ] && FAILED+=("$part")
    done <"$BESIDE_FAILED"
elif [ "$rc" -ne 0 ]; then
    FAILED+=("the Lean build, the lean tests and the type checkers (exit $rc, no result)")
fi
finish
