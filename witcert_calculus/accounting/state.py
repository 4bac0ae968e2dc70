"""The risk ledger's state, and how each event changes it, live and on replay.

A :class:`~witcert_calculus.ledger.RiskLedger` is event-sourced: every change
is one event (:mod:`~witcert_calculus.accounting.events`), built against the newest
state, made durable by the ledger's :class:`~witcert_calculus.accounting.eventlog.EventLog`,
then applied. :class:`LedgerState` holds what the events change: the accounts
(:class:`~witcert_calculus.accounting.account.Accounts`), the acknowledgements by
idempotency token, the slot table and the named drift sentinels
(:class:`~witcert_calculus.drift.eprocess.Sentinels`). It does both halves of every
change:

- its ``*_event`` methods build an event and validate it against the state,
  changing nothing; for an idempotency token admitted before into the same
  request they return the recorded acknowledgement (a
  :class:`~witcert_calculus.accounting.eventlog.Recorded`), and refuse one
  recorded for another request (:class:`~witcert_calculus.errors.TokenReusedError`);
- its ``apply*`` methods apply an event, live or replayed from a journal, and
  refuse with :class:`~witcert_calculus.errors.JournalError` an event that does
  not follow the state, before anything changes.

It is not thread-safe; its ledger serializes access under its lock.

Main declarations:

- :class:`LedgerState`
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from functools import partial
from typing import Any, final

import numpy as np
import numpy.typing as npt

from witcert_calculus.accounting.account import Accounts, EntryBatch
from witcert_calculus.accounting.eventlog import Recorded
from witcert_calculus.contracts import Reading
from witcert_calculus.drift.eprocess import EProcess, EProcessState, Sentinels
from witcert_calculus.errors import InvalidValueError, JournalError, TokenReusedError
from witcert_calculus.numerics.probability import Probability
from witcert_calculus.accounting.events import (
    AddSentinel,
    Admit,
    AdmitEntries,
    CloseRequest,
    Event,
    Evict,
    Observe,
    OpenRequest,
)
from witcert_calculus.accounting.records import Admission, EmpiricalPolicy, LedgerStats, Verdict
from witcert_calculus.accounting.slots import SlotTable

__all__ = [
    "LedgerState",
]


@final
class LedgerState:
    """A ledger's accounts, acknowledgements, slot table and sentinels, changed event by event.

    Args:
        slots: the slot table, built with ``key``.
        key: the key that lets this state apply writes and evictions to ``slots``.
        where: the journal path, or ``"<memory>"``, for error messages (read
            when an event is applied).

    Example:
        >>> import threading
        >>> class Directory:
        ...     def require_known(self, request_id: int) -> None: ...
        ...     def sync(self) -> None: ...
        >>> key = object()
        >>> table = SlotTable(2, directory=Directory(), lock=threading.RLock(), key=key)
        >>> state = LedgerState(table, key=key, where=lambda: "<memory>")
        >>> state.apply_open(state.open_event(Probability.budget("1/100"), None))
        1
        >>> state.apply_close(state.close_event(1)).closed
        True
    """

    __slots__ = ("_accounts", "_key", "_sentinels", "_slots", "_tokens", "_where")

    def __init__(self, slots: SlotTable, *, key: object, where: Callable[[], str]) -> None:
        self._accounts = Accounts()
        self._tokens: dict[str, Admission] = {}
        self._sentinels = Sentinels()
        self._slots = slots
        self._key = key
        self._where = where

    @property
    def accounts(self) -> Accounts:
        """The accounts by request id."""
        return self._accounts

    @property
    def slots(self) -> SlotTable:
        """The slot table."""
        return self._slots

    @property
    def sentinels(self) -> Sentinels:
        """The named drift sentinels."""
        return self._sentinels

    def recorded(self, token: str) -> Admission | None:
        """The acknowledgement recorded under an idempotency token, or ``None``."""
        return self._tokens.get(token)

    def _recorded(self, request_id: object, token: str | None) -> Recorded[Admission] | None:
        # A token names one admission of one request: a retry on that request gets the
        # recorded acknowledgement, the same token on another request is refused.
        if token is None or token not in self._tokens:
            return None
        adm = self._tokens[token]
        if request_id != adm.request_id:
            rid = self._accounts.get(request_id).request_id  # an int id ever opened
            raise TokenReusedError(token, rid, adm.request_id)
        return Recorded(adm)

    def stats(self, *, events: int) -> LedgerStats:
        """Aggregates over all requests, the slot table and the sentinels.

        Args:
            events: events applied.

        Returns:
            The aggregates (see :meth:`~witcert_calculus.accounting.records.LedgerStats.of`).
        """
        return LedgerStats.of(self._accounts, slots=self._slots, events=events,
                              sentinels=self._sentinels.states())

    # ------------------------------------------------------------------ build (changes nothing)

    def open_event(self, budget: Probability, request_id: int | None) -> OpenRequest:
        """The event that opens a request with ``budget``, as ``request_id`` or the next id.

        Raises:
            ReusedRequestIdError: if ``request_id`` does not exceed the last id.
            InvalidValueError: if ``request_id`` is below 1.
        """
        return OpenRequest(self._accounts.next_id(request_id), budget)

    def close_event(self, request_id: int) -> CloseRequest:
        """The event that closes an open request and frees the slots it owns.

        Raises:
            UnknownRequestError: if the request is unknown or already closed.
        """
        rid = self._accounts.open_account(request_id).request_id
        held = self._slots.holdings(rid)
        return CloseRequest(rid, held, self._slots.generations(held))

    def admit_event(self, request_id: int, reading: Reading[Any], policy: EmpiricalPolicy, *,
                    token: str | None) -> Admit | Recorded[Admission]:
        """The admission of ``reading`` into an open request (see :meth:`Account.propose`).

        Args:
            request_id: an open request.
            reading: the certificate (or empirical reading).
            policy: what an empirical reading does.
            token: the caller's idempotency token, if any.

        Returns:
            The event, or the acknowledgement recorded under ``token``.

        Raises:
            UnknownRequestError: if the request is not open.
            TokenReusedError: if ``token`` was recorded for another request.
            BudgetExceededError, AllowanceMovedError, InvalidValueError: as
                :meth:`~witcert_calculus.accounting.account.Account.propose`.
        """
        recorded = self._recorded(request_id, token)
        if recorded is not None:
            return recorded
        return self._accounts.open_account(request_id).propose(reading, policy, token=token)

    def admit_next_event(self, request_id: int, reading: Callable[[Fraction], Reading[Any]],
                         policy: EmpiricalPolicy, *,
                         token: str | None) -> Admit | Recorded[Admission]:
        """The admission of the reading built for the allowance due now.

        Args:
            request_id: an open request.
            reading: maps the allowance due to the reading to admit.
            policy: what an empirical reading does.
            token: the caller's idempotency token, if any; for one recorded
                before, ``reading`` is not called.

        Returns:
            The event, or the acknowledgement recorded under ``token``.

        Raises:
            UnknownRequestError: if the request is not open.
            InvalidValueError: if ``reading`` returns something other than a
                :class:`~witcert_calculus.contracts.Reading`.
            BudgetExceededError, AllowanceMovedError: as
                :meth:`~witcert_calculus.accounting.account.Account.propose`.
        """
        recorded = self._recorded(request_id, token)
        if recorded is not None:
            return recorded
        acct = self._accounts.open_account(request_id)
        built: object = reading(acct.allowance)
        if not isinstance(built, Reading):
            raise InvalidValueError("reading(allowance)", built, "must return a Reading")
        return acct.propose(built, policy, token=token)

    def entries_event(self, request_id: int, batch: EntryBatch, policy: EmpiricalPolicy, *,
                      token: str | None) -> AdmitEntries | Recorded[Admission]:
        """The admission of an entry batch into an open request, charged once.

        Args:
            request_id: an open request.
            batch: the certified batch.
            policy: what an empirical reading does.
            token: the caller's idempotency token, if any.

        Returns:
            The event, or the acknowledgement recorded under ``token``.

        Raises:
            UnknownRequestError: if the request is not open.
            SlotOwnershipError: if another request owns one of the batch's slots.
            BudgetExceededError, AllowanceMovedError, InvalidValueError: as
                :meth:`~witcert_calculus.accounting.account.Account.propose`.
        """
        recorded = self._recorded(request_id, token)
        if recorded is not None:
            return recorded
        acct = self._accounts.open_account(request_id)
        gens = None
        if batch.slots is not None:
            self._slots.check_writable(acct.request_id, batch.slots, "write")
            gens = self._slots.generations(batch.slots)
        return batch.propose(acct, policy, token=token, gens=gens)

    def evict_event(self, request_id: int, slots: npt.NDArray[np.int64]) -> Evict:
        """The event that evicts validated ``slots`` on behalf of an open request.

        Raises:
            UnknownRequestError: if the request is not open.
            SlotOwnershipError: if another request owns one of ``slots``.
        """
        rid = self._accounts.open_account(request_id).request_id
        self._slots.check_writable(rid, slots, "evict")
        return Evict(rid, slots, self._slots.generations(slots))

    def sentinel_event(self, name: str, proto: EProcess) -> AddSentinel:
        """The event that creates sentinel ``name`` with the parameters of ``proto``.

        Raises:
            InvalidValueError: if a sentinel of this name exists.
        """
        self._sentinels.require_new(name)
        return AddSentinel(name, proto.delta, proto.kappa)

    def observe_event(self, name: str, batch: npt.NDArray[np.float64]) -> Observe:
        """The event that feeds a batch (rows ``w``, ``m``, ``c``) to a sentinel.

        Raises:
            InvalidValueError: for an unknown sentinel or bad observations.
        """
        self._sentinels.check(name, batch)  # validate before anything is recorded
        return Observe(name, batch)

    # ------------------------------------------------------------------ apply (live and replay)

    def _check_gens(self, request_id: int, action: str, slots: npt.NDArray[np.int64],
                    gens: npt.NDArray[np.int64] | None, where: str) -> None:
        # A slot event names the generations it was built against; a replayed one that does
        # not match the table (or names none) is refused before anything changes.
        if gens is None or gens.shape != slots.shape:
            raise JournalError(where, f"request {request_id}: its {action} of slots "
                               f"{slots.tolist()} does not record their generations")
        now = self._slots.generations(slots)
        if not np.array_equal(now, gens):
            k = int(np.argmax(now != gens))
            raise JournalError(where, f"request {request_id}: its {action} names slot "
                               f"{int(slots[k])} at generation {int(gens[k])}, but the slot is "
                               f"at generation {int(now[k])}")

    def apply(self, ev: Event) -> None:
        """Apply an event of any kind (a replayed one).

        Raises:
            JournalError: if the event does not follow the state.
        """
        match ev:
            case OpenRequest():
                self.apply_open(ev)
            case Admit() | AdmitEntries():
                self.apply_admission(ev)
            case CloseRequest():
                self.apply_close(ev)
            case Evict():
                self.apply_evict(ev)
            case AddSentinel():
                self.apply_sentinel(ev)
            case Observe():
                self.apply_observe(ev)

    def apply_open(self, ev: OpenRequest) -> int:
        """Open the request's account; return its id."""
        return self._accounts.add(ev.request_id, ev.budget, where=self._where())

    def apply_admission(self, ev: Admit | AdmitEntries) -> Admission:
        """Apply an admission (and an entry batch's slot write); return its acknowledgement."""
        charge = ev.charge if isinstance(ev, AdmitEntries) else ev
        where = self._where()
        acct = self._accounts.live(charge.request_id, where=where)
        w = ev.write if isinstance(ev, AdmitEntries) else None
        if w is not None:
            self._check_gens(acct.request_id, "write", w.slots, w.gens, where)
        write = None if w is None else partial(self._slots.apply_write, self._key,
                                               acct.request_id, w.slots, w.keep, w.bounds)
        if charge.token is not None and charge.token in self._tokens:
            first = self._tokens[charge.token].request_id
            raise JournalError(where, f"request {acct.request_id}: idempotency token "
                               f"{charge.token!r} was already recorded for request {first}")
        adm = acct.apply(ev, where=where, before=write)
        if adm.token is not None:
            self._tokens[adm.token] = adm
        return adm

    def apply_close(self, ev: CloseRequest) -> Verdict:
        """Close the request and free the slots it owns; return its final verdict."""
        acct = self._accounts.live(ev.request_id, where=self._where())
        owned = self._slots.holdings(acct.request_id)
        if not np.array_equal(np.sort(ev.slots), owned):
            raise JournalError(self._where(), f"request {acct.request_id}: its close releases "
                               f"slots {ev.slots.tolist()} but it owns slots {owned.tolist()}")
        self._check_gens(acct.request_id, "close", ev.slots, ev.gens, self._where())
        self._slots.apply_evict(self._key, acct.request_id, owned)
        return acct.close()

    def apply_evict(self, ev: Evict) -> None:
        """Return the event's slots to ``UNWRITTEN``."""
        self._accounts.live(ev.request_id, where=self._where())
        self._check_gens(ev.request_id, "evict", ev.slots, ev.gens, self._where())
        self._slots.apply_evict(self._key, ev.request_id, ev.slots)

    def apply_sentinel(self, ev: AddSentinel) -> None:
        """Create the sentinel."""
        self._sentinels.add(ev.name, delta=ev.delta, kappa=ev.kappa)

    def apply_observe(self, ev: Observe) -> EProcessState:
        """Fold the observations into the sentinel; return its state."""
        return self._sentinels.observe(ev.name, ev.values)
