"""A user's own Lake project: built and exported by the same driver, then citable.

A team that proves its own bridge in Lean runs ``scripts/lean_driver.py --project DIR
--namespace NS`` on its Lake project, registers the export, and cites the theorem; a name the
build did not export stays refused. This runs the real (WebAssembly) Lean on a small project.
"""

from __future__ import annotations

import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest

from witcert_calculus import AtConsume, AttentionTV, Claim, LogitLinf, Schema, Tier
from witcert_calculus.lean import theorems
from witcert_calculus.errors import UnknownTheoremError

# Reads the Lean build's outputs: scripts/test.sh runs this file after the build (marker `lean`).
pytestmark = pytest.mark.lean

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "lean"

LAKEFILE = 'name = "mybridges"\nversion = "0.1.0"\ndefaultTargets = ["MyBridges"]\n\n' \
           '[[lean_lib]]\nname = "MyBridges"\n'
SOURCE = """module

/-! A user's bridge, proved in their own Lake project. -/

public section

namespace MyBridges

namespace Selection

/-- Keeping every entry changes nothing: the kept mass bounds the error. -/
theorem keep_all_sound (m e : Nat) (h : e ≤ m) : e ≤ m + 0 := by
  simpa using h

private theorem helper (n : Nat) : n ≤ n := Nat.le_refl n

end Selection

end MyBridges

end
"""

@pytest.mark.slow
def test_a_user_lake_project_is_exported_and_its_theorem_cited(tmp_path: Path) -> None:
    if not (CACHE / "lib" / "Init.olean").exists():
        pytest.fail("the Lean toolchain is missing: run scripts/lean_build.sh first")
    project = tmp_path / "mybridges"
    (project / "MyBridges").mkdir(parents=True)
    (project / "lakefile.toml").write_text(LAKEFILE, encoding="utf-8")
    (project / "MyBridges" / "Selection.lean").write_text(SOURCE, encoding="utf-8")
    name = "MyBridges.Selection.keep_all_sound"
    with pytest.raises(UnknownTheoremError, match=name):
        Schema(name, LogitLinf, AttentionTV, (), lambda: Claim(a=1, b=0), name="keep all")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "lean_driver.py"), "--root",
                           str(ROOT), "--cache", str(CACHE), "--project", str(project),
                           "--namespace", "MyBridges", "--jobs", "2"],
                          capture_output=True, text=True, check=False, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    export = project / "build" / "theorems.json"
    records = theorems.register_theorems(export)
    assert [r.name for r in records] == [name]  # the private helper is not exported
    rec = theorems.lookup(name)
    assert rec.module == "MyBridges.Selection" and "e ≤ m + 0" in rec.statement
    assert rec.origin == str(export.resolve())
    c = Schema(name, LogitLinf, AttentionTV, (), lambda: Claim(a=1, b=Fraction(0)),
               states=("e ≤ m + 0",), name="keep all").issue(AtConsume)
    assert c.tier is Tier.CERTIFIED and str(export.resolve()) in c.explain()
    with pytest.raises(UnknownTheoremError):
        Schema("MyBridges.Selection.helper", LogitLinf, AttentionTV, (),
               lambda: Claim(a=1, b=0), name="x")
