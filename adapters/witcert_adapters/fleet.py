"""Beyond one process: a request served by several ranks, with one account and one verdict.

A tensor-parallel group of ``R`` ranks serves each request; rank ``r`` holds the
attention heads of its :class:`~witcert_adapters.head_shards.HeadShard` and meters only
those. Each rank keeps its own :class:`~witcert_calculus.ledger.RiskLedger` (optionally
with its own journal) in which the request's account has the budget share ``delta_req / R``. Per
decode step the ranks admit their own entries locally, then reduce, with ``torch.distributed`` (gloo
on CPU, NCCL where present), with one collective per step for all requests of the step at
once (an ``all_gather`` of every rank's rows, reduced identically on every rank):

- per-request meter maxima (max), any-of gates (some entry fell back, some rank's step
  bound was vacuous), coverage counts (entries kept and offered; sums), the ranks that
  admitted no certificate (sums) and the weakest local cap (min;
  :attr:`~witcert_calculus.accounting.records.Verdict.cap`: the no-evidence rule is applied
  to the fleet's own counts, so one certified step after empirical ones is evidence);
- agreement checks (min and max): the request ids of the step, and each request's count
  of probabilistic events.

**One budget, spent once.** The ``i``-th probabilistic step of a request draws, on every
rank, that rank's telescoping allowance ``(delta_req / R) / ((i+1)(i+2))``
(:func:`~witcert_calculus.accounting.budget.telescoping_delta` of the share): the rank's
certificates for its heads are built at that delta, and by the union bound over the
``R`` shards the step fails with probability at most
``R (delta_req / R) / ((i+1)(i+2)) = delta_req / ((i+1)(i+2))`` — the allowance a single
process would draw for the whole step, not ``R`` times it. Every rank derives ``i`` from
its own account, deterministically; the reduction checks that all ranks agree, so after
``n`` probabilistic steps the request has spent exactly
``telescoping_spent(n, delta_req)`` (each rank ``telescoping_spent(n, delta_req / R)``).
A disagreement is refused with :class:`~witcert_calculus.errors.AdmissionError` on every
rank, and the request's verdict fails closed. Each rank's spend stays below its share
whatever the others do (Lean: ``WitCert.Ledger.telescope_partial_lt``), so the request's
total stays below ``delta_req`` even then.

**Failing closed.** Collectives run under the process group's timeout. When one fails
(a rank died, or stopped answering), the surviving ranks do not certify the request:
every open request is degraded to ``EMPIRICAL`` in the local ledger (so the rank's
journal records it), the ledger stops using the group, and every later verdict reports
``complete=False``.

The ranks' journals merge offline into one account per request
(:func:`~witcert_adapters.journal_merge.merge_journals`).


Main declarations:

- :class:`FleetLedger`: a rank's side of the fleet; :class:`FleetStep`, :class:`FleetVerdict`
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, final

import numpy as np
import torch

from witcert_adapters.head_shards import (
    HeadShard,
    all_gather,
    check_sharding,
    group_device,
    group_world,
)
from witcert_calculus.accounting.budget import telescoping_delta, telescoping_spent
from witcert_calculus.accounting.entries import Aggregate
from witcert_calculus.accounting.records import (
    Decision,
    EmpiricalPolicy,
    EventCounts,
    EventKind,
    Verdict,
    certified_by_evidence,
    verdict_reason,
)
from witcert_calculus.contracts import Reading, Regime
from witcert_calculus.errors import (
    AdmissionError,
    InvalidValueError,
    UnknownRequestError,
    WitcertError,
)
from witcert_calculus.ledger import RiskLedger
from witcert_calculus.metrics import Metric, metric_info
from witcert_calculus.numerics.probability import Probability, ProbabilityLike
from witcert_calculus.numerics.validation import integer
from witcert_calculus.tiers import Evidence, Measurement, Tier, weakest

__all__ = ["FleetLedger", "FleetStep", "FleetVerdict"]

_CERTIFICATES = (EventKind.DETERMINISTIC, EventKind.PROBABILISTIC)


@final
@dataclass(frozen=True, slots=True)
class FleetStep:
    """One decode step of several requests, reduced over the ranks (identical on every rank).

    Attributes:
        request_ids: the requests of the step, in the order given.
        meter_max: per request, the largest entry bound over all ranks' heads.
        fallback: per request, whether some entry on some rank fell back (any-of).
        vacuous: per request, whether some rank's step bound (the largest kept bound) was
            vacuous (any-of).
        kept: per request, entries that kept the compressed value, over all ranks.
        entries: per request, entries offered, over all ranks.
        charged: per request, the exact charge of the step to the request's budget
            (the sum of the ranks' shares: ``delta_req / ((i+1)(i+2))``, or 0).
        complete: ``False`` when a rank failed; the other fields are then empty.
    """

    request_ids: tuple[int, ...]
    meter_max: tuple[float, ...]
    fallback: tuple[bool, ...]
    vacuous: tuple[bool, ...]
    kept: tuple[int, ...]
    entries: tuple[int, ...]
    charged: tuple[Fraction, ...]
    complete: bool


@final
@dataclass(frozen=True, slots=True)
class FleetVerdict:
    """A request's verdict over the whole fleet (identical on every rank).

    Attributes:
        verdict: the request's verdict as one account: the weakest tier over the ranks,
            the budget ``delta_req``, the exact spend (``telescoping_spent(n, delta_req)``
            after ``n`` probabilistic steps), counts per kind of fleet step (a deterministic
            step is one every rank certified; one where some rank admitted no certificate
            counts as an empirical fallback), entries over all ranks (``entries_kept`` is
            the coverage count), steps, vacuous steps and the worst step bound (the largest
            kept bound over all ranks and steps). No evidence, no certificate: a request
            with no certified step is ``EMPIRICAL``, and ``verdict.reason`` says why.
        meter_max: the largest entry bound over all ranks and steps (kept or not).
        ranks: the ranks that served it.
        complete: ``False`` when a rank failed during the request: the tier is then
            ``EMPIRICAL`` (failed closed) and the counts stop at the failure.
        failure: why the fleet failed closed, or ``None``.
    """

    verdict: Verdict
    meter_max: float
    ranks: int
    complete: bool
    failure: str | None

    def __post_init__(self) -> None:
        if (self.failure is None) != self.complete:
            raise InvalidValueError("failure", self.failure,
                                    "must be given exactly when the verdict is incomplete")
        if not self.complete and self.verdict.tier is not Tier.EMPIRICAL:
            raise InvalidValueError("verdict.tier", self.verdict.tier.name,
                                    "an incomplete fleet verdict fails closed: EMPIRICAL")

    @property
    def tier(self) -> Tier:
        """The verdict's tier."""
        return self.verdict.tier

    @property
    def spent(self) -> Fraction:
        """The exact spend of the request's budget."""
        return self.verdict.spent

    def span_attributes(self) -> dict[str, str | bool | int | float]:
        """The fleet's own span attributes, next to the verdict's.

        For :meth:`witcert_calculus.export.telemetry.VerdictSpans.emit`:
        ``spans.emit(v.verdict, attributes=v.span_attributes())``.
        """
        out: dict[str, str | bool | int | float] = {
            "witcert.fleet.ranks": self.ranks, "witcert.fleet.complete": self.complete,
            "witcert.fleet.meter_max": self.meter_max}
        if self.failure is not None:
            out["witcert.fleet.failure"] = self.failure
        return out


@dataclass(slots=True)
class _Tally:
    # The fleet's running view of one request, updated from reduced (identical) values only.
    budget: Probability
    tier: Tier = Tier.CERTIFIED
    n_prob: int = 0
    n_det: int = 0
    n_empirical: int = 0
    steps: int = 0
    vacuous: int = 0
    entries: int = 0
    kept: int = 0
    worst: float = 0.0
    meter: float = 0.0
    closed: bool = False


# Columns of the reduced tensors.
_S_KEPT, _S_ENTRIES, _S_FALLBACK, _S_VACUOUS, _S_UNCERTIFIED = range(5)
_M_METER, _M_NEG_TIER, _M_NPROB, _M_NEG_NPROB, _M_RID, _M_NEG_RID, _M_STEP = range(7)


@final
class FleetLedger:
    """One rank's side of a fleet: its local ledger, and the step reduction over the group.

    Every rank constructs one (collectively: the shards are checked with
    :func:`check_sharding`) and then calls the same methods with the same request ids
    in the same order; the values returned are identical on every rank.

    Args:
        shard: the heads this rank holds.
        group: the process group (``None``: the default group). Its timeout bounds how
            long a step waits for a rank that stopped answering.
        n_slots: size of this rank's slot table (its shard of the KV pool).
        journal: path of this rank's journal, or ``None``.

    Raises:
        InvalidValueError: if the process group is not initialised or the shards do not
            partition the heads (on every rank).
        JournalError: if the journal cannot be opened.
    """

    __slots__ = ("_broken", "_device", "_group", "_ledger", "_rank", "_reduce_s", "_tallies",
                 "_world", "shards")

    def __init__(self, shard: HeadShard, *, group: Any = None, n_slots: int = 0,
                 journal: str | os.PathLike[str] | None = None) -> None:
        self._rank, self._world = group_world(group)
        self._group = group
        self._device = group_device(group)
        self.shards = check_sharding(shard, group=group)
        self._ledger = RiskLedger(n_slots=n_slots, journal=journal)
        self._tallies: dict[int, _Tally] = {}
        self._broken: str | None = None
        self._reduce_s = 0.0

    @property
    def rank(self) -> int:
        """This rank."""
        return self._rank

    @property
    def world(self) -> int:
        """Number of ranks."""
        return self._world

    @property
    def local(self) -> RiskLedger:
        """This rank's ledger (its accounts hold the rank's budget shares)."""
        return self._ledger

    @property
    def reduce_seconds(self) -> float:
        """Wall time spent in the step collectives so far (seconds)."""
        return self._reduce_s

    @property
    def failure(self) -> str | None:
        """Why the fleet failed closed, or ``None`` while it works."""
        return self._broken

    def close(self) -> None:
        """Close the local journal."""
        self._ledger.close()

    def open_request(self, request_id: int, *, delta_req: ProbabilityLike) -> None:
        """Open the request on this rank with the share ``delta_req / world`` of its budget.

        Raises:
            InvalidValueError: for a budget outside (0, 1).
            ReusedRequestIdError: if the id does not exceed every id this rank used.
        """
        budget = Probability.budget(delta_req)
        self._ledger.open_request(delta_req=budget.split(self._world), request_id=request_id)
        self._tallies[request_id] = _Tally(budget)

    def _tally(self, request_id: int) -> _Tally:
        t = self._tallies.get(request_id)
        if t is None:
            raise UnknownRequestError(request_id)
        return t

    def allowance(self, request_id: int) -> Fraction:
        """The delta this rank's certificates must hold at in the request's next probabilistic step.

        ``telescoping_delta(i, delta_req) / world``: the rank's share of the allowance
        the whole step draws.

        Raises:
            UnknownRequestError: if the request is not open here.
        """
        self._tally(request_id)
        return self._ledger.next_allowance(request_id)

    def step(self, request_ids: Sequence[int], bounds: torch.Tensor, *, threshold: float,
             metric: type[Metric[Any]], evidence: Evidence, probabilistic: bool = False,
             slots: torch.Tensor | None = None) -> FleetStep:
        """Admit one decode step of several requests on this rank, then reduce over the ranks.

        Each request's row of ``bounds`` holds the per-entry bounds of this rank's heads
        (entries are kept when ``<= threshold``, as
        :meth:`~witcert_calculus.ledger.RiskLedger.admit_entries` with
        :attr:`~witcert_calculus.accounting.entries.Aggregate.MAX`: the step bound is the meter
        maximum, so it reduces across shards exactly). With ``probabilistic=True`` the
        bounds hold at :meth:`allowance` and the step draws it.

        Args:
            request_ids: the open requests of the step (the same on every rank).
            bounds: ``[len(request_ids), entries]`` float tensor of this rank's bounds.
            threshold: per-entry threshold.
            metric: the bounds' metric, e.g. ``AttentionTV[AtConsume]``.
            evidence: what certifies the per-entry bounds.
            probabilistic: whether the bounds hold with probability ``1 - allowance``.
            slots: ``[len(request_ids), entries]`` int tensor of this rank's pool slots
                written, or ``None``.

        Returns:
            The reduced step (``complete=False`` when a rank failed: the requests then
            fail closed).

        Raises:
            InvalidValueError: for bounds or slots of the wrong shape, NaN or negative
                bounds, a repeated request, or request ids that differ between ranks (on
                every rank; every open request then fails closed).
            AdmissionError: if the ranks disagree on a request's count of probabilistic
                events (on every rank, after the step is applied to the other requests;
                that request fails closed).
            UnknownRequestError: for a request not open here.
        """
        ids = tuple(integer("request_ids[]", r) for r in request_ids)
        b = bounds.detach().to(device="cpu", dtype=torch.float64)
        if b.dim() != 2 or b.shape[0] != len(ids):
            raise InvalidValueError("bounds", tuple(b.shape),
                                    f"must be [{len(ids)} requests, entries]")
        s = None if slots is None else slots.detach().to(device="cpu", dtype=torch.int64)
        if s is not None and tuple(s.shape) != tuple(b.shape):
            raise InvalidValueError("slots", tuple(s.shape), f"must match bounds {tuple(b.shape)}")
        if self._broken is not None:
            return self._failed_step(ids)
        for r in ids:
            self._tally(r)
        if len(set(ids)) != len(ids):
            raise InvalidValueError("request_ids", ids, "must not repeat a request")
        bn = b.numpy()
        sn = None if s is None else s.numpy()
        n = len(ids)
        sums = np.zeros((n, 5), dtype=np.int64)
        maxes = np.zeros((n, 7), dtype=np.float64)
        for j, r in enumerate(ids):
            delta = self._ledger.next_allowance(r) if probabilistic else Fraction(0)
            ea = self._ledger.admit_entries(
                r, bn[j], threshold=threshold, metric=metric, evidence=evidence, delta=delta,
                slots=None if sn is None else sn[j], aggregate=Aggregate.MAX)
            v = self._ledger.verdict(r)
            used = ea.admission.decision is Decision.USE
            kept = ea.certification.n_kept if used else 0
            sums[j] = (kept, bn.shape[1], int(kept < bn.shape[1]),
                       int(used and ea.certification.vacuous),
                       int(ea.admission.kind not in _CERTIFICATES))
            nprob = v.counts.probabilistic
            maxes[j] = (float(bn[j].max()) if bn.shape[1] else 0.0, -float(int(v.cap)),
                        float(nprob), -float(nprob), float(r), -float(r),
                        float(ea.certification.step_bound) if used else 0.0)
        # One collective per step: every rank's rows (counts are exact in float64 below 2**53).
        mine = torch.as_tensor(np.concatenate([sums.astype(np.float64), maxes], axis=1),
                               device=self._device)
        table = [torch.empty_like(mine) for _ in range(self._world)]
        t0 = time.perf_counter()
        try:
            all_gather(table, mine, group=self._group)
        except WitcertError:
            raise
        except RuntimeError as exc:  # a rank died or timed out: fail closed
            self._reduce_s += time.perf_counter() - t0
            self._fail(f"step reduction failed on rank {self._rank}: "
                       f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                       metric)
            return self._failed_step(ids)
        self._reduce_s += time.perf_counter() - t0
        every = torch.stack(table).cpu().numpy()
        return self._apply(ids, every[:, :, :5].astype(np.int64).sum(axis=0),
                           every[:, :, 5:].max(axis=0), probabilistic, metric)

    def _apply(self, ids: tuple[int, ...], sums: Any, maxes: Any, probabilistic: bool,
               metric: type[Metric[Any]]) -> FleetStep:
        for j, r in enumerate(ids):
            if maxes[j, _M_RID] != -maxes[j, _M_NEG_RID]:
                reason = (f"ranks name different requests at position {j} of a step (ids "
                          f"from {int(-maxes[j, _M_NEG_RID])} to {int(maxes[j, _M_RID])}); "
                          "every rank must step the same requests in the same order")
                self._fail(reason, metric)
                raise InvalidValueError(f"request_ids[{j}]", r, reason)
        charged: list[Fraction] = []
        diverged: list[tuple[int, str]] = []
        for j, r in enumerate(ids):
            t = self._tallies[r]
            lo, hi = int(-maxes[j, _M_NEG_NPROB]), int(maxes[j, _M_NPROB])
            if lo != hi:
                # Each rank's spend stays below its share whatever the others drew; report
                # the most any rank drew, and fail the request closed.
                reason = (f"ranks disagree on the request's probabilistic events ({lo} to "
                          f"{hi}); one budget is spent once, so the request fails closed")
                self._degrade(r, reason, metric)
                t.tier = Tier.EMPIRICAL
                diverged.append((r, reason))
            charge = telescoping_delta(hi - 1, t.budget) if probabilistic else Fraction(0)
            if probabilistic:
                t.n_prob = hi
            elif sums[j, _S_UNCERTIFIED] > 0:  # some rank admitted no certificate: no evidence
                t.n_empirical += 1
            else:
                t.n_det += 1
            charged.append(charge)
            t.tier = weakest(t.tier, Tier(int(-maxes[j, _M_NEG_TIER])))
            t.steps += 1
            t.vacuous += int(sums[j, _S_VACUOUS] > 0)
            t.entries += int(sums[j, _S_ENTRIES])
            t.kept += int(sums[j, _S_KEPT])
            t.worst = max(t.worst, float(maxes[j, _M_STEP]))
            t.meter = max(t.meter, float(maxes[j, _M_METER]))
        if diverged:
            raise AdmissionError(*diverged[0])
        return FleetStep(
            request_ids=ids, meter_max=tuple(float(x) for x in maxes[:, _M_METER]),
            fallback=tuple(bool(x > 0) for x in sums[:, _S_FALLBACK]),
            vacuous=tuple(bool(x > 0) for x in sums[:, _S_VACUOUS]),
            kept=tuple(int(x) for x in sums[:, _S_KEPT]),
            entries=tuple(int(x) for x in sums[:, _S_ENTRIES]),
            charged=tuple(charged), complete=True)

    def _failed_step(self, ids: tuple[int, ...]) -> FleetStep:
        return FleetStep(request_ids=ids, meter_max=(), fallback=(), vacuous=(), kept=(),
                         entries=(), charged=(), complete=False)

    def _degrade(self, request_id: int, reason: str, metric: type[Metric[Any]]) -> None:
        # Record the failure in the local account (and journal): an empirical reading
        # under DEGRADE sets the verdict to EMPIRICAL. Its value is the metric's
        # saturation, the bound that says nothing, never a good-looking number.
        info = metric_info(metric)
        value = info.saturation if info.saturation is not None and \
            math.isfinite(info.saturation) else info.lo
        try:
            self._ledger.require_known(request_id)
        except UnknownRequestError:
            return
        self._ledger.admit(request_id, Reading(metric, value, evidence=Measurement(
            f"fleet failed closed: {reason}", samples=1), regime=Regime.MEASURED),
            on_empirical=EmpiricalPolicy.DEGRADE)

    def _fail(self, reason: str, metric: type[Metric[Any]]) -> None:
        self._broken = reason
        for r, t in self._tallies.items():
            if not t.closed:
                t.tier = Tier.EMPIRICAL
                # The step in flight may have drawn this rank's share already: report the
                # spend as if every rank drew as much as this one (never less than spent).
                t.n_prob = max(t.n_prob, self._ledger.verdict(r).counts.probabilistic)
                self._degrade(r, reason, metric)

    def verdict(self, request_id: int) -> FleetVerdict:
        """The request's fleet verdict now (no collective: built from reduced values).

        Raises:
            UnknownRequestError: for a request never opened here.
        """
        t = self._tally(request_id)
        counts = EventCounts.of({EventKind.DETERMINISTIC: t.n_det,
                                 EventKind.PROBABILISTIC: t.n_prob,
                                 EventKind.EMPIRICAL_FALLBACK: t.n_empirical})
        reason: str | None
        if self._broken is not None:
            tier, reason = Tier.EMPIRICAL, f"the fleet failed closed: {self._broken}"
        else:  # no evidence, no certificate, as for one process's ledger
            tier = certified_by_evidence(t.tier, counts)
            reason = verdict_reason(tier, counts, vacuous_steps=t.vacuous)
        verdict = Verdict(
            request_id=request_id, tier=tier, delta_req=t.budget.exact,
            spent=telescoping_spent(t.n_prob, t.budget), counts=counts, entries=t.entries,
            entries_kept=t.kept,
            retained_fraction=None if t.entries == 0 else Fraction(t.kept, t.entries),
            steps=t.steps, vacuous_steps=t.vacuous, worst_step_bound=t.worst, closed=t.closed,
            reason=reason)
        return FleetVerdict(verdict=verdict, meter_max=t.meter, ranks=self._world, complete=self._broken is None,
                            failure=self._broken)

    def close_request(self, request_id: int) -> FleetVerdict:
        """Close the request on this rank; return its final fleet verdict.

        Raises:
            UnknownRequestError: for a request not open here.
        """
        t = self._tally(request_id)
        if t.closed:
            raise UnknownRequestError(request_id)
        self._ledger.close_request(request_id)
        t.closed = True
        return self.verdict(request_id)
