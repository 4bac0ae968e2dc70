"""Evidence is issued, never typed in: every route of docs/concepts/trust.md's table.

Each test builds what a user could build through public Python (a constructor, a
``dataclasses.replace``, a copy, a pickle edited or loaded elsewhere) and requires a refusal,
or the same value still sealed. Nothing here uses the private issuers.
"""

from __future__ import annotations

import copy
import dataclasses
import pickle
import subprocess
import sys
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from witcert_calculus import (
    AtConsume,
    AttentionTV,
    Contract,
    EvidenceMismatchError,
    ForgedEvidenceError,
    KeyResidualAbs,
    LogitLinf,
    Measurement,
    Premise,
    Proof,
    Reading,
    RiskLedger,
    RopeLayout,
    Tier,
    Transfer,
    TransferKind,
    UnknownTheoremError,
    chain,
    logit_bound,
    pooling,
    rank_prefix_selection,
    recurrence,
    score_bridge,
    selector_mass_eform,
    softmax_tv_affine,
    softmax_tv_eform,
    softmax_tv_tanh,
    softmax_tv_tanh_osc,
    tv_eform,
    witness_contract,
)
from witcert_calculus.contracts import Stage, _restore  # pyright: ignore[reportPrivateUsage]
from witcert_calculus.lean.theorems import WEAKEST_COMM, cited_theorems, lookup
from witcert_calculus.meters.output_bound import output_error_contract
from witcert_calculus.meters.tv_forms import TVBasis, TVBound

K = KeyResidualAbs[AtConsume]
L = LogitLinf[AtConsume]
TV = AttentionTV[AtConsume]


def _meter() -> tuple[Any, Any]:
    """A Tier-A logit bound and its TV bound, from stored witnesses and a live query."""
    c = logit_bound(np.array([1.0, 0.0]), np.array([[0.01], [0.02]]),
                    layout=RopeLayout.INTERLEAVED, scale=1.0)
    return c, tv_eform(np.array([0.5, 0.5]), c)


def _builtin_contracts() -> list[Contract[Any, Any]]:
    return [witness_contract(AtConsume, witness_max=0.02),
            score_bridge(AtConsume, scale=0.125, q_norm_max=8),
            softmax_tv_eform(AtConsume), selector_mass_eform(AtConsume),
            softmax_tv_tanh(AtConsume), softmax_tv_tanh_osc(AtConsume),
            softmax_tv_affine(AtConsume, eps0=0.1), pooling(AtConsume, weights=[0.5, 0.5]).l2,
            pooling(AtConsume, weights=[0.5, 0.5]).max,
            rank_prefix_selection(AtConsume, m_out=0.02, m_in=0.01),
            recurrence(AtConsume, a_steps=[0.5, 0.5]).contract,
            output_error_contract(value_norm_max=2.0, p_tilde=np.array([0.5, 0.5]),
                                  rho=np.array([0.0, 0.2]))]


def test_a_hand_built_proof_or_premise_is_refused() -> None:
    # the reproducer: any exported name, attached to a contract claiming b = 0
    with pytest.raises(ForgedEvidenceError, match="Proof"):
        Contract(K, TV, a=0, b=0, evidence=Proof(WEAKEST_COMM), name="x")
    for name in sorted(cited_theorems())[:5]:
        with pytest.raises(ForgedEvidenceError):
            Proof(name)
    with pytest.raises(ForgedEvidenceError, match="Premise"):
        Premise("1 == 2", True)
    with pytest.raises(ForgedEvidenceError):  # a seal of the right length is no seal
        Premise("1 == 2", True, b"\0" * 32)


