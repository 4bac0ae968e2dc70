"""The transformers attachment on tiny random-initialised models, and the acceptance gate."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from tiny_models import kimi_linear, qwen3_next, run_probe, tiny_model  # noqa: E402
from witcert_adapters.architectures import spec_for  # noqa: E402
from witcert_adapters.gate import run_gate  # noqa: E402
from witcert_adapters.hf import Probe, attach  # noqa: E402
from witcert_adapters.layer_log import AuditStep, LayerLog, ReadStep  # noqa: E402
from witcert_adapters.readings import coverage, dense_chain, layer_readings  # noqa: E402
from witcert_adapters.witness_cache import WitnessCache  # noqa: E402
from witcert_calculus.errors import InvalidValueError  # noqa: E402
from witcert_calculus.lean.theorems import TV_EFORM_METER_SOUND, TV_TWO_SIDED_METER_SOUND  # noqa: E402
from witcert_calculus.meters.tv_forms import TVBasis  # noqa: E402
from witcert_calculus.tiers import Tier  # noqa: E402

FAMILIES = ["llama", "qwen2", "deepseek_v2", "deepseek_v3"]


def _ids(seed: int = 0, n: int = 6) -> Any:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 97, (1, n), generator=g)

def _gate_closed(model: Any, probe: Probe) -> Any:
    """Run a probe for two decode steps, close it, and return the gate's verdict."""
    try:
        tokens = run_probe(model, probe, _ids(), 2)
        run = probe.result()
    finally:
        probe.close()
    return run_gate(run, tokens=tokens)



@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("scheme", ["int8_token", "int4_g32", "kivi2_g32", "fp8_e5m2", "dither_int8"])
def test_every_class_reads_through_the_gate(family: str, scheme: str) -> None:
    model = tiny_model(family)
    with attach(model, scheme=scheme, audit=True) as probe:
        tokens = run_probe(model, probe, _ids(), 3)
        run = probe.result()
    verdict = run_gate(run, tokens=tokens)
    assert verdict.accepted, str(verdict)
    assert run.memory_class == spec_for(model.config.model_type).memory_class
    sound = verdict.stages[2]
    assert sound.failures == 0 and sound.checked >= 2 * 4 * tokens
    readings = layer_readings(run)
    assert [r.layer for r in readings] == [0, 1]
    assert all(r.meter.tier in (Tier.CERTIFIED, Tier.SATURATED) for r in readings)
    assert any(float(run.records[layer].audit.true_tv.max()) > 0 for layer in run.layers)


@pytest.mark.parametrize("family", ["llama", "deepseek_v3"])
def test_adapter_off_generation_is_bit_identical(family: str) -> None:
    model = tiny_model(family)
    ids = _ids(1)
    with torch.no_grad():
        plain = model.generate(ids, max_new_tokens=6, do_sample=False, output_logits=True,
                               return_dict_in_generate=True)
        off = model.generate(ids, max_new_tokens=6, do_sample=False, output_logits=True,
                             return_dict_in_generate=True,
                             cache=WitnessCache(config=model.config, spec=spec_for(model.config.model_type),
                                                scheme=None))
        with attach(model, scheme="identity", audit=True) as probe:
            observed = model.generate(ids, max_new_tokens=6, do_sample=False, output_logits=True,
                                      return_dict_in_generate=True, cache=probe.new_cache())
            run = probe.result()
    for other in (off, observed):
        assert torch.equal(plain.sequences, other.sequences)
        assert all(torch.equal(a, b) for a, b in zip(plain.logits, other.logits, strict=True))
    # identity: witnesses are exactly zero, so the meter is exactly zero and the gate accepts
    assert all(float(run.records[layer].read.meter.max()) == 0.0 for layer in run.layers)


def test_keys_arrive_post_rope() -> None:
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    model = tiny_model("llama")
    attn = model.model.layers[0].self_attn
    seen: dict[str, Any] = {}
    h1 = attn.k_proj.register_forward_hook(lambda m, a, out: seen.__setitem__("pre", out.detach()))
    h2 = attn.register_forward_pre_hook(
        lambda m, a, kw: seen.__setitem__("pos", kw["position_embeddings"]), with_kwargs=True)

    class Spy(WitnessCache):
        def update(self, k: Any, v: Any, layer_idx: int, *a: Any, **kw: Any) -> Any:
            if layer_idx == 0:
                seen["cached"] = k.detach()
            return super().update(k, v, layer_idx, *a, **kw)

    cache = Spy(config=model.config, spec=spec_for("llama"), scheme=None)
    with torch.no_grad():
        model(_ids(2, 8), cache=cache, use_cache=True)
    h1.remove()
    h2.remove()
    pre = seen["pre"].view(1, 8, -1, attn.head_dim).transpose(1, 2)
    cos, sin = seen["pos"]
    rotated, _ = apply_rotary_pos_emb(pre, pre, cos, sin)
    assert torch.allclose(seen["cached"], rotated, atol=1e-6)
    assert not torch.allclose(seen["cached"][:, :, 1:], pre[:, :, 1:], atol=1e-3)


