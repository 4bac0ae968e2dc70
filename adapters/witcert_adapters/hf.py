"""Hugging Face transformers attachment: the probe's read-side hooks around a witnessing cache.

Attachment uses only public APIs: :class:`~witcert_adapters.witness_cache.WitnessCache`
subclasses :class:`transformers.DynamicCache` and overrides ``update`` (the write path), and
the read side uses ``register_forward_pre_hook`` / ``register_forward_hook`` on the
attention modules. No model source is patched. The attachment is spread over modules named
after what they hold: :mod:`witcert_adapters.witness_cache` (the write path),
:mod:`witcert_adapters.layer_log` (the per-layer step records), :mod:`witcert_adapters.live_run`
(what a run observed) and this one (the probe and its hooks).

Read time (hooks on each attention module): the pre-hook recomputes the layer's
post-RoPE queries from its own projections and rotary tables; the forward hook takes the
attention probabilities ``p_tilde`` the layer actually used (eager attention returns
them). For a decode-sized call it only stashes them; at the end of the model's forward the
probe evaluates the Tier-A meter (and Tier B, and the output bound) for every (layer, head,
query position) cell of all stashed calls at once, the layers stacked on a leading axis
(one group per shape), and splits the results into each layer's step records. A call past
an element budget (a long prefill) is metered in its own hook, as is every call with
``audit=True``: then the exact keys are kept as well and the true TV against exact
attention is computed in float64 for every cell (used by the acceptance gate's soundness
stage). Both paths evaluate the same functions; the stacked one differs only in float
summation order (an ulp, far inside the outward-rounding margins).

Tier B (probabilistic), for a scheme with a dithered key store (``dither_int8``,
``dither_int8_g32_m4``, ...): the cache also records each token's float16 block scales
``s_{b,t}`` as stored, and when the probe is given a
:class:`~witcert_calculus.ledger.RiskLedger`, every forward call of the model is one
probabilistic event of the request's account. Before the call the probe asks the ledger for
the next telescoping allowance ``delta_i`` (``next_allowance``); inside, each (layer, head,
query row) cell gets ``delta_loc = delta_i / (L H rows)`` (rounded down), the sub-Gaussian
radius ``u_t = sqrt(2 varsigma_t^2 log(2 S_row / delta_loc))`` with ``varsigma_t^2 = scale^2
sum_b s_{b,t}^2 ||q_b||^2 / 12`` over the row's ``S_row`` visible tokens (``q_b`` restricted
to the block's dithered channels: outlier pairs, fixed per (layer, kv head) on the layer's
first write and kept for the request, are exact), plus the deterministic ``scale ||q|| ||k_t
- x_hat_t||`` of what the cache holds (the float64 reconstruction rounded to the model's
dtype, outlier channels as their float16 values), and the same TV forms as Tier A with ``c_t
= u_t`` (plus the Tier-A bound of any logit part whose slot is not dithered, e.g. the rope
part of a latent cache). After the call the forward's worst cell becomes one ``Reading``
with ``delta = delta_i``, admitted with ``RiskLedger.admit`` (the ledger charges
``delta_i``; after ``n`` forwards the spend is ``delta_req (1 - 1/(n+1))``). By the union
bound every cell of the forward holds except with probability ``delta_i``. The certificate
is scoped to non-adaptive queries (queries independent of the layer's dither stream: a
teacher-forced or fixed token sequence, where a layer's queries depend only on other layers'
streams); the deterministic Tier-A meter is the adaptive-safe one and is always reported
next to it.

No per-layer host synchronisation: results stay as tensors until :meth:`Probe.result`
(per forward call, one sync reads the write checks and Tier B one more, to admit the
forward's reading). The bases of the stacked layers' TV bounds are shared: their computed
premises cover the whole group, so a failed premise refuses every layer of the group.

Main declarations
-----------------
- :class:`Probe`: attaches hooks, owns the cache, collects a
  :class:`~witcert_adapters.live_run.LiveRun`.
- :func:`attach`: context manager around :class:`Probe`.
"""


from __future__ import annotations

from collections.abc import Callable, Generator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, TypeAlias, final

import torch
from torch.utils.hooks import RemovableHandle

