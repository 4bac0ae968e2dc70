"""Audit the Lean sources of ``formal/`` without running Lean, and cross-check theorem discovery.

Called by ``scripts/lean_driver.py`` before anything is compiled, and runnable alone (fast, no
Lean process)::

    .venv/bin/python scripts/lean_audit.py            # audits ROOT/formal; exit 1 on a problem
    .venv/bin/python scripts/lean_audit.py --formal DIR --namespace NS

Four checks:

1. **Banned constructs** (:data:`RULES`; comments and string literals are ignored): anything that
   adds trust beyond the kernel (``sorry``/``admit``, ``axiom`` declarations, ``native_decide`` /
   ``decide +native`` / ``ofReduceBool`` / ``trustCompiler``, ``implemented_by``, ``extern``,
   ``unsafe``, ``opaque``, ``set_option debug.*`` such as ``debug.skipKernelTC``), anything that
   hides source from the checker (``#exit``), and meta code that could add declarations the
   audit cannot read (``elab``/``elab_rules``, ``macro``/``macro_rules``, ``syntax``,
   ``declare_syntax_cat``, ``run_cmd``/``run_elab``/``run_meta``, ``#eval``, ``initialize``,
   ``meta`` declarations or imports, ``addDecl``/``addAndCompile``, ``modifyEnv``/``setEnv``,
   ``Lean.Elab`` / ``CommandElabM``). Library modules import only modules of the project (so no
   ``import Lean``); the official-toolchain audit program (:data:`PROGRAMS`) may import ``Lean``
   to call ``Lean.collectAxioms``, but every other rule applies to it. ``#guard_msgs``,
   ``#check``, ``#print``, ``decide +kernel`` and ``deriving`` stay allowed; ``notation`` and
   ``infix``/``infixl``/``infixr``/``prefix``/``postfix`` are banned (a notation can print a
   statement as the honest one while it elaborates to another term, and the development
   declares none).
2. **Theorem discovery** (:func:`declared_theorems`): every non-private ``theorem`` under the
   namespace, robust to ``public``/``noncomputable``/``@[expose]`` sections, named sections,
   nested and dotted namespaces, ``mutual`` blocks, ``open ... in`` prefixes, stacked attributes
   and ``_root_`` names.
3. **Cross-check with Lean** (:func:`crosscheck`): the discovered names must be exactly the names
   of the export (``formal/build/theorems.json`` or the shipped
   ``witcert_calculus/lean/lean_export.json``) and, after a build, exactly the user-written theorems
   Lean itself stored in the compiled ``.olean.private`` files (:func:`olean_constants`, which
   reads Lean's own object files; generated lemmas such as ``eq_1`` or ``sizeOf_spec`` are set
   aside by :func:`is_generated`). The compiled files also must hold no ``axiom`` and no
   ``opaque`` constant of any name, and no constant whose type or value refers to a
   :data:`TRUST_CONSTANTS` constant (:func:`trust_leaks`, read from Lean's ``Expr`` trees).

4. **Axioms per theorem** (:func:`axiom_closure`): what each exported theorem's statement and
   proof reach through the project's compiled declarations, up to core's; the export records
   it, and only :data:`ALLOWED_AXIOMS` may be reached.

Main declarations: :data:`RULES`, :func:`strip_comments`, :func:`audit_sources`,
:func:`audit_tree`, :func:`declared_theorems`, :func:`olean_constants`, :func:`lean_theorems`,
:data:`ALLOWED_AXIOMS`, :func:`axiom_closure`, :func:`crosscheck`, :func:`main`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import struct
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Rule:
    """One banned construct: the name reported, the pattern, and why it is banned."""

    construct: str
    pattern: re.Pattern[str]
    why: str


_CORE_CLASS_WORDS = ("LE", "LT", "Max", "Min", "BEq", "Ord", "HasEquiv", "Dvd", "Add", "Sub",
                     "Mul", "Div", "Mod", "Neg", "Inv", "Pow", "HAdd", "HSub", "HMul", "HDiv",
                     "HMod", "HPow", "SMul", "HSMul", "OfNat", "OfScientific", "NatCast",
                     "IntCast", "RatCast", "Zero", "One", "Coe", "CoeTail", "CoeHead", "CoeOut",
                     "CoeSort", "CoeFun", "CoeDep", "CoeT", "CoeHTCT")
_CORE_TYPE_WORDS = ("Nat", "Int", "Rat", "Float", "Float32", "Bool", "Prop", "Fin", "UInt8",
                    "UInt16", "UInt32", "UInt64", "USize", "Char", "String")


def _word(word: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![\w']){re.escape(word)}(?![\w'!?])")


RULES: tuple[Rule, ...] = (
    Rule("sorry", _word("sorry"), "an unproved goal"),
    Rule("sorryAx", _word("sorryAx"), "an unproved goal"),
    Rule("admit", _word("admit"), "an unproved goal"),
    Rule("axiom", _word("axiom"), "an axiom declaration adds an unproved assumption"),
    Rule("native_decide", _word("native_decide"), "trusts the compiler"),
    Rule("decide +native", re.compile(r"\+native\b|\bnative[ \t]*:=[ \t]*true\b"),
         "trusts the compiler"),
    Rule("ofReduceBool", _word("ofReduceBool"), "trusts the compiler"),
    Rule("ofReduceNat", _word("ofReduceNat"), "trusts the compiler"),
    Rule("trustCompiler", _word("trustCompiler"), "trusts the compiler"),
    Rule("implemented_by", _word("implemented_by"), "replaces a definition's code"),
    Rule("extern", _word("extern"), "replaces a definition's code with foreign code"),
    Rule("unsafe", _word("unsafe"), "unsafe code is not checked by the kernel"),
    Rule("opaque", _word("opaque"), "an opaque constant hides its value"),
    Rule("set_option debug.*", re.compile(r"\bset_option[ \t]+debug\.[\w.]*"),
         "debug options (e.g. debug.skipKernelTC) switch kernel checks off"),
    Rule("debug.skipKernelTC", _word("debug.skipKernelTC"), "skips the kernel's type check"),
    Rule("allowUnsafeReducibility", _word("allowUnsafeReducibility"),
         "unsafe reducibility changes"),
    Rule("#exit", re.compile(r"(?<![\w'])#exit\b"), "the rest of the file would not be checked"),
    Rule("#eval", re.compile(r"(?<![\w'])#eval!?(?![\w'])"),
         "meta code run at elaboration can add declarations"),
    Rule("run_cmd", _word("run_cmd"), "meta code run at elaboration can add declarations"),
    Rule("run_elab", _word("run_elab"), "meta code run at elaboration can add declarations"),
    Rule("run_meta", _word("run_meta"), "meta code run at elaboration can add declarations"),
    Rule("elab", _word("elab"), "a custom elaborator can add declarations"),
    Rule("elab_rules", _word("elab_rules"), "a custom elaborator can add declarations"),
    Rule("macro", _word("macro"), "a macro can expand to hidden declarations"),
    Rule("macro_rules", _word("macro_rules"), "a macro can expand to hidden declarations"),
    Rule("syntax", _word("syntax"), "new syntax drives macros or elaborators"),
    Rule("declare_syntax_cat", _word("declare_syntax_cat"),
         "new syntax drives macros or elaborators"),
    Rule("initialize", re.compile(r"(?<![\w'])(?:builtin_)?initialize(?![\w'!?])"),
         "initialisation code runs meta code"),
    Rule("meta", _word("meta"), "meta declarations and imports run at elaboration"),
    Rule("addDecl", _word("addDecl"), "adds a declaration from meta code"),
    Rule("addAndCompile", _word("addAndCompile"), "adds a declaration from meta code"),
    Rule("modifyEnv", _word("modifyEnv"), "changes the environment from meta code"),
    Rule("setEnv", _word("setEnv"), "changes the environment from meta code"),
    Rule("Lean.Elab", re.compile(r"(?<![\w'.])(?:Lean\.)?Elab\.[\w.]+"),
         "elaborator internals (Lean.Elab.Command and friends) can add declarations"),
    Rule("CommandElabM", _word("CommandElabM"), "command elaboration can add declarations"),
    Rule("notation", _word("notation"),
         "a notation can make a statement print as the honest one while it elaborates to "
         "another term"),
    Rule("infix/prefix/postfix", re.compile(r"(?<![\w'.])(?:infixl|infixr|infix|prefix|postfix)"
                                            r"(?![\w'!?])"),
         "an operator notation can make a statement print as the honest one while it "
         "elaborates to another term"),
    Rule("instance on a core type", re.compile(
        r"(?<![\w'])instance(?![\w'])[^\n]*?:\s*(?:" + "|".join(sorted(_CORE_CLASS_WORDS))
        + r")\s+(?:" + "|".join(sorted(_CORE_TYPE_WORDS)) + r")(?![\w'])"),
         "a core class on a core type changes what a statement's symbols mean"),
)
"""The banned constructs, checked in every ``.lean`` file (comments and strings removed). A
keyword is banned wherever it stands as a word, not only at a line's start: after ``open X in``
or ``set_option o v in``, or after another command on the same line."""

# A literal each rule's matches contain: a substring test skips most regex scans.
_NEEDLES = {"instance on a core type": "instance", "axiom": "axiom", "decide +native": "native",
            "set_option debug.*": "debug.", "initialize": "initialize", "meta": "meta",
            "Lean.Elab": "Elab.", "infix/prefix/postfix": "fix"}

PROGRAMS = frozenset({"AxiomAudit"})
"""Modules that are programs, not part of the library: they may ``import Lean`` (the audit
program calls ``Lean.collectAxioms``); every rule of :data:`RULES` still applies to them."""

IMPORT = re.compile(r"^[ \t]*(?:public[ \t]+)?(?:meta[ \t]+)?import[ \t]+(\S+)", re.MULTILINE)


_SPECIAL = re.compile(r"/-|-/|--|(?<![\w'.])r#*\"|\"|(?<![\w'.])'(?:\\.|[^\\\n])'|\n")


def strip_comments(text: str) -> str:
    """Remove Lean comments (nested block comments included) and string literals.

    Line breaks are kept, so line numbers of the result are those of the source. A string
    becomes ``""``, a character literal (such as ``'"'``) becomes ``' '``.
    """
    out: list[str] = []
    depth, pos, n = 0, 0, len(text)
    while pos < n:
        m = _SPECIAL.search(text, pos)
        if m is None:
            if not depth:
                out.append(text[pos:])
            break
        tok, start = m.group(), m.start()
        if depth:
            out.append("\n" * text.count("\n", pos, start))
            if tok == "/-":
                depth += 1
            elif tok == "-/":
                depth -= 1
                if not depth:
                    out.append(" ")  # a comment separates tokens
            elif tok == "\n":
                out.append("\n")
            pos = start + (len(tok) if tok in ("/-", "-/", "\n") else 1)
            continue
        out.append(text[pos:start])
        if tok == "/-":
            depth, pos = 1, start + 2
        elif tok == "--":
            j = text.find("\n", start)
            pos = n if j < 0 else j
        elif tok.startswith("r"):  # a raw string r"..." or r#"..."#: no escapes inside
            close = '"' + "#" * (len(tok) - 2)
            j = text.find(close, m.end())
            j = n if j < 0 else j
            out.append('""' + "\n" * text.count("\n", start, j))
            pos = j + len(close)
        elif tok == '"':
            j = start + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""' + "\n" * text.count("\n", start, j))
            pos = j + 1
        elif tok.startswith("'"):
            out.append("' '")
            pos = m.end()
        else:  # a newline, or a stray -/
            out.append(tok)
            pos = m.end()
    return "".join(out)


def module_name(formal: Path, f: Path) -> str:
    """``formal/WitCert/Contracts.lean`` -> ``WitCert.Contracts``."""
    return ".".join(f.relative_to(formal).with_suffix("").parts)


def _line(code: str, pos: int) -> int:
    return code.count("\n", 0, pos) + 1


def audit_sources(files: Sequence[Path], *, formal: Path | None = None) -> list[str]:
    """One message ``FILE:LINE: forbidden `CONSTRUCT` (why)`` per banned construct found.

    Args:
        files: the Lean sources to audit.
        formal: the project folder; when given, imports are checked too: a library module
            imports only modules of the project (:data:`PROGRAMS` may also import ``Lean``).
    """
    problems: list[str] = []
    project: set[str] = ({module_name(formal, f) for f in files} if formal is not None
                         else set())
    for f in files:
        code = strip_comments(f.read_text(encoding="utf-8"))
        hits: list[tuple[int, str]] = []
        for rule in RULES:
            if _NEEDLES.get(rule.construct, rule.construct) not in code:
                continue
            for m in rule.pattern.finditer(code):
                hits.append((_line(code, m.start()),
                             f"forbidden `{rule.construct}` ({rule.why})"))
        if formal is not None:
            program = module_name(formal, f) in PROGRAMS
            for m in IMPORT.finditer(code):
                target = m.group(1)
                if target in project or (program and target == "Lean"):
                    continue
                hits.append((_line(code, m.start(1)),
                             f"forbidden `import {target}` (a library module imports only "
                             "modules of the project: outside modules bring meta code)"))
        problems += [f"{f}:{line}: {msg}" for line, msg in sorted(hits)]
    return problems


def lean_files(formal: Path) -> list[Path]:
    """Every ``.lean`` source of the project (build outputs and ``.lake`` excluded)."""
    build = formal / "build"
    return sorted(p for p in formal.rglob("*.lean")
                  if build not in p.parents and ".lake" not in p.parts)


def audit_tree(formal: Path) -> list[str]:
    """:func:`audit_sources` on every source of the project folder, imports included."""
    return audit_sources(lean_files(formal), formal=formal)


# ----------------------------------------------------------------------------- discovery

_NAME = r"(?:«[^»]*»|[^\s(:{\[«»]+)(?:\.(?:«[^»]*»|[^\s.(:{\[«»]+))*"
_PREFIX = re.compile(r"^\s*(?:(?:open|set_option|variable|universe|attribute)\b[^\n]*?\bin\s+)+")
_ATTRS = re.compile(r"^\s*(?:@\[[^\]]*\]\s*)+")
_CMD_TOKEN = re.compile(r"^\s*((?:(?:public|private|protected|noncomputable|nonrec|partial|unsafe)"
                        r"\s+)*)(namespace|section|mutual|end|theorem)\b\s*(" + _NAME + ")?")


def _unquote(name: str) -> list[str]:
    parts = re.findall(r"«[^»]*»|[^.]+", name)
    return [p[1:-1] if p.startswith("«") else p for p in parts]


_PLAIN = re.compile(r"^[^\W\d][\w'!?₀-₉ₐ-ₜᵢ-ᵪⱼ]*$")


def render_name(parts: Sequence[str]) -> str:
    """A name as Lean prints it: components that are not plain identifiers in ``«»``."""
    return ".".join(p if _PLAIN.match(p) or p.isdigit() else f"«{p}»" for p in parts)


def declared_theorems(formal: Path, files: Iterable[Path], namespace: str = "WitCert"
                      ) -> list[tuple[str, str]]:
    """Every non-private ``theorem`` of the ``namespace``, as (full name, module), in source order.

    Handles ``namespace A.B`` / ``end A.B``, named and anonymous sections (``public section``,
    ``noncomputable section``, ``@[expose] public section``), ``mutual ... end``, ``open X in``
    prefixes, attributes before modifiers, and ``_root_.`` names.
    """
    found: list[tuple[str, str]] = []
    for f in files:
        code = strip_comments(f.read_text(encoding="utf-8"))
        stack: list[list[str]] = []
        for line in code.splitlines():
            line = _PREFIX.sub("", line)
            line = _ATTRS.sub("", line)
            m = _CMD_TOKEN.match(line)
            if not m:
                continue
            mods, kw, arg = m.group(1).split(), m.group(2), m.group(3) or ""
            if kw == "namespace":
                stack.append(_unquote(arg))
            elif kw in ("section", "mutual"):
                stack.append([])
            elif kw == "end":
                if stack:
                    stack.pop()
            elif "private" not in mods and arg:
                parts = _unquote(arg)
                if parts[0] == "_root_":
                    full = parts[1:]
                else:
                    full = [p for scope in stack for p in scope] + parts
                name = render_name(full)
                if name.startswith(namespace + "."):
                    found.append((name, module_name(formal, f)))
    return found


# ----------------------------------------------------------------------------- Lean's .olean files

_KINDS = ("axiom", "def", "theorem", "opaque", "quot", "inductive", "ctor", "rec")
_ARRAY, _STRING = 246, 249


class OleanError(ValueError):
    """An ``.olean`` file this reader does not understand."""


class _Regions:
    """The compacted regions of one module's ``.olean`` files, mapped at their base addresses."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self.regions: list[tuple[int, bytes]] = []
        for p in paths:
            data = p.read_bytes()
            if data[:5] != b"olean":
                raise OleanError(f"{p}: not an .olean file")
            # Header: "olean", version, flags, 33 bytes of Lean version, 40 of githash, then
            # the base address. The wasm Lean is 32-bit: 4-byte pointers and size_t.
            self.regions.append((struct.unpack_from("<I", data, 80)[0], data))
        self.root = struct.unpack_from("<I", self.regions[-1][1], 84)[0]

    def _at(self, ptr: int) -> tuple[bytes, int]:
        for base, data in self.regions:
            if base <= ptr < base + len(data):
                return data, ptr - base
        raise OleanError(f"pointer {ptr:#x} outside the module's regions")

    def fields(self, ptr: int) -> tuple[int, list[int]]:
        data, o = self._at(ptr)
        _rc, _cs, n, tag = struct.unpack_from("<iHBB", data, o)
        return tag, [struct.unpack_from("<I", data, o + 8 + 4 * i)[0] for i in range(n)]

    def array(self, ptr: int) -> list[int]:
        data, o = self._at(ptr)
        if data[o + 7] != _ARRAY:
            raise OleanError("expected an array")
        size = struct.unpack_from("<I", data, o + 8)[0]
        return [struct.unpack_from("<I", data, o + 16 + 4 * i)[0] for i in range(size)]

    def string(self, ptr: int) -> str:
        data, o = self._at(ptr)
        if data[o + 7] != _STRING:
            raise OleanError("expected a string")
        size = struct.unpack_from("<I", data, o + 8)[0]
        return data[o + 20:o + 20 + size - 1].decode("utf-8")

    def name(self, ptr: int) -> str:
        parts: list[str] = []
        while ptr != 1:  # Name.anonymous is the boxed scalar 0
            tag, f = self.fields(ptr)
            parts.append(self.string(f[1]) if tag == 1 else str(f[1] >> 1))
            ptr = f[0]
        return render_name(parts[::-1])


