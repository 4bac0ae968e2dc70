"""Tests of witcert_calculus.meters.witness: band witnesses, band unitarity under RoPE, logit bound."""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath as mp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
import sympy
from reference import exact, golden, second

from witcert_calculus.errors import InvalidValueError
from witcert_calculus.meters.witness import (
    RopeLayout,
    band_channels,
    band_norms,
    band_pairs,
    band_witness,
    logit_bound,
)
from witcert_calculus.bridges import softmax_tv_eform
from witcert_calculus.meters.tv_forms import tv_meter
from witcert_calculus.meters.witness import LOGIT_BOUND_THEOREM, _pair_channels
from witcert_calculus.meters.witness import logit_linf_reading
from witcert_calculus.metrics import AtConsume, AttentionTV, LogitLinf
from witcert_calculus.tiers import Tier
import pickle

from witcert_calculus.errors import ForgedBoundError
from witcert_calculus.meters.witness import CALLER_LOGIT_BOUND, LogitBound, is_established
from witcert_calculus.numerics.rounding import add_up as _add_up
from witcert_calculus.tiers import Proof, decide_tier

LAYOUTS = (RopeLayout.INTERLEAVED, RopeLayout.HALF_SPLIT)


def rope(x: np.ndarray, positions: np.ndarray, layout: RopeLayout, base: float = 10000.0
         ) -> np.ndarray:
    """A real rotary embedding (float64) at the given positions, in either layout."""
    d = x.shape[-1]
    inv_freq = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)  # (d/2,)
    ang = positions[:, None].astype(np.float64) * inv_freq[None, :]
    cos, sin = np.cos(ang), np.sin(ang)
    if layout is RopeLayout.INTERLEAVED:
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * cos - x1 * sin
        out[..., 1::2] = x0 * sin + x1 * cos
        return out
    # Hugging Face: x * cat(cos, cos) + rotate_half(x) * cat(sin, sin)
    cos2, sin2 = np.concatenate([cos, cos], -1), np.concatenate([sin, sin], -1)
    half = d // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], -1)
    return x * cos2 + rotated * sin2


def exact_norms(x: np.ndarray, d: int, bands: int, layout: RopeLayout) -> list[mp.mpf]:
    pairs = [tuple(int(v) for v in row) for row in _pair_channels(d, layout)]
    return golden.band_norms(list(map(float, x)), pairs, band_pairs(d, bands=bands))


