"""Torch twin of the eviction meter of :mod:`witcert_calculus.meters.eviction`.

The formulas, their theorems and their margins are stated once, in
:mod:`witcert_calculus.meters.eviction` and :mod:`witcert_calculus.numerics.rounding`; this
module evaluates them on float64 tensors, batched over any leading axes (layers, heads) and
query rows, and returns the same types (an :class:`~witcert_calculus.meters.eviction.EvictionWitness`
holding tensors, a :class:`~witcert_calculus.meters.eviction.DroppedMassBatch` of tensors). No
host synchronisation: the results stay on the tensors' device.

Main declarations:

- :func:`evict_witness`: the witness of dropped keys and values, per block.
- :func:`dropped_mass_batch`: the meter ``p(D) <= U / (Z_K + U)``.
- :func:`stack_witnesses`: witnesses of equal shape stacked on a new leading axis (layers).
- :func:`block_log_terms`: ``log n_b + u_b`` per row and block (what the restoring gate orders).
"""

from __future__ import annotations

from fractions import Fraction

import torch

from witcert_calculus.errors import ForgedBoundError, InvalidValueError
from witcert_calculus.meters.eviction import (
    EVICTION_ESTABLISHERS,
    DroppedMassBatch,
    EvictionWitness,
    _center_bytes,  # pyright: ignore[reportPrivateUsage]
    _center_kind,  # pyright: ignore[reportPrivateUsage]
    _checks,  # pyright: ignore[reportPrivateUsage]
    _kept_values,  # pyright: ignore[reportPrivateUsage]
    _establish,  # pyright: ignore[reportPrivateUsage]
    _meter_evidence,  # pyright: ignore[reportPrivateUsage]
    is_witness,
)
from witcert_calculus.numerics.rounding import (
    dot32_margin,
    dot_margin,
    eviction_margin,
    linf_margin,
    norm_margin,
)
from witcert_calculus.meters.witness import LogitBound
from witcert_calculus.numerics.validation import positive_int, real
from witcert_kernels.meter import round_up_as, round_up_f32
from witcert_kernels.rounding import outward

__all__ = ["block_log_terms", "dropped_mass_batch", "evict_witness", "stack_witnesses"]

_F64 = torch.float64


def _norm_up(x: torch.Tensor) -> torch.Tensor:
    """``||x||_2`` over the last dimension, rounded upward (``norm_margin``)."""
    m = norm_margin(x.shape[-1])
    n = torch.sqrt((x * x).sum(dim=-1))
    return outward(n, gamma=m.gamma, alpha=m.alpha, exact=n == 0)


_FLOATS = {"float16": torch.float16, "float32": torch.float32, "float64": torch.float64}


def _stored_center(mid: torch.Tensor, kind: str) -> torch.Tensor:
    """The center as stored, as the numpy ``_stored_center`` (int8 codes and a float16 scale
    rounded upward, or a float type)."""
    if kind != "int8":
        return mid.to(_FLOATS[kind]).to(_F64)
    amax = mid.abs().amax(dim=-1, keepdim=True)
    scale = round_up_as(amax / 127.0, torch.float16).to(_F64)
    codes = torch.clamp(torch.round(mid / torch.where(scale > 0, scale, 1.0)), -127, 127)
    return codes * scale


def evict_witness(keys: torch.Tensor, values: torch.Tensor, block: torch.Tensor, *,
                  blocks: int, center: str = "int8") -> EvictionWitness[torch.Tensor]:
    """The witness of dropped tokens per block, as the numpy
    :func:`~witcert_calculus.meters.eviction.evict_witness` (same arguments, tensors).

    Raises:
        InvalidValueError: on non-finite keys or values, mismatched shapes, a block index
            outside ``[0, blocks)`` or an unknown center kind.

    Example:
        >>> w = evict_witness(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.ones(2, 1),
        ...                   torch.tensor([0, 0]), blocks=1, center="float32")
        >>> (w.count.tolist(), w.center.tolist(), round(float(w.radius[0]), 4))
        ([2.0], [[0.5, 0.5]], 0.7071)
    """
    nb = positive_int("blocks", blocks)
    kind = _center_kind(center)
    k = keys.to(_F64)
    v = values.to(_F64)
    if tuple(v.shape[:-1]) != tuple(k.shape[:-1]) or tuple(block.shape) != tuple(k.shape[:-1]):
        raise InvalidValueError("values / block", f"shapes {tuple(v.shape)} / {tuple(block.shape)}",
                                f"must match the keys' {tuple(k.shape[:-1])}")
    if not bool(torch.isfinite(k).all()) or not bool(torch.isfinite(v).all()):
        raise InvalidValueError("keys / values", "non-finite entries", "must be finite")
    if block.numel() and (int(block.min()) < 0 or int(block.max()) >= nb):
        raise InvalidValueError("block", f"range [{int(block.min())}, {int(block.max())}]",
                                f"must lie in [0, {nb})")
    idx = block.long()
    lead = tuple(k.shape[:-2])
    count = torch.zeros(*lead, nb, dtype=_F64).scatter_add_(-1, idx, torch.ones_like(k[..., 0]))
    at = idx.unsqueeze(-1).expand(k.shape)
    lo = torch.full((*lead, nb, k.shape[-1]), float("inf"), dtype=_F64).scatter_reduce_(
        -2, at, k, reduce="amin")
    hi = torch.full((*lead, nb, k.shape[-1]), float("-inf"), dtype=_F64).scatter_reduce_(
        -2, at, k, reduce="amax")
    empty = (count == 0).unsqueeze(-1)
    mid = torch.where(empty, 0.0, lo) / 2.0 + torch.where(empty, 0.0, hi) / 2.0
    c = _stored_center(mid, kind)
    diff = k - torch.gather(c, -2, at)
    m = linf_margin()
    dmax = diff.abs().amax(dim=-1)
    dinf = outward(dmax, gamma=m.gamma, alpha=m.alpha, exact=dmax == 0)

    def per_block(x: torch.Tensor) -> torch.Tensor:
        top = torch.zeros(*lead, nb, dtype=_F64).scatter_reduce_(-1, idx, x, reduce="amax")
        return round_up_f32(top).to(_F64)

    used = int((count > 0).sum())
    stored = used * (_center_bytes(kind, k.shape[-1]) + 4 + 4 + 4 + 4)
    c32 = c.to(torch.float32)
    return _establish(c, per_block(dinf), per_block(_norm_up(diff)), count,
                      per_block(_norm_up(v)), center_norm=_norm_up(c),
                      center32=c32 if bool((c32.to(_F64) == c).all()) else None,
                      stored_bytes=stored, source="witcert_kernels.eviction.evict_witness")


