"""The package layout: imports point downward only, and no module imports one that imports it.

The layers, from the bottom: ``witcert_calculus`` (the pure library), ``witcert_kernels``
(torch and Triton), ``witcert_adapters`` (engine adapters and the demo application). An
import is every ``import``/``from ... import`` anywhere in a module (at the top, inside a
function, under ``TYPE_CHECKING``) and every string constant that names a module of the
three packages (``importlib.import_module("...")`` or a lazy-import table). A module's
import of ``pkg.mod`` is an edge to ``pkg.mod``; ``from pkg import name`` is an edge to
``pkg.name`` when that is a module, and to ``pkg`` (its ``__init__``) otherwise.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Each package, its folder, and its layer (imports may only go to the same or a lower layer).
PACKAGES: dict[str, tuple[Path, int]] = {
    "witcert_calculus": (ROOT / "witcert_calculus", 0),
    "witcert_kernels": (ROOT / "kernels" / "witcert_kernels", 1),
    "witcert_adapters": (ROOT / "adapters" / "witcert_adapters", 2),
}


@dataclass(frozen=True, slots=True)
class ImportGraph:
    """Modules of the packages and the import edges between them."""

    modules: dict[str, Path]
    edges: dict[str, set[str]]

    def cycles(self) -> list[list[str]]:
        """Every strongly connected component with a cycle (Tarjan), as sorted module lists."""
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        stack: list[str] = []
        on_stack: set[str] = set()
        found: list[list[str]] = []

        def visit(v: str) -> None:
            index[v] = low[v] = len(index)
            stack.append(v)
            on_stack.add(v)
            for w in sorted(self.edges.get(v, ())):
                if w not in index:
                    visit(w)
                    low[v] = min(low[v], low[w])
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                comp: list[str] = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1 or v in self.edges.get(v, ()):
                    found.append(sorted(comp))

        for v in sorted(self.modules):
            if v not in index:
                visit(v)
        return found

    def upward(self, layers: dict[str, int]) -> list[tuple[str, str]]:
        """Edges from a lower layer into a higher one."""
        def layer(m: str) -> int:
            return layers[m.split(".")[0]]
        return sorted((a, b) for a, bs in self.edges.items() for b in bs if layer(b) > layer(a))


def module_name(package: str, folder: Path, path: Path) -> str:
    rel = path.relative_to(folder).with_suffix("")
    parts = [package, *rel.parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def build_graph(packages: dict[str, Path]) -> ImportGraph:
    """Parse every module of ``packages`` (name -> folder) and collect its import edges."""
    modules: dict[str, Path] = {}
    for name, folder in packages.items():
        for path in sorted(folder.rglob("*.py")):
            modules[module_name(name, folder, path)] = path
    edges: dict[str, set[str]] = {m: set() for m in modules}

    def target(dotted: str) -> str | None:
        # The module itself, or the nearest enclosing module of the packages.
        parts = dotted.split(".")
        while parts:
            cand = ".".join(parts)
            if cand in modules:
                return cand
            parts.pop()
        return None

    for mod, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(tree):
            found: list[str] = []
            if isinstance(node, ast.Import):
                found = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                found = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                         for a in node.names]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and node.value in modules:
                found = [node.value]
            for dotted in found:
                t = target(dotted)
                if t is not None and t != mod:
                    edges[mod].add(t)
    return ImportGraph(modules, edges)


def _graph() -> ImportGraph:
    return build_graph({name: folder for name, (folder, _) in PACKAGES.items()})


def test_no_import_cycles() -> None:
    cycles = _graph().cycles()
    assert not cycles, f"import cycles (each list imports itself through the others): {cycles}"


def test_imports_point_downward() -> None:
    bad = _graph().upward({name: layer for name, (_, layer) in PACKAGES.items()})
    assert not bad, f"upward imports (library -> kernels -> adapters is the only order): {bad}"


def test_every_package_is_parsed() -> None:
    graph = _graph()
    for name in PACKAGES:
        assert name in graph.modules
    assert len(graph.modules) > 20
    # The graph sees real edges, including lazy ones (the package face loads its modules late).
    assert "witcert_calculus.contracts" in graph.edges["witcert_calculus.bridges"]
    assert any(e.startswith("witcert_calculus.") for e in graph.edges["witcert_adapters.hf"])


# ----------------------------------------------------------------------------- planted faults

def _plant(root: Path, files: dict[str, str]) -> dict[str, Path]:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return {name: root / name for name in {rel.split("/")[0] for rel in files}}


@pytest.mark.parametrize("b_text", [
    "from lowpkg.a import f\n",                                   # direct
    "def g():\n    from lowpkg import a\n    return a\n",         # lazy, inside a function
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from lowpkg.a import f\n",
    "import importlib\nM = importlib.import_module('lowpkg.a')\n",  # by name
    "from . import a\n",                                          # relative
])
def test_a_planted_cycle_is_caught(tmp_path: Path, b_text: str) -> None:
    pkgs = _plant(tmp_path, {"lowpkg/__init__.py": "", "lowpkg/a.py": "from lowpkg.b import g\n",
                             "lowpkg/b.py": b_text})
    assert build_graph(pkgs).cycles() == [["lowpkg.a", "lowpkg.b"]]


def test_a_cycle_through_the_package_face_is_caught(tmp_path: Path) -> None:
    pkgs = _plant(tmp_path, {"lowpkg/__init__.py": "from lowpkg.a import f\n",
                             "lowpkg/a.py": "from lowpkg import VERSION\nf = 1\n"})
    assert build_graph(pkgs).cycles() == [["lowpkg", "lowpkg.a"]]


def test_a_planted_upward_import_is_caught(tmp_path: Path) -> None:
    pkgs = _plant(tmp_path, {"lowpkg/__init__.py": "", "lowpkg/a.py": "import highpkg.x\n",
                             "highpkg/__init__.py": "", "highpkg/x.py": "from lowpkg import a\n"})
    graph = build_graph(pkgs)
    assert graph.upward({"lowpkg": 0, "highpkg": 1}) == [("lowpkg.a", "highpkg.x")]
    assert graph.cycles() == [["highpkg.x", "lowpkg.a"]]


def test_a_clean_tree_passes(tmp_path: Path) -> None:
    pkgs = _plant(tmp_path, {"lowpkg/__init__.py": "from lowpkg.a import f\n",
                             "lowpkg/a.py": "from lowpkg.b import g\nf = g\n",
                             "lowpkg/b.py": "g = 1\n",
                             "highpkg/__init__.py": "", "highpkg/x.py": "from lowpkg import a\n"})
    graph = build_graph(pkgs)
    assert graph.cycles() == []
    assert graph.upward({"lowpkg": 0, "highpkg": 1}) == []


# ----------------------------------------------------------------------------- faces

def test_a_module_implements_or_reexports_never_both() -> None:
    """Only a package ``__init__`` re-exports; every other module's ``__all__`` is its own."""
    bad: dict[str, list[str]] = {}
    for mod, path in _graph().modules.items():
        if path.name == "__init__.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom)
                    for a in n.names}
        exported: list[str] = []
        for n in tree.body:
            if isinstance(n, (ast.Assign, ast.AnnAssign)) and any(
                    isinstance(t, ast.Name) and t.id == "__all__"
                    for t in (n.targets if isinstance(n, ast.Assign) else [n.target])):
                assert n.value is not None
                exported = [e.value for e in ast.walk(n.value)
                            if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        again = sorted(set(exported) & imported)
        if again:
            bad[mod] = again
    assert not bad, f"modules that re-export names implemented elsewhere: {bad}"


def test_the_readme_layout_names_every_library_module() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    layout = text.split("## Layout\n", 1)[1].split("\n## ", 1)[0]
    missing = [p.name for p in sorted((ROOT / "witcert_calculus").glob("*.py"))
               if p.name != "__init__.py" and f"`witcert_calculus/{p.name}`" not in layout]
    assert not missing, f"README.md's layout table does not name: {missing}"
    for folder in ("kernels/witcert_kernels", "adapters/witcert_adapters"):
        names = [p.name for p in sorted((ROOT / folder).glob("*.py")) if p.name != "__init__.py"]
        row = next(ln for ln in layout.splitlines() if ln.startswith(f"| `{folder}`"))
        assert all(f"`{n}`" in row for n in names), (folder, names, row)
