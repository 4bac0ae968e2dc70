"""The statement lock: every exported Lean theorem's elaborated statement, committed.

``formal/statements.lock.json`` maps each theorem name to the statement Lean printed for it
(as recorded in the export). ``tests/test_formal_lock.py`` fails when the shipped export
(``witcert_calculus/lean/lean_export.json``), the build's export (``formal/build/theorems.json``)
or the registry of ``witcert_calculus.lean.theorems`` differs from it, naming the statements that
changed, appeared or disappeared. A weakened or rewritten statement therefore cannot pass
unnoticed: the lock changes only deliberately, in a reviewed diff::

    .venv/bin/python scripts/statement_lock.py            # check; exit 1 and a report on drift
    .venv/bin/python scripts/statement_lock.py --update   # rewrite the lock from the export

Both read the shipped export by default (``--export PATH`` reads another one, e.g.
``formal/build/theorems.json``). The usual sequence after changing a statement in Lean:
``bash scripts/lean_build.sh``, ``python scripts/lean_driver.py --root . --ship``, then
``python scripts/statement_lock.py --update`` and commit the lock with the change.

Main declarations: :data:`LOCK`, :func:`statements_of`, :func:`load_lock`, :func:`render_lock`,
:func:`lock_diff`, :func:`diff_message`, :func:`main`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

ROOT = Path(__file__).resolve().parents[1]
LOCK = Path("formal") / "statements.lock.json"
"""The lock file, relative to the repository root."""
SHIPPED = Path("witcert_calculus") / "lean" / "lean_export.json"
UPDATE_HINT = ("if the change is deliberate, regenerate the lock with "
               "`.venv/bin/python scripts/statement_lock.py --update` and commit "
               "formal/statements.lock.json with the change")


def statements_of(doc: Mapping[str, object]) -> dict[str, str]:
    """Name -> statement of an export document (``theorems.json`` or ``lean_export.json``)."""
    records = doc.get("theorems")
    if not isinstance(records, list):
        raise ValueError("an export holds a list 'theorems'")
    out: dict[str, str] = {}
    for item in cast(list[object], records):
        t = cast(dict[str, object], item) if isinstance(item, dict) else {}
        name, stmt = t.get("name"), t.get("statement")
        if not isinstance(name, str) or not isinstance(stmt, str):
            raise ValueError(f"malformed export record {item!r}")
        out[name] = stmt
    return out


def load_export(path: Path) -> dict[str, str]:
    """Name -> statement of an export file."""
    doc: dict[str, object] = json.loads(path.read_text(encoding="utf-8"))
    return statements_of(doc)


def load_lock(path: Path) -> dict[str, str]:
    """Name -> statement of a lock file."""
    doc: object = json.loads(path.read_text(encoding="utf-8"))
    stmts = cast(dict[str, object], doc).get("statements") if isinstance(doc, dict) else None
    if not isinstance(stmts, dict):
        raise ValueError(f"{path}: a lock holds an object 'statements' (name -> statement)")
    return {str(k): str(v) for k, v in cast(dict[object, object], stmts).items()}


def render_lock(statements: Mapping[str, str]) -> str:
    """The text of the lock file for these statements (sorted by name, one per line)."""
    doc = {"about": "Every exported WitCert theorem -> its elaborated statement, as the Lean "
                    "export records it. Checked by tests/test_formal_lock.py; regenerate "
                    "deliberately with: .venv/bin/python scripts/statement_lock.py --update",
           "statements": dict(sorted(statements.items()))}
    return json.dumps(doc, indent=1, ensure_ascii=False) + "\n"


@dataclass(frozen=True)
class LockDiff:
    """How an export differs from the lock."""

    changed: dict[str, tuple[str, str]] = field(default_factory=dict[str, tuple[str, str]])
    """name -> (locked statement, exported statement)"""
    appeared: dict[str, str] = field(default_factory=dict[str, str])
    """exported, not locked: name -> statement"""
    disappeared: dict[str, str] = field(default_factory=dict[str, str])
    """locked, not exported: name -> locked statement"""

    def __bool__(self) -> bool:
        return bool(self.changed or self.appeared or self.disappeared)


def lock_diff(lock: Mapping[str, str], export: Mapping[str, str]) -> LockDiff:
    """Compare an export's statements with the lock's."""
    return LockDiff(
        changed={n: (lock[n], export[n]) for n in sorted(lock.keys() & export.keys())
                 if lock[n] != export[n]},
        appeared={n: export[n] for n in sorted(export.keys() - lock.keys())},
        disappeared={n: lock[n] for n in sorted(lock.keys() - export.keys())})


def diff_message(lock: Mapping[str, str], export: Mapping[str, str], where: str) -> str | None:
    """A report naming every changed, appeared and disappeared statement; None if none."""
    d = lock_diff(lock, export)
    if not d:
        return None
    lines = [f"the theorem statements of {where} differ from the lock {LOCK} "
             f"({len(d.changed)} changed, {len(d.appeared)} appeared, "
             f"{len(d.disappeared)} disappeared):"]
    for n, (old, new) in d.changed.items():
        lines += [f"  changed: {n}", f"    lock:   {old}", f"    export: {new}"]
    lines += [f"  appeared: {n} : {s}" for n, s in d.appeared.items()]
    lines += [f"  disappeared: {n} : {s}" for n, s in d.disappeared.items()]
    lines.append(UPDATE_HINT)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Check (default) or ``--update`` the lock; returns the exit code."""
    ap = argparse.ArgumentParser(description="Check or regenerate formal/statements.lock.json.")
    ap.add_argument("--root", type=Path, default=ROOT)
    ap.add_argument("--export", type=Path,
                    help="the export to read (default ROOT/witcert_calculus/lean/lean_export.json)")
    ap.add_argument("--update", action="store_true",
                    help="rewrite the lock from the export (a deliberate change)")
    args = ap.parse_args(argv)
    root: Path = args.root.resolve()
    export_path: Path = args.export if args.export is not None else root / SHIPPED
    export = load_export(export_path)
    lock_path = root / LOCK
    if args.update:
        old = load_lock(lock_path) if lock_path.exists() else {}
        lock_path.write_text(render_lock(export), encoding="utf-8")
        d = lock_diff(old, export)
        print(f"statement-lock: wrote {LOCK} ({len(export)} statements: {len(d.changed)} "
              f"changed, {len(d.appeared)} added, {len(d.disappeared)} removed)")
        return 0
    if not lock_path.exists():
        print(f"statement-lock: {LOCK} is missing; {UPDATE_HINT}", file=sys.stderr)
        return 1
    message = diff_message(load_lock(lock_path), export, str(export_path))
    if message is not None:
        print("statement-lock: " + message, file=sys.stderr)
        return 1
    print(f"statement-lock: ok ({len(export)} statements match {LOCK})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
