"""Tests of the meters: the Tier-A TV forms, output bound, page-in, readings, theorem map.

Soundness is checked per query against the true TV (exact softmax of exact vs
perturbed logits, at 50 digits), never in aggregate.
"""

from __future__ import annotations

import math
from fractions import Fraction
from itertools import combinations

import mpmath as mp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import exact, golden, second

import witcert_calculus
from witcert_calculus import meters
from witcert_calculus.bridges import rank_prefix_selection
from witcert_calculus.contracts import Reading, chain
from witcert_calculus.errors import InvalidValueError
from witcert_calculus.meters.dispersion import DISPERSION_COUNTEREXAMPLE, dispersion_bound_unsound
from witcert_calculus.meters.output_bound import RHO_ASSUMPTION, VALUE_NORM_ASSUMPTION, \
    output_error_bound, output_error_contract
from witcert_calculus.meters.page_in import block_summary, page_in_order
from witcert_calculus.meters.tv_forms import (
    tv_bounds_batch,
    tv_eform,
    tv_meter,
    tv_retention,
    tv_tanh_max,
    tv_two_sided,
)
from witcert_calculus.meters.witness import CALLER_LOGIT_BOUND, LogitBound, RopeLayout, logit_bound
from witcert_calculus.metrics import AtConsume, AttentionOutputL2, AttentionTV
from witcert_calculus.tiers import Proof, Restricted, Tier
from reference.issued import reading

FORMS = (tv_eform, tv_two_sided, tv_retention, tv_meter)

PUBLIC_NAMES = ("band_witness", "logit_bound", "format_witness", "format_logit_bound",
                "tighter", "tv_eform", "tv_two_sided", "tv_meter",
                "tv_tanh_max", "output_error_bound", "page_in_order", "dither_quantize",
                "dither_dequantize", "subgaussian_radius", "delta_local", "sentinel_rounds",
                "rate_upper_bound")


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


def established(c: np.ndarray) -> LogitBound[np.ndarray]:
    """A Tier-A logit bound through the establishing function, with c_t rounded upward.

    A one-band query of norm 1 and witnesses ``w[t] = c_t`` give ``c_t`` back (outward).
    """
    cc = np.asarray(c, dtype=np.float64)
    return logit_bound(np.array([1.0, 0.0]), cc[:, None], layout=RopeLayout.INTERLEAVED,
                       scale=1.0)


