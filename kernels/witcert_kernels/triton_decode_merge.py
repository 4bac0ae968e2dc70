"""The split-KV merge of a fused decode step: the meter's outward-rounded bounds per tier.

The kernel (:mod:`witcert_kernels.triton_decode_kernel`) leaves, per split, three online
log-sum-exps (of ``s``, ``s + c`` and ``s - c``); they merge under log-sum-exp weights exactly
as the output does, and the e-form and two-sided TV bounds follow from ``log A`` and
``log A-`` (:func:`witcert_kernels.meter.forms_from_logs`, the twin's formulas and margins).

Margin analysis (why the reported ``log A`` is an upper bound and ``log A-`` a lower bound of
their exact values for the kernel's logits ``s`` and the bounds ``c``):

- ``c_t`` is rounded outward with :func:`witcert_calculus.numerics.rounding.logit_margin` (a tree
  sum of ``bands`` products has no more rounding steps than the recursive sum it covers), so it
  is at least its exact formula.
- Each accumulated sum ``sum_t e^{y_t - M}`` (``y`` one of ``s``, ``s + c``, ``s - c``) is a
  sum of nonnegative terms; the largest term is ``e^0 = 1`` exactly, so the sum is at least
  1. Each term passes through at most ``2 + 3 n`` float64 operations (the exponent's
  subtraction, ``exp`` within one ulp, one rescaling ``exp`` and product per later block of
  its split, and the split merge), ``n`` the number of blocks; the sum itself adds at most one
  rounding per token (a tree within a block, a recursive sum across blocks). The forming of
  ``y = s + c`` rounds the exponent by at most ``u |y|``, which changes a term by a factor
  within ``e^{2 u |y|}``. So the computed sum is within a factor ``(1 + gamma)`` of the exact
  one, ``gamma = (2 S + 3 n + 16) u + 2 u max|y|``, and each of the logarithms and the
  differences adds ``u`` times its magnitude. The reported ``log A`` adds
  ``2 gamma + 4 u (|LSE(s)| + |LSE(s + c)| + |LSE(s - c)| + 1)`` and is rounded up
  (``log A-`` subtracts the same and is rounded down): with ``max|y| <= max|s| + max c`` and
  ``n <= S``, this is what :func:`_log_margin` computes.
- An infinite ``c_t`` makes ``log A`` infinite (saturation); a NaN bound or logit makes it
  NaN (the gate rejects it; Triton's ``max`` ignores NaN, so the kernel flags it on its
  own): never a finite number. ``c = 0`` everywhere gives ``log A = log A- = 0``
  exactly (identical arithmetic on identical exponents) and the exact bound 0. A row with one
  token reports 0 (Lean ``WitCert.Meters.tv_single_token``).
- What the theorems take as given and the code does not bound: ``p~`` is the exact softmax of
  the kernel's float32 logits ``s``, not of the exact compressed logits
  (:data:`witcert_calculus.lean.modelling.SOFTMAX_AS_COMPUTED`).
- The kernel's float64 constants (the scale in ``c_t`` and ``u_t``, every margin) reach it in
  a float64 tensor: Triton passes a Python float as float32, which would round ``1 + gamma``
  to 1 and flush the subnormal absolute margins to 0.

Main declarations:

- :class:`TierMeter`: one tier's bounds per request and query head.
- :func:`tier_a_meter`, :func:`tier_b_meter`: a launch's split partials merged into a
  tier's :class:`TierMeter` with its basis (computed premises, the theorems).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Final, final

import torch

from witcert_calculus.lean.theorems import TV_SINGLE_TOKEN_METER
from witcert_calculus.meters.tv_forms import TVBasis, _issue_basis  # pyright: ignore[reportPrivateUsage]
from witcert_calculus.meters.witness import _WITNESS_PREMISE  # pyright: ignore[reportPrivateUsage]
from witcert_calculus.meters.witness import _tier_a_evidence  # pyright: ignore[reportPrivateUsage]
from witcert_calculus.numerics.rounding import TINY
from witcert_calculus.numerics.validation import UNIT_ROUNDOFF
from witcert_calculus.tiers import Assumption
from witcert_kernels.dither import _tier_b_query_evidence  # pyright: ignore[reportPrivateUsage]
from witcert_kernels.meter import _tanh_max  # pyright: ignore[reportPrivateUsage]
from witcert_kernels.meter import forms_from_logs
from witcert_kernels.triton_decode_launch import TierBLaunch

__all__ = ["TierMeter", "tier_a_meter", "tier_b_meter"]

_NEG = float("-inf")


def _merge_lse(mx: torch.Tensor, acc: torch.Tensor) -> torch.Tensor:
    """``log sum_i acc_i e^{mx_i}`` over the last (split) axis; empty splits are ``-inf``."""
    logs = torch.where(acc > 0, mx + torch.log(torch.where(acc > 0, acc, 1.0)), _NEG)
    return torch.logsumexp(logs, dim=-1)


def _log_margin(lse: tuple[torch.Tensor, torch.Tensor, torch.Tensor], s_abs: torch.Tensor,
                c_max: torch.Tensor, *, tokens: int) -> torch.Tensor:
    """The slack added to ``log A`` (and taken from ``log A-``): see the module's analysis."""
    u = UNIT_ROUNDOFF
    gamma = (5 * tokens + 64) * u + 2 * u * (s_abs + c_max)
    size = sum((torch.where(torch.isfinite(x), x.abs(), 0.0) for x in lse),
               torch.zeros_like(s_abs))
    return 2 * gamma + 4 * u * (size + 1.0) + TINY


