"""Request-level risk ledger: a telescoping failure-probability budget per request.

A ledger holds one account per request, keyed by a request id that is never
reused (ids are monotone). Each account has its own budget ``delta_req`` and
its own counters. Three admission rules are enforced by the API:

1. **Empirical readings never enter.** A reading of tier ``EMPIRICAL`` either
   triggers a fallback decision (the caller takes the exact path) or degrades
   the request's verdict to ``EMPIRICAL``; the caller chooses with
   :class:`EmpiricalPolicy`. Either way it is counted as what it is and never
   as a certificate.
2. **Deterministic certificates enter at delta = 0** (Lean:
   ``WitCert.Ledger.two_layer_budget``: spend counts probabilistic events only).
3. **Probabilistic certificates draw a telescoping allowance**
   ``delta_i = delta_req / ((i+1)(i+2))``, ``i`` the 0-based index of the
   account's probabilistic events; a certificate whose own delta exceeds its
   allowance is refused. After ``n`` such events the spend is exactly
   ``delta_req (1 - 1/(n+1)) < delta_req`` at every length (Lean:
   ``WitCert.Ledger.telescope_sum_eq``, ``WitCert.Ledger.telescope_partial_lt``).
   Totals are exact :class:`fractions.Fraction` values; by the union bound the
   probability that any certificate of the request fails is at most the spend.

A request's verdict is ``CERTIFIED``, ``PARTIALLY_CERTIFIED`` (a certificate
held only on a decidable subset, or a step's bound was vacuous, i.e. saturated)
or ``EMPIRICAL``; it reports the spent budget, counts per event kind and, for
entry-level admissions, the retained fraction next to the number of vacuous
steps (retention is not coverage when the step bound is vacuous).

The ledger also owns the request's slot table (:class:`SlotTable`, fail-closed
reads, write-side charge once per write) and named drift sentinels
(:class:`EProcess`). It is thread-safe, and with ``journal=path`` every event
is committed to a SQLite WAL journal before it is applied and acknowledged;
reopening the journal replays to the identical state, and several processes can
share one journal file.

Main declarations:

- :func:`telescoping_delta`, :func:`telescoping_spent`
- :class:`RiskLedger`
- :class:`EmpiricalPolicy`, :class:`EventKind`, :class:`Decision`
- :class:`Admission`, :class:`EntryAdmission`, :class:`EventCounts`, :class:`Verdict`,
  :class:`LedgerStats`
- re-exported: :class:`SlotTable`, :class:`SlotState`, :class:`ReadGrant`,
  :class:`SlotRead`, :class:`EProcess`, :class:`EProcessState`,
  :class:`EntryCertification`, :func:`certify_entries`, :func:`certify_step`,
  :func:`tradeoff_curve`, :class:`Aggregate`
"""

from __future__ import annotations

import enum
import math
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, final

import numpy as np
import numpy.typing as npt

from witcert_calculus.contracts import Reading, Regime
from witcert_calculus.entries import (
    ENTRY_THEOREM,
    Aggregate,
    EntryCertification,
    certify_entries,
    certify_step,
    tradeoff_curve,
)
from witcert_calculus.eprocess import EProcess, EProcessState, log_factors
from witcert_calculus.errors import (
    BudgetExceededError,
    InvalidValueError,
    JournalError,
    ReusedRequestIdError,
    UnknownRequestError,
)
from witcert_calculus.journal import Journal, JournalRow
from witcert_calculus.metrics import Metric, metric_info
from witcert_calculus.slots import ReadGrant, SlotRead, SlotRecord, SlotState, SlotTable
from witcert_calculus.theorems import TELESCOPE_PARTIAL_LT, TELESCOPE_SUM_EQ, TWO_LAYER_BUDGET
from witcert_calculus.tiers import Composition, Evidence, Tier, decide_tier, weakest

__all__ = [
    "Admission",
    "Aggregate",
    "Decision",
    "EProcess",
    "EProcessState",
    "EmpiricalPolicy",
    "EntryAdmission",
    "EntryCertification",
    "EventCounts",
    "EventKind",
    "LedgerStats",
    "ReadGrant",
    "RiskLedger",
    "SPEND_THEOREMS",
    "SlotRead",
    "SlotRecord",
    "SlotState",
    "SlotTable",
    "Verdict",
    "certify_entries",
    "certify_step",
    "telescoping_delta",
    "telescoping_spent",
    "tradeoff_curve",
]

SPEND_THEOREMS: tuple[str, ...] = (TELESCOPE_SUM_EQ, TELESCOPE_PARTIAL_LT,
                                   TWO_LAYER_BUDGET)
"""Lean theorems behind the spend rules."""


# ----------------------------------------------------------------------------- budget


