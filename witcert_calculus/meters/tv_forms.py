"""The Tier-A TV forms: deterministic bounds on attention total variation from logit bounds.

Setting: one layer, head and decode step; ``p`` and ``p_tilde`` are the softmax
attention over ``S`` cached tokens from exact and compressed keys; ``eps_t`` the
logit error of token ``t``; ``c_t >= |eps_t|`` any per-token bound (e.g.
:func:`witcert_calculus.meters.witness.logit_bound` of the stored band witness).
``TV(p, p_tilde) = 1/2 sum |p_t - p_tilde_t|``. Every TV bound is reported as
``min(1, raw)``; ``raw`` (which may be ``inf``) is kept next to it as a risk score.

The bounds hold for any cache-preserving quantizer and any query, adaptive or not.
With ``A = sum_t p_tilde_t e^{c_t}`` and ``A- = sum_t p_tilde_t e^{-c_t}``:

- e-form ``TV <= (A^2 - 1) / 2`` (Lean ``WitCert.Semantic.tv_eform_meter_sound``, about the
  semantic contract ``softmaxTVEform``, from ``WitCert.Meters.tv_eform_sound``);
- two-sided ``TV <= (A/A- - A-/A) / 2`` (``WitCert.Semantic.tv_two_sided_meter_sound``);
- retention ``TV <= 1/2 sum_t p_tilde_t min(A e^{c_t} - 1, max(e^{c_t}/A- - 1,
  1 - e^{-c_t}/A))`` (``WitCert.Semantic.tv_retention_meter_sound``);
- the meter ``min(1, e-form, two-sided)``;
- the comparison shape ``tanh(max_t c_t)`` (``WitCert.Semantic.softmax_tv_tanh_contract_sound``
  gives ``TV <= tanh(eps / 2) <= tanh(max c)``, ``eps = max_t abs(eps_t) <= max c``).

``A`` and ``A-`` are evaluated as ``log1p(sum p_tilde expm1(+-c))`` (accurate for
small ``c``) or by a log-sum-exp (large ``c``); an overflow reports saturation
with ``raw = inf``; ``c`` is never truncated. Each form is rounded outward by the rule of
:mod:`witcert_calculus.numerics.rounding` with :func:`witcert_calculus.numerics.rounding.tv_margin`.
The torch version (``witcert_kernels.meter.tv_bounds_batch``) evaluates the same
expressions and returns the same :class:`TVBatch` type.

Premises. ``c`` is either a :class:`~witcert_calculus.meters.witness.LogitBound` (from
:func:`witcert_calculus.meters.witness.logit_bound`, the Tier-B
:func:`witcert_calculus.meters.dither.tier_b_logit_bound`, or their torch twins), whose premise
``c_t >= |eps_t|`` holds by construction (on its event, with its assumptions, for Tier B), or
a plain array of the caller's, whose premise is the assumption
:data:`~witcert_calculus.meters.witness.CALLER_LOGIT_BOUND` (the reading is then at most
PARTIALLY_CERTIFIED). That ``p_tilde`` is a probability vector is computed. What each call
rests on is kept in a :class:`TVBasis`, which builds the evidence of a reading.

Main declarations:

- :class:`TVBound`: one query's bound (raw and reported) with its theorem.
- :class:`TVBatch`: every form for a batch of queries (numpy arrays or torch tensors).
- :class:`TVBasis`: what the bounds of one call rest on; :meth:`TVBasis.evidence`.
- :func:`tv_eform`, :func:`tv_two_sided`, :func:`tv_retention`, :func:`tv_meter`,
  :func:`tv_tanh_max`, :func:`tv_bounds_batch`
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Final, Generic, TypeVar, final

import numpy as np
from numpy.typing import ArrayLike

from witcert_calculus.contracts import Reading, _reading  # pyright: ignore[reportPrivateUsage]
from witcert_calculus.errors import ForgedBoundError, InvalidValueError
from witcert_calculus.metrics import AtConsume, AttentionTV
from witcert_calculus.numerics.rounding import outward, tanh_margin, tv_margin
from witcert_calculus.lean.theorems import (
    SOFTMAX_TV_TANH_CONTRACT_SOUND,
    TV_EFORM_METER_SOUND,
    TV_RETENTION_METER_SOUND,
    TV_SINGLE_TOKEN_METER,
    TV_TWO_SIDED_METER_SOUND,
)
from witcert_calculus.tiers import (
    Assumption,
    Composition,
    Evidence,
    Measurement,
    Proof,
    Restricted,
    Tier,
    _digest,  # pyright: ignore[reportPrivateUsage]
    _evidence_key,  # pyright: ignore[reportPrivateUsage]
    _premise,  # pyright: ignore[reportPrivateUsage]
    _proof,  # pyright: ignore[reportPrivateUsage]
    _sealed,  # pyright: ignore[reportPrivateUsage]
    assumptions_of,
    decide_tier,
    theorems_of,
)
from witcert_calculus.meters.witness import (
    CALLER_LOGIT_BOUND,
    ESTABLISHERS,
    LogitBound,
    is_established,
)
from witcert_calculus.numerics.validation import (
    F64,
    int_array,
    is_distribution,
    nonneg_array,
    weights_and_bounds,
)

__all__ = [
    "TVBasis",
    "TVBatch",
    "TVBound",
    "tv_bounds_batch",
    "tv_eform",
    "tv_meter",
    "tv_retention",
    "tv_tanh_max",
    "tv_two_sided",
]

ArrayT = TypeVar("ArrayT")


# --------------------------------------------------------------------------- log domain
# Batched cores over the last axis; the torch version mirrors each one line by line.

def _lse(logs: F64) -> F64:
    """log sum exp along the last axis; all -inf gives -inf, any +inf gives +inf."""
    m: F64 = logs.max(axis=-1)
    finite_m: F64 = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        body: F64 = finite_m + np.log(np.exp(logs - finite_m[..., None]).sum(axis=-1))
    out: F64 = np.where(np.isinf(m), m, body)
    return out


def _log_p(p: F64) -> F64:
    with np.errstate(divide="ignore"):
        out: F64 = np.where(p > 0, np.log(np.where(p > 0, p, 1.0)), -np.inf)
    return out


def _log_a_plus(p: F64, c: F64) -> F64:
    """log A = log sum p e^{c} along the last axis (p > 0 entries only)."""
    with np.errstate(over="ignore", invalid="ignore"):
        b: F64 = np.where(p > 0, p * np.expm1(c), 0.0).sum(axis=-1)
        small: F64 = np.log1p(b)
        ok = np.isfinite(b)
        if ok.all():
            return small
        logs: F64 = np.where(p > 0, _log_p(p) + c, -np.inf)
    out: F64 = np.where(ok, small, _lse(logs))
    return out


def _log_a_minus(p: F64, c: F64) -> F64:
    """log A- = log sum p e^{-c} along the last axis (p > 0 entries only)."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        b: F64 = np.where(p > 0, p * np.expm1(-c), 0.0).sum(axis=-1)
        small: F64 = np.log1p(b)
        ok = b > -0.5
        if ok.all():
            return small
        logs: F64 = np.where(p > 0, _log_p(p) - c, -np.inf)
    out: F64 = np.where(ok, small, _lse(logs))
    return out


