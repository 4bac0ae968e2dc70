"""What the risk ledger reports: admission vocabulary, acknowledgements, verdicts, aggregates.

Every record is a frozen, slotted value; exact quantities (charges, spends,
budgets, retained fractions) are ``Fraction`` values. Each record checks its fields once,
at construction (also through ``dataclasses.replace``): counts are ints ``>= 0`` (numpy
integers taken as ints), request ids follow the one rule of
:func:`~witcert_calculus.numerics.validation.request_id`, exact quantities are
nonnegative ``Fraction`` values, and enumerations are members of their enum; anything
else is an :class:`~witcert_calculus.errors.InvalidValueError` naming the field.

Main declarations:

- :class:`EmpiricalPolicy`, :class:`EventKind`, :class:`Decision`
- :class:`EventCounts`: admissions counted by :class:`EventKind`, plus saturated certificates.
- :class:`Admission`, :class:`EntryAdmission`: acknowledgements of one admission.
- :class:`Verdict`: a request's verdict; :func:`certified_by_evidence`, :func:`verdict_reason`:
  no evidence, no certificate, and why a verdict is below ``CERTIFIED``.
- :class:`LedgerStats`: aggregates over a whole ledger (what the Prometheus export shows),
  built from the accounts by :meth:`LedgerStats.of`.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Protocol, cast, final

from witcert_calculus.accounting.entries import EntryCertification
from witcert_calculus.accounting.slots import SlotState, SlotTable
from witcert_calculus.contracts import Reading
from witcert_calculus.drift.eprocess import EProcessState
from witcert_calculus.errors import InvalidValueError
from witcert_calculus.numerics.validation import nonneg_int, real, request_id
from witcert_calculus.tiers import Tier

__all__ = [
    "Admission",
    "Decision",
    "EmpiricalPolicy",
    "EntryAdmission",
    "EventCounts",
    "EventKind",
    "LedgerStats",
    "Verdict",
    "certified_by_evidence",
    "verdict_reason",
]


def _counts(record: object, *names: str) -> None:
    for n in names:
        object.__setattr__(record, n, nonneg_int(n, getattr(record, n)))


def _member(record: object, name: str, kind: type) -> None:
    if not isinstance(getattr(record, name), kind):
        raise InvalidValueError(name, getattr(record, name), f"must be a {kind.__name__}")


def _pairs_of(pairs: object, kind: type) -> bool:
    if not isinstance(pairs, tuple):
        return False
    items = cast("tuple[object, ...]", pairs)
    return all(isinstance(p, tuple) and len(cast("tuple[object, ...]", p)) == 2
               and isinstance(cast("tuple[object, ...]", p)[0], kind) for p in items)


def _exact(record: object, name: str, *, optional: bool = False) -> None:
    v = getattr(record, name)
    if optional and v is None:
        return
    if not isinstance(v, Fraction) or v < 0:
        raise InvalidValueError(name, v, "must be an exact Fraction >= 0")


@final
class EmpiricalPolicy(enum.Enum):
    """What an empirical reading does to a request (chosen by the caller)."""

    FALLBACK = "fallback"
    """Take the exact path: the compressed value is not used, the verdict is unchanged."""
    DEGRADE = "degrade"
    """Use the value, and degrade the request's verdict to ``EMPIRICAL``."""


@final
class EventKind(enum.Enum):
    """Kinds of admission events, counted per request."""

    DETERMINISTIC = "deterministic"
    PROBABILISTIC = "probabilistic"
    EMPIRICAL_FALLBACK = "empirical_fallback"
    EMPIRICAL_DEGRADED = "empirical_degraded"


@final
class Decision(enum.Enum):
    """What the caller does with the admitted object."""

    USE = "use"
    """Use the compressed value (or, for entries, the kept ones)."""
    FALLBACK = "fallback"
    """Use the exact path."""


