"""The host side of a fused decode launch: argument checks, the kernel's constants, Tier-B inputs.

Capturable by design: fixed grids, no host synchronisation (``max_tokens`` is the caller's
bound on ``seq_lens``, used for the margin), device-resident partials merged by device ops;
the premises stay device tensors until a reading's evidence is built (the test suite runs
every launch path with the tensor-to-host reads made to raise). The kernel's constants are
built once per value set and device and reused. An optional device counter is incremented
once per launch (a probe that every replay of a captured graph ran the meter).

Main declarations:

- :func:`launch`: checks the arguments and launches
  :func:`~witcert_kernels.triton_decode_kernel.decode_tiers_kernel`, returning its
  :class:`Partials`.
- :func:`tier_b_launch`, :class:`TierBLaunch`: the query side of the Tier-B bound, computed
  here; :class:`PoolLaunch`: what a pooled read adds.
- :func:`device_constants`: float64 constants on a device, built once per value set.
"""

# The launch indexes an untyped Triton kernel: basic checking only.
# pyright: basic

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, final

import numpy as np
import torch

from witcert_calculus.errors import InvalidValueError
from witcert_calculus.meters.dither import GRID_MEAN
from witcert_calculus.numerics.rounding import TINY, Margin, band_norm_margin, logit_margin
from witcert_calculus.numerics.validation import positive_int, real
from witcert_kernels.dither import _TierBQuery  # pyright: ignore[reportPrivateUsage]
from witcert_kernels.dither import _tier_b_log_term  # pyright: ignore[reportPrivateUsage]
from witcert_kernels.dither import _tier_b_query  # pyright: ignore[reportPrivateUsage]
from witcert_kernels.triton_decode_kernel import decode_tiers_kernel
from witcert_kernels.triton_dither import DitherPool
from witcert_kernels.triton_dither import _constants as _dither_constants  # pyright: ignore[reportPrivateUsage]
from witcert_kernels.triton_launch import check_device, pow2

__all__ = ["Partials", "PoolLaunch", "TierBLaunch", "device_constants", "launch",
           "tier_b_launch"]

_NEG = float("-inf")


@final
@dataclass(frozen=True, slots=True, eq=False)
class Partials:
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
class TierBLaunch:
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
class PoolLaunch:
    """A pooled read: the pool, its kept-channel mask and exact-channel ranks, the key dtype."""

    pool: DitherPool
    keep: torch.Tensor  # [kv_heads, d] int8
    rank: torch.Tensor  # [kv_heads, d] int64
    f16: bool


@lru_cache(maxsize=64)
def device_constants(values: tuple[float, ...], device: torch.device) -> torch.Tensor:
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
    return device_constants((scale, cm.gamma, cm.alpha, scale * scale, vm.gamma, rm.gamma,
                             rm.alpha, mm.gamma, mm.alpha, km.gamma, km.alpha, bm.gamma,
                             bm.alpha, GRID_MEAN, TINY), device)


def tier_b_launch(q: torch.Tensor, scales: torch.Tensor, *, kv_heads: int,
                   exact: torch.Tensor | None, cast: torch.Tensor | None,
                   in_kernel_cast: bool, delta_loc: float, seq_lens: torch.Tensor,
                   scale: float) -> TierBLaunch:
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
    return TierBLaunch(
        scales=scales.contiguous(),
        cast=None if cast is None else cast.to(torch.float64).contiguous(),
        in_kernel_cast=in_kernel_cast,
        query=torch.cat((tq.q2, tq.q_abs, tq.live), dim=-1).contiguous(),
        row=torch.cat((tq.var_alpha, q_norm), dim=-1).contiguous(),
        log_term=_tier_b_log_term(seq_lens, tq.delta_loc).contiguous(), tq=tq)


def launch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
            witness: torch.Tensor | None, query_bands: torch.Tensor | None, *,
            kv_indptr: torch.Tensor, kv_indices: torch.Tensor, seq_lens: torch.Tensor,
            page_size: int, scale: float, max_tokens: int, splits: int, block: int,
            tier_b: TierBLaunch | None = None, pool: PoolLaunch | None = None,
            counter: torch.Tensor | None = None) -> Partials:
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
            kernel: Any = decode_tiers_kernel[(bsz, heads, n_split)]
            kernel(q.contiguous(), k_cache.contiguous(), v, w, qb, kv_indptr.contiguous(),
                   kv_indices.contiguous(), seq_lens.contiguous(), po, pm, pl, meter, consts,
                   sc_t, cast_t, bq, br, lt, vals, keep, rank, count, heads, kv_heads, d, dv,
                   v_stride, nb, nbs, bs, m2, n_split, sc, layer, k0, k1,
                   PAGE=page, BLOCK=blk, D=pow2(d), DV=pow2(dv), NB=pow2(nb), NBS=pow2(nbs),
                   M2=pow2(m2) if m2 else 0, METER=metered, TIER_B=tier_b is not None,
                   CAST=cast_mode, POOL=pool is not None,
                   KF16=pool is not None and pool.f16, NM=nm, COUNT=counter is not None,
                   **_dither_constants())
    return Partials(po, pm, pl, meter, q.dtype, tokens)
