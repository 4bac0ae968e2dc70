"""Hugging Face transformers attachment: a witnessing Cache and read-side hooks.

Attachment uses only public APIs: :class:`WitnessCache` subclasses
:class:`transformers.DynamicCache` and overrides ``update`` (the write path), and the
read side uses ``register_forward_pre_hook`` / ``register_forward_hook`` on the
attention modules. No model source is patched.

Write time (``WitnessCache.update``): the registered scheme compresses the new entries;
the model reads the compressed ones. The cache records, per token and kv head, band
witnesses ``w_{t,b} = ||(k_hat - k)_b||`` of every slot that enters the logits (rounded
up to float32), and for dense memories the value residual ``rho_t`` and exact value norm.

Read time (hooks on each attention module): the pre-hook recomputes the layer's
post-RoPE queries from its own projections and rotary tables; the forward hook takes the
attention probabilities ``p_tilde`` the layer actually used (eager attention returns
them) and evaluates the Tier-A meter for every (layer, head, query position) cell. With
``audit=True`` the exact keys are kept as well and the true TV against exact attention is
computed in float64 for every cell (used by the acceptance gate's soundness stage).

Tier B (probabilistic), for a scheme with a dithered key store (``dither_int8``): the
cache also records each token's float16 block scales ``s_{b,t}`` as stored, and when the
probe is given a :class:`~witcert_calculus.ledger.RiskLedger`, every forward call of the
model is one probabilistic event of the request's account. Before the call the probe asks
the ledger for the next telescoping allowance ``delta_i`` (``next_allowance``); inside,
each (layer, head, query row) cell gets ``delta_loc = delta_i / (L H rows)`` (rounded
down), the sub-Gaussian radius ``u_t = sqrt(2 varsigma_t^2 log(2 S_row / delta_loc))`` with
``varsigma_t^2 = scale^2 sum_b s_{b,t}^2 ||q_b||^2 / 12`` over the row's ``S_row`` visible
tokens, plus the deterministic ``scale ||q|| ||fl(x_hat_t) - x_hat_t||`` of rounding the
float64 reconstruction to the model's dtype, and the same TV forms as Tier A with ``c_t = u_t`` (plus the Tier-A bound of any
logit part whose slot is not dithered, e.g. the rope part of a latent cache). After the
call the forward's worst cell becomes one ``Reading`` with ``delta = delta_i``, admitted
with ``RiskLedger.admit`` (the ledger charges ``delta_i``; after ``n`` forwards the spend is
``delta_req (1 - 1/(n+1))``). By the union bound every cell of the forward holds except
with probability ``delta_i``. The certificate is scoped to non-adaptive queries (queries
independent of the layer's dither stream: a teacher-forced or fixed token sequence, where
a layer's queries depend only on other layers' streams); the deterministic Tier-A meter is
the adaptive-safe one and is always reported next to it.

No per-layer host synchronisation: results stay as tensors until :meth:`Probe.result`
(Tier B syncs once per forward call, to admit the forward's reading).

Main declarations
-----------------
- :class:`WitnessCache`: the write path.
- :class:`Probe`: attaches hooks, owns the cache, collects a :class:`LiveRun`.
- :class:`LiveRun`: per-layer arrays of witnesses, meters and (audited) true errors.
- :class:`TierBEvent`: one forward's probabilistic certificate and its ledger admission.
- :func:`attach`: context manager around :class:`Probe`.
"""

from __future__ import annotations

from collections.abc import Generator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any, final

import numpy as np
import numpy.typing as npt
import torch
from transformers import DynamicCache

from witcert_adapters.architectures import ArchSpec, spec_for
from witcert_adapters.schemes import Scheme, WriteContext, get_scheme
from witcert_calculus.contracts import Reading
from witcert_calculus.dither import GRID_MEAN, NON_ADAPTIVE
from witcert_calculus.errors import InvalidValueError
from witcert_calculus.ledger import Admission, RiskLedger
from witcert_calculus.metrics import AtConsume, AttentionTV
from witcert_calculus.theorems import DITHER_LOGIT_TAIL, TV_EFORM_SOUND, TV_TWO_SIDED_SOUND
from witcert_calculus.tiers import Composition, Premise, Proof, Restricted
from witcert_kernels.meter import band_norms, l2_norm, logit_bound, round_up_f32, tv_bounds

