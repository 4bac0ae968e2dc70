"""The source audit of ``formal/`` (``scripts/lean_audit.py``) and the theorem cross-check.

Each banned construct is planted in a scratch copy of ``formal/`` and must fail the audit with a
message naming the construct and ``file:line``; the real tree must pass, fast and without Lean.
Theorem discovery must survive sections, nested namespaces and modifiers, and must agree with
what Lean itself exported and compiled.
"""

from __future__ import annotations

import importlib
import json
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Reads the Lean build's outputs: scripts/test.sh runs this file after the build (marker `lean`).
pytestmark = pytest.mark.lean

ROOT = Path(__file__).resolve().parents[1]
FORMAL = ROOT / "formal"
BUILD = FORMAL / "build"
sys.path.insert(0, str(ROOT / "scripts"))
lean_audit: Any = importlib.import_module("lean_audit")
lean_driver: Any = importlib.import_module("lean_driver")

PLANT_IN = Path("WitCert") / "Tiers.lean"


def _scratch(tmp_path: Path) -> Path:
    """A copy of formal/'s sources (no build outputs)."""
    copy = tmp_path / "formal"
    shutil.copytree(FORMAL, copy, ignore=shutil.ignore_patterns("build", ".lake"))
    return copy


def _plant(formal: Path, snippet: str, where: Path = PLANT_IN) -> tuple[Path, int]:
    """Append the snippet to a file of the copy; return the file and the snippet's first line."""
    f = formal / where
    text = f.read_text(encoding="utf-8")
    if not text.endswith("\n"):
        text += "\n"
    line = text.count("\n") + 2
    f.write_text(text + "\n" + snippet + "\n", encoding="utf-8")
    return f, line


# ----------------------------------------------------------------------------- the real tree


def test_the_real_tree_passes_fast_without_lean() -> None:
    t0 = time.monotonic()
    assert lean_audit.audit_tree(FORMAL) == []
    assert lean_audit.main(["--no-crosscheck"]) == 0
    assert lean_audit.main([]) == 0  # with the cross-checks against the exports and .olean files
    assert time.monotonic() - t0 < 10


def test_the_real_tree_uses_what_stays_allowed() -> None:
    """The audit must not ban what the development uses: golden tests and kernel decisions."""
    code = {f.name: lean_audit.strip_comments(f.read_text(encoding="utf-8"))
            for f in lean_audit.lean_files(FORMAL)}
    assert "#guard_msgs" in code["Contracts.lean"]
    assert "decide +kernel" in code["GeneratedChecks.lean"]
    assert "import Lean" in code["AxiomAudit.lean"]  # the official-toolchain audit program


def test_the_build_and_the_driver_call_the_audit() -> None:
    assert lean_driver.audit_sources is lean_audit.audit_sources
    assert lean_driver.declared_theorems is lean_audit.declared_theorems
    assert "lean_driver.py" in (ROOT / "scripts" / "lean_build.sh").read_text(encoding="utf-8")


# ----------------------------------------------------------------------------- planted constructs

