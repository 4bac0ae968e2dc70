"""Contracts: construction, composition laws, domain propagation, readings."""

from __future__ import annotations

import math
import pickle
from fractions import Fraction

import mpmath
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from witcert_calculus import (
    AtConsume,
    AttentionTV,
    AtWrite,
    Contract,
    InvalidValueError,
    KeyResidualAbs,
    LogitLinf,
    Measurement,
    MetricMismatchError,
    NotAMetricError,
    OutOfDomainError,
    Proof,
    Reading,
    Regime,
    RegimeMismatchError,
    Restricted,
    Tier,
    Transfer,
    TransferKind,
    chain,
    identity,
    weakest,
)
from reference.issued import contract, proof, reading, stage

K = KeyResidualAbs[AtConsume]
L = LogitLinf[AtConsume]
T = AttentionTV[AtConsume]
P = proof("WitCert.Contract.comp_sound")
coef = st.fractions(min_value=0, max_value=20, max_denominator=1000)
small = st.fractions(min_value=0, max_value=Fraction(1, 5), max_denominator=1000)
evidence = st.sampled_from([P, Restricted(P, "rows with margin > 2*eps"), Measurement("m", 5)])


def kk(a: Fraction, b: Fraction, ev: object = P, delta: Fraction = Fraction(0),
       cap: Fraction | None = None, name: str = "s") -> Contract[KeyResidualAbs[AtConsume], KeyResidualAbs[AtConsume]]:
    return stage(K, K, a=a, b=b, evidence=ev, name=name, delta=delta, cap=cap)  # type: ignore[arg-type]


@given(coef, coef, coef, coef, st.fractions(min_value=0, max_value=50, max_denominator=1000))
def test_composition_coefficients_and_soundness(a1: Fraction, b1: Fraction, a2: Fraction,
                                                b2: Fraction, e_in: Fraction) -> None:
    c = kk(a1, b1) >> kk(a2, b2)
    assert (c.a, c.b) == (a2 * a1, a2 * b1 + b2)
    # The adversary pushes each stage to its bound: the composite must still hold.
    worst = a2 * (a1 * e_in + b1) + b2
    assert Fraction(c.bound(e_in).raw) >= worst


@given(coef, coef, coef, coef, coef, coef, evidence, evidence, evidence)
def test_associativity_and_weakest_tier(a1: Fraction, b1: Fraction, a2: Fraction, b2: Fraction,
                                        a3: Fraction, b3: Fraction, e1: object, e2: object,
                                        e3: object) -> None:
    c1, c2, c3 = kk(a1, b1, e1, name="1"), kk(a2, b2, e2, name="2"), kk(a3, b3, e3, name="3")
    left, right = (c1 >> c2) >> c3, c1 >> (c2 >> c3)
    assert left == right
    assert left == chain(c1, c2, c3) == c3 @ c2 @ c1 == c1.then(c2).then(c3)
    assert left.tier == weakest(c1.tier, c2.tier, c3.tier)


@given(coef, coef, evidence)
def test_identity_laws(a: Fraction, b: Fraction, ev: object) -> None:
    c = kk(a, b, ev)
    assert identity(K) >> c == c
    assert c >> identity(K) == c
    assert identity(K) >> identity(K) == identity(K)


@given(small, small)
def test_deltas_add(d1: Fraction, d2: Fraction) -> None:
    c = kk(Fraction(1), Fraction(0), delta=d1) >> kk(Fraction(1), Fraction(0), delta=d2)
    assert c.delta == d1 + d2


def test_union_bound_reaching_one_is_refused() -> None:
    with pytest.raises(InvalidValueError, match="union bound"):
        kk(Fraction(1), Fraction(0), delta=Fraction(1, 2)) >> kk(Fraction(1), Fraction(0),
                                                                 delta=Fraction(1, 2))


@given(st.fractions(min_value=Fraction(1, 100), max_value=5, max_denominator=100), coef,
       st.fractions(min_value=0, max_value=10, max_denominator=100),
       st.one_of(st.none(), st.fractions(min_value=0, max_value=10, max_denominator=100)))
