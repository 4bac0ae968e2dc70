"""Tests of the risk ledger: telescoping budget, admission rules, verdicts, entries, export."""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Any

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from witcert_calculus.contracts import Reading, Regime
from witcert_calculus.errors import (
    AllowanceMovedError,
    BudgetExceededError,
    InvalidValueError,
    ReusedRequestIdError,
    UnknownRequestError,
)
from witcert_calculus.accounting.budget import SPEND_THEOREMS, telescoping_delta, telescoping_spent
from witcert_calculus.accounting.entries import (
    ENTRY_THEOREM,
    Aggregate,
    certify_entries,
    certify_step,
    sum_upper,
    tradeoff_curve,
)
from witcert_calculus.accounting.records import (
    Decision,
    EmpiricalPolicy,
    EventCounts,
    EventKind,
    Verdict,
)
from witcert_calculus.ledger import RiskLedger
from witcert_calculus.metrics import AtConsume, AttentionTV, LogitLinf
from witcert_calculus.tiers import Measurement, Proof, Restricted, Tier
from reference.issued import proof, reading

TV = AttentionTV[AtConsume]
PROOF = proof("WitCert.Meters.tv_eform_sound")


def cert(value: float = 0.01, delta: Fraction | int = 0, evidence: Any = PROOF) -> Reading[Any]:
    return reading(TV, value, evidence=evidence, delta=delta)


def empirical(value: float = 0.01) -> Reading[Any]:
    return reading(TV, value, evidence=Measurement("observed TV", samples=8),
                   regime=Regime.MEASURED)


# ----------------------------------------------------------------- telescoping


def test_theorem_names() -> None:
    assert SPEND_THEOREMS == ("WitCert.Semantic.recurrence_prob_bad_lt_budget",
                              "WitCert.Ledger.telescope_sum_eq",
                              "WitCert.Ledger.telescope_partial_lt",
                              "WitCert.Ledger.two_layer_budget")
    assert ENTRY_THEOREM == "WitCert.Semantic.entry_fallback_contract_sound"
    # each aggregate cites the theorem of its own rule: a sum of kept bounds, or their maximum
    assert certify_entries([0.01, 0.5], threshold=0.1).theorem == ENTRY_THEOREM
    assert certify_entries([0.01, 0.5], threshold=0.1, aggregate=Aggregate.MAX).theorem == \
        "WitCert.Ledger.entry_fallback_max_sound"


def test_telescoping_first_values() -> None:
    d = Fraction(1, 100)
    assert [telescoping_delta(i, d) for i in range(4)] == [
        Fraction(1, 200), Fraction(1, 600), Fraction(1, 1200), Fraction(1, 2000)]
    assert isinstance(telescoping_delta(0, d), Fraction)


@given(n=st.integers(0, 400), p=st.integers(1, 10**6), q=st.integers(1, 10**6))
@settings(max_examples=60, deadline=None)
def test_telescope_sum_eq_and_partial_lt(n: int, p: int, q: int) -> None:
    """WitCert.Ledger.telescope_sum_eq / telescope_partial_lt, exactly, for any budget."""
    d = Fraction(min(p, q), max(p, q) + 1)
    total = sum((telescoping_delta(i, d) for i in range(n)), Fraction(0))
    assert total == d * (1 - Fraction(1, n + 1)) == telescoping_spent(n, d)
    assert total < d


def test_telescope_mpmath_reference_long_run() -> None:
    # 50-digit check of the closed form at a length far beyond any request.
    mpmath.mp.dps = 50
    d = mpmath.mpf(1) / 1000
    n = 10**6
    closed = d * (1 - mpmath.mpf(1) / (n + 1))
    assert abs(mpmath.mpf(telescoping_spent(n, "1/1000").numerator)
               / telescoping_spent(n, "1/1000").denominator - closed) < mpmath.mpf(10) ** -45
    assert telescoping_spent(n, "1/1000") < Fraction(1, 1000)


@pytest.mark.parametrize("bad", [0, 1, -0.1, 1.5, math.nan, math.inf, "x", True, None])
def test_bad_delta_req(bad: object) -> None:
    with pytest.raises(InvalidValueError, match="delta_req"):
        telescoping_delta(0, bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match="delta_req"):
        RiskLedger().open_request(delta_req=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [-1, 1.0, True, "0"])
