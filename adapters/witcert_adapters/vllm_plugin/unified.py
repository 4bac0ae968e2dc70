"""vLLM's own Triton attention kernel, metered: ``unified_attention`` with the Tier-A meter.

On GPUs vLLM serves attention through ``unified_attention``
(``vllm/v1/attention/ops/triton_unified_attention.py``): one Triton kernel over paged blocks
(``block_table``, caches ``[num_blocks, block_size, kv_heads, head_size]``), launched as a 2d
grid, or as a 3d grid of KV segments whose partials ``reduce_segments`` merges. This module
builds a metered variant of that very kernel without touching the installed file: the
module's source text is read, :data:`ANCHORS` (exact upstream blocks with asserted hit
counts, :func:`witcert_adapters.injection.apply_anchors`) add the meter, and the result runs
as a new module (:func:`metered_module`). A changed upstream fails with an
:class:`~witcert_calculus.errors.InjectionError` naming the anchor; the output path of the
kernel is not edited, so the metered kernel's output is the upstream kernel's, bit for bit.

The meter is :mod:`witcert_kernels.triton_decode`'s: in the same pass over the tiles, for
every query row (token, query head) and visible key ``t``, ``c_t = scale sum_b ||q_b|| w_{t,b}``
from the stored band witnesses ``w`` (rounded outward with the margin of
:func:`witcert_calculus.numerics.rounding.logit_margin`), and three float64 online log-sum-exps of
the kernel's own float32 logits ``s``, of ``s + c`` and of ``s - c`` (the Triton helpers
``outward``, ``lse_step`` and ``meter_step`` of :mod:`witcert_kernels.triton_decode_kernel`,
imported by the generated source, not copied; they reduce over their first axis, so a tile enters
them transposed, tokens first). The witnesses live in a side buffer laid out per block slot like the
key cache, ``[num_blocks, block_size, kv_heads, bands]``. The partials of each row keep the fused
decode meter's layout (and one more field: the keys the row saw, counted in the kernel). Each KV
segment of the 3d path writes its own partials; the fused decode meter's host code
(:func:`~witcert_kernels.triton_decode_merge.tier_a_meter`: its split merge under log-sum-exp
weights, exactly as the outputs merge in ``reduce_segments``, its margin analysis and its forms)
turns them into bounds.

The meter reads the logits where the kernel has masked them and before anything vLLM may
add to them; a call with a feature that changes the logits or the weights afterwards or
beside them (ALiBi, a query-query bias, sinks, a soft cap, a sliding window or chunked
attention, multimodal prefixes, R-SWA, a quantized KV cache, fp8 output) is refused with an
:class:`~witcert_calculus.errors.InvalidValueError` naming the argument.

Main declarations
-----------------
- :data:`ANCHORS`, :data:`SOURCE_MODULE`, :data:`GENERATED_MODULE`, :func:`source_path`,
  :func:`build_module`, :func:`metered_module`: the metered module, built from vLLM's source.
- :class:`UnifiedCertificate`, :func:`metered_unified_attention`,
  :func:`certificate_from_partials`: a metered call and its bounds.
"""

# The generated module's Triton source carries no Python types: basic checking only.
# pyright: basic

from __future__ import annotations

import importlib.util
import linecache
import math
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, final

import numpy as np
import torch

from witcert_adapters.injection import Anchor, apply_anchors
from witcert_calculus.errors import InjectionError, InvalidValueError
from witcert_calculus.meters.tv_forms import TVBasis, _issue_basis  # pyright: ignore[reportPrivateUsage]
from witcert_calculus.meters.witness import RopeLayout
from witcert_calculus.numerics.rounding import logit_margin
from witcert_calculus.numerics.validation import positive_int
from witcert_kernels.meter import band_norms
from witcert_kernels.triton_decode_launch import device_constants
from witcert_kernels.triton_decode_merge import tier_a_meter
from witcert_kernels.triton_launch import pow2