def _delta_req(value: object) -> Fraction:
    """A request budget: an exact number in the open interval (0, 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, Fraction, str)):
        raise InvalidValueError("delta_req", value, "must be a number in (0, 1)")
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidValueError("delta_req", value, "must be finite, in (0, 1)")
    try:
        fr = Fraction(value)
    except (ValueError, ZeroDivisionError) as exc:
        raise InvalidValueError("delta_req", value, f"is not a number ({exc})") from None
    if not 0 < fr < 1:
        raise InvalidValueError("delta_req", value, "must lie in the open interval (0, 1)")
    return fr


def telescoping_delta(i: int, delta_req: Fraction | int | float | str) -> Fraction:
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
    if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or i < 0:
        raise InvalidValueError("i", i, "must be an int >= 0")
    k = int(i)
    return _delta_req(delta_req) / ((k + 1) * (k + 2))


def telescoping_spent(n: int, delta_req: Fraction | int | float | str) -> Fraction:
    """Closed form of the spend after ``n`` probabilistic events: ``delta_req (1 - 1/(n+1))``.

    Lean: ``WitCert.Ledger.telescope_sum_eq``.

    Example:
        >>> telescoping_spent(3, "1/100")
        Fraction(3, 400)
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise InvalidValueError("n", n, "must be an int >= 0")
    return _delta_req(delta_req) * (1 - Fraction(1, int(n) + 1))


# ----------------------------------------------------------------------------- value types


@final
class EmpiricalPolicy(enum.Enum):
    """What an empirical reading does to a request (chosen by the caller)."""

    FALLBACK = "fallback"
    """Take the exact path: the compressed value is not used, the verdict is unchanged."""
    DEGRADE = "degrade"
    """Use the value, and degrade the request's verdict to ``EMPIRICAL``."""


@final
class EventKind(enum.Enum):
    """Kinds of admission events, counted per request."""

    DETERMINISTIC = "deterministic"
    PROBABILISTIC = "probabilistic"
    EMPIRICAL_FALLBACK = "empirical_fallback"
    EMPIRICAL_DEGRADED = "empirical_degraded"


@final
class Decision(enum.Enum):
    """What the caller does with the admitted object."""

    USE = "use"
    """Use the compressed value (or, for entries, the kept ones)."""
    FALLBACK = "fallback"
    """Use the exact path."""


@final
@dataclass(frozen=True, slots=True)
class Admission:
    """Acknowledgement of one admission (durable when the ledger has a journal).

    Attributes:
        request_id: the account.
        ordinal: 0-based position of this event among the account's admissions.
        kind: deterministic, probabilistic, empirical fallback or empirical degraded.
        decision: use the value or fall back.
        tier: the tier of the admitted reading.
        charged: the telescoping allowance drawn (0 unless probabilistic).
        spent: the account's exact spend after this event.
        prob_index: the index ``i`` of a probabilistic event, else ``None``.
        token: the caller's idempotency token, if any.
    """

    request_id: int
    ordinal: int
    kind: EventKind
    decision: Decision
    tier: Tier
    charged: Fraction
    spent: Fraction
    prob_index: int | None
    token: str | None


@final
@dataclass(frozen=True, slots=True)
class EntryAdmission:
    """Acknowledgement of an entry-level (or whole-step) admission.

    Attributes:
        admission: the ledger event (the batch is charged once).
        certification: which entries keep the compressed value.
        step: the step's bound as a reading (tier decided from its evidence and
            saturation), or ``None`` for an empirical batch.
    """

    admission: Admission
    certification: EntryCertification
    step: Reading[Any] | None


@final
@dataclass(frozen=True, slots=True)
class EventCounts:
    """Admissions of a request by kind, plus how many certificates were saturated."""

    deterministic: int = 0
    probabilistic: int = 0
    empirical_fallback: int = 0
    empirical_degraded: int = 0
    saturated: int = 0

    @property
    def total(self) -> int:
        """All admissions."""
        return (self.deterministic + self.probabilistic + self.empirical_fallback
                + self.empirical_degraded)


@final
@dataclass(frozen=True, slots=True)
class Verdict:
    """A request's verdict.

    A request starts ``CERTIFIED`` (nothing uncertified has been used) and only
    moves down: a restricted certificate or a saturated (vacuous) one caps it at
    ``PARTIALLY_CERTIFIED``, an empirical reading used under
    :attr:`EmpiricalPolicy.DEGRADE` sets it to ``EMPIRICAL``.

    Attributes:
        request_id: the account.
        tier: ``CERTIFIED``, ``PARTIALLY_CERTIFIED`` or ``EMPIRICAL``.
        delta_req: the budget.
        spent: exact spend, ``delta_req (1 - 1/(n+1))`` after ``n`` probabilistic events.
        counts: admissions by kind.
        entries: entries offered to entry-level admission.
        entries_kept: entries that kept the compressed value.
        retained_fraction: ``entries_kept / entries`` (``None`` when no entries
            were offered). Retention is not coverage: read it with ``vacuous_steps``.
        steps: entry batches admitted.
        vacuous_steps: batches whose step bound reached the metric's saturation.
        worst_step_bound: largest step bound over the batches (0.0 if none).
        closed: whether the request was closed.
    """

    request_id: int
    tier: Tier
    delta_req: Fraction
    spent: Fraction
    counts: EventCounts
    entries: int
    entries_kept: int
    retained_fraction: Fraction | None
    steps: int
    vacuous_steps: int
    worst_step_bound: float
    closed: bool

    @property
    def remaining(self) -> Fraction:
        """``delta_req - spent`` (always > 0)."""
        return self.delta_req - self.spent


