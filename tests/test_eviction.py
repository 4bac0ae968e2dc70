"""The eviction meter (witcert_calculus.meters.eviction): soundness against 50-digit truths per
cell, adversarially; fail-closed cells; the gate's plan; the combination with a kept-key meter."""

from __future__ import annotations

import copy
import pickle

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from witcert_calculus import (
    AtConsume,
    AttentionTV,
    DroppedMass,
    Tier,
    combined_tv,
    dropped_mass_batch,
    evict_witness,
    eviction_output_bound,
    restore_order,
    tv_eform,
)
from witcert_calculus.errors import ForgedBoundError, InvalidValueError, MetricMismatchError
from witcert_calculus.lean.theorems import (
    EVICT_QUANT_METER_SOUND,
    EVICT_TV_BLOCKS_METER_SOUND,
)
from witcert_calculus.meters.eviction import EvictionWitness
from witcert_calculus.tiers import theorems_of

mpmath.mp.dps = 50


def _true_mass(q: np.ndarray, kept: np.ndarray, dropped: np.ndarray, scale: float) -> list[mpmath.mpf]:
    """p(D) per query row, in 50-digit arithmetic from the float keys."""
    out = []
    for row in q:
        zk = mpmath.fsum(mpmath.exp(scale * mpmath.fsum(mpmath.mpf(a) * mpmath.mpf(b)
                                                         for a, b in zip(row, k))) for k in kept)
        zd = mpmath.fsum(mpmath.exp(scale * mpmath.fsum(mpmath.mpf(a) * mpmath.mpf(b)
                                                         for a, b in zip(row, k))) for k in dropped)
        out.append(zd / (zk + zd))
    return out


def _case(rng: np.random.Generator, *, d: int, kept: int, dropped: int, blocks: int,
          spread: float, aligned: bool) -> tuple[np.ndarray, ...]:
    keys = rng.normal(size=(kept + dropped, d)) * spread
    if aligned:  # the dropped keys point where the queries look: their mass is large
        keys[kept:] += 3.0 * spread
    q = rng.normal(size=(3, d)) + (3.0 if aligned else 0.0)
    block = np.sort(rng.integers(0, blocks, size=dropped))
    return q, keys[:kept], keys[kept:], block


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), d=st.sampled_from([2, 8, 64]),
       kept=st.integers(1, 12), dropped=st.integers(1, 12), blocks=st.integers(1, 4),
       spread=st.sampled_from([1e-3, 0.3, 1.0, 4.0]), aligned=st.booleans(),
       dtype=st.sampled_from(["int8", "float16", "float32", "float64"]))
def test_bound_is_never_below_the_true_dropped_mass(seed: int, d: int, kept: int, dropped: int,
                                                    blocks: int, spread: float, aligned: bool,
                                                    dtype: type) -> None:
    rng = np.random.default_rng(seed)
    q, k_kept, k_drop, block = _case(rng, d=d, kept=kept, dropped=dropped, blocks=blocks,
                                     spread=spread, aligned=aligned)
    scale = d ** -0.5
    w = evict_witness(k_drop, rng.normal(size=(dropped, 3)), block, blocks=blocks,
                      center=dtype)
    b = dropped_mass_batch(q, scale * q @ k_kept.T, w, scale=scale)
    truth = _true_mass(q, k_kept, k_drop, scale)
    for got, want in zip(b.mass.tolist(), truth, strict=True):
        assert mpmath.mpf(got) >= want, (got, want)


def test_a_single_dropped_key_per_block_is_tight() -> None:
    # radius 0, one key per block: the bound is the exact mass up to the outward rounding
    rng = np.random.default_rng(1)
    q, k_kept, k_drop = rng.normal(size=(4, 16)), rng.normal(size=(20, 16)), rng.normal(size=(5, 16))
    w = evict_witness(k_drop, np.ones((5, 1)), np.arange(5), blocks=5, center="float64")
    assert (w.radius == 0).all() and (w.linf == 0).all()
    b = dropped_mass_batch(q, 0.25 * q @ k_kept.T, w, scale=0.25)
    truth = np.array([float(t) for t in _true_mass(q, k_kept, k_drop, 0.25)])
    assert ((b.mass - truth) / truth < 1e-12).all()
    assert (b.mass >= truth).all()


