"""The write path of the Hugging Face attachment: a ``DynamicCache`` that compresses and records.

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

Main declarations:

- :class:`WitnessCache`: compresses every write with the registered scheme and records the
  witnesses in each layer's :class:`~witcert_adapters.layer_log.LayerLog`.
"""


from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, final

import torch
from transformers import DynamicCache

from witcert_adapters.architectures import ArchSpec
from witcert_adapters.layer_log import LayerLog, WriteStep, pair_overlap
from witcert_adapters.schemes import EntryRole, Scheme, WriteContext
from witcert_calculus.errors import InvalidValueError
from witcert_kernels.dither import DitherEncoding, dither_noise_layers, exact_channels, pair_energy
from witcert_kernels.meter import band_norms, l2_norm_upper, round_up_f32

__all__ = ["WitnessCache"]

#: Entry elements of one write (one layer's, times the layers) up to which the forward's dither
#: noise is drawn once for every layer (float64: 16 MiB) and a deferring cache's record-only
#: norms wait to run stacked over layers; a larger write (a long prefill, not dispatch bound)
#: draws its own noise and is recorded at once.
_WRITE_BUDGET = 1 << 21


def _norms_up(rows: list[torch.Tensor]) -> list[torch.Tensor]:
    # round_up_f32(l2_norm_upper(x)) of each tensor; one stacked call when all shapes agree.
    if len({tuple(r.shape) for r in rows}) == 1:
        return list(round_up_f32(l2_norm_upper(torch.stack(rows))).unbind(0))
    return [round_up_f32(l2_norm_upper(r)) for r in rows]


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
                overlap = None if prefill else pair_overlap(per_token, log.outlier_pairs)
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
