"""The Tier-A meter's Triton pieces injected into SGLang's stage-1 decode kernels, and the
host-side merge that turns their split partials into bounds.

SGLang's stage-1 kernels (``_fwd_kernel_stage1`` for MHA, ``_fwd_grouped_kernel_stage1``
for GQA, MQA and MLA) compute, per request, head (or head tile) and KV split, an online
softmax over blocks of tokens. The injected source (:mod:`witcert_adapters.sglang.installer`)
calls :func:`meter_init` once the query is loaded, :func:`meter_block` on every block's
masked float32 logits, and :func:`meter_store` where the kernel stores its split's
log-sum-exp. These keep the same accumulators as
:func:`witcert_kernels.triton_decode.fused_decode`'s kernel (three float64 online
log-sum-exps of ``s``, ``s + c`` and ``s - c``, ``c_t`` from the stored witnesses and the
query's band norms rounded outward, the largest ``|s|`` and ``c``, flags for infinite and NaN
bounds, the smallest witness), one row per query head. The log-sum-exp step, the meter's
step and the outward rounding are :mod:`witcert_kernels.triton_decode_kernel`'s own Triton
functions, and the float64 constants (scale, margins) reach the kernel in a float64 tensor.

SGLang's extend kernel ``_fwd_kernel`` calls the same functions with one row per query
token (``meter_block`` on its prefix loop, whose keys are cached; :func:`meter_exact` on its
chunk loop, whose keys are the chunk's own, unrounded: ``c = 0``), one split per row.

The split partials (the fused decode kernel's column layout) merge on the host with the
fused decode's own Tier-A merge (log-sum-exp weights, exactly as the output's partials merge
in SGLang's stage 2, its margin, :func:`witcert_kernels.meter.forms_from_logs`). The margin analysis
of :mod:`witcert_kernels.triton_decode` applies unchanged: the token count is bounded by the
number of slots of the pool (no host synchronisation).

Main declarations
-----------------
- :func:`meter_init`, :func:`meter_block`, :func:`meter_exact`, :func:`meter_store`: the
  Triton functions the patched kernels call; :func:`meter_constants`: the float64 constants
  they read.
- :data:`FIELDS`: the partials' columns; :func:`empty_partials`: a partials buffer whose
  unvisited splits read as empty.
- :func:`bounds_from_partials`: the merged bounds of one launch.
"""

# The kernel body is Triton's language, which carries no Python types: basic checking only.
# pyright: basic

from __future__ import annotations

import math
from typing import Any, Final

import torch
import triton
import triton.language as tl

from witcert_calculus.numerics.rounding import logit_margin
# the fused decode kernel's own pieces (one formula, one margin analysis)
from witcert_kernels.triton_decode_kernel import lse_step, meter_step, outward
from witcert_kernels.triton_decode_launch import device_constants
from witcert_kernels.triton_decode_merge import TierMeter, tier_a_meter

__all__ = ["FIELDS", "bounds_from_partials", "empty_partials", "meter_block",
           "meter_constants", "meter_exact", "meter_init", "meter_store"]

FIELDS: Final = ("mx0", "a0", "mx1", "a1", "mx2", "a2", "s_abs", "c_max", "c_inf", "w_min",
                 "nan")
"""The columns of a partials row (one per request, query head and split)."""


@triton.jit
def meter_init(WitQn: Any, cur_batch: Any, heads: Any, mask_h: Any, q_head_num: Any,
               wit_nb: Any, WIT_NB: tl.constexpr) -> tuple[Any, ...]:  # noqa: N803
    """The query's band norms ``[R, NB]`` (float64) of heads ``heads`` and empty accumulators."""
    bi = tl.arange(0, WIT_NB)
    qn = tl.load(WitQn + (cur_batch * q_head_num + heads[:, None]) * wit_nb + bi[None, :],
                 mask=mask_h[:, None] & (bi[None, :] < wit_nb), other=0.0)
    ninf = tl.zeros_like(tl.max(qn, axis=1)) - float("inf")
    zero = tl.zeros_like(tl.max(qn, axis=1))
    return (qn, ninf, zero, ninf, zero, ninf, zero, zero, zero, zero, zero - ninf, zero)


