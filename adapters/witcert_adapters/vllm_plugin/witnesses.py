"""The side buffer: one witness per engine slot, with a generation that every write bumps.

The engine reuses slots: a freed block is handed to the next request. The buffer is
indexed by the engine's slot and keeps, per slot, the band witnesses of the key the cache
holds there (``[layers, slots, kv_heads, bands]``, float32 rounded up) and a generation
counter (0 = never written; every write adds 1). A request remembers the generation of
each of its positions when it writes (or first reads) it; reading a position whose slot
has since been rewritten is a :class:`~witcert_calculus.errors.StaleReadError`, and reading
a slot never written is an :class:`~witcert_calculus.errors.UnwrittenSlotError`: a witness
that may describe other bytes is refused, never turned into a number.

The buffer can also keep the exact (unquantized) keys of each slot, in the model's dtype
(the audit's true total variation), and the exact values (the repairing gate's backing
store): :meth:`SlotWitnesses.read_exact` returns them only for the generation the reader
expects, and refuses a slot never written or rewritten since (never zeros, never another
request's entries).

Main declarations
-----------------
- :class:`SlotWitnesses`: the buffer; :meth:`SlotWitnesses.write`, :meth:`SlotWitnesses.bump`,
  :meth:`SlotWitnesses.put`, :meth:`SlotWitnesses.read_exact`.
- :class:`Positions`: what each request expects of its positions' slots.
"""

from __future__ import annotations

from typing import final

import torch

from witcert_calculus.errors import InvalidValueError, StaleReadError, UnwrittenSlotError
from witcert_calculus.numerics.validation import nonneg_int, positive_int

__all__ = ["Positions", "SlotWitnesses"]


@final
class SlotWitnesses:
    """Witnesses and generations of every engine slot, and optionally its exact entries.

    Args:
        layers: attention layers metered.
        slots: engine slots (``num_blocks * block_size``).
        kv_heads: kv heads per layer.
        bands: witness bands per key (0: none kept, the format witness alone bounds the keys).
        exact_dim: the head dimension of the exact keys kept (audit, repair); ``None`` keeps
            none.
        exact_dtype: the dtype the exact entries are kept in.
        values: also keep the exact values (the repairing gate's backing store; needs
            ``exact_dim``).
    """

    __slots__ = ("exact", "exact_values", "generation", "witness")

    def __init__(self, *, layers: int, slots: int, kv_heads: int, bands: int,
                 exact_dim: int | None = None, exact_dtype: torch.dtype = torch.float32,
                 values: bool = False) -> None:
        shape = (positive_int("layers", layers), positive_int("slots", slots),
                 positive_int("kv_heads", kv_heads))
        self.witness = torch.zeros((*shape, nonneg_int("bands", bands)), dtype=torch.float32)
        self.generation = torch.zeros(slots, dtype=torch.int64)
        if values and exact_dim is None:
            raise InvalidValueError("values", values, "the exact values need exact_dim")
        dims = None if exact_dim is None else (*shape, positive_int("head_dim", exact_dim))
        self.exact = None if dims is None else torch.zeros(dims, dtype=exact_dtype)
        self.exact_values = torch.zeros(dims, dtype=exact_dtype) if values and dims else None

    @property
    def slots(self) -> int:
        """Number of engine slots."""
        return int(self.generation.numel())

    def bump(self, slots: torch.Tensor) -> torch.Tensor:
        """A step writes distinct ``slots`` (every layer the same): bump their generations.

        Returns:
            ``[n]`` the slots' new generations.

        Raises:
            InvalidValueError: a slot out of range.
        """
        if slots.numel() and (int(slots.min()) < 0 or int(slots.max()) >= self.slots):
            raise InvalidValueError("slots", (int(slots.min()), int(slots.max())),
                                    f"must lie in [0, {self.slots})")
        self.generation[slots] += 1
        return self.generation[slots]

    def put(self, layers: torch.Tensor | slice, slots: torch.Tensor, witness: torch.Tensor,
            exact: torch.Tensor | None = None, values: torch.Tensor | None = None) -> None:
        """Record the witnesses (and exact entries) that ``layers`` wrote at ``slots``.

        Args:
            layers: the layers (indices or a slice) the rows of ``witness`` belong to.
            slots: ``[n]`` distinct engine slots (bumped by :meth:`bump` this step).
            witness: ``[layers, n, kv_heads, bands]`` float32 upper bounds.
            exact: ``[layers, n, kv_heads, head_dim]`` exact keys (when they are kept).
            values: the same for the exact values (when they are kept).

        Raises:
            InvalidValueError: exact entries given (or missing) against what the buffer keeps.
        """
        for name, given, kept in (("exact", exact, self.exact),
                                  ("values", values, self.exact_values)):
            if (given is None) != (kept is None):
                raise InvalidValueError(name, None if given is None else tuple(given.shape),
                                        "exact entries are given exactly when the buffer "
                                        "keeps them (audit or repair mode)")
        at = (layers, slots) if isinstance(layers, slice) else \
            (layers.view(-1, 1), slots.view(1, -1))
        self.witness[at] = witness
        if self.exact is not None and exact is not None:
            self.exact[at] = exact.to(self.exact.dtype)
        if self.exact_values is not None and values is not None:
            self.exact_values[at] = values.to(self.exact_values.dtype)

    def write(self, slots: torch.Tensor, witness: torch.Tensor,
              exact: torch.Tensor | None = None) -> torch.Tensor:
        """:meth:`bump` and :meth:`put` every layer at once.

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
        if (exact is None) != (self.exact is None):
            raise InvalidValueError("exact", None if exact is None else tuple(exact.shape),
                                    "exact keys are kept in audit mode and only there")
        gens = self.bump(slots)
        self.put(slice(None), slots, witness, exact)
        return gens

    def read_exact(self, layer: int, slots: torch.Tensor, generations: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """The exact keys and values of ``slots`` (``[n, kv_heads, head_dim]`` each), as the
        generations the reader expects.

        Raises:
            UnwrittenSlotError: a slot never written (noted with the layer).
            StaleReadError: a slot rewritten since the reader saw it.
            InvalidValueError: the buffer keeps no exact values (repair is off).

        Example:
            >>> buf = SlotWitnesses(layers=1, slots=4, kv_heads=1, bands=0, exact_dim=2,
            ...                     values=True)
            >>> buf.read_exact(0, torch.tensor([1]), torch.tensor([1]))
            Traceback (most recent call last):
            ...
            witcert_calculus.errors.UnwrittenSlotError: slot 1 is UNWRITTEN: ...
        """
        if self.exact is None or self.exact_values is None:
            raise InvalidValueError("exact values", None, "kept only with repair on")
        current = self.generation[slots]
        bad = (current == 0) | (current != generations)
        if bool(bad.any()):
            i = int(torch.nonzero(bad)[0, 0])
            slot = int(slots[i])
            err: UnwrittenSlotError | StaleReadError = (
                UnwrittenSlotError(slot) if int(current[i]) == 0 else
                StaleReadError(slot, int(generations[i]), int(current[i])))
            err.add_note(f"layer {layer}: the backing store holds the entries of generation "
                         f"{int(current[i])}; a repair never reads unwritten or other "
                         "requests' bytes")
            raise err
        return self.exact[layer, slots], self.exact_values[layer, slots]


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
