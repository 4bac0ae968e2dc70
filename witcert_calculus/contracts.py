"""Contracts ``e_out <= a * e_in + b`` (except with probability delta), typed by metric.

A :class:`Contract` ``[In, Out]`` promises that whenever the error entering a
stage, measured in metric ``In``, is ``e_in``, the error leaving it, measured in
metric ``Out``, is at most ``a * e_in + b``, except with probability ``delta``.
It may also carry a tighter monotone non-affine *transfer* (e.g. the softmax
bridge ``TV <= (exp(2 eps) - 1) / 2``); its bound is then the smaller of the two.
Coefficients are exact :class:`fractions.Fraction` values; numbers that leave the
library are rounded upward, so a reported bound is never below the exact one.

Series composition (Lean: ``WitCert.Semantic.Contract.comp_sound``, ``WitCert.Contract.comp_sound``, ``comp_a``, ``comp_b``,
``comp_delta``, ``comp_tier``, ``comp_domain_sound``, ``comp_assoc``, ``id_comp``,
``comp_id``): for ``c1 : In -> Mid`` and ``c2 : Mid -> Out`` with ``a2 >= 0``,

    e_mid <= a1 e_in + b1  and  e_out <= a2 e_mid + b2
    ==>  e_out <= (a2 a1) e_in + (a2 b1 + b2),

deltas add (union bound), the tier is the weakest of the stages' tiers, and the
domain is propagated: when stage 1 can leave stage 2's domain ``e_mid <= cap2``,
the composite holds only on ``e_in <= (cap2 - b1) / a1`` and is partially
certified there. Non-affine transfers compose as functions (each is monotone
nondecreasing, so applying stage bounds in turn is sound).

Written ``c2 @ c1`` (mathematical order), ``c1 >> c2`` or ``c1.then(c2)``
(pipeline order), or ``chain(c1, c2, ...)``. A metric mismatch is a static
error for mypy and pyright (metric parameters are invariant) and raises
:class:`MetricMismatchError` at run time.

Main declarations:

- :class:`Contract`, :func:`chain`, :func:`identity`
- :class:`Reading`, :class:`Regime`
- :class:`Transfer`, :class:`TransferKind`
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Final, Generic, NoReturn, TypeVar, cast, final, overload

from witcert_calculus.errors import (
    EvidenceMismatchError,
    InvalidValueError,
    MetricMismatchError,
    OutOfDomainError,
    RegimeMismatchError,
)
from witcert_calculus.lean.modelling import ModellingStep, modelling_of
from witcert_calculus.lean.theorems import ADD_SOUND, ID_SOUND, lookup
from witcert_calculus.metrics import Metric, check_value, metric_info, metric_name, same_metric
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
from witcert_calculus.numerics.validation import exact, float_up, number, real

__all__ = [
    "Contract",
    "Number",
    "Reading",
    "Regime",
    "Stage",
    "Transfer",
    "TransferKind",
    "chain",
    "identity",
]

Number = int | float | Fraction

In = TypeVar("In", bound=Metric[Any])
Out = TypeVar("Out", bound=Metric[Any])
X = TypeVar("X", bound=Metric[Any])
M = TypeVar("M", bound=Metric[Any])



@final
class TransferKind(enum.Enum):
    """The monotone nondecreasing non-affine functions a bridge may use."""

    EXP_TV = "(exp(2x) - 1) / 2"
    """Softmax bridge from logit sup-norm error to total variation."""
    TANH = "tanh(k x)"
    """Sharp softmax bridge ``tanh(osc / 4)`` (k = 1/4) or ``tanh(eps / 2)`` (k = 1/2)."""
    POLY = "c_0 + c_1 x + c_2 x^2 + ..."
    """A polynomial with nonnegative coefficients (a local bound through a transformer layer,
    :mod:`witcert_calculus.meters.depth`); evaluated exactly, then rounded upward."""


@final
@dataclass(frozen=True, slots=True)
class Transfer:
    """A monotone nondecreasing function of the input error, evaluated rounding upward.

    Attributes:
        kind: which function.
        k: its scale parameter (used by ``TANH``), exact and > 0.
        coeffs: the coefficients ``(c_0, c_1, ...)`` of ``POLY``, exact and >= 0 (nonempty
            for ``POLY``, empty for the other kinds).
    """

    kind: TransferKind
    k: Fraction = Fraction(1)
    coeffs: tuple[Fraction, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.kind, TransferKind):
            raise InvalidValueError("kind", self.kind, "must be a TransferKind")
        object.__setattr__(self, "k", exact(self.k, "k"))
        if self.k == 0:
            raise InvalidValueError("k", self.k, "must be > 0")
        if not isinstance(self.coeffs, tuple):
            raise InvalidValueError("coeffs", self.coeffs, "must be a tuple")
        coeffs = tuple(exact(c, "coeffs") for c in self.coeffs)
        object.__setattr__(self, "coeffs", coeffs)
        if (self.kind is TransferKind.POLY) != bool(coeffs):
            raise InvalidValueError("coeffs", coeffs, "are given for POLY, and only for it")
        if any(c < 0 for c in coeffs):
            raise InvalidValueError("coeffs", coeffs, "must be >= 0 (a monotone polynomial)")

    def formula(self) -> str:
        """The function as text, with its parameter."""
        if self.kind is TransferKind.TANH:
            return f"tanh({self.k} * x)"
        if self.kind is TransferKind.POLY:
            return " + ".join(f"{float(c):.6g}" + ("" if i == 0 else " x" if i == 1 else f" x^{i}")
                              for i, c in enumerate(self.coeffs))
        return str(self.kind.value)

    def __call__(self, x: float) -> float:
        """Evaluate at ``x >= 0`` with 50 digits, rounded up to a float (inf on overflow).

        Raises:
            InvalidValueError: if ``x`` is not a real number, is NaN or is negative.
        """
        x = real("x", x, lo=0.0, allow_inf=True)
        if self.kind is TransferKind.POLY:
            if math.isinf(x):
                return math.inf if any(self.coeffs[1:]) else float_up(self.coeffs[0])
            xf = Fraction(x)
            return float_up(sum((c * xf ** i for i, c in enumerate(self.coeffs)), Fraction(0)))
        mp = _mpmath()
        with mp.workdps(50):
            xv = mp.mpf(x)
            if self.kind is TransferKind.EXP_TV:
                if 2 * xv > 700:
                    return math.inf
                val = (mp.exp(2 * xv) - 1) / 2
            else:
                val = mp.tanh(mp.mpf(self.k.numerator) / self.k.denominator * xv)
            return math.nextafter(float(val), math.inf)


def _mpmath() -> Any:
    import mpmath  # heavy; imported where the 50-digit evaluation needs it

    return mpmath


@final
class Regime(enum.Enum):
    """What kind of number a reading is; readings of different regimes never mix."""

    BOUND = "upper bound"
    """An upper bound on the error (from a contract or a meter)."""
    MEASURED = "measured value"
    """An observed error, not a bound."""
    MEAN = "mean"
    """An average of numbers (e.g. of coefficients); never a bound."""


@final
@dataclass(frozen=True, slots=True)
class Stage:
    """One elementary contract inside a (possibly composed) contract (:attr:`Contract.parts`).

    Attributes:
        name: the stage's name.
        m_in / m_out: its input and output metrics.
        a / b / delta: its coefficients, exact.
        cap: its domain's upper end (``None``: unbounded).
        transfer: its tighter non-affine bound, if any.
        evidence: what proves (or measured) it.
        is_identity: whether it is the identity's unit stage (dropped by composition).
    """

    name: str
    m_in: object
    m_out: object
    a: Fraction
    b: Fraction
    delta: Fraction
    cap: Fraction | None
    transfer: Transfer | None
    evidence: Evidence
    is_identity: bool = False

    def best(self, x: float, *, saturation: float | None = None) -> float:
        """The tightest bound this stage gives at input ``x`` (rounded up).

        With ``saturation`` (the last stage of a contract), an affine part at or above the
        output metric's saturation says nothing, and the transfer's value is kept as the
        raw risk score (the reported value is clamped to the saturation either way).
        """
        if self.a == 0:
            affine = float_up(self.b)
        else:
            affine = float_up(self.a * Fraction(x) + self.b) if math.isfinite(x) else math.inf
        if self.transfer is None:
            return affine
        return _risk(affine, self.transfer(x), saturation)

    @property
    def tier(self) -> Tier:
        """The stage's own tier (PARTIALLY_CERTIFIED when proved on a bounded domain only)."""
        return _capped_tier(self.evidence, self.cap)

    @property
    def constant(self) -> bool:
        """Whether the output bound is the same for every input (``a = 0``, no transfer)."""
        return self.a == 0 and self.transfer is None


