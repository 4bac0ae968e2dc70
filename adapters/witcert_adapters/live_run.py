"""What a Hugging Face probe observed: one record per attention layer and the Tier-B events.

Main declarations:

- :class:`LiveRun`: one :class:`~witcert_adapters.records.LayerRecord` per attention layer
  (witnesses, meters, Tier-B cells, audited true errors) and the Tier-B events.
- :class:`TierBEvent`: one forward's probabilistic certificate and its ledger admission.
"""


from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import final

from witcert_adapters.records import FloatArray, LayerRecord, ReadRecord
from witcert_adapters.runs import MemoryKind, Site, observed_sites
from witcert_calculus.accounting.records import Admission
from witcert_calculus.contracts import Reading
from witcert_calculus.errors import InvalidValueError
from witcert_calculus.metrics import AtConsume, AttentionTV

__all__ = ["LiveRun", "TierBEvent"]


@final
@dataclass(frozen=True, slots=True)
class TierBEvent:
    """One forward call's Tier-B certificate and its admission into the request ledger.

    Attributes:
        forward: 0-based index of the forward call within the request.
        delta: the telescoping allowance the certificate used (exact).
        rows: query rows the forward metered per layer and head.
        reading: the forward's worst cell as a probabilistic ``AttentionTV`` reading
            (``delta = delta``; its evidence carries the non-adaptive scope).
        admission: the ledger's acknowledgement (kind, charge, spend after it).
    """

    forward: int
    delta: Fraction
    rows: int
    reading: Reading[AttentionTV[AtConsume]]
    admission: Admission


@final
@dataclass(frozen=True, slots=True)
class LiveRun:
    """What one probed request observed: one :class:`LayerRecord` per attention layer.

    Satisfies :class:`~witcert_adapters.runs.ProbeRun`; cells are indexed
    ``[batch, head, position]``, positions are absolute query positions.

    Attributes:
        scheme: the scheme's name.
        memory_class: :attr:`MemoryKind.DENSE` or :attr:`MemoryKind.LATENT`.
        declared: the ``(layer, path)`` sites the probe declared it would observe.
        records: one record per layer that produced data, keyed by layer index (each
            record's write, read, Tier-B and audit sub-records; see
            :mod:`witcert_adapters.records`).
        tier_b_events: one :class:`TierBEvent` per forward call, in order; empty unless the
            scheme is dithered and the probe was given a ledger.

    Raises:
        InvalidValueError: a record is filed under another layer's index.
    """

    scheme: str
    memory_class: MemoryKind
    declared: frozenset[Site]
    records: Mapping[int, LayerRecord]
    tier_b_events: tuple[TierBEvent, ...] = ()

    def __post_init__(self) -> None:
        for key, rec in self.records.items():
            if key != rec.layer:
                raise InvalidValueError(f"records[{key}]", f"record of layer {rec.layer}",
                                        "must be filed under its own layer index")

    @property
    def layers(self) -> tuple[int, ...]:
        """The layers with a read-side record (metered rows), sorted."""
        return tuple(sorted(k for k, rec in self.records.items() if rec.read is not None))

    @property
    def tier_b_layers(self) -> tuple[int, ...]:
        """The layers with a Tier-B record, sorted."""
        return tuple(sorted(k for k, rec in self.records.items() if rec.tier_b is not None))

    @property
    def observed(self) -> frozenset[Site]:
        """The ``(layer, path)`` sites that produced data."""
        return observed_sites(self.records.values())

    def read(self, layer: int) -> ReadRecord:
        """Layer ``layer``'s read-side record.

        Raises:
            InvalidValueError: the layer metered no row.
        """
        rec = self.records.get(layer)
        if rec is None or rec.read is None:
            raise InvalidValueError("layer", layer, f"metered no row; metered: {self.layers}")
        return rec.read

    def reported(self, layer: int) -> FloatArray:
        """The reported meter ``min(1, raw)`` of a layer."""
        return self.read(layer).reported()

    def reported_tier_b(self, layer: int) -> FloatArray:
        """The reported Tier-B bound ``min(1, raw)`` of a layer.

        Raises:
            InvalidValueError: the layer has no Tier-B record.
        """
        rec = self.records.get(layer)
        if rec is None or rec.tier_b is None:
            raise InvalidValueError("layer", layer,
                                    f"has no Tier-B record; Tier-B layers: {self.tier_b_layers}")
        return rec.tier_b.reported()
