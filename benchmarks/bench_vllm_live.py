"""Cost of the live vLLM plugin: time per output token with the plugin on vs off.

Each configuration is one engine process (the switch is read once per process) of
vLLM's CPU build serving SmolLM2-135M-Instruct in bfloat16 and with an fp8 KV cache (where
the CPU has AVX-512 or AMX, which vLLM's CPU build needs for it). The plugin meters every
layer and head of every step (full coverage, no audit), in each of its two forms: the
meter ``min(e-form, two-sided)``, which recomputes the compressed attention from the stored
keys, and the cheap ``tanh(max c)``, which needs neither. Each engine first generates once
to warm up, then 128 greedy tokens for 1 and for 8 concurrent sequences, ``--repeat`` times;
the minimum wall time per output token is compared, on against off, in the same run.

Run: ``.venv/bin/python benchmarks/bench_vllm_live.py [--repeat 3] [--tokens 128]``
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from witcert_adapters.demo.models import smollm2_engine_dir
from witcert_adapters.vllm_plugin.config import PluginConfig
from witcert_adapters.vllm_plugin.launch import fp8_supported, run_offline

PROMPTS = [
    "The capital of France is",
    "Write a short poem about the sea.",
    "Explain why the sky is blue.",
    "List three prime numbers:",
    "Once upon a time, in a small village,",
    "The most important rule of cooking is",
    "def fibonacci(n):",
    "Translate 'good morning' into Spanish:",
]


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--tokens", type=int, default=128)
    args = p.parse_args()
    model = smollm2_engine_dir()
    dtypes = ["auto", "fp8"] if fp8_supported() else ["auto"]
    print(f"time per output token, min of {args.repeat}, {args.tokens} tokens per sequence")
    print(f"{'kv cache':10s} {'seqs':>4s} {'off ms':>9s} {'meter ms':>9s} {'tanh ms':>9s} "
          f"{'meter/off':>9s} {'tanh/off':>9s}")
    with tempfile.TemporaryDirectory() as tmp:
        for kv in dtypes:
            per: dict[str, dict[str, float]] = {}
            for mode in ("off", "meter", "tanh"):
                config = (None if mode == "off" else
                          PluginConfig(store=Path(tmp) / f"{kv}-{mode}.sqlite", form=mode))
                rec = run_offline(config, model=model, kv=kv, prompts=PROMPTS,
                                  max_tokens=args.tokens, batch_sizes=(1, 8),
                                  repeat=args.repeat)
                per[mode] = {b: min(t) / (int(b) * args.tokens)
                             for b, t in rec["generate_s"].items()}
            for b in ("1", "8"):
                off, meter, tanh = per["off"][b], per["meter"][b], per["tanh"][b]
                print(f"{'bf16' if kv == 'auto' else kv:10s} {b:>4s} {1e3 * off:9.2f} "
                      f"{1e3 * meter:9.2f} {1e3 * tanh:9.2f} {meter / off:9.3f} "
                      f"{tanh / off:9.3f}")


if __name__ == "__main__":
    main()
