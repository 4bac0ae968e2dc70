"""Tiers: how strong a number is, decided by the machine from evidence.

The tier of a contract or reading is never passed in as a free label. It is
computed by :func:`decide_tier` from the evidence attached to the object:

- a :class:`Proof` (a Lean theorem name) whose premises hold, on an unrestricted
  domain, gives ``CERTIFIED``;
- a :class:`Restricted` proof, which holds only on a stated decidable subset (a
  domain restriction, rows whose margin exceeds 2*eps, ...) or only where stated
  :class:`Assumption` s hold, gives ``PARTIALLY_CERTIFIED``;
- a :class:`Measurement` gives ``EMPIRICAL``;
- a :class:`Composition` gives the weakest tier of its parts (and at most
  ``PARTIALLY_CERTIFIED`` when composition restricted the domain);
- a proved bound whose value is at or above its metric's saturation (or infinite,
  with or without a saturation) is true but says nothing: it is reported as
  ``SATURATED``, never as ``CERTIFIED``.

Order: ``CERTIFIED > PARTIALLY_CERTIFIED > EMPIRICAL > SATURATED``; composition
keeps the weakest (:func:`weakest`, the lattice meet; Lean:
``WitCert.Tier.weakest_comm`` and its companions).

Premises and assumptions. A :class:`Premise` is a statement with the truth value the
code computed for it from the arguments (or a provenance check on a value that only its
establishing function can produce); a proof on a false premise is refused. What no code
can check where the bound is issued (the caller's own array claimed to bound the logit
error, uniform random bits, non-adaptive queries) is an :class:`Assumption`: it is
carried only by a :class:`Restricted`, so evidence with any assumption is at most
``PARTIALLY_CERTIFIED`` by the one rule above, and :func:`assumptions_of` lists them.

Main declarations:

- :class:`Tier`, :func:`weakest`
- :class:`Premise`, :class:`Assumption`, :class:`Proof`, :class:`Restricted`,
  :class:`Measurement`, :class:`Composition`, ``Evidence``
- :func:`decide_tier`, :func:`assumptions_of`
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import math
import os
from dataclasses import dataclass, field
from typing import Any, TypeAlias, final

from witcert_calculus.errors import ForgedEvidenceError, InvalidValueError, PremiseError
from witcert_calculus.lean.theorems import (
    COMP_SOUND,
    LE_WEAKEST,
    lookup,
    WEAKEST_ASSOC,
    WEAKEST_COMM,
    WEAKEST_IDEM,
    WEAKEST_LE_LEFT,
    WEAKEST_LE_RIGHT,
)
from witcert_calculus.numerics.validation import nonempty_text, positive_int, real

__all__ = [
    "Assumption",
    "Composition",
    "Evidence",
    "Measurement",
    "Premise",
    "Proof",
    "Restricted",
    "Tier",
    "assumptions_of",
    "decide_tier",
    "weakest",
]

WEAKEST_THEOREMS: tuple[str, ...] = (
    WEAKEST_COMM,
    WEAKEST_ASSOC,
    WEAKEST_IDEM,
    WEAKEST_LE_LEFT,
    WEAKEST_LE_RIGHT,
    LE_WEAKEST,
)


@final
class Tier(enum.IntEnum):
    """Strength of a number; larger is stronger."""

    SATURATED = 0
    """A sound bound at or above its metric's saturation: true but vacuous."""
    EMPIRICAL = 1
    """An observation with no bound behind it."""
    PARTIALLY_CERTIFIED = 2
    """A proved bound that holds on a stated decidable subset only."""
    CERTIFIED = 3
    """A proved bound whose premises hold, below saturation."""


def weakest(first: Tier, *rest: Tier) -> Tier:
    """Return the weakest of the given tiers (the meet of the tier lattice).

    Lean: ``WitCert.Tier.weakest_comm``, ``weakest_assoc``, ``weakest_idem``,
    ``weakest_le_left``, ``weakest_le_right``, ``le_weakest``.

    Example:
        >>> weakest(Tier.CERTIFIED, Tier.EMPIRICAL)
        <Tier.EMPIRICAL: 1>
    """
    out = first
    for t in (first, *rest):
        if not isinstance(t, Tier):
            raise InvalidValueError("tier", t, "must be a Tier")
        out = min(out, t)
    return Tier(out)


# Evidence is sealed by the code that checked it: a keyed digest (the key is drawn when the
# process starts and never leaves it) over the evidence's content. A value built by hand,
# edited with dataclasses.replace, or unpickled after an edit or in another process carries
# no valid seal and is refused (docs/concepts/trust.md, "Evidence is issued, never typed in").
_KEY: bytes = os.urandom(32)


def _digest(*parts: object) -> bytes:
    """The seal of a value whose content is ``parts`` (their reprs are exact)."""
    return hmac.new(_KEY, repr(parts).encode(), hashlib.sha256).digest()


