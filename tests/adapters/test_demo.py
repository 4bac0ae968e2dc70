"""The main job's demo reproduces the report shown in the README, and prints what a person
reads: one line per request and the table, short enough for two screens."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import re
import runpy
from pathlib import Path
from types import ModuleType

import pytest

from witcert_adapters.demo.settings import DEMO_SCHEMES, OPERATING_POINT, PROMPTS, DemoSettings
from witcert_adapters.schemes import get_scheme
from witcert_calculus.errors import InvalidValueError

ROOT = Path(__file__).resolve().parents[2]
#: ``scripts/demo.sh`` after its set-up (the worked chain, a blank line, the demo) fits on two
#: screens.
SCREENS = 100
#: One request's summary line: id, scheme, prompt, coverage (Tier B where the scheme has it),
#: the ledger's verdict, the gate, the violations.
SUMMARY = re.compile(r"^ +(\d+)  (\S+) +('.*?') +coverage (\d\.\d{3})(?:  B (\d\.\d{3}))? +"
                     r"([A-Z_]+) +(accepted|rejected at \S+)  violations (\d+)$")


def _render() -> ModuleType:
    spec = importlib.util.spec_from_file_location("render_readme",
                                                  ROOT / "scripts" / "render_readme.py")
    assert spec and spec.loader
    render = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(render)
    return render


def _worked_chain_lines() -> list[str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(str(ROOT / "examples" / "worked_chain.py"), run_name="__main__")
    return out.getvalue().splitlines()


def _check_summary(lines: list[str]) -> None:
    """One line per request, in order: every scheme over every prompt, no violation."""
    rows = [m for m in map(SUMMARY.match, lines) if m]
    assert len(rows) == len(DEMO_SCHEMES) * len(PROMPTS), lines
    assert [m.group(2) for m in rows] == [s for s in DEMO_SCHEMES for _ in PROMPTS]
    assert [m.group(3) for m in rows] == [repr(p) for _ in DEMO_SCHEMES for p in PROMPTS]
    assert {m.group(8) for m in rows} == {"0"}
    dithered = {s for s in DEMO_SCHEMES if get_scheme(s).dithered is not None}
    assert all((m.group(5) is not None) == (m.group(2) in dithered) for m in rows)


def test_the_stored_demo_prints_one_line_per_request_on_two_screens() -> None:
    render = _render()
    stored = (ROOT / "docs" / "demo_report.txt").read_text()
    shown = render.excerpt(stored).splitlines()  # what the terminal shows, the timing left out
    _check_summary(shown)
    assert "Measured table" in "\n".join(shown) and "Certified operating point" in "\n".join(shown)
    assert not any("per layer:" in ln for ln in shown)
    # demo.sh: the worked chain, a blank line, the demo and its last line (timing, files)
    assert len(_worked_chain_lines()) + 1 + len(shown) + 1 <= SCREENS
    # report.txt keeps a block per request, with its per-layer readings
    assert stored.count("\n  per layer: worst-cell meter") == len(DEMO_SCHEMES) * len(PROMPTS)


@pytest.mark.slow
def test_demo_reproduces_the_stored_report(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    from witcert_adapters.demo import run_demo

    run_demo(tmp_path)
    printed = capsys.readouterr().out.splitlines()
    render = _render()
    text = (tmp_path / "report.txt").read_text()
    # The terminal: the report without its per-request blocks (what the README shows), then
    # the timing and where the files are; on two screens with the worked chain before it.
    assert render.stable("\n".join(printed[:-1])) == render.excerpt(text)
    assert printed[-1].startswith("wall time ") and all(
        str(tmp_path / name) in printed[-1]
        for name in ("report.txt", "report.json", "traces", "coverage.png"))
    _check_summary(printed)
    assert not any("per layer:" in ln for ln in printed)
    assert len(_worked_chain_lines()) + 1 + len(printed) <= SCREENS
    # report.txt: every request's block with its per-layer readings, and the same summary
    n = len(DEMO_SCHEMES) * len(PROMPTS)
    assert text.count("\n  per layer: worst-cell meter") == n
    assert len(re.findall(r"^request \d+: scheme ", text, re.MULTILINE)) == n
    _check_summary(text.splitlines())
    fresh = render.stable(text)
    stored = (ROOT / "docs" / "demo_report.txt").read_text()
    fix = "the demo's output changed: rerun scripts/demo.sh and scripts/render_readme.py"
    # The words, the layout, the schemes, the gate verdicts: identical on every platform.
    assert render.skeleton(fresh) == render.skeleton(stored), fix
    rows = [ln.split() for ln in fresh.split("Measured table", 1)[1].splitlines()]
    rows = [r for r in rows if r and r[-1] in ("accepted", "rejected")]
    # scheme, B/key, coverage, joint, KL, top-1, max true TV, violations, gate
    assert len(rows) >= 7 and {r[-2] for r in rows} == {"0"} and {r[-1] for r in rows} == {
        "accepted"}, rows
    assert "violations 0" in fresh
    # The numbers: identical on the platform that stored them (see render.platform_id).
    if render.platform_id() == (ROOT / "docs" / "demo_report.platform").read_text():
        assert fresh == stored, fix
    for name in ("report.json", "coverage.png"):
        assert (tmp_path / name).stat().st_size > 0
    report = json.loads((tmp_path / "report.json").read_text())
    schemes = {s["name"]: s for s in report["schemes"]}
    assert list(schemes) == list(DEMO_SCHEMES) and report["threshold"] == 0.2
    for s in schemes.values():
        assert {"name", "threshold", "coverage_tier_a", "coverage_tier_b", "violations",
                "key_bytes_per_token_head"} <= set(s)
        assert s["violations"] == 0 and s["threshold"] == 0.2
        assert (s["coverage_tier_b"] is None) == (get_scheme(s["name"]).dithered is None)
    # the certified operating point: Tier-B coverage >= 0.98 at <= 0.6 of fp16's bytes,
    # the bytes measured from the stored tensors
    point = schemes[OPERATING_POINT]
    assert point["coverage_tier_b"] >= 0.98 and point["key_bytes_measured"]
    assert point["key_bytes_per_token_head"] <= 0.6 * point["key_bytes_fp16"]
    assert schemes["dither_int8"]["coverage_tier_b"] < point["coverage_tier_b"]
    # One entry trace per scheme; replayed at the threshold, it retains exactly the cells the
    # report counts as covered (the same decode-step cells, read back from disk).
    from witcert_calculus.explore.entry_trace import read_entry_trace, replay_entry_trace

    for name, s in schemes.items():
        trace = read_entry_trace(tmp_path / "traces" / f"{name}.jsonl")
        assert len(trace.steps) == 3 * 8 and {t.size for t in trace.steps} == {30 * 9}
        curve = replay_entry_trace(trace, thresholds=[report["threshold"]])
        assert curve.retained_fraction[0] == pytest.approx(s["coverage_tier_a"], abs=1e-12)


@pytest.mark.parametrize("tau", [0.0, 1.0, -0.1, 1.5, float("nan")])
def test_a_threshold_outside_the_open_unit_interval_is_a_typed_error(tau: float) -> None:
    with pytest.raises(InvalidValueError, match="threshold"):
        DemoSettings(threshold=tau)


def test_the_command_line_takes_a_threshold_and_bands(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    from witcert_adapters.demo import cli

    seen: dict[str, object] = {}
    monkeypatch.setattr(cli, "run_demo", lambda out, **kw: seen.update(kw, out=out))
    assert cli.main(["--out", str(tmp_path), "--threshold", "0.3", "--bands", "8"]) == 0
    assert seen["threshold"] == 0.3 and seen["bands"] == 8 and seen["out"] == tmp_path
    assert cli.main(["--out", str(tmp_path)]) == 0
    assert seen["threshold"] == 0.2 and seen["schemes"] == DEMO_SCHEMES
    assert seen["verbose"] is False
    assert cli.main(["--out", str(tmp_path), "--verbose"]) == 0
    assert seen["verbose"] is True


def test_docstring_examples_of_the_report() -> None:
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module("witcert_adapters.demo.report"),
                             optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted > 0
