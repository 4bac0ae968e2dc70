"""The WitCert meters: sound per-(layer, head, step) bounds on attention memory, and their theorems.

The meters are spread over modules named after what they hold; each function is
reached from the package face (``from witcert_calculus import tv_meter``):

- :mod:`witcert_calculus.meters.witness`: band witnesses of key residuals and the per-token
  logit bound ``c_t >= |eps_t|`` (Tier A, deterministic), an established ``LogitBound``.
- :mod:`witcert_calculus.meters.formats`: the residual bound each stored fp8 code carries by
  itself under a known writer (no stored byte), and the box logit bound from it; a second
  Tier-A ``LogitBound``, combined with the band bound token by token
  (:func:`~witcert_calculus.meters.witness.tighter`).
- :mod:`witcert_calculus.meters.tv_forms`: the TV forms (e-form, two-sided, retention, the
  meter, ``tanh(max c)``) from per-token logit bounds: CERTIFIED from a ``LogitBound``,
  PARTIALLY_CERTIFIED from the caller's own array (an assumption).
- :mod:`witcert_calculus.meters.output_bound`: from a TV bound to the attention output's error.
- :mod:`witcert_calculus.meters.page_in`: which blocks to page in to meet a target.
- :mod:`witcert_calculus.meters.eviction`: token eviction: the dropped attention mass bounded
  from witnesses stored at eviction time, the output bound, the restoring gate's order, and
  the combination with a quantization meter over the kept keys.
- :mod:`witcert_calculus.meters.depth`: through depth: the contracts that carry a layer's
  attention-output bound through the residual stream, layer by layer, to the next-token
  distribution, from constants read off the served activations.
- :mod:`witcert_calculus.meters.dither`: Tier B, the subtractively dithered INT8 key store and its
  probabilistic per-token logit bound and TV certificate (non-adaptive queries).
- :mod:`witcert_calculus.meters.sentinels`: the sampling sentinel and the zero-failure rate bound.
- :mod:`witcert_calculus.meters.dispersion`: an unsound shape, kept with its counterexample.
- :mod:`witcert_calculus.numerics.rounding`: the one outward-rounding rule all of them follow.

Rule (``tests/test_layout.py``): the meters import no accounting, drift, exploration or
export module; the algebra they build on imports no meter.

The torch versions (the ``witcert_kernels`` package) evaluate the same formulas with the
same margins on batched tensors.

Main declarations:

- :data:`THEOREMS`: the Lean theorem names behind each public meter function, keyed by
  the function's name in the package face (checked against the Lean export).
"""

from __future__ import annotations

from typing import Final

from witcert_calculus.lean.theorems import (
    ATTN_QUERY_STEP_LE,
    BOX_LOGIT_BOUND_METER_SOUND,
    DITHER_TIER_B_PROB_BAD,
    DITHER_TIER_B_TOKEN_SOUND,
    EVICT_QUANT_METER_SOUND,
    EVICT_TV_BLOCKS_METER_SOUND,
    EVICT_TV_RESTORE_METER_LE,
    FORMAT_RESIDUAL_LE,
    GLU_STEP_LE,
    GRID_MGF_LE,
    LOGIT_BOUND_METER_SOUND,
    MIN_BOUND_SOUND,
    NEAREST_RESIDUAL_LE,
    NEXT_TOKEN_CONTRACT_SOUND,
    ONE_SUB_POW_LE_EXP,
    OUTPUT_ERROR_CONTRACT_AT,
    OUTPUT_EVICT_ERROR_LE,
    OUTPUT_PROJECTION_CONTRACT_SOUND,
    PAGE_IN_DECREASE,
    RATE_UPPER_BOUND_SOUND,
    RESIDUAL_STEP_CONTRACT_SOUND,
    RMS_NORMALIZE_LIPSCHITZ,
    SENTINEL_ROUNDS_SOUND,
    SOFTMAX_TV_TANH_CONTRACT_SOUND,
    TV_EFORM_METER_SOUND,
    TV_RETENTION_METER_SOUND,
    TRUNC_RESIDUAL_LE,
    TV_TWO_SIDED_METER_SOUND,
)

__all__ = ["THEOREMS"]

#: The Lean theorems behind each public meter function (checked against the Lean export).
THEOREMS: Final[dict[str, tuple[str, ...]]] = {
    "logit_bound": (LOGIT_BOUND_METER_SOUND,),
    "format_witness": (TRUNC_RESIDUAL_LE, NEAREST_RESIDUAL_LE, FORMAT_RESIDUAL_LE),
    "format_logit_bound": (BOX_LOGIT_BOUND_METER_SOUND,),
    "tighter": (MIN_BOUND_SOUND,),
    "tv_eform": (TV_EFORM_METER_SOUND,),
    "tv_two_sided": (TV_TWO_SIDED_METER_SOUND,),
    "tv_retention": (TV_RETENTION_METER_SOUND,),
    "tv_meter": (TV_EFORM_METER_SOUND, TV_TWO_SIDED_METER_SOUND),
    "tv_tanh_max": (SOFTMAX_TV_TANH_CONTRACT_SOUND,),
    "output_error_bound": (OUTPUT_ERROR_CONTRACT_AT,),
    "output_error_contract": (OUTPUT_ERROR_CONTRACT_AT,),
    "page_in_order": (PAGE_IN_DECREASE,),
    "dropped_mass_batch": (EVICT_TV_BLOCKS_METER_SOUND,),
    "eviction_output_bound": (OUTPUT_EVICT_ERROR_LE,),
    "restore_order": (EVICT_TV_RESTORE_METER_LE,),
    "combined_tv": (EVICT_QUANT_METER_SOUND,),
    "dither_variance_proxy": (GRID_MGF_LE,),
    "subgaussian_radius": (DITHER_TIER_B_TOKEN_SOUND, DITHER_TIER_B_PROB_BAD),
    "tier_b_logit_bound": (DITHER_TIER_B_TOKEN_SOUND, DITHER_TIER_B_PROB_BAD),
    "tier_b_certificate": (DITHER_TIER_B_TOKEN_SOUND, DITHER_TIER_B_PROB_BAD, TV_EFORM_METER_SOUND),
    "sentinel_rounds": (SENTINEL_ROUNDS_SOUND,),
    "rate_upper_bound": (RATE_UPPER_BOUND_SOUND, ONE_SUB_POW_LE_EXP),
    "rms_slope": (RMS_NORMALIZE_LIPSCHITZ,),
    "attention_sublayer": (RESIDUAL_STEP_CONTRACT_SOUND, ATTN_QUERY_STEP_LE,
                           RMS_NORMALIZE_LIPSCHITZ),
    "mlp_sublayer": (RESIDUAL_STEP_CONTRACT_SOUND, GLU_STEP_LE, RMS_NORMALIZE_LIPSCHITZ),
    "output_projection": (OUTPUT_PROJECTION_CONTRACT_SOUND,),
    "next_token_head": (NEXT_TOKEN_CONTRACT_SOUND, RMS_NORMALIZE_LIPSCHITZ),
}