def _eform_raw(log_a: F64) -> F64:
    with np.errstate(over="ignore"):
        b = np.expm1(log_a)
        out: F64 = 0.5 * b * (b + 2.0)
    return out


def _two_sided_raw(log_a: F64, log_am: F64) -> F64:
    with np.errstate(over="ignore", invalid="ignore"):
        out: F64 = np.sinh(log_a - log_am)
    return out


def _retention_raw(p: F64, c: F64, log_a: F64, log_am: F64) -> F64:
    la = log_a[..., None]
    lm = log_am[..., None]
    with np.errstate(over="ignore", invalid="ignore"):
        one_sided = np.expm1(la + c)
        up = np.expm1(c - lm)
        down = -np.expm1(-c - la)
        per = np.minimum(one_sided, np.maximum(up, down))
        out: F64 = 0.5 * np.where(p > 0, p * per, 0.0).sum(axis=-1)
    return out


def _forms(p: F64, c: F64, *, retention: bool = True) -> tuple[F64, F64, F64, F64, F64]:
    """log A, log A-, and the outward-rounded e-form, two-sided and retention bounds."""
    la = _log_a_plus(p, c)
    lm = _log_a_minus(p, c)
    margin = tv_margin(p.shape[-1])
    cmax: F64 = np.where(np.isfinite(c), c, 0.0).max(axis=-1)
    with np.errstate(over="ignore", invalid="ignore"):
        gamma = margin.gamma * (1.0 + (np.abs(la) + np.abs(lm) + cmax))
    # c = 0 everywhere gives A = A- = 1 exactly and the exact bound 0.
    exact = cmax == 0
    e = outward(_eform_raw(la), gamma=gamma, alpha=margin.alpha, exact=exact)
    t = outward(_two_sided_raw(la, lm), gamma=gamma, alpha=margin.alpha, exact=exact)
    if not retention:
        return la, lm, e, t, e
    # retention <= e-form holds exactly; each is rounded outward on its own, so keep
    # the smaller of two sound bounds
    r = np.minimum(outward(_retention_raw(p, c, la, lm), gamma=gamma, alpha=margin.alpha,
                           exact=exact), e)
    return la, lm, e, t, r


