"""Fused decode attention and Tier-A/Tier-B meters over a paged KV cache, with split-KV merging.

One pass over the cached keys and values of every request computes the attention output and
the meter's accumulators: for the per-token logit bounds ``c_t = scale sum_b ||q_b|| w_{t,b}``
(the stored band witnesses ``w``, :func:`witcert_kernels.triton_witness.witness_write`) and
the kernel's own logits ``s_t = scale <q, k_hat_t>``,

    ``A = sum_t p~_t e^{c_t}``, ``A- = sum_t p~_t e^{-c_t}``, ``p~ = softmax(s)``,

kept as three online log-sum-exps in float64 (of ``s``, ``s + c`` and ``s - c``), so that
``log A = LSE(s + c) - LSE(s)`` and ``log A- = LSE(s - c) - LSE(s)``. ``A`` is a softmax-weighted
average, so the split-KV partials merge under log-sum-exp weights exactly as the output does
(no second scan). The e-form and two-sided TV bounds follow from ``log A`` and ``log A-``
(:func:`witcert_kernels.meter.forms_from_logs`, the twin's formulas and margins).

Layout (SGLang's and vLLM's paged caches): ``kv_indptr [B + 1]`` delimits each request's
pages in ``kv_indices``; token ``t`` of request ``b`` sits in slot
``kv_indices[kv_indptr[b] + t // page] * page + t % page`` of ``k_cache [slots, kv_heads, d]``,
``v_cache [slots, kv_heads, dv]`` and ``witness [slots, kv_heads, bands]``; ``seq_lens [B]``.
``page = 1`` is SGLang's token-level ``kv_indices``. Query heads map to kv heads in groups
(GQA; MQA with one kv head; MHA with as many).

Margin analysis (why the reported ``log A`` is an upper bound and ``log A-`` a lower bound of
their exact values for the kernel's logits ``s`` and the bounds ``c``):

- ``c_t`` is rounded outward with :func:`witcert_calculus.numerics.rounding.logit_margin` (a tree sum
  of ``bands`` products has no more rounding steps than the recursive sum it covers), so it
  is at least its exact formula.
- Each accumulated sum ``sum_t e^{y_t - M}`` (``y`` one of ``s``, ``s + c``, ``s - c``) is a
  sum of nonnegative terms; the largest term is ``e^0 = 1`` exactly, so the sum is at least
  1. Each term passes through at most ``2 + 3 n`` float64 operations (the exponent's
  subtraction, ``exp`` within one ulp, one rescaling ``exp`` and product per later block of
  its split, and the split merge), ``n`` the number of blocks; the sum itself adds at most one
  rounding per token (a tree within a block, a recursive sum across blocks). The forming of
  ``y = s + c`` rounds the exponent by at most ``u |y|``, which changes a term by a factor
  within ``e^{2 u |y|}``. So the computed sum is within a factor ``(1 + gamma)`` of the exact
  one, ``gamma = (2 S + 3 n + 16) u + 2 u max|y|``, and each of the logarithms and the
  differences adds ``u`` times its magnitude. The reported ``log A`` adds
  ``2 gamma + 4 u (|LSE(s)| + |LSE(s + c)| + |LSE(s - c)| + 1)`` and is rounded up
  (``log A-`` subtracts the same and is rounded down): with ``max|y| <= max|s| + max c`` and
  ``n <= S``, this is what :func:`_log_margin` computes.
- An infinite ``c_t`` makes ``log A`` infinite (saturation); a NaN bound or logit makes it
  NaN (the gate rejects it; Triton's ``max`` ignores NaN, so the kernel flags it on its
  own): never a finite number. ``c = 0`` everywhere gives ``log A = log A- = 0``
  exactly (identical arithmetic on identical exponents) and the exact bound 0. A row with one
  token reports 0 (Lean ``WitCert.Meters.tv_single_token``).
- What the theorems take as given and the code does not bound: ``p~`` is the exact softmax of
  the kernel's float32 logits ``s``, not of the exact compressed logits
  (:data:`witcert_calculus.lean.modelling.SOFTMAX_AS_COMPUTED`).
- The kernel's float64 constants (the scale in ``c_t`` and ``u_t``, every margin) reach it in
  a float64 tensor: Triton passes a Python float as float32, which would round ``1 + gamma``
  to 1 and flush the subnormal absolute margins to 0.

Tier B (:func:`fused_decode_tier_b`, :func:`fused_decode_pool`): the per-token bound
``u_t = sqrt(2 varsigma_t^2 log(2 S / delta_loc)) + m_t + e_t`` of
:func:`witcert_kernels.dither.tier_b_logit_bound` takes the place of ``c_t`` in the same three
log-sum-exps (the analysis above uses only ``c_t >= 0`` and its size, so the slack is the
same):

- The query-side pieces (per scale block, ``sum q_c^2`` and ``sum |q_c|`` over the kept
  channels, the outlier channels of the query head's kv head zeroed; which blocks hold a
  nonzero channel; the variance's absolute margin ``alpha (1 + max q_c^2)``; ``||q||``
  rounded outward) are computed on the host side of the launch by the torch bound's own
  function, and ``log(2 S / delta_loc)`` per request from ``seq_lens`` likewise (``S`` the
  request's tokens: the union bound of one row).
- In the kernel, per token, from the float16 block scales ``s_{t,b}`` of the slot read: the
  variance ``scale^2 sum_b q2_b s_{t,b}^2 / 12``, the radius, the grid mean
  ``scale sum_b |q|_b s_{t,b} 2^-25`` and the cast term ``scale ||q|| cast_t``, in the torch
  bound's order of operations, each rounded outward with its margin
  (:func:`witcert_calculus.numerics.rounding.variance_margin`, ``radius_margin``,
  ``grid_mean_margin``, ``cast_margin``); the block sums are tree sums, with no more
  rounding steps than the recursive sums the margins cover. A token with no block holding
  both a nonzero scale and a nonzero query channel is exact (``u_t = 0`` before the cast
  term), as in the torch bound.
- Pooled read: ``x_hat = s (code - xi)`` is exact in float64 (an 8-bit code minus a dither on
  the ``2^-24`` grid is below ``2^8`` in size: at most 32 significant bits, the float16
  scale 11), the outlier
  channels come from their float16 values, and the key is rounded once into the cache dtype,
  exactly as :func:`witcert_kernels.triton_dither.dither_read` does. ``cast_t`` bounds
  ``||k_t - x_hat*_t||`` against the reconstruction with the keys' own outlier values: a kept
  channel's rounding is computed exactly (a difference of neighbouring floats), an outlier
  value ``v = fp16(x)`` rounded to nearest is within ``max(2^-11 |v|, 2^-25)`` of ``x``
  (half an ulp: ``2^-11`` relative for normal numbers, ``2^-25`` below ``2^-14``), and the
  norm is :func:`witcert_kernels.meter.l2_norm_upper`'s (amax-scaled sum of squares,
  :func:`witcert_calculus.numerics.rounding.band_norm_margin` over ``d`` channels);
  :func:`pool_cast_bound` is its torch twin.
- An infinite scale or cast makes ``u_t`` infinite (saturation); a NaN one makes it NaN; a
  negative scale or cast refuses the evidence (computed premises, read when the evidence is
  built). The result holds except with probability ``delta_loc`` per row, for non-adaptive
  queries: the basis carries ``delta = delta_loc`` and the assumptions
  :data:`witcert_calculus.meters.dither.NON_ADAPTIVE_QUERIES`,
  :data:`witcert_calculus.meters.dither.PHILOX_UNIFORM` and
  :data:`witcert_kernels.dither.STORED_ENCODING` (or :data:`POOL_WRITTEN_BY_STORE` for the
  pooled read, which reads the scales, codes and exact mask itself).

MLA (a latent cache, e.g. ``Lk = 576`` with ``Lv = 512``): one kv head shared by every query
head, and ``v_cache = k_cache[..., :Lv]``, a view read in place with the keys' row stride (no
second tensor); the witnesses' bands partition all ``Lk`` channels.

Capturable by design: fixed grids, no host synchronisation (``max_tokens`` is the caller's
bound on ``seq_lens``, used for the margin), device-resident partials merged by device ops;
the premises stay device tensors until a reading's evidence is built (the test suite runs
every launch path with the tensor-to-host reads made to raise). The kernel's constants are
built once per value set and device and reused. An optional device counter is incremented
once per launch (a probe that every replay of a captured graph ran the meter).

On a machine without a GPU the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``,
set before triton is imported) on CPU tensors.

Main declarations
-----------------
- :class:`FusedDecode`: the output, its log-sum-exp, and the meter's bounds per query head.
- :func:`fused_decode`: the kernel launch and the split merge (Tier A).
- :func:`decode_attention`: the same kernel without the meter (the benchmarks' baseline).
- :class:`TierMeter`, :class:`FusedDecodeTiers`: one tier's bounds; a step with Tier B (and
  Tier A beside it when witnesses are given).
- :func:`fused_decode_tier_b`: attention and the Tier-B meter over keys read back from a
  dithered store, their float16 block scales read in the same pass.
- :func:`fused_decode_pool`: attention and the Tier-B meter read straight from a
  :class:`~witcert_kernels.triton_dither.DitherPool`; :func:`decode_attention_pool`, the same
  read without the meter; :func:`pool_cast_bound`, the torch twin of its cast bound;
  :data:`POOL_WRITTEN_BY_STORE`, what its basis assumes.
"""

