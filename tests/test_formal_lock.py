"""The statement lock: Lean's exported statements, the registry and the committed lock agree.

``formal/statements.lock.json`` holds every exported theorem's elaborated statement. These
tests fail when the shipped export (``witcert_calculus/lean/lean_export.json``), the build's
export (``formal/build/theorems.json``) or the registry differs from it; the message names
what changed, appeared or disappeared and how to update the lock deliberately
(``python scripts/statement_lock.py --update``).
"""

from __future__ import annotations

import importlib
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from witcert_calculus.lean import theorems

# Reads the Lean build's outputs: scripts/test.sh runs this file after the build (marker `lean`).
pytestmark = pytest.mark.lean

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
statement_lock: Any = importlib.import_module("statement_lock")
lean_driver: Any = importlib.import_module("lean_driver")

LOCK = ROOT / statement_lock.LOCK
SHIPPED = ROOT / statement_lock.SHIPPED
BUILD_EXPORT = ROOT / "formal" / "build" / "theorems.json"


@pytest.fixture(scope="module")
def lock() -> dict[str, str]:
    assert LOCK.exists(), f"{LOCK} is missing: {statement_lock.UPDATE_HINT}"
    locked: dict[str, str] = statement_lock.load_lock(LOCK)
    return locked


def _assert_matches(lock: dict[str, str], export: dict[str, str], where: str) -> None:
    message = statement_lock.diff_message(lock, export, where)
    assert message is None, message


def test_the_lock_is_canonical(lock: dict[str, str]) -> None:
    assert len(lock) >= 100
    assert LOCK.read_text(encoding="utf-8") == statement_lock.render_lock(lock), (
        "formal/statements.lock.json is not in canonical form: "
        "run python scripts/statement_lock.py --update")
    assert all(n.startswith("WitCert.") and s.strip() for n, s in lock.items())


def test_the_shipped_export_matches_the_lock(lock: dict[str, str]) -> None:
    _assert_matches(lock, statement_lock.load_export(SHIPPED), str(SHIPPED))


def test_the_build_export_matches_the_lock(lock: dict[str, str]) -> None:
    if not BUILD_EXPORT.exists():
        pytest.fail(f"{BUILD_EXPORT} is missing: run scripts/lean_build.sh before the tests")
    _assert_matches(lock, statement_lock.load_export(BUILD_EXPORT), str(BUILD_EXPORT))


def test_the_registry_shows_each_cited_statement_as_locked(lock: dict[str, str]) -> None:
    cited = theorems.cited_theorems()
    constants = {getattr(theorems, n) for n in theorems.__all__
                 if n.isupper() and n != "BUILTIN_ORIGIN"}
    assert set(cited) == constants
    for name, rec in cited.items():
        assert name in lock, f"{name} is cited by Python but not in the lock"
        assert rec.statement == lock[name] == theorems.lookup(name).statement, (
            f"{name}: the registry shows\n  {rec.statement}\nthe lock holds\n  {lock[name]}")
    builtin = {n: r.statement for n, r in theorems.registered_theorems().items()
               if r.origin == theorems.BUILTIN_ORIGIN}
    _assert_matches(lock, builtin, "the registry (witcert_calculus.lean.theorems)")


def test_a_report_names_changed_appeared_and_disappeared_statements() -> None:
    lock = {"WitCert.A.kept": "True", "WitCert.A.weakened": "∀ (x : Nat), x ≤ x + 1",
            "WitCert.A.gone": "1 = 1"}
    export = {"WitCert.A.kept": "True", "WitCert.A.weakened": "True", "WitCert.A.new": "2 = 2"}
    message = statement_lock.diff_message(lock, export, "the export")
    assert message is not None
    assert "1 changed, 1 appeared, 1 disappeared" in message
    assert "changed: WitCert.A.weakened" in message
    assert "lock:   ∀ (x : Nat), x ≤ x + 1" in message and "export: True" in message
    assert "appeared: WitCert.A.new : 2 = 2" in message
    assert "disappeared: WitCert.A.gone : 1 = 1" in message
    assert "WitCert.A.kept" not in message
    assert "scripts/statement_lock.py --update" in message
    assert statement_lock.diff_message(lock, dict(lock), "the export") is None


def _scratch_root(tmp_path: Path) -> Path:
    (tmp_path / "formal").mkdir()
    (tmp_path / "witcert_calculus" / "lean").mkdir(parents=True)
    shutil.copy2(LOCK, tmp_path / statement_lock.LOCK)
    shutil.copy2(SHIPPED, tmp_path / statement_lock.SHIPPED)
    return tmp_path


def test_a_weakened_statement_fails_the_check_until_the_lock_is_updated(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _scratch_root(tmp_path)
    export_path = root / statement_lock.SHIPPED
    doc = json.loads(export_path.read_text(encoding="utf-8"))
    target = doc["theorems"][0]
    target["statement"] = "True"
    doc["theorems"].append({"name": "WitCert.New.fresh", "module": "WitCert.New",
                            "statement": "1 = 1"})
    gone = doc["theorems"].pop(1)["name"]
    export_path.write_text(json.dumps(doc), encoding="utf-8")
    assert statement_lock.main(["--root", str(root)]) == 1
    err = capsys.readouterr().err
    assert f"changed: {target['name']}" in err
    assert "appeared: WitCert.New.fresh" in err and f"disappeared: {gone}" in err
    assert "--update" in err
    # The deliberate update, then the check passes.
    assert statement_lock.main(["--root", str(root), "--update"]) == 0
    assert "1 changed, 1 added, 1 removed" in capsys.readouterr().out
    assert statement_lock.main(["--root", str(root)]) == 0
    assert statement_lock.load_lock(root / statement_lock.LOCK)[target["name"]] == "True"


def test_a_missing_lock_fails_the_check(tmp_path: Path) -> None:
    root = _scratch_root(tmp_path)
    (root / statement_lock.LOCK).unlink()
    assert statement_lock.main(["--root", str(root)]) == 1


def test_the_lock_covers_every_exported_theorem_of_the_build(lock: dict[str, str]) -> None:
    """The lock holds exactly the names the exporter wrote (the shipped export's too)."""
    shipped = json.loads(SHIPPED.read_text(encoding="utf-8"))
    assert sorted(lock) == sorted(t["name"] for t in shipped["theorems"])
    assert lean_driver.SHIPPED == statement_lock.SHIPPED