def _risk(affine: float, other: float, saturation: float | None) -> float:
    # min(affine, other), except that an affine bound at or above the saturation is no
    # information: then ``other`` is the risk score, and min(raw, saturation) the value.
    if saturation is not None and affine >= saturation:
        return other
    return min(affine, other)


@final
class Contract(Generic[In, Out]):
    """``e_out <= a * e_in + b`` except with probability ``delta``, on ``e_in <= cap``.

    Args:
        m_in: the input metric with its site, e.g. ``KeyResidualAbs[AtConsume]``.
        m_out: the output metric with its site.
        a: slope, finite and >= 0 (int, float or Fraction; stored exactly).
        b: offset, finite and >= 0.
        evidence: what proves (or measured) it; the tier is decided from it.
        name: a short stage name used in messages and :meth:`explain`.
        delta: failure probability, in [0, 1).
        cap: upper end of the domain of validity ``e_in <= cap`` (None: unbounded).
        transfer: an optional tighter monotone non-affine bound.

    Raises:
        InvalidValueError: on NaN, inf, negative coefficients, delta outside [0, 1), or
            composite evidence.
        EvidenceMismatchError: on a proof issued for another claim.
        NotAMetricError: if a metric lacks its site or is not a metric.
        UnregisteredMetricError: if a metric class was never registered.

    Example:
        >>> from witcert_calculus import AtConsume, KeyResidualAbs, LogitLinf, Measurement
        >>> c = Contract(KeyResidualAbs[AtConsume], LogitLinf[AtConsume], a=0.5, b=0,
        ...              evidence=Measurement("ratio on a calibration set", samples=64),
        ...              name="measured score")
        >>> c.bound(0.2).value, c.tier.name
        (0.1, 'EMPIRICAL')

    A contract backed by a proof comes from the function that checked it (a bridge such
    as :func:`~witcert_calculus.bridges.score_bridge`, or :func:`declare` for a theorem of
    your own): a :class:`~witcert_calculus.tiers.Proof` certifies only the claim it was
    issued for, and one attached to other metrics, coefficients, delta, domain or
    transfer is refused with :class:`~witcert_calculus.errors.EvidenceMismatchError`.
    """

    __slots__ = ("_stages", "a", "b", "cap", "delta", "evidence", "m_in", "m_out", "name")

    m_in: type[In]
    m_out: type[Out]
    a: Fraction
    b: Fraction
    delta: Fraction
    cap: Fraction | None
    evidence: Evidence
    name: str
    _stages: tuple[Stage, ...]

    def __init__(self, m_in: type[In], m_out: type[Out], *, a: Number, b: Number,
                 evidence: Evidence, name: str, delta: Number = 0,
                 cap: Number | None = None, transfer: Transfer | None = None) -> None:
        metric_info(m_in)
        metric_info(m_out)
        if not isinstance(name, str) or not name.strip():
            raise InvalidValueError("name", name, "must be a non-empty string")
        if isinstance(evidence, Composition):
            raise InvalidValueError("evidence", evidence, "a composite contract is made by "
                                    "composing contracts (>>, @, chain), not by hand")
        if not isinstance(evidence, (Proof, Restricted, Measurement)):
            raise InvalidValueError("evidence", evidence, "must be Proof, Restricted or Measurement")
        if transfer is not None and not isinstance(transfer, Transfer):
            raise InvalidValueError("transfer", transfer, "must be a Transfer or None")
        stage = Stage(
            name=name, m_in=m_in, m_out=m_out, a=exact(a, "a"), b=exact(b, "b"),
            delta=exact(delta, "delta", upper=Fraction(1), strict_upper=True),
            cap=None if cap is None else exact(cap, "cap"), transfer=transfer, evidence=evidence,
        )
        if not isinstance(evidence, Measurement):
            _check_claim(evidence.proof if isinstance(evidence, Restricted) else evidence,
                         _claim(m_in, m_out, stage.a, stage.b, stage.delta, stage.cap, transfer))
        self._set(m_in, m_out, (stage,), stage.a, stage.b, stage.delta, stage.cap, evidence, name)

    def _set(self, m_in: object, m_out: object, stages: tuple[Stage, ...], a: Fraction,
             b: Fraction, delta: Fraction, cap: Fraction | None, evidence: Evidence,
             name: str) -> None:
        for key, value in (("m_in", m_in), ("m_out", m_out), ("_stages", stages), ("a", a),
                           ("b", b), ("delta", delta), ("cap", cap), ("evidence", evidence),
                           ("name", name)):
            object.__setattr__(self, key, value)

    @classmethod
    def _composite(cls, m_in: object, m_out: object, stages: tuple[Stage, ...], a: Fraction,
                   b: Fraction, delta: Fraction, cap: Fraction | None, evidence: Evidence,
                   name: str) -> Contract[Any, Any]:
        obj: Contract[Any, Any] = object.__new__(cls)
        obj._set(m_in, m_out, stages, a, b, delta, cap, evidence, name)
        return obj

    def __setattr__(self, key: str, value: object) -> None:
        raise AttributeError(f"Contract is frozen; cannot set {key!r}")

    def __delattr__(self, key: str) -> None:
        raise AttributeError(f"Contract is frozen; cannot delete {key!r}")

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt stage by stage through the constructor, so a pickle whose coefficients or
        # evidence were edited is checked like a contract built anew.
        return (_restore, (self._stages,))

    def _key(self) -> tuple[object, ...]:
        return (self.m_in, self.m_out, self._stages, self.a, self.b, self.delta, self.cap,
                self.evidence)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Contract):
            return NotImplemented
        return self._key() == other._key()  # pyright: ignore[reportUnknownMemberType]

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        cap = "" if self.cap is None else f", cap={self.cap}"
        return (f"Contract[{metric_name(self.m_in)} -> {metric_name(self.m_out)}]"
                f"(name={self.name!r}, a={self.a}, b={self.b}, delta={self.delta}{cap}, "
                f"tier={self.tier.name})")

    @property
    def tier(self) -> Tier:
        """The contract's tier: weakest of its stages, PARTIALLY_CERTIFIED on a bounded domain."""
        return _capped_tier(self.evidence, self.cap)

    @property
    def subset(self) -> str | None:
        """The decidable subset on which the contract holds, when it is restricted."""
        if self.cap is None:
            return None
        return f"e_in <= {_fmt(self.cap)} (exactly {self.cap})"

    @property
    def stages(self) -> tuple[str, ...]:
        """Names of the elementary stages, in pipeline order."""
        return tuple(s.name for s in self._stages)

    @property
    def parts(self) -> tuple[Stage, ...]:
        """The elementary stages themselves, in pipeline order."""
        return self._stages

    @property
    def theorems(self) -> tuple[str, ...]:
        """Every Lean theorem this contract's evidence cites."""
        return theorems_of(self.evidence)

    @property
    def assumptions(self) -> tuple[Assumption, ...]:
        """Every assumption this contract's evidence rests on (none: nothing is assumed)."""
        return assumptions_of(self.evidence)

    @property
    def modelling(self) -> tuple[ModellingStep, ...]:
        """The modelling steps between the cited theorems and this computation
        (:mod:`witcert_calculus.lean.modelling`): each proved, checked by code, or assumed."""
        return modelling_of(self.evidence)

    def then(self, other: Contract[Out, X]) -> Contract[In, X]:
        """Pipeline-order composition: ``self`` first, then ``other``.

        Coefficients ``(a2*a1, a2*b1 + b2)``, deltas add, tier is the weakest,
        domain propagated (see the module docstring).

        Raises:
            MetricMismatchError: if ``self`` does not produce what ``other`` consumes.
            InvalidValueError: if the deltas add to 1 or more, or stage 1 always leaves
                stage 2's domain.
        """
        return _compose(self, other)

    def __rshift__(self, other: Contract[Out, X]) -> Contract[In, X]:
        return _compose(self, other)

    def __matmul__(self, other: Contract[X, In]) -> Contract[X, Out]:
        return _compose(other, self)

    @overload
    def bound(self, e_in: Reading[In]) -> Reading[Out]: ...
    @overload
    def bound(self, e_in: float | Fraction) -> Reading[Out]: ...

    def bound(self, e_in: Reading[In] | float | Fraction) -> Reading[Out]:
        """Bound the output error for an input error (a number or a typed reading).

        Args:
            e_in: the input error; a :class:`Reading` must be of this contract's input
                metric, and its tier and delta carry through.

        Returns:
            A :class:`Reading` of the output metric, regime BOUND, rounded upward.

        Raises:
            MetricMismatchError: if a reading's metric differs from ``m_in``.
            OutOfDomainError: if ``e_in > cap``.
            InvalidValueError: if ``e_in`` is NaN, inf or outside the metric's range.
        """
        parts: list[Evidence] = []
        delta = self.delta
        if isinstance(e_in, Reading):
            reading: Reading[Any] = e_in
            if not same_metric(reading.metric, self.m_in):
                raise MetricMismatchError("reading", metric_name(reading.metric), self.name,
                                          metric_name(self.m_in))
            if reading.regime is not Regime.BOUND:
                raise RegimeMismatchError("bound", f"{metric_name(reading.metric)} "
                                          f"({reading.regime.value})", "a contract input (upper bound)")
            # A metric that saturates never exceeds its saturation value, so the reported
            # value bounds the error as well as the raw risk score does, and more tightly.
            x = reading.value
            parts.append(reading.evidence)
            delta = delta + Fraction(reading.delta)
            if delta >= 1:
                raise InvalidValueError("delta", delta, "input and contract deltas add to >= 1")
        else:
            if isinstance(e_in, Fraction):
                x = float_up(exact(e_in, "e_in"))
            else:
                x = check_value(self.m_in, e_in, what="e_in")
        if self.cap is not None and Fraction(x) > self.cap:
            raise OutOfDomainError(self.name, x, float(self.cap))
        raw = self._evaluate(x)
        parts.extend(s.evidence for s in self._stages if not s.is_identity)
        evidence: Evidence = parts[0] if len(parts) == 1 else Composition(tuple(parts))
        return _reading(self.m_out, raw, evidence=evidence, delta=delta)

    def _evaluate(self, x: float) -> float:
        if math.isinf(x):
            affine = float_up(self.b) if self.a == 0 else math.inf
        else:
            affine = float_up(self.a * Fraction(x) + self.b)
        if all(s.transfer is None for s in self._stages):
            return affine
        saturation = metric_info(self.m_out).saturation
        y = x
        for s in self._stages[:-1]:
            y = s.best(y)
        y = self._stages[-1].best(y, saturation=saturation)
        return _risk(affine, y, saturation)

    def explain(self) -> str:
        """A readable account: each stage with coefficients, evidence and tier, what is
        assumed and not checked (when anything is), then the total."""
        lines = [f"{self.name}: {metric_name(self.m_in)} -> {metric_name(self.m_out)}"]
        for i, s in enumerate(self._stages, 1):
            tf = "" if s.transfer is None else f"; tighter: {s.transfer.formula()}"
            cap = "" if s.cap is None else f"; valid on e_in <= {_fmt(s.cap)}"
            lines.append(
                f"  {i}. {s.name}: {metric_name(s.m_in)} -> {metric_name(s.m_out)}: "
                f"e_out <= {_fmt(s.a)} * e_in + {_fmt(s.b)}{tf}{cap}; delta={_fmt(s.delta)}; "
                f"{_describe(s.evidence)}; tier {s.tier.name}")
        assumed = self.assumptions
        if assumed:
            lines.append("  assumed, not checked (the tier is at most PARTIALLY_CERTIFIED):")
            lines.extend(f"    - {a.statement} (unchecked: {a.reason})" for a in assumed)
        steps = self.modelling
        if steps:
            lines.append("  modelled outside Lean:")
            lines.extend(f"    - {m.describe()}" for m in steps)
        lines.append(f"  total: e_out <= {self._total()}; delta={_fmt(self.delta)}; "
                     f"tier {self.tier.name}")
        return "\n".join(lines)

    def _total(self) -> str:
        """What the composite bounds: its affine part, and the stages' transfers where used."""
        cap = "" if self.cap is None else f" on e_in <= {_fmt(self.cap)}"
        affine = f"{_fmt(self.a)} * e_in + {_fmt(self.b)}"
        transfers = [f"{s.transfer.formula()} (stage {i})"
                     for i, s in enumerate(self._stages, 1) if s.transfer is not None]
        if not transfers:
            return affine + cap
        through = ", ".join(transfers)
        if any(s.constant for s in self._stages):
            # A stage with a = 0 and no transfer makes everything after it one number.
            value = self.bound(0.0).value
            return (f"{value:.6g} for every e_in{cap} (affine part {affine}; through "
                    f"{through})")
        n = len(self._stages)
        nested = "e_in"
        for i in range(1, n + 1):
            nested = f"g{i}({nested})"
        return (f"min({affine}, {nested}){cap}, g_i(x) = min(a_i * x + b_i, T_i(x)) of the "
                f"stages above, with T: {through}")


