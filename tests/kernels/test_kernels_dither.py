"""The torch port of the dithered INT8 quantizer is bit-identical to the numpy reference."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from witcert_calculus.errors import InvalidValueError  # noqa: E402
from witcert_calculus.meters import dither as ref  # noqa: E402
from witcert_calculus.meters.witness import RopeLayout  # noqa: E402
from witcert_kernels.dither import dither_noise, dither_noise_layers, dither_quantize, \
    exact_channels, philox4x32, select_outlier_pairs  # noqa: E402

from reference.issued import reading

def test_philox_matches_the_reference_on_edge_counters() -> None:
    words = np.array([0, 1, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFE, 0xFFFFFFFF], dtype=np.uint64)
    c = [words, words[::-1].copy(), np.roll(words, 2), np.roll(words, 3)]
    for key in ((0, 0), (0xFFFFFFFF, 0xFFFFFFFF), (0x12345678, 0x9ABCDEF0)):
        got = philox4x32(tuple(torch.from_numpy(w.astype(np.int64)) for w in c),  # type: ignore[arg-type]
                         key)
        want = ref.philox4x32((c[0], c[1], c[2], c[3]), key)
        for g, w in zip(got, want, strict=True):
            assert np.array_equal(g.numpy().astype(np.uint32), w)


@settings(max_examples=40, deadline=None)
@given(request=st.integers(0, 2**64 - 1), layer=st.integers(0, 2**32 - 1),
       heads=st.integers(1, 3), start=st.integers(0, 2**32 - 8), d=st.sampled_from([2, 8, 64]))
def test_noise_stream_is_bit_identical(request: int, layer: int, heads: int, start: int,
                                       d: int) -> None:
    tokens = np.arange(start, start + 5)
    xi = dither_noise(request=request, layer=layer, kv_heads=heads,
                      tokens=torch.from_numpy(tokens), head_dim=d)
    for h in range(heads):
        want = ref.dither_noise(ref.DitherKey(request, layer, h), tokens, head_dim=d)
        assert np.array_equal(xi[h].numpy(), want)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), block=st.sampled_from([8, 16, 64]),
       magnitude=st.sampled_from([1e-6, 1.0, 300.0, 5e4]), start=st.integers(0, 10_000),
       request=st.integers(0, 2**64 - 1))
def test_quantized_values_are_bit_identical(seed: int, block: int, magnitude: float, start: int,
                                            request: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 2, 5, 64, generator=g, dtype=torch.float64) * magnitude
    x[0, 1, 2, :block] = 0.0  # an all-zero block (scale 0) is handled like the reference
    x[1, 0, 3, 5] = 40.0 * magnitude  # a massive channel
    enc = dither_quantize(x.to(torch.float32), request=request, layer=7, start=start,
                          block_size=block)
    xs = x.to(torch.float32).to(torch.float64).numpy()
    for b in range(2):
        for h in range(2):
            stored = ref.dither_quantize(xs[b, h], key=ref.DitherKey(request, 7, h),
                                         tokens=np.arange(start, start + 5), block_size=block,
                                         layout=RopeLayout.HALF_SPLIT)
            assert np.array_equal(enc.scales[b, h].numpy(), stored.scales)
            assert np.array_equal(enc.codes[b, h].numpy(), stored.payload)
            assert np.array_equal(enc.x_hat[b, h].numpy(), ref.dither_dequantize(stored))
            half = stored.channel_scales() / 2
            assert bool((np.abs(enc.x_hat[b, h].numpy() - xs[b, h]) <= half).all())


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), block=st.sampled_from([16, 32, 64]),
       pairs=st.integers(0, 4), layout=st.sampled_from(list(RopeLayout)),
       start=st.integers(0, 10_000), request=st.integers(0, 2**64 - 1))
def test_group_scales_and_outlier_pairs_are_bit_identical(seed: int, block: int, pairs: int,
                                                          layout: RopeLayout, start: int,
                                                          request: int) -> None:
    """The full Tier-B store (group scales, outlier pairs chosen by energy, kept exact and out of
    the amax) gives the reference's pairs, scales, codes and reconstruction bit for bit."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, 3, 7, 64, generator=g, dtype=torch.float64)
    x[0, :, :, 5] *= 80.0  # massive channels, as RoPE outlier pairs are
    x[0, 1, :, 40] *= 200.0
    x = x.to(torch.float32)
    chosen = select_outlier_pairs(x, count=pairs, layout=layout)
    enc = dither_quantize(x, request=request, layer=2, start=start, block_size=block,
                          outlier_pairs=chosen, layout=layout)
    xs = x.to(torch.float64).numpy()
    for h in range(3):
        want_pairs = ref.select_outlier_pairs(xs[0, h], count=pairs, layout=layout)
        assert chosen[h].tolist() == want_pairs.tolist()
        stored = ref.dither_quantize(xs[0, h], key=ref.DitherKey(request, 2, h),
                                     tokens=np.arange(start, start + 7), block_size=block,
                                     layout=layout, outlier_pairs=want_pairs)
        assert np.array_equal(enc.scales[0, h].numpy(), stored.scales)
        assert np.array_equal(enc.codes[0, h].numpy(), stored.payload)
        assert np.array_equal(enc.x_hat[0, h].numpy(), ref.dither_dequantize(stored))
        assert np.array_equal(np.flatnonzero(enc.exact[h].numpy()), stored.outlier_channels)
        assert np.array_equal(enc.outlier_values[0, h].numpy(),
                              stored.outlier_values.astype(np.float16))
        # the packed bytes measured from the tensors are the reference's account
        acc = ref.byte_account(64, block_size=block, outlier_pairs=pairs, tokens=7)
        assert enc.byte_account() == acc
    read = enc.read(torch.float32).to(torch.float64)
    assert torch.equal(read[..., ~enc.exact[0]][0, 0], enc.x_hat[0, 0][:, ~enc.exact[0]].to(
        torch.float32).to(torch.float64))
    if pairs:  # outliers are read from their float16 values
        assert torch.equal(read[0, 0][:, enc.exact[0]],
                           x[0, 0][:, enc.exact[0]].to(torch.float16).to(torch.float64))


