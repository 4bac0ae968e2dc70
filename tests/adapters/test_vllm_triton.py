"""vLLM's Triton path: the metered ``unified_attention`` and the Triton backend's route.

vLLM's CPU build runs in its own environment (``.venv-vllm``); each test runs one case of
tests/adapters/engine/triton_checks.py there, in Triton's CPU interpreter, on vLLM's own
kernel (the installed source, unchanged on disk, with the meter's anchors applied in memory)
and on vLLM's own ``TritonAttentionImpl``. A case raises on the first failed check; the
numbers it measured come back as one JSON line.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from witcert_adapters.vllm_plugin.launch import engine_env, engine_python

pytestmark = [pytest.mark.slow, pytest.mark.engine]

SCRIPT = Path(__file__).parent / "engine" / "triton_checks.py"


def _case(name: str) -> dict[str, Any]:
    env = engine_env(None, plugins=False)
    env["TRITON_INTERPRET"] = "1"
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run([str(engine_python()), str(SCRIPT), name], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    print(name, result)
    return result


def test_the_installed_source_is_untouched_and_the_meter_off_is_upstream() -> None:
    """The installed file hashes as the wheel's RECORD says, before and after the metered
    module is built and run; with the meter off the generated kernel's output equals
    upstream ``unified_attention``'s bit for bit (fp32 and fp16, block sizes 16 and 32)."""
    got = _case("upstream_untouched")
    assert got["configurations"] == 4
    assert len(got["sha256"]) == 64


def test_the_2d_kernel_meters_as_the_twin_and_bounds_the_exact_tv() -> None:
    """Metered 2d kernel, GQA and MQA, block sizes 16 and 32, ragged prefill and decode rows
    behind scattered block tables, fp32 and fp16: output bit-identical to upstream, meter
    equal to ``tv_bounds_batch`` on the same attention (relative error below 1e-6), at or
    above the exact TV of true versus stored keys on every row, 0 on a one-token row, and a
    CERTIFIED reading citing the logit bound's theorem."""
    got = _case("meter_2d")["max_relative_error_vs_twin"]
    assert len(got) == 4 and max(got.values()) < 1e-6


def test_the_3d_segments_merge_to_the_2d_bounds() -> None:
    """Decode rows through the 3d kernel and ``reduce_segments`` (2 and 4 segments): output
    bit-identical to upstream's 3d path; the segment partials merged under log-sum-exp
    weights give the 2d kernel's bounds (relative 1e-9) and bound the exact TV; the 2d
    kernel's bounds are those of the project's fused decode kernel on the same cache
    (relative 1e-6: the two kernels' float32 logits differ in rounding only)."""
    got = _case("meter_3d")["max_relative_error"]
    assert len(got) == 10
    assert max(v for k, v in got.items() if k.endswith("vs-2d")) < 1e-9
    assert max(v for k, v in got.items() if k.endswith("vs-twin")) < 1e-6
    assert max(v for k, v in got.items() if k.endswith("vs-fused-decode")) < 1e-6


def test_the_bound_holds_for_queries_along_the_residuals() -> None:
    """Adversarial queries along the key residuals (large TV): ``min(1, meter) >= TV`` on
    every row, 2d and 3d."""
    got = _case("adversarial")
    assert got["min_tv"] > 1e-3
    assert got["min_margin"] >= 0 and got["min_margin_3d"] >= 0


def test_lossless_rows_are_zero_and_bad_witnesses_never_pass() -> None:
    """Zero witnesses give exactly 0; an infinite witness saturates its row only; a NaN
    witness gives NaN; a negative one, or a margin for fewer keys than a row sees, refuses
    the reading's evidence (``PremiseError``)."""
    got = _case("edges")
    assert got["saturated"] == float("inf")
    assert "w[t, b] >= 0" in got["negative_witness"]


def test_a_changed_upstream_and_unsupported_features_are_refused() -> None:
    """A changed upstream block fails naming its anchor (found 0 times, or 2 times), before
    anything runs; ALiBi, a soft cap, a sliding window, sinks, keys in another dtype than
    the query's and a witness that does not fit the cache are typed errors naming the
    value."""
    got = _case("refusals")["injection_errors"]
    assert len(got) == 2 and all("anchor" in e for e in got)


def test_the_triton_backend_routes_its_kernel_call_to_the_meter() -> None:
    """Against the real installed ``TritonAttentionImpl``: the route's checks pass, a
    ``forward`` with other parameters or without the kernel global is refused, a sliding
    window, an fp8 cache and the fused rotary cache write (which would bypass the witnesses)
    are refused; on CPU, vLLM's own KV write and ``forward`` run through the route:
    witnesses 0 on the written slots and ``inf`` elsewhere, the output bit-identical to the
    plain implementation's, a read of a never-written slot saturated, and a reallocated
    cache starting from a fresh buffer (padded rows write no slot); after
    ``attach_triton``, vLLM's registry resolves ``TRITON_ATTN`` to the metered backend."""
    got = _case("route")["refusals"]
    assert len(got) == 5 and all("refusing to serve unmetered" in e for e in got)


def test_the_triton_path_folds_each_step_into_the_requests_verdicts() -> None:
    """Two routed layers serve two requests through a prefill and a decode step: certified
    verdicts with full coverage in the SQLite store; a layer that never wrote its keys fails
    coverage; a negative witness fails its request closed."""
    result = _case("fold")
    assert result["verdicts"]["a"] == ["CERTIFIED", None, 1.0]
    assert result["verdicts"]["c"][1] == "coverage"
    assert result["verdicts"]["d"][0] is None
