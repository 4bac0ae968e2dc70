"""Source injection into an engine's installed files, anchored on exact upstream text.

An adapter that must put the meter *inside* an engine's kernel edits the engine's source.
It never edits by line number: each edit is an :class:`Anchor`, an exact block of upstream
text with its replacement and the number of times the block must occur. A changed upstream
(a block missing, or found more or fewer times) fails loudly with an
:class:`~witcert_calculus.errors.InjectionError` naming the file and the anchor, before any
byte is written.

:func:`apply_anchors` rewrites text (an in-memory module source, for instance).
:func:`patch_files` rewrites files in place (:func:`patch_file`, one file) and records, in a
manifest beside them (``.witcert-patches.json`` in each file's folder), the SHA-256 of the
pristine file, the stack of patches applied to it and the digest of the file as patched, so
that patches outlive the process that applied them (the engine imports the patched file in
its own process). :meth:`FilePatch.revert` is surgical: it undoes its own anchors only (each
replacement must occur exactly as often as it was written), checks that re-applying them
gives back the text it started from, and when the file's last patch is reverted checks that
the file hashes exactly as the pristine file did. Two adapters may therefore patch the same
file, and revert in any order.

Writes are ordered so that no crash leaves a state the next run cannot tell apart:

1. every anchor of every file is checked (and every file read) before any byte is written;
2. per file, a journal entry (``pending``: the owner, the operation and the digests before
   and after) goes into the manifest, the file is written (a temporary file and
   :func:`os.replace`, so it is either the old or the new text), then the manifest records
   the new state and drops the journal entry.

Every later call on the file first settles a journal entry left by a crash between the file
and its manifest: a file that hashes as the digest after is committed (the manifest records
the operation), one that hashes as the digest before is left as it was (the entry dropped),
anything else is an :class:`~witcert_calculus.errors.InjectionError` (a file changed behind
the journal is never repaired blindly).

Main declarations
-----------------
- :class:`Anchor`, :func:`apply_anchors`: anchored text edits.
- :class:`FilePatch`, :func:`patch_files`, :func:`patch_file`, :func:`applied_patch`,
  :func:`active_patches`: anchored file edits, their manifest (with its journal) and their
  surgical, hash-checked revert.
- :func:`sha256_file`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, cast, final

from witcert_calculus.errors import InjectionError, InvalidValueError

__all__ = ["MANIFEST", "Anchor", "FilePatch", "active_patches", "applied_patch", "apply_anchors",
           "patch_file", "patch_files", "sha256_file"]

MANIFEST: Final = ".witcert-patches.json"
"""The manifest's file name, in the folder of the files it records."""


@final
@dataclass(frozen=True, slots=True)
class Anchor:
    """One anchored edit: ``old``, an exact block of upstream text, becomes ``new``.

    Attributes:
        name: what the edit does (named in every error).
        old: the upstream block, exactly (whitespace included).
        new: its replacement (it may keep ``old`` and add to it; it must differ from it).
        count: how many times ``old`` must occur (every occurrence is replaced).
    """

    name: str
    old: str
    new: str
    count: int = 1

    def __post_init__(self) -> None:
        if not self.old or self.old == self.new:
            raise InvalidValueError(f"anchor {self.name!r}", self.old[:60],
                                    "needs a non-empty block and a replacement that differs")
        if self.count < 1:
            raise InvalidValueError(f"anchor {self.name!r} count", self.count, "must be >= 1")


def _replace_exactly(text: str, old: str, new: str, count: int, *, source: str,
                     name: str) -> str:
    found = text.count(old)
    if found != count:
        raise InjectionError(source, name, f"found {found} times, expected {count}")
    return text.replace(old, new)


def apply_anchors(text: str, anchors: Sequence[Anchor], *, source: str) -> str:
    """``text`` with every anchor applied in order, each found exactly ``count`` times.

    Raises:
        InjectionError: an anchor found another number of times (nothing is returned).
    """
    for a in anchors:
        text = _replace_exactly(text, a.old, a.new, a.count, source=source, name=a.name)
    return text


def _undo_anchors(text: str, anchors: Sequence[Anchor], *, source: str) -> str:
    for a in reversed(anchors):
        text = _replace_exactly(text, a.new, a.old, a.count, source=source,
                                name=f"{a.name} (revert)")
    return text


