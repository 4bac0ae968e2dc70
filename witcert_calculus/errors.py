"""One exception hierarchy for the whole library.

Every error is data: typed fields hold the offending values, the message is
built from them, and instances pickle (so they cross process boundaries, e.g.
from a journal writer). Each leaf also inherits the builtin it behaves like.

::

    WitcertError
    ├── InvalidValueError            (ValueError)  a number outside its allowed range
    │   ├── OutOfDomainError                       input outside a contract's domain of validity
    │   ├── PremiseError                           a proof's premise does not hold
    │   └── UnknownTheoremError                    a proof cites a theorem no export holds
    ├── MetricMismatchError          (TypeError)   two stages do not meet in one metric
    ├── RegimeMismatchError          (TypeError)   readings of different regimes combined
    ├── UnregisteredMetricError      (LookupError) a metric class that was never registered
    ├── MetricAlreadyRegisteredError (ValueError)  a metric class registered a second time
    ├── NotAMetricError              (TypeError)   something that is not a site-indexed metric
    ├── AdmissionError               (ValueError)  the ledger refuses an object by rule
    ├── BudgetExceededError          (RuntimeError) a spend would exceed a request's budget
    ├── UnknownRequestError          (LookupError) a request id the ledger never opened
    ├── ReusedRequestIdError         (ValueError)  a request id that was already used
    ├── UnwrittenSlotError           (LookupError) read of a slot that holds no bytes
    ├── StaleReadError               (LookupError) read authorised at an older generation
    ├── JournalError                 (OSError)     the durable journal cannot be used
    └── TheoremExportError           (ValueError)  a Lean export file that cannot be registered

Main declarations:

- :class:`WitcertError`: the single root.
- :class:`InvalidValueError`, :class:`MetricMismatchError`, ...: the leaves above.
"""

from __future__ import annotations

from typing import Any, final

__all__ = [
    "AdmissionError",
    "BudgetExceededError",
    "InvalidValueError",
    "JournalError",
    "MetricAlreadyRegisteredError",
    "MetricMismatchError",
    "NotAMetricError",
    "OutOfDomainError",
    "PremiseError",
    "RegimeMismatchError",
    "ReusedRequestIdError",
    "StaleReadError",
    "TheoremExportError",
    "UnknownRequestError",
    "UnknownTheoremError",
    "UnregisteredMetricError",
    "UnwrittenSlotError",
    "WitcertError",
]


class WitcertError(Exception):
    """Root of every error raised by witcert-calculus.

    Subclasses declare their fields as constructor arguments; the message is
    built by :meth:`_message` from those fields, and ``__reduce__`` keeps the
    fields so the error pickles faithfully.
    """

    def __init__(self, *args: Any) -> None:
        self._args = args
        super().__init__(self._message())

    def _message(self) -> str:
        return " ".join(str(a) for a in self._args)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), self._args)


class InvalidValueError(WitcertError, ValueError):
    """A value outside its allowed range (NaN, inf, negative coefficient, ...).

    Args:
        name: what the value is (``"a"``, ``"delta"``, ``"weights[3]"``).
        value: the offending value, as given.
        reason: what was expected, e.g. ``"must be finite and >= 0"``.
    """

    def __init__(self, name: str, value: object, reason: str) -> None:
        self.name = name
        self.value = value
        self.reason = reason
        super().__init__(name, value, reason)

    def _message(self) -> str:
        return f"{self.name}={self.value!r} is invalid: {self.reason}"


@final
class OutOfDomainError(InvalidValueError):
    """An input outside the domain ``e_in <= cap`` on which a contract was proved.

    Args:
        contract: name of the contract.
        value: the input error that was offered.
        cap: the domain's upper end.
    """

    def __init__(self, contract: str, value: float, cap: float) -> None:
        self.contract = contract
        self.cap = cap
        InvalidValueError.__init__(
            self,
            f"e_in of contract {contract!r}",
            value,
            f"outside the domain of validity e_in <= {cap!r}; use a contract proved on a larger "
            "domain or bound the input first",
        )
        self._args = (contract, value, cap)


