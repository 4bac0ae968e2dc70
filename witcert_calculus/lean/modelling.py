"""Modelling steps: what lies between a Lean theorem and the code that cites it.

A Lean theorem speaks of exact numbers (an ordered field with the laws of ``exp``, rationals,
finite lists of tokens or draws); the code that cites it computes in floating point on arrays.
Each step between the two is stated once here, with how it is discharged:

- ``PROVED``: a further Lean theorem covers the step (named in ``by``);
- ``CHECKED``: code establishes it on every call (outward rounding with derived margins,
  tested against high-precision truths), so it does not lower the tier;
- ``ASSUMED``: no code checks it where the bound is issued. Where a bound's tier rests on such
  a premise for one particular input (the caller's own logit bound, the generator's
  uniformity, non-adaptive queries), the bound carries an
  :class:`~witcert_calculus.tiers.Assumption` and is at most ``PARTIALLY_CERTIFIED``. The
  ``ASSUMED`` steps listed here are the ones the library's model of the computation rests on
  for *every* input; they are stated next to every bound that cites the theorem
  (``Contract.modelling``, ``Reading.modelling``, ``explain()``) and in ``formal/README.md``
  ("Modelling assumptions outside Lean"), and they do not change the tier.

Main declarations: :class:`Discharge`, :class:`ModellingStep`, the steps (:data:`FLOAT_ROUNDING`,
:data:`SQRT_ROUNDING`, :data:`HIGH_PRECISION`, :data:`SOFTMAX_AS_COMPUTED`, :data:`FORMAT_WRITER`,
:data:`ZERO_MASS_TOKENS`, :data:`SENTINEL_DRAWS`, :data:`SENTINEL_GENERATOR`), :data:`STEPS`,
:func:`steps_for`, :func:`modelling_of`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, final

from witcert_calculus.errors import InvalidValueError
from witcert_calculus.lean.theorems import (
    BOX_LOGIT_BOUND_METER_SOUND,
    DECOMPRESSION_CONTRACT_SOUND,
    DITHER_TIER_B_TOKEN_SOUND,
    FORMAT_RESIDUAL_LE,
    LOGIT_BOUND_METER_SOUND,
    NEAREST_RESIDUAL_LE,
    OUTPUT_ERROR_CONTRACT_AT,
    POOLING_L2_CONTRACT_SOUND,
    RATE_UPPER_BOUND_SOUND,
    SAMPLING_MISS_PROBABILITY,
    SCORE_BRIDGE_CONTRACT_SOUND,
    SELECTOR_MASS_EFORM_CONTRACT_SOUND,
    SENTINEL_ROUNDS_SOUND,
    SOFTMAX_TV_AFFINE_CONTRACT_SOUND,
    SOFTMAX_TV_EFORM_CONTRACT_SOUND,
    SOFTMAX_TV_TANH_CONTRACT_SOUND,
    SOFTMAX_TV_TANH_OSC_CONTRACT_SOUND,
    TRUNC_RESIDUAL_LE,
    TV_EFORM_METER_SOUND,
    TV_RETENTION_METER_SOUND,
    TV_SINGLE_TOKEN_METER,
    TV_TWO_SIDED_METER_SOUND,
    WITNESS_CONTRACT_SOUND,
)
from witcert_calculus.numerics.validation import nonempty_text
from witcert_calculus.tiers import Evidence, theorems_of

__all__ = [
    "FLOAT_ROUNDING",
    "FORMAT_WRITER",
    "HIGH_PRECISION",
    "SENTINEL_DRAWS",
    "SENTINEL_GENERATOR",
    "SOFTMAX_AS_COMPUTED",
    "SQRT_ROUNDING",
    "STEPS",
    "ZERO_MASS_TOKENS",
    "Discharge",
    "ModellingStep",
    "modelling_of",
    "steps_for",
]


@final
class Discharge(enum.Enum):
    """How a modelling step is discharged."""

    PROVED = "proved in Lean"
    CHECKED = "checked by code on every call"
    ASSUMED = "assumed (no code checks it)"


@final
@dataclass(frozen=True, slots=True)
class ModellingStep:
    """One step between a theorem's exact statement and the computation that cites it.

    Attributes:
        key: a short stable name (``formal/README.md`` lists every key).
        statement: what the step claims about the computation.
        discharge: how it is discharged.
        by: the Lean theorem (``PROVED``), the code and its test (``CHECKED``), or why nothing
            can check it (``ASSUMED``).

    Raises:
        InvalidValueError: on an empty field or a discharge that is not a :class:`Discharge`.
    """

    key: str
    statement: str
    discharge: Discharge
    by: str

    def __post_init__(self) -> None:
        for name in ("key", "statement", "by"):
            nonempty_text(name, getattr(self, name))
        if not isinstance(self.discharge, Discharge):
            raise InvalidValueError("discharge", self.discharge, "must be a Discharge")

    def describe(self) -> str:
        """One line: the statement, how it is discharged, and by what."""
        return f"{self.statement} [{self.key}: {self.discharge.value}: {self.by}]"


FLOAT_ROUNDING: Final = ModellingStep(
    "float-rounding",
    "each float64 evaluation of a bound lies at or above the exact real value of its formula",
    Discharge.CHECKED,
    "witcert_calculus.numerics.rounding.outward with the margin derived for each formula; "
    "scripts/margin_checks.py compares each margin with the error it claims at adversarial "
    "points (50 digits); scripts/soak_meters.py and the tests compare against 50- and "
    "100-digit evaluations")

SQRT_ROUNDING: Final = ModellingStep(
    "sqrt-rounding",
    "the theorems state norms squared (no square root over Rat); each square root the code "
    "takes is rounded upward, so the norm it reports is at least the exact one",
    Discharge.CHECKED,
    "witcert_calculus.numerics.rounding.band_norm_margin (with SQRT_TINY for underflowed arguments) and "
    "the exact integer square root of witcert_calculus.bridges; tested against exact norms")

HIGH_PRECISION: Final = ModellingStep(
    "high-precision",
    "a bridge's transfer is evaluated at 50 digits and rounded up to the next float",
    Discharge.CHECKED,
    "mpmath at 50 digits, then math.nextafter toward +inf (witcert_calculus.contracts)")

SOFTMAX_AS_COMPUTED: Final = ModellingStep(
    "softmax-as-computed",
    "the compressed attention weights p_tilde passed to the TV forms are the softmax of the "
    "compressed logits; the theorems take them as exact, while an engine computes them in "
    "floating point (a relative error of a few units of roundoff of its dtype per weight, "
    "not added to c)",
    Discharge.ASSUMED,
    "the exact softmax of the engine's logits is not available where the bound is issued; "
    "the code checks only that p_tilde is a probability vector")

ZERO_MASS_TOKENS: Final = ModellingStep(
    "zero-mass-tokens",
    "a token whose computed weight p_tilde_t is exactly 0 (masked, or a positive exact weight "
    "that underflowed) is left out of A and A-: in the theorems every listed token has "
    "positive softmax weight, so a masked token is outside the list, and an underflowed one "
    "loses its term p_tilde_t e^{c_t} (p_tilde_t below the smallest subnormal)",
    Discharge.ASSUMED,
    "the code cannot tell a masked token from an underflowed weight")

FORMAT_WRITER: Final = ModellingStep(
    "format-writer",
    "each stored fp8 code was written from the true element by the writer the format witness "
    "names: v = fl32(x * fl32(1/s)) (or fl32(x / s)), clamped, rounded onto the grid as its "
    "Rounding says, and read back as value(code) * fl32(s)",
    Discharge.CHECKED,
    "vLLM's plugin compares every byte the engine stores with the writer model's byte on every "
    "write (witcert_adapters.vllm_plugin.quantizer.check_bytes; refused at start-up, failed "
    "closed later); tests/adapters/engine/fp8_checks.py measures the model on the installed "
    "engine over every bfloat16 value; a direct caller of format_witness states its writer")

SENTINEL_DRAWS: Final = ModellingStep(
    "sentinel-draws",
    "a round of r draws with replacement from M slots, B of them corrupted, misses every "
    "corrupted slot with probability q = (1 - B/M)^r",
    Discharge.PROVED,
    SAMPLING_MISS_PROBABILITY + " (counting over the M^r equally likely draw sequences)")

SENTINEL_GENERATOR: Final = ModellingStep(
    "sentinel-generator",
    "the sentinel's draws are uniform on the slots and independent",
    Discharge.ASSUMED,
    "a property of the random generator, not of any value a test can check")

_TV_FORMS: Final = (FLOAT_ROUNDING, SOFTMAX_AS_COMPUTED, ZERO_MASS_TOKENS)

#: The modelling steps of each theorem the library cites, by theorem name.
STEPS: Final[Mapping[str, tuple[ModellingStep, ...]]] = {
    WITNESS_CONTRACT_SOUND: (SQRT_ROUNDING, FLOAT_ROUNDING),
    SCORE_BRIDGE_CONTRACT_SOUND: (SQRT_ROUNDING, FLOAT_ROUNDING),
    DECOMPRESSION_CONTRACT_SOUND: (SQRT_ROUNDING, FLOAT_ROUNDING),
    POOLING_L2_CONTRACT_SOUND: (SQRT_ROUNDING, FLOAT_ROUNDING),
    LOGIT_BOUND_METER_SOUND: (SQRT_ROUNDING, FLOAT_ROUNDING),
    BOX_LOGIT_BOUND_METER_SOUND: (FORMAT_WRITER, FLOAT_ROUNDING),
    FORMAT_RESIDUAL_LE: (FORMAT_WRITER, FLOAT_ROUNDING),
    TRUNC_RESIDUAL_LE: (FORMAT_WRITER,),
    NEAREST_RESIDUAL_LE: (FORMAT_WRITER,),
    SOFTMAX_TV_EFORM_CONTRACT_SOUND: (HIGH_PRECISION,),
    SELECTOR_MASS_EFORM_CONTRACT_SOUND: (HIGH_PRECISION,),
    SOFTMAX_TV_AFFINE_CONTRACT_SOUND: (HIGH_PRECISION,),
    SOFTMAX_TV_TANH_OSC_CONTRACT_SOUND: (HIGH_PRECISION,),
    SOFTMAX_TV_TANH_CONTRACT_SOUND: (HIGH_PRECISION, FLOAT_ROUNDING),
    TV_EFORM_METER_SOUND: _TV_FORMS,
    TV_TWO_SIDED_METER_SOUND: _TV_FORMS,
    TV_RETENTION_METER_SOUND: _TV_FORMS,
    TV_SINGLE_TOKEN_METER: (SOFTMAX_AS_COMPUTED,),
    OUTPUT_ERROR_CONTRACT_AT: (SQRT_ROUNDING, FLOAT_ROUNDING, SOFTMAX_AS_COMPUTED),
    DITHER_TIER_B_TOKEN_SOUND: (SQRT_ROUNDING, FLOAT_ROUNDING),
    SENTINEL_ROUNDS_SOUND: (SENTINEL_DRAWS, SENTINEL_GENERATOR, HIGH_PRECISION),
    RATE_UPPER_BOUND_SOUND: (HIGH_PRECISION,),
}


def steps_for(theorem: str) -> tuple[ModellingStep, ...]:
    """The modelling steps between ``theorem`` and the code citing it (none: exact use)."""
    return STEPS.get(theorem, ())


def modelling_of(evidence: Evidence) -> tuple[ModellingStep, ...]:
    """Every modelling step of the theorems a piece of evidence cites, in order, no repeats.

    Example:
        >>> import numpy as np
        >>> from witcert_calculus.meters.tv_forms import tv_eform
        >>> cert = tv_eform(np.array([0.5, 0.5]), np.array([0.01, 0.02])).reading()
        >>> [s.key for s in modelling_of(cert.evidence)]
        ['float-rounding', 'softmax-as-computed', 'zero-mass-tokens']
    """
    return tuple(dict.fromkeys(s for t in theorems_of(evidence) for s in steps_for(t)))