def test_bad_index(bad: object) -> None:
    with pytest.raises(InvalidValueError, match="i="):
        telescoping_delta(bad, "1/2")  # type: ignore[arg-type]


# ----------------------------------------------------------------- accounts and rules


def test_request_ids_monotone_never_reused() -> None:
    led = RiskLedger()
    a = led.open_request(delta_req="1/10")
    b = led.open_request(delta_req="1/10")
    assert (a, b) == (1, 2)
    assert led.open_request(delta_req="1/10", request_id=10) == 10
    with pytest.raises(ReusedRequestIdError, match="request id 10 reuses"):
        led.open_request(delta_req="1/10", request_id=10)
    with pytest.raises(ReusedRequestIdError, match="request id 5"):
        led.open_request(delta_req="1/10", request_id=5)
    led.close_request(a)
    with pytest.raises(ReusedRequestIdError):
        led.open_request(delta_req="1/10", request_id=1)
    assert led.open_request(delta_req="1/10") == 11


def test_unknown_and_closed_requests_raise() -> None:
    led = RiskLedger()
    with pytest.raises(UnknownRequestError, match="unknown request id 7"):
        led.admit(7, cert())
    r = led.open_request(delta_req="1/10")
    led.close_request(r)
    with pytest.raises(UnknownRequestError):
        led.admit(r, cert())
    with pytest.raises(UnknownRequestError):
        led.close_request(r)
    assert led.verdict(r).closed
    with pytest.raises(UnknownRequestError):
        led.verdict(99)
    with pytest.raises(InvalidValueError, match="request_id"):
        led.admit("1", cert())  # type: ignore[arg-type]


def test_deterministic_costs_zero() -> None:
    """WitCert.Ledger.two_layer_budget: deterministic events do not spend."""
    led = RiskLedger()
    r = led.open_request(delta_req="1/100")
    for _ in range(50):
        adm = led.admit(r, cert())
        assert adm.kind is EventKind.DETERMINISTIC and adm.charged == 0
    v = led.verdict(r)
    assert v.spent == 0 and v.counts.deterministic == 50 and v.tier is Tier.CERTIFIED


def test_probabilistic_draws_telescoping_allowance_and_mixed_order() -> None:
    led = RiskLedger()
    d = Fraction(1, 64)
    r = led.open_request(delta_req=d)
    rng = np.random.default_rng(0)
    n_prob = 0
    for _ in range(300):
        if rng.random() < 0.5:
            led.admit(r, cert())
        else:
            allowance = led.next_allowance(r)
            assert allowance == telescoping_delta(n_prob, d)
            # a certificate may use less than its allowance; the schedule is charged in full
            used = allowance / int(rng.integers(1, 4))
            adm = led.admit(r, cert(delta=used))
            assert adm.kind is EventKind.PROBABILISTIC and adm.prob_index == n_prob
            assert adm.charged == allowance
            n_prob += 1
        v = led.verdict(r)
        assert isinstance(v.spent, Fraction)
        assert v.spent == d * (1 - Fraction(1, n_prob + 1)) < d
    assert led.verdict(r).counts.probabilistic == n_prob


def test_probabilistic_over_allowance_refused() -> None:
    led = RiskLedger()
    r = led.open_request(delta_req="1/100")
    led.admit(r, cert(delta=Fraction(1, 200)))
    with pytest.raises(BudgetExceededError,
                       match=r"request 1: spending 1/500 .*allowance is 1/600") as info:
        led.admit(r, cert(delta=Fraction(1, 500)))
    # 1/500 is no allowance this request ever had: a certificate too loose, not a race
    assert type(info.value) is BudgetExceededError
    assert "would exceed its budget" not in str(info.value)  # 1/200 + 1/500 < 1/100
    assert info.value.allowance == "1/600"
    v = led.verdict(r)
    assert v.spent == Fraction(1, 200) and v.counts.probabilistic == 1


