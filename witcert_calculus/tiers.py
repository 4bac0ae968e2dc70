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
- a proved bound whose value is at or above its metric's saturation is true but
  says nothing: it is reported as ``SATURATED``, never as ``CERTIFIED``.

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
import math
from dataclasses import dataclass, field
from typing import TypeAlias, final

from witcert_calculus.errors import InvalidValueError, PremiseError
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
from witcert_calculus.numerics.validation import nonempty_text, positive_int

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
    for t in rest:
        if not isinstance(t, Tier):
            raise InvalidValueError("tier", t, "must be a Tier")
        out = min(out, t)
    return Tier(out)


@final
@dataclass(frozen=True, slots=True)
class Premise:
    """A premise of a theorem, stated as text, with the machine's verdict on it.

    Attributes:
        statement: the premise, e.g. ``"a2 >= 0"``.
        holds: whether it was checked to hold for these arguments: a ``bool`` computed
            by code (a check's result, or a provenance check on an established value).

    Raises:
        InvalidValueError: on an empty statement or a truth value that is not a ``bool``.
    """

    statement: str
    holds: bool

    def __post_init__(self) -> None:
        if not isinstance(self.statement, str) or not self.statement.strip():
            raise InvalidValueError("statement", self.statement, "must state the premise")
        if not isinstance(self.holds, bool):
            raise InvalidValueError("holds", self.holds,
                                    "must be a bool computed from the arguments")


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
        >>> a = Assumption("rho_t >= ||v_t - v_hat_t||", reason="the exact values are not passed")
        >>> decide_tier(Restricted(Proof("WitCert.Contract.comp_sound"), assumptions=(a,))).name
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

    Attributes:
        theorem: fully qualified Lean theorem name, e.g. ``"WitCert.Contract.comp_sound"``.
        premises: the premises and their checked truth values.

    Raises:
        InvalidValueError: if the theorem name is not a qualified Lean name.
        UnknownTheoremError: if no Lean export holds it (neither the one shipped with the
            package nor one registered with
            :func:`~witcert_calculus.lean.theorems.register_theorems`).
        PremiseError: if a premise does not hold (a bound is never issued on a
            false premise; nothing is silently demoted).
    """

    theorem: str
    premises: tuple[Premise, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.theorem, str) or not self.theorem or any(
                ch.isspace() for ch in self.theorem):
            raise InvalidValueError("theorem", self.theorem, "must be a qualified Lean name")
        lookup(self.theorem)
        for p in self.premises:
            if not isinstance(p, Premise):
                kind = "an Assumption is not a premise: carry it in Restricted(proof, " \
                    "assumptions=...)" if isinstance(p, Assumption) else "must be a Premise"
                raise InvalidValueError("premises", p, kind)
            if not p.holds:
                raise PremiseError(self.theorem, p.statement, False)


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
        if not self.description.strip():
            raise InvalidValueError("description", self.description, "must describe the measurement")
        positive_int("samples", self.samples)


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
        if not self.parts:
            raise InvalidValueError("parts", self.parts, "a composition needs at least one part")
        lookup(self.theorem)


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
        ``SATURATED`` for a proved bound at or above saturation, otherwise
        ``CERTIFIED`` / ``PARTIALLY_CERTIFIED`` / ``EMPIRICAL`` for a
        :class:`Proof` / :class:`Restricted` / :class:`Measurement`.

    Raises:
        InvalidValueError: if ``value`` is NaN or evidence is of an unknown kind.

    Example:
        >>> decide_tier(Proof("WitCert.Contract.comp_sound"), value=1.0, saturation=1.0)
        <Tier.SATURATED: 0>
    """
    if value is not None and math.isnan(value):
        raise InvalidValueError("value", value, "must not be NaN")
    if value is not None and saturation is not None and value >= saturation:
        if not isinstance(evidence, Measurement):
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
        >>> p = Proof("WitCert.Contract.comp_sound")
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
