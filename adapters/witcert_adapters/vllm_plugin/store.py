"""The verdict store: finished requests' verdicts in one SQLite file (WAL).

The worker (the engine process that meters) writes one row per finished request; the
API server's side endpoint and metrics collector, and offline callers, read them. SQLite
in WAL mode lets one writer and any number of readers in other processes share the file;
each verdict is committed in its own transaction, so a verdict a reader has seen survives
the engine's death (``kill -9``).

A request cut by the engine's death never gets a verdict from it. So the engine opens a
*session* (:meth:`VerdictStore.open_session`): a row, and an exclusive ``flock`` on a lock
file beside the store that the operating system releases when the process dies; each
request is recorded when its account opens (:meth:`VerdictStore.opened`). An engine, as it
starts, cuts every dead session's requests without a verdict (:meth:`VerdictStore.recover`):
each gets a verdict that failed closed, no tier, its whole budget counted as spent, and the
reason. A live session (its lock held) is never touched.

Main declarations
-----------------
- :class:`VerdictStore`: :meth:`~VerdictStore.put`, :meth:`~VerdictStore.find`,
  :meth:`~VerdictStore.wait`, :meth:`~VerdictStore.totals`.
- :class:`Totals`: aggregates for the metrics.
- :class:`ShadowRecord`: a request's shadow-audit outcome (:meth:`~VerdictStore.put_shadow`,
  :meth:`~VerdictStore.shadow`).
- :func:`track`: an engine's session and its requests, recorded as their accounts open.
"""

from __future__ import annotations

import fcntl
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, final

from witcert_adapters.vllm_plugin.verdicts import Accounts, RequestVerdict, cut_verdict
from witcert_calculus.errors import InvalidValueError

__all__ = ["ShadowRecord", "Totals", "VerdictStore", "track"]

