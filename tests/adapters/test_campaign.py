"""The diagnosis campaign: its log regenerated from the stored artifacts, its rules on planted
artifacts, bad input, the fault switch kept off every default path, and the planted fault
served for real.

The stored artifacts (``docs/campaign/``) were written by ``python -m
witcert_adapters.campaign run --out docs/campaign`` on vLLM's CPU build; their adjudication
log is ``docs/campaign.txt``.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from witcert_adapters.campaign import ARMS, FAULT_DIR, adjudicate, load_outcomes, run_arm
from witcert_calculus.errors import InvalidValueError

ROOT = Path(__file__).resolve().parents[2]
STORED = ROOT / "docs" / "campaign"


def _copy(tmp_path: Path) -> Path:
    folder = tmp_path / "campaign"
    shutil.copytree(STORED, folder)
    return folder


def _edit(folder: Path, name: str, change: Any) -> None:
    f = folder / f"{name}.json"
    data = json.loads(f.read_text())
    change(data)
    f.write_text(json.dumps(data))


def test_the_stored_log_is_regenerated_from_the_stored_artifacts() -> None:
    log = adjudicate(STORED)
    assert log == (ROOT / "docs" / "campaign.txt").read_text()
    outcomes = load_outcomes(STORED)
    assert len(outcomes) == len(ARMS) * 3
    # the planted regime and nothing else: violations exactly where the fault is planted and
    # the engine's own counter shows preemptions
    for o in outcomes:
        in_regime = o.arm.settings["fault"] == "planted" and o.preemptions > 0
        assert (o.violations > 0) == in_regime, (o.arm.name, o.round)
        # a request whose audit saw a violation keeps no tier: it failed closed
        assert (o.failed_closed > 0) == in_regime, (o.arm.name, o.round)
    assert "exactly in the runs where the fault is planted" in log
    assert "fault: off -> planted; does the planted fault show without preemption?) effects " \
        "by round [+0, +0, +0]: **not attributed**" in log
    assert "tight-clean -> tight (fault: off -> planted" in log
    assert log.count("**REFUSED**: arms") == 2
    assert "for 8 of 8 requests" in log and "for 7 of 8" not in log


def test_a_violation_outside_the_regime_breaks_the_localization(tmp_path: Path) -> None:
    folder = _copy(tmp_path)

    def violate(data: dict[str, Any]) -> None:
        data["run"]["verdicts"][0]["violations"] = 3

    _edit(folder, "base-r1", violate)
    log = adjudicate(folder)
    assert "NOT exactly" in log
    # one round of three: the fault's effect without preemption is not replicated
    assert "clean -> base (fault: off -> planted; does the planted fault show without " \
        "preemption?) effects by round [+0, +3, +0]: **not attributed**" in log


def test_bad_input_is_named(tmp_path: Path) -> None:
    folder = _copy(tmp_path)
    (folder / "tight-r2.json").unlink()
    with pytest.raises(InvalidValueError, match=r"round 2.*'tight'.*unmatched"):
        adjudicate(folder)
    cases: list[tuple[str, Any, str]] = [
        ("base-r0", lambda d: d.update(settings=dict(d["settings"], kv_blocks=6)), "settings"),
        ("base-r0", lambda d: d["spec"].update(max_tokens=41), "spec"),
        ("base-r0", lambda d: d.update(engine={"name": "vllm", "version": "0.31.0"}), "engine"),
        ("base-r0", lambda d: d.update(arm="nowhere"), "nowhere"),
        ("base-r0", lambda d: d["run"].pop("verdicts"), "run.verdicts"),
        ("base-r0", lambda d: d["run"]["verdicts"].pop(0), "one verdict per served request"),
    ]
    for name, change, named in cases:
        folder = _copy(tmp_path / name / named.replace(" ", "-"))
        _edit(folder, name, change)
        with pytest.raises(InvalidValueError, match=named):
            load_outcomes(folder)
    with pytest.raises(InvalidValueError, match="folder"):
        load_outcomes(tmp_path / "no-such-folder")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InvalidValueError, match="no campaign artifact"):
        load_outcomes(empty)


def test_the_fault_switch_is_on_no_default_path() -> None:
    """Only the campaign names the fault's folder or variable; the engine's default
    environment does not carry it; with the folder on the path and no switch, nothing is
    patched."""
    from witcert_adapters.vllm_plugin.launch import engine_env

    package = ROOT / "adapters" / "witcert_adapters"

    def imports(f: Path) -> set[str]:
        tree = ast.parse(f.read_text())
        return {str(n.module) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | \
            {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}

    naming = sorted(str(f.relative_to(package)) for f in package.rglob("*.py")
                    if f.parent != FAULT_DIR and ("WITCERT_PLANTED_FAULT" in f.read_text() or
                                                  any("planted" in m or "sitecustomize" in m
                                                      for m in imports(f))))
    assert naming == ["campaign.py"]
    env = engine_env(None, base={})
    assert "WITCERT_PLANTED_FAULT" not in env and "PYTHONPATH" not in env
    probe = ("import sys; import sitecustomize as s; "
             "print(s.__file__, any(type(f).__name__ == '_Finder' for f in sys.meta_path))")
    env = {k: v for k, v in os.environ.items() if k != "WITCERT_PLANTED_FAULT"}
    out = subprocess.run([sys.executable, "-c", probe], env={**env, "PYTHONPATH": str(FAULT_DIR)},
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == [str(FAULT_DIR / "sitecustomize.py"), "False"]
    armed = subprocess.run([sys.executable, "-c", probe],
                           env={**env, "PYTHONPATH": str(FAULT_DIR),
                                "WITCERT_PLANTED_FAULT": "/dev/null"},
                           capture_output=True, text=True, check=True).stdout.split()
    assert armed[1] == "True"


@pytest.mark.slow
@pytest.mark.engine
def test_the_planted_fault_is_seen_when_served_for_real(tmp_path: Path) -> None:
    """The memory-tight arm with the fault planted, served by vLLM's CPU build: the engine
    preempts, the fault corrupts the freed blocks, and the plugin's audit sees it."""
    from witcert_adapters.demo.models import smollm2_engine_dir

    f = run_arm(ARMS["tight"], 0, model=smollm2_engine_dir(), out_dir=tmp_path)
    (o,) = load_outcomes(tmp_path)
    assert f.name == "tight-r0.json"
    assert o.preemptions > 0 and o.fault_blocks > 0
    assert o.violations > 0 and o.audited > 0
