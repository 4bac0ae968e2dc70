"""Outward rounding: the one rule by which every float64 bound is reported, and its margins.

A bound is a real number ``x``; its binary64 evaluation ``y`` may fall on either side of
it. The value reported is

    ``outward(y) = next_up(y * (1 + gamma) + alpha)``

- ``gamma`` bounds the relative evaluation error of the formula to first order, in units
  of the unit roundoff ``u = 2^-53`` (each formula's derivation is stated below, next to
  its margin function);
- ``alpha`` bounds the absolute error of intermediate results in the subnormal range
  (multiples of :data:`TINY`, which is 32 times the half spacing ``2^-1075`` there);
- ``next_up`` (one step toward ``+inf``) absorbs the rounding of this very expression and
  every second-order term: it adds more than ``u`` relative.

Two cases pass through unchanged: a value that is *exact* (the inputs make it exactly 0,
e.g. every ``c_t = 0``) and a value that is not finite (``inf`` reports saturation, NaN an
invalid input; neither is ever clamped into a finite number).

A bound that is later *added* to others (the parts of a per-token logit bound: the band
witness term of each logit part, the Tier-B radius, its grid-mean and its cast term)
carries :data:`SUM_SLACK` more units of roundoff in its ``gamma``: a sum of up to four such
nonnegative bounds, rounded to nearest, is then still an upper bound of the exact sum.

Storing a bound in a narrower type (float32, float16) rounds toward ``+inf``: the next
representable value up wherever the nearest cast went down; an overflow gives ``inf``.

The numpy reference (:mod:`witcert_calculus.meters.witness`,
:mod:`witcert_calculus.meters.tv_forms`, :mod:`witcert_calculus.meters.dither`,
:mod:`witcert_calculus.meters.output_bound`) and the torch versions in the ``witcert_kernels``
package apply :func:`outward` with the margins below, computed by the same functions, so that both
are outward and agree to a few ulps.

Main declarations:

- :func:`outward`: the rule on float64 arrays (the torch package has its twin).
- :func:`add_up`: the sum of two bounds, rounded upward (sums of per-token logit bounds).
- :class:`Margin`: a ``(gamma, alpha)`` pair.
- margins: :func:`band_norm_margin`, :func:`logit_margin`, :func:`tv_margin`,
  :func:`tanh_margin`, :func:`variance_margin`, :func:`radius_margin`, :func:`grid_mean_margin`,
  :func:`cast_margin`, :func:`sum_margin`, :func:`dot_margin`, :func:`norm_margin`,
  :func:`eviction_margin`, :func:`linf_margin`, :func:`dot32_margin`.
- constants: :data:`TINY`, :data:`SQRT_TINY`, :data:`SUM_SLACK`, :data:`F16_MAX`,
  :data:`STEP_SLACK`.
"""

from __future__ import annotations

import math
from typing import Final, NamedTuple

import numpy as np
from numpy.typing import NDArray

from witcert_calculus.numerics.validation import F64, UNIT_ROUNDOFF

#: Absolute allowance for one subnormal intermediate result: ``2^-1070`` (32 half spacings).
TINY: Final = 2.0**-1070

#: ``sqrt(2^-1074)``: the absolute error of a square root whose argument underflowed.
SQRT_TINY: Final = 2.0**-537

#: Extra units of roundoff carried by a bound that is later summed with others.
SUM_SLACK: Final = 3

#: The largest finite float16: every stored block scale is at most this.
F16_MAX: Final = 65504.0

#: Per-step relative slack of a running float64 sum (8 units in the last place): the
#: streaming sentinels add ``STEP_SLACK * (|term| + |partial sum| + ...)`` to their error bound.
STEP_SLACK: Final = 2.0**-50


class Margin(NamedTuple):
    """The margins of one formula: relative ``gamma`` and absolute ``alpha``."""

    gamma: float
    alpha: float


