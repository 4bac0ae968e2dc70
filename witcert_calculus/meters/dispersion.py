"""The unsound dispersion shape, kept with its counterexample so the soundness suites can catch it.

The tempting shape ``1/2 e^{2 c_max} (E|c - c_bar| + c_bar (e^{c_max} - 1))`` is *not* a
bound on ``TV(p, p_tilde)``: :data:`DISPERSION_COUNTEREXAMPLE` pins an instance where it
returns 0.006423 while the true TV is 0.049834. Use the forms of
:mod:`witcert_calculus.meters.tv_forms` instead.

Main declarations:

- :func:`dispersion_bound_unsound`: the shape (never use it as a bound).
- :class:`DispersionCounterexample`, :data:`DISPERSION_COUNTEREXAMPLE`: the pinned instance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final, final

import numpy as np
from numpy.typing import ArrayLike

from witcert_calculus.numerics.validation import F64, weights_and_bounds

__all__ = ["DISPERSION_COUNTEREXAMPLE", "DispersionCounterexample", "dispersion_bound_unsound"]


def dispersion_bound_unsound(p_tilde: ArrayLike, c: ArrayLike) -> float:
    """UNSOUND: ``1/2 e^{2 c_max} (E_p~|c - c_bar| + c_bar (e^{c_max} - 1))``.

    Kept only as a named counterexample: see :data:`DISPERSION_COUNTEREXAMPLE`,
    where it returns 0.006423 while the true TV is 0.049834. Never use it as a bound.

    Args:
        p_tilde: compressed attention, shape ``(S,)``.
        c: per-token logit error bounds, shape ``(S,)``.

    Returns:
        What the shape claims.

    Raises:
        InvalidValueError: on invalid attention or bounds.

    Example:
        >>> round(dispersion_bound_unsound(np.array([0.5, 0.5]), np.array([0.1, 0.1])), 6)
        0.006423
    """
    p, cc = weights_and_bounds(p_tilde, c, ndim=1)
    return float(_dispersion_raw(p[None, :], cc[None, :])[0])


def _dispersion_raw(p: F64, c: F64) -> F64:
    cmax = c.max(axis=-1)
    cbar = (p * c).sum(axis=-1)
    disp = (p * np.abs(c - cbar[..., None])).sum(axis=-1)
    with np.errstate(over="ignore", invalid="ignore"):
        out: F64 = 0.5 * np.exp(2.0 * cmax) * (disp + cbar * np.expm1(cmax))
    return out


@final
@dataclass(frozen=True, slots=True)
class DispersionCounterexample:
    """The pinned counterexample to the dispersion shape.

    Attributes:
        p_tilde, c, eps: the instance (``|eps_t| <= c_t``).
        true_tv: ``TV(p, p_tilde)`` with ``p = softmax(log p_tilde - eps)``.
        claimed: what the dispersion shape returns.
    """

    p_tilde: tuple[float, ...]
    c: tuple[float, ...]
    eps: tuple[float, ...]
    true_tv: float
    claimed: float


#: The instance: two tokens of equal mass, ``c = 0.1`` each, errors of opposite signs.
DISPERSION_COUNTEREXAMPLE: Final = DispersionCounterexample(
    p_tilde=(0.5, 0.5), c=(0.1, 0.1), eps=(0.1, -0.1),
    true_tv=0.5 * math.tanh(0.1),  # p = (e^-0.1, e^0.1) / (2 cosh 0.1)
    claimed=0.5 * math.exp(0.2) * 0.1 * math.expm1(0.1),
)
