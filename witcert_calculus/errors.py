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
    ├── ForgedBoundError             (TypeError)   an established type built outside its establisher
    ├── ForgedEvidenceError          (TypeError)   evidence not issued by the code that checked it
    ├── EvidenceMismatchError        (ValueError)  a proof attached to a claim it does not prove
    ├── AdmissionError               (ValueError)  the ledger refuses an object by rule
    │   └── TokenReusedError                       an idempotency token offered for another request
    ├── BudgetExceededError          (RuntimeError) a delta above the request's next allowance
    │   └── AllowanceMovedError                    an allowance read before others drew it
    ├── UnknownRequestError          (LookupError) a request id the ledger never opened
    ├── ReusedRequestIdError         (ValueError)  a request id that was already used
    ├── UnwrittenSlotError           (LookupError) read of a slot that holds no bytes
    ├── StaleReadError               (LookupError) read authorised at an older generation
    ├── SlotOwnershipError           (PermissionError) writing or evicting another's slot
    ├── JournalError                 (OSError)     the durable journal cannot be used
    ├── EngineMismatchError          (RuntimeError) a serving engine unlike the one an adapter hooks
    ├── InjectionError               (RuntimeError) engine source an adapter cannot patch or restore
    ├── KernelBuildError             (RuntimeError) a compiled kernel that cannot be built or loaded
    ├── TheoremExportError           (ValueError)  a Lean export file that cannot be registered
    ├── ChainSpecError               (ValueError)  a chain spec that cannot be built
    ├── ConfoundedComparisonError    (ValueError)  two arms compared that differ in several knobs
    └── UnattributedEvictionError    (ValueError)  a cache change a meter cannot read as dropped tokens

Main declarations:

- :class:`WitcertError`: the single root.
- :class:`InvalidValueError`, :class:`MetricMismatchError`, ...: the leaves above.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any, Literal, final

