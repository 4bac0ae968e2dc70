# pyright: reportUnknownMemberType=false, reportUnknownVariableType=false, reportUnknownArgumentType=false, reportUntypedBaseClass=false, reportMissingImports=false, reportAttributeAccessIssue=false, reportUnknownParameterType=false, reportMissingParameterType=false
"""The plugin inside vLLM: the CPU attention backend, wrapped, and the step's accounting.

Attachment, without editing vLLM:

- :func:`attach` (called by the ``vllm.general_plugins`` entry point when the switch is
  on) checks the engine (version, the hooked methods' parameters, the metadata fields)
  and re-points the ``CPU_ATTN`` backend to :class:`WitcertCPUAttentionBackend` through
  vLLM's ``register_backend``;
- :class:`WitcertCPUAttentionImpl` subclasses vLLM's ``CPUAttentionBackendImpl``: after
  the engine writes a layer's keys (``do_kv_cache_update``) it captures the incoming keys
  and reads back the keys as the cache holds them; after the engine's attention
  (``forward``) it captures the queries. Nothing the engine computes is changed;
- the model runner's ``execute_model`` is wrapped (once, in the worker): before the step,
  finished requests get their verdicts; after it, :class:`Monitor` meters the whole step
  at once (:mod:`witcert_adapters.vllm_plugin.meter`) and folds it into the requests'
  accounts (:mod:`witcert_adapters.vllm_plugin.verdicts`).

Everything that differs from what the plugin was written against fails at start-up with
an :class:`~witcert_calculus.errors.EngineMismatchError` naming what differs: another vLLM
version, a hooked method whose parameters changed, a backend other than the CPU one, an
unsupported KV cache dtype or attention feature (sliding window, soft cap, ALiBi, sinks,
shared KV), a cache whose key layout does not read back. The plugin never serves
unmetered while switched on.

Main declarations
-----------------
- :func:`attach`, :func:`check_engine`, :data:`SUPPORTED_VERSIONS`.
- :class:`WitcertCPUAttentionBackend`, :class:`WitcertCPUAttentionImpl`, :class:`Monitor`.
"""

from __future__ import annotations

import inspect
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import torch

from witcert_adapters.repair import RepairPolicy
from witcert_adapters.vllm_plugin.config import PluginConfig, active
from witcert_adapters.vllm_plugin.meter import KeySide, LayerMeter, RowGroup, distinct_bases, \
    merge_bases, meter_layer, meter_layers, row_groups, side_by_side, step_theorems, summarize, \
    write_witnesses
from witcert_adapters.vllm_plugin.paged import CacheFormat, CacheLayout, StepLayout, \
    cache_format, cache_layout, dequantize, element_offsets, layer_index, step_requests, \
    stored_elements, stored_keys
from witcert_adapters.vllm_plugin.quantizer import ROUNDING, bits, check_bytes, engine_codes, \
    float32_scale
from witcert_adapters.vllm_plugin.repair import Gate, LayerRepair
from witcert_adapters.vllm_plugin.store import VerdictStore, track
from witcert_adapters.vllm_plugin.verdicts import Accounts, RequestTally
from witcert_adapters.vllm_plugin.witnesses import Positions, SlotWitnesses, raise_for
from witcert_calculus.errors import EngineMismatchError, InvalidValueError, WitcertError
from witcert_calculus.lean.theorems import TV_EFORM_METER_SOUND, TV_TWO_SIDED_METER_SOUND
from witcert_calculus.meters.tv_forms import TVBasis
from witcert_calculus.meters.witness import RopeLayout
from witcert_kernels.fused import fp8_codes, mismatched_elements
from witcert_kernels.fused import load as load_fused
from witcert_kernels.meter import format_witness

import vllm
from vllm.v1.attention.backends import cpu_attn

__all__ = ["SUPPORTED_VERSIONS", "Monitor", "WitcertCPUAttentionBackend",
           "WitcertCPUAttentionImpl", "attach", "check_engine"]

_log = logging.getLogger("witcert.vllm")

SUPPORTED_VERSIONS: Final = ("0.32.0",)
"""vLLM versions whose hooked methods the plugin was written and tested against."""

