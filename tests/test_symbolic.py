"""Symbolic chains agree with the numeric chain; gate-law inverses invert the forward bridges."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import pytest
import sympy as sp

from witcert_calculus import (
    AtConsume,
    Contract,
    InvalidValueError,
    score_bridge,
    softmax_tv_affine,
    softmax_tv_eform,
    softmax_tv_tanh,
    softmax_tv_tanh_osc,
    witness_contract,
)
from witcert_calculus.explore.gate_laws import gate_bound, gate_threshold
from witcert_calculus.explore.symbolic import (
    forward_law,
    gate_law,
    invert,
    saturation_point,
    symbolic_chain,
)


def _chains() -> list[Contract[Any, Any]]:
    score = score_bridge(AtConsume, scale=0.125, q_norm_max=12.0)
    return [softmax_tv_eform(AtConsume), softmax_tv_tanh(AtConsume), softmax_tv_tanh_osc(AtConsume),
            score >> softmax_tv_eform(AtConsume), score >> softmax_tv_tanh(AtConsume),
            score >> softmax_tv_affine(AtConsume, eps0=0.05),
            witness_contract(AtConsume, witness_max=0.02) >> score >> softmax_tv_eform(AtConsume)]


@pytest.mark.parametrize("index", range(7))
def test_symbolic_value_matches_the_numeric_chain(index: int) -> None:
    c = _chains()[index]
    s = symbolic_chain(c)
    hi = 2.0 if c.cap is None else float(c.cap)
    for x in [hi * i / 37 for i in range(38)]:
        num, sym = c.bound(x).value, s.value(x)
        assert sym <= num  # the numeric chain rounds up
        assert num - sym <= 1e-12 * max(1.0, num), (x, num, sym)


def test_derivative_matches_a_finite_difference_of_the_numeric_chain() -> None:
    c = score_bridge(AtConsume, scale=0.125, q_norm_max=12.0) >> softmax_tv_eform(AtConsume)
    s = symbolic_chain(c)
    d = sp.diff(s.numeric(reported=False), s.x)
    x, h = 0.05, 1e-6
    fd = (c.bound(x + h).value - c.bound(x - h).value) / (2 * h)
    assert float(d.subs(s.x, sp.Rational(1, 20))) == pytest.approx(fd, rel=1e-5)


def test_parameters_are_the_contract_coefficients() -> None:
    c = score_bridge(AtConsume, scale=0.125, q_norm_max=12.0) >> softmax_tv_eform(AtConsume)
    s = symbolic_chain(c)
    a1 = sp.Symbol("a_1", nonnegative=True)
    assert s.params[a1] == sp.Rational(c.parts[0].a.numerator, c.parts[0].a.denominator)
    # Another slope gives another chain: the expression really is in the parameters.
    moved = s.expr.subs({**s.params, a1: 2 * s.params[a1]})
    assert float(moved.subs(s.x, 1) - s.numeric(reported=False).subs(s.x, 1)) > 0


@pytest.mark.parametrize(("form", "printed"), [("eform", 0.1682361), ("osc", 0.8109302),
                                               ("tanh", None)])
def test_gate_law_inverts_the_forward_bridge(form: str, printed: float | None) -> None:
    law, tau = gate_law(form)
    fwd, w = forward_law(form)
    assert sp.simplify(fwd.subs(w, law) - tau) == 0
    solved = invert(fwd, w, tau)
    for t in (sp.Rational(1, 100), sp.Rational(1, 5), sp.Rational(9, 10)):
        assert abs(sp.N((solved - law).subs(tau, t), 30)) < 1e-25
    t = sp.Rational(1, 5)
    x = float(law.subs(tau, t))
    assert x == pytest.approx(gate_threshold(0.2, form=form), rel=1e-15)
    assert gate_bound(gate_threshold(0.2, form=form), form=form) <= 0.2
    if printed is not None:
        assert round(x, 7) == printed


def test_affine_gate_law_holds_the_domain_cap() -> None:
    law, tau = gate_law("affine")
    eps0 = sp.Symbol("eps0", positive=True)
    for t, cap in ((Fraction(1, 5), Fraction(1, 20)), (Fraction(1, 100), Fraction(1, 20))):
        x = float(law.subs({tau: sp.Rational(t), eps0: sp.Rational(cap)}))
        assert x == pytest.approx(gate_threshold(float(t), form="affine", eps0=float(cap)),
                                  rel=1e-15)


def test_saturation_point_is_where_the_numeric_chain_saturates() -> None:
    c = score_bridge(AtConsume, scale=0.125, q_norm_max=12.0) >> softmax_tv_eform(AtConsume)
    p = saturation_point(symbolic_chain(c))
    assert p is not None
    assert p == pytest.approx(math.log(3) / 2 / 1.5, rel=1e-12)
    assert c.bound(p * (1 + 1e-9)).value == 1.0
    assert c.bound(p * (1 - 1e-9)).value < 1.0
    assert saturation_point(symbolic_chain(softmax_tv_eform(AtConsume))) == pytest.approx(
        math.log(3) / 2, rel=1e-14)


def test_tanh_forms_never_saturate() -> None:
    assert saturation_point(symbolic_chain(softmax_tv_tanh(AtConsume))) is None
    assert saturation_point(symbolic_chain(
        score_bridge(AtConsume, scale=0.125, q_norm_max=12.0) >> softmax_tv_tanh(AtConsume))) is None


def test_bad_inputs_are_named() -> None:
    s = symbolic_chain(score_bridge(AtConsume, scale=0.125, q_norm_max=12.0)
                       >> softmax_tv_affine(AtConsume, eps0=0.05))
    with pytest.raises(InvalidValueError, match="cap"):
        s.value(1.0)
    with pytest.raises(InvalidValueError, match="e_in"):
        s.value(-0.1)
    with pytest.raises(InvalidValueError, match="form"):
        gate_law("nope")
    with pytest.raises(InvalidValueError, match="solutions"):
        w = sp.Symbol("w")
        invert(w ** 2 - 1, w, sp.Integer(-2))
