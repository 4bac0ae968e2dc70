"""What the type checkers say: real mypy and pyright runs over real snippets.

Each ``ill_*.py`` snippet marks the lines that must be rejected with
``# expect-mypy: <message part>`` and ``# expect-pyright: <message part>``; every
error must be expected and every expectation met, for both checkers. ``good_*.py``
snippets must type-check cleanly, with ``assert_type`` pinning inferred types.
mypy runs ``--strict`` plus ``disallow_any_expr`` and the ``deprecated`` error code for the
snippets (user code), so
a stage whose metric degraded to ``Any`` (a metric class used without its site)
is an error; pyright's strict mode rejects it through the site's default ``Never``.
An expected mypy text may be found in the error or in the notes mypy prints with it (the
overload variants), but a line must carry an error.

The chain snippets (:data:`DEFAULTS`) are also checked as a user's CI checks them:
``mypy --strict`` and plain ``pyright``, each in its default settings (no configuration
file anywhere above the folder they run in), where an ill-typed or over-long ``chain()``
must still be an error, the over-long one with a message that says how to nest.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SNIPPETS = Path(__file__).resolve().parent / "snippets"
BIN = Path(sys.executable).parent
EXPECT = re.compile(r"#\s*expect-(mypy|pyright):\s*(.*?)\s*(?=#\s*expect-|$)")
DEFAULTS = ("good_chain.py", "good_long_chain_nested.py", "ill_long_chain.py",
            "ill_long_chain_wrong_metric.py", "ill_wrong_metric.py", "ill_wrong_site.py")
MYPY_LINE = re.compile(r"(?:snippets/)?([\w.]+\.py):(\d+): (error|note): (.*)$")


def expectations(checker: str, names: tuple[str, ...] | None = None
                 ) -> dict[tuple[str, int], list[str]]:
    out: dict[tuple[str, int], list[str]] = defaultdict(list)
    for path in sorted(SNIPPETS.glob("*.py")):
        if names is not None and path.name not in names:
            continue
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
    return _mypy_report(proc.stdout, strict_outside=True)


def _mypy_report(stdout: str, *, strict_outside: bool) -> dict[tuple[str, int], list[str]]:
    # Errors keyed by line; the notes of a line that has an error are appended after them.
    errors: dict[tuple[str, int], list[str]] = defaultdict(list)
    notes: dict[tuple[str, int], list[str]] = defaultdict(list)
    for line in stdout.splitlines():
        m = MYPY_LINE.match(line)
        if m:
            (errors if m.group(3) == "error" else notes)[(m.group(1), int(m.group(2)))].append(
                m.group(4))
        elif ": error:" in line and strict_outside:
            raise AssertionError(f"mypy error outside the snippets: {line}")
    for key in errors:
        errors[key].extend(notes.get(key, []))
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


def _user_folder(tmp: Path) -> Path:
    # A folder with no configuration file above it; the package sits beside the snippets as
    # a user's own checkout would put it on the path.
    folder = tmp / "user"
    folder.mkdir()
    for name in DEFAULTS:
        shutil.copy(SNIPPETS / name, folder / name)
    (folder / "witcert_calculus").symlink_to(ROOT / "witcert_calculus")
    for parent in folder.parents:
        for cfg in ("mypy.ini", ".mypy.ini", "pyproject.toml", "setup.cfg",
                    "pyrightconfig.json"):
            assert not (parent / cfg).exists(), parent / cfg
    return folder


def _default_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "MYPYPATH", "MYPY_CONFIG_FILE_DIR")}
    env["HOME"] = str(home)
    env["XDG_CONFIG_HOME"] = str(home / ".config")
    return env


@pytest.mark.parametrize("checker", ["mypy", "pyright"])
def test_over_long_chain_is_an_error_in_default_settings(checker: str, tmp_path: Path) -> None:
    folder = _user_folder(tmp_path)
    env = _default_env(tmp_path)
    if checker == "mypy":
        proc = subprocess.run([str(BIN / "mypy"), "--strict", "--config-file=", "--no-incremental",
                               "--show-error-codes", "--no-pretty", *DEFAULTS], cwd=folder,
                              capture_output=True, text=True, env=env, check=False)
        assert "Cannot find implementation" not in proc.stdout, proc.stdout
        got = {k: v for k, v in _mypy_report(proc.stdout, strict_outside=False).items()
               if k[0] in DEFAULTS}
    else:
        proc = subprocess.run([str(BIN / "pyright"), "--outputjson", *DEFAULTS], cwd=folder,
                              capture_output=True, text=True, env=env, check=False)
        report = json.loads(proc.stdout)
        got = defaultdict(list)
        for d in report["generalDiagnostics"]:
            if d["severity"] == "error":
                got[(Path(d["file"]).name, d["range"]["start"]["line"] + 1)].append(d["message"])
        assert not any("could not be resolved" in m for v in got.values() for m in v), got
    want = expectations(checker, DEFAULTS)
    assert set(got) == set(want), f"{checker} with default settings: {dict(got)}"
    for key, parts in want.items():
        messages = " | ".join(got[key])
        for part in parts:
            assert part in messages, f"{checker} at {key}: wanted {part!r}, got {messages!r}"


def test_every_ill_typed_snippet_has_expectations_for_both_checkers() -> None:
    for path in sorted(SNIPPETS.glob("ill_*.py")):
        text = path.read_text()
        assert "# expect-mypy:" in text and "# expect-pyright:" in text, path.name
    assert any(SNIPPETS.glob("good_*.py"))