_CLAIM_FIELDS: Final = ("m_in", "m_out", "a", "b", "delta", "cap", "transfer")


def _claim(m_in: object, m_out: object, a: Fraction, b: Fraction, delta: Fraction,
           cap: Fraction | None, transfer: Transfer | None) -> tuple[object, ...]:
    """What a contract claims, as the proof backing it must have been issued for."""
    tf = None if transfer is None else (transfer.kind.name, transfer.k, transfer.coeffs)
    return ("contract", metric_name(m_in), metric_name(m_out), a, b, delta, cap, tf)


def _check_claim(proof: Proof, claim: tuple[object, ...]) -> None:
    """Refuse a proof issued for another claim than ``claim``, naming the first field."""
    if proof.claim[:len(claim)] == claim:
        return
    if not proof.claim or proof.claim[0] != "contract":
        raise EvidenceMismatchError(proof.theorem, "claim", claim[1:], proof.claim or
                                    "a number, not a contract")
    for name, mine, proved in zip(_CLAIM_FIELDS, claim[1:], proof.claim[1:], strict=True):
        if mine != proved:
            raise EvidenceMismatchError(proof.theorem, name, mine, proved)


def _proved(m_in: type[In], m_out: type[Out], *, a: Number, b: Number, theorem: str,
            name: str, premises: Iterable[tuple[str, bool]] = (), delta: Number = 0,
            cap: Number | None = None, transfer: Transfer | None = None,
            assumptions: tuple[Assumption, ...] = (), subset: str = "",
            params: str = "") -> Contract[In, Out]:
    """A contract proved by ``theorem`` on premises the calling code computed (the issuer
    of :meth:`witcert_calculus.schemas.Schema.issue`).

    The proof is issued for exactly this contract's claim (metrics, coefficients, delta,
    domain, transfer; ``params``: the schema's parameters, as shown by ``explain()``); with
    ``assumptions`` or a ``subset`` it is restricted by them."""
    metric_info(m_in)
    metric_info(m_out)
    claim = _claim(m_in, m_out, exact(a, "a"), exact(b, "b"),
                   exact(delta, "delta", upper=Fraction(1), strict_upper=True),
                   None if cap is None else exact(cap, "cap"), transfer)
    proof = _proof(theorem, tuple(_premise(s, h) for s, h in premises),
                   (*claim, params) if params else claim)
    evidence: Proof | Restricted = Restricted(proof, subset, assumptions) \
        if assumptions or subset else proof
    return Contract(m_in, m_out, a=a, b=b, evidence=evidence, name=name, delta=delta,
                    cap=cap, transfer=transfer)


