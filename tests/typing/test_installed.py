"""Types from a user's own repository: mypy and pyright see the installed package.

A user's CI type-checks their code against an installed witcert-calculus, not against this
repository. The wheel is built, installed into a fresh virtual environment, and both
checkers run from a folder outside the repository over a correct chain (no error) and a
wrong one (the pinned errors). The README set-up's own install is checked the same way.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SNIPPETS = Path(__file__).resolve().parent / "snippets"
BIN = Path(sys.executable).parent
EXPECT = re.compile(r"#\s*expect-(mypy|pyright):\s*(.*?)\s*(?=#\s*expect-|$)")
GOOD, BAD = "good_chain.py", "ill_wrong_metric.py"


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MYPYPATH")}
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env, check=False,
                          timeout=900)


def _user_repo(tmp: Path) -> Path:
    repo = tmp / "user-repo"
    repo.mkdir()
    for name in (GOOD, BAD):
        shutil.copy(SNIPPETS / name, repo / name)
    (repo / "pyrightconfig.json").write_text(json.dumps(
        {"typeCheckingMode": "strict", "pythonVersion": "3.11"}), encoding="utf-8")
    assert ROOT not in repo.parents
    return repo


def _mypy(python: Path, repo: Path, name: str) -> list[tuple[int, str]]:
    proc = _run([str(BIN / "mypy"), "--strict", "--no-incremental", "--python-executable",
                 str(python), "--no-pretty", name], repo)
    if "Cannot find implementation or library stub" in proc.stdout:
        raise AssertionError(f"mypy does not see the installed package:\n{proc.stdout}")
    return [(int(m.group(1)), m.group(2)) for m in
            re.finditer(rf"^{re.escape(name)}:(\d+): error: (.*)$", proc.stdout, re.MULTILINE)]


def _pyright(python: Path, repo: Path, name: str) -> list[tuple[int, str]]:
    proc = _run([str(BIN / "pyright"), "--outputjson", "--pythonpath", str(python), name], repo)
    report = json.loads(proc.stdout)
    found = [(d["range"]["start"]["line"] + 1, d["message"])
             for d in report["generalDiagnostics"] if d["severity"] == "error"]
    missing = [m for _, m in found if "could not be resolved" in m]
    assert not missing, f"pyright does not see the installed package: {missing}"
    return found


def _check(python: Path, repo: Path) -> None:
    for checker, run in (("mypy", _mypy), ("pyright", _pyright)):
        assert run(python, repo, GOOD) == [], f"{checker} rejects a correct chain"
        got = run(python, repo, BAD)
        lines = (repo / BAD).read_text(encoding="utf-8").splitlines()
        want = {no: [t for who, t in EXPECT.findall(line) if who == checker]
                for no, line in enumerate(lines, 1)}
        want = {k: v for k, v in want.items() if v}
        assert want, BAD
        assert {no for no, _ in got} == set(want), f"{checker}: {got}"
        for no, parts in want.items():
            text = " | ".join(m for n, m in got if n == no)
            for part in parts:
                assert part in text, f"{checker} line {no}: wanted {part!r}, got {text!r}"


@pytest.mark.slow
def test_types_from_a_wheel_in_a_fresh_environment(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w",
                  str(wheels), str(ROOT)], tmp_path)
    assert built.returncode == 0, built.stderr[-3000:]
    wheel = next(wheels.glob("witcert_calculus-*.whl"))
    venv = tmp_path / "venv"
    assert _run([sys.executable, "-m", "venv", str(venv)], tmp_path).returncode == 0
    python = venv / "bin" / "python"
    installed = _run([str(python), "-m", "pip", "install", "--quiet", str(wheel)], tmp_path)
    assert installed.returncode == 0, installed.stderr[-3000:]
    where = _run([str(python), "-c", "import witcert_calculus; print(witcert_calculus.__file__)"],
                 tmp_path)
    assert str(venv) in where.stdout, where
    _check(python, _user_repo(tmp_path))


@pytest.mark.slow
def test_types_from_the_readme_set_up(tmp_path: Path) -> None:
    # The environment scripts/setup.sh made: an editable install both checkers can read.
    _check(ROOT / ".venv" / "bin" / "python", _user_repo(tmp_path))
