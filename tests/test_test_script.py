"""``scripts/test.sh``: the split between the tests that need the Lean build and the rest.

The whole run builds Lean in the background while pytest runs the tests not marked ``lean``; a
test that reads the build's outputs without the marker would race the build (the driver
removes ``formal/build/theorems.json`` when it starts). These checks keep the marker on every
test module that reads them, and run the script with stubs for its parts (set-up, Lean build,
pytest, the checkers): their order, the Lean job count, each failure named and the exit status,
and the quick mode.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "test.sh"
#: A path into this checkout's Lean build (``formal/build``) or its toolchain (``.cache/lean``);
#: a test that builds a scratch copy names its own root, not ``ROOT``/``FORMAL``.
READS_LEAN = re.compile(r"\b(?:ROOT|FORMAL)\s*/\s*(?:\"formal\"\s*/\s*)?\"build\""
                        r"|\bROOT\s*/\s*\"\.cache\"\s*/\s*\"lean\""
                        r"|\blean_audit\.main\(")
MARKED = re.compile(r"^pytestmark\s*=.*\bpytest\.mark\.lean\b", re.MULTILINE)


def _test_files() -> list[Path]:
    return sorted((ROOT / "tests").rglob("test_*.py"))


def test_every_module_reading_the_lean_build_is_marked_lean() -> None:
    readers = [p for p in _test_files() if READS_LEAN.search(p.read_text(encoding="utf-8"))]
    assert {p.name for p in readers} >= {"test_formal.py", "test_formal_audit.py",
                                         "test_formal_lock.py", "test_user_export.py"}
    unmarked = [str(p.relative_to(ROOT)) for p in readers
                if not MARKED.search(p.read_text(encoding="utf-8"))]
    assert not unmarked, (f"{unmarked} read the Lean build's outputs: add "
                          "`pytestmark = pytest.mark.lean` so scripts/test.sh runs them after it")


def test_every_marked_module_reads_the_lean_build() -> None:
    # The marker moves a module behind the build; one that does not need it should not wait.
    marked = [p for p in _test_files() if MARKED.search(p.read_text(encoding="utf-8"))]
    assert marked and all(READS_LEAN.search(p.read_text(encoding="utf-8")) for p in marked)


def test_the_markers_are_registered() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    markers = config["tool"]["pytest"]["ini_options"]["markers"]
    assert {m.split(":", 1)[0] for m in markers} >= {"engine", "lean", "slow"}


def test_the_script_runs_lean_beside_pytest_and_its_tests_after() -> None:
    text = SCRIPT.read_text(encoding="utf-8")
    assert subprocess.run(["bash", "-n", str(SCRIPT)], check=False).returncode == 0
    # beside pytest, in its own session: the build (one Lean process, two after pytest), the
    # tests marked lean, the checkers
    assert re.search(r"lean_build\.sh --jobs 2 \$\{JOBS_FILE\[@\]\+", text)
    assert re.search(r"setsid \"\$\{BESIDE\[@\]\}\" >\"\$BESIDE_LOG\" 2>&1 &", text)
    steps = ('echo 1 >"$LEAN_JOBS"', "--lean-and-checkers --failed-file", '-m "not lean"',
             'echo 2 >"$LEAN_JOBS"', 'wait "$BESIDE_PID"')
    order = [text.index(s) for s in steps]
    assert order == sorted(order)
    body = text[text.index("lean_and_checkers() {"):]
    inner = ("lean_build.sh", '-m "lean"', "    checkers\n")
    assert [body.index(s) for s in inner] == sorted(body.index(s) for s in inner)
    # the quick mode: no Lean, no slow tests, no engine
    assert '-m "not lean and not slow and not engine"' in text
    # CI runs the whole suite
    assert (ROOT / ".ci" / "run").read_text(encoding="utf-8").rstrip().endswith(
        "bash scripts/test.sh")


def _scratch(tmp_path: Path, *, lean_rc: int = 0, pytest_rc: str = "0 0",
             mypy_rc: int = 0) -> Path:
    """A checkout whose set-up, Lean build, pytest and checkers are stubs that log their calls:
    ``pytest_rc`` gives pytest's exit status for each call in turn."""
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    (root / ".venv" / "bin").mkdir(parents=True)
    shutil.copy2(SCRIPT, root / "scripts" / "test.sh")
    stubs = {
        "scripts/setup.sh": "exit 0",
        # the build: its arguments, the job count at its start and once raised (or 5 s later)
        "scripts/lean_build.sh": f"""jobs() {{ cat out/lean_build.jobs 2>/dev/null || echo none; }}
echo "lean $* start=$(jobs)" >> calls
case "$*" in *--jobs-file*)
    for _ in $(seq 50); do [ "$(jobs)" = 2 ] && break; sleep 0.1; done ;;
esac
echo "lean end=$(jobs)" >> calls
echo "lean-build: ok"
exit {lean_rc}""",
        # pytest beside a build (the whole run) returns once the build has started
        ".venv/bin/python": f"""if [ -f out/lean_build.jobs ]; then
    for _ in $(seq 50); do grep -q '^lean' calls 2>/dev/null && break; sleep 0.1; done
fi
echo "python $*" >> calls
codes=({pytest_rc}); n=$(grep -c '^python' calls)
exit "${{codes[$((n - 1))]:-0}}" """,
        ".venv/bin/mypy": f'echo mypy >> calls; exit {mypy_rc}',
        ".venv/bin/pyright": "echo pyright >> calls; exit 0",
    }
    for rel, body in stubs.items():
        path = root / rel
        path.write_text("#!/usr/bin/env bash\n" + body + "\n", encoding="utf-8")
        path.chmod(0o755)
    return root


