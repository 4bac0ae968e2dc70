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
from typing import Any, Final

import torch

from witcert_adapters.vllm_plugin.config import PluginConfig, active
from witcert_adapters.vllm_plugin.meter import meter_rows, write_witnesses
from witcert_adapters.vllm_plugin.paged import CacheFormat, cache_format, layer_index, \
    step_requests, stored_keys, visible_keys
from witcert_adapters.vllm_plugin.store import VerdictStore
from witcert_adapters.vllm_plugin.verdicts import Accounts, RequestTally
from witcert_adapters.vllm_plugin.witnesses import Positions, SlotWitnesses, raise_for
from witcert_calculus.errors import EngineMismatchError, WitcertError
from witcert_calculus.witness import RopeLayout

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
        self.kv_cache_dtype = ""
        self.seats = 0
        self.length = 0
        self.buffer: SlotWitnesses | None = None
        self.positions: Positions | None = None
        self.accounts: Accounts | None = None
        self.store = VerdictStore(config.store)
        self.rope: RopeLayout | None = None
        self._writes: dict[int, torch.Tensor] = {}
        self._slots: torch.Tensor | None = None
        self._reads: dict[int, torch.Tensor] = {}
        self._caches: dict[int, tuple[torch.Tensor, float]] = {}
        self._metadata: Any = None
        self._checked: set[int] = set()
        self._scratch = [torch.empty(0, dtype=torch.float64)]

    # ----------------------------------------------------------------- registration
    def add_impl(self, impl: WitcertCPUAttentionImpl) -> None:
        """A layer's implementation was built (at model load, one per attention layer)."""
        fmt = cache_format(impl.kv_cache_dtype)
        if self.fmt is not None and fmt is not self.fmt:
            raise EngineMismatchError("kv_cache_dtype", self.kv_cache_dtype, impl.kv_cache_dtype)
        self.fmt = fmt
        self.kv_cache_dtype = impl.kv_cache_dtype
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
            self.buffer = SlotWitnesses(
                layers=self.n_layers, slots=int(nb * bs), kv_heads=int(kvh),
                bands=self.config.bands, exact_dim=int(two_d // 2) if self.config.audit else None,
                exact_dtype=key.dtype)
            self.positions = Positions(seats=self.seats, length=self.length)
            self.accounts = Accounts(
                layers=self.n_layers, seats=self.seats, tau=self.config.tau,
                audit=self.config.audit, delta_req=self.config.delta_req, session=self.session,
                kv_cache_dtype=self.kv_cache_dtype, form=self.config.form)
            _log.info("witcert: metering %d layers, %d slots, %s cache, audit=%s",
                      self.n_layers, nb * bs, self.kv_cache_dtype, self.config.audit)
        return self.buffer

    # ----------------------------------------------------------------- capture (per layer)
    def wrote(self, layer: int, key: torch.Tensor, kv_cache: torch.Tensor,
              slot_mapping: torch.Tensor, k_scale: float) -> None:
        """Capture a layer's written keys and read them back from the cache."""
        n = int(slot_mapping.shape[0])
        if n == 0 or kv_cache.numel() == 0:
            return
        self._allocate(kv_cache, key)
        assert self.fmt is not None
        if self._slots is None:  # every layer of a step writes the same slots
            self._slots = slot_mapping.to(torch.int64).clone()
        incoming = key[:n].clone()
        if layer not in self._checked:  # once per layer, at its first write (warm-up)
            slots = slot_mapping.to(torch.int64)
            stored = stored_keys([kv_cache], torch.clamp(slots, min=0), fmt=self.fmt,
                                 k_scales=[k_scale])[0]
            self._check_layout(layer, incoming, stored, slots, k_scale)
        self._writes[layer] = incoming
        self._caches[layer] = (kv_cache, k_scale)

    def _check_layout(self, layer: int, incoming: torch.Tensor, stored: torch.Tensor,
                      slots: torch.Tensor, k_scale: float) -> None:
        # The keys read back must be the keys just written: exactly for a cache in the
        # model's dtype, within fp8 rounding (3 mantissa bits) for an fp8 cache. A changed
        # layout reads other elements and misses by the keys' own size.
        ok = slots >= 0
        k = incoming[ok].to(torch.float64)
        s = stored[ok]
        if self.fmt is CacheFormat.MODEL_DTYPE:
            good = bool(torch.equal(k, s))
        else:
            err = (k - s).norm(dim=-1)
            tol = 0.0625 * k.norm(dim=-1) + (2.0 ** -8) * abs(k_scale) * k.shape[-1] ** 0.5
            good = bool((err <= tol).all())
        if not good:
            raise EngineMismatchError(
                f"KV cache key layout (layer {layer}, {self.kv_cache_dtype})",
                "keys stored as [head_dim, block_size] per (block, kv head), read back as written",
                "the keys read back differ from the keys written")
        self._checked.add(layer)

    def read(self, layer: int, query: torch.Tensor, metadata: Any) -> None:
        """Capture a layer's queries (and the step's metadata, shared by every layer)."""
        n = int(metadata.num_actual_tokens)
        if self._metadata is None:
            self._metadata = metadata
        elif metadata is not self._metadata:
            raise EngineMismatchError("attention metadata", "one object shared by every layer",
                                      "layers with different metadata (several KV groups)")
        self._reads[layer] = query[:n].clone()

    # ----------------------------------------------------------------- the step
    def begin(self, scheduler_output: Any) -> None:
        """Before a step: verdicts of finished requests; forget the previous captures."""
        self._writes.clear()
        self._slots = None
        self._reads.clear()
        self._metadata = None
        if self.accounts is None or self.positions is None:
            return
        for seat, verdict in self.accounts.finish_all(scheduler_output.finished_req_ids):
            self.positions.clear(seat)
            self.store.put(verdict)

    def end(self, runner: Any, scheduler_output: Any) -> None:
        """After a step: meter every captured cell and fold it into the accounts."""
        md = self._metadata
        if md is None or not self._reads:
            if self.n_layers == 0 and int(scheduler_output.total_num_scheduled_tokens) > 0:
                raise EngineMismatchError(
                    "attention backend", "CPU_ATTN (re-pointed by the witcert plugin)",
                    "another backend: no layer of the model runs the metered implementation")
            return
        buffer, positions, accounts = self.buffer, self.positions, self.accounts
        assert buffer is not None and positions is not None and accounts is not None
        assert self.fmt is not None
        if self.rope is None:
            self.rope = _rope_layout(runner.get_model())
        bs = int(next(iter(self._caches.values()))[0].shape[2])
        step, requests = step_requests(md, block_size=bs, runner=runner,
                                       scheduler_output=scheduler_output)
        q_lens = step.q_lens.tolist()
        tallies = [accounts.tally(r) for r in requests]
        seats = torch.tensor([t.seat for t in tallies], dtype=torch.int64)
        written = sorted(self._writes)
        read = sorted(self._reads)
        if written:
            assert self._slots is not None
            slots = self._slots[:step.rows]
            incoming = torch.stack([self._writes[i][:step.rows] for i in written])
            stored = stored_keys([self._caches[i][0] for i in written], slots, fmt=self.fmt,
                                 k_scales=[self._caches[i][1] for i in written])
            w = write_witnesses(incoming, stored, bands=self.config.bands, layout=self.rope)
            if len(written) != self.n_layers:  # a layer not captured keeps no witness
                full = torch.full((self.n_layers, *w.shape[1:]), torch.inf,
                                  dtype=torch.float32)
                full[written] = w
                w = full
            exact = None
            if buffer.exact is not None:
                exact = torch.zeros((self.n_layers, *incoming.shape[1:]),
                                    dtype=buffer.exact.dtype)
                exact[written] = incoming.to(buffer.exact.dtype)
            gens = buffer.write(slots, w, exact)
            positions.wrote(seats[step.row_request], step.row_position, slots, gens)
        codes = positions.check(seats, step.slots, step.visible, buffer)
        keys = None
        if self.config.form == "meter" or buffer.exact is not None:
            keys = visible_keys([self._caches[i][0] for i in read], step.slots, fmt=self.fmt,
                                k_scales=[self._caches[i][1] for i in read],
                                scratch=self._scratch)
        every = len(read) == self.n_layers  # slots first: never copy a whole buffer
        witnesses = buffer.witness[:, step.slots]
        witnesses = witnesses if every else witnesses[read]
        exact_keys = None
        if buffer.exact is not None:
            exact_keys = buffer.exact[:, step.slots]
            exact_keys = exact_keys if every else exact_keys[read]
        queries = torch.stack([self._reads[i] for i in read])
        m = meter_rows(step, queries=queries.view(len(read), step.rows, self.num_heads, -1),
                       keys=keys, witnesses=witnesses, scale=self.scale, layout=self.rope,
                       tau=self.config.tau, exact_keys=exact_keys, form=self.config.form)
        evidence = m.basis.evidence(*m.theorems)
        for i, code in enumerate(codes.tolist()):
            if code:
                self._fail(tallies[i], code, step.slots[i], step.visible[i], buffer, positions)
        accounts.add_step(tallies, m.summary.tolist(), q_lens, written=written, read=read,
                          evidence=evidence)

    def _fail(self, t: RequestTally, code: int, slots: torch.Tensor, visible: torch.Tensor,
              buffer: SlotWitnesses, positions: Positions) -> None:
        assert self.accounts is not None
        try:
            raise_for(code, slots, visible, positions.gen[t.seat, :int(slots.shape[0])], buffer)
        except WitcertError as exc:
            self.accounts.fail(t, f"{type(exc).__name__}: {exc}")


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
        self._witcert.wrote(self._index(layer), key, kv_cache, slot_mapping,
                            float(layer._k_scale_float))

    def forward(self, layer: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, attn_metadata: Any, output: torch.Tensor,
                output_scale: torch.Tensor | None = None,
                output_block_scale: torch.Tensor | None = None) -> torch.Tensor:
        out: torch.Tensor = super().forward(layer, query, key, value, kv_cache, attn_metadata,
                                            output, output_scale, output_block_scale)
        if attn_metadata is not None:
            self._witcert.read(self._index(layer), query, attn_metadata)
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
        mon.begin(scheduler_output)
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