from witcert_adapters.architectures import spec_for
from witcert_adapters.layer_log import AuditStep, LayerLog, ReadStep, TierBStep, concat
from witcert_adapters.live_run import LiveRun, TierBEvent
from witcert_adapters.runs import ProbePath, Site
from witcert_adapters.schemes import get_scheme
from witcert_adapters.witness_cache import WitnessCache
from witcert_calculus.contracts import _reading  # pyright: ignore[reportPrivateUsage]
from witcert_calculus.errors import InvalidValueError
from witcert_calculus.lean.theorems import TV_EFORM_METER_SOUND, TV_TWO_SIDED_METER_SOUND
from witcert_calculus.ledger import RiskLedger
from witcert_calculus.meters.tv_forms import TVBasis
from witcert_calculus.meters.witness import LogitBound
from witcert_calculus.metrics import AtConsume, AttentionTV
from witcert_calculus.numerics.probability import Probability
from witcert_calculus.numerics.validation import positive_int
from witcert_kernels.dither import tier_b_logit_bound
from witcert_kernels.meter import (
    TVMeter,
    l2_norm,
    l2_norm_upper,
    logit_bound,
    output_error_bound,
    tv_meter_batch,
)

__all__ = ["Probe", "attach"]

PreHook: TypeAlias = Callable[[Any, tuple[Any, ...], dict[str, Any]], None]
PostHook: TypeAlias = Callable[[Any, tuple[Any, ...], dict[str, Any], Any], None]

#: Attention-probability elements (one layer's, times the layers) up to which a call's meter
#: waits for the end of the forward, to run stacked with the other layers' (decode steps);
#: a larger call (a long prefill) is metered in its own hook.
_STASH_BUDGET = 1 << 22


