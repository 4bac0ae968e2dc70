"""The ledger's event log: sequence numbers, commit before apply, replay.

Every change of a ledger's state is one event (:mod:`witcert_calculus.accounting.events`),
numbered from 1 in the order applied. Without a journal an event is applied as
soon as it is built. With one (:class:`~witcert_calculus.accounting.journal.Journal`), a
commit takes the journal's write lock, first replays what other processes
committed since this process last looked, then builds its own event against
that newest state, appends it and commits; only then is the event applied and
its result returned, so an acknowledged event is durable. Replaying an existing
journal (:meth:`EventLog.sync`) reaches the identical state.

Main declarations:

- :class:`EventLog`
- :class:`Recorded`: what a build returns for an event recorded before (same token).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar, final

from witcert_calculus.accounting.events import EncodedEvent, Event, decode
from witcert_calculus.accounting.journal import Journal, JournalRow
from witcert_calculus.errors import InvalidValueError, JournalError
from witcert_calculus.numerics.validation import timeout_seconds

__all__ = [
    "EventLog",
    "Recorded",
]

_E = TypeVar("_E", bound=Event)
_R = TypeVar("_R")


@final
@dataclass(frozen=True, slots=True)
class Recorded(Generic[_R]):
    """An event that was recorded before (the same idempotency token), with its result.

    Attributes:
        result: the acknowledgement the first commit returned.
    """

    result: _R


@final
class EventLog:
    """A ledger's events in order, applied in memory or first committed to a journal.

    Args:
        journal: path of a SQLite journal, or ``None`` for memory only.
        n_slots: size of the owner's slot table (a journal remembers it).
        busy_timeout_s: how long to wait for another process's write lock.
        lock: the owner's lock, which serializes commits and replays.
        replay: applies one replayed event to the owner's state.

    The log starts at sequence number 0; :meth:`sync` replays an existing journal.

    Raises:
        InvalidValueError: for a bad ``busy_timeout_s`` (checked with or without a journal).
        JournalError: if the journal cannot be opened.

    Example:
        >>> from witcert_calculus.numerics.probability import Probability
        >>> from witcert_calculus.accounting.events import OpenRequest
        >>> seen = []
        >>> log = EventLog(None, n_slots=0, busy_timeout_s=1.0, lock=threading.RLock(),
        ...                replay=seen.append)
        >>> log.commit(lambda: OpenRequest(1, Probability.budget("1/2")),
        ...            lambda ev: ev.request_id), log.seq
        (1, 1)
    """

    __slots__ = ("_building", "_journal", "_lock", "_replay", "_seq")

    def __init__(self, journal: str | os.PathLike[str] | None, *, n_slots: int,
                 busy_timeout_s: float, lock: threading.RLock,
                 replay: Callable[[Event], object]) -> None:
        busy_timeout_s = timeout_seconds("busy_timeout_s", busy_timeout_s)
        self._lock = lock
        self._replay = replay
        self._seq = 0
        self._building = False
        self._journal = None if journal is None else Journal(journal, n_slots=n_slots,
                                                             busy_timeout_s=busy_timeout_s)

    @property
    def path(self) -> str | None:
        """Path of the journal, if any."""
        return None if self._journal is None else self._journal.path

    @property
    def where(self) -> str:
        """The journal path, or ``"<memory>"``, for error messages."""
        return self.path or "<memory>"

    @property
    def seq(self) -> int:
        """Sequence number of the last event applied (equals the number of events)."""
        return self._seq

    def close(self) -> None:
        """Close the journal connection (events applied so far stay applied)."""
        with self._lock:
            if self._journal is not None:
                self._journal.close()
                self._journal = None

    def sync(self) -> None:
        """Replay the events that other processes committed to the shared journal.

        Raises:
            JournalError: if an event does not replay.
        """
        with self._lock:
            if self._journal is not None:
                for row in self._journal.since(self._seq):
                    self._apply_row(row)

    def _apply_row(self, row: JournalRow) -> None:
        if row.seq != self._seq + 1:
            raise JournalError(self.where, f"event {row.seq} follows {self._seq}: gap in the "
                               "sequence", seq=self._seq + 1)
        try:
            self._replay(decode(EncodedEvent(row.op, row.payload, row.data, row.token)))
        except JournalError as exc:  # a replay rule refused it: name the event
            if exc.seq is not None:
                raise
            raise JournalError(self.where, f"event {row.seq} ({row.op}) does not replay: "
                               f"{exc.reason}", seq=row.seq) from exc
        except Exception as exc:  # a journal that does not replay is a journal error
            raise JournalError(self.where, f"event {row.seq} ({row.op}) does not replay: "
                               f"{exc}", seq=row.seq) from exc
        self._seq = row.seq

    def _build(self, build: Callable[[], _E | Recorded[_R]]) -> _E | Recorded[_R]:
        self._building = True
        try:
            return build()
        finally:
            self._building = False

    def commit(self, build: Callable[[], _E | Recorded[_R]], apply: Callable[[_E], _R]) -> _R:
        """Build an event against the newest state, make it durable, apply it, return the result.

        Args:
            build: makes the event (validating it against the state, which is
                current when it runs), or returns :class:`Recorded` for one
                recorded before; nothing is written then.
            apply: applies the event to the owner's state and returns the result.

        Returns:
            What ``apply`` returned (or the recorded result).

        Raises:
            JournalError: if the event cannot be made durable (it is then not
                applied) or a newer event does not replay; whatever ``build``
                raises, with nothing written.
            InvalidValueError: if ``build`` itself commits an event (a build
                runs inside its commit and must not start another).
        """
        with self._lock:
            if self._building:
                raise InvalidValueError(
                    "event", "<nested commit>", "was committed from inside the build of another "
                    "event (e.g. by a reading factory passed to admit_next); build the reading "
                    "without calling the ledger")
            if self._journal is None:
                ev = self._build(build)
                if isinstance(ev, Recorded):
                    return ev.result
                self._seq += 1
                return apply(ev)
            with self._journal.transaction():
                for row in self._journal.since(self._seq):
                    self._apply_row(row)
                ev = self._build(build)
                if isinstance(ev, Recorded):
                    return ev.result
                enc = ev.encode()
                seq = self._journal.append(enc.op, enc.payload, enc.data, enc.token)
            # committed: durable before it is applied and acknowledged
            if seq != self._seq + 1:
                raise JournalError(self.where, f"appended event {seq} after {self._seq}",
                                   seq=seq)
            self._seq = seq
            return apply(ev)