def test_domain_propagation(a1: Fraction, b1: Fraction, cap2: Fraction,
                            cap1: Fraction | None) -> None:
    c1 = kk(a1, b1, cap=cap1)
    c2 = kk(Fraction(1), Fraction(0), cap=cap2)
    if b1 > cap2:
        with pytest.raises(InvalidValueError, match="always leaves"):
            c1 >> c2
        return
    c = c1 >> c2
    assert c.cap is not None
    # On the composite's domain, stage 1 never leaves stage 2's domain.
    assert a1 * c.cap + b1 <= cap2
    if cap1 is not None:
        assert c.cap <= cap1
    stays = cap1 is not None and a1 * cap1 + b1 <= cap2
    assert c.tier == Tier.PARTIALLY_CERTIFIED
    assert (c.evidence == c1.evidence) or stays or "e_in <=" in str(c.evidence)
    with pytest.raises(OutOfDomainError):
        c.bound(float(c.cap) * 1.001 + 1e-9)
    assert c.bound(float(c.cap) * 0.999).tier == Tier.CERTIFIED


def test_composite_never_exceeds_a_stage_domain_unannounced() -> None:
    c = kk(Fraction(2), Fraction(0)) >> kk(Fraction(1), Fraction(0), cap=Fraction(1))
    assert c.cap == Fraction(1, 2) and c.tier is Tier.PARTIALLY_CERTIFIED
    assert c.subset is not None and "1/2" in c.subset
    with pytest.raises(OutOfDomainError, match="0.75"):
        c.bound(0.75)


@given(st.floats(min_value=0, max_value=3), st.fractions(min_value=0, max_value=4, max_denominator=64))
def test_nonaffine_composition_is_sound_against_50_digits(x: float, a: Fraction) -> None:
    score = stage(K, L, a=a, b=0, evidence=P, name="score")
    tv = stage(L, T, a=0, b=1, evidence=P, name="tv", transfer=Transfer(TransferKind.EXP_TV))
    r = (score >> tv).bound(x)
    with mpmath.workdps(50):
        eps = mpmath.mpf(a.numerator) / a.denominator * mpmath.mpf(x)
        exact = min(mpmath.mpf(1), (mpmath.exp(2 * eps) - 1) / 2)
    assert mpmath.mpf(r.raw) >= exact
    assert r.value <= 1.0


@pytest.mark.parametrize(("kw", "name"), [
    ({"a": math.nan}, "a"), ({"a": -1.0}, "a"), ({"b": math.inf}, "b"), ({"b": -0.5}, "b"),
    ({"delta": 1.0}, "delta"), ({"delta": -0.1}, "delta"), ({"a": True}, "a"), ({"a": "1"}, "a"),
    ({"cap": math.nan}, "cap"), ({"name": ""}, "name"),
])
def test_bad_coefficients_raise_naming_the_value(kw: dict[str, object], name: str) -> None:
    args: dict[str, object] = {"a": 1, "b": 0, "evidence": P, "name": "s"}
    args.update(kw)
    with pytest.raises(InvalidValueError, match=name):
        stage(K, K, **args)  # type: ignore[arg-type]


def test_wrong_metric_class_raises() -> None:
    with pytest.raises(NotAMetricError):
        stage(KeyResidualAbs, K, a=1, b=0, evidence=P, name="bare")
    with pytest.raises(NotAMetricError):
        stage(float, K, a=1, b=0, evidence=P, name="float")  # type: ignore[type-var]


def test_mismatch_names_both_metrics_sites_and_stages() -> None:
    write = stage(KeyResidualAbs[AtWrite], KeyResidualAbs[AtWrite], a=1, b=0, evidence=P,
                     name="writer")
    reader = stage(K, L, a=1, b=0, evidence=P, name="reader")
    with pytest.raises(MetricMismatchError,
                       match=r"'writer' produces KeyResidualAbs\[AtWrite\].*'reader' expects "
                             r"KeyResidualAbs\[AtConsume\]"):
        write >> reader  # type: ignore[operator]


def test_bound_rejects_bad_inputs() -> None:
    c = kk(Fraction(1), Fraction(0))
    for bad in (math.nan, math.inf, -1.0):
        with pytest.raises(InvalidValueError):
            c.bound(bad)


def test_contracts_are_frozen_hashable_picklable() -> None:
    c = kk(Fraction(1, 3), Fraction(1, 7)) >> kk(Fraction(2), Fraction(0))
    with pytest.raises(AttributeError):
        c.a = Fraction(0)  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(c)) == c
    assert hash(c) == hash(pickle.loads(pickle.dumps(c)))
    assert "1/7" in c.explain() or "0.142857" in c.explain()