_LAM, _MDATA, _PROJ = 6, 10, 11  # Expr constructor tags


def _is_projection(mem: _Regions, value: int) -> bool:
    """Whether a value is ``fun ... self => self.i`` (how Lean defines a structure field)."""
    for _ in range(256):
        if value & 1:
            return False
        tag, f = mem.fields(value)
        if tag == _PROJ:
            return True
        if tag not in (_LAM, _MDATA):
            return False
        value = f[2] if tag == _LAM else f[1]
    return False


def _module_constants(olean: Path) -> list[tuple[str, str, _Regions, list[int]]]:
    """(kind, name, regions, fields of the constant's value record) of every constant a
    compiled module declares; see :func:`olean_constants`."""
    paths = [olean, olean.with_name(olean.name + ".server"),
             olean.with_name(olean.name + ".private")]
    try:
        mem = _Regions([p for p in paths if p.exists()])
        _tag, module_data = mem.fields(mem.root)
        out: list[tuple[str, str, _Regions, list[int]]] = []
        for c in mem.array(module_data[2]):
            kind, cf = mem.fields(c)
            _t, val = mem.fields(cf[0])
            _t, constant_val = mem.fields(val[0])
            name = _KINDS[kind] if kind < len(_KINDS) else str(kind)
            if name == "theorem" and _is_projection(mem, val[1]):
                name = "field"
            out.append((name, mem.name(constant_val[0]), mem, val))
        return out
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise OleanError(f"{olean}: unreadable ({exc})") from None


