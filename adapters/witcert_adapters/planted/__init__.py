"""The diagnosis campaign's planted fault (:mod:`.sitecustomize`), kept off every default path.

Nothing imports this package: :mod:`witcert_adapters.campaign` puts the folder itself on an
engine process's ``PYTHONPATH`` for the arms whose fault is planted, where Python's start-up
imports its ``sitecustomize``.
"""
