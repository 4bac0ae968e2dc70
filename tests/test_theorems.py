"""The theorem registry: a Proof cites only what a Lean build exported."""

from __future__ import annotations

import json
import pickle
from fractions import Fraction
from pathlib import Path

import pytest

from witcert_calculus import (
    AtConsume,
    AttentionTV,
    Contract,
    EvidenceMismatchError,
    InvalidValueError,
    LogitLinf,
    PremiseError,
    Restricted,
    Tier,
    chain,
    Claim,
    Schema,
    score_bridge,
    softmax_tv_eform,
)
from witcert_calculus.errors import TheoremExportError, UnknownTheoremError
from witcert_calculus.lean import theorems
from reference.issued import proof

SHIPPED = Path(theorems.__file__).with_name("lean_export.json")


def test_a_made_up_proof_is_refused() -> None:
    with pytest.raises(UnknownTheoremError, match=r"WitCert\.User\.made_up_theorem.*register_theorems"):
        Contract(LogitLinf[AtConsume], AttentionTV[AtConsume], a=0, b=0,
                 evidence=proof("WitCert.User.made_up_theorem"), name="forged")
    with pytest.raises(UnknownTheoremError):
        Restricted(proof("WitCert.Contract.comp_sound_but_stronger"), "e_in <= 1")
    err = UnknownTheoremError("WitCert.User.made_up_theorem", 12)
    assert isinstance(err, InvalidValueError) and isinstance(err, ValueError)
    assert pickle.loads(pickle.dumps(err)).args == err.args


def test_every_constant_is_in_the_shipped_export() -> None:
    names = {getattr(theorems, n) for n in theorems.__all__
             if n.isupper() and n != "BUILTIN_ORIGIN"}
    assert len(names) > 30
    for name in sorted(names):
        rec = theorems.lookup(name)
        assert rec.name == name and rec.origin == theorems.BUILTIN_ORIGIN
        assert rec.module.startswith("WitCert.") and rec.statement.strip()


def test_the_shipped_export_has_the_exporters_format() -> None:
    doc = json.loads(SHIPPED.read_text(encoding="utf-8"))
    assert doc["theorems"], "empty export"
    for t in doc["theorems"]:
        assert set(t) >= {"name", "module", "statement", "axioms", "axioms_scope"}
        # the axioms read from what Lean compiled, within the allowed three, in each record
        assert set(t["axioms"]) <= {"propext", "Classical.choice", "Quot.sound"}, t
        rec = theorems.lookup(t["name"])
        assert rec.axioms == tuple(sorted(t["axioms"])) and rec.axioms_scope == t["axioms_scope"]


@pytest.mark.parametrize(("field", "value"), [
    ("axioms", "propext"), ("axioms", [""]), ("axioms", ["a b"]), ("axioms", [1]),
    ("axioms", {"propext": 1}), ("axioms_scope", "all"), ("axioms_scope", 1)])
def test_an_export_with_malformed_axioms_is_refused_by_entry(tmp_path: Path, field: str,
                                                            value: object) -> None:
    path = tmp_path / "theorems.json"
    entry = {"name": "MyLake.Bridges.bad_axioms", "module": "MyLake.Bridges",
             "statement": "True", "axioms": ["propext"], "axioms_scope": "complete"}
    path.write_text(json.dumps({"theorems": [{**entry, field: value}]}), encoding="utf-8")
    with pytest.raises(TheoremExportError, match=rf"theorems\[0\] has {field} "):
        theorems.register_theorems(path)


def test_the_axioms_are_described_with_how_far_they_were_followed() -> None:
    rec = theorems.TheoremRecord("A.b", "A", "True", "x", ("propext",), "complete")
    assert rec.describe_axioms() == "axioms: propext"
    partial = theorems.TheoremRecord("A.b", "A", "True", "x", (), "project")
    assert partial.describe_axioms().startswith("axioms: none (through this project's own")
    assert "not recorded" in theorems.TheoremRecord("A.b", "A", "True", "x").describe_axioms()


def _user_export(tmp_path: Path, statement: str = "∀ (x : Nat), x ≤ x + 1") -> Path:
    path = tmp_path / "theorems.json"
    path.write_text(json.dumps({"theorems": [
        {"name": "MyLake.Bridges.my_bridge_sound", "module": "MyLake.Bridges",
         "statement": statement, "axioms": ["propext"], "axioms_scope": "complete",
         "axiom_audit": "collectAxioms"}]}),
        encoding="utf-8")
    return path


