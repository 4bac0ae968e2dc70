"""The side buffer: one witness per engine slot, with a generation that every write bumps.

The engine reuses slots: a freed block is handed to the next request. The buffer is
indexed by the engine's slot and keeps, per slot, the band witnesses of the key the cache
holds there (``[layers, slots, kv_heads, bands]``, float32 rounded up) and a generation
counter (0 = never written; every write adds 1). A request remembers the generation of
each of its positions when it writes (or first reads) it; reading a position whose slot
has since been rewritten is a :class:`~witcert_calculus.errors.StaleReadError`, and reading
a slot never written is an :class:`~witcert_calculus.errors.UnwrittenSlotError`: a witness
that may describe other bytes is refused, never turned into a number.

In audit mode the buffer also keeps the exact (unquantized) keys of each slot, in the
model's dtype, for the true total variation.

Main declarations
-----------------
- :class:`SlotWitnesses`: the buffer; :meth:`SlotWitnesses.write`,
  :meth:`SlotWitnesses.check`.
- :class:`Positions`: what each request expects of its positions' slots.
"""

from __future__ import annotations

from typing import final

import torch

from witcert_calculus.errors import InvalidValueError, StaleReadError, UnwrittenSlotError
from witcert_calculus.validation import positive_int

__all__ = ["Positions", "SlotWitnesses"]


@final
class SlotWitnesses:
    """Witnesses and generations of every engine slot.

    Args:
        layers: attention layers metered.
        slots: engine slots (``num_blocks * block_size``).
        kv_heads: kv heads per layer.
        bands: witness bands per key.
        exact_dim: with audit, the head dimension of the exact keys kept; ``None`` keeps none.
        exact_dtype: the dtype the exact keys are kept in.
    """

    __slots__ = ("exact", "generation", "witness")

    def __init__(self, *, layers: int, slots: int, kv_heads: int, bands: int,
                 exact_dim: int | None = None, exact_dtype: torch.dtype = torch.float32) -> None:
        shape = (positive_int("layers", layers), positive_int("slots", slots),
                 positive_int("kv_heads", kv_heads))
        self.witness = torch.zeros((*shape, positive_int("bands", bands)), dtype=torch.float32)
        self.generation = torch.zeros(slots, dtype=torch.int64)
        self.exact = (None if exact_dim is None else
                      torch.zeros((*shape, positive_int("head_dim", exact_dim)),
                                  dtype=exact_dtype))

    @property
    def slots(self) -> int:
        """Number of engine slots."""
        return int(self.generation.numel())

    def write(self, slots: torch.Tensor, witness: torch.Tensor,
              exact: torch.Tensor | None = None) -> torch.Tensor:
        """Record new witnesses for distinct ``slots`` and bump their generations.

        Args:
            slots: ``[n]`` distinct engine slots.
            witness: ``[layers, n, kv_heads, bands]`` float32 upper bounds.
            exact: ``[layers, n, kv_heads, head_dim]`` exact keys (audit mode only).

        Returns:
            ``[n]`` the slots' new generations.

        Raises:
            InvalidValueError: a slot out of range, or exact keys given (or missing) against
                the buffer's audit mode.

        Example:
            >>> buf = SlotWitnesses(layers=1, slots=4, kv_heads=1, bands=1)
            >>> buf.write(torch.tensor([2]), torch.ones(1, 1, 1, 1)).tolist()
            [1]
        """
        if slots.numel() and (int(slots.min()) < 0 or int(slots.max()) >= self.slots):
            raise InvalidValueError("slots", (int(slots.min()), int(slots.max())),
                                    f"must lie in [0, {self.slots})")
        if (exact is None) != (self.exact is None):
            raise InvalidValueError("exact", None if exact is None else tuple(exact.shape),
                                    "exact keys are kept in audit mode and only there")
        self.witness[:, slots] = witness
        if self.exact is not None and exact is not None:
            self.exact[:, slots] = exact.to(self.exact.dtype)
        self.generation[slots] += 1
        return self.generation[slots]


@final
class Positions:
    """Per request, the slot and generation each position was written (or adopted) at.

    Rows are request *seats*, reused after a request finishes (a seat is cleared when it is
    taken). A position first seen on read (a prefix-cache hit, written by another request)
    adopts its slot's current generation; a position whose slot changed (the engine
    recomputed it into a new block) adopts the new slot.

    Args:
        seats: concurrent requests at most.
        length: longest request (positions per seat).
    """

    __slots__ = ("gen", "slot")

    def __init__(self, *, seats: int, length: int) -> None:
        shape = (positive_int("seats", seats), positive_int("length", length))
        self.slot = torch.full(shape, -1, dtype=torch.int64)
        self.gen = torch.zeros(shape, dtype=torch.int64)

    def clear(self, seat: int) -> None:
        """Forget a seat (its request finished, or the seat is taken)."""
        self.slot[seat] = -1
        self.gen[seat] = 0

    def wrote(self, seats: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
              generations: torch.Tensor) -> None:
        """Rows of ``seats`` wrote ``slots`` at ``positions``, now at ``generations``."""
        self.slot[seats, positions] = slots
        self.gen[seats, positions] = generations

    def check(self, seats: torch.Tensor, slots: torch.Tensor, visible: torch.Tensor,
              buffer: SlotWitnesses) -> torch.Tensor:
        """Check each request's visible slots against the buffer; return the failures.

        Args:
            seats: ``[R]`` the seat of each request.
            slots: ``[R, S]`` visible slots (:attr:`StepLayout.slots`).
            visible: ``[R, S]`` which entries are visible.
            buffer: the side buffer.

        Returns:
            ``[R]`` int64 per request: 0 when every visible slot holds the witness the
            request expects, 1 for a stale slot (rewritten since the request saw it), 2 for
            a slot never written. Adoptions are recorded.
        """
        width = int(slots.shape[1])
        current = buffer.generation[slots]
        seen_slot = self.slot[seats, :width]
        seen_gen = self.gen[seats, :width]
        same = seen_slot == slots
        stale = visible & same & (seen_gen != current)
        unwritten = visible & (current == 0)
        adopt = visible & ~same & (current > 0)
        self.slot[seats, :width] = torch.where(adopt, slots, seen_slot)
        self.gen[seats, :width] = torch.where(adopt, current, seen_gen)
        return torch.where(unwritten.any(dim=1), 2, torch.where(stale.any(dim=1), 1, 0))


def raise_for(code: int, slots: torch.Tensor, visible: torch.Tensor, seat_gen: torch.Tensor,
              buffer: SlotWitnesses) -> None:
    """Raise the typed error of a failed :meth:`Positions.check` (one request's row).

    Args:
        code: the request's failure code (1 stale, 2 unwritten).
        slots: ``[S]`` its visible slots; ``visible``: ``[S]``.
        seat_gen: ``[S]`` the generations it expected.
        buffer: the side buffer.

    Raises:
        UnwrittenSlotError: code 2, naming the first unwritten slot.
        StaleReadError: code 1, naming the first stale slot and both generations.
    """
    current = buffer.generation[slots]
    if code == 2:
        first = int(torch.nonzero(visible & (current == 0))[0, 0])
        raise UnwrittenSlotError(int(slots[first]))
    bad = visible & (seat_gen != current)
    first = int(torch.nonzero(bad)[0, 0])
    raise StaleReadError(int(slots[first]), int(seat_gen[first]), int(current[first]))
