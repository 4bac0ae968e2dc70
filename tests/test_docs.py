"""Every runnable example in the package's docstrings runs and prints what it says."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import witcert_calculus

#: Every module of the package, the rooms' modules included (``meters.witness``, ...).
MODULES = sorted(m.name.removeprefix("witcert_calculus.")
                 for m in pkgutil.walk_packages(witcert_calculus.__path__, "witcert_calculus."))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(f"witcert_calculus.{name}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