def olean_constants(olean: Path) -> list[tuple[str, str]]:
    """(kind, name) of every constant a compiled module declares, as Lean stored it.

    Reads ``X.olean`` with ``X.olean.server`` and ``X.olean.private`` (the module system's
    three levels; the private level holds the full declarations, theorems as theorems). The
    root object is Lean's ``ModuleData``: its third field is the array of ``ConstantInfo``.
    Kinds: ``axiom``, ``def``, ``theorem``, ``opaque``, ``quot``, ``inductive``, ``ctor``,
    ``rec``, and ``field`` for a theorem that is a structure's proof field (its value is a
    projection). Only the 32-bit layout of the WebAssembly Lean is read.

    Raises:
        OleanError: if the files are not in the expected format.
    """
    return [(kind, name) for kind, name, _mem, _val in _module_constants(olean)]


_CONST, _APP, _PI, _LET = 4, 5, 7, 8
_WITH_VALUE = ("def", "theorem", "field", "opaque")


def _used_constants(mem: _Regions, roots: Iterable[int]) -> set[str]:
    """The names of the ``Expr.const`` nodes reachable from the given expressions."""
    used: set[str] = set()
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        ptr = stack.pop()
        if ptr & 1 or ptr in seen:  # a boxed scalar, or a shared subterm already visited
            continue
        seen.add(ptr)
        tag, f = mem.fields(ptr)
        if tag == _CONST:
            used.add(mem.name(f[0]))
        elif tag == _APP:
            stack += (f[0], f[1])
        elif tag in (_LAM, _PI):
            stack += (f[1], f[2])
        elif tag == _LET:
            stack += (f[1], f[2], f[3])
        elif tag == _MDATA:
            stack.append(f[1])
        elif tag == _PROJ:
            stack.append(f[2])
    return used


