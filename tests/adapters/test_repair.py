"""The repairing gate on tiny random Llama models: certified page-in, exact entries, typed errors."""

from __future__ import annotations

import doctest
import functools
import importlib
import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tiny_models import tiny_model  # noqa: E402
from witcert_adapters.architectures import spec_for  # noqa: E402
from witcert_adapters.hf import Probe  # noqa: E402
from witcert_adapters.witness_cache import WitnessCache  # noqa: E402
from witcert_adapters.repair import (  # noqa: E402
    BackingStore,
    GateLabel,
    RepairCache,
    RepairPolicy,
    Repairer,
    attach_repair,
)
from witcert_adapters.schemes import EntryRole, WriteContext, get_scheme  # noqa: E402
from witcert_calculus.errors import InvalidValueError, UnwrittenSlotError  # noqa: E402

PREFILL, DECODE = 24, 6


def _ids(seed: int = 0) -> Any:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 97, (1, PREFILL + DECODE), generator=g)


def _forward(model: Any, cache: Any, ids: Any) -> Any:
    """Prefill, then teacher-forced decode steps; the logits of every step's last row."""
    with torch.no_grad():
        rows = [model(ids[:, :PREFILL], cache=cache, use_cache=True).logits[0, -1]]
        rows += [model(ids[:, t:t + 1], cache=cache, use_cache=True).logits[0, -1]
                 for t in range(PREFILL, PREFILL + DECODE)]
    return torch.stack(rows)


def _raw(model: Any, scheme: str) -> Any:
    """The unrepaired run of ``scheme`` as a probe meters it."""
    probe = Probe(model, scheme=scheme)
    try:
        _forward(model, probe.new_cache(), _ids())
        return probe.result()
    finally:
        probe.close()


@functools.cache
def _tau(scheme: str) -> float:
    """Half the smallest per-layer median meter of the unrepaired run: every layer has cells to
    repair, whatever the witness bands (the tiny model's meters lie far below the real one's)."""
    run = _raw(tiny_model("llama"), scheme)
    return 0.5 * min(float(np.median(run.read(layer).meter)) for layer in run.layers)


def _big_keys(scale: float) -> Any:
    """A tiny Llama whose keys are ``scale`` times larger (fp8 casts overflow or saturate)."""
    model = tiny_model("llama")
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.k_proj.weight.mul_(scale)
    return model


def _repaired(scheme: str, *, threshold: float | None = None, model: Any = None, **kw: Any
              ) -> tuple[RepairCache, Any]:
    model = tiny_model("llama") if model is None else model
    threshold = _tau(scheme) if threshold is None else threshold
    with attach_repair(model, scheme=scheme, threshold=threshold, block_size=4, **kw) as rep:
        cache = rep.new_cache()
        logits = _forward(model, cache, _ids())
    return cache, logits


@pytest.mark.parametrize("scheme", ["int4_g32", "kivi2_g32"])
def test_certified_repair_brings_every_gated_row_to_tau(scheme: str) -> None:
    model = tiny_model("llama")
    tau = _tau(scheme)
    unrepaired = _raw(model, scheme)
    probe = Probe(model, scheme=scheme)
    try:
        with attach_repair(model, scheme=scheme, threshold=tau, block_size=4,
                           every_row=True) as rep:
            cache = rep.new_cache()
            probe.bind(cache)
            _forward(model, cache, _ids())
        run = probe.result()
    finally:
        probe.close()
    summary = cache.summary()
    assert summary.label is GateLabel.CERTIFIED and summary.decisions > 0
    assert all(d.label is GateLabel.CERTIFIED for d in cache.decisions)
    assert all(d.meter_before > tau >= d.meter_after for d in cache.decisions)
    # The gate was needed: without it some cell is above tau ...
    assert max(float(unrepaired.read(layer).meter.max()) for layer in unrepaired.layers) > tau
    # ... and the probe, metering the attention the model actually ran (its own p_tilde and
    # the repaired witnesses), sees every cell at tau or below (float32 p_tilde: 1e-9 slack).
    for layer in run.layers:
        assert float(run.read(layer).meter.max()) <= tau + 1e-9, layer
    assert summary.page_in_fraction > 0.0


def test_by_default_the_decode_rows_are_gated() -> None:
    model = tiny_model("llama")
    tau = _tau("kivi2_g32")
    probe = Probe(model, scheme="kivi2_g32")
    try:
        with attach_repair(model, scheme="kivi2_g32", threshold=tau, block_size=4) as rep:
            cache = rep.new_cache()
            probe.bind(cache)
            _forward(model, cache, _ids())
        run = probe.result()
    finally:
        probe.close()
    assert cache.summary().label is GateLabel.CERTIFIED
    for layer in run.layers:
        read = run.read(layer)
        gated = read.positions >= PREFILL - 1  # the prefill's last row and every decode step
        assert float(read.meter[..., gated].max()) <= tau + 1e-9, layer


