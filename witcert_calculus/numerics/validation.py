"""Input validation: every check of a user-supplied value, each failure naming the value.

The scalar checks serve the numpy-free core (contracts, tiers) as well as the meters, so
this module imports numpy only when an array check runs; ``F64`` resolves on first use.

Main declarations:

- scalars: :func:`exact` (a finite, nonnegative exact rational, at most ``FLOAT_MAX``),
  :func:`number`, :func:`real`, :func:`positive_int`, :func:`count`, :func:`head_dim`, :func:`request_id` (the one rule for
  a request id), :func:`timeout_seconds`;
- arrays: :func:`real_array` and :func:`as_float_array` (real numbers only: no text,
  bools, complex or objects), :func:`int_array`, :func:`finite_array`, :func:`nonneg_array`, :func:`distribution`,
  :func:`is_distribution`; the alias ``F64``.

Every refusal is an :class:`~witcert_calculus.errors.InvalidValueError` (a ``ValueError``)
that names the parameter and shows the value; no builtin ``TypeError``, ``OverflowError`` or
``AttributeError`` escapes from a check.
"""

from __future__ import annotations

import math
import numbers
import sys
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Final, cast

from witcert_calculus.errors import InvalidValueError

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import ArrayLike, NDArray

    F64 = NDArray[np.float64]


def __getattr__(name: str) -> Any:
    # ``F64`` at run time, without importing numpy for the core (PEP 562).
    if name == "F64":
        import numpy as np
        from numpy.typing import NDArray
        return NDArray[np.float64]
    raise AttributeError(f"module 'witcert_calculus.numerics.validation' has no attribute {name!r}")


#: Unit roundoff of IEEE binary64.
UNIT_ROUNDOFF = 2.0**-53

#: Tolerance on ``sum(p_tilde) - 1`` for inputs that are meant to be distributions.
PROB_SUM_ATOL = 1e-6

#: The largest finite float; an exact coefficient above it could not be reported.
FLOAT_MAX: Final = Fraction(sys.float_info.max)

#: Largest request id: ids are stored as signed 64-bit integers (slot owners, journal rows).
REQUEST_ID_MAX: Final = 2**63 - 1

#: Longest wait for a journal's write lock, in seconds (SQLite takes it in ms as a C int).
TIMEOUT_MAX_S: Final = (2**31 - 1) / 1000


def _to_float(value: numbers.Real | int | float | Fraction) -> float:
    # float() of an int or Fraction beyond the float range raises OverflowError; it is +-inf.
    try:
        return float(value)
    except OverflowError:
        return math.inf if cast(Any, value) > 0 else -math.inf


def real_array(name: str, value: ArrayLike) -> F64:
    """Convert to a float64 array of any shape, taking real numbers only.

    Text, bools, complex numbers and objects that are not real numbers are refused: numpy
    would read ``"0.5"`` as 0.5, ``True`` as 1.0 and drop an imaginary part.
    """
    import numpy as np

    try:
        raw = np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise InvalidValueError(name, value, f"must be a real array ({exc})") from None
    kind = raw.dtype.kind
    if kind == "O":  # e.g. Fractions: each entry must be a real number (rare; not a hot path)
        if not all(isinstance(x, numbers.Real) and not isinstance(x, bool) for x in raw.flat):
            raise InvalidValueError(name, value, "must be a real array (every entry a real "
                                    "number, no text, bool, complex or None)")
    elif kind not in "iuf":
        what = {"b": "bool", "c": "complex", "U": "text", "S": "bytes"}.get(kind, str(raw.dtype))
        raise InvalidValueError(name, value, f"must be a real array, not {what} (the value "
                                "would be reinterpreted, e.g. an imaginary part dropped)")
    try:
        with np.errstate(over="ignore"):
            arr: F64 = raw.astype(np.float64, copy=False)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidValueError(name, value, f"must be a real array ({exc})") from None
    return arr


