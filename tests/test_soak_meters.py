"""CI subset of the adversarial soak (scripts/soak_meters.py): 20,000 trials per bound.

Also shows that the harness is able to fail: the unsound dispersion shape, and an
e-form shrunk by 10%, are flagged when wired in.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

CI_TRIALS = 20_000


def _load() -> ModuleType:
    path = Path(__file__).resolve().parents[1] / "scripts" / "soak_meters.py"
    spec = importlib.util.spec_from_file_location("soak_meters", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["soak_meters"] = module
    spec.loader.exec_module(module)
    return module


soak = _load()


@pytest.mark.slow
def test_ci_soak_has_no_violations(capsys: pytest.CaptureFixture[str]) -> None:
    results = soak.run(CI_TRIALS, seed=20260101)
    names = {r.name for r in results}
    assert {"tv.eform", "tv.two_sided", "tv.retention", "tv.meter", "tv.tanh_max",
            "output_error_bound[exact_tv]", "output_error_bound[meter]", "logit_bound",
            "tier_b.eform_on_event", "sentinel_rounds", "rate_upper_bound"} <= names
    for r in results:
        assert r.trials == CI_TRIALS, r
        assert r.violations == 0, r.line()
    out = capsys.readouterr().out
    assert "violations=  0" in out and "trials=   20,000" in out


def test_soak_flags_the_unsound_dispersion_bound() -> None:
    rng = np.random.default_rng(1)
    [res] = soak.soak_tv(CI_TRIALS, rng, bounds={"dispersion": soak.dispersion_unsound})
    assert res.violations > 0 and res.worst_ratio > 1


def test_soak_flags_a_slightly_shrunk_eform() -> None:
    rng = np.random.default_rng(2)

    def shrunk(p: np.ndarray, c: np.ndarray) -> np.ndarray:
        return 0.9 * soak.TV_BOUNDS["eform"](p, c)

    [res] = soak.soak_tv(CI_TRIALS, rng, bounds={"eform*0.9": shrunk})
    assert res.violations > 0


def test_main_prints_counts_and_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    assert soak.main(["--trials", "200", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "200 trials per bound" in out and "total violations: 0" in out
