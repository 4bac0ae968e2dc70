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
from witcert_calculus.accounting.budget import telescoping_delta, telescoping_spent  # noqa: E402
from witcert_calculus.accounting.records import EventKind  # noqa: E402
from witcert_calculus.errors import UnknownRequestError  # noqa: E402
from witcert_calculus.ledger import RiskLedger  # noqa: E402
from witcert_calculus.meters import dither as ref  # noqa: E402
from witcert_calculus.meters import tv_forms as meters  # noqa: E402
from witcert_calculus.meters.witness import RopeLayout  # noqa: E402
from witcert_calculus.tiers import Tier  # noqa: E402


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


@pytest.mark.parametrize(("scheme", "pairs"), [("dither_int8", 0), ("dither_int8_g16_m4", 4)])
def test_tier_b_cell_matches_the_numpy_reference_certificate(scheme: str, pairs: int) -> None:
    """The live Tier-B cell equals witcert_calculus.meters.dither's bound and meter on the same
    stored keys (numpy quantizer, with the outlier pairs the cache fixed on its prefill), query
    and delta_loc, up to the deterministic term of what the cache holds (float32 rounding of
    the reconstruction, float16 outlier values)."""
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
    prompt = 6
    try:
        with attach(model, scheme=scheme, request_id=rid, audit=True, ledger=ledger) as probe:
            tokens = run_probe(model, probe, _ids(4, prompt), 2)
            run = probe.result()
            cache = probe.cache
            assert cache is not None
            log = cache.logs[1]
            exact = log.exact(0)  # [1, Hkv, S, d]
            fixed = log.outlier_pairs
            cast = torch.cat(log.dither_cast, dim=2)[0]  # [Hkv, S]
    finally:
        h.remove()
    assert fixed is not None and tuple(fixed.shape) == (exact.shape[1], pairs)
    q_last = seen["q"][0, :, -1].double().numpy()  # the final decode row, [H, d]
    dloc = float(run.records[1].tier_b.delta_loc[-1])
    heads, hkv, d = q_last.shape[0], exact.shape[1], exact.shape[-1]
    scale = float(attn.scaling)
    store = run.records[1].write.store
    assert store is not None and np.array_equal(store.outlier_pairs, fixed.numpy())
    want_bytes = ref.byte_account(d, block_size=d, outlier_pairs=pairs, tokens=tokens)
    assert store.key_bytes == pytest.approx(want_bytes.total, rel=1e-12)
    assert (store.token_overlap is None) == (pairs == 0)
    for head in range(heads):
        kv = head // (heads // hkv)
        keys = exact[0, kv].double().numpy()
        # the pairs were chosen from the prefill keys alone, by the reference's rule
        chosen = ref.select_outlier_pairs(keys[:prompt], count=pairs, layout=RopeLayout.HALF_SPLIT)
        assert fixed[kv].tolist() == chosen.tolist()
        stored = ref.dither_quantize(keys, key=ref.DitherKey(rid, 1, kv), tokens=np.arange(tokens),
                                     block_size=d, layout=RopeLayout.HALF_SPLIT,
                                     outlier_pairs=chosen)
        u = ref.tier_b_logit_bound(q_last[head], stored, scale=scale, delta_loc=dloc,
                                   tokens=tokens).values
        # never below the reference bound; above it by at most the cast term
        live = run.records[1].tier_b.last_u[0, head]
        extra = scale * np.linalg.norm(q_last[head]) * cast[kv].double().numpy()
        assert np.all(live >= u) and np.all(live <= (u + extra) * (1 + 1e-9))
        p = run.records[1].read.last_p[0, head]
        want = meters.tv_meter(p / p.sum(), live).raw
        assert run.records[1].tier_b.meter[0, head, -1] == pytest.approx(want, rel=1e-9)


def test_outlier_pairs_persist_and_the_cache_holds_them_in_float16() -> None:
    """The pairs fixed at the prefill stay for the request; the cache holds those channels as
    their float16 values, every other channel as the dithered reconstruction."""
    model = tiny_model("llama")
    ledger = RiskLedger()
    rid = ledger.open_request(delta_req="1/50")
    with attach(model, scheme="dither_int8_g16_m4", request_id=rid, audit=True,
                ledger=ledger) as probe:
        run_probe(model, probe, _ids(2, 5), 3)
        cache = probe.cache
        assert cache is not None
        log = cache.logs[0]
        held = cache.layers[0].keys.double()  # type: ignore[attr-defined]
        exact = log.exact(0).double()
        mask = log.dither_exact
    assert mask is not None and int(mask[0].sum()) == 8
    assert torch.equal(held[..., mask[0]][0, 0], exact[0, 0][:, mask[0]].half().double())
    assert not torch.equal(held[0, 0][:, ~mask[0]], exact[0, 0][:, ~mask[0]])
    steps = log.written
    assert steps[0].pair_overlap is None and all(s.pair_overlap is not None for s in steps[1:])


def test_a_group_that_does_not_divide_the_head_is_a_typed_error() -> None:
    from witcert_calculus.errors import InvalidValueError

    model = tiny_model("llama")  # head_dim 16
    with attach(model, scheme="dither_int8_g32_m0") as probe:
        with pytest.raises(InvalidValueError, match="group.*32.*must divide head_dim 16"):
            run_probe(model, probe, _ids(), 1)


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
    from witcert_adapters.layer_log import LayerLog
    from witcert_calculus.errors import PremiseError
    honest = LayerLog.recorded

    def corrupted(log: LayerLog, field: str) -> list[Any]:
        return [-c - 1.0 for c in honest(log, field)] if field == "dither_cast" \
            else honest(log, field)

    monkeypatch.setattr(LayerLog, "recorded", corrupted)
    ledger = RiskLedger()
    rid = ledger.open_request(delta_req="1/100")
    with pytest.raises(PremiseError, match="cast"):
        _run("llama", ledger, rid, steps=1)
    assert ledger.spent(rid) == 0
