# pyright: reportUnknownMemberType=false, reportUnknownVariableType=false, reportUnknownArgumentType=false, reportUntypedBaseClass=false, reportMissingImports=false, reportAttributeAccessIssue=false, reportUnknownParameterType=false, reportMissingParameterType=false
"""vLLM's Triton attention backend, re-pointed to the metered ``unified_attention``.

On GPUs vLLM serves attention through ``TritonAttentionImpl`` (``TRITON_ATTN``), whose
``forward`` calls the module-level ``unified_attention`` of
``vllm/v1/attention/ops/triton_unified_attention.py``. Without editing vLLM's files:

- :func:`check_triton_backend` checks the installed backend against what the route was
  written for (the parameters of ``forward``, ``do_kv_cache_update``, ``__init__`` and
  ``unified_attention``, and that ``forward`` reaches the kernel through the global name
  ``unified_attention``), refusing with an
  :class:`~witcert_calculus.errors.EngineMismatchError` naming what differs;
- :func:`routed_forward` is ``TritonAttentionImpl.forward``'s own code with that one global
  re-pointed to another callable (the code object is reused, not re-written);
- :class:`WitcertTritonAttentionImpl` subclasses ``TritonAttentionImpl``: after the engine
  writes a layer's keys it writes their band witnesses into a side buffer laid out per block
  slot like the key cache, one buffer per cache tensor (slots never written hold ``inf``:
  they saturate the bound, they never pass it; the fused rotary cache write, which would
  bypass the witnesses, is switched off), and its ``forward`` runs the upstream ``forward`` with the kernel call
  routed to :func:`witcert_adapters.vllm_plugin.unified.metered_unified_attention`, which
  writes the output bit for bit as upstream does and leaves the call's
  :class:`~witcert_adapters.vllm_plugin.unified.UnifiedCertificate` on the implementation;
- :func:`attach_triton` (called by :func:`witcert_adapters.vllm_plugin.engine.attach` on a
  platform other than the CPU) re-points the ``TRITON_ATTN`` backend to
  :class:`WitcertTritonAttentionBackend` through vLLM's ``register_backend`` and returns the
  worker's :class:`TritonMonitor`, which the engine runs around each model-runner step: it
  collects every layer's certificate of the step and folds the step into the requests'
  ledger accounts and tallies exactly as the CPU path does
  (:class:`~witcert_adapters.vllm_plugin.verdicts.Accounts`, the summary of
  :func:`~witcert_adapters.vllm_plugin.meter.summary_columns`; coverage records keyed by
  ``(layer, path)``: a layer that wrote or read nothing in a step fails the request's
  coverage), and writes each finished request's verdict to the verdict store.

Main declarations
-----------------
- :func:`check_triton_backend`, :func:`routed_forward`, :func:`attach_triton`.
- :class:`WitcertTritonAttentionImpl`, :class:`WitcertTritonAttentionBackend`,
  :class:`TritonMonitor`.
"""

from __future__ import annotations

import inspect
import types
import uuid
from collections.abc import Callable
from typing import Any, Final

import torch

from witcert_adapters.vllm_plugin.config import PluginConfig
from witcert_adapters.vllm_plugin.meter import SUMMARY, summary_columns
from witcert_adapters.vllm_plugin.paged import layer_index, step_requests
from witcert_adapters.vllm_plugin.store import VerdictStore, track
from witcert_adapters.vllm_plugin.unified import UnifiedCertificate, metered_unified_attention
from witcert_adapters.vllm_plugin.verdicts import Accounts
from witcert_calculus.errors import EngineMismatchError, WitcertError
from witcert_calculus.lean.theorems import TV_EFORM_METER_SOUND, TV_TWO_SIDED_METER_SOUND
from witcert_calculus.meters.witness import RopeLayout
from witcert_kernels.triton_witness import witness_write

from vllm.v1.attention.backends import triton_attn

