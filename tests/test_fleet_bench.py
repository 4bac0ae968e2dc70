"""benchmarks/bench_fleet.py runs end to end on a tiny trace (no timing asserted)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # the benchmark end to end in a subprocess
def test_bench_fleet_tiny() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_fleet.py"), "--events", "3000",
         "--ranks", "2", "--requests", "3", "--entries", "50"],
        capture_output=True, text=True, check=True, timeout=240).stdout
    # 3000 events round up to whole steps: 10 steps x 3 requests x 2 ranks x 50 entries.
    assert "trace: 3000 entry events = 10 steps x 3 requests x 2 ranks x 50 entries" in out
    assert re.search(r"fleet / single-process throughput: \d+\.\d\d\n", out)
    share = re.search(r"all-reduce share of the fleet.s step time: (\d\.\d{3}) \(10 step",
                      out)
    assert share is not None and 0.0 < float(share.group(1)) <= 1.0
    assert "verdicts agree (tier, exact spend, entries kept, all 3 requests): yes" in out


def test_bench_fleet_refuses_bad_sizes() -> None:
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_fleet.py"),
                          "--ranks", "0"], capture_output=True, text=True)
    assert res.returncode == 2 and "--ranks must be >= 1" in res.stderr
