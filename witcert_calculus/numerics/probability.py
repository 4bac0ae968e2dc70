"""Exact probabilities: the one value type of a failure probability, an allowance or a budget.

A probability travels as one value type, :class:`Probability`: exact (a
``Fraction``), validated once when it is made, written to the journal as its
exact text, and turned into a float only at the edge where a float formula
needs it, by a method that names the rounding direction (:meth:`Probability.float_down`
for a failure probability handed to a bound, since a smaller delta is the safe
side there; :meth:`Probability.float_up` where a larger value is safe). The meters take
their failure probabilities in it, the ledger's budgets (:mod:`witcert_calculus.accounting.budget`)
spend it.

Main declarations:

- :class:`Probability`, :data:`ProbabilityLike`
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import TypeAlias, final

from witcert_calculus.errors import InvalidValueError
from witcert_calculus.numerics.validation import float_down, float_up, positive_int, unit_rational

__all__ = ["Probability", "ProbabilityLike"]


@final
@dataclass(frozen=True, slots=True, order=True)
class Probability:
    """An exact probability in ``[0, 1]``: a failure probability, an allowance or a budget.

    Make one with :meth:`of` (any probability) or :meth:`budget` (a request's
    budget, in the open interval ``(0, 1)``), which take ints, Fractions, floats
    (exactly: the float's binary value) and text such as ``"1/100"``, and name
    the offending value when they refuse it. The direct constructor takes a
    ``Fraction`` only.

    Attributes:
        exact: the value, as an exact ``Fraction``.

    Raises:
        InvalidValueError: if ``exact`` is not a ``Fraction`` in ``[0, 1]``.

    Example:
        >>> p = Probability.budget("1/100")
        >>> p.exact, p.to_text()
        (Fraction(1, 100), '1/100')
        >>> p.split(3).float_down() <= p.exact / 3 <= p.split(3).float_up()
        True
    """

    exact: Fraction

    def __post_init__(self) -> None:
        if not isinstance(self.exact, Fraction):
            raise InvalidValueError("probability", self.exact,
                                    "must be a Fraction (Probability.of converts other numbers)")
        if not 0 <= self.exact <= 1:
            raise InvalidValueError("probability", self.exact,
                                    "must lie in the closed interval [0, 1]")

    @classmethod
    def of(cls, value: ProbabilityLike, *, name: str = "probability") -> Probability:
        """A probability in ``[0, 1]``, converted exactly.

        Args:
            value: a :class:`Probability` (returned as is), an int, a Fraction,
                a float (taken exactly) or its exact text (``"1/100"``).
            name: what the value is, for the error message.

        Returns:
            The probability.

        Raises:
            InvalidValueError: naming ``value`` if it is not a number, NaN,
                infinite or outside ``[0, 1]``.

        Example:
            >>> Probability.of(0.5).exact
            Fraction(1, 2)
        """
        if isinstance(value, Probability):
            return value
        return cls(unit_rational(name, value, text=True))

    @classmethod
    def budget(cls, value: ProbabilityLike, *, name: str = "delta_req") -> Probability:
        """A request's budget: a probability in the open interval ``(0, 1)``.

        Args:
            value: as for :meth:`of`.
            name: what the value is, for the error message.

        Returns:
            The budget.

        Raises:
            InvalidValueError: naming ``value`` if it is not a number, NaN,
                infinite or outside ``(0, 1)``.

        Example:
            >>> Probability.budget(Fraction(1, 100)).exact
            Fraction(1, 100)
        """
        if isinstance(value, Probability):
            if 0 < value.exact.numerator < value.exact.denominator:  # in (0, 1), in ints
                return value
            value = value.exact
        return cls(unit_rational(name, value, open_interval=True, text=True))

    def to_text(self) -> str:
        """The exact text form (``"1/100"``), as written to a journal; :meth:`of` reads it back.

        Example:
            >>> Probability.of("3/400").to_text()
            '3/400'
        """
        return str(self.exact)

    def split(self, parts: int) -> Probability:
        """``self / parts``: the share of each of ``parts`` events under a union bound.

        Raises:
            InvalidValueError: if ``parts`` is not an int ``>= 1``.

        Example:
            >>> Probability.of("1/100").split(4).exact
            Fraction(1, 400)
        """
        return Probability(self.exact / positive_int("parts", parts))

    def float_down(self) -> float:
        """The largest float not above the exact value (rounded toward 0).

        Use it for a failure probability handed to a float formula: a smaller
        delta only makes the bound computed from it larger, so the union bound
        stays sound. It is 0.0 for values below the smallest subnormal float.

        Example:
            >>> p = Probability.of("1/3")
            >>> Fraction(p.float_down()) <= p.exact
            True
        """
        return float_down(self.exact)

    def float_up(self) -> float:
        """The smallest float not below the exact value (rounded toward 1).

        Use it where a larger value is the safe side, e.g. a spend or a stated
        upper limit on a probability.

        Example:
            >>> p = Probability.of("1/3")
            >>> Fraction(p.float_up()) >= p.exact
            True
        """
        return float_up(self.exact)


ProbabilityLike: TypeAlias = Probability | Fraction | int | float | str
"""What the API accepts for a probability; converted to :class:`Probability` at the door."""
