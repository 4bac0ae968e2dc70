"""Every Lean theorem that the Python code cites, named once.

Each constant is the fully qualified name of a theorem of the Lean development under
``formal/WitCert``; ``tests/test_formal.py`` checks each against what the Lean build
exports. Modules cite these constants and never type a theorem name again.

The registry of citable theorems is append-only: the export of the Lean build shipped
with the package (``lean_export.json``, name, module and statement of every theorem), plus
the exports of the user's own Lake projects registered with :func:`register_theorems`. A
:class:`~witcert_calculus.tiers.Proof` citing a name that no export holds is refused.

Main declarations:

- one ``Final`` string per theorem, grouped by Lean module;
- :class:`TheoremRecord`, :func:`lookup`, :func:`cited_theorems`, :func:`register_theorems`,
  :func:`registered_theorems`, :data:`BUILTIN_ORIGIN`.

Each record carries the statement Lean elaborated (``lookup(COMP_SOUND).statement``) and the
axioms Lean listed for it (``lookup(COMP_SOUND).axioms``). The
statements of the shipped export are also committed in ``formal/statements.lock.json``;
``tests/test_formal_lock.py`` fails when the export, this registry and the lock disagree
(regenerate the lock deliberately with ``python scripts/statement_lock.py --update``).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Final, cast, final

from witcert_calculus.errors import TheoremExportError, UnknownTheoremError

__all__ = [
    "ABS_SUB_LE_OF_MUL_SELF_EQ",
    "ADD_SOUND",
    "ATTN_QUERY_STEP_LE",
    "BET_FACTOR_MEAN_LE_ONE",
    "BET_FACTOR_MONO",
    "BET_FACTOR_MONO_DIV",
    "BET_FACTOR_NONNEG",
    "BOX_LOGIT_BOUND_METER_SOUND",
    "BUILTIN_ORIGIN",
    "COMP_SOUND",
    "CONFOUNDED_PAIR_UNIDENTIFIED",
    "CONTROLLED_PAIR_ATTRIBUTES",
    "COORD_SQ_LE_SUM",
    "DECIDE_SATURATED_NE_CERTIFIED",
    "DECOMPRESSION_CONTRACT_SOUND",
    "DITHER_TIER_B_PROB_BAD",
    "DITHER_TIER_B_TOKEN_SOUND",
    "DIV_ADD_LE_DIV_ADD",
    "DROPPED_MASS_LE_BLOCKS",
    "DROPPED_MASS_LE_WITNESS",
    "DROPPED_MASS_SOFTMAX_EQ",
    "ENTRY_FALLBACK_CONTRACT_SOUND",
    "ENTRY_FALLBACK_MAX_SOUND",
    "EVICT_QUANT_BLOCKS_METER_SOUND",
    "EVICT_QUANT_METER_SOUND",
    "EVICT_QUANT_TV_LE",
    "EVICT_QUANT_TV_LE_BLOCKS",
    "EVICT_TV_BLOCKS_METER_SOUND",
    "EVICT_TV_METER_EQ",
    "EVICT_TV_METER_SOUND",
    "EVICT_TV_RESTORE_METER_LE",
    "FORMAT_RESIDUAL_LE",
    "GLU_STEP_LE",
    "GRID_MGF_LE",
    "HADAMARD_SQ_LE",
    "ID_SOUND",
    "LE_WEAKEST",
    "LIPSCHITZ_COMP_LE",
    "LIPSCHITZ_SQ_LE",
    "LOGIT_BOUND_METER_SOUND",
    "MIN_BOUND_SOUND",
    "MIXTURE_MEAN_LE_ONE",
    "NEAREST_RESIDUAL_LE",
    "NEXT_TOKEN_CONTRACT_SOUND",
    "NEXT_TOKEN_TV_LE",
    "NORM_SMUL_INV_SUB_LE",
    "ONE_SUB_POW_LE_EXP",
    "OUTPUT_ERROR_CONTRACT_AT",
    "OUTPUT_EVICT_ERROR_LE",
    "OUTPUT_PROJECTION_CONTRACT_SOUND",
    "PAGE_IN_DECREASE",
    "POOLING_L2_CONTRACT_SOUND",
    "POOLING_MAX_CONTRACT_SOUND",
    "RANK_PREFIX_SELECTION_CONTRACT_SOUND",
    "RANK_PREFIX_STABLE",
    "RATE_UPPER_BOUND_SOUND",
    "RECURRENCE_CONTRACT_SOUND",
    "RECURRENCE_PROB_BAD_LT_BUDGET",
    "RESIDUAL_STEP_CONTRACT_SOUND",
    "RESIDUAL_STEP_LE",
    "RESTORE_BLOCK_BOUND_LE",
    "RESTORE_BOUND_LE",
    "RESTRICT_SOFTMAX_EQ",
    "RMS_NORMALIZE_LIPSCHITZ",
    "SAMPLING_MISS_PROBABILITY",
    "SCORE_BRIDGE_CONTRACT_SOUND",
    "SELECTOR_MASS_EFORM_CONTRACT_SOUND",
    "SENTINEL_ROUNDS_SOUND",
    "SERVED_MAP_LE",
    "SOFTMAX_TV_AFFINE_CONTRACT_SOUND",
    "SOFTMAX_TV_EFORM_CONTRACT_SOUND",
    "SOFTMAX_TV_LE_TANH_SHIFT",
    "SOFTMAX_TV_TANH_CONTRACT_SOUND",
    "SOFTMAX_TV_TANH_OSC_CONTRACT_SOUND",
    "TANHE_LE_ONE",
    "TANHE_LE_TWO_MUL",
    "TELESCOPE_PARTIAL_LT",
    "TELESCOPE_SUM_EQ",
    "TRUNC_RESIDUAL_LE",
    "TV_COND_DROP_EQ_TV_FILTER",
    "TV_EFORM_METER_SOUND",
    "TV_KEPT_LE_ONE",
    "TV_RESTRICT_EQ_DROPPED_MASS",
    "TV_RETENTION_METER_SOUND",
    "TV_SINGLE_TOKEN_METER",
    "TV_SOFTMAX_KEPT_EQ",
    "TV_TRIANGLE",
    "TV_TWO_SIDED_METER_SOUND",
    "TWO_LAYER_BUDGET",
    "TheoremRecord",
    "VILLE_FINITE_TREE",
    "WEAKEST_ASSOC",
    "WEAKEST_COMM",
    "WEAKEST_IDEM",
    "WEAKEST_LE_LEFT",
    "WEAKEST_LE_RIGHT",
    "WITNESS_CONTRACT_SOUND",
    "WITNESS_MASS_LE_BLOCKS",
    "cited_theorems",
    "lookup",
    "register_theorems",
    "registered_theorems",
]

# ----------------------------------------------------------------------------- Analytic

ONE_SUB_POW_LE_EXP: Final = "WitCert.Analytic.one_sub_pow_le_exp"

# ----------------------------------------------------------------------------- Audit
# Betting factors of the anytime-valid upper confidence bound on a rate (with
# ville_finite_tree).

BET_FACTOR_MEAN_LE_ONE: Final = "WitCert.Audit.bet_factor_mean_le_one"
BET_FACTOR_MONO: Final = "WitCert.Audit.bet_factor_mono"
BET_FACTOR_MONO_DIV: Final = "WitCert.Audit.bet_factor_mono_div"
BET_FACTOR_NONNEG: Final = "WitCert.Audit.bet_factor_nonneg"
MIXTURE_MEAN_LE_ONE: Final = "WitCert.Audit.mixture_mean_le_one"

# ----------------------------------------------------------------------------- Bridges

RANK_PREFIX_STABLE: Final = "WitCert.Bridges.rank_prefix_stable"

# ----------------------------------------------------------------------------- Contract

ADD_SOUND: Final = "WitCert.Contract.add_sound"

# ----------------------------------------------------------------------------- Depth
# One pre-norm layer: RMSNorm, residual connections, attention with the query perturbed, the
# gated MLP, and the next-token head.

ABS_SUB_LE_OF_MUL_SELF_EQ: Final = "WitCert.Depth.abs_sub_le_of_mul_self_eq"
ATTN_QUERY_STEP_LE: Final = "WitCert.Depth.attn_query_step_le"
COORD_SQ_LE_SUM: Final = "WitCert.Depth.coord_sq_le_sum"
GLU_STEP_LE: Final = "WitCert.Depth.glu_step_le"
HADAMARD_SQ_LE: Final = "WitCert.Depth.hadamard_sq_le"
LIPSCHITZ_COMP_LE: Final = "WitCert.Depth.lipschitz_comp_le"
LIPSCHITZ_SQ_LE: Final = "WitCert.Depth.lipschitz_sq_le"
NEXT_TOKEN_TV_LE: Final = "WitCert.Depth.next_token_tv_le"
NORM_SMUL_INV_SUB_LE: Final = "WitCert.Depth.norm_smul_inv_sub_le"
RESIDUAL_STEP_LE: Final = "WitCert.Depth.residual_step_le"
RMS_NORMALIZE_LIPSCHITZ: Final = "WitCert.Depth.rms_normalize_lipschitz"
SERVED_MAP_LE: Final = "WitCert.Depth.served_map_le"
SOFTMAX_TV_LE_TANH_SHIFT: Final = "WitCert.Depth.softmax_tv_le_tanh_shift"
TANHE_LE_ONE: Final = "WitCert.Depth.tanhE_le_one"
TANHE_LE_TWO_MUL: Final = "WitCert.Depth.tanhE_le_two_mul"

# ----------------------------------------------------------------------------- Dither

GRID_MGF_LE: Final = "WitCert.Dither.grid_mgf_le"

# ----------------------------------------------------------------------------- Eviction
# Token eviction: the TV cost of dropping tokens is their mass, its witness bounds, the output;
# eviction with compressed kept keys (triangle inequality); restoring blocks keeps the bound.

DIV_ADD_LE_DIV_ADD: Final = "WitCert.Eviction.div_add_le_div_add"
DROPPED_MASS_LE_BLOCKS: Final = "WitCert.Eviction.dropped_mass_le_blocks"
DROPPED_MASS_LE_WITNESS: Final = "WitCert.Eviction.dropped_mass_le_witness"
DROPPED_MASS_SOFTMAX_EQ: Final = "WitCert.Eviction.dropped_mass_softmax_eq"
EVICT_QUANT_TV_LE: Final = "WitCert.Eviction.evict_quant_tv_le"
EVICT_QUANT_TV_LE_BLOCKS: Final = "WitCert.Eviction.evict_quant_tv_le_blocks"
OUTPUT_EVICT_ERROR_LE: Final = "WitCert.Eviction.output_evict_error_le"
RESTORE_BLOCK_BOUND_LE: Final = "WitCert.Eviction.restore_block_bound_le"
RESTORE_BOUND_LE: Final = "WitCert.Eviction.restore_bound_le"
RESTRICT_SOFTMAX_EQ: Final = "WitCert.Eviction.restrict_softmax_eq"
TV_COND_DROP_EQ_TV_FILTER: Final = "WitCert.Eviction.tv_cond_drop_eq_tv_filter"
TV_KEPT_LE_ONE: Final = "WitCert.Eviction.tv_kept_le_one"
TV_RESTRICT_EQ_DROPPED_MASS: Final = "WitCert.Eviction.tv_restrict_eq_dropped_mass"
TV_SOFTMAX_KEPT_EQ: Final = "WitCert.Eviction.tv_softmax_kept_eq"
TV_TRIANGLE: Final = "WitCert.Eviction.tv_triangle"
WITNESS_MASS_LE_BLOCKS: Final = "WitCert.Eviction.witness_mass_le_blocks"

# ----------------------------------------------------------------------------- Formats

FORMAT_RESIDUAL_LE: Final = "WitCert.Formats.format_residual_le"
MIN_BOUND_SOUND: Final = "WitCert.Formats.min_bound_sound"
NEAREST_RESIDUAL_LE: Final = "WitCert.Formats.nearest_residual_le"
TRUNC_RESIDUAL_LE: Final = "WitCert.Formats.trunc_residual_le"

# ----------------------------------------------------------------------------- Ledger

ENTRY_FALLBACK_MAX_SOUND: Final = "WitCert.Ledger.entry_fallback_max_sound"
TELESCOPE_PARTIAL_LT: Final = "WitCert.Ledger.telescope_partial_lt"
TELESCOPE_SUM_EQ: Final = "WitCert.Ledger.telescope_sum_eq"
TWO_LAYER_BUDGET: Final = "WitCert.Ledger.two_layer_budget"
VILLE_FINITE_TREE: Final = "WitCert.Ledger.ville_finite_tree"

# ----------------------------------------------------------------------------- Meters

PAGE_IN_DECREASE: Final = "WitCert.Meters.page_in_decrease"
RATE_UPPER_BOUND_SOUND: Final = "WitCert.Meters.rate_upper_bound_sound"
SENTINEL_ROUNDS_SOUND: Final = "WitCert.Meters.sentinel_rounds_sound"

# ----------------------------------------------------------------------------- Sampling

SAMPLING_MISS_PROBABILITY: Final = "WitCert.Sampling.miss_probability_eq"

# ----------------------------------------------------------------------------- Semantic
# The semantic contracts (exact and approximate maps, failure event, soundness field) that the
# bridges and meters certify with.

BOX_LOGIT_BOUND_METER_SOUND: Final = "WitCert.Semantic.box_logit_bound_meter_sound"
COMP_SOUND: Final = "WitCert.Semantic.Contract.comp_sound"
DECOMPRESSION_CONTRACT_SOUND: Final = "WitCert.Semantic.decompression_contract_sound"
DITHER_TIER_B_PROB_BAD: Final = "WitCert.Semantic.dither_tier_b_prob_bad"
DITHER_TIER_B_TOKEN_SOUND: Final = "WitCert.Semantic.dither_tier_b_token_sound"
ENTRY_FALLBACK_CONTRACT_SOUND: Final = "WitCert.Semantic.entry_fallback_contract_sound"
EVICT_QUANT_BLOCKS_METER_SOUND: Final = "WitCert.Semantic.evict_quant_blocks_meter_sound"
EVICT_QUANT_METER_SOUND: Final = "WitCert.Semantic.evict_quant_meter_sound"
EVICT_TV_BLOCKS_METER_SOUND: Final = "WitCert.Semantic.evict_tv_blocks_meter_sound"
EVICT_TV_METER_EQ: Final = "WitCert.Semantic.evict_tv_meter_eq"
EVICT_TV_METER_SOUND: Final = "WitCert.Semantic.evict_tv_meter_sound"
EVICT_TV_RESTORE_METER_LE: Final = "WitCert.Semantic.evict_tv_restore_meter_le"
ID_SOUND: Final = "WitCert.Semantic.Contract.id_sound"
LOGIT_BOUND_METER_SOUND: Final = "WitCert.Semantic.logit_bound_norms_meter_sound"
NEXT_TOKEN_CONTRACT_SOUND: Final = "WitCert.Semantic.next_token_contract_sound"
OUTPUT_ERROR_CONTRACT_AT: Final = "WitCert.Semantic.output_error_contract_at"
OUTPUT_PROJECTION_CONTRACT_SOUND: Final = "WitCert.Semantic.output_projection_contract_sound"
POOLING_L2_CONTRACT_SOUND: Final = "WitCert.Semantic.pooling_l2_contract_sound"
POOLING_MAX_CONTRACT_SOUND: Final = "WitCert.Semantic.pooling_max_contract_sound"
RANK_PREFIX_SELECTION_CONTRACT_SOUND: Final = "WitCert.Semantic.rank_prefix_selection_contract_sound"
RECURRENCE_CONTRACT_SOUND: Final = "WitCert.Semantic.Contract.recurrence_sound"
RECURRENCE_PROB_BAD_LT_BUDGET: Final = "WitCert.Semantic.recurrence_prob_bad_lt_budget"
RESIDUAL_STEP_CONTRACT_SOUND: Final = "WitCert.Semantic.residual_step_contract_sound"
SCORE_BRIDGE_CONTRACT_SOUND: Final = "WitCert.Semantic.score_bridge_contract_sound"
SELECTOR_MASS_EFORM_CONTRACT_SOUND: Final = "WitCert.Semantic.selector_mass_eform_contract_sound"
SOFTMAX_TV_AFFINE_CONTRACT_SOUND: Final = "WitCert.Semantic.softmax_tv_affine_contract_sound"
SOFTMAX_TV_EFORM_CONTRACT_SOUND: Final = "WitCert.Semantic.softmax_tv_eform_contract_sound"
SOFTMAX_TV_TANH_CONTRACT_SOUND: Final = "WitCert.Semantic.softmax_tv_tanh_contract_sound"
SOFTMAX_TV_TANH_OSC_CONTRACT_SOUND: Final = "WitCert.Semantic.softmax_tv_tanh_osc_contract_sound"
TV_EFORM_METER_SOUND: Final = "WitCert.Semantic.tv_eform_meter_sound"
TV_RETENTION_METER_SOUND: Final = "WitCert.Semantic.tv_retention_meter_sound"
TV_SINGLE_TOKEN_METER: Final = "WitCert.Semantic.tv_single_token_meter"
TV_TWO_SIDED_METER_SOUND: Final = "WitCert.Semantic.tv_two_sided_meter_sound"
WITNESS_CONTRACT_SOUND: Final = "WitCert.Semantic.witness_contract_sound"

# ----------------------------------------------------------------------------- Diagnosis

CONFOUNDED_PAIR_UNIDENTIFIED: Final = "WitCert.Diagnosis.confounded_pair_unidentified"
CONTROLLED_PAIR_ATTRIBUTES: Final = "WitCert.Diagnosis.controlled_pair_attributes"

# ----------------------------------------------------------------------------- Tier

DECIDE_SATURATED_NE_CERTIFIED: Final = "WitCert.Tier.decide_saturated_ne_certified"
LE_WEAKEST: Final = "WitCert.Tier.le_weakest"
WEAKEST_ASSOC: Final = "WitCert.Tier.weakest_assoc"
WEAKEST_COMM: Final = "WitCert.Tier.weakest_comm"
WEAKEST_IDEM: Final = "WitCert.Tier.weakest_idem"
WEAKEST_LE_LEFT: Final = "WitCert.Tier.weakest_le_left"
WEAKEST_LE_RIGHT: Final = "WitCert.Tier.weakest_le_right"


# ----------------------------------------------------------------------------- registry

# The theorem names above, sorted (what cited_theorems lists).
_CITED: Final[tuple[str, ...]] = tuple(sorted(
    v for k, v in dict(globals()).items()
    if k.isupper() and isinstance(v, str) and v.startswith("WitCert.")))

#: Origin recorded for the theorems of the export shipped with the package.
BUILTIN_ORIGIN: Final = "witcert-calculus"

_EXPORT_FILE: Final = "lean_export.json"
_LOCK = threading.Lock()
# Name -> record. Append-only: names are added by the shipped export and register_theorems.
_REGISTRY: dict[str, TheoremRecord] = {}


@final
@dataclass(frozen=True, slots=True)
class TheoremRecord:
    """One exported Lean theorem.

    Attributes:
        name: the fully qualified name, e.g. ``"WitCert.Semantic.Contract.comp_sound"``.
        module: the Lean module that declares it.
        statement: the statement as Lean elaborated and printed it.
        origin: where the name came from: :data:`BUILTIN_ORIGIN`, or the resolved path of
            a registered export file.
        axioms: the axioms the theorem rests on, sorted; ``None`` when the export records
            none (an export written before axioms were recorded).
        axioms_scope: how far ``axioms`` reaches: ``"complete"`` (an official toolchain's
            ``Lean.collectAxioms``), ``"project"`` (the WebAssembly build: followed through the
            project's own compiled declarations up to core's, whose proofs its library does
            not hold), or ``None`` when the export does not say.
    """

    name: str
    module: str
    statement: str
    origin: str
    axioms: tuple[str, ...] | None = None
    axioms_scope: str | None = None

    def describe_axioms(self) -> str:
        """The axioms as a reader should take them, with how far they were followed.

        Example:
            >>> lookup(COMP_SOUND).describe_axioms().startswith("axioms: ")
            True
        """
        if self.axioms is None:
            return "axioms: not recorded by its export"
        listed = ", ".join(self.axioms) or "none"
        if self.axioms_scope == "complete":
            return f"axioms: {listed}"
        if self.axioms_scope == "project":
            return (f"axioms: {listed} (through this project's own proofs; the core theorems "
                    "they use are core's, listed only by an official toolchain)")
        return f"axioms: {listed} (the export does not say how far they were followed)"


def _records(text: str, where: str, origin: str) -> list[TheoremRecord]:
    try:
        doc: object = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TheoremExportError(where, f"is not JSON ({exc})") from None
    items: object = cast(dict[str, object], doc).get("theorems") if isinstance(doc, dict) else None
    if not isinstance(items, list) or not items:
        raise TheoremExportError(where, "must hold a non-empty list 'theorems' (the format "
                                 "scripts/lean_driver.py writes)")
    out: list[TheoremRecord] = []
    for i, item in enumerate(cast(list[object], items)):
        fields: dict[str, str] = {}
        for key in ("name", "module", "statement"):
            value = cast(dict[str, object], item).get(key) if isinstance(item, dict) else None
            if not isinstance(value, str) or not value.strip():
                raise TheoremExportError(where, f"theorems[{i}] has no {key} (a non-empty string)")
            fields[key] = value
        name = fields["name"]
        if any(ch.isspace() for ch in name) or "." not in name:
            raise TheoremExportError(where, f"theorems[{i}] has the name {name!r}, which is not "
                                     "a qualified Lean name")
        entry = cast(dict[str, object], item)
        scope = entry.get("axioms_scope")
        if scope is not None and scope not in _AXIOMS_SCOPES:
            raise TheoremExportError(where, f"theorems[{i}] has axioms_scope {scope!r}: one of "
                                     f"{', '.join(_AXIOMS_SCOPES)} or null")
        out.append(TheoremRecord(name, fields["module"], fields["statement"], origin,
                                 _axioms(entry.get("axioms"), where, i),
                                 None if scope is None else str(scope)))
    return out


_AXIOMS_SCOPES: Final = ("complete", "project")


def _axioms(value: object, where: str, i: int) -> tuple[str, ...] | None:
    """An export entry's ``axioms``: absent or null (not recorded), or a list of names."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(
            isinstance(a, str) and a and not any(ch.isspace() for ch in a)
            for a in cast(list[object], value)):
        raise TheoremExportError(where, f"theorems[{i}] has axioms {value!r}: a list of Lean "
                                 "names or null")
    return tuple(sorted(cast(list[str], value)))


