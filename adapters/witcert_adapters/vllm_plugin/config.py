"""The plugin's one switch: the ``WITCERT_VLLM`` environment variable, read once.

vLLM starts its engine core and worker in fresh processes and loads its plugins in each;
the environment is the one channel that reaches all of them. The switch is read once per
process into a frozen :class:`PluginConfig`; nothing else in the plugin reads the
environment.

Format: unset or empty means off. Otherwise a comma-separated list of ``key=value``
items; ``store`` is required::

    WITCERT_VLLM="store=/var/lib/witcert/verdicts.sqlite,tau=0.1,bands=0,format=1,repair=1"

- ``store``: the SQLite file the worker writes each finished request's verdict to and
  the server reads them from (created if missing; its folder must exist).
- ``tau``: the coverage threshold, a cell is covered when its meter is ``<= tau``
  (default 0.1, in ``(0, 1)``).
- ``bands``: band witnesses per key (default 0); each costs 4 bytes per token per kv head
  in the side buffer. ``0`` keeps none: the format witness alone bounds the keys.
- ``format``: ``1`` (default) bounds an fp8 cache's keys by the *format witness* each
  stored byte carries (:mod:`witcert_calculus.meters.formats`; no stored byte), taking per
  token the smaller of it and the band bound; ``0`` uses the band witnesses alone (then
  ``bands`` must be at least 1). A model-dtype cache stores keys exactly and needs neither.
- ``repair``: ``1`` turns on the gate that repairs (:mod:`.repair`): an exact backing store
  of every key and value written, and, before a layer's attention result is used, the
  output of every (request, query head) whose meter exceeds ``tau`` recomputed with the
  highest-contribution blocks paged in exactly until the meter is at most ``tau``. ``1``
  gates each request's last row of a step (a decode row, a prefill chunk's last row: the
  row whose prediction the engine samples), ``all`` every row of a prefill too (slower, and
  it pages in more); default ``0``. It keeps the exact keys and values of every slot (in
  the model's dtype).
- ``audit``: ``1`` keeps the unquantized keys beside the cache and measures every
  cell's true total variation (tests only: it doubles the key memory); default ``0``.
- ``delta``: each request's failure-probability budget ``delta_req`` (default 0.01).
- ``form``: the TV bound each cell reports. ``meter`` (default) is the library's meter
  ``min(e-form, two-sided)``, which weighs each token's logit bound by the compressed
  attention and so recomputes it from the stored keys; ``tanh`` is ``tanh(max_t c_t)``,
  looser and much cheaper (no keys, no attention weights); ``cascade`` reports
  ``tanh(max_t c_t)`` wherever it is already at most ``tau`` (a meter could not change that
  cell's coverage) and the smaller of the two elsewhere, so the keys are read only when some
  cell of a layer needs the meter (a model-dtype cache, whose bounds are all 0, never does).
  Each verdict counts the cells whose value came from ``tanh(max_t c_t)`` (``by_tanh``).
  All three are certified.

Every malformed item is an :class:`~witcert_calculus.errors.InvalidValueError` that
names it.

Main declarations
-----------------
- :class:`PluginConfig`, :data:`ENV_VAR`, :data:`FORMS`, :func:`from_environ`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from pathlib import Path
from typing import Final, final

from witcert_calculus.errors import InvalidValueError
from witcert_calculus.numerics.validation import nonneg_int, open_level, unit_rational

__all__ = ["ENV_VAR", "FORMS", "PluginConfig", "active", "from_environ"]

ENV_VAR: Final = "WITCERT_VLLM"
"""The environment variable that switches the plugin on and configures it."""

_KEYS: Final = ("store", "tau", "bands", "format", "repair", "audit", "delta", "form")
FORMS: Final = ("meter", "tanh", "cascade")
"""The TV bounds a cell can report (the ``form`` item)."""


@final
@dataclass(frozen=True, slots=True)
class PluginConfig:
    """What the plugin does in this process (frozen).

    Attributes:
        store: the verdict store's SQLite file.
        tau: coverage threshold in ``(0, 1)``.
        bands: band witnesses per key (0: none).
        format_witness: bound fp8 keys by the format witness too.
        repair: the gate that repairs, inside the engine.
        repair_every_row: with repair, gate every row of a prefill chunk, not only its last.
        audit: keep the exact keys and measure true total variation per cell.
        delta_req: each request's failure-probability budget.
        form: the TV bound of each cell, one of :data:`FORMS`.
    """

    store: Path
    tau: float = 0.1
    bands: int = 0
    format_witness: bool = True
    repair: bool = False
    repair_every_row: bool = False
    audit: bool = False
    delta_req: Fraction = Fraction(1, 100)
    form: str = "meter"

    def __post_init__(self) -> None:
        if self.form not in FORMS:
            raise InvalidValueError("form", self.form, f"must be one of {list(FORMS)}")
        open_level("tau", self.tau)
        nonneg_int("bands", self.bands)
        if self.repair_every_row and not self.repair:
            raise InvalidValueError("repair_every_row", self.repair_every_row,
                                    "needs repair on")
        if self.repair and self.form != "meter":
            raise InvalidValueError("repair", int(self.repair), "needs form=meter: the gate "
                                    "pages in by the meter's weights p~, which form=tanh "
                                    "never computes")
        if self.bands == 0 and not self.format_witness:
            raise InvalidValueError("bands", self.bands, "must be at least 1 without the format "
                                    "witness (format=0): the keys need some witness")
        unit_rational("delta", self.delta_req, open_interval=True)

    def to_env(self) -> str:
        """The ``WITCERT_VLLM`` value that reads back as this configuration.

        Example:
            >>> PluginConfig(store=Path("/tmp/v.sqlite"), tau=0.2).to_env()
            'store=/tmp/v.sqlite,tau=0.2,bands=0,format=1,repair=0,audit=0,delta=1/100,form=meter'
        """
        return (f"store={self.store},tau={self.tau!r},bands={self.bands},"
                f"format={int(self.format_witness)},"
                f"repair={'all' if self.repair_every_row else int(self.repair)},"
                f"audit={int(self.audit)},delta={self.delta_req},form={self.form}")


def from_environ(environ: Mapping[str, str]) -> PluginConfig | None:
    """Parse the switch; ``None`` when it is unset or empty (the plugin is off).

    Raises:
        InvalidValueError: an item without ``=``, an unknown or repeated key, a missing
            ``store``, or a value out of range (each names the item).

    Example:
        >>> from_environ({}) is None
        True
        >>> from_environ({"WITCERT_VLLM": "store=/tmp/v.sqlite,audit=1"}).audit
        True
    """
    text = environ.get(ENV_VAR, "").strip()
    if not text:
        return None
    items: dict[str, str] = {}
    for raw in text.split(","):
        item = raw.strip()
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not value.strip():
            raise InvalidValueError(ENV_VAR, item, "each item must read key=value")
        if key not in _KEYS:
            raise InvalidValueError(ENV_VAR, item, f"unknown key {key!r}; known: {list(_KEYS)}")
        if key in items:
            raise InvalidValueError(ENV_VAR, item, f"key {key!r} given twice")
        items[key] = value.strip()
    if "store" not in items:
        raise InvalidValueError(ENV_VAR, text, "store=PATH (the verdict store) is required")
    store = Path(items["store"])
    if not store.parent.is_dir():
        raise InvalidValueError("store", str(store), "its folder does not exist")
    flags: dict[str, bool] = {}
    for key, default in (("audit", "0"), ("format", "1")):
        flag = items.get(key, default)
        if flag not in ("0", "1"):
            raise InvalidValueError(key, flag, "must be 0 or 1")
        flags[key] = flag == "1"
    repair = items.get("repair", "0")
    if repair not in ("0", "1", "all"):
        raise InvalidValueError("repair", repair, "must be 0, 1 or all")
    try:
        tau = float(items.get("tau", "0.1"))
        bands = int(items.get("bands", "0"))
        delta = Fraction(items.get("delta", "1/100"))
    except ValueError as exc:
        raise InvalidValueError(ENV_VAR, text, f"a value does not parse: {exc}") from None
    try:
        return PluginConfig(store=store, tau=tau, bands=bands, format_witness=flags["format"],
                            repair=repair != "0", repair_every_row=repair == "all",
                            audit=flags["audit"], delta_req=delta,
                            form=items.get("form", "meter"))
    except InvalidValueError as exc:  # name the item as it was written
        given = items.get(exc.name, str(exc.value))
        raise InvalidValueError(ENV_VAR, f"{exc.name}={given}", exc.reason) from None


@lru_cache(maxsize=1)
def active() -> PluginConfig | None:
    """This process's configuration, read from the environment once."""
    return from_environ(os.environ)