def _restore(stages: tuple[Stage, ...]) -> Contract[Any, Any]:
    """A contract rebuilt from its stages through the constructor (unpickling)."""
    if not isinstance(stages, tuple) or not stages or not all(
            isinstance(s, Stage) for s in stages):
        raise InvalidValueError("stages", stages, "must be a non-empty tuple of Stage")
    parts: list[Contract[Any, Any]] = []
    for s in stages:
        m_in = cast("type[Metric[Any]]", s.m_in)
        c: Contract[Any, Any] = Contract(
            m_in, cast("type[Metric[Any]]", s.m_out), a=s.a, b=s.b, evidence=s.evidence,
            name=s.name, delta=s.delta, cap=s.cap, transfer=s.transfer)
        if s.is_identity:
            if theorems_of(s.evidence) != (ID_SOUND,):
                raise InvalidValueError("stages", s.name, "only the identity is a unit stage")
            c = identity(m_in)
        parts.append(c)
    out = parts[0]
    for c in parts[1:]:
        out = _compose(out, c)
    return out


def _capped_tier(evidence: Evidence, cap: Fraction | None) -> Tier:
    # A bound proved on a bounded domain only is partially certified.
    tier = decide_tier(evidence)
    return Tier.PARTIALLY_CERTIFIED if cap is not None and tier == Tier.CERTIFIED else tier


