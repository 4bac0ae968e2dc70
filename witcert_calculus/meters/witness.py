"""Band witnesses of key residuals and the per-band Cauchy-Schwarz logit bound (Tier A).

A key residual ``r_t = k_hat_t - k_t`` (one head, ``d`` channels) is cut into
``B`` contiguous bands of RoPE frequency pairs; the witness stored at write time
is ``w[t, b] = ||r_{t,b}||``. Because every band holds *both* coordinates of each
of its rotation pairs, a RoPE rotation (which acts on each pair as a planar
rotation) leaves every band norm unchanged: the witness of a post-RoPE residual
equals that of the pre-RoPE residual at every position ("band unitarity"). The
pairing depends on the layout: interleaved ``(x[2j], x[2j+1])`` or the
half-split layout of Hugging Face's ``rotate_half``, ``(x[j], x[j + d/2])``.

At read time the logit error of token ``t`` obeys
``|scale * <q, r_t>| <= c_t = scale * sum_b ||q_b|| * w[t, b]``
(Cauchy-Schwarz per band; Lean: ``WitCert.Witness.logit_bound_sound``).

Floating point: witnesses and ``c`` are *upper* bounds of their exact values.
Norms are computed after scaling by the row maximum (no overflow, no underflow
to a false zero); norms and ``c`` are rounded outward by the rule of
:mod:`witcert_calculus.numerics.rounding` (margins
:func:`~witcert_calculus.numerics.rounding.band_norm_margin`,
:func:`~witcert_calculus.numerics.rounding.logit_margin`); storage in float16/float32 rounds upward.
The torch versions (``witcert_kernels.meter``) use the same bands and margins.

Established by construction. :func:`logit_bound` returns a :class:`LogitBound`: the values
``c`` together with the evidence that ``c_t >= |eps_t|`` (its premises computed from the
query and the stored witnesses). Only the establishing functions produce one (this module's
:func:`logit_bound`, :func:`witcert_calculus.meters.dither.tier_b_logit_bound` and their torch twins
``witcert_kernels.meter.logit_bound`` and ``witcert_kernels.dither.tier_b_logit_bound``);
building one elsewhere raises :class:`~witcert_calculus.errors.ForgedBoundError`. The TV forms
take either a ``LogitBound`` (its premise then holds by construction) or the caller's own
array, whose premise is the assumption :data:`CALLER_LOGIT_BOUND`.

Main declarations:

- :class:`RopeLayout`: ``INTERLEAVED`` or ``HALF_SPLIT``.
- :func:`band_pairs`: the pair indices of each band.
- :func:`band_channels`: the channel indices of each band for a layout.
- :func:`band_witness`: ``w[t, b]`` from residuals.
- :func:`band_norms`: band norms of a query (same bands).
- :class:`LogitBound`: a per-token logit error bound with its evidence (established only
  by its establishing functions); :func:`is_established`, the provenance check.
- :func:`logit_bound`: ``c_t`` from a query and stored witnesses, as a ``LogitBound``.
- :func:`logit_linf_reading`: ``max_t c_t`` as a typed ``LogitLinf[AtConsume]`` reading.
- :data:`CALLER_LOGIT_BOUND`: the assumption behind a caller's own array of bounds.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from fractions import Fraction
from typing import Any, Final, Generic, NoReturn, TypeVar, final, overload

import numpy as np
from numpy.typing import ArrayLike, DTypeLike, NDArray

from witcert_calculus.contracts import Reading, _reading  # pyright: ignore[reportPrivateUsage]
from witcert_calculus.errors import ForgedBoundError, InvalidValueError
from witcert_calculus.lean.theorems import ADD_SOUND, LOGIT_BOUND_METER_SOUND, MIN_BOUND_SOUND
from witcert_calculus.metrics import AtConsume, LogitLinf
from witcert_calculus.numerics.rounding import TINY, add_up, band_norm_margin, logit_margin, outward
from witcert_calculus.tiers import (
    Assumption,
    Composition,
    Evidence,
    Restricted,
    _premise,  # pyright: ignore[reportPrivateUsage]
    _proof,  # pyright: ignore[reportPrivateUsage]
    assumptions_of,
)
from witcert_calculus.numerics.validation import F64, finite_array, nonneg_array, positive_int, real
from witcert_calculus.numerics.validation import head_dim as head_dim_of

__all__ = [
    "CALLER_LOGIT_BOUND",
    "ESTABLISHERS",
    "LOGIT_BOUND_THEOREM",
    "LogitBound",
    "RopeLayout",
    "band_channels",
    "band_norms",
    "band_pairs",
    "band_witness",
    "is_established",
    "logit_bound",
    "logit_linf_reading",
    "tighter",
]

LOGIT_BOUND_THEOREM: Final = LOGIT_BOUND_METER_SOUND

#: The functions that establish a :class:`LogitBound` (the only ones that produce one).
ESTABLISHERS: Final = ("witcert_calculus.meters.witness.logit_bound",
                       "witcert_calculus.meters.formats.format_logit_bound",
                       "witcert_calculus.meters.dither.tier_b_logit_bound",
                       "witcert_kernels.meter.logit_bound",
                       "witcert_kernels.meter.format_logit_bound",
                       "witcert_kernels.meter.exact_logit_bound",
                       "witcert_kernels.fused.fp8_logits_and_bound",
                       "witcert_kernels.dither.tier_b_logit_bound")

#: The premise ``c_t >= |eps_t|`` of a caller's own array of bounds, which no code checks.
CALLER_LOGIT_BOUND: Final = Assumption(
    "c_t >= |eps_t| for every token t, for c the caller's own array (not a LogitBound)",
    reason="the logit errors eps_t need the exact keys, which the meter never sees; a "
           "LogitBound from an establishing function carries this premise by construction")

ArrayT = TypeVar("ArrayT")

# The construction token: only the establishing functions (through _establish) hold it.
_SEAL: Final = object()


@final
class LogitBound(Generic[ArrayT]):
    """A per-token logit error bound ``c_t >= |eps_t|``, established by the function that built it.

    The values come with the evidence of the premise: a Tier-A bound (:func:`logit_bound`,
    from stored band witnesses and the live query) holds deterministically; a Tier-B bound
    (:func:`witcert_calculus.meters.dither.tier_b_logit_bound`) holds on an event of probability
    at least ``1 - delta`` and under the assumptions its evidence states. ``ArrayT`` is a
    float64 numpy array or, from ``witcert_kernels``, a float64 torch tensor.

    Only the establishing functions (:data:`ESTABLISHERS`) produce one: calling the class
    raises :class:`~witcert_calculus.errors.ForgedBoundError`. It is frozen, numpy values
    are read-only (a torch tensor cannot be: changing it in place voids the bound), and it
    is not pickled (it is established in this process).

    Sums stay established: ``c1 + c2`` bounds ``|eps1 + eps2|`` (e.g. the two logit parts of
    a latent attention, or a Tier-A part plus a Tier-B part), rounded upward, failure
    probabilities added; ``0 + c`` is ``c`` (so ``sum`` works). Adding a plain array gives a
    plain array: the sum is no longer established.

    Attributes:
        values: ``c``, shape ``[..., S]`` (one entry per token).
        evidence: what proves ``c_t >= |eps_t|`` (premises computed when ``c`` was built).
        delta: the probability (exact) that some token of a query row escapes its bound; 0
            for Tier A.
        source: the establishing function (``"a + b"`` for a sum).
        checks: premises on the numbers computed when ``c`` was built, as
            ``(statement, truth)`` pairs whose truth may be a 0-d torch tensor (read when
            the reading's evidence is built, so a hot loop never waits on the device).

    Example:
        >>> c = logit_bound(np.array([2.0, 0.0]), np.array([[0.5]]),
        ...                 layout=RopeLayout.INTERLEAVED, scale=0.5)
        >>> (type(c).__name__, is_established(c), float(c.delta))
        ('LogitBound', True, 0.0)
    """

    __slots__ = ("_add", "_seal", "checks", "delta", "evidence", "source", "values")
    __array_ufunc__ = None  # numpy defers ``array + bound`` to __radd__

    values: ArrayT
    evidence: Evidence
    delta: Fraction
    source: str
    checks: tuple[tuple[str, object], ...]
    _add: Callable[[ArrayT, ArrayT], ArrayT]
    _seal: object

    def __init__(self, values: ArrayT, *, evidence: Evidence, delta: Fraction, source: str,
                 add: Callable[[ArrayT, ArrayT], ArrayT],
                 checks: tuple[tuple[str, object], ...] = (), seal: object = None) -> None:
        if seal is not _SEAL:
            raise ForgedBoundError("LogitBound", ESTABLISHERS)
        if not isinstance(delta, Fraction) or not 0 <= delta < 1:
            raise InvalidValueError("delta", delta, "must be an exact probability in [0, 1)")
        for key, value in (("values", values), ("evidence", evidence), ("delta", delta),
                           ("source", source), ("checks", checks), ("_add", add),
                           ("_seal", seal)):
            object.__setattr__(self, key, value)

    def __setattr__(self, key: str, value: object) -> NoReturn:
        raise AttributeError(f"LogitBound is frozen; cannot set {key!r}")

    def __delattr__(self, key: str) -> NoReturn:
        raise AttributeError(f"LogitBound is frozen; cannot delete {key!r}")

    def __reduce__(self) -> NoReturn:
        raise TypeError("a LogitBound is established in this process and is not pickled; "
                        "pickle its values and rebuild it with its establishing function")

    def __copy__(self) -> LogitBound[ArrayT]:
        return self

    def __deepcopy__(self, memo: dict[int, object]) -> LogitBound[ArrayT]:
        return self

    def __repr__(self) -> str:
        shape = tuple(getattr(self.values, "shape", ()))
        return f"LogitBound(shape={shape}, source={self.source!r}, delta={self.delta})"

    @property
    def assumptions(self) -> tuple[Assumption, ...]:
        """What the bound assumes and no code checks (none for Tier A)."""
        return assumptions_of(self.evidence)

    @overload
    def __add__(self, other: LogitBound[ArrayT]) -> LogitBound[ArrayT]: ...
    @overload
    def __add__(self, other: Any) -> Any: ...

    def __add__(self, other: Any) -> Any:
        """``c1 + c2`` as an established bound (see the class); plus a plain array, a plain array."""
        if isinstance(other, int) and not isinstance(other, bool) and other == 0:
            return self
        if not isinstance(other, LogitBound):
            plain: Any = self.values
            return plain + other
        o: LogitBound[Any] = other  # pyright: ignore[reportUnknownVariableType]
        if not (is_established(self) and is_established(o)):
            raise ForgedBoundError("LogitBound", ESTABLISHERS)
        if type(self.values) is not type(o.values):
            raise InvalidValueError("c", f"bounds held as {type(self.values).__name__} and "
                                    f"{type(o.values).__name__}",
                                    "must be held alike (numpy with numpy, torch with torch)")
        delta = self.delta + o.delta
        if delta >= 1:
            raise InvalidValueError("delta", delta, "the union bound of the two parts reaches 1")
        return _establish(self._add(self.values, o.values),
                          evidence=Composition((self.evidence, o.evidence), theorem=ADD_SOUND),
                          delta=delta, source=f"{self.source} + {o.source}", add=self._add,
                          checks=self.checks + o.checks)

    def __radd__(self, other: Any) -> Any:
        if isinstance(other, int) and not isinstance(other, bool) and other == 0:
            return self
        plain: Any = self.values
        return other + plain


def is_established(c: object) -> bool:
    """Whether ``c`` is a :class:`LogitBound` produced by an establishing function.

    The provenance check behind the premise ``c_t >= |eps_t|`` of the TV forms: a plain
    array, or an object built around the constructor, is not established.

    Example:
        >>> is_established(np.array([0.1, 0.2]))
        False
    """
    subject: object = c  # kept as an object: only its seal is read
    if not isinstance(c, LogitBound):
        return False
    # a slot left unset (an object built around the constructor) reads as the default
    return getattr(subject, "_seal", None) is _SEAL


def tighter(a: LogitBound[ArrayT], b: LogitBound[ArrayT]) -> LogitBound[ArrayT]:
    """The token-wise smaller of two established bounds of the same logit errors, established.

    Both ``a_t >= |eps_t|`` and ``b_t >= |eps_t|``, so ``min(a_t, b_t) >= |eps_t|`` (Lean
    ``WitCert.Formats.min_bound_sound``); the minimum is exact (no rounding), the failure
    probabilities add (both events must hold), and both evidences are kept.

    Args:
        a, b: established bounds of the same tokens (equal shapes, held alike: numpy with
            numpy, torch with torch).

    Raises:
        ForgedBoundError: either one was not established.
        InvalidValueError: shapes or holders that differ, or failure probabilities that add
            up to 1.

    Example:
        >>> c1 = logit_bound(np.array([2.0, 0.0]), np.array([[0.5], [0.1]]),
        ...                  layout=RopeLayout.INTERLEAVED, scale=0.5)
        >>> c2 = logit_bound(np.array([2.0, 0.0]), np.array([[0.1], [0.5]]),
        ...                  layout=RopeLayout.INTERLEAVED, scale=0.5)
        >>> [round(float(v), 6) for v in tighter(c1, c2).values]
        [0.1, 0.1]
    """
    if not (is_established(a) and is_established(b)):
        raise ForgedBoundError("LogitBound", ESTABLISHERS)
    av: Any = a.values
    bv: Any = b.values
    if type(av) is not type(bv):
        raise InvalidValueError("c", f"bounds held as {type(av).__name__} and "
                                f"{type(bv).__name__}",
                                "must be held alike (numpy with numpy, torch with torch)")
    if tuple(av.shape) != tuple(bv.shape):
        raise InvalidValueError("c", f"bounds of shapes {tuple(av.shape)} and "
                                f"{tuple(bv.shape)}", "must bound the same tokens")
    delta = a.delta + b.delta
    if delta >= 1:
        raise InvalidValueError("delta", delta, "the union bound of the two parts reaches 1")
    # numpy arrays: np.minimum (read-only copy); torch tensors: their own minimum
    low: Any = _read_only(np.minimum(np.asarray(av, dtype=np.float64),
                                     np.asarray(bv, dtype=np.float64))) \
        if isinstance(av, np.ndarray) else av.minimum(bv)
    add: Callable[[ArrayT, ArrayT], ArrayT] = a._add  # pyright: ignore[reportPrivateUsage]
    return _establish(low, evidence=Composition((a.evidence, b.evidence), theorem=MIN_BOUND_SOUND),
                      delta=delta, source=f"min({a.source}, {b.source})", add=add,
                      checks=a.checks + b.checks)


def _establish(values: ArrayT, *, evidence: Evidence, delta: Fraction, source: str,
               add: Callable[[ArrayT, ArrayT], ArrayT],
               checks: tuple[tuple[str, object], ...] = ()) -> LogitBound[ArrayT]:
    """The one way to build a LogitBound: for the establishing functions only."""
    return LogitBound(values, evidence=evidence, delta=delta, source=source, add=add,
                      checks=checks, seal=_SEAL)


def _add_shapes(a: F64, b: F64) -> F64:
    if a.shape != b.shape:
        raise InvalidValueError("c", f"bounds of shapes {a.shape} and {b.shape}",
                                "must bound the same tokens (equal shapes) to be added")
    return _read_only(add_up(a, b))


def _read_only(x: F64) -> F64:
    """``x`` copied into immutable memory: no flag can make the copy writable again."""
    out: F64 = np.frombuffer(np.ascontiguousarray(x).tobytes(),
                             dtype=x.dtype).reshape(x.shape)
    return out


# The premise on the witness array (computed eagerly by numpy, deferred by torch).
_WITNESS_PREMISE: Final = ("w[t, b] >= 0 for every token and band, not NaN (the stored band "
                          "witness, rounded upward when stored)")


def _tier_a_evidence(*, scale: float, bands: int, query_bands: int, witness_ok: bool | None,
                     assumptions: tuple[Assumption, ...] = ()) -> Evidence:
    """Evidence of ``c_t = scale sum_b qn_b w[t, b]``, premises of the Lean theorem computed
    (``witness_ok=None``: that premise is deferred to the bound's checks)."""
    premises = [_premise("scale >= 0", scale >= 0),
                _premise(f"qn_b >= ||q_b|| for each of the witness's {bands} bands: band "
                         "norms of the query over the same bands, rounded outward",
                         query_bands == bands)]
    if witness_ok is not None:
        premises.insert(1, _premise(_WITNESS_PREMISE, witness_ok))
    proof = _proof(LOGIT_BOUND_METER_SOUND, tuple(premises))
    if not assumptions:
        return proof
    return Restricted(proof, assumptions=assumptions)


@final
class RopeLayout(enum.Enum):
    """How the two coordinates of each RoPE frequency pair are placed in a head vector."""

    INTERLEAVED = "interleaved"
    """Pair ``j`` is ``(x[2j], x[2j+1])`` (GPT-J / Meta reference layout)."""
    HALF_SPLIT = "half_split"
    """Pair ``j`` is ``(x[j], x[j + d/2])`` (Hugging Face ``rotate_half``)."""


def band_pairs(head_dim: int, *, bands: int) -> tuple[tuple[int, int], ...]:
    """Split the ``head_dim / 2`` frequency pairs into ``bands`` contiguous bands.

    Sizes differ by at most one (the first ``(d/2) % bands`` bands get one more).

    Args:
        head_dim: the head dimension ``d`` (even).
        bands: number of bands ``B``, ``1 <= B <= d/2``.

    Returns:
        ``(start, stop)`` pair ranges, one per band.

    Raises:
        InvalidValueError: if ``d`` is odd or ``B`` out of range.

    Example:
        >>> band_pairs(8, bands=2)
        ((0, 2), (2, 4))
    """
    d = head_dim_of("head_dim", head_dim, minimum=2)
    if d % 2:
        raise InvalidValueError("head_dim", head_dim, "must be even (RoPE acts on pairs)")
    b = positive_int("bands", bands)
    npairs = d // 2
    if b > npairs:
        raise InvalidValueError("bands", bands, f"must be <= head_dim/2 = {npairs}")
    base, extra = divmod(npairs, b)
    out: list[tuple[int, int]] = []
    start = 0
    for i in range(b):
        stop = start + base + (1 if i < extra else 0)
        out.append((start, stop))
        start = stop
    return tuple(out)


def _pair_channels(head_dim: int, layout: RopeLayout) -> NDArray[np.intp]:
    """Array (d/2, 2): the two channel indices of each pair."""
    j = np.arange(head_dim // 2)
    if layout is RopeLayout.INTERLEAVED:
        return np.stack([2 * j, 2 * j + 1], axis=1)
    if layout is RopeLayout.HALF_SPLIT:
        return np.stack([j, j + head_dim // 2], axis=1)
    raise InvalidValueError("layout", layout, "must be a RopeLayout")


def band_channels(head_dim: int, *, bands: int,
                  layout: RopeLayout) -> tuple[NDArray[np.intp], ...]:
    """Channel indices of each band: both coordinates of every pair in the band.

    Example:
        >>> [c.tolist() for c in band_channels(8, bands=2, layout=RopeLayout.HALF_SPLIT)]
        [[0, 1, 4, 5], [2, 3, 6, 7]]
    """
    ranges = band_pairs(head_dim, bands=bands)
    pc = _pair_channels(head_dim, layout)
    return tuple(np.sort(pc[a:b].reshape(-1)) for a, b in ranges)


def _band_order(head_dim: int, bands: int, layout: RopeLayout
                ) -> tuple[NDArray[np.intp], NDArray[np.intp], F64]:
    """Channel permutation that makes every band contiguous, band starts, band sizes."""
    ranges = band_pairs(head_dim, bands=bands)
    pc = _pair_channels(head_dim, layout)
    perm = np.concatenate([pc[a:b].reshape(-1) for a, b in ranges]).astype(np.intp)
    starts = np.array([2 * a for a, _ in ranges], dtype=np.intp)
    sizes = np.array([2 * (b - a) for a, b in ranges], dtype=np.float64)
    return perm, starts, sizes


def _band_norms_upper(x: F64, bands: int, layout: RopeLayout) -> F64:
    """Rigorous float64 upper bounds of the band norms along the last axis."""
    perm, starts, sizes = _band_order(x.shape[-1], bands, layout)
    xp = x[..., perm]
    ax = np.abs(xp)
    band_max = np.maximum.reduceat(ax, starts, axis=-1)
    amax = band_max.max(axis=-1, keepdims=True)
    scaled = xp / np.where(amax > 0, amax, 1.0)  # |scaled| <= 1: no overflow
    band_sq = np.add.reduceat(scaled * scaled, starts, axis=-1)
    margins = [band_norm_margin(int(m)) for m in sizes]
    gamma = np.array([m.gamma for m in margins])
    floor = np.array([m.alpha for m in margins])  # in units of amax
    # an exactly zero band stays exactly zero
    return outward(np.sqrt(band_sq) * amax, gamma=gamma, alpha=floor * amax + TINY,
                   exact=band_max == 0)


def _store_upward(x: F64, dtype: DTypeLike) -> NDArray[np.floating]:
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError):
        raise InvalidValueError("dtype", dtype, "must be float16, float32 or float64") from None
    if dt == np.dtype(np.float64):
        return x
    if dt == np.dtype(np.float16):
        return _upward_as(x, np.float16)
    if dt == np.dtype(np.float32):
        return _upward_as(x, np.float32)
    raise InvalidValueError("dtype", dtype, "must be float16, float32 or float64")


def _upward_as(x: F64, kind: type[np.float16] | type[np.float32]) -> NDArray[np.floating]:
    with np.errstate(over="ignore"):
        low: NDArray[np.floating] = x.astype(kind)
    up: NDArray[np.floating] = np.nextafter(low, np.asarray(np.inf, dtype=kind))
    stored: NDArray[np.floating] = np.where(low.astype(np.float64) < x, up, low)
    return stored


def band_witness(residual: ArrayLike, *, bands: int, layout: RopeLayout,
                 dtype: DTypeLike = np.float64) -> NDArray[np.floating]:
    """Witness ``w[t, b] = ||r_{t,b}||`` of key residuals, one value per band.

    Args:
        residual: ``k_hat - k``, shape ``(d,)`` or ``(S, d)`` (one head).
        bands: number of bands ``B`` (contiguous ranges of frequency pairs).
        layout: the RoPE layout of the head vectors.
        dtype: storage type; float16 / float32 values are rounded *upward*, so the
            stored witness still bounds the norm (``inf`` when it overflows).

    Returns:
        Array of shape ``(B,)`` or ``(S, B)``; every entry is >= the exact band norm.

    Raises:
        InvalidValueError: on NaN/inf entries, odd ``d``, ``B`` out of range,
            or an unsupported dtype.

    Example:
        >>> band_witness(np.array([3.0, 0.0, 4.0, 0.0]), bands=2,
        ...              layout=RopeLayout.HALF_SPLIT).round(12).tolist()
        [5.0, 0.0]
    """
    r = finite_array("residual", residual, ndim=(1, 2))
    return _store_upward(_band_norms_upper(r, bands, layout), dtype)


def band_norms(query: ArrayLike, *, bands: int, layout: RopeLayout) -> F64:
    """Band norms ``||q_b||`` of a query (rigorous upper bounds), same bands as the witness.

    Example:
        >>> band_norms(np.array([0.0, 3.0, 0.0, 4.0]), bands=1,
        ...            layout=RopeLayout.INTERLEAVED).round(12).tolist()
        [5.0]
    """
    q = finite_array("query", query, ndim=(1, 2))
    return _band_norms_upper(q, bands, layout)


def logit_bound(query: ArrayLike, witness: ArrayLike, *, layout: RopeLayout,
                scale: float) -> LogitBound[F64]:
    """Per-token logit error bound ``c_t = scale * sum_b ||q_b|| * w[t, b]``, established.

    Lean: ``WitCert.Semantic.logit_bound_norms_meter_sound`` (per-band Cauchy-Schwarz, ``WitCert.Witness.logit_bound_sound``, about the score contract). The band norms of
    the query are computed here, over the witness's bands, and every premise of the theorem
    is computed from the arguments, so the TV forms take the result as proved.

    Args:
        query: the query of this head, shape ``(d,)`` (pre- or post-RoPE: the band
            norms are the same).
        witness: stored witnesses, shape ``(S, B)`` (or ``(B,)`` for one token).
        layout: the RoPE layout used for the witness.
        scale: the attention scale (e.g. ``d ** -0.5``), > 0.

    Returns:
        A :class:`LogitBound` whose ``values`` (shape ``(S,)``, or ``()``, read-only) bound
        ``|scale * <q, r_t>|`` deterministically (``delta = 0``).

    Raises:
        InvalidValueError: on invalid shapes or values.

    Example:
        >>> w = band_witness(np.array([[1.0, 0.0, 0.0, 0.0]]), bands=2,
        ...                  layout=RopeLayout.INTERLEAVED)
        >>> c = logit_bound(np.array([2.0, 0.0, 0.0, 0.0]), w,
        ...                 layout=RopeLayout.INTERLEAVED, scale=0.5)
        >>> float(c.values[0]) >= 1.0
        True
    """
    q = finite_array("query", query, ndim=1)
    w = nonneg_array("witness", witness, ndim=(1, 2), allow_inf=True)
    s = real("scale", scale, lo=0.0, lo_open=True)
    nb = w.shape[-1]
    qn = _band_norms_upper(q, nb, layout)
    with np.errstate(invalid="ignore", over="ignore"):
        # inf * 0 -> nan: an overflowed witness meets an exactly zero query band,
        # whose exact contribution <q_b, r_b> is 0.
        prod = w * qn
        prod = np.where(np.isnan(prod), 0.0, prod)
        c: F64 = np.asarray(prod.sum(axis=-1) * s, dtype=np.float64)
    margin = logit_margin(nb, scale=s)
    exact = (w == 0).all(axis=-1) | bool((qn == 0).all())
    values = outward(c, gamma=margin.gamma, alpha=margin.alpha, exact=np.asarray(exact))
    evidence = _tier_a_evidence(scale=s, bands=nb, query_bands=int(qn.shape[-1]),
                                witness_ok=bool((w >= 0).all()))
    return _establish(_read_only(values), evidence=evidence, delta=Fraction(0),
                      source="witcert_calculus.meters.witness.logit_bound", add=_add_shapes)


def logit_linf_reading(c: LogitBound[Any] | ArrayLike) -> Reading[LogitLinf[AtConsume]]:
    """The sup-norm logit error bound ``max_t c_t`` as a reading of ``LogitLinf[AtConsume]``.

    It feeds the scalar softmax bridges (e.g. ``bridges.softmax_tv_eform``); the
    per-token TV forms of :mod:`witcert_calculus.meters.tv_forms` use the whole vector and are
    tighter.

    Args:
        c: per-token bounds, shape ``(S,)``, finite and >= 0: a :class:`LogitBound` (from
            :func:`logit_bound`; its evidence and ``delta`` carry over) or the caller's own
            array (its premise is the assumption :data:`CALLER_LOGIT_BOUND`).

    Returns:
        A reading citing ``WitCert.Semantic.logit_bound_norms_meter_sound``: CERTIFIED for a Tier-A
        bound, PARTIALLY_CERTIFIED for an array of the caller's (or a Tier-B bound).

    Raises:
        ForgedBoundError: on a ``LogitBound`` that no establishing function produced.
        InvalidValueError: on an empty, negative or non-finite ``c``.

    Example:
        >>> r = logit_linf_reading(np.array([0.1, 0.3]))
        >>> (r.raw, r.tier.name)
        (0.3, 'PARTIALLY_CERTIFIED')
    """
    if isinstance(c, LogitBound):
        if not is_established(c):
            raise ForgedBoundError("LogitBound", ESTABLISHERS)
        bound: LogitBound[Any] = c  # pyright: ignore[reportUnknownVariableType]
        cc = nonneg_array("c", np.asarray(bound.values, dtype=np.float64), ndim=1)
        checks = tuple(_premise(statement, bool(truth)) for statement, truth in bound.checks)
        evidence: Evidence = bound.evidence
        if checks:
            evidence = Composition((evidence, _proof(LOGIT_BOUND_THEOREM, checks)),
                                   theorem=LOGIT_BOUND_THEOREM)
        delta = bound.delta
    else:
        cc = nonneg_array("c", c, ndim=1)
        evidence = Restricted(_proof(LOGIT_BOUND_THEOREM, (
            _premise("c_t is finite and >= 0 for every token t",
                     bool(np.isfinite(cc).all() and (cc >= 0).all())),)),
            assumptions=(CALLER_LOGIT_BOUND,))
        delta = Fraction(0)
    if cc.size == 0:
        raise InvalidValueError("c", "empty array", "must hold at least one token")
    return _reading(LogitLinf[AtConsume], float(cc.max()), evidence=evidence, delta=delta)
