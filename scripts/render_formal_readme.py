"""Write the Python module <-> Lean file <-> theorem table of ``formal/README.md``.

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


def main() -> int:
    text = README.read_text(encoding="utf-8")
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    if not rest:
        print(f"{README} has no {BEGIN} marker", file=sys.stderr)
        return 1
    README.write_text(head + table() + tail, encoding="utf-8")
    print(f"wrote the module table of {README.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
