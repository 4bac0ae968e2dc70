"""Tier-A coverage of the README demo per witness band count (how DENSE_BANDS was chosen).

Runs the demo (SmolLM2-135M-Instruct, 3 prompts x 8 teacher-forced decode steps) for a few
schemes at each band count and prints each scheme's Tier-A coverage at the demo's
threshold, with the witness side buffer's bytes per token per kv head (one float32 per
band). Tier B does not use the bands.

    .venv/bin/python scripts/measure_bands.py [--bands 2 4 8 16] [--out out/bands]
"""

from __future__ import annotations

import argparse
import contextlib
import io
from pathlib import Path

from witcert_adapters.demo import run_demo

SCHEMES = ("int8_token", "int8_g32", "dither_int8", "dither_int8_g32_m4", "fp8_e4m3_scaled")


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--bands", type=int, nargs="*", default=[2, 4, 8, 16])
    p.add_argument("--out", type=Path, default=Path("out/bands"))
    args = p.parse_args()
    print(f"{'bands':>5s} {'witness B':>9s} " + " ".join(f"{s:>18s}" for s in SCHEMES))
    for b in args.bands:
        with contextlib.redirect_stdout(io.StringIO()):
            report = run_demo(args.out / str(b), schemes=SCHEMES, bands=b)
        assert isinstance(report, dict) and isinstance(report["schemes"], list)
        cov = {s["name"]: s["coverage_tier_a"] for s in report["schemes"]
               if isinstance(s, dict)}
        print(f"{b:5d} {4 * b:9d} " + " ".join(f"{cov[s]:18.3f}" for s in SCHEMES))


if __name__ == "__main__":
    main()
