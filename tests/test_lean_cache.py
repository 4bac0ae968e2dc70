"""The machine-wide cache of compiled Lean modules (``scripts/lean_driver.py``): an entry is
reused only for the same stamp and the same Lean binary, restores every output and the log,
is written atomically, and can be switched off (a clean build). Beside it, what the driver
decides from a compile's output (a warning fails the build, in a restored log too) and how
many Lean processes it runs (``--jobs-file``)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
lean_driver: Any = importlib.import_module("lean_driver")


def _outputs(base: Path) -> list[Path]:
    files = [base / "WitCert" / "Tiers.olean", base / "WitCert" / "Tiers.ilean"]
    for i, f in enumerate(files):
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(bytes([i]) * 64)
    return files


def test_a_stored_module_is_restored_with_its_log(tmp_path: Path) -> None:
    cache, out = tmp_path / "cache", tmp_path / "out"
    files = _outputs(out)
    key = lean_driver.cache_key("stamp", "lean")
    lean_driver.cache_store(cache, key, files, out, "WitCert/Tiers.lean: ok\n")
    a, b = tmp_path / "a", tmp_path / "b"
    assert lean_driver.cache_restore(cache, key, [a, b]) == "WitCert/Tiers.lean: ok\n"
    for dest in (a, b):
        for f in files:
            assert (dest / f.relative_to(out)).read_bytes() == f.read_bytes()
    assert not [p for p in cache.iterdir() if p.name.endswith(".tmp")]


def test_another_stamp_or_another_lean_misses(tmp_path: Path) -> None:
    cache, out = tmp_path / "cache", tmp_path / "out"
    lean_driver.cache_store(cache, lean_driver.cache_key("stamp", "lean"), _outputs(out), out,
                            "log")
    for key in (lean_driver.cache_key("stamp2", "lean"), lean_driver.cache_key("stamp", "lean2")):
        assert lean_driver.cache_restore(cache, key, [tmp_path / "x"]) is None
    assert not (tmp_path / "x").exists()


def test_a_half_written_entry_is_not_restored(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    key = lean_driver.cache_key("s", "l")
    (cache / key / "out").mkdir(parents=True)  # no log, no outputs: as if interrupted
    assert lean_driver.cache_restore(cache, key, [tmp_path / "x"]) is None


def test_the_cache_folder_follows_the_environment(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    monkeypatch.setenv(lean_driver.MODULE_CACHE_ENV, "off")
    assert lean_driver.module_cache_dir() is None
    monkeypatch.setenv(lean_driver.MODULE_CACHE_ENV, str(tmp_path / "c"))
    assert lean_driver.module_cache_dir() == tmp_path / "c"
    monkeypatch.delenv(lean_driver.MODULE_CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert lean_driver.module_cache_dir() == tmp_path / "witcert-calculus" / "lean-modules"


WARNED = """/tmp/witcert-lean-0/src/WitCert/Output.lean:83:0: warning: automatically included section \
variable(s) unused in theorem `WitCert.Output.absA_self_of_nonneg`:
  [LT α]
"""


def test_a_warning_fails_the_build() -> None:
    problems = lean_driver.check_messages("WitCert.Output", 0, WARNED)
    assert len(problems) == 1 and "WitCert/Output.lean:83:0" in problems[0], problems
    assert "1 warning(s)" in problems[0]
    assert lean_driver.check_messages("WitCert.Output", 0, "") == []
    # the exporter's statements are Lean's info output, not warnings
    assert lean_driver.check_messages("Export", 0, "@WitCert.Tiers.meet_le : ∀ ...") == []


def test_the_job_count_follows_its_file(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    assert lean_driver.current_jobs(2, None) == 2
    assert lean_driver.current_jobs(2, jobs) == 2  # no file yet
    for text, want in (("1\n", 1), ("2", 2), ("8", 2), ("0", 1), ("many", 2)):
        jobs.write_text(text)
        assert lean_driver.current_jobs(2, jobs) == want, text
