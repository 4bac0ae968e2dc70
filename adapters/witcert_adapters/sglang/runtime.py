"""What the patched SGLang files call: witness writes in the KV pools, meter arguments for the
stage-1 decode kernels, and the step's readings into the ledger accounts.

The patched ``set_kv_buffer`` of ``MHATokenToKVPool`` and ``MLATokenToKVPool`` calls
:func:`write_keys` before it stores: the witnesses ``||(k_hat - k)_b||`` of the keys as the
pool will store them (``k_hat``: the keys cast to the pool's dtype) are written by
:func:`witcert_kernels.triton_witness.witness_write` into a witness buffer of the layer,
``[slots, kv_heads, bands]``, allocated alongside the layer's key buffer on its first write
and filled with ``+inf``: a slot that was never witnessed saturates the meter, it never reads
as exact. The patched stage-1 launches call :func:`stage1_args`, which finds the witness
buffer of the key buffer being read, computes the query's band norms and hands the kernel
its meter arguments (none when the meter is off or the layer was never witnessed, so the
kernel compiles exactly as upstream). The patched extend launch calls :func:`extend_args`
in the same way (one meter row per query token and head, :class:`ExtendLaunch`).

Everything runs only inside :func:`metering` (an explicit :class:`Recorder` and config) or,
in an engine process, with :data:`witcert_adapters.sglang.config.CONFIG` enabled (a process
recorder). :meth:`Recorder.flush` turns the step's launches into typed readings per
``(layer, head)`` and admits each request's worst cell into the same
:class:`~witcert_adapters.vllm_plugin.verdicts.Accounts` the vLLM plugin uses, with coverage
by layer (written, read).

Main declarations
-----------------
- :class:`Recorder`, :class:`Launch`, :class:`ExtendLaunch`, :class:`CellReading`,
  :func:`metering`, :func:`active`.
- :func:`write_keys`, :func:`stage1_args`, :func:`stage2_check`, :func:`extend_args`,
  :func:`refuse_unmetered`: the calls in the patched files.
"""

from __future__ import annotations

import math
from collections.abc import Generator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, cast, final

import torch

from witcert_adapters.sglang.config import CONFIG, SGLangConfig
from witcert_adapters.sglang.triton_meter import bounds_from_partials, \
    empty_partials, meter_constants
from witcert_adapters.vllm_plugin.meter import SUMMARY
from witcert_adapters.vllm_plugin.verdicts import Accounts, RequestTally
from witcert_calculus.contracts import Reading, _reading  # pyright: ignore[reportPrivateUsage]
from witcert_calculus.errors import EngineMismatchError, InvalidValueError
from witcert_calculus.lean.theorems import TV_EFORM_METER_SOUND, TV_TWO_SIDED_METER_SOUND
from witcert_calculus.metrics import AtConsume, AttentionTV
from witcert_kernels.meter import band_norms
from witcert_kernels.triton_decode_merge import TierMeter
from witcert_kernels.triton_launch import pow2
from witcert_kernels.triton_witness import witness_write

__all__ = ["CellReading", "ExtendLaunch", "Launch", "Recorder", "active", "extend_args",
           "metering", "refuse_unmetered", "stage1_args", "stage2_check", "write_keys"]


@final
@dataclass(frozen=True, slots=True, eq=False)
class Launch:
    """One metered stage-1 launch: its layer, the kernel's partials and what merges them."""

    layer: int
    partials: torch.Tensor
    query_bands: torch.Tensor
    seq_lens: torch.Tensor
    scale: float
    tokens: int

    def bounds(self) -> TierMeter:
        """The merged bounds ``[B, H]``."""
        return bounds_from_partials(self.partials, self.query_bands, self.seq_lens,
                                    scale=self.scale, tokens=self.tokens)


    def request_meter(self, b: TierMeter) -> torch.Tensor:
        """The meter per request and head ``[B, H]`` (one query row per request)."""
        return b.meter