@triton.jit
def meter_block(qn: Any, mx0: Any, a0: Any, mx1: Any, a1: Any, mx2: Any, a2: Any, s_abs: Any,
                c_max: Any, c_inf: Any, w_min: Any, bad: Any, s: Any, valid: Any, kv_loc: Any,
                valid_n: Any, Wit: Any, cur_kv_head: Any, wit_stride_bs: Any,
                wit_stride_h: Any, wit_nb: Any, WitC: Any,
                WIT_NB: tl.constexpr) -> tuple[Any, ...]:  # noqa: N803
    """One block: ``s [R, N]`` float32 masked logits, ``valid [R, N]``, the block's slots.

    ``WitC`` holds the float64 constants ``(scale, gamma, alpha)`` (:func:`meter_constants`:
    Triton passes Python floats as float32, which would round the margins away)."""
    scale = tl.load(WitC + 0)
    c_gamma = tl.load(WitC + 1)
    c_alpha = tl.load(WitC + 2)
    bi = tl.arange(0, WIT_NB)
    wmask = valid_n[:, None] & (bi[None, :] < wit_nb)
    w: Any = tl.load(Wit + kv_loc[:, None].to(tl.int64) * wit_stride_bs + cur_kv_head * wit_stride_h
                     + bi[None, :], mask=wmask, other=0.0).to(tl.float64)  # [N, NB]
    prod = tl.where(qn[:, None, :] == 0.0, 0.0, qn[:, None, :] * w[None, :, :])  # inf * 0 is 0
    y = tl.sum(prod, axis=2) * scale  # [R, N]
    # Triton's max and min skip NaN: a NaN band norm or witness is counted on its own, kept
    # out of the exactness test and the minimum, and makes c_t and the row's w_min NaN
    q_nan: Any = tl.sum((qn != qn).to(tl.int32), axis=1) != 0  # [R]
    w_nan: Any = tl.sum((wmask & (w != w)).to(tl.int32), axis=1) != 0  # [N]
    q_top: Any = tl.max(tl.where(qn != qn, 0.0, qn), axis=1)
    w_top: Any = tl.max(tl.where(w != w, 0.0, w), axis=1)
    exact = ((q_top[:, None] == 0.0) | (w_top[None, :] == 0.0)) & ~q_nan[:, None] \
        & ~w_nan[None, :]
    c = tl.where(exact, 0.0, outward(y, c_gamma, c_alpha, exact))
    c = tl.where(q_nan[:, None] | w_nan[None, :], float("nan"), c)
    mx0, a0, mx1, a1, mx2, a2, s_abs, c_max, c_inf, bad = _accumulate(
        mx0, a0, mx1, a1, mx2, a2, s_abs, c_max, c_inf, bad, s.to(tl.float64), c, valid)
    wv: Any = tl.min(tl.where(wmask & (w == w), w, float("inf")), axis=1)  # [N]
    blk_min = tl.min(tl.where(valid, wv[None, :], float("inf")), axis=1)  # [R]
    blk_nan = tl.sum((valid & w_nan[None, :]).to(tl.int32), axis=1) != 0  # [R]
    w_min = tl.where((w_min != w_min) | blk_nan, float("nan"), tl.minimum(w_min, blk_min))
    return (qn, mx0, a0, mx1, a1, mx2, a2, s_abs, c_max, c_inf, w_min, bad)


@triton.jit
def _accumulate(mx0: Any, a0: Any, mx1: Any, a1: Any, mx2: Any, a2: Any, s_abs: Any,
                c_max: Any, c_inf: Any, bad: Any, s64: Any, c: Any,
                valid: Any) -> tuple[Any, ...]:
    """One block's logits ``s64 [R, N]`` (float64) with their bounds ``c [R, N]`` into the
    three log-sum-exps, the largest ``|s|`` and ``c`` and the flags."""
    # the kernels' reductions run over axis 0: tokens first, [N, R]
    vt = tl.trans(valid)
    st = tl.trans(s64)
    mx0, a0 = lse_step(mx0, a0, st, vt)
    mx1, a1, mx2, a2, c_max, c_inf, bad = meter_step(mx1, a1, mx2, a2, c_max, c_inf, bad, st,
                                                      tl.trans(c), vt)
    s_abs = tl.maximum(s_abs, tl.max(tl.where(valid, tl.abs(s64), 0.0), axis=1))
    return (mx0, a0, mx1, a1, mx2, a2, s_abs, c_max, c_inf, bad)


