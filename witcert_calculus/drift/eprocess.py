"""Anytime-valid drift sentinel: a streaming e-process with Hoeffding factors.

Each observation ``e`` brings a value ``W_e``, the mean ``m_e`` that the
certificate promises under the null (``E[W_e | past] <= m_e``) and the squared
width ``C_e`` of the interval that holds ``W_e`` under the null. The factor

    g_e = exp(lambda_e (W_e - m_e) - lambda_e^2 C_e / 8),   lambda_e = 4 kappa / sqrt(C_e)

has conditional expectation at most 1 under the null (Hoeffding's lemma), so
the running product ``M_t = prod_{e <= t} g_e`` is a nonnegative
supermartingale with ``M_0 = 1``. By Ville's inequality
``P(sup_t M_t >= 1/delta_e) <= delta_e``: raising an alarm when
``log M_t >= ln(1/delta_e)`` has false-alarm probability at most ``delta_e``
at every stopping time, however long the stream runs (Lean:
``WitCert.Ledger.ville_finite_tree``). ``kappa`` must be declared before any
data is seen; it is fixed at construction, in ``(0, KAPPA_MAX]``.

Stated range of an observation. Under the null ``W_e`` lies in an interval of width
``sqrt(C_e)`` that holds its promised mean ``m_e``, so ``|W_e - m_e| <= sqrt(C_e)``; then
``|lambda_e (W_e - m_e)| <= 4 kappa`` and every log-factor lies in
``[-4 kappa - 2 kappa^2, 4 kappa - 2 kappa^2]``. An observation outside that range (or
one whose log-factor is not a finite float, e.g. ``C_e`` so small that ``lambda_e^2``
overflows) is refused with an :class:`~witcert_calculus.errors.InvalidValueError` naming
it, before anything is folded in: an overflow never turns ``log M_t`` into ``inf`` or
``NaN``, which would silence the alarm for good. A state restored from a journal or JSON
holds finite values only (:class:`EProcessState` checks them).

The product is kept in log space (no overflow, no clamping). Floating-point
rounding of the running sum is tracked by a first-order error bound, and the
alarm fires only when the computed value exceeds the threshold by more than
that bound, so rounding can delay an alarm by a hair but never create one.

Main declarations:

- :class:`EProcess`: the streaming process (O(1) update, serializable state).
- :class:`EProcessState`: its frozen, JSON-serializable state.
- :func:`log_factors`: vectorised ``log g_e`` (bit-identical to the scalar update).
- :func:`log_paths`: vectorised running ``log M_t`` over many independent streams.
- :func:`observation_batch`: a stream of observations with its null means and ranges, stacked.
- :class:`Sentinels`: named processes, created once each (the ledger's drift sentinels).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Final, final

import numpy as np
import numpy.typing as npt

from witcert_calculus.errors import InvalidValueError
from witcert_calculus.lean.theorems import VILLE_FINITE_TREE
from witcert_calculus.numerics.rounding import STEP_SLACK
from witcert_calculus.numerics.validation import (
    UNIT_ROUNDOFF,
    nonneg_int,
    open_level,
    real,
    real_array,
)

__all__ = [
    "KAPPA_MAX",
    "EProcess",
    "EProcessState",
    "Sentinels",
    "VILLE_THEOREM",
    "log_factors",
    "log_paths",
    "observation_batch",
]

VILLE_THEOREM: Final = VILLE_FINITE_TREE
"""Lean theorem behind the anytime false-alarm guarantee."""

FloatArray = npt.NDArray[np.float64]

KAPPA_MAX: Final = 2.0**20
"""Largest declared ``kappa``. Any ``kappa > 1`` is already dominated (the best
``lambda`` for a deviation ``d <= sqrt(C)`` is ``4 d / C``, i.e. ``kappa = d / sqrt(C) <= 1``);
the cap keeps ``|log g_e| <= 4 kappa + 2 kappa^2`` far from overflow over any stream."""

#: Relative room on ``|w - m| <= sqrt(c)`` for the rounding of ``w - m`` and ``sqrt(c)``.
_RANGE_ROOM: Final = 1.0 + 8 * UNIT_ROUNDOFF


def _check_kappa(kappa: float) -> float:
    return real("kappa", kappa, lo=0.0, hi=KAPPA_MAX, lo_open=True)


def _check_delta(delta: float | Fraction) -> float:
    return open_level("delta", delta)


def _log_factor(w: float, m: float, c: float, kappa: float) -> float:
    # Same operations, in the same order, as log_factors (bit-identical results).
    lam = 4.0 * kappa / math.sqrt(c)
    return lam * (w - m) - lam * lam * c / 8.0


def log_factors(
    w: npt.ArrayLike, m: npt.ArrayLike, c: npt.ArrayLike, *, kappa: float = 0.5
) -> FloatArray:
    """Vectorised log-factors ``log g_e = lambda_e (W_e - m_e) - lambda_e^2 C_e / 8``.

    Args:
        w: observations ``W_e``.
        m: null means ``m_e`` (broadcast against ``w``).
        c: squared null ranges ``C_e > 0`` (broadcast against ``w``).
        kappa: the declared tuning constant, ``lambda_e = 4 kappa / sqrt(C_e)``.

    Returns:
        ``log g_e`` as a float64 array of the broadcast shape.

    Raises:
        InvalidValueError: for NaN or infinite ``w``/``m``, ``c <= 0``, ``kappa``
            outside ``(0, KAPPA_MAX]``, a ``w`` outside ``[m - sqrt(c), m + sqrt(c)]``, or a
            log-factor that is not finite.

    Example:
        >>> float(log_factors([1.0], [1.0], [1.0], kappa=0.5)[0])
        -0.5
    """
    k = _check_kappa(kappa)
    try:
        wa, ma, ca = np.broadcast_arrays(real_array("w", w), real_array("m", m),
                                         real_array("c", c))
    except ValueError as exc:
        if isinstance(exc, InvalidValueError):
            raise
        raise InvalidValueError("m, c", "shapes", f"must broadcast to the shape of w ({exc})") from None
    if not bool(np.isfinite(wa).all()):
        raise InvalidValueError("w", _first_bad(wa, np.isfinite(wa)), "must be finite")
    if not bool(np.isfinite(ma).all()):
        raise InvalidValueError("m", _first_bad(ma, np.isfinite(ma)), "must be finite")
    ok = np.isfinite(ca) & (ca > 0)
    if not bool(ok.all()):
        raise InvalidValueError("c", _first_bad(ca, ok), "must be finite and > 0")
    with np.errstate(over="ignore", invalid="ignore"):
        inside = np.abs(wa - ma) <= np.sqrt(ca) * _RANGE_ROOM
        if not bool(inside.all()):
            i = int(np.flatnonzero(~inside.ravel())[0])
            _out_of_range(float(wa.flat[i]), float(ma.flat[i]), float(ca.flat[i]))
        lam = 4.0 * k / np.sqrt(ca)
        out: FloatArray = lam * (wa - ma) - lam * lam * ca / 8.0
    fin = np.isfinite(out)
    if not bool(fin.all()):
        i = int(np.flatnonzero(~fin.ravel())[0])
        _not_finite(float(ca.flat[i]), k)
    return out


def _out_of_range(w: float, m: float, c: float) -> None:
    raise InvalidValueError("w", w, f"must lie in the null range [m - sqrt(c), m + sqrt(c)] "
                            f"with m={m!r}, c={c!r} (|w - m| <= sqrt(c)); an observation "
                            "outside it is not one the certificate describes")


def _not_finite(c: float, kappa: float) -> None:
    raise InvalidValueError("c", c, f"gives a log-factor that is not a finite float "
                            f"(lambda = 4 kappa / sqrt(c) with kappa={kappa!r} overflows); "
                            "rescale the statistic")


def log_paths(
    w: npt.ArrayLike, m: npt.ArrayLike, c: npt.ArrayLike, *, kappa: float = 0.5
) -> FloatArray:
    """Running ``log M_t`` of many independent streams at once (one stream per row).

    The sum is sequential along the last axis (``numpy.cumsum``), so each row is
    bit-identical to feeding that stream to :meth:`EProcess.observe` one value
    at a time from a fresh process.

    Args:
        w: observations, shape ``(streams, steps)`` (or ``(steps,)``).
        m: null means, broadcast against ``w``.
        c: squared null ranges, broadcast against ``w``.
        kappa: the declared tuning constant.

    Returns:
        ``log M_t`` for ``t = 1..steps``, same shape as ``w``.

    Example:
        >>> log_paths([[1.0, 1.0]], 1.0, 1.0).tolist()
        [[-0.5, -1.0]]
    """
    lf = log_factors(w, m, c, kappa=kappa)
    out: FloatArray = np.cumsum(lf, axis=-1)
    return out


def observation_batch(w: npt.ArrayLike, m: npt.ArrayLike, c: npt.ArrayLike) -> FloatArray:
    """Stack a one-dimensional stream ``w`` with its null means and ranges, broadcast to it.

    Only the shapes are checked here; :func:`log_factors` checks the values.

    Args:
        w: observations ``W_e`` (a scalar is a stream of one).
        m: null means ``m_e``, broadcast to the shape of ``w``.
        c: squared null ranges ``C_e``, broadcast to the shape of ``w``.

    Returns:
        A float64 array of shape ``(3, len(w))``: rows ``w``, ``m``, ``c``.

    Raises:
        InvalidValueError: if ``w`` is not one-dimensional or ``m``, ``c`` do
            not broadcast to its shape.

    Example:
        >>> observation_batch([0.1, 0.2], 0.0, 1.0).tolist()
        [[0.1, 0.2], [0.0, 0.0], [1.0, 1.0]]
    """
    wa = np.atleast_1d(real_array("w", w))
    if wa.ndim != 1:
        raise InvalidValueError("w", wa.shape, "must be a one-dimensional stream")
    try:
        ma = np.broadcast_to(real_array("m", m), wa.shape)
        ca = np.broadcast_to(real_array("c", c), wa.shape)
    except ValueError as exc:
        raise InvalidValueError("m, c", "shapes", f"must broadcast to the shape of w "
                                f"{wa.shape} ({exc})") from None
    return np.stack([wa, ma, ca])


def _first_bad(values: FloatArray, ok: npt.NDArray[np.bool_]) -> float:
    return float(values[~ok].flat[0])


@final
@dataclass(frozen=True, slots=True)
class EProcessState:
    """Frozen, serializable state of an :class:`EProcess`.

    Attributes:
        kappa: the declared tuning constant.
        delta: the false-alarm level ``delta_e``.
        log_value: ``log M_t`` (0.0 at the start).
        slack: first-order bound on the rounding error accumulated in ``log_value``.
        steps: number of observations folded in.
        alarm_step: the 1-based step at which the alarm first fired, or ``None``.
    """

    kappa: float
    delta: float
    log_value: float
    slack: float
    steps: int
    alarm_step: int | None

    def __post_init__(self) -> None:
        object.__setattr__(self, "kappa", _check_kappa(self.kappa))
        object.__setattr__(self, "delta", _check_delta(self.delta))
        object.__setattr__(self, "log_value", real("log_value", self.log_value))
        object.__setattr__(self, "slack", real("slack", self.slack, lo=0.0))
        object.__setattr__(self, "steps", nonneg_int("steps", self.steps))
        if self.alarm_step is not None:
            a = nonneg_int("alarm_step", self.alarm_step)
            if not 1 <= a <= self.steps:
                raise InvalidValueError("alarm_step", self.alarm_step,
                                        f"must lie in [1, steps={self.steps}] or be None")
            object.__setattr__(self, "alarm_step", a)

    def to_json(self) -> str:
        """Serialize exactly (floats as hexadecimal), e.g. for a journal."""
        return json.dumps({
            "kappa": self.kappa.hex(), "delta": self.delta.hex(),
            "log_value": self.log_value.hex(), "slack": self.slack.hex(),
            "steps": self.steps, "alarm_step": self.alarm_step,
        }, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> EProcessState:
        """Inverse of :meth:`to_json`.

        Raises:
            InvalidValueError: if the text is not a serialized state, or a field is not
                finite or out of range (the field is named).
        """
        try:
            d = json.loads(text)
            alarm = d["alarm_step"]
            state = cls(
                kappa=float.fromhex(d["kappa"]), delta=float.fromhex(d["delta"]),
                log_value=float.fromhex(d["log_value"]), slack=float.fromhex(d["slack"]),
                steps=int(d["steps"]), alarm_step=None if alarm is None else int(alarm),
            )
        except InvalidValueError:
            raise  # a field out of range, named by the state's own checks
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidValueError("state", text, f"is not a serialized EProcessState ({exc})") from exc
        return state


@final
class EProcess:
    """Streaming e-process for anytime-valid drift detection.

    Args:
        delta: false-alarm level ``delta_e`` in (0, 1); the alarm threshold is
            ``ln(1/delta_e)``.
        kappa: declared before any data (default 0.5); ``lambda_e = 4 kappa / sqrt(C_e)``.

    Raises:
        InvalidValueError: if ``delta`` is outside (0, 1) or ``kappa <= 0``.

    The process is not itself thread-safe; the :class:`~witcert_calculus.ledger.RiskLedger`
    serializes access to the sentinels it owns.

    Lean: ``WitCert.Ledger.ville_finite_tree``.

    Example:
        >>> p = EProcess(delta=0.01)
        >>> p.observe(0.9, m=0.1, c=1.0)   # one large deviation is not yet an alarm
        False
        >>> any(p.observe(1.0, m=0.1, c=1.0) for _ in range(20))
        True
    """

    __slots__ = ("_alarm_step", "_delta", "_kappa", "_log_value", "_pen4", "_slack", "_steps",
                 "_threshold")

    theorem = VILLE_THEOREM

    def __init__(self, *, delta: float | Fraction, kappa: float = 0.5) -> None:
        self._delta = _check_delta(delta)
        self._kappa = _check_kappa(kappa)
        self._pen4 = 4.0 * self._kappa * self._kappa
        self._threshold = -math.log(self._delta)
        self._log_value = 0.0
        self._slack = 0.0
        self._steps = 0
        self._alarm_step: int | None = None

    @classmethod
    def from_state(cls, state: EProcessState) -> EProcess:
        """Resume a process from its state; it continues exactly as the original would."""
        p = cls(delta=state.delta, kappa=state.kappa)
        p._log_value = state.log_value
        p._slack = state.slack
        p._steps = state.steps
        p._alarm_step = state.alarm_step
        return p

    @property
    def state(self) -> EProcessState:
        """The current state, as a frozen value."""
        return EProcessState(kappa=self._kappa, delta=self._delta, log_value=self._log_value,
                             slack=self._slack, steps=self._steps, alarm_step=self._alarm_step)

    @property
    def log_value(self) -> float:
        """``log M_t``."""
        return self._log_value

    @property
    def threshold(self) -> float:
        """``ln(1/delta_e)``."""
        return self._threshold

    @property
    def delta(self) -> float:
        """The false-alarm level."""
        return self._delta

    @property
    def kappa(self) -> float:
        """The declared tuning constant."""
        return self._kappa

    @property
    def steps(self) -> int:
        """Observations folded in so far."""
        return self._steps

    @property
    def alarmed(self) -> bool:
        """Whether the alarm has fired (it stays fired)."""
        return self._alarm_step is not None

    @property
    def alarm_step(self) -> int | None:
        """1-based step of the first alarm, or ``None``."""
        return self._alarm_step

    def check(self, w: float, *, m: float, c: float) -> float:
        """Validate one observation and return its log-factor, without changing the process.

        Raises:
            InvalidValueError: for NaN/infinite ``w`` or ``m``, ``c`` not finite and > 0,
                ``w`` outside ``[m - sqrt(c), m + sqrt(c)]`` or a log-factor that is not finite.
        """
        wf, mf, cf = (real(n, v, allow_inf=True) if not isinstance(v, float) else v
                      for n, v in (("w", w), ("m", m), ("c", c)))
        if not math.isfinite(wf):
            raise InvalidValueError("w", w, "must be finite")
        if not math.isfinite(mf):
            raise InvalidValueError("m", m, "must be finite")
        if not (math.isfinite(cf) and cf > 0):
            raise InvalidValueError("c", c, "must be finite and > 0")
        if not abs(wf - mf) <= math.sqrt(cf) * _RANGE_ROOM:
            _out_of_range(wf, mf, cf)
        try:
            lf = _log_factor(wf, mf, cf, self._kappa)
        except OverflowError:
            lf = math.inf
        if not math.isfinite(lf):
            _not_finite(cf, self._kappa)
        return lf

    def observe(self, w: float, *, m: float, c: float) -> bool:
        """Fold in one observation in O(1); return whether the alarm has fired.

        Args:
            w: the observation ``W_e``.
            m: the null mean ``m_e`` promised by the certificate.
            c: the squared width ``C_e`` of the null range of ``W_e``.

        Returns:
            ``True`` once ``log M_t - slack >= ln(1/delta_e)`` has held at some step.

        Raises:
            InvalidValueError: as :meth:`check`; nothing is folded in then.
        """
        lf = self.check(w, m=m, c=c)
        self._steps += 1
        self._log_value = self._log_value + lf
        # |log g| <= |lf| + 4 kappa^2 bounds the magnitude of every intermediate term.
        self._slack = self._slack + STEP_SLACK * (abs(lf) + self._pen4 + abs(self._log_value))
        if self._alarm_step is None and self._log_value - self._slack >= self._threshold:
            self._alarm_step = self._steps
        return self._alarm_step is not None

    def observe_many(self, w: npt.ArrayLike, *, m: npt.ArrayLike, c: npt.ArrayLike) -> bool:
        """Fold in a sequence of observations, vectorised.

        The result (state included) is bit-identical to calling :meth:`observe`
        on each value in order.

        Raises:
            InvalidValueError: as :meth:`observe`; nothing is folded in when any value is bad.
        """
        lf = log_factors(*observation_batch(w, m, c), kappa=self._kappa)
        if lf.size == 0:
            return self._alarm_step is not None
        logs = np.cumsum(np.concatenate(([self._log_value], lf)))[1:]
        inc = STEP_SLACK * ((np.abs(lf) + self._pen4) + np.abs(logs))
        slack = np.cumsum(np.concatenate(([self._slack], inc)))[1:]
        if self._alarm_step is None:
            hit = np.flatnonzero(logs - slack >= self._threshold)
            if hit.size:
                self._alarm_step = self._steps + int(hit[0]) + 1
        self._steps += int(lf.size)
        self._log_value = float(logs[-1])
        self._slack = float(slack[-1])
        return self._alarm_step is not None


@final
class Sentinels:
    """Named drift sentinels: one :class:`EProcess` per name, each created once.

    :meth:`declare`, :meth:`require_new` and :meth:`check` validate, changing nothing;
    :meth:`add` and :meth:`observe` apply a change, live or replayed. Not thread-safe:
    the :class:`~witcert_calculus.ledger.RiskLedger` serializes access and journals first.

    Example:
        >>> book = Sentinels()
        >>> proto = Sentinels.declare("drift", delta=0.01, kappa=0.5)
        >>> book.require_new("drift")
        >>> book.add("drift", delta=proto.delta, kappa=proto.kappa)
        >>> batch = observation_batch([0.2, 0.3], 0.1, 1.0)
        >>> book.check("drift", batch)
        >>> book.observe("drift", batch).steps, book.names()
        (2, ('drift',))
    """

    __slots__ = ("_by_name",)

    def __init__(self) -> None:
        self._by_name: dict[str, EProcess] = {}

    @staticmethod
    def declare(name: object, *, delta: float | Fraction, kappa: float) -> EProcess:
        """Validate a new sentinel's name and parameters; return a fresh, unregistered process.

        Args:
            name: a short, low-cardinality name (used as a metrics label).
            delta: its false-alarm level in (0, 1).
            kappa: its declared tuning constant.

        Raises:
            InvalidValueError: for a bad name, delta or kappa (:meth:`require_new`
                checks that the name is free).
        """
        if not isinstance(name, str) or not name or not name.replace("_", "").replace(
                ".", "").replace("-", "").isalnum():
            raise InvalidValueError("name", name, "must be a non-empty [A-Za-z0-9_.-] string")
        return EProcess(delta=delta, kappa=kappa)

    def require_new(self, name: str) -> None:
        """Raise if a sentinel of this name exists.

        Raises:
            InvalidValueError: if the name is in use.
        """
        if not isinstance(name, str):
            raise InvalidValueError("name", name, "must be a sentinel's name (a str)")
        if name in self._by_name:
            raise InvalidValueError("name", name, "a sentinel of this name exists")

    def _get(self, name: str) -> EProcess:
        if not isinstance(name, str) or (p := self._by_name.get(name)) is None:
            raise InvalidValueError("name", name, "no sentinel of this name")
        return p

    def check(self, name: str, batch: FloatArray) -> None:
        """Validate a batch (rows ``w``, ``m``, ``c``) for a sentinel, changing nothing.

        Raises:
            InvalidValueError: for an unknown sentinel or bad observations.
        """
        log_factors(*batch, kappa=self._get(name).kappa)

    def state(self, name: str) -> EProcessState:
        """A sentinel's current state.

        Raises:
            InvalidValueError: for an unknown sentinel.
        """
        return self._get(name).state

    def names(self) -> tuple[str, ...]:
        """Names of the sentinels, sorted."""
        return tuple(sorted(self._by_name))

    def states(self) -> tuple[tuple[str, EProcessState], ...]:
        """``(name, state)`` of each sentinel, sorted by name."""
        return tuple((n, self._by_name[n].state) for n in sorted(self._by_name))

    def add(self, name: str, *, delta: float, kappa: float) -> None:
        """Create a sentinel (live or replayed) with parameters :meth:`declare` validated."""
        self._by_name[name] = EProcess(delta=delta, kappa=kappa)

    def observe(self, name: str, batch: FloatArray) -> EProcessState:
        """Fold a batch (rows ``w``, ``m``, ``c``) into a sentinel; return its new state.

        Raises:
            KeyError: for an unknown sentinel (a journal that names none).
            InvalidValueError: for bad observations; nothing is folded in then.
        """
        proc = self._by_name[name]
        proc.observe_many(batch[0], m=batch[1], c=batch[2])
        return proc.state
