"""The fast formal sync check, ``scripts/check_formal_sync.sh``: green on the tree, red on drift.

The drifts are planted in a scratch copy of what the script reads (the library, the two
scripts, the generated Lean file, the statement lock), never in the tree itself: the sharp
bridge's ``tanh(osc/4)`` turned into ``tanh(osc/2)``, a changed telescoping allowance, and an
edited lock statement.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path("scripts") / "check_formal_sync.sh"
NEEDED = (SCRIPT, Path("scripts") / "gen_lean_checks.py", Path("scripts") / "margin_checks.py",
          Path("scripts") / "statement_lock.py",
          Path("scripts") / "check_schemas.py",
          Path("formal") / "WitCert" / "GeneratedChecks.lean",
          Path("formal") / "statements.lock.json")


def _run(root: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHON"] = sys.executable
    return subprocess.run(["bash", str(root / SCRIPT)], cwd=root, env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    """A copy of exactly what the sync check reads."""
    shutil.copytree(ROOT / "witcert_calculus", tmp_path / "witcert_calculus",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for rel in NEEDED:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, tmp_path / rel)
    return tmp_path


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1, f"{path.name}: expected exactly one {old!r}"
    path.write_text(text.replace(old, new), encoding="utf-8")


def test_sync_check_passes_on_the_tree() -> None:
    proc = _run(ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "formal-sync: ok" in proc.stdout


def test_sync_check_passes_on_an_unchanged_copy(scratch: Path) -> None:
    proc = _run(scratch)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_sync_check_fails_on_the_sharp_bridge_at_osc_over_2(scratch: Path) -> None:
    _edit(scratch / "witcert_calculus" / "bridges.py",
          "Transfer(TransferKind.TANH, Fraction(1, 4))",
          "Transfer(TransferKind.TANH, Fraction(1, 2))")
    proc = _run(scratch)
    assert proc.returncode != 0
    assert "FAILED: generated checks" in proc.stderr
    assert "statement lock" not in proc.stderr.split("drift in:")[-1]
    # The diff names the drifted coefficient, checked against Lean's `sharpOscArg`.
    assert re.search(r"^\+example : Analytic\.sharpOscArg \(1 : Rat\) = \(1/2 : Rat\)",
                     proc.stderr, re.MULTILINE), proc.stderr


def test_sync_check_fails_on_a_changed_telescoping_formula(scratch: Path) -> None:
    _edit(scratch / "witcert_calculus" / "accounting" / "budget.py",
          "return Probability.budget(delta_req).exact / ((k + 1) * (k + 2))",
          "return Probability.budget(delta_req).exact / ((k + 1) * (k + 3))")
    proc = _run(scratch)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    # Either the generator refuses (the allowances no longer sum to the closed form) or the
    # regenerated telescoping checks differ from the committed ones.
    assert "FAILED: generated checks" in proc.stderr, out
    assert "telescoping" in out or "Ledger.telescopeDelta" in out, out


def test_sync_check_fails_on_a_changed_closed_form(scratch: Path) -> None:
    _edit(scratch / "witcert_calculus" / "accounting" / "budget.py",
          "return Probability.budget(delta_req).exact * (1 - Fraction(1, k + 1))",
          "return Probability.budget(delta_req).exact * (1 - Fraction(1, k + 2))")
    proc = _run(scratch)
    assert proc.returncode != 0
    assert "FAILED: generated checks" in proc.stderr


def test_sync_check_fails_on_the_meter_core(scratch: Path) -> None:
    _edit(scratch / "witcert_calculus" / "meters" / "tv_forms.py",
          "out: F64 = 0.5 * b * (b + 2.0)", "out: F64 = 0.5 * b * (b + 1.0)")
    proc = _run(scratch)
    assert proc.returncode != 0
    assert re.search(r"^\+example : Analytic\.eformCore ", proc.stderr, re.MULTILINE), proc.stderr


@pytest.mark.parametrize("old, new, says", [
    ("val = mp.tanh(mp.mpf(self.k.numerator) / self.k.denominator * xv)\n",
     "val = mp.tanh(mp.mpf(self.k.numerator) / self.k.denominator * xv) / 2\n",
     "returned 1/4 where its tanh gave 1/2"),
    ("val = (mp.exp(2 * xv) - 1) / 2\n",
     "val = (mp.exp(2 * xv) - 1) / (2 if xv < 3 else 6)\n",
     "-example : Analytic.eformBridgeCore (2981 : Rat) = (1490 : Rat)"),
    ("if 2 * xv > 700:", "if 2 * xv > 800:", "must saturate"),
], ids=["tanh-value-halved", "eform-third-past-3", "eform-saturation-moved"])
def test_sync_check_fails_on_a_drifted_bridge_value(scratch: Path, old: str, new: str,
                                                    says: str) -> None:
    """A transfer's value (not only its argument) is compared: the tanh bridges' value
    halved, the e-form divided by 3 only at large arguments, its saturation moved."""
    _edit(scratch / "witcert_calculus" / "contracts.py", old, new)
    proc = _run(scratch)
    assert proc.returncode != 0
    assert "FAILED: generated checks" in proc.stderr
    assert says in proc.stdout + proc.stderr, proc.stdout + proc.stderr


@pytest.mark.parametrize("module, old, new, lean", [
    ("bridges.py", "return Claim(a=math.prod(norms.values(), start=Fraction(1)), b=0)",
     "return Claim(a=math.prod(norms.values(), start=Fraction(1)) / 2, b=0)",
     "(403/64 : Rat) * (403/64 : Rat) ="),
    ("bridges.py", "return Claim(a=_sqrt_up(sum((w * w for w in weights), Fraction(0))), b=0)",
     "return Claim(a=_sqrt_up(sum((w * w for w in weights), Fraction(0))) / 2, b=0)",
     "(1515789138671229/2251799813685248 : Rat) *"),
    ("meters/witness.py", "c: F64 = np.asarray(prod.sum(axis=-1) * s, dtype=np.float64)",
     "c: F64 = np.asarray(prod.sum(axis=-1) * s / 2, dtype=np.float64)",
     "(485434383663105/140737488355328 : Rat) := by"),
    ("meters/output_bound.py",
     "return Claim(a=2 * Fraction(value_norm_max), b=_sum_upper(p_tilde, rho))",
     "return Claim(a=Fraction(value_norm_max), b=_sum_upper(p_tilde, rho))",
     "example : (63/4 : Rat) = 2 * (63/8 : Rat) := by decide +kernel"),
], ids=["score-slope-halved", "l2-caliber-halved", "logit-bound-halved", "output-slope-halved"])
def test_sync_check_fails_on_a_drifted_cauchy_schwarz_coefficient(
        scratch: Path, module: str, old: str, new: str, lean: str) -> None:
    """The score slope, the l2 pooling caliber, the witness logit bound `c` and the output
    contract's slope, each computed by the library's code and compared with the coefficient of
    the statement that proves it."""
    _edit(scratch / "witcert_calculus" / module, old, new)
    proc = _run(scratch)
    assert proc.returncode != 0
    assert "FAILED: generated checks" in proc.stderr
    # the committed value of the drifted coefficient is a removed line of the diff
    removed = [ln for ln in proc.stderr.splitlines() if ln.startswith("-")]
    assert any(lean in ln for ln in removed), proc.stderr


@pytest.mark.parametrize("module, old, new, says", [
    ("numerics/rounding.py", "up = np.nextafter(value * (1.0 + gamma) + alpha, np.inf)",
     "up = np.nextafter(value * (1.0 + gamma) + alpha, -np.inf)",
     "-      dy 6004799503160715 54 := by"),
    ("meters/tv_forms.py", "b: F64 = np.where(p > 0, p * np.expm1(c), 0.0).sum(axis=-1)",
     "b: F64 = np.where(p > 0, p * np.expm1(c / 2), 0.0).sum(axis=-1)",
     "tv_forms._log_a_plus at p = [0.5, 0.25, 0.25]"),
    ("meters/tv_forms.py",
     "out: F64 = 0.5 * np.where(p > 0, p * per, 0.0).sum(axis=-1)",
     "out: F64 = 0.25 * np.where(p > 0, p * per, 0.0).sum(axis=-1)",
     "tv_forms._retention_raw at p = [0.5, 0.25, 0.25]"),
], ids=["outward-inward", "log-a-half-c", "retention-quarter"])
def test_sync_check_fails_on_drifted_rounding_or_meter_value(scratch: Path, module: str, old: str,
                                                       new: str, says: str) -> None:
    """Outward rounding turned inward changes the kernel-checked values (the committed one is a
    removed line); the meter's `log A` computed from `expm1(c / 2)`, or the retention form
    halved again, misses the statement's value at 50 digits, and the generator refuses."""
    _edit(scratch / "witcert_calculus" / module, old, new)
    proc = _run(scratch)
    assert proc.returncode != 0
    assert "FAILED: generated checks" in proc.stderr
    assert says in proc.stdout + proc.stderr, proc.stdout + proc.stderr


