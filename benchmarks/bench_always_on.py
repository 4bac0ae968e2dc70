"""Always-on cost of full coverage: one SmolLM2 decode step metered vs the same step unmetered.

Metered: the Hugging Face probe (:class:`witcert_adapters.hf.Probe`) with the certified
operating point ``dither_int8_g32_m4`` and a request ledger: every layer, every head, Tier A
and Tier B (one probabilistic event per forward, admitted into the ledger), no audit
against exact attention. Unmetered: the same compressed store (the scheme applied on write)
in a plain ``DynamicCache`` on a second copy of the model, no hooks. Both in float32 with
eager attention (the meter reads the attention probabilities), one thread.

For each context length the two caches are prefilled with the same tokens (the metered
cache compresses and records witnesses; its prefill is not metered), then ``--steps`` decode
steps run
alternately, metered and unmetered, side by side; the median time per step of each and
their ratio are printed (this machine is noisy: compare ratios from one run, not times
across runs). ``--profile`` also prints the metered step's most expensive operators.

Run: ``.venv/bin/python benchmarks/bench_always_on.py [--contexts 128 1024 4096] [--steps 9]``
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from typing import Any

import torch
from transformers import DynamicCache

from witcert_adapters.demo.models import load_smollm2
from witcert_adapters.hf import Probe
from witcert_adapters.schemes import EntryRole, Scheme, WriteContext, get_scheme
from witcert_calculus import RiskLedger

SCHEME = "dither_int8_g32_m4"


class CompressedCache(DynamicCache):
    """The unmetered store: the scheme's reconstruction on write, nothing recorded."""

    def __init__(self, *, config: Any, scheme: Scheme) -> None:
        super().__init__(config=config)
        self.scheme = scheme

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        start = self.get_seq_length(layer_idx) if layer_idx < len(self.layers) else 0
        k = self.scheme(key_states, WriteContext(0, layer_idx, start, EntryRole.KEY))
        v = self.scheme(value_states, WriteContext(0, layer_idx, start, EntryRole.VALUE))
        return super().update(k, v, layer_idx, *args, **kwargs)  # pyright: ignore


def _step(model: Any, token: torch.Tensor, cache: Any) -> float:
    t0 = time.perf_counter()
    with torch.no_grad():
        model(token, cache=cache, use_cache=True)
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--contexts", type=int, nargs="*", default=[128, 1024, 4096])
    p.add_argument("--steps", type=int, default=9, help="decode steps per context (each side)")
    p.add_argument("--profile", action="store_true", help="profile one metered step")
    args = p.parse_args()
    torch.set_num_threads(1)
    metered_model, _ = load_smollm2()
    plain_model = copy.deepcopy(metered_model)
    scheme = get_scheme(SCHEME)
    vocab = int(metered_model.config.vocab_size)
    print(f"one decode step of SmolLM2-135M-Instruct (float32, eager, 1 thread); scheme {SCHEME}; "
          f"metered: every layer and head, Tier A + Tier B, no audit; median of {args.steps}")
    print(f"{'context':>8s} {'off ms':>9s} {'on ms':>9s} {'on/off':>8s}")
    for n in args.contexts:
        ids = torch.randint(0, vocab, (1, n + args.steps), generator=torch.Generator().manual_seed(n))
        ledger = RiskLedger()
        rid = ledger.open_request(delta_req="1/100")
        # The prefill only fills the stores: the metered cache compresses and records its
        # witnesses (write path) with the read-side hooks detached; the decode steps are
        # metered in full by a probe bound to that cache.
        writer = Probe(metered_model, scheme=SCHEME, request_id=rid, ledger=ledger)
        cache_on = writer.new_cache()
        writer.close()
        cache_off = CompressedCache(config=plain_model.config, scheme=scheme)
        with torch.no_grad():
            plain_model(ids[:, :n], cache=cache_off, use_cache=True)
            metered_model(ids[:, :n], cache=cache_on, use_cache=True)
        probe = Probe(metered_model, scheme=SCHEME, request_id=rid, ledger=ledger)
        probe.bind(cache_on)
        try:
            on: list[float] = []
            off: list[float] = []
            for i in range(args.steps):
                tok = ids[:, n + i:n + i + 1]
                if i % 2:  # alternate which side goes first
                    off.append(_step(plain_model, tok, cache_off))
                    on.append(_step(metered_model, tok, cache_on))
                else:
                    on.append(_step(metered_model, tok, cache_on))
                    off.append(_step(plain_model, tok, cache_off))
            if args.profile:
                from torch.profiler import ProfilerActivity, profile

                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    _step(metered_model, ids[:, -1:], cache_on)
                print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
            events = len(probe.result().tier_b_events)
        finally:
            probe.close()
        m_on, m_off = statistics.median(on), statistics.median(off)
        print(f"{n:8d} {1e3 * m_off:9.2f} {1e3 * m_on:9.2f} {m_on / m_off:8.3f}   "
              f"({events} Tier-B events admitted)")


if __name__ == "__main__":
    main()