def _sealed(kind: str, value: object, seal: object, parts: tuple[object, ...],
            reason: str) -> None:
    """Refuse ``value`` unless ``seal`` is the digest of its content."""
    if not isinstance(seal, bytes) or not hmac.compare_digest(seal, _digest(kind, *parts)):
        raise ForgedEvidenceError(kind, value, reason)


_PREMISE_REASON = ("a premise comes only from the code that computed its truth (a "
                   "bridge's or meter's checker, or a checker passed to "
                   "witcert_calculus.Schema's premise checkers)")
_PROOF_REASON = ("a proof is issued by the bridge, meter or contract that checked its "
                 "premises for one claim; issue a contract of your own theorem with "
                 "witcert_calculus.Schema, or back a number with Measurement")


@final
@dataclass(frozen=True, slots=True)
class Premise:
    """A premise of a theorem, stated as text, with the machine's verdict on it.

    Premises are issued only by the code that computed their truth (a bridge's or meter's
    checker, or a checker of a :class:`~witcert_calculus.schemas.Schema`); one built
    by hand is refused with :class:`~witcert_calculus.errors.ForgedEvidenceError`.

    Attributes:
        statement: the premise, e.g. ``"a2 >= 0"``.
        holds: whether it was checked to hold for these arguments: a ``bool`` computed
            by code.
        seal: the issuing code's seal over the two.

    Raises:
        InvalidValueError: on an empty statement or a truth value that is not a ``bool``.
        ForgedEvidenceError: on a missing or wrong seal.
    """

    statement: str
    holds: bool
    seal: bytes = field(default=b"", repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.statement, str) or not self.statement.strip():
            raise InvalidValueError("statement", self.statement, "must state the premise")
        if not isinstance(self.holds, bool):
            raise InvalidValueError("holds", self.holds,
                                    "must be a bool computed from the arguments")
        _sealed("Premise", self, self.seal, (self.statement, self.holds), _PREMISE_REASON)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Premise, (self.statement, self.holds, self.seal))


def _premise(statement: str, holds: bool) -> Premise:  # pyright: ignore[reportUnusedFunction]
    """Issue a premise whose truth the calling code computed."""
    return Premise(statement, holds, _digest("Premise", statement, holds))


@final
@dataclass(frozen=True, slots=True)
class Assumption:
    """A premise that no code can check where the bound is issued, stated as such.

    Carried by a :class:`Restricted` (``Restricted(proof, assumptions=(...,))``), it caps
    the tier at ``PARTIALLY_CERTIFIED``; readings and contracts list it
    (``Reading.assumptions``, ``Contract.explain()``).

    Attributes:
        statement: what is assumed, e.g. ``"queries are chosen independently of the
            dither stream"``.
        reason: why it cannot be checked here, e.g. ``"no code sees how q was chosen"``.

    Raises:
        InvalidValueError: on an empty statement or reason.

    Example:
        >>> from witcert_calculus import AtConsume, AttentionTV, identity
        >>> proof = identity(AttentionTV[AtConsume]).evidence  # a proof issued by the library
        >>> a = Assumption("rho_t >= ||v_t - v_hat_t||", reason="the exact values are not passed")
        >>> decide_tier(Restricted(proof, assumptions=(a,))).name
        'PARTIALLY_CERTIFIED'
    """

    statement: str
    reason: str

    def __post_init__(self) -> None:
        for name in ("statement", "reason"):
            nonempty_text(name, getattr(self, name))


@final
@dataclass(frozen=True, slots=True)
class Proof:
    """A bound proved in Lean whose premises were checked for these arguments.

    A proof is issued by the code that checked its premises (a bridge, a meter, a
    contract's composition, or a :class:`~witcert_calculus.schemas.Schema` of a theorem of
    the user's own Lean export), for one claim: a contract's metrics and coefficients, or
    nothing beyond the number it backs. One built by hand or edited is refused.

    Attributes:
        theorem: fully qualified Lean theorem name, e.g. ``"WitCert.Semantic.Contract.comp_sound"``.
        premises: the premises and their checked truth values.
        claim: what the proof was issued for (a contract's claim, see
            :class:`~witcert_calculus.contracts.Contract`; empty for a meter's number).
        seal: the issuing code's seal over the three.

    Raises:
        InvalidValueError: if the theorem name is not a qualified Lean name.
        UnknownTheoremError: if no Lean export holds it (neither the one shipped with the
            package nor one registered with
            :func:`~witcert_calculus.lean.theorems.register_theorems`).
        PremiseError: if a premise does not hold (a bound is never issued on a
            false premise; nothing is silently demoted).
        ForgedEvidenceError: on a missing or wrong seal.
    """

    theorem: str
    premises: tuple[Premise, ...] = ()
    claim: tuple[object, ...] = ()
    seal: bytes = field(default=b"", repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.theorem, str) or not self.theorem or any(
                ch.isspace() for ch in self.theorem):
            raise InvalidValueError("theorem", self.theorem, "must be a qualified Lean name")
        lookup(self.theorem)
        if not isinstance(self.premises, tuple):
            raise InvalidValueError("premises", self.premises, "must be a tuple of Premise")
        for p in self.premises:
            if not isinstance(p, Premise):
                kind = "an Assumption is not a premise: carry it in Restricted(proof, " \
                    "assumptions=...)" if isinstance(p, Assumption) else "must be a Premise"
                raise InvalidValueError("premises", p, kind)
            if not p.holds:
                raise PremiseError(self.theorem, p.statement, False)
        if not isinstance(self.claim, tuple):
            raise InvalidValueError("claim", self.claim, "must be a tuple")
        _sealed("Proof", self, self.seal, _proof_content(self.theorem, self.premises,
                                                         self.claim), _PROOF_REASON)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Proof, (self.theorem, self.premises, self.claim, self.seal))


