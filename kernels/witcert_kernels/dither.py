"""Torch port of the subtractively dithered INT8 key quantizer of :mod:`witcert_calculus.meters.dither`.

The numpy module is the reference; this port produces the *same bits*: the same
Philox-4x32-10 stream keyed by ``(request, layer, kv_head, token, channel)`` (counter words
``(channel, token, kv_head, layer)``, key words ``(request mod 2^32, request div 2^32)``,
``xi = (w0 >> 8) * 2^-24 - 1/2``), the same block scale ``amax / (Q - 1/2)`` stored in
float16 *rounded upward*, the same codes ``rint(x/s + xi)`` computed with the scale exactly
as stored, and the same reconstruction ``s * (code - xi)`` in float64. The test suite
checks bit-identity of the noise, the scales, the codes and the reconstruction against
the numpy reference.

uint32 arithmetic is done in int64 with explicit 16-bit limbs for the 32x32 -> 64-bit
products (every intermediate stays below 2^49), so nothing relies on wrapping overflow.

Outlier RoPE pairs (:func:`select_outlier_pairs`, the rule of
:func:`witcert_calculus.meters.dither.select_outlier_pairs`: the ``m`` pairs of largest energy
``sum_t (x_{t,a}^2 + x_{t,b}^2)``) are fixed per ``(layer, kv head)``, kept exact in the
reconstruction ``x_hat`` and excluded from the block amax, as in the reference; the store
keeps their values in float16 (:attr:`DitherEncoding.outlier_values`), and
:meth:`DitherEncoding.read` is the key a cache holds. Its difference to ``x_hat`` (the
reconstruction's rounding and the float16 rounding of the outlier values) is the
deterministic cast term of :func:`tier_b_logit_bound`. :meth:`DitherEncoding.byte_account`
measures the packed bytes per token per head from the stored tensors.

The Tier-B per-token logit bound (:func:`tier_b_logit_bound`) is the formula of
:func:`witcert_calculus.meters.dither.tier_b_logit_bound` on batched tensors, with the same
margins (:mod:`witcert_calculus.numerics.rounding`), plus the term of a reconstruction stored in a
narrower type than float64.

Constants (``QMAX``, the Philox multipliers and Weyl increments, the ``2^-24`` grid) are
those of :mod:`witcert_calculus.meters.dither`.

Main declarations
-----------------
- :func:`philox4x32`: Philox-4x32-10 on int64 tensors holding uint32 words.
- :func:`dither_noise`: the dither ``xi`` for ``[kv_heads, tokens, channels]``;
  :func:`dither_noise_layers`: that of several layers in one Philox call.
- :func:`select_outlier_pairs`, :func:`pair_energy`, :func:`exact_channels`: the fixed
  outlier pairs of every kv head, the energy they are ranked by, their channel mask.
- :class:`DitherEncoding`, :func:`dither_quantize`: codes, float16 scales, outlier values and
  the reconstruction for ``[batch, kv_heads, tokens, head_dim]`` keys.
- :func:`tier_b_logit_bound`: the per-token Tier-B logit bound ``u_t`` of every query row, an
  established :class:`~witcert_calculus.meters.witness.LogitBound` (on its event, under
  :data:`witcert_calculus.meters.dither.NON_ADAPTIVE_QUERIES`,
  :data:`witcert_calculus.meters.dither.PHILOX_UNIFORM` and :data:`STORED_ENCODING`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Final, final

import torch

from witcert_calculus.meters.dither import GRID_BITS, GRID_MEAN, GRID_STEP, NON_ADAPTIVE_QUERIES, \
    PHILOX_MULTIPLIERS, PHILOX_UNIFORM, PHILOX_WEYL, QMAX, ByteAccount
from witcert_calculus.errors import InvalidValueError
from witcert_calculus.numerics.rounding import Margin, cast_margin, grid_mean_margin, radius_margin, \
    variance_margin
from witcert_calculus.meters.witness import LogitBound, RopeLayout
from witcert_calculus.numerics.validation import positive_int, real, uint
from witcert_calculus.tiers import Assumption, Evidence, _premise  # pyright: ignore[reportPrivateUsage]
from witcert_kernels.meter import _add_bounds, band_norms  # pyright: ignore[reportPrivateUsage]
from witcert_kernels.rounding import outward
# The shared constructions of an established bound and of its evidence (not public API).
from witcert_calculus.meters.dither import _tier_b_evidence  # pyright: ignore[reportPrivateUsage]
from witcert_calculus.meters.witness import _establish  # pyright: ignore[reportPrivateUsage]
from witcert_calculus.meters.witness import _pair_channels  # pyright: ignore[reportPrivateUsage]

__all__ = ["DitherEncoding", "STORED_ENCODING", "dither_noise", "dither_noise_layers",
           "dither_quantize", "exact_channels", "pair_energy", "philox4x32",
           "select_outlier_pairs", "tier_b_logit_bound"]

#: What the torch Tier-B bound takes on the caller's word: its tensors describe the store.
STORED_ENCODING: Final = Assumption(
    "scales are the float16 block scales the keys were quantized with (scale exactly as "
    "stored), exact marks only channels the store kept exact, cast bounds the distance of "
    "the keys read to their reconstruction, and visible[i] counts every token row i "
    "attends to",
    reason="the torch bound receives these tensors apart from the codes, so it cannot tie "
           "them to the stored keys; the numpy bound, given the DitheredKeys, computes them")

_MASK: Final = 0xFFFFFFFF
_M0, _M1 = PHILOX_MULTIPLIERS
_W0, _W1 = PHILOX_WEYL
_F64 = torch.float64


def _mulhilo(a: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    # (hi, lo) 32-bit words of a * m for a in [0, 2^32) (int64) and a constant m < 2^32.
    p_lo = a * (m & 0xFFFF)  # < 2^48
    p_hi = a * (m >> 16)  # < 2^48
    s = (p_hi & 0xFFFF) * 65536 + p_lo  # < 2^49
    return (p_hi >> 16) + (s >> 32), s & _MASK


def philox4x32(counter: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
               key: tuple[int, int], *, rounds: int = 10
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Philox-4x32 (Random123) on broadcast int64 tensors holding uint32 counter words.

    Args:
        counter: four int64 tensors (broadcastable) with values in ``[0, 2^32)``.
        key: two key words (taken modulo ``2^32``).
        rounds: number of rounds (10 is the standard strength).

    Returns:
        The four output words as int64 tensors with values in ``[0, 2^32)``.

    Raises:
        InvalidValueError: ``rounds`` below 1.

    Example:
        >>> z = torch.zeros((), dtype=torch.int64)
        >>> [hex(int(w)) for w in philox4x32((z, z, z, z), (0, 0))]
        ['0x6627e8d5', '0xe169c58d', '0xbc57ac4c', '0x9b00dbd8']
    """
    n_rounds = positive_int("rounds", rounds)
    words = [w.to(torch.int64) & _MASK for w in counter]
    shape = (words[0] + words[1] + words[2] + words[3]).shape  # the broadcast shape
    c0, c1, c2, c3 = (w.expand(shape) for w in words)
    k0 = int(key[0]) & _MASK
    k1 = int(key[1]) & _MASK
    for i in range(n_rounds):
        if i:
            k0 = (k0 + _W0) & _MASK
            k1 = (k1 + _W1) & _MASK
        hi0, lo0 = _mulhilo(c0, _M0)
        hi1, lo1 = _mulhilo(c2, _M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


def dither_noise(*, request: int, layer: int, kv_heads: int, tokens: torch.Tensor,
                 head_dim: int) -> torch.Tensor:
    """The dither ``xi[h, t, c]`` in ``[-1/2, 1/2)``, float64 ``[kv_heads, S, head_dim]``.

    A pure function of ``(request, layer, kv_head, token, channel)``: bit-identical to
    :func:`witcert_calculus.meters.dither.dither_noise` for ``DitherKey(request, layer, kv_head)``.

    Raises:
        InvalidValueError: an index outside its range (request ``< 2^64``, others ``< 2^32``).

    Example:
        >>> xi = dither_noise(request=7, layer=0, kv_heads=2, tokens=torch.arange(4), head_dim=8)
        >>> tuple(xi.shape), bool((xi >= -0.5).all() and (xi < 0.5).all())
        ((2, 4, 8), True)
    """
    return dither_noise_layers(request=request, layers=(layer,), kv_heads=kv_heads,
                               tokens=tokens, head_dim=head_dim)[0]


def dither_noise_layers(*, request: int, layers: Sequence[int], kv_heads: int,
                        tokens: torch.Tensor, head_dim: int) -> torch.Tensor:
    """:func:`dither_noise` of several layers in one Philox call: ``[L, kv_heads, S, head_dim]``.

    The layer is a counter word, so the noise of every layer at the same positions comes
    from one batched stream; entry ``[i]`` is bit-identical to ``dither_noise(layer=layers[i],
    ...)`` (a cache computes a forward's noise once, at its first write, and hands each
    layer its slice to :func:`dither_quantize`).

    Raises:
        InvalidValueError: an index outside its range (request ``< 2^64``, others ``< 2^32``).

    Example:
        >>> xi = dither_noise_layers(request=7, layers=(0, 3), kv_heads=2, tokens=torch.arange(4),
        ...                          head_dim=8)
        >>> bool((xi[1] == dither_noise(request=7, layer=3, kv_heads=2, tokens=torch.arange(4),
        ...                             head_dim=8)).all())
        True
    """
    for name, value, bits in (("request", request, 64), ("kv_heads", kv_heads, 32),
                              ("head_dim", head_dim, 32)):
        uint(name, value, bits=bits)
    for layer in layers:
        uint("layer", layer, bits=32)
    t = tokens.to(torch.int64)
    if t.ndim != 1 or (t.numel() and (int(t.min()) < 0 or int(t.max()) >= 2**32)):
        raise InvalidValueError("tokens", tuple(t.shape), "must be 1-D positions in [0, 2^32)")
    ch = torch.arange(head_dim, dtype=torch.int64).view(1, 1, 1, -1)
    tk = t.view(1, 1, -1, 1)
    hd = torch.arange(kv_heads, dtype=torch.int64).view(1, -1, 1, 1)
    ly = torch.tensor(list(layers), dtype=torch.int64).view(-1, 1, 1, 1)
    w0, _, _, _ = philox4x32((ch, tk, hd, ly), (request & _MASK, request >> 32))
    return (w0 >> (32 - GRID_BITS)).to(_F64) * GRID_STEP - 0.5


def _round_up_f16(x: torch.Tensor) -> torch.Tensor:
    # Nonnegative float64 -> float16 rounded toward +inf (the next float16 up, by its bits,
    # wherever the nearest cast went down). An overflow is inf (never a clamp): the caller
    # checks finiteness.
    low = x.to(torch.float16)
    up = (low.view(torch.int16) + 1).view(torch.float16)
    return torch.where(low.to(torch.float64) < x, up, low)


def select_outlier_pairs(x: torch.Tensor, *, count: int, layout: RopeLayout) -> torch.Tensor:
    """The ``count`` RoPE pairs of largest energy per kv head, sorted: ``[kv_heads, count]``.

    The rule of :func:`witcert_calculus.meters.dither.select_outlier_pairs` (energy
    ``sum_t (x_{t,a}^2 + x_{t,b}^2)`` over every token and batch row, ties to the lower
    index), for ``[batch, kv_heads, tokens, head_dim]`` keys: a cache calls it once, on a
    layer's first write (the prefill), and keeps the pairs for the request.

    Raises:
        InvalidValueError: a bad shape, non-finite keys, an odd head dimension, or more
            pairs than ``head_dim / 2``.

    Example:
        >>> x = torch.zeros(1, 2, 3, 8); x[0, 1, 0, 5] = 9.0
        >>> select_outlier_pairs(x, count=1, layout=RopeLayout.HALF_SPLIT).tolist()
        [[0], [1]]
    """
    if x.ndim != 4:
        raise InvalidValueError("x", tuple(x.shape), "must be [batch, kv_heads, tokens, head_dim]")
    d = int(x.shape[-1])
    if d % 2:
        raise InvalidValueError("head_dim", d, "must be even (RoPE acts on pairs)")
    n = positive_int("count", count, minimum=0)
    if n > d // 2:
        raise InvalidValueError("count", count, f"must be <= head_dim/2 = {d // 2} pairs")
    a = x.detach().to(_F64)
    if not bool(torch.isfinite(a).all()):
        raise InvalidValueError("x", "tensor", "keys must be finite")
    top = torch.argsort(-pair_energy(a, layout=layout).sum(dim=(0, 2)), dim=-1,
                        stable=True)[:, :n]
    return torch.sort(top, dim=-1).values


def pair_energy(x: torch.Tensor, *, layout: RopeLayout) -> torch.Tensor:
    """Per token, the energy ``x_a^2 + x_b^2`` of every RoPE pair ``(a, b)``: ``[..., d/2]``
    float64 (the quantity :func:`select_outlier_pairs` ranks, summed over tokens).

    Example:
        >>> pair_energy(torch.tensor([3.0, 1.0, 4.0, 0.0]), layout=RopeLayout.HALF_SPLIT).tolist()
        [25.0, 1.0]
    """
    pc = _pairs(int(x.shape[-1]), layout)
    e = x.detach().to(_F64) ** 2
    return e[..., pc[:, 0]] + e[..., pc[:, 1]]


def exact_channels(pairs: torch.Tensor, *, head_dim: int, layout: RopeLayout) -> torch.Tensor:
    """The channel mask ``[kv_heads, head_dim]`` of outlier pairs ``[kv_heads, m]`` (True: exact).

    Raises:
        InvalidValueError: a pair index outside ``[0, head_dim / 2)`` or a bad shape.

    Example:
        >>> exact_channels(torch.tensor([[1]]), head_dim=4, layout=RopeLayout.HALF_SPLIT).tolist()
        [[False, True, False, True]]
    """
    if pairs.ndim != 2:
        raise InvalidValueError("outlier_pairs", tuple(pairs.shape), "must be [kv_heads, m]")
    d = positive_int("head_dim", head_dim, minimum=2)
    if d % 2:
        raise InvalidValueError("head_dim", d, "must be even (RoPE acts on pairs)")
    p = pairs.to(torch.int64)
    listed = [[int(v) for v in row] for row in p]
    if p.numel() and (int(p.min()) < 0 or int(p.max()) >= d // 2):
        raise InvalidValueError("outlier_pairs", listed, f"must lie in [0, {d // 2})")
    pc = _pairs(d, layout)
    mask = torch.zeros((int(p.shape[0]), d), dtype=torch.bool)
    if p.numel():
        mask.scatter_(1, pc[p].reshape(p.shape[0], -1), True)
        if bool((mask.sum(dim=1) != 2 * p.shape[1]).any()):
            raise InvalidValueError("outlier_pairs", listed, "must not repeat a pair in a head")
    return mask


def _pairs(d: int, layout: RopeLayout) -> torch.Tensor:
    # The channels (a, b) of every RoPE pair, [d/2, 2] int64.
    return torch.as_tensor(_pair_channels(d, layout), dtype=torch.int64)


@final
@dataclass(frozen=True, slots=True, eq=False)
class DitherEncoding:
    """A dithered store of ``[batch, kv_heads, tokens, head_dim]`` keys.

    Attributes:
        codes: int8 codes, same shape as the keys (0 on exact channels, which are not stored).
        scales: float16 block scales ``[batch, kv_heads, tokens, n_blocks]`` as stored.
        x_hat: float64 reconstruction ``s * (code - xi)``, exact on the outlier channels.
        block_size: channels per scale block (contiguous).
        outlier_pairs: ``[kv_heads, m]`` RoPE pair indices kept exact (int16, as stored).
        exact: ``[kv_heads, head_dim]`` mask of the outlier channels.
        outlier_values: ``[batch, kv_heads, tokens, 2 m]`` float16 values of the outlier
            channels, in channel order.
    """

    codes: torch.Tensor
    scales: torch.Tensor
    x_hat: torch.Tensor
    block_size: int
    outlier_pairs: torch.Tensor
    exact: torch.Tensor
    outlier_values: torch.Tensor

    def read(self, dtype: torch.dtype) -> torch.Tensor:
        """The keys a cache of ``dtype`` holds: ``x_hat`` rounded to ``dtype``, with the outlier
        channels read from their float16 values."""
        out = self.x_hat
        b, h, t, m2 = self.outlier_values.shape
        if m2:
            idx = _channel_index(self.exact, m2).view(1, h, 1, m2).expand(b, h, t, m2)
            out = out.scatter(-1, idx, self.outlier_values.to(_F64))
        return out.to(dtype)

    def byte_account(self, *, key_bytes: int = 2) -> ByteAccount:
        """Packed bytes per token per head, measured from the stored tensors.

        The codes of the kept channels, the scales, the outlier values and the pair indices
        (one set per head, amortized over the stored tokens), each at its tensor's element
        size; ``key_bytes`` sizes the uncompressed reference ``key_bytes * head_dim``.

        Raises:
            InvalidValueError: an empty store (no token to amortize over).
        """
        b, h, t, d = self.codes.shape
        tokens = positive_int("tokens", int(t))
        rows = float(b * h * t)
        kept = (d - int(self.outlier_values.shape[-1])) * h * b * t  # code bytes actually held
        payload = kept * self.codes.element_size() / rows
        scales = self.scales.numel() * self.scales.element_size() / rows
        outliers = self.outlier_values.numel() * self.outlier_values.element_size() / rows
        indices = self.outlier_pairs.numel() * self.outlier_pairs.element_size() / (h * tokens)
        total = payload + scales + outliers + indices
        ref = float(positive_int("key_bytes", key_bytes) * d)
        return ByteAccount(payload=payload, scales=scales, outliers=outliers, indices=indices,
                           total=total, fp16=ref, ratio=total / ref)


def dither_quantize(x: torch.Tensor, *, request: int, layer: int, start: int,
                    block_size: int, outlier_pairs: torch.Tensor | None = None,
                    layout: RopeLayout = RopeLayout.HALF_SPLIT, exact: torch.Tensor | None = None,
                    noise: torch.Tensor | None = None,
                    deferred: list[torch.Tensor] | None = None) -> DitherEncoding:
    """Quantize keys with subtractive dither, the numpy reference's arithmetic in torch.

    Token ``i`` of the block sits at absolute position ``start + i``; the stream does not
    depend on the batch index (a batch shares one stream per request). Outlier channels are
    kept exact, excluded from the block amax and hold code 0, as in
    :func:`witcert_calculus.meters.dither.dither_quantize`.

    Args:
        x: keys ``[batch, kv_heads, tokens, head_dim]`` (values taken exactly as float64).
        request: request id (keys the stream).
        layer: layer index.
        start: absolute position of the first token.
        block_size: channels per float16 scale; must divide ``head_dim``.
        outlier_pairs: ``[kv_heads, m]`` RoPE pair indices kept exact (``None``: none).
        layout: RoPE layout (which channels form a pair).
        exact: ``exact_channels(outlier_pairs, ...)`` when the caller already holds it (a
            cache keeps each layer's mask); ``None``: computed (and validated) here.
        noise: ``dither_noise(request=request, layer=layer, ...)`` at positions ``start,
            start + 1, ...`` when the caller already holds it (a slice of
            :func:`dither_noise_layers`); ``None``: computed here.
        deferred: ``None``: the checks on tensor contents (finite keys, no float16 overflow
            of a scale or an outlier value, no clipped code) are read here. A list: they
            are appended as one 0-d boolean tensor (True: all hold) and not read (no host
            sync); the caller reads it and, where it is False, calls again without
            ``deferred`` to raise the typed error.

    Returns:
        The :class:`DitherEncoding`.

    Raises:
        InvalidValueError: non-finite keys, a bad shape or block size, bad outlier pairs, a
            scale or an outlier value that overflows float16, or (never with the
            upward-rounded scale) a clipped code.

    Example:
        >>> x = torch.linspace(-1, 1, 16).reshape(1, 1, 2, 8)
        >>> enc = dither_quantize(x, request=1, layer=0, start=0, block_size=8)
        >>> s = enc.scales.to(torch.float64).repeat_interleave(8, dim=-1)
        >>> bool(((enc.x_hat - x.double()).abs() <= s / 2).all())
        True
    """
    if x.ndim != 4:
        raise InvalidValueError("x", tuple(x.shape), "must be [batch, kv_heads, tokens, head_dim]")
    b, h, s_count, d = x.shape
    if d % positive_int("block_size", block_size):
        raise InvalidValueError("block_size", block_size, f"must divide head_dim {d}")
    positive_int("start", start, minimum=0)
    a = x.detach().to(torch.float64)
    if deferred is None and not bool(torch.isfinite(a).all()):
        raise InvalidValueError("x", "tensor", "keys must be finite")
    pairs = torch.zeros((h, 0), dtype=torch.int64) if outlier_pairs is None else outlier_pairs
    if pairs.ndim != 2 or int(pairs.shape[0]) != h:
        raise InvalidValueError("outlier_pairs", tuple(pairs.shape), f"must be [{h}, m]")
    if exact is None:
        exact = exact_channels(pairs, head_dim=d, layout=layout)  # [h, d]
    elif tuple(exact.shape) != (h, d):
        raise InvalidValueError("exact", tuple(exact.shape), f"must be [{h}, {d}]")
    if noise is None:
        noise = dither_noise(request=request, layer=layer, kv_heads=h,
                             tokens=torch.arange(start, start + s_count), head_dim=d)
    elif tuple(noise.shape) != (h, s_count, d):
        raise InvalidValueError("noise", tuple(noise.shape), f"must be [{h}, {s_count}, {d}]")
    keep = ~exact.view(1, h, 1, d)
    nb = d // block_size
    kept = torch.where(keep, a, 0.0)
    amax = kept.abs().reshape(b, h, s_count, nb, block_size).amax(dim=-1)
    scales = _round_up_f16(amax / (QMAX - 0.5))
    if deferred is None and not bool(torch.isfinite(scales).all()):
        bad = float(amax[~torch.isfinite(scales)].reshape(-1)[0])
        raise InvalidValueError("block amax", bad, "its scale amax/126.5 overflows float16 (65504)")
    s = scales.to(torch.float64).repeat_interleave(block_size, dim=-1)  # exactly as stored
    xi = noise.unsqueeze(0)
    pos = s > 0
    codes = torch.where(pos & keep, torch.round(a / torch.where(pos, s, 1.0) + xi), 0.0)
    if deferred is None and bool((codes.abs() > QMAX).any()):
        raise InvalidValueError("codes", float(codes.abs().max()),
                                f"exceed +-{QMAX}: the scale does not cover the block")
    x_hat = torch.where(keep, s * (codes - xi), a)
    m2 = 2 * int(pairs.shape[1])  # exact_channels admits no repeated pair
    values = a.gather(-1, _channel_index(exact, m2).view(1, h, 1, m2).expand(b, h, s_count, m2))
    stored = values.to(torch.float16)
    if deferred is not None:
        # non-finite keys make a scale (kept channels) or a stored value (exact ones) non-finite
        deferred.append(torch.isfinite(scales).all() & (codes.abs() <= QMAX).all()
                        & torch.isfinite(stored).all())
    elif not bool(torch.isfinite(stored).all()):
        raise InvalidValueError("outlier value", float(values[~torch.isfinite(stored)][0]),
                                "overflows float16 (65504)")
    return DitherEncoding(codes.to(torch.int8), scales, x_hat, block_size,
                          pairs.to(torch.int16), exact, stored)


def _channel_index(exact: torch.Tensor, m2: int) -> torch.Tensor:
    # The m2 exact channels of every head of a mask [h, d], in channel order: [h, m2].
    d = int(exact.shape[-1])
    ch = torch.arange(d, dtype=torch.int64, device=exact.device).expand(exact.shape)
    return torch.sort(torch.where(exact, ch, d), dim=-1).values[:, :m2]


def tier_b_logit_bound(query: torch.Tensor, scales: torch.Tensor, cast: torch.Tensor | None, *,
                       scale: float, delta_loc: float, visible: torch.Tensor,
                       exact: torch.Tensor | None = None) -> LogitBound[torch.Tensor]:
    """Per-token Tier-B logit bound ``u_t`` of every query row over dithered keys.

    ``u_t = sqrt(2 varsigma_t^2 log(2 S_row / delta_loc)) + m_t + e_t`` with the variance
    proxy ``varsigma_t^2 = scale^2 sum_b s_{t,b}^2 (sum_{c in b, c kept} q_c^2) / 12`` (the
    exact outlier channels carry no dither error), the grid-mean term
    ``m_t = scale sum_b s_{t,b} (sum_{c in b, c kept} |q_c|) 2^-25`` and the cast term
    ``e_t = scale ||q|| cast_t``: the formula and margins of
    :func:`witcert_calculus.meters.dither.tier_b_logit_bound` (which has no cast term: it reads the
    float64 reconstruction), each term rounded outward with room for the sum. ``|eps_t| <=
    u_t`` for all visible tokens of a row except with probability ``delta_loc``, for
    non-adaptive queries: the result is an established
    :class:`~witcert_calculus.meters.witness.LogitBound` with ``delta = delta_loc`` (per row) and
    the assumptions :data:`witcert_calculus.meters.dither.NON_ADAPTIVE_QUERIES`,
    :data:`witcert_calculus.meters.dither.PHILOX_UNIFORM` and :data:`STORED_ENCODING`. Its
    premises on tensor contents (scales, cast and ``visible``) are computed on the device
    and read when a reading's evidence is built.

    Args:
        query: ``[..., Q, d]`` query rows of the dithered logit part.
        scales: ``[..., S, nb]`` float16 block scales as stored (blocks of ``d / nb``
            contiguous channels).
        cast: ``[..., S]`` upper bounds of ``||k_t - x_hat_t||`` for the key ``k_t`` the
            attention reads (:meth:`DitherEncoding.read`: the reconstruction rounded into
            the cache's dtype, outlier channels from their float16 values), or ``None``
            when the float64 reconstruction itself is read.
        scale: the attention scale (> 0).
        delta_loc: failure probability of one row, in (0, 1).
        visible: ``[Q]`` tokens each row attends to (``S_row >= 1``, the union bound's ``S``);
            not checked here (a hot-loop input: a zero yields NaN, which the gate rejects,
            and refuses the reading's evidence).
        exact: ``[..., d]`` mask of the outlier channels kept exact (broadcast over the
            query rows, e.g. ``[B, H, 1, d]``), or ``None`` for none.

    Returns:
        A :class:`~witcert_calculus.meters.witness.LogitBound` of ``[..., Q, S]`` float64 bounds.

    Raises:
        InvalidValueError: ``nb`` not dividing ``d``, ``scale`` or ``delta_loc`` invalid.

    Example:
        >>> enc = dither_quantize(torch.ones(1, 1, 2, 4), request=0, layer=0, start=0,
        ...                       block_size=4)
        >>> u = tier_b_logit_bound(torch.ones(1, 1, 1, 4), enc.scales, None, scale=0.5,
        ...                        delta_loc=1e-3, visible=torch.tensor([2]))
        >>> tuple(u.values.shape), bool((u.values > 0).all()), float(u.delta)
        ((1, 1, 1, 2), True, 0.001)
    """
    s = scales.to(_F64)
    tq = _tier_b_query(query, blocks=int(s.shape[-1]), scale=scale, delta_loc=delta_loc,
                       exact=exact, cast=cast is not None)
    sc = tq.scale
    zero = torch.einsum("...qn,...sn->...qs", tq.live, (s != 0).to(_F64)) == 0
    var = (sc * sc) * torch.einsum("...qn,...sn->...qs", tq.q2, s * s) / 12.0
    var = outward(var, gamma=tq.var_margin.gamma, alpha=tq.var_alpha, exact=zero)
    log_term = _tier_b_log_term(visible, tq.delta_loc).unsqueeze(-1)  # [Q, 1]
    radius = outward(torch.sqrt(2.0 * var * log_term), gamma=tq.radius_margin.gamma,
                     alpha=tq.radius_margin.alpha, exact=var == 0)
    mean = outward(sc * torch.einsum("...qn,...sn->...qs", tq.q_abs, s) * GRID_MEAN,
                   gamma=tq.mean_margin.gamma, alpha=tq.mean_margin.alpha, exact=zero)
    u = radius + mean
    checks = [("every block scale is finite and >= 0", _finite_nonnegative(s)),
              ("visible[i] >= 1 for every query row i", (visible >= 1).all())]
    if cast is not None and tq.q_norm is not None:
        e = cast.to(_F64).unsqueeze(-2)  # [..., 1, S]
        cm = tq.cast_margin
        term = outward(sc * tq.q_norm * e, gamma=cm.gamma, alpha=cm.alpha,
                       exact=(tq.q_norm == 0) | (e == 0))
        u = u + term
        checks.append(("cast_t is finite and >= 0 for every token", _finite_nonnegative(e)))
    return _establish(u, evidence=_tier_b_query_evidence(tq, (STORED_ENCODING,)),
                      delta=Fraction(tq.delta_loc),
                      source="witcert_kernels.dither.tier_b_logit_bound", add=_add_bounds,
                      checks=tuple(checks))


def _finite_nonnegative(x: torch.Tensor) -> torch.Tensor:
    # Every entry finite and >= 0, as a 0-d boolean, from two reductions (NaN fails both).
    if not x.numel():
        return torch.ones((), dtype=torch.bool, device=x.device)
    return (x.amin() >= 0) & (x.amax() < float("inf"))


@final
@dataclass(frozen=True, slots=True, eq=False)
class _TierBQuery:
    """The query side of the Tier-B bound, shared by :func:`tier_b_logit_bound` and the fused
    decode kernel's launch (:mod:`witcert_kernels.triton_decode`): per query row and scale
    block, the sums over the kept channels (the exact ones zeroed) and the margins."""

    q2: torch.Tensor  # [..., Q, nb] sum of q_c^2 over the kept channels of each block
    q_abs: torch.Tensor  # [..., Q, nb] sum of |q_c| over them
    live: torch.Tensor  # [..., Q, nb] 1.0 where a block holds a nonzero kept channel
    var_alpha: torch.Tensor  # [..., Q, 1] the variance's absolute margin for the row
    q_norm: torch.Tensor | None  # [..., Q, 1] ||q|| over every channel, rounded outward
    scale: float
    delta_loc: float
    head_dim: int
    blocks: int
    var_margin: Margin
    radius_margin: Margin
    mean_margin: Margin
    cast_margin: Margin


def _tier_b_query(query: torch.Tensor, *, blocks: int, scale: float, delta_loc: float,
                  exact: torch.Tensor | None, cast: bool) -> _TierBQuery:
    """The query-side pieces of ``u_t`` (validated scale, delta_loc and block count)."""
    q = query.to(_F64)
    d, nb = int(q.shape[-1]), blocks
    if nb < 1 or d % nb:
        raise InvalidValueError("scales", f"{nb} blocks", f"must divide head_dim {d}")
    sc = real("scale", scale, lo=0.0, lo_open=True)
    dl = real("delta_loc", delta_loc, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    # one band holds every channel, whatever the layout: a rigorous ||q|| for the cast term
    q_norm = band_norms(q, bands=1, layout=RopeLayout.HALF_SPLIT) if cast else None
    if exact is not None:
        q = torch.where(exact.to(torch.bool), torch.zeros_like(q), q)
    grouped = q.reshape(*q.shape[:-1], nb, d // nb)
    vm = variance_margin(d, nb, scale=sc)
    q_max = q.abs().amax(dim=-1, keepdim=True)  # [..., Q, 1]
    return _TierBQuery(q2=(grouped * grouped).sum(dim=-1), q_abs=grouped.abs().sum(dim=-1),
                       live=(grouped != 0).any(dim=-1).to(_F64),
                       var_alpha=vm.alpha * (1.0 + q_max * q_max), q_norm=q_norm, scale=sc,
                       delta_loc=dl, head_dim=d, blocks=nb, var_margin=vm,
                       radius_margin=radius_margin(),
                       mean_margin=grid_mean_margin(d, nb, scale=sc), cast_margin=cast_margin())


def _tier_b_log_term(visible: torch.Tensor, delta_loc: float) -> torch.Tensor:
    """The union bound's ``log(2 S_row / delta_loc)`` per row (``visible`` tokens each)."""
    return torch.log(2.0 * visible.to(_F64) / delta_loc)


def _tier_b_query_evidence(tq: _TierBQuery, assumptions: tuple[Assumption, ...]) -> Evidence:
    """The evidence of a Tier-B bound built from ``tq`` (beside the per-tensor checks)."""
    sc, dl, d, nb = tq.scale, tq.delta_loc, tq.head_dim, tq.blocks
    return _tier_b_evidence(premises=(
        _premise("scale > 0 and 0 < delta_loc < 1", sc > 0 and 0 < dl < 1),
        _premise(f"the {nb} scale blocks tile the {d} channels", nb >= 1 and d % nb == 0)),
        union=None, assumptions=(NON_ADAPTIVE_QUERIES, PHILOX_UNIFORM, *assumptions))
