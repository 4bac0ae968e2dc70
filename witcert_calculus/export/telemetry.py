"""OpenTelemetry spans for request-level verdicts (the ``otel`` extra).

Per-request values never become metric labels (:mod:`witcert_calculus.export.prometheus` keeps
those low-cardinality); they travel here instead, as attributes of one span per request
verdict: the request id, the verdict tier, the exact budget and spend (as text, and as
floats rounded in the safe direction: the budget down, the spend up), the counts per event
kind and the entry statistics. A caller's extra attributes (e.g. a fleet's rank count) are
added next to them under the ``witcert.`` prefix.

``import witcert_calculus`` does not load this module nor ``opentelemetry``; importing this
module needs ``opentelemetry-api`` (spans are recorded when an SDK tracer provider is
installed or passed).

Main declarations:

- :func:`verdict_attributes`: the span attributes of a
  :class:`~witcert_calculus.accounting.records.Verdict`
- :class:`VerdictSpans`: emits one span per verdict through a tracer
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import TypeAlias, final

from opentelemetry import trace
from opentelemetry.trace import Span, StatusCode, Tracer, TracerProvider

from witcert_calculus.accounting.records import Verdict
from witcert_calculus.errors import InvalidValueError
from witcert_calculus.numerics.validation import float_down, float_up
from witcert_calculus.tiers import Tier

__all__ = [
    "ATTRIBUTE_PREFIX",
    "SPAN_NAME",
    "Attribute",
    "VerdictSpans",
    "verdict_attributes",
]

ATTRIBUTE_PREFIX = "witcert."
"""Prefix of every attribute this module writes."""

SPAN_NAME = "witcert.request.verdict"
"""Name of the span of one request's verdict."""

Attribute: TypeAlias = str | bool | int | float
"""A span attribute value this module writes (a scalar of OpenTelemetry's ``AttributeValue``)."""


def verdict_attributes(verdict: Verdict) -> dict[str, Attribute]:
    """The span attributes of one verdict (all keys start with ``witcert.``).

    Exact quantities appear twice: as exact text (``witcert.spent = "3/400"``) and as a
    float rounded toward the safe side (``witcert.spent_upper``, ``witcert.delta_req_lower``).
    Below ``CERTIFIED``, ``witcert.reason`` says why.

    Args:
        verdict: the request's verdict.

    Returns:
        The attributes, by key.

    Raises:
        InvalidValueError: if ``verdict`` is not a
            :class:`~witcert_calculus.accounting.records.Verdict`.

    Example:
        >>> from witcert_calculus.ledger import RiskLedger
        >>> led = RiskLedger()
        >>> a = verdict_attributes(led.verdict(led.open_request(delta_req="1/100")))
        >>> a["witcert.tier"], a["witcert.delta_req"], a["witcert.spent"]
        ('EMPIRICAL', '1/100', '0')
        >>> a["witcert.reason"]  # no evidence, no certificate
        'no evidence: no reading was admitted, so nothing certifies the request'
    """
    if not isinstance(verdict, Verdict):
        raise InvalidValueError("verdict", verdict, "must be a witcert_calculus Verdict")
    v = verdict
    c = v.counts
    out: dict[str, Attribute] = {
        "witcert.request_id": v.request_id,
        "witcert.tier": v.tier.name,
        "witcert.delta_req": str(v.delta_req),
        "witcert.delta_req_lower": float_down(v.delta_req),
        "witcert.spent": str(v.spent),
        "witcert.spent_upper": float_up(v.spent),
        "witcert.admissions.deterministic": c.deterministic,
        "witcert.admissions.probabilistic": c.probabilistic,
        "witcert.admissions.empirical_fallback": c.empirical_fallback,
        "witcert.admissions.empirical_degraded": c.empirical_degraded,
        "witcert.saturated_certificates": c.saturated,
        "witcert.entries": v.entries,
        "witcert.entries_kept": v.entries_kept,
        "witcert.steps": v.steps,
        "witcert.vacuous_steps": v.vacuous_steps,
        "witcert.worst_step_bound": v.worst_step_bound,
        "witcert.closed": v.closed,
    }
    if v.retained_fraction is not None:
        out["witcert.retained_fraction"] = str(v.retained_fraction)
    if v.reason is not None:
        out["witcert.reason"] = v.reason
    return out


def _extra(attributes: Mapping[str, Attribute]) -> dict[str, Attribute]:
    out: dict[str, Attribute] = {}
    for key, value in attributes.items():
        if not isinstance(key, str) or not key.startswith(ATTRIBUTE_PREFIX):
            raise InvalidValueError("attribute key", key,
                                    f"must be a str starting with {ATTRIBUTE_PREFIX!r}")
        if isinstance(value, Fraction):
            raise InvalidValueError(key, value, "pass an exact value as its text (str(value))")
        out[key] = value
    return out


@final
class VerdictSpans:
    """Emits one OpenTelemetry span per request verdict.

    The span is named :data:`SPAN_NAME` and carries :func:`verdict_attributes`; a verdict
    of tier ``EMPIRICAL`` (nothing certifies the request) sets the span status to
    ``ERROR`` with a description, so a trace backend shows uncertified requests.

    Args:
        tracer_provider: the provider to draw the tracer from (``None``: the global one).

    Example:
        >>> from opentelemetry.sdk.trace import TracerProvider
        >>> from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        >>> from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
        ...     InMemorySpanExporter)
        >>> from witcert_calculus.ledger import RiskLedger
        >>> exporter = InMemorySpanExporter()
        >>> provider = TracerProvider()
        >>> provider.add_span_processor(SimpleSpanProcessor(exporter))
        >>> led = RiskLedger()
        >>> r = led.open_request(delta_req="1/100")
        >>> _ = VerdictSpans(provider).emit(led.close_request(r))
        >>> [(s.name, s.attributes["witcert.tier"]) for s in exporter.get_finished_spans()]
        [('witcert.request.verdict', 'EMPIRICAL')]
    """

    __slots__ = ("_tracer",)

    def __init__(self, tracer_provider: TracerProvider | None = None) -> None:
        self._tracer: Tracer = trace.get_tracer("witcert_calculus",
                                                tracer_provider=tracer_provider)

    def emit(self, verdict: Verdict, *, attributes: Mapping[str, Attribute] | None = None,
             start_time_ns: int | None = None) -> Span:
        """Record one finished span for ``verdict``; return it.

        Args:
            verdict: the request's verdict.
            attributes: extra ``witcert.``-prefixed attributes.
            start_time_ns: the span's start (e.g. when the request opened); ``None``: now.

        Raises:
            InvalidValueError: for a non-verdict or an extra key without the prefix.
        """
        attrs = verdict_attributes(verdict)
        attrs.update(_extra(attributes or {}))
        span = self._tracer.start_span(SPAN_NAME, attributes=attrs, start_time=start_time_ns)
        if verdict.tier is Tier.EMPIRICAL:
            span.set_status(StatusCode.ERROR, "request verdict is EMPIRICAL: not certified")
        span.end()
        return span
