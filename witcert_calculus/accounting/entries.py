"""Entry-level certification with local fallback, whole-step certification, trade-off replay.

A step of attention reads many memory entries; each entry ``j`` comes with a
certified per-entry bound ``b_j`` (its contribution to the step's error when
the compressed bytes are read). Entry-level certification keeps the
compressed value of every entry whose bound is at most a threshold and falls
back to the exact bytes for the others, so one bad entry costs that entry, not
the step. An entry that falls back contributes 0 (exact bytes carry no error),
so the step's bound is the aggregate of the kept entries' bounds: their sum
(additive metrics such as a total-variation contribution) or their maximum
(sup-norm metrics) (Lean: ``WitCert.Ledger.entry_fallback_sound`` and
``WitCert.Ledger.entry_fallback_max_sound``).
Whole-step certification keeps all entries or none.

Sums are computed in float64 and then raised by the worst-case rounding of any
summation order for nonnegative terms (Higham: ``|s_hat - s| <= gamma_{n-1} s``,
``gamma_k = k u / (1 - k u)``), so the reported step bound is never below the
exact sum of the kept bounds.

Main declarations:

- :class:`Aggregate`: how per-entry bounds combine into a step bound.
- :class:`EntryCertification`, :func:`certify_entries`, :func:`certify_step`
- :class:`TradeoffCurve`, :func:`tradeoff_curve`
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Final, final

import numpy as np
import numpy.typing as npt

from witcert_calculus.errors import InvalidValueError
from witcert_calculus.lean.theorems import ENTRY_FALLBACK_CONTRACT_SOUND, ENTRY_FALLBACK_MAX_SOUND
from witcert_calculus.numerics.validation import nonneg_real, real, real_array

__all__ = [
    "Aggregate",
    "ENTRY_MAX_THEOREM",
    "ENTRY_THEOREM",
    "EntryCertification",
    "TradeoffCurve",
    "certify_entries",
    "certify_step",
    "sum_upper",
    "tradeoff_curve",
]

ENTRY_THEOREM: Final = ENTRY_FALLBACK_CONTRACT_SOUND
"""Lean theorem of the sum aggregate: exact fallback entries contribute 0, so the step's error is
at most the sum of the kept entries' bounds (the semantic contract ``entryFallback``)."""

ENTRY_MAX_THEOREM: Final = ENTRY_FALLBACK_MAX_SOUND
"""Lean theorem of the maximum aggregate (sup-norm metrics): the step's error is at most the
largest kept bound."""

_U = 2.0**-53

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


@final
class Aggregate(enum.Enum):
    """How per-entry bounds combine into a step bound."""

    SUM = "sum"
    """Additive contributions (e.g. per-entry total-variation mass)."""
    MAX = "max"
    """Sup-norm contributions (e.g. per-entry logit error)."""


def _gamma_factor(n: int) -> float:
    # Upper bound (as a float, rounded up) on 1 / (1 - gamma_{n-1}) <= 1 + 2 gamma_{n-1}.
    if n <= 1:
        return 1.0
    k = float(n - 1)
    gamma = k * _U / (1.0 - k * _U)
    return math.nextafter(math.nextafter(1.0 + 2.0 * gamma, math.inf), math.inf)


def sum_upper(computed: float, n_terms: int) -> float:
    """Raise a float64 sum of ``n_terms`` nonnegative terms to an upper bound of the exact sum.

    Valid for any summation order (pairwise, sequential, blocked).

    Example:
        >>> sum_upper(1.0, 1)
        1.0
        >>> sum_upper(1.0, 3) > 1.0
        True
    """
    if n_terms <= 1 or computed == 0.0 or math.isinf(computed):
        return float(computed)
    return math.nextafter(float(computed) * _gamma_factor(n_terms), math.inf)


def _bounds(bounds: npt.ArrayLike) -> FloatArray:
    b = real_array("bounds", bounds)
    if b.ndim != 1:
        raise InvalidValueError("bounds", f"array of shape {b.shape}", "must be one-dimensional")
    if b.size == 0:
        raise InvalidValueError("bounds", "empty array", "needs at least one entry")
    ok = b >= 0.0  # False for NaN and for negative values: one pass catches both
    if not bool(ok.all()):
        i = int(np.argmin(ok))
        raise InvalidValueError(f"bounds[{i}]", float(b[i]),
                                "must be >= 0 and not NaN (use +inf for an entry with no bound)")
    return b


def _saturation(saturation: float | None) -> float | None:
    if saturation is None:
        return None
    s = real("saturation", saturation, allow_inf=True)
    if not (s > 0.0):
        raise InvalidValueError("saturation", saturation, "must be > 0 (or None)")
    return s


