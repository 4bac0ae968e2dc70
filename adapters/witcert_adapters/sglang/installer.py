"""Install the meter into SGLang's own files: anchored edits of the decode kernels and the KV
pools, with a surgical, hash-checked revert (:mod:`witcert_adapters.injection`).

Three files of the installed SGLang are patched, each edit an exact block of upstream source
with its hit count (a changed upstream fails naming the anchor, before any byte is written):

- ``sglang/kernels/ops/attention/decode_attention.py``: both stage-1 kernels
  (``_fwd_kernel_stage1``, ``_fwd_grouped_kernel_stage1``) take the meter's arguments
  (defaults off; ``WIT_METER`` is a compile-time constant), call
  :func:`~witcert_adapters.sglang.triton_meter.meter_init` after the query load,
  :func:`~witcert_adapters.sglang.triton_meter.meter_block` on every block's masked logits
  and :func:`~witcert_adapters.sglang.triton_meter.meter_store` beside the split's
  log-sum-exp; their launches pass :func:`~witcert_adapters.sglang.runtime.stage1_args`
  (nothing when the meter is off: the upstream specialisation); stage 2 refuses attention
  sinks while metering (:func:`~witcert_adapters.sglang.runtime.stage2_check`).
- ``sglang/srt/mem_cache/memory_pool.py``: ``MHATokenToKVPool.set_kv_buffer`` and
  ``MLATokenToKVPool.set_kv_buffer`` call :func:`~witcert_adapters.sglang.runtime.write_keys`
  before they store, when a recorder is active.

- ``sglang/kernels/ops/attention/extend_attention.py``: the extend kernel ``_fwd_kernel``
  keeps the meter per query token and head:
  :func:`~witcert_adapters.sglang.triton_meter.meter_block` on the prefix loop's logits
  (cached keys, witnesses of their slots),
  :func:`~witcert_adapters.sglang.triton_meter.meter_exact` on the chunk loop's (the chunk's
  own keys, ``c = 0``), both in natural-log units; its launch passes
  :func:`~witcert_adapters.sglang.runtime.extend_args`. The unified and dense prefill entry
  points call :func:`~witcert_adapters.sglang.runtime.refuse_unmetered`.

:func:`install` refuses an engine configuration the method does not survive: the radix
(prefix) cache shares written slots across requests and reuses freed slots, so a witness is
only valid for the generation of the slot it was written at; without generation checks
(:mod:`witcert_calculus.accounting.slots`) a read could meet a witness of an older occupant.

Main declarations
-----------------
- :data:`OWNER`, :func:`decode_anchors`, :func:`extend_anchors`, :func:`pool_anchors`,
  :func:`sglang_root`.
- :class:`Installed`, :func:`install`, :func:`installed`.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Final, final

from witcert_adapters.injection import Anchor, FilePatch, active_patches, applied_patch, \
    patch_files
from witcert_calculus.errors import EngineMismatchError

__all__ = ["DECODE", "EXTEND", "OWNER", "POOL", "Installed", "decode_anchors", "extend_anchors",
           "install", "installed", "pool_anchors", "sglang_root"]

OWNER: Final = "witcert-sglang-meter"
"""The owner name of the adapter's patches (in the files' manifest)."""
DECODE: Final = "kernels/ops/attention/decode_attention.py"
EXTEND: Final = "kernels/ops/attention/extend_attention.py"
POOL: Final = "srt/mem_cache/memory_pool.py"

_IMPORT = ("from witcert_adapters.sglang import runtime as _witcert_rt\n"
           "from witcert_adapters.sglang.triton_meter import meter_block as _witcert_block\n"
           "from witcert_adapters.sglang.triton_meter import meter_init as _witcert_init\n"
           "from witcert_adapters.sglang.triton_meter import meter_store as _witcert_store\n")
_STATE = "wqn, wm0, wa0, wm1, wa1, wm2, wa2, wsa, wcm, wci, wwm, wbad"
_ARGS = "wm0, wa0, wm1, wa1, wm2, wa2, wsa, wcm, wci, wwm, wbad"


def _block(indent: str, s: str, valid: str) -> str:
    return (f"{indent}if WIT_METER:\n"
            f"{indent}    {_STATE} = _witcert_block(\n"
            f"{indent}        wqn, {_ARGS}, {s}, {valid}, kv_loc, offs_n < split_kv_end, Wit,\n"
            f"{indent}        cur_kv_head, wit_stride_bs, wit_stride_h, wit_nb, WitC, WIT_NB)\n")


def _init(heads: str, mask: str) -> str:
    return ("        if WIT_METER:\n"
            f"            wit_heads = {heads}\n"
            f"            wit_mask = {mask}\n"
            f"            {_STATE} = _witcert_init(\n"
            "                WitQn, cur_batch, wit_heads, wit_mask, wit_q_heads, wit_nb, WIT_NB)\n")


_STORE = ("        if WIT_METER:\n"
          "            _witcert_store(WitOut, cur_batch, wit_heads, wit_mask, split_kv_id,\n"
          f"                           wit_q_heads, wit_max_splits, {_ARGS})\n")

_WRAP = ("    _wit = _witcert_rt.stage1_args(\n"
         "        q, k_buffer, att_lse, kv_indptr, sm_scale_withk, logit_cap=logit_cap,\n"
         "        xai_temperature_len=xai_temperature_len, score_mod=score_mod,\n"
         "        page_size=page_size)\n")


def decode_anchors() -> tuple[Anchor, ...]:
    """The edits of ``decode_attention.py`` (SGLang 0.5.23)."""
    sig = "    uneven_batch=None,\n    ROTATE_BATCH: tl.constexpr = False,\n):\n"
    mha_q = ("    acc = tl.zeros([BLOCK_DV], dtype=tl.float32)\n\n"
             "    if split_kv_end > split_kv_start:\n"
             "        q = tl.load(Q + off_q, mask=mask_d, other=0.0)\n")
    gq = "        q = tl.load(Q + offs_q, mask=(mask_h[:, None]) & (mask_d[None, :]), other=0.0)\n"
    mha_qk = "            qk = tl.where(offs_n < split_kv_end, qk, float(\"-inf\"))\n"
    g_qk = ("            qk = tl.where(\n"
            "                mask_h[:, None] & (offs_n[None, :] < split_kv_end), qk, "
            "float(\"-inf\")\n"
            "            )\n")
    lse = ("        tl.store(\n            Att_Lse + offs_mid_o_1,\n"
           "            e_max + tl.log(e_sum),\n")
    mha_lse = lse + "        )\n"
    g_lse = lse + "            mask=mask_h,\n        )\n"
    mha_end = ("        ROTATE_BATCH=_rotate_batch(batch, uneven_batch),\n    )\n\n\n"
               "@triton.jit\ndef _fwd_grouped_kernel_stage1(")
    g_end = ("        ROTATE_BATCH=_rotate_batch(batch, uneven_batch),\n"
             "        **extra_kargs,\n    )\n")
    return (
        Anchor("meter imports", "import triton.language as tl\n",
               "import triton.language as tl\n" + _IMPORT),
        Anchor("stage-1 meter parameters", sig + "    cur_batch = tl.program_id(0)\n",
               sig[:-3] + "\n    Wit=None,\n    WitQn=None,\n    WitOut=None,\n"
               "    wit_stride_bs=0,\n    wit_stride_h=0,\n    wit_nb=1,\n    wit_q_heads=1,\n"
               "    wit_max_splits=1,\n    WitC=None,\n"
               "    WIT_NB: tl.constexpr = 1,\n    WIT_METER: tl.constexpr = False,\n):\n"
               "    cur_batch = tl.program_id(0)\n", count=2),
        Anchor("MHA meter init", mha_q,
               mha_q + _init("cur_head + tl.arange(0, 1)", "wit_heads < wit_q_heads")),
        Anchor("grouped meter init", gq, gq + _init("cur_head", "mask_h")),
        Anchor("MHA meter block", mha_qk,
               mha_qk + _block("            ", "qk[None, :]", "(offs_n < split_kv_end)[None, :]")),
        Anchor("grouped meter block", g_qk,
               g_qk + _block("            ", "qk",
                             "mask_h[:, None] & (offs_n[None, :] < split_kv_end)")),
        Anchor("MHA meter store", mha_lse, mha_lse + _STORE),
        Anchor("grouped meter store", g_lse, g_lse + _STORE),
        Anchor("MHA launch", "    _fwd_kernel_stage1[grid](\n",
               _WRAP + "    _fwd_kernel_stage1[grid](\n"),
        Anchor("grouped launch", "    _fwd_grouped_kernel_stage1[grid](\n",
               _WRAP + "    _fwd_grouped_kernel_stage1[grid](\n"),
        Anchor("stage-2 sink check", "    HAS_SINK = sinks is not None\n",
               "    HAS_SINK = sinks is not None\n"
               "    _witcert_rt.stage2_check(has_sink=HAS_SINK)\n"),
        Anchor("MHA launch arguments", mha_end,
               mha_end.replace("uneven_batch),\n    )", "uneven_batch),\n        **_wit,\n    )")),
        Anchor("grouped launch arguments", g_end,
               g_end.replace("**extra_kargs,\n", "**extra_kargs,\n        **_wit,\n")),
    )


def pool_anchors() -> tuple[Anchor, ...]:
    """The edits of ``memory_pool.py`` (SGLang 0.5.23)."""
    imp = "from sglang.srt.mem_cache.utils import (\n"
    mha = ("        global_layer_id = layer.layer_id if layer is not None else layer_id\n\n"
           "        if self.is_quantized_kv_cache:\n")
    mla = ("            \"declared which loc space it emits.\"\n        )\n"
           "        if cache_k.dtype != self.dtype:\n"
           "            cache_k = cache_k.to(self.dtype)\n")
    mha_new = mha.replace("\n\n", (
        "\n        if _witcert_rt.active() is not None:\n"
        "            _witcert_rt.write_keys(\n"
        "                layer_id - self.start_layer, loc, cache_k,\n"
        "                self.k_buffer[layer_id - self.start_layer], dtype=self.dtype,\n"
        "                k_scale=k_scale, quantized=self.is_quantized_kv_cache,\n"
        "                unsupported=\"a head-major cache\" if self.use_hnd else\n"
        "                (\"a masked write\" if dcp_kv_mask is not None else None))\n\n"), 1)
    mla_new = mla.replace("        )\n", (
        "        )\n"
        "        if _witcert_rt.active() is not None:\n"
        "            _witcert_rt.write_keys(\n"
        "                layer_id - self.start_layer, loc, cache_k,\n"
        "                self.kv_buffer[layer_id - self.start_layer], dtype=self.dtype)\n"), 1)
    return (
        Anchor("pool imports", imp, "from witcert_adapters.sglang import runtime as _witcert_rt\n"
               + imp),
        Anchor("MHA witness write", mha, mha_new),
        Anchor("MLA witness write", mla, mla_new),
    )


_EXT_IMPORT = _IMPORT.replace(
    "from witcert_adapters.sglang.triton_meter import meter_init",
    "from witcert_adapters.sglang.triton_meter import meter_exact as _witcert_exact\n"
    "from witcert_adapters.sglang.triton_meter import meter_init")
# one row per (token, head): the rows' index into the [tokens, heads] meter buffers
_EXT_ROWS = ("(cur_seq_extend_start_idx + cur_block_m * BLOCK_M + offs_m) * wit_q_heads"
             " + cur_head")
_EXT_TAIL = ("                    cur_head,\n                    final_mask,\n"
             "                    Aux0,\n                    aux0_stride_t,\n"
             "                    aux0_stride_h,\n                    aux0_len,\n"
             "                )\n\n            qk = tl.where(final_mask, qk, float(\"-inf\"))\n")
# the logits in natural-log units, converted as the kernel's own log-sum-exp store does
_EXT_S = "(qk * LN2 if USE_EXP2 else qk)"


def extend_anchors() -> tuple[Anchor, ...]:
    """The edits of ``extend_attention.py`` (SGLang 0.5.23): ``_fwd_kernel`` and its launch;
    the unified and dense prefill entry points refuse a metered call."""
    sig = "    aux0_len=0,\n):\n    if USE_COMPACT_TILE_GRID:\n        output_tile"
    qpe = ("        qpe = tl.load(Q_Extend + offs_qpe, mask=mask_m[:, None], other=0.0)\n\n"
           "    # stage 1: compute scores with prefix\n")
    pre = ("                    start_n + offs_n_prefix[None, :],\n"
           "                    (cur_seq_extend_start_idx + cur_block_m * BLOCK_M + offs_m)[\n"
           "                        :, None\n                    ],\n" + _EXT_TAIL)
    ext = ("                    cur_seq_len_prefix + start_n + offs_n[None, :],\n"
           "                    (cur_seq_extend_start_idx + cur_block_m * BLOCK_M + offs_m)[\n"
           "                        :, None\n                    ],\n" + _EXT_TAIL)
    store = ("    offs_o = (\n"
             "        (cur_seq_extend_start_idx + cur_block_m * BLOCK_M + offs_m[:, None])\n")
    launch_end = ("        num_warps=num_warps,\n        num_stages=num_stages,\n"
                  "        **extra_kargs,\n    )\n\n\n@triton.jit\ndef _fwd_kernel_unified(")
    uni = ("    Lq, Lv = q.shape[-1], v_buffer.shape[-1]\n\n"
           "    # Get block sizes and configuration\n")
    dense = ("    assert k.shape[0] == v.shape[0], (\n"
             "        f\"k/v token counts must match, got {k.shape[0]} vs {v.shape[0]}\"\n"
             "    )\n")
    return (
        Anchor("extend meter imports", "import triton.language as tl\n",
               "import triton.language as tl\n" + _EXT_IMPORT),
        Anchor("extend meter parameters", sig,
               "    aux0_len=0,\n    Wit=None,\n    WitQn=None,\n    WitOut=None,\n"
               "    wit_stride_bs=0,\n    wit_stride_h=0,\n    wit_nb=1,\n    wit_q_heads=1,\n"
               "    WitC=None,\n    WIT_NB: tl.constexpr = 1,\n"
               "    WIT_METER: tl.constexpr = False,\n):\n"
               "    if USE_COMPACT_TILE_GRID:\n        output_tile"),
        Anchor("extend meter init", qpe,
               qpe.replace("\n\n", "\n\n    if WIT_METER:\n"
                           f"        wit_rows = {_EXT_ROWS}\n"
                           f"        {_STATE} = _witcert_init(\n"
                           "            WitQn, 0, wit_rows, mask_m, 1, wit_nb, WIT_NB)\n\n", 1)),
        Anchor("extend prefix meter block", pre,
               pre + "            if WIT_METER:\n"
               f"                {_STATE} = _witcert_block(\n"
               f"                    wqn, {_ARGS}, {_EXT_S}, final_mask, offs_kv_loc,\n"
               "                    mask_n, Wit, cur_kv_head, wit_stride_bs, wit_stride_h,\n"
               "                    wit_nb, WitC, WIT_NB)\n"),
        Anchor("extend chunk meter block", ext,
               ext + "            if WIT_METER:\n"
               f"                {_STATE} = _witcert_exact(\n"
               f"                    wqn, {_ARGS}, {_EXT_S}, final_mask)\n"),
        Anchor("extend meter store", store,
               "    if WIT_METER:\n"
               "        _witcert_store(WitOut, 0, wit_rows, mask_m, 0, 1, 1,\n"
               f"                       {_ARGS})\n\n" + store),
        Anchor("extend launch", "    _fwd_kernel[grid](\n",
               "    _wit = _witcert_rt.extend_args(\n"
               "        q_extend, k_extend, k_buffer, qo_indptr, kv_indptr, sm_scale, k_scale,\n"
               "        is_causal=is_causal, logit_cap=logit_cap,\n"
               "        xai_temperature_len=xai_temperature_len, score_mod=score_mod,\n"
               "        custom_mask=custom_mask, sliding_window_size=sliding_window_size,\n"
               "        sinks=sinks, skip_prefix=skip_prefix, skip_extend=skip_extend,\n"
               "        page_size=page_size, use_exp2=USE_EXP2)\n"
               "    _fwd_kernel[grid](\n"),
        Anchor("extend launch arguments", launch_end,
               launch_end.replace("**extra_kargs,\n", "**extra_kargs,\n        **_wit,\n")),
        Anchor("unified extend refusal", uni,
               uni.replace("\n\n", "\n    _witcert_rt.refuse_unmetered(\"the unified extend "
                           "kernel\")\n\n", 1)),
        Anchor("dense prefill refusal", dense,
               dense + "    _witcert_rt.refuse_unmetered(\"the dense prefill kernel\")\n"),
    )


def sglang_root() -> Path:
    """The folder of the installed ``sglang`` package (found without importing it).

    Raises:
        EngineMismatchError: SGLang is not installed.
    """
    spec = importlib.util.find_spec("sglang")
    if spec is None or spec.origin is None:
        raise EngineMismatchError("sglang", "an installed SGLang 0.5.23", "none")
    return Path(spec.origin).parent


@final
@dataclass(frozen=True, slots=True)
class Installed:
    """The adapter's applied patches; :meth:`revert` undoes them (other owners' stay)."""

    patches: tuple[FilePatch, ...]

    def revert(self) -> None:
        """Revert every file, last patched first (hash-checked by
        :meth:`~witcert_adapters.injection.FilePatch.revert`)."""
        for p in reversed(self.patches):
            p.revert()


def _targets(root: Path) -> tuple[tuple[Path, tuple[Anchor, ...]], ...]:
    return ((root / DECODE, decode_anchors()), (root / EXTEND, extend_anchors()),
            (root / POOL, pool_anchors()))


def install(*, radix_cache: bool, generation_checks: bool, root: Path | None = None
            ) -> Installed:
    """Patch the installed SGLang files (the meter still needs ``WITCERT_SGLANG=1``).

    Args:
        radix_cache: whether the engine runs its radix (prefix) cache (SGLang's default;
            ``--disable-radix-cache`` turns it off).
        generation_checks: whether slot reads are checked against the generation they were
            written at (:mod:`witcert_calculus.accounting.slots`).
        root: the ``sglang`` package folder (default: the installed one).

    Raises:
        EngineMismatchError: the radix cache without generation checks.
        InjectionError: an upstream block not found as expected in any file (checked in
            every file before any byte is written: nothing is written).

    A file already carrying this adapter's patch (an install a crash interrupted) is kept,
    so that calling :func:`install` again completes it; :func:`installed` reverts it.
    """
    if radix_cache and not generation_checks:
        raise EngineMismatchError(
            "the radix cache", "--disable-radix-cache, or generation checks on every slot read",
            "a radix cache that shares and reuses compressed slots with no generation checks "
            "(a witness could outlive its slot's occupant)")
    base = sglang_root() if root is None else root
    targets = _targets(base)
    # a file this adapter already patched (an install a crash interrupted, settled from the
    # journal) is kept; every anchor of every other file is checked before any is written
    kept = {path: applied_patch(path, anchors, owner=OWNER) for path, anchors in targets
            if OWNER in active_patches(path)}
    fresh = iter(patch_files([(p, a) for p, a in targets if p not in kept], owner=OWNER))
    return Installed(tuple(kept[p] if p in kept else next(fresh) for p, _ in targets))


def installed(*, root: Path | None = None) -> Installed:
    """The adapter's patches as applied (in this or another process), to revert them: every
    file that carries one (an install a crash interrupted may have patched only some; a
    journal entry it left is settled first)."""
    base = sglang_root() if root is None else root
    return Installed(tuple(applied_patch(p, a, owner=OWNER) for p, a in _targets(base)
                           if OWNER in active_patches(p)))
