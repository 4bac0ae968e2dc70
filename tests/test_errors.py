"""The error hierarchy: one root, builtin parents, data fields, pickling."""

from __future__ import annotations

import pickle
from fractions import Fraction

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
    TokenReusedError,
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
    (UnknownTheoremError("WitCert.Nope.nope", 12), ValueError),
    (TheoremExportError("/tmp/theorems.json", "not a JSON list"), ValueError),
    (ChainSpecError("stage 2 ('nope')", "names no bridge 'nope'"), ValueError),
    (ForgedBoundError("LogitBound", ("witcert_calculus.meters.witness.logit_bound",)), TypeError),
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
