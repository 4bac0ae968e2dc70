"""What every Triton kernel launch of the package checks and computes on the host.

- :func:`check_device`: CPU tensors run only in Triton's interpreter (``TRITON_INTERPRET=1``,
  set before triton is imported); anything else is a typed error.
- :func:`pow2`: the smallest power of two at least ``n`` (Triton's block sizes).
"""

from __future__ import annotations

import os

import torch

from witcert_calculus.errors import InvalidValueError

__all__ = ["check_device", "pow2"]


def check_device(t: torch.Tensor) -> None:
    """Refuse a CPU tensor unless Triton's interpreter is on.

    Raises:
        InvalidValueError: a CPU tensor without ``TRITON_INTERPRET=1``.
    """
    if t.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise InvalidValueError("device", "cpu", "Triton kernels run on CPU tensors only under "
                                                 "TRITON_INTERPRET=1 (set before importing triton)")


def pow2(n: int) -> int:
    """The smallest power of two ``>= n`` (1 for ``n <= 1``).

    Example:
        >>> pow2(1), pow2(5), pow2(64)
        (1, 8, 64)
    """
    return 1 << max(0, (n - 1).bit_length())
