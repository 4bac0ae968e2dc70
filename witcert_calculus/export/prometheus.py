"""Prometheus metrics of witcert, built with ``prometheus_client`` (the ``metrics`` extra).

One module defines every ``witcert_`` metric family: the risk ledger's gauges and
counters (:func:`ledger_families`, :class:`LedgerCollector`, :func:`prometheus_text`),
meter readings as a histogram and a running maximum per metric (:class:`MeterExport`),
and the family constructors the vLLM plugin's verdict collector uses
(:func:`counter`, :func:`gauge`). Every family carries the ``witcert_`` prefix and labels
are low-cardinality by construction: event kinds, tiers, slot states, read kinds, metric
names, dtypes and sentinel names (chosen by the operator), never request ids or slot
indices; :func:`counter` and :func:`gauge` refuse a label named after a per-request value.

``import witcert_calculus`` does not load this module (nor ``prometheus_client``):
:meth:`RiskLedger.prometheus <witcert_calculus.ledger.RiskLedger.prometheus>` imports it
on first use.

Exposition text, compared with the hand-written renderer this module replaced: the
families, their order, names, ``# HELP``/``# TYPE`` lines and label sets are unchanged;
sample values are written the way ``prometheus_client`` writes them, as floats (``3.0``
where the earlier text had ``3``; ``NaN`` and ``+Inf`` as before), and ``# HELP`` text is
escaped by ``prometheus_client`` (backslash and newline only).

Main declarations:

- :func:`counter`, :func:`gauge`: ``witcert_`` families with checked, low-cardinality labels
- :func:`ledger_families`, :class:`LedgerCollector`, :func:`prometheus_text`
- :class:`MeterExport`: meter readings as ``witcert_meter_reading`` (histogram) and
  ``witcert_meter_max`` (gauge), labelled by metric
- :func:`exposition`: the text format of any collector
- :func:`rate_families`: a shadow audit's anytime-valid rate bound, labelled by the audit
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import final

import numpy as np
import numpy.typing as npt
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric as Family
from prometheus_client.registry import Collector

from witcert_calculus.accounting.rate import RateState
from witcert_calculus.accounting.records import LedgerStats
from witcert_calculus.errors import InvalidValueError
from witcert_calculus.metrics import metric_name

__all__ = [
    "FORBIDDEN_LABELS",
    "LedgerCollector",
    "MeterExport",
    "PREFIX",
    "counter",
    "exposition",
    "gauge",
    "ledger_families",
    "prometheus_text",
    "rate_families",
]

PREFIX = "witcert_"
"""Prefix of every metric family."""

FORBIDDEN_LABELS: frozenset[str] = frozenset({
    "request", "request_id", "rid", "slot", "slot_id", "position", "token", "step"})
"""Label names that would carry per-request values (unbounded cardinality); refused."""

Sample = tuple[Mapping[str, str], float]


def _check(name: str, labels: Sequence[str]) -> list[str]:
    if not isinstance(name, str) or not name.startswith(PREFIX) or name == PREFIX:
        raise InvalidValueError("metric name", name, f"must start with {PREFIX!r}")
    out = list(labels)
    bad = [lab for lab in out if lab in FORBIDDEN_LABELS]
    if bad:
        raise InvalidValueError(f"labels of {name}", tuple(out),
                                f"{bad} would carry per-request values; export those as "
                                "span attributes (witcert_calculus.export.telemetry), not labels")
    return out


def _fill(family: Family, name: str, labels: list[str], samples: Iterable[Sample]) -> None:
    for values, value in samples:
        if sorted(values) != sorted(labels):
            raise InvalidValueError(f"sample labels of {name}", dict(values),
                                    f"must name exactly the labels {labels}")
        add: Callable[..., None] = getattr(family, "add_metric")
        add([values[lab] for lab in labels], float(value))


def counter(name: str, help_: str, samples: Iterable[Sample] = (), *,
            labels: Sequence[str] = ()) -> CounterMetricFamily:
    """A counter family named ``name`` (ending in ``_total``) with the given samples.

    Args:
        name: the exposed name, ``witcert_..._total``.
        help_: the ``# HELP`` text.
        samples: ``(label values by name, value)`` pairs.
        labels: the family's label names (low-cardinality).

    Returns:
        The family, ready to be yielded from a collector.

    Raises:
        InvalidValueError: for a name without the prefix or the ``_total`` suffix, a label
            named after a per-request value, or a sample whose labels differ.

    Example:
        >>> f = counter("witcert_x_total", "Things.", [({"kind": "a"}, 2)], labels=["kind"])
        >>> [(s.name, s.labels, s.value) for s in f.samples]
        [('witcert_x_total', {'kind': 'a'}, 2.0)]
    """
    labs = _check(name, labels)
    if not name.endswith("_total"):
        raise InvalidValueError("counter name", name, "must end with '_total'")
    family = CounterMetricFamily(name, help_, labels=labs)
    _fill(family, name, labs, samples)
    return family


def gauge(name: str, help_: str, samples: Iterable[Sample] = (), *,
          labels: Sequence[str] = ()) -> GaugeMetricFamily:
    """A gauge family named ``name`` with the given samples (arguments as :func:`counter`).

    Raises:
        InvalidValueError: as :func:`counter` (a gauge has no suffix rule).

    Example:
        >>> f = gauge("witcert_y", "Level.", [({}, 0.5)])
        >>> [(s.name, s.value) for s in f.samples]
        [('witcert_y', 0.5)]
    """
    labs = _check(name, labels)
    family = GaugeMetricFamily(name, help_, labels=labs)
    _fill(family, name, labs, samples)
    return family


def ledger_families(stats: LedgerStats) -> list[Family]:
    """The ledger's aggregates as metric families, in exposition order.

    Args:
        stats: the aggregates, e.g. ``ledger.stats()``.

    Returns:
        One family per ledger quantity (see the module docstring for the names).
    """
    s = stats
    c = s.counts
    sentinels = [(n, st) for n, st in s.sentinels]
    return [
        counter("witcert_ledger_requests_total", "Requests ever opened.", [({}, s.requests)]),
        gauge("witcert_ledger_requests_open", "Requests currently open.",
              [({}, s.open_requests)]),
        counter("witcert_ledger_admissions_total", "Admissions by event kind.",
                [({"kind": "deterministic"}, c.deterministic),
                 ({"kind": "probabilistic"}, c.probabilistic),
                 ({"kind": "empirical_fallback"}, c.empirical_fallback),
                 ({"kind": "empirical_degraded"}, c.empirical_degraded)], labels=["kind"]),
        counter("witcert_ledger_saturated_certificates_total",
                "Admitted certificates whose bound reached saturation (vacuous).",
                [({}, c.saturated)]),
        gauge("witcert_ledger_open_requests_by_verdict", "Open requests by verdict tier.",
              [({"tier": t.name.lower()}, n) for t, n in s.open_by_tier], labels=["tier"]),
        gauge("witcert_ledger_worst_spent_fraction",
              "Largest spent/delta_req over open requests (always < 1).",
              [({}, float(s.worst_spent_fraction))]),
        counter("witcert_ledger_entries_total", "Entries offered to entry-level admission.",
                [({"decision": "kept"}, s.entries_kept),
                 ({"decision": "fallback"}, s.entries - s.entries_kept)], labels=["decision"]),
        counter("witcert_ledger_steps_total", "Entry batches admitted, by step bound.",
                [({"bound": "informative"}, s.steps - s.vacuous_steps),
                 ({"bound": "vacuous"}, s.vacuous_steps)], labels=["bound"]),
        counter("witcert_ledger_events_total", "Events applied (journal sequence).",
                [({}, s.events)]),
        gauge("witcert_slots", "Slots by state.",
              [({"state": st.name.lower()}, n) for st, n in s.slots], labels=["state"]),
        counter("witcert_slot_writes_total", "Slot writes (each charged once).",
                [({}, s.slot_writes)]),
        counter("witcert_slot_reads_total", "Slot reads served by this process.",
                [({"kind": "own"}, s.reads_own), ({"kind": "shared"}, s.reads_shared)],
                labels=["kind"]),
        gauge("witcert_eprocess_log_value", "log M_t of each drift sentinel.",
              [({"sentinel": n}, st.log_value) for n, st in sentinels], labels=["sentinel"]),
        gauge("witcert_eprocess_threshold", "ln(1/delta_e) of each drift sentinel.",
              [({"sentinel": n}, -math.log(st.delta)) for n, st in sentinels],
              labels=["sentinel"]),
        gauge("witcert_eprocess_alarm", "1 when the sentinel's alarm has fired.",
              [({"sentinel": n}, int(st.alarm_step is not None)) for n, st in sentinels],
              labels=["sentinel"]),
        counter("witcert_eprocess_observations_total", "Observations per sentinel.",
                [({"sentinel": n}, st.steps) for n, st in sentinels], labels=["sentinel"]),
    ]


def rate_families(name: str, state: RateState, *, threshold: float, alpha: float
                  ) -> list[Family]:
    """A shadow audit's rate bound as metric families, labelled by the audit's ``name``
    (chosen by the operator, e.g. the scheme served: low-cardinality).

    Args:
        name: the audit's label value.
        state: the :class:`~witcert_calculus.accounting.rate.RateBound`'s state.
        threshold: the divergence threshold a request exceeds.
        alpha: the bound's miscoverage level.

    Returns:
        ``witcert_shadow_rate_upper`` (the anytime-valid upper confidence bound),
        ``witcert_shadow_audited_total``, ``witcert_shadow_exceeded_total``,
        ``witcert_shadow_threshold`` and ``witcert_shadow_confidence``.

    Example:
        >>> from witcert_calculus.accounting.rate import RateState
        >>> fams = rate_families("fp8", RateState(10, 1, 0.4), threshold=0.05, alpha=0.05)
        >>> [f.name for f in fams][:2]
        ['witcert_shadow_rate_upper', 'witcert_shadow_audited']
    """
    lab = {"audit": name}
    return [
        gauge("witcert_shadow_rate_upper", "Anytime-valid upper confidence bound on the rate "
              "of audited requests whose divergence exceeds the threshold.",
              [(lab, state.upper)], labels=["audit"]),
        counter("witcert_shadow_audited_total", "Requests replayed exactly by the shadow audit.",
                [(lab, state.trials)], labels=["audit"]),
        counter("witcert_shadow_exceeded_total", "Audited requests above the threshold.",
                [(lab, state.events)], labels=["audit"]),
        gauge("witcert_shadow_threshold", "The divergence threshold (next-token TV).",
              [(lab, threshold)], labels=["audit"]),
        gauge("witcert_shadow_confidence", "The rate bound's confidence 1 - alpha.",
              [(lab, 1.0 - alpha)], labels=["audit"]),
    ]


@final
class LedgerCollector(Collector):
    """A ``prometheus_client`` collector that reads a ledger's aggregates at each scrape.

    Args:
        stats: returns the aggregates now, e.g. ``ledger.stats``.

    Example:
        >>> from prometheus_client import CollectorRegistry, generate_latest
        >>> from witcert_calculus.ledger import RiskLedger
        >>> registry = CollectorRegistry()
        >>> registry.register(LedgerCollector(RiskLedger().stats))
        >>> b"witcert_ledger_requests_open 0.0" in generate_latest(registry)
        True
    """

    def __init__(self, stats: Callable[[], LedgerStats]) -> None:
        if not callable(stats):
            raise InvalidValueError("stats", stats, "must be a callable returning LedgerStats")
        self._stats = stats

    def collect(self) -> Iterator[Family]:
        """The families of :func:`ledger_families` for the aggregates now."""
        yield from ledger_families(self._stats())


def exposition(collector: Collector) -> str:
    """The Prometheus text format (version 0.0.4) of one collector's families.

    Args:
        collector: any ``prometheus_client`` collector.

    Returns:
        The text ``prometheus_client.generate_latest`` writes, decoded.
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry).decode("utf-8")


