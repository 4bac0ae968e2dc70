"""Cost of the live vLLM plugin: time per output token with the plugin on vs off.

Each (cache, mode, prompt length) is one engine process (the switch is read once per
process) of vLLM's CPU build serving SmolLM2-135M-Instruct in bfloat16, with its
model-dtype cache and, where the CPU has AVX-512 or AMX (which vLLM's CPU build needs for
it), an fp8 cache. The plugin meters every layer, head and row of every step (full
coverage, no audit) in one of its forms:

- ``cascade``: ``tanh(max c)`` where it is already at most tau, the meter elsewhere (the
  keys are read only where a cell needs the meter);
- ``tanh``: ``tanh(max c)`` everywhere (no keys, no attention weights);
- ``meter``: ``min(e-form, two-sided)`` everywhere (recomputes the compressed attention from
  the stored keys).

Each mode runs side by side with the plugin off: two engine processes at once, taking turns
(``offline.py --turns``), so that both see the same machine; only one runs at a time. For
each number of concurrent sequences, each engine is stepped by hand
(``offline.py --step-prompt-tokens``): a warm-up run, then ``--repeat`` runs of ``b``
sequences of a prompt of the given length (distinct token ids) and ``--tokens`` greedy
tokens each, its runs alternating with the other engine's. Printed per row: the minimum over the repeats of the time per output token
(wall time of the run over ``b * tokens``), the median and 99th percentile of the decode
steps' latency (pooled over the repeats), each as a ratio to the plugin off measured in the
same run, and the *floor*: ``1 +`` the meter's arithmetic over the step's, from the shapes
(:func:`floor`), i.e. what the ratio would be if the meter cost only its floating-point
operations, at the engine's rate. ``--host busy`` (or ``both``) runs the table with one
CPU-bound process beside the engine (a busy host). Rows whose prompt tokens in flight
(``sequences * prompt``) exceed ``--max-batch-tokens`` are listed as skipped.

Run: ``.venv/bin/python benchmarks/bench_vllm_live.py [--repeat 3] [--tokens 32]
[--seqs 1 8 32] [--prompts 128 1024 4096] [--modes cascade tanh meter] [--kv auto fp8]
[--host idle|busy|both]``
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

from witcert_adapters.demo.models import smollm2_engine_dir
from witcert_adapters.vllm_plugin.config import PluginConfig
from witcert_adapters.vllm_plugin.launch import fp8_supported, run_offline

MODES = ("cascade", "tanh", "meter")


def floor(config: dict[str, Any], *, mode: str, kv: str, context: int) -> float:
    """``1 + meter / step`` floating-point operations of one decode row at ``context``.

    The step: the model's matrix products (``2 * params`` of the projections and the
    head) and attention (``4 d`` per layer, head and visible token). The meter per layer,
    head and visible token: ``tanh(max c)`` needs the format bound (``2 d``: ``|q|`` against
    the witness) and a maximum; the meter recomputes the logits (``2 d``), the softmax and
    its forms (about 12 more) on top of the bound; the cascade on a model-dtype cache
    needs nothing per token (every bound is 0), on fp8 as much as the meter.
    """
    layers, heads = int(config["num_hidden_layers"]), int(config["num_attention_heads"])
    hidden, inter = int(config["hidden_size"]), int(config["intermediate_size"])
    kvh = int(config.get("num_key_value_heads", heads))
    d = hidden // heads
    linear = layers * (hidden * (heads + 2 * kvh) * d + heads * d * hidden +
                       3 * hidden * inter) + hidden * int(config["vocab_size"])
    step = 2 * linear + layers * heads * context * 4 * d
    per_token = {"off": 0, "tanh": 2 * d + 1, "meter": 4 * d + 13,
                 "cascade": 0 if kv == "auto" else 4 * d + 14}[mode]
    return 1.0 + layers * heads * context * per_token / step


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def _spin(stop: Any) -> None:
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x = (x * 1103515245 + 12345) & 0x7FFFFFFF


def measure(args: argparse.Namespace, tmp: Path, *, kv: str, mode: str, prompt: int,
            seqs: list[int]) -> dict[str, dict[str, dict[str, float]]]:
    """The plugin off and in ``mode``, two engine processes taking turns: per engine and
    sequence count, min time per token, p50, p99 and mean decode step."""
    longest = prompt + args.tokens + 16
    board = tmp / f"turns-{kv}-{mode}-{prompt}"
    board.write_text("off")
    records: dict[str, Any] = {}

    def run(name: str) -> None:
        config = None if name == "off" else \
            PluginConfig(store=tmp / f"{kv}-{mode}-{prompt}.sqlite", form=mode)
        try:
            records[name] = run_offline(
                config, model=args.model, kv=kv, prompts=["x"], max_tokens=args.tokens,
                batch_sizes=seqs, repeat=args.repeat, kv_space_gib=args.kv_space,
                timeout=7200.0,
                extra=["--step-prompt-tokens", str(prompt), "--max-model-len", str(longest),
                       "--max-num-seqs", str(max(seqs)), "--max-num-batched-tokens",
                       str(max(2048, longest)), "--turns", str(board), "--turn", name,
                       "--next", mode if name == "off" else "off"])
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            records[name] = exc
            board.write_text("stopped")

    threads = [threading.Thread(target=run, args=(name,)) for name in ("off", mode)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out: dict[str, dict[str, dict[str, float]]] = {}
    for name, rec in records.items():
        if isinstance(rec, Exception):
            raise rec
        out[name] = {}
        for b, runs in rec["steps"].items():
            decode = [x for r in runs for x in r["decode_step_s"]]
            out[name][b] = {"per_token": min(r["wall_s"] for r in runs) / (int(b) * args.tokens),
                            "p50": _pct(decode, 0.5), "p99": _pct(decode, 0.99),
                            "mean": statistics.fmean(decode)}
    return out


def table(args: argparse.Namespace, tmp: Path, config: dict[str, Any], label: str) -> None:
    """Measure and print one table (every cache, prompt length, mode and sequence count)."""
    print(f"\n{label}: time per output token (min of {args.repeat}), decode-step p50/p99 "
          f"(pooled), {args.tokens} tokens per sequence")
    print(f"{'cache':6s} {'prompt':>6s} {'seqs':>4s} {'mode':8s} {'ms/token':>9s} "
          f"{'p50 ms':>8s} {'p99 ms':>8s} {'ratio':>6s} {'p50 r':>6s} {'p99 r':>6s} "
          f"{'floor':>6s}")
    for kv in args.kv:
        for prompt in args.prompts:
            seqs = [b for b in args.seqs if b * prompt <= args.max_batch_tokens]
            for b in args.seqs:
                if b not in seqs:
                    print(f"{kv:6s} {prompt:6d} {b:4d} skipped: {b * prompt} prompt tokens "
                          f"in flight > --max-batch-tokens {args.max_batch_tokens}")
            if not seqs:
                continue
            for mode in args.modes:
                pair = measure(args, tmp, kv=kv, mode=mode, prompt=prompt, seqs=seqs)
                for b, name in ((str(x), name) for x in seqs for name in ("off", mode)):
                    m, o = pair[name][b], pair["off"][b]
                    print(f"{'bf16' if kv == 'auto' else kv:6s} {prompt:6d} {b:>4s} {name:8s} "
                          f"{1e3 * m['per_token']:9.2f} {1e3 * m['p50']:8.2f} "
                          f"{1e3 * m['p99']:8.2f} {m['per_token'] / o['per_token']:6.3f} "
                          f"{m['p50'] / o['p50']:6.3f} {m['p99'] / o['p99']:6.3f} "
                          f"{floor(config, mode=name, kv=kv, context=prompt):6.3f}",
                          flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--seqs", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--prompts", type=int, nargs="+", default=[128, 1024, 4096])
    p.add_argument("--modes", nargs="+", default=["cascade", "tanh", "meter"], choices=MODES,
                   help="the plugin's forms, each measured beside the plugin off")
    p.add_argument("--kv", nargs="+", default=None, help="auto (bfloat16) and/or fp8")
    p.add_argument("--max-batch-tokens", type=int, default=32768)
    p.add_argument("--kv-space", type=int, default=3,
                   help="each engine's KV cache space, GiB")
    p.add_argument("--host", choices=["idle", "busy", "both"], default="idle",
                   help="busy: the table beside one CPU-bound process; both: each in turn")
    args = p.parse_args()
    args.model = smollm2_engine_dir()
    if args.kv is None:
        args.kv = ["auto", "fp8"] if fp8_supported() else ["auto"]
    config = json.loads((Path(args.model) / "config.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        if args.host != "busy":
            table(args, Path(tmp), config, "idle host")
        if args.host != "idle":
            stop = multiprocessing.Event()
            spinner = multiprocessing.Process(target=_spin, args=(stop,), daemon=True)
            spinner.start()
            try:
                table(args, Path(tmp), config, "busy host (one CPU-bound process beside)")
            finally:
                stop.set()
                spinner.join(timeout=10)


if __name__ == "__main__":
    main()