def _run(root: Path, *args: str) -> tuple[int, list[str], str]:
    proc = subprocess.run(["bash", "scripts/test.sh", *args], cwd=root, capture_output=True,
                          text=True, timeout=60, check=False)
    calls = (root / "calls").read_text(encoding="utf-8").splitlines()
    return proc.returncode, calls, proc.stdout + proc.stderr


def test_the_whole_run_orders_its_parts(tmp_path: Path) -> None:
    rc, calls, out = _run(_scratch(tmp_path), "-x")
    assert rc == 0 and out.rstrip().endswith("test.sh: ok"), out
    lean = [c for c in calls if c.startswith("lean")]
    assert lean == ["lean --jobs 2 --jobs-file out/lean_build.jobs start=1", "lean end=2"]
    rest = [c for c in calls if not c.startswith("lean")]
    assert rest == ["python -m pytest -m not lean -x", "python -m pytest -m lean -x", "mypy",
                    "pyright"]


def test_the_part_beside_pytest_runs_alone(tmp_path: Path) -> None:
    rc, calls, out = _run(_scratch(tmp_path), "--lean-and-checkers", "-k", "formal")
    assert rc == 0 and out.rstrip().endswith("test.sh --lean-and-checkers: ok"), out
    assert calls == ["lean --jobs 2 start=none", "lean end=none",
                     "python -m pytest -m lean -k formal", "mypy", "pyright"]


def test_a_part_beside_pytest_that_leaves_no_result_fails_the_run(tmp_path: Path) -> None:
    root = _scratch(tmp_path)
    (root / ".venv" / "bin" / "mypy").write_text("#!/usr/bin/env bash\nkill -9 $PPID\n",
                                                  encoding="utf-8")
    rc, _, out = _run(root)
    assert rc == 1
    assert "no result" in out.splitlines()[-1], out


def test_every_part_runs_and_each_failure_is_named(tmp_path: Path) -> None:
    rc, calls, out = _run(_scratch(tmp_path, pytest_rc="1 0", mypy_rc=1))
    assert rc == 1 and "python -m pytest -m lean" in calls and "pyright" in calls
    assert "test.sh: FAILED: pytest (not lean); mypy" in out
    # 5: nothing collected (the arguments selected only the other part's tests) is no failure
    rc, _, out = _run(_scratch(tmp_path / "5", pytest_rc="5 0"))
    assert rc == 0, out


def test_a_failed_lean_build_shows_its_log_and_skips_its_tests(tmp_path: Path) -> None:
    rc, calls, out = _run(_scratch(tmp_path, lean_rc=1))
    assert rc == 1 and "lean-build: ok" in out  # the log, shown
    assert "python -m pytest -m lean" not in calls
    assert out.rstrip().endswith("test.sh: FAILED: Lean build; pytest (lean: not run, the Lean "
                                 "build failed)")


def test_the_quick_run_has_no_lean(tmp_path: Path) -> None:
    rc, calls, out = _run(_scratch(tmp_path), "--quick", "-k", "ledger")
    assert rc == 0, out
    assert not any(c.startswith("lean") for c in calls)
    # the checkers run beside pytest: their lines may come first
    assert sorted(calls) == ["mypy", "pyright",
                             "python -m pytest -m not lean and not slow and not engine -k ledger"]
