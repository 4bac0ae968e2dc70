"""The output error bound: from attention total variation to the error of the attention output.

With ``rho_t >= ||v_t - v_hat_t||`` the value reconstruction error of token ``t``,
``||y - y_hat|| <= 2 TV(p, p_tilde) max_t ||v_t|| + sum_t p_tilde_t rho_t``
(Lean ``WitCert.Semantic.output_error_contract_at``, a theorem about the semantic contract
``outputError`` of slope ``2 M`` on probability vectors, from
``WitCert.Meters.output_error_bound_vector_sound``; scalar case
``WitCert.Meters.output_error_bound_sound``), as a contract from ``AttentionTV`` to
``AttentionOutputL2``, both at the consumption site. The float sum is rounded outward
by the rule of :mod:`witcert_calculus.numerics.rounding`.

``value_norm_max`` and ``rho`` are the caller's numbers about values this module never
sees: the contract carries them as the assumptions :data:`VALUE_NORM_ASSUMPTION` and
:data:`RHO_ASSUMPTION`, so it is at most PARTIALLY_CERTIFIED; that ``p_tilde`` is a
probability vector and the numbers are nonnegative is computed.

Main declarations:

- :func:`output_error_contract`: the contract.
- :func:`output_error_bound`: the bound for one TV bound.
- :data:`VALUE_NORM_ASSUMPTION`, :data:`RHO_ASSUMPTION`: what the contract assumes.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Final

import numpy as np
from numpy.typing import ArrayLike

from witcert_calculus.contracts import Contract
from witcert_calculus.schemas import Claim, Schema, _builtin  # pyright: ignore[reportPrivateUsage]
from witcert_calculus.errors import InvalidValueError
from witcert_calculus.lean.theorems import OUTPUT_ERROR_CONTRACT_AT
from witcert_calculus.metrics import AtConsume, AttentionOutputL2, AttentionTV
from witcert_calculus.numerics.rounding import outward, sum_margin
from witcert_calculus.tiers import Assumption
from witcert_calculus.numerics.validation import F64, distribution, float_up, is_distribution, nonneg_array, \
    real

__all__ = ["RHO_ASSUMPTION", "VALUE_NORM_ASSUMPTION", "output_error_bound",
           "output_error_contract"]

#: ``value_norm_max`` bounds the exact values: the caller's number.
VALUE_NORM_ASSUMPTION: Final = Assumption(
    "value_norm_max >= max_t ||v_t|| (the caller's number)",
    reason="the exact values v_t are not passed to the bound")

#: ``rho`` bounds the value reconstruction errors: the caller's array.
RHO_ASSUMPTION: Final = Assumption(
    "rho_t >= ||v_t - v_hat_t|| for every token t (the caller's array)",
    reason="the exact values v_t are not passed to the bound")


def _sum_upper(p: F64, r: F64) -> float:
    """An upper bound of the exact ``sum_t p_t r_t`` (products rounded to nearest, exact sum)."""
    margin = sum_margin(p.size)
    total = np.asarray(math.fsum((p * r).tolist()))
    exact = np.asarray(not bool(((p > 0) & (r > 0)).any()))
    return float(outward(total, gamma=margin.gamma, alpha=margin.alpha, exact=exact))


def _output_claim(value_norm_max: float, p_tilde: F64, rho: F64) -> Claim:
    return Claim(a=2 * Fraction(value_norm_max), b=_sum_upper(p_tilde, rho))


def _norm_nonnegative(value_norm_max: float, p_tilde: F64, rho: F64) -> bool:
    return value_norm_max >= 0


def _rho_nonnegative(value_norm_max: float, p_tilde: F64, rho: F64) -> bool:
    return bool((rho >= 0).all())


def _p_distribution(value_norm_max: float, p_tilde: F64, rho: F64) -> bool:
    return is_distribution(p_tilde)


#: The schema of :data:`~witcert_calculus.lean.theorems.OUTPUT_ERROR_CONTRACT_AT`.
OUTPUT_ERROR: Final = _builtin(Schema(
    OUTPUT_ERROR_CONTRACT_AT, AttentionTV, AttentionOutputL2,
    ("value_norm_max", "p_tilde", "rho"), _output_claim,
    premises=(("value_norm_max >= 0", _norm_nonnegative),
              ("rho_t >= 0 for every token t", _rho_nonnegative),
              ("p_tilde is a probability vector (renormalized)", _p_distribution)),
    states=(".a * Analytic.tv p.val q.val L + Analytic.lsum (fun t => q.val t * ρ t) L",),
    name="output_error", assumptions=(VALUE_NORM_ASSUMPTION, RHO_ASSUMPTION)))


def output_error_contract(*, value_norm_max: float, p_tilde: ArrayLike, rho: ArrayLike
                          ) -> Contract[AttentionTV[AtConsume], AttentionOutputL2[AtConsume]]:
    """Contract ``||y - y_hat|| <= 2 max_t ||v_t|| * TV + sum_t p_tilde_t rho_t``.

    Lean: ``WitCert.Semantic.output_error_contract_at``. Input metric ``AttentionTV``,
    output ``AttentionOutputL2``, both at the consumption site.

    Args:
        value_norm_max: ``max_t ||v_t||`` of the exact values (>= 0).
        p_tilde: compressed attention, shape ``(S,)``.
        rho: value reconstruction errors ``rho_t >= ||v_t - v_hat_t||``, shape ``(S,)``.

    Returns:
        The contract; ``b`` is rounded outward from the float sum. Its evidence is restricted
        by :data:`VALUE_NORM_ASSUMPTION` and :data:`RHO_ASSUMPTION` (PARTIALLY_CERTIFIED).

    Raises:
        InvalidValueError: on NaN or negative inputs, or mismatched shapes.

    Example:
        >>> k = output_error_contract(value_norm_max=2.0, p_tilde=np.array([0.5, 0.5]),
        ...                           rho=np.array([0.0, 0.2]))
        >>> (float(k.a), round(float(k.b), 12), k.tier.name)
        (4.0, 0.1, 'PARTIALLY_CERTIFIED')
    """
    vmax = real("value_norm_max", value_norm_max, lo=0.0)
    p = distribution("p_tilde", p_tilde)
    r = nonneg_array("rho", rho, ndim=1)
    if r.shape != p.shape:
        raise InvalidValueError("rho", f"array of shape {r.shape}",
                                f"must have the shape of p_tilde {p.shape}")
    return OUTPUT_ERROR.issue(AtConsume, value_norm_max=vmax, p_tilde=p, rho=r)


def output_error_bound(tv: float, *, value_norm_max: float, p_tilde: ArrayLike,
                       rho: ArrayLike) -> float:
    """Output error bound ``2 * min(1, tv) * max_t ||v_t|| + sum_t p_tilde_t rho_t``.

    A TV bound above 1 is replaced by 1 (total variation never exceeds 1, so this
    is the metric's range, not a clamp of the certificate). Rounded upward.

    Args:
        tv: any upper bound of ``TV(p, p_tilde)`` (e.g. ``tv_meter(...).raw``), >= 0.
        value_norm_max, p_tilde, rho: as :func:`output_error_contract`.

    Returns:
        The bound on ``||y - y_hat||`` as a float.

    Raises:
        InvalidValueError: on NaN or negative inputs.

    Example:
        >>> round(output_error_bound(0.1, value_norm_max=2.0, p_tilde=np.array([0.5, 0.5]),
        ...                          rho=np.array([0.0, 0.2])), 12)
        0.5
    """
    t = real("tv", tv, lo=0.0, allow_inf=True)
    k = output_error_contract(value_norm_max=value_norm_max, p_tilde=p_tilde, rho=rho)
    return float_up(k.a * Fraction(min(1.0, t)) + k.b)