def test_no_slot_is_paged_twice_and_the_traffic_is_counted(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    reads: list[tuple[int, int, int, int]] = []
    original = BackingStore.read

    def counting(self: BackingStore, batch: int, kv_head: int, slots: Any) -> Any:
        reads.extend((self.layer, batch, kv_head, int(s)) for s in slots)
        return original(self, batch, kv_head, slots)

    monkeypatch.setattr(BackingStore, "read", counting)
    cache, _ = _repaired("kivi2_g32", every_row=True)
    summary = cache.summary()
    twice = [k for k, n in Counter(reads).items() if n > 1]
    assert not twice, f"slots paged more than once: {twice[:5]}"
    assert len(reads) == summary.paged_slots == sum(d.slots for d in cache.decisions) > 0
    head_dim = 16  # tiny Llama: hidden 64 over 4 heads; keys and values in float32
    assert summary.page_in_bytes == summary.paged_slots * 2 * head_dim * 4
    assert summary.stored_slots == 2 * 2 * (PREFILL + DECODE)  # layers x kv heads x slots
    assert summary.page_in_fraction == summary.paged_slots / summary.stored_slots


@pytest.mark.parametrize("scheme", ["int4_g32", "kivi2_g32"])
def test_repaired_slots_hold_the_exact_entries_bit_for_bit(scheme: str) -> None:
    cache, _ = _repaired(scheme, audit=True)
    compress = get_scheme(scheme)
    assert cache.summary().paged_slots > 0
    for layer, log in cache.logs.items():
        mask = cache.paged[layer]
        stored: Any = cache.layers[layer]
        exact_k, exact_v = log.exact(0), log.exact(1)  # the witness log's own copy
        assert bool(mask.any()), layer
        assert float(exact_k[mask].abs().sum()) > 0  # a repair that read zeros fails below
        assert torch.equal(stored.keys[mask], exact_k[mask])
        assert torch.equal(stored.values[mask], exact_v[mask])
        # Unpaged slots still hold the scheme's reconstruction (per token, as written).
        hat_k = compress(exact_k, WriteContext(0, layer, 0, EntryRole.KEY))
        assert torch.equal(stored.keys[~mask], hat_k[~mask])
        assert not torch.equal(stored.keys[~mask], exact_k[~mask])
        # The paged slots' witnesses are 0; the others' are not.
        w = log.witnesses(0)
        assert float(w[mask].abs().max()) == 0.0 and float(w[~mask].max()) > 0.0
        res, _ = log.value_residuals()
        assert float(res[mask].abs().max()) == 0.0


def test_an_unwritten_backing_store_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def allocate_only(self: BackingStore, start: int, keys: Any, values: Any) -> None:
        self.reserve(start + int(keys.shape[-2]), keys, values)  # allocated, never written

    monkeypatch.setattr(BackingStore, "write", allocate_only)
    with pytest.raises(UnwrittenSlotError, match="is UNWRITTEN") as err:
        _repaired("kivi2_g32")
    assert any("layer 0" in note for note in err.value.__notes__)


def test_the_backing_store_refuses_every_unwritten_slot() -> None:
    store = BackingStore(3)
    k = torch.arange(1.0, 1.0 + 2 * 8 * 4).reshape(1, 2, 8, 4)
    store.reserve(8, k, k)
    with pytest.raises(UnwrittenSlotError, match="slot 0 is UNWRITTEN") as err:
        store.read(0, 1, torch.tensor([0]))
    assert "layer 3, batch 0, kv head 1" in err.value.__notes__[0]
    store.write(0, k[:, :, :4], -k[:, :, :4])
    keys, values = store.read(0, 1, torch.tensor([1, 3]))
    assert torch.equal(keys, k[0, 1, [1, 3]]) and torch.equal(values, -k[0, 1, [1, 3]])
    for slot in (4, 7, 100):
        with pytest.raises(UnwrittenSlotError, match=f"slot {slot} is UNWRITTEN"):
            store.read(0, 0, torch.tensor([2, slot]))


@pytest.mark.parametrize("tau", [0.0, 1.0, 1.5, -0.25, math.nan])
def test_a_threshold_outside_the_open_unit_interval_is_refused(tau: float) -> None:
    with pytest.raises(InvalidValueError, match=f"threshold={tau!r} is invalid"):
        RepairPolicy(tau)
    model = tiny_model("llama")
    with pytest.raises(InvalidValueError, match=f"threshold={tau!r} is invalid"):
        Repairer(model, scheme="int4_g32", threshold=tau)
    assert all(not m._forward_pre_hooks for m in model.modules())  # nothing left attached


def test_other_policy_values_are_refused() -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"block_size": 0}, "block_size=0"), ({"risk_traffic": 0.0}, "risk_traffic"),
        ({"saturation": 0.5}, "saturation=0.5"), ({"every_row": 1}, "every_row")]
    for kw, name in cases:
        with pytest.raises(InvalidValueError, match=name):
            RepairPolicy(0.2, **kw)


