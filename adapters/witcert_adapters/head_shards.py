"""The heads one rank of a tensor-parallel group holds, and the group it reduces over.

A tensor-parallel group of ``R`` ranks serves each request; rank ``r`` holds the attention
heads of its :class:`HeadShard` and meters only those (:mod:`witcert_adapters.fleet`).
:func:`check_sharding` checks, with one collective, that the ranks' shards tile the heads.

Main declarations:

- :class:`HeadShard`: the heads one rank holds; :func:`check_sharding` (collective)
- :func:`group_world`, :func:`group_device`, :func:`all_gather`: a process group's rank and
  size, the device its collectives run on, and the collective itself (typed)
"""


from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast, final

import torch
import torch.distributed as dist

from witcert_calculus.errors import InvalidValueError
from witcert_calculus.numerics.validation import integer

__all__ = ["HeadShard", "all_gather", "check_sharding", "group_device", "group_world"]

all_gather = cast(Callable[..., Any], getattr(dist, "all_gather"))
"""``torch.distributed.all_gather``, typed (the collectives are partly unannotated)."""


@final
@dataclass(frozen=True, slots=True)
class HeadShard:
    """The attention heads ``[start, stop)`` of ``total`` that one rank holds.

    Raises:
        InvalidValueError: unless ``0 <= start < stop <= total``.

    Example:
        >>> HeadShard.even(rank=1, world=4, total=16)
        HeadShard(start=4, stop=8, total=16)
    """

    start: int
    stop: int
    total: int

    def __post_init__(self) -> None:
        for name in ("start", "stop", "total"):
            integer(name, getattr(self, name))
        if not 0 <= self.start < self.stop <= self.total:
            raise InvalidValueError("head shard", (self.start, self.stop, self.total),
                                    "must satisfy 0 <= start < stop <= total")

    @classmethod
    def even(cls, *, rank: int, world: int, total: int) -> HeadShard:
        """Rank ``rank``'s share of ``total`` heads split evenly over ``world`` ranks.

        Raises:
            InvalidValueError: if ``world`` does not divide ``total`` or ``rank`` is out of range.
        """
        if world < 1 or total % world:
            raise InvalidValueError("total heads", total, f"must be a multiple of world={world}")
        if not 0 <= rank < world:
            raise InvalidValueError("rank", rank, f"must lie in [0, {world})")
        width = total // world
        return cls(rank * width, (rank + 1) * width, total)

    @property
    def width(self) -> int:
        """Number of heads held."""
        return self.stop - self.start

    def describe(self) -> str:
        """``"heads [start, stop) of total"``."""
        return f"heads [{self.start}, {self.stop}) of {self.total}"


def group_world(group: Any) -> tuple[int, int]:
    """This rank and the group's size; refuses when ``torch.distributed`` is not initialised."""
    if not dist.is_available() or not dist.is_initialized():
        raise InvalidValueError("process group", group,
                                "torch.distributed must be initialised (init_process_group)")
    return dist.get_rank(group), dist.get_world_size(group)


def group_device(group: Any) -> torch.device:
    """Where the group's collectives take their tensors: the rank's GPU (NCCL) or the CPU."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def check_sharding(shard: HeadShard, *, group: Any = None) -> tuple[HeadShard, ...]:
    """Collective: gather every rank's shard and check that they partition the heads in order.

    Every rank receives the same table, so every rank raises the same error.

    Args:
        shard: this rank's heads.
        group: the process group (``None``: the default group).

    Returns:
        The shards of all ranks, by rank.

    Raises:
        InvalidValueError: naming the first rank whose shard does not start where the
            previous one stopped, disagrees on the head count, or leaves heads unheld.
    """
    if not isinstance(shard, HeadShard):
        raise InvalidValueError("shard", shard, "must be a HeadShard")
    _, world = group_world(group)
    dev = group_device(group)
    mine = torch.tensor([shard.start, shard.stop, shard.total], dtype=torch.int64, device=dev)
    table = [torch.zeros(3, dtype=torch.int64, device=dev) for _ in range(world)]
    all_gather(table, mine, group=group)
    rows = cast(list[list[int]], torch.stack(table).cpu().numpy().tolist())
    shards = [(int(a), int(b), int(c)) for a, b, c in rows]
    total = shards[0][2]
    expected_start = 0
    for r, (start, stop, tot) in enumerate(shards):
        got = f"heads [{start}, {stop}) of {tot}"
        if tot != total:
            raise InvalidValueError(f"head shard of rank {r}", got,
                                    f"rank 0 shards {total} heads; every rank must agree")
        if start != expected_start:
            where = "the first rank must start at head 0" if r == 0 else (
                f"rank {r - 1} holds heads [{shards[r - 1][0]}, {shards[r - 1][1]})")
            raise InvalidValueError(f"head shard of rank {r}", got,
                                    f"must start at head {expected_start} ({where}): the "
                                    "shards must partition the heads in rank order")
        expected_start = stop
    if expected_start != total:
        raise InvalidValueError(f"head shard of rank {world - 1}",
                                f"heads [{shards[-1][0]}, {shards[-1][1]}) of {total}",
                                f"heads [{expected_start}, {total}) are held by no rank")
    return tuple(HeadShard(a, b, c) for a, b, c in shards)