TRUST_CONSTANTS = frozenset({"sorryAx", "Lean.ofReduceBool", "Lean.ofReduceNat",
                             "Lean.trustCompiler"})
"""Core constants whose use adds trust beyond the kernel: an unproved goal (``sorry``) or the
compiler's evaluation (``native_decide``, ``decide +native``)."""


ALLOWED_AXIOMS = ("propext", "Classical.choice", "Quot.sound")
"""The only axioms an exported theorem may rest on: Lean's three standard axioms."""

_KNOWN_AXIOMS = frozenset(ALLOWED_AXIOMS) | TRUST_CONSTANTS


def axiom_closure(olean_dir: Path, modules: Iterable[str], names: Iterable[str]
                  ) -> dict[str, tuple[list[str], int]]:
    """Per theorem of ``names``: the axioms its statement and proof reach through the
    project's own compiled declarations, and how many core declarations they reach.

    Every constant the modules compiled is followed through its type and value (Lean's own
    ``Expr`` trees, :func:`olean_references`); a constant they do not declare is core's, where
    the walk stops. Core's axioms are known by name (:data:`ALLOWED_AXIOMS` and
    :data:`TRUST_CONSTANTS`); any other axiom is a project constant and appears here by its own
    name. Core's theorems are not followed: the WebAssembly Lean's library holds them without
    their proofs (as axioms in the public ``.olean`` files), so what they rest on is listed only
    by an official toolchain (``Lean.collectAxioms``).

    Returns:
        ``{name: (sorted axioms, number of core declarations reached)}``.

    Raises:
        OleanError: if a file is not in the expected format.
    """
    refs: dict[str, set[str]] = {}
    kinds: dict[str, str] = {}
    for module in modules:
        for kind, name, used in _module_references(_olean_path(olean_dir, module)):
            refs[name] = used
            kinds[name] = kind
    out: dict[str, tuple[list[str], int]] = {}
    for name in names:
        seen: set[str] = set()
        stack = [name]
        axioms: set[str] = set()
        core = 0
        while stack:
            c = stack.pop()
            if c in seen:
                continue
            seen.add(c)
            if c in refs:
                if kinds.get(c) == "axiom":
                    axioms.add(c)
                stack.extend(refs[c])
            elif c in _KNOWN_AXIOMS:
                axioms.add(c)
            else:
                core += 1
        out[name] = (sorted(axioms), core)
    return out


