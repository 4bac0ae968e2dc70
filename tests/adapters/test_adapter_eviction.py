"""The eviction meter under real kvpress presses: SmolLM2's pretrained weights at a press's real
operating point (audited: no cell's true TV above its bound), the restoring gate, typed refusals
of presses that are not drops, and the attribution on tiny random Llama models."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
kvpress = pytest.importorskip("kvpress")

from tiny_models import tiny_model  # noqa: E402
from witcert_adapters.eviction import forced_logits, meter_press  # noqa: E402
from witcert_calculus import AtConsume, AttentionTV, DroppedMass, Tier  # noqa: E402
from witcert_calculus.errors import (  # noqa: E402
    InvalidValueError,
    UnattributedEvictionError,
)
from witcert_calculus.lean.theorems import (  # noqa: E402
    EVICT_TV_BLOCKS_METER_SOUND,
    EVICT_TV_METER_EQ,
)
from witcert_calculus.tiers import theorems_of  # noqa: E402

PRESSES = ("SnapKVPress", "StreamingLLMPress", "KnormPress", "ExpectedAttentionPress",
           "TOVAPress")


@pytest.fixture(scope="module")
def smollm2() -> tuple[Any, Any]:
    from witcert_adapters.demo.models import load_smollm2

    model, tok = load_smollm2()
    text = " ".join(["The weather was mild and the streets were quiet.",
                     "A train left the station on time.", "The code for Alice is 4821."] * 12)
    ids = tok(text + " The code for Alice is 4821.", return_tensors="pt").input_ids
    return model, ids


def _run(model: Any, ids: Any, press: Any, **kw: Any) -> Any:
    with meter_press(model, press, audit=True, **kw) as run:
        logits = forced_logits(model, ids, int(ids.shape[1]) - 6)
    return run, logits


@pytest.mark.parametrize("name", PRESSES)
def test_real_presses_are_metered_with_no_audited_violation(smollm2: Any, name: str) -> None:
    model, ids = smollm2
    run, _ = _run(model, ids, getattr(kvpress, name)(compression_ratio=0.5))
    s = run.summary(threshold=0.1)
    layers = model.config.num_hidden_layers
    assert s.cells == layers * model.config.num_attention_heads * 5   # every later step
    assert s.evicted_tokens > 0 and s.violations == 0
    assert s.max_true_tv is not None and 0 < s.max_true_tv <= s.max_bound
    # coverage (cells certified under tau) is a measurement, not everything nor nothing here
    assert 0.0 < s.coverage < 1.0
    r = run.reading()
    assert r.metric == DroppedMass[AtConsume] and r.tier is Tier.CERTIFIED
    assert EVICT_TV_BLOCKS_METER_SOUND in theorems_of(r.evidence)
    tv = run.tv_reading()
    assert tv.metric == AttentionTV[AtConsume] and tv.value == r.value
    assert EVICT_TV_METER_EQ in theorems_of(tv.evidence)


def test_the_gate_restores_until_every_cell_is_under_tau(smollm2: Any) -> None:
    model, ids = smollm2
    full = forced_logits(model, ids, int(ids.shape[1]) - 6)
    raw, raw_logits = _run(model, ids, kvpress.KnormPress(compression_ratio=0.5))
    gated, gated_logits = _run(model, ids, kvpress.KnormPress(compression_ratio=0.5),
                               threshold=0.1)
    r, g = raw.summary(threshold=0.1), gated.summary(threshold=0.1)
    assert g.coverage == 1.0 and g.violations == 0 and g.max_bound <= 0.1
    assert r.coverage < 1.0 and r.restored_tokens == 0
    assert 0 < g.restored_tokens < g.evicted_tokens
    assert g.restored_bytes == g.restored_tokens * 2 * 64 * 4
    # restoring exact entries moves the output toward the full cache's
    def dist(x: Any) -> float:
        return float((x - full).abs().max())
    assert dist(gated_logits) < dist(raw_logits)


def test_block_witnesses_are_sound_and_looser(smollm2: Any) -> None:
    model, ids = smollm2
    one, _ = _run(model, ids, kvpress.StreamingLLMPress(compression_ratio=0.5))
    big, _ = _run(model, ids, kvpress.StreamingLLMPress(compression_ratio=0.5), block_size=16,
                  center="float16")
    a, b = one.summary(threshold=0.1), big.summary(threshold=0.1)
    assert b.violations == 0 and b.witness_bytes < a.witness_bytes
    assert b.coverage <= a.coverage


# ----------------------------------------------------------------------------- tiny models

@pytest.fixture(scope="module")
def tiny() -> Any:
    return tiny_model("llama")


def _ids(n: int = 40) -> Any:
    return torch.randint(0, 97, (1, n), generator=torch.Generator().manual_seed(0))


def test_decoding_press_compressions_are_all_metered(tiny: Any) -> None:
    press = kvpress.DecodingPress(base_press=kvpress.KnormPress(), compression_interval=4,
                                  target_size=24)
    ids = _ids(48)
    with meter_press(tiny, press, audit=True) as run:
        forced_logits(tiny, ids, 30)
    s = run.summary(threshold=0.5)
    assert s.evicted_tokens > 0 and s.violations == 0 and s.cells > 0


def test_layers_compressed_to_different_lengths_are_metered(tiny: Any) -> None:
    # PyramidKV keeps fewer entries in deeper layers; the mask built for layer 0's length is
    # cut to each layer's own
    press = kvpress.PyramidKVPress(compression_ratio=0.5, window_size=4)
    with meter_press(tiny, press, audit=True) as run:
        forced_logits(tiny, _ids(60), 50)
    lengths = {st.keys.shape[1] for st in run.layers.values()}
    assert len(lengths) == 2
    s = run.summary(threshold=0.5)
    assert s.violations == 0 and s.cells == 2 * 4 * 9


def test_a_merging_press_is_refused_by_name(tiny: Any) -> None:
    press = kvpress.KeyRerotationPress(press=kvpress.KnormPress(compression_ratio=0.5))
    with pytest.raises(UnattributedEvictionError, match="KeyRerotationPress.*bit-exact"):
        with meter_press(tiny, press):
            forced_logits(tiny, _ids(), 30)


def test_values_changed_in_place_are_refused(tiny: Any) -> None:
    class Averaging(kvpress.KnormPress):  # type: ignore[misc]
        def compress(self, module: Any, hidden_states: Any, keys: Any, values: Any,
                     attentions: Any, kwargs: Any) -> Any:
            k, v = super().compress(module, hidden_states, keys, values, attentions, kwargs)
            return k, (v + v.roll(1, dims=2)) / 2   # keys kept, values merged

    with pytest.raises(UnattributedEvictionError, match="Averaging"):
        with meter_press(tiny, Averaging(compression_ratio=0.5)):
            forced_logits(tiny, _ids(), 30)


def test_masked_in_place_is_refused(tiny: Any) -> None:
    class Masking(kvpress.KnormPress):  # type: ignore[misc]
        def compress(self, module: Any, hidden_states: Any, keys: Any, values: Any,
                     attentions: Any, kwargs: Any) -> Any:
            module.masked_key_indices = (torch.tensor([0]), torch.tensor([0]), torch.tensor([3]))
            return keys, values

    with pytest.raises(UnattributedEvictionError, match="masked"):
        with meter_press(tiny, Masking(compression_ratio=0.5)):
            forced_logits(tiny, _ids(), 30)
    for layer in tiny.model.layers:
        layer.self_attn.masked_key_indices = None


def test_no_compression_no_certificate(tiny: Any) -> None:
    with meter_press(tiny, kvpress.KnormPress(compression_ratio=0.0)) as run:
        forced_logits(tiny, _ids(), 30)
    assert run.summary(threshold=0.1).evicted_tokens == 0
    with pytest.raises(InvalidValueError, match="nothing to certify"):
        run.reading()


def test_the_model_is_left_as_it_was(tiny: Any) -> None:
    before = tiny.config._attn_implementation
    press = kvpress.KnormPress(compression_ratio=0.5)
    with meter_press(tiny, press):
        forced_logits(tiny, _ids(), 30)
    assert tiny.config._attn_implementation == before
    assert "forward_hook" not in vars(press)
    assert all(getattr(l.self_attn, "_witcert_press_run", None) is None for l in tiny.model.layers)
    assert not any(l.self_attn._forward_hooks for l in tiny.model.layers)


def test_bad_arguments_are_refused(tiny: Any) -> None:
    press = kvpress.KnormPress(compression_ratio=0.5)
    for kw, name in (({"block_size": 0}, "block_size"), ({"threshold": 1.0}, "threshold"),
                     ({"center": "int4"}, "center")):
        with pytest.raises(InvalidValueError, match=name):
            with meter_press(tiny, press, **kw):
                pass
    with pytest.raises(InvalidValueError, match="prompt_len"):
        forced_logits(tiny, _ids(), 40)


def test_the_demo_writes_its_report(tmp_path: Any) -> None:
    from witcert_adapters.demo.eviction import render, run_eviction

    report = run_eviction(tmp_path, presses=("KnormPress",), ratios=(0.5,), items=1, facts=2,
                          filler=4, witnesses=((1, "int8"), (4, "int8")))
    row = report["presses"][0]
    assert row["raw"]["violations"] == 0 and row["gated"]["violations"] == 0
    assert row["gated"]["coverage"] == 1.0 and row["raw"]["restored_entries"] == 0
    assert row["quality_gated"]["kl"] <= row["quality_raw"]["kl"]
    choice = report["witness_choice"]["rows"]
    assert choice[0]["witness_bytes_per_entry"] > choice[1]["witness_bytes_per_entry"]
    assert report["ledger"]["requests"] == 4 and report["ledger"]["spent"] == 0.0
    text = (tmp_path / "eviction.txt").read_text()
    assert text == render(report) and "KnormPress" in text
    assert (tmp_path / "eviction.json").exists()
    with pytest.raises(InvalidValueError, match="NoPress"):
        run_eviction(tmp_path, presses=("NoPress",))
