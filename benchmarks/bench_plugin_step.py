"""The vLLM plugin's own time per decode step, without the model: what the always-on goal
has left to remove.

Run in the engine's environment (it drives the plugin's ``Monitor`` step by step, as
``tests/adapters/engine/monitor_checks.py`` does, on caches written by vLLM's own CPU kernel):
SmolLM2-135M's attention shapes (30 layers, 9 query heads, 3 kv heads, head dim 64, block
size 128), a bfloat16 cache (``--kv fp8``: vLLM's e4m3 cache), ``R`` requests each
prefilled to ``S`` tokens, then 12 decode steps; per step, everything the plugin does
(capture of every layer's keys, values and queries, the check of the stored bytes, the
step's layout and slot generations, the meter of every layer, head and row, the accounts),
the engine's own cache writes excluded. The median is printed next to the model's decode
step measured by ``bench_vllm_live.py``: their ratio is the plugin's share of the
end-to-end ratio. ``--profile`` also prints the plugin's most expensive functions;
``--sections`` the median time of each part of the plugin's step over the decode steps (the
captures, the check of the stored bytes, the step's layout, the meter, the accounts). The
median plugin time of a prefill chunk is printed too (``--profile-prefill``: its profile).

Run: ``.venv-vllm/bin/python benchmarks/bench_plugin_step.py [--requests 1 8 32]
[--tokens 144 1024] [--form cascade] [--kv auto|fp8] [--profile] [--profile-prefill]
[--sections]``
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import functools
import pstats
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from vllm import _custom_ops as ops

from witcert_adapters.vllm_plugin import engine
from witcert_adapters.vllm_plugin.config import PluginConfig
from witcert_adapters.vllm_plugin.engine import Monitor
from witcert_adapters.vllm_plugin.paged import cache_format

LAYERS, KVH, H, D, BS = 30, 3, 9, 64, 128


SECTIONS = {"captures (per layer)": (Monitor, ("wrote", "read")),
            "check of the stored bytes": (Monitor, ("_check_writes",)),
            "step layout, slot generations": (Monitor, ("_prepare",)),
            "witness writes": (Monitor, ("_put_witnesses",)),
            "meter": (engine, ("meter_layers",)),
            "summary": (engine, ("summarize",)),
            "accounts": (engine.Accounts, ("add_step",))}


def timed_sections() -> list[dict[str, float]]:
    """Wrap the step's parts with timers; the returned list gets one dict per step."""
    steps: list[dict[str, float]] = []
    begin = Monitor.begin

    def start(self: Monitor, *a: object) -> None:
        steps.append(collections.defaultdict(float))
        begin(self, *a)  # pyright: ignore[reportArgumentType]

    Monitor.begin = start  # type: ignore[method-assign]
    for label, (owner, names) in SECTIONS.items():
        for name in names:
            fn = getattr(owner, name)

            def timed(*a: object, _fn: object = fn, _label: str = label, **k: object) -> object:
                t0 = time.perf_counter()
                try:
                    return _fn(*a, **k)  # type: ignore[operator]
                finally:
                    if steps:
                        steps[-1][_label] += time.perf_counter() - t0

            setattr(owner, name, functools.wraps(fn)(timed))
    return steps