@final
@dataclass(frozen=True, slots=True, eq=False)
class ExtendLaunch:
    """One metered extend (prefill) launch: one query row per ``(token, head)``.

    ``qo_indptr`` and ``kv_indptr`` (host copies) give each token its request and the keys it
    sees: the request's prefix and, causally, the chunk's tokens up to itself."""

    layer: int
    partials: torch.Tensor
    query_bands: torch.Tensor
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    causal: bool
    scale: float
    tokens: int

    def _rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        qo, kv = self.qo_indptr.long(), self.kv_indptr.long()
        ext, pre = qo[1:] - qo[:-1], kv[1:] - kv[:-1]
        req = torch.repeat_interleave(torch.arange(int(ext.numel())), ext)
        pos = torch.arange(int(req.numel())) + int(qo[0]) - qo[req]
        seen = pre[req] + (pos + 1 if self.causal else ext[req])
        return req, seen

    def bounds(self) -> TierMeter:
        """The merged bounds per token and head ``[T, H]`` (the tokens of ``qo_indptr``)."""
        _, seen = self._rows()
        lo, hi = int(self.qo_indptr[0]), int(self.qo_indptr[-1])
        return bounds_from_partials(self.partials[lo:hi], self.query_bands[lo:hi],
                                    seen.to(self.partials.device), scale=self.scale,
                                    tokens=self.tokens)

    def request_meter(self, b: TierMeter) -> torch.Tensor:
        """Each request's worst token per head ``[B, H]`` (NaN if any token's is NaN; 0 for
        a request with no token in the chunk)."""
        req, _ = self._rows()
        out = torch.zeros(int(self.qo_indptr.numel()) - 1, int(b.meter.shape[1]),
                          dtype=b.meter.dtype)
        m = b.meter.cpu()
        for r in range(int(out.shape[0])):
            rows = m[req == r]
            if int(rows.shape[0]) > 0:
                out[r] = rows.amax(dim=0)
        return out


@final
@dataclass(frozen=True, slots=True)
class CellReading:
    """The typed reading of one ``(layer, head)`` cell of one request in one step."""

    request: int
    layer: int
    head: int
    reading: Reading[AttentionTV[AtConsume]]


@final
@dataclass(slots=True)
class _LayerWitness:
    layer: int
    witness: torch.Tensor
    key: torch.Tensor  # held, so that its address is never reused while it is registered
    writes: int = 0
    last: torch.Tensor | None = None  # the keys of the layer's latest write, as handed in