__all__ = ["ANCHORS", "GENERATED_MODULE", "SOURCE_MODULE", "UnifiedCertificate", "build_module",
           "certificate_from_partials", "metered_module", "metered_unified_attention",
           "source_path"]

SOURCE_MODULE: Final = "vllm.v1.attention.ops.triton_unified_attention"
"""The upstream module whose source the metered kernel is built from."""

GENERATED_MODULE: Final = "witcert_adapters.vllm_plugin._metered_unified_attention"
"""The name the metered module runs under (in ``sys.modules``; it has no file)."""

_FIELDS: Final = 12  # partials per (row, segment); see the kernel's epilogue anchor
_EMPTY: Final = (-math.inf, 0.0, -math.inf, 0.0, -math.inf, 0.0, 0.0, 0.0, 0.0, math.inf, 0.0,
                 0.0)  # the partials of no key: empty log-sum-exps, no bound, no witness

ANCHORS: Final[tuple[Anchor, ...]] = (
    Anchor(
        "import the meter's online log-sum-exp step",
        "from vllm.v1.kv_cache_interface import KVQuantMode\n",
        "from vllm.v1.kv_cache_interface import KVQuantMode\n"
        "from witcert_kernels.triton_decode_kernel import lse_step as _lse_step, "
        "meter_step as _meter_step, outward as _outward\n"),
    Anchor(
        "meter parameters of kernel_unified_attention",
        "    MM_PREFIX_CLAMP_SW: tl.constexpr = False,\n):\n",
        "    MM_PREFIX_CLAMP_SW: tl.constexpr = False,\n"
        "    METER: tl.constexpr = False,\n"
        "    NB: tl.constexpr = 1,\n"
        "    witness_ptr=None,\n"
        "    qbands_ptr=None,\n"
        "    meter_ptr=None,\n"
        "    nbands=1,\n"
        "    meter_segments=1,\n"
        "    meter_consts_ptr=None,\n"
        "    stride_w_0=0,\n"
        "    stride_w_1=0,\n"
        "    stride_w_2=0,\n"
        "):\n"),
    Anchor(
        "meter accumulators beside the output accumulator",
        "    acc = tl.zeros([BLOCK_M, HEAD_SIZE_PADDED], dtype=tl.float32)\n",
        "    acc = tl.zeros([BLOCK_M, HEAD_SIZE_PADDED], dtype=tl.float32)\n"
        "    if METER:\n"
        "        offs_b = tl.arange(0, NB)\n"
        "        band_mask = offs_b < nbands\n"
        "        qn = tl.load(\n"
        "            qbands_ptr\n"
        "            + (query_offset_0[:, None].to(tl.int64) * num_query_heads\n"
        "               + query_offset_1[:, None]) * nbands\n"
        "            + offs_b[None, :],\n"
        "            mask=query_mask_0[:, None] & query_mask_1[:, None] & band_mask[None, :],\n"
        "            other=0.0,\n"
        "        )\n"
        "        # Triton's max and min skip NaN: a NaN band norm or witness is counted on its\n"
        "        # own, kept out of the exactness test and the minimum, and makes c_t NaN\n"
        "        q_nan = tl.sum((qn != qn).to(tl.int32), axis=1) > 0\n"
        "        q_top = tl.max(tl.where(qn != qn, 0.0, qn), axis=1)\n"
        "        m_scale = tl.load(meter_consts_ptr + 0)\n"
        "        m_gamma = tl.load(meter_consts_ptr + 1)\n"
        "        m_alpha = tl.load(meter_consts_ptr + 2)\n"
        "        mx0 = tl.full([BLOCK_M], float(\"-inf\"), tl.float64)\n"
        "        mx1 = tl.full([BLOCK_M], float(\"-inf\"), tl.float64)\n"
        "        mx2 = tl.full([BLOCK_M], float(\"-inf\"), tl.float64)\n"
        "        a0 = tl.zeros([BLOCK_M], tl.float64)\n"
        "        a1 = tl.zeros([BLOCK_M], tl.float64)\n"
        "        a2 = tl.zeros([BLOCK_M], tl.float64)\n"
        "        s_abs = tl.zeros([BLOCK_M], tl.float64)\n"
        "        c_max = tl.zeros([BLOCK_M], tl.float64)\n"
        "        c_inf = tl.zeros([BLOCK_M], tl.int32)\n"
        "        bad = tl.zeros([BLOCK_M], tl.int32)\n"
        "        n_vis = tl.zeros([BLOCK_M], tl.int32)\n"
        "        w_min = tl.full([BLOCK_M], float(\"inf\"), tl.float64)\n"),
    Anchor(
        "meter step on each tile's masked logits",
        "        S = tl.where(\n"
        "            query_mask_1[:, None] & query_mask_0[:, None] & seq_mask, S, float(\"-inf\")\n"
        "        )\n",
        "        S = tl.where(\n"
        "            query_mask_1[:, None] & query_mask_0[:, None] & seq_mask, S, float(\"-inf\")\n"
        "        )\n"
        "        if METER:\n"
        "            valid = (query_mask_1[:, None] & query_mask_0[:, None] & seq_mask\n"
        "                     & tile_mask[None, :])\n"
        "            w = tl.load(\n"
        "                witness_ptr\n"
        "                + physical_block_idx[:, None] * stride_w_0\n"
        "                + (seq_offset % BLOCK_SIZE)[:, None].to(tl.int64) * stride_w_1\n"
        "                + kv_head_idx * stride_w_2\n"
        "                + offs_b[None, :],\n"
        "                mask=tile_mask[:, None] & band_mask[None, :],\n"
        "                other=0.0,\n"
        "            ).to(tl.float64)\n"
        "            prod = tl.where(qn[:, None, :] == 0.0, 0.0, qn[:, None, :] * w[None, :, :])\n"
        "            y = tl.sum(prod, axis=2) * m_scale\n"
        "            w_nan = tl.sum((w != w).to(tl.int32), axis=1) > 0\n"
        "            w_top = tl.max(tl.where(w != w, 0.0, w), axis=1)\n"
        "            exact = (((q_top[:, None] == 0.0) | (w_top[None, :] == 0.0))\n"
        "                     & ~q_nan[:, None] & ~w_nan[None, :])\n"
        "            c = tl.where(exact, 0.0, _outward(y, m_gamma, m_alpha, exact))\n"
        "            c = tl.where(q_nan[:, None] | w_nan[None, :], float(\"nan\"), c)\n"
        "            # the meter's helpers reduce over axis 0: tokens first\n"
        "            s64 = tl.trans(S.to(tl.float64))\n"
        "            valid_t = tl.trans(valid)\n"
        "            mx0, a0 = _lse_step(mx0, a0, s64, valid_t)\n"
        "            s_abs = tl.maximum(s_abs, tl.max(tl.where(valid_t, tl.abs(s64), 0.0), axis=0))\n"
        "            mx1, a1, mx2, a2, c_max, c_inf, bad = _meter_step(\n"
        "                mx1, a1, mx2, a2, c_max, c_inf, bad, s64, tl.trans(c), valid_t)\n"
        "            n_vis += tl.sum(valid.to(tl.int32), axis=1)\n"
        "            w_tok = tl.min(tl.where(band_mask[None, :] & (w == w), w, float(\"inf\")),\n"
        "                           axis=1)\n"
        "            blk_nan = tl.sum((valid & w_nan[None, :]).to(tl.int32), axis=1) > 0\n"
        "            blk_min = tl.min(tl.where(valid, w_tok[None, :], float(\"inf\")), axis=1)\n"
        "            w_min = tl.where((w_min != w_min) | blk_nan, float(\"nan\"),\n"
        "                             tl.minimum(w_min, blk_min))\n"),
    Anchor(
        "meter partials per row and segment before the epilogue",
        "    # ---- Epilogue ---------------------------------------------------------\n",
        "    if METER:\n"
        "        m_row = ((query_offset_0.to(tl.int64) * num_query_heads + query_offset_1)\n"
        "                 * meter_segments + segm_idx)\n"
        "        m_base = meter_ptr + m_row * 12\n"
        "        m_keep = query_mask_0 & query_mask_1\n"
        "        tl.store(m_base + 0, mx0, mask=m_keep)\n"
        "        tl.store(m_base + 1, a0, mask=m_keep)\n"
        "        tl.store(m_base + 2, mx1, mask=m_keep)\n"
        "        tl.store(m_base + 3, a1, mask=m_keep)\n"
        "        tl.store(m_base + 4, mx2, mask=m_keep)\n"
        "        tl.store(m_base + 5, a2, mask=m_keep)\n"
        "        tl.store(m_base + 6, s_abs, mask=m_keep)\n"
        "        tl.store(m_base + 7, c_max, mask=m_keep)\n"
        "        tl.store(m_base + 8, c_inf.to(tl.float64), mask=m_keep)\n"
        "        tl.store(m_base + 9, w_min, mask=m_keep)\n"
        "        tl.store(m_base + 10, bad.to(tl.float64), mask=m_keep)\n"
        "        tl.store(m_base + 11, n_vis.to(tl.float64), mask=m_keep)\n"
        "    # ---- Epilogue ---------------------------------------------------------\n"),
    Anchor(
        "meter argument of unified_attention",
        "    mm_prefix_clamp_sliding_window: bool = False,\n):\n",
        "    mm_prefix_clamp_sliding_window: bool = False,\n"
        "    meter=None,\n"
        "):\n"),
    Anchor(
        "meter arguments of the kernel launch",
        "        MM_PREFIX_CLAMP_SW=mm_prefix_clamp_sliding_window,\n"
        "        **launch_kwargs,\n"
        "    )\n",
        "        MM_PREFIX_CLAMP_SW=mm_prefix_clamp_sliding_window,\n"
        "        **(meter if meter is not None else {}),\n"
        "        **launch_kwargs,\n"
        "    )\n"),
)
"""The edits that add the meter to vLLM's kernel, in order (each found exactly once)."""