def olean_references(olean: Path) -> dict[str, set[str]]:
    """Per constant a compiled module declares, the constants its type and value refer to
    (read from Lean's own ``Expr`` trees in the ``.olean`` files).

    Raises:
        OleanError: if the files are not in the expected format.
    """
    return {name: refs for _kind, name, refs in _module_references(olean)}


def _module_references(olean: Path) -> list[tuple[str, str, set[str]]]:
    """(kind, name, referenced constants) of every constant a compiled module declares."""
    try:
        out: list[tuple[str, str, set[str]]] = []
        for kind, name, mem, val in _module_constants(olean):
            _t, constant_val = mem.fields(val[0])
            roots = [constant_val[2]] + ([val[1]] if kind in _WITH_VALUE else [])
            out.append((kind, name, _used_constants(mem, roots)))
        return out
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise OleanError(f"{olean}: unreadable ({exc})") from None


_GENERATED_LAST = re.compile(r"^(?:eq_\d+|eq_def|else_eq|sizeOf_spec|ofNat_ctorIdx|inj|injEq|"
                             r"ext|ext_iff|congr_simp|fun_cases|induct|mutual_induct|"
                             r"proof_\d+|match_\d+|splitter)$")


def is_generated(name: str) -> bool:
    """True for a theorem Lean generates rather than the source states.

    Internal names (a component starting with ``_``: ``_private``, ``_proof_1``,
    ``_sparseCasesOn``), equation lemmas (``eq_1``, ``eq_def``), structure and inductive lemmas
    (``sizeOf_spec``, ``injEq``, ``ofNat_ctorIdx``) and the like.
    """
    parts = name.split(".")
    return any(p.startswith("_") for p in parts) or bool(_GENERATED_LAST.match(parts[-1]))


