"""Torch versions of the Tier-A WitCert meter: band witnesses, logit bound, TV forms.

These evaluate the formulas of :mod:`witcert_calculus.witness` and
:mod:`witcert_calculus.tv_forms` on batched tensors (any leading shape), with the same
bands, the same expressions and the same outward-rounding margins
(:mod:`witcert_calculus.rounding`), so that an adapter can meter every (layer, head, step)
cell of a live model without a host sync per cell. They are the reference for future
Triton kernels; the test suite checks them against the numpy versions.

Layouts. Rotary embeddings rotate coordinate *pairs*; the pairing is a
:class:`witcert_calculus.witness.RopeLayout` (``HALF_SPLIT`` for Hugging Face's
``rotate_half``, ``INTERLEAVED`` for the original layout). A band is a contiguous run of
pair indices (:func:`witcert_calculus.witness.band_channels`) and always holds both
coordinates of its pairs, so the band norm of a rotated vector equals that of the
unrotated one (band unitarity).

Main declarations
-----------------
- :func:`band_norms`: per-band l2 norms, rounded outward (witnesses of residuals, band
  norms of queries).
- :func:`logit_bound`: ``c_t = scale * sum_b ||q_b|| * w_{t,b}`` (Cauchy-Schwarz per band).
- :func:`tv_bounds_batch`: every TV form as a :class:`witcert_calculus.tv_forms.TVBatch`.
- :func:`l2_norm`: the plain Euclidean norm (for reports, not a bound).
- :func:`round_up_f32`: sound storage of a nonnegative float64 bound in float32.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

from witcert_calculus.errors import InvalidValueError
from witcert_calculus.rounding import TINY, band_norm_margin, logit_margin, tanh_margin, \
    tv_margin
from witcert_calculus.tv_forms import TVBatch
from witcert_calculus.validation import positive_int, real
from witcert_calculus.witness import RopeLayout, band_channels
from witcert_kernels.rounding import outward

__all__ = [
    "band_norms",
    "l2_norm",
    "logit_bound",
    "round_up_f32",
    "tv_bounds_batch",
]

_F64 = torch.float64


@lru_cache(maxsize=64)
def _band_layout(head_dim: int, bands: int, layout: RopeLayout, device: torch.device
                 ) -> tuple[torch.Tensor, tuple[int, ...]]:
    """Channel permutation that makes every band contiguous, and the band sizes."""
    channels = band_channels(head_dim, bands=bands, layout=layout)
    perm = torch.as_tensor(np.concatenate(channels), dtype=torch.int64, device=device)
    return perm, tuple(int(c.size) for c in channels)


def band_norms(x: torch.Tensor, *, bands: int, layout: RopeLayout) -> torch.Tensor:
    """Per-band l2 norms over the last dimension: rigorous float64 upper bounds.

    The bands and the margins are those of :func:`witcert_calculus.witness.band_norms`: the
    norm is taken after scaling by the row maximum (no overflow, no false zero from
    underflow) and rounded outward (:func:`witcert_calculus.rounding.band_norm_margin`).

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
    perm, sizes = _band_layout(int(x.shape[-1]), positive_int("bands", bands), layout, x.device)
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
    margins = [band_norm_margin(m) for m in sizes]
    gamma = torch.tensor([m.gamma for m in margins], dtype=_F64, device=x.device)
    floor = torch.tensor([m.alpha for m in margins], dtype=_F64, device=x.device)
    return outward(torch.sqrt(band_sq) * amax, gamma=gamma, alpha=floor * amax + TINY,
                   exact=band_max == 0)


def l2_norm(x: torch.Tensor) -> torch.Tensor:
    """Euclidean norm over the last dimension, rounded to nearest (a report, not a bound).

    Example:
        >>> l2_norm(torch.tensor([3.0, 4.0])).item()
        5.0
    """
    # torch.linalg's stubs are partially unknown to pyright; the sum of squares is typed.
    return torch.sqrt((x * x).sum(dim=-1))