def test_stale_allowance_says_the_allowance_moved() -> None:
    """``a = next_allowance(r)``, another admission, then ``admit(r, ...delta=a)``: the error
    names the allowance read, the allowance now due and the fix; nothing is charged."""
    led = RiskLedger()
    r = led.open_request(delta_req="1/100")
    a = led.next_allowance(r)
    led.admit(r, cert(delta=a))  # another thread got there first ...
    led.admit(r, cert(delta=led.next_allowance(r)))  # ... twice
    seq = led.applied_seq
    with pytest.raises(AllowanceMovedError,
                       match=r"request 1: the allowance moved: the certificate was built for "
                             r"1/200, the allowance of probabilistic event 0, but 2 "
                             r"probabilistic admissions were made since; the allowance now due "
                             r"is 1/1200 \(event 2\); nothing was charged; .*admit_next") as info:
        led.admit(r, cert(delta=a))
    err = info.value
    assert isinstance(err, BudgetExceededError) and isinstance(err, RuntimeError)
    assert (err.request_id, err.read, err.read_index, err.due, err.due_index) == (
        r, Fraction(1, 200), 0, Fraction(1, 1200), 2)
    assert "exceed its budget" not in str(err)
    assert led.applied_seq == seq and led.verdict(r).counts.probabilistic == 2
    # the entry path reports it the same way
    with pytest.raises(AllowanceMovedError, match="allowance now due is 1/1200"):
        led.admit_entries(r, [0.01], threshold=0.05, metric=TV, evidence=PROOF,
                          delta=Fraction(1, 600))
    assert led.applied_seq == seq


def test_admit_next_reads_the_allowance_and_admits_in_one_step() -> None:
    led = RiskLedger()
    d = Fraction(1, 100)
    r = led.open_request(delta_req=d)
    seen: list[Fraction] = []

    def at(a: Fraction) -> Reading[Any]:
        seen.append(a)
        return cert(delta=a)

    for i in range(5):
        adm = led.admit_next(r, at)
        assert adm.kind is EventKind.PROBABILISTIC and adm.prob_index == i
        assert adm.charged == seen[-1] == telescoping_delta(i, d)
    # a factory may certify below the allowance (charged in full), or deterministically
    adm = led.admit_next(r, lambda a: cert(delta=a / 3))
    assert adm.charged == telescoping_delta(5, d)
    adm = led.admit_next(r, lambda a: cert())
    assert adm.kind is EventKind.DETERMINISTIC and adm.charged == 0
    adm = led.admit_next(r, lambda a: empirical(), on_empirical=EmpiricalPolicy.DEGRADE)
    assert adm.kind is EventKind.EMPIRICAL_DEGRADED
    v = led.verdict(r)
    assert v.counts.probabilistic == 6 and v.spent == telescoping_spent(6, d) < d


def test_admit_next_refusals_change_nothing() -> None:
    led = RiskLedger()
    r = led.open_request(delta_req="1/100")
    led.admit_next(r, lambda a: cert(delta=a))
    seq = led.applied_seq
    with pytest.raises(BudgetExceededError, match="allowance is 1/600"):
        led.admit_next(r, lambda a: cert(delta=2 * a))
    with pytest.raises(InvalidValueError,
                       match=r"reading\(allowance\)=0\.3 .*must return a Reading"):
        led.admit_next(r, lambda a: 0.3)  # type: ignore[arg-type, return-value]
    with pytest.raises(InvalidValueError, match="reading=0.3 .*callable"):
        led.admit_next(r, 0.3)  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match="token"):
        led.admit_next(r, lambda a: cert(delta=a), token="")
    with pytest.raises(InvalidValueError, match="on_empirical"):
        led.admit_next(r, lambda a: cert(delta=a), on_empirical="degrade")  # type: ignore[arg-type]
    with pytest.raises(UnknownRequestError, match="unknown request id 9"):
        led.admit_next(9, lambda a: cert(delta=a))

    def boom(a: Fraction) -> Reading[Any]:
        raise ZeroDivisionError("bound diverges")

    with pytest.raises(ZeroDivisionError):
        led.admit_next(r, boom)

    def reenter(a: Fraction) -> Reading[Any]:
        led.admit(r, cert(delta=a))  # a factory must not admit: it runs inside the admission
        return cert(delta=a)

    with pytest.raises(InvalidValueError, match="inside the build of another"):
        led.admit_next(r, reenter)
    assert led.applied_seq == seq and led.verdict(r).counts.total == 1
    assert led.admit_next(r, lambda a: cert(delta=a)).prob_index == 1  # the ledger still works


