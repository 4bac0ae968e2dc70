"""witcert_calculus.export.prometheus: the ledger's and the meters' families through prometheus_client."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from witcert_calculus.accounting.rate import RateBound
from witcert_calculus.contracts import Reading
from witcert_calculus.errors import InvalidValueError, NotAMetricError
from witcert_calculus.ledger import RiskLedger
from witcert_calculus.metrics import AtConsume, AttentionTV, LogitLinf
from witcert_calculus.export.prometheus import (
    FORBIDDEN_LABELS,
    LedgerCollector,
    MeterExport,
    counter,
    exposition,
    gauge,
    prometheus_text,
    rate_families,
)
from witcert_calculus.tiers import Proof
from reference.issued import proof, reading

TV = AttentionTV[AtConsume]
PROOF = proof("WitCert.Meters.tv_eform_sound")


def _ledger() -> RiskLedger:
    led = RiskLedger(n_slots=4)
    for _ in range(2):
        r = led.open_request(delta_req="1/100")
        led.admit(r, reading(TV, 0.01, evidence=PROOF, delta=led.next_allowance(r)))
        led.admit_entries(r, [0.01, 0.5], threshold=0.1, metric=TV, evidence=PROOF,
                          slots=[2 * r - 2, 2 * r - 1])
    led.close_request(1)
    led.add_sentinel("layer0.tv", delta=0.01)
    led.observe("layer0.tv", [0.1, 0.2], m=0.1, c=1.0)
    return led


def test_ledger_text_lines() -> None:
    led = _ledger()
    text = led.prometheus()
    assert text == prometheus_text(led.stats())
    lines = text.splitlines()
    # The families, in order, with their help and type lines as before; values as floats.
    for want in [
        "# HELP witcert_ledger_requests_total Requests ever opened.",
        "# TYPE witcert_ledger_requests_total counter",
        "witcert_ledger_requests_total 2.0",
        "witcert_ledger_requests_open 1.0",
        'witcert_ledger_admissions_total{kind="deterministic"} 2.0',
        'witcert_ledger_admissions_total{kind="probabilistic"} 2.0',
        'witcert_ledger_open_requests_by_verdict{tier="certified"} 1.0',
        "witcert_ledger_worst_spent_fraction 0.5",
        'witcert_ledger_entries_total{decision="kept"} 2.0',
        'witcert_ledger_entries_total{decision="fallback"} 2.0',
        'witcert_slots{state="unwritten"} 2.0',
        'witcert_slots{state="masked"} 1.0',
        'witcert_slots{state="kept_exact"} 1.0',
        'witcert_eprocess_threshold{sentinel="layer0.tv"} ' + repr(-math.log(0.01)),
        'witcert_eprocess_observations_total{sentinel="layer0.tv"} 2.0',
    ]:
        assert want in lines, want
    heads = [ln.split()[2] for ln in lines if ln.startswith("# TYPE")]
    assert heads == ["witcert_ledger_requests_total", "witcert_ledger_requests_open",
                     "witcert_ledger_admissions_total",
                     "witcert_ledger_saturated_certificates_total",
                     "witcert_ledger_open_requests_by_verdict",
                     "witcert_ledger_worst_spent_fraction", "witcert_ledger_entries_total",
                     "witcert_ledger_steps_total", "witcert_ledger_events_total",
                     "witcert_slots", "witcert_slot_writes_total", "witcert_slot_reads_total",
                     "witcert_eprocess_log_value", "witcert_eprocess_threshold",
                     "witcert_eprocess_alarm", "witcert_eprocess_observations_total"]
    assert "_created" not in text  # no per-process creation timestamps


def test_text_parses_back_to_the_stats() -> None:
    led = _ledger()
    s = led.stats()
    parsed = {(x.name, tuple(sorted(x.labels.items()))): x.value
              for fam in text_string_to_metric_families(led.prometheus()) for x in fam.samples}
    assert parsed[("witcert_ledger_requests_total", ())] == s.requests
    assert parsed[("witcert_ledger_events_total", ())] == s.events
    assert parsed[("witcert_slot_writes_total", ())] == s.slot_writes
    assert parsed[("witcert_ledger_admissions_total", (("kind", "probabilistic"),))] == \
        s.counts.probabilistic
    assert parsed[("witcert_ledger_worst_spent_fraction", ())] == float(s.worst_spent_fraction)
    for (_, labels), _ in parsed.items():
        assert not {k for k, _ in labels} & FORBIDDEN_LABELS


def test_collector_scrapes_the_state_now() -> None:
    led = RiskLedger()
    registry = CollectorRegistry()
    registry.register(LedgerCollector(led.stats))
    assert b"witcert_ledger_requests_total 0.0\n" in generate_latest(registry)
    led.open_request(delta_req="1/10")
    assert b"witcert_ledger_requests_total 1.0\n" in generate_latest(registry)
    with pytest.raises(InvalidValueError, match="stats"):
        LedgerCollector(led.stats())  # type: ignore[arg-type]


def test_families_refuse_bad_names_and_per_request_labels() -> None:
    with pytest.raises(InvalidValueError, match="must start with 'witcert_'"):
        gauge("ledger_open", "x")
    with pytest.raises(InvalidValueError, match="must end with '_total'"):
        counter("witcert_things", "x")
    for lab in ("request_id", "slot"):
        with pytest.raises(InvalidValueError, match="per-request values"):
            gauge("witcert_level", "x", labels=["tier", lab])
    with pytest.raises(InvalidValueError, match="must name exactly the labels"):
        gauge("witcert_level", "x", [({"kind": "a"}, 1.0)], labels=["tier"])


def _expected_buckets(v: np.ndarray, edges: tuple[float, ...]) -> list[float]:
    return [float(sum(1 for x in v.tolist() if x <= e)) for e in edges] + [float(v.size)]


@given(st.lists(st.one_of(st.floats(0.0, 2.0), st.sampled_from([0.1, 0.5, 1.0, math.inf])),
                min_size=0, max_size=40),
       st.integers(1, 3))
def test_meter_histogram_counts_every_reading(values: list[float], parts: int) -> None:
    edges = (0.1, 0.5, 1.0)
    meters = MeterExport(buckets=edges)
    v = np.array(values, dtype=np.float64)
    for chunk in np.array_split(v, parts):
        meters.observe(TV, chunk)
    fams = {f.name: f for f in meters.collect()}
    if v.size == 0:
        assert [s.value for s in fams["witcert_meter_reading"].samples][-2:] == [0.0, 0.0]
        return
    samples = fams["witcert_meter_reading"].samples
    buckets = [s.value for s in samples if s.name.endswith("_bucket")]
    assert buckets == _expected_buckets(v, edges)
    total = next(s.value for s in samples if s.name.endswith("_sum"))
    if np.isinf(v).any():
        assert total == math.inf
    else:
        assert total == pytest.approx(float(v.sum()))
    (mx,) = fams["witcert_meter_max"].samples
    assert mx.value == float(v.max()) and mx.labels == {"metric": "AttentionTV[AtConsume]"}


def test_meter_export_refuses_bad_input() -> None:
    meters = MeterExport()
    with pytest.raises(InvalidValueError, match=r"values\[2\]=nan"):
        meters.observe(TV, [0.1, 0.2, math.nan])
    with pytest.raises(InvalidValueError, match=r"values\[0\]=-0.5"):
        meters.observe(TV, [-0.5])
    with pytest.raises(NotAMetricError):
        meters.observe("AttentionTV", [0.1])
    with pytest.raises(InvalidValueError, match="strictly increasing"):
        MeterExport(buckets=(0.5, 0.1))
    with pytest.raises(InvalidValueError, match="buckets"):
        MeterExport(buckets=(0.1, math.inf))
    meters.observe(LogitLinf[AtConsume], [3.0])
    meters.observe(TV, [0.05])
    text = exposition(meters)
    assert 'witcert_meter_max{metric="AttentionTV[AtConsume]"} 0.05' in text
    assert 'witcert_meter_max{metric="LogitLinf[AtConsume]"} 3.0' in text


def test_import_stays_free_of_exporters() -> None:
    code = ("import sys, witcert_calculus; from witcert_calculus.ledger import RiskLedger; "
            "led = RiskLedger(); "
            "print([m for m in ('prometheus_client', 'opentelemetry') if m in sys.modules]); "
            "led.prometheus(); print('prometheus_client' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split("\n")
    assert out[0] == "[]" and out[1] == "True"


def test_the_shadow_audits_rate_bound_is_exported() -> None:
    bound = RateBound(alpha=0.05)
    for i in range(120):
        bound.observe(i % 40 == 0)

    class Audit:
        def collect(self):  # type: ignore[no-untyped-def]
            yield from rate_families("fp8_e4m3_scaled", bound.state, threshold=0.05, alpha=0.05)

    text = exposition(Audit())  # type: ignore[arg-type]
    parsed = {(s.name, s.labels["audit"]): s.value
              for f in text_string_to_metric_families(text) for s in f.samples}
    assert parsed[("witcert_shadow_rate_upper", "fp8_e4m3_scaled")] == bound.upper
    assert parsed[("witcert_shadow_audited_total", "fp8_e4m3_scaled")] == 120
    assert parsed[("witcert_shadow_exceeded_total", "fp8_e4m3_scaled")] == 3
    assert parsed[("witcert_shadow_confidence", "fp8_e4m3_scaled")] == pytest.approx(0.95)