def test_a_proof_certifies_only_the_claim_it_was_issued_for() -> None:
    score = score_bridge(AtConsume, scale=0.5, q_norm_max=1)
    fields = {"m_out": dict(m_out=TV), "a": dict(a=0), "b": dict(b=Fraction(1, 3)),
              "delta": dict(delta=Fraction(1, 100)), "cap": dict(cap=1),
              "transfer": dict(transfer=Transfer(TransferKind.TANH, Fraction(1, 4)))}
    for field, change in fields.items():
        kw: dict[str, Any] = dict(m_out=L, a=score.a, b=score.b, delta=0, cap=None,
                                  transfer=None) | change
        m_out = kw.pop("m_out")
        with pytest.raises(EvidenceMismatchError) as err:
            Contract(K, m_out, evidence=score.evidence, name="moved", **kw)
        assert err.value.field == field
    # the same claim is accepted: a proof can back an equal contract
    again = Contract(K, L, a=score.a, b=score.b, evidence=score.evidence, name="again")
    assert again.tier is Tier.CERTIFIED
    # the transfer reproducer: the tanh bridge's proof on a transfer 2.5e8 times flatter
    tanh = softmax_tv_tanh(AtConsume)
    with pytest.raises(EvidenceMismatchError, match="transfer"):
        Contract(L, TV, a=0, b=1, evidence=tanh.evidence, name="flat",
                 transfer=Transfer(TransferKind.TANH, Fraction(1, 10**9)))


def test_a_meters_proof_or_a_composition_backs_no_contract() -> None:
    _, b = _meter()
    proof = b.reading().evidence
    assert isinstance(proof, Proof) and proof.claim == ()
    with pytest.raises(EvidenceMismatchError, match="claim"):
        Contract(L, TV, a=0, b=0, evidence=proof, name="meter as contract")
    composite = chain(score_bridge(AtConsume, scale=0.5, q_norm_max=1), softmax_tv_eform(AtConsume))
    with pytest.raises(Exception, match="composing"):
        Contract(K, TV, a=0, b=0, evidence=composite.evidence, name="x")  # type: ignore[arg-type]


def test_every_certified_builtin_names_the_theorem_that_issued_its_numbers() -> None:
    for c in _builtin_contracts():
        for s in c.parts:
            ev = s.evidence
            proof = ev if isinstance(ev, Proof) else getattr(ev, "proof", None)
            assert isinstance(proof, Proof), s.name
            # the proof's claim is this stage's own: rebuilding the stage from it passes
            rebuilt = Contract(s.m_in, s.m_out, a=s.a, b=s.b, evidence=ev, name=s.name,
                               delta=s.delta, cap=s.cap, transfer=s.transfer)
            assert rebuilt.tier is c.tier
            assert proof.theorem in c.explain() and lookup(proof.theorem).name == proof.theorem


def test_a_proved_reading_typed_in_or_edited_is_refused() -> None:
    _, b = _meter()
    good = b.reading()
    assert good.tier is Tier.CERTIFIED
    with pytest.raises(ForgedEvidenceError, match="Reading"):
        Reading(TV, 0.0, evidence=good.evidence)
    with pytest.raises(ForgedEvidenceError):
        dataclasses.replace(good, raw=0.0)
    with pytest.raises(ForgedEvidenceError):  # another reading's seal does not fit
        Reading(TV, 0.0, evidence=good.evidence, seal=good.seal)
    # measurements need no seal: a caller's own number is EMPIRICAL
    own = Reading(TV, 0.0, evidence=Measurement("observed", samples=3))
    assert own.tier is Tier.EMPIRICAL
    # a ledger fed only forgeries never sees them
    led = RiskLedger()
    r = led.open_request(delta_req="1/100")
    led.admit(r, good)
    assert led.verdict(r).tier is Tier.CERTIFIED