def test_batched_cells_equal_cell_by_cell() -> None:
    rng = np.random.default_rng(2)
    q = rng.normal(size=(2, 3, 5, 8))              # layers, heads, rows, d
    kept = rng.normal(size=(2, 3, 5, 11))
    keys = rng.normal(size=(2, 3, 9, 8))
    block = np.tile(np.arange(9) % 3, (2, 3, 1))
    w = evict_witness(keys, rng.normal(size=(2, 3, 9, 4)), block, blocks=3)
    batch = dropped_mass_batch(q, kept, w, scale=0.5)
    for i in range(2):
        for h in range(3):
            one = dropped_mass_batch(q[i, h], kept[i, h],
                                     evict_witness(keys[i, h], np.ones((9, 1)), block[i, h],
                                                   blocks=3), scale=0.5)
            np.testing.assert_allclose(batch.mass[i, h], one.mass, rtol=1e-13)


def test_missing_witness_and_nothing_kept_fail_closed() -> None:
    rng = np.random.default_rng(3)
    q = rng.normal(size=(2, 2, 4))
    w = evict_witness(rng.normal(size=(2, 3, 4)), np.ones((2, 3, 1)), np.zeros((2, 3), int),
                      blocks=1)
    kept = rng.normal(size=(2, 2, 5))
    # the cache says cell 1 dropped 7 tokens; its witness covers 3: never a small mass
    b = dropped_mass_batch(q, kept, w, scale=1.0, dropped=np.array([3, 7]))
    assert np.isfinite(b.mass[0]).all() and np.isinf(b.mass[1]).all()
    assert b.worst().tier is Tier.SATURATED
    # a row that sees no kept token, with tokens dropped: saturated
    kept[0, 1] = -np.inf
    b = dropped_mass_batch(q, kept, w, scale=1.0)
    assert np.isinf(b.mass[0, 1]) and np.isfinite(b.mass[0, 0])


def test_nothing_dropped_reads_exactly_zero_and_is_certified() -> None:
    w = evict_witness(np.zeros((1, 0, 4)), np.zeros((1, 0, 2)), np.zeros((1, 0), int), blocks=2)
    b = dropped_mass_batch(np.ones((1, 3, 4)), np.zeros((1, 3, 6)), w, scale=1.0)
    assert (b.mass == 0).all()
    r = b.worst()
    assert r.tier is Tier.CERTIFIED and r.value == 0.0
    assert r.metric == DroppedMass[AtConsume]
    assert EVICT_TV_BLOCKS_METER_SOUND in theorems_of(r.evidence)


def test_witness_is_established_only_by_its_functions() -> None:
    w = evict_witness(np.ones((2, 4)), np.ones((2, 1)), np.array([0, 1]), blocks=2)
    with pytest.raises(ForgedBoundError, match="EvictionWitness"):
        EvictionWitness(w.center, w.linf * 0, w.radius * 0, w.count, w.value_norm,
                        center_norm=w.center_norm, center32=None, stored_bytes=0, source="mine")
    with pytest.raises(AttributeError, match="frozen"):
        w.radius = w.radius * 0  # type: ignore[misc]
    with pytest.raises(TypeError, match="not pickled"):
        pickle.dumps(w)
    assert copy.deepcopy(w) is w


def test_bad_input_is_refused_by_name() -> None:
    with pytest.raises(InvalidValueError, match=r"block\[1\]=5"):
        evict_witness(np.ones((2, 4)), np.ones((2, 1)), np.array([0, 5]), blocks=2)
    with pytest.raises(InvalidValueError, match="keys"):
        evict_witness(np.array([[np.nan, 1.0]]), np.ones((1, 1)), np.array([0]), blocks=1)
    with pytest.raises(InvalidValueError, match="center"):
        evict_witness(np.ones((1, 2)), np.ones((1, 1)), np.array([0]), blocks=1,
                      center="int4")
    w = evict_witness(np.ones((1, 2)), np.ones((1, 1)), np.array([0]), blocks=1)
    with pytest.raises(InvalidValueError, match="must not be \\+inf"):
        dropped_mass_batch(np.ones((1, 2)), np.array([[np.inf]]), w, scale=1.0)
    with pytest.raises(InvalidValueError, match="scale"):
        dropped_mass_batch(np.ones((1, 2)), np.array([[0.0]]), w, scale=0.0)
    with pytest.raises(InvalidValueError, match="witness"):
        dropped_mass_batch(np.ones((1, 3)), np.array([[0.0]]), w, scale=1.0)


