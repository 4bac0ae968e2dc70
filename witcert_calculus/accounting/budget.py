"""The telescoping failure-probability budget of a request.

A request's failure-probability budget ``delta_req`` is spent by its
probabilistic events: the ``i``-th (0-based) may use the allowance

    delta_i = delta_req / ((i+1)(i+2)),

and after ``n`` such events the spend is exactly ``delta_req (1 - 1/(n+1))``,
below ``delta_req`` at every length (Lean: ``WitCert.Ledger.telescope_sum_eq``,
``WitCert.Ledger.telescope_partial_lt``); deterministic events cost 0 (Lean:
``WitCert.Ledger.two_layer_budget``).

Budgets and allowances are exact :class:`~witcert_calculus.numerics.probability.Probability`
values; the telescoping formulas below take anything a
:data:`~witcert_calculus.numerics.probability.ProbabilityLike` admits.

Main declarations:

- :func:`telescoping_delta`, :func:`telescoping_spent`
- :data:`SPEND_THEOREMS`
"""

from __future__ import annotations

from fractions import Fraction

from witcert_calculus.lean.theorems import (
    RECURRENCE_PROB_BAD_LT_BUDGET,
    TELESCOPE_PARTIAL_LT,
    TELESCOPE_SUM_EQ,
    TWO_LAYER_BUDGET,
)
from witcert_calculus.numerics.probability import Probability, ProbabilityLike
from witcert_calculus.numerics.validation import nonneg_int

__all__ = [
    "SPEND_THEOREMS",
    "telescoping_delta",
    "telescoping_spent",
]

SPEND_THEOREMS: tuple[str, ...] = (RECURRENCE_PROB_BAD_LT_BUDGET, TELESCOPE_SUM_EQ,
                                   TELESCOPE_PARTIAL_LT, TWO_LAYER_BUDGET)
"""Lean theorems behind the spend rules: the semantic one first (a chain of contracts whose
``k``-th failure probability is at most the ``k``-th allowance fails with probability below the
request's budget), then the arithmetic of the allowances."""


def telescoping_delta(i: int, delta_req: ProbabilityLike) -> Fraction:
    """Allowance of the ``i``-th probabilistic event (0-based): ``delta_req / ((i+1)(i+2))``.

    The allowances sum to ``delta_req (1 - 1/(n+1))`` after ``n`` events, which
    is below ``delta_req`` at every ``n`` (Lean: ``WitCert.Ledger.telescope_sum_eq``,
    ``WitCert.Ledger.telescope_partial_lt``).

    Args:
        i: index of the probabilistic event within its account (``>= 0``).
        delta_req: the account's budget, in (0, 1) (floats are taken exactly).

    Returns:
        The exact allowance.

    Raises:
        InvalidValueError: if ``i`` is not an int ``>= 0`` or ``delta_req`` is
            outside (0, 1), NaN or infinite.

    Example:
        >>> telescoping_delta(0, Fraction(1, 100))
        Fraction(1, 200)
        >>> sum(telescoping_delta(i, "1/100") for i in range(3))
        Fraction(3, 400)
    """
    k = nonneg_int("i", i)
    return Probability.budget(delta_req).exact / ((k + 1) * (k + 2))


def telescoping_spent(n: int, delta_req: ProbabilityLike) -> Fraction:
    """Closed form of the spend after ``n`` probabilistic events: ``delta_req (1 - 1/(n+1))``.

    Lean: ``WitCert.Ledger.telescope_sum_eq``.

    Args:
        n: number of probabilistic events (``>= 0``).
        delta_req: the account's budget, in (0, 1).

    Returns:
        The exact spend, ``sum(telescoping_delta(i, delta_req) for i in range(n))``.

    Raises:
        InvalidValueError: if ``n`` is not an int ``>= 0`` or ``delta_req`` is
            outside (0, 1), NaN or infinite.

    Example:
        >>> telescoping_spent(3, "1/100")
        Fraction(3, 400)
    """
    k = nonneg_int("n", n)
    return Probability.budget(delta_req).exact * (1 - Fraction(1, k + 1))
