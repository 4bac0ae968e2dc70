"""Torch versions of the Tier-A WitCert meter: band witnesses, logit bound, TV forms.

These evaluate the formulas of :mod:`witcert_calculus.meters.witness` and
:mod:`witcert_calculus.meters.tv_forms` on batched tensors (any leading shape), with the same
bands, the same expressions and the same outward-rounding margins
(:mod:`witcert_calculus.numerics.rounding`), so that an adapter can meter every (layer, head, step)
cell of a live model without a host sync per cell. They are the reference for future
Triton kernels; the test suite checks them against the numpy versions.

Layouts. Rotary embeddings rotate coordinate *pairs*; the pairing is a
:class:`witcert_calculus.meters.witness.RopeLayout` (``HALF_SPLIT`` for Hugging Face's
``rotate_half``, ``INTERLEAVED`` for the original layout). A band is a contiguous run of
pair indices (:func:`witcert_calculus.meters.witness.band_channels`) and always holds both
coordinates of its pairs, so the band norm of a rotated vector equals that of the
unrotated one (band unitarity).

Certified by construction. An adapter certifies its Tier-A readings without asserting any
premise: ``c = logit_bound(query, witness, layout=layout, scale=scale)`` (the query itself,
its band norms computed here) is an established
:class:`~witcert_calculus.meters.witness.LogitBound`; parts add (``c = c1 + c2``, rounded upward);
``b = tv_bounds_batch(p_tilde, c, check=False)`` keeps what the bounds rest on in
``b.basis``, and ``Reading(AttentionTV[AtConsume], value, evidence=b.basis.evidence(theorem),
delta=b.basis.delta)`` is CERTIFIED below saturation. The premises on tensor contents are
computed on the device when the bounds are issued and read once, when the evidence is built.
A plain tensor for ``c`` (e.g. ``logit_bound(q_bands, witness, scale=scale)`` from band norms
the caller computed, the older calling form) is the caller's claim: it is carried as an
assumption (at most PARTIALLY_CERTIFIED).

Main declarations
-----------------
- :func:`band_norms`: per-band l2 norms, rounded outward (witnesses of residuals, band
  norms of queries).
- :func:`logit_bound`: ``c_t = scale * sum_b ||q_b|| * w_{t,b}`` (Cauchy-Schwarz per band),
  an established :class:`~witcert_calculus.meters.witness.LogitBound` holding a tensor.
- :func:`format_logit_bound`: ``c_t = scale * sum_c |q_c| * w_{t,c}`` from per-channel format
  witnesses (the box bound), an established :class:`~witcert_calculus.meters.witness.LogitBound`;
  :func:`format_witness`: those witnesses from stored fp8 codes.
- :func:`exact_logit_bound`: ``c_t = 0`` for keys the cache holds exactly (the box bound of a
  zero witness, without its product), established.
- :func:`tv_bounds_batch`: every TV form as a :class:`witcert_calculus.meters.tv_forms.TVBatch`,
  with the :class:`~witcert_calculus.meters.tv_forms.TVBasis` its readings' evidence comes from;
  :func:`tv_meter_batch` (:class:`TVMeter`): the meter ``min(e-form, two-sided)`` alone;
  :func:`tv_tanh_max_batch`: the cheap form ``tanh(max c)`` alone (no attention weights).
- :func:`forms_from_logs`: the e-form and two-sided form from ``log A`` and ``log A-``;
  :func:`meter_from_sums`: both, with their basis, from a batch's sums (shared with the
  compiled meter, :func:`witcert_kernels.fused.tv_meter_rows`).
- :func:`l2_norm_upper`: the Euclidean norm as an upper bound; :func:`l2_norm`, the plain
  norm (for reports, not a bound).
- :func:`output_error_bound`: the attention-output error from TV and value residuals.
- :func:`round_up_f32`, :func:`round_up_as`: sound storage of a float64 bound in float32 (or
  float16), rounded upward.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import final, overload

import numpy as np
import torch

from witcert_calculus.errors import ForgedBoundError, InvalidValueError
from witcert_calculus.meters.formats import BOX_PREMISE, Fp8Format, Rounding, box_evidence, \
    witness_table
from witcert_calculus.numerics.rounding import TINY, band_norm_margin, dot_margin, logit_margin, \
    sum_margin, tanh_margin, tv_margin
from witcert_calculus.lean.theorems import TV_SINGLE_TOKEN_METER
from witcert_calculus.meters.tv_forms import SINGLE_TOKEN_PREMISE, TVBasis, TVBatch
from witcert_calculus.numerics.validation import positive_int, real
from witcert_calculus.meters.witness import ESTABLISHERS, LogitBound, RopeLayout, band_channels, \
    is_established
from witcert_kernels.rounding import add_up, outward
# The shared constructions of an established bound and of a TV basis (not public API: only
# the establishing functions and the TV forms use them).
from witcert_calculus.meters.tv_forms import _basis  # pyright: ignore[reportPrivateUsage]
from witcert_calculus.meters.witness import _WITNESS_PREMISE  # pyright: ignore[reportPrivateUsage]
from witcert_calculus.meters.witness import _establish  # pyright: ignore[reportPrivateUsage]
from witcert_calculus.meters.witness import _tier_a_evidence  # pyright: ignore[reportPrivateUsage]

__all__ = [
    "TVMeter",
    "band_norms",
    "exact_logit_bound",
    "format_logit_bound",
    "format_witness",
    "l2_norm",
    "l2_norm_upper",
    "logit_bound",
    "meter_from_sums",
    "output_error_bound",
    "round_up_as",
    "round_up_f32",
    "tv_bounds_batch",
    "tv_meter_batch",
    "tv_tanh_max_batch",
]

_F64 = torch.float64


@lru_cache(maxsize=64)
def _band_layout(head_dim: int, bands: int, layout: RopeLayout, device: torch.device
                 ) -> tuple[torch.Tensor, tuple[int, ...], torch.Tensor, torch.Tensor]:
    """Channel permutation that makes every band contiguous, the band sizes, and the bands'
    norm margins ``(gamma, alpha)`` as device tensors (made once per device: no host-to-device
    copy on later calls, so a call can be captured in a CUDA graph)."""
    channels = band_channels(head_dim, bands=bands, layout=layout)
    perm = torch.as_tensor(np.concatenate(channels), dtype=torch.int64, device=device)
    sizes = tuple(int(c.size) for c in channels)
    margins = [band_norm_margin(m) for m in sizes]
    gamma = torch.tensor([m.gamma for m in margins], dtype=_F64, device=device)
    floor = torch.tensor([m.alpha for m in margins], dtype=_F64, device=device)
    return perm, sizes, gamma, floor


def band_norms(x: torch.Tensor, *, bands: int, layout: RopeLayout) -> torch.Tensor:
    """Per-band l2 norms over the last dimension: rigorous float64 upper bounds.

    The bands and the margins are those of :func:`witcert_calculus.meters.witness.band_norms`: the
    norm is taken after scaling by the row maximum (no overflow, no false zero from
    underflow) and rounded outward (:func:`witcert_calculus.numerics.rounding.band_norm_margin`).

    Args:
        x: ``[..., d]`` (a key/value residual, or a query).
        bands: number of contiguous bands of rotary pairs, ``1 <= bands <= d/2``.
        layout: the rotary pair layout of ``x``.

    Returns:
        ``[..., bands]`` float64 tensor; every entry is >= the exact band norm.

    Raises:
        InvalidValueError: ``d`` odd, ``bands`` out of range, or not a :class:`RopeLayout`.

    Example:
        >>> band_norms(torch.tensor([3.0, 0.0, 4.0, 0.0]), bands=1,
        ...            layout=RopeLayout.HALF_SPLIT).tolist()
        [5.000000000000005]
    """
    perm, sizes, gamma, floor = _band_layout(int(x.shape[-1]), positive_int("bands", bands),
                                             layout, x.device)
    xp = x.to(_F64).index_select(-1, perm)
    if len(set(sizes)) == 1:  # equal bands: one reshape
        grouped = xp.reshape(*xp.shape[:-1], bands, sizes[0])
        band_max = grouped.abs().amax(dim=-1)
        amax = band_max.amax(dim=-1, keepdim=True)
        scaled = grouped / torch.where(amax > 0, amax, 1.0).unsqueeze(-1)
        band_sq = (scaled * scaled).sum(dim=-1)
    else:  # sizes differ by one: band by band
        pieces = torch.split(xp, list(sizes), dim=-1)
        band_max = torch.stack([p.abs().amax(dim=-1) for p in pieces], dim=-1)
        amax = band_max.amax(dim=-1, keepdim=True)
        div = torch.where(amax > 0, amax, 1.0)
        band_sq = torch.stack([((p / div) * (p / div)).sum(dim=-1) for p in pieces], dim=-1)
    return outward(torch.sqrt(band_sq) * amax, gamma=gamma, alpha=floor * amax + TINY,
                   exact=band_max == 0)


def l2_norm_upper(x: torch.Tensor) -> torch.Tensor:
    """Euclidean norm over the last dimension, a rigorous float64 upper bound.

    The band norm of a single band (:func:`band_norms` with ``bands=1``: every channel,
    whatever the layout), with its margins; for norms that enter a bound (residual and
    value witnesses, the query norm of a score bridge).

    Raises:
        InvalidValueError: if the last dimension is odd (it holds rotary pairs).

    Example:
        >>> float(l2_norm_upper(torch.tensor([3.0, 4.0]))) >= 5.0
        True
    """
    return band_norms(x, bands=1, layout=RopeLayout.HALF_SPLIT)[..., 0]


def output_error_bound(tv: torch.Tensor, *, value_norm_max: torch.Tensor,
                       p_tilde: torch.Tensor, rho: torch.Tensor) -> torch.Tensor:
    """``2 min(1, tv) max_t ||v_t|| + sum_t p~_t rho_t``, batched and rounded outward.

    The torch twin of :func:`witcert_calculus.meters.output_bound.output_error_bound` (Lean:
    ``WitCert.Meters.output_error_bound_vector_sound``): the float64 sum of products
    carries :func:`witcert_calculus.numerics.rounding.dot_margin`, the combination
    :func:`witcert_calculus.numerics.rounding.sum_margin` of two terms.

    Args:
        tv: ``[...]`` upper bounds of ``TV(p, p~)`` (a bound above 1 counts as 1, the range
            of total variation).
        value_norm_max: broadcastable to ``tv``: upper bounds of ``max_t ||v_t||``.
        p_tilde: ``[..., S]`` compressed attention (renormalised here in float64).
        rho: broadcastable to ``p_tilde``: upper bounds of ``||v_t - v^_t||``.

    Returns:
        ``[...]`` float64 upper bounds of ``||y - y^||``.

    Example:
        >>> f64 = torch.float64
        >>> b = output_error_bound(torch.tensor(0.1, dtype=f64),
        ...                        value_norm_max=torch.tensor(2.0, dtype=f64),
        ...                        p_tilde=torch.tensor([0.5, 0.5], dtype=f64),
        ...                        rho=torch.tensor([0.0, 0.2], dtype=f64))
        >>> 0.5 <= float(b) < 0.5 + 1e-12
        True
    """
    p = p_tilde.to(_F64)
    p = p / p.sum(dim=-1, keepdim=True)
    terms = p * rho.to(_F64)
    dm = dot_margin(int(p.shape[-1]))
    s = outward(terms.sum(dim=-1), gamma=dm.gamma, alpha=dm.alpha, exact=~(terms > 0).any(dim=-1))
    total = 2.0 * torch.clamp(tv.to(_F64), max=1.0) * value_norm_max.to(_F64) + s
    sm = sum_margin(2)
    return outward(total, gamma=sm.gamma, alpha=sm.alpha, exact=total == 0)


def l2_norm(x: torch.Tensor) -> torch.Tensor:
    """Euclidean norm over the last dimension, rounded to nearest (a report, not a bound).

    Example:
        >>> l2_norm(torch.tensor([3.0, 4.0])).item()
        5.0
    """
    # torch.linalg's stubs are partially unknown to pyright; the sum of squares is typed.
    return torch.sqrt((x * x).sum(dim=-1))


def _band_dot(q: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``out[..., s] = sum_b q[..., b] * w[..., s, b]``, leading dimensions broadcast, as one
    batched matrix product: the leading dimensions where ``w`` has size 1 (the query rows and
    query heads of a GQA group) become its columns, so ``w`` is never copied per row. The
    sum's order is the library's, which :func:`~witcert_calculus.numerics.rounding.logit_margin`
    covers (any order)."""
    lead = np.broadcast_shapes(tuple(q.shape[:-1]), tuple(w.shape[:-2]))
    n = len(lead)
    w_lead = (1,) * (n - (w.dim() - 2)) + tuple(w.shape[:-2])
    names = "acdefghijklmnopqrtuvwxyz"[:n]
    shared = [i for i in range(n) if w_lead[i] != 1]
    w_sub = "".join(names[i] for i in shared) + "sb"
    w_kept = w.reshape(*(w_lead[i] for i in shared), *w.shape[-2:])
    return torch.einsum(f"{w_sub},{names}b->{names}s", w_kept, q.expand(*lead, q.shape[-1]))