PLANTED = [
    ("theorem planted : 1 = 2 := sorry", "sorry"),
    ("theorem planted : 1 = 2 := sorryAx _ false", "sorryAx"),
    ("theorem planted : 1 = 2 := by admit", "admit"),
    ("axiom planted : False", "axiom"),
    ("@[simp] private axiom planted : False", "axiom"),
    ("theorem planted : 10 < 11 := by native_decide", "native_decide"),
    ("theorem planted : 10 < 11 := by decide +native", "decide +native"),
    ("theorem planted : 10 < 11 := Lean.ofReduceBool _ _ rfl", "ofReduceBool"),
    ("theorem planted : 10 < 11 := Lean.ofReduceNat _ _ rfl", "ofReduceNat"),
    ("theorem planted : True := Lean.trustCompiler ▸ trivial", "trustCompiler"),
    ("@[implemented_by id] def planted (n : Nat) : Nat := n", "implemented_by"),
    ("@[extern \"planted\"] def planted (n : Nat) : Nat := n", "extern"),
    ("unsafe def planted : Nat := 0", "unsafe"),
    ("opaque planted : Nat", "opaque"),
    ("set_option debug.skipKernelTC true in\ntheorem planted : 1 = 2 := rfl",
     "set_option debug.*"),
    ("set_option debug.skipKernelTC true", "debug.skipKernelTC"),
    ("set_option allowUnsafeReducibility true", "allowUnsafeReducibility"),
    ("#exit", "#exit"),
    ("#eval (pure () : IO Unit)", "#eval"),
    ("run_cmd pure ()", "run_cmd"),
    ("run_elab pure ()", "run_elab"),
    ("run_meta pure ()", "run_meta"),
    ("elab \"planted\" : command => pure ()", "elab"),
    ("elab_rules : command | `(planted) => pure ()", "elab_rules"),
    ("macro \"planted\" : command => `(theorem hidden : True := trivial)", "macro"),
    ("macro_rules | `(planted) => `(theorem hidden : True := trivial)", "macro_rules"),
    ("syntax \"planted\" : command", "syntax"),
    ("declare_syntax_cat planted", "declare_syntax_cat"),
    ("initialize planted : IO.Ref Nat ← IO.mkRef 0", "initialize"),
    ("meta def planted : Nat := 0", "meta"),
    ("def planted := Lean.addDecl", "addDecl"),
    ("def planted := Lean.addAndCompile", "addAndCompile"),
    ("def planted := Lean.modifyEnv", "modifyEnv"),
    ("def planted := Lean.setEnv", "setEnv"),
    ("open Lean.Elab.Command in\ndef planted := 0", "Lean.Elab"),
    ("def planted : CommandElabM Unit := pure ()", "CommandElabM"),
    ("import Lean", "import Lean"),
    ("notation:50 a \" ≤ \" b => WitCert.Probe.always a b", "notation"),
    ("local infixl:65 \" + \" => WitCert.Probe.always", "infix/prefix/postfix"),
    ("scoped prefix:max \"√\" => Nat.sqrt", "infix/prefix/postfix"),
    ("postfix:max \"!\" => Nat.factorial", "infix/prefix/postfix"),
    ("infixr:30 \" ∧ \" => Or", "infix/prefix/postfix"),
    ("instance (priority := high) : LE Rat := ⟨fun _ _ => True⟩", "instance on a core type"),
    ("@[simp] instance plantedCoe : Coe Bool Nat := ⟨fun b => if b then 1 else 0⟩",
     "instance on a core type"),
]


def test_every_rule_is_planted() -> None:
    assert {c for _, c in PLANTED} >= {r.construct for r in lean_audit.RULES}


@pytest.mark.parametrize(("snippet", "construct"), PLANTED, ids=[c for _, c in PLANTED])
def test_each_planted_construct_fails_the_audit_by_name_and_line(
        tmp_path: Path, snippet: str, construct: str) -> None:
    formal = _scratch(tmp_path)
    assert lean_audit.audit_tree(formal) == [], "the scratch copy must pass before planting"
    f, line = _plant(formal, snippet)
    problems = lean_audit.audit_tree(formal)
    assert problems, f"`{construct}` was not caught"
    wanted = f"{f}:{line}: forbidden `{construct}`"
    assert any(p.startswith(wanted) for p in problems), (wanted, problems)
    # The command line reports it too, and the build refuses to start (no Lean is run).
    assert lean_audit.main(["--formal", str(formal), "--no-crosscheck"]) == 1
    code = lean_driver.main(["--root", str(tmp_path), "--cache", str(tmp_path / "no-cache")])
    assert code == 1


# Ways to hide a keyword from a line-start rule or from the string stripper: (snippet, construct,
# the line of the snippet the construct is on).
EVASIONS = [
    ("open Nat in axiom planted : False", "axiom", 0),
    ("set_option pp.all true in axiom planted : False", "axiom", 0),
    ("def plantedOne := 1 axiom planted : False", "axiom", 0),
    ("def plantedRaw := r\"\\\"\naxiom planted : False", "axiom", 1),
    ("def plantedRaw := r#\"x\"#\naxiom planted : False", "axiom", 1),
    ("open Nat in initialize planted : IO.Ref Nat ← IO.mkRef 0", "initialize", 0),
    ("def plantedOne := 1 meta def planted : Nat := 0", "meta", 0),
    ("open Nat in notation:50 a \" ≤ \" b => WitCert.Probe.always a b", "notation", 0),
    ("def plantedOne := 1 infix:50 \" ≤ \" => WitCert.Probe.always", "infix/prefix/postfix",
     0),
]


@pytest.mark.parametrize(("snippet", "construct", "offset"), EVASIONS,
                         ids=[s.split("\n")[0][:40] for s, _, _ in EVASIONS])
