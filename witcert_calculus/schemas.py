"""Schemas: what a theorem certifies, as a function of named parameters.

A Lean theorem proves a family of contracts. Its :class:`Schema` says which, in Python:
the input and output metric families (both observed at the one site a caller names), the
coefficients (``a``, ``b``, ``delta``, the domain ``cap`` and a transfer) as a function of
named parameters (a :class:`Claim`), the premises with the checkers that compute each from
the parameters, and the fragments of the Lean statement that state the claim. A proof backing
a contract is issued only by :meth:`Schema.issue`, for exactly the claim the schema computes
from the parameters given; a contract whose numbers differ from that claim is refused
(:class:`~witcert_calculus.errors.EvidenceMismatchError`), and ``explain()`` names the
theorem and the parameters its numbers came from.

The library's bridges are built-in schemas (:data:`~witcert_calculus.bridges.SCHEMAS`); each
coefficient formula is written once, in its schema. The fast formal sync check
(``scripts/check_formal_sync.sh``) compares every built-in schema with its theorem's committed
statement (:func:`check_schemas`): a statement that no longer states the schema's claim fails
there. A theorem of your own (registered with
:func:`~witcert_calculus.lean.theorems.register_theorems`) gets a schema of your own; a schema
for a theorem of the shipped export that is not the library's own is refused when it issues.

Main declarations: :class:`Claim`, :class:`Schema`, :func:`builtin_schemas`,
:func:`check_schemas`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Final, cast, final

import numpy as np

from witcert_calculus.contracts import Contract, Number, Transfer, _proved  # pyright: ignore[reportPrivateUsage]
from witcert_calculus.errors import InvalidValueError
from witcert_calculus.lean.theorems import BUILTIN_ORIGIN, ID_SOUND, lookup
from witcert_calculus.metrics import AtConsume, Metric, Site, at, metric_info
from witcert_calculus.tiers import Assumption

__all__ = ["IDENTITY", "Claim", "Schema", "builtin_schemas", "check_schemas"]


@final
@dataclass(frozen=True, slots=True)
class Claim:
    """The numbers of one contract a schema certifies: ``e_out <= a e_in + b`` except with
    probability ``delta``, on ``e_in <= cap``, and below ``transfer(e_in)`` when one is given."""

    a: Number
    b: Number
    delta: Number = 0
    cap: Number | None = None
    transfer: Transfer | None = None


Checker = Callable[..., bool]


@final
@dataclass(frozen=True, slots=True, eq=False)
class Schema:
    """What a theorem certifies about one family of contracts.

    Attributes:
        theorem: the Lean theorem, by its qualified name (it must be exported).
        m_in / m_out: the metric families (classes such as ``KeyResidualAbs``), observed at
            the site :meth:`issue` is given; ``None`` for both: any one metric on both sides,
            given in place of the site (the identity).
        params: the names of the parameters the claim is a function of.
        claim: the parameters -> the :class:`Claim`.
        premises: ``(statement, checker)`` pairs; each checker computes from the parameters
            whether its premise holds (a ``bool``).
        states: fragments of the theorem's Lean statement that state the claim, with the
            names it uses written without their ``WitCert.`` root (for a theorem of a
            registered export, checked here against its statement; for the library's own,
            against the committed statement by :func:`check_schemas`).
        name: the stage name of the contracts it issues.
        assumptions: what every contract of the schema assumes and no code checks (its tier
            is then at most PARTIALLY_CERTIFIED).

    Raises:
        UnknownTheoremError: if no registered export holds ``theorem``.
        InvalidValueError: on a parameter name that is not an identifier, a premise that is
            not a ``(statement, function)`` pair, or metric families that are not registered.

    Example:
        >>> from witcert_calculus import AtConsume, score_bridge
        >>> from witcert_calculus.bridges import SCHEMAS
        >>> c = SCHEMAS["score_bridge"].issue(AtConsume, scale=Fraction(1, 8), q_norm_max=8)
        >>> c == score_bridge(AtConsume, scale=0.125, q_norm_max=8), float(c.a)
        (True, 1.0)
    """

    theorem: str
    m_in: type[Metric[Any]] | None
    m_out: type[Metric[Any]] | None
    params: tuple[str, ...]
    claim: Callable[..., Claim]
    premises: tuple[tuple[str, Checker], ...] = ()
    states: tuple[str, ...] = ()
    name: str = ""
    assumptions: tuple[Assumption, ...] = ()

    def __post_init__(self) -> None:
        record = lookup(self.theorem)
        if (self.m_in is None) != (self.m_out is None):
            raise InvalidValueError("m_out", self.m_out, "both families are given, or neither")
        for family in (self.m_in, self.m_out):
            if family is not None:
                metric_info(at(family, AtConsume))
        if not isinstance(self.params, tuple) or not all(
                isinstance(p, str) and p.isidentifier() for p in self.params):
            raise InvalidValueError("params", self.params, "must be a tuple of parameter names")
        if not callable(self.claim):
            raise InvalidValueError("claim", self.claim, "must compute a Claim from the parameters")
        for pair in self.premises:
            if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)
                    and pair[0].strip() and callable(pair[1])):
                raise InvalidValueError("premises", pair, "must be (statement, checker) pairs")
        if not all(isinstance(s, str) and s for s in self.states):
            raise InvalidValueError("states", self.states, "must be statement fragments")
        # A schema of the user's own theorem is checked against its registered statement
        # here; the library's own against the committed lock by the formal sync check.
        if record.origin != BUILTIN_ORIGIN:
            for fragment in self.states:
                if fragment not in _unrooted(record.statement):
                    raise InvalidValueError("states", fragment,
                                            f"{self.theorem} does not state it: "
                                            f"{record.statement}")

    def issue(self, site: type[Site] | type[Metric[Any]], /, *, name: str | None = None,
              **params: object) -> Contract[Any, Any]:
        """The contract this schema certifies for ``params``, observed at ``site``.

        Each premise's checker runs here; the proof is issued for exactly the claim computed
        from ``params``.

        Raises:
            InvalidValueError: on missing or unexpected parameters, a claim that is not a
                :class:`Claim`, a checker that returns no ``bool``, or a schema of another
                origin for a theorem of the shipped export.
            PremiseError: if a checker finds its premise false.
        """
        if sorted(params) != sorted(self.params):
            raise InvalidValueError("params", sorted(params),
                                    f"{self.theorem}'s schema takes {list(self.params)}")
        if lookup(self.theorem).origin == BUILTIN_ORIGIN and id(self) not in _BUILTIN:
            raise InvalidValueError("theorem", self.theorem, "is a theorem of the shipped export: "
                                    "its schemas are the library's own (builtin_schemas())")
        claim = self.claim(**params)
        if not isinstance(claim, Claim):
            raise InvalidValueError("claim", claim, "the schema's claim function returns a Claim")
        checked: list[tuple[str, bool]] = []
        for statement, checker in self.premises:
            truth = checker(**params)
            if not isinstance(truth, bool):
                raise InvalidValueError(f"premises[{statement!r}]", truth,
                                        "the checker must return a bool")
            checked.append((statement, truth))
        if self.m_in is None or self.m_out is None:
            m_in: Any = site
            m_out: Any = site
        else:
            m_in, m_out = at(self.m_in, site), at(self.m_out, site)  # type: ignore[arg-type]
        return _proved(m_in, m_out, a=claim.a, b=claim.b, delta=claim.delta, cap=claim.cap,
                       transfer=claim.transfer, theorem=self.theorem,
                       name=self.name if name is None else name, premises=checked,
                       assumptions=self.assumptions, params=_describe(params))


def _unrooted(statement: str) -> str:
    """A statement as the schemas quote it: definitions named without the ``WitCert.`` root
    (so that a fragment never reads as a theorem name the package cites)."""
    return statement.replace("WitCert.", "")


def _describe(params: Mapping[str, object]) -> str:
    """The parameters as a reader sees them in ``explain()`` (arrays by their size)."""
    parts: list[str] = []
    for key in sorted(params):
        value = params[key]
        if isinstance(value, (tuple, list, np.ndarray)):
            parts.append(f"{key}=<{np.size(cast(Any, value))} values>")
        elif isinstance(value, Fraction) and value.denominator > 10**4:
            parts.append(f"{key}={float(value):.6g}")
        else:
            parts.append(f"{key}={value}")
    return ", ".join(parts)


_BUILTIN: dict[int, Schema] = {}


def _builtin(schema: Schema) -> Schema:
    """Mark one of the library's own schemas (the bridges', the identity's, the meters')."""
    _BUILTIN[id(schema)] = schema
    return schema


#: The identity ``e_out <= e_in`` on any one metric: the claim of
#: :func:`~witcert_calculus.contracts.identity` (which issues it directly, being the unit this
#: module's contracts compose with; ``IDENTITY.issue(metric) == identity(metric)``).
IDENTITY: Final = _builtin(Schema(ID_SOUND, None, None, (), lambda: Claim(a=1, b=0),
                                  states=("≤ 1 * X.err x x' + 0",),
                                  name="identity"))


def builtin_schemas() -> tuple[Schema, ...]:
    """Every schema of the library's own defined so far, in order: :data:`IDENTITY`, the
    bridges' (:data:`witcert_calculus.bridges.SCHEMAS`) once that module is imported, the
    output bound's (:data:`witcert_calculus.meters.output_bound.OUTPUT_ERROR`) once that one
    is."""
    return tuple(_BUILTIN.values())


def check_schemas(statements: Mapping[str, str]) -> list[str]:
    """Compare every built-in schema with the committed Lean statements.

    Args:
        statements: theorem name -> elaborated statement (``formal/statements.lock.json``).

    Returns:
        One line per disagreement (empty when every schema's theorem is there and its
        statement states each of the schema's fragments).
    """
    problems: list[str] = []
    for schema in builtin_schemas():
        statement = statements.get(schema.theorem)
        if statement is None:
            problems.append(f"{schema.name}: {schema.theorem} is not in the statement lock")
            continue
        if not schema.states:
            problems.append(f"{schema.name}: no fragment of {schema.theorem} is stated")
        problems.extend(f"{schema.name}: {schema.theorem} no longer states {fragment!r}"
                        for fragment in schema.states if fragment not in _unrooted(statement))
    return problems
