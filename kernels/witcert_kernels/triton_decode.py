"""Fused decode attention and Tier-A meter over a paged KV cache, with split-KV merging.

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

- ``c_t`` is rounded outward with :func:`witcert_calculus.rounding.logit_margin` (a tree sum
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
  (:data:`witcert_calculus.modelling.SOFTMAX_AS_COMPUTED`).

Capturable by design: fixed grids, no host synchronisation (``max_tokens`` is the caller's
bound on ``seq_lens``, used for the margin), device-resident partials merged by device ops.

On a machine without a GPU the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``,
set before triton is imported) on CPU tensors.

Main declarations
-----------------
- :class:`FusedDecode`: the output, its log-sum-exp, and the meter's bounds per query head.
- :func:`fused_decode`: the kernel launch and the split merge.
- :func:`decode_attention`: the same kernel without the meter (the benchmarks' baseline).
"""

# The kernel body is Triton's language, which carries no Python types: basic checking only.
# pyright: basic

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, final

import numpy as np
import torch
import triton
import triton.language as tl

from witcert_calculus.errors import InvalidValueError
from witcert_calculus.rounding import TINY, logit_margin
from witcert_calculus.theorems import TV_SINGLE_TOKEN
from witcert_calculus.tv_forms import TVBasis
from witcert_calculus.validation import UNIT_ROUNDOFF, positive_int, real
from witcert_calculus.witness import RopeLayout
from witcert_calculus.witness import _WITNESS_PREMISE  # pyright: ignore[reportPrivateUsage]
from witcert_calculus.witness import _tier_a_evidence  # pyright: ignore[reportPrivateUsage]
from witcert_kernels.meter import _tanh_max  # pyright: ignore[reportPrivateUsage]
from witcert_kernels.meter import band_norms, forms_from_logs
from witcert_kernels.triton_launch import check_device, pow2