def test_admit_next_token_does_not_build_again() -> None:
    led = RiskLedger()
    r = led.open_request(delta_req="1/100")
    calls: list[Fraction] = []

    def at(a: Fraction) -> Reading[Any]:
        calls.append(a)
        return cert(delta=a)

    first = led.admit_next(r, at, token="r:0")
    assert led.admit_next(r, at, token="r:0") == first
    assert calls == [Fraction(1, 200)] and led.admission("r:0") == first


def test_empirical_never_enters_budget() -> None:
    led = RiskLedger()
    r = led.open_request(delta_req="1/100")
    adm = led.admit(r, empirical())
    assert adm.kind is EventKind.EMPIRICAL_FALLBACK and adm.decision is Decision.FALLBACK
    assert adm.charged == 0
    v = led.verdict(r)  # the fallback took the exact path, and nothing certifies the request
    assert v.tier is Tier.EMPIRICAL and v.reason is not None and "no evidence" in v.reason
    # an empirical reading with a non-zero delta does not spend either
    emp_delta = reading(TV, 0.1, evidence=Measurement("m", samples=2), delta=Fraction(1, 3))
    assert emp_delta.tier is Tier.EMPIRICAL
    adm = led.admit(r, emp_delta, on_empirical=EmpiricalPolicy.DEGRADE)
    assert adm.kind is EventKind.EMPIRICAL_DEGRADED and adm.decision is Decision.USE
    v = led.verdict(r)
    assert v.spent == 0 and v.tier is Tier.EMPIRICAL
    assert (v.counts.empirical_fallback, v.counts.empirical_degraded) == (1, 1)
    # later certificates cannot lift the verdict back
    led.admit(r, cert())
    assert led.verdict(r).tier is Tier.EMPIRICAL


def test_partial_and_saturated_cap_verdict() -> None:
    led = RiskLedger()
    r = led.open_request(delta_req="1/100")
    led.admit(r, cert(evidence=Restricted(PROOF, subset="e_in <= 0.25")))
    assert led.verdict(r).tier is Tier.PARTIALLY_CERTIFIED
    r2 = led.open_request(delta_req="1/100")
    sat = cert(value=1.5)
    assert sat.tier is Tier.SATURATED
    led.admit(r2, sat)
    v = led.verdict(r2)
    assert v.tier is Tier.PARTIALLY_CERTIFIED and v.counts.saturated == 1


def test_bad_admission_inputs() -> None:
    led = RiskLedger()
    r = led.open_request(delta_req="1/100")
    with pytest.raises(InvalidValueError, match="reading"):
        led.admit(r, 0.3)  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match="on_empirical"):
        led.admit(r, cert(), on_empirical="fallback")  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match="token"):
        led.admit(r, cert(), token="")
    with pytest.raises(InvalidValueError):
        cert(value=math.nan)
    with pytest.raises(InvalidValueError):
        cert(value=-0.1)
    assert led.verdict(r).counts.total == 0


def test_idempotent_token() -> None:
    led = RiskLedger()
    r = led.open_request(delta_req="1/100")
    a1 = led.admit(r, cert(delta=Fraction(1, 300)), token="r1:0")
    a2 = led.admit(r, cert(delta=Fraction(1, 300)), token="r1:0")
    assert a1 == a2
    assert led.verdict(r).counts.probabilistic == 1


@given(st.lists(st.tuples(st.sampled_from(["det", "prob", "emp", "deg", "over"]),
                          st.integers(1, 5)), max_size=60),
       st.fractions(min_value=Fraction(1, 10**9), max_value=Fraction(999, 1000)))
@settings(max_examples=60, deadline=None)
def test_adversarial_sequences_never_exceed(ops: list[tuple[str, int]], d: Fraction) -> None:
    """Any sequence of admissions (including refused ones) keeps spend = closed form < delta_req."""
    if not 0 < d < 1:
        return
    led = RiskLedger()
    r = led.open_request(delta_req=d)
    n = 0
    for op, k in ops:
        if op == "det":
            led.admit(r, cert())
        elif op == "prob":
            led.admit(r, cert(delta=led.next_allowance(r) / k))
            n += 1
        elif op == "emp":
            led.admit(r, empirical())
        elif op == "deg":
            led.admit(r, empirical(), on_empirical=EmpiricalPolicy.DEGRADE)
        else:
            big = min(led.next_allowance(r) * (1 + Fraction(1, k)), Fraction(999, 1000))
            with pytest.raises(BudgetExceededError):
                led.admit(r, cert(delta=big))
        assert led.spent(r) == telescoping_spent(n, d) < d