_HOOKS: Final = {
    "CPUAttentionBackendImpl.forward": (
        "self", "layer", "query", "key", "value", "kv_cache", "attn_metadata", "output",
        "output_scale", "output_block_scale"),
    "CPUAttentionBackendImpl.do_kv_cache_update": (
        "self", "layer", "key", "value", "kv_cache", "slot_mapping"),
    "GPUModelRunner.execute_model": ("self", "scheduler_output", "intermediate_tensors"),
    "GPUModelRunner._update_states": ("self", "scheduler_output"),
}
_METADATA_FIELDS: Final = ("num_actual_tokens", "query_start_loc", "seq_lens", "block_table",
                           "slot_mapping", "causal")


def _runner_class() -> Any:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    return GPUModelRunner


def check_engine() -> None:
    """Check that this vLLM is the one the plugin hooks into.

    Raises:
        EngineMismatchError: another version, a CPU backend that is missing, a hooked
            method whose parameters changed, or metadata without the fields the meter reads.
    """
    if vllm.__version__ not in SUPPORTED_VERSIONS:
        raise EngineMismatchError("vllm version", ", ".join(SUPPORTED_VERSIONS),
                                  vllm.__version__)
    owners = {"CPUAttentionBackendImpl": cpu_attn.CPUAttentionBackendImpl,
              "GPUModelRunner": _runner_class()}
    for hook, expected in _HOOKS.items():
        owner, method = hook.split(".")
        fn = getattr(owners[owner], method, None)
        if fn is None:
            raise EngineMismatchError(hook, "a method", "missing")
        actual = tuple(inspect.signature(fn).parameters)
        if actual != expected:
            raise EngineMismatchError(f"{hook} parameters", str(expected), str(actual))
    fields = tuple(cpu_attn.CPUAttentionMetadata.__dataclass_fields__)
    missing = [f for f in _METADATA_FIELDS if f not in fields]
    if missing:
        raise EngineMismatchError("CPUAttentionMetadata fields", str(_METADATA_FIELDS),
                                  f"{fields} (missing {missing})")


def _rope_layout(model: Any) -> RopeLayout:
    # Witnesses and queries are both post-RoPE, so any channel partition gives a sound
    # Cauchy-Schwarz bound; bands follow the model's rotary pairs so that they mean what
    # the library's band witnesses mean everywhere else.
    styles = {bool(m.is_neox_style) for m in model.modules() if hasattr(m, "is_neox_style")}
    if styles == {False}:
        return RopeLayout.INTERLEAVED
    return RopeLayout.HALF_SPLIT


@dataclass(slots=True)
class _Step:
    # One engine step's layout and requests, derived once (at the step's first metered read
    # in repair mode, at its end otherwise).
    step: StepLayout
    requests: list[str]
    tallies: list[RequestTally]
    seats: torch.Tensor
    codes: torch.Tensor  # [R] 0, or 1 stale / 2 unwritten (Positions.check)
    groups: list[RowGroup]


