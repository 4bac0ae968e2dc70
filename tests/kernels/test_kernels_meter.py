"""Torch meter kernels against the numpy meters of witcert_calculus."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from witcert_calculus.meters import tv_forms  # noqa: E402
from witcert_calculus.meters import witness  # noqa: E402
from witcert_calculus.meters.witness import RopeLayout  # noqa: E402
from witcert_kernels.meter import (  # noqa: E402
    band_norms,
    logit_bound,
    round_up_f32,
    tv_bounds_batch,
    tv_meter_batch,
    tv_tanh_max_batch,
)
from reference.issued import reading  # noqa: E402


def _rope(x: torch.Tensor, pos: torch.Tensor, layout: RopeLayout) -> torch.Tensor:
    d = x.shape[-1]
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    ang = pos[:, None].to(torch.float64) * inv[None, :]
    c, s = torch.cos(ang), torch.sin(ang)
    if layout == RopeLayout.HALF_SPLIT:
        a, b = x[..., : d // 2], x[..., d // 2:]
        return torch.cat([a * c - b * s, b * c + a * s], dim=-1)
    a, b = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = a * c - b * s
    out[..., 1::2] = b * c + a * s
    return out


@pytest.mark.parametrize("layout", [RopeLayout.HALF_SPLIT, RopeLayout.INTERLEAVED])
def test_band_unitarity_under_real_rope(layout: RopeLayout) -> None:
    g = torch.Generator().manual_seed(1)
    r = torch.randn(50, 64, generator=g, dtype=torch.float64)
    pos = torch.randint(0, 100000, (50,), generator=g)
    before = band_norms(r, bands=8, layout=layout)
    after = band_norms(_rope(r, pos, layout), bands=8, layout=layout)
    assert torch.allclose(before, after, rtol=1e-12, atol=1e-12)
    other = RopeLayout.INTERLEAVED if layout == RopeLayout.HALF_SPLIT else RopeLayout.HALF_SPLIT
    wrong = band_norms(_rope(r, pos, layout), bands=8, layout=other)
    assert not torch.allclose(before, wrong, rtol=1e-6)


@pytest.mark.parametrize("layout", [RopeLayout.HALF_SPLIT, RopeLayout.INTERLEAVED])
def test_band_norms_match_numpy(layout: RopeLayout) -> None:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(7, 32, generator=g, dtype=torch.float64)
    ref = np.stack([witness.band_norms(row.numpy(), bands=4, layout=layout) for row in x])
    assert np.allclose(band_norms(x, bands=4, layout=layout).numpy(), ref, rtol=1e-12)


def test_round_up_never_lowers() -> None:
    x = torch.rand(10000, dtype=torch.float64) * 1e3
    assert bool((round_up_f32(x).to(torch.float64) >= x).all())


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 40), st.floats(1e-6, 30.0), st.integers(0, 2**31 - 1))
def test_tv_bounds_match_numpy_and_dominate_true_tv(s: int, cscale: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=s) * rng.uniform(0.1, 10)
    p_tilde = np.exp(logits - logits.max())
    p_tilde /= p_tilde.sum()
    c = rng.uniform(0, cscale, size=s) * (rng.uniform(size=s) < 0.8)
    eps = c * rng.choice([-1.0, 1.0], size=s) * rng.uniform(0.5, 1.0, size=s)
    p = np.exp(logits - eps - (logits - eps).max())
    p /= p.sum()
    true_tv = 0.5 * np.abs(p - p_tilde).sum()
    got = tv_bounds_batch(torch.from_numpy(p_tilde), torch.from_numpy(c))
    ref = tv_forms.tv_bounds_batch(p_tilde[None, :], c[None, :])
    m = float(got.meter)
    r = float(ref.meter[0])
    assert (np.isinf(m) and np.isinf(r)) or abs(m - r) <= 1e-9 * max(1.0, abs(r)) + 1e-14
    assert min(1.0, m) >= true_tv
    alone = tv_meter_batch(torch.from_numpy(p_tilde), torch.from_numpy(c))  # the same code
    assert torch.equal(alone.meter, got.meter) and torch.equal(alone.eform, got.eform)


def test_tv_bounds_overflow_saturates_not_truncates() -> None:
    got = tv_bounds_batch(torch.tensor([0.5, 0.5], dtype=torch.float64), torch.tensor([1e6, 0.0]))
    assert float(got.eform) == float("inf")


def test_logit_bound_dominates_true_logit_error() -> None:
    g = torch.Generator().manual_seed(3)
    q = torch.randn(64, generator=g, dtype=torch.float64)
    r = torch.randn(20, 64, generator=g, dtype=torch.float64) * 0.01
    c = logit_bound(band_norms(q, bands=8, layout=RopeLayout.HALF_SPLIT),
                    band_norms(r, bands=8, layout=RopeLayout.HALF_SPLIT), scale=0.125)
    eps = 0.125 * (r @ q)
    assert bool((c >= eps.abs()).all())


# ----------------------------------------------------------------------------- one rule, both sides

@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_outward_rule_is_bit_identical(seed: int) -> None:
    from witcert_calculus.numerics.rounding import outward as np_outward
    from witcert_kernels.rounding import outward as torch_outward

    rng = np.random.default_rng(seed)
    y = rng.normal(size=50) * 10.0 ** rng.uniform(-320, 300, size=50)
    y[:3] = (0.0, np.inf, -np.inf)
    gamma = rng.uniform(0, 1e-12, size=50)
    exact = rng.uniform(size=50) < 0.2
    want = np_outward(y, gamma=gamma, alpha=2.0**-1070, exact=exact)
    got = torch_outward(torch.from_numpy(y), gamma=torch.from_numpy(gamma), alpha=2.0**-1070,
                        exact=torch.from_numpy(exact))
    assert np.array_equal(got.numpy(), want)


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from([(4, 1), (1, 5), (4, 5)]),
       st.sampled_from(["scalar", (4, 1), (1, 5), (4, 5)]),
       st.sampled_from(["scalar", (4, 1), (4, 5)]), st.sampled_from([None, (4, 1), (1, 5), (4, 5)]))
def test_outward_rule_is_bit_identical_under_broadcasting(seed: int, shape: tuple[int, int],
                                                          gshape: Any, ashape: Any,
                                                          eshape: Any) -> None:
    """Margins and exact masks of other shapes than the value (the result broadcast larger
    than the value, or not), NaN among the values: the torch rule, which works in place where
    the shapes allow, equals the array rule bit for bit."""
    from witcert_calculus.numerics.rounding import outward as np_outward
    from witcert_kernels.rounding import outward as torch_outward

    rng = np.random.default_rng(seed)
    y = rng.normal(size=shape) * 10.0 ** rng.uniform(-320, 300, size=shape)
    y.flat[:4] = (0.0, np.inf, -np.inf, np.nan)[:y.size]
    gamma = 1e-13 if gshape == "scalar" else rng.uniform(0, 1e-12, size=gshape)
    alpha = 2.0**-1070 if ashape == "scalar" else rng.uniform(0, 1e-300, size=ashape)
    exact = None if eshape is None else rng.uniform(size=eshape) < 0.3
    want = np_outward(y, gamma=gamma, alpha=alpha, exact=exact)

    def t(x: Any) -> Any:
        return x if x is None or isinstance(x, float) else torch.from_numpy(x)

    value = torch.from_numpy(y.copy())
    got = torch_outward(value, gamma=t(gamma), alpha=t(alpha), exact=t(exact))
    assert got.shape == want.shape and np.array_equal(got.numpy(), want, equal_nan=True)
    assert np.array_equal(value.numpy(), y, equal_nan=True)  # the value itself untouched


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 40), st.floats(1e-9, 800.0), st.integers(0, 2**31 - 1))
def test_tv_forms_are_the_numpy_forms(s: int, cscale: float, seed: int) -> None:
    """Every field of the torch TVBatch equals the numpy one to a few ulps (same expressions,
    same margins; only the order of the sums may differ)."""
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(s) * rng.uniform(0.05, 3.0), size=3)
    c = rng.uniform(0, cscale, size=(3, s)) * (rng.uniform(size=(3, s)) < 0.8)
    got = tv_bounds_batch(torch.from_numpy(p), torch.from_numpy(c))
    want = tv_forms.tv_bounds_batch(p, c)
    for field in ("eform", "two_sided", "retention", "meter", "tanh_max", "log_a",
                  "log_a_minus"):
        g, w = getattr(got, field).numpy(), getattr(want, field)
        assert np.array_equal(np.isinf(g), np.isinf(w)), field
        fin = np.isfinite(w)
        assert np.allclose(g[fin], w[fin], rtol=1e-13, atol=1e-300), field


@pytest.mark.parametrize("layout", [RopeLayout.HALF_SPLIT, RopeLayout.INTERLEAVED])
def test_unequal_bands_and_logit_bound_match_numpy(layout: RopeLayout) -> None:
    g = torch.Generator().manual_seed(5)
    q = torch.randn(40, generator=g, dtype=torch.float64)  # 20 pairs in 3 bands: 7, 7, 6
    r = torch.randn(9, 40, generator=g, dtype=torch.float64) * 1e-3
    r[2] = 0.0
    qb = band_norms(q, bands=3, layout=layout)
    w = band_norms(r, bands=3, layout=layout)
    assert np.allclose(qb.numpy(), witness.band_norms(q.numpy(), bands=3, layout=layout),
                       rtol=1e-15, atol=0)
    assert np.allclose(w.numpy(), witness.band_witness(r.numpy(), bands=3, layout=layout),
                       rtol=1e-15, atol=0)
    c = logit_bound(qb, w, scale=40 ** -0.5)
    want = witness.logit_bound(q.numpy(), w.numpy(), layout=layout, scale=40 ** -0.5).values
    assert np.allclose(c.numpy(), want, rtol=1e-15, atol=0)
    assert float(c[2]) == 0.0 and float(want[2]) == 0.0  # an exact zero stays exact
    assert bool((c >= (40 ** -0.5 * (r @ q)).abs()).all())


def test_band_norms_take_a_rope_layout_only() -> None:
    from witcert_calculus.errors import InvalidValueError

    with pytest.raises(InvalidValueError, match="layout"):
        band_norms(torch.ones(4), bands=1, layout="half_split")  # type: ignore[arg-type]


@settings(max_examples=60)
@given(st.integers(1, 6), st.integers(1, 40), st.integers(0, 2**31 - 1))
def test_output_error_bound_matches_numpy_and_bounds_the_exact_value(
        rows: int, tokens: int, seed: int) -> None:
    from fractions import Fraction

    from witcert_calculus.meters.output_bound import output_error_bound as ref
    from witcert_kernels.meter import output_error_bound
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(tokens), size=rows)
    rho = rng.exponential(0.05, size=(rows, tokens)) * (rng.random((rows, tokens)) < 0.7)
    tv = rng.uniform(0.0, 1.5, size=rows)
    vmax = rng.uniform(0.0, 5.0, size=rows)
    got = output_error_bound(torch.tensor(tv), value_norm_max=torch.tensor(vmax),
                             p_tilde=torch.tensor(p), rho=torch.tensor(rho))
    for i in range(rows):
        pn = [Fraction(x) for x in p[i]]
        total = sum(pn, Fraction(0))
        exact = 2 * min(Fraction(1), Fraction(tv[i])) * Fraction(vmax[i]) + sum(
            (a / total) * Fraction(r) for a, r in zip(pn, rho[i], strict=True))
        assert Fraction(float(got[i])) >= exact
        want = ref(float(tv[i]), value_norm_max=float(vmax[i]), p_tilde=p[i], rho=rho[i])
        assert float(got[i]) == pytest.approx(want, rel=1e-12, abs=1e-300)


@settings(max_examples=60)
@given(st.integers(1, 32), st.integers(0, 2**31 - 1), st.sampled_from([1e-300, 1e-5, 1.0, 1e200]))
def test_l2_norm_upper_never_undershoots(half: int, seed: int, scale: float) -> None:
    import mpmath

    from witcert_kernels.meter import l2_norm_upper
    x = np.random.default_rng(seed).standard_normal((3, 2 * half)) * scale
    got = l2_norm_upper(torch.tensor(x))
    with mpmath.workdps(60):
        for row, g in zip(x, got.tolist(), strict=True):
            exact = mpmath.sqrt(mpmath.fsum(mpmath.mpf(v) ** 2 for v in row))
            assert mpmath.mpf(g) >= exact
            assert g <= float(exact) * (1 + 1e-12) + 1e-300


# ----------------------------------------------------------------------------- by construction

def _tier_a(layout: RopeLayout = RopeLayout.HALF_SPLIT, seed: int = 6
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 3, 4, 16, generator=g, dtype=torch.float64)  # [B, H, Q, d]
    r = torch.randn(2, 3, 5, 16, generator=g, dtype=torch.float64) * 1e-3  # [B, H, S, d]
    w = band_norms(r, bands=4, layout=layout).unsqueeze(2)  # [B, H, 1, S, B]
    return q, r, w


def test_the_torch_logit_bound_is_established_from_the_query() -> None:
    from witcert_calculus.meters.witness import LogitBound, is_established
    from witcert_calculus.tiers import Tier, decide_tier

    for layout in (RopeLayout.HALF_SPLIT, RopeLayout.INTERLEAVED):
        q, r, w = _tier_a(layout)
        c = logit_bound(q, w, layout=layout, scale=0.25)
        assert isinstance(c, LogitBound) and is_established(c) and c.delta == 0
        assert c.source == "witcert_kernels.meter.logit_bound"
        assert decide_tier(c.evidence) is Tier.CERTIFIED and c.assumptions == ()
        assert tuple(c.values.shape) == (2, 3, 4, 5)
        eps = 0.25 * torch.einsum("bhqd,bhsd->bhqs", q, r)
        assert bool((c.values >= eps.abs()).all())
        # the same numbers as the band-norm form and as numpy, query by query
        old = logit_bound(band_norms(q, bands=4, layout=layout), w, scale=0.25)
        assert torch.equal(old, c.values)
        want = witness.logit_bound(q[1, 2, 3].numpy(), w[1, 2, 0].numpy(), layout=layout,
                                   scale=0.25).values
        assert np.allclose(c.values[1, 2, 3].numpy(), want, rtol=1e-15, atol=0)


def test_band_norms_from_the_caller_give_a_plain_tensor_that_is_assumed() -> None:
    from witcert_calculus import AtConsume, AttentionTV, Reading
    from witcert_calculus.lean.theorems import TV_EFORM_METER_SOUND
    from witcert_calculus.meters.witness import CALLER_LOGIT_BOUND, LogitBound
    from witcert_calculus.tiers import Tier

    q, _, w = _tier_a()
    c = logit_bound(band_norms(q, bands=4, layout=RopeLayout.HALF_SPLIT), w, scale=0.25)
    assert isinstance(c, torch.Tensor) and not isinstance(c, LogitBound)
    p = torch.softmax(torch.randn(2, 3, 4, 5, dtype=torch.float64), dim=-1)
    b = tv_bounds_batch(p, c)
    r = reading(AttentionTV[AtConsume], float(b.meter.max()),
                evidence=b.basis.evidence(TV_EFORM_METER_SOUND))
    assert r.tier is Tier.PARTIALLY_CERTIFIED and r.assumptions == (CALLER_LOGIT_BOUND,)


def test_torch_tv_readings_are_certified_by_construction() -> None:
    from witcert_calculus import AtConsume, AttentionTV, Reading
    from witcert_calculus.lean.theorems import TV_EFORM_METER_SOUND, TV_TWO_SIDED_METER_SOUND
    from witcert_calculus.meters.witness import CALLER_LOGIT_BOUND
    from witcert_calculus.tiers import Tier

    q, _, w = _tier_a()
    c = logit_bound(q, w, layout=RopeLayout.HALF_SPLIT, scale=0.25)
    p = torch.softmax(torch.randn(2, 3, 4, 5, dtype=torch.float64), dim=-1)
    for check in (True, False):
        b = tv_bounds_batch(p, c, check=check)
        worst = float(b.meter.max())
        for theorems in ((TV_EFORM_METER_SOUND,), (TV_TWO_SIDED_METER_SOUND,),
                         (TV_EFORM_METER_SOUND, TV_TWO_SIDED_METER_SOUND)):
            r = reading(AttentionTV[AtConsume], worst, evidence=b.basis.evidence(*theorems),
                        delta=b.basis.delta)
            assert r.tier is Tier.CERTIFIED and r.assumptions == ()
        # a plain tensor is the caller's claim
        plain = tv_bounds_batch(p, c.values.clone(), check=check)
        assert torch.equal(plain.meter, b.meter)
        r = reading(AttentionTV[AtConsume], worst, evidence=plain.basis.evidence(TV_EFORM_METER_SOUND))
        assert r.tier is Tier.PARTIALLY_CERTIFIED and r.assumptions == (CALLER_LOGIT_BOUND,)


def test_unchecked_inputs_are_checked_when_the_evidence_is_built() -> None:
    """check=False defers the premises (no host sync in the hot loop); a bad input then
    refuses the evidence instead of certifying it."""
    from witcert_calculus.errors import PremiseError
    from witcert_calculus.lean.theorems import TV_EFORM_METER_SOUND

    q, _, w = _tier_a()
    c = logit_bound(q, w, layout=RopeLayout.HALF_SPLIT, scale=0.25)
    p = torch.softmax(torch.randn(2, 3, 4, 5, dtype=torch.float64), dim=-1)
    p[0, 0, 0, 0] = -0.5
    b = tv_bounds_batch(p, c, check=False)
    with pytest.raises(PremiseError, match="p_tilde"):
        b.basis.evidence(TV_EFORM_METER_SOUND)
    bad_w = w.clone()
    bad_w[0, 0, 0, 1, 2] = -1.0  # a corrupted witness
    cb = logit_bound(q, bad_w, layout=RopeLayout.HALF_SPLIT, scale=0.25)
    good_p = torch.softmax(torch.randn(2, 3, 4, 5, dtype=torch.float64), dim=-1)
    with pytest.raises(PremiseError, match="w\\[t, b\\] >= 0"):
        tv_bounds_batch(good_p, cb, check=False).basis.evidence(TV_EFORM_METER_SOUND)


def test_torch_bounds_add_outward_and_a_plain_tensor_drops_the_provenance() -> None:
    from witcert_calculus.meters.witness import LogitBound, is_established

    q, _, w = _tier_a()
    c1 = logit_bound(q, w, layout=RopeLayout.HALF_SPLIT, scale=0.25)
    c2 = logit_bound(q * 2, w, layout=RopeLayout.HALF_SPLIT, scale=0.25)
    total = c1 + c2
    assert is_established(total) and total.delta == 0
    assert bool((total.values >= c1.values + c2.values).all())
    assert bool((total.values <= torch.nextafter(c1.values + c2.values,
                                                  torch.tensor(float("inf")))).all())
    plain = torch.zeros_like(c1.values) + c1
    assert isinstance(plain, torch.Tensor) and not isinstance(plain, LogitBound)
    assert torch.equal(plain, c1.values)
    with pytest.raises(TypeError, match="pickle"):
        import pickle
        pickle.dumps(c1)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_add_up_is_bit_identical(seed: int) -> None:
    from witcert_calculus.numerics.rounding import add_up as np_add_up
    from witcert_kernels.rounding import add_up as torch_add_up

    rng = np.random.default_rng(seed)
    a = rng.uniform(0, 1, size=50) * 10.0 ** rng.uniform(-300, 300, size=50)
    b = rng.uniform(0, 1, size=50) * 10.0 ** rng.uniform(-300, 300, size=50)
    a[:3] = (0.0, np.inf, 1.0)
    want = np_add_up(a, b)
    got = torch_add_up(torch.from_numpy(a), torch.from_numpy(b))
    assert np.array_equal(got.numpy(), want)


def test_tanh_max_alone_equals_the_batch_form_and_numpy_and_is_certified() -> None:
    from witcert_calculus import AtConsume, AttentionTV, Reading
    from witcert_calculus.errors import PremiseError
    from witcert_calculus.lean.theorems import SOFTMAX_TV_TANH_CONTRACT_SOUND
    from witcert_calculus.tiers import Tier

    q, _, w = _tier_a()
    c = logit_bound(q, w, layout=RopeLayout.HALF_SPLIT, scale=0.25)
    p = torch.softmax(torch.randn(*c.values.shape, dtype=torch.float64), dim=-1)
    th, basis = tv_tanh_max_batch(c)
    assert torch.equal(th, tv_bounds_batch(p, c, check=False).tanh_max)
    flat = c.values.reshape(-1, c.values.shape[-1]).numpy()
    ref = [tv_forms.tv_tanh_max(row).raw for row in flat]
    # numpy's and torch's tanh may differ by an ulp; both are then rounded outward
    assert np.allclose(th.reshape(-1).numpy(), ref, rtol=1e-14, atol=0.0)
    assert bool((th.reshape(-1) >= torch.tanh(torch.tensor(flat.max(axis=-1)))).all())
    r = reading(AttentionTV[AtConsume], float(th.max()),
                evidence=basis.evidence(SOFTMAX_TV_TANH_CONTRACT_SOUND), delta=basis.delta)
    assert r.tier is Tier.CERTIFIED
    _, bad = tv_tanh_max_batch(-c.values)  # a negative "bound" is refused at evidence time
    with pytest.raises(PremiseError, match="c_t >= 0"):
        bad.evidence(SOFTMAX_TV_TANH_CONTRACT_SOUND)


def test_single_visible_token_rows_report_zero_in_both_twins_and_cite_the_lemma() -> None:
    """A row that sees one token has TV exactly 0 however large its logit errors: both twins
    report 0 on every form there (and only there), the readings cite
    WitCert.Meters.tv_single_token, and a row marked single whose p_tilde spreads over two
    tokens refuses the evidence."""
    from witcert_calculus.errors import PremiseError
    from witcert_calculus.lean.theorems import TV_EFORM_METER_SOUND, TV_SINGLE_TOKEN_METER, TV_TWO_SIDED_METER_SOUND
    from witcert_calculus.tiers import theorems_of

    rng = np.random.default_rng(3)
    p = np.zeros((3, 5))
    p[0, 0] = 1.0  # causal row 0: one visible token
    p[1, :2] = rng.dirichlet(np.ones(2))
    p[2] = rng.dirichlet(np.ones(5))
    c = np.full((3, 5), 4.0)  # large logit errors: every multi-token row saturates
    visible = np.array([1, 2, 5])
    # the true TV of a one-token row is 0 whatever the logits: softmax over one token is 1
    z, zt = rng.normal(size=1) * 100, rng.normal(size=1) * 100
    assert 0.5 * abs(np.exp(z - z.max()) / np.exp(z - z.max()).sum()
                     - np.exp(zt - zt.max()) / np.exp(zt - zt.max()).sum()).sum() == 0.0
    want = tv_forms.tv_bounds_batch(p, c, visible=visible)
    got = tv_bounds_batch(torch.from_numpy(p), torch.from_numpy(c), visible=torch.from_numpy(
        visible))
    for name in ("eform", "two_sided", "retention", "meter", "tanh_max"):
        w, g = getattr(want, name), getattr(got, name).numpy()
        assert w[0] == 0.0 and g[0] == 0.0, name
        assert (w[1:] > 0.5).all() and np.array_equal(w, g), name
    blind = tv_forms.tv_bounds_batch(p, c)
    assert blind.meter[0] > 1 and np.array_equal(blind.meter[1:], want.meter[1:])
    for basis in (want.basis, got.basis):
        ev = basis.evidence(TV_EFORM_METER_SOUND, TV_TWO_SIDED_METER_SOUND)
        assert TV_SINGLE_TOKEN_METER in theorems_of(ev)
    assert TV_SINGLE_TOKEN_METER not in theorems_of(blind.basis.evidence(TV_EFORM_METER_SOUND))
    lying = np.array([1, 1, 5])  # row 1 spreads over two tokens: not a one-token row
    for basis in (tv_forms.tv_bounds_batch(p, c, visible=lying).basis,
                  tv_bounds_batch(torch.from_numpy(p), torch.from_numpy(c), check=False,
                                  visible=torch.from_numpy(lying)).basis):
        with pytest.raises(PremiseError, match="one visible token"):
            basis.evidence(TV_EFORM_METER_SOUND)


def test_a_nan_witness_or_query_never_yields_a_small_bound() -> None:
    """Only inf * 0 (an overflowed witness meeting an exactly zero query band) is 0; a NaN
    witness or query band makes the bound NaN (the gate's magnitude stage rejects it), never a
    bound near 0 that would certify the cell."""
    w = torch.tensor([[0.5, float("nan")], [float("inf"), 0.25]], dtype=torch.float64)
    q = torch.tensor([1.0, 0.0, 2.0, 0.0])  # band 0 and band 1 nonzero (interleaved pairs)
    c = logit_bound(q, w, scale=0.5, layout=RopeLayout.INTERLEAVED).values
    assert bool(torch.isnan(c[0])) and bool(torch.isinf(c[1]))
    q0 = torch.tensor([1.0, 0.0, 0.0, 0.0])  # band 1 exactly zero: inf * 0 contributes 0
    c0 = logit_bound(q0, w[1:], scale=0.5, layout=RopeLayout.INTERLEAVED).values
    assert bool(torch.isinf(c0[0]))  # band 0 meets inf
    c1 = logit_bound(q0, torch.tensor([[0.5, float("inf")]], dtype=torch.float64), scale=0.5,
                     layout=RopeLayout.INTERLEAVED).values
    assert bool(torch.isfinite(c1[0])) and float(c1[0]) >= 0.25
    qn = torch.tensor([float("nan"), 0.0, 0.0, 0.0])
    cn = logit_bound(qn, torch.tensor([[0.5, 0.5]], dtype=torch.float64), scale=0.5,
                     layout=RopeLayout.INTERLEAVED).values
    assert bool(torch.isnan(cn[0]))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3), st.integers(1, 3), st.integers(1, 4), st.integers(1, 3),
       st.integers(1, 9), st.integers(0, 2**31 - 1))
def test_the_batched_logit_bound_is_the_per_row_bound(layers: int, kv: int, group: int,
                                                      rows: int, tokens: int, seed: int) -> None:
    """Queries stacked [layers, kv heads, group, rows, d] against witnesses shared by a kv
    head's group and rows [layers, kv, 1, 1, S, bands] (one batched product, the witness never
    copied per row): every row's bound equals the numpy bound of that row alone, to the ulps
    the sums' order allows, with overflowed witnesses and zero query bands placed at random."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(layers, kv, group, rows, 16, generator=g)
    q[..., :4] *= (torch.rand(layers, kv, group, rows, 1, generator=g) < 0.7)  # zero bands
    w = torch.rand(layers, kv, 1, 1, tokens, 4, generator=g, dtype=torch.float64)
    w[torch.rand(w.shape, generator=g) < 0.05] = float("inf")
    c = logit_bound(q, w, scale=0.25, layout=RopeLayout.HALF_SPLIT).values
    assert tuple(c.shape) == (layers, kv, group, rows, tokens)
    for i in itertools.product(range(layers), range(kv), range(group), range(rows)):
        one = witness.logit_bound(q[i].double().numpy(), w[i[:2]][0, 0].numpy(), scale=0.25,
                                  layout=RopeLayout.HALF_SPLIT).values
        got = c[i].numpy()
        assert np.array_equal(np.isinf(got), np.isinf(one))
        fin = np.isfinite(one)
        assert np.allclose(got[fin], one[fin], rtol=1e-15, atol=0)