@final
@dataclass(frozen=True, slots=True)
class EventCounts:
    """Admissions of a request by kind, plus how many certificates were saturated.

    Attributes:
        deterministic: certificates admitted at delta = 0.
        probabilistic: certificates that drew a telescoping allowance.
        empirical_fallback: empirical readings that sent the caller to the exact path.
        empirical_degraded: empirical readings used, degrading the verdict.
        saturated: admitted certificates whose bound reached saturation (vacuous).

    Example:
        >>> c = EventCounts.of({EventKind.PROBABILISTIC: 2}, saturated=1)
        >>> c[EventKind.PROBABILISTIC], c.saturated, (c + c).total
        (2, 1, 4)
    """

    deterministic: int = 0
    probabilistic: int = 0
    empirical_fallback: int = 0
    empirical_degraded: int = 0
    saturated: int = 0

    def __post_init__(self) -> None:
        _counts(self, "deterministic", "probabilistic", "empirical_fallback",
                "empirical_degraded", "saturated")

    @property
    def total(self) -> int:
        """All admissions."""
        return (self.deterministic + self.probabilistic + self.empirical_fallback
                + self.empirical_degraded)

    def __getitem__(self, kind: EventKind) -> int:
        """Admissions of one kind."""
        match kind:
            case EventKind.DETERMINISTIC:
                return self.deterministic
            case EventKind.PROBABILISTIC:
                return self.probabilistic
            case EventKind.EMPIRICAL_FALLBACK:
                return self.empirical_fallback
            case EventKind.EMPIRICAL_DEGRADED:
                return self.empirical_degraded

    @classmethod
    def of(cls, tally: Mapping[EventKind, int], *, saturated: int = 0) -> EventCounts:
        """Counts from admissions tallied by kind (kinds missing from ``tally`` count 0)."""
        return cls(deterministic=tally.get(EventKind.DETERMINISTIC, 0),
                   probabilistic=tally.get(EventKind.PROBABILISTIC, 0),
                   empirical_fallback=tally.get(EventKind.EMPIRICAL_FALLBACK, 0),
                   empirical_degraded=tally.get(EventKind.EMPIRICAL_DEGRADED, 0),
                   saturated=saturated)

    def __add__(self, other: EventCounts) -> EventCounts:
        """Counts of two sets of admissions together."""
        return EventCounts(
            deterministic=self.deterministic + other.deterministic,
            probabilistic=self.probabilistic + other.probabilistic,
            empirical_fallback=self.empirical_fallback + other.empirical_fallback,
            empirical_degraded=self.empirical_degraded + other.empirical_degraded,
            saturated=self.saturated + other.saturated)


@final
@dataclass(frozen=True, slots=True)
class Admission:
    """Acknowledgement of one admission (durable when the ledger has a journal).

    Attributes:
        request_id: the account.
        ordinal: 0-based position of this event among the account's admissions.
        kind: deterministic, probabilistic, empirical fallback or empirical degraded.
        decision: use the value or fall back.
        tier: the tier of the admitted reading.
        charged: the telescoping allowance drawn (0 unless probabilistic).
        spent: the account's exact spend after this event.
        prob_index: the index ``i`` of a probabilistic event, else ``None``.
        token: the caller's idempotency token, if any.
    """

    request_id: int
    ordinal: int
    kind: EventKind
    decision: Decision
    tier: Tier
    charged: Fraction
    spent: Fraction
    prob_index: int | None
    token: str | None

    def __post_init__(self) -> None:
        object.__setattr__(self, "request_id", request_id("request_id", self.request_id))
        _counts(self, "ordinal")
        _member(self, "kind", EventKind)
        _member(self, "decision", Decision)
        _member(self, "tier", Tier)
        _exact(self, "charged")
        _exact(self, "spent")
        if self.prob_index is not None:
            _counts(self, "prob_index")
        if self.token is not None and not isinstance(self.token, str):
            raise InvalidValueError("token", self.token, "must be a str or None")