# ----------------------------------------------------------------- entries


def test_entry_level_fallback_costs_one_entry() -> None:
    b = np.full(1000, 1e-4)
    b[137] = 0.5  # one bad entry
    c = certify_entries(b, threshold=1e-3, saturation=1.0)
    assert c.n_kept == 999 and c.fallback.tolist() == [137]
    assert c.retained_fraction == Fraction(999, 1000)
    assert Fraction(c.step_bound) >= sum(Fraction(x) for x in b[c.keep])
    whole = certify_step(b, threshold=0.5)  # healthy entries alone sum to 0.0999
    assert whole.n_kept == 0 and whole.whole_step  # one bad entry sinks the whole step
    assert certify_step(np.delete(b, 137), threshold=0.5).n_kept == 999
    assert not c.keep.flags.writeable


@pytest.mark.parametrize("bad,match", [([0.1, math.nan], r"bounds\[1\]"),
                                       ([-1e-300, 0.1], r"bounds\[0\]"),
                                       ([], "empty"), ([[0.1]], "one-dimensional")])
def test_entry_bad_bounds(bad: list[Any], match: str) -> None:
    with pytest.raises(InvalidValueError, match=match):
        certify_entries(bad, threshold=0.1)


@pytest.mark.parametrize("t", [math.nan, -0.1, math.inf, True])
def test_entry_bad_threshold(t: float) -> None:
    with pytest.raises(InvalidValueError, match="threshold"):
        certify_entries([0.1], threshold=t)


def test_inf_bound_always_falls_back() -> None:
    c = certify_entries([0.1, math.inf], threshold=1e300)
    assert c.keep.tolist() == [True, False]


_floats = st.floats(min_value=0.0, max_value=1e300, allow_nan=False, allow_infinity=False)
_tiny_big = st.one_of(_floats, st.sampled_from([1.0, 2.0**-52, 1e-300, 2.0**60, 3.0, 0.1]))


@given(st.lists(_tiny_big, min_size=1, max_size=300), _floats,
       st.sampled_from([Aggregate.SUM, Aggregate.MAX]))
@settings(max_examples=200, deadline=None)
def test_step_bound_sound_against_exact(bounds: list[float], t: float, how: Aggregate) -> None:
    """The reported step bound is never below the exact aggregate of kept bounds (Fraction)."""
    c = certify_entries(bounds, threshold=t, aggregate=how)
    kept = [Fraction(b) for b in bounds if b <= t]
    exact = (sum(kept, Fraction(0)) if how is Aggregate.SUM else max(kept, default=Fraction(0)))
    assert c.keep.tolist() == [b <= t for b in bounds]
    assert math.isinf(c.step_bound) or Fraction(c.step_bound) >= exact
    w = certify_step(bounds, threshold=t, aggregate=how)
    all_exact = (sum((Fraction(b) for b in bounds), Fraction(0)) if how is Aggregate.SUM
                 else max(Fraction(b) for b in bounds))
    if w.n_kept:
        assert math.isinf(w.step_bound) or Fraction(w.step_bound) >= all_exact


def test_sum_upper_rounding_adversarial() -> None:
    # 1 + many ulp-halves: float summation loses them all; the bound must not.
    xs = [1.0] + [2.0**-53] * 100_000
    s = float(np.sum(np.asarray(xs)))
    exact = Fraction(1) + 100_000 * Fraction(2) ** -53
    assert Fraction(sum_upper(s, len(xs))) >= exact
    seq = 0.0
    for x in xs:
        seq += x
    assert Fraction(seq) < exact  # the naive sum is unsound here
    assert Fraction(sum_upper(seq, len(xs))) >= exact


