"""Serving paths of vLLM with the plugin: the matrix regenerated from the stored artifacts, the
judge's rules on planted artifacts, bad input, and one path served for real.

The stored artifacts (``docs/paths/``) were written by ``witcert paths run --out docs/paths``
on vLLM's CPU build; the matrix they give is stored in ``docs/vllm_paths.txt`` and the README.
The planted artifacts are copies of stored ones with one fact changed, each of which a sound
judge must see.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from witcert_adapters.paths import PATHS, VERDICTS, judge, load_artifact, matrix_of, \
    render_matrix, run_path, serving_path
from witcert_calculus.errors import InvalidValueError

ROOT = Path(__file__).resolve().parents[2]
STORED = ROOT / "docs" / "paths"


def _stored(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((STORED / f"{name}.json").read_text())
    return data


def _judge(tmp_path: Path, data: dict[str, Any]) -> Any:
    f = tmp_path / f"{data['path']}.json"
    f.write_text(json.dumps(data))
    return judge(load_artifact(f))


def test_the_stored_matrix_is_regenerated_from_the_stored_artifacts() -> None:
    rows = matrix_of(STORED)
    assert render_matrix(rows) == (ROOT / "docs" / "vllm_paths.txt").read_text()
    assert [r.path for r in rows] == list(PATHS)
    # every path was run for real: none lacks its artifact
    assert all(r.evidence != "no artifact" for r in rows), [r.path for r in rows]
    assert {r.verdict for r in rows} <= set(VERDICTS)


def test_a_passing_path_is_every_layer_of_its_artifact(tmp_path: Path) -> None:
    row = _judge(tmp_path, _stored("abort-reuse"))
    assert row.verdict == "pass", row
    assert {k: v.status for k, v in row.layers.items()} == {
        "captured": "ok", "identity": "ok", "metered": "ok", "ledger": "ok",
        "eviction/reuse": "ok", "quality": "ok", "audit": "ok"}


@pytest.mark.parametrize("plant, layer", [
    ("violation", "audit"), ("token", "quality"), ("lost-verdict", "captured"),
    ("stray-verdict", "identity"), ("unaudited", "metered"), ("short-cells", "captured"),
    ("spend", "ledger"), ("tier-of-failed", "ledger"),
])
def test_a_planted_fault_fails_the_method_at_its_layer(tmp_path: Path, plant: str,
                                                       layer: str) -> None:
    data = copy.deepcopy(_stored("abort-reuse"))
    on = data["on"]
    if plant == "violation":
        on["verdicts"][1]["violations"] = 1
    elif plant == "token":
        rid = next(iter(on["outputs"]))
        on["outputs"][rid][0][-1] += 1
    elif plant == "lost-verdict":
        on["verdicts"].pop(0)
    elif plant == "stray-verdict":
        on["verdicts"].append(dict(on["verdicts"][0], request="ghost-9-0a1b2c3d"))
    elif plant == "unaudited":
        on["verdicts"][0]["audited"] -= 1
    elif plant == "spend":
        on["verdicts"][0]["spent"] = "1/200"  # a spend the recount does not give
    elif plant == "tier-of-failed":
        on["verdicts"][0]["failure"] = "stale slot"  # failed closed, yet it kept its tier
    else:
        on["verdicts"][0]["cells"] -= 270
    row = _judge(tmp_path, data)
    assert row.verdict == "fail-method", row
    assert row.layers[layer].status == "fail"
    assert layer in row.evidence


def test_a_regime_that_did_not_happen_is_partial(tmp_path: Path) -> None:
    data = copy.deepcopy(_stored("prefix-caching-on"))
    data["on"]["counters"]["vllm:prefix_cache_hits"] = 0.0
    row = _judge(tmp_path, data)
    assert row.verdict == "partial" and row.layers["eviction/reuse"].status == "not exercised"


def test_refusals_are_blocked_upstream_or_not_measured(tmp_path: Path) -> None:
    data = copy.deepcopy(_stored("concurrency-1"))
    data["off"] = {"engine": data["engine"], "plugin": False, "refused": "ValueError: no"}
    assert _judge(tmp_path, data).verdict == "blocked-upstream"
    data = copy.deepcopy(_stored("concurrency-1"))
    data["on"] = {"engine": data["engine"], "plugin": True,
                  "refused": "EngineMismatchError: sliding window"}
    row = _judge(tmp_path, data)
    assert row.verdict == "not-measured" and "refuses it at start-up" in row.evidence


def test_bad_input_is_named(tmp_path: Path) -> None:
    with pytest.raises(InvalidValueError, match="no-such-path"):
        serving_path("no-such-path")
    data = _stored("concurrency-1")
    cases: list[tuple[dict[str, Any], str]] = []
    missing = copy.deepcopy(data)
    del missing["on"]["verdicts"]
    cases.append((missing, "on.verdicts"))
    other = copy.deepcopy(data)
    other["engine"] = {"name": "vllm", "version": "0.31.0"}
    cases.append((other, "artifact.engine"))
    stale = copy.deepcopy(data)
    stale["spec"]["max_tokens"] += 1
    cases.append((stale, "artifact.spec"))
    for bad, named in cases:
        f = tmp_path / "concurrency-1.json"
        f.write_text(json.dumps(bad))
        with pytest.raises(InvalidValueError, match=named.replace(".", r"\.")):
            load_artifact(f)
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "nonsense.json").write_text("{}")
    with pytest.raises(InvalidValueError, match="nonsense"):
        matrix_of(tmp_path / "x")
    with pytest.raises(InvalidValueError, match="folder"):
        matrix_of(tmp_path / "no-such-folder")
    (tmp_path / "y").mkdir()
    (tmp_path / "y" / "concurrency-1.json").write_text("not json")
    with pytest.raises(InvalidValueError, match="readable JSON"):
        matrix_of(tmp_path / "y")


@pytest.mark.slow
@pytest.mark.engine
def test_a_path_served_for_real_is_judged_from_its_artifact(tmp_path: Path) -> None:
    """The abort-and-reuse path, served by vLLM's CPU build with the plugin on and off: the
    fresh artifact checks, and every layer holds."""
    from witcert_adapters.demo.models import smollm2_engine_dir

    f = run_path(PATHS["abort-reuse"], model=smollm2_engine_dir(), out_dir=tmp_path)
    row = judge(load_artifact(f))
    assert row.verdict == "pass", row