@pytest.mark.parametrize("old, new, says", [
    ("return Margin(4.0 * (tokens + 16) * UNIT_ROUNDOFF, tokens * TINY)",
     "return Margin(0.0, 0.0)", "tv_margin(4096) for tv_forms._eform_raw"),
    ("return Margin(4 * UNIT_ROUNDOFF, TINY)", "return Margin(0.0, 0.0)",
     "tanh_margin() for np.tanh"),
    ("return Margin(4.0 * (tokens + 16) * UNIT_ROUNDOFF, tokens * TINY)",
     "return Margin(2.0**-60, tokens * TINY)", "tv_margin("),
    ("return Margin((size / 2.0 + 6.0) * UNIT_ROUNDOFF, math.sqrt(size) * SQRT_TINY)",
     "return Margin(0.0, 0.0)", "band_norm_margin("),
    ("return Margin((bands + 3 + SUM_SLACK) * UNIT_ROUNDOFF, (bands * scale + 1.0) * TINY)",
     "return Margin(0.0, 0.0)", "logit_margin("),
    ("return Margin(3 * UNIT_ROUNDOFF, terms * TINY)", "return Margin(0.0, 0.0)",
     "sum_margin("),
    ("return Margin((head_dim + blocks + 3) * UNIT_ROUNDOFF, (reach + blocks + 2.0) * TINY)",
     "return Margin(0.0, 0.0)", "variance_margin at dither_variance_proxy"),
    ("return Margin((head_dim + blocks + 1 + SUM_SLACK) * UNIT_ROUNDOFF,",
     "return Margin(0.0 * UNIT_ROUNDOFF,", "grid_mean_margin at dither_mean_offset"),
    ("return Margin((3 + SUM_SLACK) * UNIT_ROUNDOFF, SQRT_TINY)", "return Margin(0.0, 0.0)",
     "radius_margin at subgaussian_radius"),
], ids=["tv-margin-zero", "tanh-margin-zero", "tv-margin-below-the-error", "band-norm-zero",
        "logit-zero", "sum-zero", "variance-zero", "grid-mean-zero", "radius-zero"])
