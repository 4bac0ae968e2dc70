"""Bridges and local contracts: numpy checks, 50-digit references, adversarial hypothesis tests."""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import mpmath
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from witcert_calculus import (
    AtConsume,
    AttentionTV,
    Contract,
    InvalidValueError,
    LogitLinf,
    PremiseError,
    SelectorMass,
    Tier,
    empirical_ratio_bridge,
    latent_witness_contract,
    pooling,
    rank_prefix_selection,
    rank_prefix_stable,
    recurrence,
    score_bridge,
    softmax_tv_affine,
    softmax_tv_eform,
    softmax_tv_tanh,
    softmax_tv_tanh_osc,
    witness_contract,
)
from witcert_calculus import bridges
from witcert_calculus.metrics import PerTokenL2, PooledError
from reference.issued import contract

finite = st.floats(min_value=-8, max_value=8, allow_nan=False)
NOISE = mpmath.mpf("1e-45")  # accuracy of the 50-digit reference (rounding of exp and sums)


def tv50(logits: list[float], delta: list[float]) -> mpmath.mpf:
    """Total variation between softmax(s) and softmax(s + delta), with 50 digits."""
    with mpmath.workdps(50):
        s = [mpmath.mpf(x) for x in logits]
        t = [mpmath.mpf(x) + mpmath.mpf(d) for x, d in zip(logits, delta, strict=True)]
        zs, zt = mpmath.fsum(mpmath.exp(x) for x in s), mpmath.fsum(mpmath.exp(x) for x in t)
        return mpmath.fsum(abs(mpmath.exp(a) / zs - mpmath.exp(b) / zt) for a, b in zip(s, t)) / 2


@st.composite
def perturbed_logits(draw: st.DrawFn) -> tuple[list[float], list[float], float]:
    n = draw(st.integers(2, 8))
    logits = draw(st.lists(finite, min_size=n, max_size=n))
    eps = draw(st.floats(min_value=0, max_value=3))
    # Extreme sign patterns (every entry at +-eps) as well as interior points.
    signs = draw(st.lists(st.sampled_from([-1.0, 1.0, 0.0, 0.5, -0.5]), min_size=n, max_size=n))
    return logits, [s * eps for s in signs], eps


def worst_violation(bound: Callable[[float], float], samples: list[tuple[list[float], list[float], float]]) -> float:
    return max(float(tv50(s, d)) - bound(e) for s, d, e in samples)


@given(perturbed_logits())
def test_eform_bridge_is_sound(case: tuple[list[float], list[float], float]) -> None:
    logits, delta, eps = case
    assert tv50(logits, delta) - NOISE <= softmax_tv_eform(AtConsume).bound(eps).raw


@given(perturbed_logits())
def test_tanh_bridges_are_sound(case: tuple[list[float], list[float], float]) -> None:
    logits, delta, eps = case
    assert tv50(logits, delta) - NOISE <= softmax_tv_tanh(AtConsume).bound(eps).raw
    osc = max(delta) - min(delta)
    assert tv50(logits, delta) - NOISE <= softmax_tv_tanh_osc(AtConsume).bound(osc).raw


@given(perturbed_logits(), st.floats(min_value=0, max_value=1))
def test_affine_bridge_is_sound_on_its_domain(case: tuple[list[float], list[float], float],
                                              eps0: float) -> None:
    logits, delta, eps = case
    c = softmax_tv_affine(AtConsume, eps0=eps0)
    if eps > eps0:
        with pytest.raises(InvalidValueError):
            c.bound(eps)
        return
    assert tv50(logits, delta) - NOISE <= c.bound(eps).raw


def test_a_wrong_bridge_would_be_caught() -> None:
    """The adversarial generator finds violations of a plausible but wrong transfer."""
    rng = np.random.default_rng(0)
    samples = []
    for _ in range(200):
        n, eps = int(rng.integers(2, 6)), float(rng.uniform(0.5, 2.0))
        samples.append((rng.normal(size=n).tolist(), (rng.choice([-1.0, 1.0], size=n) * eps).tolist(), eps))
    assert worst_violation(lambda e: math.tanh(e / 4), samples) > 0  # too optimistic by 2x
    assert worst_violation(lambda e: softmax_tv_tanh(AtConsume).bound(e).raw, samples) <= 0


