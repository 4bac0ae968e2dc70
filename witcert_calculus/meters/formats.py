"""Format witnesses: the residual bound a stored fp8 code carries by itself (Tier A).

A cache that stores keys as fp8 codes with a scale ``s`` holds ``k_hat = s * q`` for the
code's value ``q``. When the writer's rounding rule is known, the code alone bounds the
residual of every channel: the true key ``x`` lies within one grid step of ``s * q``. That
*format witness* costs no stored byte, and it bounds each channel separately, so the logit
error obeys the box bound ``|scale <q, r_t>| <= c_t = scale sum_c |q_c| w_{t,c}``, the exact
maximum of the logit error over the box (Cauchy-Schwarz over bands is looser when the
residual's channels differ in size).

The writer modelled: ``v = fl32(x * fl32(1/s))`` (or ``fl32(x / s)``), clamped to the
format's largest finite value, then rounded to a code, toward zero (:attr:`Rounding.TRUNCATE`,
vLLM's CPU writer) or to nearest (:attr:`Rounding.NEAREST`). With ``g`` the grid step at
the code (its unit in the last place; the subnormal step below the smallest normal):

1. the rounding leaves ``|v - q| <= g`` (truncation; Lean
   ``WitCert.Formats.trunc_residual_le``: the float32 rescaling of a subnormal ``v`` may
   round up by less than ``2^-30`` of a step, covered by the same ``g``), ``<= g / 2``
   (nearest; ``WitCert.Formats.nearest_residual_le``);
2. the float32 arithmetic leaves ``|x - s v| <= s (eta |v| + eps)`` with ``eta = 2^-22``
   (two roundings of relative size ``2^-24``) and ``eps = 2^-149`` (a product that
   underflows);
3. so ``|x - s q| <= w = s (g' + eta (|q| + g') + eps)`` with ``g'`` the step of (1)
   (Lean ``WitCert.Formats.format_residual_le``).

A code at the format's largest magnitude (``0x7E`` for e4m3, ``0x7B`` for e5m2) may hold a
clamped value of any size (and the writer maps NaN and infinities there): its witness is
``inf``, which saturates every bound that uses it; it is never clamped into a number.

Which rounding an engine uses, and that its bytes are exactly the model's, is established by
the adapter that reads the cache (vLLM's plugin compares every written byte with the model's
bytes); this module takes the rule as an argument.

Main declarations
-----------------
- :class:`Fp8Format`, :class:`Rounding`.
- :func:`code_value`, :func:`code_step`: a code's exact value and grid step.
- :func:`witness_exact`: ``w`` of one code as an exact rational (``None``: saturated).
- :func:`witness_table`: ``w`` of all 256 codes at a scale, rounded upward to float64.
- :func:`format_witness`: ``w`` of an array of codes.
- :func:`format_logit_bound`: ``c_t = scale sum_c |q_c| w_{t,c}`` as an established
  :class:`~witcert_calculus.meters.witness.LogitBound`.
"""

from __future__ import annotations

import enum
from fractions import Fraction
from functools import lru_cache
from typing import Final, final

import numpy as np
from numpy.typing import ArrayLike

from witcert_calculus.errors import InvalidValueError
from witcert_calculus.numerics.rounding import logit_margin, outward
from witcert_calculus.lean.theorems import BOX_LOGIT_BOUND_METER_SOUND, FORMAT_RESIDUAL_LE, \
    NEAREST_RESIDUAL_LE, TRUNC_RESIDUAL_LE
from witcert_calculus.numerics.validation import F64, finite_array, float_up, int_array, nonneg_array, real
from witcert_calculus.tiers import Proof, _premise, _proof  # pyright: ignore[reportPrivateUsage]
# The one construction of an established bound (not public API).
from witcert_calculus.meters.witness import LogitBound, _add_shapes, _establish, _read_only  # pyright: ignore[reportPrivateUsage]

__all__ = ["EPS", "ETA", "Fp8Format", "Rounding", "code_step", "code_value",
           "format_logit_bound", "format_witness", "witness_exact", "witness_table"]

#: Relative slack of the writer's float32 arithmetic: ``1/((1 - 2^-24)^2) - 1 < 2^-22``.
ETA: Final = Fraction(1, 2**22)
#: Absolute slack of a float32 product that underflows (half its spacing ``2^-149``, twice).
EPS: Final = Fraction(1, 2**149)


@final
class Fp8Format(enum.Enum):
    """An 8-bit floating-point storage format (sign, exponent, mantissa; no infinities used)."""

    E4M3 = "e4m3"
    """4 exponent bits (bias 7), 3 mantissa bits; largest finite 448 (``0x7E``)."""
    E5M2 = "e5m2"
    """5 exponent bits (bias 15), 2 mantissa bits; largest finite 57344 (``0x7B``)."""

    @property
    def mantissa_bits(self) -> int:
        """Stored mantissa bits."""
        return 3 if self is Fp8Format.E4M3 else 2

    @property
    def bias(self) -> int:
        """Exponent bias."""
        return 7 if self is Fp8Format.E4M3 else 15

    @property
    def max_code(self) -> int:
        """The magnitude code of the largest finite value, where the writer clamps."""
        return 0x7E if self is Fp8Format.E4M3 else 0x7B