@final
@dataclass(frozen=True, slots=True, eq=False)
class EntryCertification:
    """Which entries keep their compressed value, and the step bound that results.

    Attributes:
        keep: read-only boolean mask, ``True`` where the compressed value is kept.
        n_entries: number of entries.
        n_kept: number kept compressed; the others fall back to exact bytes.
        retained_fraction: ``n_kept / n_entries``, exact.
        step_bound: upper bound on the step's error (aggregate of kept bounds,
            rounded upward); 0.0 when nothing is kept.
        threshold: the threshold applied.
        aggregate: how entry bounds were combined.
        whole_step: ``True`` for whole-step certification (all or nothing).
        vacuous: ``True`` when ``step_bound`` is at or above the metric's
            saturation: entries were retained, but the step's bound says nothing.
            Retention is then not coverage; both are reported.
    """

    keep: BoolArray
    n_entries: int
    n_kept: int
    retained_fraction: Fraction
    step_bound: float
    threshold: float
    aggregate: Aggregate
    whole_step: bool
    vacuous: bool

    @property
    def fallback(self) -> npt.NDArray[np.intp]:
        """Indices of the entries that fall back to exact bytes."""
        return np.flatnonzero(~self.keep)

    def none_kept(self) -> EntryCertification:
        """The same batch with every entry falling back (nothing kept, step bound 0.0).

        Example:
            >>> certify_entries([0.01, 0.02], threshold=0.1).none_kept().keep.tolist()
            [False, False]
        """
        keep = np.zeros(self.n_entries, dtype=np.bool_)
        keep.setflags(write=False)
        return EntryCertification(
            keep=keep, n_entries=self.n_entries, n_kept=0, retained_fraction=Fraction(0),
            step_bound=0.0, threshold=self.threshold, aggregate=self.aggregate,
            whole_step=self.whole_step, vacuous=False)

    @property
    def theorem(self) -> str:
        """The Lean theorem of this certification's aggregate."""
        return ENTRY_MAX_THEOREM if self.aggregate is Aggregate.MAX else ENTRY_THEOREM


def _aggregate(b: FloatArray, keep: BoolArray | None, n_kept: int, how: Aggregate) -> float:
    if n_kept == 0:
        return 0.0
    if how is Aggregate.MAX:
        return float(np.max(b, where=keep, initial=0.0)) if keep is not None else float(b.max())
    s = float(np.add.reduce(b, where=keep)) if keep is not None else float(b.sum())
    return sum_upper(s, n_kept)


def _check_aggregate(aggregate: Aggregate) -> Aggregate:
    if not isinstance(aggregate, Aggregate):
        raise InvalidValueError("aggregate", aggregate, "must be an Aggregate")
    return aggregate


def certify_entries(bounds: npt.ArrayLike, *, threshold: float,
                    aggregate: Aggregate = Aggregate.SUM,
                    saturation: float | None = None) -> EntryCertification:
    """Entry-level certification: keep each entry whose bound is ``<= threshold``.

    Args:
        bounds: per-entry certified bounds (``>= 0``; ``+inf`` for an entry with
            no bound, which always falls back).
        threshold: largest per-entry bound kept compressed (finite, ``>= 0``).
        aggregate: how kept bounds combine into the step bound.
        saturation: the metric's saturation (e.g. 1 for total variation), if any.

    Returns:
        The keep mask, retained fraction and step bound.

    Raises:
        InvalidValueError: naming the first NaN or negative bound, an empty or
            non-1-D array, or a bad threshold.

    Lean: ``WitCert.Semantic.entry_fallback_contract_sound`` (the contract ``entryFallback``, from ``WitCert.Ledger.entry_fallback_sound``).

    Example:
        >>> c = certify_entries([0.01, 5.0, 0.02], threshold=0.1)
        >>> c.keep.tolist(), c.retained_fraction
        ([True, False, True], Fraction(2, 3))
    """
    b = _bounds(bounds)
    t = nonneg_real("threshold", threshold)
    how = _check_aggregate(aggregate)
    sat = _saturation(saturation)
    keep = b <= t
    n_kept = int(np.count_nonzero(keep))
    step = _aggregate(b, keep, n_kept, how)
    keep.setflags(write=False)
    return EntryCertification(
        keep=keep, n_entries=int(b.size), n_kept=n_kept,
        retained_fraction=Fraction(n_kept, int(b.size)), step_bound=step, threshold=t,
        aggregate=how, whole_step=False, vacuous=sat is not None and step >= sat,
    )


