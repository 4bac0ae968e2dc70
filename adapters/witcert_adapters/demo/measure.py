"""What the demo measures next to the meters: teacher-forced KL and top-1, rank correlation.

Main declarations
-----------------
- :func:`kl_top1`, :func:`spearman`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import torch

__all__ = ["kl_top1", "spearman"]

FloatArray = npt.NDArray[np.float64]


def kl_top1(ref: torch.Tensor, comp: torch.Tensor) -> tuple[list[float], list[bool]]:
    """Per row, ``KL(softmax(ref) || softmax(comp))`` in nats and whether the argmaxes agree.

    Args:
        ref: reference logits ``[steps, V]``.
        comp: compressed-run logits of the same steps.

    Returns:
        ``(kl, agree)``, one entry per step.

    Example:
        >>> kl, agree = kl_top1(torch.tensor([[0.0, 1.0]]), torch.tensor([[0.0, 1.0]]))
        >>> kl, agree
        ([0.0], [True])
    """
    lp = torch.log_softmax(ref.to(torch.float64), dim=-1)
    lq = torch.log_softmax(comp.to(torch.float64), dim=-1)
    kl = (lp.exp() * (lp - lq)).sum(dim=-1)
    agree = ref.argmax(dim=-1) == comp.argmax(dim=-1)
    return [float(v) for v in kl], [bool(v) for v in agree]


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation (average ranks for ties); NaN when a side is constant.

    Example:
        >>> spearman([1.0, 2.0, 3.0], [3.0, 2.0, 1.0])
        -1.0
    """
    def ranks(v: Sequence[float]) -> FloatArray:
        a = np.asarray(v, dtype=np.float64)
        order = np.argsort(a, kind="stable")
        r = np.empty_like(a)
        r[order] = np.arange(a.size, dtype=np.float64)
        for val in np.unique(a):
            idx = a == val
            r[idx] = r[idx].mean()
        return r
    rx, ry = ranks(x), ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return math.nan
    return float(np.corrcoef(rx, ry)[0, 1])
