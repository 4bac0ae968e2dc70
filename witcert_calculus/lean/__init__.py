"""The Lean link: the theorems Python cites, and the modelling steps between them and the code.

Main modules:

- :mod:`witcert_calculus.lean.theorems`: every Lean theorem name the library cites, written
  once, and the registry of exported theorems (the shipped export ``lean_export.json`` lies
  beside it, plus any user export).
- :mod:`witcert_calculus.lean.modelling`: each step between a Lean statement and the float
  code that cites it, and how it is discharged (proved, checked, assumed).

Rule (``tests/test_layout.py``): this room imports only ``errors``, ``numerics`` and the
algebra (a modelling step carries a tier); nothing here reaches the meters, the accounting,
drift, exploration or export.
"""
