"""Fail-closed slot state for a compressed memory pool.

Every slot of the pool is in exactly one explicit state:

- ``UNWRITTEN``: holds no bytes that may be read;
- ``MASKED``: holds compressed bytes, written under a certificate whose
  per-entry bound passed the write-time audit;
- ``KEPT_EXACT``: holds exact bytes (the entry failed the audit, or was kept
  exact by choice).

Each slot records its owning request id (the request that wrote it) and a
generation counter that is bumped on every rewrite or eviction. Only its owner
may rewrite or evict a written slot; any request may write or evict a free
(``UNWRITTEN``) one, and closing a request frees the slots it owns. A batch
that names a slot another request owns raises
:class:`~witcert_calculus.errors.SlotOwnershipError` and changes nothing: the
ledger refuses it before it is journaled, and the table checks again before it
applies a write or an eviction (so a journal that breaks the rule does not
replay). A reader first
obtains a :class:`ReadGrant` (which names the reader and the generation it was
authorized at) and then reads with it. Reading an ``UNWRITTEN`` slot, a slot
whose generation moved on since the grant (stale), or reading as a request id
that the ledger does not know raises; there is no default value. Reads of
another request's slot are allowed (prefix sharing) and are attributed to the
writing owner; reads never spend budget.

The table is mutated only by its :class:`~witcert_calculus.ledger.RiskLedger`,
which audits and charges a write once, journals it, and only then applies it
under the ledger's lock, so no reader can observe an unaudited write.

Main declarations:

- :class:`SlotState`, :class:`SlotRecord`, :class:`ReadGrant`, :class:`SlotRead`
- :class:`SlotTable`
"""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass
from typing import Final, Literal, Protocol, final

import numpy as np
import numpy.typing as npt

from witcert_calculus.errors import (
    InvalidValueError,
    SlotOwnershipError,
    StaleReadError,
    UnwrittenSlotError,
)
from witcert_calculus.numerics.validation import int_array, integer, nonneg_int
from witcert_calculus.numerics.validation import request_id as request_id_of

__all__ = [
    "MAX_SLOTS",
    "ReadGrant",
    "SlotRead",
    "SlotRecord",
    "SlotState",
    "SlotTable",
]

#: Largest slot table: 2**26 slots (state, owner, generation and bound take 25 bytes a slot,
#: about 1.6 GiB in all); a larger ``n_slots`` is refused before anything is allocated.
MAX_SLOTS: Final = 2**26

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


@final
class SlotState(enum.IntEnum):
    """Explicit state of one slot."""

    UNWRITTEN = 0
    """No readable bytes."""
    MASKED = 1
    """Compressed bytes written under a certificate that passed the write audit."""
    KEPT_EXACT = 2
    """Exact bytes."""


class _Directory(Protocol):
    def require_known(self, request_id: int) -> None: ...

    def sync(self) -> None: ...


@final
@dataclass(frozen=True, slots=True)
class SlotRecord:
    """Snapshot of one slot.

    Attributes:
        slot: index in the pool.
        state: explicit state.
        owner: request id that wrote the current generation (``None`` when unwritten).
        generation: bumped on every rewrite or eviction (0 before the first write).
        bound: certified per-entry bound of the compressed bytes (0.0 when exact
            or unwritten).
    """

    slot: int
    state: SlotState
    owner: int | None
    generation: int
    bound: float


@final
@dataclass(frozen=True, slots=True)
class ReadGrant:
    """Authorization to read one slot at one generation.

    Attributes:
        slot: the slot.
        reader: the request id that reads.
        generation: the generation the read was authorized at.
        owner: the owner at that generation.
    """

    slot: int
    reader: int
    generation: int
    owner: int


@final
@dataclass(frozen=True, slots=True)
class SlotRead:
    """Outcome of a read: what was read and to whom it is attributed.

    Attributes:
        slot: the slot.
        reader: the request id that read.
        owner: the writing owner the read is attributed to.
        generation: the generation read.
        state: ``MASKED`` or ``KEPT_EXACT``.
        bound: the per-entry bound of the bytes read (0.0 for exact bytes).
        shared: whether the reader is not the owner (prefix sharing).
    """

    slot: int
    reader: int
    owner: int
    generation: int
    state: SlotState
    bound: float
    shared: bool