def _tanh_max_arg(c: F64) -> F64:
    """The argument of the comparison shape's ``tanh``: ``max_t c_t`` along the last axis, at
    least the proved ``sharpLinfArg (max c) = max c / 2`` (the generated Lean checks)."""
    out: F64 = c.max(axis=-1)
    return out


def _tanh_max(c: F64) -> F64:
    """tanh(max_t c_t) along the last axis, rounded outward (1 and 0 are exact)."""
    t: F64 = np.tanh(_tanh_max_arg(c))
    margin = tanh_margin()
    return outward(t, gamma=margin.gamma, alpha=margin.alpha, exact=(t == 0) | (t >= 1.0))


# --------------------------------------------------------------------------- basis

@final
@dataclass(frozen=True, slots=True, eq=False)
class TVBasis:
    """What the TV bounds of one call rest on, fixed when they were issued.

    Built by the TV functions (numpy and torch) from their arguments; it turns into the
    evidence of a reading with :meth:`evidence`.

    Attributes:
        checks: the premises computed from the arguments, as ``(statement, truth)`` pairs,
            the logit bound's premise first. A truth is a ``bool``, or a 0-d boolean torch
            tensor when the torch version ran with ``check=False`` (it is read, once, when
            the evidence is built, so the hot loop never waits on the device).
        logit: the evidence of the :class:`~witcert_calculus.meters.witness.LogitBound` ``c`` was,
            or ``None`` when ``c`` was the caller's own array (then its premise is the
            assumption :data:`~witcert_calculus.meters.witness.CALLER_LOGIT_BOUND`).
        delta: the failure probability of ``c`` (0 for Tier A; for Tier B, per query row).
        also: theorems every reading of these bounds also cites (e.g.
            ``WitCert.Meters.tv_single_token`` where rows with one visible token report 0).
    """

    checks: tuple[tuple[str, object], ...]
    logit: Evidence | None
    delta: Fraction
    also: tuple[str, ...] = ()
    seal: bytes = field(default=b"", repr=False)

    def __post_init__(self) -> None:
        _sealed("TVBasis", self, self.seal,
                _basis_content(self.checks, self.logit, self.delta, self.also),
                "a basis is issued by the TV function (or kernel) that computed its checks")

    def __reduce__(self) -> tuple[Any, ...]:
        return (TVBasis, (self.checks, self.logit, self.delta, self.also, self.seal))

    def __copy__(self) -> TVBasis:
        return self

    def __deepcopy__(self, memo: dict[int, object]) -> TVBasis:
        return self

    @property
    def assumptions(self) -> tuple[Assumption, ...]:
        """What the bounds assume and no code checks (none for a Tier-A ``LogitBound``)."""
        if self.logit is None:
            return (CALLER_LOGIT_BOUND,)
        return assumptions_of(self.logit)

    def evidence(self, theorem: str, *more: str) -> Evidence:
        """The evidence of a reading of these bounds, citing the form's theorem(s).

        One theorem for a single form (``TV_EFORM_METER_SOUND``, ...); several for a minimum of
        sound forms (the meter ``min(e-form, two-sided)`` over many cells cites both).

        Returns:
            For a Tier-A ``LogitBound``: a :class:`~witcert_calculus.tiers.Proof` (a
            :class:`~witcert_calculus.tiers.Composition` of one per theorem) whose premises
            are :attr:`checks`: CERTIFIED below saturation. For a Tier-B (or otherwise
            restricted) one: its evidence composed with those proofs, restricted to its
            subset. For the caller's array: each proof restricted by
            :data:`~witcert_calculus.meters.witness.CALLER_LOGIT_BOUND`.

        Raises:
            PremiseError: if a computed check does not hold (e.g. an unchecked ``p_tilde``
                that was not a probability vector).
            UnknownTheoremError: if a theorem is not exported.

        Example:
            >>> b = tv_eform(np.array([0.5, 0.5]), np.array([0.1, 0.1]))
            >>> [a.statement[:14] for a in b.basis.assumptions]
            ['c_t >= |eps_t|']
        """
        premises = tuple(_premise(statement, bool(truth)) for statement, truth in self.checks)
        proofs = tuple(_proof(t, premises) for t in (theorem, *more, *self.also))
        parts: tuple[Proof | Restricted | Composition, ...]
        restriction: str | None = None
        if self.logit is None:
            parts = tuple(Restricted(p, assumptions=(CALLER_LOGIT_BOUND,)) for p in proofs)
        elif self.delta == 0 and decide_tier(self.logit) is Tier.CERTIFIED:
            parts = proofs
        else:
            parts = (*_flat(self.logit), *proofs)
            restriction = "; ".join(_subsets(self.logit)) or None
        if len(parts) == 1:
            return parts[0]
        return Composition(parts, theorem=theorem, restriction=restriction)


