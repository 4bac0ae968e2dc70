"""Tier B: a subtractively dithered INT8 key quantizer and its probabilistic TV certificate.

Quantizer: ``x_hat = s * (round(x/s + xi) - xi)`` with ``xi ~ U[-1/2, 1/2)``
regenerated at read time from a counter-based generator (Philox-4x32-10) keyed by
``(request, layer, kv_head, token, channel)``: the stream is a pure function of
those indices, identical whatever the batching order. The block scale is
``s = amax_block / (Q - 1/2)`` with ``Q = 127``, stored in float16 *rounded
upward*, and quantization uses the scale exactly as stored, so non-outlier
channels never clip and ``|x - x_hat| <= s/2``; with subtractive dither the error
is uniform on ``[-s/2, s/2)`` and independent of ``x``.

Outlier RoPE pairs are kept exact and excluded from the block ``amax`` (keeping
them exact without excluding them barely helps: the massive pair still sets the
scale of its block).

Certificate: the dither offset lies on a ``2^-24`` grid, so the centred error of each
channel is uniform on the ``2^24`` midpoints of ``[-s/2, s/2]``, a sum of 24 independent
fair signs with dyadic weights; it is sub-Gaussian with the variance proxy ``s^2/12`` of
the continuous uniform (Lean: ``WitCert.Dither.signAvg_dyadic``,
``WitCert.Dither.grid_mgf_le``), so the logit error of token ``t`` has proxy
``varsigma_t^2 = scale^2 sum_c q_c^2 s_{c,t}^2 / 12`` (``scale^2 = 1/d`` for the
usual attention scale). Jointly over ``S`` tokens, ``|eps_t| <= u_t =
sqrt(2 varsigma_t^2 log(2S/delta_loc))`` except with probability ``delta_loc``
(Chernoff per token, ``WitCert.Dither.dither_logit_tail``; union bound over tokens,
``WitCert.Dither.signAvg_union_le``; together the failure event and delta of the semantic
contract ``ditherTierB`` (``WitCert.Semantic.dither_tier_b_token_sound``,
``dither_tier_b_prob_bad``)),
where ``delta_loc = delta_req / (L H T)`` splits a request's budget over layers,
heads and decode steps. The offset's grid adds a deterministic mean term of at most
``scale sum_c |q_c| s_c 2^-25`` (:data:`GRID_MEAN`). Then ``A = sum p_tilde e^{u_t}`` and the
e-form of :mod:`witcert_calculus.meters.tv_forms` applies. Every term is rounded outward by the
rule of :mod:`witcert_calculus.numerics.rounding`.
The certificate holds for *non-adaptive* queries (chosen independently of the
dither stream); the deterministic Tier-A meter is the adaptive-safe one. Both
facts and ``delta_loc`` are part of the reading's evidence: :func:`tier_b_logit_bound`
returns a :class:`~witcert_calculus.meters.witness.LogitBound` that holds on the event of
probability ``1 - delta_loc``, with the assumptions :data:`NON_ADAPTIVE_QUERIES` and
:data:`PHILOX_UNIFORM` (no code can check either), and its premises on the store computed.

Main declarations:

- :func:`philox4x32`: the counter-based generator (Random123 Philox-4x32-10).
- :class:`DitherKey`, :func:`dither_noise`: the dither stream.
- :func:`select_outlier_pairs`, :func:`dither_quantize`, :func:`dither_dequantize`,
  :class:`DitheredKeys`.
- :class:`ByteAccount`, :func:`byte_account`: bytes per token per head vs fp16.
- :func:`dither_variance_proxy`, :func:`dither_mean_offset`, :func:`subgaussian_radius`,
  :func:`tier_b_logit_bound`, :func:`delta_local`, :func:`tier_b_certificate`.
- constants shared with the torch port (``witcert_kernels.dither``): :data:`QMAX`,
  :data:`GRID_BITS`, :data:`GRID_STEP`, :data:`GRID_MEAN`, :data:`PHILOX_MULTIPLIERS`,
  :data:`PHILOX_WEYL`; :data:`NON_ADAPTIVE`, the certificate's restriction, stated by the
  assumptions :data:`NON_ADAPTIVE_QUERIES` and :data:`PHILOX_UNIFORM`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Final, final

import numpy as np
from numpy.typing import ArrayLike, NDArray

from witcert_calculus.contracts import Reading
from witcert_calculus.errors import InvalidValueError
from witcert_calculus.lean.theorems import DITHER_TIER_B_PROB_BAD, DITHER_TIER_B_TOKEN_SOUND
from witcert_calculus.meters.tv_forms import tv_eform
from witcert_calculus.metrics import AtConsume, AttentionTV
from witcert_calculus.numerics.probability import Probability
from witcert_calculus.numerics.rounding import (
    grid_mean_margin,
    outward,
    radius_margin,
    variance_margin,
)
from witcert_calculus.tiers import Assumption, Composition, Evidence, Premise, Restricted, _premise, _proof  # pyright: ignore[reportPrivateUsage]
from witcert_calculus.numerics.validation import F64, count, distribution, finite_array, \
    int_array, nonneg_array, positive_int, real, uint
from witcert_calculus.numerics.validation import head_dim as head_dim_of
from witcert_calculus.meters.witness import LogitBound, RopeLayout
# the pairing of channels and the construction of an established bound are shared with
# the witness module, not public API
from witcert_calculus.meters.witness import _add_shapes, _establish  # pyright: ignore[reportPrivateUsage]
from witcert_calculus.meters.witness import _pair_channels, _read_only  # pyright: ignore[reportPrivateUsage]

__all__ = [
    "ByteAccount",
    "DitherKey",
    "DitheredKeys",
    "GRID_BITS",
    "GRID_MEAN",
    "GRID_STEP",
    "NON_ADAPTIVE",
    "NON_ADAPTIVE_QUERIES",
    "PHILOX_MULTIPLIERS",
    "PHILOX_UNIFORM",
    "PHILOX_WEYL",
    "QMAX",
    "byte_account",
    "delta_local",
    "dither_dequantize",
    "dither_mean_offset",
    "dither_noise",
    "dither_quantize",
    "dither_variance_proxy",
    "philox4x32",
    "select_outlier_pairs",
    "subgaussian_radius",
    "tier_b_certificate",
    "tier_b_logit_bound",
]

#: Largest code magnitude: int8 codes lie in ``[-QMAX, QMAX]``.
QMAX: Final = 127

#: Bits of the dither offset: ``xi = (w >> (32 - GRID_BITS)) * GRID_STEP - 1/2``.
GRID_BITS: Final = 24

#: Spacing ``2^-24`` of the grid the dither offset is drawn from.
GRID_STEP: Final = 2.0**-GRID_BITS

#: Largest mean of the rounding residual ``round(y + xi) - (y + xi)`` for ``xi`` on the
#: ``2^-24`` grid of :func:`dither_noise` (half a grid step); the centred residual is a
#: symmetric discrete uniform, whose moment generating function is below the continuous one.
GRID_MEAN: Final = GRID_STEP / 2

#: The subset of queries on which the Tier-B certificate holds.
NON_ADAPTIVE: Final = ("non-adaptive queries: q chosen independently of the dither stream "
                       "(adaptive queries need the deterministic Tier-A meter), with the "
                       "Philox-4x32-10 stream taken as uniform random bits")

#: The Tier-B bound's assumption on the queries (the scope of :data:`NON_ADAPTIVE`).
NON_ADAPTIVE_QUERIES: Final = Assumption(
    "each query q is chosen independently of the dither stream (non-adaptive queries)",
    reason="no code sees how a query was chosen; adaptive queries need the deterministic "
           "Tier-A meter")

#: The Tier-B bound's assumption on the generator.
PHILOX_UNIFORM: Final = Assumption(
    "the Philox-4x32-10 stream behaves as independent uniform random bits",
    reason="a deterministic counter-based generator; its uniformity is a cryptographic "
           "assumption, not a property a test can establish")

#: Philox-4x32 round multipliers (Random123).
PHILOX_MULTIPLIERS: Final = (0xD2511F53, 0xCD9E8D57)

#: Philox-4x32 key schedule increments (Weyl sequence, Random123).
PHILOX_WEYL: Final = (0x9E3779B9, 0xBB67AE85)

U32 = NDArray[np.uint32]
_M0: Final = np.uint64(PHILOX_MULTIPLIERS[0])
_M1: Final = np.uint64(PHILOX_MULTIPLIERS[1])
_W0: Final = np.uint32(PHILOX_WEYL[0])
_W1: Final = np.uint32(PHILOX_WEYL[1])
_MASK: Final = np.uint64(0xFFFFFFFF)


def philox4x32(counter: tuple[ArrayLike, ArrayLike, ArrayLike, ArrayLike],
               key: tuple[int, int], *, rounds: int = 10) -> tuple[U32, U32, U32, U32]:
    """Philox-4x32 (Salmon et al., Random123) on broadcast uint32 counter words.

    Args:
        counter: four arrays (broadcastable) of uint32 counter words.
        key: two uint32 key words.
        rounds: number of rounds (10 is the standard strength).

    Returns:
        The four uint32 output words.

    Example:
        >>> [hex(int(w)) for w in philox4x32((0, 0, 0, 0), (0, 0))]
        ['0x6627e8d5', '0xe169c58d', '0xbc57ac4c', '0x9b00dbd8']
    """
    c0, c1, c2, c3 = (np.asarray(w, dtype=np.uint64) & _MASK for w in counter)
    c0, c1, c2, c3 = np.broadcast_arrays(c0, c1, c2, c3)
    k0 = np.uint64(int(key[0]) & 0xFFFFFFFF)
    k1 = np.uint64(int(key[1]) & 0xFFFFFFFF)
    for i in range(positive_int("rounds", rounds)):
        if i:
            k0 = (k0 + np.uint64(_W0)) & _MASK
            k1 = (k1 + np.uint64(_W1)) & _MASK
        p0 = _M0 * c0
        p1 = _M1 * c2
        hi0, lo0 = p0 >> np.uint64(32), p0 & _MASK
        hi1, lo1 = p1 >> np.uint64(32), p1 & _MASK
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return (c0.astype(np.uint32), c1.astype(np.uint32), c2.astype(np.uint32),
            c3.astype(np.uint32))


@final
@dataclass(frozen=True, slots=True)
class DitherKey:
    """Identity of one dither stream: a request, a layer and a KV head.

    Layout (shared by every implementation): Philox key words ``(request mod 2^32,
    request div 2^32)``; counter words ``(channel, token, kv_head, layer)``; the
    first output word ``w`` gives ``xi = (w >> 8) * 2^-24 - 1/2``.

    Attributes:
        request: request id, ``0 <= request < 2^64``.
        layer: layer index, ``0 <= layer < 2^32``.
        kv_head: KV-head index, ``0 <= kv_head < 2^32``.
    """

    request: int
    layer: int
    kv_head: int

    def __post_init__(self) -> None:
        for name, value, bits in (("request", self.request, 64), ("layer", self.layer, 32),
                                  ("kv_head", self.kv_head, 32)):
            uint(name, value, bits=bits)


def dither_noise(key: DitherKey, tokens: ArrayLike, *, head_dim: int) -> F64:
    """The dither ``xi[t, c]`` in ``[-1/2, 1/2)`` for token positions and all channels.

    A pure function of ``(request, layer, kv_head, token, channel)``.

    Args:
        key: the stream identity.
        tokens: token positions (absolute, ``0 <= token < 2^32``), shape ``(S,)``.
        head_dim: number of channels ``d``.

    Returns:
        Array ``(S, d)`` of multiples of ``2^-24``.

    Example:
        >>> xi = dither_noise(DitherKey(7, 0, 1), np.arange(4), head_dim=8)
        >>> bool((xi >= -0.5).all() and (xi < 0.5).all())
        True
    """
    if not isinstance(key, DitherKey):
        raise InvalidValueError("key", key, "must be a DitherKey")
    t = int_array("tokens", tokens)
    if t.ndim != 1:
        raise InvalidValueError("tokens", f"array of shape {t.shape} and dtype {t.dtype}",
                                "must be a 1-D integer array")
    if t.size and (t.min() < 0 or t.max() >= 2**32):
        raise InvalidValueError("tokens", f"range [{t.min()}, {t.max()}]", "must lie in [0, 2^32)")
    d = head_dim_of("head_dim", head_dim)
    ch = np.arange(d, dtype=np.uint64)[None, :]
    tk = t.astype(np.uint64)[:, None]
    w0, _, _, _ = philox4x32((ch, tk, key.kv_head, key.layer),
                             (key.request & 0xFFFFFFFF, key.request >> 32))
    out: F64 = (w0 >> np.uint32(32 - GRID_BITS)).astype(np.float64) * GRID_STEP - 0.5
    return out


def _round_up_f16(x: F64) -> NDArray[np.float16]:
    with np.errstate(over="ignore"):
        low = x.astype(np.float16)
    up: NDArray[np.float16] = np.where(low.astype(np.float64) < x,
                                       np.nextafter(low, np.float16(np.inf)), low)
    return up


def select_outlier_pairs(x: ArrayLike, *, count: int, layout: RopeLayout) -> NDArray[np.intp]:
    """The ``count`` RoPE pairs of largest energy over the given tokens (sorted indices).

    The choice rule: pair ``j`` with channels ``(a, b)`` has energy
    ``sum_t (x_{t,a}^2 + x_{t,b}^2)``; the ``count`` largest are kept, ties to the lower
    index. A store fixes them once per ``(layer, kv head)`` from the prefill keys and keeps
    them for the request (the torch port ``witcert_kernels.dither.select_outlier_pairs``
    applies the same rule to batched keys).

    Raises:
        InvalidValueError: non-finite keys, an odd head dimension, or ``count`` above
            ``head_dim / 2``.

    Example:
        >>> x = np.zeros((3, 8)); x[1, 2] = 50.0
        >>> select_outlier_pairs(x, count=1, layout=RopeLayout.INTERLEAVED).tolist()
        [1]
    """
    a = finite_array("x", x, ndim=2)
    n = positive_int("count", count, minimum=0)
    pc = _pair_channels(a.shape[1], layout) if a.shape[1] % 2 == 0 else None
    if pc is None:
        raise InvalidValueError("head_dim", a.shape[1], "must be even (RoPE acts on pairs)")
    if n > pc.shape[0]:
        raise InvalidValueError("count", count, f"must be <= head_dim/2 = {pc.shape[0]} pairs")
    energy = (a * a).sum(axis=0)
    pair_energy = energy[pc[:, 0]] + energy[pc[:, 1]]
    top = np.argsort(-pair_energy, kind="stable")[:n]
    out: NDArray[np.intp] = np.sort(top).astype(np.intp)
    return out


@final
@dataclass(frozen=True, slots=True, eq=False)
class DitheredKeys:
    """Packed store of one head's keys (``S`` tokens, ``d`` channels).

    Attributes:
        payload: int8 codes ``(S, d)``; outlier channels hold 0 and are not stored.
        scales: float16 block scales ``(S, n_blocks)`` (rounded upward at write time).
        outlier_pairs: pair indices kept exact (sorted).
        outlier_values: exact values of the outlier channels ``(S, 2 * n_out)``.
        tokens: absolute token positions ``(S,)``.
        key: the dither stream identity.
        block_size: channels per scale block.
        layout: RoPE layout (decides which channels form a pair).
    """

    payload: NDArray[np.int8]
    scales: NDArray[np.float16]
    outlier_pairs: NDArray[np.intp]
    outlier_values: F64
    tokens: NDArray[np.int64]
    key: DitherKey
    block_size: int
    layout: RopeLayout

    @property
    def head_dim(self) -> int:
        """Number of channels ``d``."""
        return int(self.payload.shape[1])

    @property
    def outlier_channels(self) -> NDArray[np.intp]:
        """Channel indices of the outlier pairs (sorted)."""
        return _outlier_channels(self.head_dim, self.outlier_pairs, self.layout)

    def channel_scales(self) -> F64:
        """Per-channel scale ``s[t, c]`` ``(S, d)``; 0 on exact (outlier) channels."""
        s = np.repeat(self.scales.astype(np.float64), self.block_size, axis=1)[:, :self.head_dim]
        s[:, self.outlier_channels] = 0.0
        return s

    def byte_account(self) -> ByteAccount:
        """Bytes per token per head of this store (see :func:`byte_account`)."""
        return byte_account(self.head_dim, block_size=self.block_size,
                            outlier_pairs=int(self.outlier_pairs.size),
                            tokens=int(self.tokens.size))


def _outlier_channels(d: int, pairs: NDArray[np.intp], layout: RopeLayout) -> NDArray[np.intp]:
    pc = _pair_channels(d, layout)
    out: NDArray[np.intp] = np.sort(pc[pairs].reshape(-1)).astype(np.intp)
    return out


def dither_quantize(x: ArrayLike, *, key: DitherKey, tokens: ArrayLike, block_size: int,
                    layout: RopeLayout, outlier_pairs: ArrayLike = (),
                    exclude_outliers_from_amax: bool = True) -> DitheredKeys:
    """Quantize one head's keys with subtractive dither to int8 codes and fp16 block scales.

    Args:
        x: keys ``(S, d)`` (any float dtype; values taken exactly as float64).
        key: dither stream identity.
        tokens: absolute token positions ``(S,)``.
        block_size: channels per scale block (contiguous in the stored layout).
        layout: RoPE layout of the head vectors.
        outlier_pairs: RoPE pair indices kept exact.
        exclude_outliers_from_amax: leave outlier channels out of the block amax
            (the default; ``False`` exists to measure what exclusion buys).

    Returns:
        The packed :class:`DitheredKeys`.

    Raises:
        InvalidValueError: on non-finite keys, bad shapes, or a block scale that
            overflows float16 (``amax / 126.5 > 65504``).

    Example:
        >>> x = np.linspace(-1, 1, 16).reshape(2, 8)
        >>> st = dither_quantize(x, key=DitherKey(1, 0, 0), tokens=np.arange(2), block_size=8,
        ...                      layout=RopeLayout.INTERLEAVED)
        >>> bool((np.abs(dither_dequantize(st) - x) <= st.channel_scales() / 2).all())
        True
    """
    a = finite_array("x", x, ndim=2)
    s_count, d = a.shape
    if d % 2:
        raise InvalidValueError("head_dim", d, "must be even (RoPE acts on pairs)")
    if not isinstance(key, DitherKey):
        raise InvalidValueError("key", key, "must be a DitherKey")
    t = int_array("tokens", tokens)
    if t.shape != (s_count,):
        raise InvalidValueError("tokens", f"array of shape {t.shape}", f"must have shape ({s_count},)")
    bs = positive_int("block_size", block_size)
    if bs > d:
        raise InvalidValueError("block_size", block_size, f"must be <= head_dim = {d}")
    pairs = np.unique(int_array("outlier_pairs", outlier_pairs).astype(np.intp).reshape(-1))
    if pairs.size and (pairs.min() < 0 or pairs.max() >= d // 2):
        raise InvalidValueError("outlier_pairs", pairs.tolist(), f"must lie in [0, {d // 2})")
    out_ch = _outlier_channels(d, pairs, layout)
    mask = np.ones(d, dtype=bool)
    mask[out_ch] = False
    absx = np.abs(a)
    amax_src = np.where(mask[None, :], absx, 0.0) if exclude_outliers_from_amax else absx
    starts: NDArray[np.intp] = np.arange(0, d, bs, dtype=np.intp)
    amax = np.maximum.reduceat(amax_src, starts, axis=1)
    scales = _round_up_f16(amax / (QMAX - 0.5))
    if not np.isfinite(scales).all():
        bad = float(amax[~np.isfinite(scales)][0])
        raise InvalidValueError("block amax", bad, "its scale amax/126.5 overflows float16 (65504)")
    s = np.repeat(scales.astype(np.float64), bs, axis=1)[:, :d]  # the scale exactly as stored
    xi = dither_noise(key, t, head_dim=d)
    with np.errstate(divide="ignore", invalid="ignore"):
        codes = np.where(s > 0, np.rint(a / np.where(s > 0, s, 1.0) + xi), 0.0)
    codes = np.where(mask[None, :], codes, 0.0)
    # Soundness guard: with the upward-rounded scale no kept channel can clip.
    if np.abs(codes).max(initial=0.0) > QMAX:
        raise InvalidValueError("codes", float(np.abs(codes).max()),
                                f"exceed +-{QMAX}: the scale does not cover the block")
    return DitheredKeys(payload=codes.astype(np.int8), scales=scales, outlier_pairs=pairs,
                        outlier_values=a[:, out_ch].copy(), tokens=t.astype(np.int64),
                        key=key, block_size=bs, layout=layout)


def dither_dequantize(stored: DitheredKeys) -> F64:
    """Reconstruct ``x_hat = s * (code - xi)`` with ``xi`` regenerated from the same stream.

    Outlier channels come back exactly. Returns float64 ``(S, d)`` (exact in float64:
    an fp16 scale times a 24-bit-fraction offset fits in 53 bits).

    Example:
        >>> st = dither_quantize(np.ones((1, 4)), key=DitherKey(0, 0, 0), tokens=np.arange(1),
        ...                      block_size=4, layout=RopeLayout.HALF_SPLIT)
        >>> bool(np.allclose(dither_dequantize(st), 1.0, atol=float(st.scales.max())))
        True
    """
    d = _stored(stored).head_dim
    xi = dither_noise(stored.key, stored.tokens, head_dim=d)
    s = stored.channel_scales()
    out: F64 = s * (stored.payload.astype(np.float64) - xi)
    out[:, stored.outlier_channels] = stored.outlier_values
    return out


@final
@dataclass(frozen=True, slots=True)
class ByteAccount:
    """Bytes per token per head of a packed key store, next to float16.

    Attributes:
        payload: int8 codes of the non-outlier channels.
        scales: float16 block scales.
        outliers: exact values of the outlier channels (``key_bytes`` each).
        indices: uint16 outlier pair indices (one set per head), amortized over tokens.
        total: the sum.
        fp16: ``key_bytes * d``, the uncompressed key (``2 d`` for fp16).
        ratio: ``total / fp16``.
    """

    payload: float
    scales: float
    outliers: float
    indices: float
    total: float
    fp16: float
    ratio: float


def byte_account(head_dim: int, *, block_size: int, outlier_pairs: int, tokens: int,
                 key_bytes: int = 2) -> ByteAccount:
    """Bytes per token per head of the dithered store.

    Args:
        head_dim: channels ``d``.
        block_size: channels per float16 scale.
        outlier_pairs: RoPE pairs kept exact (their pair indices cost 2 bytes each per head).
        tokens: tokens in the store (the indices are amortized over them).
        key_bytes: bytes of one exact key value (2 for fp16/bf16 caches); also the
            uncompressed reference ``key_bytes * d``.

    Example:
        >>> byte_account(128, block_size=32, outlier_pairs=2, tokens=1024).total
        140.00390625
    """
    d = head_dim_of("head_dim", head_dim, minimum=2)
    bs = positive_int("block_size", block_size)
    n_out = positive_int("outlier_pairs", outlier_pairs, minimum=0)
    s_count = count("tokens", tokens)
    kb = positive_int("key_bytes", key_bytes, maximum=16)
    if 2 * n_out > d:
        raise InvalidValueError("outlier_pairs", outlier_pairs, f"must be <= head_dim/2 = {d // 2}")
    payload = float(d - 2 * n_out)
    scales = 2.0 * float(-(-d // bs))
    outliers = float(kb * 2 * n_out)
    indices = 2.0 * n_out / s_count
    total = payload + scales + outliers + indices
    return ByteAccount(payload=payload, scales=scales, outliers=outliers, indices=indices,
                       total=total, fp16=float(kb * d), ratio=total / (kb * d))


def dither_variance_proxy(query: ArrayLike, stored: DitheredKeys, *, scale: float) -> F64:
    """Sub-Gaussian variance proxy of each token's logit error, ``scale^2 sum_c q_c^2 s^2/12``.

    Lean: ``WitCert.Dither.grid_mgf_le`` (the grid offset's proxy is the continuous one).

    Args:
        query: the query of this head, shape ``(d,)``.
        stored: the head's dithered keys (outlier channels are exact and do not count).
        scale: the attention scale (> 0).

    Returns:
        ``varsigma_t^2`` per stored token, rounded outward
        (:func:`witcert_calculus.numerics.rounding.variance_margin`).

    Raises:
        InvalidValueError: on a non-finite query, a wrong channel count or a bad scale.

    Example:
        >>> st = dither_quantize(np.ones((1, 4)), key=DitherKey(0, 0, 0), tokens=np.arange(1),
        ...                      block_size=4, layout=RopeLayout.HALF_SPLIT)
        >>> float(dither_variance_proxy(np.ones(4), st, scale=0.5)[0]) > 0
        True
    """
    q, sc = _query_scale(query, stored, scale)
    # sum_c q_c^2 s_{c,t}^2 = sum_blocks s_{b,t}^2 * (sum of q_c^2 over the block's kept channels)
    s64 = stored.scales.astype(np.float64)
    v: F64 = (sc * sc) * ((s64 * s64) @ _per_block(q * q, stored)) / 12.0
    margin = variance_margin(stored.head_dim, s64.shape[1], scale=sc)
    qmax = float(np.abs(q).max(initial=0.0))
    return outward(v, gamma=margin.gamma, alpha=margin.alpha * (1.0 + qmax * qmax),
                   exact=_exact_tokens(q, stored))


def _stored(stored: object) -> DitheredKeys:
    # The dithered store is an established value: only dither_quantize builds one.
    if not isinstance(stored, DitheredKeys):
        raise InvalidValueError("stored", stored, "must be the DitheredKeys of dither_quantize")
    return stored


def _query_scale(query: ArrayLike, stored: DitheredKeys, scale: float) -> tuple[F64, float]:
    _stored(stored)
    q = finite_array("query", query, ndim=1)
    if q.shape[0] != stored.head_dim:
        raise InvalidValueError("query", f"array of shape {q.shape}",
                                f"must have {stored.head_dim} channels")
    return q, real("scale", scale, lo=0.0, lo_open=True)


def _exact_tokens(q: F64, stored: DitheredKeys) -> NDArray[np.bool_]:
    """Tokens whose Tier-B terms are exactly 0: no block has both a nonzero scale and a
    nonzero kept query channel."""
    live = _per_block((q != 0).astype(np.float64), stored) > 0
    out: NDArray[np.bool_] = ~((stored.scales != 0) & live[None, :]).any(axis=-1)
    return out


def _per_block(values: F64, stored: DitheredKeys) -> F64:
    """Sum of per-channel values over each block's kept (non-outlier) channels."""
    kept = values.copy()
    kept[stored.outlier_channels] = 0.0
    out: F64 = np.add.reduceat(kept, np.arange(0, stored.head_dim, stored.block_size))
    return out


def dither_mean_offset(query: ArrayLike, stored: DitheredKeys, *, scale: float) -> F64:
    """Deterministic bound on the mean of each token's logit error, ``scale sum_c |q_c| s 2^-25``.

    The dither offset is drawn from a ``2^-24`` grid, not from a continuum, so the
    quantization error has a mean of at most half a grid step per channel (in units of
    the scale); this term bounds its effect on the logit, and is added to the
    sub-Gaussian radius of the centred error.

    Args:
        query, stored, scale: as :func:`dither_variance_proxy`.

    Returns:
        The term per stored token, rounded outward
        (:func:`witcert_calculus.numerics.rounding.grid_mean_margin`).

    Raises:
        InvalidValueError: on a non-finite query, a wrong channel count or a bad scale.

    Example:
        >>> st = dither_quantize(np.ones((1, 4)), key=DitherKey(0, 0, 0), tokens=np.arange(1),
        ...                      block_size=4, layout=RopeLayout.HALF_SPLIT)
        >>> float(dither_mean_offset(np.ones(4), st, scale=0.5)[0]) > 0
        True
    """
    q, sc = _query_scale(query, stored, scale)
    s64 = stored.scales.astype(np.float64)
    m: F64 = sc * (s64 @ _per_block(np.abs(q), stored)) * GRID_MEAN
    margin = grid_mean_margin(stored.head_dim, s64.shape[1], scale=sc)
    return outward(m, gamma=margin.gamma, alpha=margin.alpha, exact=_exact_tokens(q, stored))


def subgaussian_radius(variance_proxy: ArrayLike, *, delta_loc: float,
                       tokens: int | None = None) -> F64:
    """Joint radius ``u_t = sqrt(2 varsigma_t^2 log(2S/delta_loc))`` over ``S`` tokens.

    ``P(exists t: |eps_t| > u_t) <= sum_t 2 exp(-u_t^2 / (2 varsigma_t^2)) = delta_loc``.

    Args:
        variance_proxy: ``varsigma_t^2`` per token, shape ``(S,)``.
        delta_loc: failure probability for this (layer, head, step), in (0, 1).
        tokens: ``S`` for the union bound (default: the length of ``variance_proxy``).

    Returns:
        ``u_t`` per token, rounded outward
        (:func:`witcert_calculus.numerics.rounding.radius_margin`).

    Raises:
        InvalidValueError: on a negative or non-finite proxy, ``delta_loc`` outside (0, 1),
            or ``tokens`` below the number of tokens.

    Example:
        >>> round(float(subgaussian_radius(np.array([1.0]), delta_loc=0.05)[0]), 6)
        2.716203
    """
    v = nonneg_array("variance_proxy", variance_proxy, ndim=1)
    dl = real("delta_loc", delta_loc, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    n = v.size if tokens is None else count("tokens", tokens)
    if n < v.size:
        raise InvalidValueError("tokens", tokens, f"must be >= the number of tokens {v.size}")
    with np.errstate(over="ignore"):
        r: F64 = np.sqrt(2.0 * v * math.log(2.0 * n / dl))
    margin = radius_margin()
    return outward(r, gamma=margin.gamma, alpha=margin.alpha, exact=v == 0)


def delta_local(delta_req: float | Probability, *, layers: int, heads: int, steps: int) -> float:
    """Split a request's failure budget over layers, heads and decode steps: ``delta_req/(L H T)``.

    The share is computed exactly and rounded down once, to the float handed to the
    radius (:meth:`~witcert_calculus.numerics.probability.Probability.float_down`): a smaller
    per-cell delta only widens the radius, and the ``L H T`` cells together stay
    within ``delta_req``.

    Raises:
        InvalidValueError: for ``delta_req`` outside (0, 1), a count below 1 or not an int,
            or a split so fine that the share rounds down to 0.

    Example:
        >>> delta_local(0.5, layers=2, heads=2, steps=2)
        0.0625
        >>> from fractions import Fraction
        >>> d = delta_local(0.01, layers=2, heads=5, steps=10)  # rounded down
        >>> Fraction(d) <= Fraction(0.01) / 100 < Fraction(math.nextafter(d, 1.0))
        True
    """
    dr = delta_req if isinstance(delta_req, Probability) else real(
        "delta_req", delta_req, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    n = positive_int("layers", layers) * positive_int("heads", heads) * positive_int("steps", steps)
    share = Probability.budget(dr).split(n).float_down()
    if share == 0.0:  # below the smallest float: a zero delta would claim certainty
        raise InvalidValueError("layers * heads * steps", f"~10**{len(str(n)) - 1}",
                                f"splits delta_req={delta_req!r} below the smallest positive "
                                "float; certify fewer cells per request")
    return share


def tier_b_logit_bound(query: ArrayLike, stored: DitheredKeys, *, scale: float,
                       delta_loc: float, tokens: int | None = None) -> LogitBound[F64]:
    """Per-token Tier-B logit bound ``u_t = sqrt(2 varsigma_t^2 log(2S/delta_loc)) + m_t``.

    The sub-Gaussian radius of the centred error (:func:`subgaussian_radius` of
    :func:`dither_variance_proxy`) plus the grid-mean term ``m_t`` (:func:`dither_mean_offset`):
    ``|eps_t| <= u_t`` for all ``S`` tokens except with probability ``delta_loc``, for
    non-adaptive queries (Lean ``WitCert.Semantic.dither_tier_b_token_sound``,
    ``WitCert.Semantic.dither_tier_b_prob_bad``). Each term is rounded outward with room for the sum.
    The torch version (``witcert_kernels.dither.tier_b_logit_bound``) computes the same
    terms, plus the cast term of a reconstruction stored in a narrower type.

    Args:
        query: the query of this head, shape ``(d,)``.
        stored: the head's dithered keys.
        scale: the attention scale (> 0).
        delta_loc: failure probability for this (layer, head, step), in (0, 1).
        tokens: ``S`` for the union bound (default: the stored tokens).

    Returns:
        A :class:`~witcert_calculus.meters.witness.LogitBound` with ``values`` ``u`` of shape
        ``(S,)``, ``delta = delta_loc`` and the assumptions :data:`NON_ADAPTIVE_QUERIES`,
        :data:`PHILOX_UNIFORM`; the premises on the store are computed here.

    Raises:
        InvalidValueError: on an invalid query, scale, ``delta_loc`` or ``tokens``.
        PremiseError: on a store whose codes or scales break the quantizer's guarantees.

    Example:
        >>> st = dither_quantize(np.ones((2, 4)), key=DitherKey(0, 0, 0), tokens=np.arange(2),
        ...                      block_size=4, layout=RopeLayout.HALF_SPLIT)
        >>> u = tier_b_logit_bound(np.ones(4), st, scale=0.5, delta_loc=1e-3)
        >>> bool((u.values > 0).all()) and u.values.shape == (2,), float(u.delta)
        (True, 0.001)
    """
    radius = subgaussian_radius(dither_variance_proxy(query, stored, scale=scale),
                                delta_loc=delta_loc, tokens=tokens)
    out: F64 = radius + dither_mean_offset(query, stored, scale=scale)
    dl = real("delta_loc", delta_loc, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    sc = real("scale", scale, lo=0.0, lo_open=True)
    s_count = int(stored.payload.shape[0])
    n = s_count if tokens is None else positive_int("tokens", tokens)
    scales = stored.scales.astype(np.float64)
    evidence = _tier_b_evidence(premises=(
        _premise("the store is a DitheredKeys: xi is regenerated from its own Philox key "
                "at read time (dither_dequantize), as at write time",
                isinstance(stored, DitheredKeys)),
        _premise(f"every code lies in [-{QMAX}, {QMAX}] (QMAX): no kept channel clipped, "
                "so its error is within s/2 of the stored scale",
                int(np.abs(stored.payload.astype(np.int16)).max(initial=0)) <= QMAX),
        _premise("every block scale is finite and >= 0",
                bool(np.isfinite(scales).all() and (scales >= 0).all())),
        _premise("scale > 0 and 0 < delta_loc < 1", sc > 0 and 0 < dl < 1)),
        union=_premise(f"the union bound runs over S = {n} >= {s_count} stored tokens",
                      n >= s_count),
        assumptions=(NON_ADAPTIVE_QUERIES, PHILOX_UNIFORM))
    return _establish(_read_only(out), evidence=evidence, delta=Fraction(dl),
                      source="witcert_calculus.meters.dither.tier_b_logit_bound", add=_add_shapes)


def _tier_b_evidence(*, premises: tuple[Premise, ...], union: Premise | None,
                     assumptions: tuple[Assumption, ...]) -> Evidence:
    """Evidence of ``|eps_t| <= u_t`` for every token of a row except with probability
    ``delta_loc``: the Tier-B contract ``ditherTierB`` outside its failure event, on the stated
    assumptions (``dither_tier_b_token_sound``), and the probability of that event, the union of
    the per-token sub-Gaussian tails (``dither_tier_b_prob_bad``)."""
    return Composition(
        (Restricted(_proof(DITHER_TIER_B_TOKEN_SOUND, premises), subset=NON_ADAPTIVE,
                    assumptions=assumptions),
         _proof(DITHER_TIER_B_PROB_BAD, () if union is None else (union,))),
        theorem=DITHER_TIER_B_PROB_BAD)


def tier_b_certificate(p_tilde: ArrayLike, query: ArrayLike, stored: DitheredKeys, *,
                       scale: float, delta_loc: float) -> Reading[AttentionTV[AtConsume]]:
    """Probabilistic TV certificate for one query over a dithered store.

    ``u = tier_b_logit_bound(q)``, then ``TV <= (A^2 - 1)/2`` with ``A = sum p_tilde e^{u}``,
    except with probability ``delta_loc``, for non-adaptive queries.

    Args:
        p_tilde: compressed attention over the stored tokens, shape ``(S,)``.
        query, stored, scale, delta_loc: as :func:`tier_b_logit_bound`.

    Returns:
        A reading of ``AttentionTV[AtConsume]`` with ``delta = delta_loc`` and evidence
        citing ``WitCert.Semantic.dither_tier_b_token_sound``,
        ``WitCert.Semantic.dither_tier_b_prob_bad``
        and ``WitCert.Semantic.tv_eform_meter_sound``, restricted to non-adaptive queries
        (tier PARTIALLY_CERTIFIED below saturation, SATURATED otherwise).

    Raises:
        InvalidValueError: on invalid attention (or one entry per stored token missing),
            query, scale or ``delta_loc``.

    Example:
        >>> st = dither_quantize(np.ones((2, 4)), key=DitherKey(0, 0, 0), tokens=np.arange(2),
        ...                      block_size=4, layout=RopeLayout.HALF_SPLIT)
        >>> r = tier_b_certificate(np.array([0.5, 0.5]), np.ones(4), st, scale=0.5,
        ...                        delta_loc=1e-3)
        >>> (r.tier.name, float(r.delta))
        ('PARTIALLY_CERTIFIED', 0.001)
    """
    p = distribution("p_tilde", p_tilde)
    if p.size != _stored(stored).payload.shape[0]:
        raise InvalidValueError("p_tilde", f"array of shape {p.shape}",
                                f"must have one entry per stored token ({stored.payload.shape[0]})")
    u = tier_b_logit_bound(query, stored, scale=scale, delta_loc=delta_loc)
    return tv_eform(p, u).reading()
