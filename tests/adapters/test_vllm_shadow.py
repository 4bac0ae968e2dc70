"""The shadow audit through vLLM's engine with the plugin: requests served on the fp8 cache, a
sample chosen before serving replayed along the served tokens on the same cache and on the exact
one, and the anytime-valid rate bound over them."""

from __future__ import annotations

from pathlib import Path

import pytest

from witcert_adapters.shadow import ShadowSampler, request_prompts, vllm_shadow_audit
from witcert_adapters.vllm_plugin.launch import fp8_supported
from witcert_adapters.vllm_plugin.store import VerdictStore
from witcert_calculus import Tier

pytestmark = [pytest.mark.slow, pytest.mark.engine,
              pytest.mark.skipif(not fp8_supported(), reason="vLLM's CPU build serves an fp8 KV "
                                 "cache only on CPUs with AVX-512 or AMX; this CPU has neither")]


def test_vllm_shadow_audit_replays_the_sampled_requests(tmp_path: Path) -> None:
    sampler = ShadowSampler(rate=0.7, seed=5)
    audit = vllm_shadow_audit(request_prompts(6), sampler=sampler, threshold=0.05, alpha=0.1,
                              new_tokens=4, work_dir=tmp_path)
    assert [r.sampled for r in audit.requests] == [sampler.sampled(i) for i in range(6)]
    sampled = audit.audited
    assert 0 < len(sampled) < 6 and audit.rate.trials == len(sampled)
    assert audit.rate.events == sum(r.max_tv > 0.05 for r in sampled)
    assert audit.retokenized == 0            # scored along the served token ids
    assert audit.tier is Tier.PARTIALLY_CERTIFIED and audit.scheme == "vllm fp8"
    for r in audit.requests:
        assert len(r.tokens) == 4
        if r.sampled:
            assert len(r.tv) == len(r.kl) == 4
            assert all(0 <= t <= 1 for t in r.tv) and all(k > -1e-6 for k in r.kl)
        else:
            assert r.tv == ()
    # the fp8 cache moves the distribution, and the replay sees it
    assert max(r.max_tv for r in sampled) > 1e-4
    assert 0 < audit.rate.upper <= 1
    # every request's outcome is in the served engine's verdict store, beside its verdict
    store = VerdictStore(tmp_path / "served.sqlite")
    found = [r for r in (store.shadow(v.request) or store.shadow(v.external)
                         for v in store.all()) if r is not None]
    assert len(found) == 6                      # one per served request, each beside a verdict
    last = max(found, key=lambda r: r.trials)
    assert last.trials == audit.rate.trials and last.rate_upper == audit.rate.upper
    assert sorted(r.sampled for r in found) == sorted(r.sampled for r in audit.requests)
    assert all((r.max_tv is None) != r.sampled for r in found)
    assert store.shadow("no such request") is None
