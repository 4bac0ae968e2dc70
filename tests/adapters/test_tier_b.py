"""Tier B through the live probe: dithered keys, probabilistic certificates, ledger spend."""

from __future__ import annotations

import dataclasses
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tiny_models import qwen3_next, run_probe, tiny_model  # noqa: E402
from witcert_adapters.architectures import spec_for  # noqa: E402
from witcert_adapters.gate import run_gate  # noqa: E402
from witcert_adapters.hf import Probe, attach  # noqa: E402
from witcert_adapters.readings import admit_readings, layer_readings  # noqa: E402
from witcert_adapters.recurrent import RecurrentProbe, run_recurrent_gate  # noqa: E402
from witcert_calculus import dither as ref  # noqa: E402
from witcert_calculus import tv_forms as meters  # noqa: E402
from witcert_calculus.budget import telescoping_delta, telescoping_spent  # noqa: E402
from witcert_calculus.errors import UnknownRequestError  # noqa: E402
from witcert_calculus.ledger import RiskLedger  # noqa: E402
from witcert_calculus.records import EventKind  # noqa: E402
from witcert_calculus.tiers import Tier  # noqa: E402
from witcert_calculus.witness import RopeLayout  # noqa: E402


def _ids(seed: int = 0, n: int = 6) -> Any:
    return torch.randint(0, 97, (1, n), generator=torch.Generator().manual_seed(seed))


def _run(family: str, ledger: RiskLedger, rid: int, steps: int = 3) -> tuple[Any, int]:
    model = tiny_model(family)
    with attach(model, scheme="dither_int8", request_id=rid, audit=True, ledger=ledger) as probe:
        tokens = run_probe(model, probe, _ids(), steps)
        return probe.result(), tokens


@pytest.mark.parametrize("family", ["llama", "deepseek_v3"])
def test_tier_b_spends_the_telescoping_budget_and_passes_the_gate(family: str) -> None:
    ledger = RiskLedger()
    rid = ledger.open_request(delta_req="1/100")
    run, tokens = _run(family, ledger, rid)
    verdict = run_gate(run, tokens=tokens)
    assert verdict.accepted, str(verdict)
    assert "Tier B" in verdict.stages[2].detail and "0 violations" in verdict.stages[2].detail
    assert {(layer, "tier_b") for layer in (0, 1)} <= run.declared
    events = run.tier_b_events
    assert len(events) == 4  # prefill + 3 decode steps, one probabilistic event each
    for i, ev in enumerate(events):
        assert ev.delta == telescoping_delta(i, Fraction(1, 100))
        assert ev.admission.kind is EventKind.PROBABILISTIC
        assert ev.admission.prob_index == i and ev.admission.charged == ev.delta
        assert ev.reading.delta == ev.delta
        assert ev.reading.tier in (Tier.PARTIALLY_CERTIFIED, Tier.SATURATED)
        assert "non-adaptive" in str(ev.reading.evidence)
    assert ledger.spent(rid) == telescoping_spent(4, Fraction(1, 100)) == Fraction(1, 125)
    # Tier A stays at delta 0: admitting the deterministic readings spends nothing more.
    v = admit_readings(ledger, rid, layer_readings(run))
    assert v.spent == Fraction(1, 125) and v.counts.deterministic == 2
    assert v.counts.probabilistic == 4 and v.tier is Tier.PARTIALLY_CERTIFIED
    for layer in run.layers:
        assert run.records[layer].tier_b.meter.shape == run.records[layer].read.meter.shape
        assert np.all(run.records[layer].audit.true_tv <= run.reported_tier_b(layer))
        # delta_loc = delta_i / (L * H * rows): a decode row's share of its forward's allowance
        assert run.records[layer].tier_b.delta_loc[-1] <= float(events[-1].delta) / (2 * 4 * 1)