_SESSION_KEYS: Final = ("kv_cache_dtype", "form", "witness", "tau", "delta_req")

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS verdicts (
    session TEXT NOT NULL,
    account INTEGER NOT NULL,
    request TEXT NOT NULL,
    external TEXT NOT NULL,
    kv_cache_dtype TEXT NOT NULL,
    tier TEXT,
    cells INTEGER NOT NULL,
    covered INTEGER NOT NULL,
    saturated INTEGER NOT NULL,
    audited INTEGER NOT NULL,
    violations INTEGER NOT NULL,
    coverage REAL NOT NULL,
    worst REAL NOT NULL,
    finished REAL NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (session, account)
);
CREATE INDEX IF NOT EXISTS verdicts_external ON verdicts (external);
CREATE INDEX IF NOT EXISTS verdicts_request ON verdicts (request);
CREATE TABLE IF NOT EXISTS sessions (
    session TEXT PRIMARY KEY,
    pid INTEGER NOT NULL,
    started REAL NOT NULL,
    ended REAL,
    settings TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS shadow (
    request TEXT PRIMARY KEY,
    audit TEXT NOT NULL,
    sampled INTEGER NOT NULL,
    max_tv REAL,
    mean_kl REAL,
    exceeded INTEGER,
    rate_upper REAL NOT NULL,
    trials INTEGER NOT NULL,
    events INTEGER NOT NULL,
    threshold REAL NOT NULL,
    alpha REAL NOT NULL,
    recorded REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS opened (
    session TEXT NOT NULL,
    account INTEGER NOT NULL,
    request TEXT NOT NULL,
    opened REAL NOT NULL,
    PRIMARY KEY (session, account)
);
"""


@final
@dataclass(frozen=True, slots=True)
class Totals:
    """Aggregates over the stored verdicts of one ``(kv_cache_dtype, tier)`` group."""

    kv_cache_dtype: str
    tier: str
    requests: int
    cells: int
    covered: int
    saturated: int
    audited: int
    violations: int


@final
@dataclass(frozen=True, slots=True)
class ShadowRecord:
    """One request's shadow-audit outcome (:func:`witcert_adapters.shadow.vllm_shadow_audit`).

    Attributes:
        request: vLLM's internal request id.
        audit: the audit's name (e.g. ``"vllm fp8"``).
        sampled: whether the request was replayed (decided before it was served).
        max_tv, mean_kl: its largest step TV and mean step KL (``None`` when not sampled).
        rate_upper, trials, events: the audit's rate bound and counts after this request.
        threshold, alpha: the divergence threshold and the bound's miscoverage level.
    """

    request: str
    audit: str
    sampled: bool
    max_tv: float | None
    mean_kl: float | None
    rate_upper: float
    trials: int
    events: int
    threshold: float
    alpha: float


@final
class VerdictStore:
    """One SQLite file of verdicts.

    Args:
        path: the file (created with its table if missing).

    Raises:
        InvalidValueError: the folder does not exist.
    """

    __slots__ = ("_conn", "_lock", "_session_lock", "path")

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.parent.is_dir():
            raise InvalidValueError("store", str(self.path), "its folder does not exist")
        self._conn = sqlite3.connect(self.path, timeout=30.0, check_same_thread=False,
                                     isolation_level=None)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.executescript(_SCHEMA)
        self._lock = threading.Lock()
        self._session_lock: int | None = None

    def close(self) -> None:
        """Close the connection (and release this process's session, if it opened one)."""
        self._conn.close()
        if self._session_lock is not None:
            os.close(self._session_lock)
            self._session_lock = None

    def _lock_file(self, session: str) -> Path:
        return self.path.with_name(f"{self.path.name}.session-{session}.lock")

    def open_session(self, session: str, settings: dict[str, str]) -> None:
        """Open this engine's session (its row and its lock, held until the process ends).
        The engine cuts the dead sessions' requests (:meth:`recover`) as it starts, before
        it opens its own.

        Args:
            session: the engine's session id; ``settings``: what its verdicts report
                (``kv_cache_dtype``, ``form``, ``witness``, ``tau``, ``delta_req``).

        Raises:
            InvalidValueError: a session id already in the store, a second session for this
                store object, or settings missing a key (named).
        """
        missing = [k for k in _SESSION_KEYS if k not in settings]
        if missing:
            raise InvalidValueError("session settings", missing, "are missing")
        if self._session_lock is not None:
            raise InvalidValueError("session", session, "this store object already holds one")
        with self._lock:
            if self._conn.execute("SELECT 1 FROM sessions WHERE session = ?",
                                  (session,)).fetchone():
                raise InvalidValueError("session", session, "is already in the store")
        fd = os.open(self._lock_file(session), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise InvalidValueError("session", session, "is held by another process") from None
        self._session_lock = fd
        with self._lock:
            self._conn.execute("INSERT INTO sessions VALUES (?, ?, ?, NULL, ?)",
                               (session, os.getpid(), time.time(), json.dumps(settings)))

    def opened(self, session: str, account: int, request: str) -> None:
        """Record that a request's account opened (before it has any verdict)."""
        with self._lock:
            self._conn.execute("INSERT OR REPLACE INTO opened VALUES (?, ?, ?, ?)",
                               (session, account, request, time.time()))

    def _alive(self, session: str) -> bool:
        # a session is alive while some process holds its lock
        try:
            fd = os.open(self._lock_file(session), os.O_RDWR)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    def recover(self) -> list[RequestVerdict]:
        """Cut the requests of every dead session that have no verdict: each gets a verdict
        that failed closed (no tier, its whole budget spent), and the session is ended.

        Returns:
            The verdicts written.
        """
        with self._lock:
            sessions = self._conn.execute(
                "SELECT session, settings FROM sessions WHERE ended IS NULL").fetchall()
        cut: list[RequestVerdict] = []
        for session, settings in sessions:
            if self._alive(str(session)):
                continue
            with self._lock:
                rows = self._conn.execute(
                    "SELECT o.account, o.request FROM opened o LEFT JOIN verdicts v "
                    "ON v.session = o.session AND v.account = o.account "
                    "WHERE o.session = ? AND v.account IS NULL ORDER BY o.account",
                    (session,)).fetchall()
            for account, request in rows:
                v = cut_verdict(str(request), int(account), str(session),
                                json.loads(settings))
                self.put(v)
                cut.append(v)
            with self._lock:
                self._conn.execute("UPDATE sessions SET ended = ? WHERE session = ?",
                                   (time.time(), session))
            self._lock_file(str(session)).unlink(missing_ok=True)
        return cut

    def put(self, v: RequestVerdict) -> None:
        """Store one verdict (a second verdict of the same account replaces the first)."""
        row = (v.session, v.account, v.request, v.external, v.kv_cache_dtype, v.tier, v.cells,
               v.covered, v.saturated, v.audited, v.violations, v.coverage, v.worst.meter,
               time.time(), json.dumps(v.to_json()))
        with self._lock:
            self._conn.execute("INSERT OR REPLACE INTO verdicts VALUES "
                               "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", row)

    def put_shadow(self, record: ShadowRecord) -> None:
        """Store one request's shadow-audit outcome, with the audit's rate bound after it
        (a second record of the same request replaces the first)."""
        r = record
        row = (r.request, r.audit, int(r.sampled), r.max_tv, r.mean_kl,
               None if r.max_tv is None else int(r.max_tv > r.threshold), r.rate_upper,
               r.trials, r.events, r.threshold, r.alpha, time.time())
        with self._lock:
            self._conn.execute("INSERT OR REPLACE INTO shadow VALUES "
                               "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", row)

    def shadow(self, request_id: str) -> ShadowRecord | None:
        """The shadow-audit record of one request (vLLM's internal id), if any."""
        with self._lock:
            row = self._conn.execute(
                "SELECT request, audit, sampled, max_tv, mean_kl, rate_upper, trials, events, "
                "threshold, alpha FROM shadow WHERE request = ?", (request_id,)).fetchone()
        if row is None:
            return None
        return ShadowRecord(row[0], row[1], bool(row[2]), row[3], row[4], row[5], row[6],
                            row[7], row[8], row[9])

    def _select(self, where: str, args: tuple[str, ...]) -> list[RequestVerdict]:
        with self._lock:
            rows = self._conn.execute(
                f"SELECT body FROM verdicts WHERE {where} ORDER BY finished, account",
                args).fetchall()
        return [RequestVerdict.from_json(json.loads(r[0])) for r in rows]

    def find(self, request_id: str) -> list[RequestVerdict]:
        """Verdicts of one client request.

        ``request_id`` is vLLM's internal id, the response's ``id`` (a completion's id
        covers each of its prompts, ``<id>-<i>``), or the ``X-Request-Id`` the client sent
        (vLLM's server prefixes it: ``cmpl-<id>-<i>``, ``chatcmpl-<id>``).
        """
        pattern = request_id.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        return self._select(
            "request = ? OR external = ? OR external = ? OR external LIKE ? ESCAPE '\\' "
            "OR external LIKE ? ESCAPE '\\'",
            (request_id, request_id, f"chatcmpl-{request_id}", pattern + "-%",
             f"cmpl-{pattern}-%"))

    def all(self) -> list[RequestVerdict]:
        """Every stored verdict, oldest first."""
        return self._select("1 = 1", ())

    def wait(self, request_ids: list[str], *, timeout: float = 30.0,
             poll: float = 0.05) -> dict[str, list[RequestVerdict]]:
        """Wait until every id has a verdict (the engine writes it one step after finishing).

        Raises:
            TimeoutError: some ids still have none after ``timeout`` seconds (named).
        """
        deadline = time.monotonic() + timeout
        while True:
            found = {r: self.find(r) for r in request_ids}
            missing = [r for r, v in found.items() if not v]
            if not missing:
                return found
            if time.monotonic() > deadline:
                raise TimeoutError(f"no verdict after {timeout} s for {missing[:5]}")
            time.sleep(poll)

    def totals(self) -> list[Totals]:
        """Aggregates per ``(kv_cache_dtype, tier)`` (a failed-closed request's tier is
        ``"FAILED"``)."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT kv_cache_dtype, COALESCE(tier, 'FAILED'), COUNT(*), SUM(cells), "
                "SUM(covered), SUM(saturated), SUM(audited), SUM(violations) FROM verdicts "
                "GROUP BY 1, 2 ORDER BY 1, 2").fetchall()
        return [Totals(str(r[0]), str(r[1]), *(int(x) for x in r[2:])) for r in rows]


def track(store: VerdictStore, accounts: Accounts) -> None:
    """Open the session of an engine's accounts on the store and record each request as its
    account opens."""
    store.open_session(accounts.session, {
        "kv_cache_dtype": accounts.kv_cache_dtype, "form": accounts.form,
        "witness": accounts.witness, "tau": repr(float(accounts.tau)),
        "delta_req": str(accounts.delta_req)})
    session = accounts.session
    accounts.on_open = lambda t: store.opened(session, t.account, t.request)


def on_each(store: VerdictStore) -> Callable[[RequestVerdict], None]:
    """A sink that stores each verdict."""
    return store.put