@final
class Rounding(enum.Enum):
    """How a writer rounds the rescaled value onto the format's grid."""

    TRUNCATE = "toward zero"
    """Round toward zero: ``|v - q| < g`` (vLLM's CPU writer)."""
    NEAREST = "to nearest"
    """Round to nearest: ``|v - q| <= g / 2``."""


def _code(code: int) -> int:
    if isinstance(code, bool) or not isinstance(code, (int, np.integer)) or not 0 <= code < 256:
        raise InvalidValueError("code", code, "must be an integer in [0, 256)")
    return int(code)


def code_value(code: int, fmt: Fp8Format) -> Fraction:
    """The exact value of an fp8 code (codes above the largest finite one included).

    Example:
        >>> code_value(0x7E, Fp8Format.E4M3), code_value(0x81, Fp8Format.E4M3)
        (Fraction(448, 1), Fraction(-1, 512))
    """
    c = _code(code)
    m = fmt.mantissa_bits
    mag = c & 0x7F
    e, f = mag >> m, mag & ((1 << m) - 1)
    unit = code_step(c, fmt)
    value = f * unit if e == 0 else ((1 << m) + f) * unit
    return -value if c & 0x80 else value


def code_step(code: int, fmt: Fp8Format) -> Fraction:
    """The grid step ``g`` at a code: its unit in the last place (the subnormal step for
    zero and subnormals).

    Example:
        >>> code_step(0x00, Fp8Format.E4M3), code_step(0x38, Fp8Format.E4M3)
        (Fraction(1, 512), Fraction(1, 8))
    """
    c = _code(code)
    e = (c & 0x7F) >> fmt.mantissa_bits
    return Fraction(2) ** (max(e, 1) - fmt.bias - fmt.mantissa_bits)


def witness_exact(code: int, fmt: Fp8Format, rounding: Rounding,
                  scale: Fraction) -> Fraction | None:
    """``w = s (g' + eta (|q| + g') + eps)`` for one code, exactly; ``None`` when the code
    may hold a clamped value (saturated).

    Args:
        code: the stored byte.
        fmt, rounding: the format and the writer's rounding.
        scale: the scale ``s`` the cache dequantizes with (exact, > 0).

    Example:
        >>> w = witness_exact(0x38, Fp8Format.E4M3, Rounding.TRUNCATE, Fraction(1))
        >>> w > Fraction(1, 8), w < Fraction(1, 8) * (1 + Fraction(1, 2**18))
        (True, True)
    """
    c = _code(code)
    if not (isinstance(scale, Fraction) and scale > 0):
        raise InvalidValueError("scale", scale, "must be an exact rational > 0")
    if (c & 0x7F) >= fmt.max_code:
        return None
    g = code_step(c, fmt)
    if rounding is Rounding.NEAREST:
        g = g / 2
    return scale * (g + ETA * (abs(code_value(c, fmt)) + g) + EPS)


def _kinds(fmt: object, rounding: object) -> tuple[Fp8Format, Rounding]:
    # Checked before the cached table is looked up (its key must be hashable).
    if not isinstance(fmt, Fp8Format):
        raise InvalidValueError("fmt", fmt, "must be an Fp8Format")
    if not isinstance(rounding, Rounding):
        raise InvalidValueError("rounding", rounding, "must be a Rounding")
    return fmt, rounding


def _scale(scale: float) -> float:
    s = real("scale", scale, lo=0.0, lo_open=True)
    if s == float("inf"):
        raise InvalidValueError("scale", scale, "must be finite")
    return s


@lru_cache(maxsize=64)
def _table(fmt: Fp8Format, rounding: Rounding, scale: float) -> F64:
    s = Fraction(scale)
    table = np.empty(256, dtype=np.float64)
    for c in range(256):
        w = witness_exact(c, fmt, rounding, s)
        table[c] = np.inf if w is None else float_up(w)
    return _read_only(table)


def witness_table(fmt: Fp8Format, rounding: Rounding, *, scale: float) -> F64:
    """``w`` of every code ``0..255`` at scale ``scale``, each rounded upward (``inf``:
    saturated); read-only, cached per arguments.

    Args:
        fmt, rounding: the format and the writer's rounding.
        scale: the scale the cache dequantizes with, as a float (finite, > 0).

    Raises:
        InvalidValueError: a scale that is not finite and positive.

    Example:
        >>> t = witness_table(Fp8Format.E4M3, Rounding.TRUNCATE, scale=1.0)
        >>> float(t[0x7E]), bool(t[0x38] > 0.125)
        (inf, True)
    """
    return _table(*_kinds(fmt, rounding), _scale(scale))


