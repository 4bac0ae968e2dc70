"""Page-in planning: which blocks to replace by exact values to bring the e-form under a target.

With block-constant bounds ``u_j`` and compressed masses ``mass_j``, replacing block
``j`` by exact values (``u_j -> 0``) lowers ``A = sum_j mass_j e^{u_j}`` by exactly
``mass_j (e^{u_j} - 1)`` (Lean ``WitCert.Meters.page_in_decrease``);
:func:`page_in_order` returns the fewest blocks that bring the e-form
``(A^2 - 1) / 2`` under a threshold. The identity concerns ``A`` evaluated at the
current ``p_tilde``; after the page-in the meter is recomputed on the new attention.

Main declarations:

- :func:`block_summary`: per-block mass and block-constant bound.
- :func:`page_in_order`, :class:`PageInPlan`: the plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import final

import numpy as np
from numpy.typing import ArrayLike

from witcert_calculus.meters.tv_forms import tv_eform
from witcert_calculus.numerics.validation import F64, positive_int, real, weights_and_bounds

__all__ = ["PageInPlan", "block_summary", "page_in_order"]


@final
@dataclass(frozen=True, slots=True)
class PageInPlan:
    """Which blocks to replace by exact values, in order.

    Attributes:
        order: block indices, largest decrease of ``A`` first; the shortest prefix
            that brings the e-form under the threshold.
        eform_before: the e-form bound (raw, :func:`~witcert_calculus.meters.tv_forms.tv_eform`
            of the block summary) before any page-in.
        eform_after: the same after paging in ``order`` (those blocks' bounds set to 0).
        log_a_before, log_a_after: ``log A`` before and after.
        threshold: the target.
    """

    order: tuple[int, ...]
    eform_before: float
    eform_after: float
    log_a_before: float
    log_a_after: float
    threshold: float


def block_summary(p_tilde: ArrayLike, c: ArrayLike, *, block_size: int) -> tuple[F64, F64]:
    """Per-block compressed mass and block-constant bound ``u_j = max_{t in j} c_t``.

    Blocks are consecutive runs of ``block_size`` tokens (the last may be shorter).

    Args:
        p_tilde: compressed attention, shape ``(S,)``.
        c: per-token logit error bounds ``>= 0`` (``inf`` allowed), shape ``(S,)``.
        block_size: tokens per block, >= 1.

    Returns:
        ``(mass, u)``, one entry per block.

    Raises:
        InvalidValueError: on invalid attention, bounds or block size.

    Example:
        >>> m, u = block_summary(np.full(4, 0.25), np.array([0.0, 0.1, 0.3, 0.2]), block_size=2)
        >>> (m.tolist(), u.tolist())
        ([0.5, 0.5], [0.1, 0.3])
    """
    p, cc = weights_and_bounds(p_tilde, c, ndim=1)
    bs = positive_int("block_size", block_size)
    starts = np.arange(0, p.size, min(bs, p.size))  # a block longer than S is one block
    mass: F64 = np.add.reduceat(p, starts)
    u: F64 = np.maximum.reduceat(cc, starts)
    return mass, u


def page_in_order(block_mass: ArrayLike, block_u: ArrayLike, *, threshold: float) -> PageInPlan:
    """The fewest blocks whose exact page-in brings the e-form ``(A^2 - 1)/2`` under ``threshold``.

    With ``A = sum_j mass_j e^{u_j}``, paging in block ``j`` (``u_j -> 0``) lowers
    ``A`` by exactly ``mass_j (e^{u_j} - 1)`` (Lean ``WitCert.Meters.page_in_decrease``).
    Decreases are independent and add, so taking blocks by decreasing decrease
    reaches the target with the fewest blocks. Evaluated in the log domain; the
    reported e-forms are the meter's (:func:`~witcert_calculus.meters.tv_forms.tv_eform`).

    Args:
        block_mass: compressed attention mass of each block (sums to 1).
        block_u: block-constant logit error bounds ``u_j >= 0`` (``inf`` allowed).
        threshold: target for the e-form, in ``[0, 1)``.

    Returns:
        A :class:`PageInPlan` (empty ``order`` when already under the threshold).

    Raises:
        InvalidValueError: on invalid masses, bounds or threshold.

    Example:
        >>> page_in_order(np.array([0.5, 0.3, 0.2]), np.array([0.01, 1.0, 0.5]),
        ...               threshold=0.05).order
        (1, 2)
    """
    mass, u = weights_and_bounds(block_mass, block_u, ndim=1)
    tau = real("threshold", threshold, lo=0.0, hi=1.0, hi_open=True)
    target = 0.5 * math.log1p(2.0 * tau)  # e-form <= tau  <=>  log A <= log sqrt(1 + 2 tau)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        log_mass = np.where(mass > 0, np.log(np.where(mass > 0, mass, 1.0)), -np.inf)
        # log(mass (e^u - 1)) = log mass + u + log(1 - e^-u), finite for finite u > 0
        live = (u > 0) & (mass > 0)
        log_dec = np.where(live, log_mass + u + np.log(-np.expm1(-u)), -np.inf)
        dec = np.where(live, mass * np.expm1(u), 0.0)
    order = np.lexsort((np.arange(mass.size), -log_dec))  # largest decrease first, stable
    # After paging in the first k blocks of `order`, A_k - 1 = sum_{rest} mass (e^u - 1):
    # a suffix sum of nonnegative terms (accurate); the log domain takes over on overflow.
    dec_sorted = dec[order]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        tail = np.concatenate([np.cumsum(dec_sorted[::-1])[::-1], [0.0]])
        lu = np.where(mass > 0, log_mass + u, -np.inf)[order]
        rest = np.concatenate([np.logaddexp.accumulate(lu[::-1])[::-1], [-np.inf]])
        done = np.log(np.concatenate([[0.0], np.cumsum(mass[order])]))
        log_a_k = np.where(np.isfinite(tail), np.log1p(tail), np.logaddexp(rest, done))
    log_a_k[-1] = 0.0  # every block exact: A = sum mass = 1
    k = int(np.nonzero(log_a_k <= target)[0][0])
    chosen = order[:k]
    u_after = u.copy()
    u_after[chosen] = 0.0
    return PageInPlan(order=tuple(int(i) for i in chosen),
                      eform_before=tv_eform(mass, u).raw, eform_after=tv_eform(mass, u_after).raw,
                      log_a_before=float(log_a_k[0]), log_a_after=float(log_a_k[k]),
                      threshold=tau)
