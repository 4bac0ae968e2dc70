"""Tests of witcert_calculus.meters.dither: the Philox stream, the dithered INT8 quantizer, Tier B."""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath as mp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import golden, second

from witcert_calculus.meters.dither import (
    NON_ADAPTIVE,
    QMAX,
    DitherKey,
    byte_account,
    delta_local,
    dither_dequantize,
    dither_noise,
    dither_quantize,
    dither_mean_offset,
    dither_variance_proxy,
    philox4x32,
    select_outlier_pairs,
    subgaussian_radius,
    tier_b_certificate,
)
from witcert_calculus.errors import InvalidValueError
from witcert_calculus.meters.tv_forms import tv_eform
from witcert_calculus.meters.witness import RopeLayout
from witcert_calculus.metrics import AtConsume, AttentionTV
from witcert_calculus.tiers import Composition, Restricted, Tier, theorems_of

KAT = (  # Random123 known-answer vectors for Philox-4x32-10
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF, 0xFFFFFFFF), (0x408F276D, 0x41C83B0E, 0xA20BC7C6,
                                                   0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
)


@pytest.mark.parametrize(("ctr", "key", "want"), KAT)
def test_philox_known_answers(ctr: tuple[int, ...], key: tuple[int, int],
                              want: tuple[int, ...]) -> None:
    got = philox4x32((ctr[0], ctr[1], ctr[2], ctr[3]), key)
    assert tuple(int(w) for w in got) == want


def test_stream_is_identical_regardless_of_batching_order() -> None:
    key = DitherKey(request=2**40 + 17, layer=5, kv_head=3)
    tokens = np.arange(0, 300)
    full = dither_noise(key, tokens, head_dim=64)
    perm = np.random.default_rng(0).permutation(300)
    shuffled = np.concatenate([dither_noise(key, tokens[perm[i:i + 37]], head_dim=64)
                               for i in range(0, 300, 37)])
    np.testing.assert_array_equal(shuffled, full[perm])
    # one token at a time, one element: the same values
    assert dither_noise(key, np.array([123]), head_dim=64)[0, 7] == full[123, 7]


def test_stream_depends_on_every_key_field_and_is_uniform() -> None:
    base = dither_noise(DitherKey(1, 2, 3), np.arange(64), head_dim=128)
    for other in (DitherKey(2, 2, 3), DitherKey(1 + 2**32, 2, 3), DitherKey(1, 3, 3),
                  DitherKey(1, 2, 4)):
        assert (dither_noise(other, np.arange(64), head_dim=128) != base).mean() > 0.99
    assert base.min() >= -0.5 and base.max() < 0.5
    assert abs(base.mean()) < 0.01 and abs(base.var() - 1 / 12) < 0.002
    assert (base * 2**24 == np.round(base * 2**24)).all()  # exact 24-bit grid


