"""``python -m witcert_adapters.demo --out DIR``: run the demo.

See :mod:`witcert_adapters.demo` for what it measures and writes.
"""

from __future__ import annotations

from witcert_adapters.demo.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