def test_outlier_pairs_measured_bytes_next_to_fp16() -> None:
    """g32 with 4 pairs on d = 64: 56 code bytes + 2 scales + 8 fp16 values = 76 B of 128."""
    x = torch.randn(1, 2, 16, 64)
    enc = dither_quantize(x, request=0, layer=0, start=0, block_size=32,
                          outlier_pairs=select_outlier_pairs(x, count=4,
                                                             layout=RopeLayout.HALF_SPLIT))
    acc = enc.byte_account()
    assert (acc.payload, acc.scales, acc.outliers, acc.fp16) == (56.0, 4.0, 16.0, 128.0)
    assert acc.indices == 8 / 16 and acc.total == 76.5 and acc.ratio == 76.5 / 128


def test_outlier_pair_errors_name_the_value() -> None:
    x = torch.randn(1, 2, 3, 8)
    with pytest.raises(InvalidValueError, match=r"count.*5.*head_dim/2 = 4"):
        select_outlier_pairs(x, count=5, layout=RopeLayout.HALF_SPLIT)
    with pytest.raises(InvalidValueError, match=r"outlier_pairs.*\[0, 4\)"):
        exact_channels(torch.tensor([[4], [0]]), head_dim=8, layout=RopeLayout.HALF_SPLIT)
    with pytest.raises(InvalidValueError, match="repeat"):
        exact_channels(torch.tensor([[1, 1], [0, 2]]), head_dim=8, layout=RopeLayout.HALF_SPLIT)
    with pytest.raises(InvalidValueError, match=r"outlier_pairs.*\[2, m\]"):
        dither_quantize(x, request=0, layer=0, start=0, block_size=8,
                        outlier_pairs=torch.tensor([[0]]))
    with pytest.raises(InvalidValueError, match="block_size.*must divide head_dim 8"):
        dither_quantize(x, request=0, layer=0, start=0, block_size=6)


def test_tier_b_bound_excludes_exact_channels_like_the_reference() -> None:
    """With outlier pairs, the torch bound (no cast term) is the reference's bound: the exact
    channels' query entries leave the variance and mean terms."""
    from witcert_kernels.dither import tier_b_logit_bound

    rng = np.random.default_rng(11)
    x = rng.normal(size=(1, 2, 6, 32))
    x[0, :, :, 3] *= 300.0
    q = rng.normal(size=(1, 2, 2, 32)) * 5
    xt = torch.from_numpy(x)
    pairs = select_outlier_pairs(xt, count=2, layout=RopeLayout.HALF_SPLIT)
    enc = dither_quantize(xt, request=5, layer=0, start=0, block_size=16, outlier_pairs=pairs)
    visible = torch.tensor([6, 9])
    got = tier_b_logit_bound(torch.from_numpy(q), enc.scales, None, scale=0.2, delta_loc=1e-6,
                             visible=visible, exact=enc.exact.unsqueeze(0).unsqueeze(2)).values
    blind = tier_b_logit_bound(torch.from_numpy(q), enc.scales, None, scale=0.2, delta_loc=1e-6,
                               visible=visible).values
    for h in range(2):
        stored = ref.dither_quantize(x[0, h], key=ref.DitherKey(5, 0, h), tokens=np.arange(6),
                                     block_size=16, layout=RopeLayout.HALF_SPLIT,
                                     outlier_pairs=pairs[h].numpy())
        for i in range(2):
            want = ref.tier_b_logit_bound(q[0, h, i], stored, scale=0.2, delta_loc=1e-6,
                                          tokens=int(visible[i])).values
            np.testing.assert_allclose(got[0, h, i].numpy(), want, rtol=1e-13, atol=0)
    assert bool((got < blind).all())  # the mask is what makes the exact channels free


