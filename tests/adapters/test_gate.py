"""witcert_adapters.gate: no evidence, no certificate, for every gate and the ledger alike."""

from __future__ import annotations

from witcert_adapters.gate import NO_EVIDENCE, declared_problems, run_gate
from witcert_adapters.live_run import LiveRun
from witcert_adapters.runs import MemoryKind, ProbePath
from witcert_calculus.ledger import RiskLedger
from witcert_calculus.tiers import Tier


def test_a_run_that_declared_nothing_is_not_accepted() -> None:
    """Before, a run with no site declared and no record passed all three stages."""
    run = LiveRun(scheme="x", memory_class=MemoryKind.DENSE, declared=frozenset(), records={})
    verdict = run_gate(run, tokens=3)
    assert not verdict.accepted and verdict.failed_stage == "coverage"
    assert NO_EVIDENCE in verdict.stages[0].detail
    assert [s.passed for s in verdict.stages] == [False, None, None]


def test_no_site_declared_is_a_coverage_problem_in_both_forms() -> None:
    assert declared_problems(frozenset(), frozenset()) == [NO_EVIDENCE]
    assert declared_problems(frozenset(), frozenset(), joined=True) == [NO_EVIDENCE]
    [only] = declared_problems(frozenset(), frozenset({(0, ProbePath.READ)}))
    assert only.startswith(NO_EVIDENCE) and "observed but never declared" in only
    assert declared_problems(frozenset({(0, ProbePath.READ)}),
                             frozenset({(0, ProbePath.READ)})) == []


def test_the_gate_and_the_ledger_agree_on_a_request_without_readings() -> None:
    led = RiskLedger()
    v = led.close_request(led.open_request(delta_req="1/100"))
    run = LiveRun(scheme="x", memory_class=MemoryKind.DENSE, declared=frozenset(), records={})
    assert v.tier is not Tier.CERTIFIED and not run_gate(run, tokens=1).accepted
