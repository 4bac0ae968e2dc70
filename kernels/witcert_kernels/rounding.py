"""Torch twin of the outward-rounding rule of :mod:`witcert_calculus.numerics.rounding`.

The rule, its exceptions and every formula's margins are stated once, in
:mod:`witcert_calculus.numerics.rounding`; this module applies ``next_up(y (1 + gamma) + alpha)``
to float64 tensors exactly as :func:`witcert_calculus.numerics.rounding.outward` does to arrays,
so that the torch meters are outward with the very same margins.

Main declarations:

- :func:`outward`: the rule on float64 tensors.
- :func:`add_up`: the sum of two bounds, rounded upward.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

__all__ = ["add_up", "outward"]


def _inf(x: torch.Tensor) -> torch.Tensor:
    # +inf as a 0-d tensor of x's dtype and device (nextafter's direction, broadcast).
    return torch.full((), float("inf"), dtype=x.dtype, device=x.device)


def outward(value: torch.Tensor, *, gamma: torch.Tensor | float, alpha: torch.Tensor | float,
            exact: torch.Tensor | None = None) -> torch.Tensor:
    """The rule: ``next_up(value * (1 + gamma) + alpha)``, except exact or non-finite entries.

    Args:
        value: the float64 evaluation of a bound.
        gamma: relative margin (scalar or broadcast tensor), from a margin function of
            :mod:`witcert_calculus.numerics.rounding`.
        alpha: absolute margin (scalar or broadcast tensor).
        exact: boolean tensor of entries whose value is exactly right (kept as they are).

    Returns:
        The outward-rounded bound, never below the exact value it bounds.

    Example:
        >>> y = outward(torch.tensor([1.0, 0.0, float("inf")], dtype=torch.float64),
        ...             gamma=0.0, alpha=0.0, exact=torch.tensor([False, True, False]))
        >>> y.tolist()
        [1.0000000000000002, 0.0, inf]
    """
    # the same operations as the array rule, in place where the shapes allow (each
    # full-size temporary costs a pass over fresh memory)
    raised = value * (1.0 + gamma)
    raised = _into(raised, torch.add, raised, alpha)
    raised = _into(raised, torch.nextafter, raised, _inf(raised))
    keep = torch.isfinite(value).logical_not_()
    if exact is not None:
        keep = _into(keep, torch.logical_or, keep, exact)
    return _into(raised, torch.where, keep, value, raised)


def _into(out: torch.Tensor, op: Callable[..., torch.Tensor], *args: torch.Tensor | float
          ) -> torch.Tensor:
    # op(*args) written into ``out`` when the result has out's shape and dtype (a pointwise
    # op may write over one of its inputs), else a new tensor.
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    shape = tuple(np.broadcast_shapes(*(tuple(a.shape) for a in tensors)))
    # every input of out's dtype, except a boolean mask that selects among float inputs
    same = all(a.dtype == out.dtype for a in tensors
               if a.dtype != torch.bool or out.dtype == torch.bool)
    return op(*args, out=out) if shape == tuple(out.shape) and same else op(*args)


def add_up(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a + b`` rounded upward, as :func:`witcert_calculus.numerics.rounding.add_up` does on arrays.

    Example:
        >>> add_up(torch.tensor([1.0], dtype=torch.float64),
        ...        torch.tensor([2.0**-60], dtype=torch.float64)).tolist()
        [1.0000000000000002]
    """
    s = a + b
    bv = s - a
    err = (a - (s - bv)) + (b - bv)
    up = torch.nextafter(s, _inf(s))
    return torch.where(torch.isfinite(s) & (err > 0), up, s)