def _proof_content(theorem: str, premises: tuple[Premise, ...],
                   claim: tuple[object, ...]) -> tuple[object, ...]:
    return (theorem, tuple(getattr(p, "seal", None) for p in premises), claim)


def _proof(theorem: str, premises: tuple[Premise, ...] = (),  # pyright: ignore[reportUnusedFunction]
           claim: tuple[object, ...] = ()) -> Proof:
    """Issue a proof of ``claim`` by ``theorem`` on premises the calling code checked."""
    if isinstance(premises, tuple):
        content = _proof_content(theorem, premises, claim)
        return Proof(theorem, premises, claim, _digest("Proof", *content))
    return Proof(theorem, premises, claim)


@final
@dataclass(frozen=True, slots=True)
class Restricted:
    """A proof that holds only on a stated subset of inputs, or only under assumptions.

    Attributes:
        proof: the underlying proof.
        subset: the subset, stated so that a reader can decide membership,
            e.g. ``"e_in <= 0.25"`` or ``"rows with margin > 2*eps"``; when empty, it is
            stated by the assumptions (the inputs on which they hold).
        assumptions: what the proof further assumes and no code checks here.

    Raises:
        InvalidValueError: when neither a subset nor an assumption is stated, or an
            assumption is not an :class:`Assumption`.
    """

    proof: Proof
    subset: str = ""
    assumptions: tuple[Assumption, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.assumptions, tuple) or not all(
                isinstance(a, Assumption) for a in self.assumptions):
            raise InvalidValueError("assumptions", self.assumptions,
                                    "must be a tuple of Assumption")
        if not isinstance(self.subset, str):
            raise InvalidValueError("subset", self.subset, "must state the subset")
        if not self.subset.strip():
            if not self.assumptions:
                raise InvalidValueError("subset", self.subset,
                                        "must state the subset (or the assumptions)")
            object.__setattr__(self, "subset", "inputs on which these assumptions hold: "
                               + "; ".join(a.statement for a in self.assumptions))
        if not isinstance(self.proof, Proof):
            raise InvalidValueError("proof", self.proof, "must be a Proof")

    def __reduce__(self) -> tuple[Any, ...]:
        return (Restricted, (self.proof, self.subset, self.assumptions))


@final
@dataclass(frozen=True, slots=True)
class Measurement:
    """An observed number with no proof behind it.

    Attributes:
        description: what was measured and how (e.g. ``"median ratio on top-64 sets"``).
        samples: number of observations behind it (>= 1).
        extra: further facts about the measurement, as (key, value) text pairs.
    """

    description: str
    samples: int
    extra: tuple[tuple[str, str], ...] = field(default=())

    def __post_init__(self) -> None:
        if not isinstance(self.description, str) or not self.description.strip():
            raise InvalidValueError("description", self.description, "must describe the measurement")
        positive_int("samples", self.samples)
        if not isinstance(self.extra, tuple) or not all(
                isinstance(kv, tuple) and len(kv) == 2 and all(isinstance(x, str) for x in kv)
                for kv in self.extra):
            raise InvalidValueError("extra", self.extra, "must be a tuple of (key, value) text pairs")


@final
@dataclass(frozen=True, slots=True)
class Composition:
    """Evidence of a composed number: the evidence of each part plus the composition theorem.

    Attributes:
        parts: the evidence of each part, in pipeline order.
        theorem: the Lean theorem that justifies combining them.
        restriction: when composition restricted the domain (stage 1 could leave
            stage 2's domain), the sub-domain on which the composite holds.
    """

    parts: tuple[Proof | Restricted | Measurement | Composition, ...]
    theorem: str = COMP_SOUND
    restriction: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.parts, tuple) or not self.parts:
            raise InvalidValueError("parts", self.parts, "a composition needs at least one part")
        for part in self.parts:
            if not isinstance(part, (Proof, Restricted, Measurement, Composition)):
                raise InvalidValueError("parts", part,
                                        "must be Proof, Restricted, Measurement or Composition")
        lookup(self.theorem)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Composition, (self.parts, self.theorem, self.restriction))


