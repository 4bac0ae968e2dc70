"""Gate-law inverses and the exact zero-failure rate: each tested against its forward formula."""

from __future__ import annotations

import math

import mpmath as mp
import pytest

from witcert_calculus import (
    AtConsume,
    GateForm,
    gate_bound,
    gate_threshold,
    rate_upper_bound,
    rate_upper_bound_exact,
    recurrence,
)
from witcert_calculus.errors import InvalidValueError

TAUS = [1e-9, 1e-4, 0.01, 0.05, 0.2, 0.5, 0.9, 0.999]


def test_the_published_thresholds_at_tau_0_2() -> None:
    assert f"{gate_threshold(0.2, form='eform'):.7f}" == "0.1682361"  # 1/2 ln(1.4)
    assert f"{gate_threshold(0.2, form='osc'):.7f}" == "0.8109302"  # 4 atanh(0.2)
    assert gate_threshold(0.2, form=GateForm.TANH) == pytest.approx(2 * math.atanh(0.2))


@pytest.mark.parametrize("form", ["eform", "osc", "tanh"])
@pytest.mark.parametrize("tau", TAUS)
def test_the_threshold_is_the_largest_witness_at_or_below_tau(form: str, tau: float) -> None:
    x = gate_threshold(tau, form=form)
    with mp.workdps(50):
        assert _exact(form, x) <= tau  # sound: the threshold itself passes the gate
        up = math.nextafter(x, math.inf)
        assert _exact(form, up * (1 + 1e-12)) > tau  # tight: a bit more fails it


def _exact(form: str, x: float) -> mp.mpf:
    with mp.workdps(50):
        w = mp.mpf(x)
        return {"eform": (mp.exp(2 * w) - 1) / 2, "osc": mp.tanh(w / 4),
                "tanh": mp.tanh(w / 2)}[form]


def test_the_affine_threshold_respects_the_domain() -> None:
    assert gate_threshold(0.2, form="affine", eps0=0.1) == 0.1  # the cap binds
    x = gate_threshold(0.01, form="affine", eps0=0.1)
    assert x == pytest.approx(0.01 * math.exp(-0.2))
    assert gate_bound(x, form="affine", eps0=0.1) <= 0.01 * (1 + 1e-15)
    assert gate_bound(0.2, form="affine", eps0=0.1) == math.inf  # outside: no bound


def test_tanh_forms_never_reach_saturation() -> None:
    assert gate_threshold(1.0, form="osc") == math.inf
    assert gate_threshold(3.0, form="tanh") == math.inf
    assert math.isfinite(gate_threshold(3.0, form="eform"))


@pytest.mark.parametrize("kwargs, name", [
    ({"tau": 0.0, "form": "eform"}, "tau"),
    ({"tau": math.nan, "form": "eform"}, "tau"),
    ({"tau": 0.2, "form": "cubic"}, "form"),
    ({"tau": 0.2, "form": "eform", "eps0": 0.1}, "eps0"),
    ({"tau": 0.2, "form": "affine"}, "eps0"),
    ({"tau": 0.2, "form": "affine", "eps0": -1.0}, "eps0"),
])
def test_bad_input_is_a_typed_error(kwargs: dict[str, object], name: str) -> None:
    with pytest.raises(InvalidValueError, match=name):
        gate_threshold(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("n, delta", [(1, 0.5), (144, 0.05), (1000, 1e-6), (10**6, 0.01)])
def test_the_exact_rate_solves_its_equation_and_beats_the_exponential_form(
        n: int, delta: float) -> None:
    p = rate_upper_bound_exact(n, delta)
    with mp.workdps(50):
        assert (1 - mp.mpf(p)) ** n <= delta  # zero failures at rate p: probability <= delta
        assert (1 - mp.mpf(math.nextafter(p, 0.0)) * (1 - 1e-9)) ** n > delta  # tight
    assert p <= rate_upper_bound(n, delta)
    if (n, delta) == (144, 0.05):
        assert (round(p, 4), round(rate_upper_bound(n, delta), 4)) == (0.0206, 0.0208)


def test_the_half_life_of_the_mean_is_never_shorter() -> None:
    r = recurrence(AtConsume, a_steps=[0.9, 0.5, 0.99, 0.7])
    assert r.half_life_of_mean >= r.half_life
    mean = (0.9 + 0.5 + 0.99 + 0.7) / 4
    assert r.half_life_of_mean == pytest.approx(math.log(2) / -math.log(mean))
    assert recurrence(AtConsume, a_steps=[1.0, 1.0]).half_life_of_mean == math.inf