@final
class SlotTable:
    """Slot states, owners and generations of a compressed pool (fail-closed reads).

    Created and mutated by a :class:`~witcert_calculus.ledger.RiskLedger`
    (``RiskLedger(n_slots=...)`` exposes it as ``ledger.slots``); its public
    methods only read.

    Args:
        n_slots: pool size, in ``[0, MAX_SLOTS]`` (refused up front above the cap, before any
            memory is allocated).
        directory: the owner of request ids (the ledger).
        lock: the lock that serializes access (the ledger's).
        key: the owner's private capability; mutations must present it, so only
            the ledger (which audits, charges and journals every write) can
            change slot state.

    Example:
        >>> from witcert_calculus.ledger import RiskLedger
        >>> ledger = RiskLedger(n_slots=4)
        >>> r = ledger.open_request(delta_req="1/100")
        >>> ledger.slots.record(0).state
        <SlotState.UNWRITTEN: 0>
    """

    __slots__ = ("_bound", "_dir", "_gen", "_key", "_lock", "_n", "_owner", "_reads_own",
                 "_reads_shared", "_state", "_writes")

    def __init__(self, n_slots: int, *, directory: _Directory, lock: threading.RLock,
                 key: object) -> None:
        n = nonneg_int("n_slots", n_slots)
        if n > MAX_SLOTS:
            raise InvalidValueError("n_slots", n_slots, f"must be <= MAX_SLOTS = 2**26 "
                                    f"({MAX_SLOTS} slots; about 1.6 GiB of slot state)")
        self._n = n
        self._dir = directory
        self._lock = lock
        self._key = key
        self._state = np.zeros(n, dtype=np.int8)
        self._owner = np.full(n, -1, dtype=np.int64)
        self._gen = np.zeros(n, dtype=np.int64)
        self._bound = np.zeros(n, dtype=np.float64)
        self._reads_own = 0
        self._reads_shared = 0
        self._writes = 0

    def __len__(self) -> int:
        return self._n

    # ------------------------------------------------------------------ reads

    def _check_slot(self, slot: int) -> int:
        s = integer("slot", slot)
        if not 0 <= s < self._n:
            raise InvalidValueError("slot", slot, f"must lie in [0, {self._n})")
        return s

    def record(self, slot: int) -> SlotRecord:
        """Snapshot of one slot (state, owner, generation, bound).

        Raises:
            InvalidValueError: if ``slot`` is not an index of the pool.
        """
        s = self._check_slot(slot)
        with self._lock:
            self._dir.sync()
            state = SlotState(int(self._state[s]))
            owner = int(self._owner[s])
            return SlotRecord(slot=s, state=state, owner=None if owner < 0 else owner,
                              generation=int(self._gen[s]), bound=float(self._bound[s]))

    def authorize(self, reader: int, slot: int) -> ReadGrant:
        """Authorize ``reader`` to read ``slot`` at its current generation.

        Raises:
            UnknownRequestError: if the ledger never opened ``reader`` (or closed it).
            UnwrittenSlotError: if the slot holds no bytes.
            InvalidValueError: if ``slot`` is not an index of the pool, or ``reader`` is not
                a request id (:func:`~witcert_calculus.numerics.validation.request_id`).
        """
        rid = request_id_of("reader", reader)
        s = self._check_slot(slot)
        with self._lock:
            self._dir.sync()
            self._dir.require_known(rid)
            if self._state[s] == SlotState.UNWRITTEN:
                raise UnwrittenSlotError(s)
            return ReadGrant(slot=s, reader=rid, generation=int(self._gen[s]),
                             owner=int(self._owner[s]))

    def read(self, grant: ReadGrant) -> SlotRead:
        """Read a slot with a grant; the read is attributed to the writing owner.

        Raises:
            UnknownRequestError: if the reader is not an open request of the ledger.
            StaleReadError: if the slot's generation moved on since the grant.
            UnwrittenSlotError: if the slot holds no bytes.
            InvalidValueError: if ``grant`` is not a :class:`ReadGrant`.
        """
        if not isinstance(grant, ReadGrant):
            raise InvalidValueError("grant", grant, "must be a ReadGrant from authorize()")
        s = self._check_slot(grant.slot)
        with self._lock:
            self._dir.sync()
            self._dir.require_known(grant.reader)
            gen = int(self._gen[s])
            if gen != grant.generation:
                raise StaleReadError(s, grant.generation, gen)
            state = int(self._state[s])
            if state == SlotState.UNWRITTEN:
                raise UnwrittenSlotError(s)
            owner = int(self._owner[s])
            shared = owner != grant.reader
            if shared:
                self._reads_shared += 1
            else:
                self._reads_own += 1
            return SlotRead(slot=s, reader=grant.reader, owner=owner, generation=gen,
                            state=SlotState(state), bound=float(self._bound[s]), shared=shared)

    def owned_by(self, request_id: int) -> IntArray:
        """The slots ``request_id`` owns (wrote and has not evicted), ascending.

        Raises:
            InvalidValueError: if ``request_id`` is not an int.
        """
        rid = request_id_of("request_id", request_id)
        with self._lock:
            self._dir.sync()
            return self.holdings(rid)

    def counts(self) -> dict[SlotState, int]:
        """Number of slots in each state."""
        with self._lock:
            self._dir.sync()
            c = np.bincount(self._state, minlength=3)
            return {st: int(c[st]) for st in SlotState}

    @property
    def reads(self) -> tuple[int, int]:
        """``(own, shared)`` reads served by this process (reads are not journaled)."""
        return self._reads_own, self._reads_shared

    @property
    def writes(self) -> int:
        """Slot writes applied (each charged once by the ledger)."""
        return self._writes

    def snapshot(self) -> tuple[IntArray, IntArray, IntArray, FloatArray]:
        """Copies of (state, owner, generation, bound) arrays, e.g. to compare replayed state."""
        with self._lock:
            self._dir.sync()
            return (self._state.astype(np.int64), self._owner.copy(), self._gen.copy(),
                    self._bound.copy())

    # ------------------------------------------- mutation (ledger only, under its lock)

    def validate_slots(self, slots: npt.ArrayLike) -> IntArray:
        """Check a list of slots for a write: 1-D integers in range, no repeats.

        Raises:
            InvalidValueError: naming the offending list.
        """
        arr = int_array("slots", slots)
        if arr.ndim != 1:
            raise InvalidValueError("slots", slots, "must be a one-dimensional integer array")
        idx = arr.astype(np.int64)
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= self._n):
            raise InvalidValueError("slots", slots, f"every slot must lie in [0, {self._n})")
        if np.unique(idx).size != idx.size:
            raise InvalidValueError("slots", slots, "must not repeat a slot within one write")
        return idx

    def holdings(self, owner: int) -> IntArray:
        """The slots ``owner`` owns as this table has applied them (no journal sync).

        The ledger calls it under its lock while it builds or applies an event;
        :meth:`owned_by` is the synced query.

        Raises:
            InvalidValueError: if ``owner`` is not an int.
        """
        rid = request_id_of("owner", owner)
        with self._lock:
            return np.flatnonzero(self._owner == rid).astype(np.int64)

    def generations(self, slots: IntArray) -> IntArray:
        """The generations of validated ``slots`` as this table has applied them (no journal sync).

        The ledger records them in the events that write or evict the slots, and
        checks them again when it replays those events.
        """
        with self._lock:
            return self._gen[slots].astype(np.int64)

    def check_writable(self, request_id: int, slots: npt.ArrayLike,
                       action: Literal["write", "evict"]) -> None:
        """Raise unless every slot is free or owned by ``request_id`` (no journal sync).

        The ledger checks a batch with it under its lock, against the newest
        state, before the batch is journaled; :meth:`apply_write` and
        :meth:`apply_evict` check again before they change anything.

        Args:
            request_id: the request that writes or evicts.
            slots: the batch (checked as by :meth:`validate_slots`).
            action: ``"write"`` or ``"evict"``, for the message.

        Raises:
            SlotOwnershipError: naming the first slot of the batch that another
                request owns, its owner and generation, and how many such slots
                the batch names.
            InvalidValueError: for a bad request id, batch or action.
        """
        rid = request_id_of("request_id", request_id)
        if action not in ("write", "evict"):
            raise InvalidValueError("action", action, "must be 'write' or 'evict'")
        self._check_owners(rid, self.validate_slots(slots), action)

    def _check_owners(self, request_id: int, slots: IntArray,
                      action: Literal["write", "evict"]) -> None:
        with self._lock:
            owners = self._owner[slots]
            foreign = (owners >= 0) & (owners != request_id)
            if foreign.any():
                first = int(np.argmax(foreign))
                s = int(slots[first])
                raise SlotOwnershipError(request_id, action, s, int(owners[first]),
                                         int(self._gen[s]), int(np.count_nonzero(foreign)))

    def _guard(self, key: object) -> None:
        if key is not self._key:
            raise InvalidValueError("key", key, "slot state changes only through its ledger")

    def apply_write(self, key: object, writer: int, slots: IntArray, keep: BoolArray,
                    bounds: FloatArray) -> None:
        """Apply an audited, charged and journaled write (ledger only, under its lock).

        Kept entries become ``MASKED`` with their bound; the others become
        ``KEPT_EXACT`` (restored to exact bytes before any read can see them).
        Every slot's generation is bumped and its owner set to ``writer``.

        Raises:
            InvalidValueError: if ``key`` is not the ledger's capability.
            SlotOwnershipError: if another request owns one of the slots
                (nothing is changed).
        """
        self._guard(key)
        self._check_owners(writer, slots, "write")
        self._gen[slots] += 1
        self._owner[slots] = writer
        self._state[slots] = np.where(keep, SlotState.MASKED, SlotState.KEPT_EXACT)
        self._bound[slots] = np.where(keep, bounds, 0.0)
        self._writes += int(slots.size)

    def apply_evict(self, key: object, evictor: int, slots: IntArray) -> None:
        """Return slots to ``UNWRITTEN`` and bump their generations (ledger only).

        Raises:
            InvalidValueError: if ``key`` is not the ledger's capability.
            SlotOwnershipError: if a request other than ``evictor`` owns one of
                the slots (nothing is changed).
        """
        self._guard(key)
        self._check_owners(evictor, slots, "evict")
        self._gen[slots] += 1
        self._owner[slots] = -1
        self._state[slots] = SlotState.UNWRITTEN
        self._bound[slots] = 0.0