def int_array(name: str, value: ArrayLike) -> NDArray[np.int64]:
    """Convert to an int64 array of any shape, taking integers only (not bools; empty is fine)."""
    import numpy as np

    try:
        raw = np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise InvalidValueError(name, value, f"must be an integer array ({exc})") from None
    if raw.size == 0:
        return np.zeros(raw.shape, dtype=np.int64)
    if raw.dtype.kind not in "iu":
        raise InvalidValueError(name, value, "must be an integer array")
    if raw.dtype.kind == "u" and raw.dtype.itemsize == 8 and bool((raw > 2**63 - 1).any()):
        raise InvalidValueError(name, value, "must hold integers below 2**63")
    out: NDArray[np.int64] = raw.astype(np.int64)
    return out


def as_float_array(name: str, value: ArrayLike, *, ndim: int | tuple[int, ...]) -> F64:
    """Convert to a float64 array of the given rank (:func:`real_array`); reject NaN."""
    import numpy as np

    arr = real_array(name, value)
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
    import numpy as np

    arr = as_float_array(name, value, ndim=ndim)
    bad = ~np.isfinite(arr)
    if bad.any():
        idx = np.argwhere(bad)[0].tolist()
        raise InvalidValueError(f"{name}{idx}", float(arr[tuple(idx)]), "must be finite")
    return arr


def nonneg_array(name: str, value: ArrayLike, *, ndim: int | tuple[int, ...],
                 allow_inf: bool = False) -> F64:
    """A float64 array with every entry >= 0 (``+inf`` allowed only when asked)."""
    import numpy as np

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
    import numpy as np

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


def is_distribution(p: F64) -> bool:
    """Whether every row of ``p`` (last axis) is a probability vector: finite, nonnegative,
    summing to 1 within :data:`PROB_SUM_ATOL`; the truth value of that premise, not a raise."""
    import numpy as np

    if p.ndim == 0 or p.shape[-1] == 0:
        return False
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(p).all() and (p >= 0).all() and (
            np.abs(p.sum(axis=-1) - 1.0) <= PROB_SUM_ATOL).all()
    return bool(ok)


def nonempty_text(name: str, value: object) -> str:
    """A ``str`` with at least one non-blank character (a statement, a reason, a key)."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidValueError(name, value, "must be a non-empty text")
    return value


def positive_int(name: str, value: object, *, minimum: int = 1,
                 maximum: int | None = None) -> int:
    """An ``int`` (not bool; numpy integers too) that is at least ``minimum`` (and at most
    ``maximum``, when given)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidValueError(name, value, "must be an int")
    v = int(value)
    if v < minimum:
        raise InvalidValueError(name, _short(value), f"must be >= {minimum}")
    if maximum is not None and v > maximum:
        raise InvalidValueError(name, _short(value), f"must be <= {maximum}")
    return v


#: Largest head dimension: far above any model's, small enough that per-channel arrays fit.
HEAD_DIM_MAX: Final = 2**16

#: Largest count of tokens, slots or draws: an int64, and exact as a float up to 2**53.
COUNT_MAX: Final = 2**53


def head_dim(name: str, value: object, *, minimum: int = 1) -> int:
    """A head dimension: an int in ``[minimum, HEAD_DIM_MAX]``."""
    return positive_int(name, value, minimum=minimum, maximum=HEAD_DIM_MAX)


def count(name: str, value: object, *, minimum: int = 1) -> int:
    """A count of tokens, slots, rounds or draws: an int in ``[minimum, COUNT_MAX]``."""
    return positive_int(name, value, minimum=minimum, maximum=COUNT_MAX)


def request_id(name: str, value: object) -> int:
    """A request id: a Python or numpy integer (not bool) in ``[1, REQUEST_ID_MAX]``.

    The one rule for every entry point that takes a request id (the ledger, its accounts and
    slot table), so ``np.int64(3)`` names request 3 everywhere and ``True`` names none.
    """
    if type(value) is int and 1 <= value <= REQUEST_ID_MAX:  # the common case
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidValueError(name, value, "must be an int (a request id; not a bool)")
    v = int(value)
    if not 1 <= v <= REQUEST_ID_MAX:
        raise InvalidValueError(name, value, "must lie in [1, 2**63 - 1] (a request id)")
    return v