def test_gate_rejects_a_path_the_model_never_takes() -> None:
    model = tiny_model("llama")

    class ProbeWithExtraPath(Probe):
        def declared(self) -> frozenset[tuple[int, str]]:
            return super().declared() | {(0, "indexer")}

    verdict = _gate_closed(model, ProbeWithExtraPath(model, scheme="int8_token", audit=True))
    assert not verdict.accepted and verdict.failed_stage == "coverage"
    assert "(0, 'indexer')" in verdict.stages[0].detail
    assert verdict.stages[1].passed is None and verdict.stages[2].passed is None


def test_gate_rejects_an_overwritten_per_layer_state() -> None:
    model = tiny_model("llama")

    class IntoOtherLayer(LayerLog):
        """A layer's accumulator that files its readings in another layer's."""

        def __init__(self, target: LayerLog) -> None:
            super().__init__()
            self.target = target

        def add_read(self, step: ReadStep, **last: Any) -> None:
            self.target.add_read(step, **last)

        def add_audit(self, step: AuditStep) -> None:
            self.target.add_audit(step)

    class OneSlotProbe(Probe):
        def new_cache(self) -> WitnessCache:
            cache = super().new_cache()
            first = cache.log(0)  # every layer's readings land in layer 0's accumulator
            for layer, _ in self.attention[1:]:
                cache.logs[layer] = IntoOtherLayer(first)
            return cache

    verdict = _gate_closed(model, OneSlotProbe(model, scheme="int8_token", audit=True))
    assert verdict.failed_stage == "coverage"
    assert "layer 1" in verdict.stages[0].detail or "never observed" in verdict.stages[0].detail


def test_gate_rejects_counters_that_did_not_advance() -> None:
    model = tiny_model("llama")
    with attach(model, scheme="int8_token", audit=True) as probe:
        tokens = run_probe(model, probe, _ids(), 2)
        run = probe.result()
    verdict = run_gate(run, tokens=tokens + 1)
    assert verdict.failed_stage == "coverage"
    assert "tokens written" in verdict.stages[0].detail


@pytest.mark.parametrize("bad", [float("nan"), -0.25])
def test_gate_rejects_a_value_out_of_range(bad: float) -> None:
    model = tiny_model("qwen2")
    with attach(model, scheme="int8_token", audit=True) as probe:
        tokens = run_probe(model, probe, _ids(), 2)
        run = probe.result()
    records = dict(run.records)
    corrupted = records[1].read.meter.copy()
    corrupted[0, 0, -1] = bad
    records[1] = dataclasses.replace(records[1], read=dataclasses.replace(records[1].read,
                                                                          meter=corrupted))
    verdict = run_gate(dataclasses.replace(run, records=records), tokens=tokens)
    assert verdict.failed_stage == "magnitude"
    assert "layer 1" in verdict.stages[1].detail
    assert verdict.stages[2].passed is None


def test_gate_rejects_an_unsound_meter() -> None:
    """Wiring the known-unsound dispersion shape in place of the meter must fail soundness."""
    from witcert_calculus.meters.dispersion import dispersion_bound_unsound

    model = tiny_model("llama")
    with attach(model, scheme="kivi2_g32", audit=True) as probe:
        cache = probe.new_cache()
        ids = _ids(3, 10)
        with torch.no_grad():
            model(ids, cache=cache, use_cache=True)
        run = probe.result()
    assert run_gate(run, tokens=10).accepted
    unsound = dict(run.records)
    for layer in run.layers:
        read = run.records[layer].read
        p, c = read.last_p, read.last_c
        m = read.meter.copy()
        for h in range(m.shape[1]):
            m[0, h, -1] = dispersion_bound_unsound(p[0, h] / p[0, h].sum(),
                                                   c[0, h])
        unsound[layer] = dataclasses.replace(run.records[layer],
                                             read=dataclasses.replace(read, meter=m))
    verdict = run_gate(dataclasses.replace(run, records=unsound), tokens=10)
    assert verdict.failed_stage == "soundness", str(verdict)
    assert verdict.stages[2].failures > 0