def test_witness_bytes_count_stored_blocks() -> None:
    w = evict_witness(np.ones((6, 64)), np.ones((6, 64)), np.array([0, 0, 0, 2, 2, 2]),
                      blocks=4, center="float16")
    assert w.stored_bytes == 2 * (64 * 2 + 16)
    w8 = evict_witness(np.ones((6, 64)), np.ones((6, 64)), np.arange(6), blocks=6)
    assert w8.stored_bytes == 6 * (64 + 2 + 16)


def test_output_bound_covers_the_true_output_error() -> None:
    rng = np.random.default_rng(4)
    d, kept, drop = 8, 10, 6
    q, keys, vals = rng.normal(size=d), rng.normal(size=(kept + drop, d)), rng.normal(size=(kept + drop, 5))
    s = keys @ q
    p = np.exp(s - s.max()); p /= p.sum()
    pk = np.exp(s[:kept] - s[:kept].max()); pk /= pk.sum()
    o, o_k = p @ vals, pk @ vals[:kept]
    w = evict_witness(keys[kept:], vals[kept:], np.zeros(drop, int), blocks=1)
    mass = dropped_mass_batch(q[None], s[None, :kept], w, scale=1.0).mass
    bound = eviction_output_bound(mass, value_norm_max=w.value_norm.max(),
                                  kept_output_norm=np.linalg.norm(o_k))
    assert float(bound[0]) >= np.linalg.norm(o - o_k)
    with pytest.raises(InvalidValueError, match="value_norm_max"):
        eviction_output_bound(0.1, value_norm_max=-1.0, kept_output_norm=0.0)


def test_restore_plan_reaches_the_target_with_fewest_blocks() -> None:
    terms = np.array([0.0, 2.0, -np.inf, 1.0])
    plan = restore_order(terms, 0.0, threshold=0.5)
    assert plan.order == (1, 3)
    assert plan.bound_after <= 0.5 < plan.bound_before
    # every prefix shorter than the plan misses the target
    rest = np.logaddexp.reduce(np.delete(terms, [1]))
    assert 1 / (1 + np.exp(0.0 - rest)) > 0.5
    assert restore_order(terms, 50.0, threshold=0.5).order == ()
    assert restore_order(terms, 0.0, threshold=0.0).order == (1, 3, 0)


def test_restore_then_remeter_never_raises_the_bound() -> None:
    # restore the planned blocks into the kept set, meter again: at most the planned bound
    rng = np.random.default_rng(5)
    d = 8
    q = rng.normal(size=(1, d)) + 2.0
    kept = rng.normal(size=(6, d))
    drop = rng.normal(size=(12, d)) + 1.0
    block = np.arange(12) // 3
    w = evict_witness(drop, np.ones((12, 1)), block, blocks=4)
    b = dropped_mass_batch(q, q @ kept.T, w, scale=1.0)
    from witcert_kernels.eviction import block_log_terms  # the gate orders these terms
    import torch
    from witcert_kernels.eviction import evict_witness as evict_witness_t
    wt = evict_witness_t(torch.tensor(drop), torch.ones(12, 1), torch.tensor(block), blocks=4)
    terms = block_log_terms(torch.tensor(q), wt, scale=1.0)[0].numpy()
    plan = restore_order(terms, float(b.log_z[0]), threshold=0.05)
    back = np.isin(block, plan.order)
    w2 = evict_witness(drop[~back], np.ones(((~back).sum(), 1)), block[~back], blocks=4)
    b2 = dropped_mass_batch(q, q @ np.concatenate([kept, drop[back]]).T, w2, scale=1.0)
    assert b2.mass[0] <= b.mass[0]
    assert b2.mass[0] <= plan.bound_after * (1 + 1e-9)


