"""Triton kernel of the witness write: per-token, per-band norms of the key residual.

At write time a cache keeps, for every token and kv head, the band witnesses
``w_{t,b} = ||(k_hat_t - k_t)_b||`` of the residual between the stored key ``k_hat`` (any
cache-preserving scheme, given as a tensor function applied before the kernel) and the
exact post-RoPE key ``k``, over contiguous bands of rotary pairs (Tier A: the bands are
unchanged by RoPE, so pre- and post-RoPE witnesses agree). The kernel computes, per row,
exactly what :func:`witcert_kernels.meter.band_norms` of the residual followed by
:func:`witcert_kernels.meter.round_up_f32` computes: in float64, the residual
``k_hat - k`` (exact for float32 or narrower inputs), each band's norm after scaling by the
row's largest entry, the outward rule ``next_up(y (1 + gamma) + alpha amax + TINY)`` with
the margins of :func:`witcert_calculus.numerics.rounding.band_norm_margin` (exactly 0 for an
all-zero band, non-finite values kept), then the float32 copy rounded upward. One program
per row; no host synchronisation; the result stays on the device.

Only equal bands are supported (``bands`` divides ``head_dim / 2``, every band holds the
same number of channels): the torch twin handles the others.

On a machine without a GPU the kernel runs in Triton's interpreter
(``TRITON_INTERPRET=1``, set before triton is imported) on CPU tensors.

Main declarations
-----------------
- :func:`witness_write`: the band witnesses ``[..., bands]`` (float32, rounded up) of
  ``k_hat - k``.
"""

# The kernel body is Triton's language, which carries no Python types: basic checking only.
# pyright: basic

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import triton
import triton.language as tl

from witcert_calculus.errors import InvalidValueError
from witcert_calculus.meters.witness import RopeLayout, band_channels
from witcert_calculus.numerics.rounding import TINY, band_norm_margin
from witcert_calculus.numerics.validation import positive_int
from witcert_kernels.triton_launch import check_device, pow2

__all__ = ["witness_write"]


@triton.jit
def _witness_kernel(x_ptr: Any, xh_ptr: Any, perm_ptr: Any, out_ptr: Any, d: Any, bands: Any,
                    size: Any, gamma: Any, alpha: Any, tiny: Any,
                    BANDS: tl.constexpr, SIZE: tl.constexpr) -> None:  # noqa: N803
    row = tl.program_id(0).to(tl.int64)
    b = tl.arange(0, BANDS)
    j = tl.arange(0, SIZE)
    m = (b[:, None] < bands) & (j[None, :] < size)
    ch = tl.load(perm_ptr + b[:, None] * size + j[None, :], mask=m, other=0)
    x = tl.load(x_ptr + row * d + ch, mask=m, other=0.0).to(tl.float64)
    xh = tl.load(xh_ptr + row * d + ch, mask=m, other=0.0).to(tl.float64)
    r = xh - x
    # Triton's max skips NaN: a NaN residual is counted on its own and makes every witness of
    # the row NaN, as the twin's amax over the bands (which propagates NaN) does
    r_nan = r != r
    row_nans: Any = tl.sum(tl.sum(r_nan.to(tl.int32), axis=1), axis=0)
    band_max = tl.max(tl.where(r_nan, 0.0, tl.abs(r)), axis=1)  # [BANDS]
    amax = tl.max(band_max, axis=0)
    div = tl.where(amax > 0, amax, 1.0)  # pyright: ignore[reportOperatorIssue]
    s = r / div
    y = tl.sqrt(tl.sum(s * s, axis=1)) * amax  # float64: correctly rounded
    raised = y * (1.0 + gamma) + (alpha * amax + tiny)
    up = (raised.to(tl.int64, bitcast=True) + 1).to(tl.float64, bitcast=True)  # next_up (> 0)
    finite = (y == y) & (tl.abs(y) < float("inf"))
    val = tl.where(finite, tl.where(band_max == 0, 0.0, up), y)
    val = tl.where(row_nans != 0, float("nan"), val)
    v32 = val.to(tl.float32)
    low = v32.to(tl.float64) < val
    v32 = tl.where(low, (v32.to(tl.int32, bitcast=True) + 1).to(tl.float32, bitcast=True), v32)
    tl.store(out_ptr + row * bands + b, v32, mask=b < bands)


def witness_write(k: torch.Tensor, k_hat: torch.Tensor, *, bands: int,
                  layout: RopeLayout) -> torch.Tensor:
    """Band witnesses ``||(k_hat - k)_b||`` per row, float32 rounded upward, by a Triton kernel.

    Args:
        k: exact keys ``[..., d]`` (float64, float32, float16 or bfloat16; bfloat16 is not
            exact under the CPU interpreter, which stores it as uint16: test the others).
        k_hat: the stored keys, same shape and dtype.
        bands: number of equal bands of rotary pairs (divides ``d / 2``).
        layout: the rotary pair layout of the keys.

    Returns:
        ``[..., bands]`` float32, each entry at or above the exact band norm: the values of
        ``round_up_f32(band_norms(k_hat - k))``.

    Raises:
        InvalidValueError: shapes or dtypes that differ, an odd ``d``, bands that do not
            divide ``d / 2``, or CPU tensors without ``TRITON_INTERPRET=1``.

    Example:
        >>> # w = witness_write(k, scheme(k, ctx), bands=8, layout=RopeLayout.HALF_SPLIT)
    """
    if k.shape != k_hat.shape or k.dtype != k_hat.dtype:
        raise InvalidValueError("k_hat", (tuple(k_hat.shape), str(k_hat.dtype)),
                                f"must have the shape and dtype of k {tuple(k.shape)}, {k.dtype}")
    d = int(k.shape[-1])
    if d % 2:
        raise InvalidValueError("head_dim", d, "must be even (RoPE acts on pairs)")
    nb = positive_int("bands", bands)
    if (d // 2) % nb:
        raise InvalidValueError("bands", bands, f"must divide head_dim/2 = {d // 2} (equal bands)")
    check_device(k)
    size = d // nb
    perm = torch.as_tensor(
        [int(c) for band in band_channels(d, bands=nb, layout=layout) for c in band],
        dtype=torch.int64, device=k.device)
    rows = k.reshape(-1, d).contiguous()
    rows_hat = k_hat.reshape(-1, d).contiguous()
    out = torch.empty((rows.shape[0], nb), dtype=torch.float32, device=k.device)
    margin = band_norm_margin(size)
    if rows.shape[0]:
        # a non-finite residual gives inf / inf on purpose (kept non-finite, as in the twin);
        # the CPU interpreter evaluates with numpy, which would warn about it
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            launch: Any = _witness_kernel[(rows.shape[0],)]  # constexpr sizes: plain ints
            launch(rows, rows_hat, perm, out, d, nb, size, margin.gamma, margin.alpha, TINY,
                   BANDS=pow2(nb), SIZE=pow2(size))
    return out.reshape(*k.shape[:-1], nb)