def _basis_content(checks: tuple[tuple[str, object], ...], logit: Evidence | None,
                   delta: Fraction, also: tuple[str, ...]) -> tuple[object, ...]:
    # A truth computed later on the device (a 0-d tensor) is sealed as that object.
    truths: list[tuple[str, object]] = []
    for statement, truth in checks:
        known: Any = truth
        settled = isinstance(truth, (bool, np.bool_))
        truths.append((statement, bool(known) if settled else ("deferred", id(truth))))
    return (tuple(truths), None if logit is None else _evidence_key(logit), delta, also)


def _issue_basis(checks: tuple[tuple[str, object], ...], logit: Evidence | None,
                 delta: Fraction, also: tuple[str, ...] = ()) -> TVBasis:
    """Issue the basis of TV bounds whose checks the calling code computed."""
    return TVBasis(checks, logit, delta, also,
                   _digest("TVBasis", *_basis_content(checks, logit, delta, also)))


def _flat(e: Evidence) -> tuple[Proof | Restricted | Composition, ...]:
    """The parts of a composition that cites nothing beyond them, else the evidence itself."""
    items = e.parts if isinstance(e, Composition) and e.restriction is None and \
        e.theorem in {t for part in e.parts for t in theorems_of(part)} else (e,)
    out: list[Proof | Restricted | Composition] = []
    for part in items:
        if isinstance(part, Measurement):
            raise InvalidValueError("evidence", part, "a logit bound is proved, never measured")
        out.append(part)
    return tuple(out)


def _subsets(e: Evidence) -> tuple[str, ...]:
    """The subsets of every restricted proof inside ``e``, in order, without repeats."""
    out: list[str] = []

    def walk(x: Evidence) -> None:
        if isinstance(x, Restricted):
            out.append(x.subset)
        elif isinstance(x, Composition):
            for p in x.parts:
                walk(p)

    walk(e)
    return tuple(dict.fromkeys(out))


def _basis(c: object, checks: tuple[tuple[str, object], ...],
           also: tuple[str, ...] = ()) -> TVBasis:
    """The basis of bounds computed from ``c`` (a LogitBound or the caller's array)."""
    if not isinstance(c, LogitBound):
        return _issue_basis(checks, None, Fraction(0), also)
    bound: LogitBound[Any] = c  # pyright: ignore[reportUnknownVariableType]
    established = is_established(bound)
    if not established:
        raise ForgedBoundError("LogitBound", ESTABLISHERS)
    event = "" if bound.delta == 0 else \
        f" except with probability {float(bound.delta)!r} per query row"
    premise = (f"c_t >= |eps_t| for every token t{event}: by construction, a LogitBound "
               f"established by {bound.source} ({', '.join(theorems_of(bound.evidence))})",
               established)
    return _issue_basis((premise, *bound.checks, *checks), bound.evidence, bound.delta, also)


def _values(c: LogitBound[Any] | ArrayLike) -> ArrayLike:
    if isinstance(c, LogitBound):
        if not is_established(c):
            raise ForgedBoundError("LogitBound", ESTABLISHERS)
        bound: LogitBound[Any] = c  # pyright: ignore[reportUnknownVariableType]
        return np.asarray(bound.values, dtype=np.float64)
    return c


