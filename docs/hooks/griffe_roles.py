"""Griffe extension: the package docstrings' conventions, read as the google style expects.

Once the object tree is built, three rewrites run on every docstring (the sources stay as
they are):

- Sphinx-style roles (``:class:`X```, ``:func:``, ``:mod:``, ...), which Markdown would print
  literally, become code spans wrapped in an *optional* cross-reference: a link to the
  object's API entry when the site renders it, plain code otherwise (an optional reference
  never fails the strict build). A leading ``~`` shows the last component only, as in
  Sphinx; a relative target (``Contract``, ``.config``) is resolved from the object's scope.
- ``Example:`` headers become ``Examples:``, the section the google parser reads as
  doctest examples (a lone ``Example:`` would be an admonition of plain Markdown).
- An argument entry that documents several parameters at once (``m, c: ...`` or
  ``a / b: ...``) becomes one entry per parameter with the same description, so each is
  matched against the signature (and a documented name that is not a parameter still
  warns).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(
    r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj|const|type):`(?P<tilde>~?)"
    r"(?P<target>[\w.]+(?:[ ]*\n[ ]*[\w.]+)*)`")  # a target may wrap at a dot
PACKAGES = ("witcert_calculus", "witcert_kernels", "witcert_adapters")


def _resolve(obj: griffe.Object, target: str) -> str | None:
    """The full path ``target`` names from ``obj``'s scope, or ``None`` when it is outside."""
    if target.startswith("."):  # relative to the enclosing package
        mod = obj.module
        base = mod if mod.is_init_module else (mod.parent or mod)
        rest = target.lstrip(".")
        for _ in range(len(target) - len(rest) - 1):
            base = base.parent or base
        return f"{base.path}.{rest}"
    if target.split(".")[0] in PACKAGES:
        return target
    head = target.split(".")[0]
    scope: griffe.Object | None = obj
    while scope is not None:
        member = scope.members.get(head)
        if member is not None:
            path = member.target_path if member.is_alias else member.path
            return ".".join([path, *target.split(".")[1:]])
        scope = scope.parent
    return None


def convert(obj: griffe.Object, text: str) -> str:
    """``text`` with every role replaced by an optional cross-reference around a code span."""

    def one(m: re.Match[str]) -> str:
        target = re.sub(r"\s+", "", m["target"])
        shown = target.lstrip(".").rsplit(".", 1)[-1] if m["tilde"] else target.lstrip(".")
        ident = _resolve(obj, target)
        if ident is None or not ident.startswith(PACKAGES):
            return f"`{shown}`"
        return f'<autoref identifier="{ident}" optional>`{shown}`</autoref>'

    return ROLE.sub(one, text)


EXAMPLE = re.compile(r"^(?P<indent>[ ]*)Example:[ ]*$", re.M)
ARGS_HEADER = re.compile(r"^(?P<indent>[ ]*)(?:Args|Arguments|Parameters|Attributes):[ ]*$")
SHARED = re.compile(r"^(?P<indent>[ ]+)(?P<names>\*{0,2}\w+(?:[ ]*[,/][ ]*\*{0,2}\w+)+)[ ]*:(?P<rest>.*)$")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def split_shared(text: str) -> str:
    """Expand each shared argument entry of the argument sections of ``text``."""
    lines = text.split("\n")
    out: list[str] = []
    i, section = 0, None  # section: the indentation of the current argument header
    while i < len(lines):
        line = lines[i]
        if (h := ARGS_HEADER.match(line)) is not None:
            section = len(h["indent"])
        elif line.strip() and section is not None and _indent(line) <= section:
            section = None
        m = SHARED.match(line) if section is not None else None
        if m is None:
            out.append(line)
            i += 1
            continue
        body = [m["rest"]]
        j = i + 1
        while j < len(lines) and (not lines[j].strip() or _indent(lines[j]) > len(m["indent"])):
            if not lines[j].strip() and (j + 1 >= len(lines)
                                         or _indent(lines[j + 1]) <= len(m["indent"])):
                break
            body.append("\n" + lines[j])
            j += 1
        for name in re.split(r"[ ]*[,/][ ]*", m["names"]):
            out.append(f"{m['indent']}{name}:" + "".join(body))
        i = j
    return "\n".join(out)


class SphinxRoles(griffe.Extension):
    """Rewrite every docstring once the package is loaded (see the module docstring)."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.is_alias or obj.docstring is None:
            return
        text = EXAMPLE.sub(lambda m: f"{m['indent']}Examples:", obj.docstring.value)
        obj.docstring.value = convert(obj, split_shared(text))
