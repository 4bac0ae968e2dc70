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

- ledger: :class:`RiskLedger`, with :class:`Probability` and :func:`telescoping_delta` (budget),
  :class:`Verdict` (records), :class:`SlotTable` (slots), :class:`EProcess` (eprocess)
- meters (:mod:`witcert_calculus.meters` says which module holds each):
  :func:`band_witness`, :func:`logit_bound`, :func:`tv_meter`, :func:`tv_eform`, ...

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
    MetricAlreadyRegisteredError,
    MetricMismatchError,
    NotAMetricError,
    OutOfDomainError,
    PremiseError,
    RegimeMismatchError,
    ReusedRequestIdError,
    StaleReadError,
    TheoremExportError,
    UnknownRequestError,
    UnknownTheoremError,
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
    registered_metrics,
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
        empirical_ratio_bridge,
        Pooling,
        pooling,
        rank_prefix_selection,
        rank_prefix_stable,
        Recurrence,
        recurrence,
        score_bridge,
        selector_mass_eform,
        softmax_tv_affine,
        softmax_tv_eform,
        softmax_tv_tanh,
        softmax_tv_tanh_osc,
        StableRows,
        witness_contract,
    )
    from witcert_calculus.budget import (
        Probability,
        ProbabilityLike,
        telescoping_delta,
        telescoping_spent,
    )
    from witcert_calculus.dither import (
        byte_account,
        ByteAccount,
        delta_local,
        dither_dequantize,
        dither_mean_offset,
        dither_noise,
        dither_quantize,
        dither_variance_proxy,
        DitheredKeys,
        DitherKey,
        select_outlier_pairs,
        subgaussian_radius,
        tier_b_certificate,
        tier_b_logit_bound,
    )
    from witcert_calculus.dispersion import (
        dispersion_bound_unsound,
        DispersionCounterexample,
    )
    from witcert_calculus.entries import (
        Aggregate,
        certify_entries,
        certify_step,
        EntryCertification,
        tradeoff_curve,
    )
    from witcert_calculus.eprocess import (
        EProcess,
        EProcessState,
    )
    from witcert_calculus.ledger import (
        RiskLedger,
    )
    from witcert_calculus.output_bound import (
        output_error_bound,
        output_error_contract,
    )
    from witcert_calculus.page_in import (
        block_summary,
        page_in_order,
        PageInPlan,
    )
    from witcert_calculus.tv_forms import (
        tv_bounds_batch,
        tv_eform,
        tv_meter,
        tv_retention,
        tv_tanh_max,
        tv_two_sided,
        TVBatch,
        TVBound,
    )
    from witcert_calculus.records import (
        Admission,
        Decision,
        EmpiricalPolicy,
        EntryAdmission,
        EventCounts,
        EventKind,
        LedgerStats,
        Verdict,
    )
    from witcert_calculus.sentinels import (
        rate_upper_bound,
        sentinel_rounds,
    )
    from witcert_calculus.slots import (
        ReadGrant,
        SlotRead,
        SlotRecord,
        SlotState,
        SlotTable,
    )
    from witcert_calculus.witness import (
        band_channels,
        band_norms,
        band_pairs,
        band_witness,
        logit_bound,
        logit_linf_reading,
        RopeLayout,
    )