@final
@dataclass(slots=True)
class Recorder:
    """The witness buffers of the pools' layers and the launches of the current step."""

    config: SGLangConfig
    layers: dict[int, _LayerWitness] = field(default_factory=lambda: {})
    launches: list[Launch | ExtendLaunch] = field(default_factory=lambda: [])
    step_writes: set[int] = field(default_factory=lambda: set())
    unwitnessed_reads: int = 0

    def witness_of(self, key_buffer: torch.Tensor) -> torch.Tensor | None:
        """The witness buffer of a layer's key buffer (``None``: never witnessed)."""
        entry = self.layers.get(key_buffer.data_ptr())
        return None if entry is None else entry.witness

    def _layer(self, layer: int, key_buffer: torch.Tensor) -> _LayerWitness:
        entry = self.layers.get(key_buffer.data_ptr())
        if entry is None:
            if key_buffer.ndim != 3:
                raise EngineMismatchError("the key buffer's layout", "[slots, kv_heads, dim]",
                                          f"shape {tuple(key_buffer.shape)}")
            slots, kv_heads, _ = (int(n) for n in key_buffer.shape)
            w = torch.full((slots, kv_heads, self.config.bands), math.inf, dtype=torch.float32,
                           device=key_buffer.device)
            entry = _LayerWitness(layer, w, key_buffer)
            self.layers[key_buffer.data_ptr()] = entry
        return entry

    def flush(self, accounts: Accounts, tallies: Sequence[RequestTally], *,
              layers: int) -> tuple[CellReading, ...]:
        """Close the step: readings per ``(request, layer, head)``, each request's worst cell
        admitted into its account, coverage by layer folded into its tally.

        Args:
            accounts: the engine's accounts (one ledger account per request).
            tallies: the step's requests, in batch order.
            layers: the layers the model has (each must be written and read).
        """
        cells: list[CellReading] = []
        evidence = None
        worst: list[tuple[float, int, int]] = [(-1.0, -1, -1) for _ in tallies]
        count = [0] * len(tallies)
        saturated = [0] * len(tallies)
        nan = [0] * len(tallies)
        read: set[int] = set()
        for launch in self.launches:
            b = launch.bounds()
            per = launch.request_meter(b)
            if int(per.shape[0]) != len(tallies):
                raise InvalidValueError("tallies", len(tallies),
                                        f"the launch of layer {launch.layer} has "
                                        f"{int(per.shape[0])} requests")
            ev = b.basis.evidence(TV_EFORM_METER_SOUND, TV_TWO_SIDED_METER_SOUND)
            evidence = ev if evidence is None else evidence
            read.add(launch.layer)
            rows = cast(list[list[float]],
                        per.tolist())  # pyright: ignore[reportUnknownMemberType]
            for r, row in enumerate(rows):
                for h, v in enumerate(row):
                    count[r] += 1
                    if math.isnan(v):
                        nan[r] += 1
                        continue
                    saturated[r] += int(v >= 1.0)
                    cells.append(CellReading(r, launch.layer, h, _reading(
                        AttentionTV[AtConsume], v, evidence=ev, delta=Fraction(0))))
                    if v > worst[r][0]:
                        worst[r] = (v, launch.layer, h)
        if evidence is not None:
            summary: list[list[float]] = []
            for r in range(len(tallies)):
                col = {"cells": count[r], "covered": count[r] - saturated[r] - nan[r],
                       "saturated": saturated[r], "nan": nan[r],
                       "worst": max(worst[r][0], 0.0), "worst_layer": worst[r][1],
                       "worst_head": worst[r][2], "worst_position": -1,
                       "by_tanh": 0,  # the kernels report the meter
                       "audited": 0,
                       "violations": 0, "true_max": 0.0, "excess_max": 0.0}
                summary.append([float(col[c]) for c in SUMMARY])
            accounts.add_step(tallies, summary, [1] * len(tallies),
                              written=sorted(self.step_writes & set(range(layers))),
                              read=sorted(read), evidence=evidence)
        self.launches.clear()
        self.step_writes.clear()
        return tuple(cells)


_PROCESS: Recorder | None = Recorder(CONFIG) if CONFIG.enabled else None
_CURRENT: list[Recorder] = []


def active() -> Recorder | None:
    """The recorder the patched files report to (``None``: the meter is off)."""
    return _CURRENT[-1] if _CURRENT else _PROCESS


@contextmanager
def metering(config: SGLangConfig) -> Generator[Recorder | None]:
    """Meter with an explicit config (in place of the environment's) within the block."""
    rec = Recorder(config) if config.enabled else None
    if rec is not None:
        _CURRENT.append(rec)
    try:
        yield rec
    finally:
        if rec is not None:
            _CURRENT.pop()


def write_keys(layer: int, loc: torch.Tensor, cache_k: torch.Tensor, key_buffer: torch.Tensor,
               *, dtype: torch.dtype, k_scale: float | None = None, quantized: bool = False,
               unsupported: str | None = None) -> None:
    """Witness the keys ``cache_k [N, kv_heads, dim]`` that the pool stores at ``loc``.

    Raises:
        EngineMismatchError: a pool path the witnesses do not cover (a key scale, a quantized
            or head-major cache, a masked write).
    """
    rec = active()
    if rec is None:
        return
    if k_scale is not None or quantized or unsupported is not None:
        raise EngineMismatchError("the KV pool's write path", "a plain cast into the pool's dtype",
                                  unsupported or ("a key scale" if k_scale is not None
                                                  else "a quantized cache"))
    entry = rec._layer(layer, key_buffer)  # pyright: ignore[reportPrivateUsage]
    k_hat = cache_k.to(dtype).to(cache_k.dtype)
    w = witness_write(cache_k, k_hat, bands=rec.config.bands, layout=rec.config.layout)
    entry.witness[loc] = w.view(int(cache_k.shape[0]), -1, rec.config.bands)
    entry.writes += 1
    entry.last = cache_k
    rec.step_writes.add(layer)