def _add(records: list[TheoremRecord], where: str) -> None:
    for r in records:
        old = _REGISTRY.get(r.name)
        if old is not None and (old.statement, old.module) != (r.statement, r.module):
            raise TheoremExportError(where, f"{r.name} is already registered from {old.origin} "
                                     "with another statement; a theorem name registers once")
    for r in records:
        _REGISTRY.setdefault(r.name, r)


def _ensure_builtin() -> None:
    if _REGISTRY:
        return
    with _LOCK:
        if not _REGISTRY:
            text = Path(__file__).with_name(_EXPORT_FILE).read_text(encoding="utf-8")
            _add(_records(text, _EXPORT_FILE, BUILTIN_ORIGIN), _EXPORT_FILE)


def lookup(name: str) -> TheoremRecord:
    """The exported theorem of that name.

    Raises:
        UnknownTheoremError: if neither the shipped export nor a registered one holds it.

    Example:
        >>> lookup(COMP_SOUND).module
        'WitCert.Semantic'
    """
    _ensure_builtin()
    rec = _REGISTRY.get(name)
    if rec is None:
        raise UnknownTheoremError(name, len(_REGISTRY))
    return rec


def cited_theorems() -> Mapping[str, TheoremRecord]:
    """Every theorem the package cites (the constants of this module): name -> record.

    The records come from the shipped export, so each shows the statement Lean proved.

    Example:
        >>> cited_theorems()[COMP_SOUND].statement == lookup(COMP_SOUND).statement != ""
        True
    """
    _ensure_builtin()
    return MappingProxyType({name: lookup(name) for name in _CITED})


