"""Request-level risk ledger: a telescoping failure-probability budget per request.

A ledger holds one account per request, keyed by a request id that is never
reused (ids are monotone), each with its own budget ``delta_req`` and counters.
Three admission rules are enforced by the API:

1. **Empirical readings never enter.** A reading of tier ``EMPIRICAL`` either
   triggers a fallback decision (the caller takes the exact path) or degrades
   the request's verdict to ``EMPIRICAL``; the caller chooses with
   :class:`~witcert_calculus.records.EmpiricalPolicy`. Either way it is counted
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

The ledger also owns the slot table (fail-closed reads, write-side charge once
per write) and named drift sentinels. It is thread-safe; with ``journal=path``
every event is committed to a SQLite WAL journal before it is applied and
acknowledged, reopening replays to the identical state, and several processes
can share one journal file. Beside it: :mod:`~witcert_calculus.budget`,
:mod:`~witcert_calculus.account`, :mod:`~witcert_calculus.records`,
:mod:`~witcert_calculus.events` and :mod:`~witcert_calculus.eventlog`.

Main declarations:

- :class:`RiskLedger`
"""

from __future__ import annotations

import os
import threading
from fractions import Fraction
from functools import partial
from typing import Any, final

import numpy as np
import numpy.typing as npt

from witcert_calculus.account import Accounts
from witcert_calculus.budget import Probability, ProbabilityLike
from witcert_calculus.contracts import Reading
from witcert_calculus.entries import Aggregate, certify_entries, certify_step
from witcert_calculus.eprocess import EProcess, EProcessState, log_factors, observation_batch
from witcert_calculus.errors import InvalidValueError, UnknownRequestError
from witcert_calculus.eventlog import EventLog, Recorded
from witcert_calculus.events import (
    AddSentinel,
    Admit,
    AdmitEntries,
    CloseRequest,
    Event,
    Evict,
    Observe,
    OpenRequest,
)
from witcert_calculus.metrics import Metric, metric_info
from witcert_calculus.prometheus import prometheus_text
from witcert_calculus.records import (
    Admission,
    EmpiricalPolicy,
    EntryAdmission,
    EventCounts,
    EventKind,
    LedgerStats,
    Verdict,
)
from witcert_calculus.slots import SlotTable
from witcert_calculus.theorems import ENTRY_FALLBACK_SOUND
from witcert_calculus.tiers import Composition, Evidence, Tier
from witcert_calculus.validation import integer

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

    __slots__ = ("_accounts", "_key", "_lock", "_log", "_sentinels", "_slots", "_tokens")

    def __init__(self, *, n_slots: int = 0, journal: str | os.PathLike[str] | None = None,
                 busy_timeout_s: float = 60.0) -> None:
        self._lock = threading.RLock()
        self._accounts = Accounts()
        self._tokens: dict[str, Admission] = {}
        self._sentinels: dict[str, EProcess] = {}
        self._key = object()
        self._slots = SlotTable(n_slots, directory=self, lock=self._lock, key=self._key)
        self._log = EventLog(journal, n_slots=n_slots, busy_timeout_s=busy_timeout_s,
                             lock=self._lock, replay=self._apply)
        try:
            self._log.sync()
        except BaseException:
            self._log.close()
            raise

    # ------------------------------------------------------------------ plumbing

    @property
    def slots(self) -> SlotTable:
        """The slot table of the compressed pool."""
        return self._slots

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
            UnknownRequestError: for an id never opened, or already closed.
        """
        if not self._accounts.is_open(request_id):
            raise UnknownRequestError(request_id)

    # ------------------------------------------------------------------ requests

    def open_request(self, *, delta_req: ProbabilityLike, request_id: int | None = None) -> int:
        """Open an account with budget ``delta_req``; return its request id.

        Args:
            delta_req: the request's failure-probability budget, in (0, 1);
                taken exactly (``"1/100"``, ``Fraction(1, 100)`` or a
                :class:`~witcert_calculus.budget.Probability` avoid float rounding).
            request_id: an explicit id, which must exceed every id used before;
                by default the next id is assigned.

        Raises:
            InvalidValueError: if ``delta_req`` is outside (0, 1), NaN or infinite.
            ReusedRequestIdError: if ``request_id`` does not exceed the last id.
        """
        budget = Probability.budget(delta_req)
        want = None if request_id is None else integer("request_id", request_id)

        def build() -> OpenRequest:
            return OpenRequest(self._accounts.next_id(want), budget)

        return self._log.commit(build, self._apply_open)

    def close_request(self, request_id: int) -> Verdict:
        """Close an account and return its final verdict; the id is never reused.

        Raises:
            UnknownRequestError: if the request is unknown or already closed.
        """
        def build() -> CloseRequest:
            return CloseRequest(self._accounts.open_account(request_id).request_id)

        return self._log.commit(build, self._apply_close)

    def next_allowance(self, request_id: int) -> Fraction:
        """The allowance the request's next probabilistic certificate may use.

        Raises:
            UnknownRequestError: if the request is not open.
        """
        with self._lock:
            self.sync()
            return self._accounts.open_account(request_id).allowance

    def verdict(self, request_id: int) -> Verdict:
        """The request's current verdict (also for closed requests).

        Raises:
            UnknownRequestError: for an id that was never opened.
        """
        with self._lock:
            self.sync()
            return self._accounts.get(request_id).verdict()

    def spent(self, request_id: int) -> Fraction:
        """The request's exact spend."""
        return self.verdict(request_id).spent

    def request_ids(self) -> tuple[int, ...]:
        """All request ids ever opened, ascending."""
        with self._lock:
            self.sync()
            return self._accounts.ids()

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

        def build() -> Admit | Recorded[Admission]:
            if tok is not None and tok in self._tokens:
                return Recorded(self._tokens[tok])
            acct = self._accounts.open_account(request_id)
            return acct.propose(reading, on_empirical, token=tok)

        return self._log.commit(build, self._apply_admission)

    def admission(self, token: str) -> Admission | None:
        """The acknowledgement recorded under an idempotency token, or ``None``.

        A client that crashed before it saw an acknowledgement can ask here
        whether its admission was recorded (or simply retry with the same token).
        """
        tok = _token(token)
        with self._lock:
            self.sync()
            return None if tok is None else self._tokens.get(tok)

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
                                     evidence=Composition((evidence,),
                                                          theorem=ENTRY_FALLBACK_SOUND),
                                     delta=delta)

        def build() -> AdmitEntries | Recorded[Admission]:
            if tok is not None and tok in self._tokens:
                return Recorded(self._tokens[tok])
            acct = self._accounts.open_account(request_id)
            charge = acct.propose(step, on_empirical, token=tok)
            return AdmitEntries.of(charge, cert, slots=idx, bounds=b)

        adm = self._log.commit(build, self._apply_admission)
        if adm.kind is EventKind.EMPIRICAL_FALLBACK:
            cert = cert.none_kept()
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

        def build() -> Evict:
            return Evict(self._accounts.open_account(request_id).request_id, idx)

        self._log.commit(build, self._apply_evict)

    # ------------------------------------------------------------------ sentinels

    def add_sentinel(self, name: str, *, delta: float | Fraction, kappa: float = 0.5) -> None:
        """Create a named drift sentinel (an :class:`~witcert_calculus.eprocess.EProcess`).

        Args:
            name: a short, low-cardinality name (used as a metrics label).
            delta: its false-alarm level in (0, 1).
            kappa: its declared tuning constant, fixed here.

        Raises:
            InvalidValueError: for a bad name, delta or kappa, or a name in use.
        """
        if not isinstance(name, str) or not name or not name.replace("_", "").replace(
                ".", "").replace("-", "").isalnum():
            raise InvalidValueError("name", name, "must be a non-empty [A-Za-z0-9_.-] string")
        proto = EProcess(delta=delta, kappa=kappa)

        def build() -> AddSentinel:
            if name in self._sentinels:
                raise InvalidValueError("name", name, "a sentinel of this name exists")
            return AddSentinel(name, proto.delta, proto.kappa)

        self._log.commit(build, self._apply_sentinel)

    def observe(self, name: str, w: npt.ArrayLike, *, m: npt.ArrayLike,
                c: npt.ArrayLike) -> EProcessState:
        """Feed observations to a sentinel (journaled); return its new state.

        Raises:
            InvalidValueError: for an unknown sentinel or bad observations.
        """
        batch = observation_batch(w, m, c)

        def build() -> Observe:
            p = self._sentinels.get(name)
            if p is None:
                raise InvalidValueError("name", name, "no sentinel of this name")
            log_factors(*batch, kappa=p.kappa)  # validate before anything is recorded
            return Observe(name, batch)

        return self._log.commit(build, self._apply_observe)

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
        return prometheus_text(self.stats())

    def stats(self) -> LedgerStats:
        """Aggregate gauges and counters over all requests (what :meth:`prometheus` exports)."""
        with self._lock:
            self.sync()
            counts = EventCounts()
            tiers = {Tier.CERTIFIED: 0, Tier.PARTIALLY_CERTIFIED: 0, Tier.EMPIRICAL: 0}
            open_n = entries = kept = steps = vac = 0
            worst = Fraction(0)
            for a in self._accounts:
                counts = counts + a.counts
                entries += a.entries
                kept += a.entries_kept
                steps += a.steps
                vac += a.vacuous_steps
                if not a.closed:
                    open_n += 1
                    tiers[a.tier] += 1
                    worst = max(worst, a.spent_fraction)
            own, shared = self._slots.reads
            return LedgerStats(
                requests=len(self._accounts), open_requests=open_n, counts=counts,
                open_by_tier=tuple(sorted(tiers.items(), reverse=True)),
                entries=entries, entries_kept=kept, steps=steps, vacuous_steps=vac,
                worst_spent_fraction=worst,
                slots=tuple(sorted(self._slots.counts().items())), reads_own=own,
                reads_shared=shared, slot_writes=self._slots.writes, events=self._log.seq,
                sentinels=tuple((n, self._sentinels[n].state) for n in sorted(self._sentinels)))

    # ------------------------------------------------------------------ apply (live and replay)

    def _apply(self, ev: Event) -> None:
        match ev:
            case OpenRequest():
                self._apply_open(ev)
            case Admit() | AdmitEntries():
                self._apply_admission(ev)
            case CloseRequest():
                self._apply_close(ev)
            case Evict():
                self._apply_evict(ev)
            case AddSentinel():
                self._apply_sentinel(ev)
            case Observe():
                self._apply_observe(ev)

    def _apply_open(self, ev: OpenRequest) -> int:
        return self._accounts.add(ev.request_id, ev.budget, where=self._log.where)

    def _apply_admission(self, ev: Admit | AdmitEntries) -> Admission:
        charge = ev.charge if isinstance(ev, AdmitEntries) else ev
        where = self._log.where
        acct = self._accounts.live(charge.request_id, where=where)
        w = ev.write if isinstance(ev, AdmitEntries) else None
        write = None if w is None else partial(self._slots.apply_write, self._key,
                                               acct.request_id, w.slots, w.keep, w.bounds)
        adm = acct.apply(ev, where=where, before=write)
        if adm.token is not None:
            self._tokens[adm.token] = adm
        return adm

    def _apply_close(self, ev: CloseRequest) -> Verdict:
        return self._accounts.live(ev.request_id, where=self._log.where).close()

    def _apply_evict(self, ev: Evict) -> None:
        self._accounts.live(ev.request_id, where=self._log.where)
        self._slots.apply_evict(self._key, ev.slots)

    def _apply_sentinel(self, ev: AddSentinel) -> None:
        self._sentinels[ev.name] = EProcess(delta=ev.delta, kappa=ev.kappa)

    def _apply_observe(self, ev: Observe) -> EProcessState:
        proc = self._sentinels[ev.name]
        proc.observe_many(ev.values[0], m=ev.values[1], c=ev.values[2])
        return proc.state