def test_scale_overflow_and_bad_arguments_raise_typed_errors() -> None:
    big = torch.full((1, 1, 1, 8), 1e7)
    with pytest.raises(InvalidValueError, match="overflows float16"):
        dither_quantize(big, request=0, layer=0, start=0, block_size=8)
    with pytest.raises(InvalidValueError, match="block_size"):
        dither_quantize(torch.zeros(1, 1, 1, 8), request=0, layer=0, start=0, block_size=3)
    with pytest.raises(InvalidValueError, match="finite"):
        dither_quantize(torch.full((1, 1, 1, 8), float("nan")), request=0, layer=0, start=0,
                        block_size=8)
    with pytest.raises(InvalidValueError, match="request"):
        dither_noise(request=-1, layer=0, kv_heads=1, tokens=torch.arange(2), head_dim=4)
    with pytest.raises(InvalidValueError, match="rounds"):
        z = torch.zeros((), dtype=torch.int64)
        philox4x32((z, z, z, z), (0, 0), rounds=0)


# ----------------------------------------------------------------------------- Tier B

@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), block=st.sampled_from([8, 16, 32]),
       magnitude=st.sampled_from([1e-3, 1.0, 300.0]), delta=st.sampled_from([1e-9, 1e-3, 0.2]))
def test_tier_b_logit_bound_matches_the_numpy_reference(seed: int, block: int, magnitude: float,
                                                         delta: float) -> None:
    """The torch Tier-B bound (no cast term) equals witcert_calculus.meters.dither.tier_b_logit_bound
    on the same stored keys, query rows, union-bound size and delta_loc."""
    from witcert_kernels.dither import tier_b_logit_bound

    rng = np.random.default_rng(seed)
    s, d, rows = 6, 32, 3
    x = rng.normal(size=(1, 2, s, d)) * magnitude
    x[0, 1, 2] = 0.0  # a token whose scales are all 0: its bound is exactly 0
    q = rng.normal(size=(1, 2, rows, d)) * rng.uniform(0.1, 30)
    q[0, 0, 1] = 0.0  # a zero query row: exactly 0 as well
    enc = dither_quantize(torch.from_numpy(x), request=3, layer=1, start=0, block_size=block)
    visible = torch.tensor([6, 8, 11])  # a union over at least the stored tokens
    scale = d ** -0.5
    got = tier_b_logit_bound(torch.from_numpy(q), enc.scales, None, scale=scale,
                             delta_loc=delta, visible=visible).values.numpy()
    for h in range(2):
        stored = ref.dither_quantize(x[0, h], key=ref.DitherKey(3, 1, h), tokens=np.arange(s),
                                     block_size=block, layout=RopeLayout.HALF_SPLIT)
        assert np.array_equal(enc.scales[0, h].numpy(), stored.scales)
        for i in range(rows):
            want = ref.tier_b_logit_bound(q[0, h, i], stored, scale=scale, delta_loc=delta,
                                          tokens=int(visible[i])).values
            np.testing.assert_allclose(got[0, h, i], want, rtol=1e-13, atol=0)
    assert (got[0, 1, :, 2] == 0).all() and (got[0, 0, 1] == 0).all()