def lean_theorems(olean_dir: Path, modules: Iterable[str], namespace: str = "WitCert"
                  ) -> dict[str, list[tuple[str, str]]]:
    """Per kind, the (name, module) of the namespace's constants Lean compiled into ``olean_dir``.

    Returns ``{"theorem": [...], "axiom": [...], "opaque": [...]}``; theorems exclude
    structure fields (kind ``field``) but not :func:`is_generated` names. Axioms and opaque
    constants are listed whatever their name (a root-level ``axiom`` too).
    """
    out: dict[str, list[tuple[str, str]]] = {"theorem": [], "axiom": [], "opaque": []}
    for module in modules:
        for kind, name in olean_constants(_olean_path(olean_dir, module)):
            if kind == "theorem" and name.startswith(namespace + "."):
                out["theorem"].append((name, module))
            elif kind in ("axiom", "opaque"):
                out[kind].append((name, module))
    return out


CORE_CLASSES = frozenset(_CORE_CLASS_WORDS)
"""Core classes whose instances give the symbols of a statement their meaning."""

CORE_TYPES = frozenset(_CORE_TYPE_WORDS)
"""Core types: their instances of :data:`CORE_CLASSES` are core's own."""


def _head_and_args(mem: _Regions, expr: int) -> tuple[str | None, list[int]]:
    """The head constant and the arguments of an expression under its binders (``∀ x, C a b``
    gives ``C`` and ``[a, b]``); ``None`` when the head is not a constant."""
    for _ in range(1024):
        if expr & 1:
            return None, []
        tag, f = mem.fields(expr)
        if tag == _PI:
            expr = f[2]
        elif tag == _MDATA:
            expr = f[1]
        else:
            break
    args: list[int] = []
    while not expr & 1:
        tag, f = mem.fields(expr)
        if tag != _APP:
            break
        args.append(f[1])
        expr = f[0]
    if expr & 1:
        return None, []
    tag, f = mem.fields(expr)
    return (mem.name(f[0]) if tag == _CONST else None), args[::-1]


