"""The public face: sorted and complete ``__all__``, final classes, a light import."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
import typing

import pytest

import witcert_calculus

MODULES = ["errors", "metrics", "tiers", "contracts", "bridges", "ledger", "meters"]


def test_all_is_sorted_and_every_name_imports() -> None:
    names = witcert_calculus.__all__
    assert names == sorted(names)
    for name in names:
        assert getattr(witcert_calculus, name) is not None


@pytest.mark.parametrize("module", MODULES)
def test_public_face_re_exports_each_module(module: str) -> None:
    mod = importlib.import_module(f"witcert_calculus.{module}")
    assert mod.__all__ == sorted(mod.__all__), module
    # Constants (ALL_CAPS, e.g. theorem tables) stay in their module.
    public = [n for n in mod.__all__ if not n.isupper()]
    missing = [n for n in public if n not in witcert_calculus.__all__]
    assert not missing, f"{module} exports {missing} but the package does not"
    for name in public:
        assert getattr(witcert_calculus, name) is getattr(mod, name)


@pytest.mark.parametrize("module", MODULES)
def test_public_classes_are_final_or_abstract(module: str) -> None:
    mod = importlib.import_module(f"witcert_calculus.{module}")
    for name in mod.__all__:
        obj = getattr(mod, name)
        if not inspect.isclass(obj):
            continue
        final = getattr(obj, "__final__", False)
        base = obj in (witcert_calculus.Metric, witcert_calculus.Site) or \
            issubclass(obj, (Exception,)) and obj.__subclasses__()
        assert final or base, f"{module}.{name} is neither final nor an abstract base"


def test_docstrings_with_main_declarations() -> None:
    for module in MODULES:
        doc = importlib.import_module(f"witcert_calculus.{module}").__doc__ or ""
        assert "Main declarations" in doc, module


def test_import_is_light() -> None:
    code = ("import sys, witcert_calculus; "
            "print([m for m in ('torch', 'sympy', 'numpy', 'mpmath', 'transformers') "
            "if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_type_hints_resolve() -> None:
    for module in MODULES:
        mod = importlib.import_module(f"witcert_calculus.{module}")
        for name in mod.__all__:
            obj = getattr(mod, name)
            if inspect.isfunction(obj):
                typing.get_type_hints(obj)
