"""The SGLang adapter's one switch, ``WITCERT_SGLANG``, read once into a frozen config.

``WITCERT_SGLANG=1`` turns the meter on in a process whose SGLang files carry the adapter's
patch (:mod:`witcert_adapters.sglang.installer`); unset or ``0`` leaves the patched kernels on
their upstream path (the injected branches are compile-time constants that are off). Any
other value is refused. The variable is read once, at import, into :data:`CONFIG`; an
embedding program (or a test) passes an explicit :class:`SGLangConfig` to
:func:`witcert_adapters.sglang.runtime.metering` instead.

Main declarations
-----------------
- :data:`ENV`, :class:`SGLangConfig`, :func:`load`, :data:`CONFIG`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, final

from witcert_calculus.errors import InvalidValueError
from witcert_calculus.meters.witness import RopeLayout
from witcert_calculus.numerics.validation import positive_int

__all__ = ["CONFIG", "ENV", "SGLangConfig", "load"]

ENV: Final = "WITCERT_SGLANG"
"""The environment variable that switches the meter on (``1``) or off (unset, ``0``)."""


@final
@dataclass(frozen=True, slots=True)
class SGLangConfig:
    """How the patched SGLang kernels meter.

    Attributes:
        enabled: whether the injected meter runs.
        bands: witness bands per key (equal bands of rotary pairs; divides ``head_dim / 2``).
        layout: the model's rotary pair layout.
    """

    enabled: bool
    bands: int = 8
    layout: RopeLayout = RopeLayout.HALF_SPLIT

    def __post_init__(self) -> None:
        positive_int("bands", self.bands)
        if not isinstance(self.layout, RopeLayout):
            raise InvalidValueError("layout", self.layout, "must be a RopeLayout")


def load(environ: Mapping[str, str]) -> SGLangConfig:
    """The config named by ``environ[ENV]``.

    Raises:
        InvalidValueError: a value other than unset, ``""``, ``"0"`` or ``"1"``.

    Example:
        >>> load({"WITCERT_SGLANG": "1"}).enabled
        True
    """
    raw = environ.get(ENV, "")
    if raw not in ("", "0", "1"):
        raise InvalidValueError(ENV, raw, "must be unset, '0' or '1'")
    return SGLangConfig(enabled=raw == "1")


CONFIG: Final = load(os.environ)
"""The process's config, read once at import."""