def outward(value: F64, *, gamma: F64 | float, alpha: F64 | float,
            exact: NDArray[np.bool_] | None = None) -> F64:
    """The rule: ``next_up(value * (1 + gamma) + alpha)``, except exact or non-finite entries.

    Args:
        value: the float64 evaluation of a bound.
        gamma: relative margin (scalar or broadcast array), from a margin function.
        alpha: absolute margin (scalar or broadcast array).
        exact: entries whose value is exactly right (kept as they are).

    Returns:
        The outward-rounded bound, never below the exact value it bounds.

    Example:
        >>> y = outward(np.array([1.0, 0.0, np.inf]), gamma=0.0, alpha=0.0,
        ...             exact=np.array([False, True, False]))
        >>> [float(v) for v in y]
        [1.0000000000000002, 0.0, inf]
    """
    with np.errstate(over="ignore", invalid="ignore"):
        up = np.nextafter(value * (1.0 + gamma) + alpha, np.inf)
    keep = ~np.isfinite(value)
    if exact is not None:
        keep = keep | exact
    out: F64 = np.where(keep, value, up)
    return out


def add_up(a: F64, b: F64) -> F64:
    """``a + b`` rounded upward: never below the exact sum of two float64 bounds.

    The rounding error of the float sum is recovered exactly (Knuth's TwoSum); where the
    float sum fell below the exact one it moves one step toward ``+inf``. Exact sums (a 0
    term, most small integers) and non-finite ones are kept as they are. Unlike a margin
    in ``gamma``, this stays sound however many bounds are added in turn.

    Example:
        >>> [float(v) for v in add_up(np.array([1.0, 0.5]), np.array([2.0**-60, 0.25]))]
        [1.0000000000000002, 0.75]
    """
    with np.errstate(over="ignore", invalid="ignore"):
        s = a + b
        bv = s - a
        err = (a - (s - bv)) + (b - bv)
        up = np.nextafter(s, np.inf)
    out: F64 = np.where(np.isfinite(s) & (err > 0), up, s)
    return out


def band_norm_margin(size: int) -> Margin:
    """Margin of a band norm ``amax * sqrt(sum_c (x_c / amax)^2)`` over ``size`` channels.

    ``alpha`` is in units of ``amax``: the absolute margin is ``alpha * amax + TINY``.
    The sum of ``size`` squares and the square root carry ``(size/2 + 2) u``; the division
    by ``amax``, the product by it and the margin's own product add ``4 u``. Scaled squares
    in the subnormal range lose ``2^-1075`` each, at most ``sqrt(size) 2^-537`` of the scaled
    norm; :data:`TINY` covers the products that end subnormal.

    Example:
        >>> band_norm_margin(8).gamma == 10 * 2.0**-53
        True
    """
    return Margin((size / 2.0 + 6.0) * UNIT_ROUNDOFF, math.sqrt(size) * SQRT_TINY)


def logit_margin(bands: int, *, scale: float) -> Margin:
    """Margin of ``c_t = scale * sum_b w[t, b] ||q_b||`` over ``bands`` bands (summable).

    ``bands`` products and a recursive sum carry ``bands u``, the product by ``scale`` one
    more; with 2 u to spare and :data:`SUM_SLACK`. Products that underflow lose at most
    ``2^-1075`` each, ``scale`` times that after the product, and the final product one more.

    Example:
        >>> logit_margin(4, scale=1.0).gamma == 10 * 2.0**-53
        True
    """
    return Margin((bands + 3 + SUM_SLACK) * UNIT_ROUNDOFF, (bands * scale + 1.0) * TINY)


def tv_margin(tokens: int) -> Margin:
    """Margin of the TV forms over ``S = tokens`` tokens; ``gamma`` is *per unit of* ``1 + size``.

    The sums ``sum_t p_t expm1(+-c_t)`` (or their log-sum-exp) carry a relative error of at
    most ``(S + 16) u``; passing through ``log1p``/``expm1``/``sinh`` multiplies it by at most
    ``4 + 4 |x|`` for an argument of size ``|log A| + |log A-| + max c``. So a form is
    reported with ``gamma = margin.gamma * (1 + size)`` and ``alpha = S 2^-1070`` for
    subnormal terms. The soak (scripts/soak_meters.py) checks the result against 100-digit
    truths on the same float inputs.

    Example:
        >>> tv_margin(4).gamma == 80 * 2.0**-53
        True
    """
    return Margin(4.0 * (tokens + 16) * UNIT_ROUNDOFF, tokens * TINY)