def measure(requests: int, tokens: int, form: str, kv: str, store: Path,
            profile: cProfile.Profile | None, *, profile_prefill: bool = False
            ) -> tuple[list[float], list[float]]:
    """Plugin seconds of each prefill chunk (up to 512 tokens of one request) and of each of
    the 12 decode steps after them (``profile``: of one decode step, or with
    ``profile_prefill`` of the prefill)."""
    per = (tokens + 16) // BS + 1
    blocks = requests * per + 1
    dtype = torch.bfloat16 if kv == "auto" else torch.uint8
    caches = [torch.zeros(blocks, KVH, BS, 2 * D, dtype=dtype) for _ in range(LAYERS)]
    gen = torch.Generator().manual_seed(0)
    mon = Monitor(PluginConfig(store=store, tau=0.1, form=form))
    mon.n_layers, mon.seats, mon.length = LAYERS, max(64, requests), tokens + 64
    mon.fmt, mon.kv_cache_dtype = cache_format(kv), kv
    mon.num_heads, mon.scale = H, D ** -0.5
    tables = [[r * per + b for b in range(per)] for r in range(requests)]

    def step(rows: list[tuple[int, list[int]]]) -> float:
        qsl, seq, slots = [0], [], []
        for r, pos in rows:
            qsl.append(qsl[-1] + len(pos))
            seq.append(pos[-1] + 1)
            slots += [tables[r][p // BS] * BS + p % BS for p in pos]
        ids = [f"r{r}-aaaaaaaa" for r, _ in rows]
        sched = SimpleNamespace(finished_req_ids=set(), total_num_scheduled_tokens=len(slots),
                                num_scheduled_tokens={i: len(p) for i, (_, p) in
                                                      zip(ids, rows, strict=True)})
        runner = SimpleNamespace(input_batch=SimpleNamespace(req_ids=ids),
                                 get_model=lambda: torch.nn.Module())
        md = SimpleNamespace(num_actual_tokens=len(slots), query_start_loc=torch.tensor(qsl),
                             seq_lens=torch.tensor(seq),
                             block_table=torch.tensor([tables[r] for r, _ in rows]),
                             slot_mapping=torch.tensor(slots, dtype=torch.int64))
        n = len(slots)
        keys = torch.randn(LAYERS, n, KVH, D, generator=gen).to(torch.bfloat16)
        values = torch.randn(LAYERS, n, KVH, D, generator=gen).to(torch.bfloat16)
        queries = torch.randn(LAYERS, n, H, D, generator=gen).to(torch.bfloat16)
        out = torch.empty(n, H, D, dtype=torch.bfloat16)
        engine = 0.0
        t0 = time.perf_counter()
        mon.begin(runner, sched)
        for layer, cache in enumerate(caches):
            kc, vc = cache.view(blocks, KVH, 2 * BS, D).chunk(2, dim=2)
            t1 = time.perf_counter()
            ops.cpu_attn_reshape_and_cache(keys[layer], values[layer], kc, vc,
                                           md.slot_mapping, "vec", kv_cache_dtype=kv)
            engine += time.perf_counter() - t1
            mon.wrote(layer, keys[layer], values[layer], cache, md.slot_mapping, 1.0, 1.0, "vec")
            mon.read(layer, queries[layer], md, out)
        mon.end(runner, sched)
        return time.perf_counter() - t0 - engine

    if profile is not None and profile_prefill:
        profile.enable()
    prefill = [step([(r, list(range(a, min(tokens, a + 512))))])
               for r in range(requests) for a in range(0, tokens, 512)]
    if profile is not None and profile_prefill:
        profile.disable()
        profile = None
    times = []
    for k in range(12):
        if profile is not None and k == 4:
            profile.enable()
        times.append(step([(r, [tokens + k]) for r in range(requests)]))
    if profile is not None:
        profile.disable()
    return prefill, times


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--requests", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--tokens", type=int, nargs="+", default=[144, 1024])
    p.add_argument("--form", default="cascade")
    p.add_argument("--kv", default="auto", choices=["auto", "fp8"],
                   help="the cache: the model's dtype (bfloat16) or fp8 (e4m3)")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--profile-prefill", action="store_true",
                   help="profile the prefill chunks instead of a decode step")
    p.add_argument("--sections", action="store_true",
                   help="print each part's median over the decode steps")
    args = p.parse_args()
    sections = timed_sections() if args.sections else None
    torch.set_num_threads(1)
    cache = "bfloat16" if args.kv == "auto" else "fp8 (e4m3)"
    print(f"plugin time per decode step ({cache} cache, form={args.form}), median of 12; "
          "per prefill chunk (up to 512 tokens of one request), median")
    print(f"{'requests':>8s} {'tokens':>6s} {'median ms':>9s} {'min ms':>7s} {'prefill ms':>10s}")
    with tempfile.TemporaryDirectory() as tmp:
        # warm-up: the first step loads (or builds) the compiled kernels
        measure(1, 16, args.form, args.kv, Path(tmp) / "warm.sqlite", None)
        if sections is not None:
            sections.clear()
        for tokens in args.tokens:
            for requests in args.requests:
                prof = cProfile.Profile() if args.profile or args.profile_prefill else None
                pre, t = measure(requests, tokens, args.form, args.kv, Path(tmp) / "v.sqlite",
                                 prof, profile_prefill=args.profile_prefill)
                print(f"{requests:8d} {tokens:6d} {1e3 * statistics.median(t):9.2f} "
                      f"{1e3 * min(t):7.2f} {1e3 * statistics.median(pre):10.2f}", flush=True)
                if sections is not None:
                    last = sections[-12:]  # the decode steps
                    for label in SECTIONS:
                        print(f"    {label:32s} "
                              f"{1e3 * statistics.median(x[label] for x in last):7.3f} ms")
                    sections.clear()
                if prof is not None:
                    pstats.Stats(prof).sort_stats("cumtime").print_stats("witcert", 25)


if __name__ == "__main__":
    main()
