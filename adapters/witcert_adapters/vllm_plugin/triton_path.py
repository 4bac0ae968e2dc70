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
  :class:`WitcertTritonAttentionBackend` through vLLM's ``register_backend``.

Main declarations
-----------------
- :func:`check_triton_backend`, :func:`routed_forward`, :func:`attach_triton`.
- :class:`WitcertTritonAttentionImpl`, :class:`WitcertTritonAttentionBackend`.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable
from typing import Any, Final

import torch

from witcert_adapters.vllm_plugin.unified import UnifiedCertificate, metered_unified_attention
from witcert_calculus.errors import EngineMismatchError
from witcert_calculus.witness import RopeLayout
from witcert_kernels.triton_witness import witness_write

from vllm.v1.attention.backends import triton_attn

__all__ = ["KERNEL_GLOBAL", "WitcertTritonAttentionBackend", "WitcertTritonAttentionImpl",
           "attach_triton", "check_triton_backend", "routed_forward"]

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
        return out


class WitcertTritonAttentionBackend(triton_attn.TritonAttentionBackend):  # type: ignore[misc]
    """vLLM's Triton attention backend with :class:`WitcertTritonAttentionImpl`."""

    @staticmethod
    def get_impl_cls() -> type[WitcertTritonAttentionImpl]:
        return WitcertTritonAttentionImpl


def attach_triton(*, bands: int) -> None:
    """Re-point vLLM's ``TRITON_ATTN`` backend to :class:`WitcertTritonAttentionBackend`.

    Raises:
        EngineMismatchError: the installed backend is not the one the route was written for.
    """
    check_triton_backend()
    WitcertTritonAttentionImpl.bands = int(bands)
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend
    register_backend(AttentionBackendEnum.TRITON_ATTN,
                     f"{__name__}.{WitcertTritonAttentionBackend.__name__}")
