"""The vLLM plugin end to end: the real OpenAI-compatible server on 127.0.0.1.

The live demo's three servers, each started once for the module by
:class:`witcert_adapters.vllm_plugin.launch.Server` and stopped by its PID: bfloat16, vLLM's
fp8 cache metered, and fp8 with the gate that repairs, all audited. The module drives the
demo's battery (completions and chats, and the retrieval items) through them, so the
demo's report is checked against the stored one too.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest

from witcert_adapters.demo.models import smollm2_engine_dir
from witcert_adapters.vllm_demo import BATTERY, SERVED, TAU, Served, demo_retrieval, report, \
    serve_battery
from witcert_adapters.vllm_plugin.launch import fp8_supported

pytestmark = [pytest.mark.slow, pytest.mark.engine,
              pytest.mark.skipif(not fp8_supported(), reason="the demo serves vLLM's fp8 cache, "
                                 "which vLLM's CPU build serves only on CPUs with AVX-512 or "
                                 "AMX; this CPU has neither")]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Served]:
    folder = tmp_path_factory.mktemp("served")
    model = smollm2_engine_dir()
    return {name: serve_battery(name, kv, model=model, folder=folder, repair=repair,
                                retrieval=demo_retrieval()) for name, kv, repair in SERVED}


def test_every_request_gets_its_verdict_by_either_id(served: dict[str, Served]) -> None:
    for s in served.values():
        assert len(s.verdicts) == len(BATTERY)
        for i, (kind, _) in enumerate(BATTERY):
            v, w = s.verdicts[i], s.by_response_id[i]
            assert v == w  # the X-Request-Id and the response's id name the same verdict
            prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
            assert v["external"].startswith(prefix + f"demo-{s.name}-{i}")
            assert s.response_ids[i].startswith(prefix) and s.texts[i]
            assert v["kv_cache_dtype"] == s.kv_cache_dtype
            assert v["tier"] in ("CERTIFIED", "PARTIALLY_CERTIFIED") and v["failure"] is None
            assert v["audited"] == v["cells"] > 0 and v["violations"] == 0
            assert v["gate"]["stages"]["coverage"]["passed"], v["gate"]
            assert v["gate"]["stages"]["soundness"]["passed"], v["gate"]
            assert (v["repair"] is not None) == (s.name == "fp8+repair")
        for v in s.retrieval_verdicts:  # long prompts, prefilled and then decoded
            assert v["failure"] is None and v["violations"] == 0 and v["audited"] == v["cells"]
            assert v["prefill_steps"] >= 1 and v["steps"] > v["prefill_steps"]


def _coverage(verdicts: tuple[dict[str, Any], ...]) -> float:
    return sum(v["covered"] for v in verdicts) / sum(v["cells"] for v in verdicts)


def test_fp8_is_metered_below_bf16_and_its_repaired_cells_are_within_tau(
        served: dict[str, Served]) -> None:
    every = {n: s.verdicts + s.retrieval_verdicts for n, s in served.items()}
    assert _coverage(every["bf16"]) == 1.0
    assert 0.0 < _coverage(every["fp8"]) < 1.0
    assert _coverage(every["fp8+repair"]) > _coverage(every["fp8"])
    repaired = [v["repair"] for v in every["fp8+repair"]]
    assert sum(r["cells"] for r in repaired) > 0 and sum(r["paged"] for r in repaired) > 0
    for r in repaired:  # every repaired cell's audited true TV is within tau
        assert r["true_max"] <= TAU and r["label"] in ("certified", "none")
    assert len(demo_retrieval()) == len(served["bf16"].hits)


def _metric(lines: tuple[str, ...], name: str, kv: str) -> dict[str, float]:
    pat = re.compile(rf'^{name}{{kv_cache_dtype="{kv}",tier="(\w+)"}} (\S+)$')
    return {m.group(1): float(m.group(2)) for ln in lines if (m := pat.match(ln))}


def test_metrics_sit_next_to_vllms_own(served: dict[str, Served]) -> None:
    for s in served.values():
        kv = s.kv_cache_dtype
        every = s.verdicts + s.retrieval_verdicts
        assert s.vllm_metrics > 0
        requests = _metric(s.metrics, "witcert_requests_total", kv)
        assert sum(requests.values()) == len(every)
        cells = _metric(s.metrics, "witcert_cells_total", kv)
        assert sum(cells.values()) == sum(v["cells"] for v in every)
        assert sum(_metric(s.metrics, "witcert_audit_violations_total", kv).values()) == 0
        assert any(ln.startswith("witcert_coverage_threshold 0.1") for ln in s.metrics)
        assert not any("demo-" in ln for ln in s.metrics)  # no per-request label


def test_bf16_is_exact(served: dict[str, Served]) -> None:
    s = served["bf16"]
    assert sum(v["covered"] for v in s.verdicts) == sum(v["cells"] for v in s.verdicts) > 0
    assert all(v["true_max"] == 0.0 for v in s.verdicts + s.retrieval_verdicts)


def _render() -> Any:
    spec = importlib.util.spec_from_file_location("render_readme",
                                                  ROOT / "scripts" / "render_readme.py")
    assert spec and spec.loader
    render = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(render)
    return render


def test_the_demo_report_reproduces_the_stored_one(served: dict[str, Served]) -> None:
    fresh = report(list(served.values()))
    stored = (ROOT / "docs" / "vllm_demo_report.txt").read_text()
    render = _render()
    fix = ("the live demo's output changed: rerun `python -m witcert_adapters.vllm_demo "
           "--out out/vllm_demo.txt` and `scripts/render_readme.py --vllm`")
    if render.platform_id() == (ROOT / "docs" / "vllm_demo_report.platform").read_text():
        assert fresh == stored, fix
    else:  # another CPU: the same requests and verdict lines, its own numbers
        for i in range(len(BATTERY)):
            assert f"request {i + 1} (" in fresh
        assert fresh.count("audited violations 0") == len(SERVED)