def source_path() -> Path:
    """The installed upstream file (read, never written).

    Raises:
        InjectionError: vLLM or its unified attention module is not installed.
    """
    spec = importlib.util.find_spec(SOURCE_MODULE)
    if spec is None or spec.origin is None:
        raise InjectionError(SOURCE_MODULE, "source", "the module is not installed")
    return Path(spec.origin)


def build_module(text: str, *, anchors: tuple[Anchor, ...] = ANCHORS,
                 name: str = GENERATED_MODULE) -> types.ModuleType:
    """Execute ``text`` (the upstream source) with ``anchors`` applied, as module ``name``.

    The source is registered with :mod:`linecache` under a name of its own, so that Triton
    (which reads a kernel's source to compile it) sees the metered text.

    Raises:
        InjectionError: an anchor found another number of times than expected.
    """
    src = apply_anchors(text, anchors, source=SOURCE_MODULE)
    filename = f"<{name}: {SOURCE_MODULE} with {len(anchors)} witcert anchors>"
    linecache.cache[filename] = (len(src), None, src.splitlines(keepends=True), filename)
    module = types.ModuleType(name)
    module.__file__ = filename
    sys.modules[name] = module  # Triton resolves a kernel's globals through its module
    try:
        exec(compile(src, filename, "exec"), module.__dict__)  # noqa: S102
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


