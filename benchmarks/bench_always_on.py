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
alternately, metered and unmetered, side by side. Printed per context: the median, 99th
percentile and mean time per step of each side, their ratios (this machine is noisy: compare
ratios from one run, not times across runs), and the *floor*: ``1 +`` the meter's arithmetic
over the step's, from the shapes (:func:`floor`), i.e. what the ratio would be if the meter
cost only its floating-point operations, at the model's rate. ``--profile`` also prints the
metered step's most expensive operators.

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

from witcert_adapters.architectures import spec_for
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


def floor(config: Any, *, context: int, bands: int, blocks: int) -> float:
    """``1 +`` the meter's floating-point operations over the decode step's, at ``context``.

    The step: the model's matrix products (``2 * params`` of the projections and the head)
    and eager attention (``4 d`` per layer, head and visible token: the logits and the
    weighted values). The meter per layer, head and visible token, its weights read from the
    attention the model computed: Tier A's logit bound (``2 * bands`` products and sums), its
    forms (``log A``, ``log A-``, the retention form: about 14 operations, counting an
    exponential as one) and the output bound (2); Tier B's bound (``4 * blocks`` for the
    variance and grid-mean sums, about 6 for the radius and cast terms) and its forms (14).
    """
    layers, heads = int(config.num_hidden_layers), int(config.num_attention_heads)
    hidden, inter = int(config.hidden_size), int(config.intermediate_size)
    kvh = int(getattr(config, "num_key_value_heads", heads) or heads)
    d = hidden // heads
    linear = layers * (hidden * (heads + 2 * kvh) * d + heads * d * hidden +
                       3 * hidden * inter) + hidden * int(config.vocab_size)
    step = 2 * linear + layers * heads * context * 4 * d
    per_token = (2 * bands + 14 + 2) + (4 * blocks + 6 + 14)
    return 1.0 + layers * heads * context * per_token / step


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


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
    print(f"{'context':>8s} {'off p50':>8s} {'on p50':>8s} {'off p99':>8s} {'on p99':>8s} "
          f"{'off mean':>8s} {'on mean':>8s} {'p50 r':>6s} {'p99 r':>6s} {'mean r':>6s} "
          f"{'floor':>6s}")
    head = metered_model.config.hidden_size // metered_model.config.num_attention_heads
    bands = max(p.bands for p in spec_for(metered_model.config.model_type).parts)
    blocks = head // int(scheme.group or head)
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
        row = [f(xs) for f in (statistics.median, lambda x: _pct(x, 0.99), statistics.fmean)
               for xs in (off, on)]
        ratios = [row[k + 1] / row[k] for k in (0, 2, 4)]
        fl = floor(metered_model.config, context=n, bands=bands, blocks=blocks)
        print(f"{n:8d} " + " ".join(f"{1e3 * x:8.2f}" for x in row) + " " +
              " ".join(f"{r:6.3f}" for r in ratios) + f" {fl:6.3f}   "
              f"({events} Tier-B events admitted)", flush=True)


if __name__ == "__main__":
    main()
