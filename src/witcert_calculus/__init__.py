"""witcert-calculus: typed contracts for runtime error bounds on LLM attention memory.

Every bound is a :class:`Contract` ``[In, Out]``: ``e_out <= a * e_in + b`` except
with probability ``delta``, with the metric (and its observation site) in the
type, and a tier decided by the machine from the evidence (a Lean theorem, a
restricted proof, or a measurement).

Main declarations (see each module for more):

- metrics: :class:`AtWrite`, :class:`AtConsume`, the metric classes, :func:`register_metric`
- tiers: :class:`Tier`, :func:`weakest`, :class:`Proof`, :class:`Restricted`,
  :class:`Measurement`, :func:`decide_tier`
- contracts: :class:`Contract`, :func:`chain`, :func:`identity`, :class:`Reading`
- bridges: :func:`score_bridge`, :func:`softmax_tv_eform`, :func:`rank_prefix_selection`, ...
- errors: :class:`WitcertError` and its tree

- ledger: :class:`RiskLedger`, :func:`telescoping_delta`, :class:`SlotTable`, :class:`EProcess`

Heavy modules (bridges, ledger and meters, which need numpy) load on first use, so that
``import witcert_calculus`` stays fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from witcert_calculus.contracts import (
    Contract,
    Number,
    Reading,
    Regime,
    Transfer,
    TransferKind,
    chain,
    identity,
)
from witcert_calculus.errors import (
    AdmissionError,
    BudgetExceededError,
    InvalidValueError,
    JournalError,
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
from witcert_calculus.metrics import (
    AtConsume,
    AttentionOutputL2,
    AttentionTV,
    AtWrite,
    KeyResidualAbs,
    KeyResidualRel,
    LatentResidual,
    LogitLinf,
    LogitOsc,
    Metric,
    MetricInfo,
    PerTokenL2,
    PerTokenMax,
    PooledError,
    RecurrentStateError,
    SelectorMass,
    Site,
    ValueResidual,
    metric_info,
    metric_name,
    register_metric,
)
from witcert_calculus.tiers import (
    Composition,
    Evidence,
    Measurement,
    Premise,
    Proof,
    Restricted,
    Tier,
    decide_tier,
    weakest,
)

if TYPE_CHECKING:
    from witcert_calculus.bridges import (
        Pooling,
        Recurrence,
        StableRows,
        empirical_ratio_bridge,
        pooling,
        rank_prefix_selection,
        rank_prefix_stable,
        recurrence,
        score_bridge,
        selector_mass_eform,
        softmax_tv_affine,
        softmax_tv_eform,
        softmax_tv_tanh,
        softmax_tv_tanh_osc,
        witness_contract,
    )
    from witcert_calculus.ledger import (
        Admission,
        Aggregate,
        Decision,
        EProcess,
        EProcessState,
        EmpiricalPolicy,
        EntryAdmission,
        EntryCertification,
        EventCounts,
        EventKind,
        LedgerStats,
        ReadGrant,
        RiskLedger,
        SlotRead,
        SlotRecord,
        SlotState,
        SlotTable,
        Verdict,
        certify_entries,
        certify_step,
        telescoping_delta,
        telescoping_spent,
        tradeoff_curve,
    )

_LAZY: dict[str, str] = {
    **{name: "witcert_calculus.bridges" for name in (
        "Pooling", "Recurrence", "StableRows", "empirical_ratio_bridge", "pooling",
        "rank_prefix_selection", "rank_prefix_stable", "recurrence", "score_bridge",
        "selector_mass_eform", "softmax_tv_affine", "softmax_tv_eform", "softmax_tv_tanh",
        "softmax_tv_tanh_osc", "witness_contract")},
    **{name: "witcert_calculus.ledger" for name in (
        "Admission",
        "Aggregate",
        "Decision",
        "EProcess",
        "EProcessState",
        "EmpiricalPolicy",
        "EntryAdmission",
        "EntryCertification",
        "EventCounts",
        "EventKind",
        "LedgerStats",
        "ReadGrant",
        "RiskLedger",
        "SlotRead",
        "SlotRecord",
        "SlotState",
        "SlotTable",
        "Verdict",
        "certify_entries",
        "certify_step",
        "telescoping_delta",
        "telescoping_spent",
        "tradeoff_curve",
    )},
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'witcert_calculus' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "Admission",
    "AdmissionError",
    "Aggregate",
    "AtConsume",
    "AtWrite",
    "AttentionOutputL2",
    "AttentionTV",
    "BudgetExceededError",
    "Composition",
    "Contract",
    "Decision",
    "EProcess",
    "EProcessState",
    "EmpiricalPolicy",
    "EntryAdmission",
    "EntryCertification",
    "EventCounts",
    "EventKind",
    "Evidence",
    "InvalidValueError",
    "JournalError",
    "KeyResidualAbs",
    "KeyResidualRel",
    "LatentResidual",
    "LedgerStats",
    "LogitLinf",
    "LogitOsc",
    "Measurement",
    "Metric",
    "MetricInfo",
    "MetricMismatchError",
    "NotAMetricError",
    "Number",
    "OutOfDomainError",
    "PerTokenL2",
    "PerTokenMax",
    "PooledError",
    "Pooling",
    "Premise",
    "PremiseError",
    "Proof",
    "ReadGrant",
    "Reading",
    "Recurrence",
    "RecurrentStateError",
    "Regime",
    "RegimeMismatchError",
    "Restricted",
    "ReusedRequestIdError",
    "RiskLedger",
    "SelectorMass",
    "Site",
    "SlotRead",
    "SlotRecord",
    "SlotState",
    "SlotTable",
    "StableRows",
    "StaleReadError",
    "Tier",
    "Transfer",
    "TransferKind",
    "UnknownRequestError",
    "UnregisteredMetricError",
    "UnwrittenSlotError",
    "ValueResidual",
    "Verdict",
    "WitcertError",
    "certify_entries",
    "certify_step",
    "chain",
    "decide_tier",
    "empirical_ratio_bridge",
    "identity",
    "metric_info",
    "metric_name",
    "pooling",
    "rank_prefix_selection",
    "rank_prefix_stable",
    "recurrence",
    "register_metric",
    "score_bridge",
    "selector_mass_eform",
    "softmax_tv_affine",
    "softmax_tv_eform",
    "softmax_tv_tanh",
    "softmax_tv_tanh_osc",
    "telescoping_delta",
    "telescoping_spent",
    "tradeoff_curve",
    "weakest",
    "witness_contract",
]