_built: types.ModuleType | None = None


def metered_module() -> types.ModuleType:
    """The metered ``unified_attention`` module, built once per process from the installed
    source (:func:`source_path`, which stays untouched).

    Raises:
        InjectionError: the installed source does not hold every anchor exactly once.
    """
    global _built
    if _built is None:
        _built = build_module(source_path().read_text(encoding="utf-8"))
    return _built


@final
@dataclass(frozen=True, slots=True, eq=False)
class UnifiedCertificate:
    """The meter of one ``unified_attention`` call, per query row ``[tokens, heads]``.

    Attributes:
        log_a: an upper bound of ``log A`` (``inf``: an infinite ``c``).
        log_a_minus: a lower bound of ``log A-``.
        eform: ``TV <= (A^2 - 1) / 2``, rounded outward (``inf`` on overflow).
        two_sided: ``TV <= sinh(log A - log A-)``, rounded outward.
        meter: the smaller of the two (``min(1, meter)`` is the TV bound); 0 for a row that
            sees one token; NaN for a row that sees none (a token of no sequence).
        tanh_max: the comparison shape ``tanh(max_t c_t)``.
        witness_min: the smallest witness read (``inf`` for a row with no token).
        visible: how many keys each row attended to (counted in the kernel).
        basis: what the bounds rest on, with the premises computed on the device (as
            :class:`witcert_kernels.triton_decode.FusedDecode`'s).
    """

    log_a: torch.Tensor
    log_a_minus: torch.Tensor
    eform: torch.Tensor
    two_sided: torch.Tensor
    meter: torch.Tensor
    tanh_max: torch.Tensor
    witness_min: torch.Tensor
    visible: torch.Tensor
    basis: TVBasis


