"""Registry of KV compression schemes, each one tensor function ``x -> x_hat``.

A scheme receives the new entries of one layer, ``[batch, kv_heads, tokens, head_dim]``,
together with a :class:`WriteContext` (layer, absolute positions, request id), and
returns the reconstruction that the model will read. Anything registered this way is
measured by the meter; the meter assumes nothing about the scheme (Tier A holds for any
cache-preserving black-box quantizer), so a scheme that goes wrong (e.g. an unscaled fp8
cast that overflows) is reported, not hidden.

Built-in schemes (all registered at import):

- ``identity``: no compression (the reference; witnesses are exactly zero).
- ``int8_token`` / ``int4_g32``: symmetric round-to-nearest, scale per token or per group
  of 32 channels (the whole vector when it has fewer than 32), the scale stored in float16 and used exactly as stored.
- ``fp8_e4m3`` / ``fp8_e5m2``: plain casts (values beyond the format's range become
  non-finite or saturate as torch casts them), and ``fp8_e4m3_scaled`` /
  ``fp8_e5m2_scaled`` with a per-token float16 scale mapping the token's amax to the
  format's largest normal.
- ``dither_int8``: keys through the subtractively dithered INT8 quantizer of
  :mod:`witcert_calculus.dither`, applied through its bit-identical torch port
  :mod:`witcert_kernels.dither` (per-token fp16 scale rounded upward, counter-based
  Philox stream keyed by request, layer, kv head, token and channel; the batch index is
  not part of the key, so a batch shares one stream per request); values through int8
  round-to-nearest. Its key store is exposed through :attr:`Scheme.dithered`, so the
  adapter can issue Tier-B (probabilistic) certificates next to the Tier-A meter.
- ``kivi2_g32``: KIVI-style asymmetric 2-bit (zero point and scale per group of 32
  channels, per token). KIVI's per-channel grouping of keys across tokens needs a token
  buffer and is not modelled.

Main declarations
-----------------
- :class:`EntryRole`, :class:`WriteContext`, :class:`Scheme`, :func:`register_scheme`,
  :func:`get_scheme`, :func:`scheme_names`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import final

import torch

from witcert_calculus.errors import InvalidValueError
from witcert_calculus.validation import real
from witcert_kernels.dither import DitherEncoding, dither_quantize

__all__ = [
    "EntryRole",
    "Scheme",
    "WriteContext",
    "get_scheme",
    "register_scheme",
    "scheme_names",
]


@final
class EntryRole(enum.StrEnum):
    """What a block of written entries is (members equal their values as strings)."""

    KEY = "key"
    """Attention keys (post-RoPE), or a latent cache's first slot."""
    VALUE = "value"
    """Attention values, or a latent cache's second slot."""
    STATE = "state"
    """A recurrent layer's state."""
    INDEXER_KEY = "indexer_key"
    """A learned selector's indexer keys."""


@final
@dataclass(frozen=True, slots=True)
class WriteContext:
    """Where a block of entries is written.

    Attributes:
        request_id: the request the entries belong to (keys the dither stream).
        layer: decoder layer index.
        start: absolute position of the first new token (or the state's step).
        role: what the entries are; a string is converted to its :class:`EntryRole`.

    Raises:
        InvalidValueError: ``role`` names no :class:`EntryRole`.

    Example:
        >>> WriteContext(request_id=1, layer=0, start=0, role="key").role
        <EntryRole.KEY: 'key'>
    """

    request_id: int
    layer: int
    start: int
    role: EntryRole

    def __post_init__(self) -> None:
        try:
            role = EntryRole(self.role)
        except ValueError:
            raise InvalidValueError("role", self.role,
                                    f"must be one of {[str(r) for r in EntryRole]}") from None
        object.__setattr__(self, "role", role)


SchemeFn = Callable[[torch.Tensor, WriteContext], torch.Tensor]
DitherFn = Callable[[torch.Tensor, WriteContext], DitherEncoding]