def test_each_evasion_is_caught_on_its_line(tmp_path: Path, snippet: str, construct: str,
                                            offset: int) -> None:
    formal = _scratch(tmp_path)
    f, line = _plant(formal, snippet)
    wanted = f"{f}:{line + offset}: forbidden `{construct}`"
    assert any(p.startswith(wanted) for p in lean_audit.audit_tree(formal)), wanted


def test_a_raw_string_hides_nothing_after_it_and_its_words_pass() -> None:
    code = lean_audit.strip_comments('def a := r"\\"\naxiom x\ndef b := r##"a "# axiom"##\n')
    assert code == 'def a := ""\naxiom x\ndef b := ""\n'


@pytest.mark.parametrize(("snippet", "construct"), [
    ("def planted := Lean.addDecl", "addDecl"),
    ("#eval planted", "#eval"),
    ("import Lean.Elab.Command", "import Lean.Elab.Command"),
])
def test_the_audit_program_may_import_lean_but_nothing_else(
        tmp_path: Path, snippet: str, construct: str) -> None:
    formal = _scratch(tmp_path)
    f, line = _plant(formal, snippet, Path("AxiomAudit.lean"))
    problems = lean_audit.audit_tree(formal)
    assert any(p.startswith(f"{f}:{line}: forbidden `{construct}`") for p in problems), problems
    assert not any("`import Lean`" in p for p in problems)


def test_allowed_constructs_and_words_in_comments_and_strings_pass(tmp_path: Path) -> None:
    formal = _scratch(tmp_path)
    _plant(formal, "\n".join([
        "/-- error: unknown identifier 'sorry' -/",
        "#guard_msgs in",
        "#check (1 : Nat)",
        "#print WitCert.Tier",
        "example : 10 < 11 := by decide +kernel",
        "/-! a nested /- comment naming axiom, macro, #eval, unsafe, opaque -/ -/",
        "-- set_option debug.skipKernelTC true",
        "def plantedText := \"sorry, axiom, elab, syntax, import Lean, #exit\"",
        "def plantedChar := '\"'",
        "def plantedRaw := r#\"an \"axiom\" and #exit\"#",
        "def plantedPrime (opaque' elab' : Nat) : Nat := opaque' + elab'",
        "theorem planted_meta_name (h_syntax : True) : True := h_syntax",
        "theorem planted_words (notation_ infix' prefixed : Nat) : True := trivial",
        "open WitCert in",
        "theorem planted_open : True := trivial",
    ]))
    assert lean_audit.audit_tree(formal) == []


# ----------------------------------------------------------------------------- discovery


def test_discovery_handles_sections_namespaces_and_modifiers(tmp_path: Path) -> None:
    formal = tmp_path / "formal"
    (formal / "Proj").mkdir(parents=True)
    f = formal / "Proj" / "Deep.lean"
    f.write_text("\n".join([
        "module",
        "namespace Proj",
        "@[expose] public section",
        "theorem top : True := trivial",
        "noncomputable section",
        "namespace A.B",
        "@[simp] protected theorem deep : True := trivial",
        "@[simp] @[reducible] theorem two_attrs : True := trivial",
        "private theorem hidden : True := trivial",
        "open Nat in theorem opened : True := trivial",
        "set_option maxRecDepth 100 in",
        "theorem after_option : True := trivial",
        "theorem _root_.Elsewhere.rooted : True := trivial",
        "theorem _root_.Proj.rooted_back : True := trivial",
        "end A.B",
        "section Named",
        "nonrec theorem in_named : True := trivial",
        "end Named",
        "mutual",
        "theorem in_mutual : True := trivial",
        "end",
        "theorem «quoted name» : True := trivial",
        "end",
        "namespace C",
        "/- theorem commented : True := trivial -/",
        "def s := \"theorem in_string : True\"",
        "theorem after_string : True := trivial",
        "end C",
        "end",
        "theorem after_sections : True := trivial",
        "end Proj",
        "theorem Proj.dotted : True := trivial",
        "theorem outside : True := trivial",
        "",
    ]), encoding="utf-8")
    found = lean_audit.declared_theorems(formal, [f], "Proj")
    assert [n for n, _ in found] == [
        "Proj.top", "Proj.A.B.deep", "Proj.A.B.two_attrs", "Proj.A.B.opened",
        "Proj.A.B.after_option", "Proj.rooted_back", "Proj.in_named", "Proj.in_mutual",
        "Proj.«quoted name»", "Proj.C.after_string", "Proj.after_sections", "Proj.dotted"]
    assert {m for _, m in found} == {"Proj.Deep"}