def test_bound_from_reading_carries_tier_and_delta() -> None:
    r = reading(K, 0.1, evidence=Measurement("observed residual", 3))
    c = stage(K, L, a=2, b=0, evidence=P, name="score", delta=0.01)
    out = c.bound(r)
    assert out.tier is Tier.EMPIRICAL and out.delta == Fraction(0.01)
    with pytest.raises(MetricMismatchError):
        c.bound(reading(L, 0.1, evidence=P))  # type: ignore[arg-type]
    with pytest.raises(RegimeMismatchError):
        c.bound(reading(K, 0.1, evidence=Measurement("m", 1), regime=Regime.MEASURED))


def test_readings_of_different_metric_or_regime_never_mix() -> None:
    a = reading(T, 0.2, evidence=P)
    b = reading(T, 0.3, evidence=P)
    assert (a + b).raw >= 0.5 and (a + b).tier is Tier.CERTIFIED and a < b
    with pytest.raises(RegimeMismatchError, match="LogitLinf"):
        a + reading(L, 0.1, evidence=P)  # type: ignore[operator]
    with pytest.raises(RegimeMismatchError, match="measured"):
        _ = a < reading(T, 0.1, evidence=Measurement("m", 1), regime=Regime.MEASURED)
    with pytest.raises(RegimeMismatchError):
        _ = a <= reading(AttentionTV[AtWrite], 0.1, evidence=P)  # type: ignore[operator]


def test_mean_is_empirical_and_not_a_bound() -> None:
    m = Reading.mean([reading(T, 0.2, evidence=P), reading(T, 0.4, evidence=P)])
    assert m.tier is Tier.EMPIRICAL and m.regime is Regime.MEAN
    assert m.raw == pytest.approx(0.3)
    with pytest.raises(RegimeMismatchError):
        m + m
    with pytest.raises(InvalidValueError):
        Reading.mean([])


def test_saturated_reading_keeps_raw_risk_score() -> None:
    r = reading(T, 3.5, evidence=P)
    assert r.value == 1.0 and r.raw == 3.5 and r.tier is Tier.SATURATED and r.saturated
    with pytest.raises(InvalidValueError):
        reading(T, math.nan, evidence=P)
    with pytest.raises(InvalidValueError):
        reading(T, -0.1, evidence=P)
    with pytest.raises(InvalidValueError, match="Measurement"):
        reading(T, 0.1, evidence=P, regime=Regime.MEASURED)


@given(coef, coef)
def test_float_bound_rounds_upward(a: Fraction, b: Fraction) -> None:
    assume(a > 0)
    x = 0.1
    r = kk(a, b).bound(x)
    assert Fraction(r.raw) >= a * Fraction(x) + b


def test_saturated_or_infinite_input_readings() -> None:
    tv_in = reading(T, math.inf, evidence=P)
    assert tv_in.value == 1.0 and tv_in.tier is Tier.SATURATED
    scale = stage(T, T, a=2, b=Fraction(1, 10), evidence=P, name="x2")
    # The true TV never exceeds 1, so the reported value (not the raw score) is the input.
    assert scale.bound(tv_in).raw == pytest.approx(2.1)
    grow = stage(K, L, a=3, b=0, evidence=P, name="score")
    inf_in = reading(K, math.inf, evidence=P)
    assert inf_in.tier is Tier.SATURATED
    out = grow.bound(inf_in)
    assert out.raw == math.inf and out.tier is Tier.SATURATED
    flat = stage(K, L, a=0, b=Fraction(1, 2), evidence=P, name="flat")
    assert flat.bound(inf_in).raw == 0.5


# ----------------------------------------------------------------------------- what a composite keeps

def _eform_chain(witness_max: float) -> Contract[Any, Any]:
    from witcert_calculus import score_bridge, softmax_tv_eform, witness_contract
    storage = witness_contract(AtConsume, witness_max=witness_max)
    score = score_bridge(AtConsume, scale=64 ** -0.5, q_norm_max=12.0)  # slope 3/2
    return chain(storage, score, softmax_tv_eform(AtConsume))


def test_composition_keeps_the_raw_risk_score() -> None:
    from witcert_calculus import softmax_tv_eform, tv_eform
    eps = 0.702681
    alone = softmax_tv_eform(AtConsume).bound(eps)
    meter = tv_eform([1.0], [eps]).reading()
    assert alone.raw == pytest.approx(1.5385, abs=1e-4)
    exact = (mpmath.exp(2 * mpmath.mpf(eps)) - 1) / 2
    assert alone.raw >= exact and meter.raw >= exact  # both bound (e^{2 eps} - 1)/2 from above
    composed = _eform_chain(eps / 1.5).bound(0.0)
    assert composed.raw == pytest.approx(alone.raw, rel=1e-12)
    assert composed.raw > 1.0 and composed.value == 1.0 and composed.tier is Tier.SATURATED


