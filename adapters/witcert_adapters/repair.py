"""The gate that repairs: meter-driven, block-granular page-in of exact entries during generation.

A :class:`RepairCache` is a :class:`~witcert_adapters.witness_cache.WitnessCache` (it
compresses every write with the registered scheme and records band witnesses exactly as the
witnessing cache does) that also keeps an exact :class:`BackingStore` of every entry written, on the
CPU, and repairs itself before the attention reads it. A :class:`Repairer` attaches it to a
transformers model: a forward pre-hook on each attention module recomputes the layer's
post-RoPE queries (``spec.queries(module, hidden, position_embeddings)``, as
:class:`~witcert_adapters.hf.Probe` does) and stages them on the cache; the cache's
``update``, which runs inside the attention forward after the new entries are projected,

1. copies the new keys and values into the backing store (and marks their slots written),
2. compresses and stores them as the witnessing cache does,
3. evaluates the Tier-A meter of every ``(batch, query head)`` cell of the call's decode row
   over the stored (compressed, partly repaired) keys: ``c_t = scale sum_b ||q_b|| w_{t,b}``
   (:func:`~witcert_kernels.meter.logit_bound`), ``p~ = softmax(scale q . k_hat)`` under the
   causal mask, and ``min(e-form, two-sided)`` (:func:`~witcert_kernels.meter.tv_bounds_batch`).
   The decode row is the call's last query row, the one whose prediction is emitted: a
   decode step's only row, a prefill's last; ``every_row=True`` gates every row of a
   prefill too (slower, and it pages in more),
4. for every query head whose worst row exceeds the threshold ``tau``, pages in blocks of
   ``block_size`` consecutive slots of the kv head it reads (GQA: head ``h`` reads kv head
   ``h // groups``) until the recomputed meter of every row is at most ``tau``: the exact
   keys and values of the block's slots are written back into the stored tensors, their
   witnesses (band witnesses, full witness, value residual) are set to 0 in the cache's
   :class:`~witcert_adapters.layer_log.LayerLog`, and the slots are marked paged (a paged
   slot is never paged again and stays exact for the rest of the request),
5. returns the repaired keys and values to the attention.

Which blocks. With block masses ``mass_j`` of ``p~`` and block-constant bounds
``u_j = max_{t in j} c_t`` (:func:`~witcert_calculus.meters.page_in.block_summary`), paging in block
``j`` lowers ``A = sum_j mass_j e^{u_j}`` by exactly ``mass_j (e^{u_j} - 1)`` (Lean
``WitCert.Meters.page_in_decrease``); :func:`~witcert_calculus.meters.page_in.page_in_order` gives
the fewest blocks that bring the e-form ``(A^2 - 1)/2`` to ``tau`` at the current ``p~``. The
page-in changes ``p~``, so the meter is recomputed on the repaired cache and the step is
repeated while a row stays above ``tau`` (each round pages at least one new block; when every
visible slot is exact, ``c = 0`` and the meter is exactly 0). Such a decision is
:attr:`GateLabel.CERTIFIED`: it ends with the recomputed Tier-A meter of every row of the
head at most ``tau``.

Above saturation the certified decrease says nothing: a row whose ``p~`` or ``c`` is not
finite (a non-finite stored key or witness; note that a NaN witness would enter
``logit_bound`` as 0, so such slots are flagged here from the witnesses and keys themselves),
or whose e-form exceeds ``saturation``. Its blocks are ranked by the raw risk score
``log sum_{t in j, unpaged} p~_t e^{c_t}`` (the block's share of ``A``; ``+inf`` for a
non-finite slot; ``c_t`` alone when ``p~`` is not finite) and paged in, the non-finite blocks
first, then in rounds of 1, 2, 4, ... blocks, until the meter is at most ``tau`` or the
decision has paged ``risk_traffic`` of the row's visible blocks. Such a decision is
:attr:`GateLabel.RISK_RANKED`, and so is a run with any of them
(:meth:`RepairCache.summary`).

Traffic. ``page_in_bytes`` counts the bytes moved from the backing store: per paged
``(batch, kv head, slot)``, its key and value in the model's dtype. ``page_in_fraction`` is
paged slot-heads over every slot-head stored (all layers, batch rows and kv heads).

The backing store must be impossible to miss: every slot carries a written flag, set only by
:meth:`BackingStore.write`; reading a slot whose flag is not set (allocated, never written)
raises :class:`~witcert_calculus.errors.UnwrittenSlotError` with a note naming the layer, so a
repair can never read zeros.

With a dithered scheme (Tier B), the Tier-B records of a paged slot (its block scales and
cast residual) are left as written: the slot's error is then 0, below what they bound, so
a Tier-B bound stays sound, only looser; the gate itself uses Tier A only.

Scope: dense attention memories (keys in slot 0, values in slot 1), full causal attention
without padding (each batch row is one unpadded sequence; no sliding window), no cache
cropping or reordering. The gate decides on the host (one synchronisation per layer and
forward call, plus one per repair round): a gate has to decide where the observation-only
:class:`~witcert_adapters.hf.Probe` does not.

Main declarations
-----------------
- :class:`RepairCache`: the repairing cache; :meth:`RepairCache.summary`.
- :class:`Repairer` and :func:`attach_repair`: the hooks that stage queries, and new caches.
- :class:`RepairPolicy`: threshold, block size, saturation, risk-ranked traffic cap.
- :class:`BackingStore`: one layer's exact entries with written flags.
- :class:`RepairDecision`, :class:`RepairSummary`, :class:`GateLabel`: what the gate did.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Generator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, TypeAlias, final

import numpy as np
import torch
from torch.utils.hooks import RemovableHandle

from witcert_adapters.architectures import ArchSpec, spec_for
from witcert_adapters.layer_log import LayerLog
from witcert_adapters.runs import MemoryKind
from witcert_adapters.schemes import Scheme, get_scheme
from witcert_adapters.witness_cache import WitnessCache
from witcert_calculus.errors import InvalidValueError, UnwrittenSlotError
from witcert_calculus.meters.page_in import block_summary, page_in_order
from witcert_calculus.numerics.validation import positive_int, real
from witcert_kernels.meter import logit_bound, tv_bounds_batch

__all__ = [
    "BackingStore",
    "GateLabel",
    "RepairCache",
    "RepairDecision",
    "RepairPolicy",
    "RepairSummary",
    "Repairer",
    "attach_repair",
]

PreHook: TypeAlias = Callable[[Any, tuple[Any, ...], dict[str, Any]], None]
_F64 = torch.float64


@final
class GateLabel(enum.StrEnum):
    """How a repair decision chose its blocks (members equal their values as strings)."""

    CERTIFIED = "certified"
    """By the certified decrease of ``A`` (finite inputs, e-form at most the saturation)."""
    RISK_RANKED = "risk-ranked"
    """By the raw risk score, above saturation, up to a traffic cap."""


@final
@dataclass(frozen=True, slots=True)
class RepairPolicy:
    """When and how the gate pages in.

    Attributes:
        threshold: ``tau``: a head is repaired while a row's meter exceeds it; in ``(0, 1)``.
        block_size: slots per block (blocks are aligned to slot 0), >= 1.
        saturation: the e-form above which a row's decision is risk-ranked (finite, >= 1).
        risk_traffic: the largest share of a row's visible blocks one risk-ranked decision
            pages in, in ``(0, 1]``.
        every_row: gate every query row of a multi-row call (a prefill), not only its last.

    Raises:
        InvalidValueError: a value out of range (the message names it).

    Example:
        >>> RepairPolicy(0.2).block_size
        16
        >>> RepairPolicy(1.0)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        witcert_calculus.errors.InvalidValueError: threshold=1.0 is invalid: must lie in (0.0, 1.0)
    """

    threshold: float
    block_size: int = 16
    saturation: float = 1e6
    risk_traffic: float = 0.5
    every_row: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "threshold", real("threshold", self.threshold, lo=0.0, hi=1.0,
                                                   lo_open=True, hi_open=True))
        object.__setattr__(self, "block_size", positive_int("block_size", self.block_size))
        object.__setattr__(self, "saturation", real("saturation", self.saturation, lo=1.0))
        object.__setattr__(self, "risk_traffic", real("risk_traffic", self.risk_traffic, lo=0.0,
                                                      hi=1.0, lo_open=True))
        if not isinstance(self.every_row, bool):
            raise InvalidValueError("every_row", self.every_row, "must be a bool")


@final
@dataclass(frozen=True, slots=True)
class RepairDecision:
    """One head's repair within one forward call of one layer.

    Attributes:
        layer / batch / head / kv_head: the cell's layer, batch row, query head and the kv
            head it reads.
        position: absolute query position of the worst row when the decision started.
        meter_before: that row's meter (``inf`` when not finite).
        meter_after: the head's worst row after the decision (recomputed).
        blocks: the blocks paged in, in order.
        slots: slots paged in (of that kv head; a block's already paged slots not counted).
        label: :attr:`GateLabel.CERTIFIED` if every round followed the certified decrease.
    """

    layer: int
    batch: int
    head: int
    kv_head: int
    position: int
    meter_before: float
    meter_after: float
    blocks: tuple[int, ...]
    slots: int
    label: GateLabel


@final
@dataclass(frozen=True, slots=True)
class RepairSummary:
    """What a repairing cache did over one request.

    Attributes:
        decisions: repair decisions taken; ``certified``: how many were certified.
        paged_slots: ``(batch, kv head, slot)`` entries paged in, all layers.
        stored_slots: ``(batch, kv head, slot)`` entries stored, all layers.
        page_in_bytes: bytes moved from the backing store (keys and values, model dtype).
        label: :attr:`GateLabel.CERTIFIED` if every decision was certified (or none was
            needed), else :attr:`GateLabel.RISK_RANKED`.
    """

    decisions: int
    certified: int
    paged_slots: int
    stored_slots: int
    page_in_bytes: int
    label: GateLabel

    @property
    def page_in_fraction(self) -> float:
        """Paged over stored slot-heads (0 for an empty cache)."""
        return self.paged_slots / self.stored_slots if self.stored_slots else 0.0


@final
class BackingStore:
    """One layer's exact keys and values on the CPU, with a written flag per slot.

    Args:
        layer: the layer index (named in errors).

    Capacity grows by doubling (:meth:`reserve`); reserved slots hold zeros and are not
    written until :meth:`write` copies entries into them. :meth:`read` refuses any slot whose
    flag is not set.

    Example:
        >>> s = BackingStore(0)
        >>> s.write(0, torch.ones(1, 1, 2, 4), torch.zeros(1, 1, 2, 4))
        >>> s.read(0, 0, torch.tensor([1]))[0].tolist()
        [[1.0, 1.0, 1.0, 1.0]]
    """

    def __init__(self, layer: int) -> None:
        self.layer = layer
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.written = torch.zeros(0, dtype=torch.bool)

    @property
    def capacity(self) -> int:
        """Slots allocated."""
        return int(self.written.shape[0])

    def reserve(self, end: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Allocate slots ``[0, end)`` shaped like ``keys``/``values`` (new slots unwritten)."""
        if end <= self.capacity and self.keys is not None and self.values is not None:
            return
        cap = max(end, 2 * self.capacity, 16)
        b, h = keys.shape[0], keys.shape[1]
        new_k = torch.zeros((b, h, cap, keys.shape[-1]), dtype=keys.dtype)
        new_v = torch.zeros((b, h, cap, values.shape[-1]), dtype=values.dtype)
        old = self.capacity
        if self.keys is not None and self.values is not None:
            new_k[:, :, :old] = self.keys
            new_v[:, :, :old] = self.values
        flags = torch.zeros(cap, dtype=torch.bool)
        flags[:old] = self.written
        self.keys, self.values, self.written = new_k, new_v, flags

    def write(self, start: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Copy the entries written at slots ``[start, start + T)`` and mark them written."""
        end = start + int(keys.shape[-2])
        self.reserve(end, keys, values)
        assert self.keys is not None and self.values is not None
        self.keys[:, :, start:end] = keys.detach().to("cpu")
        self.values[:, :, start:end] = values.detach().to("cpu")
        self.written[start:end] = True

    def read(self, batch: int, kv_head: int, slots: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """The exact ``(keys, values)`` of ``slots`` of one batch row and kv head, ``[n, d]``.

        Raises:
            UnwrittenSlotError: a slot that was never written (noted with the layer).
        """
        idx = slots.to(torch.int64)
        inside = idx < self.capacity
        ok = torch.zeros_like(idx, dtype=torch.bool)
        ok[inside] = self.written[idx[inside]]
        if self.keys is None or self.values is None or not bool(ok.all()):
            slot = int(idx[~ok][0]) if idx.numel() else 0
            err = UnwrittenSlotError(slot)
            err.add_note(f"layer {self.layer}, batch {batch}, kv head {kv_head}: the backing "
                         f"store holds {int(self.written.sum())} written of {self.capacity} "
                         "allocated slots; a repair must never read unwritten bytes")
            raise err
        return self.keys[batch, kv_head, idx], self.values[batch, kv_head, idx]


@dataclass(slots=True)
class _Cells:
    # One meter evaluation of a slice [b, kv, group, rows] (float64 tensors).
    meter: torch.Tensor  # [B, K, G, Q], inf where not finite or a visible slot is bad
    eform: torch.Tensor  # [B, K, G, Q]
    p: torch.Tensor  # [B, K, G, Q, S]
    c: torch.Tensor  # [B, K, G, Q, S], inf at visible bad slots


@final
class RepairCache(WitnessCache):
    """A witnessing cache with an exact backing store that repairs itself before each read.

    Args:
        config: the model config.
        spec: the architecture's layout (a dense memory: keys in slot 0, values in slot 1).
        scheme: the compression scheme.
        policy: the gate's :class:`RepairPolicy`.
        request_id: keys the dither stream of randomised schemes.
        audit: keep exact entries in the witness log too (as :class:`WitnessCache` does).

    Raises:
        InvalidValueError: a layout that is not a dense memory.

    The queries of each layer's call must be staged first (:meth:`stage_queries`; a
    :class:`Repairer`'s pre-hooks do it); an ``update`` without them raises.
    """

    def __init__(self, *, config: Any, spec: ArchSpec, scheme: Scheme, policy: RepairPolicy,
                 request_id: int = 0, audit: bool = False) -> None:
        if spec.memory_class is not MemoryKind.DENSE or spec.value_slot != 1 or \
                len(spec.parts) != 1 or spec.parts[0].slot != 0:
            raise InvalidValueError("spec", spec.model_type,
                                    "the repairing cache supports dense memories (keys in slot "
                                    "0, values in slot 1) only")
        super().__init__(config=config, spec=spec, scheme=scheme, request_id=request_id,
                         audit=audit)
        self.dense = spec
        self.policy = policy
        self.stores: dict[int, BackingStore] = {}
        self.paged: dict[int, torch.Tensor] = {}
        self.decisions: list[RepairDecision] = []
        self.page_in_bytes = 0
        self._staged: dict[int, tuple[torch.Tensor, float]] = {}

    def stage_queries(self, layer: int, queries: torch.Tensor, *, scale: float) -> None:
        """Stage layer ``layer``'s post-RoPE queries ``[B, H, Q, d]`` for its next ``update``."""
        self._staged[layer] = (queries.detach(), real("scale", scale, lo=0.0, lo_open=True))

    def store(self, layer: int) -> BackingStore:
        """Layer ``layer``'s backing store, created on first use."""
        entry = self.stores.get(layer)
        if entry is None:
            entry = BackingStore(layer)
            self.stores[layer] = entry
        return entry

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Back up, compress and store the new entries, repair the layer, return what it reads.

        Raises:
            InvalidValueError: no queries were staged for the layer.
            UnwrittenSlotError: a page-in met a slot the backing store never received.
        """
        staged = self._staged.pop(layer_idx, None)
        if staged is None:
            raise InvalidValueError("queries", None, f"layer {layer_idx}: no queries were staged "
                                    "before the cache update; open the cache with "
                                    "Repairer.new_cache() so its pre-hooks stage them")
        start = self.get_seq_length(layer_idx) if layer_idx < len(self.layers) else 0
        self.store(layer_idx).write(start, key_states, value_states)
        super().update(key_states, value_states, layer_idx, *args, **kwargs)
        fresh = torch.zeros((key_states.shape[0], key_states.shape[1], key_states.shape[-2]),
                            dtype=torch.bool)
        old = self.paged.get(layer_idx)
        self.paged[layer_idx] = fresh if old is None else torch.cat([old, fresh], dim=-1)
        queries, scale = staged
        with torch.no_grad():
            self._gate(layer_idx, queries, scale, start)
        stored: Any = self.layers[layer_idx]
        return stored.keys, stored.values

    # ------------------------------------------------------------------ the gate

    def _cells(self, layer: int, q: torch.Tensor, start: int, b: slice, k: slice,
               scale: float) -> _Cells:
        # Meter of q [B', K', G, Q, d] against the stored keys and logged witnesses of the
        # batch rows b and kv heads k.
        stored: Any = self.layers[layer]
        k_hat: torch.Tensor = stored.keys[b, k]  # [B', K', S, d]
        log = self.log(layer)
        part = self.dense.parts[0]
        w = log.witnesses(0)[b, k]  # [B', K', S, bands]
        bad = ~torch.isfinite(w).all(dim=-1) | ~torch.isfinite(k_hat).all(dim=-1)  # [B', K', S]
        s_len = int(k_hat.shape[-2])
        q_len = int(q.shape[-2])
        masked = torch.arange(s_len).unsqueeze(0) > torch.arange(start, start + q_len).unsqueeze(-1)
        c = logit_bound(q, w.unsqueeze(2).unsqueeze(3), scale=scale, layout=part.layout)
        logits = scale * torch.matmul(q.to(_F64), k_hat.to(_F64).unsqueeze(2).transpose(-1, -2))
        p = torch.softmax(logits.masked_fill(masked, float("-inf")), dim=-1)
        bounds = tv_bounds_batch(p, c, check=False)
        bad_vis = bad.unsqueeze(2).unsqueeze(3) & ~masked  # [B', K', 1, Q, S]
        row_bad = bad_vis.any(dim=-1) | ~torch.isfinite(bounds.meter)
        meter = torch.where(row_bad, float("inf"), bounds.meter)
        cc = torch.where(bad_vis, float("inf"), c.values)
        return _Cells(meter, bounds.eform, p, cc)

    def _gate(self, layer: int, queries: torch.Tensor, scale: float, start: int) -> None:
        stored: Any = self.layers[layer]
        bsz, hkv = int(stored.keys.shape[0]), int(stored.keys.shape[1])
        heads, q_len = int(queries.shape[1]), int(queries.shape[2])
        groups = heads // hkv
        q = queries.reshape(bsz, hkv, groups, q_len, -1)
        if not self.policy.every_row and q_len > 1:
            q = q[..., -1:, :]
            start += q_len - 1
        cells = self._cells(layer, q, start, slice(None), slice(None), scale)
        worst = cells.meter.amax(dim=-1).numpy()  # [B, K, G], one host sync
        tau = self.policy.threshold
        for b in range(bsz):
            for g in range(hkv):
                if not bool((worst[b, g] > tau).any()):
                    continue
                sl_b, sl_k = slice(b, b + 1), slice(g, g + 1)
                local = _Cells(cells.meter[sl_b, sl_k], cells.eform[sl_b, sl_k],
                               cells.p[sl_b, sl_k], cells.c[sl_b, sl_k])
                for gi in range(groups):
                    local = self._repair_head(layer, q[sl_b, sl_k], start, b, g, gi, groups,
                                              scale, local)

    def _repair_head(self, layer: int, q: torch.Tensor, start: int, b: int, g: int, gi: int,
                     groups: int, scale: float, cells: _Cells) -> _Cells:
        # Page in blocks of kv head g until every row of query head g*groups+gi is <= tau.
        policy = self.policy
        rows = cells.meter[0, 0, gi].numpy()
        r = int(np.argmax(rows))
        before = float(rows[r])
        if before <= policy.threshold:
            return cells
        position = start + r
        blocks: list[int] = []
        slots = 0
        certified = True
        risk_blocks = 0
        risk_rounds = 0
        cap = 0
        while True:
            rows = cells.meter[0, 0, gi].numpy()
            r = int(np.argmax(rows))
            if float(rows[r]) <= policy.threshold:
                break
            visible = start + r + 1
            p = cells.p[0, 0, gi, r, :visible].numpy()
            c = cells.c[0, 0, gi, r, :visible].numpy()
            paged = self.paged[layer][b, g, :visible].numpy()
            chosen = self._certified_blocks(p, c, paged, float(cells.eform[0, 0, gi, r]))
            if chosen is None:
                certified = False
                n_blocks = -(-visible // policy.block_size)
                cap = max(cap, max(1, math.floor(policy.risk_traffic * n_blocks)))
                if risk_blocks >= cap:
                    break
                chosen = self._risk_blocks(p, c, paged, cap - risk_blocks, risk_rounds)
                risk_rounds += 1
                risk_blocks += len(chosen)
            if not chosen:
                break  # nothing left to page: every visible slot is exact or carries no risk
            slots += self._page_in(layer, b, g, chosen)
            blocks.extend(chosen)
            cells = self._cells(layer, q, start, slice(b, b + 1), slice(g, g + 1), scale)
        after = float(cells.meter[0, 0, gi].amax())
        label = GateLabel.CERTIFIED if certified else GateLabel.RISK_RANKED
        self.decisions.append(RepairDecision(layer, b, g * groups + gi, g, position, before,
                                             after, tuple(blocks), slots, label))
        return cells

    def _certified_blocks(self, p: np.ndarray[Any, np.dtype[np.float64]],
                          c: np.ndarray[Any, np.dtype[np.float64]],
                          paged: np.ndarray[Any, np.dtype[np.bool_]],
                          eform: float) -> list[int] | None:
        # The plan of page_in_order at the current p~, or None above saturation.
        if not (np.isfinite(p).all() and np.isfinite(c).all()) or not math.isfinite(eform) \
                or eform > self.policy.saturation:
            return None
        bs = self.policy.block_size
        mass, u = block_summary(p / p.sum(), c, block_size=bs)
        plan = page_in_order(mass, u, threshold=self.policy.threshold)
        open_ = self._open_blocks(paged, bs)
        chosen = [j for j in plan.order if open_[j] and u[j] > 0]
        if not chosen:
            # The meter's outward margins can leave a row just above tau that the plan (which
            # carries none) already counts as done: take the largest decrease still open.
            dec = np.where(open_ & (u > 0), mass * np.expm1(u), -1.0)
            best = int(np.argmax(dec))
            chosen = [best] if dec[best] >= 0 else []
        return chosen

    def _risk_blocks(self, p: np.ndarray[Any, np.dtype[np.float64]],
                     c: np.ndarray[Any, np.dtype[np.float64]],
                     paged: np.ndarray[Any, np.dtype[np.bool_]], budget: int,
                     rounds: int) -> list[int]:
        # Blocks by decreasing raw risk log sum p e^c over unpaged slots; non-finite first.
        bs = self.policy.block_size
        with np.errstate(divide="ignore", invalid="ignore"):
            if np.isfinite(p).all():
                term = np.where(p > 0, np.log(np.where(p > 0, p, 1.0)), -np.inf) + c
            else:
                term = c.copy()
        term = np.where(np.isnan(term) | (c == np.inf), np.inf, term)
        term = np.where(paged, -np.inf, term)
        starts = np.arange(0, term.size, bs)
        risk = np.logaddexp.reduceat(term, starts)
        live = [j for j in np.lexsort((np.arange(risk.size), -risk)).tolist()
                if risk[j] > -np.inf]
        n_inf = sum(1 for j in live if risk[j] == np.inf)
        take = min(budget, max(n_inf, 2 ** rounds))
        return [int(j) for j in live[:take]]

    @staticmethod
    def _open_blocks(paged: np.ndarray[Any, np.dtype[np.bool_]], bs: int
                     ) -> np.ndarray[Any, np.dtype[np.bool_]]:
        starts = np.arange(0, paged.size, bs)
        out: np.ndarray[Any, np.dtype[np.bool_]] = np.logical_and.reduceat(paged, starts) == 0
        return out

    def _page_in(self, layer: int, b: int, g: int, blocks: list[int]) -> int:
        # Write the exact entries of the blocks' unpaged slots back; zero their witnesses.
        stored: Any = self.layers[layer]
        s_len = int(stored.keys.shape[-2])
        bs = self.policy.block_size
        mask = self.paged[layer]
        idx = torch.cat([torch.arange(j * bs, min((j + 1) * bs, s_len)) for j in blocks])
        idx = idx[~mask[b, g, idx]]
        if idx.numel() == 0:
            return 0
        keys, values = self.store(layer).read(b, g, idx)
        dev = stored.keys.device
        stored.keys[b, g, idx.to(dev)] = keys.to(dev)
        stored.values[b, g, idx.to(dev)] = values.to(dev)
        mask[b, g, idx] = True
        _zero_witnesses(self.log(layer), b, g, idx)
        self.page_in_bytes += int(idx.numel()) * (keys.shape[-1] * keys.element_size()
                                                  + values.shape[-1] * values.element_size())
        return int(idx.numel())

    def summary(self) -> RepairSummary:
        """What the gate did so far over this request."""
        paged = sum(int(m.sum()) for m in self.paged.values())
        stored = sum(int(m.numel()) for m in self.paged.values())
        certified = sum(1 for d in self.decisions if d.label is GateLabel.CERTIFIED)
        label = GateLabel.CERTIFIED if certified == len(self.decisions) else GateLabel.RISK_RANKED
        return RepairSummary(len(self.decisions), certified, paged, stored, self.page_in_bytes,
                             label)


def _zero_witnesses(log: LayerLog, b: int, g: int, idx: torch.Tensor) -> None:
    # Paged slots are exact: their band witnesses, full witness and value residual are 0.
    # The log's step records are frozen; the touched ones are replaced by zeroed copies.
    offset = 0
    for i, step in enumerate(log.written):
        local = idx[(idx >= offset) & (idx < offset + step.tokens)] - offset
        offset += step.tokens
        if local.numel() == 0:
            continue
        wits: list[torch.Tensor] = []
        for w in step.witnesses:
            w2 = w.clone()
            w2[b, g, local] = 0.0
            wits.append(w2)
        full = step.witness_full.clone()
        full[b, g, local] = 0.0
        res = None
        if step.value_res is not None:
            res = step.value_res.clone()
            res[b, g, local] = 0.0
        log.replace_write(i, replace(step, witnesses=tuple(wits), witness_full=full,
                                     value_res=res))


@final
class Repairer:
    """Attach repairing caches to a transformers model (forward pre-hooks stage the queries).

    Args:
        model: a causal LM whose ``config.model_type`` has a registered dense layout.
        scheme: a registered scheme name.
        threshold: ``tau`` in ``(0, 1)``.
        block_size / saturation / risk_traffic / every_row: see :class:`RepairPolicy`.
        request_id: keys the dither stream of randomised schemes.
        audit: keep exact entries in the witness log too.

    Raises:
        InvalidValueError: an unknown scheme or model type, or a policy value out of range.

    Use :meth:`new_cache` per request and pass it as ``cache=``; :meth:`close` (or
    :func:`attach_repair`) removes the hooks. A :class:`~witcert_adapters.hf.Probe` may
    meter the same cache (``probe.bind(repairer.new_cache())``): it then reads the repaired
    witnesses.
    """

    def __init__(self, model: Any, *, scheme: str, threshold: float, block_size: int = 16,
                 saturation: float = 1e6, risk_traffic: float = 0.5, every_row: bool = False,
                 request_id: int = 0, audit: bool = False) -> None:
        self.policy = RepairPolicy(threshold, block_size, saturation, risk_traffic, every_row)
        self.spec = spec_for(model.config.model_type)
        self.scheme = get_scheme(scheme)
        self.model = model
        self.request_id = request_id
        self.audit = audit
        self.cache: RepairCache | None = None
        self._handles: list[RemovableHandle] = []
        for module in model.modules():
            idx = getattr(module, "layer_idx", None)
            if isinstance(idx, int) and hasattr(module, "scaling") and \
                    type(module).__name__.endswith("Attention"):
                self._handles.append(module.register_forward_pre_hook(
                    self._make_pre(idx), with_kwargs=True))

    def new_cache(self) -> RepairCache:
        """A fresh :class:`RepairCache` for one request; the hooks stage queries into it."""
        self.cache = RepairCache(config=self.model.config, spec=self.spec, scheme=self.scheme,
                                 policy=self.policy, request_id=self.request_id,
                                 audit=self.audit)
        return self.cache

    def close(self) -> None:
        """Remove every hook this repairer registered."""
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _make_pre(self, layer: int) -> PreHook:
        def pre(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            cache = self.cache
            if cache is None:
                raise InvalidValueError("cache", None,
                                        "call Repairer.new_cache() and pass it as cache=")
            hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            with torch.no_grad():
                (queries,) = self.spec.queries(module, hidden, kwargs.get("position_embeddings"))
            cache.stage_queries(layer, queries, scale=float(module.scaling))
        return pre


@contextmanager
def attach_repair(model: Any, *, scheme: str, threshold: float, block_size: int = 16,
                  saturation: float = 1e6, risk_traffic: float = 0.5, every_row: bool = False,
                  request_id: int = 0, audit: bool = False) -> Generator[Repairer]:
    """A :class:`Repairer` for the duration of a ``with`` block.

    Example:
        >>> # with attach_repair(model, scheme="fp8_e4m3", threshold=0.2) as rep:
        >>> #     cache = rep.new_cache(); model.generate(ids, cache=cache)
        >>> #     cache.summary().page_in_fraction
    """
    rep = Repairer(model, scheme=scheme, threshold=threshold, block_size=block_size,
                   saturation=saturation, risk_traffic=risk_traffic, every_row=every_row,
                   request_id=request_id, audit=audit)
    try:
        yield rep
    finally:
        rep.close()
