"""The schema check: every built-in schema against its theorem's committed Lean statement.

Each theorem the library issues proofs of has a schema (``witcert_calculus.schemas``): the
metric families, the coefficients as a function of named parameters, the premises, and the
fragments of the Lean statement that state that claim. This check loads the committed
statement lock (``formal/statements.lock.json``) and reports every schema whose theorem is
missing there or whose statement no longer states one of its fragments
(``witcert_calculus.schemas.check_schemas``). It is the third half of
``scripts/check_formal_sync.sh``::

    .venv/bin/python scripts/check_schemas.py      # exit 1 and a report on drift
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    """Report the disagreements; 0 when there are none."""
    sys.path.insert(0, str(ROOT))
    import witcert_calculus.bridges  # noqa: F401  (the modules that define built-in schemas)
    import witcert_calculus.meters.depth  # noqa: F401
    import witcert_calculus.meters.output_bound  # noqa: F401
    from witcert_calculus.schemas import builtin_schemas, check_schemas

    lock = json.loads((ROOT / "formal" / "statements.lock.json").read_text(encoding="utf-8"))
    problems = check_schemas(lock["statements"])
    for line in problems:
        print(f"schemas: {line}", file=sys.stderr)
    if problems:
        return 1
    print(f"schemas: ok ({len(builtin_schemas())} schemas state their theorems' claims)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