__all__ = ["LayerLog", "LiveRun", "Probe", "TierBEvent", "WitnessCache", "attach"]


FloatArray = npt.NDArray[np.float64]


def _tensors() -> list[torch.Tensor]:
    return []


def _nested() -> list[list[torch.Tensor]]:
    return []


@dataclass(slots=True)
class LayerLog:
    """Mutable per-layer accumulator (one per layer; never shared between layers)."""

    writes: int = 0
    reads: int = 0
    witnesses: list[list[torch.Tensor]] = field(default_factory=_nested)  # per part, per write
    exact: list[list[torch.Tensor]] = field(default_factory=_nested)  # per slot, per write (audit)
    value_res: list[torch.Tensor] = field(default_factory=_tensors)
    value_norm: list[torch.Tensor] = field(default_factory=_tensors)
    meter: list[torch.Tensor] = field(default_factory=_tensors)  # [B, H, Q] raw min-form
    one_sided: list[torch.Tensor] = field(default_factory=_tensors)
    two_sided: list[torch.Tensor] = field(default_factory=_tensors)
    c_max: list[torch.Tensor] = field(default_factory=_tensors)
    out_bound: list[torch.Tensor] = field(default_factory=_tensors)
    true_tv: list[torch.Tensor] = field(default_factory=_tensors)
    true_out: list[torch.Tensor] = field(default_factory=_tensors)
    positions: list[torch.Tensor] = field(default_factory=_tensors)
    witness_full: list[torch.Tensor] = field(default_factory=_tensors)  # ||k_hat - k|| per token
    q_norm: list[torch.Tensor] = field(default_factory=_tensors)  # max query norm per call
    last_p: torch.Tensor | None = None  # p_tilde of the most recent query row [B, H, S]
    last_c: torch.Tensor | None = None  # c of the most recent query row [B, H, S]
    dither_scales: list[torch.Tensor] = field(default_factory=_tensors)  # [B, Hkv, S, nb] fp16
    dither_block: int = 0
    dither_cast: list[torch.Tensor] = field(default_factory=_tensors)  # ||fl(x_hat) - x_hat||
    tier_b: list[torch.Tensor] = field(default_factory=_tensors)  # [B, H, Q] raw min-form
    tier_b_dloc: list[torch.Tensor] = field(default_factory=_tensors)  # [Q] delta_loc per row
    last_u: torch.Tensor | None = None  # Tier-B c (radius + undithered parts), last row [B, H, S]


