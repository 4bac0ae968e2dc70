"""Proved values for tests of what consumes them (the ledger, composition, the journal).

Evidence is issued by the library code that checked it (``witcert_calculus.tiers``); the
tests of a consumer need proved inputs without running a meter for each, so they take them
from the library's own private issuers here, in one place. Tests of issuance itself
(``tests/test_evidence.py``) never use this module: they show that the public routes refuse
what these helpers produce.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from witcert_calculus.contracts import (
    Contract,
    Number,
    Reading,
    Regime,
    Transfer,
    _proved,  # pyright: ignore[reportPrivateUsage]
    _reading,  # pyright: ignore[reportPrivateUsage]
)
from witcert_calculus.tiers import (
    Assumption,
    Evidence,
    Premise,
    Proof,
    Restricted,
    _premise,  # pyright: ignore[reportPrivateUsage]
    _proof,  # pyright: ignore[reportPrivateUsage]
)


def premise(statement: str, holds: bool) -> Premise:
    """A premise whose truth the test computed."""
    return _premise(statement, holds)


def proof(theorem: str, premises: tuple[Premise, ...] = (),
          claim: tuple[object, ...] = ()) -> Proof:
    """A proof of ``theorem`` as a meter issues it (no contract claim)."""
    return _proof(theorem, premises, claim)


def reading(metric: Any, raw: float, *, evidence: Evidence,
            delta: Fraction | float = 0.0, regime: Regime = Regime.BOUND) -> Reading[Any]:
    """A reading as a meter issues it."""
    return _reading(metric, raw, evidence=evidence, delta=delta, regime=regime)


def contract(m_in: Any, m_out: Any, *, a: Number, b: Number, theorem: str, name: str,
             premises: tuple[tuple[str, bool], ...] = (), delta: Number = 0,
             cap: Number | None = None, transfer: Transfer | None = None,
             assumptions: tuple[Assumption, ...] = ()) -> Contract[Any, Any]:
    """A contract proved by ``theorem`` for exactly its own claim, as a bridge issues it."""
    return _proved(m_in, m_out, a=a, b=b, theorem=theorem, name=name, premises=premises,
                   delta=delta, cap=cap, transfer=transfer, assumptions=assumptions)


def stage(m_in: Any, m_out: Any, *, a: Number, b: Number, evidence: Evidence, name: str,
          delta: Number = 0, cap: Number | None = None,
          transfer: Transfer | None = None) -> Contract[Any, Any]:
    """A contract with the given evidence's theorem, premises and assumptions, its proof
    issued for this contract's claim (a measurement is kept as it is)."""
    assumptions: tuple[Assumption, ...] = ()
    if isinstance(evidence, Proof):
        theorem, premises = evidence.theorem, evidence.premises
    elif isinstance(evidence, Restricted):
        theorem, premises = evidence.proof.theorem, evidence.proof.premises
        assumptions = evidence.assumptions
    else:
        return Contract(m_in, m_out, a=a, b=b, evidence=evidence, name=name, delta=delta,
                        cap=cap, transfer=transfer)
    return _proved(m_in, m_out, a=a, b=b, theorem=theorem, name=name,
                   premises=tuple((p.statement, p.holds) for p in premises), delta=delta,
                   cap=cap, transfer=transfer, assumptions=assumptions)
