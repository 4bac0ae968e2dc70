"""Anytime-valid drift sentinel: formula, exactness of resume, Ville false-alarm rate, detection."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from witcert_calculus.drift.eprocess import (
    VILLE_THEOREM,
    EProcess,
    EProcessState,
    log_factors,
    log_paths,
)
from witcert_calculus.errors import InvalidValueError


def test_theorem_name() -> None:
    assert VILLE_THEOREM == "WitCert.Ledger.ville_finite_tree" == EProcess.theorem


_fin = st.floats(-1e3, 1e3, allow_nan=False)


@given(u=st.floats(-1.0, 1.0), m=_fin, c=st.floats(1e-6, 1e6), kappa=st.floats(0.01, 3.0))
@settings(max_examples=200, deadline=None)
def test_log_factor_against_mpmath(u: float, m: float, c: float, kappa: float) -> None:
    mpmath.mp.dps = 50
    w = m + 0.999 * u * math.sqrt(c)  # within the null range |w - m| <= sqrt(c)
    lam = 4 * mpmath.mpf(kappa) / mpmath.sqrt(mpmath.mpf(c))
    ref = lam * (mpmath.mpf(w) - mpmath.mpf(m)) - lam**2 * mpmath.mpf(c) / 8
    got = float(log_factors([w], [m], [c], kappa=kappa)[0])
    scale = float(abs(lam * (mpmath.mpf(w) - mpmath.mpf(m)))) + 2 * kappa**2
    assert abs(got - float(ref)) <= 1e-14 * scale
    assert got == EProcess(delta=0.5, kappa=kappa).check(w, m=m, c=c)


def test_hoeffding_factor_is_supermartingale_worst_case() -> None:
    """Two-point law at the ends of the range, mean m: E[g] = cosh(2 kappa) exp(-2 kappa^2) <= 1."""
    mpmath.mp.dps = 50
    for kappa in (0.1, 0.5, 1.0, 2.0):
        for c in (0.01, 1.0, 100.0):
            s = math.sqrt(c) / 2
            lf = log_factors([s, -s], 0.0, c, kappa=kappa)
            mean = (mpmath.exp(mpmath.mpf(lf[0])) + mpmath.exp(mpmath.mpf(lf[1]))) / 2
            assert mean <= 1
            assert abs(mean - mpmath.cosh(2 * kappa) * mpmath.exp(-2 * kappa**2)) < 1e-12


def test_scalar_vectorised_and_resumed_are_identical() -> None:
    rng = np.random.default_rng(7)
    n = 500
    m = rng.uniform(-0.1, 0.1, n)
    c = rng.uniform(0.5, 4.0, n)
    w = m + rng.uniform(-1, 1, n) * np.sqrt(c)  # within the null range
    a = EProcess(delta=0.01, kappa=0.3)
    for i in range(n):
        a.observe(float(w[i]), m=float(m[i]), c=float(c[i]))
    b = EProcess(delta=0.01, kappa=0.3)
    b.observe_many(w, m=m, c=c)
    assert a.state == b.state
    assert a.log_value == float(log_paths(w, m, c, kappa=0.3)[-1])
    # restart in the middle: serialize, resume, continue -> the same process
    p = EProcess(delta=0.01, kappa=0.3)
    p.observe_many(w[:200], m=m[:200], c=c[:200])
    text = p.state.to_json()
    q = EProcess.from_state(EProcessState.from_json(text))
    q.observe_many(w[200:], m=m[200:], c=c[200:])
    assert q.state == a.state


@pytest.mark.parametrize("kw,match", [({"delta": 0.0}, "delta"), ({"delta": 1.0}, "delta"),
                                      ({"delta": math.nan}, "delta"),
                                      ({"delta": 0.1, "kappa": 0.0}, "kappa"),
                                      ({"delta": 0.1, "kappa": math.inf}, "kappa")])
def test_bad_parameters(kw: dict[str, float], match: str) -> None:
    with pytest.raises(InvalidValueError, match=match):
        EProcess(**kw)


def test_bad_observations_change_nothing() -> None:
    p = EProcess(delta=0.1)
    p.observe(0.1, m=0.0, c=1.0)
    before = p.state
    for w, m, c, match in [(math.nan, 0.0, 1.0, "w="), (0.0, math.inf, 1.0, "m="),
                           (0.0, 0.0, 0.0, "c="), (0.0, 0.0, -1.0, "c="),
                           (0.0, 0.0, math.nan, "c=")]:
        with pytest.raises(InvalidValueError, match=match):
            p.observe(w, m=m, c=c)
    with pytest.raises(InvalidValueError, match="w="):
        p.observe_many([0.1, math.nan], m=0.0, c=1.0)
    assert p.state == before
    with pytest.raises(InvalidValueError, match="state"):
        EProcessState.from_json("{}")


def _null_rate(n_streams: int, steps: int, delta: float, kappa: float,
               penalty: bool = True) -> float:
    rng = np.random.default_rng(20240611)
    c = 1.0
    half = math.sqrt(c) / 2
    # Worst case for Hoeffding's lemma: two points at the ends of the range, mean exactly m.
    w = np.where(rng.random((n_streams, steps)) < 0.5, -half, half)
    if penalty:
        paths = log_paths(w, 0.0, c, kappa=kappa)
    else:  # a deliberately unsound process (no variance penalty) to show the test has power
        paths = np.cumsum(4 * kappa / math.sqrt(c) * w, axis=1)
    return float(np.mean(paths.max(axis=1) >= -math.log(delta)))


@pytest.mark.parametrize("kappa,delta", [(0.5, 0.05), (0.25, 0.2)])
def test_monte_carlo_false_alarm_rate_under_null(kappa: float, delta: float) -> None:
    """Ville: P(alarm at any time) <= delta; 20,000 null streams, 200 steps each, vectorised."""
    n = 20_000
    rate = _null_rate(n, 200, delta, kappa)
    sigma = math.sqrt(delta * (1 - delta) / n)
    assert rate <= delta + 4 * sigma, (rate, delta)
    # the same check would catch an unsound process
    assert _null_rate(n, 200, delta, kappa, penalty=False) > delta + 4 * sigma


def test_class_agrees_with_vectorised_monte_carlo() -> None:
    rng = np.random.default_rng(11)
    w = np.where(rng.random((300, 100)) < 0.5, -0.5, 0.5) + 0.15  # mild drift, some alarms
    paths = log_paths(w, 0.0, 1.0, kappa=0.5)
    thr = -math.log(0.05)
    alarms = 0
    for i in range(300):
        p = EProcess(delta=0.05, kappa=0.5)
        p.observe_many(w[i], m=0.0, c=1.0)
        assert p.log_value == paths[i, -1]
        hits = np.flatnonzero(paths[i] >= thr)
        if p.alarmed:
            alarms += 1
            # the slack only delays an alarm, by a hair (never fires below the threshold)
            assert p.alarm_step is not None and paths[i, p.alarm_step - 1] >= thr
            assert p.alarm_step - 1 == hits[0]
        else:
            assert hits.size == 0
    assert alarms > 0


def test_drifting_stream_is_caught() -> None:
    rng = np.random.default_rng(5)
    p = EProcess(delta=1e-6)
    # null promises mean 0.1 on a range of width 1; the truth drifted to mean 0.4
    for t in range(1, 2001):
        w = 0.4 + rng.uniform(-0.3, 0.3)
        if p.observe(w, m=0.1, c=1.0):
            break
    assert p.alarmed and p.alarm_step == t and t < 400
    assert p.log_value >= p.threshold == -math.log(1e-6)


def test_ledger_sentinel_journaled_state(tmp_path: object) -> None:
    from pathlib import Path

    from witcert_calculus.ledger import RiskLedger

    path = Path(str(tmp_path)) / "j.sqlite"
    led = RiskLedger(journal=path)
    led.add_sentinel("layer3.tv", delta=0.01, kappa=0.5)
    rng = np.random.default_rng(1)
    for _ in range(20):
        led.observe("layer3.tv", rng.uniform(0, 1, 7), m=0.5, c=1.0)
    state = led.sentinel("layer3.tv")
    led.close()
    again = RiskLedger(journal=path)
    assert again.sentinel("layer3.tv") == state and state.steps == 140
    with pytest.raises(InvalidValueError, match="no sentinel"):
        again.observe("nope", [0.1], m=0.0, c=1.0)
    with pytest.raises(InvalidValueError, match="exists"):
        again.add_sentinel("layer3.tv", delta=0.1)
    with pytest.raises(InvalidValueError, match="c="):
        again.observe("layer3.tv", [0.1], m=0.0, c=-1.0)
    assert again.sentinel("layer3.tv") == state
    again.close()


def test_shape_mismatch_is_typed() -> None:
    p = EProcess(delta=0.1)
    with pytest.raises(InvalidValueError, match="m, c"):
        p.observe_many([0.1, 0.2], m=[0.0, 0.0, 0.0], c=1.0)
    with pytest.raises(InvalidValueError, match="m, c"):
        p.observe_many([0.1, 0.2], m=[[0.0], [0.0]], c=1.0)
    assert p.steps == 0


@pytest.mark.parametrize(("w", "m", "c", "match"), [
    (1e308, 0.0, 1.0, "w="),                # far above m + sqrt(c): log M_t would overflow
    (-1e308, 0.0, 1.0, "w="),               # far below m - sqrt(c)
    (1.5, 0.0, 1.0, "w="),                  # just outside the stated range
    (1e308, -1e308, 1.0, "w="),             # w - m overflows
    (0.0, 0.0, 1e-320, "c="),               # lambda^2 overflows: the log-factor is not finite
])
def test_observation_outside_the_null_range_is_refused(w: float, m: float, c: float,
                                                       match: str) -> None:
    """Under the null ``W_e`` lies in an interval of width ``sqrt(C_e)`` holding ``m_e``; an
    observation outside ``[m - sqrt(c), m + sqrt(c)]`` (or one whose log-factor is not
    finite) is a typed error, and the process keeps working: it is never silenced."""
    p = EProcess(delta=0.01)
    p.observe(0.1, m=0.0, c=1.0)
    before = p.state
    with pytest.raises(InvalidValueError, match=match):
        p.observe(w, m=m, c=c)
    with pytest.raises(InvalidValueError, match=match):
        p.observe_many([0.1, w], m=m, c=c)
    with pytest.raises(InvalidValueError, match=match):
        log_factors([w], m, c)
    assert p.state == before
    assert any(p.observe(1.0, m=0.0, c=1.0) for _ in range(40))  # still alarms on drift
    assert math.isfinite(p.log_value) and math.isfinite(p.state.slack)


def test_range_ends_are_accepted() -> None:
    p = EProcess(delta=0.01)
    p.observe_many([1.0, -1.0, 3.0], m=[0.0, 0.0, 1.0], c=[1.0, 1.0, 4.0])
    assert p.steps == 3 and math.isfinite(p.log_value)


def test_kappa_is_capped() -> None:
    with pytest.raises(InvalidValueError, match="kappa"):
        EProcess(delta=0.1, kappa=1e300)
    with pytest.raises(InvalidValueError, match="kappa"):
        EProcess(delta=0.1, kappa=True)


@pytest.mark.parametrize("field,value", [("log_value", math.inf), ("log_value", -math.inf),
                                         ("log_value", math.nan), ("slack", math.inf),
                                         ("slack", -1.0), ("steps", -1), ("alarm_step", 0),
                                         ("alarm_step", 5), ("kappa", math.inf),
                                         ("delta", 1.0)])
def test_state_refuses_non_finite_fields(field: str, value: float) -> None:
    good = {"kappa": 0.5, "delta": 0.01, "log_value": 0.0, "slack": 0.0, "steps": 2,
            "alarm_step": None}
    with pytest.raises(InvalidValueError, match=field):
        EProcessState(**{**good, field: value})  # type: ignore[arg-type]
    text = EProcessState(**good).to_json().replace(  # type: ignore[arg-type]
        '"log_value": "0x0.0p+0"', '"log_value": "inf"')
    with pytest.raises(InvalidValueError, match="log_value"):
        EProcessState.from_json(text)


def test_ledger_sentinel_is_never_silenced(tmp_path: object) -> None:
    """Through the ledger: the overflowing observation is refused before it is journaled, and
    a journal restored afterwards holds the same finite state, which still alarms."""
    from pathlib import Path

    from witcert_calculus.ledger import RiskLedger

    path = Path(str(tmp_path)) / "j.sqlite"
    led = RiskLedger(journal=path)
    led.add_sentinel("s", delta=0.01)
    led.observe("s", [0.1], m=0.0, c=1.0)
    state = led.sentinel("s")
    with pytest.raises(InvalidValueError, match="w="):
        led.observe("s", [1e308], m=0.0, c=1.0)
    assert led.sentinel("s") == state
    led.close()
    again = RiskLedger(journal=path)
    assert again.sentinel("s") == state
    for _ in range(40):
        if again.observe("s", [1.0], m=0.0, c=1.0).alarm_step is not None:
            break
    assert again.sentinel("s").alarm_step is not None
    again.close()


def test_a_journal_holding_an_overflowing_observation_does_not_replay(
        tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """A journal written without the range check (an older writer) is refused on replay: the
    restored sentinel is never one whose log M_t overflowed."""
    from pathlib import Path

    from witcert_calculus.drift.eprocess import Sentinels
    from witcert_calculus.errors import JournalError
    from witcert_calculus.ledger import RiskLedger

    path = Path(str(tmp_path)) / "j.sqlite"
    led = RiskLedger(journal=path)
    led.add_sentinel("s", delta=0.01)
    with monkeypatch.context() as mp:
        mp.setattr(Sentinels, "check", lambda self, name, batch: None)
        with pytest.raises(InvalidValueError, match="w="):  # applied after journaling: refused
            led.observe("s", [1e308], m=0.0, c=1.0)
    led.close()
    with pytest.raises(JournalError, match="does not replay"):
        RiskLedger(journal=path)