#: Where each lazily loaded public name is implemented (loaded on first use, PEP 562).
_LAZY: dict[str, str] = {
    "Admission": "witcert_calculus.records",
    "Aggregate": "witcert_calculus.entries",
    "ByteAccount": "witcert_calculus.dither",
    "Decision": "witcert_calculus.records",
    "DispersionCounterexample": "witcert_calculus.dispersion",
    "DitherKey": "witcert_calculus.dither",
    "DitheredKeys": "witcert_calculus.dither",
    "EProcess": "witcert_calculus.eprocess",
    "EProcessState": "witcert_calculus.eprocess",
    "EmpiricalPolicy": "witcert_calculus.records",
    "EntryAdmission": "witcert_calculus.records",
    "EntryCertification": "witcert_calculus.entries",
    "EventCounts": "witcert_calculus.records",
    "EventKind": "witcert_calculus.records",
    "LedgerStats": "witcert_calculus.records",
    "PageInPlan": "witcert_calculus.page_in",
    "Pooling": "witcert_calculus.bridges",
    "Probability": "witcert_calculus.budget",
    "ProbabilityLike": "witcert_calculus.budget",
    "ReadGrant": "witcert_calculus.slots",
    "Recurrence": "witcert_calculus.bridges",
    "RiskLedger": "witcert_calculus.ledger",
    "RopeLayout": "witcert_calculus.witness",
    "SlotRead": "witcert_calculus.slots",
    "SlotRecord": "witcert_calculus.slots",
    "SlotState": "witcert_calculus.slots",
    "SlotTable": "witcert_calculus.slots",
    "StableRows": "witcert_calculus.bridges",
    "TVBatch": "witcert_calculus.tv_forms",
    "TVBound": "witcert_calculus.tv_forms",
    "Verdict": "witcert_calculus.records",
    "band_channels": "witcert_calculus.witness",
    "band_norms": "witcert_calculus.witness",
    "band_pairs": "witcert_calculus.witness",
    "band_witness": "witcert_calculus.witness",
    "block_summary": "witcert_calculus.page_in",
    "byte_account": "witcert_calculus.dither",
    "certify_entries": "witcert_calculus.entries",
    "certify_step": "witcert_calculus.entries",
    "delta_local": "witcert_calculus.dither",
    "dispersion_bound_unsound": "witcert_calculus.dispersion",
    "dither_dequantize": "witcert_calculus.dither",
    "dither_mean_offset": "witcert_calculus.dither",
    "dither_noise": "witcert_calculus.dither",
    "dither_quantize": "witcert_calculus.dither",
    "dither_variance_proxy": "witcert_calculus.dither",
    "empirical_ratio_bridge": "witcert_calculus.bridges",
    "logit_bound": "witcert_calculus.witness",
    "logit_linf_reading": "witcert_calculus.witness",
    "output_error_bound": "witcert_calculus.output_bound",
    "output_error_contract": "witcert_calculus.output_bound",
    "page_in_order": "witcert_calculus.page_in",
    "pooling": "witcert_calculus.bridges",
    "rank_prefix_selection": "witcert_calculus.bridges",
    "rank_prefix_stable": "witcert_calculus.bridges",
    "rate_upper_bound": "witcert_calculus.sentinels",
    "recurrence": "witcert_calculus.bridges",
    "score_bridge": "witcert_calculus.bridges",
    "select_outlier_pairs": "witcert_calculus.dither",
    "selector_mass_eform": "witcert_calculus.bridges",
    "sentinel_rounds": "witcert_calculus.sentinels",
    "softmax_tv_affine": "witcert_calculus.bridges",
    "softmax_tv_eform": "witcert_calculus.bridges",
    "softmax_tv_tanh": "witcert_calculus.bridges",
    "softmax_tv_tanh_osc": "witcert_calculus.bridges",
    "subgaussian_radius": "witcert_calculus.dither",
    "telescoping_delta": "witcert_calculus.budget",
    "telescoping_spent": "witcert_calculus.budget",
    "tier_b_certificate": "witcert_calculus.dither",
    "tier_b_logit_bound": "witcert_calculus.dither",
    "tradeoff_curve": "witcert_calculus.entries",
    "tv_bounds_batch": "witcert_calculus.tv_forms",
    "tv_eform": "witcert_calculus.tv_forms",
    "tv_meter": "witcert_calculus.tv_forms",
    "tv_retention": "witcert_calculus.tv_forms",
    "tv_tanh_max": "witcert_calculus.tv_forms",
    "tv_two_sided": "witcert_calculus.tv_forms",
    "witness_contract": "witcert_calculus.bridges",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'witcert_calculus' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "Admission",
    "AdmissionError",
    "Aggregate",
    "AtConsume",
    "AtWrite",
    "AttentionOutputL2",
    "AttentionTV",
    "BudgetExceededError",
    "ByteAccount",
    "Composition",
    "Contract",
    "Decision",
    "DispersionCounterexample",
    "DitherKey",
    "DitheredKeys",
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
    "MetricAlreadyRegisteredError",
    "MetricInfo",
    "MetricMismatchError",
    "NotAMetricError",
    "Number",
    "OutOfDomainError",
    "PageInPlan",
    "PerTokenL2",
    "PerTokenMax",
    "PooledError",
    "Pooling",
    "Premise",
    "PremiseError",
    "Probability",
    "ProbabilityLike",
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
    "RopeLayout",
    "SelectorMass",
    "Site",
    "SlotRead",
    "SlotRecord",
    "SlotState",
    "SlotTable",
    "StableRows",
    "StaleReadError",
    "TVBatch",
    "TVBound",
    "TheoremExportError",
    "Tier",
    "Transfer",
    "TransferKind",
    "UnknownRequestError",
    "UnknownTheoremError",
    "UnregisteredMetricError",
    "UnwrittenSlotError",
    "ValueResidual",
    "Verdict",
    "WitcertError",
    "band_channels",
    "band_norms",
    "band_pairs",
    "band_witness",
    "block_summary",
    "byte_account",
    "certify_entries",
    "certify_step",
    "chain",
    "decide_tier",
    "delta_local",
    "dispersion_bound_unsound",
    "dither_dequantize",
    "dither_mean_offset",
    "dither_noise",
    "dither_quantize",
    "dither_variance_proxy",
    "empirical_ratio_bridge",
    "identity",
    "logit_bound",
    "logit_linf_reading",
    "metric_info",
    "metric_name",
    "output_error_bound",
    "output_error_contract",
    "page_in_order",
    "pooling",
    "rank_prefix_selection",
    "rank_prefix_stable",
    "rate_upper_bound",
    "recurrence",
    "register_metric",
    "registered_metrics",
    "score_bridge",
    "select_outlier_pairs",
    "selector_mass_eform",
    "sentinel_rounds",
    "softmax_tv_affine",
    "softmax_tv_eform",
    "softmax_tv_tanh",
    "softmax_tv_tanh_osc",
    "subgaussian_radius",
    "telescoping_delta",
    "telescoping_spent",
    "tier_b_certificate",
    "tier_b_logit_bound",
    "tradeoff_curve",
    "tv_bounds_batch",
    "tv_eform",
    "tv_meter",
    "tv_retention",
    "tv_tanh_max",
    "tv_two_sided",
    "weakest",
    "witness_contract",
]
