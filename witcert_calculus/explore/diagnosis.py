"""Diagnosis: which knob of a serving configuration an outcome difference is attributable to.

A campaign runs *arms*, named settings of the knobs a :class:`Design` declares (prefix caching
on or off, the cache dtype, the concurrency, ...), over independent *rounds*; each :class:`Run`
is one arm's measured outcome in one round, with the regime it ran in. The rules:

- **controlled pairs only**: a comparison attributes an outcome difference to a knob only when
  the two arms differ in that knob alone (Lean ``WitCert.Diagnosis.controlled_pair_attributes``:
  an outcome model that ignores the knob gives both arms the same outcome). Arms that differ in
  two or more knobs are refused with :class:`~witcert_calculus.errors.ConfoundedComparisonError`
  naming the knobs (Lean ``WitCert.Diagnosis.confounded_pair_unidentified``: any pair of
  outcomes is reproduced by a model in which only the first knob matters and by one in which
  only the second does), never attributed;
- **replication**: the effect (the second arm's outcome minus the first's, round by round)
  must have the same nonzero sign in at least ``replications`` rounds and the opposite sign
  in none;
- **dose–response**: a claim that an effect grows with a knob's setting needs at least three
  doses of that knob, all else equal, and outcomes monotone in the dose in every round.

Every verdict is :attr:`~witcert_calculus.tiers.Tier.EMPIRICAL` (decided from its
:class:`~witcert_calculus.tiers.Measurement` evidence): a replicated controlled effect is a
measurement, never a certificate. The rounds are paired by their index, and both runs of a
pair must share the regime.

Main declarations: :class:`Design`, :class:`Arm`, :class:`Run`, :class:`Attribution`,
:class:`DoseResponse`, :func:`compare_arms`, :func:`dose_response`, :func:`differing_knobs`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, final

from witcert_calculus.errors import ConfoundedComparisonError, InvalidValueError
from witcert_calculus.lean.theorems import CONFOUNDED_PAIR_UNIDENTIFIED, CONTROLLED_PAIR_ATTRIBUTES
from witcert_calculus.numerics.validation import positive_int
from witcert_calculus.tiers import Measurement, Tier, decide_tier

__all__ = ["Arm", "Attribution", "Design", "DoseResponse", "Run", "THEOREMS", "compare_arms",
           "differing_knobs", "dose_response"]

Value = str | int | bool
"""A knob's setting."""

THEOREMS: Final = (CONTROLLED_PAIR_ATTRIBUTES, CONFOUNDED_PAIR_UNIDENTIFIED)
"""The Lean theorems behind the two rules: attribution to a controlled pair, refusal of a
confounded one."""


@final
@dataclass(frozen=True, slots=True)
class Design:
    """The knobs a campaign varies, each with the settings it may take.

    Example:
        >>> d = Design({"prefix_caching": (False, True), "dtype": ("bf16", "fp8")})
        >>> d.arm("fp8-cached", prefix_caching=True, dtype="fp8").settings["dtype"]
        'fp8'
    """

    knobs: Mapping[str, tuple[Value, ...]]

    def __post_init__(self) -> None:
        if not isinstance(self.knobs, Mapping) or not self.knobs:
            raise InvalidValueError("knobs", self.knobs, "must map at least one knob name to "
                                    "its settings")
        frozen: dict[str, tuple[Value, ...]] = {}
        for name, values in self.knobs.items():
            if not isinstance(name, str) or not name.isidentifier():
                raise InvalidValueError("knob", name, "must be a name (an identifier)")
            if (not isinstance(values, tuple) or len(values) < 2
                    or not all(isinstance(v, str | int | bool) for v in values)
                    or len(set(values)) != len(values)):
                raise InvalidValueError(f"knobs[{name!r}]", values, "must be a tuple of at least "
                                        "two distinct settings (str, int or bool)")
            frozen[name] = values
        object.__setattr__(self, "knobs", MappingProxyType(dict(sorted(frozen.items()))))

    def arm(self, name: str, **settings: Value) -> Arm:
        """An arm of this design: every knob set to one of its settings.

        Raises:
            InvalidValueError: an unknown knob, a knob left unset, or a setting the knob
                does not take, by name.
        """
        return Arm(name, self, settings)