def test_tradeoff_curve_matches_per_step_certification() -> None:
    rng = np.random.default_rng(3)
    trace = [rng.exponential(1e-3, size=int(rng.integers(1, 200))) for _ in range(30)]
    ts = np.quantile(np.concatenate(trace), [0.0, 0.1, 0.5, 0.9, 1.0])
    curve = tradeoff_curve(trace, thresholds=ts, saturation=0.05)
    for j, t in enumerate(ts):
        certs = [certify_entries(b, threshold=float(t), saturation=0.05) for b in trace]
        kept = sum(c.n_kept for c in certs)
        assert curve.retained_fraction[j] == kept / sum(b.size for b in trace)
        worst_exact = max(sum((Fraction(x) for x in b[b <= t]), Fraction(0)) for b in trace)
        assert Fraction(float(curve.worst_step_bound[j])) >= worst_exact
        assert math.isclose(curve.worst_step_bound[j], max(c.step_bound for c in certs),
                            rel_tol=1e-12)
        assert curve.vacuous_steps[j] == sum(c.vacuous for c in certs)
    assert np.all(np.diff(curve.retained_fraction) >= 0)
    with pytest.raises(InvalidValueError, match="ascending"):
        tradeoff_curve(trace, thresholds=[0.2, 0.1])
    with pytest.raises(InvalidValueError, match="trace"):
        tradeoff_curve([], thresholds=[0.1])


def test_admit_entries_in_ledger() -> None:
    led = RiskLedger()
    r = led.open_request(delta_req="1/100")
    b = np.array([0.01, 0.2, 0.03, 0.001])
    ea = led.admit_entries(r, b, threshold=0.05, metric=TV, evidence=PROOF,
                           delta=led.next_allowance(r))
    assert ea.certification.keep.tolist() == [True, False, True, True]
    assert ea.admission.kind is EventKind.PROBABILISTIC
    assert ea.step is not None and ea.step.tier is Tier.CERTIFIED
    assert ea.step.evidence.theorem == ENTRY_THEOREM  # type: ignore[union-attr]
    # a vacuous step: retention is high but the bound says nothing; both reported
    big = np.full(100, 0.02)
    ea2 = led.admit_entries(r, big, threshold=0.05, metric=TV, evidence=PROOF)
    assert ea2.certification.retained_fraction == 1 and ea2.certification.vacuous
    assert ea2.step is not None and ea2.step.tier is Tier.SATURATED
    v = led.verdict(r)
    assert (v.entries, v.entries_kept, v.steps, v.vacuous_steps) == (104, 103, 2, 1)
    assert v.retained_fraction == Fraction(103, 104)
    assert v.tier is Tier.PARTIALLY_CERTIFIED
    assert v.worst_step_bound >= 2.0
    # empirical entry evidence with fallback: no entry keeps its compressed value
    ea3 = led.admit_entries(r, b, threshold=0.05, metric=LogitLinf[AtConsume],
                            evidence=Measurement("probe", samples=4), aggregate=Aggregate.MAX)
    assert ea3.certification.n_kept == 0 and ea3.step is None
    assert ea3.admission.decision is Decision.FALLBACK
    with pytest.raises(InvalidValueError, match=r"bounds\[2\]"):
        led.admit_entries(r, [0.1, 0.1, -1.0], threshold=0.05, metric=TV, evidence=PROOF)
    assert led.verdict(r).counts.total == 3


# ----------------------------------------------------------------- export


_LINE = re.compile(r'^(witcert_[a-z_]+)(\{([a-z_]+="[^"]*"(,[a-z_]+="[^"]*")*)\})? (\S+)$')


def test_prometheus_export() -> None:
    led = RiskLedger(n_slots=8)
    for _ in range(3):
        r = led.open_request(delta_req="1/100")
        led.admit(r, cert(delta=led.next_allowance(r)))
        led.admit(r, empirical())
        led.admit_entries(r, [0.01, 0.5], threshold=0.1, metric=TV, evidence=PROOF,
                          slots=[2 * r - 2, 2 * r - 1])
    led.add_sentinel("layer0.tv", delta=0.01)
    led.observe("layer0.tv", [0.1, 0.2], m=0.1, c=1.0)
    text = led.prometheus()
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("#"):
            assert re.match(r"^# (HELP|TYPE) witcert_[a-z_]+ .+$", line), line
            continue
        m = _LINE.match(line)
        assert m, line
        names.add(m.group(1))
        float(m.group(5))
        labels = m.group(3) or ""
        assert "request" not in labels and "slot=" not in labels
    assert 'witcert_ledger_admissions_total{kind="probabilistic"} 3.0\n' in text
    assert 'witcert_ledger_admissions_total{kind="empirical_fallback"} 3.0\n' in text
    assert 'witcert_slots{state="masked"} 3.0\n' in text
    assert 'witcert_slots{state="kept_exact"} 3.0\n' in text
    assert 'witcert_eprocess_observations_total{sentinel="layer0.tv"} 2.0\n' in text
    assert "witcert_ledger_requests_total 3.0\n" in text
    for n in names:
        assert n.endswith("_total") == (f"# TYPE {n} counter" in text)


