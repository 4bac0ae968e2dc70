"""Metric types: what an error number measures, and where it is observed.

A metric is a class generic over an observation *site*: ``KeyResidualAbs[AtWrite]``
and ``KeyResidualAbs[AtConsume]`` are different types for mypy and pyright
(the site parameter is invariant) and unequal objects at run time. Metrics are
never strings. Each metric class is registered with :func:`register_metric`,
which records its unit, value range, saturation value and meaning; using a
metric that was never registered raises :class:`UnregisteredMetricError`.

Main declarations:

- :class:`Site`, :class:`AtWrite`, :class:`AtConsume`: observation sites.
- :class:`Metric`: abstract base of every metric.
- :func:`register_metric`: decorator that registers a metric class.
- :class:`MetricInfo`, :func:`metric_info`, :func:`metric_name`: look-ups used by
  contracts, readings and bridges.
- The built-in metrics: :class:`KeyResidualRel`, :class:`KeyResidualAbs`,
  :class:`ValueResidual`, :class:`LogitLinf`, :class:`LogitOsc`,
  :class:`AttentionTV`, :class:`SelectorMass`, :class:`AttentionOutputL2`,
  :class:`LatentResidual`, :class:`RecurrentStateError`, :class:`PerTokenL2`,
  :class:`PerTokenMax`, :class:`PooledError`, :class:`ResidualL2`, :class:`NextTokenTV`.

Example:
    >>> from witcert_calculus.metrics import AttentionTV, AtConsume, metric_info
    >>> metric_info(AttentionTV[AtConsume]).saturation
    1.0
"""

from __future__ import annotations

import math
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Generic, cast, final

from typing_extensions import Never, TypeVar

from witcert_calculus.errors import (
    InvalidValueError,
    MetricAlreadyRegisteredError,
    NotAMetricError,
    UnregisteredMetricError,
)
from witcert_calculus.numerics.validation import nonempty_text, real

__all__ = [
    "AtConsume",
    "AtWrite",
    "AttentionOutputL2",
    "AttentionTV",
    "KeyResidualAbs",
    "KeyResidualRel",
    "LatentResidual",
    "LogitLinf",
    "LogitOsc",
    "Metric",
    "MetricInfo",
    "NextTokenTV",
    "PerTokenL2",
    "PerTokenMax",
    "PooledError",
    "RecurrentStateError",
    "ResidualL2",
    "SelectorMass",
    "Site",
    "ValueResidual",
    "metric_info",
    "metric_name",
    "register_metric",
    "registered_metrics",
]


class Site:
    """Abstract marker for the place where an error is observed."""

    meaning: typing.ClassVar[str] = ""


@final
class AtWrite(Site):
    """Observed when the memory is written (e.g. right after quantizing a key)."""

    meaning = "observed when the memory entry is written"


@final
class AtConsume(Site):
    """Observed where the memory is consumed (e.g. inside attention at read time)."""

    meaning = "observed where the memory entry is consumed by attention"


# The default makes a bare ``KeyResidualAbs`` (site forgotten) mean ``KeyResidualAbs[Never]``,
# which no site-indexed stage accepts, instead of silently ``KeyResidualAbs[Any]``.
S = TypeVar("S", bound=Site, default=Never)
M = TypeVar("M", bound=type)


class Metric(Generic[S]):
    """Abstract base of every metric; subclass it and decorate with :func:`register_metric`.

    Metrics are types only: they are never instantiated.
    """

    def __init__(self) -> None:
        raise TypeError("metric classes are types, not values; use them as type arguments")


@final
@dataclass(frozen=True, slots=True)
class MetricInfo:
    """What a registered metric declares.

    Attributes:
        name: the class name.
        unit: the unit of its values (e.g. ``"probability mass"``).
        lo: smallest possible value.
        hi: largest possible value (``inf`` when unbounded).
        saturation: the value at which a bound says nothing (``None`` when none exists).
        meaning: one line saying what is measured.
    """

    name: str
    unit: str
    lo: float
    hi: float
    saturation: float | None
    meaning: str


# Append-only: register_metric adds a class once; nothing removes or replaces an entry.
_REGISTRY: dict[type, MetricInfo] = {}


def registered_metrics() -> Mapping[type, MetricInfo]:
    """A read-only view of the registry: metric class -> its declaration.

    Example:
        >>> from witcert_calculus.metrics import AttentionTV, registered_metrics
        >>> registered_metrics()[AttentionTV].saturation
        1.0
    """
    return MappingProxyType(_REGISTRY)


