"""The main job's demo reproduces the report shown in the README."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_demo_reproduces_the_stored_report(tmp_path: Path) -> None:
    from witcert_adapters.demo import run_demo

    run_demo(tmp_path)
    spec = importlib.util.spec_from_file_location("render_readme",
                                                  ROOT / "scripts" / "render_readme.py")
    assert spec and spec.loader
    render = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(render)
    fresh = render.stable((tmp_path / "report.txt").read_text())
    stored = (ROOT / "docs" / "demo_report.txt").read_text()
    fix = "the demo's output changed: rerun scripts/demo.sh and scripts/render_readme.py"
    # The words, the layout, the schemes, the gate verdicts: identical on every platform.
    assert render.skeleton(fresh) == render.skeleton(stored), fix
    rows = [ln.split() for ln in fresh.split("Measured table", 1)[1].splitlines()]
    rows = [r for r in rows if r and r[-1] in ("accepted", "rejected")]
    assert len(rows) >= 7 and {r[5] for r in rows} == {"0"} and {r[6] for r in rows} == {
        "accepted"}, rows  # scheme, coverage, KL, top-1, max true TV, violations, gate
    assert "violations 0" in fresh
    # The numbers: identical on the platform that stored them (see render.platform_id).
    if render.platform_id() == (ROOT / "docs" / "demo_report.platform").read_text():
        assert fresh == stored, fix
    for name in ("report.json", "coverage.png"):
        assert (tmp_path / name).stat().st_size > 0