@final
@dataclass(frozen=True, slots=True)
class Arm:
    """A named setting of every knob of a design (checked against the design).

    Raises:
        InvalidValueError: an unknown knob, a knob left unset, or a setting the knob does
            not take, by name.
    """

    name: str
    design: Design
    settings: Mapping[str, Value]

    def __post_init__(self) -> None:
        name, design = self.name, self.design
        if not isinstance(name, str) or not name.strip():
            raise InvalidValueError("arm name", name, "must be a non-empty string")
        if not isinstance(design, Design):
            raise InvalidValueError(f"arm {name!r}: design", design, "must be a Design")
        if not isinstance(self.settings, Mapping):
            raise InvalidValueError(f"arm {name!r}: settings", self.settings,
                                    "must map each knob to its setting")
        unknown = sorted(set(self.settings) - set(design.knobs), key=str)
        if unknown:
            raise InvalidValueError("knob", unknown[0], f"is not a knob of the design "
                                    f"({', '.join(design.knobs)})")
        missing = [k for k in design.knobs if k not in self.settings]
        if missing:
            raise InvalidValueError(f"arm {name!r}", missing, "leaves these knobs unset")
        for k, v in self.settings.items():
            allowed = design.knobs[k]
            if not any(v == a and type(v) is type(a) for a in allowed):
                raise InvalidValueError(f"{name}.{k}", v, f"is not a setting of {k!r} "
                                        f"({', '.join(map(repr, allowed))})")
        object.__setattr__(self, "settings", MappingProxyType(dict(sorted(self.settings.items()))))


def differing_knobs(first: Arm, second: Arm) -> tuple[tuple[str, Value, Value], ...]:
    """The knobs in which two arms of one design differ, with both settings.

    Raises:
        InvalidValueError: arms of different designs.

    Example:
        >>> d = Design({"a": (0, 1), "b": (0, 1)})
        >>> differing_knobs(d.arm("x", a=0, b=0), d.arm("y", a=1, b=0))
        (('a', 0, 1),)
    """
    if first.design != second.design:
        raise InvalidValueError("arms", (first.name, second.name), "belong to different designs")
    return tuple((k, first.settings[k], second.settings[k]) for k in first.design.knobs
                 if first.settings[k] != second.settings[k])


@final
@dataclass(frozen=True, slots=True)
class Run:
    """One arm's measured outcome in one round (what a run artifact records).

    Attributes:
        arm: the arm that ran.
        round: the round's index (runs of different arms in one round are paired).
        outcome: the measured number (finite).
        regime: the regime it ran in (e.g. ``"idle host"``); paired runs must share it.
    """

    arm: Arm
    round: int
    outcome: float
    regime: str

    def __post_init__(self) -> None:
        if not isinstance(self.arm, Arm):
            raise InvalidValueError("arm", self.arm, "must be an Arm made by Design.arm")
        if isinstance(self.round, bool) or not isinstance(self.round, int) or self.round < 0:
            raise InvalidValueError("round", self.round, "must be an integer >= 0")
        if (isinstance(self.outcome, bool) or not isinstance(self.outcome, int | float)
                or not math.isfinite(self.outcome)):
            raise InvalidValueError("outcome", self.outcome, "must be a finite number")
        if not isinstance(self.regime, str) or not self.regime.strip():
            raise InvalidValueError("regime", self.regime, "must name the regime")


