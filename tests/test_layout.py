"""The package layout: imports point downward only, and no module imports one that imports it.

The layers, from the bottom: ``witcert_calculus`` (the pure library), ``witcert_kernels``
(torch and Triton), ``witcert_adapters`` (engine adapters and the demo application). An
import is every ``import``/``from ... import`` anywhere in a module (at the top, inside a
function, under ``TYPE_CHECKING``) and every string constant that names a module of the
three packages (``importlib.import_module("...")`` or a lazy-import table). A module's
import of ``pkg.mod`` is an edge to ``pkg.mod``; ``from pkg import name`` is an edge to
``pkg.name`` when that is a module, and to ``pkg`` (its ``__init__``) otherwise.

Inside ``witcert_calculus`` the modules live in rooms: the faces a user imports sit at the
top (the algebra: ``metrics``, ``tiers``, ``contracts``, ``schemas``, ``bridges``; the ``ledger``; the
``errors``), every other module in the subpackage of its concern. :data:`ALLOWED` says which
rooms each room may import; a room that no other lists (``explore``, ``export``) is a leaf.
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


#: The library's faces (top-level modules) and the room each belongs to for the rules.
FACES: dict[str, str] = {"metrics": "algebra", "tiers": "algebra", "contracts": "algebra",
                         "schemas": "algebra", "bridges": "algebra", "ledger": "ledger",
                         "errors": "errors"}
#: The library's rooms (subpackages), each a concern.
ROOMS: frozenset[str] = frozenset({"numerics", "lean", "meters", "accounting", "drift",
                                   "explore", "export"})

#: Room -> the rooms its modules may import (its own always). The package face
#: (``witcert_calculus/__init__.py``) may import every room; no room imports it.
ALLOWED: dict[str, frozenset[str]] = {
    "errors": frozenset(),
    # input checks, exact probabilities, outward rounding: the bottom room
    "numerics": frozenset({"errors"}),
    # the Lean link: theorem names, modelling steps (which carry a tier)
    "lean": frozenset({"errors", "numerics", "algebra"}),
    # the contract algebra imports no meter, no accounting, no drift
    "algebra": frozenset({"errors", "numerics", "lean"}),
    # the meters import no accounting and no drift
    "meters": frozenset({"errors", "numerics", "lean", "algebra"}),
    # drift detection knows neither the meters nor the ledger's books
    "drift": frozenset({"errors", "numerics", "lean"}),
    # the ledger's books: no meter
    "accounting": frozenset({"errors", "numerics", "lean", "algebra", "drift"}),
    "ledger": frozenset({"errors", "numerics", "lean", "algebra", "drift", "accounting"}),
    # the leaves: nothing but the package face imports them
    "explore": frozenset({"errors", "numerics", "lean", "algebra", "accounting"}),
    "export": frozenset({"errors", "numerics", "lean", "algebra", "accounting"}),
}

#: The edges allowed across the rules, each with its reason (each must still exist).
EXCEPTIONS: dict[tuple[str, str], str] = {
    ("witcert_calculus.ledger", "witcert_calculus.export.prometheus"):
        "RiskLedger.prometheus() loads the export on first use",
    ("witcert_calculus.export.telemetry", "witcert_calculus"):
        "the tracer's name is the package's name (a string, not an import)",
}


def room_of(module: str, package: str = "witcert_calculus",
            faces: dict[str, str] = FACES, rooms: frozenset[str] = ROOMS) -> str | None:
    """The room of a module of ``package`` (``"face"`` for the package face), None if none."""
    parts = module.split(".")
    if parts[0] != package:
        raise ValueError(f"{module} is not in {package}")
    if len(parts) == 1:
        return "face"
    if parts[1] in rooms:
        return parts[1]
    return faces.get(parts[1]) if len(parts) == 2 else None


def room_violations(graph: ImportGraph, *, package: str = "witcert_calculus",
                    faces: dict[str, str] = FACES, rooms: frozenset[str] = ROOMS,
                    allowed: dict[str, frozenset[str]] = ALLOWED,
                    exceptions: dict[tuple[str, str], str] = EXCEPTIONS,
                    ) -> list[tuple[str, str]]:
    """Edges inside ``package`` from a room to one it may not import (exceptions excepted)."""
    bad: list[tuple[str, str]] = []
    for a, bs in graph.edges.items():
        if a.split(".")[0] != package:
            continue
        ra = room_of(a, package, faces, rooms)
        for b in bs:
            if b.split(".")[0] != package or (a, b) in exceptions:
                continue
            rb = room_of(b, package, faces, rooms)
            if ra == "face" or ra == rb:
                continue
            if ra is None or rb is None or rb not in allowed.get(ra, frozenset()):
                bad.append((a, b))
    return sorted(bad)


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


# ----------------------------------------------------------------------------- rooms

def test_every_library_module_is_a_face_or_in_a_room() -> None:
    """``ls witcert_calculus/`` shows the faces and the rooms, nothing else."""
    folder = ROOT / "witcert_calculus"
    top = sorted(p.stem for p in folder.glob("*.py") if p.name != "__init__.py")
    assert top == sorted(FACES), f"top-level modules that are not faces: {set(top) - set(FACES)}"
    subpackages = sorted(p.name for p in folder.iterdir()
                         if p.is_dir() and p.name != "__pycache__")
    assert subpackages == sorted(ROOMS), subpackages
    for room in ROOMS:
        assert (folder / room / "__init__.py").is_file(), room
    unplaced = [m for m in _graph().modules
                if m.split(".")[0] == "witcert_calculus" and room_of(m) is None]
    assert not unplaced, unplaced
    assert set(ALLOWED) == ROOMS | set(FACES.values())


def test_the_rooms_keep_their_rules() -> None:
    bad = room_violations(_graph())
    assert not bad, ("imports across the rooms' rules (see ALLOWED in tests/test_layout.py; "
                     f"move the code to the room it belongs to): {bad}")


def test_every_exception_is_still_needed() -> None:
    graph = _graph()
    stale = [e for e in EXCEPTIONS if e[1] not in graph.edges.get(e[0], set())]
    assert not stale, f"exceptions to the room rules that no longer occur: {stale}"


def test_the_leaves_are_imported_by_the_package_face_only() -> None:
    graph = _graph()
    for leaf in ("explore", "export"):
        importers = sorted(a for a, bs in graph.edges.items() for b in bs
                           if a.startswith("witcert_calculus.") and b.startswith("witcert_calculus.")
                           and room_of(b) == leaf and room_of(a) != leaf
                           and (a, b) not in EXCEPTIONS)
        assert not importers, (leaf, importers)


@pytest.mark.parametrize("a, b", [
    ("witcert_calculus.contracts", "witcert_calculus.meters.witness"),      # algebra -> meter
    ("witcert_calculus.meters.dither", "witcert_calculus.accounting.budget"),  # meter -> books
    ("witcert_calculus.drift.eprocess", "witcert_calculus.accounting.records"),
    ("witcert_calculus.accounting.state", "witcert_calculus.export.prometheus"),  # not a leaf
    ("witcert_calculus.numerics.rounding", "witcert_calculus.tiers"),       # bottom room
    ("witcert_calculus.meters.witness", "witcert_calculus"),                # the package face
    ("witcert_calculus.stray", "witcert_calculus.errors"),                  # a module in no room
])
def test_a_planted_room_violation_is_caught(a: str, b: str) -> None:
    graph = _graph()
    edges = {m: set(bs) for m, bs in graph.edges.items()}
    edges.setdefault(a, set()).add(b)
    planted = ImportGraph({**graph.modules, a: graph.modules.get(a, ROOT)}, edges)
    assert room_violations(planted) == [(a, b)]


def test_a_planted_room_tree_is_checked(tmp_path: Path) -> None:
    pkgs = _plant(tmp_path, {"lowpkg/__init__.py": "from lowpkg.meters.m import f\n",
                             "lowpkg/core.py": "from lowpkg.meters.m import f\n",
                             "lowpkg/meters/__init__.py": "",
                             "lowpkg/meters/m.py": "from lowpkg.core import g\nf = 1\n"})
    rules = dict(package="lowpkg", faces={"core": "algebra"}, rooms=frozenset({"meters"}),
                 allowed={"algebra": frozenset(), "meters": frozenset({"algebra"})},
                 exceptions={})
    assert room_violations(build_graph(pkgs), **rules) == [("lowpkg.core", "lowpkg.meters.m")]


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
    folder = ROOT / "witcert_calculus"
    missing = [p.relative_to(folder).as_posix() for p in sorted(folder.rglob("*.py"))
               if p.name != "__init__.py"
               and f"`witcert_calculus/{p.relative_to(folder).as_posix()}`" not in layout]
    assert not missing, f"README.md's layout table does not name: {missing}"
    for folder in ("kernels/witcert_kernels", "adapters/witcert_adapters"):
        names = [p.name for p in sorted((ROOT / folder).glob("*.py")) if p.name != "__init__.py"]
        row = next(ln for ln in layout.splitlines() if ln.startswith(f"| `{folder}`"))
        assert all(f"`{n}`" in row for n in names), (folder, names, row)