def register_theorems(path: str | os.PathLike[str]) -> tuple[TheoremRecord, ...]:
    """Register the theorems of a Lean export file, so that proofs may cite them.

    The file is what ``scripts/lean_driver.py`` writes (``formal/build/theorems.json``): a
    JSON object whose list ``theorems`` holds ``name``, ``module`` and ``statement`` for
    each theorem, and ``axioms`` (a list of names, or null when not recorded). Registering is
    append-only: a name already registered (built-in or from another file) with a different
    statement is refused; the same file twice is a no-op.

    Args:
        path: the export file; its resolved path is recorded as each name's origin.

    Returns:
        The records registered from this file (already registered identical ones included).

    Raises:
        TheoremExportError: if the file is missing, not JSON, malformed, or redefines a name.
    """
    where = Path(path).resolve()
    try:
        text = where.read_text(encoding="utf-8")
    except OSError as exc:
        raise TheoremExportError(str(where), f"cannot be read: missing or unreadable ({exc})") \
            from None
    records = _records(text, str(where), str(where))
    _ensure_builtin()
    with _LOCK:
        _add(records, str(where))
    return tuple(_REGISTRY[r.name] for r in records)


def registered_theorems() -> Mapping[str, TheoremRecord]:
    """A read-only view of every citable theorem: name -> record."""
    _ensure_builtin()
    return MappingProxyType(_REGISTRY)
