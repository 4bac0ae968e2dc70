"""Every Lean theorem that the Python code cites, named once.

Each constant is the fully qualified name of a theorem of the Lean development under
``formal/WitCert``; ``tests/test_formal.py`` checks each against what the Lean build
exports. Modules cite these constants and never type a theorem name again.

Main declarations: one ``Final`` string per theorem, grouped by Lean module.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "ADD_SOUND",
    "COMP_SOUND",
    "DECIDE_SATURATED_NE_CERTIFIED",
    "DITHER_LOGIT_TAIL",
    "ENTRY_FALLBACK_SOUND",
    "GRID_MGF_LE",
    "ID_SOUND",
    "LE_WEAKEST",
    "LOGIT_BOUND_SOUND",
    "ONE_SUB_POW_LE_EXP",
    "OUTPUT_ERROR_BOUND_VECTOR_SOUND",
    "PAGE_IN_DECREASE",
    "POOLING_L2_CALIBER",
    "POOLING_MAX_CALIBER",
    "RANK_PREFIX_SELECTION_SOUND",
    "RANK_PREFIX_STABLE",
    "RATE_UPPER_BOUND_SOUND",
    "RECURRENCE_COMP_SOUND",
    "SCORE_BRIDGE_SOUND",
    "SENTINEL_ROUNDS_SOUND",
    "SIGNAVG_UNION_LE",
    "SOFTMAX_TV_AFFINE_SOUND",
    "SOFTMAX_TV_EFORM_SOUND",
    "SOFTMAX_TV_TANH_SOUND",
    "TELESCOPE_PARTIAL_LT",
    "TELESCOPE_SUM_EQ",
    "TV_EFORM_SOUND",
    "TV_RETENTION_SOUND",
    "TV_TWO_SIDED_SOUND",
    "TWO_LAYER_BUDGET",
    "VILLE_FINITE_TREE",
    "WEAKEST_ASSOC",
    "WEAKEST_COMM",
    "WEAKEST_IDEM",
    "WEAKEST_LE_LEFT",
    "WEAKEST_LE_RIGHT",
    "WITNESS_SOUND",
]

# ----------------------------------------------------------------------------- Analytic

ONE_SUB_POW_LE_EXP: Final = "WitCert.Analytic.one_sub_pow_le_exp"
SOFTMAX_TV_AFFINE_SOUND: Final = "WitCert.Analytic.softmax_tv_affine_sound"
SOFTMAX_TV_EFORM_SOUND: Final = "WitCert.Analytic.softmax_tv_eform_sound"
SOFTMAX_TV_TANH_SOUND: Final = "WitCert.Analytic.softmax_tv_tanh_sound"

# ----------------------------------------------------------------------------- Bridges

POOLING_L2_CALIBER: Final = "WitCert.Bridges.pooling_l2_caliber"
POOLING_MAX_CALIBER: Final = "WitCert.Bridges.pooling_max_caliber"
RANK_PREFIX_SELECTION_SOUND: Final = "WitCert.Bridges.rank_prefix_selection_sound"
RANK_PREFIX_STABLE: Final = "WitCert.Bridges.rank_prefix_stable"
RECURRENCE_COMP_SOUND: Final = "WitCert.Bridges.recurrence_comp_sound"
SCORE_BRIDGE_SOUND: Final = "WitCert.Bridges.score_bridge_sound"
WITNESS_SOUND: Final = "WitCert.Bridges.witness_sound"

# ----------------------------------------------------------------------------- Contract

ADD_SOUND: Final = "WitCert.Contract.add_sound"
COMP_SOUND: Final = "WitCert.Contract.comp_sound"
ID_SOUND: Final = "WitCert.Contract.id_sound"

# ----------------------------------------------------------------------------- Dither

DITHER_LOGIT_TAIL: Final = "WitCert.Dither.dither_logit_tail"
GRID_MGF_LE: Final = "WitCert.Dither.grid_mgf_le"
SIGNAVG_UNION_LE: Final = "WitCert.Dither.signAvg_union_le"

# ----------------------------------------------------------------------------- Ledger

ENTRY_FALLBACK_SOUND: Final = "WitCert.Ledger.entry_fallback_sound"
TELESCOPE_PARTIAL_LT: Final = "WitCert.Ledger.telescope_partial_lt"
TELESCOPE_SUM_EQ: Final = "WitCert.Ledger.telescope_sum_eq"
TWO_LAYER_BUDGET: Final = "WitCert.Ledger.two_layer_budget"
VILLE_FINITE_TREE: Final = "WitCert.Ledger.ville_finite_tree"

# ----------------------------------------------------------------------------- Meters

OUTPUT_ERROR_BOUND_VECTOR_SOUND: Final = "WitCert.Meters.output_error_bound_vector_sound"
PAGE_IN_DECREASE: Final = "WitCert.Meters.page_in_decrease"
RATE_UPPER_BOUND_SOUND: Final = "WitCert.Meters.rate_upper_bound_sound"
SENTINEL_ROUNDS_SOUND: Final = "WitCert.Meters.sentinel_rounds_sound"
TV_EFORM_SOUND: Final = "WitCert.Meters.tv_eform_sound"
TV_RETENTION_SOUND: Final = "WitCert.Meters.tv_retention_sound"
TV_TWO_SIDED_SOUND: Final = "WitCert.Meters.tv_two_sided_sound"

# ----------------------------------------------------------------------------- Tier

DECIDE_SATURATED_NE_CERTIFIED: Final = "WitCert.Tier.decide_saturated_ne_certified"
LE_WEAKEST: Final = "WitCert.Tier.le_weakest"
WEAKEST_ASSOC: Final = "WitCert.Tier.weakest_assoc"
WEAKEST_COMM: Final = "WitCert.Tier.weakest_comm"
WEAKEST_IDEM: Final = "WitCert.Tier.weakest_idem"
WEAKEST_LE_LEFT: Final = "WitCert.Tier.weakest_le_left"
WEAKEST_LE_RIGHT: Final = "WitCert.Tier.weakest_le_right"

# ----------------------------------------------------------------------------- Witness

LOGIT_BOUND_SOUND: Final = "WitCert.Witness.logit_bound_sound"
