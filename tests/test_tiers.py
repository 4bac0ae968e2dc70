"""Tiers: lattice laws and machine-decided tiers."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from witcert_calculus import (
    Assumption,
    Composition,
    InvalidValueError,
    Measurement,
    Premise,
    PremiseError,
    Proof,
    Restricted,
    Tier,
    assumptions_of,
    decide_tier,
    weakest,
)
from reference.issued import proof, premise

tiers = st.sampled_from(list(Tier))


def test_order() -> None:
    assert Tier.CERTIFIED > Tier.PARTIALLY_CERTIFIED > Tier.EMPIRICAL > Tier.SATURATED


@given(tiers, tiers, tiers)
def test_weakest_is_a_meet(a: Tier, b: Tier, c: Tier) -> None:
    assert weakest(a, b) == weakest(b, a)
    assert weakest(weakest(a, b), c) == weakest(a, weakest(b, c))
    assert weakest(a, a) == a
    assert weakest(a, b) <= a and weakest(a, b) <= b
    if c <= a and c <= b:
        assert c <= weakest(a, b)


def test_weakest_rejects_non_tiers() -> None:
    with pytest.raises(InvalidValueError, match="tier"):
        weakest(Tier.CERTIFIED, "CERTIFIED")  # type: ignore[arg-type]


def test_tier_is_decided_from_evidence() -> None:
    pf = proof("WitCert.Contract.comp_sound", (premise("a2 >= 0", True),))
    assert decide_tier(pf) is Tier.CERTIFIED
    assert decide_tier(Restricted(pf, "rows with margin > 2*eps")) is Tier.PARTIALLY_CERTIFIED
    assert decide_tier(Measurement("median ratio", samples=10)) is Tier.EMPIRICAL
    assert decide_tier(pf, value=0.3, saturation=1.0) is Tier.CERTIFIED


@pytest.mark.parametrize("value", [1.0, 1.5, math.inf])
def test_saturated_bound_is_never_certified(value: float) -> None:
    pf = proof("WitCert.Contract.comp_sound")
    assert decide_tier(pf, value=value, saturation=1.0) is Tier.SATURATED
    assert decide_tier(Restricted(pf, "x"), value=value, saturation=1.0) is Tier.SATURATED
    # A measurement stays EMPIRICAL: it is not a bound that could saturate.
    assert decide_tier(Measurement("m", 1), value=value, saturation=1.0) is Tier.EMPIRICAL


def test_false_premise_refuses_the_proof() -> None:
    with pytest.raises(PremiseError, match="w >= 0"):
        proof("WitCert.Bridges.pooling_max_caliber", (premise("w >= 0", False),))


def test_composition_takes_weakest_and_restriction() -> None:
    p = proof("WitCert.Contract.comp_sound")
    assert decide_tier(Composition((p, p))) is Tier.CERTIFIED
    assert decide_tier(Composition((p, Measurement("m", 2)))) is Tier.EMPIRICAL
    assert decide_tier(Composition((p, p), restriction="e_in <= 1")) is Tier.PARTIALLY_CERTIFIED


@pytest.mark.parametrize("bad", [
    lambda: proof("comp_sound"), lambda: Measurement("", 1), lambda: Measurement("m", 0),
    lambda: Measurement("m", True), lambda: Restricted(proof("WitCert.Contract.comp_sound"), " "),
    lambda: decide_tier(proof("WitCert.Contract.comp_sound"), value=math.nan),
    lambda: decide_tier("proof"),  # type: ignore[arg-type]
])
def test_bad_evidence_raises(bad: object) -> None:
    with pytest.raises(InvalidValueError):
        bad()  # type: ignore[operator]


# --------------------------------------------------------------------------- assumptions

ASSUMED = Assumption("queries are non-adaptive", reason="no code sees how q was chosen")
ALSO = Assumption("rho_t >= ||v_t - v_hat_t||", reason="the exact values are not passed")
proofs = st.sampled_from([proof("WitCert.Contract.comp_sound"),
                          proof("WitCert.Contract.comp_sound", (premise("a2 >= 0", True),))])


def test_an_assumption_states_what_and_why() -> None:
    assert ASSUMED.statement == "queries are non-adaptive"
    assert "no code" in ASSUMED.reason
    with pytest.raises(AttributeError):
        ASSUMED.statement = "x"  # type: ignore[misc]
    assert not hasattr(ASSUMED, "__dict__")
    for bad in (lambda: Assumption("", reason="r"), lambda: Assumption("s", reason=" "),
                lambda: Assumption(3, reason="r")):  # type: ignore[arg-type]
        with pytest.raises(InvalidValueError):
            bad()


@given(proofs, st.lists(st.sampled_from([ASSUMED, ALSO]), min_size=1, max_size=3),
       st.sampled_from(["", "rows with margin > 2*eps"]),
       st.one_of(st.none(), st.floats(0.0, 0.999)))
def test_an_assumption_never_yields_certified(proof: Proof, assumed: list[Assumption],
                                              subset: str, value: float | None) -> None:
    restricted = Restricted(proof, subset, assumptions=tuple(assumed))
    assert restricted.subset.strip()  # the subset is stated by the assumptions when not given
    for ev in (restricted, Composition((proof, restricted)), Composition((restricted, proof)),
               Composition((Composition((proof, restricted)), proof))):
        assert decide_tier(ev, value=value, saturation=1.0) is Tier.PARTIALLY_CERTIFIED
        assert set(assumptions_of(ev)) == set(assumed)
        # saturation still wins
        assert decide_tier(ev, value=1.0, saturation=1.0) is Tier.SATURATED


def test_assumptions_are_collected_once_in_order() -> None:
    p = proof("WitCert.Contract.comp_sound")
    ev = Composition((Restricted(p, assumptions=(ASSUMED, ALSO)), p,
                      Restricted(p, assumptions=(ALSO,))))
    assert assumptions_of(ev) == (ASSUMED, ALSO)
    assert assumptions_of(p) == () and assumptions_of(Measurement("m", 1)) == ()
    assert "queries are non-adaptive" in Restricted(p, assumptions=(ASSUMED,)).subset


def test_an_assumption_is_not_a_premise() -> None:
    """Only a Restricted carries assumptions: a proof's premises are checked truth values."""
    with pytest.raises(InvalidValueError, match="Assumption"):
        proof("WitCert.Contract.comp_sound", (ASSUMED,))  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match="holds"):
        premise("a2 >= 0", 1)  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match="statement"):
        premise("  ", True)
    with pytest.raises(InvalidValueError, match="assumptions"):
        Restricted(proof("WitCert.Contract.comp_sound"), assumptions=("x",))  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match="subset"):
        Restricted(proof("WitCert.Contract.comp_sound"))