def timeout_seconds(name: str, value: object) -> float:
    """A wait in seconds: a finite real (not bool) in ``[0, TIMEOUT_MAX_S]``."""
    return real(name, value, lo=0.0, hi=TIMEOUT_MAX_S)


def integer(name: str, value: object) -> int:
    """An ``int`` (not bool; numpy integers too), e.g. a request id or a slot index."""
    if type(value) is int:  # the common case, without the abstract-class check
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidValueError(name, value, "must be an int")
    return int(value)


def nonneg_int(name: str, value: object) -> int:
    """An ``int`` (not bool; numpy integers too) that is ``>= 0``, e.g. an index or a count."""
    if type(value) is int and value >= 0:  # the common case, without the abstract-class check
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < 0:
        raise InvalidValueError(name, value, "must be an int >= 0")
    return int(value)


def unit_rational(name: str, value: object, *, open_interval: bool = False,
                  text: bool = False) -> Fraction:
    """An exact rational in ``[0, 1]`` (or, with ``open_interval``, in ``(0, 1)``).

    Ints, Fractions and floats are taken exactly (a float's binary value, not its
    decimal spelling); with ``text``, strings such as ``"1/100"`` too. Bools,
    NaN and infinities are refused.
    """
    where = "(0, 1)" if open_interval else "[0, 1]"
    if isinstance(value, bool) or not isinstance(value, (int, float, Fraction, str)) or (
            isinstance(value, str) and not text):
        raise InvalidValueError(name, value, f"must be a number in {where}")
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidValueError(name, value, f"must be finite, in {where}")
    try:
        fr = Fraction(value)
    except (ValueError, ZeroDivisionError) as exc:
        raise InvalidValueError(name, value, f"is not a number ({exc})") from None
    if not (0 < fr < 1 if open_interval else 0 <= fr <= 1):
        interval = "the open interval (0, 1)" if open_interval else "the closed interval [0, 1]"
        raise InvalidValueError(name, value, f"must lie in {interval}")
    return fr


def nonneg_real(name: str, value: object) -> float:
    """A finite real scalar (not bool; numpy scalars and Fractions too) that is ``>= 0``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidValueError(name, value, "must be a real number")
    v = _to_float(value)
    if not (math.isfinite(v) and v >= 0.0):
        raise InvalidValueError(name, value, "must be finite and >= 0")
    return v


def real(name: str, value: object, *, lo: float = -math.inf, hi: float = math.inf,
         lo_open: bool = False, hi_open: bool = False, allow_inf: bool = False) -> float:
    """A real scalar in the stated interval."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidValueError(name, value, "must be a real number")
    v = _to_float(value)
    if math.isnan(v) or (math.isinf(v) and not allow_inf):
        raise InvalidValueError(name, value, "must be finite" if not allow_inf else "must not be NaN")
    if v < lo or (lo_open and v == lo) or v > hi or (hi_open and v == hi):
        left = "(" if lo_open else "["
        right = ")" if hi_open else "]"
        raise InvalidValueError(name, value, f"must lie in {left}{lo}, {hi}{right}")
    return v


def number(name: str, value: object) -> float:
    """An ``int``, ``float`` or ``Fraction`` (not bool) as a float; NaN and infinities pass."""
    if isinstance(value, bool) or not isinstance(value, (int, float, Fraction)):
        raise InvalidValueError(name, value, "must be a number")
    return _to_float(value)