# ----------------------------------------------------------------- no evidence, no certificate


def test_a_request_without_admissions_is_not_certified() -> None:
    led = RiskLedger()
    r = led.open_request(delta_req="1/100")
    v = led.verdict(r)
    assert v.tier is Tier.EMPIRICAL and v.counts.total == 0
    assert v.reason == "no evidence: no reading was admitted, so nothing certifies the request"
    closed = led.close_request(r)
    assert closed.tier is Tier.EMPIRICAL and closed.reason == v.reason
    assert led.stats().open_by_tier == ((Tier.CERTIFIED, 0), (Tier.PARTIALLY_CERTIFIED, 0),
                                        (Tier.EMPIRICAL, 0))


def test_a_request_with_only_empirical_fallbacks_is_not_certified() -> None:
    led = RiskLedger()
    r = led.open_request(delta_req="1/100")
    for _ in range(3):
        led.admit(r, empirical())
    led.admit_entries(r, [0.01, 0.02], threshold=0.1, metric=TV,
                      evidence=Measurement("probe", samples=2))
    v = led.verdict(r)
    assert v.tier is Tier.EMPIRICAL and v.counts.empirical_fallback == 4
    assert v.reason == ("no evidence: 4 empirical fallbacks (exact path) and no certificate "
                        "were admitted")
    assert dict(led.stats().open_by_tier)[Tier.EMPIRICAL] == 1  # the stats agree
    assert v.cap is Tier.CERTIFIED  # what the admissions alone allow: a fleet reduces it
    led.admit(r, cert())  # one certificate is evidence: fallbacks took the exact path
    v = led.verdict(r)
    assert v.tier is Tier.CERTIFIED and v.reason is None
    assert dict(led.stats().open_by_tier)[Tier.CERTIFIED] == 1


def test_verdict_reasons_below_certified() -> None:
    led = RiskLedger()
    r = led.open_request(delta_req="1/100")
    led.admit(r, empirical(), on_empirical=EmpiricalPolicy.DEGRADE)
    assert led.verdict(r).reason == "1 empirical reading used under DEGRADE and no certificate " \
        "admitted"
    r2 = led.open_request(delta_req="1/100")
    led.admit(r2, cert(evidence=Restricted(PROOF, subset="e_in <= 0.25")))
    v2 = led.verdict(r2)
    assert v2.tier is Tier.PARTIALLY_CERTIFIED
    assert v2.reason == "a certificate held only on a decidable subset (restricted)"


def test_a_certified_verdict_needs_a_certificate() -> None:
    fields: dict[str, Any] = dict(
        request_id=1, delta_req=Fraction(1, 100), spent=Fraction(0), entries=0,
        entries_kept=0, retained_fraction=None, steps=0, vacuous_steps=0,
        worst_step_bound=0.0, closed=True)
    with pytest.raises(InvalidValueError, match="no evidence, no certificate"):
        Verdict(tier=Tier.CERTIFIED, counts=EventCounts(), **fields)
    with pytest.raises(InvalidValueError, match="no evidence, no certificate"):
        Verdict(tier=Tier.CERTIFIED, counts=EventCounts(empirical_fallback=2), **fields)
    with pytest.raises(InvalidValueError, match="says why"):
        Verdict(tier=Tier.EMPIRICAL, counts=EventCounts(), **fields)
    ok = Verdict(tier=Tier.CERTIFIED, counts=EventCounts(deterministic=1), **fields)
    assert ok.reason is None


def test_no_evidence_verdict_survives_the_journal(tmp_path: Any) -> None:
    path = tmp_path / "j.sqlite"
    led = RiskLedger(journal=path)
    a = led.open_request(delta_req="1/100")
    b = led.open_request(delta_req="1/100")
    led.admit(b, empirical())
    before = (led.verdict(a), led.verdict(b))
    led.close()
    again = RiskLedger(journal=path)
    assert (again.verdict(a), again.verdict(b)) == before
    assert {v.tier for v in before} == {Tier.EMPIRICAL}
    again.close()
