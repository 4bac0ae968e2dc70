"""Copy the demos' reports into docs/ and splice them into the README.

Run after ``bash scripts/demo.sh`` (or ``python -m witcert_adapters.demo --out out/demo``):

    .venv/bin/python scripts/render_readme.py [out/demo/report.txt]

and after ``python -m witcert_adapters.vllm_demo --out out/vllm_demo.txt`` (the live vLLM
plugin's demo, shown whole):

    .venv/bin/python scripts/render_readme.py --vllm [out/vllm_demo.txt]

The fp8 benchmark's two tables are stored and shown whole the same way:

    .venv/bin/python benchmarks/bench_vllm_fp8.py coverage > out/fp8_coverage.txt
    .venv/bin/python scripts/render_readme.py --fp8-coverage out/fp8_coverage.txt
    .venv/bin/python benchmarks/bench_vllm_fp8.py repair > out/fp8_repair.txt
    .venv/bin/python scripts/render_readme.py --fp8-repair out/fp8_repair.txt

and so is the path-contract matrix, judged from the artifacts stored in docs/paths/:

    .venv/bin/python -m witcert_adapters.cli paths matrix docs/paths > out/paths.txt
    .venv/bin/python scripts/render_readme.py --paths out/paths.txt

and the eviction demo's report (``python -m witcert_adapters.demo --eviction --out out/eviction``):

    .venv/bin/python scripts/render_readme.py --eviction out/eviction/eviction.txt

and the depth demo's report (``python -m witcert_adapters.demo --depth --out out/depth``):

    .venv/bin/python scripts/render_readme.py --depth out/depth/depth.txt

and the live plugin's cost table:

    .venv/bin/python benchmarks/bench_vllm_live.py --host both > out/vllm_cost.txt
    .venv/bin/python scripts/render_readme.py --vllm-cost out/vllm_cost.txt

``docs/demo_report.txt`` stores the whole ``report.txt`` (the timings left out); the README
shows what the demo prints in the terminal: the report without its per-request blocks (one
line per request, the measured table, the operating point). ``tests/test_readme.py`` fails
when the README and ``docs/demo_report.txt`` disagree, and the slow demo test fails when a
fresh run no longer reproduces ``docs/demo_report.txt`` or prints something else.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STORED = ROOT / "docs" / "demo_report.txt"
PLATFORM = ROOT / "docs" / "demo_report.platform"
#: Reports shown whole: option -> (stored report, its platform, README marker name).
WHOLE = {"--vllm": ("vllm_demo_report", "vllm-demo"),
         "--fp8-coverage": ("vllm_fp8_coverage", "vllm-fp8-coverage"),
         "--fp8-repair": ("vllm_fp8_repair", "vllm-fp8-repair"),
         "--vllm-cost": ("vllm_cost", "vllm-cost"),
         "--paths": ("vllm_paths", "vllm-paths"),
         "--eviction": ("eviction_report", "eviction"),
         "--depth": ("depth_report", "depth")}
NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e[+-]?\d+)?")


def platform_id() -> str:
    """The machine the numbers depend on: CPU model, torch's CPU kernels, torch version.

    Keys are quantized with rounding, which is discontinuous: a float difference in the
    model's forward pass (another CPU's matrix kernels) can move a key across a rounding
    boundary and change a witness by a whole quantization step. The report's numbers are
    therefore reproducible on one platform, not across platforms.
    """
    import platform

    import torch

    model = "unknown cpu"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return (f"{platform.machine()}; {model}; torch {torch.__version__} "
            f"({torch.backends.cpu.get_cpu_capability()})\n")


def skeleton(report: str) -> str:
    """The report's words and structure: numbers, number lists, tier tags and spacing folded."""
    text = NUMBER.sub("#", report)
    text = re.sub(r"#(?:, #)+", "#", text)
    text = re.sub(r"\[(?:cert|part|emp |sat )\]", "[tier]", text)
    text = re.sub(r" +\)", ")", text)
    return "\n".join(" ".join(ln.split()) for ln in text.splitlines()) + "\n"
BEGIN, END = "<!-- demo-report:begin -->", "<!-- demo-report:end -->"


def stable(report: str) -> str:
    """The report without its timing figures (wall time, model load), which vary run to run."""
    lines = [ln for ln in report.splitlines() if not ln.startswith("wall time")]
    return "\n".join(re.sub(r"; model load [0-9.]+ s", "", ln) for ln in lines).rstrip() + "\n"


def excerpt(report: str) -> str:
    """What the demo prints of a report (its timings left out): the header, the summary with
    one line per request, and the measured table; the per-request blocks only in the file."""
    text = stable(report)
    head = text.split("\n\n", 1)[0]
    rest = "Requests (" + text.split("\nRequests (", 1)[1]
    return f"{head.strip()}\n\n{rest.strip()}\n"


def readme_block(report: str) -> str:
    """The README block (markers included) for a report."""
    return f"{BEGIN}\n```text\n{excerpt(report)}```\n{END}"


def whole_block(marker: str, report: str) -> str:
    """The README block (markers included) of a report shown whole."""
    return f"<!-- {marker}:begin -->\n```text\n{report}```\n<!-- {marker}:end -->"


def vllm_block(report: str) -> str:
    """The README block (markers included) of the live vLLM demo's report, whole."""
    return whole_block("vllm-demo", report)


def _splice(begin: str, end: str, block: str) -> None:
    readme = (ROOT / "README.md").read_text()
    start, stop = readme.index(begin), readme.index(end) + len(end)
    (ROOT / "README.md").write_text(readme[:start] + block + readme[stop:])


def main() -> None:
    """Store the report and rewrite the README block."""
    args = sys.argv[1:]
    if args[:1] and args[0] in WHOLE:
        stem, marker = WHOLE[args[0]]
        src = Path(args[1]) if len(args) > 1 else ROOT / "out" / "vllm_demo.txt"
        report = src.read_text()
        stored = ROOT / "docs" / f"{stem}.txt"
        stored.write_text(report)
        (ROOT / "docs" / f"{stem}.platform").write_text(platform_id())
        _splice(f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->", whole_block(marker, report))
        print(f"stored {stored.relative_to(ROOT)} and updated README.md")
        return
    src = Path(args[0]) if args else ROOT / "out" / "demo" / "report.txt"
    report = stable(src.read_text())
    STORED.write_text(report)
    PLATFORM.write_text(platform_id())
    _splice(BEGIN, END, readme_block(report))
    print(f"stored {STORED.relative_to(ROOT)} and updated README.md")


if __name__ == "__main__":
    main()