@final
class PremiseError(InvalidValueError):
    """A premise of the cited theorem does not hold for the given arguments.

    Args:
        theorem: the Lean theorem name.
        premise: the premise, stated as text.
        value: the value that violates it.
    """

    def __init__(self, theorem: str, premise: str, value: object) -> None:
        self.theorem = theorem
        self.premise = premise
        InvalidValueError.__init__(
            self, f"premise {premise!r} of {theorem}", value, "does not hold"
        )
        self._args = (theorem, premise, value)


@final
class UnknownTheoremError(InvalidValueError):
    """A proof cites a theorem that neither the shipped Lean export nor a registered one holds.

    Args:
        theorem: the cited name.
        known: how many theorems the registry holds.
    """

    def __init__(self, theorem: str, known: int) -> None:
        self.theorem = theorem
        self.known = known
        InvalidValueError.__init__(self, "theorem", theorem, "is not in any Lean export")
        self._args = (theorem, known)

    def _message(self) -> str:
        return (
            f"theorem {self.theorem!r} is not exported by the Lean build shipped with "
            f"witcert-calculus nor by any registered export ({self.known} theorems known); "
            "cite an exported theorem (witcert_calculus.theorems), or prove it in your own Lake "
            "project and register its export with witcert_calculus.theorems.register_theorems(path)"
        )


@final
class MetricMismatchError(WitcertError, TypeError):
    """Two stages of a chain do not meet in the same metric (and site).

    Args:
        first: name of the upstream stage.
        produced: metric (with site) the upstream stage produces.
        second: name of the downstream stage.
        expected: metric (with site) the downstream stage consumes.
    """

    def __init__(self, first: str, produced: str, second: str, expected: str) -> None:
        self.first = first
        self.produced = produced
        self.second = second
        self.expected = expected
        super().__init__(first, produced, second, expected)

    def _message(self) -> str:
        return (
            f"stage {self.first!r} produces {self.produced} but stage {self.second!r} "
            f"expects {self.expected}; insert a bridge from {self.produced} to {self.expected}"
        )


@final
class RegimeMismatchError(WitcertError, TypeError):
    """Readings of different metrics or measurement regimes were added or compared.

    Args:
        operation: the operation attempted (``"+"``, ``"<"``, ...).
        left: description of the left reading (metric and regime).
        right: description of the right reading.
    """

    def __init__(self, operation: str, left: str, right: str) -> None:
        self.operation = operation
        self.left = left
        self.right = right
        super().__init__(operation, left, right)

    def _message(self) -> str:
        return (
            f"cannot apply {self.operation!r} to a reading of {self.left} and a reading of "
            f"{self.right}: metric and regime must match"
        )


@final
class UnregisteredMetricError(WitcertError, LookupError):
    """A metric class that was never registered with :func:`register_metric`.

    Args:
        metric: the qualified name of the class.
    """

    def __init__(self, metric: str) -> None:
        self.metric = metric
        super().__init__(metric)

    def _message(self) -> str:
        return (
            f"metric {self.metric} was never registered; decorate its class with "
            "@register_metric(unit=..., lo=..., hi=..., meaning=...)"
        )


@final
class MetricAlreadyRegisteredError(WitcertError, ValueError):
    """A metric class that is already registered: the registry is append-only.

    Args:
        metric: the qualified name of the class.
        existing: the declaration in force (unit, bounds, saturation), as text.
    """

    def __init__(self, metric: str, existing: str) -> None:
        self.metric = metric
        self.existing = existing
        super().__init__(metric, existing)

    def _message(self) -> str:
        return (
            f"metric {self.metric} is already registered ({self.existing}); a metric "
            "registers once and its declaration never changes: declare a new metric class "
            "for a different unit, range or saturation"
        )


