"""The vLLM plugin end to end: the real OpenAI-compatible server on 127.0.0.1.

One bfloat16 server for the whole module (no fp8 server: the plugin refuses vLLM's CPU fp8
cache, :data:`~witcert_adapters.vllm_plugin.launch.FP8_NOT_METERED`), started by
:class:`witcert_adapters.vllm_plugin.launch.Server` and stopped by its PID. The module
drives the live demo's battery (completions and chats) through it, so the demo's report
is checked against the stored one too.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest

from witcert_adapters.demo.models import smollm2_engine_dir
from witcert_adapters.vllm_demo import BATTERY, Served, report, serve_battery
from witcert_adapters.vllm_plugin.launch import FP8_NOT_METERED

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Served]:
    folder = tmp_path_factory.mktemp("served")
    model = smollm2_engine_dir()
    return {"auto": serve_battery("auto", model=model, folder=folder)}


def test_every_request_gets_its_verdict_by_either_id(served: dict[str, Served]) -> None:
    for s in served.values():
        assert len(s.verdicts) == len(BATTERY)
        for i, (kind, _) in enumerate(BATTERY):
            v, w = s.verdicts[i], s.by_response_id[i]
            assert v == w  # the X-Request-Id and the response's id name the same verdict
            prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
            assert v["external"].startswith(prefix + f"demo-{s.kv_cache_dtype}-{i}")
            assert s.response_ids[i].startswith(prefix) and s.texts[i]
            assert v["kv_cache_dtype"] == s.kv_cache_dtype
            assert v["tier"] in ("CERTIFIED", "PARTIALLY_CERTIFIED") and v["failure"] is None
            assert v["audited"] == v["cells"] > 0 and v["violations"] == 0
            assert v["gate"]["stages"]["coverage"]["passed"], v["gate"]
            assert v["gate"]["stages"]["soundness"]["passed"], v["gate"]


def _metric(lines: tuple[str, ...], name: str, kv: str) -> dict[str, float]:
    pat = re.compile(rf'^{name}{{kv_cache_dtype="{kv}",tier="(\w+)"}} (\S+)$')
    return {m.group(1): float(m.group(2)) for ln in lines if (m := pat.match(ln))}


def test_metrics_sit_next_to_vllms_own(served: dict[str, Served]) -> None:
    for kv, s in served.items():
        assert s.vllm_metrics > 0
        requests = _metric(s.metrics, "witcert_requests_total", kv)
        assert sum(requests.values()) == len(BATTERY)
        cells = _metric(s.metrics, "witcert_cells_total", kv)
        assert sum(cells.values()) == sum(v["cells"] for v in s.verdicts)
        assert sum(_metric(s.metrics, "witcert_audit_violations_total", kv).values()) == 0
        assert any(ln.startswith("witcert_coverage_threshold 0.1") for ln in s.metrics)
        assert not any("demo-" in ln for ln in s.metrics)  # no per-request label


def test_bf16_is_exact(served: dict[str, Served]) -> None:
    s = served["auto"]
    assert sum(v["covered"] for v in s.verdicts) == sum(v["cells"] for v in s.verdicts) > 0


def _render() -> Any:
    spec = importlib.util.spec_from_file_location("render_readme",
                                                  ROOT / "scripts" / "render_readme.py")
    assert spec and spec.loader
    render = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(render)
    return render


def test_the_demo_report_reproduces_the_stored_one(served: dict[str, Served]) -> None:
    missing = [FP8_NOT_METERED]
    fresh = report(list(served.values()), missing=missing)
    stored = (ROOT / "docs" / "vllm_demo_report.txt").read_text()
    render = _render()
    fix = ("the live demo's output changed: rerun `python -m witcert_adapters.vllm_demo "
           "--out out/vllm_demo.txt` and `scripts/render_readme.py --vllm`")
    if render.platform_id() == (ROOT / "docs" / "vllm_demo_report.platform").read_text():
        assert fresh == stored, fix
    else:  # another CPU: the same requests and verdict lines, its own numbers
        for i in range(len(BATTERY)):
            assert f"request {i + 1} (" in fresh
        assert "audited violations 0" in fresh