def prometheus_text(stats: LedgerStats) -> str:
    """Render a ledger's aggregates in the Prometheus text format (version 0.0.4).

    Args:
        stats: the aggregates, e.g. ``ledger.stats()`` (``RiskLedger.prometheus``
            renders its own).

    Returns:
        The exposition text, ending with a newline.

    Example:
        >>> from fractions import Fraction
        >>> from witcert_calculus.accounting.records import EventCounts
        >>> text = prometheus_text(LedgerStats(
        ...     requests=0, open_requests=0, counts=EventCounts(), open_by_tier=(), entries=0,
        ...     entries_kept=0, steps=0, vacuous_steps=0, worst_spent_fraction=Fraction(0),
        ...     slots=(), reads_own=0, reads_shared=0, slot_writes=0, events=0, sentinels=()))
        >>> "witcert_ledger_requests_open 0.0" in text
        True
    """
    return exposition(LedgerCollector(lambda: stats))


_DEFAULT_BUCKETS: tuple[float, ...] = (0.001, 0.01, 0.05, 0.1, 0.2, 0.5, 1.0)


@final
class MeterExport(Collector):
    """Meter readings, accumulated in bulk, exposed per metric (the label is the metric name).

    ``witcert_meter_reading`` is a histogram of every value observed (cumulative buckets,
    count and sum); ``witcert_meter_max`` the largest value observed. Values arrive as
    arrays (a step's cells at once) and are binned with one ``numpy`` call, never one
    Python call per value. A NaN reading is refused; ``+inf`` (no bound) lands in the
    ``+Inf`` bucket and makes the sum and the maximum ``+Inf``, never a finite number.

    Args:
        buckets: the finite upper bucket bounds, strictly increasing and ``>= 0``.

    Raises:
        InvalidValueError: for bad buckets.

    Example:
        >>> import numpy as np
        >>> from witcert_calculus.metrics import AttentionTV, AtConsume
        >>> meters = MeterExport(buckets=(0.1, 0.5))
        >>> meters.observe(AttentionTV[AtConsume], np.array([0.05, 0.3, 0.7]))
        >>> print(exposition(meters).splitlines()[2])
        witcert_meter_reading_bucket{le="0.1",metric="AttentionTV[AtConsume]"} 1.0
    """

    def __init__(self, *, buckets: Sequence[float] = _DEFAULT_BUCKETS) -> None:
        b = tuple(float(x) for x in buckets)
        if not b or any(not math.isfinite(x) or x < 0 for x in b) or \
                any(y <= x for x, y in zip(b, b[1:], strict=False)):
            raise InvalidValueError("buckets", tuple(buckets),
                                    "must be finite, >= 0 and strictly increasing")
        self._edges = np.array(b, dtype=np.float64)
        self._lock = threading.Lock()
        self._counts: dict[str, npt.NDArray[np.int64]] = {}
        self._sums: dict[str, float] = {}
        self._max: dict[str, float] = {}

    def observe(self, metric: object, values: npt.ArrayLike) -> None:
        """Add a batch of readings of ``metric`` (a site-indexed metric class).

        Raises:
            InvalidValueError: for a NaN or negative reading (naming its index).
            NotAMetricError: if ``metric`` is not a site-indexed metric.
        """
        name = metric_name(metric)
        v = np.asarray(values, dtype=np.float64).ravel()
        bad = np.flatnonzero(np.isnan(v) | (v < 0))
        if bad.size:
            i = int(bad[0])
            raise InvalidValueError(f"values[{i}]", float(v[i]),
                                    "a meter reading must be >= 0 (inf for no bound), not NaN")
        # Bucket k holds values <= edges[k]; the last (k = len(edges)) is +Inf.
        idx = np.searchsorted(self._edges, v, side="left")
        per = np.bincount(idx, minlength=self._edges.size + 1).astype(np.int64)
        with self._lock:
            if name not in self._counts:
                self._counts[name] = np.zeros(self._edges.size + 1, dtype=np.int64)
                self._sums[name] = 0.0
                self._max[name] = 0.0
            self._counts[name] += per
            if v.size:
                self._sums[name] += float(v.sum())
                self._max[name] = max(self._max[name], float(v.max()))

    def collect(self) -> Iterator[Family]:
        """``witcert_meter_reading`` and ``witcert_meter_max``, one sample set per metric."""
        _check("witcert_meter_reading", ["metric"])
        hist = HistogramMetricFamily("witcert_meter_reading",
                                     "Meter readings (bounds) observed, by metric.",
                                     labels=["metric"])
        with self._lock:
            rows = sorted((n, c.copy(), self._sums[n], self._max[n])
                          for n, c in self._counts.items())
        for name, counts, total, _ in rows:
            cum = np.cumsum(counts)
            buckets: list[tuple[str, float]] = [
                (_le(e), float(k)) for e, k in zip(self._edges.tolist(), cum[:-1].tolist(),
                                                    strict=True)]
            buckets.append(("+Inf", float(cum[-1])))
            hist.add_metric([name], buckets, total)
        yield hist
        yield gauge("witcert_meter_max", "Largest meter reading observed, by metric.",
                    [({"metric": n}, m) for n, _, _, m in rows], labels=["metric"])


def _le(edge: float) -> str:
    return repr(edge)