@final
@dataclass(frozen=True, slots=True)
class Attribution:
    """A controlled comparison's verdict.

    Attributes:
        knob: the one knob the two arms differ in, with its two settings.
        effects: the second arm's outcome minus the first's, by round (sorted by round).
        attributed: whether the effect replicated (the same nonzero sign in at least
            ``replications`` rounds, the opposite sign in none).
        reason: why it is or is not attributed.
        evidence: the measurement behind it (rounds as samples).
    """

    knob: tuple[str, Value, Value]
    effects: tuple[float, ...]
    attributed: bool
    reason: str
    evidence: Measurement

    @property
    def tier(self) -> Tier:
        """EMPIRICAL: a replicated controlled effect is a measurement."""
        return decide_tier(self.evidence)


def _paired(runs: Iterable[Run], arms: Sequence[Arm]) -> dict[int, list[float]]:
    """Outcomes by round, one per arm in order; every round must hold each arm once."""
    by_round: dict[int, dict[str, Run]] = {}
    names = [a.name for a in arms]
    for r in runs:
        if not isinstance(r, Run):
            raise InvalidValueError("run", r, "must be a Run")
        if r.arm.name not in names:
            continue
        if r.arm != arms[names.index(r.arm.name)]:
            raise InvalidValueError(f"run of {r.arm.name!r} in round {r.round}", r.arm.settings,
                                    "has other settings than the arm of that name")
        slot = by_round.setdefault(r.round, {})
        if r.arm.name in slot:
            raise InvalidValueError(f"round {r.round}", r.arm.name, "holds two runs of this arm")
        slot[r.arm.name] = r
    out: dict[int, list[float]] = {}
    for rnd in sorted(by_round):
        slot = by_round[rnd]
        missing = [n for n in names if n not in slot]
        if missing:
            raise InvalidValueError(f"round {rnd}", missing, "has no run of these arms: the "
                                    "arms are unmatched in that round")
        regimes = {slot[n].regime for n in names}
        if len(regimes) > 1:
            raise InvalidValueError(f"round {rnd}", sorted(regimes), "pairs runs of different "
                                    "regimes")
        out[rnd] = [slot[n].outcome for n in names]
    if not out:
        raise InvalidValueError("runs", names, "hold no round of these arms")
    return out


def compare_arms(runs: Iterable[Run], first: Arm, second: Arm, *,
                 replications: int = 3) -> Attribution:
    """Attribute the outcome difference of two arms to the one knob they differ in.

    Args:
        runs: the campaign's runs (runs of other arms are ignored).
        first: the baseline arm.
        second: the arm that changes one knob.
        replications: the rounds in which the effect must have the same nonzero sign (>= 1).

    Returns:
        The :class:`Attribution` (attributed or not, with its reason), EMPIRICAL.

    Raises:
        ConfoundedComparisonError: the arms differ in two or more knobs (never attributed).
        InvalidValueError: the same arm twice, arms of different designs, or rounds in which
            the arms are unmatched or ran in different regimes.

    Example:
        >>> d = Design({"cache": ("bf16", "fp8"), "prefix": (False, True)})
        >>> a = d.arm("bf16", cache="bf16", prefix=False)
        >>> b = d.arm("fp8", cache="fp8", prefix=False)
        >>> runs = [Run(arm, i, x, "idle") for i in range(3) for arm, x in ((a, 0.0), (b, 0.2))]
        >>> v = compare_arms(runs, a, b)
        >>> v.attributed, v.knob, v.tier.name
        (True, ('cache', 'bf16', 'fp8'), 'EMPIRICAL')
    """
    positive_int("replications", replications)
    knobs = differing_knobs(first, second)
    if len(knobs) > 1:
        raise ConfoundedComparisonError(first.name, second.name, knobs)
    if not knobs:
        raise InvalidValueError("arms", (first.name, second.name), "set every knob alike: "
                                "there is nothing to compare")
    (knob,) = knobs
    pairs = _paired(runs, [first, second])
    effects = tuple(b - a for a, b in pairs.values())
    up = sum(e > 0 for e in effects)
    down = sum(e < 0 for e in effects)
    sign, count, against = (1, up, down) if up >= down else (-1, down, up)
    attributed = count >= replications and against == 0
    if attributed:
        reason = (f"{count} of {len(effects)} rounds show a {'rise' if sign > 0 else 'fall'} "
                  f"and none the opposite (at least {replications} needed)")
    elif against:
        reason = (f"the sign is not replicated: {up} rounds rise, {down} fall, "
                  f"{len(effects) - up - down} show no change")
    else:
        reason = (f"{count} of {len(effects)} rounds show an effect; {replications} needed")
    k, before, after = knob
    evidence = Measurement(f"outcome of {second.name!r} minus {first.name!r}, {k}: "
                           f"{before!r} -> {after!r}", len(effects),
                           (("rule", CONTROLLED_PAIR_ATTRIBUTES),
                            ("replications", str(replications))))
    return Attribution(knob, effects, attributed, reason, evidence)


