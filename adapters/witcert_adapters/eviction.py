"""Token eviction under a kvpress press, metered: what each dropped key costs attention.

:func:`meter_press` wraps any kvpress press (prefill presses and decoding presses alike) on a
Hugging Face model. It never reads the press's code: around the press's own hooks on every
attention module it registers one hook that runs before them (it keeps a reference to the
layer's keys and values as the attention left them) and one that runs after (it compares).
Every kept entry must be a bit-exact copy of an entry the cache held, keys and values both; the
rest were dropped. A press that changed the cache any other way (merging, averaging or
re-rotating entries; masking keys in place, as the head-wise presses do through
``module.masked_key_indices``) is refused with
:class:`~witcert_calculus.errors.UnattributedEvictionError` naming the press.

At each compression the dropped entries of every (layer, key head) go to an exact backing
store in host memory, in blocks of ``block_size`` tokens, and their witnesses
(:func:`witcert_kernels.eviction.evict_witness`: the box of the keys as stored, radius, count, largest
value norm) are written. Every later forward of the model runs the layers' attention through
this module's attention function (registered with transformers' ``AttentionInterface``): it
computes the attention the press left (the same eager arithmetic), and for every (layer, query
head, row) cell the eviction bound ``p(D) <= U / (Z_K + U)``
(:func:`witcert_kernels.eviction.dropped_mass_batch`), with ``Z_K`` from the logits the attention
just used. No host synchronisation on that path.

With ``audit=True`` the exact dropped keys are read back from the backing store and the true
``TV = p(D)`` of every cell is computed in float64; a cell whose truth exceeds its bound is a
violation (none is expected: the bound is a theorem).

With ``threshold=tau`` the gate restores: before the read, a layer whose bound exceeds ``tau``
in some cell gets back, from the backing store, the blocks of largest witness mass of that
cell's head (:func:`witcert_calculus.meters.eviction.restore_order`) until every cell is under
``tau`` or nothing is left to restore; restored blocks stay in the cache for the rest of the
request. The bound is then recomputed on the restored cache.

Main declarations:

- :func:`meter_press`: the context manager; yields a :class:`PressRun`.
- :func:`pressed`: the press alone (unmetered), on this transformers release.
- :func:`forced_logits`: prefill a prompt and teacher-force its continuation one decode step at a
  time, with the positions a compressed cache no longer gives.
- :class:`PressRun`: what the run observed; :meth:`PressRun.summary` gives an
  :class:`EvictionSummary`, :meth:`PressRun.reading` the worst cell as a typed reading.
"""

from __future__ import annotations

from collections.abc import Generator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Final, final

import torch
from torch.utils.hooks import RemovableHandle

from witcert_calculus.bridges import dropped_mass_tv
from witcert_calculus.contracts import Reading
from witcert_calculus.errors import InvalidValueError, UnattributedEvictionError
from witcert_calculus.meters.eviction import (
    DroppedMassBatch,
    EvictionWitness,
    _center_kind,  # pyright: ignore[reportPrivateUsage]
    restore_order,
)
from witcert_calculus.metrics import AtConsume, AttentionTV, DroppedMass
from witcert_calculus.numerics.validation import positive_int, real
from witcert_kernels.eviction import (
    block_log_terms,
    dropped_mass_batch,
    evict_witness,
    stack_witnesses,
)

__all__ = ["ATTENTION", "EvictionSummary", "PressRun", "forced_logits", "meter_press",
           "pressed", "register_attention"]

#: The name this module's attention function is registered under.
ATTENTION: Final = "witcert_eviction"

_F64 = torch.float64


def _name(press: object) -> str:
    return type(press).__name__


# --------------------------------------------------------------------------- attribution

def _fingerprint(x: torch.Tensor) -> torch.Tensor:
    """An int64 hash of each row's bits (last dimension), for matching bit-exact copies."""
    bits = x.contiguous().view(torch.int16 if x.element_size() == 2 else torch.int32).long()
    weights = torch.arange(1, bits.shape[-1] + 1, dtype=torch.long) * 0x9E3779B1 + 0x7F4A7C15
    return (bits * weights).sum(dim=-1)