@st.composite
def keys_with_outliers(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, int]:
    s = draw(st.integers(1, 6))
    d = draw(st.sampled_from([8, 16, 32]))
    kind = draw(st.sampled_from(["normal", "massive", "tiny", "zeros", "amax-edge"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = rng.normal(size=(s, d)) * 10.0 ** draw(st.integers(-6, 3))
    if kind == "massive":
        x[:, int(rng.integers(d))] *= 1e4
        x = np.clip(x, -8.0e6, 8.0e6)  # an fp16 block scale covers |amax| <= 65504 * 126.5
    elif kind == "tiny":
        x *= 1e-30
    elif kind == "zeros":
        x[:, : d // 2] = 0.0
    elif kind == "amax-edge":  # values exactly at +-amax in every block
        x[:, 0] = np.abs(x).max(axis=1)
        x[:, -1] = -x[:, 0]
    with np.errstate(over="ignore"):  # fp16 keys: values beyond 65504 become inf, dropped
        x = x.astype(draw(st.sampled_from([np.float16, np.float32, np.float64])))
    x = x.astype(np.float64)
    x[~np.isfinite(x)] = 0.0
    n_out = draw(st.integers(0, 2))
    pairs = select_outlier_pairs(x, count=n_out, layout=RopeLayout.HALF_SPLIT)
    return x, pairs, draw(st.sampled_from([4, 8, d]))


@given(keys_with_outliers(), st.integers(0, 2**64 - 1))
@settings(max_examples=150)
def test_error_at_most_half_the_stored_scale_exactly(case: tuple[np.ndarray, np.ndarray, int],
                                                     request: int) -> None:
    x, pairs, bs = case
    st_ = dither_quantize(x, key=DitherKey(request, 1, 0), tokens=np.arange(x.shape[0]),
                          block_size=bs, layout=RopeLayout.HALF_SPLIT, outlier_pairs=pairs)
    assert st_.payload.dtype == np.int8 and st_.scales.dtype == np.float16
    assert np.abs(st_.payload.astype(int)).max() <= QMAX
    x_hat = dither_dequantize(st_)
    s = st_.channel_scales()
    for (t, ch), xv in np.ndenumerate(x):
        err = abs(Fraction(float(x_hat[t, ch])) - Fraction(xv))
        assert err <= Fraction(float(s[t, ch])) / 2 * (1 + Fraction(1, 2**45)), (t, ch)
    np.testing.assert_array_equal(x_hat[:, st_.outlier_channels], x[:, st_.outlier_channels])
    # the stored scale covers its block: amax / 126.5 <= s (fp16, rounded upward)
    amax = np.maximum.reduceat(np.where(np.isin(np.arange(x.shape[1]), st_.outlier_channels),
                                        0.0, np.abs(x)), np.arange(0, x.shape[1], bs), axis=1)
    assert (Fraction(1) * st_.scales.astype(np.float64) >= amax / 126.5).all()


def test_quantizing_with_an_unstored_scale_breaks_the_error_bound() -> None:
    """The pitfall: quantize with the fp32 scale, store fp16 rounded to nearest, dequantize."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2000, 64))
    amax = np.abs(x).max(axis=1, keepdims=True)
    s32 = (amax / 126.5).astype(np.float32).astype(np.float64)
    s16 = s32.astype(np.float16).astype(np.float64)
    xi = dither_noise(DitherKey(9, 0, 0), np.arange(2000), head_dim=64)
    code = np.rint(x / s32 + xi)
    wrong = np.abs(s16 * (code - xi) - x) > s16 / 2
    assert wrong.any()  # the mismatched scales do break |err| <= s/2 ...
    st_ = dither_quantize(x, key=DitherKey(9, 0, 0), tokens=np.arange(2000), block_size=64,
                          layout=RopeLayout.INTERLEAVED)
    assert (np.abs(dither_dequantize(st_) - x) <= st_.channel_scales() / 2).all()  # ... ours not


def test_error_is_uniform_and_independent_of_x() -> None:
    x = np.tile(np.linspace(-1, 1, 64), (4000, 1))
    st_ = dither_quantize(x, key=DitherKey(3, 0, 0), tokens=np.arange(4000), block_size=64,
                          layout=RopeLayout.INTERLEAVED)
    u = (dither_dequantize(st_) - x) / st_.channel_scales()
    assert abs(u.mean()) < 0.003 and abs(u.var() - 1 / 12) < 0.002
    # same mean and variance per channel, whatever the value x
    assert np.abs(u.mean(axis=0)).max() < 0.02
    assert np.abs(u.var(axis=0) - 1 / 12).max() < 0.01


def test_outlier_pairs_must_be_excluded_from_the_amax() -> None:
    rng = np.random.default_rng(6)
    s, d = 256, 64
    x = rng.normal(size=(s, d))
    massive = [3, 20]  # injected massive RoPE pairs (half-split: channels j, j + 32)
    for j in massive:
        x[:, j] *= 500.0
        x[:, j + 32] *= 500.0
    pairs = select_outlier_pairs(x, count=2, layout=RopeLayout.HALF_SPLIT)
    assert pairs.tolist() == massive
    q = rng.normal(size=d)

    def mean_proxy(**kw: object) -> float:
        st_ = dither_quantize(x, key=DitherKey(0, 0, 0), tokens=np.arange(s), block_size=32,
                              layout=RopeLayout.HALF_SPLIT, **kw)  # type: ignore[arg-type]
        return float(dither_variance_proxy(q, st_, scale=d ** -0.5).mean())

    none = mean_proxy()
    bypass_only = mean_proxy(outlier_pairs=pairs, exclude_outliers_from_amax=False)
    excluded = mean_proxy(outlier_pairs=pairs)
    assert bypass_only > 0.9 * none  # keeping them exact barely helps
    assert excluded < none / 1000  # excluding them from the amax is what works


def test_byte_account() -> None:
    acc = byte_account(128, block_size=32, outlier_pairs=2, tokens=1024)
    assert (acc.payload, acc.scales, acc.outliers) == (124.0, 8.0, 8.0)
    assert acc.indices == 4.0 / 1024 and acc.fp16 == 256.0
    assert acc.total == 124 + 8 + 8 + 4 / 1024 and acc.ratio == acc.total / 256
    st_ = dither_quantize(np.ones((10, 16)), key=DitherKey(0, 0, 0), tokens=np.arange(10),
                          block_size=8, layout=RopeLayout.INTERLEAVED, outlier_pairs=[1])
    assert st_.byte_account() == byte_account(16, block_size=8, outlier_pairs=1, tokens=10)
    # the real packed arrays occupy what the account says
    stored = (st_.payload[:, np.setdiff1d(np.arange(16), st_.outlier_channels)].nbytes
              + st_.scales.nbytes + st_.outlier_values.astype(np.float16).nbytes
              + st_.outlier_pairs.astype(np.uint16).nbytes)
    assert stored == pytest.approx(st_.byte_account().total * 10)


def _grid_mgf(x: mp.mpf, k: int) -> mp.mpf:
    """E exp(x V) for V uniform on the 2^k midpoints of [-1/2, 1/2] (exact, 60 digits)."""
    e = mp.mpf(2) ** -(k + 1)
    return mp.fsum(mp.exp(x * (2 * j + 1 - 2**k) * e) for j in range(2**k)) / 2**k


def test_grid_mgf_is_a_product_of_cosh_below_the_continuous_proxy() -> None:
    """The dither grid variable (formal/WitCert/Dither.lean): its MGF is the product of
    cosh(x 2^i e) (signAvg_dyadic) and at most exp(x^2/24), the proxy 1/12 of U[-1/2, 1/2]
    (grid_mgf_le); the continuous uniform's MGF sinh(x/2)/(x/2) obeys the same bound."""
    with mp.workdps(60):
        for k in (1, 2, 5, 8):
            e = mp.mpf(2) ** -(k + 1)
            for x in [mp.mpf(m) / 7 for m in range(-300, 301, 13)]:
                mgf = _grid_mgf(x, k)
                prod = mp.fprod(mp.cosh(x * 2**i * e) for i in range(k))
                assert mp.almosteq(mgf, prod, rel_eps=mp.mpf(10) ** -50)
                assert mgf <= mp.exp(x * x / 24)
        for x in [mp.mpf(k) / 7 for k in range(1, 400)]:
            assert mp.sinh(x / 2) / (x / 2) <= mp.exp(x * x / 24)


def test_a_proxy_below_the_grid_variance_is_caught() -> None:
    """Adversarial: the proxy cannot be lowered. The grid's variance is (1 - 4^-k)/12; a proxy
    1% below it fails for small x: the bound is tight to second order."""
    with mp.workdps(60):
        for k in (1, 4, 8):
            var = (1 - mp.mpf(4) ** -k) / 12
            x = mp.mpf("0.01")
            assert _grid_mgf(x, k) > mp.exp(x * x * var * mp.mpf("0.99") / 2)
            assert _grid_mgf(x, k) <= mp.exp(x * x * var / 2)


def test_subgaussian_radius_and_delta_local_against_references() -> None:
    v = np.array([0.0, 1e-6, 0.3, 2.0])
    u = subgaussian_radius(v, delta_loc=1e-4, tokens=1000)
    for got, var in zip(u.tolist(), v.tolist()):
        assert got == pytest.approx(float(golden.radius(var, 1000, 1e-4)), rel=1e-14)
        assert got == pytest.approx(second.radius(var, 1000, 1e-4), rel=1e-14)
    assert Fraction(delta_local(0.01, layers=32, heads=8, steps=1000)) == \
        pytest.approx(Fraction(1, 100) / (32 * 8 * 1000), rel=1e-15)


def test_tier_b_coverage_per_query() -> None:
    """Over many dither streams, the event |eps_t| <= u_t for all t fails at most delta_loc."""
    rng = np.random.default_rng(8)
    s, d, delta = 64, 32, 0.05
    x = rng.normal(size=(s, d))
    q = rng.normal(size=d) * 3
    scale = d ** -0.5
    exact_logits = scale * x @ q
    failures = 0
    trials = 400
    for request in range(trials):
        st_ = dither_quantize(x, key=DitherKey(request, 0, 0), tokens=np.arange(s),
                              block_size=16, layout=RopeLayout.INTERLEAVED)
        eps = scale * dither_dequantize(st_) @ q - exact_logits
        u = subgaussian_radius(dither_variance_proxy(q, st_, scale=scale), delta_loc=delta)
        failures += bool((np.abs(eps) > u).any())
    assert failures <= delta * trials  # expected far below: the proxy is conservative


def test_tier_b_certificate_reading() -> None:
    rng = np.random.default_rng(10)
    s, d = 32, 16
    x = rng.normal(size=(s, d))
    q = rng.normal(size=d)
    st_ = dither_quantize(x, key=DitherKey(1, 2, 3), tokens=np.arange(s), block_size=8,
                          layout=RopeLayout.HALF_SPLIT)
    logits = d ** -0.5 * dither_dequantize(st_) @ q
    p = np.exp(logits - logits.max())
    p /= p.sum()
    dl = delta_local(1e-3, layers=4, heads=2, steps=8)
    r = tier_b_certificate(p, q, st_, scale=d ** -0.5, delta_loc=dl)
    assert r.metric == AttentionTV[AtConsume]
    assert float(r.delta) == dl
    assert r.tier is Tier.PARTIALLY_CERTIFIED  # scoped to non-adaptive queries
    assert isinstance(r.evidence, Composition) and r.evidence.restriction == NON_ADAPTIVE
    assert any(isinstance(part, Restricted) and part.subset == NON_ADAPTIVE
               for part in r.evidence.parts)
    assert set(theorems_of(r.evidence)) == {"WitCert.Semantic.dither_tier_b_token_sound",
                                            "WitCert.Semantic.dither_tier_b_prob_bad",
                                            "WitCert.Semantic.tv_eform_meter_sound"}
    assert "non-adaptive" in NON_ADAPTIVE
    u = subgaussian_radius(dither_variance_proxy(q, st_, scale=d ** -0.5), delta_loc=dl) \
        + dither_mean_offset(q, st_, scale=d ** -0.5)
    assert r.raw == tv_eform(p, u).raw
    offset = dither_mean_offset(q, st_, scale=d ** -0.5)
    assert np.all(offset > 0)
    assert np.all(offset <= d ** -0.5 * np.abs(q).sum() * st_.scales.astype(float).max() * 2.0**-24)
    big = tier_b_certificate(p, q * 1e3, st_, scale=d ** -0.5, delta_loc=dl)
    assert big.tier is Tier.SATURATED and big.value == 1.0


def test_invalid_inputs() -> None:
    with pytest.raises(InvalidValueError, match="request=-1"):
        DitherKey(-1, 0, 0)
    with pytest.raises(InvalidValueError, match="layer=4294967296"):
        DitherKey(0, 2**32, 0)
    with pytest.raises(InvalidValueError, match="block amax"):
        dither_quantize(np.full((1, 4), 1e7), key=DitherKey(0, 0, 0), tokens=np.arange(1),
                        block_size=4, layout=RopeLayout.INTERLEAVED)
    with pytest.raises(InvalidValueError, match=r"x\[0, 1\]=inf"):
        dither_quantize(np.array([[0.0, np.inf]]), key=DitherKey(0, 0, 0), tokens=np.arange(1),
                        block_size=2, layout=RopeLayout.INTERLEAVED)
    with pytest.raises(InvalidValueError, match="outlier_pairs"):
        dither_quantize(np.ones((1, 4)), key=DitherKey(0, 0, 0), tokens=np.arange(1),
                        block_size=2, layout=RopeLayout.INTERLEAVED, outlier_pairs=[2])
    with pytest.raises(InvalidValueError, match="delta_loc=0.0"):
        subgaussian_radius(np.ones(2), delta_loc=0.0)
    with pytest.raises(InvalidValueError, match="steps=0"):
        delta_local(0.1, layers=1, heads=1, steps=0)
    assert math.isfinite(delta_local(0.5, layers=10**6, heads=10**3, steps=10**6))


def _store(seed: int = 10, s: int = 32, d: int = 16):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(s, d))
    q = rng.normal(size=d)
    st_ = dither_quantize(x, key=DitherKey(1, 2, 3), tokens=np.arange(s), block_size=8,
                          layout=RopeLayout.HALF_SPLIT)
    logits = d ** -0.5 * dither_dequantize(st_) @ q
    p = np.exp(logits - logits.max())
    return x, q, st_, p / p.sum()


def test_tier_b_logit_bound_is_established_on_its_event_with_its_assumptions() -> None:
    from witcert_calculus.meters.dither import (
        NON_ADAPTIVE_QUERIES,
        PHILOX_UNIFORM,
        tier_b_logit_bound,
    )
    from witcert_calculus.meters.witness import LogitBound, is_established
    from witcert_calculus.tiers import assumptions_of, decide_tier
    x, q, st_, p = _store()
    d = x.shape[1]
    dl = 1e-4
    u = tier_b_logit_bound(q, st_, scale=d ** -0.5, delta_loc=dl)
    assert isinstance(u, LogitBound) and is_established(u)
    assert u.delta == Fraction(dl) and u.source == "witcert_calculus.meters.dither.tier_b_logit_bound"
    assert u.assumptions == (NON_ADAPTIVE_QUERIES, PHILOX_UNIFORM)
    assert assumptions_of(u.evidence) == u.assumptions
    assert decide_tier(u.evidence) is Tier.PARTIALLY_CERTIFIED
    np.testing.assert_array_equal(
        u.values, subgaussian_radius(dither_variance_proxy(q, st_, scale=d ** -0.5), delta_loc=dl)
        + dither_mean_offset(q, st_, scale=d ** -0.5))
    r = tv_eform(p, u).reading()
    cert = tier_b_certificate(p, q, st_, scale=d ** -0.5, delta_loc=dl)
    assert (r.raw, r.tier, r.delta) == (cert.raw, cert.tier, cert.delta)
    assert r.tier is Tier.PARTIALLY_CERTIFIED and r.assumptions == u.assumptions
    assert cert.assumptions == (NON_ADAPTIVE_QUERIES, PHILOX_UNIFORM)
    for a in cert.assumptions:
        assert a.statement and a.reason


def test_a_tier_a_part_plus_a_tier_b_part_keeps_the_event_and_the_assumptions() -> None:
    from witcert_calculus.meters.dither import tier_b_logit_bound
    from witcert_calculus.meters.witness import band_witness, logit_bound
    x, q, st_, p = _store(11)
    d = x.shape[1]
    u = tier_b_logit_bound(q, st_, scale=d ** -0.5, delta_loc=1e-3)
    a = logit_bound(q, band_witness(x * 1e-3, bands=2, layout=RopeLayout.HALF_SPLIT),
                    layout=RopeLayout.HALF_SPLIT, scale=d ** -0.5)
    both = a + u
    assert both.delta == u.delta and both.assumptions == u.assumptions
    r = tv_eform(p, both).reading()
    assert r.tier is Tier.PARTIALLY_CERTIFIED and r.delta == u.delta
    assert r.assumptions == u.assumptions
    assert tv_eform(p, a).reading().tier is Tier.CERTIFIED


def test_the_tier_b_premises_are_computed_from_the_store() -> None:
    """A store whose codes left [-QMAX, QMAX] fails the premise instead of certifying."""
    import dataclasses

    from witcert_calculus.errors import PremiseError
    from witcert_calculus.meters.dither import tier_b_logit_bound
    x, q, st_, p = _store(12)
    bad = dataclasses.replace(st_, payload=np.full_like(st_.payload, -128))
    with pytest.raises(PremiseError, match="QMAX|127"):
        tier_b_logit_bound(q, bad, scale=0.25, delta_loc=1e-3)
