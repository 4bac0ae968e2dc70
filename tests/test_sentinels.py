"""Tests of witcert_calculus.meters.sentinels: sampling sentinel rounds and the coverage rate bound."""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath as mp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from reference import exact, golden, second

from witcert_calculus.errors import InvalidValueError
from witcert_calculus.meters.sentinels import rate_upper_bound, sentinel_miss_probability, \
    sentinel_rounds


def test_sentinel_rounds_exact_on_a_grid() -> None:
    """q^n <= delta < q^(n-1), decided in exact rational arithmetic."""
    for slots in (1, 2, 3, 7, 64):
        for corrupted in range(1, slots + 1):
            for draws in (1, 2, 5):
                for delta in (0.5, 0.1, 0.01, 1e-3, 2.0**-20):
                    n = sentinel_rounds(corrupted, slots, draws, delta)
                    assert n == exact.sentinel_rounds(corrupted, slots, draws, Fraction(delta))


@given(st.integers(1, 10**6), st.integers(0, 10**6), st.integers(1, 512),
       st.floats(1e-12, 0.999))
def test_sentinel_rounds_sound_and_minimal(slots: int, extra: int, draws: int,
                                           delta: float) -> None:
    corrupted = max(1, slots - extra)
    n = sentinel_rounds(corrupted, slots, draws, delta)
    with mp.workdps(60):
        q = (mp.mpf(slots - corrupted) / slots) ** draws
        assert q ** n <= mp.mpf(delta)
        if n > 1:
            assert q ** (n - 1) > mp.mpf(delta)
    assert n == golden.sentinel(corrupted, slots, draws, delta) or corrupted == slots
    if corrupted < slots:
        ref = second.sentinel_rounds(corrupted, slots, draws, delta)
        assert abs(n - ref) <= 1  # float64 may be off by one at a near-tie; ours is exact


def test_sentinel_models_sampling_with_replacement() -> None:
    """Monte Carlo of the implementation (with replacement) meets the confidence."""
    rng = np.random.default_rng(0)
    slots, corrupted, draws, delta = 50, 2, 3, 0.05
    n = sentinel_rounds(corrupted, slots, draws, delta)
    trials = 20000
    picks = rng.integers(0, slots, size=(trials, n * draws))
    missed = (picks >= corrupted).all(axis=1).mean()
    assert missed <= delta + 4 * math.sqrt(delta / trials)
    # the hypergeometric model (without replacement) would ask for fewer draws
    q_hyper = math.comb(slots - corrupted, draws) / math.comb(slots, draws)
    assert q_hyper < (1 - corrupted / slots) ** draws


def test_sentinel_miss_probability() -> None:
    assert sentinel_miss_probability(1, 4, 2, 3) == pytest.approx((3 / 4) ** 6, rel=1e-15)
    assert sentinel_miss_probability(1, 4, 2, 3) >= (3 / 4) ** 6
    n = sentinel_rounds(3, 1000, 16, 1e-6)
    assert sentinel_miss_probability(3, 1000, 16, n) <= 1e-6 * (1 + 1e-15)


@given(st.integers(1, 10**9), st.floats(1e-300, 0.999999))
def test_rate_upper_bound_sound(trials: int, delta: float) -> None:
    b = rate_upper_bound(trials, delta)
    with mp.workdps(60):
        assert mp.mpf(b) >= golden.rate(trials, delta)
        assert b == pytest.approx(second.rate(trials, delta), rel=1e-14)
        p = mp.mpf(b)
        if p < 1:  # at the bound, zero failures are at most delta likely
            assert (1 - p) ** trials <= mp.mpf(delta)


def test_one_sub_pow_le_exp_on_rationals() -> None:
    for n in range(1, 40):
        for k in range(0, 41):
            p = Fraction(k, 40)
            lhs = (1 - p) ** n
            with mp.workdps(50):
                assert mp.mpf(lhs.numerator) / lhs.denominator <= \
                    mp.exp(-n * mp.mpf(p.numerator) / p.denominator)


def test_invalid_inputs() -> None:
    with pytest.raises(InvalidValueError, match="corrupted=0"):
        sentinel_rounds(0, 10, 1, 0.1)
    with pytest.raises(InvalidValueError, match="corrupted=11"):
        sentinel_rounds(11, 10, 1, 0.1)
    with pytest.raises(InvalidValueError, match="delta=1.0"):
        sentinel_rounds(1, 10, 1, 1.0)
    with pytest.raises(InvalidValueError, match="draws=True"):
        sentinel_rounds(1, 10, True, 0.5)
    with pytest.raises(InvalidValueError, match="trials=0"):
        rate_upper_bound(0, 0.1)
    with pytest.raises(InvalidValueError, match="delta=0.0"):
        rate_upper_bound(10, 0.0)
    assert sentinel_rounds(10, 10, 1, 1e-9) == 1
