"""vLLM's paged CPU KV cache as the plugin reads it: slots, rows, stored keys.

A layer's cache is one tensor ``[num_blocks, kv_heads, block_size, 2 * head_dim]``. Per
(block, kv head) it holds ``2 * block_size * head_dim`` elements: first the keys, stored
transposed as ``[head_dim, block_size]``, then the values as ``[block_size, head_dim]``.
Engine slot ``s`` is token ``s % block_size`` of block ``s // block_size``. An fp8 cache
holds ``uint8`` bytes of ``float8_e4m3fn`` (or ``e5m2``) values; the engine dequantizes
them as ``value * k_scale``.

A batch (one engine step) is given by the attention metadata every layer shares:
``query_start_loc`` (the query rows of each request, in order), ``seq_lens`` (the
request's visible length after this step), ``block_table`` and ``slot_mapping`` (the slot
each row writes). :class:`StepLayout` derives, once per step and without host loops, the
request and position of every row and the slots of every request's visible tokens.

Main declarations
-----------------
- :class:`StepLayout`: rows, positions and visible slots of one step; :func:`step_requests`
  (the step and its requests, from the engine's metadata); :func:`layer_index`.
- :class:`CacheFormat` and :func:`cache_format`: how a KV cache dtype stores keys.
- :func:`stored_keys`: the keys as the cache holds them, dequantized in float64;
  :func:`visible_keys`: the same for every request's visible tokens, head-major.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, final

import torch

from witcert_calculus.errors import EngineMismatchError, InvalidValueError

__all__ = ["CacheFormat", "StepLayout", "cache_format", "layer_index", "stored_keys",
           "step_requests", "visible_keys"]


@final
class CacheFormat(enum.Enum):
    """How a cache stores one key element."""

    MODEL_DTYPE = "model dtype"
    """The model's own dtype (``kv_cache_dtype="auto"``): keys stored as computed."""
    FP8_E4M3 = "fp8_e4m3"
    """``uint8`` bytes of ``float8_e4m3fn``, times the layer's ``k_scale``."""
    FP8_E5M2 = "fp8_e5m2"
    """``uint8`` bytes of ``float8_e5m2``, times the layer's ``k_scale``."""


_FORMATS: Final = {"auto": CacheFormat.MODEL_DTYPE, "fp8": CacheFormat.FP8_E4M3,
                   "fp8_e4m3": CacheFormat.FP8_E4M3, "fp8_e5m2": CacheFormat.FP8_E5M2}
_FP8_VIEW: Final = {CacheFormat.FP8_E4M3: torch.float8_e4m3fn,
                    CacheFormat.FP8_E5M2: torch.float8_e5m2}


def cache_format(kv_cache_dtype: str) -> CacheFormat:
    """The :class:`CacheFormat` of a vLLM ``kv_cache_dtype`` string.

    Raises:
        InvalidValueError: a dtype the plugin does not meter (named, with the known ones).

    Example:
        >>> cache_format("fp8")
        <CacheFormat.FP8_E4M3: 'fp8_e4m3'>
    """
    fmt = _FORMATS.get(kv_cache_dtype)
    if fmt is None:
        raise InvalidValueError("kv_cache_dtype", kv_cache_dtype,
                                f"the plugin meters only {sorted(_FORMATS)}")
    return fmt


