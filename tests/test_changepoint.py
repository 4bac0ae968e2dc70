"""The e-detector: average run length under the null, and a delay that forgets clean prefixes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from witcert_calculus import EDetector, EProcess, InvalidValueError
from witcert_calculus.drift.changepoint import run_lengths
from witcert_calculus.drift.eprocess import log_paths

NULL, DRIFT = 0.5, 0.8  # Bernoulli means: the certificate promises <= 0.5; the drift is 0.8


def _bernoulli(rng: np.random.Generator, p: float, shape: tuple[int, ...]) -> np.ndarray:
    return (rng.random(shape) < p).astype(np.float64)


def test_average_run_length_under_the_null_is_at_least_one_over_alpha() -> None:
    # The adversarial null: the mean sits exactly at the promised bound.
    alpha, horizon = 0.02, 3000
    rng = np.random.default_rng(7)
    runs = run_lengths(_bernoulli(rng, NULL, (300, horizon)), m=NULL, c=1.0, alpha=alpha)
    censored = np.where(runs == 0, horizon, runs)  # min(tau, horizon) <= tau
    assert censored.mean() >= 1 / alpha, censored.mean()


def test_the_run_length_check_catches_factors_that_are_not_e_values() -> None:
    # Without the Hoeffding penalty the factors have mean > 1 under the null: the same
    # restart-at-0 statistic then alarms long before 1/alpha on average.
    alpha = 0.02
    rng = np.random.default_rng(7)
    lam = 2.0  # 4 kappa / sqrt(c) with kappa = 0.5, c = 1
    steps = lam * (_bernoulli(rng, NULL, (300, 3000)) - NULL)
    runs = []
    for row in steps:
        v, t = 0.0, 0
        for t, x in enumerate(row.tolist(), 1):
            v = max(v, 0.0) + x
            if v >= -math.log(alpha):
                break
        runs.append(t)
    assert np.mean(runs) < 1 / alpha


def _delays(prefix: int, streams: int, seed: int) -> tuple[float, float]:
    """Median detection delay of the e-detector and of the product e-process."""
    rng = np.random.default_rng(seed)
    alpha = 1e-6  # average run length >= 10^6: a false alarm in the prefix is rare
    after = 120_000
    clean = _bernoulli(rng, NULL, (streams, prefix))
    drift = _bernoulli(rng, DRIFT, (streams, after))
    det = []
    for row_c, row_d in zip(clean, drift, strict=True):
        d = EDetector(alpha=alpha)
        d.observe_many(row_c, m=NULL, c=1.0)
        assert not d.alarmed  # a false alarm in the clean prefix would spoil the delay
        d.observe_many(row_d[:2000], m=NULL, c=1.0)
        assert d.alarm_step is not None
        det.append(d.alarm_step - prefix)
    paths = log_paths(np.concatenate([clean, drift], axis=1), NULL, 1.0)
    hit = paths[:, prefix:] >= EProcess(delta=alpha).threshold
    assert hit.any(axis=1).all()
    prod = hit.argmax(axis=1) + 1
    return float(np.median(det)), float(np.median(prod))


def test_the_detectors_delay_does_not_grow_with_the_clean_prefix() -> None:
    d0, p0 = _delays(0, 24, seed=1)
    d1k, p1k = _delays(1_000, 24, seed=2)
    d10k, p10k = _delays(10_000, 24, seed=3)
    assert max(d1k, d10k) <= 1.5 * d0 + 5, (d0, d1k, d10k)
    # The product e-process remembers the prefix: its delay grows with it.
    assert p0 <= 1.5 * d0 + 5
    assert p1k > 10 * d0 and p10k > 100 * d0 and p10k > 5 * p1k, (p0, p1k, p10k)


def test_observe_is_observe_many_one_at_a_time() -> None:
    rng = np.random.default_rng(3)
    w = _bernoulli(rng, 0.6, (500,))
    a, b = EDetector(alpha=0.001, kappa=0.3), EDetector(alpha=0.001, kappa=0.3)
    a.observe_many(w, m=NULL, c=1.0)
    for x in w.tolist():
        b.observe(x, m=NULL, c=1.0)
    assert (a.log_value, a.steps, a.restarts, a.alarm_step) == (
        b.log_value, b.steps, b.restarts, b.alarm_step)


def test_restart_reset_and_threshold() -> None:
    d = EDetector(alpha=0.01)
    assert d.threshold == pytest.approx(math.log(100))
    d.observe_many(np.full(10, NULL), m=NULL, c=1.0)  # each step -0.5, restarted from 0
    assert d.log_value == -0.5 and d.restarts == 9 and not d.alarmed
    d.observe_many(np.ones(40), m=NULL, c=1.0)
    assert d.alarmed and d.alarm_step == 10 + 10  # +0.5 a step from 0 to ln(100)
    d.reset()
    assert not d.alarmed and d.log_value == 0.0 and d.steps == 50


@pytest.mark.parametrize(("kw", "bad"), [({"alpha": 0.0}, "alpha"), ({"alpha": 1.0}, "alpha"),
                                         ({"alpha": math.nan}, "alpha"),
                                         ({"alpha": 0.1, "kappa": 0.0}, "kappa"),
                                         ({"alpha": 0.1, "kappa": math.inf}, "kappa")])
def test_bad_parameters_name_the_value(kw: dict[str, float], bad: str) -> None:
    with pytest.raises(InvalidValueError, match=bad):
        EDetector(**kw)


@pytest.mark.parametrize(("w", "m", "c", "bad"), [([math.nan], 0.5, 1.0, "w"),
                                                  ([0.5], math.inf, 1.0, "m"),
                                                  ([0.5], 0.5, 0.0, "c"),
                                                  ([[0.5]], 0.5, 1.0, "w"),
                                                  ([1e308], 0.5, 1.0, "w"),
                                                  ([2.0], 0.5, 1.0, "w")])
def test_bad_observations_fold_in_nothing(w: object, m: float, c: float, bad: str) -> None:
    d = EDetector(alpha=0.1)
    d.observe(0.7, m=0.5, c=1.0)
    before = (d.log_value, d.steps)
    with pytest.raises(InvalidValueError, match=bad):
        d.observe_many(w, m=m, c=c)  # type: ignore[arg-type]
    assert (d.log_value, d.steps) == before


def test_kappa_is_capped_as_for_the_e_process() -> None:
    from witcert_calculus.drift.eprocess import KAPPA_MAX

    EDetector(alpha=0.1, kappa=KAPPA_MAX)
    for bad in (KAPPA_MAX * 2, 1e300, True, "0.5"):
        with pytest.raises(InvalidValueError, match="kappa"):
            EDetector(alpha=0.1, kappa=bad)  # type: ignore[arg-type]
