"""Learned sparse selector (DeepSeek-V3.2 indexer) through the same schemes and gate."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tiny_models import v32  # noqa: E402
from witcert_adapters.selector import SelectorProbe, run_selector_gate  # noqa: E402
from witcert_calculus.metrics import AtConsume, SelectorMass  # noqa: E402


def _run(scheme: str) -> tuple[Any, Any]:
    model = v32()
    probe = SelectorProbe(model, scheme=scheme, audit=True)
    try:
        cache = probe.new_cache()
        ids = torch.randint(0, 97, (1, 10), generator=torch.Generator().manual_seed(2))
        with torch.no_grad():
            model(ids, cache=cache, use_cache=True)
            for t in range(4):
                model(ids[:, t:t + 1], cache=cache, use_cache=True)
        return probe, probe.result()
    finally:
        probe.close()


@pytest.mark.parametrize("scheme", ["int8_token", "int4_g32", "kivi2_g32"])
def test_selector_contract_through_the_gate(scheme: str) -> None:
    probe, run = _run(scheme)
    verdict = run_selector_gate(run, tokens=14)
    assert verdict.accepted, str(verdict)
    assert all(r.select.selection_matches_model for r in run.records.values())
    reading, stable = probe.readings(run, 0)
    assert reading.metric == SelectorMass[AtConsume]
    assert 0.0 <= stable <= 1.0
    # stable rows keep the exact selection (checked by the gate); the test also sees rows
    # whose selection really changed, so the certificate is not vacuous
    changed = sum(int((~run.records[layer].audit.same_selection).sum()) for layer in run.layers)
    if scheme != "int8_token":
        assert changed > 0


def test_selector_gate_catches_a_stability_claim_on_a_changed_row() -> None:
    _, run = _run("kivi2_g32")
    assert run_selector_gate(run, tokens=14).accepted
    overclaim = {k: dataclasses.replace(r, select=dataclasses.replace(
        r.select, stable=np.ones_like(r.select.stable)))
        for k, r in run.records.items()}  # "every row is stable"
    verdict = run_selector_gate(dataclasses.replace(run, records=overclaim), tokens=14)
    assert verdict.failed_stage == "soundness"


def test_selector_gate_coverage_failure() -> None:
    _, run = _run("int8_token")
    verdict = run_selector_gate(run, tokens=15)
    assert verdict.failed_stage == "coverage" and "indexer keys written" in verdict.stages[0].detail
