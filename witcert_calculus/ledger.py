"""Request-level risk ledger: a telescoping failure-probability budget per request.

A ledger holds one account per request, keyed by a request id that is never
reused (ids are monotone), each with its own budget ``delta_req`` and counters.
Three admission rules are enforced by the API:

1. **Empirical readings never enter.** A reading of tier ``EMPIRICAL`` either
   triggers a fallback decision (the caller takes the exact path) or degrades
   the request's verdict to ``EMPIRICAL``; the caller chooses with
   :class:`~witcert_calculus.accounting.records.EmpiricalPolicy`. Either way it is counted
   as what it is and never as a certificate.
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

A certificate built for ``next_allowance(r)`` is refused with
:class:`~witcert_calculus.errors.AllowanceMovedError` when other admissions drew
that allowance first; :meth:`RiskLedger.admit_next` reads the allowance and
admits in one step.

The ledger also owns the slot table (fail-closed reads, write-side charge once
per write, and ownership: a request writes or evicts only its own and free
slots, and closing it frees its slots) and named drift sentinels. It is
thread-safe; with ``journal=path`` every event is committed to a SQLite WAL
journal before it is applied and acknowledged (hash-chained, with a high-water
mark beside it; see :mod:`~witcert_calculus.accounting.journal`), reopening
replays to the identical state or refuses with a
:class:`~witcert_calculus.errors.JournalError`, and several processes can share
one journal file.

No evidence, no certificate: a request into which no certificate was admitted
(none at all, or empirical fallbacks only) is ``EMPIRICAL``, and its verdict's
``reason`` says why. Beside it:
:mod:`~witcert_calculus.accounting.state` (the state its events change, and how),
:mod:`~witcert_calculus.accounting.budget`, :mod:`~witcert_calculus.accounting.account` (accounts
and entry batches), :mod:`~witcert_calculus.accounting.records` (what it reports, with the
aggregates), :mod:`~witcert_calculus.accounting.events`,
:mod:`~witcert_calculus.accounting.eventlog` and :mod:`~witcert_calculus.drift.eprocess` (the
sentinels).

Main declarations:

- :class:`RiskLedger`
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from fractions import Fraction
from typing import Any, final

import numpy.typing as npt

from witcert_calculus.accounting.account import EntryBatch
from witcert_calculus.accounting.entries import Aggregate
from witcert_calculus.accounting.eventlog import EventLog
from witcert_calculus.contracts import Reading
from witcert_calculus.drift.eprocess import EProcessState, Sentinels, observation_batch
from witcert_calculus.errors import InvalidValueError, UnknownRequestError
from witcert_calculus.metrics import Metric
from witcert_calculus.numerics.probability import Probability, ProbabilityLike
from witcert_calculus.accounting.records import (
    Admission,
    EmpiricalPolicy,
    EntryAdmission,
    LedgerStats,
    Verdict,
)
from witcert_calculus.accounting.slots import SlotTable
from witcert_calculus.accounting.state import LedgerState
from witcert_calculus.numerics.validation import request_id as request_id_of
from witcert_calculus.tiers import Evidence

__all__ = [
    "RiskLedger",
]


def _token(token: object) -> str | None:
    if token is None:
        return None
    if not isinstance(token, str) or not token:
        raise InvalidValueError("token", token, "must be a non-empty str or None")
    return token


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
        >>> import numpy as np
        >>> from witcert_calculus.meters.tv_forms import tv_eform
        >>> from witcert_calculus.meters.witness import RopeLayout, logit_bound
        >>> c = logit_bound(np.array([1.0, 0.0]), np.array([[0.01], [0.02]]),
        ...                 layout=RopeLayout.INTERLEAVED, scale=1.0)
        >>> cert = tv_eform(np.array([0.5, 0.5]), c).reading()  # a meter's reading, delta 0
        >>> ledger = RiskLedger()
        >>> r = ledger.open_request(delta_req="1/100")
        >>> ledger.admit(r, cert).charged
        Fraction(0, 1)
        >>> ledger.verdict(r).tier
        <Tier.CERTIFIED: 3>
    """

    __slots__ = ("_key", "_lock", "_log", "_state")

    def __init__(self, *, n_slots: int = 0, journal: str | os.PathLike[str] | None = None,
                 busy_timeout_s: float = 60.0) -> None:
        self._lock = threading.RLock()
        self._key = object()  # the capability to change the slot table, held with the state
        table = SlotTable(n_slots, directory=self, lock=self._lock, key=self._key)
        self._state = LedgerState(table, key=self._key, where=lambda: self._log.where)
        self._log = EventLog(journal, n_slots=n_slots, busy_timeout_s=busy_timeout_s,
                             lock=self._lock, replay=self._state.apply)
        try:
            self._log.sync()
        except BaseException:
            self._log.close()
            raise

    # ------------------------------------------------------------------ plumbing

    @property
    def slots(self) -> SlotTable:
        """The slot table of the compressed pool."""
        return self._state.slots

    @property
    def journal_path(self) -> str | None:
        """Path of the journal, if any."""
        return self._log.path

    @property
    def applied_seq(self) -> int:
        """Sequence number of the last event applied (equals the number of events)."""
        return self._log.seq

    def close(self) -> None:
        """Close the journal connection (the in-memory state stays readable)."""
        self._log.close()

    def sync(self) -> None:
        """Apply events that other processes committed to the shared journal.

        Raises:
            JournalError: if an event does not replay.
        """
        self._log.sync()

    # ------------------------------------------------------------------ directory

    def require_known(self, request_id: int) -> None:
        """Raise unless ``request_id`` is an open request.

        Raises:
            InvalidValueError: if ``request_id`` is not a request id (an int, not bool, in
                ``[1, 2**63 - 1]``).
            UnknownRequestError: for an id never opened, or already closed.
        """
        if not self._state.accounts.is_open(request_id):
            raise UnknownRequestError(request_id)

    # ------------------------------------------------------------------ requests

    def open_request(self, *, delta_req: ProbabilityLike, request_id: int | None = None) -> int:
        """Open an account with budget ``delta_req``; return its request id.

        Args:
            delta_req: the request's failure-probability budget, in (0, 1);
                taken exactly (``"1/100"``, ``Fraction(1, 100)`` or a
                :class:`~witcert_calculus.numerics.probability.Probability` avoid float rounding).
            request_id: an explicit id, which must exceed every id used before;
                by default the next id is assigned.

        Raises:
            InvalidValueError: if ``delta_req`` is outside (0, 1), NaN or infinite.
            ReusedRequestIdError: if ``request_id`` does not exceed the last id.
            InvalidValueError: if ``request_id`` is not an int (numpy integers too; not
                bool) in ``[1, 2**63 - 1]``.
        """
        budget = Probability.budget(delta_req)
        want = None if request_id is None else request_id_of("request_id", request_id)
        return self._log.commit(lambda: self._state.open_event(budget, want),
                                self._state.apply_open)

    def close_request(self, request_id: int) -> Verdict:
        """Close an account and return its final verdict; the id is never reused.

        Every slot the request owns is freed in the same event: it returns to
        ``UNWRITTEN`` with its generation bumped, so grants that other requests
        hold on it go stale and their reads fail closed.

        Raises:
            UnknownRequestError: if the request is unknown or already closed.
        """
        return self._log.commit(lambda: self._state.close_event(request_id),
                                self._state.apply_close)

    def next_allowance(self, request_id: int) -> Fraction:
        """The allowance the request's next probabilistic certificate may use.

        The value can move as soon as it is returned: when other threads or
        processes admit probabilistic certificates into the same request, a
        certificate built for it is refused with
        :class:`~witcert_calculus.errors.AllowanceMovedError`. :meth:`admit_next`
        reads the allowance and admits in one step.

        Raises:
            UnknownRequestError: if the request is not open.
        """
        with self._lock:
            self.sync()
            return self._state.accounts.open_account(request_id).allowance

    def verdict(self, request_id: int) -> Verdict:
        """The request's current verdict (also for closed requests).

        Raises:
            UnknownRequestError: for an id that was never opened.
        """
        with self._lock:
            self.sync()
            return self._state.accounts.get(request_id).verdict()

    def spent(self, request_id: int) -> Fraction:
        """The request's exact spend."""
        return self.verdict(request_id).spent

    def request_ids(self) -> tuple[int, ...]:
        """All request ids ever opened, ascending."""
        with self._lock:
            self.sync()
            return self._state.accounts.ids()

    # ------------------------------------------------------------------ admissions

    def admit(self, request_id: int, reading: Reading[Any], *,
              on_empirical: EmpiricalPolicy = EmpiricalPolicy.FALLBACK,
              token: str | None = None) -> Admission:
        """Admit one reading into a request's account.

        Args:
            request_id: an open request.
            reading: the certificate (or empirical reading).
            on_empirical: what an empirical reading does: fall back (default;
                the caller takes the exact path) or degrade the verdict.
            token: idempotency token; admitting again into the same request
                with a token that was already admitted returns the original
                acknowledgement and changes nothing (safe retries after a
                crash); the same token on another request is refused.

        Returns:
            The acknowledgement: kind, decision, charge and the exact spend.

        Raises:
            UnknownRequestError: if the request is not open.
            BudgetExceededError: if a probabilistic reading's delta exceeds the
                request's next telescoping allowance.
            AllowanceMovedError: (a :class:`BudgetExceededError`) if that delta is
                the allowance of an earlier probabilistic event of the request,
                i.e. other admissions drew it after it was read; see :meth:`admit_next`.
            InvalidValueError: for a non-reading, bad policy or bad token.
            TokenReusedError: (an :class:`AdmissionError`) if ``token`` was recorded
                for another request; it names the token and both request ids.
            JournalError: if the event cannot be made durable (it is then not applied).
        """
        tok = _token(token)
        return self._log.commit(
            lambda: self._state.admit_event(request_id, reading, on_empirical, token=tok),
            self._state.apply_admission)

    def admit_next(self, request_id: int, reading: Callable[[Fraction], Reading[Any]], *,
                   on_empirical: EmpiricalPolicy = EmpiricalPolicy.FALLBACK,
                   token: str | None = None) -> Admission:
        """Build a reading for the allowance due now and admit it, in one step.

        ``reading`` is called with the request's next telescoping allowance
        under the ledger's lock (and, with a journal, inside the write
        transaction, after the events of other processes are applied), and
        what it returns is admitted by the rules of :meth:`admit` and journaled
        like any admission. No other admission can draw the allowance in
        between, so ``a = next_allowance(r); admit(r, ...delta=a)`` races where
        this call does not. ``reading`` runs while the ledger waits: it should
        only compute the bound at the delta it is given, and must not call the
        ledger. It may certify below the allowance (the allowance is charged in
        full), or return a deterministic or empirical reading.

        Args:
            request_id: an open request.
            reading: maps the allowance due (an exact ``Fraction``) to the reading
                to admit, certified at a delta of at most that allowance.
            on_empirical: what an empirical reading does (see :meth:`admit`).
            token: idempotency token (see :meth:`admit`); a retry with a
                recorded token returns the first acknowledgement without
                calling ``reading``.

        Returns:
            The acknowledgement, as :meth:`admit` returns it.

        Raises:
            UnknownRequestError: if the request is not open.
            BudgetExceededError: if the reading's delta exceeds the allowance it
                was given.
            InvalidValueError: if ``reading`` is not callable, returns something
                other than a :class:`~witcert_calculus.contracts.Reading` or calls
                the ledger; for a bad policy or token.
            TokenReusedError: as :meth:`admit`.
            JournalError: as :meth:`admit`.

        Whatever ``reading`` raises propagates; nothing is then recorded.

        Example:
            >>> from witcert_calculus import Measurement
            >>> from witcert_calculus.contracts import Reading
            >>> from witcert_calculus.metrics import AttentionTV, AtConsume
            >>> ledger = RiskLedger()
            >>> r = ledger.open_request(delta_req="1/100")
            >>> seen = []
            >>> def at(allowance: Fraction) -> Reading[AttentionTV[AtConsume]]:
            ...     seen.append(allowance)  # a meter would spend it as its failure probability
            ...     return Reading(AttentionTV[AtConsume], 0.01,
            ...                    evidence=Measurement("observed", samples=1))
            >>> [ledger.admit_next(r, at).charged for _ in range(3)], seen
            ([Fraction(0, 1), Fraction(0, 1), Fraction(0, 1)], [Fraction(1, 200), Fraction(1, 200), Fraction(1, 200)])
        """
        if not callable(reading):
            raise InvalidValueError("reading", reading, "must be a callable that maps the "
                                    "allowance (a Fraction) to a Reading")
        tok = _token(token)
        if not isinstance(on_empirical, EmpiricalPolicy):
            raise InvalidValueError("on_empirical", on_empirical, "must be an EmpiricalPolicy")
        return self._log.commit(
            lambda: self._state.admit_next_event(request_id, reading, on_empirical, token=tok),
            self._state.apply_admission)

    def admission(self, token: str) -> Admission | None:
        """The acknowledgement recorded under an idempotency token, or ``None``.

        A client that crashed before it saw an acknowledgement can ask here
        whether its admission was recorded (or simply retry with the same token).
        """
        tok = _token(token)
        with self._lock:
            self.sync()
            return None if tok is None else self._state.recorded(tok)

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
            SlotOwnershipError: if another request owns one of ``slots`` (a
                request writes only its own and free slots); the whole batch is
                refused, nothing is charged or journaled.
            UnknownRequestError: as :meth:`admit`.
            BudgetExceededError: as :meth:`admit`.
            AllowanceMovedError: as :meth:`admit`.
            TokenReusedError: as :meth:`admit`.
            JournalError: as :meth:`admit`.

        Lean: ``WitCert.Semantic.entry_fallback_contract_sound`` (with the spend theorems).
        """
        tok = _token(token)
        batch = EntryBatch.certify(bounds, threshold=threshold, metric=metric, evidence=evidence,
                                   delta=delta, aggregate=aggregate, whole_step=whole_step,
                                   slots=slots, table=self._state.slots)
        adm = self._log.commit(
            lambda: self._state.entries_event(request_id, batch, on_empirical, token=tok),
            self._state.apply_admission)
        return batch.acknowledge(adm)

    def evict(self, request_id: int, slots: npt.ArrayLike) -> None:
        """Return slots to ``UNWRITTEN`` (generation bumped, outstanding grants go stale).

        A request evicts only slots it owns, or free ones.

        Raises:
            UnknownRequestError: if the request is not open.
            InvalidValueError: for bad or repeated slots.
            SlotOwnershipError: if another request owns one of ``slots``; no
                slot of the batch is evicted and nothing is journaled.
        """
        idx = self._state.slots.validate_slots(slots)
        self._log.commit(lambda: self._state.evict_event(request_id, idx),
                         self._state.apply_evict)

    # ------------------------------------------------------------------ sentinels

    def add_sentinel(self, name: str, *, delta: float | Fraction, kappa: float = 0.5) -> None:
        """Create a named drift sentinel (an :class:`~witcert_calculus.drift.eprocess.EProcess`).

        Args:
            name: a short, low-cardinality name (used as a metrics label).
            delta: its false-alarm level in (0, 1).
            kappa: its declared tuning constant, fixed here.

        Raises:
            InvalidValueError: for a bad name, delta or kappa, or a name in use.
        """
        proto = Sentinels.declare(name, delta=delta, kappa=kappa)
        self._log.commit(lambda: self._state.sentinel_event(name, proto),
                         self._state.apply_sentinel)

    def observe(self, name: str, w: npt.ArrayLike, *, m: npt.ArrayLike,
                c: npt.ArrayLike) -> EProcessState:
        """Feed observations to a sentinel (journaled); return its new state.

        Raises:
            InvalidValueError: for an unknown sentinel or bad observations.
        """
        batch = observation_batch(w, m, c)
        return self._log.commit(lambda: self._state.observe_event(name, batch),
                                self._state.apply_observe)

    def sentinel(self, name: str) -> EProcessState:
        """A sentinel's current state.

        Raises:
            InvalidValueError: for an unknown sentinel.
        """
        with self._lock:
            self.sync()
            return self._state.sentinels.state(name)

    def sentinel_names(self) -> tuple[str, ...]:
        """Names of the sentinels, sorted."""
        with self._lock:
            self.sync()
            return self._state.sentinels.names()

    # ------------------------------------------------------------------ export

    def prometheus(self) -> str:
        """Prometheus text exposition of the ledger's gauges and counters (``witcert_`` prefix).

        Rendered by ``prometheus_client`` (the ``metrics`` extra), imported on first use;
        :class:`~witcert_calculus.export.prometheus.LedgerCollector` registers the same families
        in a registry that a server scrapes.
        """
        from witcert_calculus.export.prometheus import prometheus_text

        return prometheus_text(self.stats())

    def stats(self) -> LedgerStats:
        """Aggregate gauges and counters over all requests (what :meth:`prometheus` exports)."""
        with self._lock:
            self.sync()
            return self._state.stats(events=self._log.seq)
