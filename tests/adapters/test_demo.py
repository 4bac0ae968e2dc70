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
    assert fresh == (ROOT / "docs" / "demo_report.txt").read_text(), (
        "the demo's output changed: rerun scripts/demo.sh and scripts/render_readme.py")
    for name in ("report.json", "coverage.png"):
        assert (tmp_path / name).stat().st_size > 0