__all__ = ["FusedDecode", "decode_attention", "fused_decode"]

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
def _decode_kernel(q_ptr: Any, k_ptr: Any, v_ptr: Any, w_ptr: Any, qn_ptr: Any, indptr_ptr: Any,
                   indices_ptr: Any, lens_ptr: Any, po_ptr: Any, pm_ptr: Any, pl_ptr: Any,
                   meter_ptr: Any, heads: Any, kv_heads: Any, d: Any, dv: Any, nbands: Any,
                   splits: Any, scale: Any, c_gamma: Any, c_alpha: Any,
                   PAGE: tl.constexpr, BLOCK: tl.constexpr, D: tl.constexpr,  # noqa: N803
                   DV: tl.constexpr, NB: tl.constexpr, METER: tl.constexpr) -> None:
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
    q = tl.load(q_ptr + (b * heads + h) * d + di, mask=di < d, other=0.0).to(tl.float32)
    qn = tl.load(qn_ptr + (b * heads + h) * nbands + bi, mask=bi < nbands, other=0.0)
    q_top = tl.max(qn, axis=0)
    m32 = tl.full((), float("-inf"), tl.float32)
    l32 = tl.zeros((), tl.float32)
    acc = tl.zeros((DV,), tl.float32)
    mx0 = tl.full((), float("-inf"), tl.float64)
    mx1 = tl.full((), float("-inf"), tl.float64)
    mx2 = tl.full((), float("-inf"), tl.float64)
    a0 = tl.zeros((), tl.float64)
    a1 = tl.zeros((), tl.float64)
    a2 = tl.zeros((), tl.float64)
    s_abs = tl.zeros((), tl.float64)
    c_max = tl.zeros((), tl.float64)
    c_inf = tl.zeros((), tl.int32)
    bad = tl.zeros((), tl.int32)
    w_min = tl.full((), float("inf"), tl.float64)
    for blk in range(0, tl.cdiv(tl.maximum(end - start, 0), BLOCK)):
        t = start + blk * BLOCK + tl.arange(0, BLOCK)
        valid = t < end
        page = tl.load(indices_ptr + first_page + t // PAGE, mask=valid, other=0).to(tl.int64)
        slot = page * PAGE + t % PAGE
        row = slot * kv_heads + kvh
        k = tl.load(k_ptr + row[:, None] * d + di[None, :],
                    mask=valid[:, None] & (di[None, :] < d), other=0.0).to(tl.float32)
        s = tl.sum(k * q[None, :], axis=1) * scale  # float32 logits
        s = tl.where(valid, s, float("-inf"))
        # the attention output: float32 online softmax
        m_new = tl.maximum(m32, tl.max(s, axis=0))
        alpha = tl.where(m32 > float("-inf"), tl.exp(m32 - m_new), 0.0)
        p = tl.where(valid, tl.exp(s - m_new), 0.0)
        v = tl.load(v_ptr + row[:, None] * dv + dvi[None, :],
                    mask=valid[:, None] & (dvi[None, :] < dv), other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        l32 = l32 * alpha + tl.sum(p, axis=0)
        m32 = m_new
        if METER:
            # the meter: per-token c_t from the witnesses, three float64 log-sum-exps
            w = tl.load(w_ptr + row[:, None] * nbands + bi[None, :],
                        mask=valid[:, None] & (bi[None, :] < nbands), other=0.0).to(tl.float64)
            prod = tl.where(qn[None, :] == 0.0, 0.0, qn[None, :] * w)  # inf * 0 is 0
            y = tl.sum(prod, axis=1) * scale
            raised = y * (1.0 + c_gamma) + c_alpha
            up = (raised.to(tl.int64, bitcast=True) + 1).to(tl.float64, bitcast=True)
            finite = (y == y) & (tl.abs(y) < float("inf"))
            exact = ((tl.zeros((BLOCK,), tl.float64) + q_top) == 0.0) | (tl.max(w, axis=1) == 0.0)
            c = tl.where(exact, 0.0, tl.where(finite, up, y))
            is_inf = valid & (c == float("inf"))
            c_inf = tl.maximum(c_inf, tl.max(is_inf.to(tl.int32), axis=0))
            # Triton's max ignores NaN: a NaN bound or logit is flagged on its own
            nan = tl.where(valid, (c != c) | (s != s), False)
            bad = tl.maximum(bad, tl.max(nan.to(tl.int32), axis=0))
            c_fin = tl.where(is_inf, 0.0, c)
            s64 = s.to(tl.float64)
            mx0, a0 = _lse_step(mx0, a0, s64, valid)
            mx1, a1 = _lse_step(mx1, a1, s64 + c_fin, valid)
            mx2, a2 = _lse_step(mx2, a2, s64 - c_fin, valid)
            s_abs = tl.maximum(s_abs, tl.max(tl.where(valid, tl.abs(s64), 0.0), axis=0))
            c_max = tl.maximum(c_max, tl.max(tl.where(valid, c_fin, 0.0), axis=0))
            w_min = tl.minimum(w_min, tl.min(tl.min(tl.where(valid[:, None] & (bi[None, :] < nbands),
                                                             w, float("inf")), axis=1), axis=0))
    part = (b * heads + h) * splits + sp
    tl.store(po_ptr + part * dv + dvi, acc, mask=dvi < dv)
    tl.store(pm_ptr + part, m32)
    tl.store(pl_ptr + part, l32)
    if METER:
        base = meter_ptr + part * 11
        tl.store(base + 0, mx0)
        tl.store(base + 1, a0)
        tl.store(base + 2, mx1)
        tl.store(base + 3, a1)
        tl.store(base + 4, mx2)
        tl.store(base + 5, a2)
        tl.store(base + 6, s_abs)
        tl.store(base + 7, c_max)
        tl.store(base + 8, c_inf.to(tl.float64))
        tl.store(base + 9, w_min)
        tl.store(base + 10, bad.to(tl.float64))


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
        basis: what the bounds rest on (:class:`~witcert_calculus.tv_forms.TVBasis`): the
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


def _launch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
            witness: torch.Tensor | None, query_bands: torch.Tensor | None, *,
            kv_indptr: torch.Tensor, kv_indices: torch.Tensor, seq_lens: torch.Tensor,
            page_size: int, scale: float, max_tokens: int, splits: int, block: int) -> _Partials:
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
    meter = torch.empty((bsz, heads, n_split, 11) if metered else (1,), dtype=torch.float64,
                        device=dev)
    w = witness.contiguous() if witness is not None else meter
    qb = query_bands.contiguous() if query_bands is not None else meter
    cm = logit_margin(nb, scale=sc)
    if bsz and heads:
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            launch: Any = _decode_kernel[(bsz, heads, n_split)]
            launch(q.contiguous(), k_cache.contiguous(), v_cache.contiguous(), w, qb,
                   kv_indptr.contiguous(), kv_indices.contiguous(), seq_lens.contiguous(), po,
                   pm, pl, meter, heads, kv_heads, d, dv, nb, n_split, sc, cm.gamma, cm.alpha,
                   PAGE=page, BLOCK=blk, D=pow2(d), DV=pow2(dv), NB=pow2(nb), METER=metered)
    return _Partials(po, pm, pl, meter, q.dtype, tokens)


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
        v_cache: ``[slots, kv_heads, dv]`` the values.
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
    meter = part.meter
    lse0 = _merge_lse(meter[..., 0], meter[..., 1])
    lse1 = _merge_lse(meter[..., 2], meter[..., 3])
    lse2 = _merge_lse(meter[..., 4], meter[..., 5])
    s_abs = meter[..., 6].amax(dim=-1)
    c_max = meter[..., 7].amax(dim=-1)
    c_inf = meter[..., 8].amax(dim=-1) > 0
    w_min = meter[..., 9].amin(dim=-1)
    nan = meter[..., 10].amax(dim=-1) > 0
    tokens = part.tokens
    slack = _log_margin((lse0, lse1, lse2), s_abs, c_max, tokens=tokens)
    exact = (c_max == 0) & ~c_inf
    up = torch.tensor(math.inf, dtype=torch.float64, device=q.device)
    log_a = torch.where(exact, 0.0, torch.nextafter(lse1 - lse0 + slack, up))
    log_a = torch.where(c_inf, math.inf, log_a)
    log_am = torch.where(exact, 0.0, torch.nextafter(lse2 - lse0 - slack, -up))
    log_am = torch.where(c_inf, -math.inf, log_am)
    log_a, log_am = (torch.where(nan, math.nan, x) for x in (log_a, log_am))
    e, t, _, _ = forms_from_logs(log_a, log_am, c_max, tokens=tokens, exact=exact)
    th = _tanh_max(torch.where(c_inf, math.inf, c_max).unsqueeze(-1))
    one = (seq_lens == 1).view(-1, 1).to(q.device)
    e, t, th = (torch.where(one, torch.zeros_like(x), x) for x in (e, t, th))
    sc = float(scale)
    checks: tuple[tuple[str, object], ...] = (
        ("c_t >= |eps_t| for every token t: computed in the kernel from the stored witnesses and "
         "the query's band norms, which are computed here (rounded outward) and not NaN",
         (query_bands >= 0).all()),
        (_WITNESS_PREMISE, (w_min >= 0).all()),
        ("no witness, logit or bound read by the kernel is NaN", ~nan.any()))
    basis = TVBasis(checks=checks, logit=_tier_a_evidence(scale=sc, bands=bands,
                                                            query_bands=bands, witness_ok=None),
                    delta=Fraction(0), also=(TV_SINGLE_TOKEN,))
    return FusedDecode(output=output, lse=lse, log_a=log_a, log_a_minus=log_am, eform=e,
                       two_sided=t, meter=torch.minimum(e, t), tanh_max=th, witness_min=w_min,
                       basis=basis)
