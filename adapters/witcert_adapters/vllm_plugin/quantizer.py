"""vLLM's CPU fp8 KV-cache writer, modelled bit for bit, and the check that the engine agrees.

``torch.ops._C.cpu_attn_reshape_and_cache`` (vLLM's CPU build, ISAs ``vec`` and ``amx``) turns
each key and value element ``x`` into one byte. Measured on the installed build by writing
every finite bfloat16 value (and random float32 values) at several scales and reading the
bytes back, the rule is, in float32 arithmetic:

1. ``inv = 1 / float32(scale)``, ``v = float32(x) * inv``;
2. NaN gives the largest finite code (``0x7E`` e4m3, ``0x7B`` e5m2); otherwise ``v`` is
   clamped to the largest finite value (so ``+-inf`` give ``0x7E``/``0xFE``);
3. ``v == 0`` (either sign) gives ``0x00``;
4. ``u = |v| * 2^(bias - 127)`` (a float32 whose exponent field is the format's), and the
   magnitude code is ``(bits(u) >> (23 - m)) & 0x7F`` capped at the largest finite code: the
   mantissa is **truncated** (rounded toward zero), not rounded to nearest; the sign bit is
   ``v``'s.

The engine reads a byte back as ``value(code) * scale``; the plugin dequantizes with the
float32 scale the writer used, ``value(code) * float32(scale)``, exactly, in float64.

Because the rule is known, each byte bounds its own residual
(:mod:`witcert_calculus.meters.formats`, :attr:`~witcert_calculus.meters.formats.Rounding.
TRUNCATE`). That bound is only as good as the model: :func:`check_bytes` compares the bytes
the engine stored with the model's bytes exactly, on every write, and names the first byte
that differs.

Main declarations
-----------------
- :func:`engine_codes`: the bytes vLLM's CPU writer stores for given elements.
- :func:`float32_scale`: the scale as the writer and the reader use it.
- :func:`check_bytes`: stored bytes against the model's, exactly.
- :func:`bits`: elements as their bit patterns (what :func:`check_bytes` compares).
- :data:`ROUNDING`: the writer's rounding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np
import torch

from witcert_calculus.errors import EngineMismatchError, InvalidValueError
from witcert_calculus.meters.formats import Fp8Format, Rounding

__all__ = ["ROUNDING", "bits", "check_bytes", "engine_codes", "float32_scale"]

ROUNDING: Final = Rounding.TRUNCATE
"""How vLLM's CPU writer rounds onto the fp8 grid (measured: toward zero)."""

_MAX: Final = {Fp8Format.E4M3: 448.0, Fp8Format.E5M2: 57344.0}


def float32_scale(scale: float) -> float:
    """The scale as the writer and the reader use it: ``float32(scale)``, checked.

    Raises:
        InvalidValueError: a scale that is 0, negative, NaN or infinite, or that float32
            cannot hold as a positive normal number (its reciprocal would overflow).

    Example:
        >>> float32_scale(0.1)
        0.10000000149011612
    """
    with np.errstate(over="ignore"):
        s = np.float32(float(scale))
    if not (bool(np.isfinite(s)) and float(s) >= 2.0 ** -126):
        raise InvalidValueError("kv scale", scale, "must be a positive finite float32 normal "
                                "number (the writer multiplies by float32(1/scale))")
    return float(s)


def engine_codes(x: torch.Tensor, *, scale: float | Sequence[float], fmt: Fp8Format
                 ) -> torch.Tensor:
    """The bytes vLLM's CPU writer stores for the elements ``x`` (the rule above).

    Args:
        x: elements in the model's dtype (bfloat16, float16 or float32), any shape.
        scale: the layer's key (or value) scale; or one scale per ``x[k]`` (several layers'
            elements stacked, each quantized at its own scale).
        fmt: the cache's fp8 format.

    Returns:
        ``uint8`` tensor of ``x``'s shape.

    Example:
        >>> engine_codes(torch.tensor([1.0, 1.2, -0.0, 500.0]), scale=1.0,
        ...              fmt=Fp8Format.E4M3).tolist()
        [56, 57, 0, 126]
    """
    if isinstance(scale, Sequence):
        if x.dim() == 0 or len(scale) != int(x.shape[0]):
            raise InvalidValueError("scale", f"{len(scale)} scales", "must be one per leading "
                                    f"slice of the elements ({tuple(x.shape)})")
        s32 = torch.tensor([float32_scale(s) for s in scale], dtype=torch.float32) \
            .view(-1, *([1] * (x.dim() - 1)))
    else:
        s32 = torch.tensor(float32_scale(scale), dtype=torch.float32)
    inv = torch.ones((), dtype=torch.float32) / s32
    v = x.to(torch.float32) * inv
    top = _MAX[fmt]
    nan = torch.isnan(v)
    v = torch.clamp(v, -top, top)
    shift = torch.tensor(2.0 ** (fmt.bias - 127), dtype=torch.float32)
    u = v.abs() * shift
    mag = (u.view(torch.int32) >> (23 - fmt.mantissa_bits)) & 0x7F
    mag = torch.clamp(mag, max=fmt.max_code)
    sign = torch.signbit(v).to(torch.int32) << 7
    code = torch.where(nan, fmt.max_code, torch.where(v == 0, 0, sign | mag))
    return code.to(torch.uint8)


def check_bytes(stored: torch.Tensor, expected: torch.Tensor, *, what: str, layer: int,
                slots: torch.Tensor) -> None:
    """Stored bytes (or model-dtype elements) against the model's, exactly.

    Args:
        stored, expected: ``[n, kv_heads, d]`` what the cache holds and what the model says
            it must hold (bytes as ``uint8``; a model-dtype cache as its elements).
        what: ``"key"`` or ``"value"``, named in the error.
        layer: the attention layer; ``slots``: ``[n]`` the engine slots of the rows.

    Raises:
        EngineMismatchError: the first differing element, by layer, slot, kv head and
            channel, with both bytes; never a tolerance.
    """
    if stored.shape != expected.shape or stored.dtype != expected.dtype:
        raise InvalidValueError("stored", f"{tuple(stored.shape)} {stored.dtype}",
                                f"must have the model's {tuple(expected.shape)} "
                                f"{expected.dtype}")
    same = bits(stored) == bits(expected)  # bit patterns: a NaN element equals itself
    if bool(same.all()):
        return
    row, head, channel = (int(i) for i in torch.nonzero(~same)[0])
    got, want = stored[row, head, channel], expected[row, head, channel]
    raise EngineMismatchError(
        f"KV cache {what} bytes (layer {layer}, slot {int(slots[row])}, kv head {head}, "
        f"channel {channel})", f"{_show(want)} (the plugin's model of the engine's writer)",
        f"{_show(got)} stored by the engine; {int((~same).sum())} of {same.numel()} elements "
        "differ")


_BITS: Final = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(t: torch.Tensor) -> torch.Tensor:
    """The elements' bit patterns as integers of their width (a NaN equals itself)."""
    return t.view(_BITS[t.element_size()])


def _show(t: torch.Tensor) -> str:
    return f"0x{int(t):02X}" if t.dtype == torch.uint8 else \
        f"{float(t)!r} (bits 0x{int(bits(t)):X})"