def round_up_f32(x: torch.Tensor) -> torch.Tensor:
    """Store a nonnegative float64 tensor in float32, rounding every entry upward.

    A witness is an upper bound; rounding it to nearest could lower it, so the
    float32 copy is moved one step toward +inf wherever the cast went down (the storage
    rule of :mod:`witcert_calculus.numerics.rounding`).

    Example:
        >>> x = torch.tensor([0.1], dtype=torch.float64)
        >>> bool(round_up_f32(x).double() >= x)
        True
    """
    return round_up_as(x, torch.float32)


def round_up_as(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Store a float64 tensor in ``dtype`` (float16 or float32), rounding every entry upward:
    one step toward +inf wherever the cast went down (an overflow gives ``inf``).

    Example:
        >>> x = torch.tensor([0.1], dtype=torch.float64)
        >>> bool(round_up_as(x, torch.float16).double() >= x)
        True
    """
    y = x.to(dtype)
    low = y.to(_F64) < x
    out: torch.Tensor = torch.where(low, torch.nextafter(y, torch.full_like(y, float("inf"))), y)
    return out


@overload
def logit_bound(query: torch.Tensor, witness: torch.Tensor, *, scale: float,
                layout: RopeLayout) -> LogitBound[torch.Tensor]: ...
@overload
def logit_bound(query: torch.Tensor, witness: torch.Tensor, *, scale: float,
                layout: None = None) -> torch.Tensor: ...


def logit_bound(query: torch.Tensor, witness: torch.Tensor, *, scale: float,
                layout: RopeLayout | None = None) -> LogitBound[torch.Tensor] | torch.Tensor:
    """Per-token logit error bound ``c_t = scale * sum_b ||q_b|| * w_{t,b}``, rounded outward.

    The torch twin of :func:`witcert_calculus.meters.witness.logit_bound`: its formula and margins
    (:func:`witcert_calculus.numerics.rounding.logit_margin`); an overflowed witness that meets an
    exactly zero query band contributes 0, as its exact product does.

    With ``layout``, the first argument is the query: its band norms are computed here
    (:func:`band_norms`, over the witness's bands) and the result is an established
    :class:`~witcert_calculus.meters.witness.LogitBound` (Lean
    ``WitCert.Witness.logit_bound_sound``; the TV forms take it as proved). That the witness is
    ``>= 0`` is computed on the device (no host sync) and read when a reading's evidence is built.
    Without ``layout`` (the older form), the first argument holds band norms the caller computed and
    the result is a plain tensor: the caller's claim, assumed by the TV forms.

    Args:
        query: ``[..., d]`` the query (with ``layout``), or ``[..., B]`` its band norms
            (without).
        witness: ``[..., S, B]`` band witnesses of the key residuals (leading dimensions
            broadcast against those of the query).
        scale: the attention's softmax scale (positive, finite).
        layout: the rotary layout of the query and the witness.

    Returns:
        With ``layout``, a :class:`~witcert_calculus.meters.witness.LogitBound` whose ``values`` are
        ``[..., S]`` float64 bounds ``c_t >= |eps_t|`` (``delta = 0``); without, the
        ``[..., S]`` tensor itself.

    Raises:
        InvalidValueError: ``scale`` not positive and finite, or bands that do not fit
            the query.

    Example:
        >>> w = torch.tensor([[0.5]], dtype=torch.float64)
        >>> c = logit_bound(torch.tensor([2.0, 0.0]), w, layout=RopeLayout.INTERLEAVED,
        ...                 scale=0.5)
        >>> 0.5 <= c.values.item() < 0.5 + 1e-14, c.assumptions
        (True, ())
    """
    sc = real("scale", scale, lo=0.0, lo_open=True)
    nb = int(witness.shape[-1])
    q_bands = query if layout is None else band_norms(query, bands=nb, layout=layout)
    qb = q_bands.to(_F64)
    w = witness.to(_F64)
    # inf * 0 (an overflowed witness, an exactly zero band): the exact product is 0, so the
    # products run over the finite witnesses and a token whose overflowed witness meets a
    # nonzero band is inf; any NaN (a NaN witness or query) stays NaN, so the bound cannot
    # certify
    overflowed = torch.isinf(w)
    if w.device.type == "cpu" and not bool(overflowed.any()):  # the common case, on the host
        raw = _band_dot(qb, w)
    else:  # a device takes this path always (no host sync)
        raw = _band_dot(qb, torch.where(overflowed, 0.0, w))
        hit = _band_dot((qb != 0).to(_F64), overflowed.to(_F64)) > 0
        raw = torch.where(hit, raw + math.inf, raw)
    margin = logit_margin(nb, scale=sc)
    # a token whose witnesses are all 0 is exact; as two reductions: max == 0 is "all 0" for
    # w >= 0, the premise checked below (a witness below 0 refuses the bound; NaN is neither)
    exact = (w.amax(dim=-1) == 0) | (qb == 0).all(dim=-1, keepdim=True)
    values = outward(raw * sc, gamma=margin.gamma, alpha=margin.alpha, exact=exact)
    if layout is None:
        return values
    evidence = _tier_a_evidence(scale=sc, bands=nb, query_bands=int(qb.shape[-1]),
                                witness_ok=None)
    nonnegative = w.amin() >= 0 if w.numel() else \
        torch.ones((), dtype=torch.bool, device=w.device)
    return _establish(values, evidence=evidence, delta=Fraction(0),
                      source="witcert_kernels.meter.logit_bound", add=_add_bounds,
                      checks=((_WITNESS_PREMISE, nonnegative),))


@lru_cache(maxsize=64)
def _witness_table(fmt: Fp8Format, rounding: Rounding, scale: float, device: torch.device
                   ) -> torch.Tensor:
    # The 256 witnesses of witcert_calculus.meters.formats.witness_table, made once per device.
    return torch.tensor(np.array(witness_table(fmt, rounding, scale=scale)), dtype=_F64,
                        device=device)


def format_witness(codes: torch.Tensor, *, fmt: Fp8Format, rounding: Rounding,
                   scale: float) -> torch.Tensor:
    """Per-channel residual bounds ``w`` of stored fp8 codes (``uint8``), float64.

    The torch twin of :func:`witcert_calculus.meters.formats.format_witness`: the same
    table (exact witnesses rounded upward, ``inf`` for a code where the writer clamps),
    looked up per code.

    Raises:
        InvalidValueError: codes that are not ``uint8``, or a bad scale.

    Example:
        >>> format_witness(torch.tensor([0x38, 0x7E], dtype=torch.uint8),
        ...                fmt=Fp8Format.E4M3, rounding=Rounding.TRUNCATE, scale=1.0)[1].item()
        inf
    """
    if codes.dtype != torch.uint8:
        raise InvalidValueError("codes", f"tensor of {codes.dtype}", "must be uint8 bytes")
    table = _witness_table(fmt, rounding, float(scale), codes.device)
    return table[codes.to(torch.int64)]


def format_logit_bound(query: torch.Tensor, witness: torch.Tensor, *, scale: float
                       ) -> LogitBound[torch.Tensor]:
    """Per-token logit error bounds ``c_t = scale * sum_c |q_c| * w_{t,c}`` of many queries
    against the same keys, established.

    The torch twin of :func:`witcert_calculus.meters.formats.format_logit_bound` (Lean
    ``WitCert.Formats.box_logit_bound_sound``), batched as a matrix product: the witness
    ``[*batch, S, d]`` is met by every query row ``[*batch, *rows, d]`` sharing its batch
    index (no copy of the witness per row). Rounded outward with the margin of ``d``
    products (:func:`witcert_calculus.numerics.rounding.logit_margin`). An infinite witness
    saturates its token (``inf``, also against a zero query channel), as in the numpy version. That
    the witness is ``>= 0`` is computed on the device and read when a reading's evidence is
    built.

    Args:
        query: ``[*batch, *rows, d]`` queries in the frame of the stored keys.
        witness: ``[*batch, S, d]`` per-channel witnesses of the keys' residuals.
        scale: the attention's softmax scale (positive, finite).

    Returns:
        A :class:`~witcert_calculus.meters.witness.LogitBound` of ``[*batch, *rows, S]`` float64
        bounds.

    Raises:
        InvalidValueError: a bad scale, or shapes that do not meet.

    Example:
        >>> c = format_logit_bound(torch.tensor([[2.0, -1.0]]),
        ...                        torch.tensor([[0.5, 0.25]], dtype=torch.float64), scale=0.5)
        >>> c.values.item() >= 0.625
        True
    """
    sc = real("scale", scale, lo=0.0, lo_open=True)
    d = int(query.shape[-1])
    batch = tuple(witness.shape[:-2])
    rows = tuple(query.shape[len(batch):-1])
    if int(witness.shape[-1]) != d or tuple(query.shape[:len(batch)]) != batch:
        raise InvalidValueError("witness", f"tensor of shape {tuple(witness.shape)}",
                                f"must be [*batch, S, {d}] for queries of shape "
                                f"{tuple(query.shape)} ([*batch, *rows, {d}])")
    aq = query.to(_F64).abs().reshape(*batch, math.prod(rows), d)
    w = witness.to(_F64)
    raw = torch.matmul(aq, w.transpose(-1, -2)) * sc  # [*batch, rows, S]
    raw = torch.where(torch.isnan(raw), torch.inf, raw)  # inf * 0 met: saturate the token
    margin = logit_margin(d, scale=sc)
    exact = (w == 0).all(dim=-1).unsqueeze(-2) | (aq == 0).all(dim=-1, keepdim=True)
    values = outward(raw, gamma=margin.gamma, alpha=margin.alpha, exact=exact)
    evidence = box_evidence(scale=sc, channels=d, witness_ok=None)
    return _establish(values.reshape(*batch, *rows, int(w.shape[-2])), evidence=evidence,
                      delta=Fraction(0), source="witcert_kernels.meter.format_logit_bound",
                      add=_add_bounds, checks=((BOX_PREMISE, (w >= 0).all()),))


EXACT_PREMISE = ("w[t, c] = 0 for every token and channel: the cache holds every visible key "
                 "exactly (its stored elements equal the model's key, checked bit for bit "
                 "when written)")
"""The premise of :func:`exact_logit_bound`, whose truth the caller computes."""


def exact_logit_bound(query: torch.Tensor, tokens: int, *, scale: float,
                      stored_exactly: object) -> LogitBound[torch.Tensor]:
    """``c_t = 0`` for keys the cache holds exactly, established.

    A key stored exactly has a zero residual, so its per-channel witness is ``w = 0`` and
    the box bound (Lean ``WitCert.Formats.box_logit_bound_sound``) gives
    ``|eps_t| <= scale * sum_c |q_c| * 0 = 0``: the product of
    :func:`format_logit_bound` is known without computing it (exact, no rounding). The
    values are a zero tensor expanded to ``[*rows, tokens]`` (no memory per token).

    Args:
        query: ``[*rows, d]`` the queries (their shape and head dimension only).
        tokens: the visible tokens ``S`` of every row.
        scale: the attention's softmax scale (positive, finite).
        stored_exactly: the truth of :data:`EXACT_PREMISE`, computed by the caller (a
            ``bool`` or a 0-d boolean tensor, read when a reading's evidence is built).

    Raises:
        InvalidValueError: a bad scale or a negative token count.

    Example:
        >>> c = exact_logit_bound(torch.ones(2, 4), 3, scale=0.5, stored_exactly=True)
        >>> (tuple(c.values.shape), float(c.values.max()))
        ((2, 3), 0.0)
    """
    sc = real("scale", scale, lo=0.0, lo_open=True)
    if tokens < 0:
        raise InvalidValueError("tokens", tokens, "must be >= 0")
    rows = tuple(int(n) for n in query.shape[:-1])
    values = torch.zeros((), dtype=_F64, device=query.device).expand(*rows, tokens)
    evidence = box_evidence(scale=sc, channels=int(query.shape[-1]), witness_ok=None)
    return _establish(values, evidence=evidence, delta=Fraction(0),
                      source="witcert_kernels.meter.exact_logit_bound", add=_add_bounds,
                      checks=((EXACT_PREMISE, stored_exactly),))


def _add_bounds(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.shape != b.shape:
        raise InvalidValueError("c", f"bounds of shapes {tuple(a.shape)} and {tuple(b.shape)}",
                                "must bound the same tokens (equal shapes) to be added")
    return add_up(a, b)


# --------------------------------------------------------------------------- TV forms
# Line by line the log-domain cores of witcert_calculus.meters.tv_forms, without host syncs on
# a device: both branches are computed there and selected per row. On the host, where reading
# a tensor costs nothing, the log-sum-exp branch is computed only when some row takes it.

def _lse(logs: torch.Tensor) -> torch.Tensor:
    m = logs.amax(dim=-1)
    finite_m = torch.where(torch.isfinite(m), m, 0.0)
    body = finite_m + torch.log(torch.exp(logs - finite_m.unsqueeze(-1)).sum(dim=-1))
    return torch.where(torch.isinf(m), m, body)


def _log_p(p: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    # log p where p > 0 (pos), -inf elsewhere.
    return torch.where(pos, torch.log(torch.where(pos, p, 1.0)), float("-inf"))


def _select(direct: torch.Tensor, small: torch.Tensor, logs: Callable[[], torch.Tensor]
            ) -> torch.Tensor:
    # log1p(sum) where ``direct`` (per row), else the log-sum-exp of logs() (its terms made
    # only when some row needs them, or always on a device: no host sync).
    if direct.device.type == "cpu" and bool(direct.all()):
        return small
    return torch.where(direct, small, _lse(logs()))


def _log_a_plus(p: torch.Tensor, c: torch.Tensor, pos: torch.Tensor,
                log_p: Callable[[], torch.Tensor]) -> torch.Tensor:
    b = torch.where(pos, p * torch.expm1(c), 0.0).sum(dim=-1)
    return _select(torch.isfinite(b), torch.log1p(b),
                   lambda: torch.where(pos, log_p() + c, float("-inf")))


def _log_a_minus(p: torch.Tensor, c: torch.Tensor, pos: torch.Tensor,
                 log_p: Callable[[], torch.Tensor]) -> torch.Tensor:
    b = torch.where(pos, p * torch.expm1(-c), 0.0).sum(dim=-1)
    return _select(b > -0.5, torch.log1p(b),
                   lambda: torch.where(pos, log_p() - c, float("-inf")))


def _eform_raw(log_a: torch.Tensor) -> torch.Tensor:
    b = torch.expm1(log_a)
    return 0.5 * b * (b + 2.0)


def _retention_raw(p: torch.Tensor, c: torch.Tensor, log_a: torch.Tensor,
                   log_am: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    la = log_a.unsqueeze(-1)
    lm = log_am.unsqueeze(-1)
    one_sided = torch.expm1(la + c)
    up = torch.expm1(c - lm)
    down = -torch.expm1(-c - la)
    per = torch.minimum(one_sided, torch.maximum(up, down))
    return 0.5 * torch.where(pos, p * per, 0.0).sum(dim=-1)


def forms_from_logs(log_a: torch.Tensor, log_a_minus: torch.Tensor, cmax: torch.Tensor, *,
                    tokens: int, exact: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
    """The e-form ``(A^2 - 1)/2`` and the two-sided form ``sinh(log A - log A-)`` from
    ``log A`` and ``log A-``, rounded outward with the margin of
    :func:`witcert_calculus.numerics.rounding.tv_margin` over ``tokens`` tokens.

    Shared by :func:`tv_bounds_batch` and the fused decode meter
    (:mod:`witcert_kernels.triton_decode`), which hands in an upper bound of ``log A`` and a
    lower bound of ``log A-``. ``exact`` marks rows with ``c = 0`` everywhere (bound 0).

    Returns:
        ``(eform, two_sided, gamma, alpha)``: the two forms and the margin they used.
    """
    margin = tv_margin(tokens)
    gamma = margin.gamma * (1.0 + (log_a.abs() + log_a_minus.abs() + cmax))
    e = outward(_eform_raw(log_a), gamma=gamma, alpha=margin.alpha, exact=exact)
    t = outward(torch.sinh(log_a - log_a_minus), gamma=gamma, alpha=margin.alpha, exact=exact)
    return e, t, gamma, margin.alpha


def tv_bounds_batch(p_tilde: torch.Tensor, c: LogitBound[torch.Tensor] | torch.Tensor, *,
                    check: bool = True, visible: torch.Tensor | None = None
                    ) -> TVBatch[torch.Tensor]:
    """Every Tier-A bound on ``TV(p, p_tilde)`` from per-token logit bounds, in the log domain.

    The torch version of :func:`witcert_calculus.meters.tv_forms.tv_bounds_batch`: with
    ``A = sum_t p~_t e^{c_t}`` and ``A- = sum_t p~_t e^{-c_t}``, the e-form
    ``(A^2 - 1) / 2``, the two-sided form ``sinh(log A - log A-)``, the retention form,
    the meter ``min`` of the first two and ``tanh(max c)``, each rounded outward with the
    same margins. Nothing is clamped: an overflow yields ``inf`` (saturation).

    Args:
        p_tilde: ``[..., S]`` compressed attention (rows summing to 1; renormalised here
            in float64 so float32 rounding of the row sum does not bias the bound).
        c: ``[..., S]`` nonnegative logit bounds (``inf`` allowed): an established
            :class:`~witcert_calculus.meters.witness.LogitBound` (from :func:`logit_bound`,
            ``witcert_kernels.dither.tier_b_logit_bound`` or their sums), whose premise holds
            by construction, or a plain tensor of the caller's, whose premise is the
            assumption :data:`witcert_calculus.meters.witness.CALLER_LOGIT_BOUND`.
        check: validate the inputs here (two host synchronisations). A caller in a hot
            loop passes ``False``: the same checks are then computed on the device and
            read when ``basis.evidence(...)`` builds a reading's evidence (a bad input
            refuses the evidence with a ``PremiseError``); a NaN or negative input also
            yields a NaN or negative bound, which the acceptance gate's magnitude stage
            rejects.
        visible: tokens each row attends to, broadcastable to ``[...]`` (e.g. ``[Q]``), or
            ``None``: rows with one visible token report 0 on every form (softmax over one
            token is 1; Lean ``WitCert.Meters.tv_single_token``), as in
            :func:`witcert_calculus.meters.tv_forms.tv_bounds_batch`, with its computed premise.

    Returns:
        A :class:`~witcert_calculus.meters.tv_forms.TVBatch` of ``[...]`` float64 tensors, with the
        :class:`~witcert_calculus.meters.tv_forms.TVBasis` of its readings.

    Raises:
        ForgedBoundError: a ``LogitBound`` that no establishing function produced.
        InvalidValueError: negative or NaN entries in ``p_tilde`` or ``c``, or shapes that
            differ.

    Example:
        >>> b = tv_bounds_batch(torch.tensor([0.5, 0.5]), torch.tensor([0.0, 0.0]))
        >>> float(b.meter), b.basis.assumptions[0].statement[:14]
        (0.0, 'c_t >= |eps_t|')
    """
    core = _meter_core(p_tilde, c, check=check, visible=visible)
    r = torch.minimum(outward(_retention_raw(core.p, core.c, core.log_a, core.log_a_minus,
                                             core.pos), gamma=core.gamma, alpha=core.alpha,
                              exact=core.exact), core.eform)
    th = _tanh_max(core.c)
    if core.one is not None:
        zero = torch.zeros_like(r)
        r, th = torch.where(core.one, zero, r), torch.where(core.one, zero, th)
    return TVBatch(eform=core.eform, two_sided=core.two_sided, retention=r,
                   meter=torch.minimum(core.eform, core.two_sided), tanh_max=th,
                   log_a=core.log_a, log_a_minus=core.log_a_minus, basis=core.basis)


@final
@dataclass(frozen=True, slots=True)
class TVMeter:
    """The meter ``min(e-form, two-sided)`` of many rows, with what it rests on.

    Attributes:
        meter: ``[...]`` the meter; ``eform``, ``two_sided``: its two forms.
        basis: what every bound of the batch rests on (as :attr:`TVBatch.basis`).
    """

    meter: torch.Tensor
    eform: torch.Tensor
    two_sided: torch.Tensor
    basis: TVBasis


def tv_meter_batch(p_tilde: torch.Tensor, c: LogitBound[torch.Tensor] | torch.Tensor, *,
                   check: bool = True, visible: torch.Tensor | None = None) -> TVMeter:
    """The meter ``min(e-form, two-sided)`` alone, as :func:`tv_bounds_batch` computes it
    (the same code, the same margins), without the retention form and ``tanh(max c)``: for
    a caller that reports the meter only (about a third less work).

    Args, raises: as :func:`tv_bounds_batch`.

    Example:
        >>> float(tv_meter_batch(torch.tensor([0.5, 0.5]), torch.tensor([0.0, 0.0])).meter)
        0.0
    """
    core = _meter_core(p_tilde, c, check=check, visible=visible)
    return TVMeter(torch.minimum(core.eform, core.two_sided), core.eform, core.two_sided,
                   core.basis)


@dataclass(frozen=True, slots=True)
class _Core:
    # What the meter's forms share: the renormalized p~, c, log A, log A-, the margins, the
    # two forms (single-token rows already 0), the rows with one token, the basis.
    p: torch.Tensor
    c: torch.Tensor
    pos: torch.Tensor
    log_a: torch.Tensor
    log_a_minus: torch.Tensor
    gamma: torch.Tensor
    alpha: float
    exact: torch.Tensor
    eform: torch.Tensor
    two_sided: torch.Tensor
    one: torch.Tensor | None
    basis: TVBasis


_P_PREMISE = ("p_tilde rows are finite and nonnegative with a positive sum (renormalized here "
              "to probability vectors)")
_C_PREMISE = "c_t >= 0 for every token t, not NaN (inf allowed)"


def _meter_core(p_tilde: torch.Tensor, c: LogitBound[torch.Tensor] | torch.Tensor, *,
                check: bool, visible: torch.Tensor | None) -> _Core:
    if isinstance(c, LogitBound) and not is_established(c):
        raise ForgedBoundError("LogitBound", ESTABLISHERS)
    cv = c.values if isinstance(c, LogitBound) else c
    p = p_tilde.to(_F64)
    cc = cv.to(_F64)
    if tuple(cc.shape) != tuple(p.shape):
        raise InvalidValueError("c", f"tensor of shape {tuple(cc.shape)}",
                                f"must have the shape of p_tilde {tuple(p.shape)}")
    if check and (bool(torch.isnan(p).any()) or bool((p < 0).any())):
        raise InvalidValueError("p_tilde", "tensor", "must be nonnegative and not NaN")
    if check and (bool(torch.isnan(cc).any()) or bool((cc < 0).any())):
        raise InvalidValueError("c", "tensor", "must be nonnegative and not NaN")
    total = p.sum(dim=-1, keepdim=True)
    # p >= 0 (its minimum; NaN fails) with finite row sums: every entry finite
    p_ok = (p.amin() >= 0) & (torch.isfinite(total) & (total > 0)).all() if p.numel() \
        else (total > 0).all()
    p = p / total
    pos = p > 0

    def log_p() -> torch.Tensor:
        return _log_p(p, pos)

    la = _log_a_plus(p, cc, pos, log_p)
    lm = _log_a_minus(p, cc, pos, log_p)
    cmax = cc.amax(dim=-1)  # the largest finite c_t (0 if none): on the host, the plain max
    if cc.device.type != "cpu" or not bool((torch.isfinite(cmax) & (cmax >= 0)).all()):
        cmax = torch.where(torch.isfinite(cc), cc, 0.0).amax(dim=-1)
    m = meter_from_sums(la, lm, cmax, c=c, tokens=int(p.shape[-1]),
                        premises=(p_ok, (cc >= 0).all()), visible=visible,
                        positive=None if visible is None else pos.sum(dim=-1))
    return _Core(p, cc, pos, la, lm, m.gamma, m.alpha, cmax == 0, m.eform, m.two_sided, m.one,
                 m.basis)


@final
@dataclass(frozen=True, slots=True)
class _Forms:
    # The meter's two forms from a batch's sums, with their margin, the rows with one token
    # (None: not given), the basis.
    eform: torch.Tensor
    two_sided: torch.Tensor
    gamma: torch.Tensor
    alpha: float
    one: torch.Tensor | None
    basis: TVBasis

    def meter(self) -> TVMeter:
        return TVMeter(torch.minimum(self.eform, self.two_sided), self.eform, self.two_sided,
                       self.basis)


def meter_from_sums(log_a: torch.Tensor, log_a_minus: torch.Tensor, cmax: torch.Tensor, *,
                    c: LogitBound[torch.Tensor] | torch.Tensor, tokens: int,
                    premises: tuple[torch.Tensor, torch.Tensor],
                    visible: torch.Tensor | None, positive: torch.Tensor | None) -> _Forms:
    """The e-form and the two-sided form of rows from their sums (``log A``, ``log A-``, the
    largest finite ``c``), as :func:`tv_meter_batch` gives them, with their basis: shared by
    the torch meter and the compiled one (:func:`witcert_kernels.fused.tv_meter_rows`).

    Args:
        c: the logit bound the sums were made of (its evidence enters the basis).
        tokens: the tokens per row (the margin's count).
        premises: whether ``p~`` was finite and nonnegative with positive row sums, and
            whether every ``c_t >= 0`` (0-d boolean tensors, read when evidence is built).
        visible: tokens each row attends to (broadcastable to the rows), or ``None``; rows
            with one report 0 (Lean ``WitCert.Meters.tv_single_token``), ``positive`` (the
            tokens of positive weight per row) checking that premise.
    """
    exact = cmax == 0  # c = 0 everywhere: A = A- = 1 exactly and the exact bound 0
    e, t, gamma, alpha = forms_from_logs(log_a, log_a_minus, cmax, tokens=tokens, exact=exact)
    checks: tuple[tuple[str, torch.Tensor], ...] = ((_P_PREMISE, premises[0]),
                                                    (_C_PREMISE, premises[1]))
    also: tuple[str, ...] = ()
    one = None
    if visible is not None:
        assert positive is not None
        one = torch.broadcast_to(visible == 1, e.shape)
        zero = torch.zeros_like(e)
        e, t = torch.where(one, zero, e), torch.where(one, zero, t)
        checks = (*checks, (SINGLE_TOKEN_PREMISE, (~one | (positive <= 1)).all()))
        also = (TV_SINGLE_TOKEN_METER,)
    return _Forms(e, t, gamma, alpha, one, _basis(c, checks, also))


def _tanh_max(cc: torch.Tensor) -> torch.Tensor:
    th = torch.tanh(cc.amax(dim=-1))
    tm = tanh_margin()
    return outward(th, gamma=tm.gamma, alpha=tm.alpha, exact=(th == 0) | (th >= 1.0))


def tv_tanh_max_batch(c: LogitBound[torch.Tensor] | torch.Tensor
                      ) -> tuple[torch.Tensor, TVBasis]:
    """``TV <= tanh(max_t c_t)`` for every row, without the attention weights.

    The torch twin of :func:`witcert_calculus.meters.tv_forms.tv_tanh_max` (Lean
    ``WitCert.Analytic.softmax_tv_tanh_sound``: the logit error's oscillation is at most
    ``2 max c``). Looser than the meter of :func:`tv_bounds_batch`, and much cheaper: it
    needs neither the keys nor ``p_tilde``. Tokens outside a row's support may carry
    ``c = 0`` (they never raise the maximum).

    Args:
        c: ``[..., S]`` nonnegative logit bounds, as for :func:`tv_bounds_batch`.

    Returns:
        ``([...] float64 bounds, basis)``; the premise ``c >= 0`` is computed on the device
        and read when ``basis.evidence(...)`` builds a reading's evidence.

    Raises:
        ForgedBoundError: a ``LogitBound`` that no establishing function produced.

    Example:
        >>> th, _ = tv_tanh_max_batch(torch.tensor([[0.1, 0.3]], dtype=torch.float64))
        >>> round(float(th[0]), 6)
        0.291313
    """
    if isinstance(c, LogitBound) and not is_established(c):
        raise ForgedBoundError("LogitBound", ESTABLISHERS)
    cc = (c.values if isinstance(c, LogitBound) else c).to(_F64)
    checks = ((_C_PREMISE, (cc >= 0).all()),)
    return _tanh_max(cc), _basis(c, checks)
