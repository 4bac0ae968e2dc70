"""Band witnesses of key residuals and the per-band Cauchy-Schwarz logit bound (Tier A).

A key residual ``r_t = k_hat_t - k_t`` (one head, ``d`` channels) is cut into
``B`` contiguous bands of RoPE frequency pairs; the witness stored at write time
is ``w[t, b] = ||r_{t,b}||``. Because every band holds *both* coordinates of each
of its rotation pairs, a RoPE rotation (which acts on each pair as a planar
rotation) leaves every band norm unchanged: the witness of a post-RoPE residual
equals that of the pre-RoPE residual at every position ("band unitarity"). The
pairing depends on the layout: interleaved ``(x[2j], x[2j+1])`` or the
half-split layout of Hugging Face's ``rotate_half``, ``(x[j], x[j + d/2])``.

At read time the logit error of token ``t`` obeys
``|scale * <q, r_t>| <= c_t = scale * sum_b ||q_b|| * w[t, b]``
(Cauchy-Schwarz per band; Lean: ``WitCert.Witness.logit_bound_sound``).

Floating point: witnesses and ``c`` are *upper* bounds of their exact values.
Norms are computed after scaling by the row maximum (no overflow, no underflow
to a false zero); norms and ``c`` are rounded outward by the rule of
:mod:`witcert_calculus.rounding` (margins :func:`~witcert_calculus.rounding.band_norm_margin`,
:func:`~witcert_calculus.rounding.logit_margin`); storage in float16/float32 rounds upward.
The torch versions (``witcert_kernels.meter``) use the same bands and margins.

Main declarations:

- :class:`RopeLayout`: ``INTERLEAVED`` or ``HALF_SPLIT``.
- :func:`band_pairs`: the pair indices of each band.
- :func:`band_channels`: the channel indices of each band for a layout.
- :func:`band_witness`: ``w[t, b]`` from residuals.
- :func:`band_norms`: band norms of a query (same bands).
- :func:`logit_bound`: ``c_t`` from a query and stored witnesses.
- :func:`logit_linf_reading`: ``max_t c_t`` as a typed ``LogitLinf[AtConsume]`` reading.
"""

from __future__ import annotations

import enum
from typing import Final, final

import numpy as np
from numpy.typing import ArrayLike, DTypeLike, NDArray

from witcert_calculus.contracts import Reading
from witcert_calculus.errors import InvalidValueError
from witcert_calculus.metrics import AtConsume, LogitLinf
from witcert_calculus.rounding import TINY, band_norm_margin, logit_margin, outward
from witcert_calculus.theorems import LOGIT_BOUND_SOUND
from witcert_calculus.tiers import Premise, Proof
from witcert_calculus.validation import F64, finite_array, nonneg_array, positive_int, real

__all__ = [
    "LOGIT_BOUND_THEOREM",
    "RopeLayout",
    "band_channels",
    "band_norms",
    "band_pairs",
    "band_witness",
    "logit_bound",
    "logit_linf_reading",
]

LOGIT_BOUND_THEOREM: Final = LOGIT_BOUND_SOUND


@final
class RopeLayout(enum.Enum):
    """How the two coordinates of each RoPE frequency pair are placed in a head vector."""

    INTERLEAVED = "interleaved"
    """Pair ``j`` is ``(x[2j], x[2j+1])`` (GPT-J / Meta reference layout)."""
    HALF_SPLIT = "half_split"
    """Pair ``j`` is ``(x[j], x[j + d/2])`` (Hugging Face ``rotate_half``)."""


def band_pairs(head_dim: int, *, bands: int) -> tuple[tuple[int, int], ...]:
    """Split the ``head_dim / 2`` frequency pairs into ``bands`` contiguous bands.

    Sizes differ by at most one (the first ``(d/2) % bands`` bands get one more).

    Args:
        head_dim: the head dimension ``d`` (even).
        bands: number of bands ``B``, ``1 <= B <= d/2``.

    Returns:
        ``(start, stop)`` pair ranges, one per band.

    Raises:
        InvalidValueError: if ``d`` is odd or ``B`` out of range.

    Example:
        >>> band_pairs(8, bands=2)
        ((0, 2), (2, 4))
    """
    d = positive_int("head_dim", head_dim, minimum=2)
    if d % 2:
        raise InvalidValueError("head_dim", head_dim, "must be even (RoPE acts on pairs)")
    b = positive_int("bands", bands)
    npairs = d // 2
    if b > npairs:
        raise InvalidValueError("bands", bands, f"must be <= head_dim/2 = {npairs}")
    base, extra = divmod(npairs, b)
    out: list[tuple[int, int]] = []
    start = 0
    for i in range(b):
        stop = start + base + (1 if i < extra else 0)
        out.append((start, stop))
        start = stop
    return tuple(out)