def test_probe_requires_eager_attention_and_known_layouts() -> None:
    model = tiny_model("llama")
    model.config._attn_implementation = "sdpa"
    with pytest.raises(InvalidValueError, match="eager"):
        Probe(model, scheme="int8_token")
    with pytest.raises(InvalidValueError, match="no_such_arch"):
        spec_for("no_such_arch")


def test_dense_chain_and_coverage() -> None:
    model = tiny_model("llama")
    with attach(model, scheme="int8_token", audit=True) as probe:
        run_probe(model, probe, _ids(), 3)
        run = probe.result()
    chains = {layer: dense_chain(witness_max=run.records[layer].write.witness_full_max,
                                 q_norm_max=run.records[layer].read.q_norm_max, scale=16 ** -0.5)
              for layer in run.layers}
    readings = layer_readings(run, chains=chains)
    for r in readings:
        assert r.chain_reading is not None
        # the coarse chain (global sup) never undercuts the per-cell meter's worst cell
        assert r.chain_reading.value >= min(1.0, r.meter.raw) - 1e-12
    cov = coverage(run, threshold=1.0)
    assert cov == 1.0
    assert 0.0 <= coverage(run, threshold=0.01, min_position=6) <= 1.0
    with pytest.raises(InvalidValueError, match="threshold"):
        coverage(run, threshold=1.5)
    assert np.all(run.reported(0) <= 1.0)


