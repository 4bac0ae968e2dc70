"""Tiers: how strong a number is, decided by the machine from evidence.

The tier of a contract or reading is never passed in as a free label. It is
computed by :func:`decide_tier` from the evidence attached to the object:

- a :class:`Proof` (a Lean theorem name) whose premises hold, on an unrestricted
  domain, gives ``CERTIFIED``;
- a :class:`Restricted` proof, which holds only on a stated decidable subset (a
  domain restriction, rows whose margin exceeds 2*eps, ...), gives
  ``PARTIALLY_CERTIFIED``;
- a :class:`Measurement` gives ``EMPIRICAL``;
- a :class:`Composition` gives the weakest tier of its parts (and at most
  ``PARTIALLY_CERTIFIED`` when composition restricted the domain);
- a proved bound whose value is at or above its metric's saturation is true but
  says nothing: it is reported as ``SATURATED``, never as ``CERTIFIED``.

Order: ``CERTIFIED > PARTIALLY_CERTIFIED > EMPIRICAL > SATURATED``; composition
keeps the weakest (:func:`weakest`, the lattice meet; Lean:
``WitCert.Tier.weakest_comm`` and its companions).

Main declarations:

- :class:`Tier`, :func:`weakest`
- :class:`Premise`, :class:`Proof`, :class:`Restricted`, :class:`Measurement`,
  :class:`Composition`, ``Evidence``
- :func:`decide_tier`
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import TypeAlias, final

from witcert_calculus.errors import InvalidValueError, PremiseError
from witcert_calculus.theorems import (
    COMP_SOUND,
    LE_WEAKEST,
    lookup,
    WEAKEST_ASSOC,
    WEAKEST_COMM,
    WEAKEST_IDEM,
    WEAKEST_LE_LEFT,
    WEAKEST_LE_RIGHT,
)
from witcert_calculus.validation import positive_int

__all__ = [
    "Composition",
    "Evidence",
    "Measurement",
    "Premise",
    "Proof",
    "Restricted",
    "Tier",
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
        holds: whether it was checked to hold for these arguments.
    """

    statement: str
    holds: bool


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
            package nor one registered with :func:`~witcert_calculus.theorems.register_theorems`).
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
            if not p.holds:
                raise PremiseError(self.theorem, p.statement, False)


@final
@dataclass(frozen=True, slots=True)
class Restricted:
    """A proof that holds only on a stated, decidable subset of inputs.

    Attributes:
        proof: the underlying proof.
        subset: the subset, stated so that a reader can decide membership,
            e.g. ``"e_in <= 0.25"`` or ``"rows with margin > 2*eps"``.
    """

    proof: Proof
    subset: str

    def __post_init__(self) -> None:
        if not self.subset.strip():
            raise InvalidValueError("subset", self.subset, "must state the subset")


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