__all__ = ["KERNEL_GLOBAL", "TritonMonitor", "WitcertTritonAttentionBackend",
           "WitcertTritonAttentionImpl", "attach_triton", "check_triton_backend",
           "routed_forward"]

KERNEL_GLOBAL: Final = "unified_attention"
"""The global name through which ``TritonAttentionImpl.forward`` reaches the kernel."""

_HOOKS: Final = {
    "forward": ("self", "layer", "query", "key", "value", "kv_cache", "attn_metadata", "output",
                "output_scale", "output_block_scale"),
    "do_kv_cache_update": ("self", "layer", "key", "value", "kv_cache", "slot_mapping"),
    "__init__": ("self", "num_heads", "head_size", "scale", "num_kv_heads", "alibi_slopes",
                 "sliding_window", "kv_cache_dtype", "logits_soft_cap", "attn_type",
                 "kv_sharing_target_layer_name", "sinks", "use_alibi_sqrt", "chunk_lookback"),
}
_KERNEL_PARAMETERS: Final = (
    "q", "k", "v", "out", "cu_seqlens_q", "max_seqlen_q", "seqused_k", "max_seqlen_k",
    "softmax_scale", "causal", "window_size", "block_table", "softcap", "q_descale",
    "k_descale", "v_descale", "seq_threshold_3D", "num_par_softmax_segments",
    "softmax_segm_output", "softmax_segm_max", "softmax_segm_expsum", "alibi_slopes",
    "output_scale", "qq_bias", "sinks", "mm_prefix_range", "rswa_prefix_lens", "rswa_window",
    "use_alibi_sqrt", "kv_quant_mode", "k_scale_cache", "v_scale_cache", "chunk_lookback",
    "use_td", "mm_prefix_clamp_sliding_window")

# constructor arguments whose features the meter does not follow, and the value each must have
_UNSUPPORTED: Final = {
    "attn_type": ("attention type", "decoder"),
    "sliding_window": ("sliding window", None),
    "logits_soft_cap": ("logits soft cap", None),
    "alibi_slopes": ("ALiBi slopes", None),
    "sinks": ("attention sinks", None),
    "kv_sharing_target_layer_name": ("shared KV cache", None),
    "use_alibi_sqrt": ("ALiBi square root", False),
    "chunk_lookback": ("chunked attention", -1),
}
_CACHE_DTYPES: Final = ("auto",)  # the model's dtype: the kernel reads the keys as stored


def _parameters(fn: Any) -> tuple[str, ...]:
    return tuple(inspect.signature(fn).parameters)


def check_triton_backend(impl_cls: Any = None) -> None:
    """Check that ``impl_cls`` (default: vLLM's ``TritonAttentionImpl``) is the one the route
    was written for.

    Raises:
        EngineMismatchError: a hooked method missing or with other parameters, a ``forward``
            that does not call the kernel through the global ``unified_attention``, that
            global bound to something other than vLLM's kernel wrapper, or a kernel wrapper
            with other parameters.
    """
    cls = triton_attn.TritonAttentionImpl if impl_cls is None else impl_cls
    for method, expected in _HOOKS.items():
        fn = getattr(cls, method, None)
        if fn is None or not callable(fn):
            raise EngineMismatchError(f"TritonAttentionImpl.{method}", "a method", "missing")
        actual = _parameters(fn)
        if actual != expected:
            raise EngineMismatchError(f"TritonAttentionImpl.{method} parameters", str(expected),
                                      str(actual))
    if getattr(triton_attn.TritonAttentionBackend, "forward_includes_kv_cache_update",
               True) is not False:
        raise EngineMismatchError("TritonAttentionBackend.forward_includes_kv_cache_update",
                                  "False (keys written by do_kv_cache_update, which writes "
                                  "their witnesses)", "True or missing")
    forward = cls.forward
    code = getattr(forward, "__code__", None)
    if code is None or KERNEL_GLOBAL not in code.co_names:
        raise EngineMismatchError("TritonAttentionImpl.forward",
                                  f"a call of the global {KERNEL_GLOBAL!r}",
                                  "no such name in its code")
    kernel = forward.__globals__.get(KERNEL_GLOBAL)
    from vllm.v1.attention.ops import triton_unified_attention
    if kernel is not triton_unified_attention.unified_attention:
        raise EngineMismatchError(f"TritonAttentionImpl.forward's {KERNEL_GLOBAL}",
                                  f"{triton_unified_attention.__name__}.unified_attention",
                                  repr(kernel))
    actual = _parameters(kernel)
    if actual != _KERNEL_PARAMETERS:
        raise EngineMismatchError("unified_attention parameters", str(_KERNEL_PARAMETERS),
                                  str(actual))


