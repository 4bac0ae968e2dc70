"""The main job's demo reproduces the report shown in the README."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from witcert_adapters.demo.settings import DEMO_SCHEMES, OPERATING_POINT, DemoSettings
from witcert_adapters.schemes import get_scheme
from witcert_calculus.errors import InvalidValueError

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