@final
@dataclass(frozen=True, slots=True, eq=False)
class TierMeter:
    """One tier's meter of a fused decode step, per request and query head (``[B, H]``).

    Attributes:
        log_a: an upper bound of ``log A`` (``inf``: an infinite bound ``c_t``).
        log_a_minus: a lower bound of ``log A-``.
        eform: ``TV <= (A^2 - 1) / 2``, rounded outward (``inf`` on overflow).
        two_sided: ``TV <= sinh(log A - log A-)``, rounded outward.
        meter: the smaller of the two (``min(1, meter)`` is the TV bound).
        tanh_max: the comparison shape ``tanh(max_t c_t)``.
        bound_max: the largest finite per-token bound ``max_t c_t`` read.
        basis: what the bounds rest on (:class:`~witcert_calculus.meters.tv_forms.TVBasis`); its
            premises on tensor contents are device tensors, read only when
            ``basis.evidence(...)`` builds a reading's evidence.
    """

    log_a: torch.Tensor
    log_a_minus: torch.Tensor
    eform: torch.Tensor
    two_sided: torch.Tensor
    meter: torch.Tensor
    tanh_max: torch.Tensor
    bound_max: torch.Tensor
    basis: TVBasis


def _forms(meter: torch.Tensor, at: tuple[int, int, int, int, int, int, int], *, tokens: int,
           seq_lens: torch.Tensor
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                      torch.Tensor, torch.Tensor]:
    """One meter's merge: the log bounds, the e-form, the two-sided form, ``tanh(max c)``,
    ``max c`` and the NaN flag, from the split partials at indices ``at`` (``mx+, a+, mx-,
    a-, c_max, c_inf, nan``) and the logits' log-sum-exp at 0, 1 and ``max|s|`` at 6."""
    lse0 = _merge_lse(meter[..., 0], meter[..., 1])
    lse1 = _merge_lse(meter[..., at[0]], meter[..., at[1]])
    lse2 = _merge_lse(meter[..., at[2]], meter[..., at[3]])
    s_abs = meter[..., 6].amax(dim=-1)
    c_max = meter[..., at[4]].amax(dim=-1)
    c_inf = meter[..., at[5]].amax(dim=-1) > 0
    nan = meter[..., at[6]].amax(dim=-1) > 0
    slack = _log_margin((lse0, lse1, lse2), s_abs, c_max, tokens=tokens)
    exact = (c_max == 0) & ~c_inf
    up = torch.full_like(lse0, math.inf)
    log_a = torch.where(exact, 0.0, torch.nextafter(lse1 - lse0 + slack, up))
    log_a = torch.where(c_inf, math.inf, log_a)
    log_am = torch.where(exact, 0.0, torch.nextafter(lse2 - lse0 - slack, -up))
    log_am = torch.where(c_inf, -math.inf, log_am)
    log_a, log_am = (torch.where(nan, math.nan, x) for x in (log_a, log_am))
    e, t, _, _ = forms_from_logs(log_a, log_am, c_max, tokens=tokens, exact=exact)
    th = _tanh_max(torch.where(c_inf, math.inf, c_max).unsqueeze(-1))
    one = (seq_lens == 1).view(-1, 1).to(meter.device)
    e, t, th = (torch.where(one, torch.zeros_like(x), x) for x in (e, t, th))
    return log_a, log_am, e, t, th, c_max, nan