@final
@dataclass(frozen=True, slots=True)
class DoseResponse:
    """A dose–response verdict over one knob's settings, in dose order.

    Attributes:
        knob: the knob varied.
        doses: its settings, in the order given.
        outcomes: by round, the outcome at each dose.
        direction: ``+1`` (rising with the dose in every round), ``-1`` (falling), ``0`` (not
            monotone in some round, or flat).
        evidence: the measurement behind it.
    """

    knob: str
    doses: tuple[Value, ...]
    outcomes: tuple[tuple[float, ...], ...]
    direction: int
    evidence: Measurement

    @property
    def monotone(self) -> bool:
        """Whether the outcome moves the same way with the dose in every round."""
        return self.direction != 0

    @property
    def tier(self) -> Tier:
        """EMPIRICAL: a dose–response curve is a measurement."""
        return decide_tier(self.evidence)


def _direction(row: Sequence[float]) -> int:
    steps = [b - a for a, b in zip(row, row[1:], strict=False)]
    if all(s >= 0 for s in steps) and any(s > 0 for s in steps):
        return 1
    if all(s <= 0 for s in steps) and any(s < 0 for s in steps):
        return -1
    return 0


def dose_response(runs: Iterable[Run], arms: Sequence[Arm], knob: str) -> DoseResponse:
    """Whether the outcome is monotone in one knob's setting, all else equal.

    Args:
        runs: the campaign's runs.
        arms: at least three arms, in dose order, each differing from the next in ``knob``
            alone and all setting ``knob`` differently.
        knob: the knob varied.

    Raises:
        ConfoundedComparisonError: two consecutive arms that differ in another knob too.
        InvalidValueError: fewer than three doses, a repeated dose, an unknown knob, or
            unmatched rounds.

    Example:
        >>> d = Design({"seqs": (1, 8, 32), "cache": ("bf16", "fp8")})
        >>> arms = [d.arm(f"s{n}", seqs=n, cache="fp8") for n in (1, 8, 32)]
        >>> runs = [Run(a, r, float(i + r), "idle") for r in range(2)
        ...         for i, a in enumerate(arms)]
        >>> dose_response(runs, arms, "seqs").direction
        1
    """
    arms = list(arms)
    if len(arms) < 3:
        raise InvalidValueError("doses", [a.name for a in arms], "a dose-response claim needs "
                                "at least three doses")
    if knob not in arms[0].design.knobs:
        raise InvalidValueError("knob", knob, "is not a knob of the arms' design")
    doses = tuple(a.settings[knob] for a in arms)
    if len(set(doses)) != len(doses):
        raise InvalidValueError(f"doses of {knob!r}", doses, "repeat a setting")
    for a, b in zip(arms, arms[1:], strict=False):
        others = [d for d in differing_knobs(a, b) if d[0] != knob]
        if others:
            raise ConfoundedComparisonError(a.name, b.name, differing_knobs(a, b))
    outcomes = tuple(tuple(row) for row in _paired(runs, arms).values())
    directions = {_direction(row) for row in outcomes}
    direction = directions.pop() if len(directions) == 1 else 0
    evidence = Measurement(f"outcome against {knob!r} at {len(doses)} doses", len(outcomes),
                           (("rule", "monotone in every round"),))
    return DoseResponse(knob, doses, outcomes, direction, evidence)
