"""Prometheus text exposition of a risk ledger's gauges and counters.

Every family carries the ``witcert_`` prefix. Labels are low-cardinality by
construction: event kinds, tiers, slot states, read kinds and sentinel names
(chosen by the operator), never request ids or slot indices.

Main declarations:

- :func:`prometheus_text`
"""

from __future__ import annotations

import math

from witcert_calculus.records import LedgerStats

__all__ = [
    "prometheus_text",
]


def _num(x: float | int) -> str:
    if isinstance(x, int):
        return str(x)
    return repr(float(x)) if x == x else "NaN"


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def prometheus_text(stats: LedgerStats) -> str:
    """Render a ledger's aggregates in the Prometheus text format (version 0.0.4).

    Args:
        stats: the aggregates, e.g. ``ledger.stats()`` (``RiskLedger.prometheus``
            renders its own).

    Returns:
        The exposition text, ending with a newline.

    Example:
        >>> from fractions import Fraction
        >>> from witcert_calculus.records import EventCounts
        >>> text = prometheus_text(LedgerStats(
        ...     requests=0, open_requests=0, counts=EventCounts(), open_by_tier=(), entries=0,
        ...     entries_kept=0, steps=0, vacuous_steps=0, worst_spent_fraction=Fraction(0),
        ...     slots=(), reads_own=0, reads_shared=0, slot_writes=0, events=0, sentinels=()))
        >>> "witcert_ledger_requests_open 0" in text
        True
    """
    s = stats
    c = s.counts
    out: list[str] = []

    def family(name: str, kind: str, help_: str,
               samples: list[tuple[dict[str, str], float | int]]) -> None:
        out.append(f"# HELP {name} {help_}")
        out.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            lab = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
            out.append(f"{name}{{{lab}}} {_num(value)}" if lab else f"{name} {_num(value)}")

    family("witcert_ledger_requests_total", "counter", "Requests ever opened.",
           [({}, s.requests)])
    family("witcert_ledger_requests_open", "gauge", "Requests currently open.",
           [({}, s.open_requests)])
    family("witcert_ledger_admissions_total", "counter", "Admissions by event kind.",
           [({"kind": "deterministic"}, c.deterministic),
            ({"kind": "probabilistic"}, c.probabilistic),
            ({"kind": "empirical_fallback"}, c.empirical_fallback),
            ({"kind": "empirical_degraded"}, c.empirical_degraded)])
    family("witcert_ledger_saturated_certificates_total", "counter",
           "Admitted certificates whose bound reached saturation (vacuous).",
           [({}, c.saturated)])
    family("witcert_ledger_open_requests_by_verdict", "gauge", "Open requests by verdict tier.",
           [({"tier": t.name.lower()}, n) for t, n in s.open_by_tier])
    family("witcert_ledger_worst_spent_fraction", "gauge",
           "Largest spent/delta_req over open requests (always < 1).",
           [({}, float(s.worst_spent_fraction))])
    family("witcert_ledger_entries_total", "counter", "Entries offered to entry-level admission.",
           [({"decision": "kept"}, s.entries_kept),
            ({"decision": "fallback"}, s.entries - s.entries_kept)])
    family("witcert_ledger_steps_total", "counter", "Entry batches admitted, by step bound.",
           [({"bound": "informative"}, s.steps - s.vacuous_steps),
            ({"bound": "vacuous"}, s.vacuous_steps)])
    family("witcert_ledger_events_total", "counter", "Events applied (journal sequence).",
           [({}, s.events)])
    family("witcert_slots", "gauge", "Slots by state.",
           [({"state": st.name.lower()}, n) for st, n in s.slots])
    family("witcert_slot_writes_total", "counter", "Slot writes (each charged once).",
           [({}, s.slot_writes)])
    family("witcert_slot_reads_total", "counter", "Slot reads served by this process.",
           [({"kind": "own"}, s.reads_own), ({"kind": "shared"}, s.reads_shared)])
    family("witcert_eprocess_log_value", "gauge", "log M_t of each drift sentinel.",
           [({"sentinel": n}, st.log_value) for n, st in s.sentinels])
    family("witcert_eprocess_threshold", "gauge", "ln(1/delta_e) of each drift sentinel.",
           [({"sentinel": n}, -math.log(st.delta)) for n, st in s.sentinels])
    family("witcert_eprocess_alarm", "gauge", "1 when the sentinel's alarm has fired.",
           [({"sentinel": n}, int(st.alarm_step is not None)) for n, st in s.sentinels])
    family("witcert_eprocess_observations_total", "counter", "Observations per sentinel.",
           [({"sentinel": n}, st.steps) for n, st in s.sentinels])
    return "\n".join(out) + "\n"
