"""Metric types: sites in the type, registry, declarations."""

from __future__ import annotations

import math
import pickle
from typing import TypeVar

import pytest

from witcert_calculus import (
    AtConsume,
    AttentionTV,
    AtWrite,
    Contract,
    KeyResidualAbs,
    LogitLinf,
    Metric,
    NotAMetricError,
    Proof,
    Reading,
    Site,
    UnregisteredMetricError,
    metric_info,
    metric_name,
    register_metric,
)
from witcert_calculus import metrics as M
from witcert_calculus.errors import InvalidValueError
from reference.issued import proof, reading

S = TypeVar("S", bound=Site)

REQUIRED = ["KeyResidualRel", "KeyResidualAbs", "ValueResidual", "LogitLinf", "AttentionTV",
            "SelectorMass", "AttentionOutputL2", "LatentResidual", "RecurrentStateError",
            "PerTokenL2", "PerTokenMax"]


def test_sites_make_distinct_runtime_types() -> None:
    assert KeyResidualAbs[AtWrite] != KeyResidualAbs[AtConsume]
    assert KeyResidualAbs[AtConsume] == KeyResidualAbs[AtConsume]
    assert metric_name(KeyResidualAbs[AtWrite]) == "KeyResidualAbs[AtWrite]"


@pytest.mark.parametrize("name", REQUIRED)
def test_required_metrics_declare_unit_range_meaning(name: str) -> None:
    cls = getattr(M, name)
    info = metric_info(cls[AtConsume])
    assert info.name == name and info.unit and info.meaning
    assert info.lo <= info.hi
    if info.saturation is not None:
        assert info.lo <= info.saturation <= info.hi


def test_attention_tv_saturates_at_one() -> None:
    assert metric_info(AttentionTV[AtWrite]).saturation == 1.0
    assert metric_info(LogitLinf[AtWrite]).saturation is None
    assert metric_info(LogitLinf[AtWrite]).hi == math.inf


def test_unregistered_metric_raises_everywhere() -> None:
    class Stray(Metric[S]):
        pass

    with pytest.raises(UnregisteredMetricError, match="Stray"):
        metric_info(Stray[AtConsume])
    with pytest.raises(UnregisteredMetricError, match="Stray"):
        Contract(Stray[AtConsume], LogitLinf[AtConsume], a=1, b=0,
                 evidence=proof("WitCert.Contract.id_sound"), name="x")
    with pytest.raises(UnregisteredMetricError, match="Stray"):
        reading(Stray[AtConsume], 0.1, evidence=proof("WitCert.Contract.id_sound"))
    from witcert_calculus import empirical_ratio_bridge
    with pytest.raises(UnregisteredMetricError, match="Stray"):
        empirical_ratio_bridge(Stray[AtConsume], AttentionTV[AtConsume], ratio=1.0, samples=3,
                               statistic="median", set_type="toy")


def test_user_registered_metric_works() -> None:
    @register_metric(unit="bits", meaning="code length excess", hi=64.0, saturation=64.0)
    class CodeExcess(Metric[S]):
        pass

    info = metric_info(CodeExcess[AtWrite])
    assert (info.unit, info.hi, info.saturation) == ("bits", 64.0, 64.0)
    r = reading(CodeExcess[AtWrite], 70.0, evidence=proof("WitCert.Contract.id_sound"))
    assert r.value == 64.0 and r.raw == 70.0 and r.saturated


def test_bare_metric_without_site_is_rejected() -> None:
    with pytest.raises(NotAMetricError, match=r"site is missing.*KeyResidualAbs\[AtConsume\]"):
        metric_info(KeyResidualAbs)
    with pytest.raises(NotAMetricError):
        metric_info("AttentionTV")
    with pytest.raises(NotAMetricError):
        metric_info(KeyResidualAbs[Site])


@pytest.mark.parametrize(("kw", "bad"), [({"unit": " "}, "unit"), ({"meaning": ""}, "meaning"),
                                         ({"lo": 2.0, "hi": 1.0}, "lo"),
                                         ({"saturation": 5.0, "hi": 1.0}, "saturation"),
                                         ({"lo": math.nan}, "lo")])
def test_register_rejects_bad_declarations(kw: dict[str, object], bad: str) -> None:
    args: dict[str, object] = {"unit": "u", "meaning": "m"}
    args.update(kw)
    with pytest.raises(InvalidValueError, match=bad):
        register_metric(**args)  # type: ignore[arg-type]


def test_metric_classes_are_types_not_values() -> None:
    with pytest.raises(TypeError):
        KeyResidualAbs()


def test_metric_types_pickle() -> None:
    assert pickle.loads(pickle.dumps(AttentionTV[AtConsume])) == AttentionTV[AtConsume]


# ----------------------------------------------------------------------------- append-only registry

def test_reregistering_a_builtin_metric_raises_and_changes_nothing() -> None:
    from witcert_calculus import MetricAlreadyRegisteredError, Tier, tv_eform
    before = metric_info(AttentionTV[AtConsume])
    with pytest.raises(MetricAlreadyRegisteredError,
                       match=r"AttentionTV is already registered.*saturation 1\.0"):
        register_metric(unit="prob", meaning="oops", hi=5.0)(AttentionTV)
    assert metric_info(AttentionTV[AtConsume]) == before
    assert before.saturation == 1.0
    assert tv_eform([1.0], [0.702681]).reading().tier is Tier.SATURATED


def test_reregistering_a_user_metric_raises() -> None:
    from witcert_calculus import MetricAlreadyRegisteredError

    @register_metric(unit="bits", meaning="first declaration")
    class Once(Metric[S]):
        pass

    with pytest.raises(MetricAlreadyRegisteredError, match="Once") as info:
        register_metric(unit="bits", meaning="second declaration", saturation=1.0)(Once)
    assert isinstance(info.value, ValueError)
    assert pickle.loads(pickle.dumps(info.value)).args == info.value.args
    assert metric_info(Once[AtWrite]).meaning == "first declaration"


def test_the_registry_is_not_writable_from_outside() -> None:
    view = M.registered_metrics()
    assert view[AttentionTV].saturation == 1.0
    with pytest.raises(TypeError):
        view[AttentionTV] = view[LogitLinf]  # type: ignore[index]
    assert M.registered_metrics()[AttentionTV].saturation == 1.0


def test_a_bare_metric_stage_fails_at_construction_and_says_why_mypy_missed_it() -> None:
    from witcert_calculus import witness_contract
    storage = witness_contract(AtConsume, witness_max=0.02)
    with pytest.raises(NotAMetricError, match=r"KeyResidualAbs\[AtConsume\].*mypy cannot.*"
                                              r"KeyResidualAbs\[Any\]"):
        storage >> Contract(KeyResidualAbs, AttentionTV[AtConsume], a=1, b=0,  # type: ignore[misc]
                            evidence=proof("WitCert.Contract.id_sound"), name="bare")
