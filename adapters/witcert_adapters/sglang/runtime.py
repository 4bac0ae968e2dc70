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
kernel compiles exactly as upstream).

Everything runs only inside :func:`metering` (an explicit :class:`Recorder` and config) or,
in an engine process, with :data:`witcert_adapters.sglang.config.CONFIG` enabled (a process
recorder). :meth:`Recorder.flush` turns the step's launches into typed readings per
``(layer, head)`` and admits each request's worst cell into the same
:class:`~witcert_adapters.vllm_plugin.verdicts.Accounts` the vLLM plugin uses, with coverage
by layer (written, read).

Main declarations
-----------------
- :class:`Recorder`, :class:`Launch`, :class:`CellReading`, :func:`metering`, :func:`active`.
- :func:`write_keys`, :func:`stage1_args`, :func:`stage2_check`: the calls in the patched
  files.
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
from witcert_adapters.sglang.triton_meter import MeterBounds, bounds_from_partials, \
    empty_partials, meter_constants
from witcert_adapters.vllm_plugin.meter import SUMMARY
from witcert_adapters.vllm_plugin.verdicts import Accounts, RequestTally
from witcert_calculus.contracts import Reading
from witcert_calculus.errors import EngineMismatchError, InvalidValueError
from witcert_calculus.metrics import AtConsume, AttentionTV
from witcert_calculus.theorems import TV_EFORM_SOUND, TV_TWO_SIDED_SOUND
from witcert_kernels.meter import band_norms
from witcert_kernels.triton_launch import pow2
from witcert_kernels.triton_witness import witness_write

__all__ = ["CellReading", "Launch", "Recorder", "active", "metering", "stage1_args",
           "stage2_check", "write_keys"]


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

    def bounds(self) -> MeterBounds:
        """The merged bounds ``[B, H]``."""
        return bounds_from_partials(self.partials, self.query_bands, self.seq_lens,
                                    scale=self.scale, tokens=self.tokens)


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


@final
@dataclass(slots=True)
class Recorder:
    """The witness buffers of the pools' layers and the launches of the current step."""

    config: SGLangConfig
    layers: dict[int, _LayerWitness] = field(default_factory=lambda: {})
    launches: list[Launch] = field(default_factory=lambda: [])
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
            if int(b.meter.shape[0]) != len(tallies):
                raise InvalidValueError("tallies", len(tallies),
                                        f"the launch of layer {launch.layer} has "
                                        f"{int(b.meter.shape[0])} requests")
            ev = b.basis.evidence(TV_EFORM_SOUND, TV_TWO_SIDED_SOUND)
            evidence = ev if evidence is None else evidence
            read.add(launch.layer)
            rows = cast(list[list[float]],
                        b.meter.tolist())  # pyright: ignore[reportUnknownMemberType]
            for r, row in enumerate(rows):
                for h, v in enumerate(row):
                    count[r] += 1
                    if math.isnan(v):
                        nan[r] += 1
                        continue
                    saturated[r] += int(v >= 1.0)
                    cells.append(CellReading(r, launch.layer, h, Reading(
                        AttentionTV[AtConsume], v, evidence=ev, delta=Fraction(0))))
                    if v > worst[r][0]:
                        worst[r] = (v, launch.layer, h)
        if evidence is not None:
            summary: list[list[float]] = []
            for r in range(len(tallies)):
                col = {"cells": count[r], "covered": count[r] - saturated[r] - nan[r],
                       "saturated": saturated[r], "nan": nan[r],
                       "worst": max(worst[r][0], 0.0), "worst_layer": worst[r][1],
                       "worst_head": worst[r][2], "worst_position": -1, "audited": 0,
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
    if q.dtype != k_buffer.dtype:  # the grouped kernel rounds q to the keys' dtype first
        raise EngineMismatchError("the decode query", f"the keys' dtype {k_buffer.dtype} (the "
                                  "witnesses do not cover a rounding of the query)", str(q.dtype))
    witness = rec.witness_of(k_buffer)
    if witness is None:
        rec.unwitnessed_reads += 1
        return {}
    entry = rec.layers[k_buffer.data_ptr()]
    bsz, heads = int(q.shape[0]), int(q.shape[1])
    splits = int(att_lse.shape[-1])
    nb = rec.config.bands
    qb = band_norms(q.to(torch.float64), bands=nb, layout=rec.config.layout).contiguous()
    partials = empty_partials(bsz, heads, splits, device=q.device)
    seq_lens = kv_indptr[1:bsz + 1] - kv_indptr[:bsz]
    rec.launches.append(Launch(entry.layer, partials, qb, seq_lens, float(scale),
                               int(witness.shape[0])))
    return {"Wit": witness, "WitQn": qb, "WitOut": partials,
            "wit_stride_bs": witness.stride(0), "wit_stride_h": witness.stride(1),
            "wit_nb": nb, "wit_q_heads": heads, "wit_max_splits": splits,
            "WitC": meter_constants(float(scale), nb, device=q.device), "WIT_NB": pow2(nb),
            "WIT_METER": True}
