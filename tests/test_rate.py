"""The anytime-valid rate bound: its e-values against 50 digits, validity under the null over
many simulated streams, monotonicity, the running minimum, and bad input."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from witcert_calculus.accounting.rate import FRACTIONS, UNIFORM_SAMPLE, RateBound, RateState, log_evalues
from witcert_calculus.errors import InvalidValueError


@given(n=st.integers(0, 5000), frac=st.floats(0.0, 1.0), theta=st.floats(0.0, 0.999))
@settings(max_examples=150, deadline=None)
def test_log_evalues_against_mpmath(n: int, frac: float, theta: float) -> None:
    s = int(frac * n)
    mpmath.mp.dps = 50
    th = mpmath.mpf(theta)
    terms = [(1 + mpmath.mpf(r) * th / (1 - th)) ** (n - s) * (1 - mpmath.mpf(r)) ** s
             for r in FRACTIONS]
    ref = mpmath.log(sum(terms) / len(terms))
    got = float(log_evalues(n, s, theta))
    assert abs(got - float(ref)) <= 1e-12 * (1 + abs(float(ref)))


def test_false_alarm_rate_under_the_null_is_at_most_alpha() -> None:
    # 2,000 independent streams of 400 requests at true rates 0.02 and 0.2: the bound fell
    # below the true rate at some time in at most alpha of them (Ville), checked through the
    # vectorised e-values (theta >= U_t for some t iff E_s(theta) >= 1/alpha for some s <= t,
    # by monotonicity) and, on the first 40 streams, through RateBound itself.
    rng = np.random.default_rng(20261207)
    alpha = 0.1
    for theta in (0.02, 0.2):
        x = rng.random((2000, 400)) < theta
        n = np.arange(1, 401)[None, :]
        s = np.cumsum(x, axis=1)
        logs = log_evalues(n, s, theta)
        alarms = (logs >= math.log(1 / alpha)).any(axis=1)
        assert alarms.mean() <= alpha
        agree = 0
        for row in range(40):
            b = RateBound(alpha=alpha)
            fell = False
            for v in x[row]:
                fell |= b.observe(bool(v)) <= theta
            assert not fell or alarms[row]   # the class's rounding margin only delays
            agree += fell == bool(alarms[row])
        assert agree >= 39


def test_the_bound_is_informative_when_the_rate_is_low() -> None:
    b = RateBound(alpha=0.05)
    for i in range(400):
        b.observe(i % 50 == 0)                 # 2 % exceedances
    assert b.events == 8 and b.trials == 400
    assert 0.02 < b.upper < 0.08


def test_evalues_grow_with_the_candidate_and_the_bound_never_rises() -> None:
    thetas = np.linspace(0.0, 0.99, 200)
    e = log_evalues(100, 7, thetas)
    assert (np.diff(e) >= -1e-12).all()
    b = RateBound(alpha=0.05)
    last = 1.0
    for v in [False] * 50 + [True] * 30:
        u = b.observe(v)
        assert u <= last
        last = u
    assert b.state == RateState(80, 30, last)


def test_bad_input_is_refused_by_name() -> None:
    with pytest.raises(InvalidValueError, match="alpha"):
        RateBound(alpha=1.0)
    with pytest.raises(InvalidValueError, match="fractions"):
        RateBound(alpha=0.1, fractions=(1.5,))
    with pytest.raises(InvalidValueError, match="event"):
        RateBound(alpha=0.1).observe(1)  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match="theta"):
        log_evalues(3, 1, 1.0)
    with pytest.raises(InvalidValueError, match="0 <= s <= n"):
        log_evalues(3, 4, 0.1)
    with pytest.raises(InvalidValueError, match="events"):
        RateState(3, 4, 0.5)
    assert "uniform" in UNIFORM_SAMPLE.statement
