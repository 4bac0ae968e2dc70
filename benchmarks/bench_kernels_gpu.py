"""The meter's cost inside the decode kernel: fused attention + Tier-A meter vs attention alone.

Both are the same Triton kernel (:mod:`witcert_kernels.triton_decode`) over the same paged
cache (page size 16, shuffled pages), one with the meter compiled in and one without; they run
alternately, side by side, and the median time per call of each and their ratio are printed
for each context length (these machines are noisy: compare the ratios of one run). The
dithered store (:func:`witcert_kernels.triton_dither.dither_store`) and the witness write
(:func:`witcert_kernels.triton_witness.witness_write`) are timed per written token next to a
plain copy of the same keys into the pool.

On a GPU: ``python benchmarks/bench_kernels_gpu.py [--contexts 4096 32768] [--batches 1 16]
[--iters 20]`` (fp16 keys and values; the meter reads float32 witnesses).
Without one, ``--dry`` runs the same code at toy sizes in Triton's interpreter (CPU tensors,
``TRITON_INTERPRET=1``) to check the script; its times say nothing about a GPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

DRY = "--dry" in sys.argv
if DRY and not os.path.exists("/dev/nvidia0"):
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import torch  # noqa: E402

from witcert_calculus.witness import RopeLayout  # noqa: E402
from witcert_kernels.dither import exact_channels  # noqa: E402
from witcert_kernels.triton_decode import decode_attention, fused_decode  # noqa: E402
from witcert_kernels.triton_dither import DitherPool, dither_store  # noqa: E402
from witcert_kernels.triton_witness import witness_write  # noqa: E402

LAYOUT = RopeLayout.HALF_SPLIT


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def _side_by_side(fns: dict[str, Callable[[], Any]], iters: int, dev: torch.device
                  ) -> dict[str, float]:
    """Median seconds per call of each function, run alternately."""
    for fn in fns.values():  # compile and warm up
        fn()
    _sync(dev)
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(iters):
        for name, fn in fns.items():
            _sync(dev)
            t0 = time.perf_counter()
            fn()
            _sync(dev)
            times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def bench_decode(ctx: int, *, batch: int, heads: int, kv_heads: int, d: int, bands: int,
                 splits: int, iters: int, dev: torch.device) -> dict[str, float]:
    page = 16
    g = torch.Generator(device="cpu").manual_seed(ctx)
    pages_per = -(-ctx // page)
    total = batch * pages_per
    indices = torch.randperm(total, generator=g).to(torch.int32).to(dev)
    indptr = (torch.arange(batch + 1, dtype=torch.int32) * pages_per).to(dev)
    lens = torch.full((batch,), ctx, dtype=torch.int32, device=dev)
    slots = total * page
    k = torch.randn(slots, kv_heads, d, generator=g).to(dev)
    k_hat = (k + 0.01 * torch.randn(slots, kv_heads, d, generator=g).to(dev)).half()
    v = torch.randn(slots, kv_heads, d, generator=g).to(dev).half()
    w = witness_write(k, k_hat.float(), bands=bands, layout=LAYOUT)
    q = torch.randn(batch, heads, d, generator=g).to(dev).half()
    common = {"kv_indptr": indptr, "kv_indices": indices, "seq_lens": lens, "page_size": page,
              "scale": d ** -0.5, "splits": splits}
    return _side_by_side({
        "attention": lambda: decode_attention(q, k_hat, v, **common),
        "attention+meter": lambda: fused_decode(q, k_hat, v, w, layout=LAYOUT, max_tokens=ctx,
                                               **common),
    }, iters, dev)


def bench_store(tokens: int, *, kv_heads: int, d: int, bands: int, iters: int,
                dev: torch.device) -> dict[str, float]:
    g = torch.Generator(device="cpu").manual_seed(tokens)
    x = torch.randn(tokens, kv_heads, d, generator=g).to(dev)
    pairs = torch.arange(4).repeat(kv_heads, 1)
    exact = exact_channels(pairs, head_dim=d, layout=LAYOUT).to(dev)
    pool = DitherPool.empty(slots=tokens, kv_heads=kv_heads, head_dim=d, block_size=32,
                            exact=exact, seed=1, layer=0, device=dev)
    slot = torch.randperm(tokens, generator=g).to(dev)
    plain = torch.empty((tokens, kv_heads, d), dtype=torch.float16, device=dev)
    return _side_by_side({
        "copy fp16": lambda: plain.index_copy_(0, slot, x.half()),
        "dither store": lambda: dither_store(pool, x, slot, check=False),
        "witness write": lambda: witness_write(x, x.half().float(), bands=bands, layout=LAYOUT),
    }, iters, dev)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", type=int, nargs="+", default=[4096, 32768])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--dry", action="store_true",
                    help="toy sizes in Triton's interpreter on CPU (checks the script only)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    dev = torch.device("cuda" if torch.cuda.is_available() and not args.dry else "cpu")
    if dev.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        print("bench-kernels: no GPU: run with --dry (Triton's interpreter) or on a GPU")
        return 2
    if args.dry:
        shape = {"heads": 2, "kv_heads": 1, "d": 32, "bands": 4, "splits": 2}
        contexts, batches, iters, store_tokens = [16, 48], [1, 2], 1, 32
    else:
        shape = {"heads": 32, "kv_heads": 8, "d": 128, "bands": 8, "splits": 8}
        contexts, batches, iters = args.contexts, args.batches, args.iters
        store_tokens = 16384
    print(f"bench-kernels: device {dev}{' (dry run: interpreter)' if args.dry else ''}; "
          f"shape {shape}")
    print("context  batch  attention (ms)  attention+meter (ms)  ratio")
    for ctx in contexts:
        for batch in batches:
            t = bench_decode(ctx, batch=batch, iters=iters, dev=dev, **shape)
            a, m = t["attention"], t["attention+meter"]
            print(f"{ctx:7d}  {batch:5d}  {a * 1e3:14.3f}  {m * 1e3:20.3f}  {m / a:5.2f}")
    s = bench_store(store_tokens, kv_heads=shape["kv_heads"], d=shape["d"],
                    bands=shape["bands"], iters=iters, dev=dev)
    base = s["copy fp16"]
    print(f"store of {store_tokens} tokens: " + ", ".join(
        f"{k} {v * 1e3:.3f} ms ({v / base:.2f}x copy)" for k, v in s.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