def test_sync_check_fails_on_a_margin_below_the_error_it_covers(scratch: Path, old: str, new: str,
                                                                says: str) -> None:
    """A rounding margin smaller than the float error of the formula it covers, at the
    adversarial points of scripts/margin_checks.py (50-digit evaluation), fails the sync check
    with the margin, the form and the point named."""
    _edit(scratch / "witcert_calculus" / "numerics" / "rounding.py", old, new)
    proc = _run(scratch)
    assert proc.returncode != 0
    assert "FAILED: generated checks" in proc.stderr
    assert says in proc.stderr and "more than the margin's" in proc.stderr, proc.stderr


def test_sync_check_fails_on_a_retention_weight_off_its_lean_definition(scratch: Path) -> None:
    """The retention meter's per-token weight taking the larger of the one-sided and the
    two-sided weights instead of the smaller: its values at rational A, A- and e^c no longer
    equal `Meters.retentionCore` (the committed example is a removed line of the diff)."""
    _edit(scratch / "witcert_calculus" / "meters" / "tv_forms.py",
          "per = np.minimum(one_sided, np.maximum(up, down))",
          "per = np.maximum(one_sided, np.maximum(up, down))")
    proc = _run(scratch)
    assert proc.returncode != 0
    assert "FAILED: generated checks" in proc.stderr
    removed = [ln for ln in proc.stderr.splitlines() if ln.startswith("-")]
    assert any("Meters.retentionCore" in ln for ln in removed) or \
        any(ln.startswith("-      (") and ": Rat) := by" in ln for ln in removed), proc.stderr