def test_tier_b_cell_matches_the_numpy_reference_certificate() -> None:
    """The live Tier-B cell equals witcert_calculus.dither's radius and meter on the same
    stored keys (numpy quantizer), query and delta_loc."""
    model = tiny_model("llama")
    attn = model.model.layers[1].self_attn
    seen: dict[str, Any] = {}
    spec = spec_for("llama")
    h = attn.register_forward_pre_hook(
        lambda m, a, kw: seen.__setitem__("q", spec.queries(m, kw["hidden_states"],
                                                            kw["position_embeddings"])[0]),
        with_kwargs=True)
    ledger = RiskLedger()
    rid = ledger.open_request(delta_req="1/50")
    try:
        with attach(model, scheme="dither_int8", request_id=rid, audit=True,
                    ledger=ledger) as probe:
            tokens = run_probe(model, probe, _ids(4), 2)
            run = probe.result()
            cache = probe.cache
            assert cache is not None
            exact = cache.logs[1].exact(0)  # [1, Hkv, S, d]
    finally:
        h.remove()
    q_last = seen["q"][0, :, -1].double().numpy()  # the final decode row, [H, d]
    dloc = float(run.records[1].tier_b.delta_loc[-1])
    heads, hkv = q_last.shape[0], exact.shape[1]
    scale = float(attn.scaling)
    for head in range(heads):
        kv = head // (heads // hkv)
        stored = ref.dither_quantize(exact[0, kv].double().numpy(),
                                     key=ref.DitherKey(rid, 1, kv), tokens=np.arange(tokens),
                                     block_size=exact.shape[-1], layout=RopeLayout.HALF_SPLIT)
        u = ref.subgaussian_radius(ref.dither_variance_proxy(q_last[head], stored, scale=scale),
                                   delta_loc=dloc, tokens=tokens)
        # the live c_t is the reference radius plus the (tiny, deterministic) float32
        # rounding of the reconstruction: never below the radius, and within 1e-5 of it
        live = run.records[1].tier_b.last_u[0, head]
        assert np.all(live >= u) and np.allclose(live, u, rtol=1e-5, atol=0)
        p = run.records[1].read.last_p[0, head]
        want = meters.tv_meter(p / p.sum(), live).raw
        assert run.records[1].tier_b.meter[0, head, -1] == pytest.approx(want, rel=1e-9)


def test_gate_counts_and_rejects_a_tier_b_violation() -> None:
    ledger = RiskLedger()
    rid = ledger.open_request(delta_req="1/100")
    run, tokens = _run("llama", ledger, rid)
    # A radius that dropped its log(2S/delta) factor is far too small: the gate must catch it.
    shrunk = {k: dataclasses.replace(r, tier_b=dataclasses.replace(r.tier_b, meter=r.tier_b.meter * 1e-3))
              for k, r in run.records.items()}
    verdict = run_gate(dataclasses.replace(run, records=shrunk), tokens=tokens)
    assert verdict.failed_stage == "soundness"
    assert "Tier-B bound" in verdict.stages[2].detail and verdict.stages[2].failures > 0
    # Tier B declared but no admitted event: the ledger counter never advanced.
    verdict = run_gate(dataclasses.replace(run, tier_b_events=()), tokens=tokens)
    assert verdict.failed_stage == "coverage"
    assert "no probabilistic event" in verdict.stages[0].detail


def test_without_a_ledger_or_dither_there_is_no_tier_b() -> None:
    model = tiny_model("llama")
    ledger = RiskLedger()
    rid = ledger.open_request(delta_req="1/100")
    for scheme, led in (("dither_int8", None), ("int8_token", ledger)):
        with attach(model, scheme=scheme, request_id=rid, audit=True, ledger=led) as probe:
            tokens = run_probe(model, probe, _ids(), 1)
            run = probe.result()
        assert not run.tier_b_layers and not run.tier_b_events
        assert not any(p == "tier_b" for _, p in run.declared)
        assert run_gate(run, tokens=tokens).accepted
    assert ledger.spent(rid) == 0
    ledger.close_request(rid)
    with pytest.raises(UnknownRequestError):
        Probe(model, scheme="dither_int8", request_id=rid, ledger=ledger)


def test_tier_b_on_a_hybrids_attention_layer() -> None:
    model = qwen3_next()
    ledger = RiskLedger()
    rid = ledger.open_request(delta_req="1/100")
    probe = RecurrentProbe(model, scheme="dither_int8", request_id=rid, audit=True, ledger=ledger)
    try:
        tokens = run_probe(model, probe, _ids(), 2)
        run = probe.result()
    finally:
        probe.close()
    verdict = run_recurrent_gate(run, writes=3, tokens=tokens)
    assert verdict.accepted, str(verdict)
    assert run.attention is not None and (1, "tier_b") in run.declared
    assert len(run.attention.tier_b_events) == 3
    assert ledger.spent(rid) == telescoping_spent(3, Fraction(1, 100))


def test_a_failed_device_check_in_any_layer_refuses_the_tier_b_event(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The checks of every layer are read in one sync per forward; a negative cast witness
    # (which would lower the radius) must refuse the event, not slip past unread.
    from witcert_adapters.hf import LayerLog
    from witcert_calculus.errors import PremiseError
    honest = LayerLog.dither_cast.fget
    assert honest is not None
    monkeypatch.setattr(LayerLog, "dither_cast",
                        property(lambda log: [-c - 1.0 for c in honest(log)]))
    ledger = RiskLedger()
    rid = ledger.open_request(delta_req="1/100")
    with pytest.raises(PremiseError, match="cast"):
        _run("llama", ledger, rid, steps=1)
    assert ledger.spent(rid) == 0
