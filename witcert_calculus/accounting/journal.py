"""Crash-safe, tamper-evident journal of ledger events in SQLite (WAL mode, extra sync).

The ledger is event-sourced: every change of state (a request opened, an
admission, a slot write or eviction, a request closed, a sentinel created or
fed) is one event. With a journal attached, an event is appended and committed
in its own write transaction *before* it is applied in memory and acknowledged
to the caller. Reopening replays the events in order and reaches the identical
state.

**Acknowledged.** An event is acknowledged when the call that records it
returns. By then (1) SQLite's ``COMMIT`` has returned with
``journal_mode=WAL`` and ``synchronous=EXTRA``, so the WAL frames of the event
were written and ``fsync``-ed before the commit returned (WAL with
``synchronous=NORMAL`` would not sync at commit), and (2) the high-water mark
beside the database (below) holds the event's sequence number and digest,
also ``fsync``-ed. An acknowledged event survives a kill of the process at any
point and, on storage that honours ``fsync``, a loss of power.

**Hash chain.** Every row carries the digest of the previous row (``prev``)
and its own (``digest``): SHA-256 over the previous digest, its sequence
number, operation, payload, packed data and token (:func:`row_digest`). The
first row's ``prev`` is the journal's genesis digest, derived from its random
id and slot-table size (:func:`genesis_digest`). Reading verifies every row
against the chain, so an edited, reordered, inserted or deleted row is a
:class:`~witcert_calculus.errors.JournalError` naming its sequence number. The
chain carries no secret: someone who rewrites rows *and* recomputes every
digest and the mark is caught only by the replay rules (ordinals, charges
against the opened budget, caps against the admission's kind, slot ownership and
generations, released slots, tokens), not by the chain.

**High-water mark.** A small file beside the database (``<path>.mark``) holds
the highest acknowledged sequence number and its digest, in two checksummed
slots written alternately in place (a torn write spoils one slot, never
both). It is written *after* the commit returns and *before* the event is
acknowledged: a crash between the two leaves the mark one event behind the
database, never ahead of it, so the mark never refuses a sound journal, and
every acknowledged event is at or below it. On open, a database that holds
fewer events than the mark (a damaged WAL that SQLite stops reading at a bad
frame, a truncated tail), a different event at the mark's sequence number, or
a mark of another journal (the database was deleted, emptied or swapped)
refuses to open. Several processes share the mark under a file lock and it
only moves forward.

What is not detectable: deleting or replacing the database and the mark
together, or rolling both back together to an earlier consistent pair (a
restored backup of both); events lost that were never acknowledged (a crash
between commit and mark loses nothing acknowledged, and such an event is
replayed if its commit survived); a rewrite that recomputes the chain and the
mark and keeps every replay rule.

Several processes may share one journal file. A writer takes SQLite's write
lock (``BEGIN IMMEDIATE``), first applies the events that other processes
committed since it last looked, then validates its own event against that
up-to-date state, appends it and commits. Events are therefore totally ordered
by their sequence number, and every process's replica agrees with the file.

Main declarations:

- :class:`Journal`: the SQLite file and its transactions.
- :class:`JournalRow`: one stored, verified event.
- :class:`HighWaterMark`: the mark file beside it.
- :func:`row_digest`, :func:`genesis_digest`: the chain.
"""

from __future__ import annotations

import enum
import hashlib
import json
import os
import secrets
import sqlite3
import struct
import threading
import zlib
from collections.abc import Generator
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, cast, final

try:  # POSIX: the mark is shared by processes under an advisory lock
    import fcntl
except ImportError:  # pragma: no cover - no advisory locks: each process still moves it forward
    fcntl = None  # type: ignore[assignment]

from witcert_calculus.errors import InvalidValueError, JournalError
from witcert_calculus.numerics.validation import timeout_seconds

__all__ = [
    "FORMAT_VERSION",
    "HighWaterMark",
    "Journal",
    "JournalRow",
    "genesis_digest",
    "row_digest",
]

