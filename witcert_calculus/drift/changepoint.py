"""Change detection: an e-detector (e-CUSUM) whose delay does not grow with a clean prefix.

The drift sentinel :class:`~witcert_calculus.drift.eprocess.EProcess` multiplies Hoeffding
factors ``g_e`` (each of conditional mean at most 1 under the null) into ``M_t = prod g_e``
and alarms once ``M_t >= 1/delta``: by Ville's inequality the probability of *any* false
alarm, ever, is at most ``delta``. As a drift alarm it forgets nothing: after a long clean
prefix ``log M_t`` has drifted far below 0 and a change must first climb back, so the
detection delay grows with the prefix.

The e-detector restarts instead: with the same factors,

    L_t = log g_t + max(L_{t-1}, 0),   L_0 = 0,      alarm when L_t >= ln(1/alpha),

i.e. ``M_t = g_t max(M_{t-1}, 1)``, the e-CUSUM. Its guarantee is on the average run length
under the null: ``E[tau] >= 1/alpha``. Proof sketch: the Shiryaev-Roberts statistic
``R_t = g_t (R_{t-1} + 1)``, ``R_0 = 0``, makes ``R_t - t`` a supermartingale when each
``E[g_t | past] <= 1``, so optional stopping at ``tau_R = inf{t : R_t >= 1/alpha}`` gives
``1/alpha <= E[R_tau] <= E[tau_R]``; by induction ``max(M_t, 1) <= R_t + 1`` and
``M_t <= R_t``, so the e-CUSUM alarms no earlier and ``E[tau] >= E[tau_R] >= 1/alpha``.
This is a statement about the mean time to a false alarm, not a bound on the probability
of one: false alarms do happen, at rate about ``alpha`` per step or less, and a stream that
runs for long enough will raise one. Use the :class:`~witcert_calculus.drift.eprocess.EProcess`
when a false alarm must be rare over the whole stream, this detector when a change must be
seen quickly whenever it happens.

Rounding: ``max(., 0)`` is 1-Lipschitz, so the first-order bound on the rounding error of
the running sum carries over (as in :mod:`~witcert_calculus.drift.eprocess`); it drops to 0 at a
restart that is certain (the computed value plus its error bound below 0), and the alarm
fires only when the computed value exceeds the threshold by more than the bound.

Main declarations:

- :class:`EDetector`: the streaming e-CUSUM (O(1) update).
- :func:`run_lengths`: alarm steps of fresh detectors over many streams.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import final

import numpy as np
import numpy.typing as npt

from witcert_calculus.drift.eprocess import KAPPA_MAX, log_factors, observation_batch
from witcert_calculus.errors import InvalidValueError
from witcert_calculus.numerics.rounding import STEP_SLACK
from witcert_calculus.numerics.validation import open_level, positive_int, real

__all__ = ["EDetector", "run_lengths"]

@final
class EDetector:
    """Streaming e-CUSUM change detector over Hoeffding factors.

    Args:
        alpha: the alarm threshold is ``ln(1/alpha)``; under the null the average run
            length to a (false) alarm is at least ``1/alpha``. In (0, 1).
        kappa: declared before any data (default 0.5); ``lambda_e = 4 kappa / sqrt(C_e)``,
            the factors of :func:`~witcert_calculus.drift.eprocess.log_factors`.

    Raises:
        InvalidValueError: if ``alpha`` is outside (0, 1) or ``kappa`` outside
            ``(0, KAPPA_MAX]`` (:data:`~witcert_calculus.drift.eprocess.KAPPA_MAX`).

    Example:
        >>> d = EDetector(alpha=0.01)
        >>> d.observe_many(np.full(5000, 0.5), m=0.5, c=1.0)   # clean: no alarm
        False
        >>> d.observe_many(np.full(40, 0.9), m=0.5, c=1.0)     # a change: seen quickly
        True
        >>> d.alarm_step - 5000 < 40
        True
    """

    __slots__ = ("_alarm_step", "_alpha", "_kappa", "_pen4", "_restarts", "_slack", "_steps",
                 "_threshold", "_value")

    def __init__(self, *, alpha: float | Fraction, kappa: float = 0.5) -> None:
        a = open_level("alpha", alpha)
        k = real("kappa", kappa, lo=0.0, hi=KAPPA_MAX, lo_open=True)
        self._alpha = a
        self._kappa = k
        self._pen4 = 4.0 * k * k
        self._threshold = -math.log(a)
        self._value = 0.0
        self._slack = 0.0
        self._steps = 0
        self._restarts = 0
        self._alarm_step: int | None = None

    @property
    def alpha(self) -> float:
        """The level: ``E[run length] >= 1/alpha`` under the null."""
        return self._alpha

    @property
    def threshold(self) -> float:
        """``ln(1/alpha)``."""
        return self._threshold

    @property
    def log_value(self) -> float:
        """The running statistic ``L_t = log M_t`` (restarted from 0 when it falls below 0)."""
        return self._value

    @property
    def steps(self) -> int:
        """Observations folded in so far."""
        return self._steps

    @property
    def restarts(self) -> int:
        """How often the statistic fell below 0 and restarted."""
        return self._restarts

    @property
    def alarmed(self) -> bool:
        """Whether the alarm has fired (it stays fired; :meth:`reset` re-arms it)."""
        return self._alarm_step is not None

    @property
    def alarm_step(self) -> int | None:
        """1-based step of the first alarm, or ``None``."""
        return self._alarm_step

    def reset(self) -> None:
        """Re-arm after an alarm was handled: the statistic starts again from 0."""
        self._value = 0.0
        self._slack = 0.0
        self._alarm_step = None

    def observe(self, w: float, *, m: float, c: float) -> bool:
        """Fold in one observation; return whether the alarm has fired.

        Args:
            w: the observation ``W_e``.
            m: the null mean ``m_e`` (``E[W_e | past] <= m_e`` under the null).
            c: the squared width ``C_e`` of the null range of ``W_e``.

        Raises:
            InvalidValueError: for NaN/infinite ``w`` or ``m``, or ``c`` not finite and > 0.
        """
        return self.observe_many([w], m=m, c=c)

    def observe_many(self, w: npt.ArrayLike, *, m: npt.ArrayLike, c: npt.ArrayLike) -> bool:
        """Fold in a stream of observations in order; return whether the alarm has fired.

        Raises:
            InvalidValueError: as :meth:`observe`; nothing is folded in when any value is bad.
        """
        lf = log_factors(*observation_batch(w, m, c), kappa=self._kappa)
        value, slack, steps, restarts = self._value, self._slack, self._steps, self._restarts
        alarm = self._alarm_step
        threshold, pen4 = self._threshold, self._pen4
        for x in lf.tolist():
            steps += 1
            if value < 0.0:
                restarts += 1
                if value + slack < 0.0:  # the exact value is below 0 too: max(., 0) = 0 exactly
                    slack = 0.0
                value = 0.0
            value = value + x
            slack = slack + STEP_SLACK * (abs(x) + pen4 + abs(value))
            if alarm is None and value - slack >= threshold:
                alarm = steps
        self._value, self._slack, self._steps, self._restarts = value, slack, steps, restarts
        self._alarm_step = alarm
        return alarm is not None


def run_lengths(streams: npt.ArrayLike, *, m: float, c: float, alpha: float,
                kappa: float = 0.5) -> npt.NDArray[np.int64]:
    """Steps to the first alarm of a fresh :class:`EDetector` on each row (0: no alarm).

    Args:
        streams: observations, shape ``(streams, steps)``.
        m, c: the null mean and squared range of every observation.
        alpha, kappa: as :class:`EDetector`.

    Returns:
        One int per row: the 1-based alarm step, or 0 when the row raised none.

    Example:
        >>> run_lengths(np.full((2, 50), 0.9), m=0.5, c=1.0, alpha=0.01).tolist()
        [16, 16]
    """
    rows = np.asarray(streams, dtype=np.float64)
    if rows.ndim != 2:
        raise InvalidValueError("streams", rows.shape, "must have shape (streams, steps)")
    positive_int("steps", rows.shape[1])
    out = np.zeros(rows.shape[0], dtype=np.int64)
    for i, row in enumerate(rows):
        det = EDetector(alpha=alpha, kappa=kappa)
        det.observe_many(row, m=m, c=c)
        out[i] = det.alarm_step or 0
    return out