def test_band_pairs_and_channels_cover_every_pair_once() -> None:
    for d in (2, 8, 64, 128, 130):
        for bands in sorted({1, min(2, d // 2), min(3, d // 2), d // 2}):
            ranges = band_pairs(d, bands=bands)
            assert ranges[0][0] == 0 and ranges[-1][1] == d // 2
            assert all(a < b for a, b in ranges)
            assert all(r1[1] == r2[0] for r1, r2 in zip(ranges, ranges[1:]))
            for layout in LAYOUTS:
                chans = band_channels(d, bands=bands, layout=layout)
                assert sorted(np.concatenate(chans).tolist()) == list(range(d))


def test_band_channels_hold_both_coordinates_of_each_pair() -> None:
    d = 16
    half = band_channels(d, bands=2, layout=RopeLayout.HALF_SPLIT)
    assert half[0].tolist() == [0, 1, 2, 3, 8, 9, 10, 11]
    inter = band_channels(d, bands=2, layout=RopeLayout.INTERLEAVED)
    assert inter[0].tolist() == list(range(8))


@pytest.mark.parametrize("layout", LAYOUTS)
@given(seed=st.integers(0, 2**32 - 1), bands=st.sampled_from([1, 2, 4, 8, 16, 32]),
       scale=st.sampled_from([1e-6, 1.0, 1e3]))
def test_band_unitarity_under_real_rope(layout: RopeLayout, seed: int, bands: int,
                                        scale: float) -> None:
    rng = np.random.default_rng(seed)
    d, s = 64, 12
    k = rng.normal(size=(s, d)) * scale
    k_hat = k + rng.normal(size=(s, d)) * scale * 10.0 ** rng.uniform(-4, 0, size=(s, 1))
    positions = rng.integers(0, 1 << 20, size=s)
    pre = band_witness(k_hat - k, bands=bands, layout=layout)
    post = band_witness(rope(k_hat, positions, layout) - rope(k, positions, layout),
                        bands=bands, layout=layout)
    np.testing.assert_allclose(post, pre, rtol=1e-9, atol=0)


def test_wrong_layout_bands_break_unitarity() -> None:
    """A band that splits a rotation pair is not invariant: the pitfall the layouts guard."""
    rng = np.random.default_rng(0)
    d = 64
    r = rng.normal(size=(50, d))
    positions = rng.integers(1, 5000, size=50)
    rotated = rope(r, positions, RopeLayout.HALF_SPLIT)
    right = np.abs(band_witness(rotated, bands=8, layout=RopeLayout.HALF_SPLIT)
                   - band_witness(r, bands=8, layout=RopeLayout.HALF_SPLIT)).max()
    wrong = np.abs(band_witness(rotated, bands=8, layout=RopeLayout.INTERLEAVED)
                   - band_witness(r, bands=8, layout=RopeLayout.INTERLEAVED)).max()
    assert right < 1e-12
    assert wrong > 0.1


@pytest.mark.parametrize("layout", LAYOUTS)
@given(data=st.data())
def test_witness_is_an_upper_bound_close_to_golden(layout: RopeLayout, data: st.DataObject
                                                   ) -> None:
    d = data.draw(st.sampled_from([2, 8, 16, 64]))
    bands = data.draw(st.integers(1, d // 2))
    x = np.array(data.draw(st.lists(
        st.floats(-1e150, 1e150, allow_nan=False) | st.sampled_from([0.0, 1e-300, -5e-324]),
        min_size=d, max_size=d)))
    w = band_witness(x, bands=bands, layout=layout)
    for got, want in zip(w.tolist(), exact_norms(x, d, bands, layout)):
        assert mp.mpf(got) >= want
        assert got <= float(want) * (1 + 1e-12) + 1e-150 * float(np.abs(x).max()) + 1e-322


def test_witness_survives_underflow_and_overflow() -> None:
    tiny = np.array([1e-200, 0.0, 3e-310, 0.0])
    w = band_witness(tiny, bands=2, layout=RopeLayout.INTERLEAVED)
    assert w[0] >= 1e-200 and w[1] >= 3e-310  # no false zero from squaring
    huge = np.array([1e200, 1e200, 0.0, 0.0])
    w = band_witness(huge, bands=2, layout=RopeLayout.INTERLEAVED)
    assert math.isfinite(float(w[0])) and mp.mpf(float(w[0])) >= mp.sqrt(2) * mp.mpf(1e200)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_reduced_precision_storage_rounds_upward(dtype: type) -> None:
    rng = np.random.default_rng(1)
    r = rng.normal(size=(200, 32)) * 10.0 ** rng.uniform(-6, 3, size=(200, 1))
    exact = band_witness(r, bands=4, layout=RopeLayout.HALF_SPLIT)
    stored = band_witness(r, bands=4, layout=RopeLayout.HALF_SPLIT, dtype=dtype)
    assert stored.dtype == np.dtype(dtype)
    assert (stored.astype(np.float64) >= exact).all()
    # nearest rounding would not be an upper bound: the test must be able to fail
    assert (exact.astype(dtype).astype(np.float64) < exact).any()
    big = band_witness(np.array([1e6, 0.0]), bands=1, layout=RopeLayout.HALF_SPLIT,
                       dtype=np.float16)
    assert np.isinf(big[0])  # overflow stays a (vacuous) upper bound


@pytest.mark.parametrize("layout", LAYOUTS)
@given(seed=st.integers(0, 2**32 - 1), bands=st.sampled_from([1, 2, 4, 16]),
       massive=st.booleans())
def test_logit_bound_sound_per_token_post_rope(layout: RopeLayout, seed: int, bands: int,
                                               massive: bool) -> None:
    """|scale <R_m q, R_n k_hat> - scale <R_m q, R_n k>| <= c_t, token by token, exactly."""
    rng = np.random.default_rng(seed)
    d, s = 32, 16
    q = rng.normal(size=d)
    k = rng.normal(size=(s, d))
    r = rng.normal(size=(s, d)) * 10.0 ** rng.uniform(-8, 1, size=(s, 1))
    if massive:  # a massive-activation channel in q and in some residuals
        ch = int(rng.integers(d))
        q[ch] *= 1e4
        r[rng.integers(s), ch] *= 1e4
    # align some residuals with q inside each band: the Cauchy-Schwarz worst case
    r[0] = q * 1e-3
    k_hat = k + r
    r = k_hat - k  # the residual actually handed to the witness
    m = int(rng.integers(0, 1 << 16))
    pos = rng.integers(0, 1 << 16, size=s)
    scale = d ** -0.5
    w = band_witness(k_hat - k, bands=bands, layout=layout)
    c = logit_bound(q, w, layout=layout, scale=scale).values
    qr = rope(q[None, :], np.array([m]), layout)[0]
    kr, khr = rope(k, pos, layout), rope(k_hat, pos, layout)
    for t in range(s):
        with mp.workdps(50):
            err = abs(mp.fsum(mp.mpf(float(a)) * (mp.mpf(float(b1)) - mp.mpf(float(b0)))
                              for a, b0, b1 in zip(qr, kr[t], khr[t]))) * mp.mpf(scale)
        # the rotated vectors carry float64 rounding of the rotation (~1e-16 relative);
        # the witness bound itself is compared against the exact pre-RoPE product below
        assert err <= mp.mpf(float(c[t])) * (1 + 1e-9)
        with mp.workdps(50):
            exact_pre = abs(mp.fsum(mp.mpf(float(a)) * mp.mpf(float(b)) for a, b in
                                    zip(q, r[t]))) * mp.mpf(scale)
        assert exact_pre <= mp.mpf(float(c[t]))


def test_logit_bound_agrees_with_second_implementation_and_golden() -> None:
    rng = np.random.default_rng(7)
    d, bands = 16, 4
    for layout in LAYOUTS:
        q = rng.normal(size=d)
        r = rng.normal(size=(5, d))
        c = logit_bound(q, band_witness(r, bands=bands, layout=layout), layout=layout,
                        scale=0.25).values
        band_of = np.empty(d, dtype=int)
        for b, ch in enumerate(band_channels(d, bands=bands, layout=layout)):
            band_of[ch] = b
        ref2 = second.logit_bound(q.tolist(), r.tolist(), 0.25, band_of.tolist(), bands)
        np.testing.assert_allclose(c, ref2, rtol=1e-12)
        qn = exact_norms(q, d, bands, layout)
        for t in range(5):
            gold = mp.mpf(0.25) * mp.fsum(a * b for a, b in zip(qn, exact_norms(r[t], d, bands,
                                                                               layout)))
            assert mp.mpf(float(c[t])) >= gold
            assert float(c[t]) <= float(gold) * (1 + 1e-12)


def test_logit_bound_exact_on_rationals() -> None:
    """Pythagorean band norms: the bound is an exact rational, matched to the last bits."""
    q = np.array([3.0, 4.0, 0.0, 0.0, 5.0, 12.0, 0.0, 0.0])  # interleaved bands of 2 pairs
    r = np.array([[0.6, 0.8, 0.0, 0.0, 0.0, 0.0, 1.2, 0.5]])
    c = logit_bound(q, band_witness(r, bands=2, layout=RopeLayout.INTERLEAVED),
                    layout=RopeLayout.INTERLEAVED, scale=0.5).values
    want = Fraction(1, 2) * (Fraction(5) * Fraction(1) + Fraction(13) * Fraction(13, 10))
    assert Fraction(float(c[0])) >= want - Fraction(1, 10**15)
    assert abs(Fraction(float(c[0])) - want) < Fraction(1, 10**12)
    assert LOGIT_BOUND_THEOREM == "WitCert.Semantic.logit_bound_norms_meter_sound"


def test_logit_bound_against_sympy_square_roots() -> None:
    """Non-Pythagorean rationals: c >= scale * sum_b sqrt(q_b^2) sqrt(r_b^2), exactly in sympy."""
    rng = np.random.default_rng(13)
    for _ in range(20):
        q = rng.integers(-9, 10, size=8) / 4.0
        r = rng.integers(-9, 10, size=(3, 8)) / 8.0
        layout = LAYOUTS[int(rng.integers(2))]
        c = logit_bound(q, band_witness(r, bands=2, layout=layout), layout=layout,
                        scale=0.5).values
        chans = band_channels(8, bands=2, layout=layout)
        for t in range(3):
            want = sympy.Rational(1, 2) * sum(
                (exact.norm([Fraction(float(q[i])) for i in ch])
                 * exact.norm([Fraction(float(r[t, i])) for i in ch]) for ch in chans),
                sympy.Integer(0))
            assert sympy.Rational(Fraction(float(c[t])).numerator,
                                  Fraction(float(c[t])).denominator) >= want
            assert float(c[t]) == pytest.approx(float(sympy.N(want, 30)), rel=1e-13, abs=1e-300)


def test_band_norms_of_query_match_witness_of_same_vector() -> None:
    x = np.arange(8.0)
    np.testing.assert_array_equal(band_norms(x, bands=2, layout=RopeLayout.HALF_SPLIT),
                                  band_witness(x, bands=2, layout=RopeLayout.HALF_SPLIT))


def test_invalid_inputs_raise_typed_errors_naming_the_value() -> None:
    with pytest.raises(InvalidValueError, match="head_dim=7"):
        band_pairs(7, bands=1)
    with pytest.raises(InvalidValueError, match="bands=5"):
        band_pairs(8, bands=5)
    with pytest.raises(InvalidValueError, match=r"residual.*NaN"):
        band_witness(np.array([np.nan, 0.0]), bands=1, layout=RopeLayout.INTERLEAVED)
    with pytest.raises(InvalidValueError, match=r"residual\[1\]=inf"):
        band_witness(np.array([0.0, np.inf]), bands=1, layout=RopeLayout.INTERLEAVED)
    with pytest.raises(InvalidValueError, match="scale=0.0"):
        logit_bound(np.ones(4), np.ones((2, 2)), layout=RopeLayout.INTERLEAVED, scale=0.0)
    with pytest.raises(InvalidValueError, match=r"witness\[0, 1\]=-1.0"):
        logit_bound(np.ones(4), np.array([[1.0, -1.0]]), layout=RopeLayout.INTERLEAVED,
                    scale=1.0)
    with pytest.raises(InvalidValueError, match="dtype"):
        band_witness(np.ones(4), bands=1, layout=RopeLayout.INTERLEAVED, dtype=np.int32)


def test_logit_reading_chains_into_the_scalar_softmax_bridge() -> None:
    rng = np.random.default_rng(12)
    d, s = 32, 20
    q = rng.normal(size=d)
    r = rng.normal(size=(s, d)) * 1e-3
    layout = RopeLayout.HALF_SPLIT
    c = logit_bound(q, band_witness(r, bands=4, layout=layout), layout=layout, scale=d ** -0.5)
    reading = logit_linf_reading(c)
    assert reading.metric == LogitLinf[AtConsume] and reading.tier is Tier.CERTIFIED
    assert reading.raw == float(c.values.max())
    tv = softmax_tv_eform(AtConsume).bound(reading)
    assert tv.metric == AttentionTV[AtConsume]
    assert set(tv.evidence.__repr__().split("'")) >= {LOGIT_BOUND_THEOREM}
    p = np.exp(rng.normal(size=s))
    p /= p.sum()
    assert tv_meter(p, c).raw <= tv.raw  # the per-token meter is never looser
    with pytest.raises(InvalidValueError, match="empty"):
        logit_linf_reading(np.array([]))


# --------------------------------------------------------------------------- LogitBound

def _tier_a(seed: int = 3, s: int = 6, d: int = 8) -> tuple[LogitBound[np.ndarray], np.ndarray]:
    rng = np.random.default_rng(seed)
    q = rng.normal(size=d)
    r = rng.normal(size=(s, d)) * 1e-2
    layout = RopeLayout.INTERLEAVED
    return logit_bound(q, band_witness(r, bands=2, layout=layout), layout=layout,
                       scale=d ** -0.5), np.abs(d ** -0.5 * (r @ q))


def test_logit_bound_is_established_by_construction() -> None:
    c, err = _tier_a()
    assert isinstance(c, LogitBound) and is_established(c)
    assert np.all(c.values >= err) and c.delta == 0 and c.assumptions == ()
    assert c.source == "witcert_calculus.meters.witness.logit_bound"
    assert isinstance(c.evidence, Proof) and c.evidence.theorem == LOGIT_BOUND_THEOREM
    assert all(p.holds for p in c.evidence.premises) and c.evidence.premises
    assert not is_established(c.values) and not is_established(None)


def test_a_forged_logit_bound_is_refused() -> None:
    c, _ = _tier_a()
    with pytest.raises(ForgedBoundError, match="LogitBound") as info:
        LogitBound(np.zeros(6), evidence=c.evidence, delta=Fraction(0),  # type: ignore[call-arg]
                   source="mine", add=np.add)
    assert info.value.kind == "LogitBound" and "witness.logit_bound" in str(info.value)
    assert isinstance(info.value, TypeError)
    with pytest.raises(ForgedBoundError):
        LogitBound(np.zeros(6), evidence=c.evidence, delta=Fraction(0), source="mine",
                   add=np.add, seal=object())
    # a bound built around the constructor is never taken as established
    fake = object.__new__(LogitBound)
    assert not is_established(fake)
    with pytest.raises(ForgedBoundError):
        tv_meter(np.full(6, 1 / 6), fake)
    with pytest.raises(ForgedBoundError):
        logit_linf_reading(fake)


def test_a_logit_bound_is_frozen_and_its_values_read_only() -> None:
    c, _ = _tier_a()
    with pytest.raises(AttributeError):
        c.values = np.zeros(6)  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del c.delta  # type: ignore[misc]
    with pytest.raises(ValueError):
        c.values[0] = 0.0
    with pytest.raises(TypeError, match="pickle"):
        pickle.dumps(c)


def test_sums_of_bounds_stay_established_and_outward() -> None:
    c1, e1 = _tier_a(1)
    c2, e2 = _tier_a(2)
    total = c1 + c2
    assert is_established(total) and total.delta == 0
    assert decide_tier(total.evidence) is Tier.CERTIFIED
    for a, b, t in zip(c1.values, c2.values, total.values):
        assert Fraction(float(t)) >= Fraction(float(a)) + Fraction(float(b))
    assert np.all(total.values >= e1 + e2)
    assert sum([c1, c2]).values.tolist() == total.values.tolist()  # type: ignore[union-attr]
    # a plain array added to a bound is a plain array: the sum is no longer established
    plain = c1 + np.ones(6)
    assert not isinstance(plain, LogitBound) and not is_established(plain)
    assert not isinstance(np.ones(6) + c1, LogitBound)
    with pytest.raises(InvalidValueError, match="shape"):
        _ = c1 + _tier_a(1, s=5)[0]
    tiny = np.array([1.0, 2.0**-60, 0.0])
    assert float(_add_up(tiny, np.array([2.0**-60, 1.0, 0.0]))[0]) > 1.0  # rounded up
    assert _add_up(tiny, np.zeros(3)).tolist() == tiny.tolist()  # exact sums stay exact


def test_logit_linf_reading_of_a_callers_array_is_assumed() -> None:
    c, _ = _tier_a()
    assert logit_linf_reading(c).tier is Tier.CERTIFIED and logit_linf_reading(c).assumptions == ()
    raw = logit_linf_reading(np.array([0.1, 0.3]))
    assert raw.tier is Tier.PARTIALLY_CERTIFIED
    assert raw.assumptions == (CALLER_LOGIT_BOUND,)
    assert "caller" in CALLER_LOGIT_BOUND.statement and CALLER_LOGIT_BOUND.reason


@given(st.floats(0, 1e300), st.floats(0, 1e300))
def test_add_up_never_falls_below_the_exact_sum(a: float, b: float) -> None:
    got = float(_add_up(np.array([a]), np.array([b]))[0])
    assert Fraction(got) >= Fraction(a) + Fraction(b)
    assert got <= math.nextafter(a + b, math.inf)  # at most one step above the float sum
