"""Torch meter kernels against the numpy meters of witcert_calculus."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from witcert_calculus import tv_forms, witness  # noqa: E402
from witcert_calculus.witness import RopeLayout  # noqa: E402
from witcert_kernels.meter import (  # noqa: E402
    band_norms,
    logit_bound,
    round_up_f32,
    tv_bounds_batch,
)


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
    from witcert_calculus.rounding import outward as np_outward
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
    want = witness.logit_bound(q.numpy(), w.numpy(), layout=layout, scale=40 ** -0.5)
    assert np.allclose(c.numpy(), want, rtol=1e-15, atol=0)
    assert float(c[2]) == 0.0 and float(want[2]) == 0.0  # an exact zero stays exact
    assert bool((c >= (40 ** -0.5 * (r @ q)).abs()).all())


def test_band_norms_take_a_rope_layout_only() -> None:
    from witcert_calculus.errors import InvalidValueError

    with pytest.raises(InvalidValueError, match="layout"):
        band_norms(torch.ones(4), bands=1, layout="half_split")  # type: ignore[arg-type]