@final
@dataclass(frozen=True, slots=True)
class EntryAdmission:
    """Acknowledgement of an entry-level (or whole-step) admission.

    Attributes:
        admission: the ledger event (the batch is charged once).
        certification: which entries keep the compressed value.
        step: the step's bound as a reading (tier decided from its evidence and
            saturation), or ``None`` for an empirical batch.
    """

    admission: Admission
    certification: EntryCertification
    step: Reading[Any] | None


@final
@dataclass(frozen=True, slots=True)
class Verdict:
    """A request's verdict.

    No evidence, no certificate: a request is ``CERTIFIED`` only when at least
    one certificate (deterministic or probabilistic) was admitted into it and
    nothing capped it; a request with no admission, or with empirical
    fallbacks only, is ``EMPIRICAL``. Otherwise a restricted certificate or a
    saturated (vacuous) one caps it at ``PARTIALLY_CERTIFIED``, and an empirical
    reading used under :attr:`EmpiricalPolicy.DEGRADE` sets it to ``EMPIRICAL``.
    Below ``CERTIFIED``, :attr:`reason` says why.

    Attributes:
        request_id: the account.
        tier: ``CERTIFIED``, ``PARTIALLY_CERTIFIED`` or ``EMPIRICAL``.
        delta_req: the budget.
        spent: exact spend, ``delta_req (1 - 1/(n+1))`` after ``n`` probabilistic events.
        counts: admissions by kind.
        entries: entries offered to entry-level admission.
        entries_kept: entries that kept the compressed value.
        retained_fraction: ``entries_kept / entries`` (``None`` when no entries
            were offered). Retention is not coverage: read it with ``vacuous_steps``.
        steps: entry batches admitted.
        vacuous_steps: batches whose step bound reached the metric's saturation.
        worst_step_bound: largest step bound over the batches (0.0 if none).
        closed: whether the request was closed.
        reason: why the tier is below ``CERTIFIED`` (``None`` when it is not);
            see :func:`verdict_reason`.

    Raises:
        InvalidValueError: for a ``CERTIFIED`` tier without a certificate in
            ``counts`` (no evidence, no certificate), or a reason that does not
            match the tier (given for ``CERTIFIED``, missing below it).
    """

    request_id: int
    tier: Tier
    delta_req: Fraction
    spent: Fraction
    counts: EventCounts
    entries: int
    entries_kept: int
    retained_fraction: Fraction | None
    steps: int
    vacuous_steps: int
    worst_step_bound: float
    closed: bool
    reason: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "request_id", request_id("request_id", self.request_id))
        _member(self, "tier", Tier)
        _exact(self, "delta_req")
        _exact(self, "spent")
        _member(self, "counts", EventCounts)
        _counts(self, "entries", "entries_kept", "steps", "vacuous_steps")
        _exact(self, "retained_fraction", optional=True)
        object.__setattr__(self, "worst_step_bound",
                           real("worst_step_bound", self.worst_step_bound, lo=0.0,
                                allow_inf=True))
        _member(self, "closed", bool)
        if self.reason is not None and not isinstance(self.reason, str):
            raise InvalidValueError("reason", self.reason, "must be a str or None")
        if self.tier is Tier.CERTIFIED:
            if self.counts.deterministic + self.counts.probabilistic == 0:
                raise InvalidValueError("tier", self.tier.name, "no evidence, no certificate: "
                                        "a verdict without an admitted certificate is not "
                                        f"CERTIFIED ({verdict_reason(self.tier, self.counts)})")
            if self.reason is not None:
                raise InvalidValueError("reason", self.reason, "a CERTIFIED verdict has none")
        elif self.reason is None:
            raise InvalidValueError("reason", None, f"a {self.tier.name} verdict says why "
                                    "(see verdict_reason)")

    @property
    def cap(self) -> Tier:
        """The weakest cap of the admissions alone, before the no-evidence rule.

        What a later certificate would leave the tier at: ``CERTIFIED`` for a request
        with no admission or only empirical fallbacks (whose ``tier`` is ``EMPIRICAL``
        for want of evidence), else :attr:`tier`. A fleet reduces it over its ranks.
        """
        c = self.counts
        if c.deterministic + c.probabilistic + c.empirical_degraded == 0:
            return Tier.CERTIFIED
        return self.tier

    @property
    def remaining(self) -> Fraction:
        """``delta_req - spent`` (always > 0)."""
        return self.delta_req - self.spent


