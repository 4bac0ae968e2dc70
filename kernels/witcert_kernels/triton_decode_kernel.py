"""The fused decode kernel: attention and the meter's accumulators in one pass over a paged cache.

One pass over the cached keys and values of every request computes the attention output and
the meter's accumulators (three online log-sum-exps in float64, of ``s``, ``s + c`` and
``s - c``; :mod:`witcert_kernels.triton_decode` says what they bound), one split of the keys
per program.

Layout (SGLang's and vLLM's paged caches): ``kv_indptr [B + 1]`` delimits each request's
pages in ``kv_indices``; token ``t`` of request ``b`` sits in slot
``kv_indices[kv_indptr[b] + t // page] * page + t % page`` of ``k_cache [slots, kv_heads, d]``,
``v_cache [slots, kv_heads, dv]`` and ``witness [slots, kv_heads, bands]``; ``seq_lens [B]``.
``page = 1`` is SGLang's token-level ``kv_indices``. Query heads map to kv heads in groups
(GQA; MQA with one kv head; MHA with as many).

MLA (a latent cache, e.g. ``Lk = 576`` with ``Lv = 512``): one kv head shared by every query
head, and ``v_cache = k_cache[..., :Lv]``, a view read in place with the keys' row stride (no
second tensor); the witnesses' bands partition all ``Lk`` channels.

On a machine without a GPU the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``,
set before triton is imported) on CPU tensors.

The host side (checks, constants, the launch) is :mod:`witcert_kernels.triton_decode_launch`;
the split merge and the margins are :mod:`witcert_kernels.triton_decode_merge`; the public
entry points are :mod:`witcert_kernels.triton_decode`. The device helpers :func:`lse_step`,
:func:`outward` and :func:`meter_step` are also called by the engines' metered kernels (the
SGLang adapter's and the vLLM plugin's).

Main declarations:

- :func:`decode_tiers_kernel`: the kernel (Tier A, Tier B, the pooled read; one split each).
- :func:`lse_step`, :func:`outward`, :func:`meter_step`: its device helpers.
"""

# The kernel body is Triton's language, which carries no Python types: basic checking only.
# pyright: basic

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

from witcert_kernels.triton_dither import _dither_xi  # pyright: ignore[reportPrivateUsage]

__all__ = ["decode_tiers_kernel", "lse_step", "meter_step", "outward"]


@triton.jit
def lse_step(mx: Any, acc: Any, y: Any, valid: Any) -> tuple[Any, Any]:
    """One block of an online log-sum-exp: running max ``mx`` and sum ``acc`` of ``e^{y-mx}``."""
    yv = tl.where(valid, y, float("-inf"))
    new = tl.maximum(mx, tl.max(yv, axis=0))
    live = new > float("-inf")
    scale = tl.where(live, tl.where(mx > float("-inf"), tl.exp(mx - new), 0.0), 0.0)
    terms = tl.where(live, tl.where(valid, tl.exp(yv - new), 0.0), 0.0)
    return new, acc * scale + tl.sum(terms, axis=0)


@triton.jit
def outward(v: Any, gamma: Any, alpha: Any, exact: Any) -> Any:
    """:func:`witcert_kernels.rounding.outward` in the kernel: ``next_up(v (1 + gamma) + alpha)``
    for ``v >= 0``, exact or non-finite entries kept (an overflow of the raise stays ``inf``)."""
    raised = v * (1.0 + gamma) + alpha
    up = tl.where(raised < float("inf"),
                  (raised.to(tl.int64, bitcast=True) + 1).to(tl.float64, bitcast=True), raised)
    finite = (v == v) & (tl.abs(v) < float("inf"))
    return tl.where(exact | ~finite, v, up)


@triton.jit
def meter_step(mx1: Any, a1: Any, mx2: Any, a2: Any, c_max: Any, c_inf: Any, bad: Any,
                s64: Any, c: Any, valid: Any) -> tuple[Any, Any, Any, Any, Any, Any, Any]:
    """One block of one meter: per-token bounds ``c`` into the log-sum-exps of ``s + c`` and
    ``s - c``, the largest finite ``c``, and the flags of an infinite and of a NaN ``c`` or
    logit (Triton's ``max`` ignores NaN, so it is flagged on its own)."""
    is_inf = valid & (c == float("inf"))
    c_inf = tl.maximum(c_inf, tl.max(is_inf.to(tl.int32), axis=0))
    nan = tl.where(valid, (c != c) | (s64 != s64), False)
    bad = tl.maximum(bad, tl.max(nan.to(tl.int32), axis=0))
    c_fin = tl.where(is_inf, 0.0, c)
    mx1, a1 = lse_step(mx1, a1, s64 + c_fin, valid)
    mx2, a2 = lse_step(mx2, a2, s64 - c_fin, valid)
    c_max = tl.maximum(c_max, tl.max(tl.where(valid, c_fin, 0.0), axis=0))
    return mx1, a1, mx2, a2, c_max, c_inf, bad