def round_up_f32(x: torch.Tensor) -> torch.Tensor:
    """Store a nonnegative float64 tensor in float32, rounding every entry upward.

    A witness is an upper bound; rounding it to nearest could lower it, so the
    float32 copy is moved one step toward +inf wherever the cast went down (the storage
    rule of :mod:`witcert_calculus.rounding`).

    Example:
        >>> x = torch.tensor([0.1], dtype=torch.float64)
        >>> bool(round_up_f32(x).double() >= x)
        True
    """
    y = x.to(torch.float32)
    low = y.to(_F64) < x
    out: torch.Tensor = torch.where(low, torch.nextafter(y, torch.full_like(y, float("inf"))), y)
    return out


def logit_bound(q_bands: torch.Tensor, witness: torch.Tensor, *, scale: float) -> torch.Tensor:
    """Per-token logit error bound ``c_t = scale * sum_b ||q_b|| * w_{t,b}``, rounded outward.

    The formula and margins of :func:`witcert_calculus.witness.logit_bound`
    (:func:`witcert_calculus.rounding.logit_margin`); an overflowed witness that meets an
    exactly zero query band contributes 0, as its exact product does.

    Args:
        q_bands: ``[..., B]`` band norms of the query (from :func:`band_norms`).
        witness: ``[..., S, B]`` band witnesses of the key residuals (leading dimensions
            broadcast against those of ``q_bands``).
        scale: the attention's softmax scale (positive, finite).

    Returns:
        ``[..., S]`` float64 bounds ``c_t >= |eps_t|``.

    Raises:
        InvalidValueError: ``scale`` not positive and finite.

    Example:
        >>> c = logit_bound(torch.tensor([2.0]), torch.tensor([[0.5]]), scale=0.5)
        >>> 0.5 <= c.item() < 0.5 + 1e-15
        True
    """
    sc = real("scale", scale, lo=0.0, lo_open=True)
    qb = q_bands.to(_F64).unsqueeze(-2)
    w = witness.to(_F64)
    prod = qb * w
    prod = torch.where(torch.isnan(prod), 0.0, prod)  # inf * 0: the exact product is 0
    margin = logit_margin(int(w.shape[-1]), scale=sc)
    exact = (w == 0).all(dim=-1) | (qb == 0).all(dim=-1)
    return outward(prod.sum(dim=-1) * sc, gamma=margin.gamma, alpha=margin.alpha, exact=exact)


# --------------------------------------------------------------------------- TV forms
# Line by line the log-domain cores of witcert_calculus.tv_forms, without host syncs:
# both branches are computed and selected per row.

def _lse(logs: torch.Tensor) -> torch.Tensor:
    m = logs.amax(dim=-1)
    finite_m = torch.where(torch.isfinite(m), m, 0.0)
    body = finite_m + torch.log(torch.exp(logs - finite_m.unsqueeze(-1)).sum(dim=-1))
    return torch.where(torch.isinf(m), m, body)


def _log_p(p: torch.Tensor) -> torch.Tensor:
    return torch.where(p > 0, torch.log(torch.where(p > 0, p, 1.0)), float("-inf"))


