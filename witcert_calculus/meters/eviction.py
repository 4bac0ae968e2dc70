"""Token eviction: a sound bound on the attention mass of evicted keys, from witnesses stored
at eviction time.

Setting: one layer, key head and query row. The cache keeps the tokens ``K`` and drops the
tokens ``D``; ``p`` is the softmax attention over every token with exact logits
``s_t = scale q.k_t``, ``p_K`` the attention the cache serves, over the kept tokens alone.
Then ``TV(p, p_K) = p(D) = Z_D / (Z_K + Z_D)`` exactly, ``Z = sum exp(s_t)`` over each part
(Lean ``WitCert.Eviction.tv_softmax_kept_eq``). ``Z_K`` is computed by the attention that runs
anyway; the dropped keys are gone, so ``Z_D`` is bounded from a witness stored when they were
evicted: per evicted block ``b`` of ``n_b`` tokens, a center ``c_b`` as stored (the middle of the
keys' box, in int8 with a float16 scale or in a float type), the largest coordinate distance
``h_b >= max_t ||k_t - c_b||_inf`` and the radius ``r_b >= max_t ||k_t - c_b||_2``, so that for
every query ``s_t <= u_b = scale (q.c_b + min(||q||_1 h_b, ||q||_2 r_b))`` (Holder and
Cauchy-Schwarz, both sound), and ``p(D) <= U / (Z_K + U)`` with ``U = sum_b n_b exp(u_b)`` (Lean
``WitCert.Semantic.evict_tv_blocks_meter_sound``). The witness also keeps ``max ||v_t||`` of
the block, for the output bound ``||o - o_K|| <= p(D) (max_D ||v|| + ||o_K||)`` (Lean
``WitCert.Eviction.output_evict_error_le``).

The bound is evaluated in the log domain, ``U / (Z_K + U) = 1 / (1 + exp(log Z_K - log U))``,
and rounded outward by the rule of :mod:`witcert_calculus.numerics.rounding`
(:func:`~witcert_calculus.numerics.rounding.eviction_margin`). Failing closed: a cell whose
cache dropped more tokens than its witness covers, or that kept no token, reports ``inf``
(saturated), never a small mass.

The gate that restores: an exact backing store keeps the evicted entries; when a cell's bound
exceeds a target, :func:`restore_order` names the blocks with the largest witness mass
``n_b exp(u_b)``; restoring them lowers ``U`` and raises ``Z_K``, so the bound never grows
(Lean ``WitCert.Eviction.restore_block_bound_le``), and it is recomputed on the restored cache.

A cache that also quantizes the kept keys serves ``q_K``, the softmax of perturbed logits over
the kept tokens: ``TV(p, q_K) <= p(D) + TV(p_K, q_K)`` (Lean
``WitCert.Eviction.evict_quant_tv_le``); :func:`combined_tv` adds the two readings, the second
from the Tier-A/Tier-B meters over the kept tokens.

The torch version (``witcert_kernels.eviction``) evaluates the same formulas on batched
tensors with the same margins.

Main declarations:

- :class:`EvictionWitness`, :func:`evict_witness`: what is stored per evicted block.
- :class:`DroppedMassBatch`, :func:`dropped_mass_batch`: the meter, batched over any leading
  axes (layers, heads) and query rows.
- :func:`eviction_output_bound`: the attention output's error.
- :class:`RestorePlan`, :func:`restore_order`: which evicted blocks to restore.
- :func:`combined_tv`: eviction plus quantization of the kept keys, one TV reading.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Final, Generic, NoReturn, TypeVar, cast, final

import numpy as np
from numpy.typing import ArrayLike

from witcert_calculus.contracts import Reading, _reading  # pyright: ignore[reportPrivateUsage]
from witcert_calculus.errors import ForgedBoundError, InvalidValueError, MetricMismatchError
from witcert_calculus.lean.theorems import (
    DIV_ADD_LE_DIV_ADD,
    EVICT_QUANT_METER_SOUND,
    EVICT_TV_BLOCKS_METER_SOUND,
)
from witcert_calculus.meters.tv_forms import _lse  # pyright: ignore[reportPrivateUsage]
from witcert_calculus.meters.witness import (
    ESTABLISHERS,
    LogitBound,
    _upward_as,  # pyright: ignore[reportPrivateUsage]
    is_established,
)
from witcert_calculus.metrics import AtConsume, AttentionTV, DroppedMass, metric_name, same_metric
from witcert_calculus.numerics.rounding import (
    add_up,
    dot_margin,
    eviction_margin,
    linf_margin,
    norm_margin,
    outward,
    sum_margin,
)
from witcert_calculus.numerics.validation import (
    F64,
    as_float_array,
    finite_array,
    int_array,
    nonneg_array,
    positive_int,
    real,
)
from witcert_calculus.tiers import (
    Composition,
    Evidence,
    _premise,  # pyright: ignore[reportPrivateUsage]
    _proof,  # pyright: ignore[reportPrivateUsage]
)

__all__ = [
    "EVICTION_ESTABLISHERS",
    "DroppedMassBatch",
    "EvictionWitness",
    "RestorePlan",
    "combined_tv",
    "dropped_mass_batch",
    "evict_witness",
    "eviction_output_bound",
    "restore_order",
]

ArrayT = TypeVar("ArrayT")

#: The functions that establish an :class:`EvictionWitness` (the only ones that produce one).
EVICTION_ESTABLISHERS: Final = ("witcert_calculus.meters.eviction.evict_witness",
                                "witcert_kernels.eviction.evict_witness",
                                "witcert_kernels.eviction.stack_witnesses")

# The construction token: only the establishing functions (through _establish) hold it.
_SEAL: Final = object()

#: The premise every eviction reading rests on, computed as the witness's provenance.
WITNESS_PREMISE: Final = ("s_t <= u_b = scale (q.c_b + ||q|| r_b) for every dropped token t of "
                          "block b: by construction, an EvictionWitness whose radius r_b bounds "
                          "||k_t - c_b|| over the block's dropped keys, rounded upward")


@final
class EvictionWitness(Generic[ArrayT]):
    """Per evicted block: a center as stored, the keys' largest coordinate distance and radius
    about it, the token count and the largest value norm.

    Built only by the establishing functions (:data:`EVICTION_ESTABLISHERS`) from the dropped
    keys and values themselves; calling the class raises
    :class:`~witcert_calculus.errors.ForgedBoundError`. Frozen, not pickled (it is established
    in this process).

    Attributes:
        center: ``c_b`` as stored, shape ``[..., B, d]`` (float64 holding the stored values).
        linf: ``h_b >= max_t ||k_t - c_b||_inf`` over the block's tokens, rounded upward, ``[..., B]``.
        radius: ``r_b >= max_t ||k_t - c_b||_2`` over the block's tokens, rounded upward, ``[..., B]``.
        count: ``n_b``, the block's number of dropped tokens (0: an empty slot), ``[..., B]``.
        value_norm: ``>= max_t ||v_t||`` over the block's tokens, rounded upward, ``[..., B]``.
        center_norm: ``>= ||c_b||_2``, rounded upward, ``[..., B]`` (derived, not stored: the
            scale of a dot product's rounding error).
        center32: the centers as float32 when every one is exactly a float32 (int8 and float16
            centers always are), else ``None``: the torch meter then takes ``q.c_b`` in float32
            with its margin (derived, not stored).
        stored_bytes: bytes the witness occupies as stored (non-empty blocks only): the center
            in its storage type (int8 codes and a float16 scale, or floats), then ``h_b``,
            ``r_b``, the value norm and the count in 4 bytes each.
        source: the establishing function.
    """

    __slots__ = ("_seal", "center", "center32", "center_norm", "count", "linf", "radius",
                 "source", "stored_bytes", "value_norm")

    center: ArrayT
    linf: ArrayT
    radius: ArrayT
    count: ArrayT
    value_norm: ArrayT
    center_norm: ArrayT
    center32: Any  # ArrayT's float32 kind (an array or a tensor), or None
    stored_bytes: int
    source: str
    _seal: object

    def __init__(self, center: ArrayT, linf: ArrayT, radius: ArrayT, count: ArrayT,
                 value_norm: ArrayT, *, center_norm: ArrayT, center32: Any,
                 stored_bytes: int, source: str, seal: object = None) -> None:
        if seal is not _SEAL:
            raise ForgedBoundError("EvictionWitness", EVICTION_ESTABLISHERS)
        for key, value in (("center", center), ("linf", linf), ("radius", radius),
                           ("count", count), ("value_norm", value_norm),
                           ("center_norm", center_norm), ("center32", center32),
                           ("stored_bytes", stored_bytes), ("source", source), ("_seal", seal)):
            object.__setattr__(self, key, value)

    def __setattr__(self, key: str, value: object) -> NoReturn:
        raise AttributeError(f"EvictionWitness is frozen; cannot set {key!r}")

    def __delattr__(self, key: str) -> NoReturn:
        raise AttributeError(f"EvictionWitness is frozen; cannot delete {key!r}")

    def __reduce__(self) -> NoReturn:
        raise TypeError("an EvictionWitness is established in this process and is not pickled")

    def __copy__(self) -> EvictionWitness[ArrayT]:
        return self

    def __deepcopy__(self, memo: dict[int, object]) -> EvictionWitness[ArrayT]:
        return self

    def __repr__(self) -> str:
        shape = tuple(getattr(self.center, "shape", ()))
        return f"EvictionWitness(shape={shape}, bytes={self.stored_bytes}, source={self.source!r})"


def _establish(center: ArrayT, linf: ArrayT, radius: ArrayT, count: ArrayT, value_norm: ArrayT,
               *, center_norm: ArrayT, center32: Any, stored_bytes: int, source: str
               ) -> EvictionWitness[ArrayT]:
    """Issue a witness computed by an establishing function (this module's or the torch one's)."""
    return EvictionWitness(center, linf, radius, count, value_norm, center_norm=center_norm,
                           center32=center32, stored_bytes=stored_bytes, source=source,
                           seal=_SEAL)


def is_witness(w: object) -> bool:
    """Whether ``w`` is an :class:`EvictionWitness` produced by an establishing function."""
    return isinstance(w, EvictionWitness) and \
        object.__getattribute__(cast(object, w), "_seal") is _SEAL


def _up(x: F64, kind: type[np.float16] | type[np.float32]) -> F64:
    """``x`` stored in float16 or float32, rounded toward ``+inf``, read back as float64."""
    out: F64 = _upward_as(x, kind).astype(np.float64)
    return out


def _norm_up(x: F64) -> F64:
    """``||x||_2`` over the last axis, rounded upward (:func:`norm_margin`)."""
    m = norm_margin(x.shape[-1])
    n: F64 = np.sqrt((x * x).sum(axis=-1))
    return outward(n, gamma=m.gamma, alpha=m.alpha, exact=n == 0)


#: How a witness center can be stored: int8 codes with one float16 scale per block, or floats.
CENTER_KINDS: Final = ("int8", "float16", "float32", "float64")


def _center_kind(value: object) -> str:
    if isinstance(value, str) and value in CENTER_KINDS:
        return value
    raise InvalidValueError("center", value, f"must be one of {', '.join(CENTER_KINDS)}")


def _center_bytes(kind: str, d: int) -> int:
    """Bytes of one stored center: int8 codes and a float16 scale, or ``d`` floats."""
    return d + 2 if kind == "int8" else d * np.dtype(kind).itemsize


def _stored_center(mid: F64, kind: str) -> F64:
    """``mid`` as stored (float64 holding the stored values). int8: codes ``round(mid / s)``
    with the block's scale ``s = max |mid| / 127`` stored in float16 (rounded upward, so that no
    code leaves ``[-127, 127]``), the center ``codes * s`` exactly as the reader rebuilds it."""
    if kind != "int8":
        out: F64 = mid.astype(kind).astype(np.float64)
        return out
    amax = np.abs(mid).max(axis=-1, keepdims=True, initial=0.0)
    scale = _up(amax / 127.0, np.float16)
    safe = np.where(scale > 0, scale, 1.0)
    codes = np.clip(np.rint(mid / safe), -127, 127)
    center: F64 = codes * scale
    return center


def evict_witness(keys: ArrayLike, values: ArrayLike, block: ArrayLike, *, blocks: int,
                  center: str = "int8") -> EvictionWitness[F64]:
    """The witness of evicted tokens, grouped into blocks, written when they are dropped.

    Args:
        keys: the dropped keys as the cache held them, shape ``[..., n, d]`` (post-RoPE).
        values: their values, shape ``[..., n, dv]``.
        block: each dropped token's block, integers in ``[0, blocks)``, shape ``[..., n]``.
        blocks: ``B``, the number of block slots per cell (a slot may stay empty).
        center: how each block's center (the middle of its keys' box) is stored: ``"int8"``
            (codes and a float16 scale per block), ``"float16"``, ``"float32"`` or ``"float64"``.
            The distances are measured from the stored center, so any choice is sound; they
            and the value norm are stored as float32, rounded upward.

    Returns:
        An :class:`EvictionWitness` of shape ``[..., B, d]``.

    Raises:
        InvalidValueError: on non-finite keys or values, mismatched shapes, a block index
            outside ``[0, blocks)`` or an unknown center kind.

    Example:
        >>> w = evict_witness(np.array([[1.0, 0.0], [0.0, 1.0]]), np.ones((2, 1)),
        ...                   np.array([0, 0]), blocks=1, center="float32")
        >>> (w.count.tolist(), w.center.tolist(), round(float(w.linf[0]), 4),
        ...  round(float(w.radius[0]), 4))
        ([2.0], [[0.5, 0.5]], 0.5, 0.7071)
    """
    k = finite_array("keys", keys, ndim=(2, 3, 4, 5))
    v = finite_array("values", values, ndim=(2, 3, 4, 5))
    b = int_array("block", block)
    nb = positive_int("blocks", blocks)
    kind = _center_kind(center)
    if v.shape[:-1] != k.shape[:-1] or b.shape != k.shape[:-1]:
        raise InvalidValueError("values / block", f"shapes {v.shape} / {b.shape}",
                                f"must match the keys' {k.shape[:-1]} (one per dropped token)")
    bad = (b < 0) | (b >= nb)
    if bad.any():
        idx = np.argwhere(bad)[0].tolist()
        raise InvalidValueError(f"block{idx}", int(b[tuple(idx)]), f"must lie in [0, {nb})")
    onehot = b[..., None] == np.arange(nb)                                # [..., n, B]
    count: F64 = onehot.sum(axis=-2).astype(np.float64)                  # [..., B]
    member, kk = onehot[..., None], k[..., :, None, :]
    lo = np.where(member, kk, np.inf).min(axis=-3, initial=np.inf)
    hi = np.where(member, kk, -np.inf).max(axis=-3, initial=-np.inf)
    empty = (count == 0)[..., None]
    mid = np.where(empty, 0.0, np.where(empty, 0.0, lo) / 2.0 + np.where(empty, 0.0, hi) / 2.0)
    c = _stored_center(mid, kind)
    diff = k - np.take_along_axis(c, np.broadcast_to(b[..., None], k.shape), axis=-2)
    m = linf_margin()
    dmax = np.abs(diff).max(axis=-1, initial=0.0)
    dinf = outward(dmax, gamma=m.gamma, alpha=m.alpha, exact=dmax == 0)
    dist = _norm_up(diff)                                                 # [..., n]

    def per_block(x: F64) -> F64:
        return _up(np.where(onehot, x[..., None], 0.0).max(axis=-2, initial=0.0), np.float32)

    used = int((count > 0).sum())
    stored = used * (_center_bytes(kind, k.shape[-1]) + 4 + 4 + 4 + 4)
    c32 = c.astype(np.float32)
    return _establish(c, per_block(dinf), per_block(dist), count, per_block(_norm_up(v)),
                      center_norm=_norm_up(c),
                      center32=c32 if bool((c32.astype(np.float64) == c).all()) else None,
                      stored_bytes=stored, source="witcert_calculus.meters.eviction.evict_witness")


# --------------------------------------------------------------------------- the meter

def _dropped_logit_up(q: F64, w: EvictionWitness[F64], scale: float) -> F64:
    """``u_b = scale (q.c_b + min(||q||_1 h_b, ||q||_2 r_b))`` per row and block, rounded upward
    (:func:`dot_margin`: a dot product of ``d`` terms, a norm or a sum, a product and a sum)."""
    qn = _norm_up(q)                                                          # [..., N]
    q1 = np.abs(q).sum(axis=-1)
    qc = np.einsum("...nd,...bd->...nb", q, w.center)
    box = q1[..., None] * w.linf[..., None, :]
    ball = qn[..., None] * w.radius[..., None, :]
    size = np.einsum("...nd,...bd->...nb", np.abs(q), np.abs(w.center)) + np.maximum(box, ball)
    u = scale * (qc + np.minimum(box, ball))
    m = dot_margin(q.shape[-1] + 3)
    with np.errstate(over="ignore", invalid="ignore"):
        up: F64 = np.nextafter(u + m.gamma * scale * size + m.alpha, np.inf)
    return up


def _mass_raw(log_u: F64, log_z: F64) -> F64:
    """``U / (Z_K + U) = 1 / (1 + exp(log Z_K - log U))``; 0 when nothing is dropped."""
    with np.errstate(over="ignore", invalid="ignore"):
        out: F64 = 1.0 / (1.0 + np.exp(log_z - log_u))
    return np.where(np.isneginf(log_u), 0.0, out)


@final
@dataclass(frozen=True, slots=True, eq=False)
class DroppedMassBatch(Generic[ArrayT]):
    """Bounds on the dropped attention mass ``p(D)`` of many cells at once.

    Attributes:
        mass: the outward-rounded bound ``U / (Z_K + U)`` per cell, shape ``[..., N]``; ``inf``
            where the cell fails closed (a dropped token without a witness, or no kept token).
        log_u: ``log U``, the witness mass of the dropped blocks (``-inf``: nothing dropped).
        log_z: ``log Z_K``, the kept tokens' softmax normaliser.
        evidence: the proof every cell's bound rests on (premises computed by the meter).
        delta: the failure probability per query row (that of the kept logits' bound, if
            any; 0 otherwise).
    """

    mass: ArrayT
    log_u: ArrayT
    log_z: ArrayT
    evidence: Evidence
    delta: Fraction = Fraction(0)

    def reading(self, raw: float) -> Reading[DroppedMass[AtConsume]]:
        """A typed reading of one value of :attr:`mass` (e.g. its maximum over cells).

        The tier is decided by the machine: CERTIFIED below saturation (1), SATURATED at or
        above it (an ``inf`` cell included).
        """
        return _reading(DroppedMass[AtConsume], float(raw), evidence=self.evidence,
                        delta=self.delta)

    def worst(self) -> Reading[DroppedMass[AtConsume]]:
        """The reading of the largest bound of the batch (0 for an empty batch)."""
        m: Any = self.mass
        return self.reading(float(m.max()) if m.size else 0.0)


def _checks(witness_ok: bool) -> tuple[tuple[str, bool], ...]:
    return ((WITNESS_PREMISE, witness_ok),)


def _meter_evidence(checks: tuple[tuple[str, object], ...],
                    kept_bound: LogitBound[Any] | None = None) -> Evidence:
    """The meter's proof; with the kept logits' bound, composed with its evidence and the
    monotonicity that lets a lower bound of ``Z_K`` stand in for it."""
    premises = tuple(_premise(s, bool(h)) for s, h in checks)
    proof = _proof(EVICT_TV_BLOCKS_METER_SOUND, premises)
    if kept_bound is None:
        return proof
    if not is_established(kept_bound):
        raise ForgedBoundError("LogitBound", ESTABLISHERS)
    lower = _proof(DIV_ADD_LE_DIV_ADD, (_premise(
        "Z_K >= sum_t exp(s_t - c_t) > 0 with c_t >= |s_t - s_exact_t|: by construction of the "
        "LogitBound, each exponent rounded downward", is_established(kept_bound)),))
    return Composition((kept_bound.evidence, proof, lower), theorem=EVICT_TV_BLOCKS_METER_SOUND)


def _kept_values(kept_bound: LogitBound[Any] | None) -> Any:
    if kept_bound is None:
        return None
    if not is_established(kept_bound):
        raise ForgedBoundError("LogitBound", ESTABLISHERS)
    return kept_bound.values


def dropped_mass_batch(q: ArrayLike, kept_logits: ArrayLike, witness: EvictionWitness[F64], *,
                       scale: float, dropped: ArrayLike | None = None,
                       restored: ArrayLike | None = None,
                       kept_bound: LogitBound[Any] | None = None) -> DroppedMassBatch[F64]:
    """The eviction meter: ``p(D) <= U / (Z_K + U)`` for every cell, from stored witnesses.

    Lean: ``WitCert.Semantic.evict_tv_blocks_meter_sound`` (the semantic contract ``evictTV``).

    Args:
        q: query rows, shape ``[..., N, d]`` (post-RoPE, as the attention uses them).
        kept_logits: the logits ``scale q.k_t`` over the kept tokens, shape ``[..., N, S]``;
            ``-inf`` at positions a row does not see (a causal mask).
        witness: the witness of the cell's evicted blocks, shape ``[..., B, d]``, established
            by :func:`evict_witness` (or its torch twin) from the dropped keys.
        scale: the attention's logit scale (``d ** -0.5`` usually), ``> 0``.
        dropped: the number of tokens the cache dropped per cell, shape ``[...]`` (``None``:
            the witness's count). A cell whose witness covers fewer reports ``inf``.
        restored: blocks the cache has restored, boolean, shape ``[..., B]`` (``None``: none).
            Their tokens are kept again, so their logits are among ``kept_logits`` and their
            witness leaves ``U`` (Lean ``WitCert.Eviction.restore_block_bound_le``: the bound
            never grows by a restore).
        kept_bound: when the kept keys are themselves compressed (quantized), ``kept_logits``
            are the served logits and ``Z_K`` of the exact ones is unknown: a
            :class:`~witcert_calculus.meters.witness.LogitBound` ``c_t >= |eps_t|`` of the kept
            tokens (broadcast to ``kept_logits``) gives ``Z_K >= sum_t exp(s_t - c_t)``, and the
            bound ``U / (Z_K + U)`` only grows as ``Z_K`` shrinks (Lean
            ``WitCert.Eviction.div_add_le_div_add``). The reading then carries the bound's
            evidence, its tier and its failure probability; :func:`combined_tv` adds the
            kept tokens' own TV bound from the same ``c``.

    Returns:
        A :class:`DroppedMassBatch` with one bound per query row.

    Raises:
        ForgedBoundError: on a witness no establishing function produced.
        InvalidValueError: on NaN or ``+inf`` logits, non-finite queries, mismatched shapes.

    Example:
        >>> w = evict_witness(np.array([[1.0, 0.0]]), np.ones((1, 1)), np.array([0]), blocks=1,
        ...                   center="float32")
        >>> b = dropped_mass_batch(np.array([[1.0, 0.0]]), np.array([[1.0]]), w, scale=1.0)
        >>> round(float(b.mass[0]), 6)  # one dropped and one kept token of equal logit
        0.5
    """
    if not is_witness(witness):
        raise ForgedBoundError("EvictionWitness", EVICTION_ESTABLISHERS)
    qq = finite_array("q", q, ndim=(2, 3, 4, 5))
    s = as_float_array("kept_logits", kept_logits, ndim=qq.ndim)
    sc = real("scale", scale, lo=0.0, lo_open=True)
    lead = qq.shape[:-2]
    if s.shape[:-1] != qq.shape[:-1]:
        raise InvalidValueError("kept_logits", f"array of shape {s.shape}",
                                f"must have the query rows' leading shape {qq.shape[:-1]}")
    if witness.center.shape[:-2] != lead or witness.center.shape[-1] != qq.shape[-1]:
        raise InvalidValueError("witness", f"shape {witness.center.shape}",
                                f"must be [{', '.join(map(str, lead))}, B, {qq.shape[-1]}] "
                                "(one witness per cell, the queries' head dimension)")
    if np.isposinf(s).any():
        idx = np.argwhere(np.isposinf(s))[0].tolist()
        raise InvalidValueError(f"kept_logits{idx}", float("inf"), "must not be +inf")
    count = witness.count
    if restored is not None:
        back = np.asarray(restored)
        if back.dtype != np.bool_ or back.shape != count.shape:
            raise InvalidValueError("restored", f"array of {back.dtype} {back.shape}",
                                    f"must be boolean of the witness's shape {count.shape}")
        count = np.where(back, 0.0, count)
    u = _dropped_logit_up(qq, witness, sc)                                     # [..., N, B]
    with np.errstate(divide="ignore"):
        log_n = np.log(count)[..., None, :]
    log_u = _lse(np.where(count[..., None, :] > 0, log_n + u, -np.inf))
    c = _kept_values(kept_bound)
    if c is not None:
        cc = nonneg_array("kept_bound", c, ndim=tuple(range(s.ndim + 1)), allow_inf=True)
        try:
            cc = np.broadcast_to(cc, s.shape)
        except ValueError:
            raise InvalidValueError("kept_bound", f"shape {cc.shape}", "must broadcast to the "
                                    f"kept logits' {s.shape}") from None
        with np.errstate(invalid="ignore"):
            s = np.nextafter(s - cc, -np.inf)   # each exponent rounded downward
        s = np.where(np.isnan(s), -np.inf, s)   # -inf - inf: a masked position stays masked
    log_z = _lse(s)
    raw = _mass_raw(log_u, log_z)
    m = eviction_margin(s.shape[-1], witness.count.shape[-1])
    with np.errstate(invalid="ignore"):
        size = 1.0 + np.where(np.isfinite(log_u), np.abs(log_u), 0.0) + \
            np.where(np.isfinite(log_z), np.abs(log_z), 0.0)
    mass = outward(raw, gamma=m.gamma * size, alpha=m.alpha, exact=raw == 0)
    covered = witness.count.sum(axis=-1)                                        # [...]
    if dropped is not None:
        want = int_array("dropped", dropped)
        if want.shape != lead:
            raise InvalidValueError("dropped", f"array of shape {want.shape}",
                                    f"must have one count per cell {lead}")
        mass = np.where((want > covered)[..., None], np.inf, mass)
    nothing_kept = np.isneginf(log_z) & (np.isfinite(log_u) | (covered > 0)[..., None])
    mass = np.where(nothing_kept, np.inf, mass)
    return DroppedMassBatch(mass=mass, log_u=log_u, log_z=log_z,
                            evidence=_meter_evidence(_checks(is_witness(witness)), kept_bound),
                            delta=Fraction(0) if kept_bound is None else kept_bound.delta)


def eviction_output_bound(mass: ArrayLike, *, value_norm_max: ArrayLike,
                          kept_output_norm: ArrayLike) -> F64:
    """``||o - o_K|| <= p(D) (max_D ||v|| + ||o_K||)``, rounded outward.

    Lean: ``WitCert.Eviction.output_evict_error_le``.

    Args:
        mass: bounds on ``p(D)`` (``inf`` allowed: the output bound is then ``inf``).
        value_norm_max: ``>= max ||v_t||`` over the dropped tokens (the witness's
            ``value_norm.max(-1)``), broadcast against ``mass``.
        kept_output_norm: ``||o_K||`` (an upper bound), broadcast against ``mass``.

    Returns:
        The bound per cell (float64).

    Raises:
        InvalidValueError: on NaN or negative inputs.

    Example:
        >>> float(eviction_output_bound(0.0, value_norm_max=3.0, kept_output_norm=1.0))
        0.0
    """
    p = as_float_array("mass", mass, ndim=(0, 1, 2, 3, 4, 5))
    vm = as_float_array("value_norm_max", value_norm_max, ndim=(0, 1, 2, 3, 4, 5))
    on = as_float_array("kept_output_norm", kept_output_norm, ndim=(0, 1, 2, 3, 4, 5))
    for name, x in (("mass", p), ("value_norm_max", vm), ("kept_output_norm", on)):
        if (x < 0).any():
            raise InvalidValueError(name, float(x[x < 0].flat[0]), "must be >= 0")
    m = sum_margin(2)
    with np.errstate(over="ignore", invalid="ignore"):
        raw: F64 = np.where(p == 0, 0.0, p * (vm + on))
    return outward(raw, gamma=m.gamma, alpha=m.alpha, exact=raw == 0)


# --------------------------------------------------------------------------- the gate

@final
@dataclass(frozen=True, slots=True)
class RestorePlan:
    """Which evicted blocks to restore, in order, to bring a cell's bound under a target.

    Attributes:
        order: block indices, largest witness mass ``n_b exp(u_b)`` first; the shortest prefix
            whose removal brings ``U' / (Z_K + U')`` under the threshold (``Z_K`` held fixed: the
            restored blocks' exact mass only adds to it, so the bound after the restore is at
            most ``bound_after``).
        bound_before: the bound before any restore.
        bound_after: the planned bound (``U'`` without the restored blocks, ``Z_K`` unchanged).
        threshold: the target.
    """

    order: tuple[int, ...]
    bound_before: float
    bound_after: float
    threshold: float


def restore_order(log_terms: ArrayLike, log_z: float, *, threshold: float) -> RestorePlan:
    """The fewest evicted blocks whose restore brings the eviction bound under ``threshold``.

    With ``U = sum_b exp(t_b)`` (``t_b = log n_b + u_b``, the block's witness mass), removing
    a block lowers ``U`` by ``exp(t_b)``; the bound ``U / (Z_K + U)`` is increasing in ``U``
    and decreasing in ``Z_K``, which a restore only raises (Lean
    ``WitCert.Eviction.restore_block_bound_le``; about the contract ``evictTV``,
    ``WitCert.Semantic.evict_tv_restore_meter_le``), so taking blocks by decreasing ``t_b``
    reaches the target with the fewest blocks. The bound is then recomputed on the restored
    cache by :func:`dropped_mass_batch`.

    Args:
        log_terms: ``log n_b + u_b`` per block (``-inf``: an empty slot), shape ``(B,)``.
        log_z: ``log Z_K`` of the cell (finite).
        threshold: the target, in ``[0, 1)``.

    Returns:
        A :class:`RestorePlan` (empty ``order`` when already under the threshold; every
        non-empty block when only a full restore reaches it).

    Raises:
        InvalidValueError: on NaN or ``+inf`` terms, a non-finite ``log_z`` or a threshold
            outside ``[0, 1)``.

    Example:
        >>> restore_order(np.array([0.0, 2.0, 1.0]), 0.0, threshold=0.5).order
        (1, 2)
    """
    t = as_float_array("log_terms", log_terms, ndim=1)
    if np.isposinf(t).any():
        raise InvalidValueError("log_terms", float("inf"), "must not be +inf")
    lz = real("log_z", log_z)
    tau = real("threshold", threshold, lo=0.0, hi=1.0, hi_open=True)
    order = np.lexsort((np.arange(t.size), -t))
    order = order[np.isfinite(t[order])]
    # after removing the first k blocks of `order`: log U_k = lse of the remaining terms
    rest = np.concatenate([np.logaddexp.accumulate(t[order][::-1])[::-1], [-np.inf]])
    bounds = _mass_raw(rest, np.full(rest.shape, lz))
    k = int(np.nonzero(bounds <= tau)[0][0])
    return RestorePlan(order=tuple(int(i) for i in order[:k]), bound_before=float(bounds[0]),
                       bound_after=float(bounds[k]), threshold=tau)


# --------------------------------------------------------------------------- combination

def combined_tv(evicted: Reading[DroppedMass[AtConsume]], kept: Reading[AttentionTV[AtConsume]]
                ) -> Reading[AttentionTV[AtConsume]]:
    """One bound for a cache that drops some tokens and quantizes the kept ones.

    ``TV(p, q_K) <= p(D) + TV(p_K, q_K)``: ``p`` the exact attention over every token, ``p_K``
    its restriction to the kept tokens, ``q_K`` the attention the cache serves from the
    quantized kept keys (Lean ``WitCert.Semantic.evict_quant_meter_sound``). ``evicted``
    bounds ``p(D)`` (:func:`dropped_mass_batch` of the served kept logits with their
    ``kept_bound``, or of the exact ones); ``kept`` bounds ``TV(p_K, q_K)`` (a Tier-A/Tier-B
    meter over the kept tokens alone, e.g. :func:`~witcert_calculus.meters.tv_forms.tv_meter`
    from the same ``c``).

    Returns:
        ``AttentionTV[AtConsume]`` reading of ``evicted + kept`` rounded upward; its tier is
        the weaker of the two, its failure probability the sum.

    Raises:
        MetricMismatchError: if either reading is of another metric.

    Example:
        >>> w = evict_witness(np.array([[1.0, 0.0]]), np.ones((1, 1)), np.array([0]), blocks=1)
        >>> e = dropped_mass_batch(np.array([[0.0, 0.0]]), np.array([[0.0]]), w, scale=1.0)
        >>> from witcert_calculus.meters.tv_forms import tv_eform
        >>> k = tv_eform(np.array([1.0]), np.array([0.0])).reading()
        >>> round(combined_tv(e.worst(), k).value, 6)
        0.5
    """
    for what, r, want in (("evicted", evicted, DroppedMass[AtConsume]),
                          ("kept", kept, AttentionTV[AtConsume])):
        if not isinstance(r, Reading) or not same_metric(r.metric, want):
            got = metric_name(r.metric) if isinstance(r, Reading) else type(r).__name__
            raise MetricMismatchError(f"combined_tv({what}=...)", got, "combined_tv",
                                      metric_name(want))
    total = float(add_up(np.array(evicted.raw), np.array(kept.raw)))
    premises = (_premise("the readings are the dropped mass of the cell and the TV over its kept "
                         "tokens", same_metric(evicted.metric, DroppedMass[AtConsume])
                         and same_metric(kept.metric, AttentionTV[AtConsume])),)
    evidence = Composition((evicted.evidence, kept.evidence,
                            _proof(EVICT_QUANT_METER_SOUND, premises)),
                           theorem=EVICT_QUANT_METER_SOUND)
    return _reading(AttentionTV[AtConsume], total, evidence=evidence,
                    delta=Fraction(evicted.delta) + Fraction(kept.delta))
