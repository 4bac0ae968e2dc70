"""Tests of witcert_calculus.meters.formats: fp8 codes, the residual bound each code carries,
the box logit bound, and the token-wise minimum of two bounds.

The writers here are references written for the tests, in numpy float32 (a truncating writer
with the float32 reciprocal of the scale, as vLLM's CPU build; a round-to-nearest writer by
torch's own fp8 cast); every residual is checked in exact rational arithmetic.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from witcert_calculus.errors import ForgedBoundError, InvalidValueError
from witcert_calculus.meters.formats import EPS, ETA, Fp8Format, Rounding, code_step, \
    code_value, format_logit_bound, format_witness, witness_exact, witness_table
from witcert_calculus.lean.theorems import BOX_LOGIT_BOUND_METER_SOUND, MIN_BOUND_SOUND
from witcert_calculus.meters.tv_forms import tv_meter
from witcert_calculus.meters.witness import RopeLayout, band_witness, logit_bound, tighter
from witcert_calculus.tiers import Tier, decide_tier, theorems_of
from witcert_kernels import meter as tmeter

FORMATS = (Fp8Format.E4M3, Fp8Format.E5M2)
_VIEW = {Fp8Format.E4M3: torch.float8_e4m3fn, Fp8Format.E5M2: torch.float8_e5m2}
_MAX = {Fp8Format.E4M3: 448.0, Fp8Format.E5M2: 57344.0}


def truncating_writer(x: np.ndarray, scale: float, fmt: Fp8Format) -> np.ndarray:
    """Bytes of a writer that truncates ``fl32(x * fl32(1/s))`` (NaN -> the max code)."""
    inv = np.float32(1.0) / np.float32(scale)
    with np.errstate(over="ignore", invalid="ignore"):
        v = x.astype(np.float32) * inv
    nan = np.isnan(v)
    v = np.clip(np.where(nan, 0, v), -_MAX[fmt], _MAX[fmt]).astype(np.float32)
    with np.errstate(under="ignore"):
        u = (np.abs(v) * np.float32(2.0 ** (fmt.bias - 127))).astype(np.float32)
    mag = np.minimum((u.view(np.uint32) >> (23 - fmt.mantissa_bits)) & 0x7F, fmt.max_code)
    code = (np.signbit(v).astype(np.uint32) << 7) | mag
    code = np.where(v == 0, 0, code)
    return np.where(nan, fmt.max_code, code).astype(np.uint8)


def nearest_writer(x: np.ndarray, scale: float, fmt: Fp8Format) -> np.ndarray:
    """Bytes of a writer that rounds ``fl32(x / s)`` to nearest (torch's cast), saturating."""
    v = torch.from_numpy(x.astype(np.float32)) / torch.tensor(scale, dtype=torch.float32)
    v = torch.clamp(v, -_MAX[fmt], _MAX[fmt])
    return v.to(_VIEW[fmt]).view(torch.uint8).numpy()


def _finite_bfloat16() -> np.ndarray:
    everything = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    x = everything.float()
    return x[torch.isfinite(x)].double().numpy()


def _violations(x: np.ndarray, codes: np.ndarray, scale: float, fmt: Fp8Format,
                rounding: Rounding, *, eta: Fraction = ETA) -> list[tuple[float, int]]:
    """Elements whose exact residual |x - s q| exceeds the exact witness of their code."""
    s = Fraction(float(np.float32(scale)))
    bad = []
    for xi, c in zip(x.tolist(), codes.tolist(), strict=True):
        if not np.isfinite(xi):
            continue
        g = code_step(c, fmt) / (2 if rounding is Rounding.NEAREST else 1)
        if (c & 0x7F) >= fmt.max_code:
            continue  # saturated: inf
        w = s * (g + eta * (abs(code_value(c, fmt)) + g) + EPS)
        if abs(Fraction(xi) - s * code_value(c, fmt)) > w:
            bad.append((xi, c))
    return bad


@pytest.mark.parametrize("fmt", FORMATS)
def test_code_values_are_the_formats_own(fmt: Fp8Format) -> None:
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    decoded = codes.view(_VIEW[fmt]).double().tolist()
    for c in range(256):
        if (c & 0x7F) > fmt.max_code:
            continue  # NaN (e4m3fn 0x7F) or inf/NaN (e5m2 0x7C..0x7F): never written
        assert float(code_value(c, fmt)) == decoded[c], hex(c)
        up = code_value(c + 1, fmt) if (c & 0x7F) < 0x7F else None
        if up is not None and (c & 0x7F) < fmt.max_code and c < 0x80:
            assert up - code_value(c, fmt) == code_step(c, fmt)  # the step to the next code


@pytest.mark.parametrize("fmt", FORMATS)
def test_table_is_the_exact_witness_rounded_up(fmt: Fp8Format) -> None:
    for rounding in Rounding:
        for scale in (1.0, 0.1, 3.0):
            table = witness_table(fmt, rounding, scale=scale)
            assert not table.flags.writeable
            for c in range(256):
                w = witness_exact(c, fmt, rounding, Fraction(scale))
                if w is None:
                    assert table[c] == np.inf and (c & 0x7F) >= fmt.max_code
                else:
                    assert Fraction(float(table[c])) >= w
                    assert Fraction(float(np.nextafter(table[c], 0))) < w


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("scale", [1.0, 1 / 16, 0.1, 3.0, 1.7])
def test_truncating_writer_every_bfloat16_value(fmt: Fp8Format, scale: float) -> None:
    x = _finite_bfloat16()
    codes = truncating_writer(x, scale, fmt)
    w = format_witness(codes, fmt=fmt, rounding=Rounding.TRUNCATE, scale=float(np.float32(scale)))
    q = np.array([float(code_value(c, fmt)) for c in range(256)])[codes] * float(np.float32(scale))
    # x - q is exact in float64 here: a finite witness keeps x within a step of q
    assert (np.abs(x - q) <= w).all()
    assert not _violations(x[:4096], codes[:4096], scale, fmt, Rounding.TRUNCATE)


@pytest.mark.parametrize("scale", [3.1842105388641357, 3.763157844543457])
def test_the_float32_slack_is_needed(scale: float) -> None:
    # At these scales float32(1/s) rounds down, so an x just above a code boundary times s
    # lands just below the boundary after the writer's multiply and truncates a whole step:
    # without eta the bound fails (the check can fail), with it the bound holds.
    s32 = np.float32(scale)
    assert Fraction(float(np.float32(1) / s32)) * Fraction(float(s32)) < 1
    edges = np.array([float(code_value(c, Fp8Format.E4M3)) for c in range(1, 0x7E)])
    near = (edges.astype(np.float32) * s32).astype(np.float32)
    x = np.concatenate([near, np.nextafter(near, np.float32(np.inf))]).astype(np.float64)
    codes = truncating_writer(x, scale, Fp8Format.E4M3)
    assert _violations(x, codes, scale, Fp8Format.E4M3, Rounding.TRUNCATE, eta=Fraction(0))
    assert not _violations(x, codes, scale, Fp8Format.E4M3, Rounding.TRUNCATE)


def test_a_nearest_witness_under_states_truncated_bytes() -> None:
    x = np.linspace(-20, 20, 4001)
    codes = truncating_writer(x, 1.0, Fp8Format.E4M3)
    assert _violations(x, codes, 1.0, Fp8Format.E4M3, Rounding.NEAREST)  # half a step: wrong
    assert not _violations(x, codes, 1.0, Fp8Format.E4M3, Rounding.TRUNCATE)


@given(st.lists(st.floats(min_value=-3e4, max_value=3e4, allow_nan=False, width=32),
                min_size=1, max_size=40),
       st.sampled_from([1.0, 0.37, 2.5, 1 / 1024]), st.sampled_from(FORMATS))
def test_writers_stay_within_the_witness_property(xs: list[float], scale: float,
                                                  fmt: Fp8Format) -> None:
    x = np.array(xs, dtype=np.float64)
    assert not _violations(x, truncating_writer(x, scale, fmt), scale, fmt, Rounding.TRUNCATE)
    inside = x[np.abs(x / np.float32(scale)) < _MAX[fmt] * 0.99]
    assert not _violations(inside, nearest_writer(inside, scale, fmt), scale, fmt,
                           Rounding.NEAREST)


def test_saturated_and_special_codes() -> None:
    x = np.array([np.nan, np.inf, -np.inf, 1e6, -1e6, 0.0, -0.0, 1e-45])
    codes = truncating_writer(x, 1.0, Fp8Format.E4M3)
    assert codes.tolist() == [0x7E, 0x7E, 0xFE, 0x7E, 0xFE, 0, 0, 0]
    w = format_witness(codes, fmt=Fp8Format.E4M3, rounding=Rounding.TRUNCATE, scale=1.0)
    assert np.isinf(w[:5]).all() and (w[5:] > 0).all()
    with pytest.raises(InvalidValueError, match="codes"):
        format_witness(np.array([256]), fmt=Fp8Format.E4M3, rounding=Rounding.TRUNCATE,
                       scale=1.0)
    with pytest.raises(InvalidValueError, match="scale"):
        witness_table(Fp8Format.E4M3, Rounding.TRUNCATE, scale=0.0)
    with pytest.raises(InvalidValueError, match="scale"):
        witness_table(Fp8Format.E4M3, Rounding.TRUNCATE, scale=float("inf"))
    with pytest.raises(InvalidValueError, match="code"):
        code_value(-1, Fp8Format.E4M3)


@given(st.integers(min_value=0, max_value=2**31 - 1))
def test_box_bound_holds_and_is_tight(seed: int) -> None:
    rng = np.random.default_rng(seed)
    d, s_len = int(rng.integers(2, 65)), int(rng.integers(1, 9))
    q = rng.standard_normal(d) * rng.choice([1e-3, 1.0, 1e3])
    w = np.abs(rng.standard_normal((s_len, d))) * rng.choice([1e-6, 1e-2, 1.0])
    scale = float(d ** -0.5)
    c = format_logit_bound(q, w, scale=scale)
    exact_max = [abs(sum(Fraction(float(qc)) * Fraction(float(wc)) * (1 if qc >= 0 else -1)
                         for qc, wc in zip(q, w[t], strict=True))) * Fraction(scale)
                 for t in range(s_len)]
    for t in range(s_len):
        assert Fraction(float(c.values[t])) >= exact_max[t]  # the residual sign(q) * w
        assert float(c.values[t]) <= float(exact_max[t]) * (1 + 1e-12) + 1e-300
        r = rng.uniform(-1, 1, d) * w[t]  # any residual in the box
        assert abs(scale * float(np.dot(q, r))) <= float(c.values[t])


def test_box_bound_evidence_saturation_and_errors() -> None:
    q = np.array([1.0, 0.0, -2.0])
    w = np.array([[0.1, np.inf, 0.2], [0.0, 0.0, 0.0], [np.inf, 0.0, 0.0]])
    c = format_logit_bound(q, w, scale=0.5)
    assert c.values[0] == np.inf  # inf meets a zero query channel: saturated, never NaN
    assert c.values[1] == 0.0 and c.values[2] == np.inf
    assert theorems_of(c.evidence) == (BOX_LOGIT_BOUND_METER_SOUND,)
    assert decide_tier(c.evidence) is Tier.CERTIFIED
    with pytest.raises(InvalidValueError, match="channels"):
        format_logit_bound(q, np.ones((2, 4)), scale=0.5)
    with pytest.raises(InvalidValueError, match="witness"):
        format_logit_bound(q, -np.ones((2, 3)), scale=0.5)


def test_torch_twin_matches_numpy() -> None:
    rng = np.random.default_rng(5)
    q = rng.standard_normal((3, 4, 64))  # [batch, rows, d]
    w = np.abs(rng.standard_normal((3, 7, 64))) * 1e-2
    got = tmeter.format_logit_bound(torch.from_numpy(q), torch.from_numpy(w), scale=0.125)
    assert tuple(got.values.shape) == (3, 4, 7)
    for b in range(3):
        for m in range(4):
            ref = format_logit_bound(q[b, m], w[b], scale=0.125).values
            assert np.allclose(got.values[b, m].numpy(), ref, rtol=1e-14, atol=0)
            assert (got.values[b, m].numpy() >= ref * (1 - 1e-15)).all()
    codes = torch.randint(0, 256, (5, 8), dtype=torch.int32).to(torch.uint8)
    tw = tmeter.format_witness(codes, fmt=Fp8Format.E5M2, rounding=Rounding.TRUNCATE, scale=0.5)
    nw = format_witness(codes.numpy(), fmt=Fp8Format.E5M2, rounding=Rounding.TRUNCATE, scale=0.5)
    assert np.array_equal(tw.numpy(), nw)
    with pytest.raises(InvalidValueError, match="uint8"):
        tmeter.format_witness(codes.to(torch.int32), fmt=Fp8Format.E5M2,
                              rounding=Rounding.TRUNCATE, scale=0.5)


def test_tighter_takes_the_smaller_bound_and_keeps_both_evidences() -> None:
    rng = np.random.default_rng(2)
    d = 16
    q = rng.standard_normal(d)
    residual = rng.standard_normal((5, d)) * np.array([1e-3] * 8 + [1e-1] * 8)  # uneven bands
    layout = RopeLayout.HALF_SPLIT
    band = logit_bound(q, band_witness(residual, bands=2, layout=layout), layout=layout,
                       scale=0.25)
    box = format_logit_bound(q, np.abs(residual) * 1.5, scale=0.25)
    both = tighter(band, box)
    assert np.array_equal(both.values, np.minimum(band.values, box.values))
    assert MIN_BOUND_SOUND in theorems_of(both.evidence)
    assert decide_tier(both.evidence) is Tier.CERTIFIED
    exact = np.abs(0.25 * residual @ q)
    assert (exact <= both.values).all()
    p = np.full(5, 0.2)
    assert tv_meter(p, both).raw <= min(tv_meter(p, band).raw, tv_meter(p, box).raw)
    with pytest.raises(InvalidValueError, match="same tokens"):
        tighter(band, format_logit_bound(q, np.ones((4, d)), scale=0.25))
    forged = object.__new__(type(band))
    with pytest.raises(ForgedBoundError):
        tighter(band, forged)  # type: ignore[arg-type]
