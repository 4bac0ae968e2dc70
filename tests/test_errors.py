"""The error hierarchy: one root, builtin parents, data fields, pickling."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import pytest

from witcert_calculus import errors
from witcert_calculus.errors import (
    AdmissionError,
    AllowanceMovedError,
    BudgetExceededError,
    EvidenceMismatchError,
    ForgedBoundError,
    ForgedEvidenceError,
    InvalidValueError,
    EngineMismatchError,
    InjectionError,
    JournalError,
    KernelBuildError,
    TokenReusedError,
    UnattributedEvictionError,
    MetricAlreadyRegisteredError,
    MetricMismatchError,
    NotAMetricError,
    OutOfDomainError,
    PremiseError,
    RegimeMismatchError,
    ReusedRequestIdError,
    SlotOwnershipError,
    StaleReadError,
    TheoremExportError,
    UnknownRequestError,
    ChainSpecError,
    ConfoundedComparisonError,
    UnknownTheoremError,
    UnregisteredMetricError,
    UnwrittenSlotError,
    WitcertError,
)

SAMPLES: list[tuple[WitcertError, type[Exception]]] = [
    (InvalidValueError("a", -1.0, "must be >= 0"), ValueError),
    (OutOfDomainError("score", 0.5, 0.25), ValueError),
    (PremiseError("WitCert.Bridges.pooling_l2_caliber", "w >= 0", False), ValueError),
    (MetricMismatchError("s1", "KeyResidualAbs[AtConsume]", "s2", "AttentionTV[AtConsume]"),
     TypeError),
    (RegimeMismatchError("+", "AttentionTV[AtConsume] (upper bound)", "LogitLinf[AtWrite] (mean)"),
     TypeError),
    (UnregisteredMetricError("pkg.Foo"), LookupError),
    (MetricAlreadyRegisteredError("AttentionTV", "unit 'prob', range [0.0, 1.0], saturation 1.0"),
     ValueError),
    (NotAMetricError("KeyResidualAbs", "the observation site is missing"), TypeError),
    (AdmissionError(3, "empirical readings never enter"), ValueError),
    (TokenReusedError("t", 2, 3), ValueError),
    (BudgetExceededError(3, "1/2", "1/2", "1/2"), RuntimeError),
    (BudgetExceededError(3, "1/200", "1/500", "1/100", "1/600"), RuntimeError),
    (AllowanceMovedError(3, Fraction(1, 200), 0, Fraction(1, 1200), 2, Fraction(1, 150),
                         "1/100"), RuntimeError),
    (SlotOwnershipError(2, "evict", 5, 1, 3, 2), PermissionError),
    (UnknownRequestError(9), LookupError),
    (ReusedRequestIdError(2, 5), ValueError),
    (UnwrittenSlotError(4), LookupError),
    (StaleReadError(4, 1, 2), LookupError),
    (JournalError("/tmp/x.db", "disk full"), OSError),
    (JournalError("/tmp/x.db", "event 7 fails its digest", seq=7), OSError),
    (EngineMismatchError("vllm version", "0.32.0", "0.33.0"), RuntimeError),
    (InjectionError("decode_attention.py", "stage1 loop", "found 0 times, expected 1"),
     RuntimeError),
    (KernelBuildError("witcert_fused", "g++ exited with 1"), RuntimeError),
    (UnknownTheoremError("WitCert.Nope.nope", 12), ValueError),
    (TheoremExportError("/tmp/theorems.json", "not a JSON list"), ValueError),
    (ChainSpecError("stage 2 ('nope')", "names no bridge 'nope'"), ValueError),
    (ConfoundedComparisonError("a", "b", (("prefix_caching", True, False),
                                          ("dtype", "fp8", "bf16"))), ValueError),
    (ForgedBoundError("LogitBound", ("witcert_calculus.meters.witness.logit_bound",)), TypeError),
    (UnattributedEvictionError("MergingPress", 3, "a kept value is not a bit-exact copy"),
     ValueError),
    (ForgedEvidenceError("Proof", "Proof('WitCert.Contract.id_sound')", "issued by a bridge"),
     TypeError),
    (EvidenceMismatchError("WitCert.Bridges.score_bridge_sound", "b", 0, Fraction(1, 2)),
     ValueError),
]


@pytest.mark.parametrize(("err", "builtin"), SAMPLES, ids=lambda x: type(x).__name__)
def test_each_leaf_has_one_root_and_its_builtin(err: WitcertError, builtin: type) -> None:
    assert isinstance(err, WitcertError)
    assert isinstance(err, builtin)


@pytest.mark.parametrize(("err", "builtin"), SAMPLES, ids=lambda x: type(x).__name__)
def test_errors_pickle_with_their_fields_and_message(err: WitcertError, builtin: type) -> None:
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err)
    assert str(back) == str(err)
    assert vars(back) == vars(err)


def test_every_declared_error_is_sampled() -> None:
    declared = {getattr(errors, n) for n in errors.__all__}
    assert declared - {WitcertError} == {type(e) for e, _ in SAMPLES}


def test_messages_name_values_and_suggest_fix() -> None:
    m = MetricMismatchError("storage", "KeyResidualAbs[AtConsume]", "select", "AttentionTV[AtConsume]")
    text = str(m)
    assert "KeyResidualAbs[AtConsume]" in text and "AttentionTV[AtConsume]" in text
    assert "'storage'" in text and "'select'" in text and "insert a bridge" in text
    assert "-1.0" in str(InvalidValueError("a", -1.0, "must be >= 0"))


def test_ledger_refusals_say_what_moved_and_who_owns() -> None:
    moved = str(AllowanceMovedError(3, Fraction(1, 200), 0, Fraction(1, 1200), 2,
                                    Fraction(1, 150), "1/100"))
    assert "allowance moved" in moved and "1/200" in moved and "1/1200" in moved
    assert "admit_next" in moved and "budget" not in moved
    slot = str(SlotOwnershipError(2, "write", 5, 1, 3, 1))
    assert slot.startswith("request 2 may not write slot 5: it is owned by request 1 "
                           "(generation 3)")
    assert "nothing of the batch was applied" in slot


def test_a_forged_bound_names_the_type_and_its_establishers() -> None:
    err = ForgedBoundError("LogitBound", ("witcert_calculus.meters.witness.logit_bound",
                                          "witcert_calculus.meters.dither.tier_b_logit_bound"))
    text = str(err)
    assert err.kind == "LogitBound" and "LogitBound" in text
    assert "witcert_calculus.meters.witness.logit_bound" in text and "tier_b_logit_bound" in text
    assert "assumption" in text  # the fix: pass the plain array, carried as an assumption


# ---------------------------------------------------------------------------- bad inputs
#
# Each bad input below is refused with a typed error of the hierarchy that names the
# parameter and shows the value (never a bare TypeError, ValueError, OverflowError,
# AttributeError or MemoryError from inside, and never a silent wrong answer).

def _contract() -> object:
    from witcert_calculus import AtConsume, score_bridge

    return score_bridge(AtConsume, scale=1, q_norm_max=0.5)


def _ledger_with_slot() -> tuple[object, int]:
    from reference.issued import proof

    from witcert_calculus import AtConsume, AttentionTV, RiskLedger

    led = RiskLedger(n_slots=4)
    r = led.open_request(delta_req="1/100")
    led.admit_entries(r, [0.1], threshold=0.5, metric=AttentionTV[AtConsume],
                      evidence=proof("WitCert.Meters.tv_eform_sound"), slots=[1])
    return led, r


def _admit_entries(bounds: object, request_id: object = None) -> object:
    from reference.issued import proof

    from witcert_calculus import AtConsume, AttentionTV

    led, r = _ledger_with_slot()
    return led.admit_entries(r if request_id is None else request_id,  # type: ignore[attr-defined]
                             bounds, threshold=0.5, metric=AttentionTV[AtConsume],
                             evidence=proof("WitCert.Meters.tv_eform_sound"), slots=[2])


def _tv_batch(visible: Any) -> object:
    import numpy as np

    from witcert_calculus import tv_bounds_batch

    return tv_bounds_batch(np.full((1, 4), 0.25), np.zeros((1, 4)), visible=[visible])


def _journal(timeout: float, tmp: str, *, eventlog: bool = False) -> object:
    import os
    import tempfile
    import threading

    from witcert_calculus.accounting.eventlog import EventLog
    from witcert_calculus.accounting.journal import Journal

    path = os.path.join(tempfile.mkdtemp(), f"{tmp}.sqlite")
    if eventlog:
        return EventLog(path, n_slots=0, busy_timeout_s=timeout, lock=threading.RLock(),
                        replay=lambda ev: None)
    return Journal(path, n_slots=0, busy_timeout_s=timeout)


def _measured_tv(value: float) -> object:
    from witcert_calculus import AtConsume, AttentionTV, Measurement, Reading, Regime

    return Reading(AttentionTV[AtConsume], value, evidence=Measurement("observed TV", 3),
                   regime=Regime.MEASURED)


def _bad_inputs() -> list[tuple[str, Callable[[], object], type[WitcertError], str]]:
    import math

    import numpy as np

    import witcert_calculus as wc

    nan = math.nan
    c = _contract()
    return [
        ("bound-str", lambda: c.bound("0.1"), InvalidValueError, "e_in='0.1'"),  # type: ignore[attr-defined]
        ("bound-bool", lambda: c.bound(True), InvalidValueError, "e_in=True"),  # type: ignore[attr-defined]
        ("bound-huge-fraction", lambda: c.bound(Fraction(10**400)),  # type: ignore[attr-defined]
         InvalidValueError, "e_in="),
        ("contract-huge-b", lambda: wc.Contract(
            wc.KeyResidualAbs[wc.AtConsume], wc.LogitLinf[wc.AtConsume], a=0.5, b=10**400,
            evidence=wc.Measurement("ratio", 3), name="s"),
         InvalidValueError, "b="),
        ("witness-contract-huge", lambda: wc.witness_contract(wc.AtConsume,
                                                              witness_max=10**400),
         InvalidValueError, "witness_max='~10**400'"),
        ("score-bridge-overflow", lambda: wc.score_bridge(wc.AtConsume, scale=1e308,
                                                          q_norm_max=1e308),
         InvalidValueError, "scale"),
        ("tv-eform-str", lambda: wc.tv_eform(["0.5", "0.5"], [0.1, 0.1]),
         InvalidValueError, "p_tilde="),
        ("tv-eform-bool", lambda: wc.tv_eform([True, False], [0.1, 0.1]),
         InvalidValueError, "p_tilde="),
        ("admit-entries-str", lambda: _admit_entries(["0.1"]), InvalidValueError, "bounds="),
        ("band-witness-complex", lambda: wc.band_witness(
            np.array([1j, 0, 0, 0]), bands=1, layout=wc.RopeLayout.INTERLEAVED),
         InvalidValueError, "residual="),
        ("visible-0", lambda: _tv_batch(0), InvalidValueError, "visible"),
        ("visible-neg", lambda: _tv_batch(-1), InvalidValueError, "visible"),
        ("visible-above-S", lambda: _tv_batch(5), InvalidValueError, "visible"),
        ("visible-float", lambda: _tv_batch(1.5), InvalidValueError, "visible"),
        ("measured-tv-5", lambda: _measured_tv(5.0), InvalidValueError, "raw=5.0"),
        ("weakest-int", lambda: wc.weakest(3, wc.Tier.CERTIFIED),  # type: ignore[arg-type]
         InvalidValueError, "tier=3"),
        ("journal-timeout-neg", lambda: _journal(-1.0, "a"), InvalidValueError,
         "busy_timeout_s=-1.0"),
        ("journal-timeout-nan", lambda: _journal(nan, "b"), InvalidValueError,
         "busy_timeout_s=nan"),
        ("eventlog-timeout-neg", lambda: _journal(-1.0, "c", eventlog=True),
         InvalidValueError, "busy_timeout_s=-1.0"),
        ("ledger-timeout-nan", lambda: wc.RiskLedger(busy_timeout_s=nan),
         InvalidValueError, "busy_timeout_s=nan"),
        ("transfer-neg", lambda: wc.Transfer(wc.TransferKind.EXP_TV)(-1.0),
         InvalidValueError, "x=-1.0"),
        ("transfer-nan", lambda: wc.Transfer(wc.TransferKind.TANH)(nan),
         InvalidValueError, "x=nan"),
        ("delta-local-underflow", lambda: wc.delta_local(0.5, layers=10**200, heads=10**200,
                                                         steps=10**200),
         InvalidValueError, "layers"),
        ("authorize-bool", lambda: _ledger_with_slot()[0].slots.authorize(True, 1),  # type: ignore[attr-defined]
         InvalidValueError, "reader=True"),
        ("open-request-2**63", lambda: wc.RiskLedger().open_request(
            delta_req="1/100", request_id=2**63), InvalidValueError, "request_id="),
        ("write-slot-2**63", lambda: _admit_entries([0.1], request_id=2**63),
         InvalidValueError, "request_id="),
        ("measurement-int-description", lambda: wc.Measurement(5, 3),  # type: ignore[arg-type]
         InvalidValueError, "description=5"),
        ("register-metric-int-unit", lambda: wc.register_metric(unit=5, meaning="x"),  # type: ignore[arg-type]
         InvalidValueError, "unit=5"),
        ("n-slots-huge", lambda: wc.RiskLedger(n_slots=10**12), InvalidValueError,
         "n_slots="),
    ]


@pytest.mark.parametrize("case", _bad_inputs(), ids=lambda case: case[0])
def test_bad_input_is_a_typed_error_naming_the_parameter(
        case: tuple[str, Callable[[], object], type[WitcertError], str]) -> None:
    import re

    _, call, kind, match = case
    with pytest.raises(kind, match=re.escape(match)):
        call()


def test_an_infinite_proved_bound_is_saturated_never_certified() -> None:
    import math

    from reference.issued import proof as issue

    from witcert_calculus import Measurement, Tier, decide_tier

    proof = issue("WitCert.Contract.comp_sound")
    assert decide_tier(proof, value=math.inf) is Tier.SATURATED
    assert decide_tier(proof, value=math.inf, saturation=1.0) is Tier.SATURATED
    assert decide_tier(Measurement("m", 1), value=math.inf) is Tier.EMPIRICAL
    assert decide_tier(proof, value=0.5) is Tier.CERTIFIED
    with pytest.raises(InvalidValueError, match="value"):
        decide_tier(proof, value=-math.inf)
    with pytest.raises(InvalidValueError, match="value"):
        decide_tier(proof, value="0.5")  # type: ignore[arg-type]


def test_one_request_id_rule_everywhere() -> None:
    """Python and numpy integers (not bool) in [1, 2**63 - 1], the same for every entry point."""
    import numpy as np

    from reference.issued import proof, reading as issue_reading

    from witcert_calculus import AtConsume, AttentionTV
    from witcert_calculus.numerics.validation import REQUEST_ID_MAX, request_id

    assert REQUEST_ID_MAX == 2**63 - 1
    assert request_id("request_id", np.int64(7)) == 7 and request_id("r", 2**63 - 1) == 2**63 - 1
    for bad in (True, False, 0, -1, 2**63, 1.0, "1", np.float64(1.0)):
        with pytest.raises(InvalidValueError, match="request_id="):
            request_id("request_id", bad)
    led, r = _ledger_with_slot()
    grant = led.slots.authorize(np.int64(r), 1)  # type: ignore[attr-defined]
    assert type(grant.reader) is int and grant.reader == r
    reading = issue_reading(AttentionTV[AtConsume], 0.01,
                            evidence=proof("WitCert.Meters.tv_eform_sound"))
    assert led.admit(np.int64(r), reading).request_id == r  # type: ignore[attr-defined]
    with pytest.raises(InvalidValueError, match="request_id=True"):
        led.admit(True, reading)  # type: ignore[attr-defined]
    with pytest.raises(InvalidValueError, match="request_id=True"):
        led.require_known(True)  # type: ignore[attr-defined]
    assert led.slots.owned_by(np.int64(r)).tolist() == [1]  # type: ignore[attr-defined]


def test_ledger_records_refuse_junk_fields() -> None:
    """The records of :mod:`witcert_calculus.accounting.records` check their fields once."""
    import dataclasses
    import math

    import numpy as np

    from witcert_calculus import Admission, Decision, EventCounts, EventKind, Tier

    counts = EventCounts(deterministic=np.int64(2))  # type: ignore[arg-type]
    assert type(counts.deterministic) is int
    for bad in ({"probabilistic": -1}, {"saturated": True}, {"deterministic": 1.5}):
        with pytest.raises(InvalidValueError, match=next(iter(bad))):
            EventCounts(**bad)
    ok = Admission(request_id=1, ordinal=0, kind=EventKind.DETERMINISTIC, decision=Decision.USE,
                   tier=Tier.CERTIFIED, charged=Fraction(0), spent=Fraction(0), prob_index=None,
                   token=None)
    for field, value in (("request_id", True), ("request_id", 2**63), ("kind", "deterministic"),
                         ("tier", 3), ("charged", 0.5), ("spent", Fraction(-1)),
                         ("token", 5), ("prob_index", -1)):
        with pytest.raises(InvalidValueError, match=field):
            dataclasses.replace(ok, **{field: value})  # type: ignore[arg-type]
    assert math.isfinite(float(ok.spent))


def test_a_bound_that_overflows_a_float_reports_saturation() -> None:
    """Coefficients are exact and at most the largest float; a bound ``a * e_in + b`` above
    it is rounded up to ``inf`` (saturated), never clamped to a finite number."""
    import math

    from witcert_calculus import AtConsume, Tier, score_bridge

    c = score_bridge(AtConsume, scale=1e308, q_norm_max=1)
    r = c.bound(10.0)
    assert r.raw == math.inf and r.tier is Tier.SATURATED
