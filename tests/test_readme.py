"""The README's quickstart runs and prints exactly what the README says it prints."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def test_quickstart_output_matches_readme() -> None:
    text = README.read_text()
    m = re.search(r"## Quickstart\n\n```python\n(.*?)```\n\nprints\n\n```text\n(.*?)```", text,
                  re.S)
    assert m, "the README lost its quickstart block"
    code, expected = m.group(1), m.group(2)
    assert len(code.strip().splitlines()) <= 20
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README quickstart", "exec"), {})
    assert out.getvalue() == expected


def test_readme_names_exactly_two_setup_commands() -> None:
    text = README.read_text()
    block = text.split("## Set-up: two commands", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [ln for ln in block.splitlines() if ln.strip()]
    assert [c.split("#")[0].strip() for c in commands] == ["bash scripts/demo.sh",
                                                           "bash scripts/test.sh"]
    ci = (README.parent / ".ci" / "run").read_text()
    assert "bash scripts/test.sh" in ci


def _render():  # type: ignore[no-untyped-def]
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "render_readme", README.parent / "scripts" / "render_readme.py")
    assert spec and spec.loader
    render = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(render)
    return render


def test_demo_report_in_readme_is_the_stored_one() -> None:
    text = (README.parent / "docs" / "demo_report.txt").read_text()
    assert _render().readme_block(text) in README.read_text()


@pytest.mark.parametrize("option", ["--vllm", "--fp8-coverage", "--fp8-repair",
                                    "--vllm-cost", "--eviction", "--depth"])
def test_whole_reports_in_readme_are_the_stored_ones(option: str) -> None:
    render = _render()
    stem, marker = render.WHOLE[option]
    text = (README.parent / "docs" / f"{stem}.txt").read_text()
    assert render.whole_block(marker, text) in README.read_text()
    assert (README.parent / "docs" / f"{stem}.platform").read_text().strip()