@final
@dataclass(frozen=True, slots=True)
class LedgerStats:
    """Aggregates over the whole ledger (no per-request detail).

    Attributes:
        requests: requests ever opened.
        open_requests: requests open now.
        counts: admissions by kind, over all requests.
        open_by_tier: ``(tier, open requests with that verdict)``, strongest first.
        entries: entries offered to entry-level admission.
        entries_kept: entries that kept the compressed value.
        steps: entry batches admitted.
        vacuous_steps: batches whose step bound reached saturation.
        worst_spent_fraction: largest ``spent / delta_req`` over open requests (< 1).
        slots: ``(state, slots in that state)``.
        reads_own: slot reads by their owner (this process).
        reads_shared: slot reads of another request's slot (this process).
        slot_writes: slot writes applied.
        events: events applied.
        sentinels: ``(name, state)`` of each drift sentinel.
    """

    requests: int
    open_requests: int
    counts: EventCounts
    open_by_tier: tuple[tuple[Tier, int], ...]
    entries: int
    entries_kept: int
    steps: int
    vacuous_steps: int
    worst_spent_fraction: Fraction
    slots: tuple[tuple[SlotState, int], ...]
    reads_own: int
    reads_shared: int
    slot_writes: int
    events: int
    sentinels: tuple[tuple[str, EProcessState], ...]


# ----------------------------------------------------------------------------- accounts


@final
class _Account:
    __slots__ = ("allowance", "closed", "delta_req", "ordinal", "counts", "entries", "entries_kept",
                 "request_id", "spent", "steps", "tier", "vacuous_steps", "worst_step_bound")

    def __init__(self, request_id: int, delta_req: Fraction) -> None:
        self.request_id = request_id
        self.delta_req = delta_req
        self.spent = Fraction(0)
        self.allowance = delta_req / 2  # telescoping_delta(0, delta_req), kept current
        self.ordinal = 0
        self.counts = [0, 0, 0, 0, 0]  # det, prob, emp-fallback, emp-degraded, saturated
        self.tier = Tier.CERTIFIED
        self.entries = 0
        self.entries_kept = 0
        self.steps = 0
        self.vacuous_steps = 0
        self.worst_step_bound = 0.0
        self.closed = False

    def verdict(self) -> Verdict:
        c = self.counts
        return Verdict(
            request_id=self.request_id, tier=self.tier, delta_req=self.delta_req,
            spent=self.spent,
            counts=EventCounts(deterministic=c[0], probabilistic=c[1], empirical_fallback=c[2],
                               empirical_degraded=c[3], saturated=c[4]),
            entries=self.entries, entries_kept=self.entries_kept,
            retained_fraction=None if self.entries == 0 else Fraction(self.entries_kept,
                                                                      self.entries),
            steps=self.steps, vacuous_steps=self.vacuous_steps,
            worst_step_bound=self.worst_step_bound, closed=self.closed)


_KIND_INDEX = {EventKind.DETERMINISTIC: 0, EventKind.PROBABILISTIC: 1,
               EventKind.EMPIRICAL_FALLBACK: 2, EventKind.EMPIRICAL_DEGRADED: 3}


def _frac(value: Fraction | str) -> Fraction:
    # Events hold exact objects in memory and their text form after a journal round trip.
    return value if isinstance(value, Fraction) else Fraction(value)


def _tier(value: Tier | int) -> Tier:
    return value if isinstance(value, Tier) else Tier(int(value))


def _kind(value: EventKind | str) -> EventKind:
    return value if isinstance(value, EventKind) else EventKind(value)


def _token(token: object) -> str | None:
    if token is None:
        return None
    if not isinstance(token, str) or not token:
        raise InvalidValueError("token", token, "must be a non-empty str or None")
    return token


