"""What the type checkers say: real mypy and pyright runs over real snippets.

Each ``ill_*.py`` snippet marks the lines that must be rejected with
``# expect-mypy: <message part>`` and ``# expect-pyright: <message part>``; every
error must be expected and every expectation met, for both checkers. ``good_*.py``
snippets must type-check cleanly, with ``assert_type`` pinning inferred types.
mypy runs ``--strict`` plus ``disallow_any_expr`` and the ``deprecated`` error code for the
snippets (user code), so
a stage whose metric degraded to ``Any`` (a metric class used without its site)
is an error; pyright's strict mode rejects it through the site's default ``Never``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SNIPPETS = Path(__file__).resolve().parent / "snippets"
BIN = Path(sys.executable).parent
EXPECT = re.compile(r"#\s*expect-(mypy|pyright):\s*(.*?)\s*(?=#\s*expect-|$)")


def expectations(checker: str) -> dict[tuple[str, int], list[str]]:
    out: dict[tuple[str, int], list[str]] = defaultdict(list)
    for path in sorted(SNIPPETS.glob("*.py")):
        for no, line in enumerate(path.read_text().splitlines(), 1):
            for who, text in EXPECT.findall(line):
                if who == checker:
                    out[(path.name, no)].append(text)
    return out


@pytest.fixture(scope="module")
def mypy_errors(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, int], list[str]]:
    cfg = tmp_path_factory.mktemp("mypy") / "mypy.ini"
    cfg.write_text(
        f"[mypy]\nstrict = True\nmypy_path = {ROOT}:{ROOT / 'kernels'}:{ROOT / 'adapters'}\n"
        "namespace_packages = True\n"
        "explicit_package_bases = True\n\n"
        "[mypy-mpmath.*,sympy.*]\nignore_missing_imports = True\n\n"
        "[mypy-snippets.*]\ndisallow_any_expr = True\nenable_error_code = deprecated\n")
    files = [str(p.relative_to(SNIPPETS.parent)) for p in sorted(SNIPPETS.glob("*.py"))]
    proc = subprocess.run([str(BIN / "mypy"), "--config-file", str(cfg), "--no-incremental",
                           "--show-error-codes", "--no-pretty", *files], cwd=SNIPPETS.parent,
                          capture_output=True, text=True, env={"MYPYPATH": str(ROOT),
                                                                "PATH": str(BIN)}, check=False)
    errors: dict[tuple[str, int], list[str]] = defaultdict(list)
    for line in proc.stdout.splitlines():
        m = re.match(r"(?:snippets/)?([\w.]+\.py):(\d+): error: (.*)$", line)
        if m:
            errors[(m.group(1), int(m.group(2)))].append(m.group(3))
        elif ": error:" in line:
            raise AssertionError(f"mypy error outside the snippets: {line}")
    return errors


@pytest.fixture(scope="module")
def pyright_errors() -> dict[tuple[str, int], list[str]]:
    proc = subprocess.run([str(BIN / "pyright"), "--outputjson", str(SNIPPETS)], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    report = json.loads(proc.stdout)
    errors: dict[tuple[str, int], list[str]] = defaultdict(list)
    for d in report["generalDiagnostics"]:
        if d["severity"] == "error":
            errors[(Path(d["file"]).name, d["range"]["start"]["line"] + 1)].append(d["message"])
    return errors


@pytest.mark.parametrize("checker", ["mypy", "pyright"])
def test_checker_rejects_exactly_the_expected_lines(
        checker: str, mypy_errors: dict[tuple[str, int], list[str]],
        pyright_errors: dict[tuple[str, int], list[str]]) -> None:
    got = mypy_errors if checker == "mypy" else pyright_errors
    want = expectations(checker)
    unexpected = {k: v for k, v in got.items() if k not in want}
    assert not unexpected, f"{checker} reported unexpected errors: {unexpected}"
    for key, parts in want.items():
        messages = " | ".join(got.get(key, []))
        for part in parts:
            assert part in messages, f"{checker} at {key}: wanted {part!r}, got {messages!r}"


def test_every_ill_typed_snippet_has_expectations_for_both_checkers() -> None:
    for path in sorted(SNIPPETS.glob("ill_*.py")):
        text = path.read_text()
        assert "# expect-mypy:" in text and "# expect-pyright:" in text, path.name
    assert any(SNIPPETS.glob("good_*.py"))