def core_instances(olean_dir: Path, modules: Iterable[str]) -> list[str]:
    """One message per compiled constant whose type is a :data:`CORE_CLASSES` class applied to
    a :data:`CORE_TYPES` type (``instance : LE Rat := ...``, however declared): a statement's
    ``≤`` on ``Rat`` must keep core's meaning."""
    problems: list[str] = []
    for module in modules:
        for kind, name, mem, val in _module_constants(_olean_path(olean_dir, module)):
            if kind not in _WITH_VALUE:
                continue
            _t, constant_val = mem.fields(val[0])
            head, args = _head_and_args(mem, constant_val[2])
            if head not in CORE_CLASSES:
                continue
            types = [t for t in (_head_and_args(mem, a)[0] for a in args) if t in CORE_TYPES]
            if types:
                problems.append(f"{module}: Lean compiled {name} : {head} {' '.join(types)}, "
                                "a core class on a core type (core's instance must decide "
                                "what a statement means)")
    return problems


def _olean_path(olean_dir: Path, module: str) -> Path:
    return olean_dir.joinpath(*module.split(".")).with_suffix(".olean")


def trust_leaks(olean_dir: Path, modules: Iterable[str]) -> list[str]:
    """One message per compiled constant of the modules whose type or value refers to a
    :data:`TRUST_CONSTANTS` constant (whatever the source looked like)."""
    problems: list[str] = []
    for module in modules:
        for name, used in olean_references(_olean_path(olean_dir, module)).items():
            for bad in sorted(used & TRUST_CONSTANTS):
                problems.append(f"{module}: Lean compiled {name}, which uses {bad}")
    return problems


