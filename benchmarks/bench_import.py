"""Import cost of ``witcert_calculus`` next to bare Python start-up, measured in one run.

Run: ``.venv/bin/python benchmarks/bench_import.py``. Each sample is a fresh
interpreter; the ratio and the difference are printed side by side, and the
heavy modules that must not be imported are listed.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

RUNS = 15
PROBE = ("import sys, time; t = time.perf_counter(); import witcert_calculus; "
         "d = time.perf_counter() - t; heavy = [m for m in ('torch', 'sympy', 'numpy', 'mpmath') "
         "if m in sys.modules]; print(d, ','.join(heavy))")


def main() -> None:
    """Time ``import witcert_calculus`` in fresh interpreters, next to an empty start-up."""
    inside: list[float] = []
    bare: list[float] = []
    heavy = set()
    for _ in range(RUNS):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        bare.append(time.perf_counter() - t)
        t = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", PROBE], check=True, capture_output=True,
                             text=True).stdout.split()
        total = time.perf_counter() - t
        inside.append(float(out[0]))
        heavy.update(x for x in (out[1].split(",") if len(out) > 1 else []) if x)
        _ = total
    med = statistics.median(inside)
    print(f"import witcert_calculus: median {med * 1e3:.1f} ms over {RUNS} fresh interpreters "
          f"(min {min(inside) * 1e3:.1f} ms); interpreter start-up median "
          f"{statistics.median(bare) * 1e3:.1f} ms; import / start-up = "
          f"{med / statistics.median(bare):.2f}")
    print(f"target <= 150 ms: {'met' if med <= 0.150 else 'NOT met'}; heavy modules imported: "
          f"{sorted(heavy) or 'none'}")


if __name__ == "__main__":
    main()