@st.composite
def queries(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(p_tilde, c, eps) with |eps_t| <= c_t: extreme signs, peaked/flat p, large c."""
    s = draw(st.integers(1, 12))
    shape = draw(st.sampled_from(["flat", "random", "peaked", "two-level"]))
    if shape == "flat":
        z = np.zeros(s)
    elif shape == "random":
        z = np.array(draw(st.lists(st.floats(-30, 30), min_size=s, max_size=s)))
    elif shape == "peaked":
        z = np.zeros(s)
        z[draw(st.integers(0, s - 1))] = draw(st.floats(5, 60))
    else:
        z = np.where(np.arange(s) < draw(st.integers(0, s)), 0.0, -draw(st.floats(1, 40)))
    p = softmax(z)
    cval = st.floats(0, 6) | st.sampled_from([0.0, 1e-12, 1e-6, 1e-3, 0.1, 2.0, 20.0, 400.0])
    c = np.array(draw(st.lists(cval, min_size=s, max_size=s)))
    pattern = draw(st.sampled_from(["plus", "minus", "alternate", "by-mass", "random"]))
    if pattern == "plus":
        sign = np.ones(s)
    elif pattern == "minus":
        sign = -np.ones(s)
    elif pattern == "alternate":
        sign = np.where(np.arange(s) % 2 == 0, 1.0, -1.0)
    elif pattern == "by-mass":  # boost the light tokens, suppress the heavy ones
        sign = np.where(p < np.median(p), -1.0, 1.0)
    else:
        sign = np.array(draw(st.lists(st.floats(-1, 1), min_size=s, max_size=s)))
    return p, c, sign * c


def test_public_names_exist() -> None:
    for name in PUBLIC_NAMES:
        assert callable(getattr(witcert_calculus, name)), name
    assert list(meters.__all__) == sorted(meters.__all__)
    for name in meters.__all__:
        assert hasattr(meters, name), name


AGREED_LEAN_NAMES = {
    "WitCert.Semantic.logit_bound_norms_meter_sound", "WitCert.Semantic.tv_eform_meter_sound",
    "WitCert.Semantic.tv_two_sided_meter_sound", "WitCert.Semantic.tv_retention_meter_sound",
    "WitCert.Semantic.output_error_contract_at", "WitCert.Meters.page_in_decrease",
    "WitCert.Meters.sentinel_rounds_sound", "WitCert.Meters.rate_upper_bound_sound",
    "WitCert.Semantic.softmax_tv_tanh_contract_sound", "WitCert.Analytic.one_sub_pow_le_exp",
    "WitCert.Dither.grid_mgf_le", "WitCert.Semantic.dither_tier_b_token_sound",
    "WitCert.Semantic.dither_tier_b_prob_bad", "WitCert.Semantic.box_logit_bound_meter_sound",
    "WitCert.Formats.format_residual_le", "WitCert.Formats.trunc_residual_le",
    "WitCert.Formats.min_bound_sound", "WitCert.Formats.nearest_residual_le",
    "WitCert.Semantic.evict_tv_blocks_meter_sound", "WitCert.Eviction.output_evict_error_le",
    "WitCert.Semantic.evict_tv_restore_meter_le", "WitCert.Semantic.evict_quant_meter_sound",
    "WitCert.Depth.rms_normalize_lipschitz", "WitCert.Semantic.residual_step_contract_sound",
    "WitCert.Depth.attn_query_step_le", "WitCert.Depth.glu_step_le",
    "WitCert.Semantic.output_projection_contract_sound",
    "WitCert.Semantic.next_token_contract_sound",
}


def test_every_public_meter_names_an_agreed_lean_theorem() -> None:
    for name, theorems in meters.THEOREMS.items():
        assert callable(getattr(witcert_calculus, name)), name
        assert theorems and set(theorems) <= AGREED_LEAN_NAMES, name
    assert set(PUBLIC_NAMES) - {"band_witness", "dither_quantize", "dither_dequantize",
                                "delta_local"} <= set(meters.THEOREMS)


@given(queries())
def test_every_form_bounds_the_true_tv_per_query(q: tuple[np.ndarray, np.ndarray, np.ndarray]
                                                  ) -> None:
    p, c, eps = q
    truth = golden.true_tv(p.tolist(), eps.tolist())
    for form in FORMS:
        b = form(p, c)
        # 1e-45: the 50-digit reference's own rounding (an exact zero comes out near 1e-51)
        assert truth - mp.mpf("1e-45") <= mp.mpf(b.raw), (form.__name__, b, truth)
        assert b.value == min(1.0, b.raw)
    assert truth <= mp.mpf(tv_tanh_max(c).raw)


@given(queries())
def test_forms_agree_with_golden_and_are_upward(q: tuple[np.ndarray, np.ndarray, np.ndarray]
                                               ) -> None:
    p, c, _ = q
    pairs = ((tv_eform, golden.eform), (tv_two_sided, golden.two_sided),
             (tv_retention, golden.retention))
    for form, ref in pairs:
        got = form(p, c).raw
        want = ref(p.tolist(), c.tolist())
        if want > mp.mpf("1e300"):
            assert got == math.inf or mp.mpf(got) >= want
            continue
        assert mp.mpf(got) >= want, (form.__name__, got, want)  # rounded outward
        assert got <= max(float(want), 0.0) * (1 + 1e-9) + 1e-300, (form.__name__, got, want)


@given(queries())
def test_retention_never_above_eform_and_meter_is_the_min(
        q: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
    p, c, _ = q
    e, t, r, m = (f(p, c) for f in FORMS)
    assert r.raw <= e.raw
    assert m.raw == min(e.raw, t.raw)
    assert m.theorem == (t.theorem if t.raw < e.raw else e.theorem)


def _rational_distribution(rng: np.random.Generator, size: int, grid: int) -> list[Fraction]:
    """A random probability vector with rational entries (weights drawn from 1..grid-1)."""
    weights = [Fraction(int(x), grid) for x in rng.integers(1, grid, size=size)]
    total = sum(weights, Fraction(0))
    return [x / total for x in weights]


def test_four_evaluations_agree() -> None:
    """numpy, mpmath golden, exact Fraction (r = e^c rational), and the second implementation."""
    rng = np.random.default_rng(3)
    for _ in range(40):
        s = int(rng.integers(1, 9))
        pf = _rational_distribution(rng, s, 1000)
        rf = [Fraction(int(x), 64) for x in rng.integers(64, 400, size=s)]  # r = e^c in [1, 6.25)
        p = np.array([float(x) for x in pf])
        c = np.array([math.log(float(x)) for x in rf])
        for form, gold, ex, sec in ((tv_eform, golden.eform, exact.eform, second.eform),
                                    (tv_two_sided, golden.two_sided, exact.two_sided,
                                     second.two_sided),
                                    (tv_retention, golden.retention, exact.retention,
                                     second.retention)):
            got = form(p, c).raw
            want_exact = float(ex(pf, rf))
            assert got == pytest.approx(want_exact, rel=1e-12, abs=1e-15), form.__name__
            assert got == pytest.approx(float(gold(p.tolist(), c.tolist())), rel=1e-12, abs=1e-15)
            assert got == pytest.approx(sec(p.tolist(), c.tolist()), rel=1e-10, abs=1e-14)
        assert tv_meter(p, c).raw == pytest.approx(second.meter(p.tolist(), c.tolist()),
                                                   rel=1e-10, abs=1e-14) or \
            tv_meter(p, c).raw > 1  # second.meter reports min(1, .)
        assert tv_tanh_max(c).raw == pytest.approx(second.tanh_max(c.tolist()), rel=1e-15)


def test_exact_tv_below_exact_forms_on_rationals() -> None:
    """Exact rational instances: w = e^{-eps} rational with 1/r <= w <= r."""
    rng = np.random.default_rng(11)
    for _ in range(200):
        s = int(rng.integers(1, 7))
        pf = _rational_distribution(rng, s, 97)
        rf = [Fraction(int(x), 16) for x in rng.integers(16, 80, size=s)]
        w = [r if rng.random() < 0.5 else 1 / r for r in rf]  # extreme signs
        truth = exact.true_tv(pf, w)
        assert truth <= exact.eform(pf, rf)
        assert truth <= exact.two_sided(pf, rf)
        assert truth <= exact.retention(pf, rf)


def test_small_c_is_accurate_and_large_c_uses_the_log_domain() -> None:
    p = np.array([0.25, 0.25, 0.5])
    c = np.array([1e-12, 3e-12, 0.0])
    want = golden.eform(p.tolist(), c.tolist())
    assert tv_eform(p, c).raw == pytest.approx(float(want), rel=1e-12)
    # a massive bound on a token of tiny mass: A stays finite in the log domain
    p = np.array([1.0 - 1e-300, 1e-300])
    c = np.array([0.0, 700.0])
    got = tv_two_sided(p, c).raw
    assert math.isfinite(got)
    assert mp.mpf(got) >= golden.two_sided(p.tolist(), c.tolist())


def test_overflow_reports_saturation_and_keeps_raw() -> None:
    p = np.array([0.5, 0.5])
    for c in (np.array([800.0, 0.0]), np.array([math.inf, 0.0])):
        for form in FORMS:
            b = form(p, c)
            assert b.raw == math.inf and b.value == 1.0 and b.saturated
            reading = b.reading()
            assert reading.tier is Tier.SATURATED and reading.value == 1.0
            assert reading.raw == math.inf


def test_zero_mass_tokens_do_not_count_even_with_infinite_c() -> None:
    p = np.array([1.0, 0.0])
    b = tv_meter(p, established(np.array([0.0, math.inf])))
    assert b.raw == 0.0 and b.reading().tier is Tier.CERTIFIED


def test_batch_matches_single_queries() -> None:
    rng = np.random.default_rng(5)
    p = np.stack([softmax(rng.normal(size=16) * 3) for _ in range(20)])
    c = rng.exponential(0.3, size=(20, 16))
    batch = tv_bounds_batch(p, c)
    for i in range(20):
        assert batch.eform[i] == tv_eform(p[i], c[i]).raw
        assert batch.two_sided[i] == tv_two_sided(p[i], c[i]).raw
        assert batch.retention[i] == tv_retention(p[i], c[i]).raw
        assert batch.meter[i] == tv_meter(p[i], c[i]).raw
        assert batch.tanh_max[i] == tv_tanh_max(c[i]).raw


def test_readings_are_typed_and_tiered_by_the_machine() -> None:
    p = np.array([0.7, 0.2, 0.1])
    r = tv_eform(p, established(np.array([0.01, 0.02, 0.0]))).reading()
    assert isinstance(r, Reading) and r.metric == AttentionTV[AtConsume]
    assert r.tier is Tier.CERTIFIED
    assert isinstance(r.evidence, Proof) and r.evidence.theorem == "WitCert.Semantic.tv_eform_meter_sound"
    assert tv_two_sided(p, established(np.ones(3))).reading().evidence.theorem == \
        "WitCert.Semantic.tv_two_sided_meter_sound"  # type: ignore[union-attr]
    assert tv_retention(p, np.ones(3)).theorem == "WitCert.Semantic.tv_retention_meter_sound"
    assert tv_tanh_max(np.ones(3)).theorem == "WitCert.Semantic.softmax_tv_tanh_contract_sound"
    sat = tv_meter(p, np.full(3, 3.0)).reading()
    assert sat.tier is Tier.SATURATED and sat.raw > 1 and sat.value == 1.0


def test_meter_reading_plugs_into_contract_chains() -> None:
    p = np.array([0.6, 0.3, 0.1])
    reading = tv_meter(p, established(np.array([0.0, 0.01, 0.05]))).reading()
    assert reading.tier is Tier.CERTIFIED
    out_contract = output_error_contract(value_norm_max=2.0, p_tilde=p,
                                         rho=np.array([0.0, 0.01, 0.02]))
    selected = chain(rank_prefix_selection(AtConsume, m_out=0.001, m_in=0.0), out_contract)
    y = selected.bound(reading)
    assert y.metric == AttentionOutputL2[AtConsume]
    # the caller's value_norm_max and rho are assumptions: the output bound is partial
    assert y.tier is Tier.PARTIALLY_CERTIFIED
    assert y.assumptions == (VALUE_NORM_ASSUMPTION, RHO_ASSUMPTION)
    assert "WitCert.Semantic.output_error_contract_at" in selected.theorems
    assert "WitCert.Semantic.tv_eform_meter_sound" in out_contract.bound(reading).evidence.__repr__() or \
        "WitCert.Semantic.tv_two_sided_meter_sound" in out_contract.bound(reading).evidence.__repr__()
    want = 2.0 * 2.0 * (reading.raw + 0.0005) + 0.6 * 0 + 0.3 * 0.01 + 0.1 * 0.02
    assert y.raw == pytest.approx(want, rel=1e-12) and y.raw >= want * (1 - 1e-15)


@given(queries(), st.integers(0, 2**32 - 1))
@settings(max_examples=100)
def test_output_error_bound_sound_per_query(q: tuple[np.ndarray, np.ndarray, np.ndarray],
                                            seed: int) -> None:
    p_tilde, c, eps = q
    rng = np.random.default_rng(seed)
    s, dv = p_tilde.size, 4
    with mp.workdps(50):
        p = [x for x in golden.softmax([math.log(x) if x > 0 else -1e9 for x in
                                        p_tilde.tolist()])]
        w = [pi * mp.exp(-mp.mpf(e)) for pi, e in zip(p, eps.tolist())]
        z = mp.fsum(w)
        p_exact = [x / z for x in w]
    # adversarial values: along +e0 where p grew, -e0 where it shrank
    grow = np.array([float(a - b) for a, b in zip(p_exact, p)])
    v = rng.normal(size=(s, dv)) * 0.1
    v[:, 0] += np.sign(grow) * 3.0
    noise = rng.normal(size=(s, dv))
    rho_t = rng.uniform(0, 0.2, size=s)
    v_hat = v + noise / np.linalg.norm(noise, axis=1, keepdims=True) * rho_t[:, None]
    rho = np.linalg.norm(v - v_hat, axis=1) * (1 + 1e-12)
    vmax = float(np.linalg.norm(v, axis=1).max() * (1 + 1e-12))
    with mp.workdps(50):
        diff = [mp.fsum(pe * mp.mpf(float(v[t, j])) - pt * mp.mpf(float(v_hat[t, j]))
                        for t, (pe, pt) in enumerate(zip(p_exact, p))) for j in range(dv)]
        err = mp.sqrt(mp.fsum(x * x for x in diff))
        tv_true = golden.true_tv(p_tilde.tolist(), eps.tolist())
    tv_up = float(tv_true) * (1 + 1e-12)
    assert err <= mp.mpf(output_error_bound(tv_up, value_norm_max=vmax, p_tilde=p_tilde,
                                            rho=rho))
    assert err <= mp.mpf(output_error_bound(tv_meter(p_tilde, c).raw, value_norm_max=vmax,
                                            p_tilde=p_tilde, rho=rho))
    ref = second.output_bound(tv_up, (v * (1 + 1e-12)).tolist(), p_tilde.tolist(), rho.tolist())
    assert output_error_bound(tv_up, value_norm_max=vmax, p_tilde=p_tilde, rho=rho) == \
        pytest.approx(ref, rel=1e-9)


def test_output_error_bound_exact_value_and_saturated_input() -> None:
    p = np.array([0.5, 0.25, 0.25])
    rho = np.array([0.5, 0.25, 0.0])
    got = output_error_bound(0.125, value_norm_max=3.0, p_tilde=p, rho=rho)
    want = Fraction(2) * Fraction(1, 8) * 3 + Fraction(1, 4) + Fraction(1, 16)
    assert Fraction(got) >= want and got == pytest.approx(float(want), rel=1e-15)
    # a saturated TV bound counts as 1 (TV never exceeds 1)
    assert output_error_bound(math.inf, value_norm_max=3.0, p_tilde=p, rho=rho) == \
        pytest.approx(6.0 + 0.3125, rel=1e-15)
    k = output_error_contract(value_norm_max=3.0, p_tilde=p, rho=rho)
    assert k.m_in == AttentionTV[AtConsume] and k.m_out == AttentionOutputL2[AtConsume]
    assert k.tier is Tier.PARTIALLY_CERTIFIED and k.a == 6
    assert k.assumptions == (VALUE_NORM_ASSUMPTION, RHO_ASSUMPTION)


def test_page_in_decrease_is_exact() -> None:
    """Replacing block j by exact values lowers A by exactly mass_j (e^{u_j} - 1)."""
    rng = np.random.default_rng(2)
    for _ in range(50):
        n = int(rng.integers(1, 7))
        mass = [Fraction(int(x), 50) for x in rng.integers(1, 50, size=n)]
        total = sum(mass, Fraction(0))
        mass = [m / total for m in mass]
        r = [Fraction(int(x), 8) for x in rng.integers(8, 40, size=n)]  # e^{u_j}
        for j in range(n):
            before = exact.page_in_a(mass, r, set())
            after = exact.page_in_a(mass, r, {j})
            assert before - after == mass[j] * (r[j] - 1)


def test_page_in_order_uses_the_fewest_blocks() -> None:
    rng = np.random.default_rng(4)
    for _ in range(150):
        n = int(rng.integers(1, 8))
        mass = rng.dirichlet(np.ones(n) * rng.uniform(0.2, 3))
        u = rng.exponential(rng.uniform(0.01, 0.5), size=n)
        tau = float(rng.uniform(0.0, 0.3))
        plan = page_in_order(mass, u, threshold=tau)
        brute = second.page_in_fewest(mass.tolist(), u.tolist(), tau)
        a_after = math.sqrt(1 + 2 * plan.eform_after)
        target = math.sqrt(1 + 2 * tau)
        if abs(a_after - target) > 1e-9:  # away from float ties
            assert len(plan.order) == brute
        assert plan.eform_after <= tau * (1 + 1e-12) + 1e-15
        # the plan's prediction equals the meter with the paged blocks set to 0
        u_after = u.copy()
        u_after[list(plan.order)] = 0.0
        assert plan.eform_after == pytest.approx(tv_eform(mass, u_after).raw, rel=1e-9,
                                                 abs=1e-15)
        decreases = mass * np.expm1(u)
        chosen = decreases[list(plan.order)]
        assert (np.diff(chosen) <= 0).all()  # largest decrease first


def test_page_in_order_handles_overflow_and_already_under() -> None:
    plan = page_in_order(np.array([0.9, 0.1]), np.array([0.0, 2000.0]), threshold=0.01)
    assert plan.order == (1,) and plan.eform_before == math.inf and plan.eform_after == 0.0
    plan = page_in_order(np.array([0.5, 0.5]), np.array([1e-6, 0.0]), threshold=0.01)
    assert plan.order == ()
    plan = page_in_order(np.array([0.0, 0.6, 0.4]), np.array([math.inf, 0.5, 0.1]),
                         threshold=0.0)
    assert plan.order == (1, 2) and plan.eform_after == 0.0


def test_block_summary() -> None:
    p = np.full(5, 0.2)
    c = np.array([0.1, 0.3, 0.0, 0.5, 0.2])
    mass, u = block_summary(p, c, block_size=2)
    np.testing.assert_allclose(mass, [0.4, 0.4, 0.2])
    assert u.tolist() == [0.3, 0.5, 0.2]


def test_dispersion_counterexample_is_pinned() -> None:
    ce = DISPERSION_COUNTEREXAMPLE
    p, c, eps = np.array(ce.p_tilde), np.array(ce.c), np.array(ce.eps)
    assert (np.abs(eps) <= c).all()
    truth = golden.true_tv(ce.p_tilde, ce.eps)
    assert float(truth) == pytest.approx(0.049834, abs=5e-7)
    assert ce.true_tv == pytest.approx(float(truth), rel=1e-14)
    claimed = dispersion_bound_unsound(p, c)
    assert claimed == pytest.approx(0.006423, abs=5e-7) and claimed == ce.claimed
    assert claimed < truth  # the shape is unsound
    assert all(truth <= mp.mpf(f(p, c).raw) for f in FORMS)  # the meters are not


def test_invalid_inputs_raise_typed_errors() -> None:
    with pytest.raises(InvalidValueError, match=r"sum\(p_tilde\)"):
        tv_eform(np.array([0.5, 0.6]), np.zeros(2))
    with pytest.raises(InvalidValueError, match=r"c\[1\]=-0.1"):
        tv_meter(np.array([0.5, 0.5]), np.array([0.0, -0.1]))
    with pytest.raises(InvalidValueError, match=r"c=.*NaN"):
        tv_two_sided(np.array([0.5, 0.5]), np.array([0.0, np.nan]))
    with pytest.raises(InvalidValueError, match="shape of p_tilde"):
        tv_retention(np.array([0.5, 0.5]), np.zeros(3))
    with pytest.raises(InvalidValueError, match="threshold=1.0"):
        page_in_order(np.array([1.0]), np.array([0.1]), threshold=1.0)
    with pytest.raises(InvalidValueError, match="tv=nan"):
        output_error_bound(math.nan, value_norm_max=1.0, p_tilde=np.ones(1), rho=np.zeros(1))
    with pytest.raises(InvalidValueError, match=r"p_tilde\[0\]=-0.5"):
        tv_eform(np.array([-0.5, 1.5]), np.zeros(2))


# --------------------------------------------------------------------------- premises

def test_a_callers_array_is_an_assumption_and_an_established_bound_is_certified() -> None:
    """The tier of a TV reading follows how c was obtained, never a literal."""
    p = np.array([0.7, 0.2, 0.1])
    raw = np.array([0.01, 0.02, 0.0])
    for form in FORMS:
        assumed = form(p, raw).reading()
        assert assumed.tier is Tier.PARTIALLY_CERTIFIED
        assert assumed.assumptions == (CALLER_LOGIT_BOUND,)
        assert isinstance(assumed.evidence, Restricted)
        assert assumed.evidence.proof.theorem == form(p, raw).theorem
        proved = form(p, established(raw)).reading()
        assert proved.tier is Tier.CERTIFIED and proved.assumptions == ()
        assert isinstance(proved.evidence, Proof)
        statements = [pr.statement for pr in proved.evidence.premises]
        assert any("by construction" in st_ and "LogitBound" in st_ for st_ in statements)
        assert any("probability vector" in st_ for st_ in statements)
        assert all(pr.holds for pr in proved.evidence.premises)
    assert tv_tanh_max(raw).reading().tier is Tier.PARTIALLY_CERTIFIED
    assert tv_tanh_max(established(raw)).reading().tier is Tier.CERTIFIED
    # saturation still wins over both
    assert tv_meter(p, np.full(3, 3.0)).reading().tier is Tier.SATURATED
    assert tv_meter(p, established(np.full(3, 3.0))).reading().tier is Tier.SATURATED


def test_batch_basis_gives_the_evidence_of_each_form() -> None:
    rng = np.random.default_rng(8)
    p = np.stack([softmax(rng.normal(size=5)) for _ in range(3)])
    c = rng.exponential(0.01, size=(3, 5))
    cb = established(c.reshape(-1))
    with pytest.raises(InvalidValueError, match="shape"):
        tv_bounds_batch(p, cb)  # one query's bound is not a batch's
    assumed = tv_bounds_batch(p, c)
    assert assumed.basis.assumptions == (CALLER_LOGIT_BOUND,)
    ev = assumed.basis.evidence("WitCert.Meters.tv_eform_sound")
    r = reading(AttentionTV[AtConsume], float(assumed.eform.max()), evidence=ev)
    assert r.tier is Tier.PARTIALLY_CERTIFIED and r.assumptions == (CALLER_LOGIT_BOUND,)
    both = assumed.basis.evidence("WitCert.Meters.tv_eform_sound",
                                  "WitCert.Meters.tv_two_sided_sound")
    assert reading(AttentionTV[AtConsume], 0.1, evidence=both).tier is Tier.PARTIALLY_CERTIFIED
    single = tv_eform(p[0], established(c[0]))
    proved = single.basis.evidence("WitCert.Meters.tv_eform_sound",
                                   "WitCert.Meters.tv_two_sided_sound")
    assert reading(AttentionTV[AtConsume], single.raw, evidence=proved).tier is Tier.CERTIFIED


def test_output_error_contract_premises_are_computed() -> None:
    p = np.array([0.5, 0.5])
    k = output_error_contract(value_norm_max=1.0, p_tilde=p, rho=np.array([0.0, 0.1]))
    assert isinstance(k.evidence, Restricted)
    assert all(pr.holds for pr in k.evidence.proof.premises) and k.evidence.proof.premises
    text = k.explain()
    assert VALUE_NORM_ASSUMPTION.statement in text and RHO_ASSUMPTION.statement in text
