"""Every number stated in prose comes from code: the registry ``docs/claims.toml`` says which
code, and this test evaluates it.

Scanned: ``README.md``, every ``docs/**/*.md`` page and the markdown cells of every
``notebooks/*.ipynb``. Outside fenced code blocks, inline code spans and HTML comments, each
decimal number and each percentage must be registered for its file; each registered claim
must still appear in its file, and its expression, formatted, must equal its text.
"""

from __future__ import annotations

import importlib
import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = ROOT / "docs" / "claims.toml"

FENCE = re.compile(r"^\s*```.*?^\s*```", re.S | re.M)
CODE = re.compile(r"`[^`\n]*`")
COMMENT = re.compile(r"<!--.*?-->", re.S)
#: A decimal number (``0.2``, ``1e-6``, ``2.06%``) or a percentage, not part of a word, a
#: version (``0.5.23``) or a longer number.
NUMBER = re.compile(r"(?<![\w.\-])(\d+\.\d+(?:[eE]-?\d+)?%?|\d+(?:[eE]-\d+)%?|\d+%)(?![\w.]*\d)")


def prose(text: str) -> str:
    """The text with code blocks, code spans and comments blanked out."""
    return CODE.sub(" ", FENCE.sub(" ", COMMENT.sub(" ", text)))


def documents() -> dict[str, str]:
    """Every scanned document, by its path relative to the repository, as markdown."""
    out = {"README.md": (ROOT / "README.md").read_text(encoding="utf-8")}
    for page in sorted((ROOT / "docs").rglob("*.md")):
        out[page.relative_to(ROOT).as_posix()] = page.read_text(encoding="utf-8")
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
        out[nb.relative_to(ROOT).as_posix()] = "\n\n".join(
            "".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    return out


def claims() -> list[dict[str, Any]]:
    return list(tomllib.loads(REGISTRY.read_text(encoding="utf-8"))["claim"])


def numbers_in(text: str) -> list[str]:
    return [m.group(1) for m in NUMBER.finditer(prose(text))]


def _namespace() -> dict[str, Any]:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return {"import_module": importlib.import_module, "project": meta["project"], "ROOT": ROOT}


@pytest.mark.parametrize("claim", claims(), ids=lambda c: f"{c['file']}:{c['text']}")
def test_each_claim_is_what_its_code_computes(claim: dict[str, Any]) -> None:
    value = eval(claim["expr"], _namespace())  # the registry is repository code
    assert claim["format"].format(value) == claim["text"], (
        f"{claim['file']} states {claim['text']}, but {claim['expr']} gives {value!r}")


def test_each_claim_still_appears_in_its_file() -> None:
    docs = documents()
    for c in claims():
        assert c["file"] in docs, f"{c['file']} is not a scanned document"
        assert c["text"] in numbers_in(docs[c["file"]]), (
            f"{c['text']} no longer appears in the prose of {c['file']}: drop its claim")


def test_every_number_in_prose_is_registered() -> None:
    registered: dict[str, set[str]] = {}
    for c in claims():
        registered.setdefault(c["file"], set()).add(c["text"])
    loose = [(name, n) for name, text in documents().items() for n in numbers_in(text)
             if n not in registered.get(name, set())]
    assert not loose, ("numbers stated in prose without a claim in docs/claims.toml "
                       f"(compute them, or move them into code): {loose}")


def test_the_guard_sees_a_typed_in_number() -> None:
    planted = "The cache is safe at 0.5 TV, see `0.25` and\n```text\n0.75\n```\n(2.06%)."
    assert numbers_in(planted) == ["0.5", "2.06%"]
    assert numbers_in("version 0.5.23, Python 3.11, fp16") == ["3.11"]