def format_witness(codes: ArrayLike, *, fmt: Fp8Format, rounding: Rounding,
                   scale: float) -> F64:
    """Per-channel residual bounds ``w`` of stored codes: ``|x - s q| <= w`` channel by channel.

    Args:
        codes: stored bytes (any shape, integers in ``[0, 256)``).
        fmt, rounding: the format and the writer's rounding.
        scale: the scale the cache dequantizes with.

    Returns:
        float64 array of the codes' shape (``inf`` where a code is saturated).

    Raises:
        InvalidValueError: a code outside ``[0, 256)`` or a bad scale.

    Example:
        >>> format_witness([0, 0x7E], fmt=Fp8Format.E4M3, rounding=Rounding.TRUNCATE,
        ...                scale=1.0)[1]
        np.float64(inf)
    """
    c = int_array("codes", codes)
    if c.size and (c.min() < 0 or c.max() > 255):
        raise InvalidValueError("codes", f"array of {c.dtype}", "must hold integers in [0, 256)")
    out: F64 = witness_table(fmt, rounding, scale=scale)[c.astype(np.intp)]
    return out


def box_evidence(*, scale: float, channels: int, witness_ok: bool | None) -> Proof:
    """Evidence of ``c_t = scale sum_c |q_c| w_{t,c}``: the box bound, with its premises
    computed (``witness_ok=None``: that premise is deferred to the bound's checks)."""
    premises = [_premise("scale >= 0", scale >= 0),
                _premise(f"the query's {channels} channels meet the witness's channel by "
                        "channel (equal head dimensions)", channels > 0)]
    if witness_ok is not None:
        premises.append(_premise(BOX_PREMISE, witness_ok))
    return _proof(BOX_LOGIT_BOUND_METER_SOUND, tuple(premises))


#: The premise on the per-channel witnesses (computed eagerly by numpy, deferred by torch).
BOX_PREMISE: Final = ("w[t, c] >= 0 for every token and channel, not NaN (|r_c| <= w: the "
                      f"format witness, {FORMAT_RESIDUAL_LE} with {TRUNC_RESIDUAL_LE} or "
                      f"{NEAREST_RESIDUAL_LE})")


def format_logit_bound(query: ArrayLike, witness: ArrayLike, *, scale: float
                       ) -> LogitBound[F64]:
    """Per-token logit error bound ``c_t = scale sum_c |q_c| w_{t,c}``, established.

    Lean: ``WitCert.Semantic.box_logit_bound_meter_sound`` (``WitCert.Formats.box_logit_bound_sound`` about the score contract). ``w`` bounds each channel of the key
    residual (:func:`format_witness`). An infinite witness saturates its token (``c_t =
    inf``), even where it meets an exactly zero query channel (whose exact product is 0):
    an upper bound, and the rule the batched torch twin can follow without a host read.
    Rounded outward with the margin of a sum of ``d`` products
    (:func:`~witcert_calculus.numerics.rounding.logit_margin`).

    Args:
        query: the query of this head, shape ``(d,)``, in the frame of the stored keys.
        witness: per-channel witnesses, shape ``(S, d)`` (or ``(d,)``).
        scale: the attention scale (> 0).

    Returns:
        A :class:`~witcert_calculus.meters.witness.LogitBound` (``delta = 0``), values of shape
        ``(S,)`` (or ``()``), read-only.

    Raises:
        InvalidValueError: shapes that do not meet, a NaN or negative witness, a bad query or
            scale.

    Example:
        >>> c = format_logit_bound(np.array([2.0, -1.0]), np.array([[0.5, 0.25]]), scale=0.5)
        >>> float(c.values[0]) >= 0.625
        True
    """
    q = finite_array("query", query, ndim=1)
    w = nonneg_array("witness", witness, ndim=(1, 2), allow_inf=True)
    s = real("scale", scale, lo=0.0, lo_open=True)
    d = int(q.shape[0])
    if int(w.shape[-1]) != d:
        raise InvalidValueError("witness", f"array of shape {w.shape}",
                                f"must have the query's {d} channels in its last axis")
    aq = np.abs(q)
    with np.errstate(invalid="ignore", over="ignore"):
        prod = w * aq
        prod = np.where(np.isnan(prod), np.inf, prod)  # inf * 0: saturate the token
        c: F64 = np.asarray(prod.sum(axis=-1) * s, dtype=np.float64)
    margin = logit_margin(d, scale=s)
    exact = (w == 0).all(axis=-1) | bool((aq == 0).all())
    values = outward(c, gamma=margin.gamma, alpha=margin.alpha, exact=np.asarray(exact))
    evidence = box_evidence(scale=s, channels=d, witness_ok=bool((w >= 0).all()))
    return _establish(_read_only(values), evidence=evidence, delta=Fraction(0),
                      source="witcert_calculus.meters.formats.format_logit_bound",
                      add=_add_shapes)