@final
class NotAMetricError(WitcertError, TypeError):
    """An object used as a metric that is not a site-indexed metric type.

    Args:
        value: repr of what was given.
        reason: why it is not a metric (e.g. the site parameter is missing).
    """

    def __init__(self, value: str, reason: str) -> None:
        self.value = value
        self.reason = reason
        super().__init__(value, reason)

    def _message(self) -> str:
        return f"{self.value} is not a metric type: {self.reason}"


@final
class AdmissionError(WitcertError, ValueError):
    """The ledger refuses an object by rule (e.g. an empirical reading as a certificate).

    Args:
        request_id: the account concerned.
        reason: the rule that refuses it.
    """

    def __init__(self, request_id: int, reason: str) -> None:
        self.request_id = request_id
        self.reason = reason
        super().__init__(request_id, reason)

    def _message(self) -> str:
        return f"request {self.request_id}: admission refused: {self.reason}"


@final
class BudgetExceededError(WitcertError, RuntimeError):
    """A spend would take a request's failure probability past its budget.

    Args:
        request_id: the account concerned.
        spent: what the account has spent (exact, as text).
        requested: what the event asks for.
        budget: the account's delta_req.
    """

    def __init__(self, request_id: int, spent: str, requested: str, budget: str) -> None:
        self.request_id = request_id
        self.spent = spent
        self.requested = requested
        self.budget = budget
        super().__init__(request_id, spent, requested, budget)

    def _message(self) -> str:
        return (
            f"request {self.request_id}: spending {self.requested} on top of {self.spent} "
            f"would exceed its budget {self.budget}"
        )


@final
class UnknownRequestError(WitcertError, LookupError):
    """A request id that the ledger never opened (or already closed).

    Args:
        request_id: the id given.
    """

    def __init__(self, request_id: object) -> None:
        self.request_id = request_id
        super().__init__(request_id)

    def _message(self) -> str:
        return f"unknown request id {self.request_id!r}: open the account before using it"


@final
class ReusedRequestIdError(WitcertError, ValueError):
    """A request id that is not larger than every id used before (ids are monotone).

    Args:
        request_id: the id given.
        last: the largest id used so far.
    """

    def __init__(self, request_id: int, last: int) -> None:
        self.request_id = request_id
        self.last = last
        super().__init__(request_id, last)

    def _message(self) -> str:
        return (
            f"request id {self.request_id} reuses or precedes the last id {self.last}; "
            "request ids are never reused"
        )


@final
class UnwrittenSlotError(WitcertError, LookupError):
    """A read of a slot that holds no written bytes.

    Args:
        slot: the slot index.
    """

    def __init__(self, slot: int) -> None:
        self.slot = slot
        super().__init__(slot)

    def _message(self) -> str:
        return f"slot {self.slot} is UNWRITTEN: reading it would return stale or garbage bytes"


@final
class StaleReadError(WitcertError, LookupError):
    """A read authorised at a generation that the slot has since left.

    Args:
        slot: the slot index.
        authorized: the generation the reader was authorised at.
        current: the slot's current generation.
    """

    def __init__(self, slot: int, authorized: int, current: int) -> None:
        self.slot = slot
        self.authorized = authorized
        self.current = current
        super().__init__(slot, authorized, current)

    def _message(self) -> str:
        return (
            f"slot {self.slot} was authorised at generation {self.authorized} but is now at "
            f"generation {self.current}: re-authorise the read"
        )


@final
class JournalError(WitcertError, OSError):
    """The durable journal cannot be opened, written or replayed.

    Args:
        path: the journal file.
        reason: what went wrong.
    """

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(path, reason)

    def _message(self) -> str:
        return f"journal {self.path}: {self.reason}"


@final
class TheoremExportError(WitcertError, ValueError):
    """A Lean export file (``theorems.json``) that cannot be registered.

    Args:
        path: the file.
        reason: what is wrong with it.
    """

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(path, reason)

    def _message(self) -> str:
        return f"Lean export {self.path}: {self.reason}"

