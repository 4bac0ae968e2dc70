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
- meters: :func:`band_witness`, :func:`logit_bound`, :func:`tv_meter`, :func:`tv_eform`, ...

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
    from witcert_calculus.meters import (
        ByteAccount,
        DispersionCounterexample,
        DitherKey,
        DitheredKeys,
        PageInPlan,
        RopeLayout,
        TVBatch,
        TVBound,
        band_channels,
        band_norms,
        band_pairs,
        band_witness,
        block_summary,
        byte_account,
        delta_local,
        dispersion_bound_unsound,
        dither_dequantize,
        dither_mean_offset,
        dither_noise,
        dither_quantize,
        dither_variance_proxy,
        logit_bound,
        logit_linf_reading,
        output_error_bound,
        output_error_contract,
        page_in_order,
        rate_upper_bound,
        select_outlier_pairs,
        sentinel_rounds,
        subgaussian_radius,
        tier_b_certificate,
        tv_bounds_batch,
        tv_eform,
        tv_meter,
        tv_retention,
        tv_tanh_max,
        tv_two_sided,
    )

_LAZY_MODULES = ("witcert_calculus.bridges", "witcert_calculus.ledger", "witcert_calculus.meters")


def __getattr__(name: str) -> Any:
    # Names of the heavy modules load on first use (PEP 562).
    if name in __all__:
        for module in _LAZY_MODULES:
            mod = importlib.import_module(module)
            if name in mod.__all__:
                value = getattr(mod, name)
                globals()[name] = value
                return value
    raise AttributeError(f"module 'witcert_calculus' has no attribute {name!r}")


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
    "Tier",
    "Transfer",
    "TransferKind",
    "UnknownRequestError",
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