@final
@dataclass(frozen=True, slots=True)
class Scheme:
    """A registered compression scheme.

    Attributes:
        name: registry key.
        fn: ``(x, ctx) -> x_hat`` on ``[batch, kv_heads, tokens, head_dim]``.
        bits: payload bits per element (scales and zero points not included).
        description: one line.
        dithered: for a subtractively dithered key quantizer, the function returning its
            store (codes, float16 block scales, reconstruction) for keys; the
            adapter records the scales at write time and builds Tier-B certificates from
            them at read time. ``None`` for every other scheme (Tier A only).
    """

    name: str
    fn: SchemeFn
    bits: float
    description: str
    dithered: DitherFn | None = None

    def encode_keys(self, x: torch.Tensor, ctx: WriteContext) -> DitherEncoding:
        """The dithered store of keys ``x`` (same reconstruction as ``self(x, ctx)``).

        Raises:
            InvalidValueError: the scheme is not dithered, or ``ctx.role`` is not a key.
        """
        if self.dithered is None:
            raise InvalidValueError("scheme", self.name, "is not a dithered key quantizer")
        if ctx.role is not EntryRole.KEY:
            raise InvalidValueError("role", ctx.role, "the dithered store holds keys only")
        enc = self.dithered(x, ctx)
        if enc.x_hat.shape != x.shape:
            raise InvalidValueError(f"scheme {self.name!r} encoding", tuple(enc.x_hat.shape),
                                    f"must keep shape {tuple(x.shape)}")
        return enc

    def __call__(self, x: torch.Tensor, ctx: WriteContext) -> torch.Tensor:
        """Apply the scheme, checking that it preserves shape and dtype."""
        y = self.fn(x, ctx)
        if y.shape != x.shape or y.dtype != x.dtype:
            raise InvalidValueError(
                f"scheme {self.name!r} output",
                (tuple(y.shape), str(y.dtype)),
                f"must keep shape {tuple(x.shape)} and dtype {x.dtype}",
            )
        return y


_SCHEMES: dict[str, Scheme] = {}


def register_scheme(name: str, fn: SchemeFn, *, bits: float, description: str,
                    dithered: DitherFn | None = None) -> Scheme:
    """Register a compression scheme under ``name``.

    Args:
        name: registry key (must be new).
        fn: ``(x, ctx) -> x_hat``; must keep shape and dtype.
        bits: payload bits per element.
        description: one line for reports.
        dithered: the key store of a subtractively dithered quantizer (enables Tier B);
            its reconstruction must equal ``fn``'s for keys.

    Returns:
        The registered :class:`Scheme`.

    Raises:
        InvalidValueError: the name is taken or ``bits`` is not positive.

    Example:
        >>> s = register_scheme("halve_doc", lambda x, ctx: x * 0.5, bits=32, description="x/2")
        >>> get_scheme("halve_doc").bits
        32
    """
    if name in _SCHEMES:
        raise InvalidValueError("name", name, "a scheme of that name is already registered")
    real("bits", bits, lo=0.0, lo_open=True)
    scheme = Scheme(name, fn, bits, description, dithered)
    _SCHEMES[name] = scheme
    return scheme


def get_scheme(name: str) -> Scheme:
    """Return the scheme registered as ``name``.

    Raises:
        InvalidValueError: no such scheme (the message lists the registered ones).
    """
    try:
        return _SCHEMES[name]
    except KeyError:
        raise InvalidValueError("scheme", name, f"is not registered; known: {scheme_names()}") from None


def scheme_names() -> list[str]:
    """Names of all registered schemes, sorted."""
    return sorted(_SCHEMES)


def _fp16_scale(amax: torch.Tensor, levels: float) -> torch.Tensor:
    # The scale is stored in float16 and used exactly as stored; a zero block gets scale 1.
    s = (amax / levels).to(torch.float16).to(torch.float32)
    return torch.where(s > 0, s, torch.ones_like(s))


