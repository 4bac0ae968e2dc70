"""One interface for all four memory classes: registry dispatch, probe, gate."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tiny_models import kimi_linear, mamba2, qwen3_next, tiny_model, v32  # noqa: E402
from witcert_adapters.memory import MEMORY_CLASSES, memory_class_of, open_probe  # noqa: E402
from witcert_calculus.errors import InvalidValueError  # noqa: E402


@pytest.mark.parametrize(("build", "expected"), [
    (lambda: tiny_model("llama"), "dense"),
    (lambda: tiny_model("deepseek_v3"), "latent"),
    (v32, "sparse_selector"),
    (mamba2, "recurrent"),
    (qwen3_next, "recurrent"),
    (kimi_linear, "recurrent"),
], ids=["llama", "deepseek_v3", "v32", "mamba2", "qwen3_next", "kimi_linear"])
def test_every_memory_class_through_one_interface(build: Any, expected: str) -> None:
    model = build()
    mc, probe = open_probe(model, scheme="int8_token", audit=True)
    assert mc.name == expected
    try:
        cache = probe.new_cache()
        ids = torch.randint(0, 97, (1, 6), generator=torch.Generator().manual_seed(4))
        with torch.no_grad():
            model(ids, cache=cache, use_cache=True)
            for t in range(3):
                model(ids[:, t:t + 1], cache=cache, use_cache=True)
        verdict = mc.gate(probe.result(), tokens=9, writes=4)
    finally:
        probe.close()
    assert verdict.accepted, str(verdict)


def test_registry_covers_four_classes_and_rejects_unknown_types() -> None:
    assert sorted(MEMORY_CLASSES) == ["dense", "latent", "recurrent", "sparse_selector"]
    with pytest.raises(InvalidValueError, match="gpt2"):
        memory_class_of("gpt2")
