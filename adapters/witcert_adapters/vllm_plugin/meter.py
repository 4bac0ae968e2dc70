"""One engine step metered at once: every layer, head and query row of every request.

The plugin captures, per layer, the step's queries and the keys it wrote; at the end of
the step everything is evaluated in one batch over ``[layers, rows, heads]`` (no host loop
over layers, tokens or requests):

1. write side: the witness of each written slot is the band norm of the residual between
   the incoming key and the key as the cache holds it (:func:`write_witnesses`);
2. read side: for every row, over its request's visible tokens (block table -> slots,
   causal within a prefill chunk), the Tier-A logit bound
   ``c_t = scale * sum_b ||q_b|| w_{t,b}`` from the stored witnesses and the live query
   (an established :class:`~witcert_calculus.witness.LogitBound`), the compressed
   attention ``p~`` recomputed from the stored keys in float64, and the TV meter
   ``min(e-form, two-sided)`` of :func:`witcert_kernels.meter.tv_bounds_batch` (or, in the
   cheap form, ``tanh(max c)`` of :func:`witcert_kernels.meter.tv_tanh_max_batch`, which
   needs neither keys nor ``p~``);
3. with audit keys, the true ``TV(p, p~)`` against exact attention on the unquantized keys;
4. per request, the step's tallies, packed in one float64 tensor (one host read per step).

Main declarations
-----------------
- :func:`write_witnesses`, :func:`meter_rows`, :func:`summary_columns`, :class:`StepMeter`,
  :data:`SUMMARY`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, final

import torch

from witcert_adapters.vllm_plugin.paged import StepLayout
from witcert_calculus.errors import InvalidValueError
from witcert_calculus.tv_forms import TVBasis
from witcert_calculus.witness import RopeLayout
from witcert_calculus.theorems import SOFTMAX_TV_TANH_SOUND, TV_EFORM_SOUND, TV_TWO_SIDED_SOUND
from witcert_kernels.meter import band_norms, logit_bound, round_up_f32, tv_bounds_batch, \
    tv_tanh_max_batch

__all__ = ["SUMMARY", "StepMeter", "meter_rows", "summary_columns", "write_witnesses"]

_F64 = torch.float64

SUMMARY: Final = ("cells", "covered", "saturated", "nan", "worst", "worst_layer", "worst_head",
                  "worst_position", "audited", "violations", "true_max", "excess_max")
"""The columns of :attr:`StepMeter.summary`, one row per request of the step."""


def write_witnesses(incoming: torch.Tensor, stored: torch.Tensor, *, bands: int,
                    layout: RopeLayout) -> torch.Tensor:
    """Band witnesses ``||(k - k^)_b||`` of written keys, as float32 upper bounds.

    Args:
        incoming: ``[..., d]`` the keys the model computed.
        stored: ``[..., d]`` float64, the same keys as the cache holds them.
        bands: witness bands; ``layout``: the rotary pair layout of the keys.

    Returns:
        ``[..., bands]`` float32, every entry >= the exact band norm of the residual.
    """
    residual = incoming.to(_F64) - stored
    return round_up_f32(band_norms(residual, bands=bands, layout=layout))


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


def _by_row(per_request: torch.Tensor, step: StepLayout) -> torch.Tensor:
    # [L, R, ...] -> [L, T, ...]; a decode-only step (one row per request, in order) needs
    # no row gather.
    return per_request if step.rows == step.requests else per_request[:, step.row_request]


def summary_columns(meter: torch.Tensor, step: StepLayout, *, tau: float) -> list[torch.Tensor]:
    """The first eight :data:`SUMMARY` columns of a step's raw meters ``[L, T, H]``, one entry
    per request: cells, covered (reported ``min(1, meter) <= tau``), saturated, NaN, the worst
    reported cell and its layer, head and position (the audit's four columns are the
    caller's)."""
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
    return [_segment_sum(cells_row, idx, r), _segment_sum(covered_row, idx, r),
            _segment_sum(saturated_row, idx, r), _segment_sum(nan_row, idx, r), req_max,
            (worst_arg // heads).to(_F64), (worst_arg % heads).to(_F64),
            step.row_position[worst_row].to(_F64)]


def meter_rows(step: StepLayout, *, queries: torch.Tensor, keys: torch.Tensor | None,
               witnesses: torch.Tensor, scale: float, layout: RopeLayout, tau: float,
               exact_keys: torch.Tensor | None = None, form: str = "meter") -> StepMeter:
    """Meter every (layer, row, head) cell of one step.

    Args:
        step: the step's rows and visible slots.
        queries: ``[L, T, H, d]`` the live post-RoPE queries.
        keys: ``[L, R, kvh, S, d]`` float64 stored keys of each request's visible tokens
            (:func:`~witcert_adapters.vllm_plugin.paged.visible_keys`).
        witnesses: ``[L, R, S, kvh, B]`` their band witnesses.
        scale: the softmax scale; ``layout``: the rotary layout; ``tau``: coverage threshold.
        exact_keys: ``[L, R, S, kvh, d]`` unquantized keys (audit mode).
        form: ``"meter"`` (``min(e-form, two-sided)``, needs ``keys``) or ``"tanh"``
            (``tanh(max c)``; ``keys`` only with ``exact_keys``, for the audit).

    Returns:
        The :class:`StepMeter`.
    """
    n_layers, rows, heads, dim = queries.shape
    kvh = int(witnesses.shape[3])
    group = heads // kvh
    width = int(step.slots.shape[1])
    q = queries.to(_F64).view(n_layers, rows, kvh, group, dim)
    j = torch.arange(width)
    causal = step.visible[step.row_request] & (j.unsqueeze(0) <= step.row_position.unsqueeze(1))
    mask = causal.view(1, rows, 1, 1, width)  # [1, T, 1, 1, S]
    p_tilde = None
    if keys is not None:
        logits = scale * torch.matmul(q, _by_row(keys, step).transpose(-1, -2))  # [L,T,kvh,G,S]
        p_tilde = torch.softmax(logits.masked_fill(~mask, -torch.inf), dim=-1)
    w_rows = _by_row(witnesses.permute(0, 1, 3, 2, 4), step).unsqueeze(3)
    w_rows = torch.where(mask.unsqueeze(-1), w_rows.to(_F64), 0.0)  # [L, T, kvh, 1, S, B]
    c = logit_bound(q, w_rows, scale=scale, layout=layout)
    if form == "tanh":
        raw, basis = tv_tanh_max_batch(c)
        theorems: tuple[str, ...] = (SOFTMAX_TV_TANH_SOUND,)
    else:
        if p_tilde is None:
            raise InvalidValueError("keys", None, "the meter form needs the stored keys")
        # a row that sees one token has TV exactly 0 (Lean WitCert.Meters.tv_single_token)
        visible = causal.sum(dim=-1).view(rows, 1, 1)
        bounds = tv_bounds_batch(p_tilde, c, check=False, visible=visible)
        raw, basis = bounds.meter, bounds.basis
        theorems = (TV_EFORM_SOUND, TV_TWO_SIDED_SOUND)
    meter = raw.reshape(n_layers, rows, heads)
    reported = torch.clamp(meter, max=1.0)
    columns = summary_columns(meter, step, tau=tau)
    r, idx = step.requests, step.row_request
    cells = columns[0]
    if exact_keys is None or p_tilde is None:
        zeros = torch.zeros(r, dtype=_F64)
        columns += [zeros, zeros, zeros, zeros]
    else:
        k_exact = _by_row(exact_keys.permute(0, 1, 3, 2, 4), step).to(_F64)
        exact_logits = scale * torch.matmul(q, k_exact.transpose(-1, -2))
        p = torch.softmax(exact_logits.masked_fill(~mask, -torch.inf), dim=-1)
        true_tv = (0.5 * (p - p_tilde).abs().sum(dim=-1)).reshape(n_layers, rows, heads)
        excess = true_tv - reported
        columns += [cells,  # every cell is audited
                    _segment_sum((excess > 0).sum(dim=(0, 2)), idx, r),
                    _segment_max(true_tv.amax(dim=(0, 2)), idx, r),
                    _segment_max(excess.amax(dim=(0, 2)), idx, r)]
    return StepMeter(torch.stack(columns, dim=1), meter, basis, theorems)
