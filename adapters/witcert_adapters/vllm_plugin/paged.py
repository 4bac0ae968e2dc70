"""vLLM's paged CPU KV cache as the plugin reads it: slots, rows, stored keys and values.

A layer's cache is one tensor ``[num_blocks, kv_heads, block_size, 2 * head_dim]``. Per
(block, kv head) it holds ``2 * block_size * head_dim`` elements: first the keys, then the
values, placed by the writer of the attention's ISA (:class:`CacheLayout`): for ``vec`` the
keys transposed as ``[head_dim, block_size]`` and the values as ``[block_size, head_dim]``;
``amx`` interleaves them in tiles. Engine slot ``s`` is token ``s % block_size`` of block
``s // block_size``. An fp8 cache holds ``uint8`` bytes of ``float8_e4m3fn`` (or ``e5m2``)
values, written by the rule of :mod:`.quantizer`; the engine reads them back as
``value * scale``.

A batch (one engine step) is given by the attention metadata every layer shares:
``query_start_loc`` (the query rows of each request, in order), ``seq_lens`` (the
request's visible length after this step), ``block_table`` and ``slot_mapping`` (the slot
each row writes). :class:`StepLayout` derives, once per step and without host loops, the
request and position of every row and the slots of every request's visible tokens.

Main declarations
-----------------
- :class:`StepLayout`: rows, positions and visible slots of one step; :func:`step_requests`
  (the step and its requests, from the engine's metadata); :func:`layer_index`.
- :class:`CacheFormat` and :func:`cache_format`: how a KV cache dtype stores an element;
  :class:`CacheLayout` and :func:`cache_layout`: where an ISA's writer puts it.
- :func:`stored_elements`: the raw elements of slots (keys or values);
  :func:`dequantize`: to float64, exactly; :func:`stored_keys`: both at once;
  :func:`visible_keys`: the same for every request's visible tokens, head-major.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, final

import torch

from witcert_adapters.vllm_plugin.quantizer import float32_scale
from witcert_calculus.errors import EngineMismatchError, InvalidValueError
from witcert_calculus.meters.formats import Fp8Format

__all__ = ["CacheFormat", "CacheLayout", "StepLayout", "cache_format", "cache_layout",
           "dequantize", "layer_index", "step_requests", "stored_elements", "stored_keys",
           "visible_keys"]


@final
class CacheFormat(enum.Enum):
    """How a cache stores one key element."""

    MODEL_DTYPE = "model dtype"
    """The model's own dtype (``kv_cache_dtype="auto"``): keys stored as computed."""
    FP8_E4M3 = "fp8_e4m3"
    """``uint8`` bytes of ``float8_e4m3fn``, times the layer's ``k_scale``."""
    FP8_E5M2 = "fp8_e5m2"
    """``uint8`` bytes of ``float8_e5m2``, times the layer's ``k_scale``."""

    @property
    def fp8(self) -> Fp8Format | None:
        """The fp8 format of the bytes (``None`` for the model's dtype)."""
        return {CacheFormat.FP8_E4M3: Fp8Format.E4M3,
                CacheFormat.FP8_E5M2: Fp8Format.E5M2}.get(self)


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


@final
class CacheLayout(enum.Enum):
    """Where the CPU writer of an ISA puts token ``o`` (of a block) and channel ``c``.

    Offsets are within one (block, kv head) region of ``2 * block_size * head_dim``
    elements, keys first: ``K(o, c)`` and ``V(o, c)``.
    """

    VEC = "vec"
    """``K = c * bs + o`` (keys transposed), ``V = bs * d + o * d + c``."""
    AMX = "amx"
    """``K = (o // 16) 16 d + (c // 2) 32 + (o % 16) 2 + c % 2``,
    ``V = bs d + (c // 16) 16 bs + (o // 2) 32 + (c % 16) 2 + o % 2``."""


_LAYOUTS: Final = {"vec": CacheLayout.VEC, "amx": CacheLayout.AMX}


def cache_layout(isa: str) -> CacheLayout:
    """The :class:`CacheLayout` the CPU writer of ``isa`` uses.

    Raises:
        EngineMismatchError: an ISA whose layout the plugin does not read (named).

    Example:
        >>> cache_layout("vec")
        <CacheLayout.VEC: 'vec'>
    """
    layout = _LAYOUTS.get(isa)
    if layout is None:
        raise EngineMismatchError("CPU attention ISA", f"one of {sorted(_LAYOUTS)} (the cache "
                                  "layouts the plugin reads)", repr(isa))
    return layout