def _kept_index(press: str, layer: int, before_k: torch.Tensor, before_v: torch.Tensor,
                after_k: torch.Tensor, after_v: torch.Tensor) -> torch.Tensor:
    """For each kept entry of each key head, the position it held before: ``[Hkv, S']``.

    Raises:
        UnattributedEvictionError: if a kept entry is not a bit-exact copy of one entry held
            before (keys and values), or an entry is kept twice.
    """
    if before_k.shape[0] != 1 or after_k.shape[0] != 1:
        raise InvalidValueError("batch", before_k.shape[0], "the eviction meter reads one "
                                "sequence per forward (batch size 1)")
    if after_k.shape[1] != before_k.shape[1] or after_k.shape[-1] != before_k.shape[-1] \
            or after_k.dtype != before_k.dtype or after_v.shape[2] != after_k.shape[2]:
        raise UnattributedEvictionError(press, layer, f"the cache's shape changed from "
                                        f"{tuple(before_k.shape)} to {tuple(after_k.shape)} "
                                        "other than along the token axis")
    out: list[torch.Tensor] = []
    for h in range(before_k.shape[1]):
        fb, fa = _fingerprint(before_k[0, h]), _fingerprint(after_k[0, h])
        order = torch.argsort(fb, stable=True)
        pos = torch.searchsorted(fb[order], fa).clamp(max=fb.numel() - 1)
        idx = order[pos]
        same = torch.equal(before_k[0, h, idx], after_k[0, h]) and \
            torch.equal(before_v[0, h, idx], after_v[0, h])
        ordered = torch.sort(idx).values
        if not same or bool((ordered[1:] == ordered[:-1]).any()):
            raise UnattributedEvictionError(
                press, layer, f"a kept entry of key head {h} is not a bit-exact copy of an entry "
                "the cache held (merged, averaged or re-rotated keys or values); no eviction "
                "contract covers it")
        out.append(idx)
    return torch.stack(out)


def _blocks(n: int, hkv: int, block_size: int) -> torch.Tensor:
    """Block index of each of the ``n`` dropped tokens of each head, in the cache's order."""
    return torch.div(torch.arange(n), block_size, rounding_mode="floor").expand(hkv, n)


# --------------------------------------------------------------------------- per layer