def test_sharp_tanh_is_attained_two_point() -> None:
    """tanh(osc/4) is tight: two tokens, errors (0, osc), the second of mass 1/(1 + e^{osc/2})."""
    osc = 1.2
    y = 1 / (1 + math.exp(osc / 2))
    tv = float(tv50([math.log(1 - y), math.log(y)], [0.0, osc]))
    assert tv == pytest.approx(math.tanh(osc / 4), rel=1e-12)
    assert tv <= softmax_tv_tanh_osc(AtConsume).bound(osc).raw


@given(st.integers(1, 32).flatmap(lambda d: st.tuples(
    st.lists(finite, min_size=d, max_size=d), st.lists(finite, min_size=d, max_size=d))),
    st.floats(min_value=1e-3, max_value=2))
def test_score_bridge_cauchy_schwarz(vecs: tuple[list[float], list[float]], scale: float) -> None:
    def norm_up(v: list[float]) -> float:  # 50 digits: float norms of tiny vectors underflow
        with mpmath.workdps(50):
            return math.nextafter(float(mpmath.sqrt(mpmath.fsum(mpmath.mpf(x) ** 2 for x in v))),
                                  math.inf)

    qn = norm_up(vecs[0])
    c = score_bridge(AtConsume, scale=scale, q_norm_max=qn)
    dk_norm = norm_up(vecs[1])
    with mpmath.workdps(50):
        true = abs(mpmath.mpf(scale) * mpmath.fsum(mpmath.mpf(a) * mpmath.mpf(b) for a, b in zip(vecs[0], vecs[1])))
    assert true <= c.bound(dk_norm).raw
    assert c.tier is Tier.CERTIFIED


@given(st.lists(st.floats(min_value=0, max_value=1), min_size=1, max_size=12),
       st.lists(st.floats(min_value=-5, max_value=5), min_size=12, max_size=12))
def test_pooling_both_calibers(raw_w: list[float], e: list[float]) -> None:
    total = sum(raw_w)
    w = [x / total for x in raw_w] if total > 0 else [1.0 / len(raw_w)] * len(raw_w)
    e = e[: len(w)]
    p = pooling(AtConsume, weights=w)
    pooled = abs(sum(Fraction(a) * Fraction(b) for a, b in zip(w, e)))
    with mpmath.workdps(50):
        l2e = math.nextafter(float(mpmath.sqrt(mpmath.fsum(mpmath.mpf(x) ** 2 for x in e))), math.inf)
    assert Fraction(l2e) ** 2 >= sum(Fraction(x) ** 2 for x in e)
    assert pooled <= Fraction(p.l2.bound(l2e).raw)
    assert pooled <= Fraction(p.max.bound(max(abs(x) for x in e)).raw)
    assert Fraction(p.l2.a) ** 2 >= sum(Fraction(x) ** 2 for x in w)


def test_pooling_offers_both_and_refuses_negative_weights() -> None:
    p = pooling(AtConsume, weights=np.full(16, 1 / 16))
    assert float(p.max.a) == pytest.approx(1.0) and float(p.l2.a) == pytest.approx(0.25)
    with pytest.raises(InvalidValueError, match=r"weights\[1\]"):
        pooling(AtConsume, weights=[0.5, -0.1, 0.6])
    with pytest.raises(InvalidValueError, match=r"weights\[0\]"):
        pooling(AtConsume, weights=[math.nan])


@st.composite
def selections(draw: st.DrawFn) -> tuple[list[Fraction], list[Fraction]]:
    n = draw(st.integers(2, 10))
    pw = draw(st.lists(st.integers(0, 100), min_size=n, max_size=n))
    qw = draw(st.lists(st.integers(0, 100), min_size=n, max_size=n))
    keep_p = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    keep_q = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    pw = [w if k else 0 for w, k in zip(pw, keep_p)]
    qw = [w if k else 0 for w, k in zip(qw, keep_q)]
    if sum(pw) == 0:
        pw[0] = 1
    if sum(qw) == 0:
        qw[-1] = 1
    return [Fraction(x, sum(pw)) for x in pw], [Fraction(x, sum(qw)) for x in qw]


