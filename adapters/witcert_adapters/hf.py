"""Hugging Face transformers attachment: a witnessing Cache and read-side hooks.

Attachment uses only public APIs: :class:`WitnessCache` subclasses
:class:`transformers.DynamicCache` and overrides ``update`` (the write path), and the
read side uses ``register_forward_pre_hook`` / ``register_forward_hook`` on the
attention modules. No model source is patched.

Write time (``WitnessCache.update``): the registered scheme compresses the new entries;
the model reads the compressed ones. The cache records, per token and kv head, band
witnesses ``w_{t,b} = ||(k_hat - k)_b||`` of every slot that enters the logits (rounded
up to float32), and for dense memories the value residual ``rho_t`` and exact value norm.
Only ``k_hat``/``v_hat`` are produced inside the layer: a dithered store takes its noise from
one Philox call per forward (every layer's, at the forward's positions, drawn at its first
write) and keeps each layer's exact-channel mask; its checks on tensor contents (finite
keys, no float16 overflow, no clipped code) are, in a probe's cache, 0-d device booleans
that :meth:`WitnessCache.verify` reads once per forward (a failure reruns that layer's
quantization with eager checks, which raises the typed error naming the value). A probe's
cache also holds the record-only norms until :meth:`WitnessCache.record_writes` computes
those of every layer stacked (a long prefill's write is recorded at once).

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

Records: every write and every metered call appends one frozen step record
(:class:`WriteStep`, :class:`ReadStep`, :class:`TierBStep`, :class:`AuditStep`) to the
layer's :class:`LayerLog`; :meth:`Probe.result` converts each log once into the layer's
:class:`~witcert_adapters.records.LayerRecord` of numpy values.

Main declarations
-----------------
- :class:`WitnessCache`: the write path.
- :class:`Probe`: attaches hooks, owns the cache, collects a :class:`LiveRun`.
- :class:`LiveRun`: one :class:`~witcert_adapters.records.LayerRecord` per attention layer
  (witnesses, meters, Tier-B cells, audited true errors) and the Tier-B events.
- :class:`TierBEvent`: one forward's probabilistic certificate and its ledger admission.
- :class:`LayerLog` and its step records :class:`WriteStep`, :class:`ReadStep`,
  :class:`TierBStep`, :class:`AuditStep`: the per-layer accumulator while the model runs.
- :func:`attach`: context manager around :class:`Probe`.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from fractions import Fraction
from functools import partial
from typing import Any, TypeAlias, final

import torch
from torch.utils.hooks import RemovableHandle
from transformers import DynamicCache

from witcert_adapters.architectures import ArchSpec, spec_for
from witcert_adapters.records import (
    AuditRecord,
    FloatArray,
    KeyStoreRecord,
    LayerRecord,
    ReadRecord,
    TierBRecord,
    WriteRecord,
)
from witcert_adapters.runs import MemoryKind, ProbePath, Site, observed_sites
from witcert_adapters.schemes import EntryRole, Scheme, WriteContext, get_scheme
from witcert_calculus.numerics.probability import Probability
from witcert_calculus.contracts import Reading
from witcert_calculus.errors import InvalidValueError
from witcert_calculus.ledger import RiskLedger
from witcert_calculus.metrics import AtConsume, AttentionTV
from witcert_calculus.accounting.records import Admission
from witcert_calculus.lean.theorems import TV_EFORM_SOUND, TV_TWO_SIDED_SOUND
from witcert_calculus.meters.tv_forms import TVBasis, TVBatch
from witcert_calculus.numerics.validation import positive_int
from witcert_calculus.meters.witness import LogitBound
from witcert_kernels.dither import DitherEncoding, dither_noise_layers, \
    exact_channels, pair_energy, tier_b_logit_bound
from witcert_kernels.meter import (
    band_norms,
    l2_norm,
    l2_norm_upper,
    logit_bound,
    output_error_bound,
    round_up_f32,
    tv_bounds_batch,
)

__all__ = ["AuditStep", "LayerLog", "LiveRun", "Probe", "ReadStep", "TierBEvent", "TierBStep",
           "WitnessCache", "WriteStep", "attach"]

PreHook: TypeAlias = Callable[[Any, tuple[Any, ...], dict[str, Any]], None]
PostHook: TypeAlias = Callable[[Any, tuple[Any, ...], dict[str, Any], Any], None]

#: Attention-probability elements (one layer's, times the layers) up to which a call's meter
#: waits for the end of the forward, to run stacked with the other layers' (decode steps);
#: a larger call (a long prefill) is metered in its own hook.
_STASH_BUDGET = 1 << 22

#: Entry elements of one write (one layer's, times the layers) up to which the forward's dither
#: noise is drawn once for every layer (float64: 16 MiB) and a deferring cache's record-only
#: norms wait to run stacked over layers; a larger write (a long prefill, not dispatch bound)
#: draws its own noise and is recorded at once.
_WRITE_BUDGET = 1 << 21


def _cat(xs: list[torch.Tensor], dim: int) -> torch.Tensor:
    return xs[0] if len(xs) == 1 else torch.cat(xs, dim=dim)


def _cat_np(xs: list[torch.Tensor]) -> FloatArray:
    # Steps joined along the cell axis, as float64 numpy (once, when a run is collected).
    return _cat(xs, dim=-1).to(torch.float64).numpy()


@final
@dataclass(frozen=True, slots=True)
class WriteStep:
    """One ``Cache.update`` call of one layer as recorded (tensors; float32 witnesses).

    Attributes:
        tokens: entries written.
        witnesses: per logit part, band witnesses ``[B, Hkv, T, bands]``, rounded up.
        witness_full: ``||k_hat - k||`` of the first logit slot per token ``[B, Hkv, T]``.
        value_res / value_norm: dense memories: ``||v_hat - v||`` and ``||v||`` per token;
            ``None`` for a latent memory.
        exact: with ``audit=True``, the exact ``(key_states, value_states)``; else ``None``.
        dither_scales: a dithered key store's float16 block scales ``[B, Hkv, T, nb]`` as
            stored; ``None`` for any other scheme.
        dither_cast: with a dithered store, ``||k - x_hat||`` per token for the key ``k`` the
            cache holds (the deterministic rounding of the reconstruction to the model's
            dtype and of the outlier values to float16).
        store_bytes: with a dithered store, the bytes of this write's packed codes, scales
            and outlier values per kv head and batch row (summed over its tokens), measured
            from the stored tensors.
        pair_overlap: with outlier pairs, per token of a write after the first, the
            fraction of the token's own top-``m`` pairs (by pair energy) that are among the
            layer's fixed pairs ``[B, Hkv, T]``; ``None`` otherwise.
    """

    tokens: int
    witnesses: tuple[torch.Tensor, ...]
    witness_full: torch.Tensor
    value_res: torch.Tensor | None = None
    value_norm: torch.Tensor | None = None
    exact: tuple[torch.Tensor, torch.Tensor] | None = None
    dither_scales: torch.Tensor | None = None
    dither_cast: torch.Tensor | None = None
    store_bytes: float = 0.0
    pair_overlap: torch.Tensor | None = None


@final
@dataclass(frozen=True, slots=True)
class ReadStep:
    """One metered forward call of one layer (Tier A), cells ``[B, H, Q]``.

    Attributes:
        rows: query rows metered (``Q``).
        meter / eform / two_sided: the raw min-form TV bound and its two forms.
        c_max: ``max_t c_t`` per cell.
        positions: the call's query positions ``[Q]``.
        q_norm: the largest norm of the first logit slot's query (a 0-d tensor).
        out_bound: the attention-output error bound (dense memories), else ``None``.
        value_scale: with ``out_bound``, the ``max_t ||v_t||`` it scales with ``[B, H, Q]``
            (the output bound relative to it is comparable with a TV threshold).
        basis: what the call's TV bounds rest on (:class:`~witcert_calculus.meters.tv_forms.TVBasis`:
            the logit bound's evidence and the premises computed from the call's inputs; one
            basis shared by the layers metered together, stacked, at the end of a forward).
    """

    rows: int
    meter: torch.Tensor
    eform: torch.Tensor
    two_sided: torch.Tensor
    c_max: torch.Tensor
    positions: torch.Tensor
    q_norm: torch.Tensor
    out_bound: torch.Tensor | None = None
    basis: TVBasis | None = None
    value_scale: torch.Tensor | None = None


@final
@dataclass(frozen=True, slots=True)
class TierBStep:
    """One forward call's Tier-B cells of one layer.

    Attributes:
        meter: raw Tier-B min-form bound ``[B, H, Q]``.
        delta_loc: the per-cell failure probability of each row ``[Q]``.
        fixed_meter: the same bound at the fixed-horizon allocation
            ``delta_req / (L H T)`` (for comparison; never admitted), or ``None``.
    """

    meter: torch.Tensor
    delta_loc: torch.Tensor
    fixed_meter: torch.Tensor | None = None


@final
@dataclass(frozen=True, slots=True)
class AuditStep:
    """One forward call's true errors of one layer, cells ``[B, H, Q]``.

    Attributes:
        true_tv: true TV against exact attention.
        true_out: true attention-output error (dense memories), else ``None``.
    """

    true_tv: torch.Tensor
    true_out: torch.Tensor | None = None


def _write_steps() -> list[WriteStep]:
    return []


def _read_steps() -> list[ReadStep]:
    return []


def _tier_b_steps() -> list[TierBStep]:
    return []


def _audit_steps() -> list[AuditStep]:
    return []


@dataclass(slots=True)
class LayerLog:
    """Mutable per-layer accumulator (one per layer; never shared between layers).

    Every call appends one step record (:class:`WriteStep` per ``Cache.update``,
    :class:`ReadStep`, :class:`TierBStep` and :class:`AuditStep` per metered forward call);
    only the final query row's probabilities and bounds are kept, overwritten per call.
    :meth:`record` converts the steps into the layer's :class:`LayerRecord` once.

    Attributes:
        written / metered / tier_b_steps / audited: the step records, in call order.
        last_p / last_c: ``p_tilde`` and ``c`` of the most recent query row ``[B, H, S]``.
        last_u: the Tier-B ``c`` (radius plus undithered parts) of that row.
        outlier_pairs: a dithered store's outlier pairs ``[Hkv, m]``, fixed on the layer's
            first write and kept for the request; ``None`` without a dithered store.
        dither_exact: their channel mask ``[Hkv, d]``.
        pair_energy: the running pair energy ``[Hkv, d/2]`` of every key written (to measure
            how stable the fixed choice is); ``None`` without outlier pairs.
        index_bytes: the stored outlier pair indices' bytes per kv head (one set per head).
    """

    written: list[WriteStep] = field(default_factory=_write_steps)
    metered: list[ReadStep] = field(default_factory=_read_steps)
    tier_b_steps: list[TierBStep] = field(default_factory=_tier_b_steps)
    audited: list[AuditStep] = field(default_factory=_audit_steps)
    last_p: torch.Tensor | None = None
    last_c: torch.Tensor | None = None
    last_u: torch.Tensor | None = None
    outlier_pairs: torch.Tensor | None = None
    dither_exact: torch.Tensor | None = None
    pair_energy: torch.Tensor | None = None
    index_bytes: float = 0.0

    @property
    def writes(self) -> int:
        """Tokens written so far."""
        return sum(step.tokens for step in self.written)

    @property
    def reads(self) -> int:
        """Query rows metered so far."""
        return sum(step.rows for step in self.metered)

    def add_write(self, step: WriteStep) -> None:
        """Append one write call's records."""
        self.written.append(step)

    def add_read(self, step: ReadStep, *, last_p: torch.Tensor, last_c: torch.Tensor) -> None:
        """Append one metered call and keep its final row's ``p_tilde`` and ``c``."""
        self.metered.append(step)
        self.last_p = last_p
        self.last_c = last_c

    def add_tier_b(self, step: TierBStep, *, last_u: torch.Tensor) -> None:
        """Append one call's Tier-B cells and keep its final row's ``c``."""
        self.tier_b_steps.append(step)
        self.last_u = last_u

    def add_audit(self, step: AuditStep) -> None:
        """Append one call's true errors."""
        self.audited.append(step)

    def witnesses(self, part: int) -> torch.Tensor:
        """Band witnesses of logit part ``part`` over every written token ``[B, Hkv, S, bands]``."""
        return _cat([step.witnesses[part] for step in self.written], dim=2)

    def exact(self, slot: int) -> torch.Tensor:
        """The exact entries of cache slot ``slot`` (0 keys, 1 values) ``[B, Hkv, S, d]``.

        Raises:
            InvalidValueError: the cache did not keep exact entries (``audit=False``).
        """
        kept = [step.exact[slot] for step in self.written if step.exact is not None]
        if not kept:
            raise InvalidValueError("audit", False, "no exact entries were kept")
        return _cat(kept, dim=2)

    def value_residuals(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(||v_hat - v||, ||v||)`` per written token ``[B, Hkv, S]`` (dense memories).

        Raises:
            InvalidValueError: the layout has no value slot.
        """
        res = [step.value_res for step in self.written if step.value_res is not None]
        norm = [step.value_norm for step in self.written if step.value_norm is not None]
        if not res or not norm:
            raise InvalidValueError("value_slot", None, "no value residuals were recorded")
        return _cat(res, dim=2), _cat(norm, dim=2)

    @property
    def dither_scales(self) -> list[torch.Tensor]:
        """The dithered key store's float16 block scales, one tensor per write call."""
        return [step.dither_scales for step in self.written if step.dither_scales is not None]

    @property
    def dither_cast(self) -> list[torch.Tensor]:
        """``||fl(x_hat) - x_hat||`` per token, one tensor per write call."""
        return [step.dither_cast for step in self.written if step.dither_cast is not None]

    def _store_record(self) -> KeyStoreRecord | None:
        # The dithered key store's measured bytes and the stability of its outlier pairs.
        pairs = self.outlier_pairs
        if pairs is None:
            return None
        per_token = (sum(s.store_bytes for s in self.written) + self.index_bytes) / self.writes
        later = [s.pair_overlap.reshape(-1) for s in self.written if s.pair_overlap is not None]
        final = None
        if self.pair_energy is not None:  # the energy of every token written, as one "token"
            final = float(_pair_overlap(self.pair_energy.view(1, pairs.shape[0], 1, -1),
                                        pairs).mean())
        return KeyStoreRecord(per_token, outlier_pairs=pairs.to(torch.int64).numpy(),
                              token_overlap=float(torch.cat(later).mean()) if later else None,
                              final_overlap=final)

    def record(self, layer: int) -> LayerRecord:
        """The layer's :class:`LayerRecord` (numpy), one sub-record per path with data."""
        write = read = tier_b = audit = None
        if self.written:
            write = WriteRecord(
                self.writes,
                witness_max=max(float(torch.cat([s.witnesses[i].reshape(-1) for s in self.written])
                                      .max()) for i in range(len(self.written[0].witnesses))),
                witness_full_max=float(torch.cat([s.witness_full.reshape(-1)
                                                  for s in self.written]).max()),
                store=self._store_record())
        steps = self.metered
        if steps and self.last_p is not None and self.last_c is not None:
            bounds = [s.out_bound for s in steps if s.out_bound is not None]
            vscale = [s.value_scale for s in steps if s.value_scale is not None]
            read = ReadRecord(
                self.reads, meter=_cat_np([s.meter for s in steps]),
                eform=_cat_np([s.eform for s in steps]),
                two_sided=_cat_np([s.two_sided for s in steps]),
                c_max=_cat_np([s.c_max for s in steps]),
                positions=torch.cat([s.positions for s in steps]).numpy(),
                q_norm_max=float(torch.stack([s.q_norm for s in steps]).max()),
                last_p=self.last_p.to(torch.float64).numpy(), last_c=self.last_c.numpy(),
                out_bound=_cat_np(bounds) if bounds else None,
                value_scale=_cat_np(vscale) if vscale else None,
                bases=tuple(s.basis for s in steps if s.basis is not None))
        if self.tier_b_steps and self.last_u is not None:
            fixed = [s.fixed_meter for s in self.tier_b_steps if s.fixed_meter is not None]
            tier_b = TierBRecord(_cat_np([s.meter for s in self.tier_b_steps]),
                                 delta_loc=_cat_np([s.delta_loc for s in self.tier_b_steps]),
                                 last_u=self.last_u.numpy(),
                                 fixed_meter=_cat_np(fixed) if fixed else None)
        if self.audited:
            outs = [s.true_out for s in self.audited if s.true_out is not None]
            audit = AuditRecord(_cat_np([s.true_tv for s in self.audited]),
                                true_out=_cat_np(outs) if outs else None)
        return LayerRecord(layer, write=write, read=read, tier_b=tier_b, audit=audit)


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
        defer: hold a small write's record-only norms (band witnesses, residual, value and
            cast norms) until :meth:`record_writes`, which computes those of all held writes
            stacked over layers, and a dithered write's content checks until :meth:`verify`
            (the probe calls both at the end of each forward). ``False``: each write is
            recorded and checked in its ``update`` (e.g. a subclass that reads its log there).
    """

    def __init__(self, *, config: Any, spec: ArchSpec | None, scheme: Scheme | None,
                 request_id: int = 0, audit: bool = False, defer: bool = False) -> None:
        super().__init__(config=config)
        self.defer = defer
        self._unrecorded: list[_Unrecorded] = []
        self.spec = spec
        self.scheme = scheme
        self.request_id = request_id
        self.audit = audit
        self.logs: dict[int, LayerLog] = {}
        self._layers = int(getattr(config, "num_hidden_layers", 0) or 0)
        self._noise_key: tuple[int, int, int, int] | None = None
        self._noise_all: torch.Tensor | None = None
        self._deferred: list[tuple[int, torch.Tensor, Callable[[], DitherEncoding]]] = []

    def verify(self) -> None:
        """Read the deferred content checks of the dithered writes so far in one host sync.

        Raises:
            InvalidValueError: the typed error of the first write whose keys are not finite
                or whose store overflowed or clipped (its quantization rerun with eager checks).
        """
        pending, self._deferred = self._deferred, []
        if not pending or bool(torch.stack([ok for _, ok, _ in pending]).all()):
            return
        for layer, ok, quantize in pending:
            if not bool(ok):
                quantize()  # raises the check's typed error, naming the value
                raise InvalidValueError("dithered store", f"layer {layer}",
                                        "failed a deferred content check")

    def _verify_before(self, layer: int) -> None:
        # A layer writing again starts a new forward: read the previous forward's checks now
        # if no probe did at its end.
        if any(pending == layer for pending, _, _ in self._deferred):
            self.verify()

    def _noise(self, layer: int, start: int, keys: torch.Tensor) -> torch.Tensor | None:
        # The dither of every layer at this write's positions, drawn at the forward's first
        # dithered write in one Philox call and sliced per layer; None (the layer draws its
        # own) past the element budget (a long prefill) or outside the config's layers.
        _, kv_heads, tokens, head_dim = (int(n) for n in keys.shape)
        key = (start, tokens, kv_heads, head_dim)
        if layer >= self._layers or self._layers * kv_heads * tokens * head_dim > _WRITE_BUDGET:
            return None
        if self._noise_key != key or self._noise_all is None:
            self._noise_all = dither_noise_layers(
                request=self.request_id, layers=range(self._layers), kv_heads=kv_heads,
                tokens=torch.arange(start, start + tokens), head_dim=head_dim)
            self._noise_key = key
        return self._noise_all[layer]

    def record_writes(self) -> None:
        """Record every held write (see ``defer``): its norms computed stacked over layers."""
        pending, self._unrecorded = self._unrecorded, []
        spec = self.spec
        if not pending or spec is None:
            return
        groups: dict[tuple[object, ...], list[_Unrecorded]] = {}
        for u in pending:
            key = tuple(None if t is None else tuple(t.shape)
                        for t in (*u.residuals, u.values, u.cast_res))
            groups.setdefault(key, []).append(u)
        for group in groups.values():
            residuals = [torch.stack([u.residuals[i] for u in group]) for i in range(2)]
            witnesses = [round_up_f32(band_norms(residuals[part.slot], bands=part.bands,
                                                 layout=part.layout)).unbind(0)
                         for part in spec.parts]
            # Every per-token norm (||k_hat - k|| of the first logit slot, then ||k - x_hat||,
            # ||v_hat - v||, ||v|| where present) in as few calls as shapes allow.
            casts = [u.cast_res for u in group if u.cast_res is not None]
            vals = [u.values for u in group if u.values is not None]
            rows = [residuals[spec.parts[0].slot]] + ([torch.stack(casts)] if casts else [])
            if spec.value_slot is not None and vals:
                rows += [residuals[spec.value_slot], torch.stack(vals)]
            norms = [n.unbind(0) for n in _norms_up(rows)]
            full = norms.pop(0)
            cast = norms.pop(0) if casts else (None,) * len(group)
            value_res, value_norm = (norms[0], norms[1]) if norms else ((None,) * len(group),) * 2
            for g, u in enumerate(group):
                self.log(u.layer).add_write(u.make(
                    tuple(w[g] for w in witnesses), full[g], value_res=value_res[g],
                    value_norm=value_norm[g], dither_cast=cast[g]))

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
        log = self.log(layer_idx)
        layout = spec.parts[0].layout
        ctx_k, ctx_v = (WriteContext(self.request_id, layer_idx, start, role, layout)
                        for role in (EntryRole.KEY, EntryRole.VALUE))
        scales = overlap = None
        cast_res: torch.Tensor | None = None
        store_bytes = 0.0
        dithered = self.scheme.dithered
        if dithered is not None:
            self._verify_before(layer_idx)
            prefill = log.outlier_pairs is None
            d = int(key_states.shape[-1])
            if log.outlier_pairs is None:  # the prefill fixes the pairs for the request
                log.outlier_pairs = dithered.select(key_states, ctx_k)
                log.dither_exact = exact_channels(log.outlier_pairs, head_dim=d, layout=layout)
            # the scheme's store (DitherSpec.encode), with the layer's kept channel mask, the
            # forward's batched noise and (deferring) its content checks left to verify()
            quantize = partial(dithered.encode, key_states, ctx_k, log.outlier_pairs,
                               exact=log.dither_exact)
            deferred: list[torch.Tensor] | None = [] if self.defer else None
            enc = quantize(noise=self._noise(layer_idx, start, key_states), deferred=deferred)
            if deferred is not None:
                self._deferred.append((layer_idx, deferred[0], quantize))
            scales = enc.scales
            k_hat = enc.read(key_states.dtype)
            # The model reads the reconstruction rounded to its dtype, outliers from their
            # float16 values; that rounding is not dither noise, so it enters the Tier-B
            # bound as a deterministic witness.
            cast_res = k_hat.to(torch.float64) - enc.x_hat
            acc = enc.byte_account()
            log.index_bytes = enc.outlier_pairs.numel() * enc.outlier_pairs.element_size() \
                / max(1, int(enc.outlier_pairs.shape[0]))
            store_bytes = (acc.total - acc.indices) * key_states.shape[-2]
            if dithered.outlier_pairs:
                per_token = pair_energy(key_states, layout=layout)  # [B, Hkv, T, d/2]
                overlap = None if prefill else _pair_overlap(per_token, log.outlier_pairs)
                energy = per_token.sum(dim=(0, 2))
                log.pair_energy = energy if log.pair_energy is None else log.pair_energy + energy
            hats = (k_hat, self.scheme(value_states, ctx_v))
        else:
            hats = (self.scheme(key_states, ctx_k), self.scheme(value_states, ctx_v))
        residuals = (hats[0].to(torch.float64) - slots[0].to(torch.float64),
                     hats[1].to(torch.float64) - slots[1].to(torch.float64))
        values = None if spec.value_slot is None else slots[spec.value_slot].to(torch.float64)
        if any(u.layer == layer_idx for u in self._unrecorded):
            self.record_writes()  # a new forward: the previous one's writes first
        self._unrecorded.append(_Unrecorded(layer_idx, residuals, values, cast_res, partial(
            WriteStep, key_states.shape[-2],
            exact=(key_states.detach(), value_states.detach()) if self.audit else None,
            dither_scales=scales, store_bytes=store_bytes, pair_overlap=overlap)))
        if not self.defer or self._layers * residuals[0].numel() > _WRITE_BUDGET:
            self.record_writes()
        return super().update(  # pyright: ignore[reportUnknownMemberType]
            hats[0], hats[1], layer_idx, *args, **kwargs)


def _pair_overlap(energy: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
    # Per token, the fraction of its own top-m pairs (by its pair energy [B, Hkv, T, d/2])
    # that are among the fixed pairs [Hkv, m].
    m = int(pairs.shape[-1])
    own = torch.topk(energy, m, dim=-1).indices  # [B, Hkv, T, m]
    hit = (own.unsqueeze(-1) == pairs.view(1, pairs.shape[0], 1, 1, m)).any(-1)
    return hit.to(torch.float64).mean(dim=-1)


def _norms_up(rows: list[torch.Tensor]) -> list[torch.Tensor]:
    # round_up_f32(l2_norm_upper(x)) of each tensor; one stacked call when all shapes agree.
    if len({tuple(r.shape) for r in rows}) == 1:
        return list(round_up_f32(l2_norm_upper(torch.stack(rows))).unbind(0))
    return [round_up_f32(l2_norm_upper(r)) for r in rows]


def _expand_heads(x: torch.Tensor, heads: int, *, dim: int = 1) -> torch.Tensor:
    # [B, Hkv, S, ...] -> [B, H, S, ...] (GQA: head h reads kv head h // groups); dim=2 for
    # tensors stacked over a leading layer axis.
    hkv = x.shape[dim]
    if hkv == heads:
        return x
    return x.repeat_interleave(heads // hkv, dim=dim)


@final
@dataclass(frozen=True, slots=True)
class _Unrecorded:
    # One write whose record-only norms are not computed yet: the float64 residuals of both
    # slots, the exact values (dense), the cast residual (dithered) and the rest of its record.
    layer: int
    residuals: tuple[torch.Tensor, torch.Tensor]
    values: torch.Tensor | None
    cast_res: torch.Tensor | None
    make: Callable[..., WriteStep]


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


def _float_down(delta: Probability, parts: int) -> float:
    # delta / parts, rounded down once: a smaller delta_loc keeps the union over the parts
    # within delta.
    return delta.split(parts).float_down()


@final
@dataclass(frozen=True, slots=True)
class LiveRun:
    """What one probed request observed: one :class:`LayerRecord` per attention layer.

    Satisfies :class:`~witcert_adapters.runs.ProbeRun`; cells are indexed
    ``[batch, head, position]``, positions are absolute query positions.

    Attributes:
        scheme: the scheme's name.
        memory_class: :attr:`MemoryKind.DENSE` or :attr:`MemoryKind.LATENT`.
        declared: the ``(layer, path)`` sites the probe declared it would observe.
        records: one record per layer that produced data, keyed by layer index (each
            record's write, read, Tier-B and audit sub-records; see
            :mod:`witcert_adapters.records`).
        tier_b_events: one :class:`TierBEvent` per forward call, in order; empty unless the
            scheme is dithered and the probe was given a ledger.

    Raises:
        InvalidValueError: a record is filed under another layer's index.
    """

    scheme: str
    memory_class: MemoryKind
    declared: frozenset[Site]
    records: Mapping[int, LayerRecord]
    tier_b_events: tuple[TierBEvent, ...] = ()

    def __post_init__(self) -> None:
        for key, rec in self.records.items():
            if key != rec.layer:
                raise InvalidValueError(f"records[{key}]", f"record of layer {rec.layer}",
                                        "must be filed under its own layer index")

    @property
    def layers(self) -> tuple[int, ...]:
        """The layers with a read-side record (metered rows), sorted."""
        return tuple(sorted(k for k, rec in self.records.items() if rec.read is not None))

    @property
    def tier_b_layers(self) -> tuple[int, ...]:
        """The layers with a Tier-B record, sorted."""
        return tuple(sorted(k for k, rec in self.records.items() if rec.tier_b is not None))

    @property
    def observed(self) -> frozenset[Site]:
        """The ``(layer, path)`` sites that produced data."""
        return observed_sites(self.records.values())

    def read(self, layer: int) -> ReadRecord:
        """Layer ``layer``'s read-side record.

        Raises:
            InvalidValueError: the layer metered no row.
        """
        rec = self.records.get(layer)
        if rec is None or rec.read is None:
            raise InvalidValueError("layer", layer, f"metered no row; metered: {self.layers}")
        return rec.read

    def reported(self, layer: int) -> FloatArray:
        """The reported meter ``min(1, raw)`` of a layer."""
        return self.read(layer).reported()

    def reported_tier_b(self, layer: int) -> FloatArray:
        """The reported Tier-B bound ``min(1, raw)`` of a layer.

        Raises:
            InvalidValueError: the layer has no Tier-B record.
        """
        rec = self.records.get(layer)
        if rec is None or rec.tier_b is None:
            raise InvalidValueError("layer", layer,
                                    f"has no Tier-B record; Tier-B layers: {self.tier_b_layers}")
        return rec.tier_b.reported()


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
                b.evidence(TV_EFORM_SOUND, TV_TWO_SIDED_SOUND)  # raises PremiseError
        worst = self._event_bases[int(torch.argmax(maxima))]
        evidence_max = worst.evidence(TV_EFORM_SOUND, TV_TWO_SIDED_SOUND)
        reading = Reading(AttentionTV[AtConsume], raw, evidence=evidence_max, delta=delta.exact)
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
        # the kv-head side, stacked [G, B, Hkv, S, ...]
        kv_side: dict[str, torch.Tensor] = {
            f"w{i}": torch.stack([log.witnesses(i) for log in logs])
            for i in range(len(self.spec.parts))}
        if dense:
            res, norm = zip(*(log.value_residuals() for log in logs), strict=True)
            kv_side["rho"], kv_side["vnorm"] = torch.stack(res), torch.stack(norm)
        if tier_b:
            kv_side["scales"] = torch.stack([_cat(log.dither_scales, dim=2) for log in logs])
            kv_side["cast"] = torch.stack([_cat(log.dither_cast, dim=2) for log in logs])
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
        bounds = tv_bounds_batch(p_tilde, c, check=False,  # validated once per run by the gate
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

        def meter(delta_loc: float) -> tuple[LogitBound[torch.Tensor], TVBatch[torch.Tensor]]:
            parts = [c_parts[i] if part.slot != 0  # not dithered: its deterministic Tier-A part
                     else tier_b_logit_bound(queries[i], scales, cast, scale=scale,
                                             delta_loc=delta_loc, visible=visible, exact=exact)
                     for i, part in enumerate(self.spec.parts)]
            cb = parts[0]
            for extra in parts[1:]:
                cb = cb + extra
            return cb, tv_bounds_batch(p_tilde, cb, check=False, visible=visible)

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