# The kernel body is Triton's language, which carries no Python types: basic checking only.
# pyright: basic

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Any, Final, final

import numpy as np
import torch
import triton
import triton.language as tl

from witcert_calculus.meters.dither import GRID_MEAN
from witcert_calculus.errors import InvalidValueError
from witcert_calculus.numerics.rounding import TINY, Margin, band_norm_margin, logit_margin
from witcert_calculus.lean.theorems import TV_SINGLE_TOKEN
from witcert_calculus.tiers import Assumption
from witcert_calculus.meters.tv_forms import TVBasis
from witcert_calculus.numerics.validation import UNIT_ROUNDOFF, positive_int, real
from witcert_calculus.meters.witness import RopeLayout
from witcert_calculus.meters.witness import _WITNESS_PREMISE  # pyright: ignore[reportPrivateUsage]
from witcert_calculus.meters.witness import _tier_a_evidence  # pyright: ignore[reportPrivateUsage]
from witcert_kernels.meter import _tanh_max  # pyright: ignore[reportPrivateUsage]
from witcert_kernels.meter import band_norms, forms_from_logs, l2_norm_upper
from witcert_kernels.dither import STORED_ENCODING
from witcert_kernels.dither import _TierBQuery  # pyright: ignore[reportPrivateUsage]
from witcert_kernels.dither import _tier_b_log_term  # pyright: ignore[reportPrivateUsage]
from witcert_kernels.dither import _tier_b_query  # pyright: ignore[reportPrivateUsage]
from witcert_kernels.dither import _tier_b_query_evidence  # pyright: ignore[reportPrivateUsage]
from witcert_kernels.triton_dither import DitherPool, dither_read
from witcert_kernels.triton_dither import _constants as _dither_constants  # pyright: ignore[reportPrivateUsage]
from witcert_kernels.triton_dither import _dither_xi  # pyright: ignore[reportPrivateUsage]
from witcert_kernels.triton_launch import check_device, pow2

__all__ = ["POOL_WRITTEN_BY_STORE", "FusedDecode", "FusedDecodeTiers", "TierMeter",
           "decode_attention", "decode_attention_pool", "fused_decode", "fused_decode_pool",
           "fused_decode_tier_b", "pool_cast_bound"]

_NEG = float("-inf")


@triton.jit
def _lse_step(mx: Any, acc: Any, y: Any, valid: Any) -> tuple[Any, Any]:
    """One block of an online log-sum-exp: running max ``mx`` and sum ``acc`` of ``e^{y-mx}``."""
    yv = tl.where(valid, y, float("-inf"))
    new = tl.maximum(mx, tl.max(yv, axis=0))
    live = new > float("-inf")
    scale = tl.where(live, tl.where(mx > float("-inf"), tl.exp(mx - new), 0.0), 0.0)
    terms = tl.where(live, tl.where(valid, tl.exp(yv - new), 0.0), 0.0)
    return new, acc * scale + tl.sum(terms, axis=0)


@triton.jit
def _outward(v: Any, gamma: Any, alpha: Any, exact: Any) -> Any:
    """:func:`witcert_kernels.rounding.outward` in the kernel: ``next_up(v (1 + gamma) + alpha)``
    for ``v >= 0``, exact or non-finite entries kept (an overflow of the raise stays ``inf``)."""
    raised = v * (1.0 + gamma) + alpha
    up = tl.where(raised < float("inf"),
                  (raised.to(tl.int64, bitcast=True) + 1).to(tl.float64, bitcast=True), raised)
    finite = (v == v) & (tl.abs(v) < float("inf"))
    return tl.where(exact | ~finite, v, up)


@triton.jit
def _meter_step(mx1: Any, a1: Any, mx2: Any, a2: Any, c_max: Any, c_inf: Any, bad: Any,
                s64: Any, c: Any, valid: Any) -> tuple[Any, Any, Any, Any, Any, Any, Any]:
    """One block of one meter: per-token bounds ``c`` into the log-sum-exps of ``s + c`` and
    ``s - c``, the largest finite ``c``, and the flags of an infinite and of a NaN ``c`` or
    logit (Triton's ``max`` ignores NaN, so it is flagged on its own)."""
    is_inf = valid & (c == float("inf"))
    c_inf = tl.maximum(c_inf, tl.max(is_inf.to(tl.int32), axis=0))
    nan = tl.where(valid, (c != c) | (s64 != s64), False)
    bad = tl.maximum(bad, tl.max(nan.to(tl.int32), axis=0))
    c_fin = tl.where(is_inf, 0.0, c)
    mx1, a1 = _lse_step(mx1, a1, s64 + c_fin, valid)
    mx2, a2 = _lse_step(mx2, a2, s64 - c_fin, valid)
    c_max = tl.maximum(c_max, tl.max(tl.where(valid, c_fin, 0.0), axis=0))
    return mx1, a1, mx2, a2, c_max, c_inf, bad