def register_metric(
    *, unit: str, meaning: str, lo: float = 0.0, hi: float = math.inf,
    saturation: float | None = None,
) -> Callable[[M], M]:
    """Register a metric class (a class decorator).

    Args:
        unit: the unit of the values, e.g. ``"logit"``.
        meaning: one line saying what the metric measures.
        lo: smallest possible value (default 0).
        hi: largest possible value (default unbounded).
        saturation: value at or above which a bound is vacuous (e.g. 1 for total
            variation); must lie in ``[lo, hi]``.

    Returns:
        The decorator; it returns the class unchanged after recording it.

    Raises:
        InvalidValueError: on an empty unit or meaning, ``lo > hi``, NaN bounds,
            or a saturation outside ``[lo, hi]``.
        NotAMetricError: if the class is not a subclass of :class:`Metric`.
        MetricAlreadyRegisteredError: if the class is already registered (built-in or
            user metric): the registry is append-only.

    Example:
        >>> from witcert_calculus.metrics import Metric, S, register_metric
        >>> @register_metric(unit="bits", meaning="code length excess")
        ... class CodeExcess(Metric[S]): ...
    """
    nonempty_text("unit", unit)
    nonempty_text("meaning", meaning)
    lo = real("lo", lo, allow_inf=True)
    hi = real("hi", hi, allow_inf=True)
    if saturation is not None:
        saturation = real("saturation", saturation)
    if math.isnan(lo) or math.isnan(hi) or lo > hi or lo == math.inf:
        raise InvalidValueError("(lo, hi)", (lo, hi), "must satisfy lo <= hi, not NaN")
    if saturation is not None and not (lo <= saturation <= hi) or (
        saturation is not None and math.isinf(saturation)
    ):
        raise InvalidValueError("saturation", saturation, f"must be finite and in [{lo}, {hi}]")

    def decorate(cls: M) -> M:
        target: type = cls
        if not issubclass(target, Metric):
            raise NotAMetricError(repr(target), "register_metric decorates subclasses of Metric")
        old = _REGISTRY.get(target)
        if old is not None:
            raise MetricAlreadyRegisteredError(
                target.__qualname__, f"unit {old.unit!r}, range [{old.lo}, {old.hi}], "
                f"saturation {old.saturation}")
        _REGISTRY[target] = MetricInfo(target.__name__, unit, float(lo), float(hi),
                                       None if saturation is None else float(saturation), meaning)
        return cls

    return decorate


def _is_concrete_site(obj: object) -> bool:
    return isinstance(obj, type) and issubclass(obj, Site) and obj is not Site


def _is_metric_class(obj: object) -> bool:
    return isinstance(obj, type) and issubclass(obj, Metric)


# Why this run-time check is the guard under mypy: a bare generic class used as a value is
# typed KeyResidualAbs[Any] by mypy (it does not apply the site parameter's default), and Any
# matches every site; pyright applies the default, Never, and rejects the stage statically.
_BARE_METRIC_NOTE = (
    "pyright --strict rejects a bare metric class statically ({name}[Never]); mypy cannot, "
    "since it types a bare generic class as {name}[Any], so this check at construction is "
    "the guard there (mypy's disallow_any_expr flags the Any)")


def _split(metric: object) -> tuple[type, type]:
    """Validate a parameterized metric and return (metric class, site class)."""
    origin: object = typing.get_origin(metric)
    args: tuple[object, ...] = typing.get_args(metric)
    if origin is None:
        if _is_metric_class(metric):
            name = str(getattr(metric, "__name__", metric))
            raise NotAMetricError(name, "the observation site is missing; write e.g. "
                                  f"{name}[AtConsume]. {_BARE_METRIC_NOTE.format(name=name)}")
        raise NotAMetricError(repr(metric), "expected a metric class with a site, "
                              "e.g. AttentionTV[AtConsume]")
    if not _is_metric_class(origin):
        raise NotAMetricError(repr(metric), "its origin is not a Metric subclass")
    cls = cast(type, origin)
    site = args[0] if len(args) == 1 else None
    if not _is_concrete_site(site):
        raise NotAMetricError(repr(metric), "its site must be a concrete Site such as AtConsume")
    if cls not in _REGISTRY:
        raise UnregisteredMetricError(f"{cls.__module__}.{cls.__qualname__}")
    return cls, cast(type, site)


def metric_info(metric: object) -> MetricInfo:
    """Return the registered declaration of a site-indexed metric.

    Args:
        metric: e.g. ``AttentionTV[AtConsume]``.

    Returns:
        Its :class:`MetricInfo`.

    Raises:
        NotAMetricError: if ``metric`` is not a metric class with a concrete site.
        UnregisteredMetricError: if the metric class was never registered.

    Example:
        >>> from witcert_calculus.metrics import LogitLinf, AtWrite, metric_info
        >>> metric_info(LogitLinf[AtWrite]).unit
        'logit'
    """
    return _REGISTRY[_split(metric)[0]]


