"""What the demo runs: prompts, schemes, threshold and continuation, in one validated value.

Main declarations
-----------------
- :data:`PROMPTS`, :data:`DEMO_SCHEMES`, :data:`OPERATING_POINT`, :data:`THRESHOLD`,
  :data:`CONTINUATION`, :data:`DELTA_REQ`, :data:`BANDS`: the defaults.
- :class:`DemoSettings`: one run's settings, checked once at construction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, final

from witcert_adapters.architectures import DENSE_BANDS
from witcert_adapters.schemes import get_scheme
from witcert_calculus.errors import InvalidValueError
from witcert_calculus.numerics.validation import positive_int, real

__all__ = ["BANDS", "CONTINUATION", "DELTA_REQ", "DEMO_SCHEMES", "MODEL_NAME", "MODEL_TITLE",
           "OPERATING_POINT", "PROMPTS", "THRESHOLD", "DemoSettings"]

PROMPTS: Final = (
    "The capital of France is",
    "def fibonacci(n):",
    "Water boils at a temperature of",
)
OPERATING_POINT: Final = "dither_int8_g32_m4"
"""The certified operating point the demo shows beside the raw schemes: dithered int8 keys with
32-channel fp16 group scales and 4 exact fp16 outlier RoPE pairs per (layer, kv head)."""
DEMO_SCHEMES: Final = (
    "int8_token", "int8_g32", "dither_int8", "dither_int8_g32_m0", "dither_int8_g32_m2",
    OPERATING_POINT, "dither_int8_g16_m4", "fp8_e4m3_scaled", "fp8_e4m3", "fp8_e5m2_scaled",
    "int4_g32", "kivi2_g32",
)
THRESHOLD: Final = 0.2
"""A cell is covered when its reported meter is at most this (the customary tau)."""
BANDS: Final = DENSE_BANDS
"""Witness bands per key (contiguous runs of RoPE pairs): the dense layouts' default."""
CONTINUATION: Final = 9
"""Greedy reference tokens per prompt (the last one is never fed back: ``CONTINUATION - 1``
teacher-forced decode steps)."""
DELTA_REQ: Final = "1/100"
"""Each request's failure-probability budget in the ledger."""
MODEL_TITLE: Final = "SmolLM2-135M-Instruct (30 layers, 9 query heads, 3 kv heads)"
MODEL_NAME: Final = "SmolLM2-135M-Instruct.Q4_1 (dequantised)"


@final
@dataclass(frozen=True, slots=True)
class DemoSettings:
    """One demo run's settings.

    Attributes:
        schemes: registered scheme names, in report order.
        prompts: the prompts, in report order.
        continuation: greedy reference tokens per prompt (at least 2).
        threshold: the coverage threshold tau, in ``(0, 1)``.
        threads: torch CPU threads.
        bands: witness bands per key.

    Raises:
        InvalidValueError: an unknown scheme, no scheme or prompt, or a value out of range.

    Example:
        >>> DemoSettings(schemes=("int8_token",)).decode_steps
        8
    """

    schemes: tuple[str, ...] = DEMO_SCHEMES
    prompts: tuple[str, ...] = PROMPTS
    continuation: int = CONTINUATION
    threshold: float = THRESHOLD
    threads: int = 1
    bands: int = BANDS

    def __post_init__(self) -> None:
        if not self.schemes:
            raise InvalidValueError("schemes", self.schemes, "must name at least one scheme")
        if not self.prompts:
            raise InvalidValueError("prompts", self.prompts, "must hold at least one prompt")
        for name in self.schemes:
            get_scheme(name)
        positive_int("continuation", self.continuation, minimum=2)
        real("threshold", self.threshold, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
        positive_int("threads", self.threads)
        positive_int("bands", self.bands)

    @property
    def decode_steps(self) -> int:
        """Teacher-forced decode steps per prompt."""
        return self.continuation - 1