Evidence: TypeAlias = Proof | Restricted | Measurement | Composition


def decide_tier(evidence: Evidence, *, value: float | None = None,
                saturation: float | None = None) -> Tier:
    """Decide the tier of a number from its evidence.

    Lean: ``WitCert.Tier.decide_saturated_ne_certified``.

    Args:
        evidence: the evidence behind the number.
        value: the bound's value, when a number is being issued.
        saturation: the metric's saturation value, if it has one.

    Returns:
        ``SATURATED`` for a proved bound at or above saturation, or infinite (an infinite
        bound says nothing, whether or not the metric saturates), otherwise
        ``CERTIFIED`` / ``PARTIALLY_CERTIFIED`` / ``EMPIRICAL`` for a
        :class:`Proof` / :class:`Restricted` / :class:`Measurement`.

    Raises:
        InvalidValueError: if ``value`` is not a real number, NaN or ``-inf``, if
            ``saturation`` is not a real number or is NaN, or evidence is of an unknown kind.

    Example:
        >>> from witcert_calculus import AtConsume, AttentionTV, identity
        >>> proof = identity(AttentionTV[AtConsume]).evidence  # a proof issued by the library
        >>> decide_tier(proof, value=1.0, saturation=1.0)
        <Tier.SATURATED: 0>
    """
    if value is not None:
        value = real("value", value, allow_inf=True)
        if value == -math.inf:
            raise InvalidValueError("value", value, "must not be -inf (a bound on an error)")
    if saturation is not None:
        saturation = real("saturation", saturation, allow_inf=True)
    if value is not None and not isinstance(evidence, Measurement) and (
            value == math.inf or (saturation is not None and value >= saturation)):
        return Tier.SATURATED
    return _intrinsic(evidence)


def _intrinsic(evidence: Evidence) -> Tier:
    if isinstance(evidence, Measurement):
        return Tier.EMPIRICAL
    if isinstance(evidence, Proof):
        return Tier.CERTIFIED
    if isinstance(evidence, Restricted):
        return Tier.PARTIALLY_CERTIFIED
    if isinstance(evidence, Composition):
        tier = weakest(*(_intrinsic(p) for p in evidence.parts))
        if evidence.restriction is not None and tier > Tier.PARTIALLY_CERTIFIED:
            tier = Tier.PARTIALLY_CERTIFIED
        return tier
    raise InvalidValueError("evidence", evidence,
                            "must be Proof, Restricted, Measurement or Composition")


def assumptions_of(evidence: Evidence) -> tuple[Assumption, ...]:
    """Every assumption a piece of evidence rests on, in order, without repeats.

    Example:
        >>> a = Assumption("queries are non-adaptive", reason="no code sees how q was chosen")
        >>> from witcert_calculus import AtConsume, AttentionTV, identity
        >>> p = identity(AttentionTV[AtConsume]).evidence
        >>> [x.statement for x in assumptions_of(Composition((p, Restricted(p, assumptions=(a,)))))]
        ['queries are non-adaptive']
    """
    out: list[Assumption] = []

    def walk(e: Evidence) -> None:
        if isinstance(e, Restricted):
            out.extend(e.assumptions)
        elif isinstance(e, Composition):
            for p in e.parts:
                walk(p)

    walk(evidence)
    return tuple(dict.fromkeys(out))


def _evidence_key(evidence: Evidence) -> tuple[object, ...]:
    """The content of a piece of evidence for a seal over a value it backs."""
    if isinstance(evidence, Proof):
        return ("P", evidence.seal)
    if isinstance(evidence, Restricted):
        return ("R", evidence.proof.seal, evidence.subset, evidence.assumptions)
    if isinstance(evidence, Composition):
        return ("C", evidence.theorem, evidence.restriction,
                tuple(_evidence_key(p) for p in evidence.parts))
    return ("M", evidence)


def theorems_of(evidence: Evidence) -> tuple[str, ...]:
    """Every Lean theorem cited by a piece of evidence, in order, without repeats."""
    out: list[str] = []

    def walk(e: Evidence) -> None:
        if isinstance(e, Proof):
            out.append(e.theorem)
        elif isinstance(e, Restricted):
            out.append(e.proof.theorem)
        elif isinstance(e, Composition):
            out.append(e.theorem)
            for p in e.parts:
                walk(p)

    walk(evidence)
    return tuple(dict.fromkeys(out))
