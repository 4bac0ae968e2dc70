"""What every probe run is: memory kinds, observed paths, and the run protocol.

Every probe (attention, learned selector, recurrent state) declares the ``(layer, path)``
sites it will observe, records one value per layer while the model runs, and returns a
frozen run. The acceptance gates and the memory-class registry are written against the
protocols here, not against one probe's run.

- A *site* is ``(layer, path)``: a layer index and the :class:`ProbePath` through that
  layer's memory that produced (or was promised to produce) data.
- An :class:`ObservedLayer` is what a run records about one layer: how many entries its
  write path recorded and which paths produced data.
- A :class:`ProbeRun` is one probe's run: the scheme, the memory kind, the declared sites
  and one record per layer; its observed sites are derived from the records, so they can
  never disagree with them.
- A :class:`MemoryProbe` is a probe: it declares sites, opens a cache per request,
  returns its run and removes its hooks.

Main declarations
-----------------
- :class:`MemoryKind`, :class:`ProbePath`, :data:`Site`.
- :class:`ObservedLayer`, :class:`ProbeRun`, :class:`MemoryProbe`.
- :func:`observed_sites`.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Protocol, TypeAlias, TypeVar, final

if TYPE_CHECKING:
    from transformers import DynamicCache

__all__ = ["MemoryKind", "MemoryProbe", "ObservedLayer", "ProbePath", "ProbeRun", "Site",
           "observed_sites"]


@final
class MemoryKind(enum.StrEnum):
    """The memory class an architecture's attention memory belongs to.

    Members compare equal to their names as strings (``MemoryKind.DENSE == "dense"``).
    """

    DENSE = "dense"
    """Dense KV cache (GQA with RoPE): post-RoPE keys and values."""
    LATENT = "latent"
    """Latent cache (MLA): a compressed latent decompressed on read, plus a shared key part."""
    SPARSE_SELECTOR = "sparse_selector"
    """A learned selector (top-k over indexer scores) in front of the attention."""
    RECURRENT = "recurrent"
    """Recurrent state: contracted and updated, never appended."""


@final
class ProbePath(enum.StrEnum):
    """A path through one layer's memory that a probe declares and observes.

    Members compare (and hash) equal to their values as strings, so a site
    ``(layer, ProbePath.READ)`` equals ``(layer, "read")``.
    """

    WRITE = "write"
    """Entries written (witnesses recorded at write time)."""
    READ = "read"
    """Attention rows metered at read time (Tier A)."""
    TIER_B = "tier_b"
    """Attention rows certified probabilistically (dithered keys, with a ledger)."""
    AUDIT = "audit"
    """True errors measured against the exact memory."""
    SELECT = "select"
    """Selector rows: the selection contract and the selector-score mass."""
    CONTRACTION = "contraction"
    """Recurrent steps: the state's contraction coefficient read per step."""


Site: TypeAlias = tuple[int, ProbePath]
"""A ``(layer, path)`` pair."""


class ObservedLayer(Protocol):
    """What a run records about one layer (every probe's per-layer record satisfies it)."""

    @property
    def layer(self) -> int:
        """The layer index."""
        ...

    @property
    def writes(self) -> int:
        """Entries the layer's write path recorded (tokens, indexer keys or state writes)."""
        ...

    @property
    def paths(self) -> frozenset[ProbePath]:
        """The paths of this layer that produced data."""
        ...


L_co = TypeVar("L_co", bound=ObservedLayer, covariant=True)


class ProbeRun(Protocol[L_co]):
    """One probe's run: what it promised to observe and one record per layer.

    Attributes:
        scheme: the scheme's name.
        memory_class: the memory kind the probe observed.
        declared: the sites the probe promised to observe.
        records: one record per layer that produced data, keyed by layer index.
        observed: the sites that produced data (from :attr:`records`, and for a hybrid
            also from its attention run).
        layers: the layers whose read-side record is complete, sorted (those the gate's
            magnitude and soundness stages evaluate).
    """

    @property
    def scheme(self) -> str: ...

    @property
    def memory_class(self) -> MemoryKind: ...

    @property
    def declared(self) -> frozenset[Site]: ...

    @property
    def records(self) -> Mapping[int, L_co]: ...

    @property
    def observed(self) -> frozenset[Site]: ...

    @property
    def layers(self) -> tuple[int, ...]: ...


class MemoryProbe(Protocol):
    """A probe attached to a model: declare, open a cache per request, collect, close."""

    def declared(self) -> frozenset[Site]:
        """The sites this probe promises to observe."""
        ...

    def new_cache(self) -> DynamicCache:
        """A fresh cache for one request; pass it to the model as ``cache=``."""
        ...

    def result(self) -> ProbeRun[ObservedLayer]:
        """What the current cache observed."""
        ...

    def close(self) -> None:
        """Remove every hook the probe registered."""
        ...


def observed_sites(records: Iterable[ObservedLayer]) -> frozenset[Site]:
    """The sites that produced data: ``(record.layer, path)`` for every path of every record.

    Example:
        >>> from dataclasses import dataclass
        >>> @dataclass(frozen=True)
        ... class Rec:
        ...     layer: int
        ...     writes: int
        ...     paths: frozenset[ProbePath]
        >>> sorted(observed_sites([Rec(1, 4, frozenset({ProbePath.WRITE}))]))
        [(1, <ProbePath.WRITE: 'write'>)]
    """
    return frozenset((r.layer, p) for r in records for p in r.paths)