def certified_by_evidence(tier: Tier, counts: EventCounts) -> Tier:
    """The tier a request's admissions earn: ``tier``, but never ``CERTIFIED`` without evidence.

    A request into which no certificate (deterministic or probabilistic) was
    admitted has no metered bound behind it: with no admission, or with
    empirical fallbacks only, it is ``EMPIRICAL``.

    Example:
        >>> certified_by_evidence(Tier.CERTIFIED, EventCounts())
        <Tier.EMPIRICAL: 1>
        >>> certified_by_evidence(Tier.CERTIFIED, EventCounts(deterministic=1))
        <Tier.CERTIFIED: 3>
    """
    if counts.deterministic + counts.probabilistic == 0 and tier > Tier.EMPIRICAL:
        return Tier.EMPIRICAL
    return tier


def verdict_reason(tier: Tier, counts: EventCounts, *, vacuous_steps: int = 0) -> str | None:
    """Why a verdict of ``tier`` with these admissions is below ``CERTIFIED`` (``None`` if not).

    Args:
        tier: the verdict's tier.
        counts: the request's admissions by kind.
        vacuous_steps: entry batches whose step bound reached saturation.

    Example:
        >>> verdict_reason(Tier.EMPIRICAL, EventCounts())
        'no evidence: no reading was admitted, so nothing certifies the request'
        >>> verdict_reason(Tier.EMPIRICAL, EventCounts(empirical_fallback=2))
        'no evidence: 2 empirical fallbacks (exact path) and no certificate were admitted'
    """
    if tier is Tier.CERTIFIED:
        return None
    certificates = counts.deterministic + counts.probabilistic
    parts: list[str] = []
    if counts.total == 0:
        parts.append("no evidence: no reading was admitted, so nothing certifies the request")
    elif certificates == 0 and counts.empirical_degraded == 0:
        parts.append(f"no evidence: {counts.empirical_fallback} empirical fallback"
                     f"{'s' if counts.empirical_fallback != 1 else ''} (exact path) and no "
                     "certificate were admitted")
    if counts.empirical_degraded:
        parts.append(f"{counts.empirical_degraded} empirical reading"
                     f"{'s' if counts.empirical_degraded != 1 else ''} used under DEGRADE"
                     + (" and no certificate admitted" if certificates == 0 else ""))
    if counts.saturated or vacuous_steps:
        parts.append(f"{counts.saturated} saturated certificate"
                     f"{'s' if counts.saturated != 1 else ''} and {vacuous_steps} vacuous "
                     f"step{'s' if vacuous_steps != 1 else ''} (a bound at saturation says "
                     "nothing)")
    if not parts:
        parts.append("a certificate held only on a decidable subset (restricted)"
                     if tier is Tier.PARTIALLY_CERTIFIED else
                     f"the request was capped at {tier.name}")
    return "; ".join(parts)