@triton.jit
def decode_tiers_kernel(q_ptr: Any, k_ptr: Any, v_ptr: Any, w_ptr: Any, qn_ptr: Any,
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
    w_nans = tl.zeros((), tl.int32)
    q_nan = tl.zeros((), tl.int32)
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
        q_nan = tl.sum((qn != qn).to(tl.int32), axis=0)  # max skips NaN: counted on its own
        q_top = tl.max(tl.where(qn != qn, 0.0, qn), axis=0)
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
                e_nan = tl.sum((err != err).to(tl.int32), axis=1) != 0  # max skips NaN
                err = tl.where(err != err, 0.0, err)
                e_top: Any = tl.max(err, axis=1)
                e_div = tl.where(e_top > 0, e_top, 1.0)
                sq = tl.sum((err / e_div[:, None]) * (err / e_div[:, None]), axis=1)
                bm_g = tl.load(consts_ptr + 11)
                bm_a = tl.load(consts_ptr + 12)
                cast_t = outward(tl.sqrt(sq) * e_top, bm_g, bm_a * e_top + tl.load(consts_ptr + 14),
                                  e_top == 0)
                cast_t = tl.where(e_top == float("inf"), float("inf"), cast_t)
                cast_t = tl.where(e_nan, float("nan"), cast_t)
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
            mx0, a0 = lse_step(mx0, a0, s64, valid)
            s_abs = tl.maximum(s_abs, tl.max(tl.where(valid, tl.abs(s64), 0.0), axis=0))
        if METER:
            # Tier A: per-token c_t from the witnesses, rounded outward
            w = tl.load(w_ptr + row[:, None] * nbands + bi[None, :],
                        mask=valid[:, None] & (bi[None, :] < nbands), other=0.0).to(tl.float64)
            prod = tl.where(qn[None, :] == 0.0, 0.0, qn[None, :] * w)  # inf * 0 is 0
            y = tl.sum(prod, axis=1) * scale64
            # Triton's max and min skip NaN: a NaN witness is counted on its own, kept out of
            # the exactness test and the minimum, and makes the token's c_t NaN
            w_nan = tl.sum((w != w).to(tl.int32), axis=1) != 0
            w_top = tl.max(tl.where(w != w, 0.0, w), axis=1)
            exact = (((tl.zeros((BLOCK,), tl.float64) + q_top) == 0.0) | (w_top == 0.0)) \
                & ~w_nan & (q_nan == 0)
            c = tl.where(exact, 0.0, outward(y, c_gamma, c_alpha, exact))
            c = tl.where(w_nan | (q_nan != 0), float("nan"), c)
            mx1, a1, mx2, a2, c_max, c_inf, bad = meter_step(mx1, a1, mx2, a2, c_max, c_inf,
                                                              bad, s64, c, valid)
            wm = valid[:, None] & (bi[None, :] < nbands)
            w_min = tl.minimum(w_min, tl.min(tl.min(tl.where(wm & (w == w), w, float("inf")),
                                                    axis=1), axis=0))
            w_nans += tl.sum(tl.where(valid & w_nan, 1, 0), axis=0)
        if TIER_B:
            # Tier B: u_t of witcert_kernels.dither.tier_b_logit_bound from the stored scales
            sm = valid[:, None] & (bj[None, :] < nbs)
            sb = tl.load(sc_ptr + row[:, None] * nbs + bj[None, :], mask=sm, other=0.0
                         ).to(tl.float64)
            zero = tl.sum(ql[None, :] * (sb != 0).to(tl.float64), axis=1) == 0
            var = tl.load(consts_ptr + 3) * tl.sum(q2[None, :] * (sb * sb), axis=1) / 12.0
            var = outward(var, tl.load(consts_ptr + 4), var_alpha, zero)
            radius = outward(tl.sqrt(2.0 * var * log_term), tl.load(consts_ptr + 5),
                              tl.load(consts_ptr + 6), var == 0)
            mean = outward(scale64 * tl.sum(qa[None, :] * sb, axis=1) * tl.load(consts_ptr + 13),
                            tl.load(consts_ptr + 7), tl.load(consts_ptr + 8), zero)
            u = radius + mean
            if CAST > 0:
                if CAST == 1:
                    cast_t = tl.load(cast_ptr + row, mask=valid, other=0.0).to(tl.float64)
                term = outward(scale64 * q_norm * cast_t, tl.load(consts_ptr + 9),
                                tl.load(consts_ptr + 10),
                                ((tl.zeros((BLOCK,), tl.float64) + q_norm) == 0)
                                | (cast_t == 0))
                u = u + term
                cbad = valid & ~((cast_t >= 0) & (cast_t < float("inf")))
                e_bad = tl.maximum(e_bad, tl.max(cbad.to(tl.int32), axis=0))
            u = tl.where(valid, u, 0.0)
            sbad = sm & ~((sb >= 0) & (sb < float("inf")))
            s_bad = tl.maximum(s_bad, tl.max(tl.max(sbad.to(tl.int32), axis=1), axis=0))
            ux1, ua1, ux2, ua2, u_max, u_inf, u_bad = meter_step(ux1, ua1, ux2, ua2, u_max,
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
        tl.store(base + 9, tl.where(w_nans > 0, float("nan"), w_min))
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
