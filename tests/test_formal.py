"""Cross-check of the Lean companion (``formal/``) against the Python library.

The test command runs ``scripts/lean_build.sh`` first; it compiles every Lean file
and writes ``formal/build/theorems.json`` (each theorem's name and the statement
Lean printed). These tests fail -- never skip -- when that export is missing.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import json
import re
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

import witcert_calculus
from witcert_calculus import bridges, contracts, metrics, tiers
from witcert_calculus.errors import MetricMismatchError
from witcert_calculus.lean import theorems
from reference.issued import contract

# Reads the Lean build's outputs: scripts/test.sh runs this file after the build (marker `lean`).
pytestmark = pytest.mark.lean

ROOT = Path(__file__).resolve().parents[1]
FORMAL = ROOT / "formal"
BUILD = FORMAL / "build"
EXPORT = BUILD / "theorems.json"
OFFICIAL = BUILD / "axioms.json"
PACKAGE = Path(witcert_calculus.__file__).resolve().parent
ALLOWED_AXIOMS = {"propext", "Classical.choice", "Quot.sound"}
LEAN_NAME = re.compile(r"\bWitCert\.[A-Z]\w*(?:\.\w+)+")

sys.path.insert(0, str(ROOT / "scripts"))
lean_driver: Any = importlib.import_module("lean_driver")
gen_lean_checks: Any = importlib.import_module("gen_lean_checks")
margin_checks: Any = importlib.import_module("margin_checks")


@pytest.fixture(scope="module")
def export() -> dict[str, Any]:
    if not EXPORT.exists():
        pytest.fail(f"{EXPORT} is missing: run scripts/lean_build.sh (it compiles formal/ "
                    "and exports the theorems) before the tests")
    data: dict[str, Any] = json.loads(EXPORT.read_text(encoding="utf-8"))
    return data


@pytest.fixture(scope="module")
def exported(export: dict[str, Any]) -> dict[str, str]:
    return {t["name"]: t["statement"] for t in export["theorems"]}


def python_theorem_names() -> dict[str, list[str]]:
    """Every fully qualified Lean name the package mentions, with the files that mention it."""
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for name in LEAN_NAME.findall(path.read_text(encoding="utf-8")):
            found.setdefault(name, []).append(path.name)
    return found


def lean_sources() -> list[Path]:
    return sorted(p for p in FORMAL.rglob("*.lean")
                  if BUILD not in p.parents and ".lake" not in p.parts)


# ----------------------------------------------------------------------------- the export


def test_export_is_current(export: dict[str, Any]) -> None:
    recorded = export["sources"]
    # Official-toolchain-only files (the collectAxioms exporter) are not compiled here.
    current = {str(p.relative_to(ROOT)): hashlib.sha256(p.read_bytes()).hexdigest()
               for p in lean_sources() if p.stem not in lean_driver.OFFICIAL_ONLY}
    assert recorded == current, "formal/ changed since the last build: run scripts/lean_build.sh"


def test_the_shipped_export_is_the_builds(export: dict[str, Any]) -> None:
    shipped = (ROOT / lean_driver.SHIPPED).read_text(encoding="utf-8")
    assert shipped == lean_driver.shipped_export(export), (
        f"{lean_driver.SHIPPED} differs from the Lean build's export: run "
        "python scripts/lean_driver.py --root . --ship")


def test_export_has_a_statement_for_every_declared_theorem(export: dict[str, Any]) -> None:
    declared = [n for n, _ in lean_driver.declared_theorems(FORMAL, lean_sources())]
    names = [t["name"] for t in export["theorems"]]
    assert sorted(names) == sorted(declared)
    assert len(set(names)) == len(names)
    for t in export["theorems"]:
        assert t["name"].startswith("WitCert."), t
        assert t["statement"].strip(), f"Lean printed no statement for {t['name']}"


def test_every_theorem_named_by_python_is_exported(exported: dict[str, str]) -> None:
    names = python_theorem_names()
    assert len(names) >= 30, "the package should name its Lean theorems"
    missing = {n: files for n, files in names.items() if n not in exported}
    assert not missing, f"named in Python but not exported by Lean: {missing}"


def test_axiom_audit(export: dict[str, Any]) -> None:
    audit = export["axiom_audit"]
    assert audit["method"] in {"olean-closure", "collectAxioms"}
    assert set(audit["allowed_axioms"]) == ALLOWED_AXIOMS
    scope = "project" if audit["method"] == "olean-closure" else "complete"
    for t in export["theorems"]:
        # every theorem's axioms, read from what Lean compiled, and how far they were followed
        assert t["axiom_audit"] == audit["method"] and isinstance(t["axioms"], list), t
        assert t["axioms_scope"] == scope and set(t["axioms"]) <= ALLOWED_AXIOMS, t
    # the standard axioms do reach the development's proofs (the walk is not vacuous)
    assert {a for t in export["theorems"] for a in t["axioms"]} >= {"propext"}
    for log in sorted((BUILD / "logs").glob("*.log")):
        text = log.read_text(encoding="utf-8")
        assert "declaration uses 'sorry'" not in text, log
        assert not re.search(r"^\S*\.lean:\d+:\d+: error", text, re.MULTILINE), log


EVICTION_THEOREMS = {
    theorems.TV_RESTRICT_EQ_DROPPED_MASS:
        "WitCert.Analytic.tv p (WitCert.Eviction.restrict p drop L) L = "
        "WitCert.Eviction.droppedMass p drop L",
    theorems.DROPPED_MASS_SOFTMAX_EQ:
        "WitCert.Eviction.droppedMass (WitCert.Analytic.softmax E s L) drop L = "
        "WitCert.Eviction.droppedMass (fun t => E.exp (s t)) drop L / "
        "(WitCert.Eviction.keptMass (fun t => E.exp (s t)) drop L + "
        "WitCert.Eviction.droppedMass (fun t => E.exp (s t)) drop L)",
    theorems.RESTRICT_SOFTMAX_EQ:
        "drop t = false → WitCert.Eviction.restrict (WitCert.Analytic.softmax E s L) drop L t = "
        "WitCert.Analytic.softmax E s (List.filter (fun t => !drop t) L) t",
    theorems.TV_SOFTMAX_KEPT_EQ:
        "WitCert.Analytic.tv (WitCert.Analytic.softmax E s L) (fun t => bif drop t then 0 else "
        "WitCert.Analytic.softmax E s (List.filter (fun t => !drop t) L) t) L = "
        "WitCert.Eviction.droppedMass (fun t => E.exp (s t)) drop L / ",
    theorems.TV_KEPT_LE_ONE:
        "WitCert.Analytic.tv (WitCert.Analytic.softmax E z L) (fun t => bif drop t then 0 else "
        "WitCert.Analytic.softmax E z' (List.filter (fun t => !drop t) L) t) L ≤ 1",
    theorems.DROPPED_MASS_LE_WITNESS:
        "(∀ (t : β), t ∈ L → drop t = true → s t ≤ u t) → "
        "WitCert.Eviction.droppedMass (WitCert.Analytic.softmax E s L) drop L ≤ "
        "WitCert.Eviction.droppedMass (fun t => E.exp (u t)) drop L / "
        "(WitCert.Eviction.keptMass (fun t => E.exp (s t)) drop L + "
        "WitCert.Eviction.droppedMass (fun t => E.exp (u t)) drop L)",
    theorems.WITNESS_MASS_LE_BLOCKS:
        "WitCert.Eviction.droppedMass (fun t => E.exp (u (blk t))) drop L ≤ "
        "WitCert.Analytic.lsum (fun b => WitCert.Eviction.blockCount drop blk L b * E.exp (u b)) B",
    theorems.DROPPED_MASS_LE_BLOCKS:
        "(∀ (t : β), t ∈ L → drop t = true → s t ≤ u (blk t)) → ",
    theorems.OUTPUT_EVICT_ERROR_LE:
        "≤ WitCert.Eviction.droppedMass p drop L * (M + N.norm (N.vsum (fun t => "
        "N.smul (WitCert.Eviction.restrict p drop L t) (v t)) L))",
    theorems.TV_TRIANGLE:
        "WitCert.Analytic.tv p r L ≤ WitCert.Analytic.tv p q L + WitCert.Analytic.tv q r L",
    theorems.TV_COND_DROP_EQ_TV_FILTER:
        "WitCert.Analytic.tv (fun t => bif drop t then 0 else f t) "
        "(fun t => bif drop t then 0 else g t) L = "
        "WitCert.Analytic.tv f g (List.filter (fun t => !drop t) L)",
    theorems.EVICT_QUANT_TV_LE:
        "WitCert.Analytic.tv (WitCert.Analytic.softmax E s L) (fun t => bif drop t then 0 else "
        "WitCert.Analytic.softmax E s' (List.filter (fun t => !drop t) L) t) L ≤ "
        "WitCert.Eviction.droppedMass (WitCert.Analytic.softmax E s L) drop L + "
        "WitCert.Analytic.tv (WitCert.Analytic.softmax E s (List.filter (fun t => !drop t) L)) "
        "(WitCert.Analytic.softmax E s' (List.filter (fun t => !drop t) L)) "
        "(List.filter (fun t => !drop t) L)",
    theorems.EVICT_QUANT_TV_LE_BLOCKS:
        "(WitCert.Eviction.keptMass (fun t => E.exp (s t)) drop L + WitCert.Analytic.lsum "
        "(fun b => WitCert.Eviction.blockCount drop blk L b * E.exp (u b)) B) + "
        "WitCert.Analytic.tv (WitCert.Analytic.softmax E s (List.filter (fun t => !drop t) L)) ",
    theorems.DIV_ADD_LE_DIV_ADD:
        "0 < Z → Z ≤ Z' → 0 ≤ x → x ≤ x' → x / (Z' + x) ≤ x' / (Z + x')",
    theorems.RESTORE_BOUND_LE:
        "(∀ (t : β), t ∈ L → drop' t = true → drop t = true) → "
        "WitCert.Analytic.lsum (fun b => WitCert.Eviction.blockCount drop' blk L b * "
        "E.exp (u b)) B / "
        "(WitCert.Eviction.keptMass (fun t => E.exp (s t)) drop' L + ",
    theorems.RESTORE_BLOCK_BOUND_LE:
        "WitCert.Eviction.keptMass (fun t => E.exp (s t)) "
        "(fun t => drop t && !decide (blk t = b₀)) L + ",
}

# The eviction meters about the semantic contract `evictTV` (WitCert/SemanticEviction.lean).
SEMANTIC_EVICTION_THEOREMS = {
    theorems.EVICT_TV_METER_EQ: "= WitCert.Eviction.droppedMass (fun t => E.exp (z t)) drop L / ",
    theorems.EVICT_TV_METER_SOUND:
        "≤ WitCert.Eviction.droppedMass (fun t => E.exp (u t)) drop L / ",
    theorems.EVICT_TV_BLOCKS_METER_SOUND:
        "≤ WitCert.Analytic.lsum (fun b => WitCert.Eviction.blockCount drop blk L b * E.exp (u b)) B / ",
    theorems.EVICT_QUANT_METER_SOUND:
        "WitCert.Eviction.droppedMass (fun t => E.exp (z t)) drop L) + "
        "WitCert.Analytic.tv (WitCert.Analytic.softmax E z (List.filter (fun t => !drop t) L)) "
        "(WitCert.Analytic.softmax E z' (List.filter (fun t => !drop t) L)) "
        "(List.filter (fun t => !drop t) L)",
    theorems.EVICT_QUANT_BLOCKS_METER_SOUND:
        "E.exp (u b)) B) + "
        "WitCert.Analytic.tv (WitCert.Analytic.softmax E z (List.filter (fun t => !drop t) L)) ",
    theorems.EVICT_TV_RESTORE_METER_LE:
        "(∀ (t : β), t ∈ L → drop t = true → drop₀ t = true) → ",
}


def test_eviction_theorems_are_exported_axiom_free_and_cited(export: dict[str, Any]) -> None:
    """The theorems of token eviction (``WitCert/Eviction.lean``) and its meters about the
    contract ``evictTV`` (``WitCert/SemanticEviction.lean``): each is cited by a constant of
    ``theorems.py``, exported from its module with its statement, shipped with the package, and
    reaches no axiom beyond the allowed ones; the two modules declare no other public theorem and
    pass the source audit."""
    rows = {t["name"]: t for t in export["theorems"]}
    constants = {getattr(theorems, n) for n in theorems.__all__
                 if isinstance(getattr(theorems, n), str)}
    sources = [FORMAL / "WitCert" / "Eviction.lean", FORMAL / "WitCert" / "SemanticEviction.lean"]
    declared = {n: m for n, m in lean_driver.declared_theorems(FORMAL, sources)}
    assert set(declared) == set(EVICTION_THEOREMS) | set(SEMANTIC_EVICTION_THEOREMS)
    for name, fragment in (EVICTION_THEOREMS | SEMANTIC_EVICTION_THEOREMS).items():
        assert name in constants and name in theorems.cited_theorems(), name
        row = rows[name]
        assert row["module"] == declared[name], row
        assert fragment in row["statement"], (name, row["statement"])
        assert "sorryAx" not in row["axioms"] and set(row["axioms"]) <= ALLOWED_AXIOMS, row
        shipped = theorems.lookup(name)
        assert shipped.statement == row["statement"]
        assert set(shipped.axioms or ()) <= ALLOWED_AXIOMS, name
    assert lean_driver.audit_sources(sources) == []
    # the meters read the contract's maps, as every meter Python certifies with must
    for name in SEMANTIC_EVICTION_THEOREMS:
        assert name.startswith("WitCert.Semantic."), name
        statement = rows[name]["statement"]
        assert "(WitCert.Semantic.evictTV E L hL drop S s).exact z" in statement, statement
        assert "(WitCert.Semantic.evictTV E L hL drop S s).approx ω z" in statement, statement


def test_official_axiom_audit_when_present(exported: dict[str, str]) -> None:
    """``lake exe axiom_audit > formal/build/axioms.json`` on an official toolchain."""
    if not OFFICIAL.exists():
        # The wasm build cannot run Lean.collectAxioms; the source scan is checked instead.
        assert lean_driver.audit_sources(lean_sources()) == []
        return
    rows = json.loads(OFFICIAL.read_text(encoding="utf-8"))
    assert {r["name"] for r in rows} >= set(exported)
    for r in rows:
        assert "sorryAx" not in r["axioms"], r
        assert set(r["axioms"]) <= ALLOWED_AXIOMS, r


def test_sources_pass_the_audit() -> None:
    files = lean_sources()
    assert {p.name for p in files} >= {"Metrics.lean", "Tiers.lean", "Contracts.lean",
                                       "Bridges.lean", "GeneratedChecks.lean", "WitCert.lean"}
    assert lean_driver.audit_sources(files) == []


@pytest.mark.parametrize("snippet, word", [
    ("theorem t : 1 = 1 := by native_decide", "native_decide"),
    ("axiom bad : False", "axiom"),
    ("theorem t : False := sorry", "sorry"),
    ("@[implemented_by foo] def f := 1", "implemented_by"),
    ("@[extern \"c\"] opaque g : Nat", "extern"),
    ("theorem t : True := by admit", "admit"),
    ("def f := Lean.ofReduceBool", "ofReduceBool"),
])
def test_audit_catches_forbidden_constructs(tmp_path: Path, snippet: str, word: str) -> None:
    f = tmp_path / "Bad.lean"
    f.write_text(f"-- a comment may say native_decide or axiom\n/- sorry -/\n{snippet}\n")
    problems = lean_driver.audit_sources([f])
    assert problems and all(f":3:" in p for p in problems), problems
    assert any(word in p for p in problems)


def test_audit_ignores_comments_and_strings(tmp_path: Path) -> None:
    f = tmp_path / "Ok.lean"
    f.write_text('/-! never `axiom`, no native_decide /- nested sorry -/ -/\n'
                 'def s := "sorry, extern"\n-- admit\ntheorem t : True := trivial\n')
    assert lean_driver.audit_sources([f]) == []


# ------------------------------------------------------------------- the statements themselves


def test_composition_coefficients_match_python(exported: dict[str, str]) -> None:
    # Lean states the coefficients of `g.comp f` (first f, then g); Python's `c1 >> c2`.
    assert exported["WitCert.Contract.comp_a"].endswith("(g.comp f).a = g.a * f.a")
    assert exported["WitCert.Contract.comp_b"].endswith("(g.comp f).b = g.a * f.b + g.b")
    assert exported["WitCert.Contract.comp_delta"].endswith(
        "(g.comp f).delta = f.delta + g.delta")
    assert exported["WitCert.Contract.comp_tier"].endswith(
        "(g.comp f).tier = f.tier.weakest g.tier")
    p = contracts.identity(metrics.AttentionTV[metrics.AtConsume])
    tv = metrics.AttentionTV[metrics.AtConsume]
    c1 = contract(tv, tv, a=Fraction(3, 4), b=Fraction(1, 8), delta=Fraction(1, 100),
                  theorem="WitCert.Contract.comp_sound", name="f")
    c2 = contract(tv, tv, a=Fraction(2), b=Fraction(1, 3), delta=Fraction(1, 50),
                  theorem="WitCert.Contract.comp_sound", name="g")
    comp = c1 >> c2
    assert (comp.a, comp.b, comp.delta) == (c2.a * c1.a, c2.a * c1.b + c2.b, c1.delta + c2.delta)
    assert (p >> c1).a == c1.a and (c1 >> p).b == c1.b


def test_comp_sound_statement(exported: dict[str, str]) -> None:
    s = exported["WitCert.Contract.comp_sound"]
    assert "0 ≤ g.a" in s and "eMid ≤ f.a * e + f.b" in s and "eOut ≤ g.a * eMid + g.b" in s
    assert s.endswith("eOut ≤ (g.comp f).a * e + (g.comp f).b")


def test_ill_typed_compositions_are_pinned_in_lean() -> None:
    text = (FORMAL / "WitCert" / "Contracts.lean").read_text(encoding="utf-8")
    blocks = re.findall(r"/--\nerror: (.*?)-/\n#guard_msgs in\nexample : (.*?)\n\n", text,
                        re.DOTALL)
    assert len(blocks) >= 4
    for message, _body in blocks:
        assert "PLACEHOLDER" not in message
        assert "mismatch" in message.lower(), message
    bodies = " ".join(b for _, b in blocks)
    assert "selectStage.comp storageStage" in bodies
    assert "scoreStage.comp storageAtWrite" in bodies
    # The same compositions fail at run time in Python.
    storage = bridges.witness_contract(metrics.AtConsume, witness_max=0.02)
    select = bridges.rank_prefix_selection(metrics.AtConsume, m_out=0.01, m_in=0.01)
    with pytest.raises(MetricMismatchError, match="KeyResidualAbs"):
        _ = storage >> select  # type: ignore[operator]
    storage_w = bridges.witness_contract(metrics.AtWrite, witness_max=0.02)
    score = bridges.score_bridge(metrics.AtConsume, scale=0.125, q_norm_max=8.0)
    with pytest.raises(MetricMismatchError, match="AtWrite"):
        _ = storage_w >> score  # type: ignore[operator]


def test_lean_metrics_mirror_python_metrics() -> None:
    text = (FORMAL / "WitCert" / "Metrics.lean").read_text(encoding="utf-8")
    ctors = set(re.findall(r"^  \| (\w+) \(s : Site\) : Metric s$", text, re.MULTILINE))
    classes = {name for name in metrics.__all__
               if inspect.isclass(getattr(metrics, name))
               and issubclass(getattr(metrics, name), metrics.Metric)
               and getattr(metrics, name) is not metrics.Metric}
    assert {c[0].lower() + c[1:] for c in classes} == ctors
    assert set(gen_lean_checks.METRICS) == classes


def test_lean_tier_order_mirrors_python() -> None:
    text = (FORMAL / "WitCert" / "Tiers.lean").read_text(encoding="utf-8")
    ranks = dict(re.findall(r"^  \| (\w+) => (\d)$", text, re.MULTILINE))
    py = {t.name: t.value for t in tiers.Tier}
    lean_of = {"SATURATED": "saturated", "EMPIRICAL": "empirical",
               "PARTIALLY_CERTIFIED": "partiallyCertified", "CERTIFIED": "certified"}
    assert {lean_of[k]: str(v) for k, v in py.items()} == ranks


# ------------------------------------------------------------- every Python rule names a theorem


def test_every_bridge_rule_names_a_theorem(exported: dict[str, str]) -> None:
    for name in bridges.__all__:
        obj = getattr(bridges, name)
        if not inspect.isfunction(obj) or name == "empirical_ratio_bridge":
            continue
        keys = [k for k in bridges.THEOREMS if k == name or k.startswith(name + ".")]
        assert keys, f"bridges.{name} names no Lean theorem"
        for k in keys:
            assert bridges.THEOREMS[k] in exported, (name, bridges.THEOREMS[k])
    # A measured bridge names none and is EMPIRICAL: that is its whole point.
    ratio = bridges.empirical_ratio_bridge(metrics.LogitLinf[metrics.AtConsume],
                                           metrics.AttentionTV[metrics.AtConsume], ratio=0.5,
                                           samples=10, statistic="median", set_type="top-64")
    assert ratio.tier is tiers.Tier.EMPIRICAL and ratio.theorems == ()


def test_constructed_contracts_cite_exported_theorems(exported: dict[str, str]) -> None:
    site = metrics.AtConsume
    made: list[contracts.Contract[Any, Any]] = [
        bridges.witness_contract(site, witness_max=0.02),
        bridges.score_bridge(site, scale=0.125, q_norm_max=8.0),
        bridges.softmax_tv_eform(site),
        bridges.selector_mass_eform(site),
        bridges.softmax_tv_tanh(site),
        bridges.softmax_tv_tanh_osc(site),
        bridges.softmax_tv_affine(site, eps0=0.25),
        bridges.pooling(site, weights=[0.5, 0.25, 0.25]).l2,
        bridges.pooling(site, weights=[0.5, 0.25, 0.25]).max,
        bridges.rank_prefix_selection(site, m_out=0.02, m_in=0.01),
        bridges.recurrence(site, a_steps=[0.5, 0.5], b_steps=[0.1, 0.1]).contract,
        contracts.identity(metrics.AttentionTV[site]),
    ]
    chained = contracts.chain(made[0], made[1], made[2], made[9])
    for c in [*made, chained]:
        assert c.theorems, c
        missing = [t for t in c.theorems if t not in exported]
        assert not missing, (c.name, missing)
    assert "WitCert.Semantic.Contract.comp_sound" in chained.theorems
    stable = bridges.rank_prefix_stable([[3.0, 1.0, 0.9]], k=1, eps=0.5)
    assert stable.theorem in exported
    for t in tiers.WEAKEST_THEOREMS + (theorems.DECIDE_SATURATED_NE_CERTIFIED,):
        assert t in exported


# Cited theorems that are facts about numbers, not about a stage's exact and approximate maps:
# statistical tests, allowance arithmetic, the grid's moment bound, format residuals (each the
# premise of a contract below), the tighter of two bounds, bound addition.
NOT_ABOUT_A_STAGE = {
    theorems.ADD_SOUND, theorems.GRID_MGF_LE, theorems.FORMAT_RESIDUAL_LE,
    theorems.NEAREST_RESIDUAL_LE, theorems.TRUNC_RESIDUAL_LE, theorems.MIN_BOUND_SOUND,
    theorems.PAGE_IN_DECREASE, theorems.SENTINEL_ROUNDS_SOUND, theorems.RATE_UPPER_BOUND_SOUND,
    theorems.ONE_SUB_POW_LE_EXP,
    theorems.OUTPUT_EVICT_ERROR_LE,  # an output-space bound given the dropped mass
    # the step algebra behind the transfers of the residual contracts (which are cited)
    theorems.RMS_NORMALIZE_LIPSCHITZ, theorems.ATTN_QUERY_STEP_LE, theorems.GLU_STEP_LE,
}


def test_bridges_meters_and_ledger_cite_semantic_contracts(exported: dict[str, str]) -> None:
    """Every bridge schema, meter and ledger spend rule the library certifies with cites a
    theorem about a ``WitCert.Semantic`` contract: one whose statement reads the contract's
    exact and approximate maps (or its failure event), not the numbers-only layer."""
    import witcert_calculus.meters as meters
    import witcert_calculus.meters.depth  # noqa: F401  (defines schemas)
    import witcert_calculus.meters.output_bound  # noqa: F401  (defines a schema)
    from witcert_calculus.accounting.budget import SPEND_THEOREMS
    from witcert_calculus.accounting.entries import ENTRY_THEOREM
    from witcert_calculus.schemas import builtin_schemas

    cited = {s.theorem for s in builtin_schemas()}
    cited |= {t for ts in meters.THEOREMS.values() for t in ts} - NOT_ABOUT_A_STAGE
    cited |= {SPEND_THEOREMS[0], ENTRY_THEOREM}
    assert len(cited) >= 20
    for name in sorted(cited):
        assert name.startswith("WitCert.Semantic."), name
        statement = exported[name]
        assert re.search(r"\)\.(exact|approx|bad)\b|\)\.recurrence ", statement), (name, statement)
    # Tier B's failure event is a real one: its probability is bounded by the tails, not 0
    tail = exported[theorems.DITHER_TIER_B_PROB_BAD]
    assert ".prob" in tail and "E.exp (-(r t * r t / (2 * σ2 t)))" in tail, tail


# ----------------------------------------------------------------------- the generated checks


def test_generated_checks_are_fresh() -> None:
    committed = gen_lean_checks.TARGET.read_text(encoding="utf-8")
    assert committed == gen_lean_checks.generate(), (
        "formal/WitCert/GeneratedChecks.lean is stale: run python scripts/gen_lean_checks.py")


def test_generated_checks_cover_every_rule() -> None:
    text = gen_lean_checks.generate()
    examples = re.findall(r"^example :", text, re.MULTILINE)
    closed = re.findall(r":= by(?: |\n  )decide \+kernel\n", text)
    assert len(examples) == len(closed) >= 150
    for needle in (".comp ", ").a = ", ").b = ", ").delta = ", ").tier = ", ").cap = ",
                   "Tier.weakest", "Tier.decideTier", ".saturation = ", "(List.range",
                   "Bridges.dot", "Bridges.tv"):
        assert needle in text, needle
    # The three-stage compositions exercise associativity of the Python chain.
    assert re.search(r"\(comp\d+s3\.comp \(comp\d+s2\.comp comp\d+s1\)\)", text)


def test_generated_checks_were_compiled() -> None:
    stamps = BUILD / "stamps"
    if not stamps.exists():
        pytest.fail("formal/build/stamps is missing: run scripts/lean_build.sh")
    assert (stamps / "WitCert.GeneratedChecks.sha256").exists()
    assert (stamps / "WitCert.sha256").exists()
    root = (FORMAL / "WitCert.lean").read_text(encoding="utf-8")
    for f in sorted((FORMAL / "WitCert").glob("*.lean")):
        assert f"public import WitCert.{f.stem}\n" in root, f"WitCert.lean must import {f.stem}"


def test_generated_checks_detect_a_wrong_value() -> None:
    """The generator's arithmetic is the library's: a perturbed value would differ."""
    text = gen_lean_checks.generate()
    m = re.search(r"example : \((comp\d+s2)\.comp (comp\d+s1)\)\.b = \((\d+)(?:/(\d+))? : Rat\)",
                  text)
    assert m is not None
    b = Fraction(int(m.group(3)), int(m.group(4) or 1))
    s1 = _parse_stage(text, m.group(2))
    s2 = _parse_stage(text, m.group(1))
    assert b == s2[0] * s1[1] + s2[1]


def _parse_stage(text: str, name: str) -> tuple[Fraction, Fraction]:
    m = re.search(rf"def {name} :\n.*?\n  mk _ _ \(([\d/]+) : Rat\) \(([\d/]+) : Rat\)", text)
    assert m is not None, name
    return Fraction(m.group(1)), Fraction(m.group(2))


def test_formal_readme_lists_every_theorem(exported: dict[str, str]) -> None:
    readme = (FORMAL / "README.md").read_text(encoding="utf-8")
    missing = [n for n in exported if f"`{n}`" not in readme]
    assert not missing, f"formal/README.md does not list: {missing}"


def test_formal_readme_module_table_is_current() -> None:
    spec = importlib.util.spec_from_file_location(
        "render_formal_readme", ROOT / "scripts" / "render_formal_readme.py")
    assert spec and spec.loader
    render = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(render)
    text = (FORMAL / "README.md").read_text(encoding="utf-8")
    assert render.table() in text, (
        "formal/README.md's module table is stale: run python scripts/render_formal_readme.py")
    assert "`witcert_calculus.bridges`" in render.table()
    values = render.value_table()
    assert values in text, (
        "formal/README.md's list of value checks is stale: run "
        "python scripts/render_formal_readme.py")
    # every section of the generated file is listed, each with its kernel checks
    kernel_table = values.split("\n\n")[0]  # the margin table follows it
    rows = [r for r in kernel_table.splitlines()
            if r.startswith("| ") and not r.startswith("| section")]
    assert all(f"| {name} |" in values for name, _, _ in margin_checks.MARGIN_CHECKS)
    generated = (FORMAL / "WitCert" / "GeneratedChecks.lean").read_text(encoding="utf-8")
    titles = [t for t, _, _ in gen_lean_checks.VALUE_CHECKS]
    assert [r.split(" | ")[0].removeprefix("| ") for r in rows] == titles
    assert all(f"/-! ### {t} -/" in generated for t in titles)
    assert all(int(r.rstrip(" |").rsplit("| ", 1)[-1]) > 0 for r in rows), values


def test_the_exporter_runs_after_every_module() -> None:
    """The exporter's cross-check reads every module's compiled .olean files, the root module
    and the generated checks included (they declare no theorem): a clean parallel build must
    not start it before all of them are compiled."""
    files = [p for p in lean_sources() if p.stem not in lean_driver.OFFICIAL_ONLY]
    graph = lean_driver.module_graph(ROOT / "formal", files)
    full = lean_driver.with_exporter(graph)
    assert set(full[lean_driver.EXPORTER]) == set(graph)
    assert {"WitCert", "WitCert.GeneratedChecks"} <= set(full[lean_driver.EXPORTER])
    order = lean_driver.topo_order(full)
    assert order[-1] == lean_driver.EXPORTER