def routed_forward(kernel: Callable[..., Any], *, impl_cls: Any = None
                   ) -> Callable[..., torch.Tensor]:
    """``impl_cls.forward`` (default ``TritonAttentionImpl.forward``), the same code, with
    the global ``unified_attention`` it calls re-pointed to ``kernel``.

    Raises:
        EngineMismatchError: the class is not the one the route was written for
            (:func:`check_triton_backend`).
    """
    cls = triton_attn.TritonAttentionImpl if impl_cls is None else impl_cls
    check_triton_backend(cls)
    fn = cls.forward
    scope = dict(fn.__globals__)
    scope[KERNEL_GLOBAL] = kernel
    routed = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__,
                                fn.__closure__)
    routed.__kwdefaults__ = fn.__kwdefaults__
    routed.__qualname__ = fn.__qualname__
    routed.__doc__ = fn.__doc__
    return routed


class WitcertTritonAttentionImpl(triton_attn.TritonAttentionImpl):  # type: ignore[misc]
    """vLLM's Triton attention with band witnesses written at each KV write and the kernel
    call metered (its output unchanged); :attr:`certificate` is the last call's."""

    bands: int = 4
    layout: RopeLayout = RopeLayout.HALF_SPLIT

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        bound = inspect.signature(triton_attn.TritonAttentionImpl.__init__).bind(
            self, *args, **kwargs)
        bound.apply_defaults()
        given = bound.arguments
        for name, (what, expected) in _UNSUPPORTED.items():
            value = given.get(name, expected)
            same = value is expected or (not isinstance(value, torch.Tensor)
                                         and bool(value == expected))
            if not same:
                raise EngineMismatchError(what, f"{expected} (the metered kernel follows plain "
                                          "causal softmax attention)", repr(value))
        if str(given["kv_cache_dtype"]) not in _CACHE_DTYPES:
            raise EngineMismatchError("kv_cache_dtype", ", ".join(_CACHE_DTYPES),
                                      str(given["kv_cache_dtype"]))
        check_triton_backend()
        super().__init__(*args, **kwargs)
        self.witness: torch.Tensor | None = None
        self._store = torch.empty(0)
        self._cache = 0
        self.certificate: UnifiedCertificate | None = None
        self._routed = routed_forward(self._kernel)
        self.monitor = _monitor  # the worker's, when the plugin is attached
        if self.monitor is not None:
            self.monitor.add_impl(self)

    def _kernel(self, **kwargs: Any) -> None:
        if self.witness is None:
            raise EngineMismatchError("witness side buffer", "written at the layer's KV write",
                                      "attention read before any key was written")
        self.certificate = metered_unified_attention(witness=self.witness, layout=self.layout,
                                                     **kwargs)

    def do_kv_cache_update(self, layer: Any, key: torch.Tensor, value: torch.Tensor,
                           kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        super().do_kv_cache_update(layer, key, value, kv_cache, slot_mapping)
        # the key cache as the kernel reads it: [num_blocks, block_size, kv_heads, head_size]
        key_cache = kv_cache.transpose(1, 2)[..., :int(self.head_size)]
        nb, bs, kvh, _ = (int(n) for n in key_cache.shape)
        if self.witness is None or self._cache != kv_cache.data_ptr():
            # a buffer per cache (a new cache holds none of the old one's keys); one row past
            # the cache takes the padded rows' writes (no host synchronisation)
            self._cache = kv_cache.data_ptr()
            self._store = torch.full((nb * bs + 1, kvh, self.bands), torch.inf,
                                     dtype=torch.float32, device=kv_cache.device)
            self.witness = self._store[:nb * bs].view(nb, bs, kvh, self.bands)
        n = int(slot_mapping.shape[0])
        slots = slot_mapping.to(torch.int64)
        ok = slots >= 0  # padded rows (-1) write no slot
        safe = torch.where(ok, slots, 0)
        stored = key_cache[safe // bs, safe % bs]  # the written rows only, never the whole cache
        # the residual of the keys as computed against the keys as stored, in float64 (a
        # cache in another dtype than the model's keeps its conversion in the witness)
        w = witness_write(key[:n].to(torch.float64), stored.to(torch.float64),
                          bands=self.bands, layout=self.layout)
        self._store[torch.where(ok, slots, nb * bs)] = w
        if self.monitor is not None:
            self.monitor.wrote(layer, bs)

    def fused_rope_kvcache_supported(self) -> bool:
        """Never: every key the cache holds is written by :meth:`do_kv_cache_update`, which
        writes its witness."""
        return False

    def do_rope_and_kv_cache_update(self, *args: Any, **kwargs: Any) -> None:
        raise EngineMismatchError("KV cache write", "do_kv_cache_update (which writes the "
                                  "keys' witnesses)", "the fused rotary and cache write")

    def forward(self, layer: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, attn_metadata: Any, output: torch.Tensor,
                output_scale: torch.Tensor | None = None,
                output_block_scale: torch.Tensor | None = None) -> torch.Tensor:
        out: torch.Tensor = self._routed(self, layer, query, key, value, kv_cache,
                                         attn_metadata, output, output_scale,
                                         output_block_scale)
        if self.monitor is not None and attn_metadata is not None:
            if self.certificate is None:
                raise EngineMismatchError("attention call", "through the metered kernel",
                                          "a forward that left no certificate")
            self.monitor.read(layer, self.certificate, attn_metadata)
        return out


class WitcertTritonAttentionBackend(triton_attn.TritonAttentionBackend):  # type: ignore[misc]
    """vLLM's Triton attention backend with :class:`WitcertTritonAttentionImpl`."""

    @staticmethod
    def get_impl_cls() -> type[WitcertTritonAttentionImpl]:
        return WitcertTritonAttentionImpl


class TritonMonitor:
    """The worker's accounting on the Triton path: each layer's certificate of the step,
    folded into the requests' accounts after the step.

    Args:
        config: the plugin's switch (threshold, budget, verdict store, form).
        seats: concurrent requests at most (``None``: the engine's ``max_num_seqs``, read
            when the first layer registers).
    """

    def __init__(self, config: PluginConfig, *, seats: int | None = None) -> None:
        self.config = config
        self.session = uuid.uuid4().hex[:12]
        self.seats = seats
        self.n_layers = 0
        self.accounts: Accounts | None = None
        self.store = VerdictStore(config.store)
        # requests an earlier engine on this store died serving get their failed-closed verdicts
        self.store.recover()
        self._certs: dict[int, UnifiedCertificate] = {}
        self._written: set[int] = set()
        self._metadata: Any = None
        self._block_size = 0

    def add_impl(self, impl: WitcertTritonAttentionImpl) -> None:
        """A layer's implementation was built (at model load, one per attention layer)."""
        self.n_layers += 1
        self.accounts = None  # opened at the first step, over every layer registered

    def wrote(self, layer: Any, block_size: int) -> None:
        """A layer wrote its keys (and their witnesses) this step."""
        self._written.add(layer_index(layer, self.n_layers))
        self._block_size = block_size

    def read(self, layer: Any, certificate: UnifiedCertificate, metadata: Any) -> None:
        """A layer's attention ran through the metered kernel this step."""
        if self._metadata is None:
            self._metadata = metadata
        elif metadata is not self._metadata:
            raise EngineMismatchError("attention metadata", "one object shared by every layer",
                                      "layers with different metadata (several KV groups)")
        self._certs[layer_index(layer, self.n_layers)] = certificate

    def _accounts(self) -> Accounts:
        if self.accounts is None:
            if self.seats is None:
                from vllm.config import get_current_vllm_config
                self.seats = int(get_current_vllm_config().scheduler_config.max_num_seqs)
            self.accounts = Accounts(
                layers=self.n_layers, seats=self.seats, tau=self.config.tau, audit=False,
                delta_req=self.config.delta_req, session=self.session, kv_cache_dtype="auto",
                form="meter", witness=f"bands={self.config.bands}")
            track(self.store, self.accounts)
        return self.accounts

    def begin(self, runner: Any, scheduler_output: Any) -> None:
        """Before a step: verdicts of finished requests; forget the previous step."""
        self._certs.clear()
        self._written.clear()
        self._metadata = None
        if self.accounts is not None:
            for _, verdict in self.accounts.finish_all(scheduler_output.finished_req_ids):
                self.store.put(verdict)

    def end(self, runner: Any, scheduler_output: Any) -> None:
        """After a step: fold every layer's certificate into the requests' accounts.

        Raises:
            EngineMismatchError: a step that scheduled tokens with no metered layer, or
                rows per request that differ from the scheduler's.
        """
        md = self._metadata
        if md is None or not self._certs:
            if int(scheduler_output.total_num_scheduled_tokens) > 0 and self.n_layers == 0:
                raise EngineMismatchError(
                    "attention backend", "TRITON_ATTN (re-pointed by the witcert plugin)",
                    "another backend: no layer of the model runs the metered implementation")
            return
        accounts = self._accounts()
        step, requests = step_requests(md, block_size=self._block_size, runner=runner,
                                       scheduler_output=scheduler_output)
        q_lens = step.q_lens.tolist()
        tallies = [accounts.tally(r) for r in requests]
        read = sorted(self._certs)
        meter = torch.stack([self._certs[i].meter[:step.rows].to(torch.float64) for i in read])
        columns = summary_columns(meter.cpu(), step, tau=self.config.tau)
        zeros = torch.zeros(step.requests, dtype=torch.float64)
        summary = torch.stack(columns + [zeros] * (len(SUMMARY) - len(columns)), dim=1)
        try:  # every layer's premises are read; the step's readings share one evidence
            evidence = [self._certs[i].basis.evidence(TV_EFORM_METER_SOUND, TV_TWO_SIDED_METER_SOUND)
                        for i in read][0]
        except WitcertError as exc:
            for t in tallies:
                accounts.fail(t, f"{type(exc).__name__}: {exc}")
            evidence = None
        if evidence is not None:
            accounts.add_step(tallies, summary.tolist(), q_lens, written=sorted(self._written),
                              read=read, evidence=evidence)


_monitor: TritonMonitor | None = None


def attach_triton(config: PluginConfig, *, seats: int | None = None) -> TritonMonitor:
    """Re-point vLLM's ``TRITON_ATTN`` backend to :class:`WitcertTritonAttentionBackend`;
    the implementations built from then on report to the returned :class:`TritonMonitor`.

    Raises:
        EngineMismatchError: the installed backend is not the one the route was written for,
            or a configuration the Triton path does not meter (no band witnesses: it serves
            a model-dtype cache, whose keys the band witnesses bound; repair).
    """
    global _monitor
    check_triton_backend()
    if config.bands < 1 or config.repair:
        raise EngineMismatchError("witcert configuration on the Triton path",
                                  "bands >= 1 and repair=0",
                                  f"bands={config.bands}, repair={int(config.repair)}")
    WitcertTritonAttentionImpl.bands = int(config.bands)
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend
    register_backend(AttentionBackendEnum.TRITON_ATTN,
                     f"{__name__}.{WitcertTritonAttentionBackend.__name__}")
    _monitor = TritonMonitor(config, seats=seats)
    return _monitor