def certificate_from_partials(partials: torch.Tensor, query_bands: torch.Tensor, *,
                              scale: float, max_tokens: int) -> UnifiedCertificate:
    """Merge the kernel's per-segment partials ``[tokens, heads, segments, 12]`` and turn
    them into bounds, with the fused decode meter's host code (merge, margins, forms,
    premises), plus the premise that no row saw more keys than ``max_tokens``.

    Raises:
        InvalidValueError: partials of another shape, or a non-positive ``max_tokens``.
    """
    if partials.ndim != 4 or int(partials.shape[-1]) != _FIELDS:
        raise InvalidValueError("partials", tuple(partials.shape),
                                f"must be [tokens, heads, segments, {_FIELDS}]")
    tokens = positive_int("max_tokens", max_tokens)
    visible = partials[..., 11].sum(dim=-1)
    # the rows of one token share its keys (the mask does not depend on the head)
    tier, w_min = tier_a_meter(partials, tokens=tokens, seq_lens=visible[:, 0],
                                query_bands=query_bands, scale=float(scale),
                                bands=int(query_bands.shape[-1]))
    none = visible == 0  # a row of no sequence: no bound at all, never a perfect one
    log_a, log_am, e, t, th = (torch.where(none, math.nan, x) for x in (
        tier.log_a, tier.log_a_minus, tier.eform, tier.two_sided, tier.tanh_max))
    b = tier.basis
    basis = _issue_basis(checks=(*b.checks, (
        "every row attends to at most the margin's token count of keys (counted in the kernel)",
        (visible <= tokens).all())), logit=b.logit, delta=b.delta, also=b.also)
    return UnifiedCertificate(log_a=log_a, log_a_minus=log_am, eform=e, two_sided=t,
                              meter=torch.minimum(e, t), tanh_max=th, witness_min=w_min,
                              visible=visible, basis=basis)


# unified_attention's arguments whose features the meter does not follow, and the value
# each must have for a metered call
_PLAIN: Final[dict[str, object]] = {
    "alibi_slopes": None, "qq_bias": None, "sinks": None, "mm_prefix_range": None,
    "rswa_prefix_lens": None, "rswa_window": None, "output_scale": None, "q_descale": None,
    "k_scale_cache": None, "v_scale_cache": None, "chunk_lookback": -1,
}


def _check_plain(kwargs: dict[str, Any]) -> None:
    for name, expected in _PLAIN.items():
        got = kwargs.get(name, expected)
        if got is not expected and got != expected:
            raise InvalidValueError(name, type(got).__name__ if isinstance(got, torch.Tensor)
                                    else got, f"must be {expected!r} for a metered call (the "
                                    "meter follows plain softmax attention)")
    softcap = kwargs.get("softcap", 0)
    if softcap not in (None, 0, 0.0):
        raise InvalidValueError("softcap", softcap, "must be 0 for a metered call")
    window = tuple(kwargs.get("window_size", (-1, -1)))
    if window[0] != -1:
        raise InvalidValueError("window_size", window, "must be (-1, -1) for a metered call")
    mode = kwargs.get("kv_quant_mode")
    if mode is not None and int(mode) != 0:
        raise InvalidValueError("kv_quant_mode", mode, "must be NONE for a metered call")