def _request_id(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidValueError("request_id", value, "must be an int")
    return int(value)  # pyright: ignore[reportUnknownArgumentType]


Event = tuple[str, dict[str, Any], bytes, str | None]


# ----------------------------------------------------------------------------- the ledger


@final
class RiskLedger:
    """Per-request failure-probability ledger with slot state, sentinels and an optional journal.

    Args:
        n_slots: size of the compressed pool's slot table (``ledger.slots``).
        journal: path of a SQLite journal; events are committed there before
            they are acknowledged, and an existing journal is replayed on open.
        busy_timeout_s: how long to wait for another process's write lock.

    Raises:
        JournalError: if the journal cannot be opened or does not replay.

    Example:
        >>> from witcert_calculus.contracts import Reading
        >>> from witcert_calculus.metrics import AttentionTV, AtConsume
        >>> from witcert_calculus.tiers import Proof
        >>> ledger = RiskLedger()
        >>> r = ledger.open_request(delta_req="1/100")
        >>> cert = Reading(AttentionTV[AtConsume], 0.01,
        ...                evidence=Proof("WitCert.Meters.tv_eform_sound"),
        ...                delta=ledger.next_allowance(r))
        >>> ledger.admit(r, cert).charged
        Fraction(1, 200)
        >>> ledger.verdict(r).tier
        <Tier.CERTIFIED: 3>
    """

    __slots__ = ("_accounts", "_journal", "_key", "_last_id", "_lock", "_seq", "_sentinels",
                 "_slots", "_tokens")

    def __init__(self, *, n_slots: int = 0, journal: str | os.PathLike[str] | None = None,
                 busy_timeout_s: float = 60.0) -> None:
        self._lock = threading.RLock()
        self._accounts: dict[int, _Account] = {}
        self._last_id = 0
        self._seq = 0
        self._tokens: dict[str, Admission] = {}
        self._sentinels: dict[str, EProcess] = {}
        self._key = object()
        self._slots = SlotTable(n_slots, directory=self, lock=self._lock, key=self._key)
        self._journal: Journal | None = None
        if journal is not None:
            self._journal = Journal(journal, n_slots=n_slots, busy_timeout_s=busy_timeout_s)
            try:
                self.sync()
            except BaseException:
                self.close()
                raise

    # ------------------------------------------------------------------ plumbing

    @property
    def slots(self) -> SlotTable:
        """The slot table of the compressed pool."""
        return self._slots

    @property
    def journal_path(self) -> str | None:
        """Path of the journal, if any."""
        return None if self._journal is None else self._journal.path

    @property
    def applied_seq(self) -> int:
        """Sequence number of the last event applied (equals the number of events)."""
        return self._seq

    def close(self) -> None:
        """Close the journal connection (the in-memory state stays readable)."""
        with self._lock:
            if self._journal is not None:
                self._journal.close()
                self._journal = None

    def sync(self) -> None:
        """Apply events that other processes committed to the shared journal.

        Raises:
            JournalError: if an event does not replay.
        """
        with self._lock:
            if self._journal is not None:
                for row in self._journal.since(self._seq):
                    self._apply_row(row)

    def _apply_row(self, row: JournalRow) -> None:
        if row.seq != self._seq + 1:
            raise JournalError(_where(self), f"event {row.seq} follows {self._seq}: gap in the "
                               "sequence")
        try:
            self._apply((row.op, row.payload, row.data, row.token))
        except JournalError:
            raise
        except Exception as exc:  # a journal that does not replay is a journal error
            raise JournalError(_where(self), f"event {row.seq} ({row.op}) does not replay: "
                               f"{exc}") from exc
        self._seq = row.seq

    def _commit(self, build: Callable[[], Event | Admission]) -> Any:
        """Validate against the newest state, make durable, apply, return the result."""
        with self._lock:
            if self._journal is None:
                ev = build()
                if isinstance(ev, Admission):
                    return ev
                self._seq += 1
                return self._apply(ev)
            with self._journal.transaction():
                for row in self._journal.since(self._seq):
                    self._apply_row(row)
                ev = build()
                if isinstance(ev, Admission):
                    return ev
                seq = self._journal.append(ev[0], ev[1], ev[2], ev[3])
            # committed: durable before it is applied and acknowledged
            if seq != self._seq + 1:
                raise JournalError(_where(self), f"appended event {seq} after {self._seq}")
            self._seq = seq
            return self._apply(ev)

    # ------------------------------------------------------------------ directory

    def require_known(self, request_id: int) -> None:
        """Raise unless ``request_id`` is an open request.

        Raises:
            UnknownRequestError: for an id never opened, or already closed.
        """
        acct = self._accounts.get(request_id) if isinstance(request_id, int) else None
        if acct is None or acct.closed:
            raise UnknownRequestError(request_id)

    def _account(self, request_id: object) -> _Account:
        rid = _request_id(request_id)
        acct = self._accounts.get(rid)
        if acct is None or acct.closed:
            raise UnknownRequestError(request_id)
        return acct

    # ------------------------------------------------------------------ requests

    def open_request(self, *, delta_req: Fraction | int | float | str,
                     request_id: int | None = None) -> int:
        """Open an account with budget ``delta_req``; return its request id.

        Args:
            delta_req: the request's failure-probability budget, in (0, 1);
                taken exactly (``"1/100"`` or ``Fraction(1, 100)`` avoid float
                rounding).
            request_id: an explicit id, which must exceed every id used before;
                by default the next id is assigned.

        Raises:
            InvalidValueError: if ``delta_req`` is outside (0, 1), NaN or infinite.
            ReusedRequestIdError: if ``request_id`` does not exceed the last id.
        """
        budget = _delta_req(delta_req)
        want = None if request_id is None else _request_id(request_id)

        def build() -> Event:
            rid = self._last_id + 1 if want is None else want
            if rid <= self._last_id:
                raise ReusedRequestIdError(rid, self._last_id)
            if rid < 1:
                raise InvalidValueError("request_id", rid, "must be >= 1")
            return ("open", {"rid": rid, "delta_req": str(budget)}, b"", None)

        result: int = self._commit(build)
        return result

    def close_request(self, request_id: int) -> Verdict:
        """Close an account and return its final verdict; the id is never reused.

        Raises:
            UnknownRequestError: if the request is unknown or already closed.
        """
        def build() -> Event:
            acct = self._account(request_id)
            return ("close", {"rid": acct.request_id}, b"", None)

        result: Verdict = self._commit(build)
        return result

    def next_allowance(self, request_id: int) -> Fraction:
        """The allowance the request's next probabilistic certificate may use.

        Raises:
            UnknownRequestError: if the request is not open.
        """
        with self._lock:
            self.sync()
            acct = self._account(request_id)
            return acct.allowance

    def verdict(self, request_id: int) -> Verdict:
        """The request's current verdict (also for closed requests).

        Raises:
            UnknownRequestError: for an id that was never opened.
        """
        with self._lock:
            self.sync()
            acct = self._accounts.get(_request_id(request_id))
            if acct is None:
                raise UnknownRequestError(request_id)
            return acct.verdict()

    def spent(self, request_id: int) -> Fraction:
        """The request's exact spend."""
        return self.verdict(request_id).spent

    def request_ids(self) -> tuple[int, ...]:
        """All request ids ever opened, ascending."""
        with self._lock:
            self.sync()
            return tuple(sorted(self._accounts))

    # ------------------------------------------------------------------ admissions

    def _classify(self, acct: _Account, reading: Reading[Any], policy: EmpiricalPolicy,
                  ) -> tuple[EventKind, Fraction, Tier]:
        """Admission rule for one reading: its kind, the allowance charged, the tier it caps to."""
        if not isinstance(reading, Reading):
            raise InvalidValueError("reading", reading, "must be a Reading")
        if not isinstance(policy, EmpiricalPolicy):
            raise InvalidValueError("on_empirical", policy, "must be an EmpiricalPolicy")
        intrinsic = decide_tier(reading.evidence)
        if reading.regime is not Regime.BOUND or intrinsic is Tier.EMPIRICAL:
            # Rule 1: empirical objects never enter the budget.
            if policy is EmpiricalPolicy.FALLBACK:
                return EventKind.EMPIRICAL_FALLBACK, Fraction(0), Tier.CERTIFIED
            return EventKind.EMPIRICAL_DEGRADED, Fraction(0), Tier.EMPIRICAL
        cap = Tier.PARTIALLY_CERTIFIED if reading.tier is Tier.SATURATED else intrinsic
        delta = Fraction(reading.delta)
        if delta == 0:
            # Rule 2: WitCert.Ledger.two_layer_budget.
            return EventKind.DETERMINISTIC, Fraction(0), cap
        # Rule 3: WitCert.Ledger.telescope_sum_eq / telescope_partial_lt.
        allowance = acct.allowance
        if delta > allowance:
            raise BudgetExceededError(
                acct.request_id, str(acct.spent), str(delta),
                f"{acct.delta_req} (the next telescoping allowance is {allowance})")
        return EventKind.PROBABILISTIC, allowance, cap

    def admit(self, request_id: int, reading: Reading[Any], *,
              on_empirical: EmpiricalPolicy = EmpiricalPolicy.FALLBACK,
              token: str | None = None) -> Admission:
        """Admit one reading into a request's account.

        Args:
            request_id: an open request.
            reading: the certificate (or empirical reading).
            on_empirical: what an empirical reading does: fall back (default;
                the caller takes the exact path) or degrade the verdict.
            token: idempotency token; admitting again with a token that was
                already admitted returns the original acknowledgement and
                changes nothing (safe retries after a crash).

        Returns:
            The acknowledgement: kind, decision, charge and the exact spend.

        Raises:
            UnknownRequestError: if the request is not open.
            BudgetExceededError: if a probabilistic reading's delta exceeds the
                request's next telescoping allowance.
            InvalidValueError: for a non-reading, bad policy or bad token.
            JournalError: if the event cannot be made durable (it is then not applied).
        """
        tok = _token(token)

        def build() -> Event | Admission:
            if tok is not None and tok in self._tokens:
                return self._prior(tok)
            acct = self._account(request_id)
            kind, charged, cap = self._classify(acct, reading, on_empirical)
            payload = {"rid": acct.request_id, "ord": acct.ordinal, "kind": kind,
                       "charged": charged, "cap": cap, "tier": reading.tier,
                       "saturated": reading.tier is Tier.SATURATED}
            return ("admit", payload, b"", tok)

        result: Admission = self._commit(build)
        return result

    def admission(self, token: str) -> Admission | None:
        """The acknowledgement recorded under an idempotency token, or ``None``.

        A client that crashed before it saw an acknowledgement can ask here
        whether its admission was recorded (or simply retry with the same token).
        """
        tok = _token(token)
        with self._lock:
            self.sync()
            return None if tok is None else self._tokens.get(tok)

    def _prior(self, tok: str) -> Admission:
        return self._tokens[tok]

    def admit_entries(self, request_id: int, bounds: npt.ArrayLike, *, threshold: float,
                      metric: type[Metric[Any]], evidence: Evidence,
                      delta: Fraction | float | int = 0,
                      slots: npt.ArrayLike | None = None,
                      aggregate: Aggregate = Aggregate.SUM, whole_step: bool = False,
                      on_empirical: EmpiricalPolicy = EmpiricalPolicy.FALLBACK,
                      token: str | None = None) -> EntryAdmission:
        """Admit a step's per-entry bounds; each entry keeps or falls back on its own.

        Entries whose bound is ``<= threshold`` keep the compressed value;
        the others fall back to exact bytes (with ``slots``, they are written
        ``KEPT_EXACT`` before any read can see them). The step's bound (the
        aggregate of the kept bounds) becomes a reading of ``metric`` whose tier
        is decided from ``evidence`` and the metric's saturation; the batch is
        charged once, by the same rules as :meth:`admit`. With
        ``whole_step=True`` the step keeps all entries or none.

        Args:
            request_id: an open request.
            bounds: per-entry bounds (``>= 0``, ``+inf`` for no bound).
            threshold: per-entry (or, whole-step, per-step) threshold.
            metric: metric of the bounds, e.g. ``AttentionTV[AtConsume]``.
            evidence: what certifies the per-entry bounds.
            delta: failure probability of those bounds (0 for deterministic).
            slots: pool slots the entries are written to (one per entry), or ``None``.
            aggregate: how entry bounds combine into the step bound.
            whole_step: certify the step as a whole instead of per entry.
            on_empirical: for empirical evidence: fall back (no entry kept) or
                degrade the verdict (entries kept by threshold).
            token: idempotency token (see :meth:`admit`).

        Raises:
            InvalidValueError: for NaN or negative bounds, a bad threshold, bad
                or repeated slots, or a slot count that does not match.
            UnknownRequestError, BudgetExceededError, JournalError: as :meth:`admit`.

        Lean: ``WitCert.Ledger.entry_fallback_sound`` (with the spend theorems).
        """
        tok = _token(token)
        info = metric_info(metric)
        cert_fn = certify_step if whole_step else certify_entries
        cert = cert_fn(bounds, threshold=threshold, aggregate=aggregate,
                       saturation=info.saturation)
        b = np.asarray(bounds, dtype=np.float64)
        idx: npt.NDArray[np.int64] | None = None
        if slots is not None:
            idx = self._slots.validate_slots(slots)
            if idx.size != cert.n_entries:
                raise InvalidValueError("slots", f"{idx.size} slots",
                                        f"must name one slot per entry ({cert.n_entries})")
        step: Reading[Any] = Reading(metric, cert.step_bound,
                                     evidence=Composition((evidence,), theorem=ENTRY_THEOREM),
                                     delta=delta)

        def build() -> Event | Admission:
            if tok is not None and tok in self._tokens:
                return self._prior(tok)
            acct = self._account(request_id)
            kind, charged, cap = self._classify(acct, step, on_empirical)
            keep = cert.keep
            if kind is EventKind.EMPIRICAL_FALLBACK:
                keep = np.zeros(cert.n_entries, dtype=np.bool_)
            n_kept = int(np.count_nonzero(keep))
            payload = {"rid": acct.request_id, "ord": acct.ordinal, "kind": kind,
                       "charged": charged, "cap": cap, "tier": step.tier,
                       "saturated": step.tier is Tier.SATURATED, "n": cert.n_entries,
                       "kept": n_kept, "step_bound": float(cert.step_bound).hex(),
                       "vacuous": bool(cert.vacuous), "slots": idx is not None}
            data = b""
            if idx is not None:
                data = (idx.astype("<i8").tobytes() + np.packbits(keep).tobytes()
                        + np.where(keep, b, 0.0).astype("<f8").tobytes())
            return ("entries", payload, data, tok)

        adm: Admission = self._commit(build)
        if adm.kind is EventKind.EMPIRICAL_FALLBACK:
            none = np.zeros(cert.n_entries, dtype=np.bool_)
            none.setflags(write=False)
            cert = EntryCertification(
                keep=none, n_entries=cert.n_entries, n_kept=0, retained_fraction=Fraction(0),
                step_bound=0.0, threshold=cert.threshold, aggregate=cert.aggregate,
                whole_step=cert.whole_step, vacuous=False)
        return EntryAdmission(admission=adm, certification=cert,
                              step=None if adm.kind in (EventKind.EMPIRICAL_FALLBACK,
                                                        EventKind.EMPIRICAL_DEGRADED) else step)

    def evict(self, request_id: int, slots: npt.ArrayLike) -> None:
        """Return slots to ``UNWRITTEN`` (generation bumped, outstanding grants go stale).

        Raises:
            UnknownRequestError: if the request is not open.
            InvalidValueError: for bad or repeated slots.
        """
        idx = self._slots.validate_slots(slots)

        def build() -> Event:
            acct = self._account(request_id)
            return ("evict", {"rid": acct.request_id}, idx.astype("<i8").tobytes(), None)

        self._commit(build)

    # ------------------------------------------------------------------ sentinels

    def add_sentinel(self, name: str, *, delta: float | Fraction, kappa: float = 0.5) -> None:
        """Create a named drift sentinel (an :class:`EProcess`); ``kappa`` is fixed here.

        Args:
            name: a short, low-cardinality name (used as a metrics label).
            delta: its false-alarm level in (0, 1).
            kappa: its declared tuning constant.

        Raises:
            InvalidValueError: for a bad name, delta or kappa, or a name in use.
        """
        if not isinstance(name, str) or not name or not name.replace("_", "").replace(
                ".", "").replace("-", "").isalnum():
            raise InvalidValueError("name", name, "must be a non-empty [A-Za-z0-9_.-] string")
        proto = EProcess(delta=delta, kappa=kappa)

        def build() -> Event:
            if name in self._sentinels:
                raise InvalidValueError("name", name, "a sentinel of this name exists")
            return ("sentinel", {"name": name, "delta": proto.delta.hex(),
                                 "kappa": proto.kappa.hex()}, b"", None)

        self._commit(build)

    def observe(self, name: str, w: npt.ArrayLike, *, m: npt.ArrayLike,
                c: npt.ArrayLike) -> EProcessState:
        """Feed observations to a sentinel (journaled); return its new state.

        Raises:
            InvalidValueError: for an unknown sentinel or bad observations.
        """
        wa = np.atleast_1d(np.asarray(w, dtype=np.float64))
        if wa.ndim != 1:
            raise InvalidValueError("w", wa.shape, "must be a one-dimensional stream")
        try:
            ma = np.broadcast_to(np.asarray(m, dtype=np.float64), wa.shape)
            ca = np.broadcast_to(np.asarray(c, dtype=np.float64), wa.shape)
        except ValueError as exc:
            raise InvalidValueError("m, c", "shapes", f"must broadcast to the shape of w "
                                    f"{wa.shape} ({exc})") from None

        def build() -> Event:
            p = self._sentinels.get(name)
            if p is None:
                raise InvalidValueError("name", name, "no sentinel of this name")
            log_factors(wa, ma, ca, kappa=p.kappa)  # validate before anything is recorded
            data = np.stack([wa, ma, ca]).astype("<f8").tobytes()
            return ("observe", {"name": name, "n": int(wa.size)}, data, None)

        result: EProcessState = self._commit(build)
        return result

    def sentinel(self, name: str) -> EProcessState:
        """A sentinel's current state.

        Raises:
            InvalidValueError: for an unknown sentinel.
        """
        with self._lock:
            self.sync()
            p = self._sentinels.get(name)
            if p is None:
                raise InvalidValueError("name", name, "no sentinel of this name")
            return p.state

    def sentinel_names(self) -> tuple[str, ...]:
        """Names of the sentinels, sorted."""
        with self._lock:
            self.sync()
            return tuple(sorted(self._sentinels))

    # ------------------------------------------------------------------ export

    def prometheus(self) -> str:
        """Prometheus text exposition of the ledger's gauges and counters (``witcert_`` prefix)."""
        from witcert_calculus.prometheus import prometheus_text

        return prometheus_text(self)

    def stats(self) -> LedgerStats:
        """Aggregate gauges and counters over all requests (what :meth:`prometheus` exports)."""
        with self._lock:
            self.sync()
            counts = [0, 0, 0, 0, 0]
            tiers = {Tier.CERTIFIED: 0, Tier.PARTIALLY_CERTIFIED: 0, Tier.EMPIRICAL: 0}
            open_n = entries = kept = steps = vac = 0
            worst = Fraction(0)
            for a in self._accounts.values():
                for k in range(5):
                    counts[k] += a.counts[k]
                entries += a.entries
                kept += a.entries_kept
                steps += a.steps
                vac += a.vacuous_steps
                if not a.closed:
                    open_n += 1
                    tiers[a.tier] += 1
                    worst = max(worst, a.spent / a.delta_req)
            slot_counts = self._slots.counts()
            own, shared = self._slots.reads
            return LedgerStats(
                requests=len(self._accounts), open_requests=open_n,
                counts=EventCounts(deterministic=counts[0], probabilistic=counts[1],
                                   empirical_fallback=counts[2], empirical_degraded=counts[3],
                                   saturated=counts[4]),
                open_by_tier=tuple(sorted(tiers.items(), reverse=True)),
                entries=entries, entries_kept=kept, steps=steps, vacuous_steps=vac,
                worst_spent_fraction=worst,
                slots=tuple(sorted(slot_counts.items())), reads_own=own, reads_shared=shared,
                slot_writes=self._slots.writes, events=self._seq,
                sentinels=tuple((n, self._sentinels[n].state) for n in sorted(self._sentinels)))

    # ------------------------------------------------------------------ apply (live and replay)

    def _apply(self, ev: Event) -> Any:
        op, p, data, tok = ev
        if op == "open":
            rid = int(p["rid"])
            if rid <= self._last_id:
                raise JournalError(_where(self), f"request id {rid} reused")
            self._last_id = rid
            self._accounts[rid] = _Account(rid, _delta_req(p["delta_req"]))
            return rid
        if op in ("admit", "entries"):
            return self._apply_admission(op, p, data, tok)
        if op == "close":
            acct = self._live(int(p["rid"]))
            acct.closed = True
            return acct.verdict()
        if op == "evict":
            self._live(int(p["rid"]))
            self._slots.apply_evict(self._key, np.frombuffer(data, dtype="<i8").astype(np.int64))
            return None
        if op == "sentinel":
            self._sentinels[str(p["name"])] = EProcess(delta=float.fromhex(p["delta"]),
                                                      kappa=float.fromhex(p["kappa"]))
            return None
        if op == "observe":
            n = int(p["n"])
            arr = np.frombuffer(data, dtype="<f8").astype(np.float64).reshape(3, n)
            proc = self._sentinels[str(p["name"])]
            proc.observe_many(arr[0], m=arr[1], c=arr[2])
            return proc.state
        raise JournalError(_where(self), f"unknown event kind {op!r}")

    def _live(self, rid: int) -> _Account:
        acct = self._accounts.get(rid)
        if acct is None or acct.closed:
            raise JournalError(_where(self), f"event for request {rid}, which is not open")
        return acct

    def _apply_admission(self, op: str, p: dict[str, Any], data: bytes,
                         tok: str | None) -> Admission:
        acct = self._live(int(p["rid"]))
        if int(p["ord"]) != acct.ordinal:
            raise JournalError(_where(self), f"request {acct.request_id}: event ordinal "
                               f"{p['ord']} applied at ordinal {acct.ordinal} (applied twice?)")
        kind = _kind(p["kind"])
        charged = _frac(p["charged"])
        prob_index: int | None = None
        if kind is EventKind.PROBABILISTIC:
            prob_index = acct.counts[1]
            expected = acct.allowance  # telescoping_delta(prob_index, delta_req)
            if charged is not expected and charged != expected:
                raise JournalError(_where(self), f"request {acct.request_id}: charge {charged} "
                                   f"is not the allowance {expected}")
        elif charged != 0:
            raise JournalError(_where(self), f"{kind.value} event charged {charged}")
        new_spent = acct.spent + charged
        if new_spent >= acct.delta_req:  # cannot happen: WitCert.Ledger.telescope_partial_lt
            raise JournalError(_where(self), f"request {acct.request_id}: spend {new_spent} "
                               f"reaches its budget {acct.delta_req}")
        if op == "entries":
            n, kept = int(p["n"]), int(p["kept"])
            if p["slots"]:
                idx = np.frombuffer(data[:8 * n], dtype="<i8").astype(np.int64)
                nb = (n + 7) // 8
                keep = np.unpackbits(np.frombuffer(data[8 * n:8 * n + nb], dtype=np.uint8),
                                     count=n).astype(np.bool_)
                bnd = np.frombuffer(data[8 * n + nb:], dtype="<f8").astype(np.float64)
                if int(np.count_nonzero(keep)) != kept or bnd.size != n:
                    raise JournalError(_where(self), "entry event does not match its arrays")
                self._slots.apply_write(self._key, acct.request_id, idx, keep, bnd)
            acct.entries += n
            acct.entries_kept += kept
            acct.steps += 1
            if p["vacuous"] and kind is not EventKind.EMPIRICAL_FALLBACK:
                acct.vacuous_steps += 1
            if kind is not EventKind.EMPIRICAL_FALLBACK:
                acct.worst_step_bound = max(acct.worst_step_bound, float.fromhex(p["step_bound"]))
        acct.spent = new_spent
        acct.counts[_KIND_INDEX[kind]] += 1
        if kind is EventKind.PROBABILISTIC:
            i = acct.counts[1]
            acct.allowance = acct.delta_req / ((i + 1) * (i + 2))
        if p["saturated"] and kind in (EventKind.DETERMINISTIC, EventKind.PROBABILISTIC):
            acct.counts[4] += 1
        acct.tier = weakest(acct.tier, _tier(p["cap"]))
        ordinal = acct.ordinal
        acct.ordinal += 1
        adm = Admission(request_id=acct.request_id, ordinal=ordinal, kind=kind,
                        decision=Decision.FALLBACK if kind is EventKind.EMPIRICAL_FALLBACK
                        else Decision.USE,
                        tier=_tier(p["tier"]), charged=charged, spent=new_spent,
                        prob_index=prob_index, token=tok)
        if tok is not None:
            self._tokens[tok] = adm
        return adm


def _where(ledger: RiskLedger) -> str:
    # The journal path for error messages.
    return ledger.journal_path or "<memory>"

