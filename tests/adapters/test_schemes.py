"""Compression-scheme registry: shapes, error guarantees, typed errors."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from witcert_adapters.schemes import WriteContext, get_scheme, register_scheme, scheme_names  # noqa: E402
from witcert_calculus.errors import InvalidValueError  # noqa: E402

CTX = WriteContext(request_id=1, layer=0, start=0, role="key")


def _x() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 5, 64, generator=g) * 3
    x[0, 0, 0, 7] = 900.0  # beyond fp8 e4m3's range of 448
    return x


@pytest.mark.parametrize("name", [n for n in scheme_names() if not n.endswith("_doc")])
def test_scheme_keeps_shape_and_dtype(name: str) -> None:
    x = _x()
    assert get_scheme(name)(x, CTX).shape == x.shape


def test_identity_is_exact() -> None:
    x = _x()
    assert torch.equal(get_scheme("identity")(x, CTX), x)


def test_int8_error_within_half_step_of_stored_scale() -> None:
    x = _x()
    y = get_scheme("int8_token")(x, CTX)
    s = (x.abs().amax(dim=-1, keepdim=True) / 127).to(torch.float16).to(torch.float32)
    assert bool(((y - x).abs() <= s / 2 + 1e-6 * s).all())
    assert not torch.equal(y, x)


def test_unscaled_fp8_e4m3_does_not_hide_overflow() -> None:
    y = get_scheme("fp8_e4m3")(_x(), CTX)
    bad = y[0, 0, 0, 7]
    assert not torch.isfinite(bad) or float(bad) != 900.0
    scaled = get_scheme("fp8_e4m3_scaled")(_x(), CTX)
    assert bool(torch.isfinite(scaled).all())
    assert abs(float(scaled[0, 0, 0, 7]) - 900.0) < 900.0 * 2**-3


def test_kivi2_uses_four_levels_per_group() -> None:
    x = _x()
    y = get_scheme("kivi2_g32")(x, CTX)
    groups = y.reshape(-1, 32)
    assert max(len(torch.unique(g)) for g in groups) <= 4


def test_registry_errors_name_the_value() -> None:
    with pytest.raises(InvalidValueError, match="no_such_scheme"):
        get_scheme("no_such_scheme")
    with pytest.raises(InvalidValueError, match="already registered"):
        register_scheme("identity", lambda x, ctx: x, bits=32, description="dup")
    with pytest.raises(InvalidValueError, match="bits"):
        register_scheme("zero_bits", lambda x, ctx: x, bits=0, description="bad")


def test_scheme_changing_shape_is_rejected() -> None:
    s = register_scheme("truncating_test", lambda x, ctx: x[..., :-1], bits=8, description="bad")
    with pytest.raises(InvalidValueError, match="must keep shape"):
        s(_x(), CTX)


def test_dither_int8_is_reproducible_and_within_half_step() -> None:
    from witcert_calculus.meters.dither import DitherKey, dither_quantize
    from witcert_calculus.meters.witness import RopeLayout

    x = torch.randn(1, 2, 6, 64, generator=torch.Generator().manual_seed(5))
    ctx = WriteContext(request_id=7, layer=3, start=10, role="key")
    y1 = get_scheme("dither_int8")(x, ctx)
    y2 = get_scheme("dither_int8")(x, ctx)
    assert torch.equal(y1, y2)  # same stream on the write and read side
    stored = dither_quantize(x[0, 1].double().numpy(), key=DitherKey(7, 3, 1),
                             tokens=np.arange(10, 16), block_size=64, layout=RopeLayout.HALF_SPLIT)
    half = torch.from_numpy(stored.channel_scales()) / 2
    assert bool(((y1[0, 1].double() - x[0, 1].double()).abs() <= half + 1e-7).all())
    other = get_scheme("dither_int8")(x, WriteContext(request_id=8, layer=3, start=10, role="key"))
    assert not torch.equal(y1, other)  # a different request draws a different stream
    # the torch store is the numpy reference's, bit for bit (then cast to the model dtype)
    from witcert_calculus.meters.dither import dither_dequantize

    ref = torch.from_numpy(dither_dequantize(stored)).to(torch.float32)
    assert torch.equal(y1[0, 1], ref)
    enc = get_scheme("dither_int8").encode_keys(x, ctx)
    assert torch.equal(enc.scales[0, 1], torch.from_numpy(stored.scales))
    assert torch.equal(enc.x_hat.to(torch.float32), y1)


def test_only_dithered_schemes_expose_a_key_store() -> None:
    with pytest.raises(InvalidValueError, match="not a dithered"):
        get_scheme("int8_token").encode_keys(_x(), CTX)
    with pytest.raises(InvalidValueError, match="keys only"):
        get_scheme("dither_int8").encode_keys(_x(), WriteContext(1, 0, 0, "value"))