@given(selections())
def test_rank_prefix_selection_exact(pq: tuple[list[Fraction], list[Fraction]]) -> None:
    p, q = pq
    tv = sum((abs(a - b) for a, b in zip(p, q)), Fraction(0)) / 2
    both = [i for i in range(len(p)) if p[i] > 0 and q[i] > 0]
    m_out = sum((p[i] for i in range(len(p)) if q[i] == 0), Fraction(0))
    m_in = sum((q[i] for i in range(len(p)) if p[i] == 0), Fraction(0))
    inner = sum((abs(p[i] - q[i]) for i in both), Fraction(0)) / 2
    c = rank_prefix_selection(AtConsume, m_out=m_out, m_in=m_in)
    assert (c.a, c.b) == (1, (m_out + m_in) / 2)
    assert tv <= Fraction(c.bound(inner).raw)


@given(st.integers(3, 12).flatmap(lambda n: st.lists(st.floats(-10, 10), min_size=n, max_size=n)),
       st.floats(0, 1), st.data())
def test_rank_prefix_stable_rows_keep_their_top_set(scores: list[float], eps: float,
                                                    data: st.DataObject) -> None:
    k = data.draw(st.integers(1, len(scores) - 1))
    rows = rank_prefix_stable(scores, k=k, eps=eps)
    noise = data.draw(st.lists(st.floats(-1, 1), min_size=len(scores), max_size=len(scores)))
    moved = np.array(scores) + np.array(noise) * eps
    if rows.stable[0]:
        assert set(np.argsort(-np.array(scores))[:k]) == set(np.argsort(-moved)[:k])


def test_rank_prefix_stable_validates() -> None:
    with pytest.raises(InvalidValueError, match="k"):
        rank_prefix_stable([1.0, 2.0], k=2, eps=0.1)
    with pytest.raises(InvalidValueError, match="eps"):
        rank_prefix_stable([1.0, 2.0], k=1, eps=-1.0)
    rows = rank_prefix_stable([[5.0, 1.0, 0.0], [1.0, 0.9, 0.0]], k=1, eps=0.1)
    assert rows.stable.tolist() == [True, False] and rows.fraction == 0.5
    assert "2*eps" in rows.subset


@given(st.lists(st.tuples(st.fractions(0, 2, max_denominator=64),
                          st.fractions(0, 1, max_denominator=64)), min_size=1, max_size=20),
       st.fractions(0, 5, max_denominator=64))
def test_recurrence_composes_exactly(steps: list[tuple[Fraction, Fraction]], e0: Fraction) -> None:
    r = recurrence(AtConsume, a_steps=[float(a) for a, _ in steps], b_steps=[float(b) for _, b in steps])
    e = Fraction(float(e0))
    for a, b in steps:
        e = Fraction(float(a)) * e + Fraction(float(b))  # the adversary meets each step's bound
    assert e <= Fraction(r.contract.bound(float(e0)).raw)


def test_recurrence_reports_both_calibers() -> None:
    r = recurrence(AtConsume, a_steps=[0.99, 0.01])
    assert r.mean_caliber == pytest.approx(math.log(0.5))
    assert r.mean_log_a == pytest.approx((math.log(0.99) + math.log(0.01)) / 2)
    assert r.half_life == pytest.approx(math.log(2) / -r.mean_log_a)
    grow = recurrence(AtConsume, a_steps=[1.5, 1.5])
    assert grow.half_life == math.inf
    with pytest.raises(InvalidValueError, match=r"a_steps\[1\]"):
        recurrence(AtConsume, a_steps=[0.5, -0.5])


def test_empirical_bridge_makes_chains_empirical() -> None:
    c = empirical_ratio_bridge(SelectorMass[AtConsume], AttentionTV[AtConsume], ratio=0.9,
                               samples=100, statistic="median", set_type="top-8 pages")
    assert c.tier is Tier.EMPIRICAL
    sel = rank_prefix_selection(AtConsume, m_out=0.0, m_in=0.0)
    assert (c >> sel).tier is Tier.EMPIRICAL
    with pytest.raises(InvalidValueError, match="samples"):
        empirical_ratio_bridge(SelectorMass[AtConsume], AttentionTV[AtConsume], ratio=0.9,
                               samples=0, statistic="median", set_type="x")


