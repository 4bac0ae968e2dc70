"""Drift detection: anytime-valid sentinels over a stream of certified observations.

Main modules:

- :mod:`witcert_calculus.drift.eprocess`: the e-process drift sentinel (Ville's inequality).
- :mod:`witcert_calculus.drift.changepoint`: the e-detector (e-CUSUM), whose delay does not
  grow with a clean prefix.

Rule (``tests/test_layout.py``): drift imports no meter, accounting, exploration or export
module (the ledger's books use it, not the other way round).
"""