def metric_name(metric: object) -> str:
    """Return ``"Name[Site]"`` for a site-indexed metric, validating it as :func:`metric_info`.

    Example:
        >>> from witcert_calculus.metrics import AttentionTV, AtConsume, metric_name
        >>> metric_name(AttentionTV[AtConsume])
        'AttentionTV[AtConsume]'
    """
    origin, site = _split(metric)
    return f"{origin.__name__}[{site.__name__}]"


def same_metric(left: object, right: object) -> bool:
    """True when two site-indexed metrics are the same class at the same site."""
    return _split(left) == _split(right)


def check_value(metric: object, value: float, *, what: str) -> float:
    """Validate that ``value`` lies in the metric's declared range; return it as float."""
    info = metric_info(metric)
    v = real(what, value, allow_inf=True)
    if math.isnan(v) or not (info.lo <= v <= info.hi) or math.isinf(v):
        raise InvalidValueError(what, value,
                                f"must be finite and in [{info.lo}, {info.hi}] for {metric_name(metric)}")
    return v


def _declare(unit: str, meaning: str, **kw: Any) -> Callable[[M], M]:
    return register_metric(unit=unit, meaning=meaning, **kw)


@final
@_declare("relative residual", "||k_hat - k|| / ||k|| of a stored key")
class KeyResidualRel(Metric[S]):
    """Relative l2 residual of a stored key."""


@final
@_declare("absolute l2", "||k_hat - k|| of a stored key, in key units")
class KeyResidualAbs(Metric[S]):
    """Absolute l2 residual of a stored key."""


@final
@_declare("absolute l2", "||v_hat - v|| of a stored value, in value units")
class ValueResidual(Metric[S]):
    """Absolute l2 residual of a stored value."""


@final
@_declare("logit", "max over tokens of |s_hat_t - s_t|, the logit sup-norm error")
class LogitLinf(Metric[S]):
    """Sup-norm error of the attention logits over the cached tokens."""


@final
@_declare("logit", "max_t Delta_t - min_t Delta_t, the oscillation of the logit error")
class LogitOsc(Metric[S]):
    """Oscillation of the logit error (max minus min over tokens)."""


@final
@_declare("probability mass", "total variation between exact and compressed attention",
          hi=1.0, saturation=1.0)
class AttentionTV(Metric[S]):
    """Total variation distance between two attention distributions (saturates at 1)."""


@final
@_declare("probability mass", "attention mass p(D) of the evicted keys, equal to the TV between "
          "full and kept attention", hi=1.0, saturation=1.0)
class DroppedMass(Metric[S]):
    """Attention mass of the tokens a cache evicted (saturates at 1)."""


@final
@_declare("probability mass", "selector-score mass swapped by a top-k selection",
          hi=1.0, saturation=1.0)
class SelectorMass(Metric[S]):
    """Mass of the selector's own score distribution (not attention mass)."""


@final
@_declare("absolute l2", "||y_hat - y|| of the attention output")
class AttentionOutputL2(Metric[S]):
    """l2 error of the attention output vector."""


@final
@_declare("absolute l2", "||c_hat - c|| of a compressed latent (MLA-style cache)")
class LatentResidual(Metric[S]):
    """Absolute l2 residual of a latent cache entry."""


@final
@_declare("absolute l2", "||h_hat - h|| of a recurrent state")
class RecurrentStateError(Metric[S]):
    """l2 error of a recurrent (state-space or linear-attention) state."""


@final
@_declare("absolute l2", "per-token errors aggregated in l2: sqrt(sum_i e_i^2)")
class PerTokenL2(Metric[S]):
    """Per-token errors pooled with the l2 caliber."""


@final
@_declare("absolute", "per-token errors aggregated by max: max_i |e_i|")
class PerTokenMax(Metric[S]):
    """Per-token errors pooled with the max caliber."""


@final
@_declare("absolute", "|sum_i w_i e_i|, the error after gate-weighted pooling")
class PooledError(Metric[S]):
    """Error after pooling per-token errors with gate weights."""


@final
@_declare("absolute l2", "||h_hat - h|| of the residual stream (the hidden state) at the current "
          "token, in hidden-state units")
class ResidualL2(Metric[S]):
    """l2 error of a transformer's residual stream at one token, between two layers."""


@final
@_declare("probability mass", "total variation between the exact and the served next-token "
          "distributions", hi=1.0, saturation=1.0)
class NextTokenTV(Metric[S]):
    """Total variation between two next-token distributions (saturates at 1)."""


def at(metric: type, site: type[Site]) -> Any:
    """Parameterize a metric class by a site chosen at run time (``at(AttentionTV, AtWrite)``).

    The result is typed ``Any``; callers cast it to the precise type they promise.
    """
    if not _is_concrete_site(site):
        raise NotAMetricError(repr(site), "a site must be a concrete Site such as AtConsume")
    param: Any = metric
    return param[site]