def test_witness_contract_and_bad_arguments() -> None:
    w = witness_contract(AtConsume, witness_max=0.5)
    assert w.bound(0.0).raw == 0.5 and w.bound(123.0).raw == 123.5
    assert (w.a, w.b) == (Fraction(1), Fraction(1, 2))
    with pytest.raises(InvalidValueError, match="scale"):
        score_bridge(AtConsume, scale=0.0, q_norm_max=1.0)
    with pytest.raises(InvalidValueError, match="q_norm_max"):
        score_bridge(AtConsume, scale=1.0, q_norm_max=-1.0)
    with pytest.raises(InvalidValueError, match="m_out"):
        rank_prefix_selection(AtConsume, m_out=1.5, m_in=0.0)


def test_every_bridge_names_a_lean_theorem() -> None:
    for rule, theorem in bridges.THEOREMS.items():
        assert theorem.startswith("WitCert."), rule
    assert softmax_tv_eform(AtConsume).theorems == ("WitCert.Semantic.softmax_tv_eform_contract_sound",)
    assert LogitLinf[AtConsume] == softmax_tv_eform(AtConsume).m_in
    with pytest.raises(PremiseError):
        contract(PerTokenL2[AtConsume], PooledError[AtConsume], a=1, b=0,
                 theorem=bridges.THEOREMS["pooling.l2"], premises=(("w >= 0", False),),
                 name="pooling (l2 caliber)")


def _norm_up(v: np.ndarray) -> Fraction:
    """An exact upper bound on the Euclidean norm of a float vector (a stored witness)."""
    sq = sum((Fraction(float(x)) ** 2 for x in v), Fraction(0))
    root = Fraction(math.isqrt(math.ceil(sq * 2**80)) + 1, 2**40)
    assert root * root >= sq
    return root


@pytest.mark.parametrize("make", [witness_contract, latent_witness_contract])
def test_a_witness_after_an_inexact_stage_counts_the_upstream_error(
        make: Callable[..., Contract[Any, Any]]) -> None:
    """An entry stored from an inexact input is off from the exact one by the input's error
    plus its stored residual: with the residual along the input's error the two add up, and a
    witness contract that ignored its input (a = 0) would bound that by the witness alone."""
    k = np.array([0.3, -1.2, 0.7, 2.0])
    direction = np.array([1.0, -1.0, 1.0, 1.0]) / 2.0
    first = k + 0.25 * direction  # stored once (residual norm 0.25) ...
    second = first + 0.125 * direction  # ... and requantized (residual norm 0.125)
    w1, w2 = _norm_up(first - k), _norm_up(second - first)
    chained = make(AtConsume, witness_max=w1) >> make(AtConsume, witness_max=w2)
    true_error = float(np.linalg.norm(second - k))
    assert true_error > float(w2) + 0.1  # the case a = 0 gets wrong
    assert chained.bound(0.0).value >= true_error
    assert chained.tier is Tier.CERTIFIED and chained.b == w1 + w2


@given(st.lists(st.tuples(st.floats(-4, 4), st.floats(-4, 4), st.floats(-4, 4)),
                min_size=1, max_size=12),
       st.sampled_from([1 / 64, 1 / 8, 1 / 2]), st.sampled_from([1 / 4, 1.0]))
def test_two_quantizers_in_series_stay_within_the_chained_witnesses(
        rows: list[tuple[float, float, float]], fine: float, coarse: float) -> None:
    """Real rounding twice (a fine grid, then a coarse one), each stage's witness its stored
    residual's norm rounded up: the chain bounds the final entry's distance from the exact one."""
    k = np.array([x for x, _, _ in rows])
    first = np.round(k / fine) * fine
    second = np.round(first / coarse) * coarse
    chained = (witness_contract(AtConsume, witness_max=_norm_up(first - k))
               >> witness_contract(AtConsume, witness_max=_norm_up(second - first)))
    assert chained.bound(0.0).value >= float(np.linalg.norm(second - k))