def _fmt(value: Fraction) -> str:
    """A readable form of an exact coefficient: the fraction when short, else 6 digits (upward)."""
    if value.denominator <= 10**4:
        return str(value)
    return f"{float_up(value):.6g}"


def _describe(e: Evidence) -> str:
    if isinstance(e, Proof):
        return f"Lean {_cite(e.theorem)}{_params(e)}"
    if isinstance(e, Restricted):
        return f"Lean {_cite(e.proof.theorem)}{_params(e.proof)} on {e.subset}"
    if isinstance(e, Measurement):
        return f"measured: {e.description} (n={e.samples})"
    return f"composition by Lean {_cite(e.theorem)}"


def _params(proof: Proof) -> str:
    """The schema parameters a contract's proof was issued for, when it names them."""
    extra = proof.claim[1 + len(_CLAIM_FIELDS):]
    return f" with {extra[0]}" if extra else ""


def _cite(theorem: str) -> str:
    """A theorem name with the export it came from."""
    return f"{theorem} [{lookup(theorem).origin}]"


def _compose(c1: Contract[Any, Any], c2: Contract[Any, Any]) -> Contract[Any, Any]:
    if not isinstance(c1, Contract) or not isinstance(c2, Contract):  # pyright: ignore[reportUnnecessaryIsInstance]
        bad = c1 if not isinstance(c1, Contract) else c2  # pyright: ignore[reportUnnecessaryIsInstance]
        raise InvalidValueError("stage", bad, "must be a Contract")
    if not same_metric(c1.m_out, c2.m_in):
        raise MetricMismatchError(c1.name, metric_name(c1.m_out), c2.name, metric_name(c2.m_in))
    a = c2.a * c1.a
    b = c2.a * c1.b + c2.b
    delta = c1.delta + c2.delta
    if delta >= 1:
        raise InvalidValueError("delta", delta,
                                f"the union bound of {c1.name!r} and {c2.name!r} reaches 1")
    cap = c1.cap
    restriction: str | None = None
    if c2.cap is not None:
        worst = None if c1.cap is None else c1.a * c1.cap + c1.b
        if c1.a == 0:
            worst = c1.b
        if worst is None or worst > c2.cap:
            if c1.b > c2.cap:
                raise InvalidValueError(
                    "composition", f"{c1.name} >> {c2.name}",
                    f"stage {c1.name!r} always leaves the domain e_mid <= {c2.cap} of {c2.name!r}")
            cap = (c2.cap - c1.b) / c1.a
            if c1.cap is not None:
                cap = min(cap, c1.cap)
            restriction = f"e_in <= {cap}"
    stages = tuple(s for s in c1._stages + c2._stages if not s.is_identity)  # pyright: ignore[reportPrivateUsage]
    if not stages:
        stages = c1._stages  # pyright: ignore[reportPrivateUsage]
    if len(stages) == 1 and restriction is None:
        only = stages[0]
        return Contract._composite(  # pyright: ignore[reportPrivateUsage]
        c1.m_in, c2.m_out, stages, a, b, delta, cap, only.evidence,
                                   only.name)
    evidence = Composition(tuple(s.evidence for s in stages), restriction=restriction)
    name = " >> ".join(s.name for s in stages)
    return Contract._composite(  # pyright: ignore[reportPrivateUsage]
        c1.m_in, c2.m_out, stages, a, b, delta, cap, evidence, name)