def _expand_heads(x: torch.Tensor, heads: int, *, dim: int = 1) -> torch.Tensor:
    # [B, Hkv, S, ...] -> [B, H, S, ...] (GQA: head h reads kv head h // groups); dim=2 for
    # tensors stacked over a leading layer axis.
    hkv = x.shape[dim]
    if hkv == heads:
        return x
    return x.repeat_interleave(heads // hkv, dim=dim)


@final
@dataclass(frozen=True, slots=True)
class _Call:
    # One attention call awaiting its meter: what the layer produced, nothing computed yet.
    layer: int
    scale: float
    queries: tuple[torch.Tensor, ...]
    start: int
    p_tilde: torch.Tensor


@final
class _Stack:
    # One per-token field of a group of layers' write records (witnesses, value norms, block
    # scales, ...), stacked [G, B, Hkv, S, ...] in a buffer that grows by doubling: a meter
    # copies only the write steps recorded since the previous one, not the whole history.
    # What is held is reused only while every layer's log has the same revision (no step
    # replaced, e.g. by a repair) and still holds each layer's last copied step where it was.
    __slots__ = ("buf", "tokens", "last", "revisions")

    def __init__(self) -> None:
        self.buf: torch.Tensor | None = None
        self.tokens = 0
        self.last: list[torch.Tensor] = []  # each layer's last step held
        self.revisions: tuple[int, ...] = ()

    def stacked(self, rows: list[list[torch.Tensor]], dtype: torch.dtype | None, *,
                revisions: tuple[int, ...]) -> torch.Tensor:
        """``rows[g]``: layer g's step tensors ``[B, Hkv, T, ...]`` in write order, stacked in
        ``dtype`` (``None``: as recorded); ``revisions``: the layers' log revisions."""
        dtype = dtype or rows[0][0].dtype
        if len({len(r) for r in rows}) != 1:  # layers with different histories: no reuse
            self.buf, self.tokens, self.last = None, 0, []
            return torch.stack([concat(r, dim=2) for r in rows]).to(dtype)
        n = self._held(rows) if revisions == self.revisions else None
        if n is None:
            self.buf, self.tokens, n = None, 0, 0
        self.revisions = revisions
        if n < len(rows[0]):
            add = torch.stack([concat(r[n:], dim=2) for r in rows]).to(dtype)
            if self.buf is not None and (self.buf.shape[:3] != add.shape[:3]
                                         or self.buf.shape[4:] != add.shape[4:]):
                self.buf, self.tokens = None, 0
                add = torch.stack([concat(r, dim=2) for r in rows]).to(dtype)
            need = self.tokens + int(add.shape[3])
            if self.buf is None or int(self.buf.shape[3]) < need:
                cap = max(need, 2 * (0 if self.buf is None else int(self.buf.shape[3])))
                grown = add.new_empty((*add.shape[:3], cap, *add.shape[4:]))
                if self.buf is not None:
                    grown[:, :, :, :self.tokens] = self.buf[:, :, :, :self.tokens]
                self.buf = grown
            self.buf[:, :, :, self.tokens:need] = add
            self.tokens = need
            self.last = [r[-1] for r in rows]
        assert self.buf is not None
        return self.buf[:, :, :, :self.tokens]

    def _held(self, rows: list[list[torch.Tensor]]) -> int | None:
        # Steps already in the buffer: each layer's last held step found at the same index
        # (else None: these are not the records held).
        if self.buf is None or len(rows) != len(self.last):
            return None
        found = {next((i + 1 for i in range(len(r) - 1, -1, -1) if r[i] is last), None)
                 for r, last in zip(rows, self.last, strict=True)}
        return None if None in found or len(found) != 1 else found.pop()


def _float_down(delta: Probability, parts: int) -> float:
    # delta / parts, rounded down once: a smaller delta_loc keeps the union over the parts
    # within delta.
    return delta.split(parts).float_down()


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
        horizon: with Tier B, the request's query rows ``T`` when known in advance: each
            cell's bound is also computed at the fixed-horizon allocation
            ``delta_req / (L H T)`` (a comparison only; the ledger spends the anytime-valid
            telescoping allowance). ``None``: not computed.

    Raises:
        InvalidValueError: unknown scheme or model type, or a non-eager attention.

    Use :meth:`new_cache` for each forward/generate call sequence of one request, pass it
    as ``cache=``, then :meth:`result`. Call :meth:`close` (or use :func:`attach`).
    """

    def __init__(self, model: Any, *, scheme: str | None, request_id: int = 0,
                 audit: bool = False, bands: int | None = None,
                 ledger: RiskLedger | None = None, horizon: int | None = None) -> None:
        config = model.config
        spec = spec_for(config.model_type)
        if bands is not None:
            bands = positive_int("bands", bands)
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
        self._stash: list[_Call] = []
        self._stacks: dict[tuple[tuple[int, ...], str, int | None], _Stack] = {}
        self._handles: list[RemovableHandle] = []
        self.attention = self._find_attention(model)
        self.ledger = ledger
        self.tier_b = ledger is not None and self.scheme is not None \
            and self.scheme.dithered is not None
        self._fixed: float | None = None
        if self.tier_b:
            assert ledger is not None
            ledger.require_known(request_id)
            if horizon is not None:
                rows = positive_int("horizon", horizon) * len(self.attention) \
                    * int(config.num_attention_heads)
                self._fixed = _float_down(Probability.of(ledger.verdict(request_id).delta_req,
                                                         name="delta_req"), rows)
        self._event_delta: Probability | None = None
        self._event_max: list[torch.Tensor] = []
        self._event_bases: list[TVBasis] = []
        self._event_rows = 0
        self._events: list[TierBEvent] = []
        if self.tier_b:
            self._handles.append(model.register_forward_pre_hook(self._begin_event))
        if self.scheme is not None:
            self._handles.append(model.register_forward_hook(self._end_forward))
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

    def declared(self) -> frozenset[Site]:
        """The ``(layer, path)`` sites this probe promises to observe."""
        paths = [ProbePath.WRITE, ProbePath.READ] + ([ProbePath.AUDIT] if self.audit else []) \
            + ([ProbePath.TIER_B] if self.tier_b else [])
        return frozenset((layer, p) for layer, _ in self.attention for p in paths)

    def new_cache(self) -> WitnessCache:
        """A fresh :class:`WitnessCache` for one request; the probe reads from it."""
        return self.bind(WitnessCache(config=self.model.config, spec=self.spec,
                                      scheme=self.scheme, request_id=self.request_id,
                                      audit=self.audit, defer=True))

    def bind(self, cache: WitnessCache) -> WitnessCache:
        """Read from ``cache`` (a fresh one of this request, e.g. a hybrid's shared cache)."""
        self.cache = cache
        self._pending.clear()
        self._stash = []
        self._stacks = {}
        self._events = []
        return cache

    def close(self) -> None:
        """Remove every hook this probe registered."""
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _begin_event(self, module: Any, args: Any) -> None:
        assert self.ledger is not None
        self._event_delta = Probability.of(self.ledger.next_allowance(self.request_id),
                                           name="allowance")
        self._event_max = []
        self._event_bases = []
        self._event_rows = 0

    def _end_forward(self, module: Any, args: Any, output: Any) -> None:
        # The forward's deferred write checks (one host sync), its stashed meters, then its
        # Tier-B event.
        if self.cache is not None:
            self.cache.verify()
        self._flush()
        if self.tier_b:
            self._end_event()

    def _end_event(self) -> None:
        assert self.ledger is not None
        delta = self._event_delta
        self._event_delta = None
        if delta is None or not self._event_max:
            return
        maxima = torch.stack(self._event_max)
        raw = float(maxima.max())
        rows = self._event_rows
        # Every layer's Tier-B bounds rest on their computed checks: all of them are read in
        # one device sync per forward; only a failure walks the layers to name the premise.
        # The reading is the worst layer's, with that layer's evidence.
        truths = [t for b in self._event_bases for _, t in b.checks if isinstance(t, torch.Tensor)]
        if truths and not bool(torch.stack(truths).all()):
            for b in self._event_bases:
                b.evidence(TV_EFORM_METER_SOUND, TV_TWO_SIDED_METER_SOUND)  # raises PremiseError
        worst = self._event_bases[int(torch.argmax(maxima))]
        evidence_max = worst.evidence(TV_EFORM_METER_SOUND, TV_TWO_SIDED_METER_SOUND)
        reading = _reading(AttentionTV[AtConsume], raw, evidence=evidence_max, delta=delta.exact)
        admission = self.ledger.admit(self.request_id, reading)
        self._events.append(TierBEvent(len(self._events), delta.exact, rows, reading, admission))

    def _make_pre(self, layer: int) -> PreHook:
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

    def _make_post(self, layer: int) -> PostHook:
        def post(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
            cache = self.cache
            if cache is None:
                raise InvalidValueError("cache", None, "call Probe.new_cache() and pass it as cache=")
            queries, start = self._pending.pop(layer)
            p_tilde = output[1]
            if p_tilde is None:
                raise InvalidValueError("attn_weights", None, "the attention returned no probabilities")
            call = _Call(layer, float(module.scaling), queries, start, p_tilde.detach())
            if self.audit or call.p_tilde.numel() * len(self.attention) > _STASH_BUDGET:
                with torch.no_grad():  # a large prefill (or an audit): metered right here
                    self._meter([call], cache)
                return
            if any(c.layer == layer for c in self._stash):
                self._flush()  # the previous forward ended without the model's hook
            self._stash.append(call)
        return post

    def _flush(self) -> None:
        # Meter the stashed calls, stacked over a leading layer axis per group of equal shapes.
        stash, self._stash = self._stash, []
        cache = self.cache
        if not stash or cache is None:
            return
        groups: dict[tuple[object, ...], list[_Call]] = {}
        for call in stash:
            log = cache.log(call.layer)
            key = (call.scale, call.start, tuple(call.p_tilde.shape),
                   tuple(tuple(q.shape) for q in call.queries),
                   tuple(tuple(step.witnesses[i].shape[:2]) + (step.witnesses[i].shape[3],)
                         for step in log.written[:1] for i in range(len(self.spec.parts))),
                   bool(log.dither_scales))
            groups.setdefault(key, []).append(call)
        with torch.no_grad():
            for calls in groups.values():
                self._meter(calls, cache)

    def _meter(self, calls: list[_Call], cache: WitnessCache) -> None:
        # Tier A (and Tier B, audit) of attention calls with equal shapes, scale and start,
        # evaluated once over a leading layer axis g; one step record per layer. Heads are
        # split [kv, group] so what a kv head stores broadcasts over its query heads.
        cache.record_writes()
        logs = [cache.log(call.layer) for call in calls]
        first = calls[0]
        batch, heads, q_len = (int(n) for n in first.p_tilde.shape[:3])
        g_count = len(calls)
        scale, start = first.scale, first.start
        dense = self.spec.value_slot is not None
        tier_b = self.tier_b and self._event_delta is not None and bool(logs[0].dither_scales)
        # the kv-head side, stacked [G, B, Hkv, S, ...] (float64 where the meter reads float64)
        layers = tuple(call.layer for call in calls)
        revisions = tuple(log.revision for log in logs)

        def stacked(field: str, dtype: torch.dtype | None, part: int | None = None
                    ) -> torch.Tensor:  # a WriteStep field (witnesses: of one logit part)
            rows = [[s.witnesses[part] for s in log.written] if part is not None
                    else log.recorded(field) for log in logs]
            return self._stacks.setdefault((layers, field, part), _Stack()).stacked(
                rows, dtype, revisions=revisions)

        kv_side: dict[str, torch.Tensor] = {
            f"w{i}": stacked("witnesses", torch.float64, i) for i in range(len(self.spec.parts))}
        if dense:
            kv_side["rho"] = stacked("value_res", torch.float64)
            kv_side["vnorm"] = stacked("value_norm", torch.float64)
        if tier_b:
            kv_side["scales"] = stacked("dither_scales", None)
            kv_side["cast"] = stacked("dither_cast", None)
            masks = [log.dither_exact for log in logs]
            assert all(m is not None for m in masks), "a dithered write records its exact channels"
            kv_side["exact"] = torch.stack([m for m in masks if m is not None]).unsqueeze(1)
        sizes = {int(t.shape[2]) for t in kv_side.values()}
        kv = sizes.pop() if len(sizes) == 1 else heads  # one kv layout, else every head its own
        kvs = {k: _expand_heads(t, kv, dim=2).unsqueeze(3) for k, t in kv_side.items()}

        def split(x: torch.Tensor) -> torch.Tensor:  # [G, B, H, ...] -> [G, B, kv, H/kv, ...]
            return x.reshape(g_count, batch, kv, heads // kv, *x.shape[3:])

        def join(x: torch.Tensor) -> torch.Tensor:  # and back
            return x.flatten(2, 3)

        queries = [split(torch.stack([call.queries[i] for call in calls]))
                   for i in range(len(self.spec.parts))]  # [G, B, kv, H/kv, Q, d]
        p_tilde = split(torch.stack([call.p_tilde for call in calls]))  # [G, B, kv, H/kv, Q, S]
        # c_t >= |eps_t| established from the stored band witnesses and the live queries,
        # one bound per logit part (their sum stays established).
        c_parts: list[LogitBound[torch.Tensor]] = [
            logit_bound(queries[i], kvs[f"w{i}"].unsqueeze(4), scale=scale, layout=part.layout)
            for i, part in enumerate(self.spec.parts)]
        c = c_parts[0]
        for extra in c_parts[1:]:
            c = c + extra
        # causal rows: row i sees start + i + 1 tokens; the first one sees one (TV exactly 0)
        visible = torch.arange(start + 1, start + q_len + 1)
        bounds = tv_meter_batch(p_tilde, c, check=False,  # validated once per run by the gate
                                visible=visible)
        if tier_b:
            self._tier_b(logs, queries, c_parts, p_tilde, kvs, join, start, scale, heads)
        p64 = p_tilde.to(torch.float64)
        p64 = p64 / p64.sum(dim=-1, keepdim=True)
        out_bound: tuple[torch.Tensor | None, ...] = (None,) * g_count
        value_scale: tuple[torch.Tensor | None, ...] = (None,) * g_count
        if dense:
            rho = kvs["rho"].to(torch.float64)
            vmax = kvs["vnorm"].to(torch.float64).amax(dim=-1)
            out = output_error_bound(bounds.meter, value_norm_max=vmax.unsqueeze(-1),
                                     p_tilde=p64, rho=rho.unsqueeze(-2))
            out_bound = join(out).unbind(0)
            value_scale = join(vmax.unsqueeze(-1).expand_as(out)).unbind(0)
        positions = torch.arange(start, start + q_len)
        q_norm = l2_norm_upper(queries[0].to(torch.float64)).flatten(1).amax(dim=-1)
        for step in zip(logs, join(bounds.meter).unbind(0), join(bounds.eform).unbind(0),
                        join(bounds.two_sided).unbind(0), join(c.values.amax(dim=-1)).unbind(0),
                        q_norm.unbind(0), out_bound, value_scale, calls,
                        join(c.values[..., -1, :]).unbind(0), strict=True):
            log, meter, eform, two_sided, c_max, qn, ob, vs, call, last_c = step
            log.add_read(ReadStep(q_len, meter, eform, two_sided, c_max, positions, qn, ob,
                                  basis=bounds.basis, value_scale=vs),
                         last_p=call.p_tilde[:, :, -1, :], last_c=last_c)
        if self.audit:
            for call, log in zip(calls, logs, strict=True):
                self._audit(call.layer, log, call.queries, start, cache, scale, heads)

    def _tier_b(self, logs: list[LayerLog], queries: list[torch.Tensor],
                c_parts: list[LogitBound[torch.Tensor]], p_tilde: torch.Tensor,
                kvs: dict[str, torch.Tensor], join: Callable[[torch.Tensor], torch.Tensor],
                start: int, scale: float, heads: int) -> None:
        # Tier B of _meter's stacked calls (leading layer axis g, heads split [kv, H/kv]).
        assert self._event_delta is not None
        q_len = p_tilde.shape[-2]
        rows = heads * q_len
        # delta_loc = delta_i / (L * H * rows), rounded down; the union over this forward's
        # cells (every attention layer, head and query row) is at most delta_i.
        dloc = _float_down(self._event_delta, len(self.attention) * rows)
        scales, cast = kvs["scales"], kvs["cast"]  # [G, B, kv, 1, S, nb] fp16, [G, B, kv, 1, S]
        exact = kvs["exact"].unsqueeze(4)  # [G, 1, kv, 1, 1, d]
        visible = torch.arange(start + 1, start + q_len + 1)  # S_row, the union bound's S

        def meter(delta_loc: float) -> tuple[LogitBound[torch.Tensor], TVMeter]:
            parts = [c_parts[i] if part.slot != 0  # not dithered: its deterministic Tier-A part
                     else tier_b_logit_bound(queries[i], scales, cast, scale=scale,
                                             delta_loc=delta_loc, visible=visible, exact=exact)
                     for i, part in enumerate(self.spec.parts)]
            cb = parts[0]
            for extra in parts[1:]:
                cb = cb + extra
            return cb, tv_meter_batch(p_tilde, cb, check=False, visible=visible)

        cb, tb = meter(dloc)
        fixed: tuple[torch.Tensor | None, ...] = (None,) * len(logs) if self._fixed is None \
            else join(meter(self._fixed)[1].meter).unbind(0)
        dlocs = torch.full((q_len,), dloc, dtype=torch.float64)
        for log, m, f, last_u in zip(logs, join(tb.meter).unbind(0), fixed,
                                     join(cb.values[..., -1, :]).unbind(0), strict=True):
            log.add_tier_b(TierBStep(m, dlocs, fixed_meter=f), last_u=last_u)
        self._event_max.extend(tb.meter.flatten(1).amax(dim=-1).unbind(0))
        self._event_bases.extend([tb.basis] * len(logs))
        self._event_rows = q_len * heads

    def _audit(self, layer: int, log: LayerLog, queries: tuple[torch.Tensor, ...], start: int,
               cache: WitnessCache, scale: float, heads: int) -> None:
        exact_slots = [log.exact(0), log.exact(1)]
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
        true_out = None
        if self.spec.value_slot is not None:
            v = _expand_heads(exact_slots[self.spec.value_slot], heads).to(torch.float64)
            vh = _expand_heads(hat_slots[self.spec.value_slot], heads).to(torch.float64)
            y = torch.einsum("bhqs,bhsd->bhqd", p, v)
            yh = torch.einsum("bhqs,bhsd->bhqd", ph, vh)
            true_out = l2_norm(y - yh)
        log.add_audit(AuditStep(0.5 * (p - ph).abs().sum(dim=-1), true_out))

    def result(self) -> LiveRun:
        """Collect what the current cache observed into a :class:`LiveRun`.

        Raises:
            InvalidValueError: the adapter is switched off (no scheme) or no cache was opened.
        """
        cache = self.cache
        if cache is None or self.scheme is None:
            raise InvalidValueError("probe", "detached", "nothing observed: no scheme or no cache")
        cache.verify()
        self._flush()
        cache.record_writes()
        return LiveRun(
            scheme=self.scheme.name, memory_class=self.spec.memory_class,
            declared=self.declared(),
            records={layer: log.record(layer) for layer, log in sorted(cache.logs.items())},
            tier_b_events=tuple(self._events))


@contextmanager
def attach(model: Any, *, scheme: str | None, request_id: int = 0,
           audit: bool = False, bands: int | None = None,
           ledger: RiskLedger | None = None, horizon: int | None = None) -> Generator[Probe]:
    """Attach a :class:`Probe` for the duration of a ``with`` block.

    Example:
        >>> # with attach(model, scheme="int8_token", audit=True) as probe:
        >>> #     model(ids, cache=probe.new_cache()); run = probe.result()
    """
    probe = Probe(model, scheme=scheme, request_id=request_id, audit=audit, bands=bands,
                  ledger=ledger, horizon=horizon)
    try:
        yield probe
    finally:
        probe.close()