__all__ = [
    "AdmissionError",
    "AllowanceMovedError",
    "BudgetExceededError",
    "ChainSpecError",
    "ConfoundedComparisonError",
    "EngineMismatchError",
    "EvidenceMismatchError",
    "ForgedBoundError",
    "ForgedEvidenceError",
    "InjectionError",
    "InvalidValueError",
    "JournalError",
    "KernelBuildError",
    "MetricAlreadyRegisteredError",
    "MetricMismatchError",
    "NotAMetricError",
    "OutOfDomainError",
    "PremiseError",
    "RegimeMismatchError",
    "ReusedRequestIdError",
    "SlotOwnershipError",
    "StaleReadError",
    "TheoremExportError",
    "TokenReusedError",
    "UnattributedEvictionError",
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
            "cite an exported theorem (witcert_calculus.lean.theorems), or prove it in your own Lake "
            "project and register its export with witcert_calculus.lean.theorems.register_theorems(path)"
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
class ForgedBoundError(WitcertError, TypeError):
    """A value of an established type (e.g. a ``LogitBound``) built outside the functions
    that establish it.

    Such a type carries its premise by construction (a logit bound computed from stored
    witnesses and the live query), so only its establishing functions may produce one.

    Args:
        kind: the type's name, e.g. ``"LogitBound"``.
        establishers: the qualified names of the functions that produce it.
    """

    def __init__(self, kind: str, establishers: tuple[str, ...]) -> None:
        self.kind = kind
        self.establishers = establishers
        super().__init__(kind, establishers)

    def _message(self) -> str:
        return (
            f"a {self.kind} is established only by {', '.join(self.establishers)}; "
            f"it cannot be built or rebuilt elsewhere. To use numbers of your own, pass the "
            "plain array: its premise is then carried as an assumption (at most "
            "PARTIALLY_CERTIFIED)"
        )


@final
class ForgedEvidenceError(WitcertError, TypeError):
    """Evidence (a ``Proof``, ``Premise``, proved ``Reading`` or TV bound) that was not
    issued by the library code that checked it: built by hand, edited with
    ``dataclasses.replace``, or unpickled in another process or after an edit.

    Args:
        kind: the type's name, e.g. ``"Proof"``.
        value: the offending value (its repr is shown).
        reason: how such a value is obtained instead.
    """

    def __init__(self, kind: str, value: object, reason: str) -> None:
        self.kind = kind
        self.value = value
        self.reason = reason
        super().__init__(kind, value, reason)

    def _message(self) -> str:
        return (f"{self.kind} {self.value!r} was not issued by the code that checked it: "
                f"{self.reason}")


@final
class EvidenceMismatchError(WitcertError, ValueError):
    """A proof attached to a claim other than the one it was issued for.

    A proof is issued for one claim (a contract's metrics, coefficients, delta, domain
    and transfer); it certifies only that claim.

    Args:
        theorem: the proof's theorem.
        field: the part of the claim that differs (``"b"``, ``"transfer"``, ...).
        claimed: the value on the object the proof was attached to.
        proved: the value the proof was issued for.
    """

    def __init__(self, theorem: str, field: str, claimed: object, proved: object) -> None:
        self.theorem = theorem
        self.field = field
        self.claimed = claimed
        self.proved = proved
        super().__init__(theorem, field, claimed, proved)

    def _message(self) -> str:
        return (f"{self.theorem} was issued for {self.field}={self.proved!r}, not "
                f"{self.field}={self.claimed!r}: a proof certifies only the claim it was "
                "issued for")


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
class TokenReusedError(AdmissionError):
    """An idempotency token offered for a request other than the one it was recorded for.

    A token names one admission of one request; a retry must name the same request.

    Args:
        token: the token.
        request_id: the request it was offered for now.
        recorded_request_id: the request it was recorded for.
    """

    def __init__(self, token: str, request_id: int, recorded_request_id: int) -> None:
        self.token = token
        self.recorded_request_id = recorded_request_id
        AdmissionError.__init__(
            self, request_id,
            f"idempotency token {token!r} was recorded for request {recorded_request_id}, "
            f"not request {request_id}; a token names one admission of one request: use a "
            "fresh token for this request")
        self._args = (token, request_id, recorded_request_id)


class BudgetExceededError(WitcertError, RuntimeError):
    """A probabilistic certificate whose delta the request's budget cannot pay for.

    The telescoping schedule gives a request's ``i``-th probabilistic event the
    allowance ``delta_req / ((i+1)(i+2))``; a certificate whose delta exceeds the
    allowance due when it is admitted is refused (and nothing is charged).

    Args:
        request_id: the account concerned.
        spent: what the account has spent (exact, as text).
        requested: the delta the certificate asks for.
        budget: the account's delta_req.
        allowance: the allowance now due (as text), when the refusal is by the
            telescoping schedule; ``None`` for a spend past the budget itself.
    """

    def __init__(self, request_id: int, spent: str, requested: str, budget: str,
                 allowance: str | None = None) -> None:
        self.request_id = request_id
        self.spent = spent
        self.requested = requested
        self.budget = budget
        self.allowance = allowance
        super().__init__(request_id, spent, requested, budget, allowance)

    def _message(self) -> str:
        if self.allowance is None:
            return (
                f"request {self.request_id}: spending {self.requested} on top of {self.spent} "
                f"would exceed its budget {self.budget}"
            )
        return (
            f"request {self.request_id}: spending {self.requested} on top of {self.spent} is "
            f"refused by the telescoping schedule of delta_req={self.budget}: the allowance is "
            f"{self.allowance} for its next probabilistic event; certify at a delta of at most "
            f"{self.allowance}, or let RiskLedger.admit_next(request_id, make_reading) pass "
            "the allowance due to the certificate"
        )


@final
class AllowanceMovedError(BudgetExceededError):
    """A certificate built for an allowance that other admissions have since used up.

    Raised when a probabilistic certificate's delta is exactly the allowance of
    an earlier probabilistic event of the same request: the caller read the
    allowance (``RiskLedger.next_allowance``), then other admissions drew it
    before this one arrived. Nothing is charged. ``RiskLedger.admit_next``
    reads the allowance and admits in one step, so it cannot happen there.

    Args:
        request_id: the account concerned.
        read: the allowance the certificate was built for (the delta offered).
        read_index: the probabilistic event that allowance belongs to.
        due: the allowance now due.
        due_index: the probabilistic event now due.
        spent: what the account has spent.
        budget: the account's delta_req, as text.
    """

    def __init__(self, request_id: int, read: Fraction, read_index: int, due: Fraction,
                 due_index: int, spent: Fraction, budget: str) -> None:
        self.request_id = request_id
        self.read = read
        self.read_index = read_index
        self.due = due
        self.due_index = due_index
        self.spent = str(spent)
        self.requested = str(read)
        self.budget = budget
        self.allowance = str(due)
        WitcertError.__init__(self, request_id, read, read_index, due, due_index, spent, budget)

    def _message(self) -> str:
        since = self.due_index - self.read_index
        made = "admission was" if since == 1 else "admissions were"
        return (
            f"request {self.request_id}: the allowance moved: the certificate was built for "
            f"{self.read}, the allowance of probabilistic event {self.read_index}, but {since} "
            f"probabilistic {made} made since; the allowance now due is {self.due} (event "
            f"{self.due_index}); nothing was charged; read the allowance and admit in one step "
            f"with RiskLedger.admit_next(request_id, make_reading), or certify again at a delta "
            f"of at most {self.due}"
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
class SlotOwnershipError(WitcertError, PermissionError):
    """A write or eviction of a slot that another request owns.

    A request may write or evict only the slots it owns and free (``UNWRITTEN``)
    slots; a batch that names any other slot is refused whole, and nothing of it
    is applied or journaled.

    Args:
        request_id: the request that tried.
        action: ``"write"`` or ``"evict"``.
        slot: the first refused slot of the batch.
        owner: the request that owns it.
        generation: the slot's current generation.
        refused: how many slots of the batch other requests own.
    """

    def __init__(self, request_id: int, action: Literal["write", "evict"], slot: int,
                 owner: int, generation: int, refused: int) -> None:
        self.request_id = request_id
        self.action = action
        self.slot = slot
        self.owner = owner
        self.generation = generation
        self.refused = refused
        super().__init__(request_id, action, slot, owner, generation, refused)

    def _message(self) -> str:
        more = (f"; {self.refused} slots of the batch are owned by others"
                if self.refused > 1 else "")
        return (
            f"request {self.request_id} may not {self.action} slot {self.slot}: it is owned by "
            f"request {self.owner} (generation {self.generation}){more}; a request writes or "
            f"evicts only its own slots and free ones, so nothing of the batch was applied: "
            f"choose a free slot, or have request {self.owner} evict it (closing a request "
            "frees its slots)"
        )


@final
class JournalError(WitcertError, OSError):
    """The durable journal cannot be opened, written or replayed.

    Args:
        path: the journal file.
        reason: what went wrong.
        seq: the sequence number of the event concerned (the first one that
            fails its digest, does not replay, or is missing), if one is; the
            reason names it too.
    """

    def __init__(self, path: str, reason: str, seq: int | None = None) -> None:
        self.path = path
        self.reason = reason
        self.seq = seq
        super().__init__(path, reason, seq)

    def _message(self) -> str:
        return f"journal {self.path}: {self.reason}"


@final
class EngineMismatchError(WitcertError, RuntimeError):
    """A serving engine that differs from what an adapter hooks into (raised at start-up).

    An adapter that cannot meter what the engine serves refuses to start rather than serve
    unmetered while claiming to meter.

    Args:
        what: the property that differs (a version, a method's parameters, a dtype).
        expected: what the adapter supports.
        actual: what the engine has.
    """

    def __init__(self, what: str, expected: str, actual: str) -> None:
        self.what = what
        self.expected = expected
        self.actual = actual
        super().__init__(what, expected, actual)

    def _message(self) -> str:
        return (f"{self.what}: the witcert plugin supports {self.expected}, the engine has "
                f"{self.actual}; refusing to serve unmetered")


@final
class InjectionError(WitcertError, RuntimeError):
    """Engine source that an adapter cannot patch, or a patched file it cannot restore.

    Raised when an anchor (an exact block of upstream source) is not found the expected
    number of times, or when a file's bytes differ from what was recorded before patching.

    Args:
        source: the file or object the text came from.
        anchor: the anchor's name (or ``"restore"`` for a revert).
        reason: what differs (the hit count found against the one expected, a hash).
    """

    def __init__(self, source: str, anchor: str, reason: str) -> None:
        self.source = source
        self.anchor = anchor
        self.reason = reason
        super().__init__(source, anchor, reason)

    def _message(self) -> str:
        return f"{self.source}: anchor {self.anchor!r} {self.reason}; refusing to patch"


@final
class KernelBuildError(WitcertError, RuntimeError):
    """A compiled kernel (a C++ extension built with the system compiler) that cannot be
    built or loaded: the meter that needs it refuses to start rather than serve unmetered.

    Args:
        kernel: the kernel's name.
        reason: what failed (the compiler's or loader's message, shortened).
    """

    def __init__(self, kernel: str, reason: str) -> None:
        self.kernel = kernel
        self.reason = reason
        super().__init__(kernel, reason)

    def _message(self) -> str:
        return f"kernel {self.kernel!r} cannot be built: {self.reason}"


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



@final
class ChainSpecError(WitcertError, ValueError):
    """A chain spec (text, JSON or TOML; :mod:`witcert_calculus.explore.chain_spec`) that cannot be built.

    Args:
        where: the part at fault: a stage by position and text, a file, or a key.
        reason: what is wrong with it.
    """

    def __init__(self, where: str, reason: str) -> None:
        self.where = where
        self.reason = reason
        super().__init__(where, reason)

    def _message(self) -> str:
        return f"chain spec: {self.where} {self.reason}"


@final
class ConfoundedComparisonError(WitcertError, ValueError):
    """Two arms compared that differ in two or more knobs: no difference between their
    outcomes can be attributed to one knob (``witcert_calculus.explore.diagnosis``; Lean
    ``WitCert.Diagnosis.confounded_pair_unidentified``).

    Args:
        first: the first arm's name.
        second: the second arm's name.
        knobs: the knobs in which they differ, each with its two values.
    """

    def __init__(self, first: str, second: str,
                 knobs: tuple[tuple[str, object, object], ...]) -> None:
        self.first = first
        self.second = second
        self.knobs = knobs
        super().__init__(first, second, knobs)

    def _message(self) -> str:
        differ = ", ".join(f"{k} ({a!r} vs {b!r})" for k, a, b in self.knobs)
        return (f"arms {self.first!r} and {self.second!r} differ in {len(self.knobs)} knobs: "
                f"{differ}; a comparison attributes an outcome to a knob only when the arms "
                "differ in that knob alone (compare arms that change one knob at a time)")


@final
class UnattributedEvictionError(WitcertError, ValueError):
    """A compression step that changed the cache in a way the eviction meter cannot read as
    dropped tokens: a kept entry that is not a bit-exact copy of an entry the cache held (a
    press that merges, averages or rotates keys or values), or tokens masked in place (a
    head-wise press that hides keys from attention instead of removing them). No eviction
    contract covers such a step, so it is refused instead of metered as a drop.

    Args:
        press: the press (its class name).
        layer: the attention layer where it happened.
        reason: what changed, and how to proceed.
    """

    def __init__(self, press: str, layer: int, reason: str) -> None:
        self.press = press
        self.layer = layer
        self.reason = reason
        super().__init__(press, layer, reason)

    def _message(self) -> str:
        return (f"press {self.press!r} changed the cache of layer {self.layer} in a way that is "
                f"not a drop of tokens: {self.reason}")