def identity(metric: type[M]) -> Contract[M, M]:
    """The identity contract ``e_out <= e_in`` on one metric; a unit of composition.

    Lean: ``WitCert.Semantic.Contract.id_sound``, ``WitCert.Contract.id_comp``, ``comp_id``.

    Example:
        >>> from witcert_calculus import AttentionTV, AtConsume
        >>> identity(AttentionTV[AtConsume]).a
        Fraction(1, 1)
    """
    # the claim of witcert_calculus.schemas.IDENTITY (that module builds on this one)
    c = _proved(metric, metric, a=1, b=0, theorem=ID_SOUND, name="identity")
    stage = c._stages[0]  # pyright: ignore[reportPrivateUsage]
    marked = Stage(stage.name, stage.m_in, stage.m_out, stage.a, stage.b, stage.delta, stage.cap,
                    stage.transfer, stage.evidence, is_identity=True)
    out: Contract[M, M] = Contract._composite(  # pyright: ignore[reportPrivateUsage]
        metric, metric, (marked,), stage.a, stage.b,
                                              stage.delta, None, stage.evidence, "identity")
    return out


# The type parameters are named after the junction they stand for, so that a checker that
# cannot solve one names the two stages that do not meet in one metric.
Stage1In = TypeVar("Stage1In", bound=Metric[Any])
Stage1Out_Stage2In = TypeVar("Stage1Out_Stage2In", bound=Metric[Any])
Stage2Out_Stage3In = TypeVar("Stage2Out_Stage3In", bound=Metric[Any])
Stage3Out_Stage4In = TypeVar("Stage3Out_Stage4In", bound=Metric[Any])
Stage4Out_Stage5In = TypeVar("Stage4Out_Stage5In", bound=Metric[Any])
Stage5Out_Stage6In = TypeVar("Stage5Out_Stage6In", bound=Metric[Any])
Stage6Out_Stage7In = TypeVar("Stage6Out_Stage7In", bound=Metric[Any])
Stage7Out_Stage8In = TypeVar("Stage7Out_Stage8In", bound=Metric[Any])
Stage8Out = TypeVar("Stage8Out", bound=Metric[Any])

#: The most stages one type-checked call of :func:`chain` takes; nest calls for more.
CHAIN_MAX_STAGES: Final = 8


@final
class NestChainCallsBeyond8Stages:
    """No value has this type: it stands in the 9th place of :func:`chain`'s signature so
    that a longer call names it. chain() type-checks up to 8 stages; nest the calls for
    more: ``chain(chain(c1, ..., c8), c9, ...)``."""

    __slots__ = ()

    def __init__(self) -> None:
        raise TypeError("NestChainCallsBeyond8Stages has no values")


@overload
def chain(c1: Contract[Stage1In, Stage1Out_Stage2In],
          c2: Contract[Stage1Out_Stage2In, Stage2Out_Stage3In], /
          ) -> Contract[Stage1In, Stage2Out_Stage3In]: ...
@overload
def chain(c1: Contract[Stage1In, Stage1Out_Stage2In],
          c2: Contract[Stage1Out_Stage2In, Stage2Out_Stage3In],
          c3: Contract[Stage2Out_Stage3In, Stage3Out_Stage4In], /
          ) -> Contract[Stage1In, Stage3Out_Stage4In]: ...
@overload
def chain(c1: Contract[Stage1In, Stage1Out_Stage2In],
          c2: Contract[Stage1Out_Stage2In, Stage2Out_Stage3In],
          c3: Contract[Stage2Out_Stage3In, Stage3Out_Stage4In],
          c4: Contract[Stage3Out_Stage4In, Stage4Out_Stage5In], /
          ) -> Contract[Stage1In, Stage4Out_Stage5In]: ...
@overload
def chain(c1: Contract[Stage1In, Stage1Out_Stage2In],
          c2: Contract[Stage1Out_Stage2In, Stage2Out_Stage3In],
          c3: Contract[Stage2Out_Stage3In, Stage3Out_Stage4In],
          c4: Contract[Stage3Out_Stage4In, Stage4Out_Stage5In],
          c5: Contract[Stage4Out_Stage5In, Stage5Out_Stage6In], /
          ) -> Contract[Stage1In, Stage5Out_Stage6In]: ...
@overload
def chain(c1: Contract[Stage1In, Stage1Out_Stage2In],
          c2: Contract[Stage1Out_Stage2In, Stage2Out_Stage3In],
          c3: Contract[Stage2Out_Stage3In, Stage3Out_Stage4In],
          c4: Contract[Stage3Out_Stage4In, Stage4Out_Stage5In],
          c5: Contract[Stage4Out_Stage5In, Stage5Out_Stage6In],
          c6: Contract[Stage5Out_Stage6In, Stage6Out_Stage7In], /
          ) -> Contract[Stage1In, Stage6Out_Stage7In]: ...
@overload
def chain(c1: Contract[Stage1In, Stage1Out_Stage2In],
          c2: Contract[Stage1Out_Stage2In, Stage2Out_Stage3In],
          c3: Contract[Stage2Out_Stage3In, Stage3Out_Stage4In],
          c4: Contract[Stage3Out_Stage4In, Stage4Out_Stage5In],
          c5: Contract[Stage4Out_Stage5In, Stage5Out_Stage6In],
          c6: Contract[Stage5Out_Stage6In, Stage6Out_Stage7In],
          c7: Contract[Stage6Out_Stage7In, Stage7Out_Stage8In], /
          ) -> Contract[Stage1In, Stage7Out_Stage8In]: ...