@pytest.mark.parametrize("family", FAMILIES + ["qwen3_next", "kimi_linear"])
def test_recomputed_queries_reproduce_the_models_attention(family: str) -> None:
    """The queries the meter uses are the layer's own: with them and the cached (compressed)
    keys, softmax reproduces the attention probabilities the layer returned (also for the
    full-attention layer of the hybrids: gated partial-RoPE GQA, MLA with NoPE)."""
    model = {"qwen3_next": qwen3_next, "kimi_linear": kimi_linear}.get(
        family, lambda: tiny_model(family))()
    spec = spec_for(model.config.model_type)
    attn = model.model.layers[1].self_attn
    seen: dict[str, Any] = {}
    h1 = attn.register_forward_pre_hook(
        lambda m, a, kw: seen.__setitem__("q", spec.queries(m, kw["hidden_states"],
                                                            kw.get("position_embeddings"))),
        with_kwargs=True)
    h2 = attn.register_forward_hook(lambda m, a, out: seen.__setitem__("p", out[1]))
    cache = WitnessCache(config=model.config, spec=spec, scheme=None)
    ids = _ids(5, 7)
    with torch.no_grad():
        model(ids, cache=cache, use_cache=True)
        model(ids[:, :1], cache=cache, use_cache=True)  # one decode step
    h1.remove()
    h2.remove()
    layer = cache.layers[1]
    slots = [layer.keys, layer.values]
    heads = seen["p"].shape[1]
    logits = sum(float(attn.scaling) * torch.einsum(
        "bhqd,bhsd->bhqs", q.double(),
        slots[part.slot].double().repeat_interleave(heads // slots[part.slot].shape[1], dim=1))
        for q, part in zip(seen["q"], spec.parts, strict=True))
    assert torch.allclose(torch.softmax(logits, dim=-1), seen["p"].double(), atol=1e-6)


#: The batched and per-layer meters sum the same terms in another order (stacked reductions
#: vectorize differently): an ulp or two, far below the outward-rounding margins (>= 1e-14).
_REORDER = 1e-15


def _same(a: Any, b: Any, where: str = "run") -> None:
    """Two probe results hold the same values (arrays equal up to summation order)."""
    if isinstance(a, TVBasis):
        # Each basis is sealed as issued (a deferred truth as its own tensor): compared by
        # the evidence it gives.
        assert a.evidence(TV_EFORM_METER_SOUND, TV_TWO_SIDED_METER_SOUND) == b.evidence(
            TV_EFORM_METER_SOUND, TV_TWO_SIDED_METER_SOUND), where
    elif dataclasses.is_dataclass(a) and not isinstance(a, type):
        assert type(a) is type(b), where
        for f in dataclasses.fields(a):
            _same(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
    elif isinstance(a, np.ndarray):
        assert a.shape == b.shape and a.dtype == b.dtype, where
        assert np.allclose(a, b, rtol=_REORDER, atol=0.0, equal_nan=True), (
            where, float(np.nanmax(np.abs(a - b) / np.maximum(np.abs(b), 1e-300))))
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _same(a[k], b[k], f"{where}[{k}]")
    elif isinstance(a, tuple | list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def _probed(build: Any, scheme: str, *, ledger: bool, batched: bool,
            monkeypatch: pytest.MonkeyPatch) -> Any:
    import witcert_adapters.hf as hf
    import witcert_adapters.witness_cache as witness_cache
    from witcert_adapters.recurrent import RecurrentProbe
    from witcert_calculus import RiskLedger

    with monkeypatch.context() as m:
        if not batched:  # each call metered in its hook, each write noised and recorded alone
            m.setattr(hf, "_STASH_BUDGET", 0)
            m.setattr(witness_cache, "_WRITE_BUDGET", 0)
        model = build()
        led = RiskLedger() if ledger else None
        rid = led.open_request(delta_req="1/100") if led is not None else 0
        hybrid = model.config.model_type == "qwen3_next"
        probe: Any = (RecurrentProbe if hybrid else Probe)(model, scheme=scheme,
                                                            request_id=rid, ledger=led)
        try:
            cache = probe.new_cache()
            ids = _ids(3, 7)
            with torch.no_grad():
                model(ids[:, :5], cache=cache, use_cache=True)
                for t in range(5, 7):
                    model(ids[:, t:t + 1], cache=cache, use_cache=True)
            run = probe.result()
        finally:
            probe.close()
    return run.attention if hybrid else run


@pytest.mark.parametrize("family", ["llama", "deepseek_v3", "qwen3_next"])
@pytest.mark.parametrize("scheme", ["dither_int8_g16_m4", "int8_token"])
@pytest.mark.parametrize("ledger", [False, True])
def test_batched_meter_matches_the_per_layer_path(family: str, scheme: str, ledger: bool,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Decode calls metered together at the end of the forward (stacked over layers, the
    forward's dither noise drawn once) record exactly what per-layer metering records."""
    build = qwen3_next if family == "qwen3_next" else (lambda: tiny_model(family))
    want = _probed(build, scheme, ledger=ledger, batched=False, monkeypatch=monkeypatch)
    got = _probed(build, scheme, ledger=ledger, batched=True, monkeypatch=monkeypatch)
    assert got.records and (not ledger or "dither" not in scheme or got.tier_b_events)
    _same(got, want)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(1, 9), min_size=1, max_size=4),
                          st.sampled_from(["append", "new", "uneven", "replace"])),
                min_size=1, max_size=8),
       st.integers(1, 3))
def test_the_grown_stack_is_the_stacked_history(rounds: list[tuple[list[int], str]],
                                                layers: int) -> None:
    """The probe's stacked per-token records (grown in place, only new write steps copied)
    are exactly every layer's steps concatenated and stacked: after appends, after records
    that are not the ones held (a new history), with layers of different step counts, and
    after an earlier step was replaced (a repair's zeroed witnesses: a new log revision)."""
    from witcert_adapters.hf import _Stack  # pyright: ignore[reportPrivateUsage]
    from witcert_adapters.layer_log import concat

    g = torch.Generator().manual_seed(len(rounds))
    stack = _Stack()
    rows: list[list[Any]] = [[] for _ in range(layers)]
    revision = 0
    for sizes, kind in rounds:
        if kind == "new":  # other records of the same shapes: nothing held may be reused
            rows = [[] for _ in range(layers)]
        if kind == "replace" and rows[0]:  # the first step of every layer zeroed in a copy
            rows = [[torch.zeros_like(r[0])] + r[1:] for r in rows]
            revision += 1
        for t in sizes:
            for r in rows:
                r.append(torch.rand(2, 3, t, 4, generator=g, dtype=torch.float32))
        if kind == "uneven" and layers > 1:  # layer 1: the same tokens in fewer steps
            for r in rows:
                r.append(torch.rand(2, 3, 1, 4, generator=g))
            rows[1][-2:] = [torch.cat(rows[1][-2:], dim=2)]
        got = stack.stacked(rows, torch.float64, revisions=(revision,) * layers)
        want = torch.stack([concat(r, dim=2) for r in rows]).to(torch.float64)
        assert got.dtype == torch.float64 and torch.equal(got, want)


def test_a_deferred_write_check_fails_closed_with_the_value(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """A dithered write's content checks are read once per forward; a failure still raises
    the quantizer's typed error naming the value."""
    model = tiny_model("llama")
    probe = Probe(model, scheme="dither_int8_g16_m4")
    try:
        cache = probe.new_cache()
        with torch.no_grad():
            model(_ids(), cache=cache, use_cache=True)
        big = model.model.layers[1].self_attn.k_proj
        with torch.no_grad():
            big.weight.mul_(1e6)  # keys ~1e6: a block scale overflows float16
            with pytest.raises(InvalidValueError, match="overflows float16"):
                model(_ids()[:, :1], cache=cache, use_cache=True)
    finally:
        probe.close()
