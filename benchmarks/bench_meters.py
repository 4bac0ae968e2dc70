#!/usr/bin/env python3
"""Cost of the WitCert meters as a ratio to a numpy softmax attention over the same S, d.

For each S in {1k, 8k, 32k} (one head, one decode step, head dim d, float64,
one thread), times side by side in one run:

- ``attention``: ``softmax(scale * K q) @ V``, the thing being observed;
- ``tier_a_read``: the read-time Tier-A meter, ``logit_bound`` from stored band
  witnesses plus ``tv_meter`` (all input validation included);
- ``tv_meter``: the TV forms alone, given ``c``;
- ``tier_b_read``: the Tier-B certificate ingredients, variance proxy + radius + e-form;
- ``witness_all_S``: write-time ``band_witness`` of all S residuals (a prefill);
- ``witness_1_tok``: the witness of the one token a decode step writes.

Prints the median time of each and its ratio to ``attention``.

Usage::

    python benchmarks/bench_meters.py [--repeats 15] [--head-dim 128] [--bands 8]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402

import numpy as np  # noqa: E402

from witcert_calculus.meters.dither import DitherKey, byte_account, dither_quantize, \
    dither_variance_proxy, subgaussian_radius  # noqa: E402
from witcert_calculus.meters.tv_forms import tv_eform, tv_meter  # noqa: E402
from witcert_calculus.meters.witness import RopeLayout, band_witness, logit_bound  # noqa: E402

SIZES = (1024, 8192, 32768)


def _median_time(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench(s: int, *, d: int, bands: int, repeats: int, seed: int = 0) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    k = rng.normal(size=(s, d))
    v = rng.normal(size=(s, d))
    q = rng.normal(size=d)
    scale = d ** -0.5
    layout = RopeLayout.HALF_SPLIT
    stored = dither_quantize(k, key=DitherKey(0, 0, 0), tokens=np.arange(s), block_size=32,
                             layout=layout)
    residual = k - k.round(2)
    witness = band_witness(residual, bands=bands, layout=layout)

    def attention() -> object:
        z = scale * (k @ q)
        p = np.exp(z - z.max())
        p /= p.sum()
        return p @ v

    z = scale * (k @ q)
    p = np.exp(z - z.max())
    p /= p.sum()

    def tier_a() -> object:
        c = logit_bound(q, witness, layout=layout, scale=scale)
        return tv_meter(p, c)

    c_fixed = logit_bound(q, witness, layout=layout, scale=scale)

    def meter_only() -> object:
        return tv_meter(p, c_fixed)

    def tier_b() -> object:
        u = subgaussian_radius(dither_variance_proxy(q, stored, scale=scale), delta_loc=1e-9)
        return tv_eform(p, u)

    def witness_write() -> object:
        return band_witness(residual, bands=bands, layout=layout)

    def witness_step() -> object:
        return band_witness(residual[-1:], bands=bands, layout=layout)

    return {name: _median_time(fn, repeats) for name, fn in (
        ("attention", attention), ("tier_a_read", tier_a), ("tv_meter", meter_only),
        ("tier_b_read", tier_b), ("witness_all_S", witness_write),
        ("witness_1_tok", witness_step))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--bands", type=int, default=8)
    parser.add_argument("--sizes", type=int, nargs="*", default=list(SIZES))
    args = parser.parse_args(argv)
    print(f"bench_meters: numpy {np.__version__}, d={args.head_dim}, B={args.bands}, "
          f"float64, 1 thread, median of {args.repeats}")
    print(f"{'S':>6}  {'what':<14} {'median_ms':>10}  {'ratio_to_attention':>18}")
    for s in args.sizes:
        res = bench(s, d=args.head_dim, bands=args.bands, repeats=args.repeats)
        base = res["attention"]
        for name, t in res.items():
            print(f"{s:>6}  {name:<14} {t * 1e3:>10.3f}  {t / base:>18.2f}")
    for n_out in (0, 2):
        acc = byte_account(args.head_dim, block_size=32, outlier_pairs=n_out, tokens=max(args.sizes))
        print(f"Tier-B store, block 32, {n_out} outlier pairs: {acc.total:.3f} bytes/token/head "
              f"(payload {acc.payload:g} + scales {acc.scales:g} + outliers {acc.outliers:g} "
              f"+ indices {acc.indices:.4f}) vs fp16 {acc.fp16:g}: ratio {acc.ratio:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
