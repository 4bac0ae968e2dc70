"""The documentation site builds with ``mkdocs build --strict``, and its generated pages are complete.

One strict build (module-scoped): every griffe docstring warning, broken link or missing
page fails it. The CLI reference is generated at build time by ``docs/hooks/cli_help.py``;
the test walks the parser of ``witcert_adapters.cli.build_parser()`` on its own and requires
every command, nested ones included, on the built page, so the reference cannot silently
drop one. Every module of the three packages has an API entry (``::: module``).
"""

from __future__ import annotations

import argparse
import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from witcert_adapters.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"witcert_calculus": ROOT / "witcert_calculus",
            "witcert_kernels": ROOT / "kernels" / "witcert_kernels",
            "witcert_adapters": ROOT / "adapters" / "witcert_adapters"}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    return out


def _text(page: Path) -> str:
    """A built page's text: tags stripped, entities decoded."""
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text(encoding="utf-8")))


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ("witcert",)
              ) -> list[tuple[str, ...]]:
    found = [path]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _commands(sub, (*path, name))
    return found


@pytest.mark.slow  # the strict mkdocs build (module-scoped, tens of seconds)
def test_the_site_builds_strictly(site: Path) -> None:
    for page in ("index.html", "cli/index.html", "faq/index.html", "tutorial/index.html",
                 "api/library/contracts/index.html"):
        assert (site / page).is_file(), f"{page} was not built"


@pytest.mark.slow  # the strict mkdocs build (module-scoped, tens of seconds)
def test_the_cli_page_holds_every_command(site: Path) -> None:
    text = _text(site / "cli" / "index.html")
    assert "witcert-cli-help" not in (site / "cli" / "index.html").read_text(encoding="utf-8")
    commands = _commands(build_parser())
    assert any(len(c) > 2 for c in commands), "the parser has no nested command to check"
    missing = [" ".join(c) for c in commands if f"usage: {' '.join(c)}" not in text]
    assert not missing, f"the CLI reference lacks the help of: {missing}"


def test_every_module_has_an_api_entry() -> None:
    documented = {m.group(1) for page in (ROOT / "docs" / "api").rglob("*.md")
                  for m in re.finditer(r"^::: ([\w.]+)", page.read_text(encoding="utf-8"), re.M)}
    modules = set()
    for name, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = [name, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__main__":
                continue
            if parts[-1] == "__init__":
                parts.pop()
            modules.add(".".join(parts))
    missing = sorted(modules - documented)
    assert not missing, f"modules without an API entry under docs/api/: {missing}"