def _log_a_plus(p: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    b = torch.where(p > 0, p * torch.expm1(c), 0.0).sum(dim=-1)
    logs = torch.where(p > 0, _log_p(p) + c, float("-inf"))
    return torch.where(torch.isfinite(b), torch.log1p(b), _lse(logs))


def _log_a_minus(p: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    b = torch.where(p > 0, p * torch.expm1(-c), 0.0).sum(dim=-1)
    logs = torch.where(p > 0, _log_p(p) - c, float("-inf"))
    return torch.where(b > -0.5, torch.log1p(b), _lse(logs))


def _eform_raw(log_a: torch.Tensor) -> torch.Tensor:
    b = torch.expm1(log_a)
    return 0.5 * b * (b + 2.0)


def _retention_raw(p: torch.Tensor, c: torch.Tensor, log_a: torch.Tensor,
                   log_am: torch.Tensor) -> torch.Tensor:
    la = log_a.unsqueeze(-1)
    lm = log_am.unsqueeze(-1)
    one_sided = torch.expm1(la + c)
    up = torch.expm1(c - lm)
    down = -torch.expm1(-c - la)
    per = torch.minimum(one_sided, torch.maximum(up, down))
    return 0.5 * torch.where(p > 0, p * per, 0.0).sum(dim=-1)


def tv_bounds_batch(p_tilde: torch.Tensor, c: torch.Tensor, *,
                    check: bool = True) -> TVBatch[torch.Tensor]:
    """Every Tier-A bound on ``TV(p, p_tilde)`` from per-token logit bounds, in the log domain.

    The torch version of :func:`witcert_calculus.tv_forms.tv_bounds_batch`: with
    ``A = sum_t p~_t e^{c_t}`` and ``A- = sum_t p~_t e^{-c_t}``, the e-form
    ``(A^2 - 1) / 2``, the two-sided form ``sinh(log A - log A-)``, the retention form,
    the meter ``min`` of the first two and ``tanh(max c)``, each rounded outward with the
    same margins. Nothing is clamped: an overflow yields ``inf`` (saturation).

    Args:
        p_tilde: ``[..., S]`` compressed attention (rows summing to 1; renormalised here
            in float64 so float32 rounding of the row sum does not bias the bound).
        c: ``[..., S]`` nonnegative logit bounds (``inf`` allowed).
        check: validate the inputs here (two host synchronisations). A caller in a hot
            loop passes ``False`` and validates the outputs once per run instead (a NaN or
            negative input yields a NaN or negative bound, which the acceptance gate's
            magnitude stage rejects).

    Returns:
        A :class:`~witcert_calculus.tv_forms.TVBatch` of ``[...]`` float64 tensors.

    Raises:
        InvalidValueError: negative or NaN entries in ``p_tilde`` or ``c``.

    Example:
        >>> b = tv_bounds_batch(torch.tensor([0.5, 0.5]), torch.tensor([0.0, 0.0]))
        >>> float(b.meter)
        0.0
    """
    p = p_tilde.to(_F64)
    cc = c.to(_F64)
    if check and (bool(torch.isnan(p).any()) or bool((p < 0).any())):
        raise InvalidValueError("p_tilde", "tensor", "must be nonnegative and not NaN")
    if check and (bool(torch.isnan(cc).any()) or bool((cc < 0).any())):
        raise InvalidValueError("c", "tensor", "must be nonnegative and not NaN")
    p = p / p.sum(dim=-1, keepdim=True)
    la = _log_a_plus(p, cc)
    lm = _log_a_minus(p, cc)
    margin = tv_margin(int(p.shape[-1]))
    cmax = torch.where(torch.isfinite(cc), cc, 0.0).amax(dim=-1)
    gamma = margin.gamma * (1.0 + (la.abs() + lm.abs() + cmax))
    exact = cmax == 0  # c = 0 everywhere: A = A- = 1 exactly and the exact bound 0
    e = outward(_eform_raw(la), gamma=gamma, alpha=margin.alpha, exact=exact)
    t = outward(torch.sinh(la - lm), gamma=gamma, alpha=margin.alpha, exact=exact)
    r = torch.minimum(outward(_retention_raw(p, cc, la, lm), gamma=gamma, alpha=margin.alpha,
                              exact=exact), e)
    th = torch.tanh(cc.amax(dim=-1))
    tm = tanh_margin()
    th = outward(th, gamma=tm.gamma, alpha=tm.alpha, exact=(th == 0) | (th >= 1.0))
    return TVBatch(eform=e, two_sided=t, retention=r, meter=torch.minimum(e, t), tanh_max=th,
                   log_a=la, log_a_minus=lm)