_AT_A: Final = (2, 3, 4, 5, 7, 8, 10)
_AT_B: Final = (11, 12, 13, 14, 15, 16, 17)


def tier_a_meter(meter: torch.Tensor, *, tokens: int, seq_lens: torch.Tensor,
                  query_bands: torch.Tensor, scale: float, bands: int
                  ) -> tuple[TierMeter, torch.Tensor]:
    log_a, log_am, e, t, th, c_max, nan = _forms(meter, _AT_A, tokens=tokens, seq_lens=seq_lens)
    w_min = meter[..., 9].amin(dim=-1)
    checks: tuple[tuple[str, object], ...] = (
        ("c_t >= |eps_t| for every token t: computed in the kernel from the stored witnesses and "
         "the query's band norms, which are computed here (rounded outward) and not NaN",
         (query_bands >= 0).all()),
        (_WITNESS_PREMISE, (w_min >= 0).all()),
        ("no witness, logit or bound read by the kernel is NaN", ~nan.any()))
    basis = _issue_basis(checks=checks, logit=_tier_a_evidence(scale=scale, bands=bands,
                                                            query_bands=bands, witness_ok=None),
                    delta=Fraction(0), also=(TV_SINGLE_TOKEN_METER,))
    return TierMeter(log_a=log_a, log_a_minus=log_am, eform=e, two_sided=t,
                     meter=torch.minimum(e, t), tanh_max=th, bound_max=c_max,
                     basis=basis), w_min


def tier_b_meter(meter: torch.Tensor, *, tokens: int, seq_lens: torch.Tensor,
                  tb: TierBLaunch, assumption: Assumption) -> TierMeter:
    log_a, log_am, e, t, th, u_max, nan = _forms(meter, _AT_B, tokens=tokens, seq_lens=seq_lens)
    tq = tb.tq
    checks: list[tuple[str, object]] = [
        (f"c_t >= |eps_t| for every token t except with probability {tq.delta_loc!r} per query "
         "row: u_t computed in the kernel by the formula and margins of "
         "witcert_kernels.dither.tier_b_logit_bound from the block scales read, with its "
         "query-side sums computed here, nonnegative and not NaN",
         (tb.query >= 0).all() & (tb.row >= 0).all()),
        ("every block scale read is finite and >= 0", ~(meter[..., 18] > 0).any()),
        ("visible[i] >= 1 for every query row i", (seq_lens >= 1).all()),
        ("no block scale, cast bound, logit or bound read by the kernel is NaN", ~nan.any())]
    if tb.cast is not None or tb.in_kernel_cast:
        checks.append(("cast_t is finite and >= 0 for every token read",
                       ~(meter[..., 19] > 0).any()))
    basis = _issue_basis(checks=tuple(checks), logit=_tier_b_query_evidence(tq, (assumption,)),
                    delta=Fraction(tq.delta_loc), also=(TV_SINGLE_TOKEN_METER,))
    return TierMeter(log_a=log_a, log_a_minus=log_am, eform=e, two_sided=t,
                     meter=torch.minimum(e, t), tanh_max=th, bound_max=u_max, basis=basis)
