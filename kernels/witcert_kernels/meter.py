"""Torch versions of the Tier-A WitCert meter: band witnesses, logit bound, TV bound.

These mirror the numpy meters of :mod:`witcert_calculus.meters` on batched tensors
(any leading shape), so that an adapter can meter every (layer, head, step) cell of
a live model without a host sync per cell. The test suite checks them against the
numpy versions.

Layouts. Rotary embeddings rotate coordinate *pairs*. Hugging Face's
``rotate_half`` pairs ``(x[j], x[j + d/2])`` (:data:`HALF_SPLIT`); the original
interleaved layout pairs ``(x[2j], x[2j+1])`` (:data:`INTERLEAVED`). A band is a
contiguous run of pair indices and always holds both coordinates of its pairs, so
the band norm of a rotated vector equals that of the unrotated one (band unitarity).

Main declarations
-----------------
- :func:`band_norms`: per-band l2 norms (witnesses of residuals, band norms of queries).
- :func:`logit_bound`: ``c_t = scale * sum_b ||q_b|| * w_{t,b}`` (Cauchy-Schwarz per band).
- :func:`tv_bounds`: one-sided e-form, two-sided form and their minimum, in the log domain.
- :func:`round_up_f32`: sound storage of a nonnegative float64 witness in float32.
"""

from __future__ import annotations

from typing import Final, NamedTuple

import torch

from witcert_calculus.errors import InvalidValueError

__all__ = [
    "HALF_SPLIT",
    "INTERLEAVED",
    "TVBounds",
    "band_norms",
    "l2_norm",
    "logit_bound",
    "round_up_f32",
    "tv_bounds",
]

HALF_SPLIT: Final = "half_split"
INTERLEAVED: Final = "interleaved"


