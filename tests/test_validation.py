"""Junk in, typed errors out: every public constructor and function of ``witcert_calculus``.

For each name the package exports, a valid call is written down once (``CASES``); hypothesis
then replaces one argument at a time with junk (text, bools, complex numbers, NaN, +-inf,
huge ints and Fractions, numpy scalars, None, lists) and requires either a result or an
error of the hierarchy (:class:`~witcert_calculus.errors.WitcertError`): never a bare
``TypeError``, ``ValueError``, ``OverflowError``, ``AttributeError`` or ``MemoryError``
from inside, and never a warning (warnings are errors in this suite).

Skipped exports, and why (``SKIPPED`` holds each name; a test checks that every export is
either called here or skipped with a reason):

- the error classes: built by the library, with free-form fields (``test_errors.py``);
- enumerations (``Tier``, ``Aggregate``, ...): ``Enum(value)`` lookup is the standard
  library's own, and the functions that take them are fuzzed instead;
- metric and site classes (``AttentionTV``, ``AtConsume``, ...): no arguments; functions
  that take them (``identity``, ``metric_info``, the bridges) are fuzzed;
- type aliases (``Evidence``, ``Number``, ``ProbabilityLike``): not callable;
- establishing types (``LogitBound``, ``DitheredKeys``, ``EvictionWitness``): only their establishing functions
  build them (a direct call is a ``ForgedBoundError`` by design); those functions are fuzzed;
- ``SlotTable``: built by a :class:`RiskLedger` with its private lock and capability;
  its read methods are reached through a ledger here;
- result records that the library builds from checked inputs and returns (``TVBound``,
  ``TVBatch``, ``TVBasis``, ``EntryAdmission``, ``EntryCertification``, ``Stage``,
  ``SymbolicChain``, ``StableRows``, ``Pooling``, ``Recurrence``, ``PageInPlan``,
  ``DispersionCounterexample``, ``ByteAccount``, ``ReadGrant``, ``SlotRead``,
  ``SlotRecord``, ``MetricInfo``, ``LedgerStats``, ``DroppedMassBatch``, ``RestorePlan``): their
  constructors are not an input
  route (the ledger records that are, ``Admission``, ``Verdict``, ``EventCounts``,
  ``EProcessState``, are fuzzed);
- ``symbolic_chain``: loads sympy (seconds), fuzzed through its one argument elsewhere
  (``test_symbolic.py``);
- ``Premise``, ``Proof``: issued only by the code that checked them (a direct call is a
  ``ForgedEvidenceError``; ``test_evidence.py``); proved inputs here come from
  ``tests/reference/issued.py``;
- ``declare``: needs a registered user Lean export (``test_user_export.py``);
- ``Schema``, ``Claim``: a theorem's registration (built by the library, or for a user
  export with its own checkers) and the record of the numbers it issues; the bridges that
  issue through them are fuzzed;
- ``registered_metrics``: takes no arguments.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import witcert_calculus as wc
from reference.issued import proof, reading
from witcert_calculus.errors import WitcertError

P = proof("WitCert.Meters.tv_eform_sound")
TV = wc.AttentionTV[wc.AtConsume]
K = wc.KeyResidualAbs[wc.AtConsume]
L = wc.LogitLinf[wc.AtConsume]
CONTRACT = wc.score_bridge(wc.AtConsume, scale=1, q_norm_max=0.5)
MEASURED = wc.Measurement("ratio on a calibration set", 64)
TO_TV = wc.softmax_tv_eform(wc.AtConsume)
KEY = wc.DitherKey(1, 0, 0)
X = np.linspace(-1.0, 1.0, 16).reshape(2, 8)
STORED = wc.dither_quantize(X, key=KEY, tokens=[0, 1], block_size=8,
                            layout=wc.RopeLayout.INTERLEAVED)
Q = np.linspace(0.5, 1.0, 8)
P2 = np.array([0.5, 0.5])
WITNESS = wc.band_witness(np.ones((2, 8)) * 0.01, bands=2, layout=wc.RopeLayout.INTERLEAVED)
LOGIT = wc.logit_bound(Q, WITNESS, layout=wc.RopeLayout.INTERLEAVED, scale=0.5)
EVICTED = wc.evict_witness(np.ones((3, 8)), np.ones((3, 2)), np.array([0, 0, 1]), blocks=2)
MASS = wc.dropped_mass_batch(np.ones((2, 8)), np.zeros((2, 4)), EVICTED, scale=0.5).worst()


@dataclass(frozen=True)
class Case:
    """A valid call: ``fn(*args, **kwargs)``."""

    fn: Callable[..., object]
    args: tuple[object, ...] = ()
    kwargs: dict[str, object] = field(default_factory=dict)


def _ledger_call(method: str, *args: object, **kwargs: object) -> object:
    led = wc.RiskLedger(n_slots=4)
    r = led.open_request(delta_req="1/100")
    led.add_sentinel("s", delta=0.01)
    led.admit_entries(r, [0.1], threshold=0.5, metric=TV, evidence=P, slots=[1])
    target: Any = led.slots if method in ("authorize", "read", "record") else led
    return getattr(target, method)(*args, **kwargs)


def _ledger(method: str) -> Callable[..., object]:
    def call(*args: object, **kwargs: object) -> object:
        return _ledger_call(method, *args, **kwargs)
    call.__name__ = f"RiskLedger.{method}"
    return call


ATT_SENS_KW: dict[str, object] = {
    "norm_slope": 0.5, "scale": 0.125, "out_norm": 2.0, "wq": [1.0], "wk": [1.0], "wv": [1.0],
    "q_norm": [4.0], "key_radius": [2.0], "value_norm": [3.0]}
MLP_SENS_KW: dict[str, object] = {
    "norm_slope": 0.5, "down_norm": 2.0, "gate_norm": 2.0, "up_norm": 2.0, "up_max": 1.0,
    "act_max": 1.0, "gate_reach": 10.0}

CASES: dict[str, Case] = {
    "Admission": Case(wc.Admission, (1, 0, wc.EventKind.DETERMINISTIC, wc.Decision.USE,
                                     wc.Tier.CERTIFIED, Fraction(0), Fraction(0), None, None)),
    "Assumption": Case(wc.Assumption, ("queries are non-adaptive", "not observable")),
    "Composition": Case(wc.Composition, ((P, P),)),
    "Contract": Case(wc.Contract, (K, L), {"a": 0.5, "b": 0, "evidence": MEASURED,
                                           "name": "s", "delta": 0, "cap": 1.0}),
    "Contract.bound": Case(CONTRACT.bound, (0.2,)),
    "Contract.bound(tv)": Case(TO_TV.bound, (0.05,)),
    "DitherKey": Case(wc.DitherKey, (1, 0, 0)),
    "EDetector": Case(wc.EDetector, (), {"alpha": 0.01, "kappa": 0.5}),
    "EProcess": Case(wc.EProcess, (), {"delta": 0.01, "kappa": 0.5}),
    "EProcess.observe": Case(lambda w, *, m, c: wc.EProcess(delta=0.01).observe(w, m=m, c=c),
                             (0.2,), {"m": 0.1, "c": 1.0}),
    "EProcessState": Case(wc.EProcessState, (0.5, 0.01, 0.0, 0.0, 2, None)),
    "EventCounts": Case(wc.EventCounts, (1, 2, 0, 0, 0)),
    "Measurement": Case(wc.Measurement, ("median ratio", 3, (("k", "v"),))),

    "Probability": Case(wc.Probability, (Fraction(1, 100),)),
    "Probability.of": Case(wc.Probability.of, ("1/100",)),
    "Probability.budget": Case(wc.Probability.budget, (0.01,)),

    "Reading": Case(wc.Reading, (TV, 0.1, MEASURED), {"delta": 0,
                                                      "regime": wc.Regime.MEASURED}),
    "Restricted": Case(wc.Restricted, (P, "e_in <= 1")),
    "RiskLedger": Case(wc.RiskLedger, (), {"n_slots": 4, "busy_timeout_s": 1.0}),
    "RiskLedger.open_request": Case(_ledger("open_request"), (), {"delta_req": "1/100",
                                                                  "request_id": 5}),
    "RiskLedger.admit": Case(_ledger("admit"), (1, reading(TV, 0.1, evidence=P))),
    "RiskLedger.admit_entries": Case(_ledger("admit_entries"), (1, [0.1, 0.2]), {
        "threshold": 0.5, "metric": TV, "evidence": P, "delta": 0, "slots": [2, 3]}),
    "RiskLedger.observe": Case(_ledger("observe"), ("s", [0.2]), {"m": 0.1, "c": 1.0}),
    "RiskLedger.add_sentinel": Case(_ledger("add_sentinel"), ("t",), {"delta": 0.01,
                                                                     "kappa": 0.5}),
    "RiskLedger.close_request": Case(_ledger("close_request"), (1,)),
    "RiskLedger.verdict": Case(_ledger("verdict"), (1,)),
    "RiskLedger.slots.authorize": Case(_ledger("authorize"), (1, 1)),
    "RiskLedger.slots.read": Case(_ledger("read"), (wc.ReadGrant(1, 1, 1, 1),)),
    "RiskLedger.slots.record": Case(_ledger("record"), (1,)),
    "RiskLedger.evict": Case(_ledger("evict"), (1, [1])),
    "RiskLedger.next_allowance": Case(_ledger("next_allowance"), (1,)),
    "Transfer": Case(wc.Transfer, (wc.TransferKind.TANH, Fraction(1, 2))),
    "Transfer.__call__": Case(wc.Transfer(wc.TransferKind.EXP_TV), (0.1,)),
    "Verdict": Case(wc.Verdict, (1, wc.Tier.CERTIFIED, Fraction(1, 100), Fraction(0),
                                 wc.EventCounts(deterministic=1), 0, 0, None, 0, 0, 0.0,
                                 False)),
    "assumptions_of": Case(wc.assumptions_of, (P,)),
    "band_channels": Case(wc.band_channels, (8,), {"bands": 2,
                                                   "layout": wc.RopeLayout.HALF_SPLIT}),
    "band_norms": Case(wc.band_norms, (Q,), {"bands": 2, "layout": wc.RopeLayout.INTERLEAVED}),
    "band_pairs": Case(wc.band_pairs, (8,), {"bands": 2}),
    "band_witness": Case(wc.band_witness, (np.ones(8),), {
        "bands": 2, "layout": wc.RopeLayout.INTERLEAVED, "dtype": np.float16}),
    "block_summary": Case(wc.block_summary, (np.full(4, 0.25), np.zeros(4)), {"block_size": 2}),
    "byte_account": Case(wc.byte_account, (8,), {"block_size": 8, "outlier_pairs": 1,
                                                 "tokens": 4, "key_bytes": 2}),
    "certify_entries": Case(wc.certify_entries, ([0.1, 0.2],), {
        "threshold": 0.5, "aggregate": wc.Aggregate.SUM, "saturation": 1.0}),
    "certify_step": Case(wc.certify_step, ([0.1, 0.2],), {"threshold": 0.5,
                                                          "saturation": 1.0}),
    "chain": Case(wc.chain, (wc.witness_contract(wc.AtConsume, witness_max=0.1),
                             wc.score_bridge(wc.AtConsume, scale=0.5, q_norm_max=1))),
    "decide_tier": Case(wc.decide_tier, (P,), {"value": 0.5, "saturation": 1.0}),
    "decompression_bridge": Case(wc.decompression_bridge, (wc.AtConsume,), {
        "row_norm_max": 2.0}),
    "delta_local": Case(wc.delta_local, (0.01,), {"layers": 2, "heads": 2, "steps": 2}),
    "dispersion_bound_unsound": Case(wc.dispersion_bound_unsound, (P2, [0.1, 0.2])),
    "dither_dequantize": Case(wc.dither_dequantize, (STORED,)),
    "dither_mean_offset": Case(wc.dither_mean_offset, (Q, STORED), {"scale": 0.5}),
    "dither_noise": Case(wc.dither_noise, (KEY, [0, 1]), {"head_dim": 8}),
    "dither_quantize": Case(wc.dither_quantize, (X,), {
        "key": KEY, "tokens": [0, 1], "block_size": 8, "layout": wc.RopeLayout.INTERLEAVED,
        "outlier_pairs": (), "exclude_outliers_from_amax": True}),
    "dither_variance_proxy": Case(wc.dither_variance_proxy, (Q, STORED), {"scale": 0.5}),
    "empirical_ratio_bridge": Case(wc.empirical_ratio_bridge, (TV, TV), {
        "ratio": 1.5, "samples": 10, "statistic": "median", "set_type": "top-64"}),
    "format_logit_bound": Case(wc.format_logit_bound, (Q, np.full((2, 8), 0.01)), {"scale": 0.5}),
    "format_witness": Case(wc.format_witness, ([1, 2],), {
        "fmt": wc.Fp8Format.E4M3, "rounding": wc.Rounding.NEAREST, "scale": 0.5}),
    "gate_bound": Case(wc.gate_bound, (0.1,), {"form": "eform"}),
    "gate_form": Case(wc.gate_form, ("eform",)),
    "gate_threshold": Case(wc.gate_threshold, (0.1,), {"form": "eform"}),
    "identity": Case(wc.identity, (TV,)),
    "is_established": Case(wc.is_established, (LOGIT,)),
    "latent_witness_contract": Case(wc.latent_witness_contract, (wc.AtConsume,), {
        "witness_max": 0.1}),
    "logit_bound": Case(wc.logit_bound, (Q, WITNESS), {"layout": wc.RopeLayout.INTERLEAVED,
                                                       "scale": 0.5}),
    "logit_linf_reading": Case(wc.logit_linf_reading, (LOGIT,)),
    "metric_info": Case(wc.metric_info, (TV,)),
    "metric_name": Case(wc.metric_name, (TV,)),
    "output_error_bound": Case(wc.output_error_bound, (0.1,), {
        "value_norm_max": 2.0, "p_tilde": P2, "rho": [0.1, 0.1]}),
    "output_error_contract": Case(wc.output_error_contract, (), {
        "value_norm_max": 2.0, "p_tilde": P2, "rho": [0.1, 0.1]}),
    "page_in_order": Case(wc.page_in_order, ([0.5, 0.5], [0.1, 0.2]), {"threshold": 0.1}),
    "pooling": Case(wc.pooling, (wc.AtConsume,), {"weights": [0.5, 0.5]}),
    "rank_prefix_selection": Case(wc.rank_prefix_selection, (wc.AtConsume,), {
        "m_out": 0.1, "m_in": 0.9}),
    "rank_prefix_stable": Case(wc.rank_prefix_stable, ([[3.0, 2.0, 1.0]],), {"k": 1,
                                                                            "eps": 0.1}),
    "rate_upper_bound": Case(wc.rate_upper_bound, (100, 0.05)),
    "rate_upper_bound_exact": Case(wc.rate_upper_bound_exact, (100, 0.05)),
    "recurrence": Case(wc.recurrence, (wc.AtConsume,), {"a_steps": [0.5, 0.5],
                                                        "b_steps": [0.1, 0.1]}),
    "register_metric": Case(wc.register_metric, (), {"unit": "bits", "meaning": "excess",
                                                     "lo": 0.0, "hi": 10.0,
                                                     "saturation": 5.0}),
    "score_bridge": Case(wc.score_bridge, (wc.AtConsume,), {"scale": 0.5, "q_norm_max": 2}),
    "select_outlier_pairs": Case(wc.select_outlier_pairs, (X,), {
        "count": 1, "layout": wc.RopeLayout.INTERLEAVED}),
    "selector_mass_eform": Case(wc.selector_mass_eform, (wc.AtConsume,)),
    "sentinel_rounds": Case(wc.sentinel_rounds, (1, 100, 4, 0.01)),
    "softmax_tv_affine": Case(wc.softmax_tv_affine, (wc.AtConsume,), {"eps0": 0.5}),
    "softmax_tv_eform": Case(wc.softmax_tv_eform, (wc.AtConsume,)),
    "softmax_tv_tanh": Case(wc.softmax_tv_tanh, (wc.AtConsume,)),
    "softmax_tv_tanh_osc": Case(wc.softmax_tv_tanh_osc, (wc.AtConsume,)),
    "subgaussian_radius": Case(wc.subgaussian_radius, ([0.1, 0.2],), {"delta_loc": 0.01,
                                                                      "tokens": 2}),
    "telescoping_delta": Case(wc.telescoping_delta, (2, "1/100")),
    "telescoping_spent": Case(wc.telescoping_spent, (2, "1/100")),
    "tier_b_certificate": Case(wc.tier_b_certificate, (P2, Q, STORED), {
        "scale": 0.5, "delta_loc": 0.01}),
    "tier_b_logit_bound": Case(wc.tier_b_logit_bound, (Q, STORED), {
        "scale": 0.5, "delta_loc": 0.01, "tokens": 2}),
    "tighter": Case(wc.tighter, (LOGIT, LOGIT)),
    "tradeoff_curve": Case(wc.tradeoff_curve, ([[0.1, 0.2]],), {"thresholds": [0.1, 0.5],
                                                                 "saturation": 1.0}),
    "tv_bounds_batch": Case(wc.tv_bounds_batch, ([P2], [[0.1, 0.2]]), {"visible": [2]}),
    "tv_eform": Case(wc.tv_eform, (P2, [0.1, 0.2])),
    "tv_meter": Case(wc.tv_meter, (P2, [0.1, 0.2])),
    "tv_retention": Case(wc.tv_retention, (P2, [0.1, 0.2])),
    "tv_tanh_max": Case(wc.tv_tanh_max, ([0.1, 0.2],)),
    "tv_two_sided": Case(wc.tv_two_sided, (P2, [0.1, 0.2])),
    "weakest": Case(wc.weakest, (wc.Tier.CERTIFIED, wc.Tier.EMPIRICAL)),
    "evict_witness": Case(wc.evict_witness, (np.ones((3, 8)), np.ones((3, 2)),
                                             np.array([0, 0, 1])), {"blocks": 2}),
    "dropped_mass_batch": Case(wc.dropped_mass_batch, (np.ones((2, 8)), np.zeros((2, 4)),
                                                       EVICTED), {"scale": 0.5}),
    "eviction_output_bound": Case(wc.eviction_output_bound, (0.1,), {
        "value_norm_max": 2.0, "kept_output_norm": 1.0}),
    "restore_order": Case(wc.restore_order, ([0.0, 1.0], 0.0), {"threshold": 0.5}),
    "combined_tv": Case(wc.combined_tv, (MASS, wc.tv_eform(P2, [0.1, 0.2]).reading())),
    "dropped_mass_tv": Case(wc.dropped_mass_tv, (wc.AtConsume,)),
    "AttentionSensitivity": Case(wc.AttentionSensitivity, (), ATT_SENS_KW),
    "MlpSensitivity": Case(wc.MlpSensitivity, (), MLP_SENS_KW),
    "HeadSensitivity": Case(wc.HeadSensitivity, (), {"norm_slope": 0.5, "row_radius": 2.0}),
    "attention_sublayer": Case(wc.attention_sublayer, (wc.AtConsume,
                                                       wc.AttentionSensitivity(**ATT_SENS_KW))),
    "mlp_sublayer": Case(wc.mlp_sublayer, (wc.AtConsume, wc.MlpSensitivity(**MLP_SENS_KW))),
    "next_token_head": Case(wc.next_token_head, (wc.AtConsume, wc.HeadSensitivity(
        norm_slope=0.5, row_radius=2.0))),
    "output_projection": Case(wc.output_projection, (wc.AtConsume,), {"out_norm": 2.0}),
    "op_norm_upper": Case(wc.op_norm_upper, ([[1.0, 2.0], [3.0, 4.0]],)),
    "rms_slope": Case(wc.rms_slope, ([1.0, 2.0],), {"gain_max": 1.0, "eps": 1e-6}),
    "RateBound": Case(wc.RateBound, (), {"alpha": 0.05}),
    "RateState": Case(wc.RateState, (3, 1, 0.5)),
    "witness_contract": Case(wc.witness_contract, (wc.AtConsume,), {"witness_max": 0.1}),
    "witness_table": Case(wc.witness_table, (wc.Fp8Format.E4M3, wc.Rounding.NEAREST), {
        "scale": 0.5}),
}

#: Exports not called here, each with its reason in the module docstring.
SKIPPED: frozenset[str] = frozenset({
    "AtConsume", "AtWrite", "AttentionOutputL2", "AttentionTV", "KeyResidualAbs",
    "KeyResidualRel", "LatentResidual", "LogitLinf", "LogitOsc", "Metric", "PerTokenL2",
    "PerTokenMax", "PooledError", "RecurrentStateError", "SelectorMass", "Site", "DroppedMass",
    "NextTokenTV", "ResidualL2",
    "ValueResidual",  # metric and site classes
    "Aggregate", "Decision", "EmpiricalPolicy", "EventKind", "Fp8Format", "GateForm",
    "Regime", "RopeLayout", "Rounding", "SlotState", "Tier", "TransferKind",  # enums
    "Evidence", "Number", "ProbabilityLike",  # type aliases
    "LogitBound", "DitheredKeys", "EvictionWitness",  # establishing types
    "SlotTable",  # built by a ledger
    "TVBound", "TVBatch", "TVBasis", "EntryAdmission", "EntryCertification", "Stage",
    "SymbolicChain", "StableRows", "Pooling", "Recurrence", "PageInPlan",
    "DispersionCounterexample", "ByteAccount", "ReadGrant", "SlotRead", "SlotRecord",
    "MetricInfo", "LedgerStats", "DroppedMassBatch", "RestorePlan",  # result records
    "symbolic_chain", "registered_metrics",
    "Premise", "Proof",  # issued by the code that checked them (test_evidence.py)
    "declare",  # needs a registered user export (test_user_export.py)
    "Schema", "Claim",  # a theorem's registration and the numbers it issues
})

JUNK = st.one_of(
    st.text(max_size=4),
    st.sampled_from(["0.1", "1/100", "nan", "inf", ""]),
    st.booleans(),
    st.complex_numbers(max_magnitude=10),
    st.sampled_from([math.nan, math.inf, -math.inf, -1.0, 0.0, 1e308, -1e308, 5e-324]),
    st.floats(),
    st.integers(-(2**70), 2**70),
    st.sampled_from([10**400, -(10**400), 2**63, 2**63 - 1, 0, -1, Fraction(10**400),
                     Fraction(1, 10**400)]),
    st.sampled_from([np.int64(3), np.int64(-1), np.float32(0.5), np.float64(math.nan),
                     np.float64(math.inf), np.bool_(True), np.complex128(1j), np.uint8(7)]),
    st.none(),
    st.lists(st.one_of(st.floats(), st.text(max_size=2), st.booleans()), max_size=3),
    st.sampled_from([[1j, 2j], np.array([1 + 1j]), np.array(["a"]), np.array([True]),
                     [[0.1], [0.2, 0.3]], object()]),
)

#: Parameters whose junk would touch the disk (a text journal is a file path).
NOT_FUZZED: dict[str, frozenset[str]] = {"RiskLedger": frozenset({"journal"})}


def _slots(case: Case) -> list[int | str]:
    return list(range(len(case.args))) + list(case.kwargs)


def test_every_export_is_called_or_skipped_with_a_reason() -> None:
    exported = {n for n in wc.__all__
                if not (isinstance(getattr(wc, n), type)
                        and issubclass(getattr(wc, n), BaseException))}
    called = {name.split(".")[0].split("(")[0] for name in CASES}
    assert exported - called - SKIPPED == set()
    assert SKIPPED & called == set()


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_valid_call_works(name: str) -> None:
    case = CASES[name]
    case.fn(*case.args, **case.kwargs)


@pytest.mark.parametrize("name", sorted(CASES))
@settings(max_examples=24, deadline=None)
@given(data=st.data())
def test_junk_is_refused_by_a_typed_error(name: str, data: st.DataObject) -> None:
    case = CASES[name]
    slot = data.draw(st.sampled_from(_slots(case)), label="argument")
    junk = data.draw(JUNK, label="junk")
    args = list(case.args)
    kwargs = dict(case.kwargs)
    if isinstance(slot, int):
        args[slot] = junk
    else:
        kwargs[slot] = junk
    try:
        case.fn(*args, **kwargs)
    except WitcertError:
        pass