def test_combined_tv_adds_and_cites_the_combination() -> None:
    w = evict_witness(np.array([[1.0, 0.0]]), np.ones((1, 1)), np.array([0]), blocks=1)
    e = dropped_mass_batch(np.zeros((1, 2)), np.zeros((1, 1)), w, scale=1.0).worst()
    k = tv_eform(np.array([0.5, 0.5]), np.array([0.01, 0.01])).reading()
    r = combined_tv(e, k)
    assert r.metric == AttentionTV[AtConsume]
    assert r.value >= e.value + k.value
    assert EVICT_QUANT_METER_SOUND in theorems_of(r.evidence)
    assert r.tier is Tier.PARTIALLY_CERTIFIED  # the kept bound was the caller's array
    with pytest.raises(MetricMismatchError, match="combined_tv"):
        combined_tv(k, k)  # type: ignore[arg-type]


def test_combined_tv_is_sound_against_the_true_distance() -> None:
    # drop some tokens, perturb the kept logits within c: TV(p, q_K) <= mass bound + kept meter
    from witcert_calculus import tv_meter
    rng = np.random.default_rng(6)
    for _ in range(50):
        s = rng.normal(size=20) * 2
        drop = rng.random(20) < 0.4
        drop[0] = False
        c = rng.uniform(0, 0.3, size=(~drop).sum())
        s_q = s[~drop] + rng.uniform(-1, 1, size=c.size) * c
        p = np.exp(s - s.max()); p /= p.sum()
        qk = np.exp(s_q - s_q.max()); qk /= qk.sum()
        served = np.zeros(20); served[~drop] = qk
        true_tv = 0.5 * np.abs(p - served).sum()
        keys = np.zeros((drop.sum(), 1)); keys[:, 0] = s[drop]
        w = evict_witness(keys, np.ones((drop.sum(), 1)), np.arange(drop.sum()), blocks=max(1, drop.sum()),
                          center="float64")
        e = dropped_mass_batch(np.ones((1, 1)), s[None, ~drop], w, scale=1.0).worst()
        k = tv_meter(qk, c).reading()
        assert combined_tv(e, k).value >= true_tv - 1e-12


def test_quantized_kept_keys_and_evicted_ones_get_one_sound_bound() -> None:
    # keys kept in a compressed form (a residual per key, its band witness stored) and others
    # evicted: the eviction bound from the served logits with the kept keys' LogitBound, plus
    # the Tier-A meter over the kept tokens, bounds the true TV against the exact full attention
    from witcert_calculus import RopeLayout, band_witness, logit_bound, tv_meter

    rng = np.random.default_rng(9)
    d, kept, drop = 16, 24, 12
    for trial in range(30):
        keys = rng.normal(size=(kept + drop, d)) * 2
        q = rng.normal(size=d) * 2
        residual = rng.uniform(-1, 1, size=(kept, d)) * 0.05 * (trial % 5)
        served = keys[:kept] + residual
        sc = d ** -0.5
        c = logit_bound(q, band_witness(residual, bands=4, layout=RopeLayout.HALF_SPLIT),
                        layout=RopeLayout.HALF_SPLIT, scale=sc)
        s_served = sc * served @ q
        w = evict_witness(keys[kept:], np.ones((drop, 1)), np.arange(drop), blocks=drop)
        e = dropped_mass_batch(q[None], s_served[None], w, scale=sc, kept_bound=c).worst()
        p_tilde = np.exp(s_served - s_served.max()); p_tilde /= p_tilde.sum()
        k = tv_meter(p_tilde, c).reading()
        total = combined_tv(e, k)
        assert total.tier is Tier.CERTIFIED or total.tier is Tier.SATURATED
        s_exact = sc * keys @ q
        p = np.exp(s_exact - s_exact.max()); p /= p.sum()
        q_k = np.concatenate([p_tilde, np.zeros(drop)])
        true_tv = 0.5 * np.abs(p - q_k).sum()
        assert total.raw >= true_tv, (trial, total.raw, true_tv)
        # the exact kept logits' normaliser alone would not be known here; with c = 0 the
        # served logits are exact and the bound is the plain eviction bound
    with pytest.raises(ForgedBoundError):
        dropped_mass_batch(q[None], s_served[None], w, scale=sc,
                           kept_bound=np.ones(kept))  # type: ignore[arg-type]