def test_above_saturation_the_gate_is_risk_ranked() -> None:
    # fp8_e4m3 saturates keys at 448: the residuals of keys ~1700 give e-forms beyond 1e6.
    cache, logits = _repaired("fp8_e4m3", threshold=0.2, model=_big_keys(3000.0),
                              risk_traffic=0.25)
    summary = cache.summary()
    assert summary.label is GateLabel.RISK_RANKED
    risky = [d for d in cache.decisions if d.label is GateLabel.RISK_RANKED]
    assert any(d.meter_before > 1e6 for d in risky)  # saturation is judged on the e-form
    assert bool(torch.isfinite(logits).all())
    # The same cells below saturation (moderate keys) are repaired with a certificate.
    calm, _ = _repaired("fp8_e4m3", threshold=0.2, model=_big_keys(300.0))
    assert calm.summary().label is GateLabel.CERTIFIED and calm.summary().decisions > 0


def test_non_finite_slots_are_paged_first() -> None:
    # fp8_e5m2 overflows keys ~1.7e5 to inf: the raw run's attention is NaN; the gate ranks
    # the non-finite slots first and the repaired run stays finite.
    model = _big_keys(300000.0)
    raw = WitnessCache(config=model.config, spec=spec_for("llama"), scheme=get_scheme("fp8_e5m2"))
    assert not bool(torch.isfinite(_forward(model, raw, _ids())).all())
    cache, logits = _repaired("fp8_e5m2", threshold=0.2, model=model, risk_traffic=1.0)
    assert cache.summary().label is GateLabel.RISK_RANKED
    assert all(math.isinf(d.meter_before) for d in cache.decisions)
    assert bool(torch.isfinite(logits).all())
    for layer in cache.logs:
        stored: Any = cache.layers[layer]
        assert bool(torch.isfinite(stored.keys).all()), layer


def test_an_update_without_staged_queries_is_refused() -> None:
    model = tiny_model("llama")
    cache = RepairCache(config=model.config, spec=spec_for("llama"),
                        scheme=get_scheme("int4_g32"), policy=RepairPolicy(0.2))
    with pytest.raises(InvalidValueError, match="layer 0: no queries were staged"):
        _forward(model, cache, _ids())


def test_only_dense_memories_are_repaired() -> None:
    model = tiny_model("deepseek_v2")
    with pytest.raises(InvalidValueError, match="dense memories"):
        Repairer(model, scheme="int4_g32", threshold=0.2).new_cache()


@pytest.mark.parametrize("module", ["witcert_adapters.repair", "witcert_adapters.demo.repair"])
def test_docstring_examples(module: str) -> None:
    result = doctest.testmod(importlib.import_module(module),
                             optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted > 0


def test_the_retrieval_battery_is_fixed() -> None:
    from witcert_adapters.demo.repair import retrieval_battery

    battery = retrieval_battery()
    assert battery == retrieval_battery() and len(battery) == 12
    for item in battery:
        assert item.prompt.count(f"is {item.answer}.") == 1 and len(item.answer) == 4
        assert item.prompt.endswith(" is")


@pytest.mark.slow
def test_run_repair_on_smollm2(tmp_path: Path) -> None:
    from witcert_adapters.demo.repair import run_repair

    report: Any = run_repair(tmp_path, schemes=("fp8_e4m3",))
    assert json.loads((tmp_path / "repair.json").read_text()) == report
    row = report["schemes"]["fp8_e4m3"]
    assert set(row) >= {"quality_uncompressed", "quality_raw", "quality_gated", "page_in_bytes",
                        "page_in_fraction", "gate", "threshold"}
    assert row["threshold"] == report["threshold"] == 0.2
    assert row["gate"] in ("certified", "risk-ranked")
    assert 0 < row["page_in_fraction"] <= 1 and row["page_in_bytes"] > 0
    for key in ("quality_uncompressed", "quality_raw", "quality_gated"):
        assert set(row[key]) == {"kl", "top1", "retrieval"}
    raw, gated = row["quality_raw"], row["quality_gated"]
    assert gated["kl"] <= raw["kl"] and gated["top1"] >= raw["top1"]
    assert gated["retrieval"] >= raw["retrieval"]
    assert row["quality_uncompressed"]["retrieval"] >= 0.5  # the battery is one it can pass
