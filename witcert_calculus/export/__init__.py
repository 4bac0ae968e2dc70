"""Export: the ledger's and the meters' numbers as Prometheus metrics and OpenTelemetry spans.

Main modules:

- :mod:`witcert_calculus.export.prometheus`: every ``witcert_`` metric family
  (``prometheus_client``, the ``metrics`` extra).
- :mod:`witcert_calculus.export.telemetry`: a verdict's span attributes (the ``otel`` extra).

Rule (``tests/test_layout.py``): a leaf room; no module of the library imports it, except
:meth:`~witcert_calculus.ledger.RiskLedger.prometheus`, which loads it on first use.
"""
