"""Page-in decisions for many rows at once: which blocks of exact entries each row needs.

The torch twin of the repairing gate's block choice (:mod:`witcert_calculus.meters.page_in` and
:class:`witcert_adapters.repair.RepairCache`), batched over rows. For each row (a query of
one head) over its visible tokens, with blocks of ``block_size`` consecutive tokens:

- **certified** (finite ``p~`` and ``c``, e-form at most ``saturation``): with block masses
  ``mass_j`` of ``p~`` and block-constant bounds ``u_j = max_{t in j} c_t``, paging in block
  ``j`` lowers ``A = sum_j mass_j e^{u_j}`` by exactly ``mass_j (e^{u_j} - 1)`` (Lean
  ``WitCert.Meters.page_in_decrease``); the plan takes blocks by decreasing decrease until
  the e-form ``(A^2 - 1)/2`` reaches the threshold: the fewest blocks
  (:func:`witcert_calculus.meters.page_in.page_in_order`, the same order and count). When the plan
  needs none but the row is still above the threshold (the meter's outward margins), it takes
  the one block of largest decrease;
- **risk-ranked** (otherwise): blocks by decreasing raw risk ``log sum_{t in j, unpaged}
  p~_t e^{c_t}`` (``+inf`` for a non-finite bound; ``c_t`` alone when ``p~`` is not finite),
  the non-finite blocks first, ``max(#non-finite, 2^round)`` of them, at most ``budget``.

Tokens already paged carry ``c = 0`` (they are exact) and are never chosen again; a block
whose every token is exact has ``u = 0`` and no risk.

Main declarations
-----------------
- :func:`page_in_batch`, :class:`PageInBatch`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import final

import torch

from witcert_calculus.numerics.validation import positive_int, real

__all__ = ["PageInBatch", "page_in_batch"]

_F64 = torch.float64


@final
@dataclass(frozen=True, slots=True)
class PageInBatch:
    """The blocks each row takes in this round.

    Attributes:
        chosen: ``[M, blocks]`` bool, the blocks to page in.
        certified: ``[M]`` bool, whether the row's choice followed the certified decrease.
    """

    chosen: torch.Tensor
    certified: torch.Tensor


def _blocks(x: torch.Tensor, block_size: int, fill: float) -> torch.Tensor:
    # [M, S] -> [M, blocks, block_size], padded with ``fill``
    m, s = (int(n) for n in x.shape)
    nb = -(-s // block_size)
    pad = torch.full((m, nb * block_size - s), fill, dtype=x.dtype)
    return torch.cat([x, pad], dim=1).view(m, nb, block_size)


def page_in_batch(p: torch.Tensor, c: torch.Tensor, paged: torch.Tensor, *, block_size: int,
                  threshold: float, saturation: float, eform: torch.Tensor,
                  rounds: torch.Tensor, budget: torch.Tensor) -> PageInBatch:
    """The blocks every row pages in this round (see the module).

    Args:
        p: ``[M, S]`` compressed attention of each row (0 outside its support).
        c: ``[M, S]`` logit bounds ``>= 0`` (``inf`` allowed; 0 where exact).
        paged: ``[M, S]`` tokens already exact.
        block_size: tokens per block (blocks aligned to token 0).
        threshold: ``tau`` in ``(0, 1)``; ``saturation``: the e-form above which a row is
            risk-ranked; ``eform``: ``[M]`` each row's e-form now.
        rounds: ``[M]`` risk-ranked rounds each row already had (it takes ``2^rounds``).
        budget: ``[M]`` blocks each row may still take on the risk-ranked path.

    Returns:
        The :class:`PageInBatch`.

    Example:
        >>> b = page_in_batch(torch.tensor([[0.5, 0.3, 0.2]], dtype=torch.float64),
        ...                   torch.tensor([[0.01, 1.0, 0.5]], dtype=torch.float64),
        ...                   torch.zeros(1, 3, dtype=torch.bool), block_size=1,
        ...                   threshold=0.05, saturation=1e6,
        ...                   eform=torch.tensor([2.0], dtype=torch.float64),
        ...                   rounds=torch.zeros(1, dtype=torch.int64),
        ...                   budget=torch.ones(1, dtype=torch.int64))
        >>> b.chosen.tolist(), b.certified.tolist()
        ([[False, True, True]], [True])
    """
    bs = positive_int("block_size", block_size)
    tau = real("threshold", threshold, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    sat = real("saturation", saturation, lo=1.0)
    pp, cc = p.to(_F64), c.to(_F64)
    finite = torch.isfinite(pp).all(dim=1) & torch.isfinite(cc).all(dim=1)
    certified = finite & torch.isfinite(eform) & (eform <= sat)
    # --- certified: the plan of page_in_order at the current p~
    total = pp.sum(dim=1, keepdim=True)
    pn = pp / torch.where(total > 0, total, 1.0)
    mass = _blocks(torch.where(finite.unsqueeze(1), pn, 0.0), bs, 0.0).sum(dim=-1)
    u = _blocks(torch.where(finite.unsqueeze(1), cc, 0.0), bs, 0.0).amax(dim=-1)
    live = (u > 0) & (mass > 0)
    log_mass = torch.log(torch.where(mass > 0, mass, 1.0))
    log_dec = torch.where(live, log_mass + u + torch.log(-torch.expm1(-u)), -torch.inf)
    dec = torch.where(live, mass * torch.expm1(u), 0.0)
    order = torch.sort(log_dec, dim=1, descending=True, stable=True).indices
    dec_sorted = torch.gather(dec, 1, order)
    tail = torch.flip(torch.cumsum(torch.flip(dec_sorted, [1]), dim=1), [1])
    tail = torch.cat([tail, torch.zeros(int(tail.shape[0]), 1, dtype=_F64)], dim=1)
    target = 0.5 * math.log1p(2.0 * tau)
    reached = torch.log1p(tail) <= target
    reached[:, -1] = True  # every block exact: A = 1
    k = reached.to(torch.int64).argmax(dim=1)  # first prefix length that reaches the target
    any_live = live.any(dim=1)
    k = torch.where((k == 0) & any_live, 1, k)  # still above tau: the largest decrease
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(int(order.shape[1])).expand_as(order))
    plan = (rank < k.unsqueeze(1)) & live
    # --- risk-ranked: blocks by raw risk, non-finite first
    with torch.no_grad():
        log_p = torch.where(pp > 0, torch.log(torch.where(pp > 0, pp, 1.0)), -torch.inf)
        term = torch.where(torch.isfinite(pp).all(dim=1, keepdim=True), log_p + cc, cc)
        term = torch.where(torch.isnan(term) | (cc == torch.inf), torch.inf, term)
        term = torch.where(paged, -torch.inf, term)
        risk = torch.logsumexp(_blocks(term, bs, -math.inf), dim=-1)
        risk = torch.where(torch.isnan(risk), torch.inf, risk)
    n_inf = (risk == torch.inf).sum(dim=1)
    take = torch.minimum(budget, torch.maximum(n_inf, torch.pow(2, rounds)))
    r_order = torch.sort(risk, dim=1, descending=True, stable=True).indices
    r_rank = torch.empty_like(r_order)
    r_rank.scatter_(1, r_order, torch.arange(int(r_order.shape[1])).expand_as(r_order))
    ranked = (r_rank < take.unsqueeze(1)) & (risk > -torch.inf)
    chosen = torch.where(certified.unsqueeze(1), plan, ranked)
    return PageInBatch(chosen, certified)
