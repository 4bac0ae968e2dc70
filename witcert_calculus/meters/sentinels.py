"""Sampling sentinel and coverage confidence: two small meters with exact guarantees.

Sampling sentinel: each round draws ``r`` slots uniformly *with replacement*
from ``M`` slots of which ``B`` are corrupted (the implementation samples with
replacement, so that is what is modelled, not the friendlier hypergeometric).
A round misses every corrupted slot with probability ``q = (1 - B/M)^r`` (Lean
``WitCert.Sampling.miss_probability_eq``: counted over the ``M^r`` equally likely draw
sequences; that the generator's draws are uniform and independent is the modelling step
:data:`witcert_calculus.lean.modelling.SENTINEL_GENERATOR`);
``n = ceil(log delta / log q)`` rounds detect corruption with confidence
``1 - delta`` since ``q^n <= delta`` (Lean ``WitCert.Meters.sentinel_rounds_sound``).

Coverage confidence: zero failures in ``n`` independent trials bound the failure
rate by ``ln(1/delta)/n`` with confidence ``1 - delta``, because
``(1 - p)^n <= e^{-np}`` (Lean ``WitCert.Analytic.one_sub_pow_le_exp``,
``WitCert.Meters.rate_upper_bound_sound``).

Both are evaluated with 50-digit arithmetic and rounded in the safe direction.

Main declarations:

- :func:`sentinel_rounds`, :func:`sentinel_miss_probability`
- :func:`rate_upper_bound`, :func:`rate_upper_bound_exact`
"""

from __future__ import annotations

import math
from typing import Any, Final

from witcert_calculus.errors import InvalidValueError
from witcert_calculus.numerics.validation import count, positive_int, real

__all__ = [
    "rate_upper_bound",
    "rate_upper_bound_exact",
    "sentinel_miss_probability",
    "sentinel_rounds",
]

_DPS: Final = 50


def _mp() -> Any:  # mpmath ships no type information
    import mpmath

    return mpmath


def _sentinel_args(corrupted: int, slots: int, draws: int) -> tuple[int, int, int]:
    m = count("slots", slots)
    b = count("corrupted", corrupted)
    r = count("draws", draws)
    if b > m:
        raise InvalidValueError("corrupted", corrupted, f"must be <= slots = {m}")
    return b, m, r


def sentinel_miss_probability(corrupted: int, slots: int, draws: int, rounds: int) -> float:
    """``q^n = (1 - B/M)^(r n)``, the probability that ``n`` rounds all miss (rounded up).

    Example:
        >>> sentinel_miss_probability(1, 2, 1, 3)
        0.125
    """
    b, m, r = _sentinel_args(corrupted, slots, draws)
    n = positive_int("rounds", rounds, minimum=0)
    mp = _mp()
    with mp.workdps(_DPS):
        val = mp.power(mp.mpf(m - b) / m, r * n)
        f = float(val)
        if mp.mpf(f) < val:
            f = math.nextafter(f, math.inf)
        return f


def sentinel_rounds(corrupted: int, slots: int, draws: int, delta: float) -> int:
    """Rounds ``n = ceil(log delta / log q)``, ``q = (1 - B/M)^r``, so that ``q^n <= delta``.

    Args:
        corrupted: number of corrupted slots ``B`` (>= 1).
        slots: number of slots ``M`` (>= B).
        draws: slots drawn per round ``r``, uniformly with replacement.
        delta: allowed miss probability, in (0, 1).

    Returns:
        The smallest ``n`` with ``q^n <= delta`` (decided with 50 digits; at an exact
        tie the answer may be one larger, never smaller).

    Raises:
        InvalidValueError: on ``B < 1``, ``B > M``, ``r < 1`` or ``delta`` outside (0, 1).

    Example:
        >>> sentinel_rounds(1, 100, 10, 0.01)
        46
    """
    b, m, r = _sentinel_args(corrupted, slots, draws)
    dl = real("delta", delta, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    if b == m:
        return 1  # q = 0: one round always hits a corrupted slot
    mp = _mp()
    with mp.workdps(_DPS):
        log_q = r * mp.log(mp.mpf(m - b) / m)  # < 0
        log_d = mp.log(mp.mpf(dl))
        n = int(mp.ceil(log_d / log_q))
        n = max(n, 1)
        while n * log_q > log_d:  # guard the ceiling against rounding: q^n <= delta
            n += 1
        while n > 1 and (n - 1) * log_q <= log_d:
            n -= 1
        return n


def rate_upper_bound_exact(trials: int, delta: float) -> float:
    """The exact zero-failure rate bound ``1 - delta^(1/n)`` (rounded up).

    The solution ``p*`` of ``(1 - p)^n = delta``: if the true rate were ``p > p*``, zero
    failures in ``n`` trials would have probability ``(1 - p)^n < delta`` (``(1 - p)^n`` is
    decreasing in ``p``). Tighter than :func:`rate_upper_bound`, which solves
    ``e^{-np} = delta`` with ``(1 - p)^n <= e^{-np}``.

    Args:
        trials: number of independent trials ``n`` (>= 1), all without failure.
        delta: confidence parameter, in (0, 1).

    Example:
        >>> round(rate_upper_bound_exact(144, 0.05), 4), round(rate_upper_bound(144, 0.05), 4)
        (0.0206, 0.0208)
    """
    n = positive_int("trials", trials)
    dl = real("delta", delta, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    mp = _mp()
    with mp.workdps(_DPS):
        val = -mp.expm1(mp.log(mp.mpf(dl)) / n)
        f = float(val)
        if mp.mpf(f) < val:
            f = math.nextafter(f, math.inf)
        return f


def rate_upper_bound(trials: int, delta: float) -> float:
    """Failure-rate bound ``ln(1/delta) / n`` after zero failures in ``n`` trials (rounded up).

    If the true rate were ``p > ln(1/delta)/n``, zero failures would have probability
    ``(1-p)^n <= e^{-np} < delta``.

    Args:
        trials: number of independent trials ``n`` (>= 1), all without failure.
        delta: confidence parameter, in (0, 1).

    Returns:
        The bound as a float, at least the exact value.

    Example:
        >>> round(rate_upper_bound(1000, 0.05), 9)
        0.002995732
    """
    n = positive_int("trials", trials)
    dl = real("delta", delta, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    mp = _mp()
    with mp.workdps(_DPS):
        val = mp.log(1 / mp.mpf(dl)) / n
        f = float(val)
        if mp.mpf(f) < val:
            f = math.nextafter(f, math.inf)
        return f
