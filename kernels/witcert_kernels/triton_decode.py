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

The kernel, its launch and the split merge with its margin analysis are in
:mod:`witcert_kernels.triton_decode_kernel`, :mod:`witcert_kernels.triton_decode_launch` and
:mod:`witcert_kernels.triton_decode_merge`; this module holds the entry points and what they
return.

Tier B (:func:`fused_decode_tier_b`, :func:`fused_decode_pool`): the per-token bound
``u_t = sqrt(2 varsigma_t^2 log(2 S / delta_loc)) + m_t + e_t`` of
:func:`witcert_kernels.dither.tier_b_logit_bound` takes the place of ``c_t`` in the same three
log-sum-exps (the margin analysis of :mod:`witcert_kernels.triton_decode_merge` uses only
``c_t >= 0`` and its size, so the slack is the same):

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

Main declarations
-----------------
- :class:`FusedDecode`: the output, its log-sum-exp, and the meter's bounds per query head.
- :func:`fused_decode`: the kernel launch and the split merge (Tier A).
- :func:`decode_attention`: the same kernel without the meter (the benchmarks' baseline).
- :class:`FusedDecodeTiers`: a step with Tier B (and Tier A beside it when witnesses are
  given), each tier a :class:`~witcert_kernels.triton_decode_merge.TierMeter`.
- :func:`fused_decode_tier_b`: attention and the Tier-B meter over keys read back from a
  dithered store, their float16 block scales read in the same pass.
- :func:`fused_decode_pool`: attention and the Tier-B meter read straight from a
  :class:`~witcert_kernels.triton_dither.DitherPool`; :func:`decode_attention_pool`, the same
  read without the meter; :func:`pool_cast_bound`, the torch twin of its cast bound;
  :data:`POOL_WRITTEN_BY_STORE`, what its basis assumes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, final

import torch

from witcert_calculus.errors import InvalidValueError
from witcert_calculus.meters.tv_forms import TVBasis
from witcert_calculus.meters.witness import RopeLayout
from witcert_calculus.tiers import Assumption
from witcert_kernels.dither import STORED_ENCODING
from witcert_kernels.meter import band_norms, l2_norm_upper
from witcert_kernels.triton_decode_launch import PoolLaunch, TierBLaunch, launch, tier_b_launch
from witcert_kernels.triton_decode_merge import TierMeter, tier_a_meter, tier_b_meter
from witcert_kernels.triton_dither import DitherPool, dither_read
from witcert_kernels.triton_launch import check_device

__all__ = ["POOL_WRITTEN_BY_STORE", "FusedDecode", "FusedDecodeTiers", "decode_attention",
           "decode_attention_pool", "fused_decode", "fused_decode_pool", "fused_decode_tier_b",
           "pool_cast_bound"]


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


#: What the pooled Tier-B meter takes on the caller's word about the pool it reads.
POOL_WRITTEN_BY_STORE: Final = Assumption(
    "every slot read was written by witcert_kernels.triton_dither.dither_store into this "
    "pool (its seed, layer, block size and exact mask) from the keys the logit errors are "
    "measured against, and seq_lens counts every token each row attends to",
    reason="the kernel reads the codes, scales and outlier values, not the keys they were "
           "written from")

_KEY_DTYPES: Final = (torch.float16, torch.float32)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, *,
                     kv_indptr: torch.Tensor, kv_indices: torch.Tensor, seq_lens: torch.Tensor,
                     page_size: int, scale: float, splits: int = 1, block: int = 16
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """The same kernel without the meter: ``(output, lse)``, the baseline the meter's cost is
    measured against (``benchmarks/bench_kernels_gpu.py``). Arguments as :func:`fused_decode`.
    """
    return launch(q, k_cache, v_cache, None, None, kv_indptr=kv_indptr, kv_indices=kv_indices,
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
    part = launch(q, k_cache, v_cache, witness, query_bands, kv_indptr=kv_indptr,
                   kv_indices=kv_indices, seq_lens=seq_lens, page_size=page_size, scale=scale,
                   max_tokens=max_tokens, splits=splits, block=block)
    output, lse = part.output()
    a, w_min = tier_a_meter(part.meter, tokens=part.tokens, seq_lens=seq_lens,
                             query_bands=query_bands, scale=float(scale), bands=bands)
    return FusedDecode(output=output, lse=lse, log_a=a.log_a, log_a_minus=a.log_a_minus,
                       eform=a.eform, two_sided=a.two_sided, meter=a.meter, tanh_max=a.tanh_max,
                       witness_min=w_min, basis=a.basis)


def _tiers(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
           witness: torch.Tensor | None, layout: RopeLayout | None, tb: TierBLaunch,
           pool: PoolLaunch | None, assumption: Assumption, *, kv_indptr: torch.Tensor,
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
    part = launch(q, k_cache, v_cache, witness, query_bands, kv_indptr=kv_indptr,
                   kv_indices=kv_indices, seq_lens=seq_lens, page_size=page_size, scale=scale,
                   max_tokens=max_tokens, splits=splits, block=block, tier_b=tb, pool=pool,
                   counter=counter)
    output, lse = part.output()
    tier_b = tier_b_meter(part.meter, tokens=part.tokens, seq_lens=seq_lens, tb=tb,
                           assumption=assumption)
    tier_a, w_min = None, None
    if query_bands is not None:
        tier_a, w_min = tier_a_meter(part.meter, tokens=part.tokens, seq_lens=seq_lens,
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
    tb = tier_b_launch(q, scales, kv_heads=kv_heads, exact=exact, cast=cast,
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
    tb = tier_b_launch(q, pool.scales, kv_heads=pool.heads, exact=pool.exact, cast=None,
                        in_kernel_cast=True, delta_loc=delta_loc, seq_lens=seq_lens,
                        scale=scale)
    return _tiers(q, pool.codes, v_cache, witness, layout, tb, read, POOL_WRITTEN_BY_STORE,
                  kv_indptr=kv_indptr, kv_indices=kv_indices, seq_lens=seq_lens,
                  page_size=page_size, scale=scale, max_tokens=max_tokens, splits=splits,
                  block=block, counter=counter)


def _pool_launch(pool: DitherPool, key_dtype: torch.dtype) -> PoolLaunch:
    """The pool's read-side tables: kept channels and each exact channel's rank."""
    if key_dtype not in _KEY_DTYPES:
        raise InvalidValueError("key_dtype", str(key_dtype), "must be float16 or float32")
    check_device(pool.codes)
    keep = (~pool.exact).to(torch.int8).contiguous()
    rank = torch.where(pool.exact, torch.cumsum(pool.exact.to(torch.int64), dim=-1) - 1,
                       0).contiguous()
    return PoolLaunch(pool=pool, keep=keep, rank=rank, f16=key_dtype == torch.float16)


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
    return launch(q, pool.codes, v_cache, None, None, kv_indptr=kv_indptr,
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
