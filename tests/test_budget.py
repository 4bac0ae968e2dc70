"""The exact probability type: validation, exactness through the journal, rounding direction."""

from __future__ import annotations

import dataclasses
import json
import math
import pickle
import sqlite3
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from witcert_calculus.accounting.budget import telescoping_delta, telescoping_spent
from witcert_calculus.errors import InvalidValueError, WitcertError
from witcert_calculus.ledger import RiskLedger
from witcert_calculus.metrics import AtConsume, AttentionTV
from witcert_calculus.numerics.probability import Probability
from witcert_calculus.tiers import Proof
from reference.issued import proof

TV = AttentionTV[AtConsume]
PROOF = proof("WitCert.Meters.tv_eform_sound")

# Numerators and denominators far beyond float precision and range (down to 2^-1200).
_DEN = st.integers(1, 2**1200)


@st.composite
def unit_fractions(draw: st.DrawFn, *, open_interval: bool = False) -> Fraction:
    q = draw(_DEN)
    lo, hi = (1, q - 1) if open_interval else (0, q)
    if lo > hi:
        q, lo, hi = 2, 1, 1
    return Fraction(draw(st.integers(lo, hi)), q)


# ----------------------------------------------------------------- construction


@pytest.mark.parametrize("bad,reason", [
    (True, "must be a number in"), (None, "must be a number in"), (b"1/2", "must be a number in"),
    (math.nan, "must be finite"), (math.inf, "must be finite"), (-math.inf, "must be finite"),
    (-0.1, "must lie in the closed interval"), (1.5, "must lie in the closed interval"),
    (Fraction(-1, 10**30), "must lie in the closed interval"), (2, "must lie in the closed"),
    ("x", "is not a number"), ("1/0", "is not a number"), ("nan", "is not a number")])
def test_bad_probability_names_the_value(bad: object, reason: str) -> None:
    with pytest.raises(InvalidValueError, match=reason) as info:
        Probability.of(bad, name="delta_loc")  # type: ignore[arg-type]
    err = info.value
    assert isinstance(err, WitcertError) and isinstance(err, ValueError)
    assert err.name == "delta_loc" and err.value is bad
    assert f"delta_loc={bad!r}" in str(err)
    assert pickle.loads(pickle.dumps(err)).args == err.args


@pytest.mark.parametrize("bad", [0, 1, 0.0, 1.0, "0", "1", Fraction(1), Probability.of(0),
                                 Probability.of(1)])
def test_a_budget_is_in_the_open_interval(bad: object) -> None:
    with pytest.raises(InvalidValueError, match=r"delta_req=.* must lie in the open interval"):
        Probability.budget(bad)  # type: ignore[arg-type]


def test_the_constructor_takes_a_fraction_in_the_unit_interval() -> None:
    with pytest.raises(InvalidValueError, match="probability=0.5 .*Probability.of"):
        Probability(0.5)  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match="closed interval"):
        Probability(Fraction(3, 2))
    assert Probability(Fraction(1, 3)) == Probability.of("1/3") == Probability.of(Fraction(2, 6))


def test_frozen_slotted_and_ordered() -> None:
    p = Probability.of("1/100")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.exact = Fraction(1, 2)  # type: ignore[misc]
    assert not hasattr(p, "__dict__")
    assert Probability.of(0) < p < Probability.of(1)
    assert Probability.of(p) is p and Probability.budget(p) is p
    assert pickle.loads(pickle.dumps(p)) == p and hash(p) == hash(Probability.of("1/100"))


def test_floats_are_taken_exactly() -> None:
    assert Probability.of(0.1).exact == Fraction(0.1) != Fraction(1, 10)
    assert Probability.of("0.1").exact == Fraction(1, 10)


# ----------------------------------------------------------------- rounding at the edge


@given(x=unit_fractions())
@settings(max_examples=400, deadline=None)
def test_float_down_and_up_bracket_the_exact_value(x: Fraction) -> None:
    p = Probability(x)
    down, up = p.float_down(), p.float_up()
    assert Fraction(down) <= x <= Fraction(up)
    assert 0.0 <= down <= up <= 1.0
    # adjacent floats (or equal, when the value is a float): no slack beyond one rounding
    assert up == down or math.nextafter(down, math.inf) == up
    assert (up == down) == (Fraction(down) == x)


@given(f=st.floats(0.0, 1.0))
def test_a_float_value_rounds_to_itself(f: float) -> None:
    p = Probability.of(f)
    assert p.float_down() == p.float_up() == f


def test_rounding_direction_adversarial_cases() -> None:
    third = Probability.of("1/3")
    assert Fraction(third.float_down()) < third.exact < Fraction(third.float_up())
    tiny = Probability(Fraction(1, 2**1100))  # below the smallest subnormal float
    assert tiny.float_down() == 0.0 and tiny.float_up() == 5e-324
    near_one = Probability(1 - Fraction(1, 2**80))
    assert near_one.float_down() == math.nextafter(1.0, 0.0) and near_one.float_up() == 1.0
    assert Probability.of(1).float_down() == 1.0 and Probability.of(0).float_up() == 0.0


@given(x=unit_fractions(open_interval=True), parts=st.integers(1, 10**9))
@settings(max_examples=200, deadline=None)
def test_split_is_exact_and_its_float_down_is_safe(x: Fraction, parts: int) -> None:
    share = Probability(x).split(parts)
    assert share.exact == x / parts
    assert Fraction(share.float_down()) * parts <= x  # the union over the parts stays within x


@pytest.mark.parametrize("bad", [0, -1, 1.0, True])
def test_split_names_a_bad_part_count(bad: object) -> None:
    with pytest.raises(InvalidValueError, match=f"parts={bad!r}"):
        Probability.of("1/2").split(bad)  # type: ignore[arg-type]


# ----------------------------------------------------------------- exact to the journal


@given(x=unit_fractions(open_interval=True))
@settings(max_examples=100, deadline=None)
def test_text_round_trip_is_exact(x: Fraction) -> None:
    p = Probability.budget(x)
    assert Probability.budget(p.to_text()) == p and p.to_text() == str(x)


def test_journal_round_trip_keeps_the_budget_exact(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    budgets = [Fraction(1, 3), Fraction(2**200 - 1, 2**201), Fraction(0.1), Fraction(1, 10**40)]
    led = RiskLedger(journal=path)
    ids = [led.open_request(delta_req=Probability.budget(b)) for b in budgets]
    ids.append(led.open_request(delta_req=0.1))  # a float is taken exactly too
    for r in ids:
        led.admit_entries(r, [0.0], threshold=0.0, metric=TV, evidence=PROOF,
                          delta=led.next_allowance(r))
    led.close()
    again = RiskLedger(journal=path)
    for r, b in zip(ids, [*budgets, Fraction(0.1)], strict=True):
        v = again.verdict(r)
        assert v.delta_req == b and v.spent == telescoping_spent(1, b) == telescoping_delta(0, b)
    again.close()
    with sqlite3.connect(path) as con:
        stored = [json.loads(p)["delta_req"] for (p,) in
                  con.execute("SELECT payload FROM events WHERE op='open' ORDER BY seq")]
    assert stored == [str(b) for b in [*budgets, Fraction(0.1)]]


def test_telescoping_accepts_the_probability_type() -> None:
    p = Probability.budget("1/100")
    assert telescoping_delta(1, p) == telescoping_delta(1, "1/100") == Fraction(1, 600)
    assert telescoping_spent(2, p) == Fraction(2, 300)