class _Tallied(Protocol):
    # What LedgerStats.of reads of an account (witcert_calculus.accounting.account.Account).
    @property
    def counts(self) -> EventCounts: ...
    @property
    def entries(self) -> int: ...
    @property
    def entries_kept(self) -> int: ...
    @property
    def steps(self) -> int: ...
    @property
    def vacuous_steps(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    @property
    def tier(self) -> Tier: ...
    @property
    def spent_fraction(self) -> Fraction: ...


@final
@dataclass(frozen=True, slots=True)
class LedgerStats:
    """Aggregates over the whole ledger (no per-request detail).

    Attributes:
        requests: requests ever opened.
        open_requests: requests open now.
        counts: admissions by kind, over all requests.
        open_by_tier: ``(tier, open requests with that verdict)``, strongest first.
        entries: entries offered to entry-level admission.
        entries_kept: entries that kept the compressed value.
        steps: entry batches admitted.
        vacuous_steps: batches whose step bound reached saturation.
        worst_spent_fraction: largest ``spent / delta_req`` over open requests (< 1).
        slots: ``(state, slots in that state)``.
        reads_own: slot reads by their owner (this process).
        reads_shared: slot reads of another request's slot (this process).
        slot_writes: slot writes applied.
        events: events applied.
        sentinels: ``(name, state)`` of each drift sentinel.
    """

    requests: int
    open_requests: int
    counts: EventCounts
    open_by_tier: tuple[tuple[Tier, int], ...]
    entries: int
    entries_kept: int
    steps: int
    vacuous_steps: int
    worst_spent_fraction: Fraction
    slots: tuple[tuple[SlotState, int], ...]
    reads_own: int
    reads_shared: int
    slot_writes: int
    events: int
    sentinels: tuple[tuple[str, EProcessState], ...]

    def __post_init__(self) -> None:
        _counts(self, "requests", "open_requests", "entries", "entries_kept", "steps",
                "vacuous_steps", "reads_own", "reads_shared", "slot_writes", "events")
        _member(self, "counts", EventCounts)
        _exact(self, "worst_spent_fraction")
        for name, kind in (("open_by_tier", Tier), ("slots", SlotState), ("sentinels", str)):
            pairs: object = getattr(self, name)
            if not _pairs_of(pairs, kind):
                raise InvalidValueError(name, pairs, f"must be a tuple of ({kind.__name__}, "
                                        "value) pairs")

    @classmethod
    def of(cls, accounts: Iterable[_Tallied], *, slots: SlotTable, events: int,
           sentinels: tuple[tuple[str, EProcessState], ...]) -> LedgerStats:
        """Aggregate a ledger's accounts, next to its slot table, event count and sentinels.

        Args:
            accounts: every account ever opened (open or closed).
            slots: the ledger's slot table (its counts by state, reads and writes).
            events: events applied.
            sentinels: ``(name, state)`` of each drift sentinel.

        Returns:
            The aggregates; the tiers and the spend fraction count open requests only.

        Example:
            >>> import threading
            >>> from witcert_calculus.accounting.account import Accounts
            >>> from witcert_calculus.numerics.probability import Probability
            >>> class Directory:
            ...     def require_known(self, request_id: int) -> None: ...
            ...     def sync(self) -> None: ...
            >>> table = SlotTable(2, directory=Directory(), lock=threading.RLock(), key=object())
            >>> book = Accounts()
            >>> book.add(1, Probability.budget("1/10"), where="<memory>")
            1
            >>> s = LedgerStats.of(book, slots=table, events=1, sentinels=())
            >>> s.requests, s.open_requests, s.open_by_tier[0], s.slots[0]
            (1, 1, (<Tier.CERTIFIED: 3>, 0), (<SlotState.UNWRITTEN: 0>, 2))
            >>> s.open_by_tier[2]  # nothing admitted yet: no evidence, no certificate
            (<Tier.EMPIRICAL: 1>, 1)
        """
        counts = EventCounts()
        tiers = {Tier.CERTIFIED: 0, Tier.PARTIALLY_CERTIFIED: 0, Tier.EMPIRICAL: 0}
        requests = open_n = entries = kept = steps = vac = 0
        worst = Fraction(0)
        for a in accounts:
            requests += 1
            counts = counts + a.counts
            entries += a.entries
            kept += a.entries_kept
            steps += a.steps
            vac += a.vacuous_steps
            if not a.closed:
                open_n += 1
                tiers[a.tier] += 1
                worst = max(worst, a.spent_fraction)
        own, shared = slots.reads
        return cls(
            requests=requests, open_requests=open_n, counts=counts,
            open_by_tier=tuple(sorted(tiers.items(), reverse=True)),
            entries=entries, entries_kept=kept, steps=steps, vacuous_steps=vac,
            worst_spent_fraction=worst,
            slots=tuple(sorted(slots.counts().items())), reads_own=own,
            reads_shared=shared, slot_writes=slots.writes, events=events, sentinels=sentinels)
