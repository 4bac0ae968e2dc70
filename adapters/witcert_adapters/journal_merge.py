"""The fleet's per-rank journals merged offline: one account per request, every slot's owner.

The ranks' journals merge offline into one account per request
(:func:`merge_journals`): the spend is the sum of the ranks' spends, the tier the weakest,
and every slot write keeps its owner, the rank and request that wrote it.

Main declarations:

- :func:`merge_journals`: per-rank journals into :class:`MergedAccount` values, with
  :class:`SlotOwner` attribution
"""


from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import final

from witcert_calculus.accounting.events import AdmitEntries, EncodedEvent, decode
from witcert_calculus.accounting.journal import Journal
from witcert_calculus.accounting.records import EventCounts, Verdict
from witcert_calculus.errors import InvalidValueError, JournalError
from witcert_calculus.ledger import RiskLedger
from witcert_calculus.tiers import Tier, weakest

__all__ = ["MergedAccount", "SlotOwner", "merge_journals"]


@final
@dataclass(frozen=True, slots=True, order=True)
class SlotOwner:
    """One slot write, attributed: the rank whose pool holds the slot, the slot, its writer.

    Attributes:
        rank: the rank (its journal's position in :func:`merge_journals`).
        slot: the slot index in that rank's pool.
        request_id: the request that wrote it.
        kept: whether the entry kept the compressed value (else exact bytes).
    """

    rank: int
    slot: int
    request_id: int
    kept: bool


@final
@dataclass(frozen=True, slots=True)
class MergedAccount:
    """One request's account, merged from every rank's journal.

    Attributes:
        request_id: the request.
        tier: the weakest tier over the ranks (``EMPIRICAL`` when a rank's journal lacks
            the request: it failed closed).
        delta_req: the request's budget, the sum of the ranks' shares.
        spent: the exact spend, the sum of the ranks' spends.
        counts: admissions by kind, summed over the ranks.
        entries: entries offered over all ranks.
        entries_kept: entries kept over all ranks.
        per_rank: each rank's own verdict (``None`` where the journal lacks the request).
        agreed: whether every rank drew the same number of allowances (one budget spent
            in step); when not, the tier is ``EMPIRICAL`` (a rank stopped mid-request, or
            diverged) while the spend is still the sum of the ranks' sound shares.
        writes: every slot write of the request, attributed, sorted by (rank, slot).
        reason: why the tier is below ``CERTIFIED`` (a rank lacks the request, the
            ranks disagree, or a rank's own reason, e.g. no evidence), else ``None``.
    """

    request_id: int
    tier: Tier
    delta_req: Fraction
    spent: Fraction
    counts: EventCounts
    entries: int
    entries_kept: int
    per_rank: tuple[Verdict | None, ...]
    agreed: bool
    writes: tuple[SlotOwner, ...]
    reason: str | None = None


def merge_journals(paths: Sequence[str | os.PathLike[str]], *,
                   n_slots: int) -> tuple[MergedAccount, ...]:
    """Merge the ranks' journals (``paths[r]`` is rank ``r``'s) into one account per request.

    Args:
        paths: the journals, by rank.
        n_slots: each rank's slot-table size (as the ranks opened them).

    Returns:
        One merged account per request id found in any journal, ascending.

    Raises:
        JournalError: if a journal does not replay, or the ranks' shares of a request's
            budget differ.
    """
    if not paths:
        raise InvalidValueError("paths", paths, "must name at least one journal")
    verdicts: list[dict[int, Verdict]] = []
    writes: dict[int, list[SlotOwner]] = {}
    for rank, p in enumerate(paths):
        led = RiskLedger(n_slots=n_slots, journal=p)
        try:
            verdicts.append({r: led.verdict(r) for r in led.request_ids()})
        finally:
            led.close()
        journal = Journal(p, n_slots=n_slots)
        try:
            rows = journal.since(0)
        finally:
            journal.close()
        for row in rows:
            if row.op != AdmitEntries.op:
                continue
            event = decode(EncodedEvent(row.op, row.payload, row.data, row.token))
            if not isinstance(event, AdmitEntries) or event.write is None:
                continue
            rid = event.charge.request_id
            for slot, keep in zip(event.write.slots.tolist(), event.write.keep.tolist(),
                                  strict=True):
                writes.setdefault(rid, []).append(SlotOwner(rank, int(slot), rid, bool(keep)))
    out: list[MergedAccount] = []
    for rid in sorted(set[int]().union(*verdicts)):
        per = tuple(v.get(rid) for v in verdicts)
        present = [v for v in per if v is not None]
        shares = {v.delta_req for v in present}
        if len(shares) != 1:
            raise JournalError(str(paths[0]), f"request {rid}: the ranks' budget shares differ "
                               f"({sorted(str(x) for x in shares)})")
        agreed = len({v.counts.probabilistic for v in present}) == 1
        tier = Tier.CERTIFIED
        for v in present:
            tier = weakest(tier, v.tier)
        reasons = [f"rank {k}: {v.reason}" for k, v in enumerate(per)
                   if v is not None and v.reason is not None]
        if len(present) < len(per):
            tier = Tier.EMPIRICAL
            reasons.insert(0, f"ranks {[k for k, v in enumerate(per) if v is None]} lack the "
                           "request (failed closed)")
        if not agreed:
            tier = Tier.EMPIRICAL
            reasons.insert(0, "the ranks drew different numbers of allowances")
        counts = EventCounts()
        for v in present:
            counts = counts + v.counts
        out.append(MergedAccount(
            request_id=rid, tier=tier, delta_req=shares.pop() * len(per),
            spent=sum((v.spent for v in present), Fraction(0)), counts=counts,
            entries=sum(v.entries for v in present),
            entries_kept=sum(v.entries_kept for v in present), per_rank=per, agreed=agreed,
            writes=tuple(sorted(writes.get(rid, []))),
            reason=None if tier is Tier.CERTIFIED else "; ".join(reasons) or tier.name))
    return tuple(out)