def _rtn_symmetric(x: torch.Tensor, *, qmax: int, group: int) -> torch.Tensor:
    d = x.shape[-1]
    g = d if group <= 0 else min(group, d)
    if d % g:
        raise InvalidValueError("group", group, f"must divide head_dim {d}")
    xf = x.to(torch.float32).reshape(*x.shape[:-1], d // g, g)
    s = _fp16_scale(xf.abs().amax(dim=-1, keepdim=True), float(qmax))
    q = torch.clamp(torch.round(xf / s), -qmax, qmax)
    return (q * s).reshape(x.shape).to(x.dtype)


def _asym(x: torch.Tensor, *, bits: int, group: int) -> torch.Tensor:
    d = x.shape[-1]
    group = min(group, d)
    if d % group:
        raise InvalidValueError("group", group, f"must divide head_dim {d}")
    xf = x.to(torch.float32).reshape(*x.shape[:-1], d // group, group)
    lo = xf.amin(dim=-1, keepdim=True).to(torch.float16).to(torch.float32)
    hi = xf.amax(dim=-1, keepdim=True)
    levels = float(2**bits - 1)
    s = _fp16_scale(hi - lo, levels)
    q = torch.clamp(torch.round((xf - lo) / s), 0, levels)
    return (q * s + lo).reshape(x.shape).to(x.dtype)


def _fp8(x: torch.Tensor, *, dtype: torch.dtype, scaled: bool) -> torch.Tensor:
    xf = x.to(torch.float32)
    if not scaled:
        return xf.to(dtype).to(torch.float32).to(x.dtype)
    fmax = float(torch.finfo(dtype).max)
    s = _fp16_scale(xf.abs().amax(dim=-1, keepdim=True), fmax)
    # The float16 rounding of the scale may map amax slightly above fmax; clamp the input
    # to the format's range so the cast is the format's nearest value, never overflow.
    y = torch.clamp(xf / s, -fmax, fmax).to(dtype).to(torch.float32)
    return (y * s).to(x.dtype)


def _dither_keys(x: torch.Tensor, ctx: WriteContext) -> DitherEncoding:
    # Keys: the subtractively dithered int8 quantizer of witcert_calculus.dither, ported to
    # torch bit for bit (witcert_kernels.dither): one fp16 scale per token (rounded upward,
    # used exactly as stored), Philox stream keyed by request, layer, kv head, token, channel.
    return dither_quantize(x, request=ctx.request_id, layer=ctx.layer, start=ctx.start,
                           block_size=x.shape[-1])


def _dither_int8(x: torch.Tensor, ctx: WriteContext) -> torch.Tensor:
    # Values (and recurrent states): int8 round-to-nearest; keys: the dithered store.
    if ctx.role is not EntryRole.KEY:
        return _rtn_symmetric(x, qmax=127, group=0)
    return _dither_keys(x, ctx).x_hat.to(x.dtype)


register_scheme("identity", lambda x, ctx: x, bits=32, description="no compression (reference)")
register_scheme("int8_token", lambda x, ctx: _rtn_symmetric(x, qmax=127, group=0), bits=8,
                description="int8 round-to-nearest, one fp16 scale per token")
register_scheme("int4_g32", lambda x, ctx: _rtn_symmetric(x, qmax=7, group=32), bits=4,
                description="int4 round-to-nearest, one fp16 scale per 32 channels")
register_scheme("fp8_e4m3", lambda x, ctx: _fp8(x, dtype=torch.float8_e4m3fn, scaled=False),
                bits=8, description="plain cast to fp8 e4m3 (no scale)")
register_scheme("fp8_e4m3_scaled", lambda x, ctx: _fp8(x, dtype=torch.float8_e4m3fn, scaled=True),
                bits=8, description="fp8 e4m3 with a per-token fp16 scale")
register_scheme("fp8_e5m2", lambda x, ctx: _fp8(x, dtype=torch.float8_e5m2, scaled=False),
                bits=8, description="plain cast to fp8 e5m2 (no scale)")
register_scheme("fp8_e5m2_scaled", lambda x, ctx: _fp8(x, dtype=torch.float8_e5m2, scaled=True),
                bits=8, description="fp8 e5m2 with a per-token fp16 scale")
register_scheme("kivi2_g32", lambda x, ctx: _asym(x, bits=2, group=32), bits=2,
                description="KIVI-style asymmetric 2-bit, per token, groups of 32 channels")
register_scheme("dither_int8", _dither_int8, bits=8,
                description="keys: subtractively dithered int8 (Philox stream), values: int8 RTN",
                dithered=_dither_keys)