def sha256_file(path: Path) -> str:
    """The SHA-256 of a file's bytes, in hex."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _manifest_path(path: Path) -> Path:
    return path.parent / MANIFEST


def _read_manifest(path: Path) -> dict[str, Any]:
    m = _manifest_path(path)
    if not m.exists():
        return {}
    try:
        data: Any = json.loads(m.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise InjectionError(str(m), "manifest", f"cannot be read ({e})") from e
    if not isinstance(data, dict):
        raise InjectionError(str(m), "manifest", "is not a JSON object")
    return data  # pyright: ignore[reportUnknownVariableType]


def _entry(data: dict[str, Any], path: Path) -> tuple[str | None, list[str]]:
    # (pristine SHA-256, owners' stack) of one file's manifest entry; (None, []) if none
    entry: Any = data.get(path.name)
    if not isinstance(entry, dict):
        return None, []
    fields = cast(dict[str, Any], entry)
    stack = cast(list[Any], fields.get("stack", []))
    pristine = fields.get("pristine")
    return (None if pristine is None else str(pristine)), [str(o) for o in stack]


def _set_entry(data: dict[str, Any], path: Path, pristine: str | None, stack: list[str],
               digest: str, pending: dict[str, Any] | None = None) -> None:
    entry: dict[str, Any] = {}
    if stack:
        entry.update(pristine=pristine, stack=stack, digest=digest)
    if pending is not None:
        entry["pending"] = pending
    if entry:
        data[path.name] = entry
    else:
        data.pop(path.name, None)


def _write_manifest(path: Path, data: dict[str, Any]) -> None:
    m = _manifest_path(path)
    if not data:
        m.unlink(missing_ok=True)
        return
    tmp = m.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, m)


def _tmp_of(path: Path) -> Path:
    return path.with_name(path.name + ".witcert-tmp")


def _write_text(path: Path, text: str) -> None:
    # bytes as read: no newline translation, the file's own encoding (UTF-8 source)
    tmp = _tmp_of(path)
    tmp.write_bytes(text.encode("utf-8"))
    os.replace(tmp, path)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _settle(path: Path) -> dict[str, Any]:
    """The manifest of ``path`` with a journal entry a crash left behind settled (and
    written), stale temporary files removed."""
    data = _read_manifest(path)
    entry: Any = data.get(path.name)
    pending: Any = (cast(dict[str, Any], entry).get("pending") if isinstance(entry, dict)
                    else None)
    if pending is not None:
        p = cast(dict[str, Any], pending)
        now = sha256_file(path)
        pristine, stack = _entry(data, path)
        owner, op = str(p.get("owner")), p.get("op")
        if now == p.get("after"):  # the file was written, its manifest was not: commit
            if op == "apply":
                pristine = pristine if pristine is not None else str(p.get("pristine"))
                stack = [*stack, owner] if owner not in stack else stack
            elif op == "revert":
                stack = [o for o in stack if o != owner]
            else:
                raise InjectionError(str(path), "journal", f"unknown operation {op!r}")
        elif now != p.get("before"):
            raise InjectionError(str(path), "journal",
                                 f"the file hashes {now}, neither the {op} of {owner!r} journal "
                                 f"entry's before ({p.get('before')}) nor after "
                                 f"({p.get('after')}): changed behind the journal")
        _set_entry(data, path, pristine, stack, now)
        _write_manifest(path, data)
    _tmp_of(path).unlink(missing_ok=True)
    _manifest_path(path).with_suffix(".tmp").unlink(missing_ok=True)
    return data


def _commit(path: Path, data: dict[str, Any], *, owner: str, op: str, before: str, text: str,
            pristine: str | None, stack: list[str]) -> None:
    # journal, file, manifest: a crash at any point leaves a state _settle resolves
    after = _sha(text)
    _, old_stack = _entry(data, path)
    journal = {"owner": owner, "op": op, "before": before, "after": after,
               "pristine": pristine}
    _set_entry(data, path, pristine, old_stack, before, journal)
    _write_manifest(path, data)
    _write_text(path, text)
    _set_entry(data, path, pristine, stack, after)
    _write_manifest(path, data)


def active_patches(path: Path) -> tuple[str, ...]:
    """The owners of the patches now applied to ``path``, oldest first (from its manifest,
    a journal entry a crash left behind settled first)."""
    return tuple(_entry(_settle(Path(path)), Path(path))[1])


@final
@dataclass(frozen=True, slots=True)
class FilePatch:
    """One owner's anchored edits of one file, as applied (:func:`patch_file`).

    Attributes:
        path: the file.
        owner: who applied it (one patch per owner and file).
        anchors: the edits.
        pristine: the SHA-256 of the file before any patch (from the manifest).
    """

    path: Path
    owner: str
    anchors: tuple[Anchor, ...]
    pristine: str

    def revert(self) -> None:
        """Undo this patch's edits only, leaving other owners' patches in place.

        Raises:
            InjectionError: the patch is not applied, a replacement is not found as often
                as it was written, the undone text does not re-patch to the current one,
                the file, with no patch left, does not hash as the pristine file did, or a
                journal entry that cannot be settled.
        """
        data = _settle(self.path)
        _, stack = _entry(data, self.path)
        if self.owner not in stack:
            raise InjectionError(str(self.path), "restore", f"no patch of {self.owner!r} is applied")
        text = self.path.read_bytes().decode("utf-8")
        undone = _undo_anchors(text, self.anchors, source=str(self.path))
        if apply_anchors(undone, self.anchors, source=str(self.path)) != text:
            raise InjectionError(str(self.path), "restore",
                                 f"undoing {self.owner!r} does not re-patch to the current file")
        stack.remove(self.owner)
        if not stack:
            got = _sha(undone)
            if got != self.pristine:
                raise InjectionError(str(self.path), "restore",
                                     f"restored text hashes {got}, the pristine file {self.pristine}")
        _commit(self.path, data, owner=self.owner, op="revert", before=_sha(text), text=undone,
                pristine=self.pristine, stack=stack)


def patch_files(targets: Sequence[tuple[Path, Sequence[Anchor]]], *, owner: str
                ) -> tuple[FilePatch, ...]:
    """Apply each file's anchors in place, as ``owner``: every anchor of every file is
    checked before any byte is written, then each file is written atomically, its manifest
    after it (with a journal entry between, see the module docstring).

    The first patch of a file records its pristine SHA-256 in the manifest; later patches
    (other owners) stack on top.

    Returns:
        One :class:`FilePatch` per file, in order; each :meth:`~FilePatch.revert` undoes one.

    Raises:
        InjectionError: an anchor found another number of times than expected, ``owner``
            already patched a file, or a journal entry that cannot be settled (nothing is
            written to any file).
        InvalidValueError: a file with no anchors, or one file named twice.
    """
    plans: list[tuple[Path, tuple[Anchor, ...], dict[str, Any], str, str, str, list[str]]] = []
    seen: set[Path] = set()
    for path, anchors in targets:
        path = Path(path)
        if not anchors:
            raise InvalidValueError("anchors", 0, f"a patch of {path} needs at least one anchor")
        if path.resolve() in seen:
            raise InvalidValueError("targets", str(path), "names a file twice")
        seen.add(path.resolve())
        data = _settle(path)
        recorded, stack = _entry(data, path)
        if owner in stack:
            raise InjectionError(str(path), owner, "is already applied by this owner")
        raw = path.read_bytes()
        before = hashlib.sha256(raw).hexdigest()
        pristine = recorded if recorded is not None else before
        text = apply_anchors(raw.decode("utf-8"), anchors, source=str(path))
        plans.append((path, tuple(anchors), data, before, text, pristine, [*stack, owner]))
    done: list[FilePatch] = []
    try:
        for path, anchors, _, before, text, pristine, stack in plans:
            # re-read: an earlier file of the same folder shares the manifest
            _commit(path, _read_manifest(path), owner=owner, op="apply", before=before,
                    text=text, pristine=pristine, stack=stack)
            done.append(FilePatch(path, owner, anchors, pristine))
    except BaseException:
        for patch in reversed(done):  # best effort; what a crash leaves, the journal settles
            with contextlib.suppress(Exception):
                patch.revert()
        raise
    return tuple(done)


def patch_file(path: Path, anchors: Sequence[Anchor], *, owner: str) -> FilePatch:
    """Apply ``anchors`` to the file ``path`` in place, as ``owner`` (:func:`patch_files`
    with one file).

    Returns:
        The :class:`FilePatch`, whose :meth:`~FilePatch.revert` undoes it.

    Raises:
        InjectionError: an anchor found another number of times than expected, or ``owner``
            already patched this file.
        InvalidValueError: no anchors.
    """
    (patch,) = patch_files(((path, anchors),), owner=owner)
    return patch


def applied_patch(path: Path, anchors: Sequence[Anchor], *, owner: str) -> FilePatch:
    """The :class:`FilePatch` ``owner`` applied to ``path`` (in this or another process),
    rebuilt from the manifest (a journal entry a crash left behind settled first), so that
    it can be reverted.

    Raises:
        InjectionError: ``owner`` has no patch applied to ``path``.
    """
    path = Path(path)
    pristine, stack = _entry(_settle(path), path)
    if pristine is None or owner not in stack:
        raise InjectionError(str(path), owner, "has no patch applied to this file")
    return FilePatch(path, owner, tuple(anchors), pristine)