def test_tier_b_bound_with_cast_term_is_above_the_exact_value() -> None:
    """u_t = radius + grid mean + scale ||q|| cast_t, against a 50-digit evaluation of the same
    float inputs: never below, and within 1e-13 relative."""
    import mpmath as mp

    from witcert_kernels.dither import tier_b_logit_bound

    g = torch.Generator().manual_seed(4)
    q = torch.randn(1, 1, 2, 16, generator=g, dtype=torch.float64)
    enc = dither_quantize(torch.randn(1, 1, 5, 16, generator=g), request=0, layer=0, start=0,
                          block_size=8)
    cast = torch.rand(1, 1, 5, generator=g, dtype=torch.float64) * 1e-4
    scale, delta, visible = 0.25, 1e-4, torch.tensor([5, 7])
    got = tier_b_logit_bound(q, enc.scales, cast, scale=scale, delta_loc=delta,
                             visible=visible).values
    s = enc.scales.to(torch.float64)
    with mp.workdps(50):
        for i in range(2):
            qi = [mp.mpf(float(v)) for v in q[0, 0, i]]
            qn = mp.sqrt(mp.fsum(v * v for v in qi))
            log_term = mp.log(2 * mp.mpf(int(visible[i])) / mp.mpf(delta))
            for t in range(5):
                sb = [mp.mpf(float(v)) for v in s[0, 0, t]]
                var = mp.mpf(scale) ** 2 * mp.fsum(
                    sb[b] ** 2 * mp.fsum(v * v for v in qi[8 * b:8 * b + 8]) for b in range(2)) / 12
                mean = mp.mpf(scale) * mp.fsum(
                    sb[b] * mp.fsum(abs(v) for v in qi[8 * b:8 * b + 8]) for b in range(2)) \
                    * mp.mpf(2) ** -25
                exact = mp.sqrt(2 * var * log_term) + mean \
                    + mp.mpf(scale) * qn * mp.mpf(float(cast[0, 0, t]))
                assert mp.mpf(float(got[0, 0, i, t])) >= exact
                assert float(got[0, 0, i, t]) <= float(exact) * (1 + 1e-13)
    with pytest.raises(InvalidValueError, match="delta_loc"):
        tier_b_logit_bound(q, enc.scales, None, scale=0.25, delta_loc=1.0, visible=visible)


def test_the_torch_tier_b_bound_carries_its_event_and_its_assumptions() -> None:
    from fractions import Fraction

    from witcert_calculus import AtConsume, AttentionTV, Reading
    from witcert_calculus.lean.theorems import TV_EFORM_METER_SOUND, TV_TWO_SIDED_METER_SOUND
    from witcert_calculus.meters.dither import NON_ADAPTIVE_QUERIES, PHILOX_UNIFORM
    from witcert_calculus.meters.witness import is_established
    from witcert_calculus.tiers import Tier
    from witcert_kernels.dither import STORED_ENCODING, tier_b_logit_bound
    from witcert_kernels.meter import band_norms, logit_bound, tv_bounds_batch

    g = torch.Generator().manual_seed(9)
    q = torch.randn(1, 1, 2, 16, generator=g, dtype=torch.float64)
    enc = dither_quantize(torch.randn(1, 1, 5, 16, generator=g), request=0, layer=0, start=0,
                          block_size=8)
    u = tier_b_logit_bound(q, enc.scales, None, scale=0.25, delta_loc=1e-4,
                           visible=torch.tensor([5, 5]))
    assert is_established(u) and u.delta == Fraction(1e-4)
    assert u.source == "witcert_kernels.dither.tier_b_logit_bound"
    assert u.assumptions == (NON_ADAPTIVE_QUERIES, PHILOX_UNIFORM, STORED_ENCODING)
    w = band_norms(torch.randn(1, 1, 5, 16, generator=g, dtype=torch.float64) * 1e-3, bands=2,
                   layout=RopeLayout.HALF_SPLIT).unsqueeze(2)
    a = logit_bound(q, w, layout=RopeLayout.HALF_SPLIT, scale=0.25)
    both = a + u
    p = torch.softmax(torch.randn(1, 1, 2, 5, generator=g, dtype=torch.float64), dim=-1)
    b = tv_bounds_batch(p, both, check=False)
    r = reading(AttentionTV[AtConsume], float(b.meter.max()),
                evidence=b.basis.evidence(TV_EFORM_METER_SOUND, TV_TWO_SIDED_METER_SOUND), delta=b.basis.delta)
    assert r.tier is Tier.PARTIALLY_CERTIFIED and r.delta == Fraction(1e-4)
    assert r.assumptions == u.assumptions
    bad = tier_b_logit_bound(q, enc.scales, None, scale=0.25, delta_loc=1e-4,
                             visible=torch.tensor([0, 5]))
    from witcert_calculus.errors import PremiseError
    with pytest.raises(PremiseError, match="visible"):
        tv_bounds_batch(p, bad, check=False).basis.evidence(TV_EFORM_METER_SOUND)


