"""One engine step metered: every layer, head and query row of every request.

The plugin captures, per layer, the step's queries and the keys it wrote, and evaluates a
layer's cells in a few batched tensor operations (no host loop over tokens):

1. write side: the band witness of each written slot is the band norm of the residual
   between the incoming key and the key as the cache holds it (:func:`write_witnesses`);
   an fp8 cache's bytes also carry their own per-channel *format witness*
   (:mod:`witcert_calculus.meters.formats`), which costs no stored byte;
2. read side, per layer (:func:`meter_layer`): for every row, over its request's visible
   tokens (block table -> slots, causal within a prefill chunk), the Tier-A logit bound
   ``c_t``: the band bound ``scale * sum_b ||q_b|| w_{t,b}``, the format bound
   ``scale * sum_c |q_c| w_{t,c}``, or per token the smaller of the two (each an
   established :class:`~witcert_calculus.meters.witness.LogitBound`, their minimum by
   :func:`~witcert_calculus.meters.witness.tighter`); the compressed attention ``p~`` recomputed
   from the stored keys in float64; and the TV meter ``min(e-form, two-sided)`` of
   :func:`witcert_kernels.meter.tv_meter_batch` (for an fp8 cache, the compiled
   :func:`witcert_kernels.fused.tv_meter_rows` of the same sums, from the logits of the
   pass that reads its bytes; or, in the cheap form, ``tanh(max c)`` of
   :func:`witcert_kernels.meter.tv_tanh_max_batch`, which needs neither keys nor ``p~``;
   or the cascade: ``tanh(max c)`` where it is already ``<= tau``, the meter elsewhere). A
   cache that holds the model's keys exactly has every ``c_t = 0``
   (:func:`witcert_kernels.meter.exact_logit_bound`): no witness, no key is read;
3. with audit keys, the true ``TV(p, p~)`` against exact attention on the unquantized keys;
4. per request, the step's tallies, packed in one float64 tensor (:func:`summarize`; one
   host read per step).

Rows are grouped for the batched products (:func:`row_groups`): every decode row of the
step in one group (one row per request), a prefill chunk in groups of its own (one
request, up to 32 consecutive rows each), so a request's keys are never copied per row; a
chunk's group reads only the tokens up to its last row's position (the causal mask hides
the rest from each of its rows), which spares about a third of a chunk's cells.
The layers of a step are metered in one pass (:func:`meter_layers`): their heads side by
side, as the heads of one layer, so the per-step cost of the host's operator calls does not
grow with the depth.

Main declarations
-----------------
- :func:`write_witnesses`, :func:`meter_layer` (one layer), :func:`meter_layers` (many in
  one pass, heads side by side: :func:`side_by_side`), :func:`meter_step` (a step),
  :func:`summarize`, :func:`summary_columns`, :func:`row_groups`, :func:`merge_bases`,
  :func:`distinct_bases`, :func:`step_theorems`, :func:`stack_by_tanh`.
- :class:`KeySide`, :class:`RowGroup`, :class:`GroupCells`, :class:`LayerMeter`,
  :class:`StepMeter`, :data:`SUMMARY`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Final, final

import torch

from witcert_adapters.vllm_plugin.paged import StepLayout
from witcert_calculus.errors import InvalidValueError
from witcert_calculus.lean.theorems import SOFTMAX_TV_TANH_CONTRACT_SOUND, TV_EFORM_METER_SOUND, TV_TWO_SIDED_METER_SOUND
from witcert_calculus.meters.tv_forms import TVBasis, _issue_basis  # pyright: ignore[reportPrivateUsage]
from witcert_calculus.meters.witness import LogitBound, RopeLayout, tighter
from witcert_kernels.fused import Fp8Codes, fp8_logits_and_bound, tv_meter_rows
from witcert_kernels.meter import band_norms, exact_logit_bound, format_logit_bound, logit_bound, \
    round_up_f32, tv_meter_batch, tv_tanh_max_batch

__all__ = ["SUMMARY", "GroupCells", "KeySide", "LayerMeter", "RowGroup", "StepMeter",
           "distinct_bases", "merge_bases", "meter_layer", "meter_layers", "meter_step",
           "row_groups", "side_by_side", "stack_by_tanh", "step_theorems", "summarize",
           "summary_columns", "write_witnesses"]

_F64 = torch.float64

SUMMARY: Final = ("cells", "covered", "saturated", "nan", "worst", "worst_layer", "worst_head",
                  "worst_position", "by_tanh", "audited", "violations", "true_max",
                  "excess_max")
"""The columns of :attr:`StepMeter.summary`, one row per request of the step."""


def write_witnesses(incoming: torch.Tensor, stored: torch.Tensor, *, bands: int,
                    layout: RopeLayout) -> torch.Tensor:
    """Band witnesses ``||(k - k^)_b||`` of written keys, as float32 upper bounds.

    Args:
        incoming: ``[..., d]`` the keys the model computed.
        stored: ``[..., d]`` float64, the same keys as the cache holds them.
        bands: witness bands (0: an empty witness); ``layout``: the keys' rotary layout.

    Returns:
        ``[..., bands]`` float32, every entry >= the exact band norm of the residual.
    """
    if bands == 0:
        return torch.zeros((*incoming.shape[:-1], 0), dtype=torch.float32)
    residual = incoming.to(_F64) - stored
    return round_up_f32(band_norms(residual, bands=bands, layout=layout))


@final
@dataclass(frozen=True, slots=True)
class KeySide:
    """What one layer's meter reads of every request's visible keys.

    Attributes:
        keys: ``[R, kvh, S, d]`` float64 keys as the cache holds them (``None`` for the cheap
            form without audit).
        witnesses: ``[R, S, kvh, B]`` band witnesses (``None``: no bands kept).
        bounds: ``[R, kvh, S, d]`` per-channel format witnesses (``None``: not used).
        exact: ``[R, S, kvh, d]`` the unquantized keys (audit mode).
        codes: an fp8 cache's stored bytes of the visible keys with their values and format
            witnesses (:class:`~witcert_kernels.fused.Fp8Codes`): the logits and the format
            bound come from one compiled pass over the bytes
            (:func:`~witcert_kernels.fused.fp8_logits_and_bound`) instead of ``keys`` and
            ``bounds``.
        stored_exactly: for a cache that holds the model's keys exactly (a model-dtype
            cache), the computed truth of that premise (a ``bool`` or a 0-d boolean tensor):
            every logit bound is then 0 (:func:`~witcert_kernels.meter.exact_logit_bound`)
            and no witness is read; ``None`` otherwise.
    """

    keys: torch.Tensor | None
    witnesses: torch.Tensor | None
    bounds: torch.Tensor | None = None
    exact: torch.Tensor | None = None
    stored_exactly: object = None
    codes: Fp8Codes | None = None

    @property
    def has_keys(self) -> bool:
        """Whether the stored keys can be read (as float64 keys or as fp8 codes)."""
        return self.keys is not None or self.codes is not None

    @property
    def reads_queries(self) -> bool:
        """Whether the meter reads the queries' values: not for keys stored exactly without
        keys to meet them (every bound is 0 whatever the query: only its shape is read)."""
        return self.stored_exactly is None or self.has_keys


@final
@dataclass(frozen=True, slots=True)
class RowGroup:
    """Rows metered together: ``N`` requests with ``Q`` rows each.

    Attributes:
        requests: ``[N]`` request indices of the step.
        rows: ``[N, Q]`` the rows (indices into the step's rows), in position order.
        width: the group's rows see only tokens ``[0, width)`` (``None``: every token).
    """

    requests: torch.Tensor
    rows: torch.Tensor
    width: int | None = None


ROW_BLOCK: Final = 32
"""Rows of a prefill chunk metered together (one group)."""


def row_groups(step: StepLayout) -> list[RowGroup]:
    """Every decode row of the step in one group; the rows of each multi-row request in
    groups of :data:`ROW_BLOCK` consecutive rows, each with the width its last row sees."""
    q_lens = [int(q) for q in step.q_lens]
    starts = [0]
    for q in q_lens:
        starts.append(starts[-1] + q)
    single = [r for r, q in enumerate(q_lens) if q == 1]
    groups: list[RowGroup] = []
    if single:
        groups.append(RowGroup(torch.tensor(single), torch.tensor([[starts[r]] for r in single])))
    tokens = int(step.slots.shape[1])
    for r, q in enumerate(q_lens):
        if q == 1:  # in the decode group above
            continue
        for a in range(0, q, ROW_BLOCK):
            rows = torch.arange(starts[r] + a, starts[r] + min(q, a + ROW_BLOCK))
            seen = min(tokens, int(step.row_position[rows].max()) + 1)
            groups.append(RowGroup(torch.tensor([r]), rows.unsqueeze(0), seen))
    return groups


def _narrow(side: KeySide, width: int) -> KeySide:
    # The side's first ``width`` tokens of every request.
    def tokens(x: torch.Tensor | None, dim: int) -> torch.Tensor | None:
        return None if x is None else x.narrow(dim, 0, width)

    codes = None if side.codes is None else \
        replace(side.codes, start=side.codes.start[..., :width])
    return KeySide(tokens(side.keys, 2), tokens(side.witnesses, 1), tokens(side.bounds, 2),
                   tokens(side.exact, 1), side.stored_exactly, codes)


@final
@dataclass(frozen=True, slots=True)
class GroupCells:
    """One group's cells of one layer, kept for the repairing gate.

    Attributes:
        group: the rows.
        mask: ``[N, Q, S]`` each row's support (visible and causal).
        p: ``[N, kvh, G, Q, S]`` compressed attention ``p~``.
        c: ``[N, kvh, G, Q, S]`` the logit bounds (values of the established bound).
        meter: ``[N, kvh, G, Q]`` raw meters; ``eform``: the e-form alone.
    """

    group: RowGroup
    mask: torch.Tensor
    p: torch.Tensor
    c: torch.Tensor
    meter: torch.Tensor
    eform: torch.Tensor


@final
@dataclass(frozen=True, slots=True)
class LayerMeter:
    """One layer's metered cells.

    Attributes:
        meter: ``[T, H]`` raw meter values (report ``min(1, .)``).
        true_tv: ``[T, H]`` audited true TV (``None`` without audit keys).
        basis: what the layer's bounds rest on; ``theorems``: the Lean theorems of the forms
            its values came from.
        cells: per group, what the repairing gate needs (kept when asked).
        by_tanh: ``[T, H]`` whether a cell's value is ``tanh(max c)`` (the other forms: the
            meter ``min(e-form, two-sided)``); ``None``: no cell is.
    """

    meter: torch.Tensor
    true_tv: torch.Tensor | None
    basis: TVBasis
    theorems: tuple[str, ...]
    cells: tuple[GroupCells, ...] = ()
    by_tanh: torch.Tensor | None = None


@final
@dataclass(frozen=True, slots=True)
class StepMeter:
    """The metered step.

    Attributes:
        summary: ``[R, len(SUMMARY)]`` float64 per-request tallies (columns :data:`SUMMARY`).
        meter: ``[L, T, H]`` raw meter values (report ``min(1, .)``).
        basis: what every bound of the step rests on (its evidence, read once per step).
        theorems: the Lean theorems of the form reported.
    """

    summary: torch.Tensor
    meter: torch.Tensor
    basis: TVBasis
    theorems: tuple[str, ...]


def _segment_sum(x: torch.Tensor, index: torch.Tensor, n: int) -> torch.Tensor:
    return torch.zeros(n, dtype=_F64).index_add_(0, index, x.to(_F64))


def _segment_max(x: torch.Tensor, index: torch.Tensor, n: int) -> torch.Tensor:
    out = torch.full((n,), -torch.inf, dtype=_F64)
    return out.scatter_reduce(0, index, x.to(_F64), reduce="amax", include_self=True)


def summary_columns(meter: torch.Tensor, step: StepLayout, *, tau: float,
                    by_tanh: torch.Tensor | None = None) -> list[torch.Tensor]:
    """The first nine :data:`SUMMARY` columns of a step's raw meters ``[L, T, H]``, one entry
    per request: cells, covered (reported ``min(1, meter) <= tau``), saturated, NaN, the worst
    reported cell and its layer, head and position, and the cells whose value is
    ``tanh(max c)`` (``by_tanh`` ``[L, T, H]``; ``None``: none); the audit's four columns are
    the caller's."""
    n_layers, rows, heads = (int(n) for n in meter.shape)
    reported = torch.clamp(meter, max=1.0)
    cells_row = torch.full((rows,), float(n_layers * heads), dtype=_F64)
    covered_row = (reported <= tau).sum(dim=(0, 2))
    saturated_row = (meter >= 1.0).sum(dim=(0, 2))
    nan_row = torch.isnan(meter).sum(dim=(0, 2))
    flat = reported.nan_to_num(nan=2.0).permute(1, 0, 2).reshape(rows, n_layers * heads)
    row_max, row_arg = flat.max(dim=1)
    r, idx = step.requests, step.row_request
    req_max = _segment_max(row_max, idx, r)
    candidate = torch.where(row_max == req_max[idx], torch.arange(rows), rows)
    worst_row = torch.full((r,), rows, dtype=torch.int64).scatter_reduce(
        0, idx, candidate, reduce="amin", include_self=True)
    worst_arg = row_arg[worst_row]
    tanh_row = torch.zeros(rows, dtype=_F64) if by_tanh is None else by_tanh.sum(dim=(0, 2))
    return [_segment_sum(cells_row, idx, r), _segment_sum(covered_row, idx, r),
            _segment_sum(saturated_row, idx, r), _segment_sum(nan_row, idx, r), req_max,
            (worst_arg // heads).to(_F64), (worst_arg % heads).to(_F64),
            step.row_position[worst_row].to(_F64), _segment_sum(tanh_row, idx, r)]


def merge_bases(bases: Sequence[TVBasis]) -> TVBasis:
    """One basis for many bounds issued by the same code path: the same logit evidence,
    each premise the conjunction of its truths in the bases that state it (device tensors
    are combined on the device; a premise of a form only some bases used, e.g. the meter's
    in a cascade, is checked wherever it was computed), theorems cited by any.

    Raises:
        InvalidValueError: no basis, or bases from different paths (logit evidence or
            failure probability that differ).
    """
    if not bases:
        raise InvalidValueError("bases", 0, "at least one TV basis is needed")
    first = bases[0]
    for b in bases[1:]:
        if b.logit != first.logit or b.delta != first.delta:
            raise InvalidValueError("bases", "bounds of different paths",
                                    "must rest on the same evidence to be merged")
    truths: dict[str, list[object]] = {}
    also: dict[str, None] = {}
    for b in bases:
        for statement, truth in b.checks:
            truths.setdefault(statement, []).append(truth)
        also.update(dict.fromkeys(b.also))
    checks = tuple((statement, _all(t)) for statement, t in truths.items())
    return _issue_basis(checks=checks, logit=first.logit, delta=first.delta, also=tuple(also))


def _all(truths: Sequence[object]) -> object:
    out: Any = truths[0]
    for t in truths[1:]:
        out = out & t
    return out


def _group_logits(q: torch.Tensor, keys: torch.Tensor, scale: float) -> torch.Tensor:
    # q [N, kvh, G, Q, d], keys [N, kvh, S, d] -> [N, kvh, G, Q, S], one product per kv head
    n, kvh, g, qn, d = (int(x) for x in q.shape)
    flat = torch.matmul(q.reshape(n, kvh, g * qn, d), keys.transpose(-1, -2))
    return (scale * flat).view(n, kvh, g, qn, -1)


def _bound(q: torch.Tensor, side: KeySide, group: RowGroup, visible: torch.Tensor,
           mask: torch.Tensor, *, scale: float, layout: RopeLayout, per_token: bool,
           fused: LogitBound[torch.Tensor] | None = None) -> LogitBound[torch.Tensor]:
    # The group's established logit bound: 0 for keys stored exactly; else bands, format
    # (``fused``: computed with the logits from the fp8 codes), or per token the smaller.
    req = group.requests
    if side.stored_exactly is not None:
        # every token's bound is the same 0: tanh(max c) needs one column of it, the meter
        # (weighted by p~) one per visible token
        return exact_logit_bound(q, int(mask.shape[-1]) if per_token else 1, scale=scale,
                                 stored_exactly=side.stored_exactly)
    parts: list[LogitBound[torch.Tensor]] = []
    if side.witnesses is not None and int(side.witnesses.shape[-1]) > 0:
        w = side.witnesses[req].permute(0, 2, 1, 3).unsqueeze(2).unsqueeze(3)  # [N,kvh,1,1,S,B]
        w = torch.where(mask.view(*mask.shape[:1], 1, 1, *mask.shape[1:], 1), w.to(_F64), 0.0)
        parts.append(logit_bound(q, w, scale=scale, layout=layout))
    if fused is not None:
        parts.append(fused)
    if side.bounds is not None:
        # tokens no row of the request sees carry no witness; causally masked tokens of a
        # chunk keep theirs (true bounds; p~ is 0 there, so only tanh(max c) sees them)
        wf = torch.where(visible[req].view(-1, 1, int(visible.shape[1]), 1),
                         side.bounds[req], 0.0)
        parts.append(format_logit_bound(q, wf, scale=scale))
    if not parts:
        raise InvalidValueError("witnesses", None, "the meter needs band witnesses, format "
                                "witnesses, or both")
    return parts[0] if len(parts) == 1 else tighter(parts[0], parts[1])


_TANH: Final = (SOFTMAX_TV_TANH_CONTRACT_SOUND,)
_METER: Final = (TV_EFORM_METER_SOUND, TV_TWO_SIDED_METER_SOUND)


def meter_layer(step: StepLayout, *, queries: torch.Tensor, side: KeySide, kv_heads: int,
                scale: float, layout: RopeLayout, form: str = "meter",
                groups: Sequence[RowGroup] | None = None, keep: bool = False,
                tau: float | None = None) -> LayerMeter:
    """Meter every (row, head) cell of one layer.

    Args:
        step: the step's rows and visible slots.
        queries: ``[T, H, d]`` the layer's live post-RoPE queries.
        side: the keys' side (:class:`KeySide`); ``kv_heads``: kv heads of the layer.
        scale: the softmax scale; ``layout``: the rotary layout.
        form: ``"meter"`` (``min(e-form, two-sided)``, needs ``side.keys``), ``"tanh"``
            (``tanh(max c)``; keys only for the audit) or ``"cascade"``: ``tanh(max c)``
            where it is already ``<= tau``, elsewhere the smaller of it and the meter (keys
            only where some cell needs the meter; every cell's form is kept in
            :attr:`LayerMeter.by_tanh`).
        groups: :func:`row_groups` of the step (computed when not given).
        keep: keep each group's ``p~`` and ``c`` (:attr:`LayerMeter.cells`, for the gate).
        tau: the coverage threshold (the cascade's switch; needed by it only).

    Returns:
        The :class:`LayerMeter`.

    Raises:
        InvalidValueError: the meter form without keys (the cascade: a cell that needs the
            meter without keys), no witness at all, or the cascade without ``tau``.
    """
    rows, heads, dim = (int(n) for n in queries.shape)
    grp = heads // kv_heads
    if form == "meter" and not side.has_keys:
        raise InvalidValueError("keys", None, "the meter form needs the stored keys")
    if form == "cascade" and tau is None:
        raise InvalidValueError("tau", None, "the cascade needs the coverage threshold")
    full = int(step.slots.shape[1])
    meter = torch.zeros(rows, heads, dtype=_F64)
    true_tv = None if side.exact is None or not side.has_keys else \
        torch.zeros(rows, heads, dtype=_F64)
    by_tanh = None if form == "meter" else torch.ones(rows, heads, dtype=torch.bool)
    bases: list[TVBasis] = []
    kept: list[GroupCells] = []
    theorems: dict[str, None] = dict.fromkeys(_TANH if form != "meter" else _METER)
    for group in (row_groups(step) if groups is None else groups):
        req, idx = group.requests, group.rows
        n, qn = (int(x) for x in idx.shape)
        # the tokens the group's rows can see (all of them for the gate's cells)
        width = full if keep or group.width is None else group.width
        gside = side if width == full else _narrow(side, width)
        visible = step.visible[:, :width]
        j = torch.arange(width)
        if gside.reads_queries:
            q = queries[idx].to(_F64).view(n, qn, kv_heads, grp, dim).permute(0, 2, 3, 1, 4)
        else:  # the shape alone (no copy)
            q = torch.zeros((), dtype=_F64).expand(n, kv_heads, grp, qn, dim)
        mask = visible[req].unsqueeze(1) & \
            (j.view(1, 1, width) <= step.row_position[idx].unsqueeze(-1))  # [N, Q, S]
        fused_logits = fused = None
        if gside.codes is not None:  # fp8 bytes: the logits and the format bound in one pass
            fused_logits, fused = fp8_logits_and_bound(q, gside.codes, req, visible[req],
                                                       scale=scale)
        c = _bound(q, gside, group, visible, mask, scale=scale, layout=layout,
                   per_token=form == "meter" or keep, fused=fused)
        th = need = raw = eform = None
        if form != "meter":
            th, basis = tv_tanh_max_batch(c)
            bases.append(basis)
            raw = eform = th
            if form == "cascade":
                assert tau is not None
                need = th > tau
                if not bool(need.any()):  # no cell's verdict can change: no meter
                    need = None
        metered = form == "meter" or need is not None
        # the fp8 pass's logits are metered by the compiled meter, without p~ (kept for the
        # gate, or for the audit's true TV, it is made as well)
        compiled = metered and fused_logits is not None and not keep
        p = None
        if gside.has_keys and ((metered and not compiled) or gside.exact is not None):
            logits = fused_logits if fused_logits is not None else \
                _group_logits(q, _keys(gside)[req], scale)
            p = torch.softmax(logits.masked_fill(~mask.view(n, 1, 1, qn, width), -torch.inf),
                              dim=-1)
        if metered:
            if p is None and not compiled:
                raise InvalidValueError("keys", None, "cells above tau need the meter, which "
                                        "needs the stored keys")
            if int(c.values.shape[-1]) != width:  # the meter weighs every token's bound
                c = _bound(q, gside, group, visible, mask, scale=scale, layout=layout,
                           per_token=True, fused=fused)
            # a row that sees one token has TV exactly 0 (Lean WitCert.Meters.tv_single_token)
            if compiled:
                assert fused_logits is not None
                bounds = tv_meter_rows(fused_logits, c, mask)
            else:
                assert p is not None
                bounds = tv_meter_batch(p, c, check=False,
                                        visible=mask.sum(dim=-1).view(n, 1, 1, qn))
            bases.append(bounds.basis)
            theorems.update(dict.fromkeys(_METER))
            raw, eform = bounds.meter, bounds.eform
            if th is not None and need is not None:
                use_tanh = ~need | (th <= raw)
                raw = torch.where(use_tanh, th, raw)
                assert by_tanh is not None
                by_tanh[idx] = use_tanh.permute(0, 3, 1, 2).reshape(n, qn, heads)
        assert raw is not None and eform is not None
        meter[idx] = raw.permute(0, 3, 1, 2).reshape(n, qn, heads)
        if true_tv is not None and p is not None:
            assert gside.exact is not None
            exact = _group_logits(q, gside.exact[req].permute(0, 2, 1, 3).to(_F64), scale)
            p_true = torch.softmax(exact.masked_fill(~mask.view(n, 1, 1, qn, width), -torch.inf),
                                   dim=-1)
            tv = 0.5 * (p_true - p).abs().sum(dim=-1)
            true_tv[idx] = tv.permute(0, 3, 1, 2).reshape(n, qn, heads)
        if keep and p is not None:
            kept.append(GroupCells(group, mask, p, c.values, raw, eform))
    return LayerMeter(meter, true_tv, merge_bases(bases), tuple(theorems), tuple(kept), by_tanh)


def _keys(side: KeySide) -> torch.Tensor:
    assert side.keys is not None
    return side.keys


def side_by_side(side: KeySide) -> KeySide:
    """The key sides of ``L`` layers, each field stacked ``[L, ...]``, as the side of one layer
    whose kv heads are theirs side by side (layer-major: ``L * kvh`` heads), so that
    :func:`meter_layer` meters every layer in one pass (:func:`meter_layers`)."""
    def heads(x: torch.Tensor | None) -> torch.Tensor | None:  # [L, R, kvh, S, .]
        if x is None:
            return None
        n, r, _, width, last = (int(k) for k in x.shape)
        return x[0] if n == 1 else x.transpose(0, 1).reshape(r, -1, width, last)

    def slots(x: torch.Tensor | None) -> torch.Tensor | None:  # [L, R, S, kvh, .]
        if x is None:
            return None
        n, r, width, _, last = (int(k) for k in x.shape)
        return x[0] if n == 1 else x.permute(1, 2, 0, 3, 4).reshape(r, width, -1, last)

    return KeySide(heads(side.keys), slots(side.witnesses), heads(side.bounds),
                   slots(side.exact), side.stored_exactly, side.codes)


def meter_layers(step: StepLayout, *, queries: torch.Tensor, side: KeySide, kv_heads: int,
                 scale: float, layout: RopeLayout, form: str = "meter",
                 groups: Sequence[RowGroup] | None = None, tau: float | None = None
                 ) -> list[LayerMeter]:
    """Meter ``L`` layers in one pass: their heads side by side (:func:`side_by_side`), one
    :func:`meter_layer` call, the result split back per layer (sharing one basis).

    Args:
        queries: ``[L, T, H, d]``; ``side``: the layers' sides stacked (see
            :func:`side_by_side`); ``kv_heads``: per layer; the rest as :func:`meter_layer`.
    """
    n, rows, heads, dim = (int(k) for k in queries.shape)
    q = queries[0] if n == 1 else queries.transpose(0, 1).reshape(rows, n * heads, dim)
    m = meter_layer(step, queries=q, side=side_by_side(side), kv_heads=n * kv_heads,
                    scale=scale, layout=layout, form=form, groups=groups, tau=tau)

    def part(x: torch.Tensor | None, k: int) -> torch.Tensor | None:
        return None if x is None else x[:, k * heads:(k + 1) * heads]

    return [LayerMeter(m.meter[:, k * heads:(k + 1) * heads], part(m.true_tv, k), m.basis,
                       m.theorems, (), part(m.by_tanh, k)) for k in range(n)]


def distinct_bases(layers: Sequence[LayerMeter]) -> list[TVBasis]:
    """The layers' bases, each once (layers metered in one pass share theirs)."""
    return list({id(m.basis): m.basis for m in layers}.values())


def meter_step(step: StepLayout, *, queries: torch.Tensor, sides: Sequence[KeySide],
               kv_heads: int, scale: float, layout: RopeLayout, tau: float,
               form: str = "meter") -> StepMeter:
    """Meter every layer of a step (:func:`meter_layer` per layer) and summarize it.

    Args:
        queries: ``[L, T, H, d]``; ``sides``: one :class:`KeySide` per layer; the rest as
            :func:`meter_layer`; ``tau``: the coverage threshold.
    """
    groups = row_groups(step)
    layers = [meter_layer(step, queries=queries[i], side=side, kv_heads=kv_heads, scale=scale,
                          layout=layout, form=form, groups=groups, tau=tau)
              for i, side in enumerate(sides)]
    meter = torch.stack([m.meter for m in layers])
    audited = [m.true_tv for m in layers]
    true_tv = None if any(t is None for t in audited) else \
        torch.stack([t for t in audited if t is not None])
    return StepMeter(summarize(meter, true_tv, step, tau=tau, by_tanh=stack_by_tanh(layers)),
                     meter, merge_bases(distinct_bases(layers)), step_theorems(layers))


def stack_by_tanh(layers: Sequence[LayerMeter]) -> torch.Tensor | None:
    """``[L, T, H]``: which cells of the layers report ``tanh(max c)`` (``None``: none)."""
    if all(m.by_tanh is None for m in layers):
        return None
    return torch.stack([torch.zeros_like(m.meter, dtype=torch.bool) if m.by_tanh is None
                        else m.by_tanh for m in layers])


def step_theorems(layers: Sequence[LayerMeter]) -> tuple[str, ...]:
    """The Lean theorems of the forms the layers' values came from (in a stable order)."""
    cited = {t for m in layers for t in m.theorems}
    return tuple(t for t in (*_TANH, *_METER) if t in cited)


def summarize(meter: torch.Tensor, true_tv: torch.Tensor | None, step: StepLayout, *,
              tau: float, by_tanh: torch.Tensor | None = None) -> torch.Tensor:
    """The step's :data:`SUMMARY` rows from its raw meters ``[L, T, H]`` and, with audit, the
    true TV ``[L, T, H]`` (one row per request); ``by_tanh`` as :func:`summary_columns`."""
    columns = summary_columns(meter, step, tau=tau, by_tanh=by_tanh)
    r, idx = step.requests, step.row_request
    if true_tv is None:
        zeros = torch.zeros(r, dtype=_F64)
        columns += [zeros, zeros, zeros, zeros]
    else:
        excess = true_tv - torch.clamp(meter, max=1.0)
        columns += [columns[0],  # every cell is audited
                    _segment_sum((excess > 0).sum(dim=(0, 2)), idx, r),
                    _segment_max(true_tv.amax(dim=(0, 2)), idx, r),
                    _segment_max(excess.amax(dim=(0, 2)), idx, r)]
    return torch.stack(columns, dim=1)
