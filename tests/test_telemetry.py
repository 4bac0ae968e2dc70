"""witcert_calculus.export.telemetry: one OpenTelemetry span per request verdict (SDK in-memory export)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Iterator
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from witcert_calculus.accounting.budget import telescoping_spent
from witcert_calculus.accounting.records import EmpiricalPolicy, EventCounts
from witcert_calculus.contracts import Reading, Regime
from witcert_calculus.errors import InvalidValueError
from witcert_calculus.export.telemetry import SPAN_NAME, VerdictSpans, verdict_attributes
from witcert_calculus.ledger import RiskLedger
from witcert_calculus.metrics import AtConsume, AttentionTV
from witcert_calculus.tiers import Measurement, Proof, Tier
from reference.issued import proof, reading

TV = AttentionTV[AtConsume]
PROOF = proof("WitCert.Meters.tv_eform_sound")


@pytest.fixture
def spans() -> Iterator[tuple[VerdictSpans, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield VerdictSpans(provider), exporter
    provider.shutdown()


def test_one_span_per_verdict_with_per_request_values(
        spans: tuple[VerdictSpans, InMemorySpanExporter]) -> None:
    tracer, exporter = spans
    led = RiskLedger()
    ids = []
    for n in range(3):
        r = led.open_request(delta_req="1/100")
        for _ in range(n):
            led.admit_next(r, lambda a: reading(TV, 0.01, evidence=PROOF, delta=a))
        led.admit_entries(r, [0.01, 0.3], threshold=0.1, metric=TV, evidence=PROOF)
        ids.append(r)
    verdicts = [led.close_request(r) for r in ids]
    for v in verdicts:
        tracer.emit(v, attributes={"witcert.fleet.ranks": 4}, start_time_ns=1)
    finished = exporter.get_finished_spans()
    assert [s.name for s in finished] == [SPAN_NAME] * 3
    for n, (s, v) in enumerate(zip(finished, verdicts, strict=True)):
        a = s.attributes
        assert a is not None
        assert a["witcert.request_id"] == v.request_id
        assert a["witcert.spent"] == str(telescoping_spent(n, "1/100"))
        assert a["witcert.admissions.probabilistic"] == n
        assert a["witcert.entries"] == 2 and a["witcert.entries_kept"] == 1
        assert a["witcert.retained_fraction"] == "1/2"
        assert a["witcert.closed"] is True and a["witcert.fleet.ranks"] == 4
        assert s.start_time == 1
        assert s.status.status_code is StatusCode.UNSET


def test_empirical_verdict_is_an_error_span(
        spans: tuple[VerdictSpans, InMemorySpanExporter]) -> None:
    tracer, exporter = spans
    led = RiskLedger()
    r = led.open_request(delta_req="1/100")
    led.admit(r, reading(TV, 0.2, evidence=Measurement("observed", samples=3),
                         regime=Regime.MEASURED), on_empirical=EmpiricalPolicy.DEGRADE)
    tracer.emit(led.verdict(r))
    (s,) = exporter.get_finished_spans()
    assert s.status.status_code is StatusCode.ERROR
    assert s.attributes is not None and s.attributes["witcert.tier"] == "EMPIRICAL"


@given(st.integers(1, 10**6), st.integers(2, 10**6), st.integers(0, 50))
def test_float_attributes_round_to_the_safe_side(num: int, den: int, n: int) -> None:
    if num >= den:
        num, den = den - 1, den
    led = RiskLedger()
    r = led.open_request(delta_req=Fraction(num, den))
    for _ in range(n):
        led.admit_next(r, lambda a: reading(TV, 0.01, evidence=PROOF, delta=a))
    v = led.verdict(r)
    a = verdict_attributes(v)
    assert Fraction(a["witcert.spent"]) == v.spent  # type: ignore[arg-type]
    assert Fraction(a["witcert.spent_upper"]) >= v.spent  # type: ignore[arg-type]
    assert Fraction(a["witcert.delta_req_lower"]) <= v.delta_req  # type: ignore[arg-type]


def test_bad_input(spans: tuple[VerdictSpans, InMemorySpanExporter]) -> None:
    tracer, _ = spans
    led = RiskLedger()
    v = led.verdict(led.open_request(delta_req="1/10"))
    with pytest.raises(InvalidValueError, match="Verdict"):
        verdict_attributes("CERTIFIED")  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match="attribute key='ranks'"):
        tracer.emit(v, attributes={"ranks": 4})
    with pytest.raises(InvalidValueError, match="exact value as its text"):
        tracer.emit(v, attributes={"witcert.x": Fraction(1, 3)})  # type: ignore[dict-item]


def test_fleet_verdict_span(spans: tuple[VerdictSpans, InMemorySpanExporter]) -> None:
    from witcert_adapters.fleet import FleetVerdict

    tracer, exporter = spans
    led = RiskLedger()
    r = led.open_request(delta_req="1/100")
    led.admit(r, reading(TV, 1.0, evidence=Measurement("rank 1 lost", samples=1),
                         regime=Regime.MEASURED), on_empirical=EmpiricalPolicy.DEGRADE)
    v = led.close_request(r)
    with pytest.raises(InvalidValueError, match="fails closed"):
        FleetVerdict(verdict=dataclasses.replace(v, tier=Tier.CERTIFIED, reason=None,
                                                 counts=EventCounts(deterministic=1)),
                     meter_max=0.25,
                     ranks=4, complete=False, failure="x")
    with pytest.raises(InvalidValueError, match="exactly when the verdict is incomplete"):
        FleetVerdict(verdict=v, meter_max=0.25, ranks=4, complete=True, failure="x")
    failed = FleetVerdict(verdict=v, meter_max=0.25, ranks=4, complete=False,
                          failure="step reduction failed on rank 1")
    tracer.emit(failed.verdict, attributes=failed.span_attributes())
    (s,) = exporter.get_finished_spans()
    assert s.attributes is not None
    assert (s.attributes["witcert.fleet.ranks"], s.attributes["witcert.fleet.complete"],
            s.attributes["witcert.fleet.meter_max"], s.attributes["witcert.fleet.failure"]) == \
        (4, False, 0.25, "step reduction failed on rank 1")


def test_import_stays_free_of_opentelemetry() -> None:
    code = ("import sys, witcert_calculus, witcert_calculus.ledger, witcert_calculus.accounting.records; "
            "print('opentelemetry' in sys.modules); import witcert_calculus.export.telemetry; "
            "print('opentelemetry' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["False", "True"]
