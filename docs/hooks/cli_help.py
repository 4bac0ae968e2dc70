"""MkDocs hook: the CLI reference is the ``--help`` text of the ``witcert`` parser, at build time.

``docs/cli.md`` holds the marker ``<!-- witcert-cli-help -->``; this hook replaces it with the
help of the top-level parser of :func:`witcert_adapters.cli.build_parser` and of every
subcommand found on it, nested ones (``witcert ledger replay``) by recursion, each under its
own heading. Nothing is written by hand, so a new command appears on the page the next time
the site is built. The help is formatted at a fixed width with colour off, so the page does
not depend on the terminal that builds it.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

MARKER = "<!-- witcert-cli-help -->"
WIDTH = 88
ROOT = Path(__file__).resolve().parents[2]


def subcommands(parser: argparse.ArgumentParser, *, path: tuple[str, ...] = ("witcert",)
                ) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """``parser`` and every parser below it, depth first, with the words that reach each."""
    yield path, parser
    seen: set[int] = set()
    for action in parser._actions:  # argparse has no public accessor for its subparsers
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if id(sub) in seen:  # an alias of a command listed already
                    continue
                seen.add(id(sub))
                yield from subcommands(sub, path=(*path, name))


@contextmanager
def _fixed_terminal() -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in ("COLUMNS", "NO_COLOR", "PYTHON_COLORS")}
    os.environ.update(COLUMNS=str(WIDTH), NO_COLOR="1", PYTHON_COLORS="0")
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def help_text(parser: argparse.ArgumentParser) -> str:
    """``parser``'s help at :data:`WIDTH` columns, whatever formatter class it uses."""
    cls = parser.formatter_class
    parser.formatter_class = lambda prog: cls(prog, width=WIDTH)  # type: ignore[misc,assignment]
    try:
        with _fixed_terminal():
            return parser.format_help().rstrip()
    finally:
        parser.formatter_class = cls


def _parser() -> argparse.ArgumentParser:
    for folder in (ROOT, ROOT / "adapters", ROOT / "kernels"):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    from witcert_adapters.cli import build_parser

    return build_parser()


def cli_reference() -> str:
    """The markdown that replaces the marker: one heading and help block per command."""
    commands = list(subcommands(_parser()))
    if len(commands) < 2:
        raise RuntimeError("witcert_adapters.cli.build_parser() has no subcommands")
    blocks = []
    for path, parser in commands:
        name = " ".join(path)
        level = "#" * min(len(path) + 1, 6)
        blocks.append(f"{level} `{name}`\n\n```text\n{help_text(parser)}\n```\n")
    return "\n".join(blocks)


def on_page_markdown(markdown: str, *, page: Any, config: Any, files: Any) -> str:
    """Replace the marker of ``cli.md`` with the generated reference."""
    if page.file.src_uri != "cli.md":
        return markdown
    if MARKER not in markdown:
        raise RuntimeError(f"docs/cli.md lost its marker {MARKER}")
    return markdown.replace(MARKER, cli_reference())