def test_a_tv_bound_or_basis_typed_in_or_edited_is_refused() -> None:
    c, b = _meter()
    genuine = b.basis.logit
    with pytest.raises(ForgedEvidenceError, match="TVBasis"):
        TVBasis(checks=(), logit=genuine, delta=Fraction(0))
    with pytest.raises(ForgedEvidenceError, match="TVBound"):
        TVBound(raw=0.0, value=0.0, theorem=b.theorem, form="eform", basis=b.basis)
    with pytest.raises(ForgedEvidenceError, match="TVBound"):
        dataclasses.replace(b, raw=0.0, value=0.0).reading()
    with pytest.raises(ForgedEvidenceError, match="TVBasis"):
        dataclasses.replace(b.basis, checks=())
    # a saturated bound stays saturated: its raw value cannot be edited down
    big = tv_eform(np.array([0.5, 0.5]), logit_bound(
        np.array([30.0, 0.0]), np.array([[1.0], [2.0]]), layout=RopeLayout.INTERLEAVED,
        scale=1.0))
    assert big.reading().tier is Tier.SATURATED
    with pytest.raises(ForgedEvidenceError):
        dataclasses.replace(big, raw=0.0, value=0.0)


def test_a_logit_bounds_values_cannot_be_made_writable_again() -> None:
    c, _ = _meter()
    before = np.array(c.values)
    for arr in (c.values, c.values.base):
        if isinstance(arr, np.ndarray):
            with pytest.raises(ValueError):
                arr.flags.writeable = True
    with pytest.raises(ValueError):
        c.values[:] = 0
    assert np.array_equal(c.values, before)


def test_copies_are_the_same_sealed_values() -> None:
    _, b = _meter()
    reading = b.reading()
    for value in (reading, reading.evidence, b, b.basis, *_builtin_contracts()):
        for dup in (copy.copy(value), copy.deepcopy(value)):
            assert dup == value


def test_pickles_round_trip_in_process_and_are_revalidated() -> None:
    _, b = _meter()
    for value in (b.reading(), b.reading().evidence, b, *_builtin_contracts(),
                  chain(witness_contract(AtConsume, witness_max=0.02),
                        score_bridge(AtConsume, scale=0.125, q_norm_max=8),
                        softmax_tv_tanh(AtConsume))):
        back = pickle.loads(pickle.dumps(value))
        assert back == value
        if isinstance(value, Contract):
            assert back.tier is value.tier and back.bound(0.01) == value.bound(0.01)


def test_an_edited_pickle_is_refused_on_load() -> None:
    score = score_bridge(AtConsume, scale=0.5, q_norm_max=1)
    data = pickle.dumps(score.evidence)
    # a theorem name edited to one no export holds, or to another exported one
    with pytest.raises(UnknownTheoremError):
        pickle.loads(data.replace(b"score_bridge_contract_sound", b"score_bridge_contract_sounX"))
    name = score.evidence.theorem
    other = next(t for t in sorted(cited_theorems()) if len(t) == len(name) and t != name)
    with pytest.raises(ForgedEvidenceError):
        pickle.loads(data.replace(name.encode(), other.encode()))
    # a contract whose b is edited: in the stage alone, or in the stage and the claim
    weak = score_bridge(AtConsume, scale=0.5, q_norm_max=1) >> softmax_tv_eform(AtConsume)
    raw = pickle.dumps(weak)
    half = b"K\x01K\x02\x86"  # Fraction(1, 2), pickled as its two integers
    assert raw.count(half) >= 2
    for edited in (raw.replace(half, b"K\x01K\x04\x86", 1), raw.replace(half, b"K\x01K\x04\x86")):
        with pytest.raises((EvidenceMismatchError, ForgedEvidenceError)):
            pickle.loads(edited)
    stage = dataclasses.replace(weak.parts[0], a=Fraction(0))

    class Edited:
        def __reduce__(self) -> tuple[Any, ...]:
            return (_restore, ((stage, weak.parts[1]),))

    with pytest.raises(EvidenceMismatchError, match="a="):
        pickle.loads(pickle.dumps(Edited()))
    # a measured contract's evidence switched to a proof of another claim
    measured = Contract(K, L, a=0, b=0, evidence=Measurement("m", samples=2), name="m")
    stage = dataclasses.replace(measured.parts[0], evidence=score.evidence)

    class Switched:
        def __reduce__(self) -> tuple[Any, ...]:
            return (_restore, ((stage,),))

    with pytest.raises(EvidenceMismatchError):
        pickle.loads(pickle.dumps(Switched()))


