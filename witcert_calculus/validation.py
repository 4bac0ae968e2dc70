"""Input validation shared by the meter modules (each failure names the value)."""

from __future__ import annotations

import math
import numbers

import numpy as np
from numpy.typing import ArrayLike, NDArray

from witcert_calculus.errors import InvalidValueError

F64 = NDArray[np.float64]

#: Unit roundoff of IEEE binary64.
UNIT_ROUNDOFF = 2.0**-53

#: Tolerance on ``sum(p_tilde) - 1`` for inputs that are meant to be distributions.
PROB_SUM_ATOL = 1e-6


def as_float_array(name: str, value: ArrayLike, *, ndim: int | tuple[int, ...]) -> F64:
    """Convert to a float64 array of the given rank; reject NaN."""
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidValueError(name, value, f"must be a real array ({exc})") from None
    dims = (ndim,) if isinstance(ndim, int) else ndim
    if arr.ndim not in dims:
        raise InvalidValueError(name, f"array of shape {arr.shape}",
                                f"must have rank {' or '.join(map(str, dims))}")
    if np.isnan(arr).any():
        raise InvalidValueError(name, f"array with NaN at {np.argwhere(np.isnan(arr))[0].tolist()}",
                                "must not contain NaN")
    return arr


def finite_array(name: str, value: ArrayLike, *, ndim: int | tuple[int, ...]) -> F64:
    """As :func:`as_float_array`, and reject infinities."""
    arr = as_float_array(name, value, ndim=ndim)
    bad = ~np.isfinite(arr)
    if bad.any():
        idx = np.argwhere(bad)[0].tolist()
        raise InvalidValueError(f"{name}{idx}", float(arr[tuple(idx)]), "must be finite")
    return arr


def nonneg_array(name: str, value: ArrayLike, *, ndim: int | tuple[int, ...],
                 allow_inf: bool = False) -> F64:
    """A float64 array with every entry >= 0 (``+inf`` allowed only when asked)."""
    arr = as_float_array(name, value, ndim=ndim) if allow_inf else finite_array(
        name, value, ndim=ndim)
    neg = arr < 0
    if neg.any():
        idx = np.argwhere(neg)[0].tolist()
        raise InvalidValueError(f"{name}{idx}", float(arr[tuple(idx)]), "must be >= 0")
    return arr


def distribution(name: str, value: ArrayLike, *, ndim: int | tuple[int, ...] = 1) -> F64:
    """Non-negative weights summing to 1 (within 1e-6) along the last axis, renormalized.

    Renormalizing makes the bound refer to the distribution the weights define, so
    rounding in the caller's normalization never enters the bound.
    """
    arr = nonneg_array(name, value, ndim=ndim)
    if arr.shape[-1] == 0:
        raise InvalidValueError(name, "empty array", "must hold at least one token")
    total = arr.sum(axis=-1, keepdims=True)
    off = np.abs(total - 1.0) > PROB_SUM_ATOL
    if off.any():
        raise InvalidValueError(f"sum({name})", float(total[np.argwhere(off)[0][0]][0])
                                if total.ndim > 1 else float(total[0]),
                                f"must be 1 within {PROB_SUM_ATOL}")
    out: F64 = arr / total
    return out


def positive_int(name: str, value: object, *, minimum: int = 1) -> int:
    """An ``int`` (not bool) that is at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidValueError(name, value, "must be an int")
    v = int(value)
    if v < minimum:
        raise InvalidValueError(name, value, f"must be >= {minimum}")
    return v


def real(name: str, value: object, *, lo: float = -math.inf, hi: float = math.inf,
         lo_open: bool = False, hi_open: bool = False, allow_inf: bool = False) -> float:
    """A real scalar in the stated interval."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidValueError(name, value, "must be a real number")
    v = float(value)
    if math.isnan(v) or (math.isinf(v) and not allow_inf):
        raise InvalidValueError(name, value, "must be finite" if not allow_inf else "must not be NaN")
    if v < lo or (lo_open and v == lo) or v > hi or (hi_open and v == hi):
        left = "(" if lo_open else "["
        right = ")" if hi_open else "]"
        raise InvalidValueError(name, value, f"must lie in {left}{lo}, {hi}{right}")
    return v
