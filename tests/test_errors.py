"""The error hierarchy: one root, builtin parents, data fields, pickling."""

from __future__ import annotations

import pickle

import pytest

from witcert_calculus import errors
from witcert_calculus.errors import (
    AdmissionError,
    BudgetExceededError,
    InvalidValueError,
    JournalError,
    MetricAlreadyRegisteredError,
    MetricMismatchError,
    NotAMetricError,
    OutOfDomainError,
    PremiseError,
    RegimeMismatchError,
    ReusedRequestIdError,
    StaleReadError,
    UnknownRequestError,
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
    (BudgetExceededError(3, "1/2", "1/2", "1/2"), RuntimeError),
    (UnknownRequestError(9), LookupError),
    (ReusedRequestIdError(2, 5), ValueError),
    (UnwrittenSlotError(4), LookupError),
    (StaleReadError(4, 1, 2), LookupError),
    (JournalError("/tmp/x.db", "disk full"), OSError),
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