def tanh_margin() -> Margin:
    """Margin of ``tanh(max_t c_t)``: the library ``tanh`` is within 2 ulps (``4 u``).

    A result of exactly 1 (from a large or infinite argument) is above every ``tanh`` of a
    finite argument and counts as exact, as does ``tanh(0) = 0``.

    Example:
        >>> tanh_margin().gamma == 4 * 2.0**-53
        True
    """
    return Margin(4 * UNIT_ROUNDOFF, TINY)


def variance_margin(head_dim: int, blocks: int, *, scale: float) -> Margin:
    """Margin of ``scale^2 sum_b s_b^2 (sum_{c in b} q_c^2) / 12`` (the Tier-B variance proxy).

    ``alpha`` is *per unit of* ``1 + max_c q_c^2``. ``q_c^2`` and a block sum carry
    ``block u <= d u``; ``s_b^2`` is exact (a float16 squared); the products, the sum over
    ``blocks``, ``scale^2``, its product and the division by 12 add ``(blocks + 3) u``.
    Subnormal squares of ``q`` lose ``2^-1075`` each, scaled by at most
    ``F16_MAX^2 scale^2``; a subnormal ``scale^2`` loses ``2^-1075`` times at most
    ``d F16_MAX^2 max_c q_c^2``; the other products one each.

    Example:
        >>> variance_margin(16, 2, scale=0.25).gamma == 21 * 2.0**-53
        True
    """
    reach = head_dim * F16_MAX * F16_MAX * max(1.0, scale * scale)
    return Margin((head_dim + blocks + 3) * UNIT_ROUNDOFF, (reach + blocks + 2.0) * TINY)


def radius_margin() -> Margin:
    """Margin of ``sqrt(2 v log(2 S / delta))`` (the sub-Gaussian radius, summable).

    ``2 S / delta > 2``, so its logarithm carries ``2.5 u`` relative; the product by ``2 v``
    one more, the square root halves that and adds ``u``: ``2.75 u``, rounded to ``3 u``,
    with :data:`SUM_SLACK`. A subnormal argument of the square root is off by at most
    ``2^-1074``, its root by :data:`SQRT_TINY`.

    Example:
        >>> radius_margin().gamma == 6 * 2.0**-53
        True
    """
    return Margin((3 + SUM_SLACK) * UNIT_ROUNDOFF, SQRT_TINY)


def grid_mean_margin(head_dim: int, blocks: int, *, scale: float) -> Margin:
    """Margin of ``scale sum_b s_b (sum_{c in b} |q_c|) 2^-25`` (the grid-mean term, summable).

    A block sum of ``|q_c|`` carries ``d u``; the products by ``s_b``, the sum over
    ``blocks`` and the product by ``scale`` add ``(blocks + 1) u`` (the power of two is
    exact), with :data:`SUM_SLACK`. Subnormal products lose ``2^-1075`` each: ``blocks``
    of them scaled by ``scale``, then the product by ``scale`` and by ``2^-25``.

    Example:
        >>> grid_mean_margin(16, 2, scale=0.25).gamma == 22 * 2.0**-53
        True
    """
    return Margin((head_dim + blocks + 1 + SUM_SLACK) * UNIT_ROUNDOFF,
                  (blocks * scale + 2.0) * TINY)


def cast_margin() -> Margin:
    """Margin of ``scale ||q|| e_t`` (a stored cast error ``e_t`` seen by the query, summable).

    Two products carry ``2 u``, with :data:`SUM_SLACK`; subnormal products lose ``2^-1075``
    each.

    Example:
        >>> cast_margin().gamma == 5 * 2.0**-53
        True
    """
    return Margin((2 + SUM_SLACK) * UNIT_ROUNDOFF, TINY)