def stack_witnesses(witnesses: list[EvictionWitness[torch.Tensor]]
                    ) -> EvictionWitness[torch.Tensor]:
    """Established witnesses of one shape stacked on a new leading axis: each cell keeps its
    own witness, so the stack is established as its parts are.

    Raises:
        ForgedBoundError: if a part is not established.
        InvalidValueError: if there is no part or the shapes differ.
    """
    if not witnesses:
        raise InvalidValueError("witnesses", witnesses, "must hold at least one witness")
    for w in witnesses:
        if not is_witness(w):
            raise ForgedBoundError("EvictionWitness", EVICTION_ESTABLISHERS)
    shapes = {tuple(w.center.shape) for w in witnesses}
    if len(shapes) != 1:
        raise InvalidValueError("witnesses", sorted(shapes), "must all have one shape")
    c32 = [w.center32 for w in witnesses]
    return _establish(*(torch.stack([getattr(w, f) for w in witnesses])
                        for f in ("center", "linf", "radius", "count", "value_norm")),
                      center_norm=torch.stack([w.center_norm for w in witnesses]),
                      center32=None if any(c is None for c in c32) else
                      torch.stack([c for c in c32 if c is not None]),
                      stored_bytes=sum(w.stored_bytes for w in witnesses),
                      source="witcert_kernels.eviction.stack_witnesses")


def block_log_terms(q: torch.Tensor, witness: EvictionWitness[torch.Tensor], *, scale: float,
                    restored: torch.Tensor | None = None) -> torch.Tensor:
    """``log n_b + u_b`` per query row and block, ``u_b = scale (q.c_b + min(||q||_1 h_b, ||q||_2 r_b))``
    rounded upward (``-inf`` for an empty or restored block), shape ``[..., N, B]``.

    Raises:
        ForgedBoundError: on a witness no establishing function produced.
    """
    if not is_witness(witness):
        raise ForgedBoundError("EvictionWitness", EVICTION_ESTABLISHERS)
    sc = real("scale", scale, lo=0.0, lo_open=True)
    qq = q.to(_F64)
    qn = _norm_up(qq).unsqueeze(-1)                                     # [..., N, 1]
    q1 = qq.abs().sum(dim=-1, keepdim=True)
    d = q.shape[-1]
    # q.c_b: in float32 when q and every center are float32 values (one rounding error per
    # term, at most dot32_margin on ||q|| ||c_b|| >= sum |q_c c_c|), else in float64
    if witness.center32 is not None and bool(q.dtype == torch.float32):
        qc = torch.matmul(q, witness.center32.transpose(-1, -2)).to(_F64)
        md = dot32_margin(d)
    else:
        qc = torch.matmul(qq, witness.center.transpose(-1, -2))
        md = dot_margin(d)
    # Per row, bounds on the per-block rounding terms (each block's own is at most its cell's
    # largest): the dot product's error, and the size of everything summed after it, whose
    # float64 rounding (the 1-norm, two products, two sums, the scale) dot_margin(d + 4) covers.
    cn = witness.center_norm.amax(dim=-1, keepdim=True).unsqueeze(-2)      # [..., 1, 1]
    dot_err = md.gamma * qn * cn + md.alpha
    reach = q1 * witness.linf.amax(dim=-1, keepdim=True).unsqueeze(-2) + \
        qn * witness.radius.amax(dim=-1, keepdim=True).unsqueeze(-2)
    m = dot_margin(d + 4)
    slack = sc * dot_err + m.gamma * sc * (qn * cn + dot_err + reach) + m.alpha  # [..., N, 1]
    spread = torch.minimum(q1 * witness.linf.unsqueeze(-2), qn * witness.radius.unsqueeze(-2))
    u = (qc + spread).mul_(sc).add_(slack)
    up = torch.nextafter(u, torch.full((), float("inf"), dtype=_F64))
    count = witness.count if restored is None else torch.where(restored, 0.0, witness.count)
    live = (count > 0).unsqueeze(-2)
    return torch.where(live, up.add_(torch.log(count.clamp(min=1.0)).unsqueeze(-2)), float("-inf"))


