"""Triton kernels of the dithered INT8 key store: the write and the read, keyed by slot.

The store of :func:`witcert_calculus.meters.dither.dither_quantize` (the numpy reference) and of its
torch port :func:`witcert_kernels.dither.dither_quantize`, as it lives in an engine's paged
KV pool: rows are *slots* of the pool, and the dither of a row is a pure function of
``(seed, layer, kv head, slot, channel)`` (Philox-4x32-10, key words ``(seed mod 2^32,
seed div 2^32)``, counter words ``(channel, slot, kv_head, layer)``, ``xi = (w >> 8) 2^-24 -
1/2``). Because the slot, not the token's position in a sequence, keys the stream, prefix
sharing (two requests reading one slot) and paging (a token's slot chosen by the allocator)
never change what a written slot decodes to: the read regenerates the write's stream from the
slot it reads.

Write (:func:`dither_store`), one program per (token, kv head): float16 block scales
``round_up_f16(amax / 126.5)`` over the kept channels (the outlier channels are excluded from
the amax and hold code 0), codes ``rint(x / s + xi)`` as int8, and the outlier channels' values
as float16, all written at the token's slot in the pool; a per-row flag records whether every
check holds (finite keys, scales and values, no code beyond +-127). Read (:func:`dither_read`): the
keys ``s (code - xi)`` with the outlier channels from their float16 values, in the requested
dtype. Both are bit-identical to the numpy reference and the torch port for the same slots.

Capturable by design: no host synchronisation inside either call with ``check=False`` (the
flags stay on the device for the caller to read once), fixed launch grids, device-resident
outputs.

On a machine without a GPU the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``,
set before triton is imported) on CPU tensors.

Main declarations
-----------------
- :class:`DitherPool`: the pool tensors (codes, scales, outlier values) and the stream's seed.
- :func:`dither_store`: write keys at slots; :func:`dither_read`: read slots back.
"""

# The kernel body is Triton's language, which carries no Python types: basic checking only.
# pyright: basic

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, final

import numpy as np
import torch
import triton
import triton.language as tl

from witcert_calculus.errors import InvalidValueError
from witcert_calculus.meters.dither import (
    GRID_BITS,
    GRID_STEP,
    PHILOX_MULTIPLIERS,
    PHILOX_WEYL,
    QMAX,
)
from witcert_calculus.numerics.validation import positive_int, uint
from witcert_kernels.dither import _channel_index
from witcert_kernels.triton_launch import check_device, pow2

__all__ = ["DitherPool", "dither_read", "dither_store"]

_MAGIC = 6755399441055744.0  # 1.5 * 2^52: (v + M) - M rounds |v| < 2^51 half to even


@triton.jit
def _dither_xi(ch: Any, slot: Any, head: Any, layer: Any, k0: Any, k1: Any,
               M0: tl.constexpr, M1: tl.constexpr, W0: tl.constexpr,  # noqa: N803
               W1: tl.constexpr, SHIFT: tl.constexpr, STEP: tl.constexpr) -> Any:
    """The dither of channels ``ch`` at ``slot`` (broadcast uint32 words): Philox-4x32-10."""
    c0 = ch.to(tl.uint32)
    c1 = slot.to(tl.uint32)
    c2 = head.to(tl.uint32)
    c3 = layer.to(tl.uint32)
    key0 = k0.to(tl.uint32)
    key1 = k1.to(tl.uint32)
    m0 = tl.full(c0.shape, M0, tl.uint32)
    m1 = tl.full(c0.shape, M1, tl.uint32)
    for i in tl.static_range(10):  # pyright: ignore[reportGeneralTypeIssues]
        if i > 0:
            key0 = key0 + W0
            key1 = key1 + W1
        hi0 = tl.umulhi(c0, m0)
        lo0 = c0 * m0
        hi1 = tl.umulhi(c2, m1)
        lo1 = c2 * m1
        c0, c1, c2, c3 = hi1 ^ c1 ^ key0, lo1, hi0 ^ c3 ^ key1, lo0
    return (c0 >> SHIFT).to(tl.float64) * STEP - 0.5