@overload
def chain(c1: Contract[Stage1In, Stage1Out_Stage2In],
          c2: Contract[Stage1Out_Stage2In, Stage2Out_Stage3In],
          c3: Contract[Stage2Out_Stage3In, Stage3Out_Stage4In],
          c4: Contract[Stage3Out_Stage4In, Stage4Out_Stage5In],
          c5: Contract[Stage4Out_Stage5In, Stage5Out_Stage6In],
          c6: Contract[Stage5Out_Stage6In, Stage6Out_Stage7In],
          c7: Contract[Stage6Out_Stage7In, Stage7Out_Stage8In],
          c8: Contract[Stage7Out_Stage8In, Stage8Out], /) -> Contract[Stage1In, Stage8Out]: ...
@overload
def chain(c1: Contract[Stage1In, Stage1Out_Stage2In],
          c2: Contract[Stage1Out_Stage2In, Stage2Out_Stage3In],
          c3: Contract[Stage2Out_Stage3In, Stage3Out_Stage4In],
          c4: Contract[Stage3Out_Stage4In, Stage4Out_Stage5In],
          c5: Contract[Stage4Out_Stage5In, Stage5Out_Stage6In],
          c6: Contract[Stage5Out_Stage6In, Stage6Out_Stage7In],
          c7: Contract[Stage6Out_Stage7In, Stage7Out_Stage8In],
          c8: Contract[Stage7Out_Stage8In, Stage8Out],
          nest_as_chain_of_chain_c1_to_c8_then_c9: NestChainCallsBeyond8Stages, /,
          *more: NestChainCallsBeyond8Stages) -> NoReturn: ...


def chain(*stages: Contract[Any, Any] | NestChainCallsBeyond8Stages) -> Contract[Any, Any]:
    """Compose stages in pipeline order: ``chain(c1, c2, c3) == c1 >> c2 >> c3``.

    Overloaded for 2 to :data:`CHAIN_MAX_STAGES` (8) stages so that the checkers verify
    each junction (a list-based pipeline would join invariant generics to ``object``).
    Longer pipelines nest: ``chain(chain(c1, ..., c8), c9, ...)`` is checked junction by
    junction too. A longer call is a type error under the checkers' default settings: its
    9th place takes only :class:`NestChainCallsBeyond8Stages`, which no value has, so
    pyright names that parameter (``nest_as_chain_of_chain_c1_to_c8_then_c9``) and type,
    and mypy lists the overload with that type among the variants; at run time it raises.

    Raises:
        MetricMismatchError: naming the first junction whose metrics differ.
        InvalidValueError: on fewer than 2 or more than 8 stages.
    """
    if len(stages) < 2:
        raise InvalidValueError("stages", len(stages), "chain needs at least two stages")
    if len(stages) > CHAIN_MAX_STAGES:
        raise InvalidValueError(
            "stages", len(stages),
            f"chain() type-checks up to {CHAIN_MAX_STAGES} stages; nest the calls for more: "
            "chain(chain(c1, ..., c8), c9, ...)")
    contracts: list[Contract[Any, Any]] = []
    for s in stages:
        if not isinstance(s, Contract):
            raise InvalidValueError("stage", s, "must be a Contract")
        contracts.append(s)
    out = contracts[0]
    for s in contracts[1:]:
        out = _compose(out, s)
    return out