def test_a_user_export_makes_its_names_citable_and_explain_shows_the_origin(
        tmp_path: Path) -> None:
    def schema() -> Schema:
        return Schema("MyLake.Bridges.my_bridge_sound", LogitLinf, AttentionTV, ("b",),
                      lambda b: Claim(a=0, b=b), premises=(("b <= 1", lambda b: b <= 1),),
                      states=("x ≤ x + 1",), name="mine")

    with pytest.raises(UnknownTheoremError):
        schema()
    path = _user_export(tmp_path)
    records = theorems.register_theorems(path)
    assert [r.name for r in records] == ["MyLake.Bridges.my_bridge_sound"]
    assert theorems.lookup("MyLake.Bridges.my_bridge_sound").origin == str(path.resolve())
    assert theorems.lookup("MyLake.Bridges.my_bridge_sound").axioms == ("propext",)
    mine = schema().issue(AtConsume, b=Fraction(1, 2))
    assert mine.tier is Tier.CERTIFIED and mine.b == Fraction(1, 2)
    assert "with b=1/2" in mine.explain()
    # Its proof certifies that claim only: attached to another b, it is refused.
    with pytest.raises(EvidenceMismatchError, match="b="):
        Contract(LogitLinf[AtConsume], AttentionTV[AtConsume], a=0, b=0, evidence=mine.evidence,
                 name="stronger")
    # A checker that finds its premise false, or returns no bool, issues nothing; nor do
    # parameters other than the schema's.
    with pytest.raises(PremiseError):
        schema().issue(AtConsume, b=2)
    with pytest.raises(InvalidValueError, match="must return a bool"):
        Schema("MyLake.Bridges.my_bridge_sound", LogitLinf, AttentionTV, ("b",),
               lambda b: Claim(a=0, b=b), premises=(("b <= 1", lambda b: 1),),
               name="mine").issue(AtConsume, b=0)
    with pytest.raises(InvalidValueError, match="params"):
        schema().issue(AtConsume, b=0, a=1)
    # A schema must state what its theorem states.
    with pytest.raises(InvalidValueError, match="does not state it"):
        Schema("MyLake.Bridges.my_bridge_sound", LogitLinf, AttentionTV, ("b",),
               lambda b: Claim(a=0, b=b), states=("x ≤ x + 2",), name="mine")
    # The shipped export's theorems are issued by the library's own schemas only.
    with pytest.raises(InvalidValueError, match="shipped export"):
        Schema("WitCert.Bridges.score_bridge_sound", LogitLinf, AttentionTV, (),
               lambda: Claim(a=0, b=0), name="forged").issue(AtConsume)
    text = mine.explain()
    assert "MyLake.Bridges.my_bridge_sound" in text and str(path.resolve()) in text
    built_in = chain(score_bridge(AtConsume, scale=1.0, q_norm_max=1.0), softmax_tv_eform(AtConsume))
    assert f"[{theorems.BUILTIN_ORIGIN}]" in built_in.explain()
    # Registering the same file again changes nothing; a different statement is refused.
    assert theorems.register_theorems(path) == records
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(TheoremExportError, match="my_bridge_sound.*already registered"):
        theorems.register_theorems(_user_export(other, "∀ (x : Nat), x ≤ x"))


def test_a_user_export_cannot_redefine_a_builtin_theorem(tmp_path: Path) -> None:
    path = tmp_path / "theorems.json"
    path.write_text(json.dumps({"theorems": [
        {"name": theorems.COMP_SOUND, "module": "Evil", "statement": "True"}]}), encoding="utf-8")
    with pytest.raises(TheoremExportError, match="comp_sound"):
        theorems.register_theorems(path)
    assert theorems.lookup(theorems.COMP_SOUND).origin == theorems.BUILTIN_ORIGIN


@pytest.mark.parametrize(("text", "why"), [
    ("not json", "JSON"),
    ('{"no": "theorems"}', "theorems"),
    ('{"theorems": [{"name": "A.b"}]}', "module"),
    ('{"theorems": [{"name": "", "module": "A", "statement": "True"}]}', "name"),
    ('{"theorems": [{"name": "A b", "module": "A", "statement": "True"}]}', "name"),
    ('{"theorems": [{"name": "A.b", "module": "A", "statement": ""}]}', "statement"),
])
def test_a_malformed_export_is_refused_by_name(tmp_path: Path, text: str, why: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(TheoremExportError, match=why):
        theorems.register_theorems(path)
    with pytest.raises(TheoremExportError, match="missing"):
        theorems.register_theorems(tmp_path / "missing.json")


def test_the_registry_view_is_read_only() -> None:
    view = theorems.registered_theorems()
    with pytest.raises(TypeError):
        view["X.y"] = view[theorems.COMP_SOUND]  # type: ignore[index]
