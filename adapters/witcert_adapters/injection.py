"""Source injection into an engine's installed files, anchored on exact upstream text.

An adapter that must put the meter *inside* an engine's kernel edits the engine's source.
It never edits by line number: each edit is an :class:`Anchor`, an exact block of upstream
text with its replacement and the number of times the block must occur. A changed upstream
(a block missing, or found more or fewer times) fails loudly with an
:class:`~witcert_calculus.errors.InjectionError` naming the file and the anchor, before any
byte is written.

:func:`apply_anchors` rewrites text (an in-memory module source, for instance).
:func:`patch_file` rewrites a file in place and records, in a manifest beside it
(``.witcert-patches.json`` in the file's folder), the SHA-256 of the pristine file and the
stack of patches applied to it, so that patches outlive the process that applied them
(the engine imports the patched file in its own process). :meth:`FilePatch.revert` is
surgical: it undoes its own anchors only (each replacement must occur exactly as often as
it was written), checks that re-applying them gives back the text it started from, and
when the file's last patch is reverted checks that the file hashes exactly as the pristine
file did. Two adapters may therefore patch the same file, and revert in any order.

Main declarations
-----------------
- :class:`Anchor`, :func:`apply_anchors`: anchored text edits.
- :class:`FilePatch`, :func:`patch_file`, :func:`applied_patch`, :func:`active_patches`:
  anchored file edits, their manifest and their surgical, hash-checked revert.
- :func:`sha256_file`.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, cast, final

from witcert_calculus.errors import InjectionError, InvalidValueError

__all__ = ["MANIFEST", "Anchor", "FilePatch", "active_patches", "applied_patch", "apply_anchors",
           "patch_file", "sha256_file"]

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
    return str(fields.get("pristine")), [str(o) for o in stack]


def _write_manifest(path: Path, data: dict[str, Any]) -> None:
    m = _manifest_path(path)
    if not data:
        m.unlink(missing_ok=True)
        return
    tmp = m.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, m)


def _write_text(path: Path, text: str) -> None:
    # bytes as read: no newline translation, the file's own encoding (UTF-8 source)
    tmp = path.with_name(path.name + ".witcert-tmp")
    tmp.write_bytes(text.encode("utf-8"))
    os.replace(tmp, path)


def active_patches(path: Path) -> tuple[str, ...]:
    """The owners of the patches now applied to ``path``, oldest first (from its manifest)."""
    return tuple(_entry(_read_manifest(path), path)[1])


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
                as it was written, the undone text does not re-patch to the current one, or
                the file, with no patch left, does not hash as the pristine file did.
        """
        data = _read_manifest(self.path)
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
            got = hashlib.sha256(undone.encode("utf-8")).hexdigest()
            if got != self.pristine:
                raise InjectionError(str(self.path), "restore",
                                     f"restored text hashes {got}, the pristine file {self.pristine}")
            data.pop(self.path.name)
        else:
            data[self.path.name] = {"pristine": self.pristine, "stack": stack}
        _write_text(self.path, undone)
        _write_manifest(self.path, data)


def patch_file(path: Path, anchors: Sequence[Anchor], *, owner: str) -> FilePatch:
    """Apply ``anchors`` to the file ``path`` in place, as ``owner``.

    The first patch of a file records its pristine SHA-256 in the manifest; later patches
    (other owners) stack on top. Nothing is written unless every anchor matches.

    Returns:
        The :class:`FilePatch`, whose :meth:`~FilePatch.revert` undoes it.

    Raises:
        InjectionError: an anchor found another number of times than expected, or ``owner``
            already patched this file.
        InvalidValueError: no anchors.
    """
    if not anchors:
        raise InvalidValueError("anchors", 0, "a patch needs at least one anchor")
    path = Path(path)
    data = _read_manifest(path)
    recorded, stack = _entry(data, path)
    if owner in stack:
        raise InjectionError(str(path), owner, "is already applied by this owner")
    raw = path.read_bytes()
    pristine = recorded if recorded is not None else hashlib.sha256(raw).hexdigest()
    text = apply_anchors(raw.decode("utf-8"), anchors, source=str(path))
    data[path.name] = {"pristine": pristine, "stack": [*stack, owner]}
    _write_manifest(path, data)
    _write_text(path, text)
    return FilePatch(path, owner, tuple(anchors), pristine)


def applied_patch(path: Path, anchors: Sequence[Anchor], *, owner: str) -> FilePatch:
    """The :class:`FilePatch` ``owner`` applied to ``path`` (in this or another process),
    rebuilt from the manifest, so that it can be reverted.

    Raises:
        InjectionError: ``owner`` has no patch applied to ``path``.
    """
    path = Path(path)
    pristine, stack = _entry(_read_manifest(path), path)
    if pristine is None or owner not in stack:
        raise InjectionError(str(path), owner, "has no patch applied to this file")
    return FilePatch(path, owner, tuple(anchors), pristine)