def _current_build() -> bool:
    return bool(lean_audit.build_is_current(FORMAL))


def test_discovery_agrees_with_the_exports() -> None:
    """The regex's list is exactly the names in the shipped export and the build's export."""
    exports = [ROOT / "witcert_calculus" / "lean" / "lean_export.json", BUILD / "theorems.json"]
    if not exports[1].exists():
        pytest.fail(f"{exports[1]} is missing: run scripts/lean_build.sh before the tests")
    assert lean_audit.crosscheck(FORMAL, exports=exports) == []


def test_discovery_agrees_with_what_lean_compiled() -> None:
    """Lean's own list: the user-written theorems stored in the compiled .olean files."""
    if not _current_build():
        pytest.fail("formal/build is missing or stale: run scripts/lean_build.sh")
    assert lean_audit.crosscheck(FORMAL, olean_dir=BUILD / "olean") == []
    kinds = dict((n, k) for k, n in lean_audit.olean_constants(
        BUILD / "olean" / "WitCert" / "Tiers.olean"))
    assert kinds["WitCert.Tier.weakest_comm"] == "theorem"
    assert kinds["WitCert.Tier.weakest"] == "def"
    assert kinds["WitCert.Tier"] == "inductive"
    assert kinds["WitCert.Tier.decideTier.eq_1"] == "theorem"  # generated, set aside
    assert lean_audit.is_generated("WitCert.Tier.decideTier.eq_1")
    assert not lean_audit.is_generated("WitCert.Tier.weakest_comm")


def test_a_disagreement_is_reported_by_name(tmp_path: Path) -> None:
    shipped = json.loads((ROOT / "witcert_calculus" / "lean" / "lean_export.json").read_text("utf-8"))
    dropped = shipped["theorems"].pop()["name"]
    shipped["theorems"].append({"name": "WitCert.Ghost.made_by_a_macro", "module": "X",
                                "statement": "True"})
    fake = tmp_path / "export.json"
    fake.write_text(json.dumps(shipped), encoding="utf-8")
    problems = lean_audit.crosscheck(FORMAL, exports=[fake])
    text = "\n".join(problems)
    assert dropped in text and "not in " + str(fake) in text
    assert "WitCert.Ghost.made_by_a_macro" in text and "not found in the sources" in text


def test_a_theorem_hidden_from_the_regex_is_caught_by_lean(tmp_path: Path) -> None:
    """Drop one theorem from the discovered list: Lean's compiled list still holds it."""
    if not _current_build():
        pytest.fail("formal/build is missing or stale: run scripts/lean_build.sh")
    formal = _scratch(tmp_path)
    f = formal / PLANT_IN
    text = f.read_text(encoding="utf-8")
    hidden = re.sub(r"^theorem weakest_comm\b", "private theorem weakest_comm", text,
                    count=1, flags=re.MULTILINE)
    assert hidden != text
    f.write_text(hidden, encoding="utf-8")
    problems = lean_audit.crosscheck(formal, olean_dir=BUILD / "olean")
    assert any("WitCert.Tier.weakest_comm" in p and "not found in the sources" in p
               for p in problems), problems


# ------------------------------------------------------- the official-toolchain path's output


def _audit_rows(export: dict[str, Any]) -> list[dict[str, Any]]:
    """What ``lake exe axiom_audit`` prints for this tree: one row per theorem (statements at
    another line width), plus theorems Lean generates and the sources never declare."""
    rows = [{"name": t["name"], "statement": t["statement"].replace(", ", ",\n    ", 1),
             "axioms": t["axioms"][::-1], "axiom_audit": "collectAxioms"}
            for t in export["theorems"]]
    rows.append({"name": "WitCert.Constraint.mk.injEq", "statement": "∀ (coeff bound : Rat) ...",
                 "axioms": [], "axiom_audit": "collectAxioms"})
    return rows


@pytest.fixture(scope="module")
def wasm_export() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((BUILD / "theorems.json").read_text(encoding="utf-8"))
    return data