def dropped_mass_batch(q: torch.Tensor, kept_logits: torch.Tensor,
                       witness: EvictionWitness[torch.Tensor], *, scale: float,
                       dropped: torch.Tensor | None = None, restored: torch.Tensor | None = None,
                       kept_bound: LogitBound[torch.Tensor] | None = None
                       ) -> DroppedMassBatch[torch.Tensor]:
    """The eviction meter on tensors, as the numpy
    :func:`~witcert_calculus.meters.eviction.dropped_mass_batch` (same arguments, tensors):
    ``q`` ``[..., N, d]``, ``kept_logits`` ``[..., N, S]`` (``-inf`` where masked), the witness
    ``[..., B, d]``, ``dropped`` ``[...]``, ``restored`` ``[..., B]`` (boolean), ``kept_bound``
    a torch :class:`~witcert_calculus.meters.witness.LogitBound` broadcast to ``kept_logits``.

    Raises:
        ForgedBoundError: on a witness no establishing function produced.
        InvalidValueError: on mismatched shapes.

    Example:
        >>> w = evict_witness(torch.tensor([[1.0, 0.0]]), torch.ones(1, 1), torch.tensor([0]),
        ...                   blocks=1, center="float32")
        >>> b = dropped_mass_batch(torch.tensor([[1.0, 0.0]]), torch.tensor([[1.0]]), w,
        ...                        scale=1.0)
        >>> round(float(b.mass[0]), 6)
        0.5
    """
    lead = tuple(q.shape[:-2])
    if tuple(kept_logits.shape[:-1]) != tuple(q.shape[:-1]):
        raise InvalidValueError("kept_logits", f"tensor of shape {tuple(kept_logits.shape)}",
                                f"must have the query rows' leading shape {tuple(q.shape[:-1])}")
    if tuple(witness.center.shape[:-2]) != lead or witness.center.shape[-1] != q.shape[-1]:
        raise InvalidValueError("witness", f"shape {tuple(witness.center.shape)}",
                                f"must be [{', '.join(map(str, lead))}, B, {q.shape[-1]}]")
    if restored is not None and (restored.dtype != torch.bool
                                 or tuple(restored.shape) != tuple(witness.count.shape)):
        raise InvalidValueError("restored", f"tensor of {restored.dtype} {tuple(restored.shape)}",
                                f"must be boolean of the witness's shape {tuple(witness.count.shape)}")
    terms = block_log_terms(q, witness, scale=scale, restored=restored)
    log_u = torch.logsumexp(terms, dim=-1)   # max-shifted; all -inf gives -inf
    s = kept_logits.to(_F64)
    c = _kept_values(kept_bound)
    if c is not None:
        lowered = torch.nextafter(s - c, torch.full((), float("-inf"), dtype=_F64))
        s = torch.where(torch.isnan(lowered), float("-inf"), lowered)
    log_z = torch.logsumexp(s, dim=-1)
    raw = torch.where(torch.isneginf(log_u), 0.0, 1.0 / (1.0 + torch.exp(log_z - log_u)))
    m = eviction_margin(s.shape[-1], witness.count.shape[-1])
    size = 1.0 + torch.where(torch.isfinite(log_u), log_u.abs(), 0.0) + \
        torch.where(torch.isfinite(log_z), log_z.abs(), 0.0)
    mass = outward(raw, gamma=m.gamma * size, alpha=m.alpha, exact=raw == 0)
    covered = witness.count.sum(dim=-1)
    if dropped is not None:
        if tuple(dropped.shape) != lead:
            raise InvalidValueError("dropped", f"tensor of shape {tuple(dropped.shape)}",
                                    f"must have one count per cell {lead}")
        mass = torch.where((dropped.to(_F64) > covered).unsqueeze(-1), float("inf"), mass)
    nothing_kept = torch.isneginf(log_z) & (torch.isfinite(log_u) | (covered > 0).unsqueeze(-1))
    # a +inf or NaN logit (read, as everything here, without a host synchronisation) fails
    # closed: the cell reports inf instead of a mass computed from it
    broken = torch.isnan(log_z) | torch.isposinf(log_z)
    mass = torch.where(nothing_kept | broken, float("inf"), mass)
    return DroppedMassBatch(mass=mass, log_u=log_u, log_z=log_z,
                            evidence=_meter_evidence(_checks(is_witness(witness)), kept_bound),
                            delta=Fraction(0) if kept_bound is None else kept_bound.delta)
