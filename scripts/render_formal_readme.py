"""Write the generated tables of ``formal/README.md``.

1. The Python module <-> Lean file <-> theorem table.
2. The formulas compared by value: each section of ``WitCert/GeneratedChecks.lean``
   (``gen_lean_checks.VALUE_CHECKS``), the Python code it runs, the Lean definitions it is
   compared with, and how many kernel checks the committed file holds for it.

For each module of the three packages, the theorems it cites are the constants it imports
from ``witcert_calculus.lean.theorems``; the Lean file of each theorem is its module in the Lean
export shipped with the package (``witcert_calculus/lean/lean_export.json``). Run after changing
which theorems a module cites or after ``python scripts/lean_driver.py --root . --ship``:

    .venv/bin/python scripts/render_formal_readme.py

``tests/test_formal.py`` fails when the table in ``formal/README.md`` is not what this prints.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "formal" / "README.md"
BEGIN, END = "<!-- module-table:begin -->", "<!-- module-table:end -->"
VBEGIN, VEND = "<!-- value-checks:begin -->", "<!-- value-checks:end -->"
CHECKS = ROOT / "formal" / "WitCert" / "GeneratedChecks.lean"
PACKAGES = {"witcert_calculus": ROOT / "witcert_calculus",
            "witcert_kernels": ROOT / "kernels" / "witcert_kernels",
            "witcert_adapters": ROOT / "adapters" / "witcert_adapters"}


def _constants() -> dict[str, str]:
    """Constant name -> theorem name, read from the theorems module's source."""
    tree = ast.parse((ROOT / "witcert_calculus" / "lean" / "theorems.py").read_text(encoding="utf-8"))
    out: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str) \
                and node.value.value.startswith("WitCert."):
            out[node.target.id] = node.value.value
    return out


def cited() -> dict[str, list[str]]:
    """Python module -> the theorems it imports from ``witcert_calculus.lean.theorems``."""
    constants = _constants()
    found: dict[str, list[str]] = {}
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(folder).with_suffix("")
            module = ".".join([package, *rel.parts]).removesuffix(".__init__")
            names: set[str] = set()
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and node.module == "witcert_calculus.lean.theorems":
                    names |= {constants[a.name] for a in node.names if a.name in constants}
            if names:
                found[module] = sorted(names)
    return found


def table() -> str:
    """The table, markers included."""
    export = json.loads((ROOT / "witcert_calculus" / "lean" / "lean_export.json").read_text(encoding="utf-8"))
    lean = {t["name"]: t["module"] for t in export["theorems"]}
    rows = ["| Python module | Lean file(s) | theorems cited |", "|---|---|---|"]
    for module, names in cited().items():
        files = sorted({"formal/" + lean[n].replace(".", "/") + ".lean" for n in names})
        rows.append(f"| `{module}` | {', '.join(f'`{f}`' for f in files)} | "
                    f"{', '.join(f'`{n}`' for n in names)} |")
    return "\n".join([BEGIN, *rows, END])


def value_table() -> str:
    """The formulas compared by value, markers included."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from gen_lean_checks import VALUE_CHECKS
    from margin_checks import MARGIN_CHECKS

    counts: dict[str, int] = {}
    section = ""
    for line in CHECKS.read_text(encoding="utf-8").splitlines():
        if line.startswith("/-! ### ") and line.endswith(" -/"):
            section = line[len("/-! ### "):-len(" -/")]
        elif line.startswith("example"):
            counts[section] = counts.get(section, 0) + 1
    rows = ["| section | Python code run | compared with (Lean) | kernel checks |",
            "|---|---|---|---|"]
    rows += [f"| {title} | {python} | {lean} | {counts.get(title, 0)} |"
             for title, python, lean in VALUE_CHECKS]
    rows += ["", "The rounding margins have no Lean statement (floating-point rounding has no "
             "model in the Lean development); `scripts/margin_checks.py` compares each with the "
             "error it claims to cover, in 50-digit arithmetic at adversarial float inputs, "
             "every time the file above is generated:", "",
             "| margin | Python code it covers | compared with |", "|---|---|---|"]
    rows += [f"| {name} | {python} | {exact} |" for name, python, exact in MARGIN_CHECKS]
    return "\n".join([VBEGIN, *rows, VEND])


def _replace(text: str, begin: str, end: str, block: str) -> str | None:
    head, _, rest = text.partition(begin)
    _, _, tail = rest.partition(end)
    return None if not rest else head + block + tail


def main() -> int:
    text = README.read_text(encoding="utf-8")
    for begin, end, block in ((BEGIN, END, table()), (VBEGIN, VEND, value_table())):
        new = _replace(text, begin, end, block)
        if new is None:
            print(f"{README} has no {begin} marker", file=sys.stderr)
            return 1
        text = new
    README.write_text(text, encoding="utf-8")
    print(f"wrote the generated tables of {README.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
