"""The diagnosis calculus (``witcert_calculus.explore.diagnosis``): controlled pairs are
attributed only when the effect replicates, confounded pairs are refused by name, dose-response
needs three doses and monotone rounds, and every verdict is EMPIRICAL."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from witcert_calculus import ConfoundedComparisonError, InvalidValueError, Tier
from witcert_calculus.explore.diagnosis import (
    THEOREMS,
    Arm,
    Design,
    Run,
    compare_arms,
    differing_knobs,
    dose_response,
)
from witcert_calculus.lean.theorems import lookup

DESIGN = Design({"prefix_caching": (False, True), "cache": ("bf16", "fp8"),
                 "seqs": (1, 8, 32)})
BASE = DESIGN.arm("base", prefix_caching=False, cache="bf16", seqs=8)
FP8 = DESIGN.arm("fp8", prefix_caching=False, cache="fp8", seqs=8)
BOTH = DESIGN.arm("fp8+pc", prefix_caching=True, cache="fp8", seqs=8)


def _runs(arm: Arm, outcomes: list[float], regime: str = "idle") -> list[Run]:
    return [Run(arm, i, x, regime) for i, x in enumerate(outcomes)]


def test_a_replicated_controlled_effect_is_attributed_to_its_knob_and_stays_empirical() -> None:
    runs = _runs(BASE, [0.0, 0.0, 0.0]) + _runs(FP8, [0.3, 0.1, 0.2])
    v = compare_arms(runs, BASE, FP8, replications=3)
    assert v.attributed and v.knob == ("cache", "bf16", "fp8")
    assert v.effects == pytest.approx((0.3, 0.1, 0.2))
    assert v.tier is Tier.EMPIRICAL and v.evidence.samples == 3
    assert "3 of 3 rounds show a rise" in v.reason


@pytest.mark.parametrize(("second", "why"), [
    ([0.3, 0.0, 0.2], "2 of 3 rounds show an effect; 3 needed"),
    ([0.3, -0.1, 0.2], "the sign is not replicated: 2 rounds rise, 1 fall"),
])
def test_an_effect_that_does_not_replicate_is_not_attributed(second: list[float],
                                                             why: str) -> None:
    v = compare_arms(_runs(BASE, [0.0] * 3) + _runs(FP8, second), BASE, FP8, replications=3)
    assert not v.attributed and why in v.reason
    assert v.tier is Tier.EMPIRICAL


def test_a_confounded_comparison_is_refused_naming_both_knobs() -> None:
    runs = _runs(BASE, [0.0] * 3) + _runs(BOTH, [0.5] * 3)
    with pytest.raises(ConfoundedComparisonError,
                       match=r"'base' and 'fp8\+pc' differ in 2 knobs: cache \('bf16' vs 'fp8'\),"
                             r" prefix_caching \(False vs True\)") as info:
        compare_arms(runs, BASE, BOTH)
    assert info.value.knobs == (("cache", "bf16", "fp8"), ("prefix_caching", False, True))
    back = pickle.loads(pickle.dumps(info.value))
    assert str(back) == str(info.value)


@given(st.dictionaries(st.sampled_from(sorted(DESIGN.knobs)), st.integers(0, 2), min_size=0),
       st.dictionaries(st.sampled_from(sorted(DESIGN.knobs)), st.integers(0, 2), min_size=0))
def test_a_comparison_is_attributed_refused_or_rejected_by_the_number_of_differing_knobs(
        pick_a: dict[str, int], pick_b: dict[str, int]) -> None:
    """Whatever two arms are drawn: one differing knob gives a verdict naming it, two or more
    are refused (never attributed), none is rejected as nothing to compare."""
    def arm(name: str, pick: dict[str, int]) -> Arm:
        return DESIGN.arm(name, **{k: DESIGN.knobs[k][pick.get(k, 0) % len(DESIGN.knobs[k])]
                                   for k in DESIGN.knobs})
    a, b = arm("a", pick_a), arm("b", pick_b)
    runs = _runs(a, [0.0] * 3) + _runs(b, [1.0] * 3)
    knobs = differing_knobs(a, b)
    if len(knobs) == 1:
        v = compare_arms(runs, a, b)
        assert v.attributed and v.knob == knobs[0]
    elif knobs:
        with pytest.raises(ConfoundedComparisonError):
            compare_arms(runs, a, b)
    else:
        with pytest.raises(InvalidValueError, match="nothing to compare"):
            compare_arms(runs, a, b)


@pytest.mark.parametrize(("runs", "match"), [
    (_runs(BASE, [0.0, 0.0]) + _runs(FP8, [0.1]), r"round 1.*has no run of these arms"),
    (_runs(BASE, [0.0]) + _runs(FP8, [0.1], regime="busy"), "pairs runs of different regimes"),
    (_runs(BASE, [0.0]) + [Run(BASE, 0, 0.1, "idle")] + _runs(FP8, [0.1]),
     "holds two runs of this arm"),
    (_runs(BOTH, [0.0]), "hold no round of these arms"),
])
def test_unmatched_rounds_are_refused_by_round(runs: list[Run], match: str) -> None:
    with pytest.raises(InvalidValueError, match=match):
        compare_arms(runs, BASE, FP8, replications=1)


@pytest.mark.parametrize(("make", "match"), [
    (lambda: DESIGN.arm("x", prefix_caching=False, cache="bf16", seqs=8, tp=2),
     "knob='tp' is invalid"),
    (lambda: DESIGN.arm("x", prefix_caching=False, cache="bf16"), "leaves these knobs unset"),
    (lambda: DESIGN.arm("x", prefix_caching=False, cache="int4", seqs=8), "x.cache='int4'"),
    (lambda: DESIGN.arm("x", prefix_caching=0, cache="bf16", seqs=8), "x.prefix_caching=0"),
    (lambda: DESIGN.arm("", prefix_caching=False, cache="bf16", seqs=8), "arm name"),
    (lambda: Design({}), "at least one knob"),
    (lambda: Design({"a": (1,)}), "at least two distinct settings"),
    (lambda: Design({"not a name": (1, 2)}), "must be a name"),
    (lambda: Run(BASE, -1, 0.0, "idle"), "round=-1"),
    (lambda: Run(BASE, 0, float("nan"), "idle"), "must be a finite number"),
    (lambda: Run(BASE, 0, 0.0, " "), "must name the regime"),
    (lambda: compare_arms([], BASE, BASE), "nothing to compare"),
    (lambda: compare_arms([], BASE, FP8, replications=0), "replications"),
    (lambda: differing_knobs(BASE, Design({"a": (0, 1)}).arm("y", a=0)), "different designs"),
])
def test_bad_input_is_refused_by_name(make: Any, match: str) -> None:
    with pytest.raises(InvalidValueError, match=match):
        make()


def test_arms_and_designs_are_read_only() -> None:
    with pytest.raises(TypeError):
        BASE.settings["cache"] = "fp8"  # type: ignore[index]
    with pytest.raises(TypeError):
        DESIGN.knobs["cache"] = ("x", "y")  # type: ignore[index]


def test_dose_response_needs_three_doses_all_else_equal_and_monotone_rounds() -> None:
    arms = [DESIGN.arm(f"s{n}", prefix_caching=False, cache="fp8", seqs=n) for n in (1, 8, 32)]
    rising = [Run(a, r, float(i) + 0.1 * r, "idle") for r in range(3) for i, a in enumerate(arms)]
    v = dose_response(rising, arms, "seqs")
    assert v.monotone and v.direction == 1 and v.doses == (1, 8, 32)
    assert v.tier is Tier.EMPIRICAL and v.evidence.samples == 3
    # one round out of order: no dose-response
    bent = rising[:-1] + [Run(arms[2], 2, 0.5, "idle")]
    assert dose_response(bent, arms, "seqs").direction == 0
    with pytest.raises(InvalidValueError, match="at least three doses"):
        dose_response(rising, arms[:2], "seqs")
    mixed = [arms[0], DESIGN.arm("s8-bf16", prefix_caching=False, cache="bf16", seqs=8), arms[2]]
    with pytest.raises(ConfoundedComparisonError, match="cache"):
        dose_response(rising, mixed, "seqs")
    with pytest.raises(InvalidValueError, match="repeat a setting"):
        dose_response(rising, [arms[0], arms[1], arms[0]], "seqs")


def test_the_rules_cite_exported_theorems_that_state_them() -> None:
    attributes, refuses = (lookup(n) for n in THEOREMS)
    assert "IgnoresKnob k f → f a = f b" in attributes.statement
    assert "differ K a b = [k]" in attributes.statement
    assert "∃ f g," in refuses.statement
    assert "IgnoresKnob k₂ f ∧ WitCert.Diagnosis.IgnoresKnob k₁ g" in refuses.statement
    v = compare_arms(_runs(BASE, [0.0]) + _runs(FP8, [1.0]), BASE, FP8, replications=1)
    assert dict(v.evidence.extra)["rule"] == attributes.name