#: The computed premise of reporting 0 on rows with one visible token.
SINGLE_TOKEN_PREMISE: Final = ("every row with one visible token has at most one nonzero "
                               "p_tilde entry")


def _checks(p: F64 | None, c: F64) -> tuple[tuple[str, object], ...]:
    out: list[tuple[str, object]] = []
    if p is not None:
        out.append(("p_tilde is a probability vector (finite, nonnegative, summing to 1 "
                    "within 1e-6; renormalized)", is_distribution(p)))
    out.append(("c_t >= 0 for every token t (inf allowed)", bool((c >= 0).all())))
    return tuple(out)


# --------------------------------------------------------------------------- values

@final
@dataclass(frozen=True, slots=True)
class TVBound:
    """A total-variation bound for one query.

    Attributes:
        raw: the unclamped bound (a risk score; ``inf`` after an overflow).
        value: the reported bound ``min(1, raw)``.
        theorem: the Lean theorem that proves it.
        form: which formula produced it (``"eform"``, ``"two_sided"``, ...).
        basis: what it rests on (how ``c`` was obtained, the checks on the arguments).
    """

    raw: float
    value: float
    theorem: str
    form: str
    basis: TVBasis = field(compare=False, repr=False)
    seal: bytes = field(default=b"", compare=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.basis, TVBasis):
            raise InvalidValueError("basis", self.basis, "must be a TVBasis")
        _sealed("TVBound", self, self.seal, (self.raw, self.value, self.theorem, self.form,
                                             self.basis.seal),
                "a TV bound is issued by the TV function that computed it")

    def __reduce__(self) -> tuple[Any, ...]:
        return (TVBound, (self.raw, self.value, self.theorem, self.form, self.basis,
                          self.seal))

    @property
    def saturated(self) -> bool:
        """True when the bound says nothing (``raw >= 1``)."""
        return self.raw >= 1.0

    @property
    def assumptions(self) -> tuple[Assumption, ...]:
        """What the bound assumes and no code checks (see :attr:`TVBasis.assumptions`)."""
        return self.basis.assumptions

    def reading(self) -> Reading[AttentionTV[AtConsume]]:
        """This bound as a typed reading of ``AttentionTV[AtConsume]``.

        The tier is decided by the machine from :attr:`basis`: SATURATED at or above 1;
        below, CERTIFIED for a Tier-A :class:`~witcert_calculus.meters.witness.LogitBound`,
        PARTIALLY_CERTIFIED for a Tier-B one (``delta`` carried) or the caller's array.

        Example:
            >>> from witcert_calculus.meters.witness import RopeLayout, logit_bound
            >>> p = np.array([0.5, 0.5])
            >>> tv_eform(p, np.array([0.01, 0.02])).reading().tier.name
            'PARTIALLY_CERTIFIED'
            >>> c = logit_bound(np.array([1.0, 0.0]), np.array([[0.01], [0.02]]),
            ...                 layout=RopeLayout.INTERLEAVED, scale=1.0)
            >>> tv_eform(p, c).reading().tier.name
            'CERTIFIED'
        """
        return _reading(AttentionTV[AtConsume], self.raw,
                        evidence=self.basis.evidence(self.theorem), delta=self.basis.delta)


def _tv(raw: float, theorem: str, form: str, basis: TVBasis) -> TVBound:
    value = min(1.0, raw)
    return TVBound(raw, value, theorem, form, basis,
                   _digest("TVBound", raw, value, theorem, form, basis.seal))


@final
@dataclass(frozen=True, slots=True, eq=False)
class TVBatch(Generic[ArrayT]):
    """Raw TV bounds of many queries at once, one entry per query.

    The numpy :func:`tv_bounds_batch` fills it with float64 arrays of shape ``(N,)``;
    the torch version with float64 tensors of the batch's leading shape.

    Attributes:
        eform: ``(A^2 - 1) / 2``.
        two_sided: ``(A/A- - A-/A) / 2``.
        retention: the per-token retention form.
        meter: ``min(eform, two_sided)`` (report ``min(1, meter)``).
        tanh_max: ``tanh(max_t c_t)``.
        log_a: ``log A``; ``log_a_minus``: ``log A-``.
        basis: what every bound of the batch rests on; a reading of any of them takes its
            evidence from ``basis.evidence(theorem)``.
    """

    eform: ArrayT
    two_sided: ArrayT
    retention: ArrayT
    meter: ArrayT
    tanh_max: ArrayT
    log_a: ArrayT
    log_a_minus: ArrayT
    basis: TVBasis