@final
@dataclass(frozen=True, slots=True, eq=True)
class Reading(Generic[M]):
    """A number of a given metric, with its tier decided from its evidence.

    Args:
        metric: the metric with its site, e.g. ``AttentionTV[AtConsume]``.
        raw: the unclamped value (kept as a risk score; may exceed saturation).
        evidence: what backs it; decides the tier.
        delta: failure probability of the number, in [0, 1).
        regime: BOUND, MEASURED or MEAN; readings of different regimes never mix.

    Attributes:
        value: the reported value, ``min(saturation, raw)``.
        tier: decided by :func:`decide_tier` (``SATURATED`` when a bound reaches
            saturation).

    A reading backed by a proof is issued by the code that computed it (a contract's
    :meth:`Contract.bound`, a meter, a TV bound's ``reading()``); one built here by hand
    with a proof, or edited afterwards, is refused. Build your own readings with a
    :class:`~witcert_calculus.tiers.Measurement` (EMPIRICAL).

    Raises:
        InvalidValueError: on NaN, a negative value, delta outside [0, 1), or a
            MEASURED/MEAN reading backed by a proof.
        ForgedEvidenceError: on a proved reading not issued by the library.
    """

    metric: type[M]
    raw: float
    evidence: Evidence
    delta: Fraction | float = 0.0
    regime: Regime = Regime.BOUND
    seal: object = field(default=b"", repr=False, compare=False)
    value: float = field(init=False)
    tier: Tier = field(init=False)

    def __post_init__(self) -> None:
        info = metric_info(self.metric)
        raw = self.raw
        raw = number("raw", raw)
        if math.isnan(raw) or raw < info.lo:
            raise InvalidValueError("raw", self.raw, f"must be a number >= {info.lo} for "
                                    f"{metric_name(self.metric)}")
        if self.regime is not Regime.BOUND and raw > info.hi:  # e.g. a measured TV above 1
            raise InvalidValueError("raw", self.raw, f"must be <= {info.hi} for a "
                                    f"{self.regime.value} of {metric_name(self.metric)}")
        if info.saturation is None and raw > info.hi and not (
                math.isinf(raw) and self.regime is Regime.BOUND):
            raise InvalidValueError("raw", self.raw, f"must be <= {info.hi} for "
                                    f"{metric_name(self.metric)}")
        delta = exact(self.delta, "delta", upper=Fraction(1), strict_upper=True)
        if not isinstance(self.regime, Regime):
            raise InvalidValueError("regime", self.regime, "must be a Regime")
        if self.regime is not Regime.BOUND and not isinstance(self.evidence, Measurement):
            raise InvalidValueError("evidence", self.evidence,
                                    f"a {self.regime.value} reading is backed by a Measurement")
        value = raw if info.saturation is None else min(raw, info.saturation)
        object.__setattr__(self, "raw", raw)
        object.__setattr__(self, "delta", delta)
        object.__setattr__(self, "value", value)
        # An infinite bound says nothing, whether or not the metric saturates.
        saturation = math.inf if info.saturation is None and math.isinf(raw) else info.saturation
        object.__setattr__(self, "tier", decide_tier(self.evidence, value=raw,
                                                     saturation=saturation))
        if decide_tier(self.evidence) > Tier.EMPIRICAL:
            # A proved number is issued by the code that computed it, sealed over its
            # content; one built by hand or edited (dataclasses.replace, a pickle) is refused.
            content = ("Reading", metric_name(self.metric), raw, delta, self.regime,
                       _evidence_key(self.evidence))
            if self.seal is _ISSUE:
                object.__setattr__(self, "seal", _digest(*content))
            _sealed("Reading", self, self.seal, content[1:], _READING_REASON)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Reading, (self.metric, self.raw, self.evidence, self.delta, self.regime,
                          self.seal))

    @property
    def saturated(self) -> bool:
        """True when this bound says nothing (at or above its metric's saturation)."""
        return self.tier is Tier.SATURATED

    @property
    def assumptions(self) -> tuple[Assumption, ...]:
        """Every assumption the evidence rests on, collected from the evidence tree.

        Empty when every premise was computed or carried by construction; otherwise the
        tier is at most ``PARTIALLY_CERTIFIED``.
        """
        return assumptions_of(self.evidence)

    @property
    def modelling(self) -> tuple[ModellingStep, ...]:
        """The modelling steps between the cited theorems and this computation
        (:mod:`witcert_calculus.lean.modelling`): each proved, checked by code, or assumed."""
        return modelling_of(self.evidence)

    def _check(self, op: str, other: object) -> Reading[Any]:
        if not isinstance(other, Reading):
            raise RegimeMismatchError(op, self._label(), type(other).__name__)
        o: Reading[Any] = other  # pyright: ignore[reportUnknownVariableType]
        if not same_metric(self.metric, o.metric) or self.regime is not o.regime:
            raise RegimeMismatchError(op, self._label(), o._label())
        return o

    def _label(self) -> str:
        return f"{metric_name(self.metric)} ({self.regime.value})"

    def __add__(self, other: Reading[M]) -> Reading[M]:
        """Sum of two readings of the same metric and regime (a bound of the sum for bounds)."""
        o = self._check("+", other)
        if self.regime is Regime.MEAN:
            raise RegimeMismatchError("+", self._label(), o._label())
        delta = Fraction(self.delta) + Fraction(o.delta)
        raw = math.nextafter(self.raw + o.raw, math.inf) if self.regime is Regime.BOUND \
            else self.raw + o.raw
        evidence: Evidence
        if self.regime is Regime.BOUND:
            evidence = Composition((self.evidence, o.evidence), theorem=ADD_SOUND)
        else:
            evidence = Measurement("sum of measured values",
                                   samples=_samples(self.evidence) + _samples(o.evidence))
        return _reading(self.metric, raw, evidence=evidence, delta=delta, regime=self.regime)

    def __lt__(self, other: Reading[M]) -> bool:
        return self.raw < self._check("<", other).raw

    def __le__(self, other: Reading[M]) -> bool:
        return self.raw <= self._check("<=", other).raw

    def __gt__(self, other: Reading[M]) -> bool:
        return self.raw > self._check(">", other).raw

    def __ge__(self, other: Reading[M]) -> bool:
        return self.raw >= self._check(">=", other).raw

    @staticmethod
    def mean(readings: Iterable[Reading[M]]) -> Reading[M]:
        """The mean of readings of one metric: an EMPIRICAL aggregate, never a bound.

        Raises:
            InvalidValueError: on an empty input.
            RegimeMismatchError: if the readings differ in metric.
        """
        items = list(readings)
        if not items:
            raise InvalidValueError("readings", items, "the mean of nothing is undefined")
        first = items[0]
        for r in items[1:]:
            if not same_metric(first.metric, r.metric):
                raise RegimeMismatchError("mean", first._label(), r._label())
        total = math.fsum(r.raw for r in items)
        return Reading(first.metric, total / len(items),
                       evidence=Measurement(f"mean of {len(items)} readings", samples=len(items)),
                       regime=Regime.MEAN)

    def __str__(self) -> str:
        sat = " (saturated)" if self.saturated else ""
        return (f"{metric_name(self.metric)} {self.regime.value} {self.value:.6g}{sat} "
                f"[{self.tier.name}, delta={float(self.delta):.3g}]")


_ISSUE: Final = object()
_READING_REASON: Final = ("a proved reading is issued by the code that computed its value "
                          "(Contract.bound, a meter, TVBound.reading); back a number of your "
                          "own with Measurement")


def _reading(metric: type[M], raw: float, *, evidence: Evidence,
             delta: Fraction | float = 0.0, regime: Regime = Regime.BOUND) -> Reading[M]:
    """Issue a reading whose value the calling code computed from its evidence."""
    return Reading(metric, raw, evidence=evidence, delta=delta, regime=regime, seal=_ISSUE)


def _samples(e: Evidence) -> int:
    return e.samples if isinstance(e, Measurement) else 1