def _key_blocks(cache: torch.Tensor) -> torch.Tensor:
    # One layer's keys as ``[num_blocks, kv_heads, head_dim, block_size]`` (a view).
    nb, kvh, bs, two_d = cache.shape
    return cache.view(nb, kvh, 2, two_d // 2, bs)[:, :, 0]


def _dequantize(raw: torch.Tensor, *, fmt: CacheFormat, k_scales: Sequence[float],
                scratch: list[torch.Tensor] | None = None) -> torch.Tensor:
    # ``[L, ...]`` stored elements to float64 exactly: the element's value, times the
    # layer's key scale for fp8 (written into the scratch buffer when one is given).
    if fmt is not CacheFormat.MODEL_DTYPE:
        raw = raw.view(_FP8_VIEW[fmt])
    if scratch is None:
        out = raw.to(torch.float64)
    else:
        if scratch[0].numel() < raw.numel():
            scratch[0] = torch.empty(raw.numel(), dtype=torch.float64)
        out = scratch[0][:raw.numel()].view(raw.shape).copy_(raw)
    if fmt is not CacheFormat.MODEL_DTYPE:
        scale = torch.tensor(list(k_scales), dtype=torch.float64)
        out.mul_(scale.view(-1, *([1] * (raw.dim() - 1))))
    return out


def stored_keys(kv_caches: Sequence[torch.Tensor], slots: torch.Tensor, *, fmt: CacheFormat,
                k_scales: Sequence[float]) -> torch.Tensor:
    """The keys of ``slots`` as each layer's cache holds them, dequantized exactly, float64.

    Args:
        kv_caches: per layer, the cache ``[num_blocks, kv_heads, block_size, 2 * head_dim]``.
        slots: ``[...]`` int64 engine slots (each in range).
        fmt: how the caches store an element.
        k_scales: per layer, the key scale (fp8 caches).

    Returns:
        ``[layers, ..., kv_heads, head_dim]`` float64.
    """
    bs = int(kv_caches[0].shape[2])
    block, offset = slots // bs, slots % bs
    raw = torch.stack([_key_blocks(c)[block, :, :, offset] for c in kv_caches])
    return _dequantize(raw, fmt=fmt, k_scales=k_scales)  # [L, ..., kvh, d]


def visible_keys(kv_caches: Sequence[torch.Tensor], slots: torch.Tensor, *, fmt: CacheFormat,
                 k_scales: Sequence[float], scratch: list[torch.Tensor] | None = None
                 ) -> torch.Tensor:
    """:func:`stored_keys` of every request's visible slots, head-major for the logits.

    Args:
        kv_caches, fmt, k_scales: as :func:`stored_keys`.
        slots: ``[R, S]`` the visible slots (:attr:`StepLayout.slots`).
        scratch: a one-element list holding a flat float64 buffer reused from step to step
            (grown when too small): the float64 keys are the step's one large tensor, and a
            fresh allocation of that size costs page faults every step.

    Returns:
        ``[layers, R, kv_heads, S, head_dim]`` float64, gathered in that order (no copy to
        transpose afterwards); a view of the scratch buffer when one is given.
    """
    kvh, bs = int(kv_caches[0].shape[1]), int(kv_caches[0].shape[2])
    block, offset = (slots // bs).unsqueeze(1), (slots % bs).unsqueeze(1)  # [R, 1, S]
    heads = torch.arange(kvh).view(1, kvh, 1)
    raw = torch.stack([_key_blocks(c).transpose(2, 3)[block, heads, offset]
                       for c in kv_caches])  # [L, R, kvh, S, d]
    return _dequantize(raw, fmt=fmt, k_scales=k_scales, scratch=scratch)


@final
@dataclass(frozen=True, slots=True)
class StepLayout:
    """The rows of one engine step and the visible slots of each request.

    Attributes:
        requests: number of requests ``R`` in the step.
        rows: number of query rows ``T`` (tokens of the step).
        row_request: ``[T]`` the request index of each row.
        row_position: ``[T]`` the absolute position of each row's token.
        row_slot: ``[T]`` the slot each row writes.
        q_lens: ``[R]`` rows per request.
        seq_lens: ``[R]`` visible tokens of each request after the step.
        slots: ``[R, S]`` the slot of each request's visible token ``j`` (``S`` the
            longest visible length; entries past a request's length are 0 and masked).
        visible: ``[R, S]`` bool, ``j < seq_lens[r]``.
    """

    requests: int
    rows: int
    row_request: torch.Tensor
    row_position: torch.Tensor
    row_slot: torch.Tensor
    q_lens: torch.Tensor
    seq_lens: torch.Tensor
    slots: torch.Tensor
    visible: torch.Tensor

    @classmethod
    def of(cls, *, query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
           block_table: torch.Tensor, slot_mapping: torch.Tensor, block_size: int
           ) -> StepLayout:
        """Derive the layout from vLLM's attention metadata (tensor ops only).

        Raises:
            InvalidValueError: the metadata disagree (row counts, lengths shorter than the
                rows, a row that writes no slot or a slot other than its position's).

        Example:
            >>> lay = StepLayout.of(query_start_loc=torch.tensor([0, 1, 3]),
            ...                     seq_lens=torch.tensor([5, 2]),
            ...                     block_table=torch.tensor([[0], [1]]),
            ...                     slot_mapping=torch.tensor([4, 128, 129]), block_size=128)
            >>> lay.row_position.tolist(), lay.slots[1, :2].tolist()
            ([4, 0, 1], [128, 129])
        """
        qsl = query_start_loc.to(torch.int64)
        requests = int(qsl.numel()) - 1
        seq = seq_lens[:requests].to(torch.int64)
        q_lens = qsl[1:] - qsl[:-1]
        rows = int(qsl[-1])
        row_slot = slot_mapping[:rows].to(torch.int64)
        if int(slot_mapping.numel()) < rows:
            raise InvalidValueError("slot_mapping", int(slot_mapping.numel()),
                                    f"must name a slot for each of the {rows} rows")
        if bool((q_lens > seq).any()) or bool((row_slot < 0).any()):
            raise InvalidValueError("attn_metadata",
                                    ([int(x) for x in q_lens], [int(x) for x in seq]),
                                    "a request has more rows than visible tokens, or a row "
                                    "writes no slot")
        row_request = torch.repeat_interleave(torch.arange(requests), q_lens)
        offset = torch.arange(rows) - qsl[:-1][row_request]
        row_position = seq[row_request] - q_lens[row_request] + offset
        width = int(seq.max()) if requests else 0
        j = torch.arange(width)
        visible = j.unsqueeze(0) < seq.unsqueeze(1)
        blocks = block_table[:requests].to(torch.int64)
        block_of = torch.clamp(j // block_size, max=max(int(blocks.shape[1]) - 1, 0))
        slots = blocks[:, block_of] * block_size + (j % block_size)
        slots = torch.where(visible, slots, 0)
        if rows and bool((slots[row_request, row_position] != row_slot).any()):
            raise InvalidValueError("slot_mapping", [int(x) for x in row_slot[:8]],
                                    "disagrees with the block table: a row writes a slot "
                                    "other than its position's")
        return cls(requests, rows, row_request, row_position, row_slot, q_lens, seq, slots,
                   visible)


def layer_index(layer: Any, n_layers: int) -> int:
    """An attention layer's index, from its name (``model.layers.7.self_attn.attn``).

    Raises:
        EngineMismatchError: a name with no single index below ``n_layers``.
    """
    digits = [int(p) for p in str(layer.layer_name).split(".") if p.isdigit()]
    if len(digits) != 1 or not 0 <= digits[0] < n_layers:
        raise EngineMismatchError("attention layer name", f"one layer index below {n_layers}",
                                  str(layer.layer_name))
    return digits[0]


def step_requests(metadata: Any, *, block_size: int, runner: Any, scheduler_output: Any
                  ) -> tuple[StepLayout, list[str]]:
    """A step's layout (from the attention metadata) and its requests in batch order (from
    the model runner's batch), checked against the scheduler's rows per request.

    Raises:
        EngineMismatchError: the rows per request differ from the scheduler's.
        InvalidValueError: metadata that disagree (:meth:`StepLayout.of`).
    """
    step = StepLayout.of(query_start_loc=metadata.query_start_loc, seq_lens=metadata.seq_lens,
                         block_table=metadata.block_table, slot_mapping=metadata.slot_mapping,
                         block_size=block_size)
    q_lens = [int(n) for n in step.q_lens]
    requests = [str(r) for r in runner.input_batch.req_ids[:step.requests]]
    scheduled = [int(scheduler_output.num_scheduled_tokens.get(r, -1)) for r in requests]
    if scheduled != q_lens:
        raise EngineMismatchError("batch order", f"rows per request {scheduled}",
                                  f"query_start_loc segments {q_lens}")
    return step, requests