@dataclass
class _Layer:
    # The evicted entries of one layer (the backing store) and their witnesses.
    keys: torch.Tensor          # [Hkv, n, d] as the cache held them
    values: torch.Tensor        # [Hkv, n, dv]
    block: torch.Tensor         # [Hkv, n]
    witness: EvictionWitness[torch.Tensor]
    restored: torch.Tensor      # [Hkv, B] bool

    @property
    def blocks(self) -> int:
        return int(self.restored.shape[1])

    def restored_entries(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Restored keys and values padded to one length per head, and the padding mask."""
        back = self.restored.gather(1, self.block)                        # [Hkv, n]
        counts = back.sum(dim=1)
        r = int(counts.max()) if back.numel() else 0
        hkv, _, d = self.keys.shape
        k = self.keys.new_zeros(hkv, r, d)
        v = self.values.new_zeros(hkv, r, self.values.shape[-1])
        pad = torch.ones(hkv, r, dtype=torch.bool)
        for h in range(hkv):
            m = int(counts[h])
            k[h, :m], v[h, :m] = self.keys[h, back[h]], self.values[h, back[h]]
            pad[h, :m] = False
        return k, v, pad


@final
@dataclass(frozen=True, slots=True)
class EvictionSummary:
    """What a metered run observed over all its cells after the first compression.

    Attributes:
        cells: (layer, query head, row) cells metered.
        threshold: the coverage target ``tau``.
        coverage: share of cells whose bound is at most ``tau``.
        max_bound: the largest bound (``inf``: a cell failed closed).
        max_true_tv: the largest audited true TV (``None`` without audit).
        violations: audited cells whose true TV exceeds the bound (``None`` without audit).
        evicted_tokens: (layer, key head) entries dropped by the press.
        witness_bytes: bytes of the stored witnesses.
        restored_tokens: entries the gate restored; ``restored_bytes`` their keys and values.
    """

    cells: int
    threshold: float
    coverage: float
    max_bound: float
    max_true_tv: float | None
    violations: int | None
    evicted_tokens: int
    witness_bytes: int
    restored_tokens: int
    restored_bytes: int

    @property
    def witness_bytes_per_token(self) -> float:
        """Witness bytes per evicted (layer, key head) entry."""
        return self.witness_bytes / self.evicted_tokens if self.evicted_tokens else 0.0

    @property
    def restored_fraction(self) -> float:
        """Restored entries over evicted entries."""
        return self.restored_tokens / self.evicted_tokens if self.evicted_tokens else 0.0


@final
@dataclass(eq=False)
class PressRun:
    """One request's run under a metered press (built by :func:`meter_press`).

    Attributes:
        press: the press's class name.
        threshold: the gate's ``tau`` (``None``: no gate) .
        audit: whether the true TV was computed.
    """

    press: str
    block_size: int
    center: str
    threshold: float | None
    audit: bool
    layers: dict[int, _Layer] = field(default_factory=dict[int, _Layer])
    bounds: list[torch.Tensor] = field(default_factory=list[torch.Tensor])
    truths: list[torch.Tensor] = field(default_factory=list[torch.Tensor])
    evidence: list[DroppedMassBatch[torch.Tensor]] = field(
        default_factory=list[DroppedMassBatch[torch.Tensor]])
    evicted: int = 0
    _stash: list[tuple[int, torch.Tensor, torch.Tensor, float]] = field(
        default_factory=list[tuple[int, torch.Tensor, torch.Tensor, float]])
    _stacked: dict[tuple[int, ...], EvictionWitness[torch.Tensor]] = field(
        default_factory=dict[tuple[int, ...], EvictionWitness[torch.Tensor]])
    witness_bytes: int = 0
    restored_tokens: int = 0
    restored_bytes: int = 0

    # -- compression -------------------------------------------------------------------

    def evict(self, layer: int, keys: torch.Tensor, values: torch.Tensor,
              kept: torch.Tensor) -> None:
        """Record the entries of ``keys``/``values`` (``[Hkv, S, d]``) not in ``kept``."""
        hkv, s = keys.shape[0], keys.shape[1]
        drop = torch.ones(hkv, s, dtype=torch.bool)
        drop.scatter_(1, kept, False)
        n = s - kept.shape[1]
        if n == 0:
            return
        dk = keys[drop].view(hkv, n, -1)
        dv = values[drop].view(hkv, n, -1)
        block = _blocks(n, hkv, self.block_size)
        old = self.layers.get(layer)
        if old is not None:  # a later compression (a decoding press): new blocks after the old
            block = torch.cat([old.block, block + old.blocks], dim=1)
            dk, dv = torch.cat([old.keys, dk], dim=1), torch.cat([old.values, dv], dim=1)
        blocks = int(block.max()) + 1
        w = evict_witness(dk, dv, block, blocks=blocks, center=self.center)
        restored = torch.zeros(hkv, blocks, dtype=torch.bool)
        if old is not None:
            restored[:, :old.blocks] = old.restored
            self.witness_bytes -= old.witness.stored_bytes
        self.layers[layer] = _Layer(dk.detach(), dv.detach(), block, w, restored)
        self._stacked.clear()
        self.evicted += hkv * (s - kept.shape[1])
        self.witness_bytes += w.stored_bytes

    # -- reading ---------------------------------------------------------------------

    def attend(self, module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               mask: torch.Tensor | None, scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's attention over what the cache holds (plus restored blocks), metered."""
        st = self.layers.get(int(module.layer_idx))
        if st is None:
            return _eager(query, key, value, mask, scaling)
        if self.threshold is None and not self.audit and not bool(st.restored.any()):
            # metered at the end of the model's forward, every layer of one shape at once
            out, weights, scores = _attention(query, key, value, mask, scaling)
            self._stash.append((int(module.layer_idx), query, scores, scaling))
            return out, weights
        _, h, n, d = query.shape
        hkv = key.shape[1]
        g = h // hkv
        q = query.reshape(hkv, g * n, d).to(_F64)  # batch 1: [Hkv, g N, d]
        while True:
            k, v, full_mask = _extended(st, key, value, mask, h)
            out, weights, scores = _attention(query, k, v, full_mask, scaling)
            logits = scores.reshape(hkv, g * n, -1).to(_F64)
            batch = dropped_mass_batch(q, logits, st.witness, scale=scaling, restored=st.restored)
            if self.threshold is None or not self._restore(st, q, batch, scaling):
                break
        self.bounds.append(batch.mass.reshape(hkv * g, n))
        self.evidence.append(batch)
        if self.audit:
            self.truths.append(_true_tv(st, q, batch.log_z, scaling).reshape(hkv * g, n))
        return out, weights

    def flush(self) -> None:
        """Meter the stashed layers of the forward that just ended, one batch per shape."""
        stash, self._stash = self._stash, []
        groups: dict[tuple[object, ...], list[tuple[int, torch.Tensor, torch.Tensor, float]]] = {}
        for item in stash:
            layer, query, scores, scaling = item
            key = (tuple(query.shape), tuple(scores.shape),
                   tuple(self.layers[layer].witness.center.shape), scaling)
            groups.setdefault(key, []).append(item)
        for items in groups.values():
            layers = tuple(i[0] for i in items)
            _, h, n, d = items[0][1].shape
            hkv = self.layers[layers[0]].keys.shape[0]
            q = torch.stack([i[1].reshape(hkv, h // hkv * n, d) for i in items]).to(_F64)
            logits = torch.stack([i[2].reshape(hkv, h // hkv * n, -1) for i in items]).to(_F64)
            witness = self._stacked.get(layers)
            if witness is None:
                witness = stack_witnesses([self.layers[i].witness for i in layers])
                self._stacked[layers] = witness
            batch = dropped_mass_batch(q, logits, witness, scale=items[0][3])
            self.bounds.append(batch.mass.reshape(len(layers) * h, n))
            self.evidence.append(batch)

    def _restore(self, st: _Layer, q: torch.Tensor, batch: DroppedMassBatch[torch.Tensor],
                 scaling: float) -> bool:
        """Restore the blocks that bring each head's worst cell under the threshold; whether
        any block was restored (then the layer's attention is recomputed)."""
        tau = self.threshold
        assert tau is not None
        worst, row = batch.mass.max(dim=1)
        over = [int(i) for i in torch.nonzero(worst > tau).flatten()]
        if not over:
            return False
        terms = block_log_terms(q, st.witness, scale=scaling, restored=st.restored)
        changed = False
        for h in over:
            r = int(row[h])
            plan = restore_order(terms[h, r].numpy(), float(batch.log_z[h, r]), threshold=tau)
            order = list(plan.order) or \
                [int(i) for i in (~st.restored[h] & (st.witness.count[h] > 0)).nonzero().flatten()]
            for blk in order:
                if not bool(st.restored[h, blk]):
                    st.restored[h, blk] = True
                    tokens = int((st.block[h] == blk).sum())
                    self.restored_tokens += tokens
                    self.restored_bytes += tokens * (st.keys.shape[-1] + st.values.shape[-1]) * \
                        st.keys.element_size()
                    changed = True
        return changed

    # -- results ---------------------------------------------------------------------

    def summary(self, *, threshold: float) -> EvictionSummary:
        """Coverage at ``threshold``, the largest bound and true TV, violations, bytes."""
        tau = real("threshold", threshold, lo=0.0, hi=1.0)
        bounds = torch.cat([x.flatten() for x in self.bounds]) if self.bounds else \
            torch.zeros(0, dtype=_F64)
        truths = torch.cat([x.flatten() for x in self.truths]) if self.truths else None
        cells = int(bounds.numel())
        return EvictionSummary(
            cells=cells, threshold=tau,
            coverage=float((bounds <= tau).double().mean()) if cells else 0.0,
            max_bound=float(bounds.max()) if cells else 0.0,
            max_true_tv=None if truths is None else float(truths.max()),
            violations=None if truths is None else int((truths > bounds).sum()),
            evicted_tokens=self.evicted, witness_bytes=self.witness_bytes,
            restored_tokens=self.restored_tokens, restored_bytes=self.restored_bytes)

    def reading(self) -> Reading[DroppedMass[AtConsume]]:
        """The worst metered cell as a ``DroppedMass[AtConsume]`` reading (CERTIFIED below 1).

        Raises:
            InvalidValueError: if no cell was metered (no evidence, no certificate).
        """
        if not self.evidence:
            raise InvalidValueError("run", self.press, "metered no cell after a compression: "
                                    "there is nothing to certify")
        worst = max(range(len(self.bounds)), key=lambda i: float(self.bounds[i].max()))
        return self.evidence[worst].reading(float(self.bounds[worst].max()))

    def tv_reading(self) -> Reading[AttentionTV[AtConsume]]:
        """:meth:`reading` bridged to ``AttentionTV[AtConsume]`` (``TV(p, p_K) = p(D)``)."""
        return dropped_mass_tv(AtConsume).bound(self.reading())


def _eager(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
           mask: torch.Tensor | None, scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    out, weights, _ = _attention(query, key, value, mask, scaling)
    return out, weights


def _attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               mask: torch.Tensor | None, scaling: float
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """transformers' eager attention, also returning the logits it used: the same products,
    mask, float32 softmax and weighted sum, with each key head's query heads taken as one
    group of rows (no copy of the keys and values per query head)."""
    b, h, n, d = query.shape
    hkv = key.shape[1]
    g = h // hkv
    scores = torch.matmul(query.reshape(b, hkv, g * n, d), key.transpose(2, 3)) * scaling
    scores = scores.reshape(b, h, n, -1)
    if mask is not None:
        scores = scores + _fit(mask, key.shape[2])
    weights = torch.nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    out = torch.matmul(weights.reshape(b, hkv, g * n, -1), value).reshape(b, h, n, -1)
    return out.transpose(1, 2).contiguous(), weights, scores


def _fit(mask: torch.Tensor, keys: int) -> torch.Tensor:
    """A mask sized for another layer's cache length (layers compressed to different lengths
    share the mask built for layer 0) cut or padded on the left to ``keys`` columns: the
    newest columns carry the causal structure, older ones are all visible."""
    s = mask.shape[-1]
    if s == keys:
        return mask
    if s > keys:
        return mask[..., s - keys:]
    return torch.nn.functional.pad(mask, (keys - s, 0))


def _extended(st: _Layer, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
              heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The cache's keys and values with the restored blocks appended, and the mask for them:
    ``[1, heads, N, S + r]`` (the restored count differs per key head, so the padding does)."""
    if not bool(st.restored.any()):
        return key, value, mask
    rk, rv, pad = st.restored_entries()
    k = torch.cat([key, rk.unsqueeze(0).to(key.dtype)], dim=2)
    v = torch.cat([value, rv.unsqueeze(0).to(value.dtype)], dim=2)
    g = heads // key.shape[1]
    n = 1 if mask is None else mask.shape[2]
    base = torch.zeros(1, 1, n, key.shape[2], dtype=key.dtype) if mask is None else \
        _fit(mask, key.shape[2])
    extra = torch.where(pad, torch.finfo(key.dtype).min, 0.0).to(key.dtype)   # [Hkv, r]
    extra = extra.repeat_interleave(g, dim=0)[None, :, None, :].expand(1, heads, n, -1)
    return k, v, torch.cat([base.expand(1, heads, n, base.shape[3]), extra], dim=3)


def _true_tv(st: _Layer, q: torch.Tensor, log_z: torch.Tensor, scaling: float) -> torch.Tensor:
    """The audited ``TV = p(D)`` per cell from the exact dropped keys (not restored), float64."""
    logits = scaling * torch.matmul(q, st.keys.to(_F64).transpose(1, 2))   # [Hkv, gN, n]
    back = st.restored.gather(1, st.block).unsqueeze(1)
    logits = torch.where(back, float("-inf"), logits)
    m = logits.amax(dim=-1)
    fm = torch.where(torch.isfinite(m), m, 0.0)
    log_d = fm + torch.log(torch.exp(logits - fm.unsqueeze(-1)).sum(dim=-1))
    log_d = torch.where(torch.isinf(m), m, log_d)
    return torch.where(torch.isneginf(log_d), 0.0, 1.0 / (1.0 + torch.exp(log_z - log_d)))


# --------------------------------------------------------------------------- attachment

def _cache(kwargs: dict[str, Any]) -> Any:
    # transformers 5.24 passes the cache to attention modules as ``cache=``; earlier releases
    # (and kvpress 0.5.5's hooks) as ``past_key_values=``
    return kwargs["cache"] if kwargs.get("cache") is not None else kwargs.get("past_key_values")


def _bridged(hook: Any) -> Any:
    """kvpress 0.5.5's forward hook called with the keyword arguments it reads: transformers 5.24
    passes the cache as ``cache=`` and no ``cache_position`` (the position ids are the cache
    positions of an unpadded sequence)."""
    def forward_hook(module: Any, args: Any, kwargs: dict[str, Any], output: Any) -> Any:
        kw = dict(kwargs)
        kw.setdefault("past_key_values", _cache(kwargs))
        if kw.get("cache_position") is None:
            pid = kw.get("position_ids")
            if pid is None:
                raise InvalidValueError("position_ids", None, "pass position_ids to the model "
                                        "under a press (the cache's length no longer gives "
                                        "the next position once it was compressed)")
            kw["cache_position"] = pid[0]
        return hook(module, args, kw, output)
    return forward_hook

def _attention_function(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        attention_mask: torch.Tensor | None, scaling: float, dropout: float = 0.0,
                        **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention function registered as :data:`ATTENTION` (eager arithmetic, metered)."""
    run: PressRun | None = getattr(module, "_witcert_press_run", None)
    if run is None:
        return _eager(query, key, value, attention_mask, scaling)
    return run.attend(module, query, key, value, attention_mask, scaling)


def register_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(ATTENTION, _attention_function)  # pyright: ignore[reportUnknownMemberType]
    AttentionMaskInterface.register(  # pyright: ignore[reportUnknownMemberType]
        ATTENTION, ALL_MASK_ATTENTION_FUNCTIONS["eager"])  # pyright: ignore[reportUnknownArgumentType]


def _attention_modules(model: Any) -> list[Any]:
    inner = model.model.language_model if hasattr(model.model, "language_model") else model.model
    return [layer.self_attn for layer in inner.layers]


@contextmanager
def meter_press(model: Any, press: Any, *, block_size: int = 1, center: str = "int8",
                threshold: float | None = None, audit: bool = False
                ) -> Generator[PressRun, None, None]:
    """Run ``model`` under ``press`` with every eviction metered (see the module docstring).

    Use one context per request (one sequence): prefill and decode inside it, with a fresh
    ``DynamicCache``.

    Args:
        model: a Hugging Face causal LM with ``model.model.layers[i].self_attn``.
        press: any kvpress press (a context manager over the model).
        block_size: dropped tokens per witness block, >= 1 (1: a witness per token; larger
            blocks store fewer bytes and bound less tightly, see ``docs/guides/eviction.md``).
        center: how each block's center is stored (``"int8"``, ``"float16"``, ...).
        threshold: the restoring gate's ``tau`` in ``(0, 1)``; ``None``: no gate.
        audit: compute the true TV of every cell from the exact dropped keys.

    Yields:
        The :class:`PressRun` being recorded.

    Raises:
        UnattributedEvictionError: when the press changes the cache other than by dropping
            entries.
        InvalidValueError: on a bad block size, center kind or threshold, or a batch above 1.

    Example:
        >>> # with meter_press(model, SnapKVPress(compression_ratio=0.5), audit=True) as run:
        >>> #     model(ids, past_key_values=DynamicCache(config=model.config))
        >>> # run.summary(threshold=0.1).violations
    """
    bs = positive_int("block_size", block_size)
    tau = None if threshold is None else real("threshold", threshold, lo=0.0, hi=1.0,
                                               lo_open=True, hi_open=True)
    register_attention()
    run = PressRun(_name(press), bs, _center_kind(center), tau, audit)
    modules = _attention_modules(model)
    held: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    handles: list[RemovableHandle] = []

    def before(module: Any, args: Any, kwargs: dict[str, Any], output: Any) -> None:
        layer = cache_layer(module, kwargs)
        if layer is not None:
            held[int(module.layer_idx)] = (layer.keys, layer.values)

    def after(module: Any, args: Any, kwargs: dict[str, Any], output: Any) -> None:
        i = int(module.layer_idx)
        if getattr(module, "masked_key_indices", None) is not None:
            raise UnattributedEvictionError(run.press, i, "keys are masked in place "
                                            "(module.masked_key_indices), not dropped; use a "
                                            "press that removes entries")
        layer = cache_layer(module, kwargs)
        if layer is None or i not in held:
            return
        bk, bv = held.pop(i)
        if layer.keys is bk and layer.values is bv:
            return
        kept = _kept_index(run.press, i, bk, bv, layer.keys, layer.values)
        run.evict(i, bk[0], bv[0], kept)

    previous = model.config._attn_implementation
    try:
        for m in modules:
            m._witcert_press_run = run
            handles.append(m.register_forward_hook(before, with_kwargs=True))
        model.config._attn_implementation = ATTENTION
        def flush(*_: object) -> None:
            run.flush()

        handles.append(model.register_forward_hook(flush))
        with pressed(model, press):
            for m in modules:
                handles.append(m.register_forward_hook(after, with_kwargs=True))
            yield run
        run.flush()
    finally:
        for handle in handles:
            handle.remove()
        for m in modules:
            m._witcert_press_run = None
        model.config._attn_implementation = previous


@contextmanager
def pressed(model: Any, press: Any) -> Generator[None, None, None]:
    """``press`` applied to ``model`` alone, unmetered: kvpress 0.5.5's hooks called with the
    keyword arguments they read (:func:`_bridged`). The baseline the eviction benchmark
    compares the metered press with; :func:`meter_press` applies the press through it.

    Example:
        >>> # with pressed(model, KnormPress(compression_ratio=0.5)):
        >>> #     forced_logits(model, ids, prompt_len)
    """
    own_hook = "forward_hook" in vars(press)
    original = press.forward_hook
    press.forward_hook = _bridged(original)
    try:
        with press(model):
            yield
    finally:
        if own_hook:
            press.forward_hook = original
        else:
            del press.forward_hook


def cache_layer(module: Any, kwargs: dict[str, Any]) -> Any:
    """The cache layer an attention module's forward wrote to (``None`` without a cache)."""
    cache = _cache(kwargs)
    if cache is None or int(module.layer_idx) >= len(cache.layers):
        return None
    return cache.layers[int(module.layer_idx)]


def forced_logits(model: Any, ids: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """Prefill ``ids[:, :prompt_len]``, then one decode step per further token but the last;
    the logits predicting each token after the prompt, ``[n, V]``.

    Every forward passes its ``position_ids``: once a press has compressed the cache, its
    length no longer gives the next position (RoPE would rotate the new keys wrongly).

    Raises:
        InvalidValueError: if the prompt is empty or leaves no token to predict.
    """
    n = int(ids.shape[1])
    plen = positive_int("prompt_len", prompt_len)
    if plen >= n:
        raise InvalidValueError("prompt_len", prompt_len, f"must leave a token to predict "
                                f"(the sequence holds {n})")
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        rows = [model(ids[:, :plen], cache=cache, use_cache=True,
                      position_ids=torch.arange(plen).unsqueeze(0)).logits[0, -1]]
        rows += [model(ids[:, t:t + 1], cache=cache, use_cache=True,
                       position_ids=torch.tensor([[t]])).logits[0, -1] for t in range(plen, n - 1)]
    return torch.stack(rows)
