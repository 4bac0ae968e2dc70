"""Exploration: chains as symbols and as text, gate laws, recorded entry traces, diagnosis.

Main modules:

- :mod:`witcert_calculus.explore.symbolic`: a composed contract as a sympy expression.
- :mod:`witcert_calculus.explore.chain_spec`: a chain written as text, JSON or TOML.
- :mod:`witcert_calculus.explore.gate_laws`: the largest witness that keeps a bridge under ``tau``.
- :mod:`witcert_calculus.explore.entry_trace`: per-step entry bounds on disk, replayed.
- :mod:`witcert_calculus.explore.diagnosis`: which knob an outcome difference is attributable
  to (controlled pairs, replication, dose-response; confounded comparisons refused).

Rule (``tests/test_layout.py``): a leaf room; no module of the library imports it except
the package face.
"""
