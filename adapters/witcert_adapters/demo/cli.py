"""The demo's command line: ``python -m witcert_adapters.demo [--threshold TAU] [--verbose]
[--repair | --eviction | --depth] --out DIR``.

Main declarations
-----------------
- :func:`main`.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from witcert_adapters.demo.run import run_demo
from witcert_adapters.demo.settings import BANDS, DEMO_SCHEMES, THRESHOLD

__all__ = ["main"]

DESCRIPTION = ("The README demo: live WitCert meters on SmolLM2-135M-Instruct under several KV "
               "schemes.")


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line, run the demo, return the exit status.

    Args:
        argv: the arguments (default: ``sys.argv[1:]``).

    Returns:
        0 after a complete run.

    Example:
        >>> # main(["--out", "out/demo", "--schemes", "int8_token"])
    """
    parser = argparse.ArgumentParser(prog="python -m witcert_adapters.demo",
                                     description=DESCRIPTION)
    parser.add_argument("--out", type=Path, default=Path("out/demo"),
                        help="folder for report.txt, report.json and coverage.png")
    parser.add_argument("--schemes", nargs="*", default=list(DEMO_SCHEMES),
                        help="registered scheme names (default: %(default)s)")
    parser.add_argument("--threshold", type=float, default=THRESHOLD,
                        help="coverage threshold tau in (0, 1) (default: %(default)s)")
    parser.add_argument("--bands", type=int, default=BANDS,
                        help="witness bands per key (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--verbose", action="store_true",
                        help="also print each request's block (per-layer readings, ledger, gate, "
                             "page-in), which report.txt always holds")
    parser.add_argument("--repair", action="store_true",
                        help="instead, measure the repairing gate (page-in from an exact backing "
                             "store) and write repair.json")
    parser.add_argument("--eviction", action="store_true",
                        help="instead, meter token eviction under kvpress presses (coverage, "
                             "audited truth, quality raw and gated) and write eviction.json and "
                             "eviction.txt (tau defaults to 0.1 here)")
    parser.add_argument("--depth", action="store_true",
                        help="instead, carry the per-layer memory bounds through depth to the "
                             "next token (the certified inter-layer bound against audited "
                             "truth per depth window) and run the shadow audit of end-to-end "
                             "divergence with its anytime-valid rate bound; writes depth.json "
                             "and depth.txt")
    args = parser.parse_args(argv)
    if args.depth:
        from witcert_adapters.demo.depth import run_depth

        run_depth(args.out, threads=args.threads)
        print((args.out / "depth.txt").read_text(), end="")
        return 0
    if args.eviction:
        from witcert_adapters.demo.eviction import run_eviction

        tau = 0.1 if args.threshold == THRESHOLD else args.threshold
        report = run_eviction(args.out, threshold=tau, threads=args.threads)
        print((args.out / "eviction.txt").read_text(), end="")
        del report
        return 0
    if args.repair:
        from witcert_adapters.demo.repair import run_repair

        run_repair(args.out, threshold=args.threshold, threads=args.threads)
        return 0
    run_demo(args.out, schemes=tuple(args.schemes), threads=args.threads,
             threshold=args.threshold, bands=args.bands, verbose=args.verbose)
    return 0