@triton.jit
def meter_exact(qn: Any, mx0: Any, a0: Any, mx1: Any, a1: Any, mx2: Any, a2: Any, s_abs: Any,
                c_max: Any, c_inf: Any, w_min: Any, bad: Any, s: Any,
                valid: Any) -> tuple[Any, ...]:
    """One block of keys the kernel reads uncompressed (``c = 0`` exactly): their logits
    ``s [R, N]`` (float32, masked) still enter every log-sum-exp; no witness is read."""
    s64 = s.to(tl.float64)
    mx0, a0, mx1, a1, mx2, a2, s_abs, c_max, c_inf, bad = _accumulate(
        mx0, a0, mx1, a1, mx2, a2, s_abs, c_max, c_inf, bad, s64, tl.zeros_like(s64), valid)
    return (qn, mx0, a0, mx1, a1, mx2, a2, s_abs, c_max, c_inf, w_min, bad)


def meter_constants(scale: float, bands: int, *, device: torch.device) -> torch.Tensor:
    """The float64 constants :func:`meter_block` reads: the scale and the logit bound's margin
    (:func:`witcert_calculus.numerics.rounding.logit_margin`), made once per value set and device."""
    m = logit_margin(bands, scale=scale)
    return device_constants((float(scale), m.gamma, m.alpha), device)


@triton.jit
def meter_store(WitOut: Any, cur_batch: Any, heads: Any, mask_h: Any, split_kv_id: Any,
                q_head_num: Any, max_splits: Any, mx0: Any, a0: Any, mx1: Any, a1: Any,
                mx2: Any, a2: Any, s_abs: Any, c_max: Any, c_inf: Any, w_min: Any,
                bad: Any) -> None:  # noqa: N803
    """Store one split's accumulators, one row of :data:`FIELDS` per head in ``heads``."""
    base = WitOut + ((cur_batch * q_head_num + heads) * max_splits + split_kv_id) * 11
    tl.store(base + 0, mx0, mask=mask_h)
    tl.store(base + 1, a0, mask=mask_h)
    tl.store(base + 2, mx1, mask=mask_h)
    tl.store(base + 3, a1, mask=mask_h)
    tl.store(base + 4, mx2, mask=mask_h)
    tl.store(base + 5, a2, mask=mask_h)
    tl.store(base + 6, s_abs, mask=mask_h)
    tl.store(base + 7, c_max, mask=mask_h)
    tl.store(base + 8, c_inf, mask=mask_h)
    tl.store(base + 9, w_min, mask=mask_h)
    tl.store(base + 10, bad, mask=mask_h)


def empty_partials(batch: int, heads: int, splits: int, *, device: torch.device
                   ) -> torch.Tensor:
    """``[batch, heads, splits, 11]`` float64 partials that read as empty splits (a split
    with no token is never stored by the kernel)."""
    out = torch.zeros((batch, heads, splits, len(FIELDS)), dtype=torch.float64, device=device)
    out[..., FIELDS.index("mx0")] = -math.inf
    out[..., FIELDS.index("mx1")] = -math.inf
    out[..., FIELDS.index("mx2")] = -math.inf
    out[..., FIELDS.index("w_min")] = math.inf
    return out


def bounds_from_partials(partials: torch.Tensor, query_bands: torch.Tensor,
                         seq_lens: torch.Tensor, *, scale: float, tokens: int) -> TierMeter:
    """Merge a launch's split partials ``[B, H, S, 11]`` into the meter's bounds.

    Args:
        partials: the kernel's partials (:data:`FIELDS`), empty splits as
            :func:`empty_partials` leaves them.
        query_bands: ``[B, H, bands]`` float64, the query's band norms the kernel read.
        seq_lens: ``[B]`` tokens per request.
        scale: the softmax scale the kernel applied.
        tokens: an upper bound of every ``seq_lens`` entry (the margin's token count).

    Returns:
        The launch's :class:`~witcert_kernels.triton_decode_merge.TierMeter` (the fused decode's
        own type: one certificate type for every kernel).
    """
    bands = int(query_bands.shape[-1])
    tier, _ = tier_a_meter(partials, tokens=tokens, seq_lens=seq_lens,
                            query_bands=query_bands, scale=float(scale), bands=bands)
    return tier
