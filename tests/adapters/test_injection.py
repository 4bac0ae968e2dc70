"""Anchored source injection: exact hit counts, stacked patches, surgical hash-checked revert."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from witcert_adapters.injection import MANIFEST, Anchor, active_patches, applied_patch, \
    apply_anchors, patch_file, patch_files, sha256_file
from witcert_calculus.errors import InjectionError, InvalidValueError

SOURCE = "def f(x):\n    y = x + 1\n    return y\n\n\ndef g(x):\n    return x * 2\n"
A = (Anchor("f body", "    y = x + 1\n", "    y = x + 1\n    y = hook(y)\n"),)
B = (Anchor("g body", "    return x * 2\n", "    return hook(x) * 2\n"),)


@pytest.fixture
def source(tmp_path: Path) -> Path:
    p = tmp_path / "kernel.py"
    p.write_bytes(SOURCE.encode())
    return p


def test_an_anchor_must_match_exactly_the_expected_number_of_times() -> None:
    assert apply_anchors(SOURCE, A, source="s") == SOURCE.replace("    y = x + 1\n",
                                                                  "    y = x + 1\n    y = hook(y)\n")
    with pytest.raises(InjectionError, match=r"'f body' found 0 times, expected 1"):
        apply_anchors(SOURCE.replace("x + 1", "x + 2"), A, source="s")
    with pytest.raises(InjectionError, match=r"found 2 times, expected 1"):
        apply_anchors(SOURCE + "    y = x + 1\n", A, source="s")
    twice = Anchor("f body", "    y = x + 1\n", "    y = x + 1 + 0\n", count=2)
    assert apply_anchors(SOURCE + "    y = x + 1\n", (twice,), source="s").count("+ 0") == 2


def test_a_bad_anchor_is_refused_at_construction() -> None:
    with pytest.raises(InvalidValueError, match="differs"):
        Anchor("same", "x", "x")
    with pytest.raises(InvalidValueError, match="non-empty"):
        Anchor("empty", "", "x")
    with pytest.raises(InvalidValueError, match="count"):
        Anchor("none", "x", "y", count=0)


def test_a_changed_upstream_writes_nothing(source: Path) -> None:
    before = source.read_bytes()
    with pytest.raises(InjectionError, match="kernel.py: anchor 'missing'"):
        patch_file(source, (*A, Anchor("missing", "not there\n", "x\n")), owner="a")
    assert source.read_bytes() == before and not (source.parent / MANIFEST).exists()


def test_two_owners_patch_one_file_and_revert_in_either_order(source: Path) -> None:
    pristine = sha256_file(source)
    for first, second in (("a", "b"), ("b", "a")):
        pa = patch_file(source, A, owner="a")
        pb = patch_file(source, B, owner="b")
        assert active_patches(source) == ("a", "b")
        text = source.read_text()
        assert "y = hook(y)" in text and "return hook(x) * 2" in text
        with pytest.raises(InjectionError, match="already applied"):
            patch_file(source, A, owner="a")
        patches = {"a": pa, "b": pb}
        patches[first].revert()
        left = source.read_text()
        assert ("hook(y)" in left) == (first == "b") and ("hook(x)" in left) == (first == "a")
        assert active_patches(source) == (second,)
        # rebuilt from the manifest, as another process would
        applied_patch(source, A if second == "a" else B, owner=second).revert()
        assert sha256_file(source) == pristine == hashlib.sha256(SOURCE.encode()).hexdigest()
        assert active_patches(source) == () and not (source.parent / MANIFEST).exists()


def test_a_file_edited_behind_the_patch_is_not_restored_blindly(source: Path) -> None:
    p = patch_file(source, A, owner="a")
    source.write_text(source.read_text().replace("y = hook(y)", "y = other(y)"))
    with pytest.raises(InjectionError, match=r"'f body \(revert\)' found 0 times"):
        p.revert()
    # an edit elsewhere survives the undo, so the restored file cannot hash as the pristine one
    source.write_text(source.read_text().replace("other", "hook") + "# local edit\n")
    with pytest.raises(InjectionError, match="restored text hashes"):
        p.revert()
    assert active_patches(source) == ("a",)


def test_reverting_what_is_not_applied_is_an_error(source: Path) -> None:
    with pytest.raises(InjectionError, match="no patch applied"):
        applied_patch(source, A, owner="a")
    p = patch_file(source, A, owner="a")
    p.revert()
    with pytest.raises(InjectionError, match="no patch of 'a'"):
        p.revert()


def _three(tmp_path: Path) -> list[Path]:
    files = [tmp_path / "a" / "one.py", tmp_path / "a" / "two.py", tmp_path / "b" / "three.py"]
    for f in files:
        f.parent.mkdir(exist_ok=True)
        f.write_bytes(SOURCE.encode())
    return files


def test_patch_files_checks_every_anchor_of_every_file_first(tmp_path: Path) -> None:
    files = _three(tmp_path)
    stamps = [f.stat().st_mtime_ns for f in files]
    broken = (*A, Anchor("missing", "not there\n", "x\n"))
    with pytest.raises(InjectionError, match="three.py: anchor 'missing'"):
        patch_files([(files[0], A), (files[1], B), (files[2], broken)], owner="o")
    assert [f.read_bytes() for f in files] == [SOURCE.encode()] * 3
    assert [f.stat().st_mtime_ns for f in files] == stamps
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == [
        "one.py", "three.py", "two.py"]
    done = patch_files([(files[0], A), (files[1], B), (files[2], A)], owner="o")
    assert [active_patches(f) for f in files] == [("o",)] * 3
    for p in reversed(done):
        p.revert()
    assert [f.read_bytes() for f in files] == [SOURCE.encode()] * 3
    assert not any(p.name.startswith(".witcert") for p in tmp_path.rglob("*"))


def test_a_journal_entry_is_settled_by_the_file_it_describes(
        source: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.replace
    calls: list[str] = []

    def dying(src: object, dst: object) -> None:
        calls.append(str(dst))
        if len(calls) == 3:  # journal, file, then the manifest that records it: dies
            raise OSError("simulated crash")
        real(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "replace", dying)
    with pytest.raises(OSError, match="simulated crash"):
        patch_file(source, A, owner="a")
    monkeypatch.undo()
    assert calls[1] == str(source) and "hook(y)" in source.read_text()
    assert active_patches(source) == ("a",)  # committed from the journal: the file was written
    applied_patch(source, A, owner="a").revert()
    assert source.read_bytes() == SOURCE.encode()
    assert not (source.parent / MANIFEST).exists()
    # a journal entry whose file is neither before nor after is not settled blindly
    monkeypatch.setattr(os, "replace", dying)
    calls.clear()
    with pytest.raises(OSError, match="simulated crash"):
        patch_file(source, A, owner="a")
    monkeypatch.undo()
    source.write_text(source.read_text() + "# edited\n")
    with pytest.raises(InjectionError, match="changed behind the journal"):
        active_patches(source)