def test_sync_check_fails_on_a_changed_lock_statement(scratch: Path) -> None:
    lock = scratch / "formal" / "statements.lock.json"
    text = lock.read_text(encoding="utf-8")
    m = re.search(r'"WitCert\.Ledger\.telescope_partial_lt": "([^"]*)< δ"', text)
    assert m is not None
    lock.write_text(text.replace(m.group(0), m.group(0).replace("< δ", "≤ δ")), encoding="utf-8")
    proc = _run(scratch)
    assert proc.returncode != 0
    assert "FAILED: statement lock" in proc.stderr
    assert "changed: WitCert.Ledger.telescope_partial_lt" in proc.stderr
    assert "generated checks" not in proc.stderr.split("drift in:")[-1]


def test_sync_check_fails_on_a_consistently_changed_telescoping_budget(scratch: Path) -> None:
    """Both the allowance and its closed form halved: the library agrees with itself, so only
    the comparison with the committed checks (and, in the Lean build, with
    ``WitCert.Ledger.telescopeDelta`` / ``WitCert.Ledger.spent``) catches it."""
    budget = scratch / "witcert_calculus" / "accounting" / "budget.py"
    _edit(budget, "return Probability.budget(delta_req).exact / ((k + 1) * (k + 2))",
          "return Probability.budget(delta_req).exact / (2 * (k + 1) * (k + 2))")
    _edit(budget, "return Probability.budget(delta_req).exact * (1 - Fraction(1, k + 1))",
          "return Probability.budget(delta_req).exact * (1 - Fraction(1, k + 1)) / 2")
    proc = _run(scratch)
    assert proc.returncode != 0
    assert "FAILED: generated checks" in proc.stderr
    assert re.search(r"^\+example : Ledger\.(spent|telescopeDelta) ", proc.stderr,
                     re.MULTILINE), proc.stderr


@pytest.mark.parametrize("module, old, new, lean", [
    ("bridges.py", "Claim(a=1, b=(m_out + m_in) / 2)", "Claim(a=1, b=(m_out + m_in) / 4)",
     "Bridges.selectionOffset"),
    ("bridges.py", "b=0, cap=eps0)", "b=0, cap=2 * eps0)", "Analytic.affineSlopeArg"),
    ("meters/tv_forms.py", "out: F64 = c.max(axis=-1)\n", "out: F64 = c.max(axis=-1) / 4\n",
     "Analytic.sharpLinfArg"),
], ids=["selection-offset", "affine-cap", "tanh-max-argument"])
def test_sync_check_fails_on_a_drifted_coefficient(scratch: Path, module: str, old: str,
                                                   new: str, lean: str) -> None:
    """The selection offset, the affine bridge's cap (tied to its slope's argument) and the
    comparison shape's ``tanh`` argument are each checked against a Lean definition."""
    _edit(scratch / "witcert_calculus" / module, old, new)
    proc = _run(scratch)
    assert proc.returncode != 0
    assert "FAILED: generated checks" in proc.stderr
    assert re.search(rf"^\+example : {re.escape(lean)} ", proc.stderr, re.MULTILINE), proc.stderr


def test_sync_check_fails_on_a_statement_that_no_longer_states_a_schema(scratch: Path) -> None:
    """The selection contract's slope doubled in Lean, in the lock and the shipped export alike:
    the lock agrees with the export, the generated checks do not read statements, and only
    the schema check sees that the theorem no longer states the bridge's claim."""
    old = ("(WitCert.Semantic.selectionBridge n dropped added hd ha hOut hIn S s).approx ω p').val) "
           "≤ 1 * WitCert.Bridges.tv")
    new = old.replace("≤ 1 *", "≤ 2 *")
    _edit(scratch / "formal" / "statements.lock.json", old, new)
    export = scratch / "witcert_calculus" / "lean" / "lean_export.json"
    data = json.loads(export.read_text(encoding="utf-8"))
    (record,) = [r for r in data["theorems"] if old in r["statement"]]
    record["statement"] = record["statement"].replace(old, new)
    export.write_text(json.dumps(data), encoding="utf-8")
    proc = _run(scratch)
    assert proc.returncode != 0
    assert "FAILED: schemas" in proc.stderr
    assert "rank-prefix selection: WitCert.Semantic.rank_prefix_selection_contract_sound no " \
        "longer states" in proc.stderr
    assert proc.stderr.split("drift in:")[-1].strip() == "schemas", proc.stderr
