"""Through depth on real models: SmolLM2's pretrained weights (every layer's bound and the
next-token bound at or above the audited truth, for fp8, the certified operating point and int4
at several depth windows), a tiny Llama where the composed bound is informative, the shadow
audit's sampling and rate bound, and the depth demo at a small size."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from tiny_models import tiny_model  # noqa: E402
from witcert_adapters.depth import depth_step, model_norms  # noqa: E402
from witcert_adapters.shadow import ShadowSampler, request_prompts, shadow_audit  # noqa: E402
from witcert_calculus import NextTokenTV, Tier  # noqa: E402
from witcert_calculus.errors import InvalidValueError  # noqa: E402
from witcert_calculus.metrics import same_metric  # noqa: E402


@pytest.fixture(scope="module")
def smollm2() -> tuple[Any, Any, Any]:
    from witcert_adapters.demo.models import load_smollm2

    model, tok = load_smollm2()
    return model, tok, model_norms(model)


def _sound(step: Any) -> None:
    assert len(step.bound) == len(step.truth) == len(step.local) == len(step.local_truth)
    for b, t in zip(step.bound, step.truth, strict=True):
        assert t <= b
    for b, t in zip(step.local, step.local_truth, strict=True):
        assert t <= b
    assert step.tv_truth <= step.tv_bound
    assert same_metric(step.reading.metric, NextTokenTV[__import__("witcert_calculus").AtConsume])


@pytest.mark.parametrize("scheme", ["fp8_e4m3_scaled", "dither_int8_g32_m4", "int4_g32"])
def test_smollm2_bounds_hold_at_every_layer_and_at_the_next_token(smollm2: Any,
                                                                   scheme: str) -> None:
    model, tok, norms = smollm2
    layers = model.config.num_hidden_layers
    for prompt in request_prompts(2):
        ids = tok(prompt, return_tensors="pt").input_ids
        for w in (1, 4, layers):
            step = depth_step(model, ids, scheme=scheme, window=range(layers - w, layers),
                              norms=norms)
            _sound(step)
            assert step.first == layers - w
            assert step.tv_truth > 0                    # the compression did change the output
            assert all(t > 0 for t in step.local_truth)
            # On this model the certified chain says nothing (SATURATED), and says so.
            assert step.reading.tier is Tier.SATURATED


def test_a_small_model_gets_an_informative_certificate() -> None:
    model = tiny_model("llama", seed=3)
    with torch.no_grad():                       # small weights: a well-conditioned model
        for p in model.parameters():
            if p.ndim == 2:
                p.mul_(0.2)
    norms = model_norms(model)
    ids = torch.randint(0, 97, (1, 24), generator=torch.Generator().manual_seed(0))
    informative = 0
    for scheme in ("int8_token", "int4_g32", "kivi2_g32"):
        for w in ((1,), (0, 1)):
            step = depth_step(model, ids, scheme=scheme, window=w, norms=norms)
            _sound(step)
            informative += step.reading.tier is not Tier.SATURATED and step.tv_bound < 0.5
    assert informative >= 2


def test_the_window_and_the_model_are_checked(smollm2: Any) -> None:
    model, tok, norms = smollm2
    ids = tok("Hello there", return_tensors="pt").input_ids
    with pytest.raises(InvalidValueError, match="window"):
        depth_step(model, ids, scheme="int4_g32", window=[], norms=norms)
    with pytest.raises(InvalidValueError, match="window"):
        depth_step(model, ids, scheme="int4_g32", window=[99], norms=norms)
    qwen = tiny_model("qwen2")
    with pytest.raises(InvalidValueError, match="bias"):
        model_norms(qwen)
    # nothing is left behind on the model
    assert model.config._attn_implementation == "eager"
    assert not any(hasattr(layer.self_attn, "_witcert_depth") for layer in model.model.layers)


def test_the_sampler_decides_before_serving_from_the_id_alone() -> None:
    s = ShadowSampler(rate=0.3, seed=11)
    picks = [s.sampled(i) for i in range(4000)]
    assert picks == [ShadowSampler(rate=0.3, seed=11).sampled(i) for i in range(4000)]
    assert 0.27 < sum(picks) / 4000 < 0.33
    assert picks != [ShadowSampler(rate=0.3, seed=12).sampled(i) for i in range(4000)]
    with pytest.raises(InvalidValueError, match="rate"):
        ShadowSampler(rate=0.0, seed=1)
    with pytest.raises(InvalidValueError, match="request_id"):
        s.sampled(-1)


def test_shadow_audit_measures_the_sampled_requests(smollm2: Any) -> None:
    model, tok, norms = smollm2
    audit = shadow_audit(model, tok, request_prompts(5), scheme="int4_g32",
                         sampler=ShadowSampler(rate=0.6, seed=3), threshold=0.05, alpha=0.1,
                         new_tokens=4, norms=norms)
    sampled = [r for r in audit.requests if r.sampled]
    assert [r.sampled for r in audit.requests] == [
        ShadowSampler(rate=0.6, seed=3).sampled(i) for i in range(5)]
    assert audit.rate.trials == len(sampled) and len(sampled) > 0
    assert audit.rate.events == sum(r.max_tv > 0.05 for r in sampled)
    assert audit.tier is Tier.PARTIALLY_CERTIFIED
    upper = {f.name: f.samples[0].value for f in audit.families()}["witcert_shadow_rate_upper"]
    assert upper == audit.rate.upper
    for r in audit.requests:
        assert len(r.tokens) == 4
        if r.sampled:
            assert len(r.tv) == len(r.kl) == 3 and r.depth is not None
            assert all(0 < t <= 1 for t in r.tv) and all(k >= 0 for k in r.kl)
            _sound(r.depth)
        else:
            assert r.tv == () and r.depth is None
    none = shadow_audit(model, tok, request_prompts(2), scheme="int4_g32",
                        sampler=ShadowSampler(rate=1e-9, seed=3), threshold=0.05, alpha=0.1,
                        new_tokens=2, norms=norms)
    assert none.rate.trials == 0 and none.tier is Tier.EMPIRICAL and none.rate.upper == 1.0


def test_depth_demo_at_a_small_size(tmp_path: Path) -> None:
    from witcert_adapters.demo.depth import run_depth

    report = run_depth(tmp_path, cases=1, requests=4, rate=0.99, new_tokens=3, windows=(1,),
                       schemes=("int4_g32",), shadow_schemes=("int4_g32",), vllm_requests=0)
    text = (tmp_path / "depth.txt").read_text()
    assert "SATU" in text and "anytime-valid" in text and "EMPIRICAL" in text
    assert report["windows"][0]["violations"] == 0
    assert report["shadow"][0]["depth_violations"] == 0
    assert (tmp_path / "depth.json").is_file()