def test_evidence_pickled_in_one_process_is_refused_in_another() -> None:
    _, b = _meter()
    payloads = [pickle.dumps(v) for v in (b.reading(), b.reading().evidence, b,
                                          score_bridge(AtConsume, scale=0.5, q_norm_max=1))]
    script = (
        "import pickle, sys\n"
        "from witcert_calculus.errors import ForgedEvidenceError\n"
        "out = []\n"
        "for blob in pickle.loads(sys.stdin.buffer.read()):\n"
        "    try:\n"
        "        pickle.loads(blob)\n"
        "        out.append('loaded')\n"
        "    except ForgedEvidenceError:\n"
        "        out.append('refused')\n"
        "print(' '.join(out))\n")
    proc = subprocess.run([sys.executable, "-c", script], input=pickle.dumps(payloads),
                          capture_output=True, check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    assert proc.stdout.decode().split() == ["refused"] * len(payloads)


def _stage_of(c: Contract[Any, Any]) -> Stage:
    return c.parts[0]


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_a_flipped_byte_in_pickled_evidence_is_refused_or_changes_nothing(data: Any) -> None:
    _, b = _meter()
    value = data.draw(st.sampled_from([b.reading(), b.reading().evidence,
                                       score_bridge(AtConsume, scale=0.5, q_norm_max=1)]))
    blob = bytearray(pickle.dumps(value))
    i = data.draw(st.integers(0, len(blob) - 1))
    blob[i] ^= data.draw(st.integers(1, 255))
    try:
        back = pickle.loads(bytes(blob))
    except Exception:  # noqa: BLE001 - any refusal of the damaged stream will do
        return
    if isinstance(value, Contract):
        assert isinstance(back, Contract)
        assert (back.a, back.b, back.delta, back.cap, back.tier) == (
            value.a, value.b, value.delta, value.cap, value.tier)
        assert _stage_of(back).transfer == _stage_of(value).transfer
    elif isinstance(value, Reading):
        assert isinstance(back, Reading)
        assert (back.raw, back.delta, back.evidence, back.tier) == (
            value.raw, value.delta, value.evidence, value.tier)
    else:
        assert back == value


def test_every_builtin_contract_comes_from_its_theorems_schema() -> None:
    from witcert_calculus import identity
    from witcert_calculus.bridges import SCHEMAS
    from witcert_calculus.metrics import metric_name
    from witcert_calculus.schemas import IDENTITY, builtin_schemas

    schemas = builtin_schemas()
    assert set(SCHEMAS.values()) <= set(schemas) and IDENTITY in schemas
    for c in (*_builtin_contracts(), identity(TV)):
        for s in c.parts:
            proof = s.evidence if isinstance(s.evidence, Proof) else s.evidence.proof  # type: ignore[union-attr]
            families = {(x.theorem, x.m_in and metric_name(x.m_in[AtConsume]),
                         x.m_out and metric_name(x.m_out[AtConsume])) for x in schemas}
            key = (proof.theorem, metric_name(s.m_in), metric_name(s.m_out))
            assert key in families or (proof.theorem, None, None) in families, key
    assert IDENTITY.issue(TV).evidence == identity(TV).evidence  # the unit is marked as such
    assert SCHEMAS["score_bridge"].issue(AtConsume, scale=Fraction(1, 8), q_norm_max=8) == \
        score_bridge(AtConsume, scale=0.125, q_norm_max=8)
    assert "with q_norm_max=8, scale=1/8" in score_bridge(
        AtConsume, scale=0.125, q_norm_max=8).explain()
