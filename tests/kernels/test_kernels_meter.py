"""Torch meter kernels against the numpy meters of witcert_calculus."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from witcert_calculus import meters  # noqa: E402
from witcert_calculus.witness import RopeLayout  # noqa: E402
from witcert_kernels.meter import HALF_SPLIT, INTERLEAVED, band_norms, logit_bound, round_up_f32, tv_bounds  # noqa: E402


def _rope(x: torch.Tensor, pos: torch.Tensor, layout: str) -> torch.Tensor:
    d = x.shape[-1]
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    ang = pos[:, None].to(torch.float64) * inv[None, :]
    c, s = torch.cos(ang), torch.sin(ang)
    if layout == HALF_SPLIT:
        a, b = x[..., : d // 2], x[..., d // 2:]
        return torch.cat([a * c - b * s, b * c + a * s], dim=-1)
    a, b = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = a * c - b * s
    out[..., 1::2] = b * c + a * s
    return out


@pytest.mark.parametrize("layout", [HALF_SPLIT, INTERLEAVED])
def test_band_unitarity_under_real_rope(layout: str) -> None:
    g = torch.Generator().manual_seed(1)
    r = torch.randn(50, 64, generator=g, dtype=torch.float64)
    pos = torch.randint(0, 100000, (50,), generator=g)
    before = band_norms(r, bands=8, layout=layout)
    after = band_norms(_rope(r, pos, layout), bands=8, layout=layout)
    assert torch.allclose(before, after, rtol=1e-12, atol=1e-12)
    other = INTERLEAVED if layout == HALF_SPLIT else HALF_SPLIT
    wrong = band_norms(_rope(r, pos, layout), bands=8, layout=other)
    assert not torch.allclose(before, wrong, rtol=1e-6)


@pytest.mark.parametrize("layout", [HALF_SPLIT, INTERLEAVED])
def test_band_norms_match_numpy(layout: str) -> None:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(7, 32, generator=g, dtype=torch.float64)
    np_layout = RopeLayout.HALF_SPLIT if layout == HALF_SPLIT else RopeLayout.INTERLEAVED
    ref = np.stack([meters.band_norms(row.numpy(), bands=4, layout=np_layout) for row in x])
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
    got = tv_bounds(torch.from_numpy(p_tilde), torch.from_numpy(c))
    ref = meters.tv_bounds_batch(p_tilde[None, :], c[None, :])
    m = float(got.meter)
    r = float(ref.meter[0])
    assert (np.isinf(m) and np.isinf(r)) or abs(m - r) <= 1e-9 * max(1.0, abs(r)) + 1e-14
    assert min(1.0, m) >= true_tv


def test_tv_bounds_overflow_saturates_not_truncates() -> None:
    got = tv_bounds(torch.tensor([0.5, 0.5], dtype=torch.float64), torch.tensor([1e6, 0.0]))
    assert float(got.one_sided) == float("inf")


def test_logit_bound_dominates_true_logit_error() -> None:
    g = torch.Generator().manual_seed(3)
    q = torch.randn(64, generator=g, dtype=torch.float64)
    r = torch.randn(20, 64, generator=g, dtype=torch.float64) * 0.01
    c = logit_bound(band_norms(q, bands=8), band_norms(r, bands=8), scale=0.125)
    eps = 0.125 * (r @ q)
    assert bool((c >= eps.abs()).all())
