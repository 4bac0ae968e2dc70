"""Exact evaluations with ``fractions.Fraction`` (and sympy for square roots).

The TV forms are algebraic in ``r_t = e^{c_t}``: given rational ``r_t >= 1`` they
are rational, so a test can pass ``c_t = log r_t`` to the package and compare.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

import sympy


def a_plus(p: Sequence[Fraction], r: Sequence[Fraction]) -> Fraction:
    return sum((pi * ri for pi, ri in zip(p, r)), Fraction(0))


def a_minus(p: Sequence[Fraction], r: Sequence[Fraction]) -> Fraction:
    return sum((pi / ri for pi, ri in zip(p, r)), Fraction(0))


def eform(p: Sequence[Fraction], r: Sequence[Fraction]) -> Fraction:
    a = a_plus(p, r)
    return (a * a - 1) / 2


def two_sided(p: Sequence[Fraction], r: Sequence[Fraction]) -> Fraction:
    a, am = a_plus(p, r), a_minus(p, r)
    return (a / am - am / a) / 2


def retention(p: Sequence[Fraction], r: Sequence[Fraction]) -> Fraction:
    a, am = a_plus(p, r), a_minus(p, r)
    return sum((pi * min(a * ri - 1, max(ri / am - 1, 1 - 1 / (ri * a)))
                for pi, ri in zip(p, r)), Fraction(0)) / 2


def true_tv(p: Sequence[Fraction], w: Sequence[Fraction]) -> Fraction:
    """TV between p and the distribution proportional to ``p_t w_t`` (``w_t = e^{-eps_t}``)."""
    z = sum((pi * wi for pi, wi in zip(p, w)), Fraction(0))
    return sum((abs(pi * wi / z - pi) for pi, wi in zip(p, w)), Fraction(0)) / 2


def page_in_a(mass: Sequence[Fraction], r: Sequence[Fraction], paged: set[int]) -> Fraction:
    """A after replacing the blocks in ``paged`` by exact values (r -> 1 there)."""
    return sum((m if j in paged else m * rj for j, (m, rj) in enumerate(zip(mass, r))),
               Fraction(0))


def sentinel_rounds(corrupted: int, slots: int, draws: int, delta: Fraction) -> int:
    """Smallest n with ((M - B)/M)^(r n) <= delta, by exact search."""
    q = Fraction(slots - corrupted, slots) ** draws
    n, qn = 1, q
    while qn > delta:
        n += 1
        qn *= q
    return n


def norm(xs: Sequence[Fraction]) -> sympy.Expr:
    return sympy.sqrt(sum((sympy.Rational(x.numerator, x.denominator) ** 2 for x in xs),
                          sympy.Integer(0)))
