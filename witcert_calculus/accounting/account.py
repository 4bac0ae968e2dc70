"""One request's account: the three admission rules and the state they move.

An account holds a request's budget (a :class:`~witcert_calculus.numerics.probability.Probability`
in ``(0, 1)``), its exact spend, the allowance of its next probabilistic event,
its counters (tallied by :class:`~witcert_calculus.accounting.records.EventKind`, read as
an :class:`~witcert_calculus.accounting.records.EventCounts`), its entry statistics and the
tier of its verdict. It moves in two steps per admission:

1. :meth:`Account.propose` applies the rules to a reading and returns the
   :class:`~witcert_calculus.accounting.events.Admit` event, changing nothing:
   empirical readings never enter the budget (they fall back or degrade the
   verdict), deterministic certificates enter at delta = 0 (Lean:
   ``WitCert.Ledger.two_layer_budget``), probabilistic ones draw the telescoping
   allowance ``delta_req / ((i+1)(i+2))`` and are refused above it (Lean:
   ``WitCert.Ledger.telescope_sum_eq``, ``WitCert.Ledger.telescope_partial_lt``);
   a delta that is exactly an earlier allowance of the account is refused as
   :class:`~witcert_calculus.errors.AllowanceMovedError` (it was read before
   other admissions drew it), any other as
   :class:`~witcert_calculus.errors.BudgetExceededError`.
2. :meth:`Account.apply` applies an event, live or replayed from a journal;
   it refuses an event that does not follow the account's state (wrong
   ordinal, a charge that is not the allowance, a spend that would reach the
   budget) before anything changes.

:class:`EntryBatch` is a step's per-entry bounds, certified, with the step's
bound as a reading: it proposes the batch's event to an account (charged once,
by the same rules) and builds the acknowledgement once the event is applied.

:class:`Accounts` is the directory of a ledger's accounts: request ids are
monotone and never reused, and a closed account stays readable. None of these
is thread-safe; their :class:`~witcert_calculus.ledger.RiskLedger` serializes access.

Main declarations:

- :class:`Account`: one request's state.
- :class:`EntryBatch`: an entry-level admission, certified and ready to propose.
- :class:`Accounts`: the accounts by request id.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, NoReturn, final

import numpy as np
import numpy.typing as npt

from witcert_calculus.accounting.budget import telescoping_delta
from witcert_calculus.accounting.entries import (
    Aggregate,
    EntryCertification,
    certify_entries,
    certify_step,
)
from witcert_calculus.contracts import Reading, Regime, _reading  # pyright: ignore[reportPrivateUsage]
from witcert_calculus.numerics.probability import Probability
from witcert_calculus.errors import (
    AllowanceMovedError,
    BudgetExceededError,
    InvalidValueError,
    JournalError,
    ReusedRequestIdError,
    UnknownRequestError,
)
from witcert_calculus.accounting.events import Admit, AdmitEntries
from witcert_calculus.metrics import Metric, metric_info
from witcert_calculus.accounting.records import (
    Admission,
    Decision,
    EmpiricalPolicy,
    EntryAdmission,
    EventCounts,
    EventKind,
    Verdict,
    certified_by_evidence,
    verdict_reason,
)
from witcert_calculus.accounting.slots import SlotTable
from witcert_calculus.numerics.validation import REQUEST_ID_MAX, request_id as _request_id
from witcert_calculus.tiers import Composition, Evidence, Tier, decide_tier, weakest

__all__ = [
    "Account",
    "Accounts",
    "EntryBatch",
]

_CERTIFICATES = (EventKind.DETERMINISTIC, EventKind.PROBABILISTIC)
_ZERO = Fraction(0)


def _allowance_index(delta: Fraction, budget: Fraction) -> int | None:
    # The i with delta == budget / ((i+1)(i+2)), if there is one (exact: integer square root).
    q = budget / delta
    if q.denominator != 1:
        return None
    k = math.isqrt(q.numerator)
    return k - 1 if k >= 1 and k * (k + 1) == q.numerator else None


def _check_cap(charge: Admit, request_id: int, where: str) -> None:
    # The cap an admission puts on the verdict follows from its kind (the rules of propose):
    # a replayed event whose cap does not is refused, never allowed to change a verdict.
    kind, cap = charge.kind, charge.cap
    if kind is EventKind.EMPIRICAL_DEGRADED:
        rule = "EMPIRICAL" if cap is not Tier.EMPIRICAL else None
    elif kind is EventKind.EMPIRICAL_FALLBACK:
        rule = "CERTIFIED (a fallback takes the exact path)" if cap is not Tier.CERTIFIED \
            else None
    elif charge.saturated != (charge.tier is Tier.SATURATED):
        rule = f"saturated={charge.tier is Tier.SATURATED} for a reading of tier {charge.tier.name}"
    elif charge.saturated:
        rule = "PARTIALLY_CERTIFIED (a saturated certificate)" \
            if cap is not Tier.PARTIALLY_CERTIFIED else None
    else:
        rule = "CERTIFIED or PARTIALLY_CERTIFIED" \
            if cap not in (Tier.CERTIFIED, Tier.PARTIALLY_CERTIFIED) else None
    if rule is not None:
        raise JournalError(where, f"request {request_id}: a {kind.value} admission caps the "
                           f"verdict at {cap.name}; the admission rules give {rule}")


@final
class Account:
    """The state of one request's account.

    Args:
        request_id: the account's id.
        budget: the request's ``delta_req``, in ``(0, 1)``.

    Example:
        >>> import numpy as np
        >>> from witcert_calculus.meters.tv_forms import tv_eform
        >>> from witcert_calculus.meters.witness import RopeLayout, logit_bound
        >>> c = logit_bound(np.array([1.0, 0.0]), np.array([[0.01], [0.02]]),
        ...                 layout=RopeLayout.INTERLEAVED, scale=1.0)
        >>> cert = tv_eform(np.array([0.5, 0.5]), c).reading()  # a meter's reading, delta 0
        >>> acct = Account(1, Probability.budget("1/100"))
        >>> event = acct.propose(cert, EmpiricalPolicy.FALLBACK, token=None)
        >>> acct.apply(event, where="<memory>").spent, acct.allowance
        (Fraction(0, 1), Fraction(1, 200))
    """

    __slots__ = ("_cap", "_saturated", "_tally", "allowance", "budget", "closed", "entries",
                 "entries_kept", "ordinal", "request_id", "spent", "steps",
                 "vacuous_steps", "worst_step_bound")

    def __init__(self, request_id: int, budget: Probability) -> None:
        self.request_id = request_id
        self.budget = budget
        self.spent = Fraction(0)
        self.allowance = telescoping_delta(0, budget)  # next probabilistic event's, kept current
        self.ordinal = 0
        self._tally = dict.fromkeys(EventKind, 0)
        self._saturated = 0
        self._cap = Tier.CERTIFIED  # the weakest cap of the admissions so far
        self.entries = 0
        self.entries_kept = 0
        self.steps = 0
        self.vacuous_steps = 0
        self.worst_step_bound = 0.0
        self.closed = False

    def propose(self, reading: Reading[Any], policy: EmpiricalPolicy, *,
                token: str | None) -> Admit:
        """The admission event of ``reading`` under the three rules; the account does not change.

        Args:
            reading: the certificate (or empirical reading).
            policy: what an empirical reading does.
            token: the caller's idempotency token, if any.

        Returns:
            The event: its kind, the allowance it draws and the tier it caps the verdict to.

        Raises:
            InvalidValueError: for a non-reading or a bad policy.
            AllowanceMovedError: if that delta is the allowance of an earlier
                probabilistic event (read before other admissions drew it).
            BudgetExceededError: if a probabilistic reading's delta exceeds the
                next telescoping allowance.
        """
        if not isinstance(reading, Reading):
            raise InvalidValueError("reading", reading, "must be a Reading")
        if not isinstance(policy, EmpiricalPolicy):
            raise InvalidValueError("on_empirical", policy, "must be an EmpiricalPolicy")
        intrinsic = decide_tier(reading.evidence)
        kind, charged = EventKind.DETERMINISTIC, _ZERO
        if reading.regime is not Regime.BOUND or intrinsic is Tier.EMPIRICAL:
            # Rule 1: empirical objects never enter the budget.
            if policy is EmpiricalPolicy.FALLBACK:
                kind, cap = EventKind.EMPIRICAL_FALLBACK, Tier.CERTIFIED
            else:
                kind, cap = EventKind.EMPIRICAL_DEGRADED, Tier.EMPIRICAL
        else:
            cap = Tier.PARTIALLY_CERTIFIED if reading.tier is Tier.SATURATED else intrinsic
            delta = reading.delta if isinstance(reading.delta, Fraction) else Fraction(
                reading.delta)
            # Rule 2 (delta = 0): WitCert.Ledger.two_layer_budget.
            if delta != 0:
                # Rule 3: WitCert.Ledger.telescope_sum_eq / telescope_partial_lt.
                if delta > self.allowance:
                    self._refuse(delta)
                kind, charged = EventKind.PROBABILISTIC, self.allowance
        return Admit(request_id=self.request_id, ordinal=self.ordinal, kind=kind,
                     charged=charged, cap=cap, tier=reading.tier,
                     saturated=reading.tier is Tier.SATURATED, token=token)

    def _refuse(self, delta: Fraction) -> NoReturn:
        # A delta that is exactly an earlier allowance of this account was read before
        # other admissions drew it: say so, rather than blame the budget.
        due_index = self._tally[EventKind.PROBABILISTIC]
        read_index = _allowance_index(delta, self.budget.exact)
        if read_index is not None and read_index < due_index:
            raise AllowanceMovedError(self.request_id, delta, read_index, self.allowance,
                                      due_index, self.spent, self.budget.to_text())
        raise BudgetExceededError(self.request_id, str(self.spent), str(delta),
                                  self.budget.to_text(), str(self.allowance))

    def apply(self, event: Admit | AdmitEntries, *, where: str,
              before: Callable[[], None] | None = None) -> Admission:
        """Apply an admission (live or replayed); return its acknowledgement.

        The event is first checked against the account, and nothing changes when
        it does not follow the account's state.

        Args:
            event: the admission, or an entry batch.
            where: the journal path, for the error message.
            before: run once the checks pass and before the account changes
                (the ledger writes an entry batch's slots there).

        Returns:
            The acknowledgement: kind, decision, charge and the exact spend after it.

        Raises:
            JournalError: for an ordinal other than the account's (an event
                applied twice), a charge other than the allowance, or a spend
                that would reach the budget.
        """
        charge = event.charge if isinstance(event, AdmitEntries) else event
        kind, charged = charge.kind, charge.charged
        _check_cap(charge, self.request_id, where)
        if charge.ordinal != self.ordinal:
            raise JournalError(where, f"request {self.request_id}: event ordinal "
                               f"{charge.ordinal} applied at ordinal {self.ordinal} "
                               "(applied twice?)")
        spent = self.spent
        if kind is EventKind.PROBABILISTIC:
            expected = self.allowance
            if charged is not expected and charged != expected:
                raise JournalError(where, f"request {self.request_id}: charge {charged} "
                                   f"is not the allowance {expected}")
            spent = spent + charged
            if spent >= self.budget.exact:  # cannot happen: WitCert.Ledger.telescope_partial_lt
                raise JournalError(where, f"request {self.request_id}: spend {spent} "
                                   f"reaches its budget {self.budget.to_text()}")
        elif charged != 0:
            raise JournalError(where, f"{kind.value} event charged {charged}")
        if before is not None:
            before()
        if isinstance(event, AdmitEntries):
            self.entries += event.n_entries
            self.entries_kept += event.n_kept
            self.steps += 1
            if kind is not EventKind.EMPIRICAL_FALLBACK:
                if event.vacuous:
                    self.vacuous_steps += 1
                self.worst_step_bound = max(self.worst_step_bound, event.step_bound)
        prob_index: int | None = None
        if kind is EventKind.PROBABILISTIC:
            prob_index = self._tally[kind]
            self.allowance = telescoping_delta(prob_index + 1, self.budget)
        self._tally[kind] += 1
        if charge.saturated and kind in _CERTIFICATES:
            self._saturated += 1
        self.spent = spent
        self._cap = weakest(self._cap, charge.cap)
        ordinal = self.ordinal
        self.ordinal += 1
        return Admission(request_id=self.request_id, ordinal=ordinal, kind=kind,
                         decision=Decision.FALLBACK if kind is EventKind.EMPIRICAL_FALLBACK
                         else Decision.USE,
                         tier=charge.tier, charged=charged, spent=spent,
                         prob_index=prob_index, token=charge.token)

    @property
    def tier(self) -> Tier:
        """The verdict's tier: the weakest cap of the admissions, and ``EMPIRICAL`` without a
        certificate (no evidence, no certificate)."""
        return certified_by_evidence(self._cap, self.counts)

    @property
    def counts(self) -> EventCounts:
        """Admissions so far, by kind."""
        return EventCounts.of(self._tally, saturated=self._saturated)

    def close(self) -> Verdict:
        """Close the account; return its final verdict."""
        self.closed = True
        return self.verdict()

    @property
    def spent_fraction(self) -> Fraction:
        """``spent / delta_req`` (always < 1)."""
        return self.spent / self.budget.exact

    def verdict(self) -> Verdict:
        """The account's verdict now (below ``CERTIFIED``, with the reason)."""
        counts = self.counts
        tier = certified_by_evidence(self._cap, counts)
        return Verdict(
            request_id=self.request_id, tier=tier, delta_req=self.budget.exact,
            spent=self.spent, counts=self.counts, entries=self.entries,
            entries_kept=self.entries_kept,
            retained_fraction=None if self.entries == 0 else Fraction(self.entries_kept,
                                                                      self.entries),
            steps=self.steps, vacuous_steps=self.vacuous_steps,
            worst_step_bound=self.worst_step_bound, closed=self.closed,
            reason=verdict_reason(tier, counts, vacuous_steps=self.vacuous_steps))