FORMAT_VERSION = 3
"""Version of the journal's table layout and event encoding.

Version 2: replay enforces slot ownership (a request writes or evicts only its
own and free slots) and a close records the slots it frees. Version 3: every
row is chained to the previous one by its digest, sequence numbers are
assigned by the journal (no gaps), a high-water mark file sits beside the
database, and slot events record the generations of their slots. A journal of another version does not open: its events were made
under other rules.
"""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY,
    op TEXT NOT NULL,
    payload TEXT NOT NULL,
    data BLOB,
    token TEXT UNIQUE,
    prev BLOB NOT NULL,
    digest BLOB NOT NULL
);
"""

_SYNC_EXTRA = 3  # PRAGMA synchronous value of EXTRA

# What reading a damaged file can raise: SQLite's errors, and text that is not UTF-8.
_DB_ERRORS = (sqlite3.Error, ValueError)


def _encode(value: object) -> object:
    # Exact text for fractions; enums by value (IntEnums are already ints for json).
    if isinstance(value, Fraction):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.value
    raise TypeError(f"cannot journal {type(value).__name__}")


def _field(h: Any, raw: bytes) -> None:
    # Length-prefixed, so no two different rows hash the same byte string.
    h.update(struct.pack(">Q", len(raw)))
    h.update(raw)


def genesis_digest(journal_id: str, n_slots: int) -> bytes:
    """The ``prev`` of a journal's first row: binds the chain to the journal and its table size.

    Example:
        >>> len(genesis_digest("00" * 16, 8))
        32
    """
    h = hashlib.sha256(b"witcert-journal-genesis")
    _field(h, str(FORMAT_VERSION).encode())
    _field(h, journal_id.encode())
    _field(h, str(n_slots).encode())
    return h.digest()


def row_digest(prev: bytes, seq: int, op: str, payload: str, data: bytes,
               token: str | None) -> bytes:
    """SHA-256 of one row, chained to the digest of the row before it.

    Args:
        prev: the previous row's digest (the genesis digest for the first row).
        seq: the row's sequence number.
        op: its operation name.
        payload: its JSON payload, exactly as stored.
        data: its packed arrays.
        token: its idempotency token, or ``None``.

    Example:
        >>> a = row_digest(bytes(32), 1, "open", '{"rid": 1}', b"", None)
        >>> a == row_digest(bytes(32), 1, "open", '{"rid": 2}', b"", None)
        False
    """
    h = hashlib.sha256(b"witcert-journal-row")
    _field(h, prev)
    h.update(struct.pack(">q", seq))
    _field(h, op.encode())
    _field(h, payload.encode())
    _field(h, data)
    if token is None:
        h.update(b"\x00")
    else:
        h.update(b"\x01")
        _field(h, token.encode())
    return h.digest()


@final
@dataclass(frozen=True, slots=True)
class JournalRow:
    """One stored event, verified against the chain.

    Attributes:
        seq: position in the total order of events (1-based, increasing, no gaps).
        op: the event's kind.
        payload: its JSON fields.
        data: packed arrays (slot indices, masks, bounds), or ``b""``.
        token: the caller's idempotency token, if any.
        digest: the row's digest in the chain.
    """

    seq: int
    op: str
    payload: dict[str, Any]
    data: bytes
    token: str | None
    digest: bytes = b""


_MARK_MAGIC = b"WCHM"
_MARK_SLOT = struct.Struct(">4s16sq32sI")  # magic, journal id, seq, digest, crc32


@final
class HighWaterMark:
    """The high-water mark file beside a journal: the highest acknowledged event.

    Two fixed slots, each ``magic, journal id, seq, digest, crc32``; an advance
    writes the slot of the new sequence number's parity in place and syncs it,
    so a torn write spoils one slot and the other still holds the previous
    mark. The mark only moves forward (under an advisory lock, across processes).

    Args:
        path: the mark file (created empty if missing).
        journal_id: the journal's id (32 hex digits); a slot of another journal
            does not count.

    Raises:
        JournalError: if the file cannot be opened.
    """

    __slots__ = ("_fd", "_id", "path")

    def __init__(self, path: str, journal_id: str) -> None:
        self.path = path
        try:
            self._id = bytes.fromhex(journal_id)
        except ValueError as exc:
            raise JournalError(path, f"journal id {journal_id!r} is not hexadecimal") from exc
        try:
            existed = os.path.exists(path)
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            if not existed:
                _sync_dir(path)
        except OSError as exc:
            raise JournalError(path, f"cannot open the high-water mark: {exc}") from exc

    @contextmanager
    def _locked(self) -> Generator[None, None, None]:
        if fcntl is not None:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            if fcntl is not None:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _slots(self, *, foreign: bool = False) -> list[tuple[int, bytes]]:
        # The valid slots of this journal (or, with foreign=True, of any other journal).
        raw = os.pread(self._fd, 2 * _MARK_SLOT.size, 0)
        out: list[tuple[int, bytes]] = []
        for k in range(2):
            chunk = raw[k * _MARK_SLOT.size:(k + 1) * _MARK_SLOT.size]
            if len(chunk) != _MARK_SLOT.size:
                continue
            magic, jid, seq, digest, crc = _MARK_SLOT.unpack(chunk)
            if (magic == _MARK_MAGIC and (jid != self._id) == foreign and seq >= 0
                    and zlib.crc32(chunk[:-4]) == crc):
                out.append((int(seq), bytes(digest)))
        return out

    def foreign(self) -> int:
        """The highest mark this file holds for *another* journal (0 if none).

        A mark of another journal beside a database means the database it
        belonged to was replaced (deleted, truncated to nothing, or swapped).

        Raises:
            JournalError: if the file cannot be read.
        """
        try:
            with self._locked():
                slots = self._slots(foreign=True)
        except OSError as exc:
            raise JournalError(self.path, f"cannot read the high-water mark: {exc}") from exc
        return max(slots)[0] if slots else 0

    def read(self) -> tuple[int, bytes] | None:
        """The mark: ``(seq, digest)`` of the highest acknowledged event, or ``None`` if unset.

        Raises:
            JournalError: if the file cannot be read.
        """
        try:
            with self._locked():
                slots = self._slots()
        except OSError as exc:
            raise JournalError(self.path, f"cannot read the high-water mark: {exc}") from exc
        return max(slots) if slots else None

    def _put(self, slot: int, seq: int, digest: bytes) -> None:
        body = _MARK_SLOT.pack(_MARK_MAGIC, self._id, seq, digest, 0)[:-4]
        os.pwrite(self._fd, body + struct.pack(">I", zlib.crc32(body)), slot * _MARK_SLOT.size)
        os.fsync(self._fd)

    def advance(self, seq: int, digest: bytes) -> None:
        """Raise the mark to ``seq`` (no change if it is already at or above it); synced.

        Raises:
            JournalError: if the file cannot be written.
        """
        try:
            with self._locked():
                slots = self._slots()
                if not slots or seq > max(slots)[0]:
                    self._put(seq % 2, seq, digest)
        except OSError as exc:
            raise JournalError(self.path, f"cannot write the high-water mark: {exc}") from exc

    def rewrite(self, seq: int, digest: bytes) -> None:
        """Set the mark to ``seq`` in both slots, also downward (to adopt a journal deliberately).

        Raises:
            JournalError: if the file cannot be written.
        """
        try:
            with self._locked():
                self._put(0, seq, digest)
                self._put(1, seq, digest)
        except OSError as exc:
            raise JournalError(self.path, f"cannot write the high-water mark: {exc}") from exc

    def close(self) -> None:
        """Close the file."""
        try:
            os.close(self._fd)
        except OSError:
            pass


def _sync_dir(path: str) -> None:
    # Make a newly created file's directory entry durable (POSIX; a no-op where unsupported).
    try:
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@final
class Journal:
    """An SQLite journal file in WAL mode, hash-chained, with a high-water mark beside it.

    Args:
        path: the database file (created if missing); the mark is ``<path>.mark``.
        n_slots: size of the slot table the journal belongs to; a journal
            created for another size refuses to open.
        busy_timeout_s: how long a writer waits for another process's write lock, in
            seconds: finite, in ``[0, TIMEOUT_MAX_S]`` (about 24.8 days; SQLite's limit).

    Raises:
        InvalidValueError: for a path that is not a str or path-like, or a bad
            ``busy_timeout_s`` (negative, NaN, infinite, too large, not a real number).
        JournalError: if the file cannot be opened, is not a journal of this
            format, belongs to a different slot-table size, has no mark while it
            holds events, or holds fewer events than its mark (or another event
            at the mark).
    """

    __slots__ = ("_conn", "_genesis", "_in_tx", "_lock", "_mark", "_pending", "_tip", "path")

    def __init__(self, path: str | os.PathLike[str], *, n_slots: int,
                 busy_timeout_s: float = 60.0) -> None:
        busy_timeout_s = timeout_seconds("busy_timeout_s", busy_timeout_s)
        if not isinstance(path, (str, os.PathLike)):
            raise InvalidValueError("journal", path, "must be a path (str or os.PathLike)")
        self.path = os.fspath(path)
        self._lock = threading.RLock()
        self._in_tx = False
        self._pending: tuple[int, bytes] | None = None
        self._mark: HighWaterMark | None = None
        try:
            self._conn = sqlite3.connect(self.path, timeout=busy_timeout_s, isolation_level=None,
                                         check_same_thread=False)
        except _DB_ERRORS as exc:
            raise JournalError(self.path, f"cannot open: {exc}") from exc
        try:
            self._open(n_slots, busy_timeout_s)
        except BaseException:
            self.close()
            raise

    def _open(self, n_slots: int, busy_timeout_s: float) -> None:
        try:
            self._conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
            mode = self._conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise JournalError(self.path, f"cannot switch to WAL mode (got {mode!r})")
            self._conn.execute("PRAGMA synchronous=EXTRA")
            sync = self._conn.execute("PRAGMA synchronous").fetchone()[0]
            if sync != _SYNC_EXTRA:
                raise JournalError(self.path, f"cannot set synchronous=EXTRA (got {sync!r})")
        except _DB_ERRORS as exc:
            raise JournalError(self.path, f"cannot open: {exc}") from exc
        journal_id = self._init_schema(n_slots)
        self._genesis = genesis_digest(journal_id, n_slots)
        self._tip = (0, self._genesis)
        self._mark = HighWaterMark(f"{self.path}.mark", journal_id)
        self._check_mark()

    def _init_schema(self, n_slots: int) -> str:
        try:
            with self.transaction():
                for stmt in _SCHEMA.strip().split(";"):
                    if stmt.strip():
                        self._conn.execute(stmt)
                rows = dict(self._conn.execute("SELECT key, value FROM meta").fetchall())
                if not rows:
                    rows = {"format": str(FORMAT_VERSION), "n_slots": str(n_slots),
                            "journal_id": secrets.token_hex(16)}
                    self._conn.executemany("INSERT INTO meta VALUES (?, ?)", rows.items())
        except _DB_ERRORS as exc:
            raise JournalError(self.path, f"cannot initialise: {exc}") from exc
        if rows.get("format") != str(FORMAT_VERSION):
            raise JournalError(self.path, f"format {rows.get('format')!r}, expected "
                               f"{FORMAT_VERSION}")
        if rows.get("n_slots") != str(n_slots):
            raise JournalError(self.path, f"was created for n_slots={rows.get('n_slots')}, "
                               f"opened with n_slots={n_slots}")
        journal_id = rows.get("journal_id")
        if not isinstance(journal_id, str) or len(journal_id) != 32:
            raise JournalError(self.path, f"journal id {journal_id!r} is not 32 hex digits")
        return journal_id

    def _check_mark(self) -> None:
        assert self._mark is not None
        mark = self._mark.read()
        try:
            last = self._conn.execute("SELECT MAX(seq) FROM events").fetchone()[0] or 0
            at = None if mark is None else self._conn.execute(
                "SELECT digest FROM events WHERE seq=?", (mark[0],)).fetchone()
        except _DB_ERRORS as exc:
            raise JournalError(self.path, f"cannot read events: {exc}") from exc
        if not isinstance(last, int) or (at is not None and not isinstance(at[0], bytes)):
            raise JournalError(self.path, f"has a malformed events table (last seq {last!r})")
        if mark is None:
            replaced = self._mark.foreign()
            if replaced:
                raise JournalError(self.path, f"its high-water mark {self._mark.path} belongs "
                                   f"to another journal that acknowledged {replaced} events: "
                                   "the database was replaced or emptied (to start afresh, "
                                   "delete the mark too)", seq=replaced)
            if last:
                raise JournalError(self.path, f"holds events up to {last} but its high-water "
                                   f"mark {self._mark.path} is missing or unreadable; events "
                                   "acknowledged after the last one it holds cannot be ruled "
                                   "out", seq=int(last))
            self._mark.advance(0, self._genesis)
            return
        seq, digest = mark
        if seq > last:
            raise JournalError(self.path, f"holds events up to {last}, fewer than its "
                               f"high-water mark {seq}: {seq - int(last)} acknowledged events "
                               "are missing (a damaged WAL or a truncated file)", seq=seq)
        if seq > 0 and (at is None or bytes(at[0]) != digest):
            raise JournalError(self.path, f"event {seq} is not the event its high-water mark "
                               "acknowledged", seq=seq)

    @contextmanager
    def transaction(self) -> Generator[None, None, None]:
        """A write transaction (``BEGIN IMMEDIATE``); commits on success, rolls back on error.

        After the commit, the high-water mark is raised to the last event appended.

        Raises:
            JournalError: if SQLite cannot begin or commit, or the mark cannot be
                written. In the last case the event is committed but not
                acknowledged: it is not applied here, and the next read of the
                journal replays it (the mark stays behind, never ahead).
        """
        with self._lock:
            if self._in_tx:
                yield
                return
            try:
                self._conn.execute("BEGIN IMMEDIATE")
            except _DB_ERRORS as exc:
                raise JournalError(self.path, f"cannot begin a write transaction: {exc}") from exc
            self._in_tx = True
            self._pending = None
            try:
                yield
            except BaseException:
                self._in_tx = False
                self._pending = None
                try:
                    self._conn.execute("ROLLBACK")
                except _DB_ERRORS:
                    pass
                raise
            self._in_tx = False
            pending: tuple[int, bytes] | None = self._take_pending()
            try:
                self._conn.execute("COMMIT")
            except _DB_ERRORS as exc:
                try:
                    self._conn.execute("ROLLBACK")
                except _DB_ERRORS:
                    pass
                raise JournalError(self.path, f"commit failed, event not recorded: {exc}") from exc
            if pending is not None:
                # Durable in the database; now the mark (never ahead of the database).
                self._tip = pending
                if self._mark is not None:
                    self._mark.advance(*pending)

    def _take_pending(self) -> tuple[int, bytes] | None:
        # The last row appended in this transaction, if any (cleared for the next one).
        pending, self._pending = self._pending, None
        return pending

    def append(self, op: str, payload: dict[str, Any], data: bytes = b"",
               token: str | None = None) -> int:
        """Append one event after the last one read, inside the current transaction.

        Call :meth:`since` first in the same transaction (the chain continues from
        the last row it verified).

        Returns:
            The event's sequence number.

        Raises:
            JournalError: outside a transaction, or if SQLite refuses the row.
        """
        with self._lock:
            if not self._in_tx:
                raise JournalError(self.path, "append outside a write transaction")
            last, prev = self._pending or self._tip
            seq = last + 1
            text = json.dumps(payload, sort_keys=True, default=_encode)
            digest = row_digest(prev, seq, op, text, data, token)
            try:
                self._conn.execute(
                    "INSERT INTO events (seq, op, payload, data, token, prev, digest) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)", (seq, op, text, data, token, prev, digest))
            except _DB_ERRORS as exc:
                raise JournalError(self.path, f"cannot append {op!r}: {exc}", seq=seq) from exc
            self._pending = (seq, digest)
            return seq

    def _prev_of(self, seq: int) -> bytes:
        # The digest the row after ``seq`` must chain to.
        if seq == 0:
            return self._genesis
        if seq == self._tip[0]:
            return self._tip[1]
        row = self._conn.execute("SELECT digest FROM events WHERE seq=?", (seq,)).fetchone()
        if row is None:
            raise JournalError(self.path, f"event {seq} is missing", seq=seq)
        return bytes(row[0])

    def since(self, seq: int) -> list[JournalRow]:
        """Every event with a sequence number above ``seq``, in order, verified against the chain.

        Raises:
            JournalError: if the file cannot be read, or a row is out of sequence,
                fails its digest or does not decode (naming its sequence number).
        """
        with self._lock:
            try:
                prev = self._prev_of(seq)
                rows = self._conn.execute(
                    "SELECT seq, op, payload, data, token, prev, digest FROM events "
                    "WHERE seq > ? ORDER BY seq", (seq,)).fetchall()
            except _DB_ERRORS as exc:
                raise JournalError(self.path, f"cannot read events: {exc}", seq=seq + 1) from exc
            out: list[JournalRow] = []
            expect = seq
            for s, op, payload, data, token, row_prev, digest in rows:
                expect += 1
                if not isinstance(s, int):
                    raise JournalError(self.path, f"event {expect} has a malformed row",
                                       seq=expect)
                if s != expect:
                    raise JournalError(self.path, f"event {expect} is missing (the next row is "
                                       f"{s})", seq=expect)
                if not (isinstance(op, str) and isinstance(payload, str)
                        and isinstance(row_prev, bytes) and isinstance(digest, bytes)
                        and (data is None or isinstance(data, bytes))
                        and (token is None or isinstance(token, str))):
                    raise JournalError(self.path, f"event {s} has a malformed row", seq=s)
                blob = b"" if data is None else data
                if row_prev != prev or row_digest(prev, s, op, payload, blob, token) != digest:
                    raise JournalError(self.path, f"event {s} fails its digest: the row was "
                                       "changed, or a row before it was", seq=s)
                try:
                    decoded = json.loads(payload)
                except ValueError as exc:
                    raise JournalError(self.path, f"event {s} does not decode: {exc}",
                                       seq=s) from exc
                if not isinstance(decoded, dict):
                    raise JournalError(self.path, f"event {s} does not decode to fields", seq=s)
                fields = cast("dict[str, Any]", decoded)
                out.append(JournalRow(seq=s, op=op, payload=fields, data=blob, token=token,
                                      digest=digest))
                prev = digest
            if out and out[-1].seq > self._tip[0]:
                self._tip = (out[-1].seq, out[-1].digest)
            return out

    def close(self) -> None:
        """Close the connection and the mark (committed events stay durable)."""
        with self._lock:
            self._conn.close()
            if self._mark is not None:
                self._mark.close()
                self._mark = None
