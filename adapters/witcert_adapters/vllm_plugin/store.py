"""The verdict store: finished requests' verdicts in one SQLite file (WAL).

The worker (the engine process that meters) writes one row per finished request; the
API server's side endpoint and metrics collector, and offline callers, read them. SQLite
in WAL mode lets one writer and any number of readers in other processes share the file;
each verdict is committed in its own transaction.

Main declarations
-----------------
- :class:`VerdictStore`: :meth:`~VerdictStore.put`, :meth:`~VerdictStore.find`,
  :meth:`~VerdictStore.wait`, :meth:`~VerdictStore.totals`.
- :class:`Totals`: aggregates for the metrics.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, final

from witcert_adapters.vllm_plugin.verdicts import RequestVerdict
from witcert_calculus.errors import InvalidValueError

__all__ = ["Totals", "VerdictStore"]

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
class VerdictStore:
    """One SQLite file of verdicts.

    Args:
        path: the file (created with its table if missing).

    Raises:
        InvalidValueError: the folder does not exist.
    """

    __slots__ = ("_conn", "_lock", "path")

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.parent.is_dir():
            raise InvalidValueError("store", str(self.path), "its folder does not exist")
        self._conn = sqlite3.connect(self.path, timeout=30.0, check_same_thread=False,
                                     isolation_level=None)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.executescript(_SCHEMA)
        self._lock = threading.Lock()

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()

    def put(self, v: RequestVerdict) -> None:
        """Store one verdict (a second verdict of the same account replaces the first)."""
        row = (v.session, v.account, v.request, v.external, v.kv_cache_dtype, v.tier, v.cells,
               v.covered, v.saturated, v.audited, v.violations, v.coverage, v.worst.meter,
               time.time(), json.dumps(v.to_json()))
        with self._lock:
            self._conn.execute("INSERT OR REPLACE INTO verdicts VALUES "
                               "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", row)

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


def on_each(store: VerdictStore) -> Callable[[RequestVerdict], None]:
    """A sink that stores each verdict."""
    return store.put