def test_the_audit_programs_output_converts_to_the_same_export(
        wasm_export: dict[str, Any]) -> None:
    doc, problems = lean_driver.export_from_audit(FORMAL, ROOT, _audit_rows(wasm_export),
                                                  toolchain="leanprover/lean4:v4.28.0")
    assert problems == []
    assert doc["axiom_audit"]["method"] == "collectAxioms"
    assert doc["sources"] == wasm_export["sources"]
    wasm = {t["name"]: (t["module"], t["statement"]) for t in wasm_export["theorems"]}
    official = {t["name"]: (t["module"], t["statement"]) for t in doc["theorems"]}
    assert official == wasm  # same names, modules, statements (whitespace normalized)
    # each row's axioms, sorted (the rows above carry the wasm build's, reversed)
    assert {t["name"]: t["axioms"] for t in doc["theorems"]} == {
        t["name"]: t["axioms"] for t in wasm_export["theorems"]}
    assert all(t["axiom_audit"] == "collectAxioms" for t in doc["theorems"])
    # The statement lock and the shipped export read it as they read the wasm build's.
    statement_lock: Any = importlib.import_module("statement_lock")
    lock = statement_lock.load_lock(ROOT / statement_lock.LOCK)
    assert statement_lock.diff_message(lock, statement_lock.statements_of(doc), "x") is None
    official_ship = json.loads(lean_driver.shipped_export(doc))
    wasm_ship = json.loads(lean_driver.shipped_export(wasm_export))
    assert {t.pop("axioms_scope") for t in official_ship["theorems"]} == {"complete"}
    assert {t.pop("axioms_scope") for t in wasm_ship["theorems"]} == {"project"}
    assert official_ship == wasm_ship


@pytest.mark.parametrize("fault, expected", [
    ("sorry", "depends on sorryAx"),
    ("axiom", "depends on WitCert.bad"),
    ("missing", "has no row"),
    ("malformed", "malformed audit row"),
])
def test_the_official_path_fails_on_a_bad_audit(wasm_export: dict[str, Any], fault: str,
                                                expected: str) -> None:
    rows = _audit_rows(wasm_export)
    victim = rows[3]
    if fault == "sorry":
        victim["axioms"] = ["propext", "sorryAx"]
    elif fault == "axiom":
        victim["axioms"] = ["WitCert.bad"]
    elif fault == "missing":
        rows.remove(victim)
    else:
        victim.pop("axioms")
    _, problems = lean_driver.export_from_audit(FORMAL, ROOT, rows, toolchain="t")
    assert expected in problems[0] and victim["name"] in problems[0], problems
    # A malformed row also leaves its theorem without a row; nothing else is reported.
    assert len(problems) == (2 if fault == "malformed" else 1), problems


def test_the_official_path_command_writes_the_export(tmp_path: Path,
                                                     wasm_export: dict[str, Any]) -> None:
    root = tmp_path / "repo"
    root.mkdir()
    shutil.copytree(FORMAL, root / "formal", ignore=shutil.ignore_patterns("build", ".lake"))
    audit = tmp_path / "axioms.json"
    audit.write_text(json.dumps(_audit_rows(wasm_export)), encoding="utf-8")
    assert lean_driver.main(["--root", str(root), "--from-audit", str(audit)]) == 0
    doc = json.loads((root / "formal" / "build" / "theorems.json").read_text(encoding="utf-8"))
    assert len(doc["theorems"]) == len(wasm_export["theorems"])
    assert doc["toolchain"] == "leanprover/lean4:v4.28.0"
    audit.write_text("[1]", encoding="utf-8")
    assert lean_driver.main(["--root", str(root), "--from-audit", str(audit)]) == 1
    assert not (root / "formal" / "build" / "theorems.json").exists()


# ----------------------------------------------------------------------------- the compiled check

PLANTED_MODULE = """module
public section
axiom rootAx : (1 : Nat) = 2
theorem WitCert.Probe.uses_root_axiom : (1 : Nat) = 2 := rootAx
theorem WitCert.Probe.through_a_lemma : (2 : Nat) = 1 := WitCert.Probe.uses_root_axiom.symm
theorem WitCert.Probe.by_propext (a b : Prop) (h : a ↔ b) : a = b := propext h
theorem WitCert.Probe.trusts : True := Lean.trustCompiler
theorem WitCert.Probe.unproved : (1 : Nat) = 2 := sorryAx _ false
theorem WitCert.Probe.honest : (1 : Nat) + 1 = 2 := rfl
instance (priority := high) WitCert.Probe.anyLE : LE Rat := ⟨fun _ _ => True⟩
theorem WitCert.Probe.vacuous : ∀ (x : Rat), x ≤ x + 1 := fun _ => trivial
structure WitCert.Probe.Own where
  n : Nat
instance WitCert.Probe.ownLE : LE WitCert.Probe.Own := ⟨fun a b => a.n ≤ b.n⟩
def WitCert.Probe.natOfBool : Coe Bool Nat := ⟨fun b => if b then 1 else 0⟩
end
"""


