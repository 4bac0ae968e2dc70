"""The books of the risk ledger: budgets, accounts, events, their log and journal, state, slots.

The face is :mod:`witcert_calculus.ledger` (:class:`~witcert_calculus.ledger.RiskLedger`);
these modules hold what it keeps.

Main modules:

- :mod:`~witcert_calculus.accounting.budget`: the telescoping budget of a request.
- :mod:`~witcert_calculus.accounting.account`: one request's account and its admission rules.
- :mod:`~witcert_calculus.accounting.records`: what the ledger reports (verdicts, aggregates).
- :mod:`~witcert_calculus.accounting.events`, :mod:`~witcert_calculus.accounting.eventlog`,
  :mod:`~witcert_calculus.accounting.journal`: events as values, their log, the SQLite journal.
- :mod:`~witcert_calculus.accounting.state`: the state the events change, live and on replay.
- :mod:`~witcert_calculus.accounting.slots`: fail-closed slot states of a compressed pool.
- :mod:`~witcert_calculus.accounting.entries`: entry-level certification with local fallback.

Rule (``tests/test_layout.py``): the accounting imports no meter, exploration or export
module.
"""