def tv_bounds_batch(p_tilde: ArrayLike, c: LogitBound[Any] | ArrayLike, *,
                    visible: ArrayLike | None = None) -> TVBatch[F64]:
    """All TV bounds for a batch of queries, vectorized.

    Args:
        p_tilde: compressed attention, shape ``(N, S)``; rows sum to 1 (within 1e-6,
            renormalized).
        c: per-token logit error bounds ``>= 0`` (``inf`` allowed), shape ``(N, S)``: a
            :class:`~witcert_calculus.meters.witness.LogitBound` or the caller's own array.
        visible: tokens each row attends to, shape ``(N,)`` (``None``: not known). A row
            with one visible token has TV exactly 0 whatever its logit errors (softmax over
            one token is 1; Lean ``WitCert.Meters.tv_single_token``): every form reports 0
            there, and the readings cite that theorem too. Its premise, computed: such a
            row's ``p_tilde`` has at most one nonzero entry.

    Returns:
        A :class:`TVBatch` of raw bounds and their :class:`TVBasis`.

    Raises:
        ForgedBoundError: on a ``LogitBound`` that no establishing function produced.
        InvalidValueError: on NaN, negative ``c``, mismatched shapes, rows not summing to 1,
            or a ``visible`` count that is not an integer in ``[1, S]``.

    Example:
        >>> b = tv_bounds_batch(np.full((2, 4), 0.25), np.zeros((2, 4)))
        >>> b.meter.tolist()
        [0.0, 0.0]
    """
    p, cc = weights_and_bounds(p_tilde, _values(c), ndim=2)
    la, lm, e, t, r = _forms(p, cc)
    th = _tanh_max(cc)
    checks = _checks(p, cc)
    also: tuple[str, ...] = ()
    if visible is not None:
        v = int_array("visible", visible)
        if v.shape != (p.shape[0],):
            raise InvalidValueError("visible", f"array of shape {v.shape}",
                                    f"must have one entry per row ({p.shape[0]})")
        bad = (v < 1) | (v > p.shape[1])
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise InvalidValueError(f"visible[{i}]", int(v[i]),
                                    f"must lie in [1, S={p.shape[1]}] (a row attends to at "
                                    "least one of its S tokens)")
        one = v == 1
        e, t, r, th = (np.where(one, 0.0, x) for x in (e, t, r, th))
        checks = (*checks, (SINGLE_TOKEN_PREMISE, bool((~one | ((p > 0).sum(axis=-1) <= 1)).all())))
        also = (TV_SINGLE_TOKEN_METER,)
    return TVBatch(eform=e, two_sided=t, retention=r, meter=np.minimum(e, t),
                   tanh_max=th, log_a=la, log_a_minus=lm,
                   basis=_basis(c, checks, also))


def tv_eform(p_tilde: ArrayLike, c: LogitBound[Any] | ArrayLike) -> TVBound:
    """e-form bound ``TV <= (A^2 - 1) / 2`` with ``A = sum_t p_tilde_t e^{c_t}``.

    Lean: ``WitCert.Semantic.tv_eform_meter_sound`` (from ``WitCert.Meters.tv_eform_sound``).

    Args:
        p_tilde: compressed attention over ``S`` tokens, shape ``(S,)``.
        c: per-token bounds ``c_t >= |eps_t|``, shape ``(S,)``; ``inf`` allowed: a
            :class:`~witcert_calculus.meters.witness.LogitBound` (the premise holds by
            construction) or the caller's own array (the premise is then assumed).

    Returns:
        A :class:`TVBound` (``raw`` may be ``inf``; ``value = min(1, raw)``).

    Raises:
        ForgedBoundError: on a ``LogitBound`` that no establishing function produced.
        InvalidValueError: on NaN, negative ``c``, shape mismatch, ``sum(p_tilde) != 1``.

    Example:
        >>> round(tv_eform(np.array([0.5, 0.5]), np.array([0.1, 0.1])).raw, 6)
        0.110701
    """
    p, cc = weights_and_bounds(p_tilde, _values(c), ndim=1)
    return _tv(float(_forms(p, cc, retention=False)[2]), TV_EFORM_METER_SOUND, "eform",
               _basis(c, _checks(p, cc)))