def exact(value: object, name: str, *, upper: Fraction | None = None,
          strict_upper: bool = False) -> Fraction:
    """Convert a finite, nonnegative number to an exact Fraction, or raise naming it.

    Ints (numpy integers too), floats and Fractions are taken exactly; a value above the
    largest float (:data:`FLOAT_MAX`) is refused, since no bound built on it could be reported.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, Fraction, numbers.Integral)):
        raise InvalidValueError(name, value, "must be an int, float or Fraction")
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidValueError(name, value, "must be finite")
    fr = Fraction(int(value)) if isinstance(value, numbers.Integral) else Fraction(value)
    if fr < 0:
        raise InvalidValueError(name, _short(value), "must be >= 0")
    if fr > FLOAT_MAX:
        raise InvalidValueError(name, _short(value),
                                "must not exceed the largest float (1.7976931348623157e+308)")
    if upper is not None and (fr >= upper if strict_upper else fr > upper):
        bound = f"< {upper}" if strict_upper else f"<= {upper}"
        raise InvalidValueError(name, value, f"must be {bound}")
    return fr



def uint(name: str, value: object, *, bits: int) -> int:
    """An ``int`` (not bool; numpy integers too) in ``[0, 2^bits)``, e.g. a counter word."""
    v = positive_int(name, value, minimum=0)
    if v >= 2**bits:
        raise InvalidValueError(name, value, f"must be < 2^{bits}")
    return v


def weights_and_bounds(p_tilde: ArrayLike, c: ArrayLike, *, ndim: int) -> tuple[F64, F64]:
    """A distribution ``p_tilde`` (see :func:`distribution`) and bounds ``c >= 0`` of its shape.

    ``c`` may hold ``+inf`` (a bound that says nothing); NaN and negative entries are refused.
    """
    p = distribution("p_tilde", p_tilde, ndim=ndim)
    cc = nonneg_array("c", c, ndim=ndim, allow_inf=True)
    if cc.shape != p.shape:
        raise InvalidValueError("c", f"array of shape {cc.shape}",
                                f"must have the shape of p_tilde {p.shape}")
    return p, cc


def open_level(name: str, value: object) -> float:
    """A level in the open interval (0, 1) as a float (exact input; refused if it rounds to 0 or 1)."""
    d = float(unit_rational(name, value, open_interval=True))
    if not 0.0 < d < 1.0:  # a Fraction that rounds to 0.0 or 1.0
        raise InvalidValueError(name, value, "must lie in the open interval (0, 1)")
    return d


def positive_finite(name: str, value: float) -> float:
    """A finite real ``> 0`` (not bool, not text; numpy scalars and Fractions too)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidValueError(name, value, "must be a real number")
    v = _to_float(value)
    if not (math.isfinite(v) and v > 0):
        raise InvalidValueError(name, value, "must be finite and > 0")
    return v


def _short(value: object) -> object:
    # A huge exact number shown by its size, not by its four hundred digits.
    if isinstance(value, (int, Fraction)) and not isinstance(value, bool):
        exact_value = Fraction(value)
        if abs(exact_value) > FLOAT_MAX:
            sign = "-" if exact_value < 0 else ""
            return f"{sign}~10**{len(str(abs(int(exact_value)))) - 1}"
    return value


def float_up(value: Fraction) -> float:
    """The smallest float not below an exact rational (a bound converted once, at the edge).

    ``inf`` above the largest float: an overflow reports saturation, never a finite value.
    """
    if value > FLOAT_MAX:
        return math.inf
    if value < -FLOAT_MAX:
        return -sys.float_info.max
    f = float(value)
    return f if Fraction(f) >= value else math.nextafter(f, math.inf)


def float_down(value: Fraction) -> float:
    """The largest float not above an exact rational (0.0 below the smallest subnormal;
    ``-inf`` below the most negative float, the largest float above it)."""
    if value > FLOAT_MAX:
        return sys.float_info.max
    if value < -FLOAT_MAX:
        return -math.inf
    f = float(value)
    return f if Fraction(f) <= value else math.nextafter(f, -math.inf)



def json_object(value: object) -> dict[str, Any] | None:
    """A parsed JSON (or TOML) value as an object with string keys, or ``None`` if it is not one."""
    if not isinstance(value, dict):
        return None
    obj = cast("dict[object, Any]", value)
    if not all(isinstance(k, str) for k in obj):
        return None
    return cast("dict[str, Any]", obj)