@pytest.fixture
def stage_dir() -> Iterator[Path]:
    """A scratch folder inside the build's stage (the wasm Lean reads only under it)."""
    env = lean_driver.make_env(ROOT, FORMAL, ROOT / ".cache" / "lean")
    env.stage.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="planted-", dir=env.stage))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_what_lean_compiled_is_checked_whatever_the_source_hid(stage_dir: Path) -> None:
    """A module compiled by the real Lean without the source audit: its root-level axiom and
    each proof that uses a trust constant are reported from the .olean files alone."""
    env = lean_driver.make_env(ROOT, FORMAL, ROOT / ".cache" / "lean")
    assert env.lean_js.exists(), "run scripts/lean_build.sh before the tests"
    lean_js, lib = lean_driver.stage_toolchain(env)
    src, out = stage_dir / "Planted.lean", stage_dir / "out"
    src.write_text(PLANTED_MODULE, encoding="utf-8")
    code, log, _ = lean_driver.run_lean(env, lean_js, lib, "Planted", src, out / "Planted.olean")
    assert code == 0, log
    kinds = lean_audit.lean_theorems(out, ["Planted"])
    assert kinds["axiom"] == [("rootAx", "Planted")]
    probes = ["WitCert.Probe.uses_root_axiom", "WitCert.Probe.through_a_lemma",
              "WitCert.Probe.by_propext", "WitCert.Probe.trusts", "WitCert.Probe.unproved",
              "WitCert.Probe.honest", "WitCert.Probe.vacuous"]
    assert {n for n, _ in kinds["theorem"] if not lean_audit.is_generated(n)} == set(probes)
    refs = lean_audit.olean_references(out / "Planted.olean")
    assert "rootAx" in refs["WitCert.Probe.uses_root_axiom"]
    # Each theorem's axioms, followed through the compiled declarations (a lemma's included),
    # as the export records them; the build's check refuses each one outside the three
    closure = lean_audit.axiom_closure(out, ["Planted"], probes)
    axioms = {n: found for n, (found, _core) in closure.items()}
    assert axioms == {"WitCert.Probe.uses_root_axiom": ["rootAx"],
                      "WitCert.Probe.through_a_lemma": ["rootAx"],
                      "WitCert.Probe.by_propext": ["propext"],
                      "WitCert.Probe.trusts": ["Lean.trustCompiler"],
                      "WitCert.Probe.unproved": ["sorryAx"],
                      "WitCert.Probe.honest": [], "WitCert.Probe.vacuous": []}
    assert all(core > 0 for _found, core in closure.values())  # Eq, Nat, ... are core's
    assert sorted(p.split(" (")[0] for p in lean_driver.axiom_problems(axioms, probes)) == [
        "WitCert.Probe.through_a_lemma depends on rootAx",
        "WitCert.Probe.trusts depends on Lean.trustCompiler",
        "WitCert.Probe.unproved depends on sorryAx",
        "WitCert.Probe.uses_root_axiom depends on rootAx"]
    assert lean_audit.trust_leaks(out, ["Planted"]) == [
        "Planted: Lean compiled WitCert.Probe.trusts, which uses Lean.trustCompiler",
        "Planted: Lean compiled WitCert.Probe.unproved, which uses sorryAx"]
    # a core class on a core type, however declared; an instance on the project's own type is
    # not one
    assert sorted(p.split(",")[0] for p in lean_audit.core_instances(out, ["Planted"])) == [
        "Planted: Lean compiled WitCert.Probe.anyLE : LE Rat",
        "Planted: Lean compiled WitCert.Probe.natOfBool : Coe Bool Nat"]


def test_the_real_build_uses_no_trust_constant_and_no_core_instance() -> None:
    modules = sorted(lean_audit.module_name(FORMAL, f) for f in lean_audit.lean_files(FORMAL)
                     if lean_audit.module_name(FORMAL, f) not in lean_audit.PROGRAMS)
    assert lean_audit.trust_leaks(BUILD / "olean", modules) == []
    assert lean_audit.core_instances(BUILD / "olean", modules) == []
    # the reader sees the proofs: a theorem's references include what its proof cites
    refs = lean_audit.olean_references(BUILD / "olean" / "WitCert" / "Tiers.olean")
    assert "WitCert.Tier.weakest" in refs["WitCert.Tier.weakest_comm"]
