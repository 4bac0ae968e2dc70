"""An anytime-valid upper confidence bound on the rate of an event over sampled requests.

Each audited request contributes ``x_i = 1`` when its event happened (e.g. its end-to-end
next-token divergence exceeded a threshold) and ``0`` otherwise. Under the assumption that
the audited requests are drawn uniformly and independently from the served ones, before
they are served (:data:`UNIFORM_SAMPLE`), the ``x_i`` are i.i.d. Bernoulli(``theta``).

For a candidate rate ``theta' < 1`` and a fraction ``rho`` in ``(0, 1)``, the betting factor

    f(x) = 1 + lambda (theta' - x),    lambda = rho / (1 - theta'),

is nonnegative for ``x`` in ``{0, 1}`` and has mean ``1 + lambda (theta' - theta) <= 1``
whenever ``theta >= theta'`` (Lean ``WitCert.Audit.bet_factor_mean_le_one``,
``bet_factor_nonneg``); the average over a fixed set of fractions ``rho_k`` of the running
products is a nonnegative supermartingale with initial value 1 under that null
(``bet_mixture_mean_le_one``). By Ville's inequality (``WitCert.Ledger.ville_finite_tree``)
it reaches ``1/alpha`` at some time with probability at most ``alpha``. Each factor grows
with ``theta'`` (``bet_factor_mono``), so at every time the rejected candidates form an upper
interval; the bound ``U_t`` is the smallest rejected candidate seen at any time so far (found by
bisection, rounded up), and

    P(exists t: theta >= U_t) <= alpha,

at every request count, however the audit is stopped or peeked at. The running product
depends on the outcomes only through their counts: ``(1 + lambda theta')^(n - s) (1 - rho)^s``
after ``n`` outcomes with ``s`` events. The sum is kept in log space; rounding can only delay
a rejection (a margin is added before the comparison), never create one.

Main declarations:

- :class:`RateBound`: the streaming bound (counts, the running minimum, O(K) per update).
- :func:`log_evalues`: the log e-values of many candidates or streams at once.
- :data:`UNIFORM_SAMPLE`: the assumption that limits the tier to PARTIALLY_CERTIFIED.
- :data:`FRACTIONS`: the default fractions ``rho_k`` (fixed before any data).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Final, final

import numpy as np
import numpy.typing as npt

from witcert_calculus.errors import InvalidValueError
from witcert_calculus.lean.theorems import (
    BET_FACTOR_MEAN_LE_ONE,
    BET_FACTOR_MONO_DIV,
    BET_FACTOR_NONNEG,
    MIXTURE_MEAN_LE_ONE,
    VILLE_FINITE_TREE,
)
from witcert_calculus.numerics.validation import UNIT_ROUNDOFF, nonneg_int, open_level, real, real_array
from witcert_calculus.tiers import (
    Assumption,
    Composition,
    Restricted,
    Tier,
    _premise,  # pyright: ignore[reportPrivateUsage]
    _proof,  # pyright: ignore[reportPrivateUsage]
    decide_tier,
)

__all__ = ["FRACTIONS", "THEOREMS", "UNIFORM_SAMPLE", "RateBound", "RateState", "log_evalues"]

#: The Lean theorems behind the bound: the betting factor, its monotonicity, the mixture, Ville.
THEOREMS: Final = (BET_FACTOR_NONNEG, BET_FACTOR_MEAN_LE_ONE, BET_FACTOR_MONO_DIV,
                   MIXTURE_MEAN_LE_ONE, VILLE_FINITE_TREE)

FloatArray = npt.NDArray[np.float64]

#: The betting fractions ``rho_k``, declared before any data (a mixture spreads the bet over
#: rates from about ``1/64`` to ``9/10`` of the gap to one).
FRACTIONS: Final = (0.9, 0.75, 0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625)

#: What the rate bound assumes and no code checks.
UNIFORM_SAMPLE: Final = Assumption(
    "the audited requests are a uniform, independent sample of the served requests, "
    "decided before each request is served",
    reason="the sampling decision and the request population are outside the audit's view")

_GRID = 64
_ROUNDS = 6


def _fractions(fractions: tuple[float, ...]) -> FloatArray:
    f = real_array("fractions", fractions)
    if f.ndim != 1 or f.size == 0 or not np.isfinite(f).all() or (f <= 0).any() or (f >= 1).any():
        raise InvalidValueError("fractions", fractions, "must be a nonempty tuple in (0, 1)")
    return f


def log_evalues(n: npt.ArrayLike, s: npt.ArrayLike, theta: npt.ArrayLike,
                fractions: tuple[float, ...] = FRACTIONS) -> FloatArray:
    """``log E(theta')`` after ``n`` outcomes with ``s`` events, broadcast over the arguments.

    ``E = mean_k (1 + rho_k theta' / (1 - theta'))^(n - s) (1 - rho_k)^s``.

    Args:
        n: outcome counts (>= s >= 0).
        s: event counts.
        theta: candidate rates in ``[0, 1)``.
        fractions: the betting fractions.

    Returns:
        The log e-values, float64 (``log1p`` and a log-sum-exp; first-order exact).

    Raises:
        InvalidValueError: on counts that are negative or with ``s > n``, or a candidate
            outside ``[0, 1)``.

    Example:
        >>> float(log_evalues(0, 0, 0.3))
        0.0
    """
    nn, ss, th = real_array("n", n), real_array("s", s), real_array("theta", theta)
    if (nn < 0).any() or (ss < 0).any() or (ss > nn).any():
        raise InvalidValueError("s", "counts", "must satisfy 0 <= s <= n")
    if not np.isfinite(th).all() or (th < 0).any() or (th >= 1).any():
        raise InvalidValueError("theta", "candidates", "must lie in [0, 1)")
    rho = _fractions(fractions)
    nn, ss, th = (a[..., None] for a in np.broadcast_arrays(nn, ss, th))
    lam = rho / (1.0 - th)                                        # [..., K]
    terms = (nn - ss) * np.log1p(lam * th) + ss * np.log1p(-rho)
    top = terms.max(axis=-1)
    out: FloatArray = top + np.log(np.exp(terms - top[..., None]).mean(axis=-1))
    return out


def _margin(n: float) -> float:
    # A first-order bound of the float error of log_evalues at n outcomes (each log1p and
    # product carries a few ulps, scaled by the count; the log-sum-exp a few more).
    return 64.0 * (n + 8.0) * UNIT_ROUNDOFF * (1.0 + math.log(n + 2.0))


def _upper(n: int, s: int, level: float, fractions: tuple[float, ...]) -> float:
    # The smallest candidate rejected at counts (n, s), rounded up: returns 1.0 when no
    # candidate below 1 is rejected. The rejected set is an upper interval, searched on
    # successively finer grids of _GRID + 1 points.
    threshold = level + _margin(float(n))
    lo, hi = 0.0, math.nextafter(1.0, 0.0)
    for _ in range(_ROUNDS):
        grid = np.linspace(lo, hi, _GRID + 1)
        rejected = np.flatnonzero(log_evalues(n, s, grid, fractions) >= threshold)
        if rejected.size == 0:
            return 1.0 if hi == math.nextafter(1.0, 0.0) else hi
        j = int(rejected[0])
        if j == 0:
            return float(grid[0])
        lo, hi = float(grid[j - 1]), float(grid[j])
    return hi


@final
@dataclass(frozen=True, slots=True)
class RateState:
    """A :class:`RateBound`'s state: counts and the running bound (JSON-friendly numbers).

    Raises:
        InvalidValueError: on counts with ``events > trials`` or a bound outside ``[0, 1]``.
    """

    trials: int
    events: int
    upper: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "trials", nonneg_int("trials", self.trials))
        object.__setattr__(self, "events", nonneg_int("events", self.events))
        object.__setattr__(self, "upper", real("upper", self.upper, lo=0.0, hi=1.0))
        if not (0 <= self.events <= self.trials) or not (0.0 <= self.upper <= 1.0):
            raise InvalidValueError("state", (self.trials, self.events, self.upper),
                                    "needs 0 <= events <= trials and upper in [0, 1]")


@final
class RateBound:
    """Anytime-valid upper confidence bound on an event's rate (see the module docstring).

    Args:
        alpha: the miscoverage level, in ``(0, 1)``: ``P(exists t: theta >= upper_t) <= alpha``.
        fractions: the betting fractions, fixed here before any data.

    Raises:
        InvalidValueError: on a level outside ``(0, 1)`` or bad fractions.

    Example:
        >>> b = RateBound(alpha=0.05)
        >>> for _ in range(200):
        ...     _ = b.observe(False)
        >>> 0.0 < b.upper < 0.03
        True
    """

    __slots__ = ("_alpha", "_fractions", "_level", "_s", "_n", "_upper")

    def __init__(self, *, alpha: float, fractions: tuple[float, ...] = FRACTIONS) -> None:
        self._alpha = open_level("alpha", alpha)
        _fractions(fractions)
        self._fractions = tuple(float(f) for f in fractions)
        self._level = math.log(1.0 / self._alpha)
        self._n = 0
        self._s = 0
        self._upper = 1.0

    @property
    def alpha(self) -> float:
        """The miscoverage level."""
        return self._alpha

    @property
    def trials(self) -> int:
        """Outcomes observed."""
        return self._n

    @property
    def events(self) -> int:
        """Outcomes that were events."""
        return self._s

    @property
    def upper(self) -> float:
        """The running upper confidence bound ``U_t`` (1.0 before any rejection)."""
        return self._upper

    @property
    def state(self) -> RateState:
        """The counts and the running bound."""
        return RateState(self._n, self._s, self._upper)

    @property
    def evidence(self) -> Composition:
        """The proofs of :data:`THEOREMS` (premises computed: fractions in ``(0, 1)``, equal
        weights summing to one), each restricted by :data:`UNIFORM_SAMPLE`."""
        k = len(self._fractions)
        premises = (_premise("0 < rho_k < 1 for every fraction",
                             all(0 < f < 1 for f in self._fractions)),
                    _premise("mixture weights 1/K are nonnegative and sum to 1",
                             sum((Fraction(1, k) for _ in range(k)), Fraction(0)) == 1))
        return Composition(tuple(Restricted(_proof(t, premises), assumptions=(UNIFORM_SAMPLE,))
                                 for t in THEOREMS), theorem=VILLE_FINITE_TREE)

    @property
    def tier(self) -> Tier:
        """PARTIALLY_CERTIFIED (the uniform-sample assumption) once something was observed;
        EMPIRICAL before (no evidence, no certificate)."""
        if self._n == 0:
            return Tier.EMPIRICAL
        return decide_tier(self.evidence)

    def observe(self, event: bool) -> float:
        """Fold in one audited request's outcome; return the updated bound.

        Raises:
            InvalidValueError: if ``event`` is not a bool.
        """
        if not isinstance(event, (bool, np.bool_)):
            raise InvalidValueError("event", event, "must be a bool (did the event happen)")
        self._n += 1
        self._s += int(bool(event))
        self._upper = min(self._upper, _upper(self._n, self._s, self._level, self._fractions))
        return self._upper
