"""The ledger's events as typed values, and their one codec to and from the journal encoding.

The ledger is event-sourced: every change of state is one event, built and
validated against the newest state, made durable (with a journal), then
applied. In memory an event is one of the frozen classes below; in the journal
it is an operation name, a JSON payload of plain values (exact fractions as
text, floats in hexadecimal, enums by value), packed arrays and an optional
idempotency token (:class:`EncodedEvent`). Each class encodes itself
(:meth:`encode`) and is decoded through one table keyed by the operation name
(:func:`decode`), so ``decode(e.encode()).encode() == e.encode()``. The
encoding is the journal's format version 3 (a close records the slots it frees; a slot
write, an eviction and a close record the slots' generations before the event).

Main declarations:

- :class:`OpenRequest`, :class:`Admit`, :class:`AdmitEntries`, :class:`SlotWrite`,
  :class:`CloseRequest`, :class:`Evict`, :class:`AddSentinel`, :class:`Observe`
- :data:`Event`: any of them.
- :class:`EncodedEvent`, :func:`decode`
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, ClassVar, Final, TypeAlias, final

import numpy as np
import numpy.typing as npt

from witcert_calculus.accounting.entries import EntryCertification
from witcert_calculus.accounting.records import EventKind
from witcert_calculus.errors import InvalidValueError
from witcert_calculus.numerics.probability import Probability
from witcert_calculus.tiers import Tier

__all__ = [
    "AddSentinel",
    "Admit",
    "AdmitEntries",
    "CloseRequest",
    "EncodedEvent",
    "Event",
    "Evict",
    "Observe",
    "OpenRequest",
    "SlotWrite",
    "decode",
]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


@final
@dataclass(frozen=True, slots=True)
class EncodedEvent:
    """An event in the journal's encoding.

    Attributes:
        op: the operation name (``"open"``, ``"admit"``, ``"entries"``, ``"close"``,
            ``"evict"``, ``"sentinel"``, ``"observe"``).
        payload: JSON-ready fields (str, int, bool).
        data: packed little-endian arrays, or ``b""``.
        token: the caller's idempotency token, if any.
    """

    op: str
    payload: dict[str, Any]
    data: bytes = b""
    token: str | None = None


@final
@dataclass(frozen=True, slots=True)
class OpenRequest:
    """A request opened with its budget.

    Attributes:
        request_id: the new account's id.
        budget: its ``delta_req``.
    """

    op: ClassVar[str] = "open"
    request_id: int
    budget: Probability

    def encode(self) -> EncodedEvent:
        """The journal encoding (the budget as its exact text)."""
        return EncodedEvent(self.op, {"rid": self.request_id, "delta_req": self.budget.to_text()})

    @classmethod
    def decode(cls, e: EncodedEvent) -> OpenRequest:
        """Inverse of :meth:`encode`."""
        return cls(int(e.payload["rid"]), Probability.budget(e.payload["delta_req"]))


@final
@dataclass(frozen=True, slots=True)
class Admit:
    """One reading admitted into an account (also the charge of an entry batch).

    Attributes:
        request_id: the account.
        ordinal: the account's admission count before this event.
        kind: the admission rule that applied.
        charged: the telescoping allowance drawn (0 unless probabilistic).
        cap: the tier the request's verdict is capped to.
        tier: the tier of the reading.
        saturated: whether the reading's bound reached saturation.
        token: the caller's idempotency token, if any.
    """

    op: ClassVar[str] = "admit"
    request_id: int
    ordinal: int
    kind: EventKind
    charged: Fraction
    cap: Tier
    tier: Tier
    saturated: bool
    token: str | None

    def payload(self) -> dict[str, Any]:
        """The JSON fields of the charge."""
        return {"rid": self.request_id, "ord": self.ordinal, "kind": self.kind.value,
                "charged": str(self.charged), "cap": int(self.cap), "tier": int(self.tier),
                "saturated": self.saturated}

    def encode(self) -> EncodedEvent:
        """The journal encoding."""
        return EncodedEvent(self.op, self.payload(), b"", self.token)

    @classmethod
    def decode(cls, e: EncodedEvent) -> Admit:
        """Inverse of :meth:`encode` (also reads the charge of an ``"entries"`` event)."""
        p = e.payload
        return cls(request_id=int(p["rid"]), ordinal=int(p["ord"]), kind=EventKind(p["kind"]),
                   charged=Fraction(p["charged"]), cap=Tier(int(p["cap"])),
                   tier=Tier(int(p["tier"])), saturated=bool(p["saturated"]), token=e.token)


@final
@dataclass(frozen=True, slots=True, eq=False)
class SlotWrite:
    """The slots an entry batch writes, which of them keep compressed bytes, and their bounds.

    Attributes:
        slots: one pool slot per entry.
        keep: ``True`` where the entry keeps its compressed value (``MASKED``).
        bounds: per-entry bounds of the kept entries, 0.0 elsewhere.
        gens: the slots' generations before the write (the ledger records them and
            replay checks them), or ``None``.
    """

    slots: IntArray
    keep: BoolArray
    bounds: FloatArray
    gens: IntArray | None = None

    def pack(self) -> bytes:
        """Slots (``<i8``), the packed keep mask, bounds (``<f8``), then generations (``<i8``)."""
        return (self.slots.astype("<i8").tobytes() + np.packbits(self.keep).tobytes()
                + self.bounds.astype("<f8").tobytes()
                + (b"" if self.gens is None else self.gens.astype("<i8").tobytes()))

    @classmethod
    def unpack(cls, data: bytes, n: int, kept: int, *, gens: bool = False) -> SlotWrite:
        """Inverse of :meth:`pack` for ``n`` entries of which ``kept`` are kept.

        Raises:
            InvalidValueError: if the arrays do not match ``n`` and ``kept``.
        """
        nb = (n + 7) // 8
        idx = np.frombuffer(data[:8 * n], dtype="<i8").astype(np.int64)
        keep = np.unpackbits(np.frombuffer(data[8 * n:8 * n + nb], dtype=np.uint8),
                             count=n).astype(np.bool_)
        end = 8 * n + nb + 8 * n if gens else len(data)
        bnd = np.frombuffer(data[8 * n + nb:end], dtype="<f8").astype(np.float64)
        gen = np.frombuffer(data[end:], dtype="<i8").astype(np.int64) if gens else None
        if (int(np.count_nonzero(keep)) != kept or bnd.size != n or idx.size != n
                or (gen is not None and gen.size != n) or len(data) < end):
            raise InvalidValueError("entries event", f"{n} entries, {kept} kept",
                                    "entry event does not match its arrays")
        return cls(idx, keep, bnd, gen)


@final
@dataclass(frozen=True, slots=True)
class AdmitEntries:
    """An entry batch admitted into an account, charged once.

    Attributes:
        charge: the admission of the step's reading (fields as in :class:`Admit`).
        n_entries: entries offered.
        n_kept: entries that keep the compressed value.
        step_bound: the step's bound.
        vacuous: whether the step bound reached the metric's saturation.
        write: the slot write, or ``None`` when the batch names no slots.
    """

    op: ClassVar[str] = "entries"
    charge: Admit
    n_entries: int
    n_kept: int
    step_bound: float
    vacuous: bool
    write: SlotWrite | None

    @classmethod
    def of(cls, charge: Admit, cert: EntryCertification, *, slots: IntArray | None,
           bounds: FloatArray, gens: IntArray | None = None) -> AdmitEntries:
        """The event of a certified batch; an empirical fallback keeps no entry.

        Args:
            charge: the admission of the step's reading.
            cert: the batch's certification.
            slots: the pool slots written (one per entry), or ``None``.
            bounds: the per-entry bounds.
            gens: the slots' generations before the write, or ``None``.
        """
        keep = cert.keep
        if charge.kind is EventKind.EMPIRICAL_FALLBACK:
            keep = np.zeros(cert.n_entries, dtype=np.bool_)
        write = None if slots is None else SlotWrite(slots, keep, np.where(keep, bounds, 0.0),
                                                     gens)
        return cls(charge=charge, n_entries=cert.n_entries, n_kept=int(np.count_nonzero(keep)),
                   step_bound=float(cert.step_bound), vacuous=bool(cert.vacuous), write=write)

    def encode(self) -> EncodedEvent:
        """The journal encoding (the charge's fields next to the batch's)."""
        payload = self.charge.payload()
        payload.update({"n": self.n_entries, "kept": self.n_kept,
                        "step_bound": float(self.step_bound).hex(), "vacuous": self.vacuous,
                        "slots": self.write is not None})
        if self.write is not None and self.write.gens is not None:
            payload["gens"] = True
        data = b"" if self.write is None else self.write.pack()
        return EncodedEvent(self.op, payload, data, self.charge.token)

    @classmethod
    def decode(cls, e: EncodedEvent) -> AdmitEntries:
        """Inverse of :meth:`encode`.

        Raises:
            InvalidValueError: if the packed arrays do not match the payload.
        """
        p = e.payload
        n, kept = int(p["n"]), int(p["kept"])
        write = SlotWrite.unpack(e.data, n, kept, gens=bool(p.get("gens", False))) \
            if p["slots"] else None
        return cls(charge=Admit.decode(e), n_entries=n, n_kept=kept,
                   step_bound=float.fromhex(p["step_bound"]), vacuous=bool(p["vacuous"]),
                   write=write)


def _no_slots() -> IntArray:
    return np.zeros(0, dtype=np.int64)


def _encode_slots(op: str, request_id: int, slots: IntArray,
                  gens: IntArray | None) -> EncodedEvent:
    # Slots as <i8, then (flagged in the payload) their generations before the event.
    payload: dict[str, Any] = {"rid": request_id}
    data = slots.astype("<i8").tobytes()
    if gens is not None:
        payload["gens"] = True
        data += gens.astype("<i8").tobytes()
    return EncodedEvent(op, payload, data)


def _decode_slots(e: EncodedEvent) -> tuple[IntArray, IntArray | None]:
    arr = np.frombuffer(e.data, dtype="<i8").astype(np.int64)
    if not e.payload.get("gens", False):
        return arr, None
    if arr.size % 2:
        raise InvalidValueError(f"{e.op} event", f"{arr.size} integers",
                                "slots and generations do not pair up")
    n = arr.size // 2
    return arr[:n].copy(), arr[n:].copy()


@final
@dataclass(frozen=True, slots=True, eq=False)
class CloseRequest:
    """A request closed (its id is never reused), and the slots it owned freed.

    Attributes:
        request_id: the account.
        slots: the slots the request owned, which the close returns to
            ``UNWRITTEN``; replay checks that they are exactly the slots it owns.
        gens: their generations before the close (recorded by the ledger, checked
            on replay), or ``None``.
    """

    op: ClassVar[str] = "close"
    request_id: int
    slots: IntArray = field(default_factory=_no_slots)
    gens: IntArray | None = None

    def encode(self) -> EncodedEvent:
        """The journal encoding (released slots, then their generations, as ``<i8``)."""
        return _encode_slots(self.op, self.request_id, self.slots, self.gens)

    @classmethod
    def decode(cls, e: EncodedEvent) -> CloseRequest:
        """Inverse of :meth:`encode`."""
        return cls(int(e.payload["rid"]), *_decode_slots(e))


@final
@dataclass(frozen=True, slots=True, eq=False)
class Evict:
    """Slots returned to ``UNWRITTEN`` on behalf of a request.

    Attributes:
        request_id: the request that evicts.
        slots: the slots.
        gens: their generations before the eviction (recorded by the ledger,
            checked on replay), or ``None``.
    """

    op: ClassVar[str] = "evict"
    request_id: int
    slots: IntArray
    gens: IntArray | None = None

    def encode(self) -> EncodedEvent:
        """The journal encoding (slots, then their generations, as ``<i8``)."""
        return _encode_slots(self.op, self.request_id, self.slots, self.gens)

    @classmethod
    def decode(cls, e: EncodedEvent) -> Evict:
        """Inverse of :meth:`encode`."""
        return cls(int(e.payload["rid"]), *_decode_slots(e))


@final
@dataclass(frozen=True, slots=True)
class AddSentinel:
    """A named drift sentinel created.

    Attributes:
        name: the sentinel's name.
        delta: its false-alarm level.
        kappa: its declared tuning constant.
    """

    op: ClassVar[str] = "sentinel"
    name: str
    delta: float
    kappa: float

    def encode(self) -> EncodedEvent:
        """The journal encoding (floats in hexadecimal, exactly)."""
        return EncodedEvent(self.op, {"name": self.name, "delta": self.delta.hex(),
                                      "kappa": self.kappa.hex()})

    @classmethod
    def decode(cls, e: EncodedEvent) -> AddSentinel:
        """Inverse of :meth:`encode`."""
        p = e.payload
        return cls(str(p["name"]), float.fromhex(p["delta"]), float.fromhex(p["kappa"]))


@final
@dataclass(frozen=True, slots=True, eq=False)
class Observe:
    """Observations fed to a sentinel.

    Attributes:
        name: the sentinel.
        values: shape ``(3, n)``: the observations ``w``, null means ``m`` and
            squared ranges ``c``.
    """

    op: ClassVar[str] = "observe"
    name: str
    values: FloatArray

    def encode(self) -> EncodedEvent:
        """The journal encoding (values as ``<f8``)."""
        return EncodedEvent(self.op, {"name": self.name, "n": int(self.values.shape[1])},
                            self.values.astype("<f8").tobytes())

    @classmethod
    def decode(cls, e: EncodedEvent) -> Observe:
        """Inverse of :meth:`encode`."""
        n = int(e.payload["n"])
        return cls(str(e.payload["name"]),
                   np.frombuffer(e.data, dtype="<f8").astype(np.float64).reshape(3, n))


Event: TypeAlias = (OpenRequest | Admit | AdmitEntries | CloseRequest | Evict | AddSentinel
                    | Observe)
"""Any ledger event."""

_DECODERS: Final[dict[str, Callable[[EncodedEvent], Event]]] = {
    OpenRequest.op: OpenRequest.decode,
    Admit.op: Admit.decode,
    AdmitEntries.op: AdmitEntries.decode,
    CloseRequest.op: CloseRequest.decode,
    Evict.op: Evict.decode,
    AddSentinel.op: AddSentinel.decode,
    Observe.op: Observe.decode,
}


def decode(encoded: EncodedEvent) -> Event:
    """The event a journal row holds.

    Args:
        encoded: the row's operation, payload, data and token.

    Returns:
        The typed event.

    Raises:
        InvalidValueError: for an unknown operation or packed arrays that do not
            match the payload; ``KeyError``, ``ValueError`` or ``TypeError`` for
            a payload that is not an encoding of its operation.

    Example:
        >>> from witcert_calculus.numerics.probability import Probability
        >>> ev = OpenRequest(1, Probability.budget("1/100"))
        >>> ev.encode().payload
        {'rid': 1, 'delta_req': '1/100'}
        >>> decode(ev.encode()) == ev
        True
    """
    decoder = _DECODERS.get(encoded.op)
    if decoder is None:
        raise InvalidValueError("op", encoded.op, "is not a known event kind")
    return decoder(encoded)