def certify_step(bounds: npt.ArrayLike, *, threshold: float,
                 aggregate: Aggregate = Aggregate.SUM,
                 saturation: float | None = None) -> EntryCertification:
    """Whole-step certification: keep every entry if the step bound is ``<= threshold``, else none.

    Args:
        bounds: per-entry certified bounds (as in :func:`certify_entries`).
        threshold: largest step bound accepted.
        aggregate: how entry bounds combine into the step bound.
        saturation: the metric's saturation, if any.

    Returns:
        A certification whose mask is all ``True`` or all ``False``; its
        ``step_bound`` is the aggregate over all entries when kept, else 0.0.

    Raises:
        InvalidValueError: as :func:`certify_entries`.

    Example:
        >>> certify_step([0.01, 5.0, 0.02], threshold=0.1).n_kept
        0
    """
    b = _bounds(bounds)
    t = nonneg_real("threshold", threshold)
    how = _check_aggregate(aggregate)
    sat = _saturation(saturation)
    total = _aggregate(b, None, int(b.size), how)
    ok = total <= t
    keep = np.full(b.size, ok, dtype=np.bool_)
    keep.setflags(write=False)
    n_kept = int(b.size) if ok else 0
    step = total if ok else 0.0
    return EntryCertification(
        keep=keep, n_entries=int(b.size), n_kept=n_kept,
        retained_fraction=Fraction(n_kept, int(b.size)), step_bound=step, threshold=t,
        aggregate=how, whole_step=True, vacuous=sat is not None and step >= sat,
    )


@final
@dataclass(frozen=True, slots=True, eq=False)
class TradeoffCurve:
    """Retention versus per-step bound, replayed from a trace of entry reads.

    Attributes:
        thresholds: the per-entry thresholds, ascending.
        retained_fraction: for each threshold, kept entries / all entries over the trace.
        worst_step_bound: for each threshold, the largest step bound over the trace.
        vacuous_steps: for each threshold, steps whose bound reached saturation
            (all zero when no saturation was given).
        n_steps: number of steps in the trace.
    """

    thresholds: FloatArray
    retained_fraction: FloatArray
    worst_step_bound: FloatArray
    vacuous_steps: npt.NDArray[np.int64]
    n_steps: int


def tradeoff_curve(trace: Sequence[npt.ArrayLike], *, thresholds: npt.ArrayLike,
                   aggregate: Aggregate = Aggregate.SUM,
                   saturation: float | None = None) -> TradeoffCurve:
    """Replay entry-level certification over a trace for many thresholds at once.

    For every step the bounds are sorted once and accumulated (``cumsum``); each
    threshold then reads its kept prefix by binary search. Retention and vacuous
    counts equal those of :func:`certify_entries` per step and threshold; step
    bounds agree up to float rounding (the summation order differs) and are, like
    those, raised to upper bounds of the exact sums.

    Args:
        trace: one array of per-entry bounds per step.
        thresholds: per-entry thresholds (finite, ``>= 0``), ascending.
        aggregate: how entry bounds combine.
        saturation: the metric's saturation, if any.

    Raises:
        InvalidValueError: for an empty trace, bad bounds, or unsorted or bad thresholds.

    Example:
        >>> c = tradeoff_curve([[0.1, 0.3], [0.2, 0.2]], thresholds=[0.0, 0.25, 1.0])
        >>> c.retained_fraction.tolist()
        [0.0, 0.75, 1.0]
    """
    if isinstance(trace, (str, bytes)) or not hasattr(trace, "__len__") or len(trace) == 0:
        raise InvalidValueError("trace", trace, "needs at least one step (a sequence of arrays)")
    ts = real_array("thresholds", thresholds)
    if ts.ndim != 1 or ts.size == 0 or not bool(np.isfinite(ts).all()) or bool((ts < 0).any()):
        raise InvalidValueError("thresholds", thresholds, "must be a non-empty 1-D array of "
                                "finite values >= 0")
    if bool((np.diff(ts) < 0).any()):
        raise InvalidValueError("thresholds", thresholds, "must be ascending")
    how = _check_aggregate(aggregate)
    sat = _saturation(saturation)
    kept_total = np.zeros(ts.size, dtype=np.int64)
    worst = np.zeros(ts.size, dtype=np.float64)
    vac = np.zeros(ts.size, dtype=np.int64)
    n_total = 0
    for step in trace:
        b = np.sort(_bounds(step))
        k = np.searchsorted(b, ts, side="right")  # entries with bound <= threshold
        if how is Aggregate.SUM:
            cs = np.cumsum(b)
            raw = np.where(k > 0, cs[np.maximum(k - 1, 0)], 0.0)
            bound = np.array([sum_upper(float(v), int(n)) for v, n in zip(raw, k, strict=True)])
        else:
            bound = np.where(k > 0, b[np.maximum(k - 1, 0)], 0.0)
        kept_total += k
        worst = np.maximum(worst, bound)
        if sat is not None:
            vac += bound >= sat
        n_total += int(b.size)
    return TradeoffCurve(thresholds=ts, retained_fraction=kept_total / n_total,
                         worst_step_bound=worst, vacuous_steps=vac, n_steps=len(trace))