def test_raw_is_never_below_the_value_and_the_value_never_loosens() -> None:
    from witcert_calculus import softmax_tv_eform
    tv = softmax_tv_eform(AtConsume)
    for eps in (0.0, 0.01, 0.2, 0.5493, 0.7, 3.0, 400.0):
        r = tv.bound(eps)
        exact = (math.exp(2 * eps) - 1) / 2 if eps < 300 else math.inf
        assert r.raw >= exact * (1 - 1e-15)
        assert r.value == min(1.0, r.raw) and r.value >= min(1.0, exact)


def test_explain_total_shows_what_the_composite_bounds() -> None:
    from witcert_calculus import score_bridge, softmax_tv_eform
    # A stage with a = 0 and no transfer (a witness on an exact input, `witness_sound`) makes
    # everything after it one number.
    exact_input = contract(KeyResidualAbs[AtConsume], KeyResidualAbs[AtConsume], a=0,
                           b=Fraction(0.02), theorem="WitCert.Bridges.witness_sound",
                           name="witness on an exact input")
    c = chain(exact_input, score_bridge(AtConsume, scale=64 ** -0.5, q_norm_max=12.0),
              softmax_tv_eform(AtConsume))
    total = c.explain().splitlines()[-1]
    value = c.bound(0.0).value
    assert f"{value:.6g}" in total, total          # the constant it actually bounds: 0.0309183
    assert "0 * e_in + 1" in total and "(exp(2x) - 1) / 2" in total, total
    assert "for every e_in" in total
    # A composite that depends on e_in shows the affine part and the transfer it applies.
    d = chain(score_bridge(AtConsume, scale=1.0, q_norm_max=2.0), softmax_tv_eform(AtConsume))
    line = d.explain().splitlines()[-1]
    assert "min(" in line and "0 * e_in + 1" in line and "(exp(2x) - 1) / 2" in line, line


def test_chain_takes_up_to_eight_stages_and_says_how_to_go_further() -> None:
    from witcert_calculus.contracts import CHAIN_MAX_STAGES
    assert CHAIN_MAX_STAGES == 8
    s = stage(K, K, a=1, b=Fraction(1, 100), evidence=proof("WitCert.Contract.id_sound"),
                 name="s")
    eight = chain(s, s, s, s, s, s, s, s)
    assert eight.b == Fraction(8, 100)
    with pytest.raises(InvalidValueError, match=r"stages=9.*up to 8 stages.*chain\(chain\(c1"):
        chain(s, s, s, s, s, s, s, s, s)  # type: ignore[call-overload]
    nested = chain(eight, s)
    assert nested.b == Fraction(9, 100) and len(nested.stages) == 9


def test_a_chain_with_one_assumed_stage_is_partially_certified_and_says_why() -> None:
    from witcert_calculus import Assumption, score_bridge, softmax_tv_eform, witness_contract
    assumed = Assumption("q_norm_max >= ||q|| for every query the bound covers",
                         reason="the queries are not passed to the contract")
    storage = witness_contract(AtConsume, witness_max=0.01)
    score = score_bridge(AtConsume, scale=0.125, q_norm_max=2.0)
    leap = stage(L, L, a=1, b=0, name="assumed",
                    evidence=Restricted(proof("WitCert.Contract.id_sound"), assumptions=(assumed,)))
    proved = chain(storage, score, softmax_tv_eform(AtConsume))
    c = chain(storage, score, leap, softmax_tv_eform(AtConsume))
    assert proved.tier is Tier.CERTIFIED and proved.assumptions == ()
    assert c.tier is Tier.PARTIALLY_CERTIFIED  # composition keeps the weakest
    assert c.assumptions == (assumed,)
    r = c.bound(0.0)
    assert r.tier is Tier.PARTIALLY_CERTIFIED and r.assumptions == (assumed,)
    assert proved.bound(0.0).tier is Tier.CERTIFIED and proved.bound(0.0).assumptions == ()
    text = c.explain()
    assert "assumed, not checked" in text and assumed.statement in text and assumed.reason in text
    assert "assumed, not checked" not in proved.explain()
    assert text.splitlines()[-1].lstrip().startswith("total:")
    # a reading with an assumption fed into a proved contract keeps it
    fed = softmax_tv_eform(AtConsume).bound(
        reading(L, 0.01, evidence=Restricted(proof("WitCert.Contract.id_sound"),
                                             assumptions=(assumed,))))
    assert fed.tier is Tier.PARTIALLY_CERTIFIED and fed.assumptions == (assumed,)