@triton.jit
def _decode_tiers_kernel(q_ptr: Any, k_ptr: Any, v_ptr: Any, w_ptr: Any, qn_ptr: Any,
                         indptr_ptr: Any, indices_ptr: Any, lens_ptr: Any, po_ptr: Any,
                         pm_ptr: Any, pl_ptr: Any, meter_ptr: Any, consts_ptr: Any, sc_ptr: Any,
                         cast_ptr: Any, bq_ptr: Any, br_ptr: Any, lt_ptr: Any, vals_ptr: Any,
                         keep_ptr: Any, rank_ptr: Any, count_ptr: Any, heads: Any, kv_heads: Any,
                         d: Any, dv: Any, v_stride: Any, nbands: Any, nbs: Any, bs: Any,
                         m2: Any, splits: Any, scale: Any, layer: Any, k0: Any, k1: Any,
                         PAGE: tl.constexpr, BLOCK: tl.constexpr, D: tl.constexpr,  # noqa: N803
                         DV: tl.constexpr, NB: tl.constexpr, NBS: tl.constexpr,
                         M2: tl.constexpr, METER: tl.constexpr, TIER_B: tl.constexpr,
                         CAST: tl.constexpr, POOL: tl.constexpr, KF16: tl.constexpr,
                         NM: tl.constexpr, COUNT: tl.constexpr, M0: tl.constexpr,
                         M1: tl.constexpr, W0: tl.constexpr, W1: tl.constexpr,
                         SHIFT: tl.constexpr, STEP: tl.constexpr) -> None:
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    sp = tl.program_id(2).to(tl.int64)
    kvh = h // (heads // kv_heads)
    seq = tl.load(lens_ptr + b).to(tl.int64)
    first_page = tl.load(indptr_ptr + b).to(tl.int64)
    per = (seq + splits - 1) // splits
    start = sp * per
    end = tl.minimum(start + per, seq)
    di = tl.arange(0, D)
    dvi = tl.arange(0, DV)
    bi = tl.arange(0, NB)
    bj = tl.arange(0, NBS)
    q = tl.load(q_ptr + (b * heads + h) * d + di, mask=di < d, other=0.0).to(tl.float32)
    # float64 constants (Triton passes Python floats as float32): the margins, the scale
    scale64 = tl.load(consts_ptr + 0)
    c_gamma = tl.load(consts_ptr + 1)
    c_alpha = tl.load(consts_ptr + 2)
    m32 = tl.full((), float("-inf"), tl.float32)
    l32 = tl.zeros((), tl.float32)
    acc = tl.zeros((DV,), tl.float32)
    mx0 = tl.full((), float("-inf"), tl.float64)
    a0 = tl.zeros((), tl.float64)
    s_abs = tl.zeros((), tl.float64)
    # Tier A: c_t from the witnesses
    mx1 = tl.full((), float("-inf"), tl.float64)
    mx2 = tl.full((), float("-inf"), tl.float64)
    a1 = tl.zeros((), tl.float64)
    a2 = tl.zeros((), tl.float64)
    c_max = tl.zeros((), tl.float64)
    c_inf = tl.zeros((), tl.int32)
    bad = tl.zeros((), tl.int32)
    w_min = tl.full((), float("inf"), tl.float64)
    # Tier B: u_t from the block scales
    ux1 = tl.full((), float("-inf"), tl.float64)
    ux2 = tl.full((), float("-inf"), tl.float64)
    ua1 = tl.zeros((), tl.float64)
    ua2 = tl.zeros((), tl.float64)
    u_max = tl.zeros((), tl.float64)
    u_inf = tl.zeros((), tl.int32)
    u_bad = tl.zeros((), tl.int32)
    s_bad = tl.zeros((), tl.int32)
    e_bad = tl.zeros((), tl.int32)
    qn = tl.zeros((NB,), tl.float64)
    q_top = tl.zeros((), tl.float64)
    if METER:
        qn = tl.load(qn_ptr + (b * heads + h) * nbands + bi, mask=bi < nbands, other=0.0)
        q_top = tl.max(qn, axis=0)
    q2 = tl.zeros((NBS,), tl.float64)
    qa = tl.zeros((NBS,), tl.float64)
    ql = tl.zeros((NBS,), tl.float64)
    var_alpha = tl.zeros((), tl.float64)
    q_norm = tl.zeros((), tl.float64)
    log_term = tl.zeros((), tl.float64)
    if TIER_B:
        qrow = bq_ptr + (b * heads + h) * 3 * nbs
        q2 = tl.load(qrow + bj, mask=bj < nbs, other=0.0)
        qa = tl.load(qrow + nbs + bj, mask=bj < nbs, other=0.0)
        ql = tl.load(qrow + 2 * nbs + bj, mask=bj < nbs, other=0.0)
        var_alpha = tl.load(br_ptr + (b * heads + h) * 2)
        q_norm = tl.load(br_ptr + (b * heads + h) * 2 + 1)
        log_term = tl.load(lt_ptr + b)
    if POOL:
        keep_c = tl.load(keep_ptr + kvh * d + di, mask=di < d, other=1) != 0
        rank_c = tl.load(rank_ptr + kvh * d + di, mask=di < d, other=0)
    for blk in range(0, tl.cdiv(tl.maximum(end - start, 0), BLOCK)):
        t = start + blk * BLOCK + tl.arange(0, BLOCK)
        valid = t < end
        page = tl.load(indices_ptr + first_page + t // PAGE, mask=valid, other=0).to(tl.int64)
        slot = page * PAGE + t % PAGE
        row = slot * kv_heads + kvh
        km = valid[:, None] & (di[None, :] < d)
        cast_t = tl.zeros((BLOCK,), tl.float64)
        if POOL:
            # the dithered store read in registers: s (code - xi), the outlier channels from
            # their float16 values, rounded once into the cache's dtype (what dither_read gives)
            code = tl.load(k_ptr + row[:, None] * d + di[None, :], mask=km, other=0)
            s_c = tl.load(sc_ptr + row[:, None] * nbs + (di // bs)[None, :], mask=km,
                          other=0.0).to(tl.float64)
            ch = di[None, :] + tl.zeros((BLOCK, D), tl.int64)
            xi = _dither_xi(ch, slot[:, None] + tl.zeros((BLOCK, D), tl.int64), kvh, layer,
                            k0, k1, M0, M1, W0, W1, SHIFT, STEP)
            x_hat = s_c * (code.to(tl.float64) - xi)
            exact_v = tl.zeros((BLOCK, D), tl.float64)
            if M2 > 0:
                exact_v = tl.load(vals_ptr + row[:, None] * m2 + rank_c[None, :],
                                  mask=km & ~keep_c[None, :], other=0.0).to(tl.float64)
                x_hat = tl.where(keep_c[None, :], x_hat, exact_v)
            if KF16:
                k_read = x_hat.to(tl.float16).to(tl.float64)
            else:
                k_read = x_hat.to(tl.float32).to(tl.float64)
            k = k_read.to(tl.float32)
            if TIER_B:
                # ||k_read - x_hat*|| (x_hat* exact on the outlier channels): the kept channels'
                # rounding exactly; an outlier's float16 rounding to nearest is within
                # max(2^-11 |v|, 2^-25) of the key
                err = tl.where(keep_c[None, :], tl.abs(k_read - x_hat),
                               tl.maximum(tl.abs(exact_v) * 0.00048828125,
                                          2.9802322387695312e-08))
                err = tl.where(km, err, 0.0)
                e_top: Any = tl.max(err, axis=1)
                e_div = tl.where(e_top > 0, e_top, 1.0)
                sq = tl.sum((err / e_div[:, None]) * (err / e_div[:, None]), axis=1)
                bm_g = tl.load(consts_ptr + 11)
                bm_a = tl.load(consts_ptr + 12)
                cast_t = _outward(tl.sqrt(sq) * e_top, bm_g, bm_a * e_top + tl.load(consts_ptr + 14),
                                  e_top == 0)
                cast_t = tl.where(e_top == float("inf"), float("inf"), cast_t)
        else:
            k = tl.load(k_ptr + row[:, None] * d + di[None, :], mask=km, other=0.0).to(tl.float32)
        s = tl.sum(k * q[None, :], axis=1) * scale  # float32 logits
        s = tl.where(valid, s, float("-inf"))
        # the attention output: float32 online softmax
        m_new = tl.maximum(m32, tl.max(s, axis=0))
        alpha = tl.where(m32 > float("-inf"), tl.exp(m32 - m_new), 0.0)
        p = tl.where(valid, tl.exp(s - m_new), 0.0)
        v = tl.load(v_ptr + row[:, None] * v_stride + dvi[None, :],
                    mask=valid[:, None] & (dvi[None, :] < dv), other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        l32 = l32 * alpha + tl.sum(p, axis=0)
        m32 = m_new
        s64 = s.to(tl.float64)
        if METER or TIER_B:
            mx0, a0 = _lse_step(mx0, a0, s64, valid)
            s_abs = tl.maximum(s_abs, tl.max(tl.where(valid, tl.abs(s64), 0.0), axis=0))
        if METER:
            # Tier A: per-token c_t from the witnesses, rounded outward
            w = tl.load(w_ptr + row[:, None] * nbands + bi[None, :],
                        mask=valid[:, None] & (bi[None, :] < nbands), other=0.0).to(tl.float64)
            prod = tl.where(qn[None, :] == 0.0, 0.0, qn[None, :] * w)  # inf * 0 is 0
            y = tl.sum(prod, axis=1) * scale64
            exact = ((tl.zeros((BLOCK,), tl.float64) + q_top) == 0.0) | (tl.max(w, axis=1) == 0.0)
            c = tl.where(exact, 0.0, _outward(y, c_gamma, c_alpha, exact))
            mx1, a1, mx2, a2, c_max, c_inf, bad = _meter_step(mx1, a1, mx2, a2, c_max, c_inf,
                                                              bad, s64, c, valid)
            w_min = tl.minimum(w_min, tl.min(tl.min(tl.where(valid[:, None] & (bi[None, :] < nbands),
                                                             w, float("inf")), axis=1), axis=0))
        if TIER_B:
            # Tier B: u_t of witcert_kernels.dither.tier_b_logit_bound from the stored scales
            sm = valid[:, None] & (bj[None, :] < nbs)
            sb = tl.load(sc_ptr + row[:, None] * nbs + bj[None, :], mask=sm, other=0.0
                         ).to(tl.float64)
            zero = tl.sum(ql[None, :] * (sb != 0).to(tl.float64), axis=1) == 0
            var = tl.load(consts_ptr + 3) * tl.sum(q2[None, :] * (sb * sb), axis=1) / 12.0
            var = _outward(var, tl.load(consts_ptr + 4), var_alpha, zero)
            radius = _outward(tl.sqrt(2.0 * var * log_term), tl.load(consts_ptr + 5),
                              tl.load(consts_ptr + 6), var == 0)
            mean = _outward(scale64 * tl.sum(qa[None, :] * sb, axis=1) * tl.load(consts_ptr + 13),
                            tl.load(consts_ptr + 7), tl.load(consts_ptr + 8), zero)
            u = radius + mean
            if CAST > 0:
                if CAST == 1:
                    cast_t = tl.load(cast_ptr + row, mask=valid, other=0.0).to(tl.float64)
                term = _outward(scale64 * q_norm * cast_t, tl.load(consts_ptr + 9),
                                tl.load(consts_ptr + 10),
                                ((tl.zeros((BLOCK,), tl.float64) + q_norm) == 0)
                                | (cast_t == 0))
                u = u + term
                cbad = valid & ~((cast_t >= 0) & (cast_t < float("inf")))
                e_bad = tl.maximum(e_bad, tl.max(cbad.to(tl.int32), axis=0))
            u = tl.where(valid, u, 0.0)
            sbad = sm & ~((sb >= 0) & (sb < float("inf")))
            s_bad = tl.maximum(s_bad, tl.max(tl.max(sbad.to(tl.int32), axis=1), axis=0))
            ux1, ua1, ux2, ua2, u_max, u_inf, u_bad = _meter_step(ux1, ua1, ux2, ua2, u_max,
                                                                  u_inf, u_bad, s64, u, valid)
    part = (b * heads + h) * splits + sp
    tl.store(po_ptr + part * dv + dvi, acc, mask=dvi < dv)
    tl.store(pm_ptr + part, m32)
    tl.store(pl_ptr + part, l32)
    base = meter_ptr + part * NM
    if METER or TIER_B:
        tl.store(base + 0, mx0)
        tl.store(base + 1, a0)
        tl.store(base + 6, s_abs)
    if METER:
        tl.store(base + 2, mx1)
        tl.store(base + 3, a1)
        tl.store(base + 4, mx2)
        tl.store(base + 5, a2)
        tl.store(base + 7, c_max)
        tl.store(base + 8, c_inf.to(tl.float64))
        tl.store(base + 9, w_min)
        tl.store(base + 10, bad.to(tl.float64))
    if TIER_B:
        tl.store(base + 11, ux1)
        tl.store(base + 12, ua1)
        tl.store(base + 13, ux2)
        tl.store(base + 14, ua2)
        tl.store(base + 15, u_max)
        tl.store(base + 16, u_inf.to(tl.float64))
        tl.store(base + 17, u_bad.to(tl.float64))
        tl.store(base + 18, s_bad.to(tl.float64))
        tl.store(base + 19, e_bad.to(tl.float64))
    if COUNT:
        # a device-resident launch counter: one increment per launch (program (0, 0, 0))
        tl.atomic_add(count_ptr, 1, mask=(b == 0) & (h == 0) & (sp == 0))


def _merge_lse(mx: torch.Tensor, acc: torch.Tensor) -> torch.Tensor:
    """``log sum_i acc_i e^{mx_i}`` over the last (split) axis; empty splits are ``-inf``."""
    logs = torch.where(acc > 0, mx + torch.log(torch.where(acc > 0, acc, 1.0)), _NEG)
    return torch.logsumexp(logs, dim=-1)


def _log_margin(lse: tuple[torch.Tensor, torch.Tensor, torch.Tensor], s_abs: torch.Tensor,
                c_max: torch.Tensor, *, tokens: int) -> torch.Tensor:
    """The slack added to ``log A`` (and taken from ``log A-``): see the module's analysis."""
    u = UNIT_ROUNDOFF
    gamma = (5 * tokens + 64) * u + 2 * u * (s_abs + c_max)
    size = sum((torch.where(torch.isfinite(x), x.abs(), 0.0) for x in lse),
               torch.zeros_like(s_abs))
    return 2 * gamma + 4 * u * (size + 1.0) + TINY


@final
@dataclass(frozen=True, slots=True, eq=False)
class FusedDecode:
    """What one fused decode step returns, per request and query head (``[B, H]`` unless said).

    Attributes:
        output: the attention output ``[B, H, dv]`` in the query's dtype.
        lse: the float32 log-sum-exp of the logits (what split-KV merging needs).
        log_a: an upper bound of ``log A`` (``inf``: an infinite ``c``).
        log_a_minus: a lower bound of ``log A-``.
        eform: ``TV <= (A^2 - 1) / 2``, rounded outward (``inf`` on overflow).
        two_sided: ``TV <= sinh(log A - log A-)``, rounded outward.
        meter: the smaller of the two (what the meter reports; ``min(1, meter)`` is the TV
            bound).
        tanh_max: the comparison shape ``tanh(max_t c_t)``.
        witness_min: the smallest witness read (``inf`` for a row with no token).
        basis: what the bounds rest on (:class:`~witcert_calculus.meters.tv_forms.TVBasis`): the
            logit bounds ``c_t`` were computed in the kernel from the stored witnesses and
            the query's band norms (computed here, rounded outward; Lean
            ``WitCert.Witness.logit_bound_sound``), with the premises computed on the device
            (``w >= 0``, no NaN) and read only when ``basis.evidence(...)`` builds a
            reading's evidence.
    """

    output: torch.Tensor
    lse: torch.Tensor
    log_a: torch.Tensor
    log_a_minus: torch.Tensor
    eform: torch.Tensor
    two_sided: torch.Tensor
    meter: torch.Tensor
    tanh_max: torch.Tensor
    witness_min: torch.Tensor
    basis: TVBasis


@final
@dataclass(frozen=True, slots=True, eq=False)
class TierMeter:
    """One tier's meter of a fused decode step, per request and query head (``[B, H]``).

    Attributes:
        log_a: an upper bound of ``log A`` (``inf``: an infinite bound ``c_t``).
        log_a_minus: a lower bound of ``log A-``.
        eform: ``TV <= (A^2 - 1) / 2``, rounded outward (``inf`` on overflow).
        two_sided: ``TV <= sinh(log A - log A-)``, rounded outward.
        meter: the smaller of the two (``min(1, meter)`` is the TV bound).
        tanh_max: the comparison shape ``tanh(max_t c_t)``.
        bound_max: the largest finite per-token bound ``max_t c_t`` read.
        basis: what the bounds rest on (:class:`~witcert_calculus.meters.tv_forms.TVBasis`); its
            premises on tensor contents are device tensors, read only when
            ``basis.evidence(...)`` builds a reading's evidence.
    """

    log_a: torch.Tensor
    log_a_minus: torch.Tensor
    eform: torch.Tensor
    two_sided: torch.Tensor
    meter: torch.Tensor
    tanh_max: torch.Tensor
    bound_max: torch.Tensor
    basis: TVBasis


@final
@dataclass(frozen=True, slots=True, eq=False)
class FusedDecodeTiers:
    """What a fused decode step with the Tier-B meter returns (``[B, H]`` unless said).

    Attributes:
        output: the attention output ``[B, H, dv]`` in the query's dtype.
        lse: the float32 log-sum-exp of the logits.
        tier_b: the Tier-B meter (per-token ``u_t`` from the stored block scales; its
            bounds hold except with probability ``delta_loc`` per row).
        tier_a: the Tier-A meter of the same pass when witnesses were given, else ``None``.
        witness_min: the smallest witness read (Tier A), else ``None``.
    """

    output: torch.Tensor
    lse: torch.Tensor
    tier_b: TierMeter
    tier_a: TierMeter | None
    witness_min: torch.Tensor | None


@final
@dataclass(frozen=True, slots=True, eq=False)
class _Partials:
    """The split partials of one launch, and what the merge needs."""

    po: torch.Tensor
    pm: torch.Tensor
    pl: torch.Tensor
    meter: torch.Tensor
    dtype: torch.dtype
    tokens: int

    def output(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The merged output and its log-sum-exp."""
        top = self.pm.amax(dim=-1, keepdim=True)
        wts = torch.where(self.pm > _NEG, torch.exp(self.pm - top), 0.0)
        den = (wts * self.pl).sum(dim=-1)
        output = ((wts.unsqueeze(-1) * self.po).sum(dim=-2) / den.unsqueeze(-1)).to(self.dtype)
        return output, top.squeeze(-1) + torch.log(den)


@final
@dataclass(frozen=True, slots=True, eq=False)
class _TierBLaunch:
    """The Tier-B inputs of one launch, computed on the host side of it (device tensors)."""

    scales: torch.Tensor  # [slots, kv_heads, nb] float16, as stored
    cast: torch.Tensor | None  # [slots, kv_heads] float64 cast bounds read by the kernel
    in_kernel_cast: bool  # the pooled read computes its cast bound itself
    query: torch.Tensor  # [B, H, 3 nb] float64: q2, q_abs, live of witcert_kernels.dither
    row: torch.Tensor  # [B, H, 2] float64: the variance's alpha, ||q||
    log_term: torch.Tensor  # [B] float64: log(2 seq_len / delta_loc)
    tq: _TierBQuery


@final
@dataclass(frozen=True, slots=True, eq=False)
class _PoolLaunch:
    """A pooled read: the pool, its kept-channel mask and exact-channel ranks, the key dtype."""

    pool: DitherPool
    keep: torch.Tensor  # [kv_heads, d] int8
    rank: torch.Tensor  # [kv_heads, d] int64
    f16: bool


#: What the pooled Tier-B meter takes on the caller's word about the pool it reads.
POOL_WRITTEN_BY_STORE: Final = Assumption(
    "every slot read was written by witcert_kernels.triton_dither.dither_store into this "
    "pool (its seed, layer, block size and exact mask) from the keys the logit errors are "
    "measured against, and seq_lens counts every token each row attends to",
    reason="the kernel reads the codes, scales and outlier values, not the keys they were "
           "written from")

_KEY_DTYPES: Final = (torch.float16, torch.float32)


@lru_cache(maxsize=64)
def _constants(values: tuple[float, ...], device: torch.device) -> torch.Tensor:
    """The kernel's float64 constants on ``device``, built once per value set (a launch in a
    captured graph reuses them: no host-to-device copy inside it)."""
    return torch.tensor(values, dtype=torch.float64, device=device)


def _kernel_constants(*, scale: float, bands: int, tq: _TierBQuery | None, head_dim: int,
                      device: torch.device) -> torch.Tensor:
    cm = logit_margin(bands, scale=scale)
    zero = Margin(0.0, 0.0)
    vm, rm, mm, km = (zero,) * 4 if tq is None else (tq.var_margin, tq.radius_margin,
                                                      tq.mean_margin, tq.cast_margin)
    bm = band_norm_margin(head_dim)
    return _constants((scale, cm.gamma, cm.alpha, scale * scale, vm.gamma, rm.gamma, rm.alpha,
                       mm.gamma, mm.alpha, km.gamma, km.alpha, bm.gamma, bm.alpha, GRID_MEAN,
                       TINY), device)


def _tier_b_launch(q: torch.Tensor, scales: torch.Tensor, *, kv_heads: int,
                   exact: torch.Tensor | None, cast: torch.Tensor | None,
                   in_kernel_cast: bool, delta_loc: float, seq_lens: torch.Tensor,
                   scale: float) -> _TierBLaunch:
    """The query side of ``u_t`` (:func:`witcert_kernels.dither.tier_b_logit_bound`'s own
    pieces), the outlier channels of each query head's kv head excluded."""
    bsz, heads, d = (int(n) for n in q.shape)
    slots = int(scales.shape[0])
    if scales.ndim != 3 or int(scales.shape[1]) != kv_heads or scales.dtype != torch.float16:
        raise InvalidValueError("scales", (tuple(scales.shape), str(scales.dtype)),
                                f"must be float16 [slots, {kv_heads}, blocks]")
    if cast is not None and (tuple(cast.shape) != (slots, kv_heads)):
        raise InvalidValueError("cast", tuple(cast.shape), f"must be [{slots}, {kv_heads}]")
    ex = None
    if exact is not None:
        if tuple(exact.shape) != (kv_heads, d) or exact.dtype != torch.bool:
            raise InvalidValueError("exact", (tuple(exact.shape), str(exact.dtype)),
                                    f"must be a bool mask [{kv_heads}, {d}]")
        ex = exact.to(q.device).repeat_interleave(heads // kv_heads, dim=0)  # [H, d]
    tq = _tier_b_query(q, blocks=int(scales.shape[-1]), scale=scale, delta_loc=delta_loc,
                       exact=ex, cast=cast is not None or in_kernel_cast)
    q_norm = tq.q_norm if tq.q_norm is not None else torch.zeros_like(tq.var_alpha)
    return _TierBLaunch(
        scales=scales.contiguous(),
        cast=None if cast is None else cast.to(torch.float64).contiguous(),
        in_kernel_cast=in_kernel_cast,
        query=torch.cat((tq.q2, tq.q_abs, tq.live), dim=-1).contiguous(),
        row=torch.cat((tq.var_alpha, q_norm), dim=-1).contiguous(),
        log_term=_tier_b_log_term(seq_lens, tq.delta_loc).contiguous(), tq=tq)


def _launch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
            witness: torch.Tensor | None, query_bands: torch.Tensor | None, *,
            kv_indptr: torch.Tensor, kv_indices: torch.Tensor, seq_lens: torch.Tensor,
            page_size: int, scale: float, max_tokens: int, splits: int, block: int,
            tier_b: _TierBLaunch | None = None, pool: _PoolLaunch | None = None,
            counter: torch.Tensor | None = None) -> _Partials:
    if q.ndim != 3 or k_cache.ndim != 3 or v_cache.ndim != 3:
        raise InvalidValueError("q", tuple(q.shape),
                                "q [B, H, d] and caches [slots, kv_heads, ...] expected")
    bsz, heads, d = (int(n) for n in q.shape)
    slots, kv_heads, dk = (int(n) for n in k_cache.shape)
    dv = int(v_cache.shape[-1])
    if dk != d or tuple(v_cache.shape[:2]) != (slots, kv_heads):
        raise InvalidValueError("k_cache", tuple(k_cache.shape),
                                f"caches must share [slots, kv_heads] and the query's d = {d}")
    if kv_heads < 1 or heads % kv_heads:
        raise InvalidValueError("kv_heads", kv_heads, f"must divide the {heads} query heads")
    metered = witness is not None and query_bands is not None
    nb = 1
    if witness is not None and query_bands is not None:
        nb = int(witness.shape[-1])
        if witness.ndim != 3 or tuple(witness.shape[:2]) != (slots, kv_heads):
            raise InvalidValueError("witness", tuple(witness.shape),
                                    f"must be [{slots}, {kv_heads}, bands]")
        if tuple(query_bands.shape) != (bsz, heads, nb) or query_bands.dtype != torch.float64:
            raise InvalidValueError("query_bands", tuple(query_bands.shape),
                                    f"must be float64 [{bsz}, {heads}, {nb}]")
    if tuple(seq_lens.shape) != (bsz,) or tuple(kv_indptr.shape) != (bsz + 1,):
        raise InvalidValueError("seq_lens", tuple(seq_lens.shape),
                                f"seq_lens [{bsz}] and kv_indptr [{bsz + 1}] expected")
    if tier_b is not None and int(tier_b.scales.shape[0]) != slots:
        raise InvalidValueError("scales", tuple(tier_b.scales.shape),
                                f"must hold the cache's {slots} slots")
    if counter is not None and (tuple(counter.shape) != (1,) or counter.dtype != torch.int32):
        raise InvalidValueError("counter", (tuple(counter.shape), str(counter.dtype)),
                                "must be an int32 tensor of shape [1]")
    page = positive_int("page_size", page_size)
    n_split = positive_int("splits", splits)
    blk = pow2(positive_int("block", block))
    sc = real("scale", scale, lo=0.0, lo_open=True)
    tokens = positive_int("max_tokens", max_tokens)
    check_device(q)
    dev = q.device
    po = torch.empty((bsz, heads, n_split, dv), dtype=torch.float32, device=dev)
    pm = torch.empty((bsz, heads, n_split), dtype=torch.float32, device=dev)
    pl = torch.empty((bsz, heads, n_split), dtype=torch.float32, device=dev)
    nm = 20 if tier_b is not None else 11
    meter = torch.empty((bsz, heads, n_split, nm) if metered or tier_b is not None else (1,),
                        dtype=torch.float64, device=dev)
    w = witness.contiguous() if witness is not None else meter
    qb = query_bands.contiguous() if query_bands is not None else meter
    consts = _kernel_constants(scale=sc, bands=nb, tq=None if tier_b is None else tier_b.tq,
                               head_dim=d, device=dev)
    if v_cache.stride(-1) == 1 and v_cache.stride(0) == kv_heads * v_cache.stride(1):
        v, v_stride = v_cache, int(v_cache.stride(1))  # a view (MLA: the keys' first channels)
    else:
        v, v_stride = v_cache.contiguous(), dv
    nbs = bs = 1
    m2 = 0
    layer = k0 = k1 = 0
    sc_t = cast_t = bq = br = lt = vals = keep = rank = meter
    if tier_b is not None:
        nbs = int(tier_b.scales.shape[-1])
        sc_t, bq, br, lt = tier_b.scales, tier_b.query, tier_b.row, tier_b.log_term
        cast_t = tier_b.cast if tier_b.cast is not None else meter
    cast_mode = 0 if tier_b is None else (2 if tier_b.in_kernel_cast else
                                          int(tier_b.cast is not None))
    if pool is not None:
        p = pool.pool
        if tuple(p.codes.shape) != (slots, kv_heads, d):
            raise InvalidValueError("pool", tuple(p.codes.shape),
                                    f"its codes must be the keys read [{slots}, {kv_heads}, {d}]")
        sc_t, nbs = p.scales, int(p.scales.shape[-1])
        bs, m2, layer = p.block_size, int(p.outlier_values.shape[-1]), p.layer
        k0, k1 = p.seed & 0xFFFFFFFF, p.seed >> 32
        vals, keep, rank = p.outlier_values, pool.keep, pool.rank
    count = counter if counter is not None else meter
    if bsz and heads:
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            launch: Any = _decode_tiers_kernel[(bsz, heads, n_split)]
            launch(q.contiguous(), k_cache.contiguous(), v, w, qb, kv_indptr.contiguous(),
                   kv_indices.contiguous(), seq_lens.contiguous(), po, pm, pl, meter, consts,
                   sc_t, cast_t, bq, br, lt, vals, keep, rank, count, heads, kv_heads, d, dv,
                   v_stride, nb, nbs, bs, m2, n_split, sc, layer, k0, k1,
                   PAGE=page, BLOCK=blk, D=pow2(d), DV=pow2(dv), NB=pow2(nb), NBS=pow2(nbs),
                   M2=pow2(m2) if m2 else 0, METER=metered, TIER_B=tier_b is not None,
                   CAST=cast_mode, POOL=pool is not None,
                   KF16=pool is not None and pool.f16, NM=nm, COUNT=counter is not None,
                   **_dither_constants())
    return _Partials(po, pm, pl, meter, q.dtype, tokens)


def _forms(meter: torch.Tensor, at: tuple[int, int, int, int, int, int, int], *, tokens: int,
           seq_lens: torch.Tensor
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                      torch.Tensor, torch.Tensor]:
    """One meter's merge: the log bounds, the e-form, the two-sided form, ``tanh(max c)``,
    ``max c`` and the NaN flag, from the split partials at indices ``at`` (``mx+, a+, mx-,
    a-, c_max, c_inf, nan``) and the logits' log-sum-exp at 0, 1 and ``max|s|`` at 6."""
    lse0 = _merge_lse(meter[..., 0], meter[..., 1])
    lse1 = _merge_lse(meter[..., at[0]], meter[..., at[1]])
    lse2 = _merge_lse(meter[..., at[2]], meter[..., at[3]])
    s_abs = meter[..., 6].amax(dim=-1)
    c_max = meter[..., at[4]].amax(dim=-1)
    c_inf = meter[..., at[5]].amax(dim=-1) > 0
    nan = meter[..., at[6]].amax(dim=-1) > 0
    slack = _log_margin((lse0, lse1, lse2), s_abs, c_max, tokens=tokens)
    exact = (c_max == 0) & ~c_inf
    up = torch.full_like(lse0, math.inf)
    log_a = torch.where(exact, 0.0, torch.nextafter(lse1 - lse0 + slack, up))
    log_a = torch.where(c_inf, math.inf, log_a)
    log_am = torch.where(exact, 0.0, torch.nextafter(lse2 - lse0 - slack, -up))
    log_am = torch.where(c_inf, -math.inf, log_am)
    log_a, log_am = (torch.where(nan, math.nan, x) for x in (log_a, log_am))
    e, t, _, _ = forms_from_logs(log_a, log_am, c_max, tokens=tokens, exact=exact)
    th = _tanh_max(torch.where(c_inf, math.inf, c_max).unsqueeze(-1))
    one = (seq_lens == 1).view(-1, 1).to(meter.device)
    e, t, th = (torch.where(one, torch.zeros_like(x), x) for x in (e, t, th))
    return log_a, log_am, e, t, th, c_max, nan


_AT_A: Final = (2, 3, 4, 5, 7, 8, 10)
_AT_B: Final = (11, 12, 13, 14, 15, 16, 17)


def _tier_a_meter(meter: torch.Tensor, *, tokens: int, seq_lens: torch.Tensor,
                  query_bands: torch.Tensor, scale: float, bands: int
                  ) -> tuple[TierMeter, torch.Tensor]:
    log_a, log_am, e, t, th, c_max, nan = _forms(meter, _AT_A, tokens=tokens, seq_lens=seq_lens)
    w_min = meter[..., 9].amin(dim=-1)
    checks: tuple[tuple[str, object], ...] = (
        ("c_t >= |eps_t| for every token t: computed in the kernel from the stored witnesses and "
         "the query's band norms, which are computed here (rounded outward) and not NaN",
         (query_bands >= 0).all()),
        (_WITNESS_PREMISE, (w_min >= 0).all()),
        ("no witness, logit or bound read by the kernel is NaN", ~nan.any()))
    basis = TVBasis(checks=checks, logit=_tier_a_evidence(scale=scale, bands=bands,
                                                            query_bands=bands, witness_ok=None),
                    delta=Fraction(0), also=(TV_SINGLE_TOKEN,))
    return TierMeter(log_a=log_a, log_a_minus=log_am, eform=e, two_sided=t,
                     meter=torch.minimum(e, t), tanh_max=th, bound_max=c_max,
                     basis=basis), w_min


def _tier_b_meter(meter: torch.Tensor, *, tokens: int, seq_lens: torch.Tensor,
                  tb: _TierBLaunch, assumption: Assumption) -> TierMeter:
    log_a, log_am, e, t, th, u_max, nan = _forms(meter, _AT_B, tokens=tokens, seq_lens=seq_lens)
    tq = tb.tq
    checks: list[tuple[str, object]] = [
        (f"c_t >= |eps_t| for every token t except with probability {tq.delta_loc!r} per query "
         "row: u_t computed in the kernel by the formula and margins of "
         "witcert_kernels.dither.tier_b_logit_bound from the block scales read, with its "
         "query-side sums computed here, nonnegative and not NaN",
         (tb.query >= 0).all() & (tb.row >= 0).all()),
        ("every block scale read is finite and >= 0", ~(meter[..., 18] > 0).any()),
        ("visible[i] >= 1 for every query row i", (seq_lens >= 1).all()),
        ("no block scale, cast bound, logit or bound read by the kernel is NaN", ~nan.any())]
    if tb.cast is not None or tb.in_kernel_cast:
        checks.append(("cast_t is finite and >= 0 for every token read",
                       ~(meter[..., 19] > 0).any()))
    basis = TVBasis(checks=tuple(checks), logit=_tier_b_query_evidence(tq, (assumption,)),
                    delta=Fraction(tq.delta_loc), also=(TV_SINGLE_TOKEN,))
    return TierMeter(log_a=log_a, log_a_minus=log_am, eform=e, two_sided=t,
                     meter=torch.minimum(e, t), tanh_max=th, bound_max=u_max, basis=basis)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, *,
                     kv_indptr: torch.Tensor, kv_indices: torch.Tensor, seq_lens: torch.Tensor,
                     page_size: int, scale: float, splits: int = 1, block: int = 16
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """The same kernel without the meter: ``(output, lse)``, the baseline the meter's cost is
    measured against (``benchmarks/bench_kernels_gpu.py``). Arguments as :func:`fused_decode`.
    """
    return _launch(q, k_cache, v_cache, None, None, kv_indptr=kv_indptr, kv_indices=kv_indices,
                   seq_lens=seq_lens, page_size=page_size, scale=scale, max_tokens=1,
                   splits=splits, block=block).output()


def fused_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 witness: torch.Tensor, *, layout: RopeLayout, kv_indptr: torch.Tensor,
                 kv_indices: torch.Tensor, seq_lens: torch.Tensor, page_size: int, scale: float,
                 max_tokens: int, splits: int = 1, block: int = 16) -> FusedDecode:
    """One decode step's attention and Tier-A meter over a paged cache, in one data pass.

    Args:
        q: ``[B, H, d]`` queries (float32 or float16).
        k_cache: ``[slots, kv_heads, d]`` the keys as stored (any cache-preserving scheme).
        v_cache: ``[slots, kv_heads, dv]`` the values; a view whose rows are strided like
            the keys' (MLA: ``k_cache[..., :dv]``, the latent channels of the same rows) is
            read in place.
        witness: ``[slots, kv_heads, bands]`` float32 band witnesses of the key residuals.
        layout: the rotary layout of queries and keys (the query's band norms are computed
            here, over the witnesses' bands: :func:`witcert_kernels.meter.band_norms`).
        kv_indptr: ``[B + 1]`` each request's range of pages in ``kv_indices``.
        kv_indices: page ids.
        seq_lens: ``[B]`` tokens per request (at most ``max_tokens``; not read on the host).
        page_size: tokens per page (1: token-level indices).
        scale: the softmax scale (> 0).
        max_tokens: an upper bound of ``seq_lens`` (the margin's token count).
        splits: split-KV partitions per request (merged by log-sum-exp weights).
        block: tokens per block of the scan.

    Returns:
        The :class:`FusedDecode` of the step.

    Raises:
        InvalidValueError: shapes that do not fit, heads that do not group, a non-positive
            scale, page size, split count or block, or CPU tensors without
            ``TRITON_INTERPRET=1``.
    """
    if witness.ndim != 3:
        raise InvalidValueError("witness", tuple(witness.shape), "must be [slots, kv_heads, bands]")
    bands = int(witness.shape[-1])
    query_bands = band_norms(q.to(torch.float64), bands=bands, layout=layout)
    part = _launch(q, k_cache, v_cache, witness, query_bands, kv_indptr=kv_indptr,
                   kv_indices=kv_indices, seq_lens=seq_lens, page_size=page_size, scale=scale,
                   max_tokens=max_tokens, splits=splits, block=block)
    output, lse = part.output()
    a, w_min = _tier_a_meter(part.meter, tokens=part.tokens, seq_lens=seq_lens,
                             query_bands=query_bands, scale=float(scale), bands=bands)
    return FusedDecode(output=output, lse=lse, log_a=a.log_a, log_a_minus=a.log_a_minus,
                       eform=a.eform, two_sided=a.two_sided, meter=a.meter, tanh_max=a.tanh_max,
                       witness_min=w_min, basis=a.basis)


def _tiers(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
           witness: torch.Tensor | None, layout: RopeLayout | None, tb: _TierBLaunch,
           pool: _PoolLaunch | None, assumption: Assumption, *, kv_indptr: torch.Tensor,
           kv_indices: torch.Tensor, seq_lens: torch.Tensor, page_size: int, scale: float,
           max_tokens: int, splits: int, block: int,
           counter: torch.Tensor | None) -> FusedDecodeTiers:
    query_bands = None
    bands = 1
    if witness is not None:
        if layout is None:
            raise InvalidValueError("layout", None, "a RopeLayout is needed with witnesses")
        if witness.ndim != 3:
            raise InvalidValueError("witness", tuple(witness.shape),
                                    "must be [slots, kv_heads, bands]")
        bands = int(witness.shape[-1])
        query_bands = band_norms(q.to(torch.float64), bands=bands, layout=layout)
    part = _launch(q, k_cache, v_cache, witness, query_bands, kv_indptr=kv_indptr,
                   kv_indices=kv_indices, seq_lens=seq_lens, page_size=page_size, scale=scale,
                   max_tokens=max_tokens, splits=splits, block=block, tier_b=tb, pool=pool,
                   counter=counter)
    output, lse = part.output()
    tier_b = _tier_b_meter(part.meter, tokens=part.tokens, seq_lens=seq_lens, tb=tb,
                           assumption=assumption)
    tier_a, w_min = None, None
    if query_bands is not None:
        tier_a, w_min = _tier_a_meter(part.meter, tokens=part.tokens, seq_lens=seq_lens,
                                      query_bands=query_bands, scale=float(scale), bands=bands)
    return FusedDecodeTiers(output=output, lse=lse, tier_b=tier_b, tier_a=tier_a,
                            witness_min=w_min)


def fused_decode_tier_b(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        scales: torch.Tensor, *, exact: torch.Tensor | None,
                        cast: torch.Tensor | None, delta_loc: float, kv_indptr: torch.Tensor,
                        kv_indices: torch.Tensor, seq_lens: torch.Tensor, page_size: int,
                        scale: float, max_tokens: int, witness: torch.Tensor | None = None,
                        layout: RopeLayout | None = None, splits: int = 1, block: int = 16
                        ) -> FusedDecodeTiers:
    """One decode step's attention and Tier-B meter (and Tier A with witnesses), one pass.

    The per-token bound ``u_t`` of :func:`witcert_kernels.dither.tier_b_logit_bound` (its
    formula and margins; the query-side sums are that function's own, computed here) is
    evaluated in the kernel from the float16 block scales of the slots it reads and fed into
    the same three log-sum-exps as Tier A's ``c_t``.

    Args:
        q: ``[B, H, d]`` queries (float32 or float16).
        k_cache: ``[slots, kv_heads, d]`` the keys as read (a dithered store's read-back, e.g.
            :meth:`witcert_kernels.dither.DitherEncoding.read` or
            :func:`witcert_kernels.triton_dither.dither_read`).
        v_cache: ``[slots, kv_heads, dv]`` the values.
        scales: ``[slots, kv_heads, blocks]`` float16 block scales as stored.
        exact: ``[kv_heads, d]`` outlier channels kept exact (excluded from the variance), or
            ``None``.
        cast: ``[slots, kv_heads]`` upper bounds of ``||k_t - x_hat_t||`` (the keys read
            against the float64 reconstruction), or ``None`` when the keys are read exactly.
        delta_loc: failure probability per query row, in ``(0, 1)``.
        kv_indptr: as :func:`fused_decode`.
        kv_indices: as :func:`fused_decode`.
        seq_lens: as :func:`fused_decode`; also each row's union-bound count.
        page_size: as :func:`fused_decode`.
        scale: as :func:`fused_decode`.
        max_tokens: as :func:`fused_decode`.
        witness: band witnesses of the same keys: the Tier-A meter of the same pass.
        layout: their rotary layout (needed with ``witness``).
        splits: as :func:`fused_decode`.
        block: as :func:`fused_decode`.

    Returns:
        The :class:`FusedDecodeTiers`: its Tier-B basis has ``delta = delta_loc`` and the
        assumptions :data:`witcert_calculus.meters.dither.NON_ADAPTIVE_QUERIES`,
        :data:`witcert_calculus.meters.dither.PHILOX_UNIFORM` and
        :data:`witcert_kernels.dither.STORED_ENCODING`.

    Raises:
        InvalidValueError: shapes or dtypes that do not fit, invalid ``scale`` or
            ``delta_loc``, or witnesses without a layout.
    """
    kv_heads = int(k_cache.shape[1]) if k_cache.ndim == 3 else 0
    if q.ndim != 3 or kv_heads < 1:
        raise InvalidValueError("q", tuple(q.shape),
                                "q [B, H, d] and caches [slots, kv_heads, ...] expected")
    tb = _tier_b_launch(q, scales, kv_heads=kv_heads, exact=exact, cast=cast,
                        in_kernel_cast=False, delta_loc=delta_loc, seq_lens=seq_lens, scale=scale)
    return _tiers(q, k_cache, v_cache, witness, layout, tb, None, STORED_ENCODING,
                  kv_indptr=kv_indptr, kv_indices=kv_indices, seq_lens=seq_lens,
                  page_size=page_size, scale=scale, max_tokens=max_tokens, splits=splits,
                  block=block, counter=None)


def fused_decode_pool(q: torch.Tensor, pool: DitherPool, v_cache: torch.Tensor, *,
                      key_dtype: torch.dtype, delta_loc: float, kv_indptr: torch.Tensor,
                      kv_indices: torch.Tensor, seq_lens: torch.Tensor, page_size: int,
                      scale: float, max_tokens: int, witness: torch.Tensor | None = None,
                      layout: RopeLayout | None = None, splits: int = 1, block: int = 16,
                      counter: torch.Tensor | None = None) -> FusedDecodeTiers:
    """Decode attention straight from a dithered key pool, with the Tier-B meter, one pass.

    The kernel reads each slot's int8 codes, float16 scales and float16 outlier values,
    regenerates the dither by slot (the store's Philox stream, ``_dither_xi``), reconstructs
    the key in registers exactly as :func:`witcert_kernels.triton_dither.dither_read` does
    (rounded once into ``key_dtype``), and computes the output, ``u_t`` with its cast term
    (``||k_t - x_hat_t||``, bounded in the kernel: the kept channels' rounding exactly, an
    outlier channel's float16 rounding by ``max(2^-11 |v|, 2^-25)``) and, with witnesses,
    Tier A's ``c_t``.

    Args:
        q: ``[B, H, d]`` queries.
        pool: the layer's :class:`~witcert_kernels.triton_dither.DitherPool`.
        v_cache: ``[slots, kv_heads, dv]`` the values.
        key_dtype: the dtype the keys are read into (float16 or float32).
        delta_loc: failure probability per query row, in ``(0, 1)``.
        kv_indptr: as :func:`fused_decode`.
        kv_indices: as :func:`fused_decode`.
        seq_lens: as :func:`fused_decode_tier_b`.
        page_size: as :func:`fused_decode`.
        scale: as :func:`fused_decode`.
        max_tokens: as :func:`fused_decode`.
        witness: as :func:`fused_decode_tier_b` (witnesses of the keys as this call reads them).
        layout: as :func:`fused_decode_tier_b`.
        splits: as :func:`fused_decode`.
        block: as :func:`fused_decode`.
        counter: an int32 ``[1]`` device tensor the kernel increments once per launch (a
            probe that every replay of a captured graph ran the meter), or ``None``.

    Returns:
        The :class:`FusedDecodeTiers`; its Tier-B basis assumes
        :data:`POOL_WRITTEN_BY_STORE` beside the dither's two assumptions.

    Raises:
        InvalidValueError: a key dtype other than float16 or float32, shapes that do not fit
            the pool, invalid ``scale`` or ``delta_loc``, a bad counter.
    """
    if q.ndim != 3:
        raise InvalidValueError("q", tuple(q.shape), "must be [B, H, d]")
    read = _pool_launch(pool, key_dtype)
    tb = _tier_b_launch(q, pool.scales, kv_heads=pool.heads, exact=pool.exact, cast=None,
                        in_kernel_cast=True, delta_loc=delta_loc, seq_lens=seq_lens,
                        scale=scale)
    return _tiers(q, pool.codes, v_cache, witness, layout, tb, read, POOL_WRITTEN_BY_STORE,
                  kv_indptr=kv_indptr, kv_indices=kv_indices, seq_lens=seq_lens,
                  page_size=page_size, scale=scale, max_tokens=max_tokens, splits=splits,
                  block=block, counter=counter)


def _pool_launch(pool: DitherPool, key_dtype: torch.dtype) -> _PoolLaunch:
    """The pool's read-side tables: kept channels and each exact channel's rank."""
    if key_dtype not in _KEY_DTYPES:
        raise InvalidValueError("key_dtype", str(key_dtype), "must be float16 or float32")
    check_device(pool.codes)
    keep = (~pool.exact).to(torch.int8).contiguous()
    rank = torch.where(pool.exact, torch.cumsum(pool.exact.to(torch.int64), dim=-1) - 1,
                       0).contiguous()
    return _PoolLaunch(pool=pool, keep=keep, rank=rank, f16=key_dtype == torch.float16)


def decode_attention_pool(q: torch.Tensor, pool: DitherPool, v_cache: torch.Tensor, *,
                          key_dtype: torch.dtype, kv_indptr: torch.Tensor,
                          kv_indices: torch.Tensor, seq_lens: torch.Tensor, page_size: int,
                          scale: float, splits: int = 1, block: int = 16
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """The pooled read of :func:`fused_decode_pool` without a meter: ``(output, lse)`` (the
    benchmarks' baseline). Arguments as :func:`fused_decode_pool`.

    Raises:
        InvalidValueError: as :func:`fused_decode_pool`.
    """
    return _launch(q, pool.codes, v_cache, None, None, kv_indptr=kv_indptr,
                   kv_indices=kv_indices, seq_lens=seq_lens, page_size=page_size, scale=scale,
                   max_tokens=1, splits=splits, block=block,
                   pool=_pool_launch(pool, key_dtype)).output()


def pool_cast_bound(pool: DitherPool, slots: torch.Tensor, *, key_dtype: torch.dtype
                    ) -> torch.Tensor:
    """Upper bounds of ``||k_t - x_hat_t||`` for the keys :func:`fused_decode_pool` reads from
    ``pool`` at ``slots`` (float64 ``[len(slots), kv_heads]``): the torch twin of the bound
    its kernel computes, and the ``cast`` argument of :func:`fused_decode_tier_b` over keys
    read with :func:`witcert_kernels.triton_dither.dither_read`.

    ``x_hat_t`` is the float64 reconstruction with the outlier channels exact (the keys' own
    values); ``k_t`` is the key read into ``key_dtype``. A kept channel's error is computed
    exactly (both are float64 numbers); an outlier channel holds ``v = fp16(x)`` rounded to
    nearest, within ``max(2^-11 |v|, 2^-25)`` of ``x``. The norm is
    :func:`witcert_kernels.meter.l2_norm_upper`, rounded outward.

    Raises:
        InvalidValueError: a key dtype other than float16 or float32, or bad slots.

    Example:
        >>> from witcert_kernels.triton_dither import dither_store
        >>> pool = DitherPool.empty(slots=2, kv_heads=1, head_dim=4, block_size=4,
        ...                         exact=torch.zeros(1, 4, dtype=torch.bool), seed=0, layer=0)
        >>> _ = dither_store(pool, torch.ones(2, 1, 4), torch.arange(2))
        >>> bool((pool_cast_bound(pool, torch.arange(2), key_dtype=torch.float32) >= 0).all())
        True
    """
    if key_dtype not in _KEY_DTYPES:
        raise InvalidValueError("key_dtype", str(key_dtype), "must be float16 or float32")
    x_hat = dither_read(pool, slots, dtype=torch.float64)  # exact on the kept channels
    err = torch.where(pool.exact.to(x_hat.device),
                      torch.maximum(x_hat.abs() * 2.0**-11, torch.full_like(x_hat, 2.0**-25)),
                      (x_hat.to(key_dtype).to(torch.float64) - x_hat).abs())
    return l2_norm_upper(err)
