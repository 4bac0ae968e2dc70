"""Throughput of the risk ledger.

Batch admission (entry-level certification of a vector of per-entry bounds,
through ``RiskLedger.admit_entries`` and through the bare ``certify_entries``)
is timed side by side with a plain numpy pass over the same array
(``cumsum`` + comparison), for 10^6 and 10^7 entries, and reported as a ratio
of throughputs (goal: at least 1/3). Scalar admissions per second are timed
for an in-memory ledger and for a journaled one (each journaled admission is
an fsynced SQLite commit).

Run: ``.venv/bin/python benchmarks/bench_ledger.py [--repeats N] [--quick]``
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import numpy as np

from witcert_calculus.accounting.entries import certify_entries
from witcert_calculus.contracts import _reading  # pyright: ignore[reportPrivateUsage]
from witcert_calculus.ledger import RiskLedger
from witcert_calculus.metrics import AtConsume, AttentionTV
from witcert_calculus.tiers import _proof  # pyright: ignore[reportPrivateUsage]

TV = AttentionTV[AtConsume]
# A meter's proof, as the meter issues it (the benchmark times the ledger, not a meter).
PROOF = _proof("WitCert.Meters.tv_eform_sound")


def _best(fn: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def batch(n: int, repeats: int) -> None:
    rng = np.random.default_rng(0)
    b = rng.exponential(1e-4, n)
    threshold = 3e-4
    led = RiskLedger()
    r = led.open_request(delta_req="1/100")

    def numpy_pass() -> object:
        return np.cumsum(b) <= threshold

    def ledger_pass() -> object:
        return led.admit_entries(r, b, threshold=threshold, metric=TV, evidence=PROOF)

    def core_pass() -> object:
        return certify_entries(b, threshold=threshold)

    # interleave the three so that load on the machine hits them alike
    t_np = t_led = t_core = float("inf")
    for _ in range(repeats):
        t_np = min(t_np, _best(numpy_pass, 1))
        t_led = min(t_led, _best(ledger_pass, 1))
        t_core = min(t_core, _best(core_pass, 1))
    print(f"n={n:>9,d}  numpy cumsum+compare {n / t_np / 1e6:8.1f} M entries/s | "
          f"ledger.admit_entries {n / t_led / 1e6:8.1f} M entries/s "
          f"(ratio {t_np / t_led:.2f}) | certify_entries {n / t_core / 1e6:8.1f} M entries/s "
          f"(ratio {t_np / t_core:.2f})")


def scalar(n: int, n_journal: int) -> None:
    det = _reading(TV, 0.01, evidence=PROOF)
    prob = _reading(TV, 0.01, evidence=PROOF, delta=Fraction(1, 10**12))
    led = RiskLedger()
    r = led.open_request(delta_req="1/100")
    t0 = time.perf_counter()
    for i in range(n):
        led.admit(r, prob if i & 1 else det)
    dt = time.perf_counter() - t0
    print(f"scalar admissions (in memory): {n / dt:,.0f} /s over {n:,d}")
    with tempfile.TemporaryDirectory() as d:
        jl = RiskLedger(journal=Path(d) / "bench.sqlite")
        r = jl.open_request(delta_req="1/100")
        t0 = time.perf_counter()
        for i in range(n_journal):
            jl.admit(r, prob if i & 1 else det)
        dt = time.perf_counter() - t0
        jl.close()
    print(f"scalar admissions (journaled, fsync per commit): {n_journal / dt:,.0f} /s "
          f"over {n_journal:,d}")


def main() -> None:
    ap = argparse.ArgumentParser(description="Throughput of the risk ledger.")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="10^5 and 10^6 entries only")
    args = ap.parse_args()
    for n in ((10**5, 10**6) if args.quick else (10**6, 10**7)):
        batch(n, args.repeats)
    scalar(100_000 if not args.quick else 20_000, 500 if not args.quick else 100)


if __name__ == "__main__":
    main()