@pytest.mark.parametrize("where", ["scale", "cast"])
@pytest.mark.parametrize("bad", [-1.0, float("inf"), float("nan")])
def test_a_corrupted_block_scale_or_cast_norm_refuses_the_tier_b_evidence(where: str,
                                                                         bad: float) -> None:
    """One stored block scale (or cast norm) that is negative, infinite or NaN, anywhere in
    the history, refuses the Tier-B bound's evidence; the clean inputs give it."""
    from witcert_calculus.errors import PremiseError
    from witcert_calculus.lean.theorems import TV_EFORM_METER_SOUND
    from witcert_kernels.dither import tier_b_logit_bound
    from witcert_kernels.meter import tv_bounds_batch

    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 1, 2, 16, generator=g, dtype=torch.float64)
    enc = dither_quantize(torch.randn(1, 1, 5, 16, generator=g), request=0, layer=0, start=0,
                          block_size=8)
    cast = torch.rand(1, 1, 5, generator=g, dtype=torch.float64) * 1e-4
    p = torch.softmax(torch.randn(1, 1, 2, 5, generator=g, dtype=torch.float64), dim=-1)

    def evidence(scales: Any, cast_norms: Any) -> Any:
        u = tier_b_logit_bound(q, scales, cast_norms, scale=0.25, delta_loc=1e-4,
                               visible=torch.tensor([5, 5]))
        return tv_bounds_batch(p, u, check=False).basis.evidence(TV_EFORM_METER_SOUND)

    assert evidence(enc.scales, cast) is not None
    scales, cast_norms = enc.scales.clone(), cast.clone()
    if where == "scale":
        scales[0, 0, 3, 1] = bad
    else:
        cast_norms[0, 0, 2] = bad
    with pytest.raises(PremiseError, match="finite and >= 0"):
        evidence(scales, cast_norms)


@settings(max_examples=20, deadline=None)
@given(request=st.integers(0, 2**64 - 1), layers=st.lists(st.integers(0, 2**32 - 1), min_size=1,
                                                         max_size=4),
       heads=st.integers(1, 3), start=st.integers(0, 2**32 - 8))
def test_noise_of_several_layers_is_each_layers_stream(request: int, layers: list[int], heads: int,
                                                      start: int) -> None:
    tokens = torch.arange(start, start + 3)
    xi = dither_noise_layers(request=request, layers=layers, kv_heads=heads, tokens=tokens,
                             head_dim=8)
    for i, layer in enumerate(layers):
        assert torch.equal(xi[i], dither_noise(request=request, layer=layer, kv_heads=heads,
                                               tokens=tokens, head_dim=8))


@pytest.mark.parametrize("bad", ["ok", "nan_kept", "inf_exact", "scale_overflow",
                                 "outlier_overflow"])
def test_deferred_checks_agree_with_the_eager_ones(bad: str) -> None:
    """With precomputed noise and mask and deferred checks the store is the same, and the
    deferred boolean is False exactly when the eager call raises."""
    x = torch.randn(1, 2, 3, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    pairs = torch.tensor([[1], [2]])
    exact = exact_channels(pairs, head_dim=8, layout=RopeLayout.HALF_SPLIT)
    if bad == "nan_kept":
        x[0, 1, 2, 0] = float("nan")
    elif bad == "inf_exact":
        x[0, 0, 1, 1] = float("inf")  # channel 1 is exact in head 0
    elif bad == "scale_overflow":
        x[0, 1, 0, 0] = 1e7
    elif bad == "outlier_overflow":
        x[0, 1, 0, 2] = 1e6  # pair 2's channel: exact in head 1, stored in float16
    args: dict[str, Any] = dict(request=5, layer=3, start=10, block_size=4, outlier_pairs=pairs)
    deferred: list[torch.Tensor] = []
    noise = dither_noise_layers(request=5, layers=(0, 3), kv_heads=2,
                                tokens=torch.arange(10, 13), head_dim=8)[1]
    got = dither_quantize(x, **args, exact=exact, noise=noise, deferred=deferred)
    if bad == "ok":
        want = dither_quantize(x, **args)
        assert bool(deferred[0])
        for f in ("codes", "scales", "x_hat", "outlier_values"):
            assert torch.equal(getattr(got, f), getattr(want, f)), f
        assert torch.equal(got.read(torch.float32), want.read(torch.float32))
    else:
        assert not bool(deferred[0])
        with pytest.raises(InvalidValueError, match="finite|overflows"):
            dither_quantize(x, **args)