@final
@dataclass(frozen=True, slots=True, eq=False)
class EntryBatch:
    """A step's per-entry bounds, certified, with the step's bound as a reading.

    Attributes:
        certification: which entries keep the compressed value, and the step bound.
        step: the step's bound as a reading of the batch's metric, its tier
            decided from the evidence and the metric's saturation (Lean:
            ``WitCert.Ledger.entry_fallback_sound``).
        bounds: the per-entry bounds, as float64.
        slots: the pool slots the entries are written to (one per entry, validated), or ``None``.

    Example:
        >>> import numpy as np
        >>> from witcert_calculus.meters.tv_forms import tv_eform
        >>> from witcert_calculus.meters.witness import RopeLayout, logit_bound
        >>> c = logit_bound(np.array([1.0, 0.0]), np.array([[0.01], [0.02]]),
        ...                 layout=RopeLayout.INTERLEAVED, scale=1.0)
        >>> cert = tv_eform(np.array([0.5, 0.5]), c).reading()  # a meter's reading, delta 0
        >>> from witcert_calculus.metrics import AttentionTV, AtConsume
        >>> batch = EntryBatch.certify([0.01, 0.5], threshold=0.1, metric=AttentionTV[AtConsume],
        ...                            evidence=cert.evidence, delta=0)
        >>> acct = Account(1, Probability.budget("1/100"))
        >>> event = batch.propose(acct, EmpiricalPolicy.FALLBACK, token=None)
        >>> event.n_entries, event.n_kept
        (2, 1)
        >>> ack = batch.acknowledge(acct.apply(event, where="<memory>"))
        >>> ack.certification.keep.tolist(), ack.step is batch.step
        ([True, False], True)
    """

    certification: EntryCertification
    step: Reading[Any]
    bounds: npt.NDArray[np.float64]
    slots: npt.NDArray[np.int64] | None

    @classmethod
    def certify(cls, bounds: npt.ArrayLike, *, threshold: float, metric: type[Metric[Any]],
                evidence: Evidence, delta: Fraction | float | int,
                aggregate: Aggregate = Aggregate.SUM, whole_step: bool = False,
                slots: npt.ArrayLike | None = None,
                table: SlotTable | None = None) -> EntryBatch:
        """Certify a step's per-entry bounds (per entry, or the step as a whole).

        Args:
            bounds: per-entry bounds (``>= 0``, ``+inf`` for no bound).
            threshold: per-entry (or, whole-step, per-step) threshold.
            metric: metric of the bounds, e.g. ``AttentionTV[AtConsume]``.
            evidence: what certifies the per-entry bounds.
            delta: failure probability of those bounds (0 for deterministic).
            aggregate: how entry bounds combine into the step bound.
            whole_step: certify the step as a whole instead of per entry.
            slots: pool slots the entries are written to (one per entry), or ``None``.
            table: the slot table that ``slots`` index (needed with ``slots``).

        Returns:
            The certified batch.

        Raises:
            InvalidValueError: for NaN or negative bounds, a bad threshold, bad
                or repeated slots, a slot count that does not match, or slots
                without their table.
            NotAMetricError, UnregisteredMetricError: as
                :func:`~witcert_calculus.metrics.metric_info`.
        """
        info = metric_info(metric)
        cert_fn = certify_step if whole_step else certify_entries
        cert = cert_fn(bounds, threshold=threshold, aggregate=aggregate,
                       saturation=info.saturation)
        b = np.asarray(bounds, dtype=np.float64)
        idx: npt.NDArray[np.int64] | None = None
        if slots is not None:
            if table is None:
                raise InvalidValueError("table", table, "must be the slot table that slots index")
            idx = table.validate_slots(slots)
            if idx.size != cert.n_entries:
                raise InvalidValueError("slots", f"{idx.size} slots",
                                        f"must name one slot per entry ({cert.n_entries})")
        step: Reading[Any] = _reading(metric, cert.step_bound,
                                     evidence=Composition((evidence,), theorem=cert.theorem),
                                     delta=delta)
        return cls(certification=cert, step=step, bounds=b, slots=idx)

    def propose(self, account: Account, policy: EmpiricalPolicy, *,
                token: str | None, gens: npt.NDArray[np.int64] | None = None) -> AdmitEntries:
        """The batch's admission event into ``account``, charged once; the account does not change.

        Args:
            account: the open account of the request.
            policy: what an empirical reading does (no entry is kept under fallback).
            token: the caller's idempotency token, if any.
            gens: the generations of the batch's slots before the write (recorded
                in the event), or ``None``.

        Returns:
            The event: the step reading's charge (as :meth:`Account.propose`
            makes it) next to the entries kept and the slot write.

        Raises:
            AllowanceMovedError, BudgetExceededError, InvalidValueError: as
                :meth:`Account.propose`.
        """
        charge = account.propose(self.step, policy, token=token)
        return AdmitEntries.of(charge, self.certification, slots=self.slots, bounds=self.bounds,
                               gens=gens)

    def acknowledge(self, admission: Admission) -> EntryAdmission:
        """The acknowledgement of the batch, from the admission its event returned.

        An empirical fallback keeps no entry; an empirical batch (fallback or
        degraded) reports no step reading.

        Args:
            admission: the acknowledgement of the batch's charge.

        Returns:
            The entry-level acknowledgement.
        """
        cert = self.certification
        if admission.kind is EventKind.EMPIRICAL_FALLBACK:
            cert = cert.none_kept()
        empirical = admission.kind in (EventKind.EMPIRICAL_FALLBACK, EventKind.EMPIRICAL_DEGRADED)
        return EntryAdmission(admission=admission, certification=cert,
                              step=None if empirical else self.step)


