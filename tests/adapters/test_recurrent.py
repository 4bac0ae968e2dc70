"""Recurrent-state memories (Mamba2, Qwen3-Next, Kimi-Linear) through the same scheme registry and gate."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tiny_models import kimi_linear, mamba2, qwen3_next  # noqa: E402
from witcert_adapters.recurrent import RecurrentProbe, run_recurrent_gate  # noqa: E402
from witcert_calculus.errors import InvalidValueError  # noqa: E402
from witcert_calculus.metrics import AtConsume, RecurrentStateError  # noqa: E402


def _run(model: Any, scheme: str, steps: int = 4) -> Any:
    probe = RecurrentProbe(model, scheme=scheme, audit=True)
    try:
        cache = probe.new_cache()
        ids = torch.randint(0, 97, (1, 6), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            model(ids, cache=cache, use_cache=True)
            for t in range(steps):
                model(ids[:, t:t + 1], cache=cache, use_cache=True)
        return probe.result()
    finally:
        probe.close()


@pytest.mark.parametrize("scheme", ["int8_token", "int4_g32", "kivi2_g32"])
def test_mamba2_state_error_is_bounded_through_the_gate(scheme: str) -> None:
    run = _run(mamba2(), scheme)
    verdict = run_recurrent_gate(run, writes=5)
    assert verdict.accepted, str(verdict)
    assert run.layers == (0, 1)
    assert max(float(run.records[layer].true_err.max()) for layer in run.layers) > 0
    rec = run.summary(0)
    reading = rec.contract.bound(float(run.records[0].b[0].max()))
    assert reading.metric == RecurrentStateError[AtConsume]
    a = run.records[0].a[1:]
    assert math.isclose(rec.mean_log_a, float(np.log(a.reshape(a.shape[0], -1)[:, int(np.argmax(
        run.records[0].bound[-1].reshape(-1)))]).mean()), rel_tol=1e-12)
    assert rec.mean_log_a <= rec.mean_caliber  # Jensen: E[log a] <= log E[a]


def test_recurrent_gate_catches_a_bound_that_drops_the_carried_error() -> None:
    run = _run(mamba2(), "kivi2_g32")
    assert run_recurrent_gate(run, writes=5).accepted
    # A plausible bug: forget the contraction term and bound each step by its own witness.
    wrong = dataclasses.replace(run, records={k: dataclasses.replace(r, bound=r.b.copy())
                                              for k, r in run.records.items()})
    verdict = run_recurrent_gate(wrong, writes=5)
    assert verdict.failed_stage == "soundness", str(verdict)


def test_recurrent_gate_coverage_and_magnitude_failures() -> None:
    run = _run(mamba2(), "int8_token")
    assert run_recurrent_gate(run, writes=6).failed_stage == "coverage"
    a = {k: dataclasses.replace(r, a=r.a.copy()) for k, r in run.records.items()}
    a[1].a[2, 0, 0] = 1.5  # a "contraction" above 1 is out of range
    verdict = run_recurrent_gate(dataclasses.replace(run, records=a), writes=5)
    assert verdict.failed_stage == "magnitude"
    assert verdict.stages[2].passed is None


@pytest.mark.parametrize("build", [qwen3_next, kimi_linear], ids=["qwen3_next", "kimi_linear"])
@pytest.mark.parametrize("scheme", ["int8_token", "kivi2_g32"])
def test_delta_rule_states_are_bounded_through_the_gate(build: Any, scheme: str) -> None:
    """Gated DeltaNet (Qwen3-Next) and KDA (Kimi-Linear): the linear-attention layer is a
    recurrent memory, and the hybrid's full-attention layer is observed and gated too."""
    run = _run(build(), scheme)
    verdict = run_recurrent_gate(run, writes=5, tokens=10)
    assert verdict.accepted, str(verdict)
    assert run.layers == (0,)
    assert run.attention is not None and run.attention.layers == (1,)
    assert {(1, "write"), (1, "read"), (1, "audit")} <= run.declared
    assert float(run.attention.records[1].audit.true_tv.max()) > 0
    assert verdict.stages[2].checked > run.records[0].true_err.size  # attention cells were audited
    a = run.records[0].a[1:]
    assert bool(((a > 0) & (a <= 1)).all())
    assert float(run.records[0].true_err.max()) > 0
    rec = run.summary(0)
    assert rec.mean_log_a <= rec.mean_caliber


@pytest.mark.parametrize("build", [qwen3_next, kimi_linear], ids=["qwen3_next", "kimi_linear"])
def test_hybrid_gate_rejects_an_unobserved_attention_layer(build: Any) -> None:
    """Coverage declares the full-attention layers: a run whose attention layer never
    produced readings (here: its hooks removed) is rejected at coverage."""
    model = build()
    probe = RecurrentProbe(model, scheme="int8_token", audit=True)
    try:
        assert probe.attention is not None
        cache = probe.new_cache()
        probe.attention.close()  # the attention layer's read path is no longer observed
        ids = torch.randint(0, 97, (1, 6), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            model(ids, cache=cache, use_cache=True)
        run = probe.result()
    finally:
        probe.close()
    verdict = run_recurrent_gate(run, writes=1, tokens=6)
    assert verdict.failed_stage == "coverage", str(verdict)
    assert "(1, 'read')" in verdict.stages[0].detail
    with pytest.raises(InvalidValueError, match="tokens"):
        run_recurrent_gate(run, writes=1)


def test_hybrid_attention_soundness_failure_is_caught() -> None:
    run = _run(qwen3_next(), "kivi2_g32")
    assert run_recurrent_gate(run, writes=5, tokens=10).accepted
    att = run.attention
    assert att is not None
    zero = {k: dataclasses.replace(r, read=dataclasses.replace(r.read, meter=np.zeros_like(r.read.meter)))
            for k, r in att.records.items()}  # a meter claiming exactness
    verdict = run_recurrent_gate(dataclasses.replace(run, attention=dataclasses.replace(
        att, records=zero)), writes=5, tokens=10)
    assert verdict.failed_stage == "soundness", str(verdict)