class WitnessCache(DynamicCache):
    """A :class:`~transformers.DynamicCache` that compresses on write and records witnesses.

    Args:
        config: the model config (layer types are taken from it, as ``DynamicCache`` does).
        spec: the architecture's attention-memory layout (``None`` for a model without
            attention layers, e.g. a pure recurrent one; an attention write then raises).
        scheme: compression scheme, or ``None`` to store entries untouched and record nothing
            (the adapter switched off).
        request_id: keys the dither stream of randomised schemes.
        audit: keep exact entries too (needed for the soundness stage of the gate).
    """

    def __init__(self, *, config: Any, spec: ArchSpec | None, scheme: Scheme | None,
                 request_id: int = 0, audit: bool = False) -> None:
        super().__init__(config=config)
        self.spec = spec
        self.scheme = scheme
        self.request_id = request_id
        self.audit = audit
        self.logs: dict[int, LayerLog] = {}

    def log(self, layer: int) -> LayerLog:
        """Return layer ``layer``'s accumulator, creating it on first use."""
        entry = self.logs.get(layer)
        if entry is None:
            entry = LayerLog()
            self.logs[layer] = entry
        return entry

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Compress the new entries, record their witnesses, then store them as usual."""
        if self.scheme is None:
            return super().update(  # pyright: ignore[reportUnknownMemberType]
                key_states, value_states, layer_idx, *args, **kwargs)
        spec = self.spec
        if spec is None:
            raise InvalidValueError("spec", None, f"layer {layer_idx} wrote attention entries but "
                                    "the cache has no registered attention layout")
        start = self.get_seq_length(layer_idx) if layer_idx < len(self.layers) else 0
        slots = (key_states, value_states)
        roles = ("key", "value")
        log = self.log(layer_idx)
        ctxs = [WriteContext(self.request_id, layer_idx, start, role) for role in roles]
        if self.scheme.dithered is not None:
            enc = self.scheme.encode_keys(key_states, ctxs[0])
            log.dither_scales.append(enc.scales)
            log.dither_block = enc.block_size
            k_hat = enc.x_hat.to(key_states.dtype)
            # The model reads the reconstruction rounded to its dtype; that rounding is not
            # dither noise, so it enters the Tier-B bound as a deterministic witness.
            log.dither_cast.append(round_up_f32(l2_norm(k_hat.to(torch.float64) - enc.x_hat)))
            hats = (k_hat, self.scheme(value_states, ctxs[1]))
        else:
            hats = (self.scheme(key_states, ctxs[0]), self.scheme(value_states, ctxs[1]))
        if not log.witnesses:
            log.witnesses = [[] for _ in spec.parts]
            log.exact = [[], []]
        for i, part in enumerate(spec.parts):
            r = hats[part.slot].to(torch.float64) - slots[part.slot].to(torch.float64)
            log.witnesses[i].append(round_up_f32(band_norms(r, bands=part.bands, layout=part.layout)))
        first = spec.parts[0]
        r0 = hats[first.slot].to(torch.float64) - slots[first.slot].to(torch.float64)
        log.witness_full.append(round_up_f32(l2_norm(r0)))
        if spec.value_slot is not None:
            v, vh = slots[spec.value_slot], hats[spec.value_slot]
            rho = l2_norm(vh.to(torch.float64) - v.to(torch.float64))
            log.value_res.append(round_up_f32(rho))
            log.value_norm.append(round_up_f32(l2_norm(v.to(torch.float64))))
        if self.audit:
            log.exact[0].append(key_states.detach())
            log.exact[1].append(value_states.detach())
        log.writes += key_states.shape[-2]
        return super().update(  # pyright: ignore[reportUnknownMemberType]
            hats[0], hats[1], layer_idx, *args, **kwargs)


def _cat(xs: list[torch.Tensor], dim: int) -> torch.Tensor:
    return xs[0] if len(xs) == 1 else torch.cat(xs, dim=dim)


def _expand_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    # [B, Hkv, S, ...] -> [B, H, S, ...] (GQA: head h reads kv head h // groups).
    hkv = x.shape[1]
    if hkv == heads:
        return x
    return x.repeat_interleave(heads // hkv, dim=1)


@final
@dataclass(frozen=True, slots=True)
class TierBEvent:
    """One forward call's Tier-B certificate and its admission into the request ledger.

    Attributes:
        forward: 0-based index of the forward call within the request.
        delta: the telescoping allowance the certificate used (exact).
        rows: query rows the forward metered per layer and head.
        reading: the forward's worst cell as a probabilistic ``AttentionTV`` reading
            (``delta = delta``; its evidence carries the non-adaptive scope).
        admission: the ledger's acknowledgement (kind, charge, spend after it).
    """

    forward: int
    delta: Fraction
    rows: int
    reading: Reading[AttentionTV[AtConsume]]
    admission: Admission


def _float_down(x: Fraction) -> float:
    # The largest float not above x (delta_loc rounded down keeps the union bound sound).
    f = float(x)
    return f if Fraction(f) <= x else float(np.nextafter(f, 0.0))


def tier_b_evidence(delta_loc: float) -> Composition:
    """Evidence of a Tier-B reading: sub-Gaussian radius (non-adaptive) + the TV forms."""
    return Composition(
        (Restricted(Proof(DITHER_LOGIT_TAIL, (
            Premise("subtractive dither, xi regenerated from the same Philox stream", True),
            Premise(f"|eps_t| <= u_t for every visible token of every cell except with "
                    f"probability delta_loc <= {delta_loc!r} per cell (union bound)", True))),
            subset=NON_ADAPTIVE),
         Proof(TV_EFORM_SOUND, (Premise("c_t = u_t >= |eps_t| on the event above", True),)),
         Proof(TV_TWO_SIDED_SOUND, (Premise("c_t = u_t >= |eps_t| on the event above", True),))),
        theorem=TV_EFORM_SOUND, restriction=NON_ADAPTIVE)


@final
@dataclass(frozen=True, slots=True)
class LiveRun:
    """What one probed run observed, as numpy arrays (one entry per attention layer).

    Cells are indexed ``[batch, head, position]``; positions are absolute query positions.

    Attributes:
        scheme: the scheme's name.
        memory_class: ``"dense"`` or ``"latent"``.
        layers: the observed layer indices, sorted.
        declared: the ``(layer, path)`` pairs the probe declared it would observe.
        observed: the ``(layer, path)`` pairs that produced data.
        writes / reads: per-layer counters (tokens written, query rows metered).
        meter: per layer, raw min-form TV bound ``[B, H, T]`` (inf = overflow/saturation).
        one_sided / two_sided: the two forms behind :attr:`meter`.
        c_max: per layer, ``max_t c_t`` per cell (logit sup-norm bound).
        witness_max: per layer, the largest band witness seen.
        out_bound / true_out: per layer, attention-output bound and true error (dense only).
        true_tv: per layer, true TV against exact attention (audit only).
        positions: per layer, the positions ``[T]``.
        witness_full_max / q_norm_max: per layer, the largest full-residual witness of the
            first logit slot and the largest norm of its query (inputs of the coarse chain).
        last_p / last_c: per layer, ``p_tilde`` and ``c`` of the final query row ``[B, H, S]``.
        tier_b: per layer, raw Tier-B (probabilistic) min-form bound ``[B, H, T]``; empty
            unless the scheme is dithered and the probe was given a ledger.
        tier_b_delta_loc: per layer, the per-cell failure probability of each row ``[T]``.
        tier_b_events: one :class:`TierBEvent` per forward call, in order.
        last_u: per layer, the Tier-B per-token bound ``c_t`` of the final query row.
    """

    scheme: str
    memory_class: str
    layers: tuple[int, ...]
    declared: frozenset[tuple[int, str]]
    observed: frozenset[tuple[int, str]]
    writes: dict[int, int]
    reads: dict[int, int]
    meter: dict[int, FloatArray]
    one_sided: dict[int, FloatArray]
    two_sided: dict[int, FloatArray]
    c_max: dict[int, FloatArray]
    witness_max: dict[int, float]
    out_bound: dict[int, FloatArray]
    true_tv: dict[int, FloatArray]
    true_out: dict[int, FloatArray]
    positions: dict[int, npt.NDArray[np.int64]]
    witness_full_max: dict[int, float]
    q_norm_max: dict[int, float]
    last_p: dict[int, FloatArray]
    last_c: dict[int, FloatArray]
    tier_b: dict[int, FloatArray] = field(default_factory=dict[int, FloatArray])
    tier_b_delta_loc: dict[int, FloatArray] = field(default_factory=dict[int, FloatArray])
    tier_b_events: tuple[TierBEvent, ...] = ()
    last_u: dict[int, FloatArray] = field(default_factory=dict[int, FloatArray])

    def reported(self, layer: int) -> FloatArray:
        """The reported meter ``min(1, raw)`` of a layer."""
        return np.minimum(1.0, self.meter[layer])

    def reported_tier_b(self, layer: int) -> FloatArray:
        """The reported Tier-B bound ``min(1, raw)`` of a layer."""
        return np.minimum(1.0, self.tier_b[layer])


class Probe:
    """Attach the witnessing cache and read-side hooks to a transformers model.

    Args:
        model: a causal LM whose ``config.model_type`` has a registered layout and which
            runs with ``attn_implementation="eager"`` (the probabilities are read from it).
        scheme: a registered scheme name, or ``None`` for the adapter switched off.
        request_id: the request the run belongs to.
        audit: also compute the true TV against exact attention per cell.
        bands: witness bands for every rotary slot (default: the registered layout's, 4 for
            dense models); more bands give tighter bounds and larger witnesses.
        ledger: the request ledger; with a dithered scheme, every forward call becomes one
            Tier-B probabilistic event of ``request_id``'s (open) account, spending its
            telescoping allowance. ``None``: Tier A only.

    Raises:
        InvalidValueError: unknown scheme or model type, or a non-eager attention.

    Use :meth:`new_cache` for each forward/generate call sequence of one request, pass it
    as ``cache=``, then :meth:`result`. Call :meth:`close` (or use :func:`attach`).
    """

    def __init__(self, model: Any, *, scheme: str | None, request_id: int = 0,
                 audit: bool = False, bands: int | None = None,
                 ledger: RiskLedger | None = None) -> None:
        config = model.config
        spec = spec_for(config.model_type)
        if bands is not None:
            if bands < 1:
                raise InvalidValueError("bands", bands, "must be >= 1")
            spec = replace(spec, parts=tuple(replace(p, bands=bands) if p.bands > 1 else p
                                             for p in spec.parts))
        self.spec = spec
        impl = getattr(config, "_attn_implementation", None)
        if scheme is not None and impl != "eager":
            raise InvalidValueError("attn_implementation", impl,
                                    "must be 'eager' so attention probabilities can be read")
        self.model = model
        self.scheme = None if scheme is None else get_scheme(scheme)
        self.request_id = request_id
        self.audit = audit
        self.cache: WitnessCache | None = None
        self._pending: dict[int, tuple[tuple[torch.Tensor, ...], int]] = {}
        self._handles: list[Any] = []
        self.attention = self._find_attention(model)
        self.ledger = ledger
        self.tier_b = ledger is not None and self.scheme is not None \
            and self.scheme.dithered is not None
        if self.tier_b:
            assert ledger is not None
            ledger.require_known(request_id)
        self._event_delta: Fraction | None = None
        self._event_max: list[torch.Tensor] = []
        self._event_rows = 0
        self._events: list[TierBEvent] = []
        if self.tier_b:
            self._handles.append(model.register_forward_pre_hook(self._begin_event))
            self._handles.append(model.register_forward_hook(self._end_event))
        if self.scheme is not None:
            for layer, module in self.attention:
                self._handles.append(module.register_forward_pre_hook(
                    self._make_pre(layer), with_kwargs=True))
                self._handles.append(module.register_forward_hook(
                    self._make_post(layer), with_kwargs=True))

    @staticmethod
    def _find_attention(model: Any) -> list[tuple[int, Any]]:
        found: list[tuple[int, Any]] = []
        for module in model.modules():
            idx = getattr(module, "layer_idx", None)
            if isinstance(idx, int) and hasattr(module, "scaling") and type(module).__name__.endswith(
                    "Attention"):
                found.append((idx, module))
        return sorted(found, key=lambda t: t[0])

    def declared(self) -> frozenset[tuple[int, str]]:
        """The ``(layer, path)`` pairs this probe promises to observe."""
        paths = ["write", "read"] + (["audit"] if self.audit else []) + \
            (["tier_b"] if self.tier_b else [])
        return frozenset((layer, p) for layer, _ in self.attention for p in paths)

    def new_cache(self) -> WitnessCache:
        """A fresh :class:`WitnessCache` for one request; the probe reads from it."""
        return self.bind(WitnessCache(config=self.model.config, spec=self.spec,
                                      scheme=self.scheme, request_id=self.request_id,
                                      audit=self.audit))

    def bind(self, cache: WitnessCache) -> WitnessCache:
        """Read from ``cache`` (a fresh one of this request, e.g. a hybrid's shared cache)."""
        self.cache = cache
        self._pending.clear()
        self._events = []
        return cache

    def close(self) -> None:
        """Remove every hook this probe registered."""
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _begin_event(self, module: Any, args: Any) -> None:
        assert self.ledger is not None
        self._event_delta = self.ledger.next_allowance(self.request_id)
        self._event_max = []
        self._event_rows = 0

    def _end_event(self, module: Any, args: Any, output: Any) -> None:
        assert self.ledger is not None
        delta = self._event_delta
        self._event_delta = None
        if delta is None or not self._event_max:
            return
        raw = float(torch.stack(self._event_max).max())
        rows = self._event_rows
        dloc = _float_down(delta / (len(self.attention) * rows))
        reading = Reading(AttentionTV[AtConsume], raw, evidence=tier_b_evidence(dloc), delta=delta)
        admission = self.ledger.admit(self.request_id, reading)
        self._events.append(TierBEvent(len(self._events), delta, rows, reading, admission))

    def layer_key(self, layer: int) -> int:
        """The accumulator a layer's readings go to (the identity; a test overrides it)."""
        return layer

    def _make_pre(self, layer: int) -> Any:
        def pre(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            pos = kwargs.get("position_embeddings")
            cache = self.cache
            start = 0
            if cache is not None and layer < len(cache.layers):
                start = cache.get_seq_length(layer)
            with torch.no_grad():
                self._pending[layer] = (self.spec.queries(module, hidden, pos), start)
        return pre

    def _make_post(self, layer: int) -> Any:
        def post(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
            cache = self.cache
            if cache is None:
                raise InvalidValueError("cache", None, "call Probe.new_cache() and pass it as cache=")
            queries, start = self._pending.pop(layer)
            p_tilde = output[1]
            if p_tilde is None:
                raise InvalidValueError("attn_weights", None, "the attention returned no probabilities")
            with torch.no_grad():
                self._meter(layer, module, queries, start, p_tilde.detach(), cache)
        return post

    def _meter(self, layer: int, module: Any, queries: tuple[torch.Tensor, ...], start: int,
               p_tilde: torch.Tensor, cache: WitnessCache) -> None:
        src = cache.log(layer)
        log = cache.log(self.layer_key(layer))
        heads = p_tilde.shape[1]
        q_len = p_tilde.shape[2]
        scale = float(module.scaling)
        c = torch.zeros(p_tilde.shape, dtype=torch.float64)
        c_parts: list[torch.Tensor] = []
        for i, part in enumerate(self.spec.parts):
            w = _expand_heads(_cat(src.witnesses[i], dim=2), heads).unsqueeze(2)
            qb = band_norms(queries[i], bands=part.bands, layout=part.layout)
            c_parts.append(logit_bound(qb, w, scale=scale))
            c = c + c_parts[-1]
        bounds = tv_bounds(p_tilde, c, check=False)  # validated once per run by the gate
        if self.tier_b and self._event_delta is not None and src.dither_scales:
            self._tier_b(log, src, queries, c_parts, p_tilde, start, scale, heads)
        log.meter.append(bounds.meter)
        log.one_sided.append(bounds.one_sided)
        log.two_sided.append(bounds.two_sided)
        log.c_max.append(c.amax(dim=-1))
        log.positions.append(torch.arange(start, start + q_len))
        log.q_norm.append(l2_norm(queries[0].to(torch.float64)).amax())
        log.last_p = p_tilde[:, :, -1, :]
        log.last_c = c[:, :, -1, :]
        log.reads += q_len
        p64 = p_tilde.to(torch.float64)
        p64 = p64 / p64.sum(dim=-1, keepdim=True)
        if self.spec.value_slot is not None:
            rho = _expand_heads(_cat(src.value_res, dim=2), heads).to(torch.float64)
            vmax = _expand_heads(_cat(src.value_norm, dim=2), heads).to(torch.float64).amax(dim=-1)
            tv = torch.clamp(bounds.meter, max=1.0)
            log.out_bound.append(2.0 * tv * vmax.unsqueeze(-1) + torch.einsum("bhqs,bhs->bhq", p64, rho))
        if self.audit:
            self._audit(layer, log, src, queries, start, p64, cache, scale, heads)

    def _tier_b(self, log: LayerLog, src: LayerLog, queries: tuple[torch.Tensor, ...],
                c_parts: list[torch.Tensor], p_tilde: torch.Tensor, start: int, scale: float,
                heads: int) -> None:
        assert self._event_delta is not None
        q_len = p_tilde.shape[2]
        rows = heads * q_len
        # delta_loc = delta_i / (L * H * rows), rounded down; the union over this forward's
        # cells (every attention layer, head and query row) is at most delta_i.
        dloc = _float_down(self._event_delta / (len(self.attention) * rows))
        scales = _expand_heads(_cat(src.dither_scales, dim=2), heads).to(torch.float64)
        s2 = scales * scales  # [B, H, S, nb]
        visible = torch.arange(start + 1, start + q_len + 1, dtype=torch.float64)  # S_row
        log_term = torch.log(2.0 * visible / dloc)  # [Q]
        cb = torch.zeros(p_tilde.shape, dtype=torch.float64)
        for i, part in enumerate(self.spec.parts):
            if part.slot != 0:  # not dithered: its deterministic Tier-A part
                cb = cb + c_parts[i]
                continue
            q = queries[i].to(torch.float64)
            nb = s2.shape[-1]
            q2 = (q * q).reshape(*q.shape[:-1], nb, q.shape[-1] // nb).sum(dim=-1)  # [B,H,Q,nb]
            var = (scale * scale) * torch.einsum("bhqn,bhsn->bhqs", q2, s2) / 12.0
            cast = _expand_heads(_cat(src.dither_cast, dim=2), heads).to(torch.float64)
            q_norm = l2_norm(q)  # [B, H, Q]
            # The dither offset lies on a 2^-24 grid: the error's mean is at most
            # s * 2^-25 per channel, a deterministic term next to the centred radius.
            q_abs = q.abs().reshape(*q.shape[:-1], nb, q.shape[-1] // nb).sum(dim=-1)
            mean = scale * torch.einsum("bhqn,bhsn->bhqs", q_abs, scales) * GRID_MEAN \
                * (1.0 + 1e-12)
            cb = cb + torch.sqrt(2.0 * var * log_term.view(1, 1, -1, 1)) + mean \
                + scale * q_norm.unsqueeze(-1) * cast.unsqueeze(2)
        tb = tv_bounds(p_tilde, cb, check=False)
        log.tier_b.append(tb.meter)
        log.last_u = cb[:, :, -1, :]
        log.tier_b_dloc.append(torch.full((q_len,), dloc, dtype=torch.float64))
        self._event_max.append(tb.meter.amax())
        self._event_rows = q_len * heads

    def _audit(self, layer: int, log: LayerLog, src: LayerLog, queries: tuple[torch.Tensor, ...],
               start: int, p_model: torch.Tensor, cache: WitnessCache, scale: float,
               heads: int) -> None:
        exact_slots = [_cat(src.exact[s], dim=2) for s in (0, 1)]
        stored: Any = cache.layers[layer]
        hat_slots: list[torch.Tensor] = [stored.keys, stored.values]
        q_len = queries[0].shape[2]
        s_len = exact_slots[0].shape[2]
        logits = torch.zeros((queries[0].shape[0], heads, q_len, s_len), dtype=torch.float64)
        logits_hat = torch.zeros_like(logits)
        for i, part in enumerate(self.spec.parts):
            q = queries[i].to(torch.float64)
            k = _expand_heads(exact_slots[part.slot], heads).to(torch.float64)
            kh = _expand_heads(hat_slots[part.slot], heads).to(torch.float64)
            logits = logits + scale * torch.einsum("bhqd,bhsd->bhqs", q, k)
            logits_hat = logits_hat + scale * torch.einsum("bhqd,bhsd->bhqs", q, kh)
        qpos = torch.arange(start, start + q_len).unsqueeze(-1)
        masked = torch.arange(s_len).unsqueeze(0) > qpos
        logits = logits.masked_fill(masked, float("-inf"))
        logits_hat = logits_hat.masked_fill(masked, float("-inf"))
        p = torch.softmax(logits, dim=-1)
        ph = torch.softmax(logits_hat, dim=-1)
        log.true_tv.append(0.5 * (p - ph).abs().sum(dim=-1))
        if self.spec.value_slot is not None:
            v = _expand_heads(exact_slots[self.spec.value_slot], heads).to(torch.float64)
            vh = _expand_heads(hat_slots[self.spec.value_slot], heads).to(torch.float64)
            y = torch.einsum("bhqs,bhsd->bhqd", p, v)
            yh = torch.einsum("bhqs,bhsd->bhqd", ph, vh)
            log.true_out.append(l2_norm(y - yh))
        del p_model

    def result(self) -> LiveRun:
        """Collect what the current cache observed into a :class:`LiveRun`."""
        cache = self.cache
        if cache is None or self.scheme is None:
            raise InvalidValueError("probe", "detached", "nothing observed: no scheme or no cache")
        observed: set[tuple[int, str]] = set()

        def cat_np(xs: list[torch.Tensor]) -> FloatArray:
            return _cat(xs, dim=-1).to(torch.float64).numpy()

        meter: dict[int, FloatArray] = {}
        one: dict[int, FloatArray] = {}
        two: dict[int, FloatArray] = {}
        cmax: dict[int, FloatArray] = {}
        wmax: dict[int, float] = {}
        ob: dict[int, FloatArray] = {}
        ttv: dict[int, FloatArray] = {}
        tout: dict[int, FloatArray] = {}
        pos: dict[int, npt.NDArray[np.int64]] = {}
        wfull: dict[int, float] = {}
        qmax: dict[int, float] = {}
        lp: dict[int, FloatArray] = {}
        lc: dict[int, FloatArray] = {}
        tb: dict[int, FloatArray] = {}
        tbd: dict[int, FloatArray] = {}
        lu: dict[int, FloatArray] = {}
        for layer, log in sorted(cache.logs.items()):
            if log.writes:
                observed.add((layer, "write"))
                wfull[layer] = float(torch.cat([x.reshape(-1) for x in log.witness_full]).max())
                wmax[layer] = float(max(float(torch.cat(
                    [x.reshape(-1) for x in ws]).max()) for ws in log.witnesses))
            if log.meter:
                observed.add((layer, "read"))
                meter[layer] = cat_np(log.meter)
                one[layer] = cat_np(log.one_sided)
                two[layer] = cat_np(log.two_sided)
                cmax[layer] = cat_np(log.c_max)
                pos[layer] = torch.cat(log.positions).numpy()
                qmax[layer] = float(torch.stack(log.q_norm).max())
                if log.last_p is not None and log.last_c is not None:
                    lp[layer] = log.last_p.to(torch.float64).numpy()
                    lc[layer] = log.last_c.numpy()
                if log.out_bound:
                    ob[layer] = cat_np(log.out_bound)
            if log.tier_b:
                observed.add((layer, "tier_b"))
                tb[layer] = cat_np(log.tier_b)
                tbd[layer] = cat_np(log.tier_b_dloc)
                if log.last_u is not None:
                    lu[layer] = log.last_u.numpy()
            if log.true_tv:
                observed.add((layer, "audit"))
                ttv[layer] = cat_np(log.true_tv)
                if log.true_out:
                    tout[layer] = cat_np(log.true_out)
        return LiveRun(
            scheme=self.scheme.name, memory_class=self.spec.memory_class,
            layers=tuple(sorted(meter)), declared=self.declared(), observed=frozenset(observed),
            writes={k: v.writes for k, v in cache.logs.items()},
            reads={k: v.reads for k, v in cache.logs.items()},
            meter=meter, one_sided=one, two_sided=two, c_max=cmax, witness_max=wmax,
            out_bound=ob, true_tv=ttv, true_out=tout, positions=pos,
            witness_full_max=wfull, q_norm_max=qmax, last_p=lp, last_c=lc,
            tier_b=tb, tier_b_delta_loc=tbd, tier_b_events=tuple(self._events), last_u=lu,
        )


@contextmanager
def attach(model: Any, *, scheme: str | None, request_id: int = 0,
           audit: bool = False, bands: int | None = None,
           ledger: RiskLedger | None = None) -> Generator[Probe]:
    """Attach a :class:`Probe` for the duration of a ``with`` block.

    Example:
        >>> # with attach(model, scheme="int8_token", audit=True) as probe:
        >>> #     model(ids, cache=probe.new_cache()); run = probe.result()
    """
    probe = Probe(model, scheme=scheme, request_id=request_id, audit=audit, bands=bands,
                  ledger=ledger)
    try:
        yield probe
    finally:
        probe.close()