def tv_two_sided(p_tilde: ArrayLike, c: LogitBound[Any] | ArrayLike) -> TVBound:
    """Two-sided bound ``TV <= (A/A- - A-/A) / 2 = sinh(log A - log A-)``.

    Lean: ``WitCert.Semantic.tv_two_sided_meter_sound`` (from ``WitCert.Meters.tv_two_sided_sound``). Arguments, returns and raises as
    :func:`tv_eform`.

    Example:
        >>> round(tv_two_sided(np.array([0.99, 0.01]), np.array([0.0, 4.0])).raw, 6)
        0.453276
    """
    p, cc = weights_and_bounds(p_tilde, _values(c), ndim=1)
    return _tv(float(_forms(p, cc, retention=False)[3]), TV_TWO_SIDED_METER_SOUND, "two_sided",
               _basis(c, _checks(p, cc)))


def tv_retention(p_tilde: ArrayLike, c: LogitBound[Any] | ArrayLike) -> TVBound:
    """Per-token retention bound (never above the e-form).

    ``TV <= 1/2 sum_t p_tilde_t min(A e^{c_t} - 1, max(e^{c_t}/A- - 1, 1 - e^{-c_t}/A))``.
    Lean: ``WitCert.Semantic.tv_retention_meter_sound`` (from ``WitCert.Meters.tv_retention_sound``). Arguments, returns and raises as
    :func:`tv_eform`.

    Example:
        >>> p, c = np.array([0.5, 0.5]), np.array([0.1, 0.1])
        >>> tv_retention(p, c).raw <= tv_eform(p, c).raw
        True
    """
    p, cc = weights_and_bounds(p_tilde, _values(c), ndim=1)
    return _tv(float(_forms(p, cc)[4]), TV_RETENTION_METER_SOUND, "retention", _basis(c, _checks(p, cc)))


def tv_meter(p_tilde: ArrayLike, c: LogitBound[Any] | ArrayLike) -> TVBound:
    """The WitCert meter ``min(1, e-form, two-sided)``.

    The returned bound names the theorem of the form that attains the minimum.
    Arguments, returns and raises as :func:`tv_eform`.

    Example:
        >>> m = tv_meter(np.array([0.99, 0.01]), np.array([0.0, 4.0]))
        >>> (round(m.raw, 6), m.form)
        (0.453276, 'two_sided')
    """
    p, cc = weights_and_bounds(p_tilde, _values(c), ndim=1)
    _, _, ea, ta, _ = _forms(p, cc, retention=False)
    e, t = float(ea), float(ta)
    basis = _basis(c, _checks(p, cc))
    if t < e:
        return _tv(t, TV_TWO_SIDED_METER_SOUND, "two_sided", basis)
    return _tv(e, TV_EFORM_METER_SOUND, "eform", basis)


def tv_tanh_max(c: LogitBound[Any] | ArrayLike) -> TVBound:
    """Deterministic comparison shape ``TV <= tanh(max_t c_t)``.

    Sound because the oscillation of the logit error is at most ``2 max c`` and
    ``TV <= tanh(osc / 4)`` (Lean ``WitCert.Analytic.softmax_tv_tanh_sound``);
    it ignores ``p_tilde`` and is kept as a comparison for the meter.

    Args:
        c: per-token bounds ``c_t >= |eps_t|``, shape ``(S,)``; ``inf`` allowed (a
            :class:`~witcert_calculus.meters.witness.LogitBound` or the caller's own array).

    Returns:
        A :class:`TVBound`.

    Raises:
        ForgedBoundError: on a ``LogitBound`` that no establishing function produced.
        InvalidValueError: on NaN, negative or empty ``c``.

    Example:
        >>> round(tv_tanh_max(np.array([0.1, 0.3])).raw, 6)
        0.291313
    """
    cc = nonneg_array("c", _values(c), ndim=1, allow_inf=True)
    if cc.size == 0:
        raise InvalidValueError("c", "empty array", "must hold at least one token")
    return _tv(float(_tanh_max(cc)), SOFTMAX_TV_TANH_CONTRACT_SOUND, "tanh_max", _basis(c, _checks(None, cc)))