@triton.jit
def _store_kernel(x_ptr: Any, slot_ptr: Any, keep_ptr: Any, idx_ptr: Any, codes_ptr: Any,
                  scales_ptr: Any, vals_ptr: Any, ok_ptr: Any, heads: Any, d: Any, nb: Any,
                  bs: Any, m2: Any, layer: Any, k0: Any, k1: Any, qmax: Any,
                  NB: tl.constexpr, BS: tl.constexpr, M2: tl.constexpr,  # noqa: N803
                  M0: tl.constexpr, M1: tl.constexpr, W0: tl.constexpr, W1: tl.constexpr,
                  SHIFT: tl.constexpr, STEP: tl.constexpr, MAGIC: tl.constexpr) -> None:
    row = tl.program_id(0).to(tl.int64)  # token * heads + head
    head = row % heads
    slot = tl.load(slot_ptr + row // heads)
    b = tl.arange(0, NB)
    j = tl.arange(0, BS)
    m = (b[:, None] < nb) & (j[None, :] < bs)
    ch = b[:, None] * bs + j[None, :]
    a = tl.load(x_ptr + row * d + ch, mask=m, other=0.0).to(tl.float64)
    keep = tl.load(keep_ptr + head * d + ch, mask=m, other=0) != 0
    # Triton's max skips NaN: a block holding a NaN kept key is counted on its own and its
    # scale is NaN, as the torch port's amax gives (and the row check fails)
    a_nan = keep & (a != a)
    amax = tl.max(tl.where(keep & ~a_nan, tl.abs(a), 0.0), axis=1)  # [NB]
    amax = tl.where(tl.sum(a_nan.to(tl.int32), axis=1) != 0, float("nan"), amax)
    q = amax / (qmax - 0.5)
    low = q.to(tl.float16)
    up = (low.to(tl.int16, bitcast=True) + 1).to(tl.float16, bitcast=True)
    scale = tl.where(low.to(tl.float64) < q, up, low)  # rounded toward +inf
    dst = slot * heads + head
    tl.store(scales_ptr + dst * nb + b, scale, mask=b < nb)
    s = scale.to(tl.float64)[:, None]
    xi = _dither_xi(ch, slot, head, layer, k0, k1, M0, M1, W0, W1, SHIFT, STEP)
    pos = s > 0
    v = a / tl.where(pos, s, 1.0) + xi
    code = tl.where(pos & keep, (v + MAGIC) - MAGIC, 0.0)
    tl.store(codes_ptr + dst * d + ch, code.to(tl.int8), mask=m)
    # Triton's max ignores NaN: finiteness of the keys is checked on its own.
    finite_x = (a == a) & (tl.abs(a) < float("inf"))
    finite = (scale == scale) & (scale.to(tl.float64) < float("inf"))
    all_x: Any = tl.min(tl.min(finite_x.to(tl.int32), axis=1), axis=0)
    all_s: Any = tl.min(finite.to(tl.int32), axis=0)
    ok = (all_x > 0) & (all_s > 0) & (tl.max(tl.max(tl.abs(code), axis=1), axis=0) <= qmax)
    if M2 > 0:
        i = tl.arange(0, M2)
        mi = i < m2
        c_out = tl.load(idx_ptr + head * m2 + i, mask=mi, other=0)
        val = tl.load(x_ptr + row * d + c_out, mask=mi, other=0.0).to(tl.float64).to(tl.float16)
        tl.store(vals_ptr + dst * m2 + i, val, mask=mi)
        vf = val.to(tl.float64)
        ok = ok & (tl.max(tl.where(mi & ((vf != vf) | (tl.abs(vf) == float("inf"))), 1, 0),
                          axis=0) == 0)
    tl.store(ok_ptr + row, ok.to(tl.int8))


@triton.jit
def _read_kernel(codes_ptr: Any, scales_ptr: Any, vals_ptr: Any, slot_ptr: Any, keep_ptr: Any,
                 pos_ptr: Any, out_ptr: Any, heads: Any, d: Any, nb: Any, bs: Any, m2: Any,
                 layer: Any, k0: Any, k1: Any,
                 NB: tl.constexpr, BS: tl.constexpr, M2: tl.constexpr,  # noqa: N803
                 M0: tl.constexpr, M1: tl.constexpr, W0: tl.constexpr, W1: tl.constexpr,
                 SHIFT: tl.constexpr, STEP: tl.constexpr) -> None:
    row = tl.program_id(0).to(tl.int64)
    head = row % heads
    slot = tl.load(slot_ptr + row // heads)
    src = slot * heads + head
    b = tl.arange(0, NB)
    j = tl.arange(0, BS)
    m = (b[:, None] < nb) & (j[None, :] < bs)
    ch = b[:, None] * bs + j[None, :]
    code = tl.load(codes_ptr + src * d + ch, mask=m, other=0).to(tl.float64)
    s = tl.load(scales_ptr + src * nb + b, mask=b < nb, other=0.0).to(tl.float64)[:, None]
    xi = _dither_xi(ch, slot, head, layer, k0, k1, M0, M1, W0, W1, SHIFT, STEP)
    x_hat = s * (code - xi)
    if M2 > 0:
        keep = tl.load(keep_ptr + head * d + ch, mask=m, other=1) != 0
        at = tl.load(pos_ptr + head * d + ch, mask=m, other=0)  # rank among the exact channels
        val = tl.load(vals_ptr + src * m2 + at, mask=m & ~keep, other=0.0).to(tl.float64)
        x_hat = tl.where(keep, x_hat, val)
    tl.store(out_ptr + row * d + ch, x_hat.to(out_ptr.dtype.element_ty), mask=m)


def _constants() -> dict[str, int | float]:
    (m0, m1), (w0, w1) = PHILOX_MULTIPLIERS, PHILOX_WEYL
    return {"M0": m0, "M1": m1, "W0": w0, "W1": w1, "SHIFT": 32 - GRID_BITS, "STEP": GRID_STEP}


@final
@dataclass(frozen=True, slots=True, eq=False)
class DitherPool:
    """One layer's dithered key pool: ``slots`` rows of ``kv_heads`` heads of ``head_dim`` keys.

    Attributes:
        codes: int8 ``[slots, kv_heads, head_dim]`` (0 on the outlier channels).
        scales: float16 ``[slots, kv_heads, head_dim / block_size]``.
        outlier_values: float16 ``[slots, kv_heads, 2 m]``: the outlier channels' values, in
            channel order.
        exact: bool ``[kv_heads, head_dim]``: the outlier channels (fixed per head).
        block_size: channels per scale (divides ``head_dim``).
        seed: the stream's key, ``0 <= seed < 2^64`` (the pool's, not a request's: requests
            sharing a slot read the same stream).
        layer: the layer index (a counter word of the stream).
    """

    codes: torch.Tensor
    scales: torch.Tensor
    outlier_values: torch.Tensor
    exact: torch.Tensor
    block_size: int
    seed: int
    layer: int

    @staticmethod
    def empty(*, slots: int, kv_heads: int, head_dim: int, block_size: int,
              exact: torch.Tensor, seed: int, layer: int,
              device: torch.device | str = "cpu") -> DitherPool:
        """A zeroed pool.

        Raises:
            InvalidValueError: a block size that does not divide ``head_dim``, an ``exact``
                mask of the wrong shape or with an odd count per head (pairs are exact
                together), or a seed or layer out of range.
        """
        n = positive_int("slots", slots)
        h = positive_int("kv_heads", kv_heads)
        d = positive_int("head_dim", head_dim)
        if d % positive_int("block_size", block_size):
            raise InvalidValueError("block_size", block_size, f"must divide head_dim {d}")
        uint("seed", seed, bits=64)
        uint("layer", layer, bits=32)
        if tuple(exact.shape) != (h, d) or exact.dtype != torch.bool:
            raise InvalidValueError("exact", (tuple(exact.shape), str(exact.dtype)),
                                    f"must be a bool mask [{h}, {d}]")
        counts = exact.sum(dim=-1)
        m2 = int(counts[0]) if h else 0
        if bool((counts != m2).any()) or m2 % 2:
            raise InvalidValueError("exact", counts.tolist(),
                                    "every head needs the same, even number of exact channels")
        return DitherPool(
            codes=torch.zeros((n, h, d), dtype=torch.int8, device=device),
            scales=torch.zeros((n, h, d // block_size), dtype=torch.float16, device=device),
            outlier_values=torch.zeros((n, h, m2), dtype=torch.float16, device=device),
            exact=exact.to(device), block_size=block_size, seed=seed, layer=layer)

    @property
    def heads(self) -> int:
        """Number of kv heads."""
        return int(self.codes.shape[1])

    @property
    def head_dim(self) -> int:
        """Channels per head."""
        return int(self.codes.shape[2])


def _check_slots(pool: DitherPool, slots: torch.Tensor) -> torch.Tensor:
    if slots.ndim != 1 or slots.dtype not in (torch.int32, torch.int64):
        raise InvalidValueError("slots", (tuple(slots.shape), str(slots.dtype)),
                                "must be a 1-D integer tensor")
    check_device(pool.codes)
    return slots.to(torch.int64).contiguous()


def _bounds_check(pool: DitherPool, slots: torch.Tensor) -> None:
    # Reads the slots' range (a host sync): only on the checked path.
    if slots.numel() and (int(slots.min()) < 0 or int(slots.max()) >= pool.codes.shape[0]):
        raise InvalidValueError("slots", (int(slots.min()), int(slots.max())),
                                f"must lie in [0, {int(pool.codes.shape[0])})")


def dither_store(pool: DitherPool, x: torch.Tensor, slots: torch.Tensor, *,
                 check: bool = True) -> torch.Tensor:
    """Write keys ``x [tokens, kv_heads, head_dim]`` into the pool at ``slots [tokens]``.

    Args:
        pool: the layer's pool (written in place).
        x: post-RoPE keys (float64, float32 or float16; bfloat16 is not exact under the CPU
            interpreter).
        slots: the pool row of each token.
        check: read the per-row flags and the slots' range and raise on a failed check (a
            host sync); ``False``: nothing is read, the flags are returned for the caller.

    Returns:
        int8 flags ``[tokens, kv_heads]``: 1 where the row's keys, scales and outlier values
        are finite and no code exceeds +-127 (the upward-rounded scale never lets a code clip).

    Raises:
        InvalidValueError: a shape that does not fit the pool, slots out of range, or (with
            ``check``) a failed row check, naming the first offending (token, head).
    """
    h, d = pool.heads, pool.head_dim
    if x.ndim != 3 or tuple(x.shape[1:]) != (h, d):
        raise InvalidValueError("x", tuple(x.shape), f"must be [tokens, {h}, {d}]")
    s = _check_slots(pool, slots)
    if int(s.shape[0]) != int(x.shape[0]):
        raise InvalidValueError("slots", tuple(s.shape), f"must be [{int(x.shape[0])}]")
    if check:
        _bounds_check(pool, s)
    rows = x.contiguous()
    m2 = int(pool.outlier_values.shape[-1])
    keep = (~pool.exact).to(torch.int8).contiguous()
    idx = _channel_index(pool.exact, m2).contiguous()
    ok = torch.ones((int(x.shape[0]), h), dtype=torch.int8, device=x.device)
    nb = d // pool.block_size
    if x.shape[0]:
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            launch: Any = _store_kernel[(int(x.shape[0]) * h,)]
            launch(rows, s, keep, idx, pool.codes, pool.scales, pool.outlier_values, ok, h, d,
                   nb, pool.block_size, m2, pool.layer, pool.seed & 0xFFFFFFFF, pool.seed >> 32,
                   float(QMAX), NB=pow2(nb), BS=pow2(pool.block_size), M2=pow2(m2) if m2 else 0,
                   MAGIC=_MAGIC, **_constants())
    if check and not bool(ok.all()):
        t, hh = (int(v) for v in (ok == 0).nonzero()[0])
        raise InvalidValueError("x", f"token {t}, kv head {hh}",
                                "a scale or an outlier value overflows float16, or the keys are "
                                "not finite")
    return ok


def dither_read(pool: DitherPool, slots: torch.Tensor, *, dtype: torch.dtype,
                check: bool = True) -> torch.Tensor:
    """The keys held at ``slots``: ``[len(slots), kv_heads, head_dim]`` in ``dtype``.

    ``s (code - xi)`` in float64 (exact), the outlier channels from their float16 values, then
    rounded to ``dtype`` once: what :meth:`witcert_kernels.dither.DitherEncoding.read` gives.

    Raises:
        InvalidValueError: slots that are not a 1-D integer tensor, or (with ``check``) out of
            range.
    """
    s = _check_slots(pool, slots)
    if check:
        _bounds_check(pool, s)
    h, d = pool.heads, pool.head_dim
    m2 = int(pool.outlier_values.shape[-1])
    out = torch.empty((int(s.shape[0]), h, d), dtype=dtype, device=pool.codes.device)
    keep = (~pool.exact).to(torch.int8).contiguous()
    rank = torch.where(pool.exact, torch.cumsum(pool.exact.to(torch.int64), dim=-1) - 1,
                       0).contiguous()  # the rank of each exact channel (0 elsewhere, unread)
    nb = d // pool.block_size
    if s.shape[0]:
        launch: Any = _read_kernel[(int(s.shape[0]) * h,)]
        launch(pool.codes, pool.scales, pool.outlier_values, s, keep, rank, out, h, d, nb,
               pool.block_size, m2, pool.layer, pool.seed & 0xFFFFFFFF, pool.seed >> 32,
               NB=pow2(nb), BS=pow2(pool.block_size), M2=pow2(m2) if m2 else 0,
               **_constants())
    return out
