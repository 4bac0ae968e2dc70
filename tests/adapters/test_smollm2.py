"""Soundness on the embedded pretrained model: SmolLM2-135M-Instruct, all 30 layers.

Three prompts, prefill plus decode steps, four schemes; every (layer, head, position)
cell's true TV against exact attention must be at most the reported Tier-A bound, and the
gate must accept every request. For the dithered scheme the Tier-B (probabilistic)
certificate of every cell is checked the same way, with each forward call admitted into
the request's ledger as one probabilistic event.

The decode steps here feed back the compressed model's greedy token, so the queries of
later steps depend on the dither stream: that run is outside the Tier-B certificate's
non-adaptive scope (Tier A, the adaptive-safe tier, still applies), and a Tier-B
violation would be reported by the gate, not hidden. With delta_loc of order 1e-5, zero
violations are expected and asserted.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from witcert_adapters.demo.models import load_smollm2, smollm2_gguf_path  # noqa: E402
from witcert_adapters.gate import run_gate  # noqa: E402
from witcert_adapters.hf import attach  # noqa: E402
from witcert_calculus.accounting.budget import telescoping_spent  # noqa: E402
from witcert_calculus.ledger import RiskLedger  # noqa: E402

PROMPTS = ("The capital of France is", "def fibonacci(n):", "Water boils at a temperature of")


@pytest.mark.slow
def test_smollm2_zero_tier_a_violations() -> None:
    torch.set_num_threads(1)
    assert smollm2_gguf_path().is_file()
    model, tok = load_smollm2()
    assert model.config.num_hidden_layers == 30
    cells = 0
    b_cells = 0
    largest_tv = 0.0
    ledger = RiskLedger()
    for scheme in ("int8_token", "fp8_e4m3_scaled", "kivi2_g32", "dither_int8"):
        for prompt in PROMPTS:
            ids = tok(prompt, return_tensors="pt").input_ids
            rid = ledger.open_request(delta_req="1/100")
            with attach(model, scheme=scheme, request_id=rid, audit=True,
                        ledger=ledger) as probe:
                cache = probe.new_cache()
                with torch.no_grad():
                    out = model(ids, cache=cache, use_cache=True)
                    nxt = out.logits[:, -1:].argmax(-1)
                    for _ in range(4):
                        out = model(nxt, cache=cache, use_cache=True)
                        nxt = out.logits[:, -1:].argmax(-1)
                run = probe.result()
            tokens = int(ids.shape[1]) + 4
            verdict = run_gate(run, tokens=tokens)
            assert verdict.accepted, f"{scheme} {prompt!r}: {verdict}"
            assert run.layers == tuple(range(30))
            for layer in run.layers:
                assert run.records[layer].read.positions[-1] == tokens - 1  # decode steps were metered
                bound = run.reported(layer)
                tv = run.records[layer].audit.true_tv
                assert not np.any(tv > bound)
                cells += tv.size
                largest_tv = max(largest_tv, float(tv.max()))
                if scheme == "dither_int8":
                    assert not np.any(tv > run.reported_tier_b(layer))
                    b_cells += tv.size
            if scheme == "dither_int8":
                assert len(run.tier_b_events) == 5
                assert ledger.spent(rid) == telescoping_spent(5, "1/100")
            ledger.close_request(rid)
    assert cells >= 4 * 3 * 30 * 9 * 9
    assert b_cells >= 3 * 30 * 9 * 9
    assert largest_tv > 0.05  # the audit measured real, non-trivial errors
