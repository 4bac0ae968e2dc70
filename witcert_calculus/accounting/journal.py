"""Crash-safe journal of ledger events in SQLite (WAL mode, full sync).

The ledger is event-sourced: every change of state (a request opened, an
admission, a slot write or eviction, a request closed, a sentinel created or
fed) is one event. With a journal attached, an event is appended and committed
in its own write transaction *before* it is applied in memory and acknowledged
to the caller, so an acknowledged event survives a crash of the process
(``journal_mode=WAL``, ``synchronous=FULL``). Reopening replays the events in
order and reaches the identical state.

Several processes may share one journal file. A writer takes SQLite's write
lock (``BEGIN IMMEDIATE``), first applies the events that other processes
committed since it last looked, then validates its own event against that
up-to-date state, appends it and commits. Events are therefore totally ordered
by their sequence number, and every process's replica agrees with the file.

Main declarations:

- :class:`Journal`: the SQLite file and its transactions.
- :class:`JournalRow`: one stored event.
"""

from __future__ import annotations

import enum
import json
import os
import sqlite3
import threading
from collections.abc import Generator
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, final

from witcert_calculus.errors import JournalError

__all__ = [
    "FORMAT_VERSION",
    "Journal",
    "JournalRow",
]

FORMAT_VERSION = 2
"""Version of the journal's table layout and event encoding.

Version 2: replay enforces slot ownership (a request writes or evicts only its
own and free slots) and a close records the slots it frees. A journal of
another version does not open: its events were made under other rules.
"""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    op TEXT NOT NULL,
    payload TEXT NOT NULL,
    data BLOB,
    token TEXT UNIQUE
);
"""


def _encode(value: object) -> object:
    # Exact text for fractions; enums by value (IntEnums are already ints for json).
    if isinstance(value, Fraction):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.value
    raise TypeError(f"cannot journal {type(value).__name__}")


@final
@dataclass(frozen=True, slots=True)
class JournalRow:
    """One stored event.

    Attributes:
        seq: position in the total order of events (1-based, increasing).
        op: the event's kind.
        payload: its JSON fields.
        data: packed arrays (slot indices, masks, bounds), or ``b""``.
        token: the caller's idempotency token, if any.
    """

    seq: int
    op: str
    payload: dict[str, Any]
    data: bytes
    token: str | None


@final
class Journal:
    """An SQLite journal file in WAL mode.

    Args:
        path: the database file (created if missing).
        n_slots: size of the slot table the journal belongs to; a journal
            created for another size refuses to open.
        busy_timeout_s: how long a writer waits for another process's write lock.

    Raises:
        JournalError: if the file cannot be opened, is not a journal of this
            format, or belongs to a different slot-table size.
    """

    __slots__ = ("_conn", "_in_tx", "_lock", "path")

    def __init__(self, path: str | os.PathLike[str], *, n_slots: int,
                 busy_timeout_s: float = 60.0) -> None:
        self.path = os.fspath(path)
        self._lock = threading.RLock()
        self._in_tx = False
        try:
            self._conn = sqlite3.connect(self.path, timeout=busy_timeout_s, isolation_level=None,
                                         check_same_thread=False)
            self._conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
            mode = self._conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise JournalError(self.path, f"cannot switch to WAL mode (got {mode!r})")
            self._conn.execute("PRAGMA synchronous=FULL")
        except sqlite3.Error as exc:
            raise JournalError(self.path, f"cannot open: {exc}") from exc
        self._init_schema(n_slots)

    def _init_schema(self, n_slots: int) -> None:
        try:
            with self.transaction():
                for stmt in _SCHEMA.strip().split(";"):
                    if stmt.strip():
                        self._conn.execute(stmt)
                rows = dict(self._conn.execute("SELECT key, value FROM meta").fetchall())
                if not rows:
                    self._conn.execute("INSERT INTO meta VALUES ('format', ?), ('n_slots', ?)",
                                       (str(FORMAT_VERSION), str(n_slots)))
                    rows = {"format": str(FORMAT_VERSION), "n_slots": str(n_slots)}
        except sqlite3.Error as exc:
            raise JournalError(self.path, f"cannot initialise: {exc}") from exc
        if rows.get("format") != str(FORMAT_VERSION):
            raise JournalError(self.path, f"format {rows.get('format')!r}, expected "
                               f"{FORMAT_VERSION}")
        if rows.get("n_slots") != str(n_slots):
            raise JournalError(self.path, f"was created for n_slots={rows.get('n_slots')}, "
                               f"opened with n_slots={n_slots}")

    @contextmanager
    def transaction(self) -> Generator[None, None, None]:
        """A write transaction (``BEGIN IMMEDIATE``); commits on success, rolls back on error.

        Raises:
            JournalError: if SQLite cannot begin or commit.
        """
        with self._lock:
            if self._in_tx:
                yield
                return
            try:
                self._conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise JournalError(self.path, f"cannot begin a write transaction: {exc}") from exc
            self._in_tx = True
            try:
                yield
            except BaseException:
                self._in_tx = False
                try:
                    self._conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
                raise
            self._in_tx = False
            try:
                self._conn.execute("COMMIT")
            except sqlite3.Error as exc:
                try:
                    self._conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
                raise JournalError(self.path, f"commit failed, event not recorded: {exc}") from exc

    def append(self, op: str, payload: dict[str, Any], data: bytes = b"",
               token: str | None = None) -> int:
        """Append one event inside the current transaction; return its sequence number.

        Raises:
            JournalError: outside a transaction, or if SQLite refuses the row.
        """
        with self._lock:
            if not self._in_tx:
                raise JournalError(self.path, "append outside a write transaction")
            try:
                cur = self._conn.execute(
                    "INSERT INTO events (op, payload, data, token) VALUES (?, ?, ?, ?)",
                    (op, json.dumps(payload, sort_keys=True, default=_encode), data, token))
            except sqlite3.Error as exc:
                raise JournalError(self.path, f"cannot append {op!r}: {exc}") from exc
            seq = cur.lastrowid
            if seq is None:
                raise JournalError(self.path, f"no sequence number for {op!r}")
            return int(seq)

    def since(self, seq: int) -> list[JournalRow]:
        """Every event with a sequence number above ``seq``, in order.

        Raises:
            JournalError: if the file cannot be read or a row does not decode.
        """
        with self._lock:
            try:
                rows = self._conn.execute(
                    "SELECT seq, op, payload, data, token FROM events WHERE seq > ? ORDER BY seq",
                    (seq,)).fetchall()
            except sqlite3.Error as exc:
                raise JournalError(self.path, f"cannot read events: {exc}") from exc
        out: list[JournalRow] = []
        for s, op, payload, data, token in rows:
            try:
                decoded = json.loads(payload)
            except ValueError as exc:
                raise JournalError(self.path, f"event {s} does not decode: {exc}") from exc
            out.append(JournalRow(seq=int(s), op=str(op), payload=decoded,
                                  data=bytes(data) if data is not None else b"",
                                  token=None if token is None else str(token)))
        return out

    def close(self) -> None:
        """Close the connection (committed events stay durable)."""
        with self._lock:
            self._conn.close()
