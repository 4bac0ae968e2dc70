"""The Triton witness-write kernel equals the torch twin bit for bit and bounds the exact norms."""

from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from test_kernels_meter import _rope  # noqa: E402
from witcert_adapters.schemes import EntryRole, WriteContext, get_scheme  # noqa: E402
from witcert_calculus.errors import InvalidValueError  # noqa: E402
from witcert_calculus.meters.witness import RopeLayout, band_channels  # noqa: E402
from witcert_kernels.meter import band_norms, round_up_f32  # noqa: E402
from witcert_kernels.triton_witness import witness_write  # noqa: E402


def _twin(k: torch.Tensor, k_hat: torch.Tensor, bands: int, layout: RopeLayout) -> torch.Tensor:
    return round_up_f32(band_norms(k_hat.double() - k.double(), bands=bands, layout=layout))


@pytest.mark.parametrize("layout", list(RopeLayout))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("scheme", ["int8_token", "fp8_e4m3", "dither_int8_g32_m4", "kivi2_g32"])
def test_kernel_equals_the_torch_twin_for_any_scheme(layout: RopeLayout, dtype: torch.dtype,
                                                     scheme: str) -> None:
    g = torch.Generator().manual_seed(5)
    k = (torch.randn(2, 3, 7, 64, generator=g) * 3).to(dtype)
    k[0, 1, 2, :] = 0.0  # a lossless row: exactly 0
    k[1, 0, 3, 5] = 300.0  # a massive channel
    ctx = WriteContext(1, 0, 0, EntryRole.KEY, layout)
    k_hat = get_scheme(scheme)(k, ctx)
    for bands in (1, 8, 32):
        got = witness_write(k, k_hat, bands=bands, layout=layout)
        assert got.dtype == torch.float32 and got.shape == (2, 3, 7, bands)
        assert torch.equal(got, _twin(k, k_hat, bands, layout)), (scheme, bands)
    assert bool((witness_write(k, k_hat, bands=4, layout=layout)[0, 1, 2] == 0).all())


def test_kernel_bounds_the_exact_band_norms() -> None:
    g = torch.Generator().manual_seed(8)
    k = torch.randn(40, 32, generator=g) * torch.logspace(-20, 20, 40).unsqueeze(-1)
    k_hat = k + torch.randn(40, 32, generator=g) * k.abs().amax(dim=-1, keepdim=True) * 1e-3
    got = witness_write(k, k_hat, bands=4, layout=RopeLayout.INTERLEAVED)
    bands = band_channels(32, bands=4, layout=RopeLayout.INTERLEAVED)
    with mp.workdps(50):
        for t in range(40):
            r = [mp.mpf(float(a)) - mp.mpf(float(b)) for a, b in zip(k_hat[t], k[t], strict=True)]
            for i, ch in enumerate(bands):
                exact = mp.sqrt(mp.fsum(r[int(c)] ** 2 for c in ch))
                assert mp.mpf(float(got[t, i])) >= exact
                assert float(got[t, i]) <= float(exact) * (1 + 2.0**-20)


@pytest.mark.parametrize("layout", list(RopeLayout))
def test_band_witnesses_survive_a_real_rotation_at_random_positions(layout: RopeLayout) -> None:
    """The bands are unions of rotary pairs: rotating key and stored key by RoPE at any
    positions leaves every band witness unchanged (up to the float32 step), and the kernel
    still bounds the rotated residual."""
    g = torch.Generator().manual_seed(2)
    k = torch.randn(60, 64, generator=g, dtype=torch.float64)
    k_hat = k + 1e-2 * torch.randn(60, 64, generator=g, dtype=torch.float64)
    pos = torch.randint(0, 100_000, (60,), generator=g)
    before = witness_write(k, k_hat, bands=8, layout=layout)
    rk, rkh = _rope(k, pos, layout), _rope(k_hat, pos, layout)
    after = witness_write(rk, rkh, bands=8, layout=layout)
    np.testing.assert_allclose(after.numpy(), before.numpy(), rtol=1e-6)
    assert bool((after.double() >= band_norms(rkh - rk, bands=8, layout=layout) * (1 - 1e-15)
                 ).all())
    other = RopeLayout.INTERLEAVED if layout is RopeLayout.HALF_SPLIT else RopeLayout.HALF_SPLIT
    wrong = witness_write(rk, rkh, bands=8, layout=other)
    assert not np.allclose(wrong.numpy(), before.numpy(), rtol=1e-3)


def test_non_finite_residuals_stay_non_finite() -> None:
    k = torch.zeros(2, 8)
    k_hat = torch.zeros(2, 8)
    k_hat[0, 1] = float("inf")
    got = witness_write(k, k_hat, bands=2, layout=RopeLayout.INTERLEAVED)
    assert not bool(torch.isfinite(got[0]).all()) and bool((got[1] == 0).all())


def test_bad_arguments_are_typed_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    k = torch.zeros(2, 12)
    with pytest.raises(InvalidValueError, match=r"bands.*4.*must divide head_dim/2 = 6"):
        witness_write(k, k, bands=4, layout=RopeLayout.HALF_SPLIT)
    with pytest.raises(InvalidValueError, match="k_hat"):
        witness_write(k, torch.zeros(2, 10), bands=1, layout=RopeLayout.HALF_SPLIT)
    with pytest.raises(InvalidValueError, match="head_dim"):
        witness_write(torch.zeros(1, 7), torch.zeros(1, 7), bands=1, layout=RopeLayout.HALF_SPLIT)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(InvalidValueError, match="TRITON_INTERPRET=1"):
        witness_write(k, k, bands=1, layout=RopeLayout.HALF_SPLIT)


@pytest.mark.parametrize("where", ["band", "token", "head"])
@pytest.mark.parametrize("side", ["k", "k_hat"])
def test_a_nan_residual_never_reads_as_zero(side: str, where: str) -> None:
    """Triton's max skips NaN: a NaN residual in a band whose other entries are 0 once gave
    the row ``[nan, 0, 0, 0]``; the kernel gives what the torch twin gives (whose amax over the
    bands propagates NaN): every witness of that row NaN, every other row its own value."""
    import warnings

    g = torch.Generator().manual_seed(1)
    k = torch.randn(5, 2, 16, generator=g)
    k_hat = k + 0.01 * torch.randn(5, 2, 16, generator=g)
    layout = RopeLayout.HALF_SPLIT
    band0 = band_channels(16, bands=4, layout=layout)[0]
    rows = slice(None) if where == "head" else slice(2, 3)
    k_hat[rows, 0] = k[rows, 0]  # a lossless token: every band 0
    target = k if side == "k" else k_hat
    if where == "band":
        target[rows, 0, int(band0[0])] = math.nan
    else:
        target[rows, 0, :] = math.nan
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "All-NaN slice encountered", RuntimeWarning)
        got = witness_write(k, k_hat, bands=4, layout=layout)
    want = _twin(k, k_hat, 4, layout)
    assert torch.equal(torch.isnan(got), torch.isnan(want)), (got[:, 0], want[:, 0])
    assert bool(torch.isnan(got[rows, 0]).all())
    assert torch.equal(torch.nan_to_num(got), torch.nan_to_num(want.to(got.dtype)))