def metered_unified_attention(*, witness: torch.Tensor, layout: RopeLayout,
                              **kwargs: Any) -> UnifiedCertificate:
    """Run vLLM's ``unified_attention`` with the meter in its kernel; return the certificate.

    Args:
        witness: ``[num_blocks, block_size, kv_heads, bands]`` float32 band witnesses of the
            key residuals, per block slot like the key cache ``k``.
        layout: the rotary layout of queries and keys (the query's band norms are computed
            here: :func:`witcert_kernels.meter.band_norms`).
        **kwargs: ``unified_attention``'s own arguments, by name (``q``, ``k``, ``v``,
            ``out``, ``cu_seqlens_q``, ``max_seqlen_q``, ``seqused_k``, ``max_seqlen_k``,
            ``softmax_scale``, ``causal``, ``window_size``, ``block_table``, ``softcap``,
            ``q_descale``, ``k_descale``, ``v_descale``, and the split-KV buffers). ``out`` is
            written exactly as the upstream kernel writes it.

    Returns:
        The :class:`UnifiedCertificate` of every row of ``q`` (``max_seqlen_k`` is the
        margin's token count).

    Raises:
        InvalidValueError: a witness that does not fit the cache, a key cache in another
            dtype than the query's, or a feature the meter does not follow.
        InjectionError: the installed source no longer holds the anchors.
    """
    _check_plain(kwargs)
    q: torch.Tensor = kwargs["q"]
    k: torch.Tensor = kwargs["k"]
    if witness.ndim != 4 or tuple(witness.shape[:3]) != tuple(k.shape[:3]):
        raise InvalidValueError("witness", tuple(witness.shape),
                                f"must be [{', '.join(str(int(n)) for n in k.shape[:3])}, bands] "
                                "(num_blocks, block_size, kv_heads of the key cache)")
    if witness.dtype != torch.float32 or int(witness.stride(-1)) != 1:
        raise InvalidValueError("witness", f"{witness.dtype}, strides {witness.stride()}",
                                "must be float32 with contiguous bands")
    if k.dtype != q.dtype:  # the kernel casts the keys to the query's dtype before the dot
        raise InvalidValueError("k", str(k.dtype), f"must have the query's dtype {q.dtype} for "
                                "a metered call (the witnesses bound the keys as stored)")
    bands = int(witness.shape[-1])
    scale = float(kwargs["softmax_scale"])
    query_bands = band_norms(q.to(torch.float64), bands=bands, layout=layout).contiguous()
    segments = int(kwargs.get("num_par_softmax_segments") or 1)
    tokens, heads = int(q.shape[0]), int(q.shape[1])
    # a segment no program visits stays empty: no key, merged away (cached on the device)
    partials = device_constants(_EMPTY, q.device).repeat(tokens, heads, segments, 1)
    cm = logit_margin(bands, scale=scale)
    consts = device_constants((scale, cm.gamma, cm.alpha), q.device)
    args = {"METER": True, "NB": pow2(bands), "witness_ptr": witness, "qbands_ptr": query_bands,
            "meter_ptr": partials, "nbands": bands, "meter_segments": segments,
            "meter_consts_ptr": consts, "stride_w_0": int(witness.stride(0)),
            "stride_w_1": int(witness.stride(1)), "stride_w_2": int(witness.stride(2))}
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        metered_module().unified_attention(**kwargs, meter=args)
    return certificate_from_partials(partials, query_bands, scale=scale,
                                     max_tokens=int(kwargs["max_seqlen_k"]))