def dot_margin(terms: int) -> Margin:
    """Margin of a float64 sum of ``terms`` nonnegative products in any order (no ``fsum``).

    Each product is rounded once and the recursive sum of ``n`` terms has relative error at
    most ``(n - 1) u`` to first order: ``(terms + 1) u``, with ``u`` to spare; each
    subnormal product loses at most ``2^-1075``.

    Example:
        >>> dot_margin(3).gamma == 4 * 2.0**-53
        True
    """
    return Margin((terms + 1) * UNIT_ROUNDOFF, terms * TINY)


def sum_margin(terms: int) -> Margin:
    """Margin of a sum of ``terms`` nonnegative products computed exactly (``math.fsum``).

    Each product is rounded once (``u``) and the exact sum once more (``u``): ``2 u``, with
    ``u`` to spare; each subnormal product loses at most ``2^-1075``.

    Example:
        >>> sum_margin(3).gamma == 3 * 2.0**-53
        True
    """
    return Margin(3 * UNIT_ROUNDOFF, terms * TINY)


def norm_margin(size: int) -> Margin:
    """Margin of a plain float64 ``sqrt(sum_c x_c^2)`` over ``size`` entries (a key's distance to
    its stored centroid, a query's or a value's norm).

    Each entry may itself be a rounded difference of two floats (``u``); the squares, the
    recursive sum and the square root carry ``(size + 2) u`` on the sum of squares, half of it
    on the root, plus ``u``: ``(size / 2 + 7) u`` with room to spare. Squares in the subnormal
    range lose ``2^-1075`` each, at most ``sqrt(size) 2^-537`` of the root.

    Example:
        >>> norm_margin(8).gamma == 11 * 2.0**-53
        True
    """
    return Margin((size / 2.0 + 7.0) * UNIT_ROUNDOFF, math.sqrt(size) * SQRT_TINY + TINY)


def eviction_margin(tokens: int, blocks: int) -> Margin:
    """Margin of the eviction bound ``1 / (1 + exp(log Z_K - log U))``; ``gamma`` is *per unit of*
    ``1 + abs(log U) + abs(log Z_K)``.

    ``log Z_K`` is a log-sum-exp over ``S = tokens`` logits and ``log U`` one over ``blocks``
    terms; each carries an absolute error of at most ``(n + 4) u (1 + abs(log))``. The map
    ``x -> 1 / (1 + e^-x)`` has derivative at most its value, so an absolute error ``e`` in
    ``x = log U - log Z_K`` moves the bound by at most ``e^e - 1`` relative; ``exp`` and the
    division add ``3 u``. So the bound is reported with ``gamma = margin.gamma (1 + size)``,
    ``4 (S + B + 16) u`` per unit (twice what the sums need), and ``alpha = (S + B) 2^-1070``.
    ``scripts/margin_checks.py`` checks it against 50-digit truths on the same float inputs.

    Example:
        >>> eviction_margin(4, 2).gamma == 88 * 2.0**-53
        True
    """
    return Margin(4.0 * (tokens + blocks + 16) * UNIT_ROUNDOFF, (tokens + blocks) * TINY)


def linf_margin() -> Margin:
    """Margin of ``max_c abs(x_c - y_c)`` over float64 entries: the one rounded subtraction
    carries ``u`` relative (``2 u`` with room to spare); a subnormal difference loses at most
    ``2^-1075``.

    Example:
        >>> linf_margin().gamma == 2 * 2.0**-53
        True
    """
    return Margin(2 * UNIT_ROUNDOFF, TINY)


#: The unit roundoff of float32, ``2^-24``.
UNIT_ROUNDOFF32: Final = 2.0**-24


def dot32_margin(terms: int) -> Margin:
    """Margin of a float32 dot product of ``terms`` products of float32 values, in any summation
    order (a BLAS kernel's blocks and fused multiply-adds included): its error is at most
    ``gamma_n sum_c abs(x_c y_c)`` with ``gamma_n = n u32 / (1 - n u32)``, reported here as
    ``(terms + 1) u32`` *per unit of* a bound on ``sum_c abs(x_c y_c)`` (e.g. ``||x|| ||y||``);
    each product that ends subnormal loses at most ``2^-150``.

    Example:
        >>> dot32_margin(3).gamma == 4 * 2.0**-24
        True
    """
    return Margin((terms + 1) * UNIT_ROUNDOFF32, terms * 2.0**-149)