def _views(cache: torch.Tensor, layout: CacheLayout
           ) -> tuple[torch.Tensor, torch.Tensor]:
    # One layer's keys and values as views indexed by (block, head, *token dims, *channel
    # dims): VEC [nb, kvh, bs, d] each; AMX keys [nb, kvh, bs/16, 16, d/2, 2], values
    # [nb, kvh, bs/2, 2, d/16, 16].
    nb, kvh, bs, two_d = (int(n) for n in cache.shape)
    d = two_d // 2
    region = cache.view(nb, kvh, 2, bs * d)
    k, v = region[:, :, 0], region[:, :, 1]
    if layout is CacheLayout.VEC:
        return k.view(nb, kvh, d, bs).transpose(2, 3), v.view(nb, kvh, bs, d)
    if bs % 16 or d % 16:
        raise EngineMismatchError("AMX cache layout", "block size and head dim multiples of 16",
                                  f"block size {bs}, head dim {d}")
    keys = k.view(nb, kvh, bs // 16, d // 2, 16, 2).permute(0, 1, 2, 4, 3, 5)
    values = v.view(nb, kvh, d // 16, bs // 2, 16, 2).permute(0, 1, 3, 5, 2, 4)
    return keys, values


def _token(offset: torch.Tensor, layout: CacheLayout, part: int) -> tuple[torch.Tensor, ...]:
    # The token index (or indices) of a block offset in the views of _views.
    if layout is CacheLayout.VEC:
        return (offset,)
    group = 16 if part == 0 else 2
    return (offset // group, offset % group)


def stored_elements(kv_caches: Sequence[torch.Tensor], slots: torch.Tensor, *,
                    layout: CacheLayout, part: int = 0, heads_first: bool = False
                    ) -> torch.Tensor:
    """The raw elements (bytes of an fp8 cache, else the model's dtype) of ``slots``.

    Args:
        kv_caches: per layer, the cache ``[num_blocks, kv_heads, block_size, 2 * head_dim]``.
        slots: ``[...]`` int64 engine slots (each in range).
        layout: where the writer put them; ``part``: 0 keys, 1 values.
        heads_first: put the kv heads before the slots' dimensions (``[L, kv_heads, ...,
            d]``, the attention's order for ``[R, S]`` slots: ``[L, R, kvh, S, d]``).

    Returns:
        ``[layers, ..., kv_heads, head_dim]`` (or heads first, see above).
    """
    offsets = element_offsets(kv_caches, slots, layout=layout, part=part,
                              heads_first=heads_first)
    if offsets is not None:
        # one flat index of the elements, the same in every layer's cache (its layout and
        # shape): a plain take per layer instead of a multi-tensor advanced index
        start, channels = offsets
        flat = start.unsqueeze(-1) + channels
        return torch.stack([c.view(-1)[flat] for c in kv_caches])
    index = _element_dims(kv_caches[0], slots, layout=layout, part=part,
                          heads_first=heads_first)
    out = [_views(c, layout)[part][index] for c in kv_caches]
    return torch.stack([o.reshape(*o.shape[:int(slots.dim()) + 1], -1) for o in out])


def element_offsets(kv_caches: Sequence[torch.Tensor], slots: torch.Tensor, *,
                    layout: CacheLayout, part: int = 0, heads_first: bool = False
                    ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Where :func:`stored_elements`'s elements are in each layer's cache flattened, the
    same for every layer: ``cache.view(-1)[start[..., None] + channels]``, ``start`` (shaped
    as one layer's result without its last dimension) the position of each (slot, kv
    head)'s first element and ``channels`` (``[head_dim]``) the offsets of its elements
    from it (the same for every token, in every layout); ``None`` when the caches differ in
    shape or one is not contiguous."""
    first = kv_caches[0]
    if not all(c.is_contiguous() and c.shape == first.shape for c in kv_caches):
        return None
    index = _element_dims(first, slots, layout=layout, part=part, heads_first=heads_first)
    start, channels = _flat_index(_views(first, layout)[part], index,
                                  int(first.storage_offset()))
    return start.reshape(*start.shape[:int(slots.dim()) + 1]), channels


def _element_dims(cache: torch.Tensor, slots: torch.Tensor, *, layout: CacheLayout, part: int,
                  heads_first: bool) -> tuple[torch.Tensor, ...]:
    # The (block, head, *token dims) indices of ``slots`` in the views of _views.
    bs = int(cache.shape[2])
    kvh = int(cache.shape[1])
    if heads_first:  # [R, S] -> [R, kvh, S]
        block, offset = (slots // bs).unsqueeze(-2), (slots % bs).unsqueeze(-2)
        heads = torch.arange(kvh).view(kvh, 1)
    else:
        block, offset = (slots // bs).unsqueeze(-1), (slots % bs).unsqueeze(-1)
        heads = torch.arange(kvh)
    return (block, heads, *_token(offset, layout, part))


def _flat_index(view: torch.Tensor, index: tuple[torch.Tensor, ...], origin: int
                ) -> tuple[torch.Tensor, torch.Tensor]:
    # The positions of view[index] in its (contiguous) base flattened, whose first element
    # sits at storage offset ``origin`` (a layer's cache may be a view into one buffer that
    # holds every layer's), as (start, rest): the indexed dimensions by ``index``
    # (broadcast) give each start, the remaining ones whole the offsets ``rest`` (flat)
    # from it; the positions are start[..., None] + rest.
    strides = view.stride()
    start = sum((i * st for i, st in zip(index, strides, strict=False)),
                start=torch.tensor(int(view.storage_offset()) - origin, dtype=torch.int64))
    rest = torch.zeros((), dtype=torch.int64)
    for size, st in zip(view.shape[len(index):], strides[len(index):], strict=True):
        rest = rest.unsqueeze(-1) + torch.arange(int(size)) * st
    return start, rest.reshape(-1)


def dequantize(raw: torch.Tensor, *, fmt: CacheFormat, scales: Sequence[float],
               scratch: list[torch.Tensor] | None = None) -> torch.Tensor:
    """``[L, ...]`` stored elements to float64, exactly: the element's value, times the
    layer's float32 scale for fp8 (written into the scratch buffer when one is given; a
    one-element list holding a flat float64 buffer, grown when too small)."""
    if fmt is not CacheFormat.MODEL_DTYPE:
        raw = raw.view(_FP8_VIEW[fmt])
    if scratch is None:
        out = raw.to(torch.float64)
    else:
        if scratch[0].numel() < raw.numel():
            scratch[0] = torch.empty(raw.numel(), dtype=torch.float64)
        out = scratch[0][:raw.numel()].view(raw.shape).copy_(raw)
    if fmt is not CacheFormat.MODEL_DTYPE:
        scale = torch.tensor([float32_scale(s) for s in scales], dtype=torch.float64)
        out.mul_(scale.view(-1, *([1] * (raw.dim() - 1))))
    return out


def stored_keys(kv_caches: Sequence[torch.Tensor], slots: torch.Tensor, *, fmt: CacheFormat,
                k_scales: Sequence[float], layout: CacheLayout = CacheLayout.VEC
                ) -> torch.Tensor:
    """The keys of ``slots`` as each layer's cache holds them, dequantized exactly, float64.

    Args:
        kv_caches: per layer, the cache ``[num_blocks, kv_heads, block_size, 2 * head_dim]``.
        slots: ``[...]`` int64 engine slots (each in range).
        fmt: how the caches store an element; ``layout``: where (the writer's ISA).
        k_scales: per layer, the key scale (fp8 caches).

    Returns:
        ``[layers, ..., kv_heads, head_dim]`` float64.
    """
    raw = stored_elements(kv_caches, slots, layout=layout)
    return dequantize(raw, fmt=fmt, scales=k_scales)


def visible_keys(kv_caches: Sequence[torch.Tensor], slots: torch.Tensor, *, fmt: CacheFormat,
                 k_scales: Sequence[float], scratch: list[torch.Tensor] | None = None,
                 layout: CacheLayout = CacheLayout.VEC) -> torch.Tensor:
    """:func:`stored_keys` of every request's visible slots, head-major for the logits.

    Args:
        kv_caches, fmt, k_scales, layout: as :func:`stored_keys`.
        slots: ``[R, S]`` the visible slots (:attr:`StepLayout.slots`).
        scratch: a one-element list holding a flat float64 buffer reused from step to step
            (:func:`dequantize`).

    Returns:
        ``[layers, R, kv_heads, S, head_dim]`` float64, gathered in that order (no copy to
        transpose afterwards); a view of the scratch buffer when one is given.
    """
    raw = stored_elements(kv_caches, slots, layout=layout, heads_first=True)
    return dequantize(raw, fmt=fmt, scales=k_scales, scratch=scratch)


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
