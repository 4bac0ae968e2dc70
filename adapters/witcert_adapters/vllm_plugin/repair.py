"""The gate that repairs, inside the engine: meter-driven page-in of exact keys and values.

With ``repair=1`` the plugin keeps an exact backing store of every key and value the engine
writes (:class:`~witcert_adapters.vllm_plugin.witnesses.SlotWitnesses` with exact values:
keyed by slot, read only at the generation the request expects). Each layer is metered in
its own ``forward``, right after the engine's attention wrote the layer's output and
before the next layer reads it; then for every cell (request, query row, query head) whose
meter exceeds ``tau``:

1. blocks of ``block_size`` consecutive positions of the kv head the cell reads are chosen
   by the rule of :class:`witcert_adapters.repair.RepairCache` (batched:
   :func:`witcert_kernels.page_in.page_in_batch`): the fewest blocks by the certified decrease
   of ``A`` (Lean ``WitCert.Meters.page_in_decrease``), or, above saturation, by raw risk in
   rounds of 1, 2, 4, ... blocks up to ``risk_traffic`` of the row's blocks
   (risk-ranked, and labelled so);
2. the chosen positions become exact for the request, in this layer and kv head (a paged
   position stays exact for the rest of the request, and is never paged twice): their keys
   and values are read from the backing store, their witnesses are 0;
3. the cell's meter is recomputed over the mixed keys (stored where not paged, exact where
   paged) by the same code as every meter (:func:`~witcert_adapters.vllm_plugin.meter.
   meter_layer`), and steps 1-3 repeat while a cell stays above ``tau`` and a block is left;
4. the cell's output is recomputed, ``sum_t p~_t v_t`` over the mixed keys and values, and
   written into the engine's output tensor: the served tokens come from the repaired
   attention. The cell reports the recomputed meter (the bound of the attention actually
   served), and with audit the true TV against exact attention.

Which rows are gated is the caller's choice (``rows``): each request's last row of the step
(the row whose prediction is sampled) or every row. Cells at or below ``tau``, and rows not
gated, keep the engine's own output and their meter. The decision is
made on the host, one layer at a time; a repairing engine is slower than a metering one.

Main declarations
-----------------
- :class:`Gate`: the paged state of every seat and the repair of one layer;
  :class:`LayerRepair`: what it did.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import final

import torch

from witcert_adapters.repair import RepairPolicy
from witcert_adapters.vllm_plugin.meter import GroupCells, KeySide, LayerMeter, RowGroup
from witcert_adapters.vllm_plugin.paged import StepLayout
from witcert_adapters.vllm_plugin.witnesses import Positions, SlotWitnesses
from witcert_calculus.meters.tv_forms import TVBasis
from witcert_kernels.page_in import page_in_batch

__all__ = ["Gate", "LayerRepair"]

_F64 = torch.float64


@final
@dataclass(frozen=True, slots=True)
class LayerRepair:
    """One layer's repair in one step.

    Attributes:
        meter: ``[T, H]`` the meter of every cell as served (recomputed where repaired).
        true_tv: ``[T, H]`` audited true TV as served (``None`` without audit).
        repaired: ``[R]`` cells repaired per request; ``risk_ranked``: of which risk-ranked.
        paged: ``[R]`` (kv head, position) entries paged in per request.
        page_in_bytes: ``[R]`` bytes moved from the backing store per request.
        repaired_true_max: ``[R]`` the largest audited true TV of a repaired cell (0 without
            audit or repair).
        bases: what every meter it reports rests on (the stored keys' and each recomputation's).
    """

    meter: torch.Tensor
    true_tv: torch.Tensor | None
    repaired: torch.Tensor
    risk_ranked: torch.Tensor
    paged: torch.Tensor
    page_in_bytes: torch.Tensor
    repaired_true_max: torch.Tensor
    bases: tuple[TVBasis, ...]


Remeter = Callable[[KeySide, list[RowGroup]], LayerMeter]


@final
class Gate:
    """The repairing gate's state: which positions each seat has paged in, per layer and kv
    head.

    Args:
        seats: concurrent requests at most; ``layers``, ``kv_heads``; ``length``: positions
            per request.
        policy: threshold, block size, saturation, risk-ranked traffic cap.
    """

    __slots__ = ("paged", "policy")

    def __init__(self, *, seats: int, layers: int, kv_heads: int, length: int,
                 policy: RepairPolicy) -> None:
        self.policy = policy
        self.paged = torch.zeros(seats, layers, kv_heads, length, dtype=torch.bool)

    def clear(self, seat: int) -> None:
        """Forget a seat's pages (its request finished)."""
        self.paged[seat] = False

    def repair(self, layer: int, step: StepLayout, lm: LayerMeter, side: KeySide, *,
               seats: torch.Tensor, ok: torch.Tensor, buffer: SlotWitnesses,
               positions: Positions, values: torch.Tensor, output: torch.Tensor,
               remeter: Remeter, rows: torch.Tensor | None = None) -> LayerRepair:
        """Repair one layer's cells above the threshold (see the module).

        Args:
            layer: the layer; ``step``: the step's rows and visible slots.
            lm: the layer's meter over the stored keys (with :attr:`LayerMeter.cells`).
            side: the keys' side that meter read (stored keys and witnesses).
            seats: ``[R]`` each request's seat; ``ok``: ``[R]`` requests not failed closed
                (only they are repaired: their slots are known to be current).
            buffer: the backing store; ``positions``: the generations each seat expects.
            values: ``[R, kvh, S, d]`` float64 values as the cache holds them.
            output: ``[T, H, d]`` the engine's attention output, written in place.
            remeter: meters given groups over a given key side (the layer's own
                :func:`~witcert_adapters.vllm_plugin.meter.meter_layer`).
            rows: ``[T]`` the rows gated (``None``: every row).

        Returns:
            The :class:`LayerRepair`.

        Raises:
            UnwrittenSlotError, StaleReadError: a backing-store read of a slot never written
                or rewritten (never zeros).
        """
        policy = self.policy
        tau, bs = policy.threshold, policy.block_size
        r_count = step.requests
        n_rows, heads = (int(n) for n in lm.meter.shape)
        kvh = int(values.shape[1])
        grp = heads // kvh
        width = int(step.slots.shape[1])
        zeros = torch.zeros(r_count, dtype=torch.int64)
        gated = ok[step.row_request] if rows is None else ok[step.row_request] & rows
        bad = ~(lm.meter <= tau) & gated.unsqueeze(1)  # NaN counts as bad
        if not bool(bad.any()):
            return LayerRepair(lm.meter, lm.true_tv, zeros, zeros, zeros, zeros,
                               zeros.to(_F64), (lm.basis,))
        # the positions each request already has exact in this layer, [R, kvh, S]
        paged = self.paged[seats, layer, :, :width] & step.visible.unsqueeze(1)
        before = paged.clone()
        groups = _focus([c.group for c in lm.cells], bad.any(dim=1))
        rounds = torch.zeros(n_rows, heads, dtype=torch.int64)
        spent = torch.zeros(n_rows, heads, dtype=torch.int64)
        certified = torch.ones(n_rows, heads, dtype=torch.bool)
        # the gated rows' cells over the keys as served so far (earlier pages exact)
        served = self._remeter(groups, paged, side, step, layer, seats, buffer, positions,
                               remeter)
        bases = [lm.basis, served.basis]
        current = {id(c.group): c for c in served.cells}
        active = bad & ~(served.meter <= tau)
        while bool(active.any()):
            new = torch.zeros_like(paged)
            for g in groups:
                self._choose(g, current[id(g)], active, paged, new, rounds, spent, certified,
                             bs=bs, tau=tau)
            new &= ~paged
            if not bool(new.any()):
                break  # nothing left to page: every chosen position is exact already
            paged |= new
            served = self._remeter(groups, paged, side, step, layer, seats, buffer, positions,
                                   remeter)
            bases.append(served.basis)
            current = {id(c.group): c for c in served.cells}
            active = bad & ~(served.meter <= tau)
        # persist the pages; serve the repaired cells
        self.paged[seats, layer, :, :width] |= paged
        meter = torch.where(bad, served.meter, lm.meter)
        true_tv = None if lm.true_tv is None or served.true_tv is None else \
            torch.where(bad, served.true_tv, lm.true_tv)
        v_mix = _mix(values, paged, step, layer, seats, buffer, positions, part=1)
        for g in groups:
            cell = current[id(g)]
            idx = g.rows
            n, qn = (int(x) for x in idx.shape)
            flat = cell.p.reshape(n, kvh, grp * qn, width)
            out = torch.matmul(flat, v_mix[g.requests]).view(n, kvh, grp, qn, -1)
            out = out.permute(0, 3, 1, 2, 4).reshape(n, qn, heads, -1)  # [N, Q, H, d]
            hit = bad[idx]  # [N, Q, H]
            target = output[idx]
            target[hit] = out[hit].to(output.dtype)
            output[idx] = target
        req_of = step.row_request.unsqueeze(1).expand(n_rows, heads)
        repaired = torch.zeros(r_count, dtype=torch.int64).index_add_(
            0, req_of[bad], torch.ones(int(bad.sum()), dtype=torch.int64))
        risky = bad & ~certified
        risk_ranked = torch.zeros(r_count, dtype=torch.int64).index_add_(
            0, req_of[risky], torch.ones(int(risky.sum()), dtype=torch.int64))
        added = (paged & ~before).sum(dim=(1, 2))
        assert buffer.exact is not None
        per_entry = int(values.shape[-1]) * 2 * buffer.exact.element_size()
        true_max = torch.zeros(r_count, dtype=_F64)
        if true_tv is not None:
            true_max = true_max.scatter_reduce(0, req_of[bad], true_tv[bad], reduce="amax")
        return LayerRepair(meter, true_tv, repaired, risk_ranked, added, added * per_entry,
                           true_max, tuple(bases))

    # ------------------------------------------------------------------ pieces

    def _choose(self, g: RowGroup, cell: GroupCells, active: torch.Tensor, paged: torch.Tensor,
                new: torch.Tensor, rounds: torch.Tensor, spent: torch.Tensor,
                certified: torch.Tensor, *, bs: int, tau: float) -> None:
        # One round of choices for the group's active cells, marked into ``new`` [R, kvh, S].
        n, kvh, grp, qn, width = (int(x) for x in cell.p.shape)
        act = active[g.rows].view(n, qn, kvh, grp).permute(0, 2, 3, 1)  # [N, kvh, G, Q]
        where = torch.nonzero(act)
        if where.numel() == 0:
            return
        ni, ki, gi, qi = where.unbind(1)
        req = g.requests[ni]
        p = cell.p[ni, ki, gi, qi]
        c = cell.c[ni, ki, gi, qi]
        row_paged = paged[req, ki]
        head = ki * grp + gi
        row = g.rows[ni, qi]
        visible = cell.mask[ni, qi].sum(dim=-1)
        cap = torch.clamp((self.policy.risk_traffic * -(-visible // bs)).floor().to(torch.int64),
                          min=1)
        res = page_in_batch(p, c, row_paged, block_size=bs, threshold=tau,
                            saturation=self.policy.saturation, eform=cell.eform[ni, ki, gi, qi],
                            rounds=rounds[row, head], budget=cap - spent[row, head])
        risky = ~res.certified
        taken = res.chosen.sum(dim=1)
        spent[row[risky], head[risky]] += taken[risky]
        rounds[row[risky], head[risky]] += 1
        certified[row[risky], head[risky]] = False
        tokens = res.chosen.repeat_interleave(bs, dim=1)[:, :width] & cell.mask[ni, qi]
        hits = torch.zeros(int(new.shape[0]) * kvh, width, dtype=torch.int32).index_add_(
            0, req * kvh + ki, tokens.to(torch.int32))  # several cells may share a kv head
        new |= hits.view(-1, kvh, width) > 0

    @staticmethod
    def _remeter(groups: list[RowGroup], paged: torch.Tensor, side: KeySide, step: StepLayout,
                 layer: int, seats: torch.Tensor, buffer: SlotWitnesses, positions: Positions,
                 remeter: Remeter) -> LayerMeter:
        # The groups' cells over the mixed keys; paged positions carry no witness (exact).
        assert side.keys is not None
        keys = _mix(side.keys, paged, step, layer, seats, buffer, positions, part=0)
        witnesses = None if side.witnesses is None else torch.where(
            paged.permute(0, 2, 1).unsqueeze(-1), 0.0, side.witnesses)
        bounds = None if side.bounds is None else torch.where(paged.unsqueeze(-1), 0.0,
                                                              side.bounds)
        return remeter(KeySide(keys, witnesses, bounds, side.exact), groups)


def _focus(groups: list[RowGroup], rows: torch.Tensor) -> list[RowGroup]:
    # The groups restricted to the rows marked in ``rows`` [T] (a decode group keeps its
    # requests with a marked row; a prefill group its marked rows, in order).
    out: list[RowGroup] = []
    for g in groups:
        hit = rows[g.rows]  # [N, Q]
        if not bool(hit.any()):
            continue
        if int(g.rows.shape[1]) == 1:
            keep = hit[:, 0]
            out.append(RowGroup(g.requests[keep], g.rows[keep]))
        else:
            out.extend(RowGroup(g.requests[n:n + 1], g.rows[n][hit[n]].unsqueeze(0))
                       for n in range(int(g.rows.shape[0])) if bool(hit[n].any()))
    return out


def _mix(stored: torch.Tensor, paged: torch.Tensor, step: StepLayout, layer: int,
         seats: torch.Tensor, buffer: SlotWitnesses, positions: Positions, *,
         part: int) -> torch.Tensor:
    # Keys (part 0) or values (part 1) ``[R, kvh, S, d]`` with every paged position exact,
    # read from the backing store at the generation the request expects.
    out = stored.clone()
    r_idx, j_idx = torch.nonzero(paged.any(dim=1), as_tuple=True)
    if r_idx.numel():
        gens = positions.gen[seats[r_idx], j_idx]
        exact = buffer.read_exact(layer, step.slots[r_idx, j_idx], gens)[part]  # [n, kvh, d]
        sel = paged[r_idx, :, j_idx].unsqueeze(-1)  # [n, kvh, 1]
        out[r_idx, :, j_idx] = torch.where(sel, exact.to(_F64), out[r_idx, :, j_idx])
    return out