def _pair_view(x: torch.Tensor, layout: str) -> torch.Tensor:
    """Return ``x`` as ``[..., d/2, 2]`` with both coordinates of each rotary pair together."""
    d = x.shape[-1]
    if d % 2:
        raise InvalidValueError("head_dim", d, "must be even to hold rotary pairs")
    if layout == HALF_SPLIT:
        half = d // 2
        return torch.stack((x[..., :half], x[..., half:]), dim=-1)
    if layout == INTERLEAVED:
        return x.reshape(*x.shape[:-1], d // 2, 2)
    raise InvalidValueError("layout", layout, f"must be {HALF_SPLIT!r} or {INTERLEAVED!r}")


def band_norms(x: torch.Tensor, *, bands: int, layout: str = HALF_SPLIT) -> torch.Tensor:
    """Per-band l2 norms over the last dimension, computed in float64.

    Args:
        x: ``[..., d]`` (a key/value residual, or a query).
        bands: number of contiguous bands of rotary pairs; must divide ``d / 2``.
        layout: :data:`HALF_SPLIT` or :data:`INTERLEAVED`.

    Returns:
        ``[..., bands]`` float64 tensor.

    Raises:
        InvalidValueError: ``d`` odd, ``bands`` not dividing ``d/2``, unknown layout.

    Example:
        >>> band_norms(torch.tensor([3.0, 0.0, 4.0, 0.0]), bands=1).tolist()
        [5.0]
    """
    pairs = _pair_view(x.to(torch.float64), layout)
    npairs = pairs.shape[-2]
    if bands < 1 or npairs % bands:
        raise InvalidValueError("bands", bands, f"must be >= 1 and divide the {npairs} rotary pairs")
    grouped = pairs.reshape(*pairs.shape[:-2], bands, (npairs // bands) * 2)
    return l2_norm(grouped)


def l2_norm(x: torch.Tensor) -> torch.Tensor:
    """Euclidean norm over the last dimension (``torch.linalg.vector_norm``, typed)."""
    # torch.linalg's stubs are partially unknown to pyright; the sum of squares is typed.
    return torch.sqrt((x * x).sum(dim=-1))


def round_up_f32(x: torch.Tensor) -> torch.Tensor:
    """Store a nonnegative float64 tensor in float32, rounding every entry upward.

    A witness is an upper bound; rounding it to nearest could lower it, so the
    float32 copy is moved one step toward +inf wherever the cast went down.
    """
    y = x.to(torch.float32)
    low = y.to(torch.float64) < x
    out: torch.Tensor = torch.where(low, torch.nextafter(y, torch.full_like(y, float("inf"))), y)
    return out


def logit_bound(q_bands: torch.Tensor, w: torch.Tensor, *, scale: float) -> torch.Tensor:
    """Per-token logit error bound ``c_t = scale * sum_b ||q_b|| * w_{t,b}``.

    Args:
        q_bands: ``[..., B]`` band norms of the query.
        w: ``[..., S, B]`` band witnesses of the key residuals (leading dimensions
            broadcast against those of ``q_bands``).
        scale: the attention's softmax scale (positive, finite).

    Returns:
        ``[..., S]`` float64 bounds ``c_t >= |eps_t|``.

    Raises:
        InvalidValueError: ``scale`` not positive and finite.

    Example:
        >>> logit_bound(torch.tensor([2.0]), torch.tensor([[0.5]]), scale=0.5).tolist()
        [0.5]
    """
    if not (scale > 0 and scale < float("inf")):
        raise InvalidValueError("scale", scale, "must be positive and finite")
    qb = q_bands.to(torch.float64).unsqueeze(-2)
    return scale * (qb * w.to(torch.float64)).sum(dim=-1)


class TVBounds(NamedTuple):
    """Raw (unclamped) TV bounds; ``inf`` marks an overflow (saturation)."""

    one_sided: torch.Tensor
    two_sided: torch.Tensor
    meter: torch.Tensor


def tv_bounds(p_tilde: torch.Tensor, c: torch.Tensor, *, check: bool = True) -> TVBounds:
    """Tier-A bounds on ``TV(p, p_tilde)`` from per-token logit bounds, in the log domain.

    With ``A = sum_t p~_t e^{c_t}`` and ``A- = sum_t p~_t e^{-c_t}``:
    one-sided ``(A^2 - 1) / 2``, two-sided ``(A/A- - A-/A) / 2 = sinh(log A - log A-)``,
    meter ``min`` of both. Nothing is clamped: an overflow yields ``inf`` (saturation).

    Args:
        p_tilde: ``[..., S]`` compressed attention (rows summing to 1; renormalised here
            in float64 so float32 rounding of the row sum does not bias the bound).
        c: ``[..., S]`` nonnegative logit bounds.
        check: validate the inputs here (two host synchronisations). A caller in a hot
            loop passes ``False`` and validates the outputs once per run instead (a NaN or
            negative input yields a NaN or negative bound, which the acceptance gate's
            magnitude stage rejects).

    Returns:
        :class:`TVBounds` of ``[...]`` float64 tensors.

    Raises:
        InvalidValueError: negative or NaN entries in ``p_tilde`` or ``c``.

    Example:
        >>> b = tv_bounds(torch.tensor([0.5, 0.5]), torch.tensor([0.0, 0.0]))
        >>> float(b.meter)
        0.0
    """
    p = p_tilde.to(torch.float64)
    cc = c.to(torch.float64)
    if check and (bool(torch.isnan(p).any()) or bool((p < 0).any())):
        raise InvalidValueError("p_tilde", "tensor", "must be nonnegative and not NaN")
    if check and (bool(torch.isnan(cc).any()) or bool((cc < 0).any())):
        raise InvalidValueError("c", "tensor", "must be nonnegative and not NaN")
    p = p / p.sum(dim=-1, keepdim=True)
    logp = torch.log(p)
    log_a = torch.logsumexp(logp + cc, dim=-1)
    log_am = torch.logsumexp(logp - cc, dim=-1)
    exact_row = (cc == 0).all(dim=-1)
    one = _outward(0.5 * torch.expm1(2.0 * log_a), exact_row)
    two = _outward(torch.sinh(log_a - log_am), exact_row)
    return TVBounds(one, two, torch.minimum(one, two))


def _outward(x: torch.Tensor, exact_row: torch.Tensor) -> torch.Tensor:
    # Outward rounding of the float64 evaluation: a relative margin of 1e-12 and an absolute
    # one of 1e-15 cover the logsumexp rounding. A row with every c_t = 0 has identical
    # logits, hence TV = 0 exactly, and is reported as 0.
    up = torch.clamp_min(x, 0.0) * (1.0 + 1e-12) + 1e-15
    return torch.where(exact_row, torch.zeros_like(x), up)
