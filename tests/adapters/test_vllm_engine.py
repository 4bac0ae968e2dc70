"""The vLLM plugin in the real engine, offline (``LLM.generate``): off, on, audited, fp8.

vLLM's CPU build runs in its own environment (``.venv-vllm``, made by scripts/setup.sh);
each engine is a subprocess (:func:`witcert_adapters.vllm_plugin.launch.run_offline`). One
battery of prompts is served by the unpatched engine (no plugin loaded), with the plugin
loaded and switched off, switched on with audit on the bfloat16 cache (both TV forms), and
on vLLM's fp8 (e4m3) cache, metered and with the gate that repairs, audited; an e5m2 cache
serves one prompt, metered by the cascade. A long prompt is prefilled in chunks (``max_num_batched_tokens=64``)
while a short one decodes, so some steps mix a decode row with a prefill chunk. Another
engine starts with a malformed switch and must refuse to start. The fp8 writer itself is
measured byte for byte against the plugin's model (``engine/fp8_checks.py``), and the
Monitor is driven step by step on caches vLLM's own kernel wrote (``engine/monitor_checks.py``:
stale slots, changed bytes, bad scales, an unknown ISA).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from witcert_adapters.demo.models import smollm2_engine_dir
from witcert_adapters.vllm_plugin.config import PluginConfig
from witcert_adapters.vllm_plugin.launch import engine_env, engine_python, fp8_supported, \
    run_offline

pytestmark = [pytest.mark.slow, pytest.mark.engine]
FP8 = pytest.mark.skipif(not fp8_supported(), reason="vLLM's CPU build serves an fp8 KV cache "
                         "only on CPUs with AVX-512 or AMX; this CPU has neither")

PROMPTS = [
    "The capital of France is",
    "Here is a long story. " + "The river ran past the old mill and the miller sang. " * 16,
    "List three prime numbers:",
]
CHUNKED = ("--max-num-batched-tokens", "64")
TOKENS = 12


@pytest.fixture(scope="module")
def model() -> Path:
    return smollm2_engine_dir()


@pytest.fixture(scope="module")
def runs(model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    store = tmp_path_factory.mktemp("vllm") / "verdicts.sqlite"
    on = PluginConfig(store=store, tau=0.1, audit=True)
    fp8 = PluginConfig(store=store.with_name("fp8.sqlite"), tau=0.1, audit=True)
    repair = PluginConfig(store=store.with_name("repair.sqlite"), tau=0.1, audit=True,
                          repair=True)
    served = {} if not fp8_supported() else {
        "fp8": run_offline(fp8, model=model, kv="fp8", prompts=PROMPTS, max_tokens=TOKENS,
                           extra=CHUNKED),
        "fp8-repair": run_offline(repair, model=model, kv="fp8", prompts=PROMPTS,
                                  max_tokens=TOKENS, extra=CHUNKED),
        "e5m2": run_offline(PluginConfig(store=store.with_name("e5m2.sqlite"), tau=0.1,
                                         audit=True, form="cascade"), model=model, kv="fp8_e5m2",
                            prompts=PROMPTS[:1], max_tokens=4)}
    return {
        **served,
        "unpatched": run_offline(None, model=model, kv="auto", prompts=PROMPTS,
                                 max_tokens=TOKENS, plugins=False, extra=CHUNKED),
        "off": run_offline(None, model=model, kv="auto", prompts=PROMPTS, max_tokens=TOKENS,
                           extra=CHUNKED),
        "on": run_offline(on, model=model, kv="auto", prompts=PROMPTS, max_tokens=TOKENS,
                          extra=CHUNKED),
        "tanh": run_offline(PluginConfig(store=store.with_name("tanh.sqlite"), tau=0.1,
                                         audit=True, form="tanh"),
                            model=model, kv="auto", prompts=PROMPTS, max_tokens=TOKENS,
                            extra=CHUNKED),
    }


def _tokens(run: dict[str, Any]) -> list[tuple[list[int], list[float]]]:
    return [(r["token_ids"], r["logprobs"]) for r in run["requests"]]


def test_off_and_on_are_bit_identical_to_the_unpatched_engine(
        runs: dict[str, dict[str, Any]]) -> None:
    base = _tokens(runs["unpatched"])
    assert all(len(ids) == TOKENS for ids, _ in base)
    assert _tokens(runs["off"]) == base  # token ids and logprobs, exactly
    assert _tokens(runs["on"]) == base
    assert _tokens(runs["tanh"]) == base
    assert "verdicts" not in runs["off"] and "verdicts" not in runs["unpatched"]


@pytest.mark.parametrize("mode", ["on", "tanh", pytest.param("fp8", marks=FP8),
                                  pytest.param("fp8-repair", marks=FP8)])
def test_every_served_request_carries_an_audited_verdict(
        runs: dict[str, dict[str, Any]], mode: str) -> None:
    by_external = {v["external"]: v for v in runs[mode]["verdicts"]}
    for r in runs[mode]["requests"]:
        v = by_external[r["request_id"]]
        assert v["form"] == ("tanh" if mode == "tanh" else "meter")
        assert v["kv_cache_dtype"] == ("fp8" if mode.startswith("fp8") else "auto")
        assert v["witness"] == "format"
        # bf16 certifies every cell; fp8 saturates some, so the ledger's verdict is partial
        assert v["tier"] in (("CERTIFIED",) if not mode.startswith("fp8") else
                             ("CERTIFIED", "PARTIALLY_CERTIFIED"))
        assert v["failure"] is None and v["spent"] == "0"
        assert v["gate"]["accepted"], v["gate"]
        assert v["cells"] == v["rows"] * 30 * 9 and v["audited"] == v["cells"]
        assert v["violations"] == 0
        assert 0.0 <= v["worst"]["meter"] <= 1.0
        assert (v["repair"] is not None) == (mode == "fp8-repair")
    long = by_external[runs[mode]["requests"][1]["request_id"]]
    assert long["prefill_steps"] > 1  # its prompt was prefilled in chunks
    assert any(v["mixed_steps"] > 0 for v in by_external.values())  # decode + prefill


def _mine(run: dict[str, Any]) -> list[dict[str, Any]]:
    ids = {r["request_id"] for r in run["requests"]}
    return [v for v in run["verdicts"] if v["external"] in ids]


@FP8
def test_fp8_is_metered_below_bf16_and_repaired_to_tau(
        runs: dict[str, dict[str, Any]]) -> None:
    def coverage(mode: str) -> float:
        vs = _mine(runs[mode])
        return sum(v["covered"] for v in vs) / sum(v["cells"] for v in vs)

    assert coverage("on") == 1.0
    assert 0.0 < coverage("fp8") < 1.0  # fp8 loses keys; the format witness bounds each byte
    assert max(v["true_max"] for v in _mine(runs["fp8"])) > 0  # the audit sees real error
    repaired = _mine(runs["fp8-repair"])
    total = sum(v["repair"]["cells"] for v in repaired)
    assert total > 0 and all(v["repair"]["risk_ranked"] == 0 for v in repaired)
    for v in repaired:
        rep = v["repair"]
        assert rep["label"] in ("certified", "none")
        assert rep["true_max"] <= 0.1  # every repaired cell's audited true TV is within tau
        assert 0.0 <= rep["page_in_fraction"] <= 1.0
        assert rep["page_in_bytes"] == rep["paged"] * 64 * 2 * 2  # bf16 keys and values
    assert sum(v["repair"]["paged"] for v in repaired) > 0
    assert coverage("fp8-repair") > coverage("fp8")
    # vLLM's CPU build serves e5m2 too: the same writer rule, its own grid, every byte checked
    (e5m2,) = _mine(runs["e5m2"])
    assert e5m2["kv_cache_dtype"] == "fp8_e5m2" and e5m2["failure"] is None
    assert e5m2["gate"]["accepted"] and e5m2["violations"] == 0 and e5m2["true_max"] > 0
    # ... metered by the cascade, every cell audited
    assert e5m2["form"] == "cascade" and e5m2["audited"] == e5m2["cells"]
    assert 0 <= e5m2["by_tanh"] <= e5m2["cells"]


@FP8
def test_vllms_fp8_writer_is_modelled_byte_for_byte(tmp_path: Path) -> None:
    script = Path(__file__).parent / "engine" / "fp8_checks.py"
    proc = subprocess.run([str(engine_python()), str(script)], env=engine_env(None),
                          capture_output=True, text=True, timeout=600, check=True, cwd=tmp_path)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["finite_bf16"] == 65280
    checked = [k for k in out if "@" in k]
    assert len(checked) == 2 * 7
    for name in checked:
        r = out[name]
        assert r["key_bytes_differ"] == 0 and r["value_bytes_differ"] == 0, (name, r)
        if name.endswith("@layout"):
            assert r["positions_read"] == r["expected_positions"] == 300 * 2 * 64 * 2
            assert r["other_bytes_changed"] == 0
        else:
            assert r["witness_violations"] == 0 and r["witness_max_ratio"] <= 1.0, (name, r)
            assert r["witness_max_ratio"] > 0.99  # the bound is tight, not loose by a margin


def test_a_bfloat16_cache_holds_the_keys_exactly(runs: dict[str, dict[str, Any]]) -> None:
    # The model computes its keys in bfloat16 and the cache stores them as they are: every
    # witness is 0, so every cell is certified at 0 and matches the audit exactly.
    for v in runs["on"]["verdicts"]:
        if v["external"] in {r["request_id"] for r in runs["on"]["requests"]}:
            assert v["coverage"] == 1.0 and v["worst"]["meter"] == 0.0
            assert v["true_max"] == 0.0


def test_startup_checks_name_what_differs(tmp_path: Path) -> None:
    script = Path(__file__).parent / "engine" / "startup_checks.py"
    proc = subprocess.run([str(engine_python()), str(script), str(tmp_path / "v.sqlite")],
                          env=engine_env(None), capture_output=True, text=True, timeout=300,
                          check=True)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["off_backend"].endswith("cpu_attn.CPUAttentionBackend")
    assert out["off_engine_imported"] is False
    assert out["as_installed"] == "no error"
    assert "vllm version" in out["other_version"] and "0.33.0" in out["other_version"]
    assert "do_kv_cache_update parameters" in out["changed_hook"]
    assert "'kv_scales'" in out["changed_hook"]
    assert "sliding window" in out["sliding_window"] and "64" in out["sliding_window"]
    assert "logits soft cap" in out["soft_cap"]
    assert "kv_cache_dtype" in out["unknown_dtype"] and "nvfp4" in out["unknown_dtype"]
    assert out["layout_exact"] is True


def test_a_malformed_switch_stops_the_engine_at_startup(model: Path, tmp_path: Path) -> None:
    env = engine_env(None)
    env["WITCERT_VLLM"] = f"store={tmp_path}/v.sqlite,tau=2"
    proc = subprocess.run(
        [str(engine_python()), "-m", "witcert_adapters.vllm_plugin.offline", "--model",
         str(model), "--prompts-json", '["x"]', "--out", str(tmp_path / "o.json")],
        env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode != 0
    assert "WITCERT_VLLM='tau=2' is invalid" in proc.stdout + proc.stderr
    assert not (tmp_path / "o.json").exists()


def test_monitor_fails_a_stale_reader_closed_and_refuses_an_unmetered_backend(
        tmp_path: Path) -> None:
    # The Monitor driven step by step on caches written by vLLM's own kernel: a request
    # whose slot another write reused reports no tier and names the stale slot.
    script = Path(__file__).parent / "engine" / "monitor_checks.py"
    proc = subprocess.run([str(engine_python()), str(script), str(tmp_path / "m.sqlite")],
                          env=engine_env(None), capture_output=True, text=True, timeout=300,
                          check=True)
    verdicts = json.loads(proc.stdout.strip().splitlines()[-1])
    fp8 = verdicts.pop("fp8")
    cascade = verdicts.pop("cascade")
    v = cascade["verdict"]
    assert v["form"] == "cascade" and v["tier"] == "CERTIFIED" and v["gate"]["accepted"]
    assert v["cells"] == 4 * 2 * 4 and v["by_tanh"] == v["cells"] == v["covered"]
    assert v["worst"]["meter"] == 0.0
    assert v["audited"] == v["cells"] and v["violations"] == 0 and v["true_max"] == 0.0
    assert cascade["float32 keys"].startswith("EngineMismatchError: key dtype (layer 0)")
    assert "torch.float32" in cascade["float32 keys"]
    assert fp8["startup"].startswith("EngineMismatchError: KV cache key bytes (layer 1, slot 130, "
                                     "kv head 1, channel 5)")
    assert "refusing to serve unmetered" in fp8["startup"]
    for scale in ("0.0", "nan", "inf"):
        assert fp8[f"scale {scale}"].startswith("EngineMismatchError: key scale (layer 0)")
        assert f"engine has {scale}" in fp8[f"scale {scale}"]
    assert fp8["isa"].startswith("EngineMismatchError: CPU attention ISA") and \
        "'vec16'" in fp8["isa"]
    later = fp8["later"]
    assert later["tier"] is None and later["gate"]["accepted"] is False
    assert later["failure"].startswith("EngineMismatchError: KV cache value bytes (layer 0, "
                                       "slot 3, kv head 0, channel 7)")
    unmetered = verdicts.pop("unmetered_backend")
    assert unmetered.startswith("EngineMismatchError: attention backend")
    assert "refusing to serve unmetered" in unmetered
    assert set(verdicts) == {"clean", "victim", "thief"}
    for name in ("clean", "thief"):
        v = verdicts[name]
        assert v["tier"] == "CERTIFIED" and v["failure"] is None and v["gate"]["accepted"]
    assert verdicts["clean"]["rows"] == 5 and verdicts["clean"]["cells"] == 5 * 2 * 4
    victim = verdicts["victim"]
    assert victim["tier"] is None and victim["gate"]["accepted"] is False
    assert victim["failure"].startswith("StaleReadError: slot 128 was authorised at "
                                        "generation 1 but is now at generation 2")
    assert victim["rows"] == 3  # nothing after the stale read was counted as metered
