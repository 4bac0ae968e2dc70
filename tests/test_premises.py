"""No premise is asserted: every ``Premise`` truth value is computed, in all three packages.

A premise is computed from the arguments, carried by a type only the establishing function
can produce (a :class:`~witcert_calculus.meters.witness.LogitBound`, whose TV evidence comes from
:meth:`~witcert_calculus.meters.tv_forms.TVBasis.evidence`), or stated as an
:class:`~witcert_calculus.tiers.Assumption`, which limits the tier. A literal ``True`` in
``Premise(...)`` (or ``holds=True``, or a ``(statement, True)`` pair handed to a proof
helper) is a tier that the machine did not decide; this test names each one by file and line.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    "witcert_calculus": ROOT / "witcert_calculus",
    "witcert_kernels": ROOT / "kernels" / "witcert_kernels",
    "witcert_adapters": ROOT / "adapters" / "witcert_adapters",
}

FIX = (
    "compute the truth value from the arguments (e.g. the result of the validation check), "
    "or carry it by construction (build c with witcert_kernels.meter.logit_bound(query, "
    "witness, layout=..., scale=...) or witcert_kernels.dither.tier_b_logit_bound, pass it to "
    "tv_bounds_batch and take the reading's evidence from batch.basis.evidence(theorem)), or "
    "state it as an Assumption in Restricted(proof, assumptions=(...,)), which makes the "
    "reading at most PARTIALLY_CERTIFIED"
)

_HOLDS_TRUE = re.compile(r"\bholds\s*=\s*True\b")


def _is_true(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def _name(func: ast.AST) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def asserted(path: Path) -> list[tuple[int, str]]:
    """``(line, what)`` of every premise in ``path`` whose truth value is the literal True."""
    text = path.read_text(encoding="utf-8")
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(text, filename=str(path))):
        if not isinstance(node, ast.Call):
            continue
        name = _name(node.func)
        if name == "Premise":
            truth = node.args[1] if len(node.args) > 1 else next(
                (k.value for k in node.keywords if k.arg == "holds"), None)
            if truth is not None and _is_true(truth):
                found.append((node.lineno, "Premise(..., True)"))
        elif name.lstrip("_") in ("proof", "premise"):
            for arg in node.args:
                if isinstance(arg, ast.Tuple) and len(arg.elts) == 2 and _is_true(arg.elts[1]):
                    found.append((arg.lineno, f"{name}(..., (statement, True))"))
    for i, line in enumerate(text.splitlines(), 1):
        if _HOLDS_TRUE.search(line):
            found.append((i, "holds=True"))
    return sorted(set(found))


@pytest.mark.parametrize("package", list(PACKAGES))
def test_no_premise_is_a_literal_true(package: str) -> None:
    folder = PACKAGES[package]
    bad = [f"{path.relative_to(ROOT)}:{line}: {what}"
           for path in sorted(folder.rglob("*.py")) for line, what in asserted(path)]
    assert not bad, (f"{len(bad)} premise(s) in {package} asserted, not checked:\n  "
                     + "\n  ".join(bad) + f"\nFix: {FIX}.")


def test_the_scan_finds_each_form(tmp_path: Path) -> None:
    planted = tmp_path / "m.py"
    planted.write_text(
        "from witcert_calculus.tiers import Premise, Proof\n"
        "a = Premise('x', True)\n"
        "b = Premise(statement='y', holds=True)\n"
        "c = Premise('z',\n"
        "            True)\n"
        "d = _proof('rule', ('w >= 0', True))\n"
        "ok = Premise('w >= 0', bool(w >= 0))\n"
        "also = Premise('a2 >= 0', a2 >= 0)\n", encoding="utf-8")
    lines = [line for line, _ in asserted(planted)]
    assert lines == [2, 3, 3, 4, 6]