def _diff(what: str, ours: Iterable[str], theirs: Iterable[str], source: str) -> list[str]:
    a, b = set(ours), set(theirs)
    problems: list[str] = []
    if a - b:
        problems.append(f"{what}: found in the sources but not in {source}: {sorted(a - b)}")
    if b - a:
        problems.append(f"{what}: in {source} but not found in the sources: {sorted(b - a)}")
    return problems


def crosscheck(formal: Path, *, namespace: str = "WitCert", exports: Sequence[Path] = (),
               olean_dir: Path | None = None) -> list[str]:
    """Compare the theorems discovered in the sources with what Lean produced.

    Args:
        formal: the project folder.
        namespace: the exported namespace.
        exports: export files (``theorems.json`` / ``lean_export.json``) whose names must be
            exactly the discovered ones; missing files are skipped.
        olean_dir: the build's ``.olean`` folder; when given, the user-written theorems Lean
            compiled must be exactly the discovered ones (private ones aside), no axiom or
            opaque constant of any name may be compiled, and no compiled constant may use a
            :data:`TRUST_CONSTANTS` constant (:func:`trust_leaks`), and no compiled value may
            be an instance of a core class on a core type (:func:`core_instances`).
    """
    files = [f for f in lean_files(formal) if module_name(formal, f) not in PROGRAMS]
    declared = declared_theorems(formal, files, namespace)
    names = [n for n, _ in declared]
    problems: list[str] = []
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        problems.append(f"theorem names declared twice: {dupes}")
    for path in exports:
        if not path.exists():
            continue
        doc = json.loads(path.read_text(encoding="utf-8"))
        problems += _diff("theorem discovery", names, (t["name"] for t in doc["theorems"]),
                          str(path))
    if olean_dir is not None:
        modules = sorted({module_name(formal, f) for f in files})
        lean = lean_theorems(olean_dir, modules, namespace)
        known = set(names)
        user = (n for n, _ in lean["theorem"] if n in known or not is_generated(n))
        problems += _diff("theorem discovery", names, user,
                          f"the theorems Lean compiled into {olean_dir}")
        for kind in ("axiom", "opaque"):
            for n, m in lean[kind]:
                problems.append(f"{m}: Lean compiled the {kind} constant {n}")
        problems += trust_leaks(olean_dir, modules)
        problems += core_instances(olean_dir, modules)
    return problems


def build_is_current(formal: Path) -> bool:
    """Whether ``formal/build/theorems.json`` was built from the sources as they are now."""
    export = formal / "build" / "theorems.json"
    if not export.exists():
        return False
    recorded = json.loads(export.read_text(encoding="utf-8")).get("sources")
    current = {str(p.relative_to(formal.parent)): hashlib.sha256(p.read_bytes()).hexdigest()
               for p in lean_files(formal) if module_name(formal, p) not in PROGRAMS}
    return bool(recorded == current)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: audit a project folder and cross-check discovery; exit code 1 on a problem."""
    root = Path(__file__).resolve().parents[1]
    ap = argparse.ArgumentParser(description="Audit formal/ without running Lean.")
    ap.add_argument("--formal", type=Path, default=root / "formal")
    ap.add_argument("--namespace", default="WitCert")
    ap.add_argument("--no-crosscheck", action="store_true",
                    help="only the source audit (no comparison with exports or .olean files)")
    args = ap.parse_args(argv)
    formal: Path = args.formal.resolve()
    problems = audit_tree(formal)
    if not args.no_crosscheck:
        exports: list[Path] = []
        if formal == root / "formal":
            exports.append(root / "witcert_calculus" / "lean" / "lean_export.json")
        current = build_is_current(formal)
        if current:
            exports.append(formal / "build" / "theorems.json")
        else:
            print("lean-audit: no current build (formal/build/theorems.json is missing or "
                  "older than the sources): the build's export and .olean files are not "
                  "compared")
        problems += crosscheck(formal, namespace=args.namespace, exports=exports,
                               olean_dir=formal / "build" / "olean" if current else None)
    if problems:
        print("lean-audit: FAILED:\n  " + "\n  ".join(problems))
        return 1
    print(f"lean-audit: ok ({len(lean_files(formal))} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