class Monitor:
    """The worker's metering state: captures of the current step, side buffer, accounts.

    One per worker process (:func:`monitor`); layers register as their implementation is
    built.
    """

    def __init__(self, config: PluginConfig) -> None:
        self.config = config
        self.session = uuid.uuid4().hex[:12]
        self.n_layers = 0
        self.num_heads = 0
        self.scale = 0.0
        self.fmt: CacheFormat | None = None
        self.layout: CacheLayout | None = None
        self.kv_cache_dtype = ""
        self.seats = 0
        self.length = 0
        self.buffer: SlotWitnesses | None = None
        self.positions: Positions | None = None
        self.accounts: Accounts | None = None
        self.gate: Gate | None = None
        self.store = VerdictStore(config.store)
        # requests an earlier engine on this store died serving get their failed-closed verdicts
        self.store.recover()
        self.rope: RopeLayout | None = None
        self._runner: Any = None
        self._scheduled: Any = None
        self._writes: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._slots: torch.Tensor | None = None
        self._reads: dict[int, torch.Tensor] = {}
        self._caches: dict[int, tuple[torch.Tensor, float, float]] = {}
        self._metered: dict[int, LayerRepair] = {}
        self._bases: list[TVBasis] = []
        self._metadata: Any = None
        self._step: _Step | None = None
        self._mismatch: str | None = None
        self._checked: set[int] = set()  # layers whose bytes were checked at least once
        self._verified: set[int] = set()  # layers whose bytes of this step were checked
        self._model_dtype_writes = True  # every write so far in the cache's own dtype
        self._scratch = [torch.empty(0, dtype=torch.float64)]

    # ----------------------------------------------------------------- registration
    def add_impl(self, impl: WitcertCPUAttentionImpl) -> None:
        """A layer's implementation was built (at model load, one per attention layer)."""
        fmt = cache_format(impl.kv_cache_dtype)
        if self.fmt is not None and fmt is not self.fmt:
            raise EngineMismatchError("kv_cache_dtype", self.kv_cache_dtype, impl.kv_cache_dtype)
        self.fmt = fmt
        self.kv_cache_dtype = impl.kv_cache_dtype
        load_fused()  # the compiled check of writes (and fp8 pass): a failed build refuses
        shape = (int(impl.num_heads), float(impl.scale))
        if self.n_layers and shape != (self.num_heads, self.scale):
            raise EngineMismatchError("attention layers", f"heads and scale {shape}",
                                      f"{(self.num_heads, self.scale)} in another layer")
        self.num_heads, self.scale = shape
        self.n_layers += 1
        from vllm.config import get_current_vllm_config
        cfg = get_current_vllm_config()
        if cfg.use_v2_model_runner:
            raise EngineMismatchError("model runner", "vLLM's V1 model runner (whose "
                                      "execute_model the plugin wraps)", "the V2 model runner")
        self.seats = int(cfg.scheduler_config.max_num_seqs)
        self.length = int(cfg.model_config.max_model_len)

    def index(self, layer: Any) -> int:
        """The attention layer's index, from its name (``model.layers.7.self_attn.attn``)."""
        return layer_index(layer, self.n_layers)

    def _allocate(self, kv_cache: torch.Tensor, key: torch.Tensor) -> SlotWitnesses:
        if self.buffer is None:
            nb, kvh, bs, two_d = kv_cache.shape
            keep = self.config.audit or self.config.repair
            self.buffer = SlotWitnesses(
                layers=self.n_layers, slots=int(nb * bs), kv_heads=int(kvh),
                bands=self.config.bands, exact_dim=int(two_d // 2) if keep else None,
                exact_dtype=key.dtype, values=self.config.repair)
            self.positions = Positions(seats=self.seats, length=self.length)
            self.accounts = Accounts(
                layers=self.n_layers, seats=self.seats, tau=self.config.tau,
                audit=self.config.audit, delta_req=self.config.delta_req, session=self.session,
                kv_cache_dtype=self.kv_cache_dtype, form=self.config.form,
                witness=self.witness_name, repair=self.config.repair, kv_heads=int(kvh))
            track(self.store, self.accounts)
            if self.config.repair:
                self.gate = Gate(seats=self.seats, layers=self.n_layers, kv_heads=int(kvh),
                                 length=self.length, policy=RepairPolicy(self.config.tau))
            _log.info("witcert: metering %d layers, %d slots, %s cache, %s, repair=%s, "
                      "audit=%s", self.n_layers, nb * bs, self.kv_cache_dtype,
                      self.witness_name, self.config.repair, self.config.audit)
        return self.buffer

    @property
    def witness_name(self) -> str:
        """What bounds the keys: ``"format"``, ``"bands=B"`` or ``"format+bands=B"``."""
        parts = (["format"] if self._format_witness else []) + \
            ([f"bands={self.config.bands}"] if self.config.bands else [])
        return "+".join(parts)

    @property
    def _stored_exactly(self) -> bool | None:
        # A model-dtype cache holds the model's keys exactly (every write checked bit for bit,
        # in the model's dtype): every logit bound is 0, and no witness is read. The computed
        # truth of that premise, or None where it does not apply.
        if self.fmt is None or self.fmt.fp8 is not None or not self._model_dtype_writes:
            return None
        return self._model_dtype_writes

    @property
    def _format_witness(self) -> bool:
        return self.config.format_witness or self.config.bands == 0

    # ----------------------------------------------------------------- capture (per layer)
    def wrote(self, layer: int, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
              slot_mapping: torch.Tensor, k_scale: float, v_scale: float, isa: str) -> None:
        """Capture a layer's written keys and values (their stored bytes are checked,
        every layer at once, before the layer is metered: :meth:`_check_writes`).

        Raises:
            EngineMismatchError: at a layer's first write (start-up), an ISA whose layout the
                plugin does not read, a scale float32 does not hold, or keys a model-dtype
                cache rounds without band witnesses.
        """
        n = int(slot_mapping.shape[0])
        if n == 0 or kv_cache.numel() == 0:
            return
        self._allocate(kv_cache, key)
        layout = cache_layout(isa)
        if self.layout is None:
            self.layout = layout
        elif layout is not self.layout:
            raise EngineMismatchError("CPU attention ISA", self.layout.value, isa)
        if layer not in self._checked and self.fmt is not None and self.fmt.fp8 is not None:
            for what, scale in (("key", k_scale), ("value", v_scale)):
                try:
                    float32_scale(scale)
                except InvalidValueError as exc:
                    raise EngineMismatchError(f"{what} scale (layer {layer})",
                                              "a positive finite scale float32 holds",
                                              repr(scale)) from exc
        if self.fmt is not None and self.fmt.fp8 is None and key.dtype != kv_cache.dtype:
            # the cache rounds the model's keys: only band witnesses bound that residual
            if self.config.bands == 0 and layer not in self._checked:
                raise EngineMismatchError(f"key dtype (layer {layer})",
                                          f"the cache's {kv_cache.dtype} (stored exactly) or "
                                          "band witnesses (bands >= 1)", str(key.dtype))
            self._model_dtype_writes = False
        if self._slots is None:  # every layer of a step writes the same slots
            self._slots = slot_mapping.to(torch.int64, copy=True)
        self._writes[layer] = (key[:n].clone(), value[:n].clone())
        self._caches[layer] = (kv_cache, k_scale, v_scale)

    def _check_writes(self, layers: list[int]) -> None:
        # The elements the engine stored must be the model's, exactly, keys and values: the
        # layout, the quantizer and the scale, checked on every write (the step's layers at
        # once; a layer with a difference is then named by slot, kv head and channel).
        # Raises EngineMismatchError at a layer's first write (start-up); later, the step's
        # requests fail closed.
        assert self.fmt is not None and self.layout is not None and self._slots is not None
        todo = [i for i in layers if i in self._writes and i not in self._verified]
        if not todo:
            return
        self._verified.update(todo)
        n = int(self._writes[todo[0]][0].shape[0])
        slots = self._slots[:n]
        ok = slots >= 0
        every = bool(ok.all())
        written = slots if every else slots[ok]
        fp8 = self.fmt.fp8
        caches = [self._caches[i][0] for i in todo]
        for part, what in ((0, "key"), (1, "value")):
            elements = torch.stack([self._writes[i][part] for i in todo])
            if not every:
                elements = elements[:, ok]
            if fp8 is None:
                want = elements.to(caches[0].dtype)
            else:  # every layer's bytes at once, each layer at its own scale
                scales = [self._caches[i][1] if part == 0 else self._caches[i][2] for i in todo]
                want = engine_codes(elements, scale=scales, fmt=fp8)
            # every layer compared in place, in one compiled call (the torch gather below
            # only names a difference, or reads caches that are not one contiguous shape)
            offsets = element_offsets(caches, written, layout=self.layout, part=part)
            if offsets is not None and not bool(
                    mismatched_elements(caches, *offsets, want.unbind()).any()):
                continue
            stored = stored_elements(caches, written, layout=self.layout, part=part)
            if offsets is None and bool((bits(stored) == bits(want)).all()):
                continue
            for k, layer in enumerate(todo):
                try:
                    check_bytes(stored[k], want[k], what=what, layer=layer, slots=written)
                except EngineMismatchError as exc:
                    if layer not in self._checked:
                        raise
                    if self._mismatch is None:
                        self._mismatch = f"{type(exc).__name__}: {exc}"
        self._checked.update(todo)

    def read(self, layer: int, query: torch.Tensor, metadata: Any, output: torch.Tensor
             ) -> None:
        """Capture a layer's queries (and the step's metadata, shared by every layer); with
        repair on, meter the layer now and repair its output in place."""
        n = int(metadata.num_actual_tokens)
        if self._metadata is None:
            self._metadata = metadata
        elif metadata is not self._metadata:
            raise EngineMismatchError("attention metadata", "one object shared by every layer",
                                      "layers with different metadata (several KV groups)")
        self._reads[layer] = query[:n].clone()
        if self.gate is not None and self.buffer is not None:
            self._repair(layer, output[:n].view(n, self.num_heads, -1))

    # ----------------------------------------------------------------- the step
    def begin(self, runner: Any, scheduler_output: Any) -> None:
        """Before a step: verdicts of finished requests; forget the previous captures."""
        self._writes.clear()
        self._verified.clear()
        self._slots = None
        self._reads.clear()
        self._metered.clear()
        self._bases.clear()
        self._metadata = None
        self._step = None
        self._mismatch = None
        self._runner, self._scheduled = runner, scheduler_output
        if self.accounts is None or self.positions is None:
            return
        for seat, verdict in self.accounts.finish_all(scheduler_output.finished_req_ids):
            self.positions.clear(seat)
            if self.gate is not None:
                self.gate.clear(seat)
            self.store.put(verdict)

    def _prepare(self) -> _Step:
        # The step's layout and requests; the written slots' generations; each request's
        # visible slots checked against what it expects (stale or unwritten slots found).
        if self._step is not None:
            return self._step
        buffer, positions, accounts = self.buffer, self.positions, self.accounts
        assert buffer is not None and positions is not None and accounts is not None
        if self.rope is None:
            self.rope = _rope_layout(self._runner.get_model())
        bs = int(next(iter(self._caches.values()))[0].shape[2])
        step, requests = step_requests(self._metadata, block_size=bs, runner=self._runner,
                                       scheduler_output=self._scheduled)
        tallies = [accounts.tally(r) for r in requests]
        seats = torch.tensor([t.seat for t in tallies], dtype=torch.int64)
        if self._writes:
            assert self._slots is not None
            slots = self._slots[:step.rows]
            gens = buffer.bump(slots)
            positions.wrote(seats[step.row_request], step.row_position, slots, gens)
        codes = positions.check(seats, step.slots, step.visible, buffer)
        self._step = _Step(step, requests, tallies, seats, codes, row_groups(step))
        return self._step

    def _put_witnesses(self, layers: list[int], rows: int) -> None:
        # The written slots' band witnesses (and exact entries) of ``layers``, at once.
        buffer = self.buffer
        assert buffer is not None and self.fmt is not None and self.rope is not None
        assert self._slots is not None and self.layout is not None
        slots = self._slots[:rows]
        incoming = torch.stack([self._writes[i][0][:rows] for i in layers])
        w = torch.zeros((len(layers), rows, incoming.shape[2], self.config.bands),
                        dtype=torch.float32)
        if self.config.bands:
            stored = stored_keys([self._caches[i][0] for i in layers], slots, fmt=self.fmt,
                                 k_scales=[self._caches[i][1] for i in layers],
                                 layout=self.layout)
            w = write_witnesses(incoming, stored, bands=self.config.bands, layout=self.rope)
        exact = incoming if buffer.exact is not None else None
        values = torch.stack([self._writes[i][1][:rows] for i in layers]) \
            if buffer.exact_values is not None else None
        buffer.put(torch.tensor(layers), slots, w, exact, values)

    def _side(self, layers: list[int], step: StepLayout) -> tuple[KeySide, torch.Tensor | None]:
        # What the meter of ``layers`` reads of the visible keys, stacked per layer
        # (:func:`side_by_side` turns it into one layer's), and, for the gate (one layer),
        # the stored values: one gather of the raw elements, dequantized exactly.
        buffer = self.buffer
        assert buffer is not None and self.fmt is not None and self.layout is not None
        caches = [self._caches[i][0] for i in layers]
        k_scales = [self._caches[i][1] for i in layers]
        keys = bounds = codes = None
        fp8 = self.fmt.fp8
        exactly = self._stored_exactly
        need_keys = self.config.form == "meter" or buffer.exact is not None or \
            (self.config.form == "cascade" and exactly is None)
        offsets = None
        if fp8 is not None and self._format_witness and self.gate is None:
            offsets = element_offsets(caches, step.slots, layout=self.layout, heads_first=True)
        if offsets is not None and fp8 is not None:
            # the logits and the format bound read from the cache's bytes in one compiled pass
            codes = fp8_codes(caches, *offsets, fmt=fp8, rounding=ROUNDING,
                              scales=[float32_scale(s) for s in k_scales])
        elif need_keys or (self._format_witness and exactly is None):
            raw = stored_elements(caches, step.slots, layout=self.layout, heads_first=True)
            if need_keys:
                keys = dequantize(raw, fmt=self.fmt, scales=k_scales,
                                  scratch=None if self.gate is not None else self._scratch)
            if self._format_witness and fp8 is not None:
                bounds = torch.stack([format_witness(raw[k], fmt=fp8, rounding=ROUNDING,
                                                     scale=float32_scale(k_scales[k]))
                                      for k in range(len(layers))])
        index = (torch.tensor(layers).view(-1, 1, 1), step.slots.unsqueeze(0))  # [L, R, S]
        witnesses = buffer.witness[index] if self.config.bands and exactly is None else None
        exact = buffer.exact[index] if self.config.audit and buffer.exact is not None else None
        values = None
        if self.gate is not None:
            (layer,) = layers
            raw_v = stored_elements(caches, step.slots, layout=self.layout, part=1,
                                    heads_first=True)
            values = dequantize(raw_v, fmt=self.fmt, scales=[self._caches[layer][2]])[0]
        return KeySide(keys, witnesses, bounds, exact, exactly, codes), values

    def _queries(self, layers: list[int], step: StepLayout, side: KeySide | None = None
                 ) -> torch.Tensor:
        # [L, rows, heads, d]; their shape alone where the meter reads no query value
        reads = [self._reads[i].reshape(step.rows, self.num_heads, -1) for i in layers]
        if side is not None and not side.reads_queries:
            return torch.zeros((), dtype=reads[0].dtype).expand(len(layers), *reads[0].shape)
        return torch.stack(reads)

    def _meter(self, layer: int, step: StepLayout, side: KeySide, groups: list[RowGroup], *,
               keep: bool = False) -> LayerMeter:
        # One layer (the gate's), its side already one layer's.
        return meter_layer(step, queries=self._queries([layer], step)[0], side=side,
                           kv_heads=int(self._caches[layer][0].shape[1]), scale=self.scale,
                           layout=self.rope or RopeLayout.HALF_SPLIT, form=self.config.form,
                           groups=groups, keep=keep, tau=self.config.tau)

    def _chunks(self, layers: list[int], step: StepLayout, groups: list[RowGroup]
                ) -> list[list[int]]:
        # Layers metered together: as many as keep a chunk's largest tensors (the float64
        # keys, and a row group's weights and bounds: its rows x heads x visible tokens)
        # within _CHUNK_ELEMENTS, one layer at least.
        if not layers:
            return []
        cache = self._caches[layers[0]][0]
        r, width = (int(n) for n in step.slots.shape)
        if self._stored_exactly and self.config.form != "meter" and not self.config.audit:
            per_layer = step.rows * self.num_heads  # no key read: one bound per cell
        else:
            rows = max((int(g.rows.numel()) for g in groups), default=step.rows)
            per_layer = max(r * int(cache.shape[1]) * int(cache.shape[3]) // 2,
                            rows * self.num_heads) * width
        size = max(1, _CHUNK_ELEMENTS // max(1, per_layer))
        return [layers[k:k + size] for k in range(0, len(layers), size)]

    def _repair(self, layer: int, output: torch.Tensor) -> None:
        # Repair mode: meter this layer now, repair its cells above tau in the output.
        if layer not in self._writes:
            return  # a layer that never wrote keeps no witness: coverage fails at the end
        st = self._prepare()
        buffer, positions, gate = self.buffer, self.positions, self.gate
        assert buffer is not None and positions is not None and gate is not None
        self._check_writes([layer])
        self._put_witnesses([layer], st.step.rows)
        stacked, values = self._side([layer], st.step)
        side = side_by_side(stacked)
        lm = self._meter(layer, st.step, side, st.groups, keep=True)
        assert values is not None
        ok = (st.codes == 0) & (self._mismatch is None)
        try:
            last = torch.zeros(st.step.rows, dtype=torch.bool)
            last[torch.cumsum(st.step.q_lens, 0) - 1] = True  # each request's last row
            done = gate.repair(layer, st.step, lm, side, seats=st.seats, ok=ok, buffer=buffer,
                               positions=positions, values=values, output=output,
                               remeter=lambda mixed, groups: self._meter(
                                   layer, st.step, mixed, groups, keep=True),
                               rows=None if self.config.repair_every_row else last)
        except WitcertError as exc:  # a backing-store read refused: fail the step closed
            self._mismatch = f"{type(exc).__name__}: {exc}"
            zeros = torch.zeros(st.step.requests, dtype=torch.int64)
            done = LayerRepair(lm.meter, lm.true_tv, zeros, zeros, zeros, zeros,
                               zeros.to(torch.float64), (lm.basis,))
        self._metered[layer] = done
        self._bases.extend(done.bases)

    def end(self, runner: Any, scheduler_output: Any) -> None:
        """After a step: meter every captured cell (repair mode: gather what each layer's
        repair metered) and fold it into the accounts."""
        md = self._metadata
        if md is None or not self._reads:
            if self.n_layers == 0 and int(scheduler_output.total_num_scheduled_tokens) > 0:
                raise EngineMismatchError(
                    "attention backend", "CPU_ATTN (re-pointed by the witcert plugin)",
                    "another backend: no layer of the model runs the metered implementation")
            return
        accounts = self.accounts
        assert accounts is not None and self.buffer is not None and self.positions is not None
        st = self._prepare()
        step = st.step
        written = sorted(self._writes)
        read = sorted(self._reads)
        self._check_writes(written)
        if self.gate is None:
            if written:
                self._put_witnesses(written, step.rows)
            metered = [i for i in read if i in self._caches]
            layers: list[LayerMeter] = []
            for chunk in self._chunks(metered, step, st.groups):
                side = self._side(chunk, step)[0]
                layers += meter_layers(step, queries=self._queries(chunk, step, side), side=side,
                                       kv_heads=int(self._caches[chunk[0]][0].shape[1]),
                                       scale=self.scale, layout=self.rope or RopeLayout.HALF_SPLIT,
                                       form=self.config.form, groups=st.groups,
                                       tau=self.config.tau)
            meters = {i: m.meter for i, m in zip(metered, layers, strict=True)}
            trues = {i: m.true_tv for i, m in zip(metered, layers, strict=True)}
            tanhs = {i: m.by_tanh for i, m in zip(metered, layers, strict=True)}
            bases = distinct_bases(layers)
            theorems = step_theorems(layers) if layers else (TV_EFORM_METER_SOUND, TV_TWO_SIDED_METER_SOUND)
        else:
            meters = {i: m.meter for i, m in self._metered.items()}
            trues = {i: m.true_tv for i, m in self._metered.items()}
            tanhs = {}
            bases = self._bases
            theorems = (TV_EFORM_METER_SOUND, TV_TWO_SIDED_METER_SOUND)
            accounts.add_repairs(st.tallies, list(self._metered.values()),
                                 step.seq_lens.tolist())
        # a layer that read without writing witnesses keeps none: its cells saturate
        full = torch.full((len(read), step.rows, self.num_heads), torch.inf, dtype=torch.float64)
        by_tanh = None if not any(t is not None for t in tanhs.values()) else \
            torch.zeros(full.shape, dtype=torch.bool)
        for k, i in enumerate(read):
            if i in meters:
                full[k] = meters[i]
                t = tanhs.get(i)
                if by_tanh is not None and t is not None:
                    by_tanh[k] = t
        audited = None
        if self.config.audit and all(trues.get(i) is not None for i in read):
            audited = torch.stack([trues[i] for i in read])  # type: ignore[misc]
        summary = summarize(full, audited, step, tau=self.config.tau, by_tanh=by_tanh)
        evidence = merge_bases(bases).evidence(*theorems) if bases else None
        for i, code in enumerate(st.codes.tolist()):
            if code:
                self._fail(st.tallies[i], code, step.slots[i], step.visible[i], self.buffer,
                           self.positions)
            elif self._mismatch is not None:
                accounts.fail(st.tallies[i], self._mismatch)
            elif evidence is None:  # no evidence, no certificate
                accounts.fail(st.tallies[i], "no layer of the step was metered")
        accounts.add_step(st.tallies, summary.tolist(), step.q_lens.tolist(), written=written,
                          read=[i for i in read if i in meters], evidence=evidence)

    def _fail(self, t: RequestTally, code: int, slots: torch.Tensor, visible: torch.Tensor,
              buffer: SlotWitnesses, positions: Positions) -> None:
        assert self.accounts is not None
        try:
            raise_for(code, slots, visible, positions.gen[t.seat, :int(slots.shape[0])], buffer)
        except WitcertError as exc:
            self.accounts.fail(t, f"{type(exc).__name__}: {exc}")


_CHUNK_ELEMENTS: Final = 1 << 22
"""Elements of the largest float64 tensor of a chunk of layers metered at once (32 MiB)."""

_monitor: Monitor | None = None


def monitor() -> Monitor:
    """This process's :class:`Monitor` (created on first use; the switch must be on)."""
    global _monitor
    if _monitor is None:
        config = active()
        if config is None:
            raise EngineMismatchError("plugin switch", "WITCERT_VLLM set", "unset")
        _monitor = Monitor(config)
    return _monitor


class WitcertCPUAttentionImpl(cpu_attn.CPUAttentionBackendImpl):  # type: ignore[misc]
    """vLLM's CPU attention, unchanged, with the plugin's captures after each call."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        bound = inspect.signature(cpu_attn.CPUAttentionBackendImpl.__init__).bind(
            self, *args, **kwargs)
        bound.apply_defaults()
        given = bound.arguments
        unsupported = {
            "attn_type": ("attention type", "decoder"),
            "sliding_window": ("sliding window", None),
            "logits_soft_cap": ("logits soft cap", None),
            "alibi_slopes": ("ALiBi slopes", None),
            "sinks": ("attention sinks", None),
            "kv_sharing_target_layer_name": ("shared KV cache", None),
        }
        for name, (what, expected) in unsupported.items():
            if given.get(name, expected) != expected:
                raise EngineMismatchError(what, f"{expected} (the plugin meters plain causal "
                                          "softmax attention)", repr(given.get(name)))
        try:
            cache_format(str(given["kv_cache_dtype"]))
        except WitcertError as exc:
            raise EngineMismatchError("kv_cache_dtype", "auto, fp8, fp8_e4m3 or fp8_e5m2",
                                      str(given["kv_cache_dtype"])) from exc
        super().__init__(*args, **kwargs)
        self._witcert_layer: int | None = None
        self._witcert = monitor()
        self._witcert.add_impl(self)

    def _index(self, layer: Any) -> int:
        if self._witcert_layer is None:
            self._witcert_layer = self._witcert.index(layer)
        return self._witcert_layer

    def do_kv_cache_update(self, layer: Any, key: torch.Tensor, value: torch.Tensor,
                           kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        super().do_kv_cache_update(layer, key, value, kv_cache, slot_mapping)
        self._witcert.wrote(self._index(layer), key, value, kv_cache, slot_mapping,
                            float(layer._k_scale_float), float(layer._v_scale_float),
                            str(getattr(layer, "isa", "")))

    def forward(self, layer: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, attn_metadata: Any, output: torch.Tensor,
                output_scale: torch.Tensor | None = None,
                output_block_scale: torch.Tensor | None = None) -> torch.Tensor:
        out: torch.Tensor = super().forward(layer, query, key, value, kv_cache, attn_metadata,
                                            output, output_scale, output_block_scale)
        if attn_metadata is not None:
            self._witcert.read(self._index(layer), query, attn_metadata, output)
        return out


class WitcertCPUAttentionBackend(cpu_attn.CPUAttentionBackend):  # type: ignore[misc]
    """vLLM's CPU attention backend with :class:`WitcertCPUAttentionImpl`."""

    @staticmethod
    def get_impl_cls() -> type[WitcertCPUAttentionImpl]:
        return WitcertCPUAttentionImpl


_wrapped = False


def _wrap_runner(get_monitor: Callable[[], Any]) -> None:
    # the step's accounting around the model runner's step: ``begin`` and ``end`` of the
    # monitor ``get_monitor`` returns (the CPU path's :class:`Monitor`, or the Triton path's)
    global _wrapped
    if _wrapped:
        return
    runner_cls = _runner_class()
    original = runner_cls.execute_model

    def execute_model(self: Any, scheduler_output: Any, intermediate_tensors: Any = None) -> Any:
        mon = get_monitor()
        mon.begin(self, scheduler_output)
        out = original(self, scheduler_output, intermediate_tensors)
        mon.end(self, scheduler_output)
        return out

    execute_model.__wrapped__ = original  # type: ignore[attr-defined]
    runner_cls.execute_model = execute_model
    _wrapped = True


def attach() -> None:
    """Switch the plugin on in this process (the entry point calls it when the switch is on).

    Raises:
        EngineMismatchError: the engine is not the one the plugin supports (see
            :func:`check_engine`), or the platform is neither vLLM's CPU platform nor a
            GPU served by the Triton backend (:mod:`.triton_path`).
    """
    check_engine()
    from vllm.platforms import current_platform
    if current_platform.is_cuda_alike():  # GPUs serve through the Triton backend
        from witcert_adapters.vllm_plugin.triton_path import attach_triton
        config = active()
        if config is None:
            raise EngineMismatchError("plugin switch", "WITCERT_VLLM set", "unset")
        mon = attach_triton(config)
        _wrap_runner(lambda: mon)
        return
    if not current_platform.is_cpu():
        raise EngineMismatchError("platform", "cpu (the CPU_ATTN backend)",
                                  str(current_platform.device_type))
    from vllm.v1.attention.backends.registry import (
        AttentionBackendEnum, register_backend)
    register_backend(AttentionBackendEnum.CPU_ATTN,
                     f"{__name__}.{WitcertCPUAttentionBackend.__name__}")
    _wrap_runner(monitor)