def stage2_check(*, has_sink: bool) -> None:
    """Refuse attention sinks while metering (the meter's softmax has no sink term).

    Raises:
        EngineMismatchError: a sink in a metered step.
    """
    if has_sink and active() is not None:
        raise EngineMismatchError("the decode softmax", "no attention sinks", "attention sinks")


def stage1_args(q: torch.Tensor, k_buffer: torch.Tensor, att_lse: torch.Tensor,
                kv_indptr: torch.Tensor, scale: float, *, logit_cap: float,
                xai_temperature_len: int, score_mod: object, page_size: int) -> dict[str, Any]:
    """The meter's extra arguments of one stage-1 launch (empty: launch as upstream).

    Raises:
        EngineMismatchError: logits the witnesses do not bound (a logit cap, a temperature,
            a score modifier, a query in another dtype than the keys) or a paged key view.
    """
    rec = active()
    if rec is None:
        return {}
    if logit_cap > 0 or xai_temperature_len > 0 or score_mod is not None or k_buffer.ndim != 3:
        raise EngineMismatchError("the decode logits", "plain scaled dot products over "
                                  "[slots, kv_heads, dim] keys",
                                  f"logit_cap={logit_cap}, xai_temperature_len="
                                  f"{xai_temperature_len}, score_mod={score_mod!r}, "
                                  f"k_buffer {tuple(k_buffer.shape)}")
    found = _witnessed(rec, q, k_buffer, "the decode query")  # the grouped kernel rounds q
    if found is None:
        return {}
    witness, entry, qb = found
    bsz, heads = int(q.shape[0]), int(q.shape[1])
    splits = int(att_lse.shape[-1])
    partials = empty_partials(bsz, heads, splits, device=q.device)
    seq_lens = kv_indptr[1:bsz + 1] - kv_indptr[:bsz]
    rec.launches.append(Launch(entry.layer, partials, qb, seq_lens, float(scale),
                               int(witness.shape[0])))
    return _kernel_args(rec, witness, qb, partials, scale, wit_max_splits=splits)


def _witnessed(rec: Recorder, q: torch.Tensor, k_buffer: torch.Tensor, what: str
               ) -> tuple[torch.Tensor, _LayerWitness, torch.Tensor] | None:
    # The layer's witness buffer, its entry and the query's band norms for one launch
    # (None: keys the pool never witnessed, counted as an unwitnessed read). The kernels round
    # q to the keys' dtype before the dot product, a rounding the witnesses do not cover.
    if q.dtype != k_buffer.dtype:
        raise EngineMismatchError(what, f"the keys' dtype {k_buffer.dtype} (the witnesses do "
                                  "not cover a rounding of the query)", str(q.dtype))
    witness = rec.witness_of(k_buffer)
    if witness is None:
        rec.unwitnessed_reads += 1
        return None
    qb = band_norms(q.to(torch.float64), bands=rec.config.bands,
                    layout=rec.config.layout).contiguous()
    return witness, rec.layers[k_buffer.data_ptr()], qb


def _kernel_args(rec: Recorder, witness: torch.Tensor, qb: torch.Tensor, partials: torch.Tensor,
                 scale: float, **extra: int) -> dict[str, Any]:
    # The meter's keyword arguments of a patched launch (the injected parameters' names).
    nb = rec.config.bands
    return {"Wit": witness, "WitQn": qb, "WitOut": partials,
            "wit_stride_bs": witness.stride(0), "wit_stride_h": witness.stride(1),
            "wit_nb": nb, "wit_q_heads": int(qb.shape[1]),
            "WitC": meter_constants(float(scale), nb, device=qb.device), "WIT_NB": pow2(nb),
            "WIT_METER": True, **extra}


def refuse_unmetered(kernel: str) -> None:
    """Refuse a prefill kernel that carries no meter while metering (its reads would go
    unmetered).

    Raises:
        EngineMismatchError: ``kernel`` called in a metered step.
    """
    if active() is not None:
        raise EngineMismatchError("the prefill kernel", "extend_attention_fwd (metered)", kernel)


