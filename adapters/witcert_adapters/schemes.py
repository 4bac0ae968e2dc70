"""Registry of KV compression schemes, each one tensor function ``x -> x_hat``.

A scheme receives the new entries of one layer, ``[batch, kv_heads, tokens, head_dim]``,
together with a :class:`WriteContext` (layer, absolute positions, request id), and
returns the reconstruction that the model will read. Anything registered this way is
measured by the meter; the meter assumes nothing about the scheme (Tier A holds for any
cache-preserving black-box quantizer), so a scheme that goes wrong (e.g. an unscaled fp8
cast that overflows) is reported, not hidden.

Built-in schemes (all registered at import):

- ``identity``: no compression (the reference; witnesses are exactly zero).
- ``int8_token`` / ``int8_g32`` / ``int4_g32``: symmetric round-to-nearest, scale per token or
  per group of 32 channels (the whole vector when it has fewer than 32), the scale stored in
  float16 and used exactly as stored.
- ``fp8_e4m3`` / ``fp8_e5m2``: plain casts (values beyond the format's range become
  non-finite or saturate as torch casts them), and ``fp8_e4m3_scaled`` /
  ``fp8_e5m2_scaled`` with a per-token float16 scale mapping the token's amax to the
  format's largest normal.
- ``dither_int8``: keys through the subtractively dithered INT8 quantizer of
  :mod:`witcert_calculus.meters.dither`, applied through its bit-identical torch port
  :mod:`witcert_kernels.dither` (per-token fp16 scale rounded upward, counter-based
  Philox stream keyed by request, layer, kv head, token and channel; the batch index is
  not part of the key, so a batch shares one stream per request); values through int8
  round-to-nearest. Its key store is described by :attr:`Scheme.dithered` (a
  :class:`DitherSpec`), so the adapter can issue Tier-B (probabilistic) certificates next
  to the Tier-A meter.
- ``dither_int8_g{G}_m{M}`` (``g32_m0``, ``g32_m2``, ``g32_m4``, ``g16_m4``): the full Tier-B
  store: one fp16 scale per group of ``G`` channels, and ``M`` outlier RoPE pairs per
  (layer, kv head) chosen from the prefill keys by pair energy
  (:func:`witcert_kernels.dither.select_outlier_pairs`), kept for the request, stored in
  fp16 and excluded from the group amax; values through int8 round-to-nearest with groups
  of ``G`` channels.
- ``kivi2_g32``: KIVI-style asymmetric 2-bit (zero point and scale per group of 32
  channels, per token). KIVI's per-channel grouping of keys across tokens needs a token
  buffer and is not modelled.

Main declarations
-----------------
- :class:`EntryRole`, :class:`WriteContext`, :class:`DitherSpec`, :class:`Scheme`,
  :func:`register_scheme`, :func:`get_scheme`, :func:`scheme_names`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import final

import torch

from witcert_calculus.errors import InvalidValueError
from witcert_calculus.meters.dither import byte_account
from witcert_calculus.meters.witness import RopeLayout
from witcert_calculus.numerics.validation import positive_int, real
from witcert_kernels.dither import DitherEncoding, dither_quantize, select_outlier_pairs

__all__ = [
    "DitherSpec",
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
        layout: the RoPE layout of the entries (which channels form a rotation pair).

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
    layout: RopeLayout = RopeLayout.HALF_SPLIT

    def __post_init__(self) -> None:
        try:
            role = EntryRole(self.role)
        except ValueError:
            raise InvalidValueError("role", self.role,
                                    f"must be one of {[str(r) for r in EntryRole]}") from None
        object.__setattr__(self, "role", role)


SchemeFn = Callable[[torch.Tensor, WriteContext], torch.Tensor]


@final
@dataclass(frozen=True, slots=True)
class DitherSpec:
    """A subtractively dithered key store: its group size and its outlier pairs.

    Attributes:
        group: channels per float16 scale (``0``: one scale per head vector); must divide
            the head dimension when the store is used.
        outlier_pairs: RoPE pairs per (layer, kv head) kept exact (chosen from the first
            write's keys, by pair energy, and kept for the request).

    Raises:
        InvalidValueError: a negative group or pair count.

    Example:
        >>> DitherSpec(group=32, outlier_pairs=4).block_size(64)
        32
    """

    group: int
    outlier_pairs: int

    def __post_init__(self) -> None:
        positive_int("group", self.group, minimum=0)
        positive_int("outlier_pairs", self.outlier_pairs, minimum=0)

    def block_size(self, head_dim: int) -> int:
        """Channels per scale for vectors of ``head_dim`` channels.

        Raises:
            InvalidValueError: the group does not divide ``head_dim``.
        """
        g = self.group or head_dim
        if head_dim % g:
            raise InvalidValueError("group", self.group, f"must divide head_dim {head_dim}")
        return g

    def select(self, x: torch.Tensor, ctx: WriteContext) -> torch.Tensor:
        """The outlier pairs ``[kv_heads, m]`` of keys ``x`` (the rule of
        :func:`witcert_kernels.dither.select_outlier_pairs`).

        Raises:
            InvalidValueError: more pairs than ``head_dim / 2``.
        """
        return select_outlier_pairs(x, count=self.outlier_pairs, layout=ctx.layout)

    def encode(self, x: torch.Tensor, ctx: WriteContext, pairs: torch.Tensor | None = None, *,
               exact: torch.Tensor | None = None, noise: torch.Tensor | None = None,
               deferred: list[torch.Tensor] | None = None) -> DitherEncoding:
        """The store of keys ``x``; ``pairs`` are the request's fixed outlier pairs (``None``:
        chosen from ``x`` itself). ``exact``, ``noise`` and ``deferred`` are passed to
        :func:`witcert_kernels.dither.dither_quantize` (a cache's kept channel mask, its
        forward's precomputed noise, its checks left to one read per forward)."""
        chosen = self.select(x, ctx) if pairs is None else pairs
        return dither_quantize(x, request=ctx.request_id, layer=ctx.layer, start=ctx.start,
                               block_size=self.block_size(int(x.shape[-1])),
                               outlier_pairs=chosen, layout=ctx.layout, exact=exact,
                               noise=noise, deferred=deferred)


@final
@dataclass(frozen=True, slots=True)
class Scheme:
    """A registered compression scheme.

    Attributes:
        name: registry key.
        fn: ``(x, ctx) -> x_hat`` on ``[batch, kv_heads, tokens, head_dim]``.
        bits: payload bits per element (scales and zero points not included).
        description: one line.
        dithered: for a subtractively dithered key quantizer, its :class:`DitherSpec`; the
            adapter fixes the outlier pairs on a layer's first write, records the scales and
            the exact channels at write time and builds Tier-B certificates from them at read
            time. ``None`` for every other scheme (Tier A only).
        group: channels per stored scale (``0``: one per vector; also for a plain cast,
            whose ``meta_bytes`` is 0).
        meta_bytes: bytes stored per group next to the payload (a float16 scale: 2; scale
            and zero point: 4; none: 0).
    """

    name: str
    fn: SchemeFn
    bits: float
    description: str
    dithered: DitherSpec | None = None
    group: int = 0
    meta_bytes: int = 0

    def key_bytes(self, head_dim: int, *, tokens: int = 1) -> float:
        """Bytes per token per head of a stored key: payload plus per-group metadata; for a
        dithered store, :func:`witcert_calculus.meters.dither.byte_account` over ``tokens`` stored
        tokens (the outlier indices amortize over them). The adapter measures a dithered
        store from its tensors (:meth:`witcert_kernels.dither.DitherEncoding.byte_account`).

        Example:
            >>> get_scheme("int4_g32").key_bytes(64), get_scheme("dither_int8_g32_m4").key_bytes(64)
            (36.0, 84.0)
        """
        d = positive_int("head_dim", head_dim)
        if self.dithered is not None:
            return byte_account(d, block_size=self.dithered.block_size(d),
                                outlier_pairs=self.dithered.outlier_pairs, tokens=tokens).total
        groups = 1 if self.group == 0 else -(-d // min(self.group, d))
        return d * self.bits / 8 + groups * self.meta_bytes

    def encode_keys(self, x: torch.Tensor, ctx: WriteContext,
                    pairs: torch.Tensor | None = None) -> DitherEncoding:
        """The dithered store of keys ``x`` (same reconstruction as ``self(x, ctx)`` when
        ``pairs`` is ``None``: the outlier pairs are then chosen from ``x``).

        Args:
            x: keys ``[batch, kv_heads, tokens, head_dim]``.
            ctx: where they are written.
            pairs: the request's fixed outlier pairs ``[kv_heads, m]`` (a cache passes the
                pairs it chose on the layer's first write).

        Raises:
            InvalidValueError: the scheme is not dithered, ``ctx.role`` is not a key, or the
                pairs do not match the scheme's count.
        """
        if self.dithered is None:
            raise InvalidValueError("scheme", self.name, "is not a dithered key quantizer")
        if ctx.role is not EntryRole.KEY:
            raise InvalidValueError("role", ctx.role, "the dithered store holds keys only")
        if pairs is not None and int(pairs.shape[-1]) != self.dithered.outlier_pairs:
            raise InvalidValueError("pairs", tuple(pairs.shape),
                                    f"scheme {self.name!r} keeps "
                                    f"{self.dithered.outlier_pairs} pairs per kv head")
        return self.dithered.encode(x, ctx, pairs)

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
                    dithered: DitherSpec | None = None, group: int = 0,
                    meta_bytes: int = 0) -> Scheme:
    """Register a compression scheme under ``name``.

    Args:
        name: registry key (must be new).
        fn: ``(x, ctx) -> x_hat``; must keep shape and dtype.
        bits: payload bits per element.
        description: one line for reports.
        dithered: the key store of a subtractively dithered quantizer (enables Tier B);
            ``fn`` must return its reconstruction for keys.
        group, meta_bytes: the stored metadata (see :class:`Scheme`), for byte accounts.

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
    positive_int("group", group, minimum=0)
    positive_int("meta_bytes", meta_bytes, minimum=0)
    scheme = Scheme(name, fn, bits, description, dithered, group, meta_bytes)
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


def _dithered(spec: DitherSpec) -> SchemeFn:
    # Keys: the subtractively dithered int8 store (witcert_kernels.dither, the numpy reference
    # bit for bit), read as a cache of the keys' dtype holds them; values (and recurrent
    # states): int8 round-to-nearest with the same groups.
    def fn(x: torch.Tensor, ctx: WriteContext) -> torch.Tensor:
        if ctx.role is not EntryRole.KEY:
            return _rtn_symmetric(x, qmax=127, group=spec.group)
        return spec.encode(x, ctx).read(x.dtype)
    return fn


register_scheme("identity", lambda x, ctx: x, bits=32, description="no compression (reference)")
register_scheme("int8_token", lambda x, ctx: _rtn_symmetric(x, qmax=127, group=0), bits=8,
                description="int8 round-to-nearest, one fp16 scale per token", meta_bytes=2)
register_scheme("int8_g32", lambda x, ctx: _rtn_symmetric(x, qmax=127, group=32), bits=8,
                description="int8 round-to-nearest, one fp16 scale per 32 channels", group=32,
                meta_bytes=2)
register_scheme("int4_g32", lambda x, ctx: _rtn_symmetric(x, qmax=7, group=32), bits=4,
                description="int4 round-to-nearest, one fp16 scale per 32 channels", group=32,
                meta_bytes=2)
register_scheme("fp8_e4m3", lambda x, ctx: _fp8(x, dtype=torch.float8_e4m3fn, scaled=False),
                bits=8, description="plain cast to fp8 e4m3 (no scale)")
register_scheme("fp8_e4m3_scaled", lambda x, ctx: _fp8(x, dtype=torch.float8_e4m3fn, scaled=True),
                bits=8, description="fp8 e4m3 with a per-token fp16 scale", meta_bytes=2)
register_scheme("fp8_e5m2", lambda x, ctx: _fp8(x, dtype=torch.float8_e5m2, scaled=False),
                bits=8, description="plain cast to fp8 e5m2 (no scale)")
register_scheme("fp8_e5m2_scaled", lambda x, ctx: _fp8(x, dtype=torch.float8_e5m2, scaled=True),
                bits=8, description="fp8 e5m2 with a per-token fp16 scale", meta_bytes=2)
register_scheme("kivi2_g32", lambda x, ctx: _asym(x, bits=2, group=32), bits=2,
                description="KIVI-style asymmetric 2-bit, per token, groups of 32 channels",
                group=32, meta_bytes=4)
_DITHER_PLAIN = DitherSpec(group=0, outlier_pairs=0)
register_scheme("dither_int8", _dithered(_DITHER_PLAIN), bits=8,
                description="keys: subtractively dithered int8 (Philox stream), values: int8 RTN",
                dithered=_DITHER_PLAIN, meta_bytes=2)
for _group, _pairs in ((32, 0), (32, 2), (32, 4), (16, 4)):
    _spec = DitherSpec(group=_group, outlier_pairs=_pairs)
    register_scheme(f"dither_int8_g{_group}_m{_pairs}", _dithered(_spec), bits=8,
                    description=f"keys: dithered int8, fp16 scale per {_group} channels, "
                                f"{_pairs} exact fp16 outlier pairs; values: int8 RTN g{_group}",
                    dithered=_spec, group=_group, meta_bytes=2)