@final
class Accounts:
    """A ledger's accounts by request id; ids are monotone and never reused.

    Example:
        >>> book = Accounts()
        >>> book.add(book.next_id(None), Probability.budget("1/10"), where="<memory>")
        1
        >>> book.open_account(1).allowance, book.next_id(5)
        (Fraction(1, 20), 5)
    """

    __slots__ = ("_by_id", "_last_id")

    def __init__(self) -> None:
        self._by_id: dict[int, Account] = {}
        self._last_id = 0

    def __len__(self) -> int:
        return len(self._by_id)

    def __iter__(self) -> Iterator[Account]:
        return iter(self._by_id.values())

    def ids(self) -> tuple[int, ...]:
        """Every request id ever opened, ascending."""
        return tuple(sorted(self._by_id))

    def next_id(self, want: int | None) -> int:
        """The id a new request gets: ``want``, or the next one after the last.

        Raises:
            ReusedRequestIdError: if ``want`` does not exceed the last id.
            InvalidValueError: if ``want`` is not a request id (an int, not bool, in
                ``[1, 2**63 - 1]``; :func:`~witcert_calculus.numerics.validation.request_id`).
        """
        rid = self._last_id + 1 if want is None else _request_id("request_id", want)
        if rid <= self._last_id:
            raise ReusedRequestIdError(rid, self._last_id)
        if rid > REQUEST_ID_MAX:  # the assigned ids ran out (a journal that used the last one)
            raise InvalidValueError("request_id", rid, "must lie in [1, 2**63 - 1] (a request id)")
        return rid

    def add(self, request_id: int, budget: Probability, *, where: str) -> int:
        """Open the account of a new request id; return the id.

        Raises:
            JournalError: if the id does not exceed the last one (a replayed id reused).
        """
        if request_id <= self._last_id:
            raise JournalError(where, f"request id {request_id} reused")
        self._last_id = request_id
        self._by_id[request_id] = Account(request_id, budget)
        return request_id

    def is_open(self, request_id: object) -> bool:
        """Whether ``request_id`` names an open account.

        Raises:
            InvalidValueError: if ``request_id`` is not a request id (one rule everywhere:
                :func:`~witcert_calculus.numerics.validation.request_id`).
        """
        acct = self._by_id.get(_request_id("request_id", request_id))
        return acct is not None and not acct.closed

    def get(self, request_id: object) -> Account:
        """The account of an id ever opened (open or closed).

        Raises:
            InvalidValueError: if ``request_id`` is not an int.
            UnknownRequestError: for an id never opened.
        """
        acct = self._by_id.get(_request_id("request_id", request_id))
        if acct is None:
            raise UnknownRequestError(request_id)
        return acct

    def open_account(self, request_id: object) -> Account:
        """The account of an open request.

        Raises:
            InvalidValueError: if ``request_id`` is not an int.
            UnknownRequestError: for an id never opened, or closed.
        """
        acct = self.get(request_id)
        if acct.closed:
            raise UnknownRequestError(request_id)
        return acct

    def live(self, request_id: int, *, where: str) -> Account:
        """The open account a replayed event names.

        Raises:
            JournalError: if the request is not open.
        """
        acct = self._by_id.get(request_id)
        if acct is None or acct.closed:
            raise JournalError(where, f"event for request {request_id}, which is not open")
        return acct