def extend_args(q: torch.Tensor, k_extend: torch.Tensor, k_buffer: torch.Tensor,
                qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, scale: float,
                k_scale: object, *, is_causal: bool, logit_cap: float, xai_temperature_len: int,
                score_mod: object, custom_mask: object, sliding_window_size: int,
                sinks: object, skip_prefix: bool, skip_extend: bool,
                page_size: int, use_exp2: bool = False) -> dict[str, Any]:
    """The meter's extra arguments of one ``_fwd_kernel`` launch (empty: launch as upstream).

    Each query row (token) and head accumulates the Tier-A meter over both of the kernel's
    loops. The prefix loop reads the request's cached keys from the pool through
    ``kv_indices``: their ``c_t`` come from the stored witnesses of those slots. The extend
    loop reads the chunk's own keys from ``k_extend``: SGLang's Triton backend stores the
    layer's freshly computed keys into the pool and hands the same keys, not the pool's
    compressed copies, to the kernel, so those logits are the exact ones and their ``c`` is
    exactly 0; they still enter every log-sum-exp of ``s``. This is checked per launch: the
    chunk's keys must equal the keys of the layer's latest pool write (the backend's
    read-back of cached keys, ``k_buffer[cache_loc]``, follows no write and is refused). The
    kernel's logits enter the meter in natural-log units; its base-2 mode (logits scaled by
    ``log2 e``, converted back by a float32 product whose rounding the margin analysis does
    not cover) is refused while metering, and ``c`` uses the scale ``sm_scale`` the prefix
    logits were computed with (a key scale other than 1 is refused).

    Raises:
        EngineMismatchError: logits or masks the witnesses do not follow (a logit cap, a
            temperature, a score modifier, a custom mask, a sliding window, sinks, a key
            scale, a split prefix or chunk pass, the base-2 mode, a paged key view, a query in another dtype
            than the pool's keys, chunk keys other than those the layer last stored).
    """
    rec = active()
    if rec is None:
        return {}
    ks = float(k_scale) if isinstance(k_scale, (int, float, torch.Tensor)) else math.nan
    if (logit_cap > 0 or xai_temperature_len > 0 or score_mod is not None
            or custom_mask is not None or sliding_window_size > 0 or sinks is not None
            or ks != 1.0 or skip_prefix or skip_extend or page_size != 1
            or k_buffer.ndim != 3 or use_exp2):
        raise EngineMismatchError(
            "the extend logits", "plain causal or full scaled dot products over "
            "[slots, kv_heads, dim] keys, both loops, no sinks",
            f"logit_cap={logit_cap}, xai_temperature_len={xai_temperature_len}, "
            f"score_mod={score_mod!r}, custom_mask={'set' if custom_mask is not None else None}"
            f", sliding_window_size={sliding_window_size}, "
            f"sinks={'set' if sinks is not None else None}, k_scale={k_scale!r}, "
            f"skip_prefix={skip_prefix}, skip_extend={skip_extend}, page_size={page_size}, "
            f"use_exp2={use_exp2}, k_buffer {tuple(k_buffer.shape)}")
    found = _witnessed(rec, q, k_buffer, "the extend query")  # the prefix loop rounds q
    if found is None:
        return {}
    witness, entry, qb = found
    last = entry.last
    if last is None or last.shape != k_extend.shape or not torch.equal(last, k_extend):
        raise EngineMismatchError("the extend chunk's keys", "the keys the layer's latest pool "
                                  "write was handed (the freshly computed ones)",
                                  f"keys {tuple(k_extend.shape)} that layer {entry.layer} "
                                  "did not last store (possibly the pool's compressed copies)")
    tokens, heads = int(q.shape[0]), int(q.shape[1])
    partials = empty_partials(tokens, heads, 1, device=q.device)
    rec.launches.append(ExtendLaunch(entry.layer, partials, qb, qo_indptr.detach().cpu(),
                                     kv_indptr.detach().cpu(), bool(is_causal), float(scale),
                                     int(witness.shape[0]) + tokens))
    return _kernel_args(rec, witness, qb, partials, scale)