def _pair_channels(head_dim: int, layout: RopeLayout) -> NDArray[np.intp]:
    """Array (d/2, 2): the two channel indices of each pair."""
    j = np.arange(head_dim // 2)
    if layout is RopeLayout.INTERLEAVED:
        return np.stack([2 * j, 2 * j + 1], axis=1)
    if layout is RopeLayout.HALF_SPLIT:
        return np.stack([j, j + head_dim // 2], axis=1)
    raise InvalidValueError("layout", layout, "must be a RopeLayout")


def band_channels(head_dim: int, *, bands: int,
                  layout: RopeLayout) -> tuple[NDArray[np.intp], ...]:
    """Channel indices of each band: both coordinates of every pair in the band.

    Example:
        >>> [c.tolist() for c in band_channels(8, bands=2, layout=RopeLayout.HALF_SPLIT)]
        [[0, 1, 4, 5], [2, 3, 6, 7]]
    """
    ranges = band_pairs(head_dim, bands=bands)
    pc = _pair_channels(head_dim, layout)
    return tuple(np.sort(pc[a:b].reshape(-1)) for a, b in ranges)


def _band_order(head_dim: int, bands: int, layout: RopeLayout
                ) -> tuple[NDArray[np.intp], NDArray[np.intp], F64]:
    """Channel permutation that makes every band contiguous, band starts, band sizes."""
    ranges = band_pairs(head_dim, bands=bands)
    pc = _pair_channels(head_dim, layout)
    perm = np.concatenate([pc[a:b].reshape(-1) for a, b in ranges]).astype(np.intp)
    starts = np.array([2 * a for a, _ in ranges], dtype=np.intp)
    sizes = np.array([2 * (b - a) for a, b in ranges], dtype=np.float64)
    return perm, starts, sizes


def _band_norms_upper(x: F64, bands: int, layout: RopeLayout) -> F64:
    """Rigorous float64 upper bounds of the band norms along the last axis."""
    perm, starts, sizes = _band_order(x.shape[-1], bands, layout)
    xp = x[..., perm]
    ax = np.abs(xp)
    band_max = np.maximum.reduceat(ax, starts, axis=-1)
    amax = band_max.max(axis=-1, keepdims=True)
    scaled = xp / np.where(amax > 0, amax, 1.0)  # |scaled| <= 1: no overflow
    band_sq = np.add.reduceat(scaled * scaled, starts, axis=-1)
    margins = [band_norm_margin(int(m)) for m in sizes]
    gamma = np.array([m.gamma for m in margins])
    floor = np.array([m.alpha for m in margins])  # in units of amax
    # an exactly zero band stays exactly zero
    return outward(np.sqrt(band_sq) * amax, gamma=gamma, alpha=floor * amax + TINY,
                   exact=band_max == 0)


def _store_upward(x: F64, dtype: DTypeLike) -> NDArray[np.floating]:
    dt = np.dtype(dtype)
    if dt == np.dtype(np.float64):
        return x
    if dt == np.dtype(np.float16):
        return _upward_as(x, np.float16)
    if dt == np.dtype(np.float32):
        return _upward_as(x, np.float32)
    raise InvalidValueError("dtype", dtype, "must be float16, float32 or float64")


def _upward_as(x: F64, kind: type[np.float16] | type[np.float32]) -> NDArray[np.floating]:
    with np.errstate(over="ignore"):
        low: NDArray[np.floating] = x.astype(kind)
    up: NDArray[np.floating] = np.nextafter(low, np.asarray(np.inf, dtype=kind))
    stored: NDArray[np.floating] = np.where(low.astype(np.float64) < x, up, low)
    return stored


def band_witness(residual: ArrayLike, *, bands: int, layout: RopeLayout,
                 dtype: DTypeLike = np.float64) -> NDArray[np.floating]:
    """Witness ``w[t, b] = ||r_{t,b}||`` of key residuals, one value per band.

    Args:
        residual: ``k_hat - k``, shape ``(d,)`` or ``(S, d)`` (one head).
        bands: number of bands ``B`` (contiguous ranges of frequency pairs).
        layout: the RoPE layout of the head vectors.
        dtype: storage type; float16 / float32 values are rounded *upward*, so the
            stored witness still bounds the norm (``inf`` when it overflows).

    Returns:
        Array of shape ``(B,)`` or ``(S, B)``; every entry is >= the exact band norm.

    Raises:
        InvalidValueError: on NaN/inf entries, odd ``d``, ``B`` out of range,
            or an unsupported dtype.

    Example:
        >>> band_witness(np.array([3.0, 0.0, 4.0, 0.0]), bands=2,
        ...              layout=RopeLayout.HALF_SPLIT).round(12).tolist()
        [5.0, 0.0]
    """
    r = finite_array("residual", residual, ndim=(1, 2))
    return _store_upward(_band_norms_upper(r, bands, layout), dtype)


def band_norms(query: ArrayLike, *, bands: int, layout: RopeLayout) -> F64:
    """Band norms ``||q_b||`` of a query (rigorous upper bounds), same bands as the witness.

    Example:
        >>> band_norms(np.array([0.0, 3.0, 0.0, 4.0]), bands=1,
        ...            layout=RopeLayout.INTERLEAVED).round(12).tolist()
        [5.0]
    """
    q = finite_array("query", query, ndim=(1, 2))
    return _band_norms_upper(q, bands, layout)


def logit_bound(query: ArrayLike, witness: ArrayLike, *, layout: RopeLayout,
                scale: float) -> F64:
    """Per-token logit error bound ``c_t = scale * sum_b ||q_b|| * w[t, b]``.

    Lean: ``WitCert.Witness.logit_bound_sound`` (per-band Cauchy-Schwarz).

    Args:
        query: the query of this head, shape ``(d,)`` (pre- or post-RoPE: the band
            norms are the same).
        witness: stored witnesses, shape ``(S, B)`` (or ``(B,)`` for one token).
        layout: the RoPE layout used for the witness.
        scale: the attention scale (e.g. ``d ** -0.5``), > 0.

    Returns:
        ``c`` of shape ``(S,)`` (or ``()``), an upper bound of ``|scale * <q, r_t>|``.

    Raises:
        InvalidValueError: on invalid shapes or values.

    Example:
        >>> w = band_witness(np.array([[1.0, 0.0, 0.0, 0.0]]), bands=2,
        ...                  layout=RopeLayout.INTERLEAVED)
        >>> float(logit_bound(np.array([2.0, 0.0, 0.0, 0.0]), w,
        ...                   layout=RopeLayout.INTERLEAVED, scale=0.5)[0]) >= 1.0
        True
    """
    q = finite_array("query", query, ndim=1)
    w = nonneg_array("witness", witness, ndim=(1, 2), allow_inf=True)
    s = real("scale", scale, lo=0.0, lo_open=True)
    nb = w.shape[-1]
    qn = _band_norms_upper(q, nb, layout)
    with np.errstate(invalid="ignore", over="ignore"):
        # inf * 0 -> nan: an overflowed witness meets an exactly zero query band,
        # whose exact contribution <q_b, r_b> is 0.
        prod = w * qn
        prod = np.where(np.isnan(prod), 0.0, prod)
        c: F64 = np.asarray(prod.sum(axis=-1) * s, dtype=np.float64)
    margin = logit_margin(nb, scale=s)
    exact = (w == 0).all(axis=-1) | bool((qn == 0).all())
    return outward(c, gamma=margin.gamma, alpha=margin.alpha, exact=np.asarray(exact))


def logit_linf_reading(c: ArrayLike) -> Reading[LogitLinf[AtConsume]]:
    """The sup-norm logit error bound ``max_t c_t`` as a reading of ``LogitLinf[AtConsume]``.

    It feeds the scalar softmax bridges (e.g. ``bridges.softmax_tv_eform``); the
    per-token TV forms of :mod:`witcert_calculus.tv_forms` use the whole vector and are tighter.

    Args:
        c: per-token bounds from :func:`logit_bound`, shape ``(S,)``, finite and >= 0.

    Returns:
        A CERTIFIED reading citing ``WitCert.Witness.logit_bound_sound``.

    Example:
        >>> logit_linf_reading(np.array([0.1, 0.3])).raw
        0.3
    """
    cc = nonneg_array("c", c, ndim=1)
    if cc.size == 0:
        raise InvalidValueError("c", "empty array", "must hold at least one token")
    evidence = Proof(LOGIT_BOUND_THEOREM, (Premise(
        "c_t = scale * sum_b ||q_b|| w[t, b] with w[t, b] >= ||r_{t,b}||", True),))
    return Reading(LogitLinf[AtConsume], float(cc.max()), evidence=evidence)
