"""Per-layer records of an attention probe's run: one frozen value per layer and path.

A :class:`LayerRecord` holds what one attention layer produced during a request, split by
the path that produced it: the write path (witnesses of the compressed entries), the read
path (the Tier-A meter on every metered query row), Tier B (the probabilistic certificate
of a dithered key store) and the audit (true errors against exact attention). A path that
produced nothing has no sub-record, so a present sub-record is always complete.

Cells are indexed ``[batch, head, position]``; positions are absolute query positions.
Arrays are numpy (float64 unless stated); they are the probe's results, converted once
when the run is collected.

Main declarations
-----------------
- :class:`WriteRecord` (with a dithered store's :class:`KeyStoreRecord`), :class:`ReadRecord`,
  :class:`TierBRecord`, :class:`AuditRecord`.
- :class:`LayerRecord`: one layer's sub-records.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import final

import numpy as np
import numpy.typing as npt

from witcert_adapters.runs import ProbePath
from witcert_calculus.meters.tv_forms import TVBasis, _issue_basis  # pyright: ignore[reportPrivateUsage]
from witcert_calculus.tiers import Evidence

__all__ = ["AuditRecord", "FloatArray", "IntArray", "KeyStoreRecord", "LayerRecord", "ReadRecord",
           "TierBRecord", "WriteRecord"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@final
@dataclass(frozen=True, slots=True)
class KeyStoreRecord:
    """A layer's dithered key store, as measured from its stored tensors.

    Attributes:
        key_bytes: packed bytes per token per kv head (codes of the kept channels, float16
            scales, float16 outlier values, and the outlier pair indices of each head
            amortized over the tokens written).
        outlier_pairs: the pairs fixed on the layer's first write ``[Hkv, m]``.
        token_overlap: over every token written after the first write, the mean fraction
            of its own top-``m`` pairs (by pair energy) among the fixed ones; ``None`` when
            there is no such token or no pair.
        final_overlap: the fraction of the top-``m`` pairs by the energy of every token
            written that are the fixed ones; ``None`` without pairs.
    """

    key_bytes: float
    outlier_pairs: IntArray
    token_overlap: float | None = None
    final_overlap: float | None = None


@final
@dataclass(frozen=True, slots=True)
class WriteRecord:
    """What a layer's write path recorded.

    Attributes:
        tokens: tokens written.
        witness_max: the largest band witness over every logit part.
        witness_full_max: the largest full-residual witness ``||k_hat - k||`` of the first
            logit slot (an input of the coarse chain).
        store: a dithered key store's measured bytes and outlier pairs, else ``None``.
    """

    tokens: int
    witness_max: float
    witness_full_max: float
    store: KeyStoreRecord | None = None


@final
@dataclass(frozen=True, slots=True)
class ReadRecord:
    """What a layer's read path metered (Tier A, deterministic).

    Attributes:
        rows: query rows metered.
        meter: raw min-form TV bound ``[B, H, T]`` (``inf`` = overflow, reported as saturation).
        eform / two_sided: the two forms behind :attr:`meter`.
        c_max: ``max_t c_t`` per cell (the logit sup-norm bound).
        positions: the query positions ``[T]`` (int64).
        q_norm_max: the largest norm of the first logit slot's query (an input of the
            coarse chain).
        last_p / last_c: ``p_tilde`` and ``c`` of the final query row ``[B, H, S]``.
        out_bound: attention-output error bound ``[B, H, T]`` (dense memories), else ``None``.
        bases: what each metered call's bounds rest on, in call order.
        value_scale: with :attr:`out_bound`, the ``max_t ||v_t||`` of each cell's bound.
    """

    rows: int
    meter: FloatArray
    eform: FloatArray
    two_sided: FloatArray
    c_max: FloatArray
    positions: IntArray
    q_norm_max: float
    last_p: FloatArray
    last_c: FloatArray
    out_bound: FloatArray | None = None
    bases: tuple[TVBasis, ...] = ()
    value_scale: FloatArray | None = None

    def reported(self) -> FloatArray:
        """The reported meter ``min(1, raw)``."""
        return np.minimum(1.0, self.meter)

    def relative_output(self) -> FloatArray | None:
        """The output bound over its cell's ``max_t ||v_t||`` (``||y - y^|| / max ||v||`` is
        at most this), or ``None`` without an output bound. A cell whose values are all 0
        has bound 0."""
        if self.out_bound is None or self.value_scale is None:
            return None
        with np.errstate(divide="ignore", invalid="ignore"):
            rel: FloatArray = np.where(self.value_scale > 0, self.out_bound / self.value_scale,
                                       np.where(self.out_bound > 0, np.inf, 0.0))
        return rel

    def output_cells(self, *, threshold: float, min_position: int = 0
                     ) -> tuple[int, int, int] | None:
        """``(cells, output, joint)`` over cells at positions ``>= min_position``: how many
        there are, how many have :meth:`relative_output` at most ``threshold``, and how many
        have both it and the reported meter at most ``threshold`` (counted cell by cell);
        ``None`` without an output bound."""
        rel = self.relative_output()
        if rel is None:
            return None
        sel = self.positions >= min_position
        ok = rel[..., sel] <= threshold
        joint = ok & (self.reported()[..., sel] <= threshold)
        return int(ok.size), int(ok.sum()), int(joint.sum())

    def evidence(self, theorem: str) -> Evidence:
        """The evidence of a reading of this path's bounds that cites ``theorem``.

        Each metered call's :class:`~witcert_calculus.meters.tv_forms.TVBasis` is turned into
        evidence, which reads its computed premises (a failed one raises); a record without
        bases (built by hand) assumes its logit bounds, and its readings are at most
        PARTIALLY_CERTIFIED.

        Raises:
            PremiseError: if a premise computed from a call's inputs does not hold.
        """
        if not self.bases:
            return _issue_basis((), None, Fraction(0)).evidence(theorem)
        found = [b.evidence(theorem) for b in self.bases]
        return found[0]


@final
@dataclass(frozen=True, slots=True)
class TierBRecord:
    """A layer's Tier-B (probabilistic, non-adaptive scope) certificate per cell.

    Attributes:
        meter: raw Tier-B min-form bound ``[B, H, T]``, cell for cell with the Tier-A meter.
        delta_loc: the per-cell failure probability of each row ``[T]``.
        last_u: the per-token bound ``c_t`` of the final query row ``[B, H, S]``.
        fixed_meter: the same bound at the fixed-horizon allocation ``delta_req / (L H T)``
            (compared in reports, never admitted), or ``None``.
    """

    meter: FloatArray
    delta_loc: FloatArray
    last_u: FloatArray
    fixed_meter: FloatArray | None = None

    def reported(self) -> FloatArray:
        """The reported Tier-B bound ``min(1, raw)``."""
        return np.minimum(1.0, self.meter)


@final
@dataclass(frozen=True, slots=True)
class AuditRecord:
    """A layer's true errors against exact attention (float64 references).

    Attributes:
        true_tv: true TV per cell ``[B, H, T]``.
        true_out: true attention-output error per cell (dense memories), else ``None``.
    """

    true_tv: FloatArray
    true_out: FloatArray | None = None


@final
@dataclass(frozen=True, slots=True)
class LayerRecord:
    """Everything one attention layer produced during a request, by path.

    Attributes:
        layer: the layer index.
        write: the write path's record, or ``None`` when the layer wrote nothing.
        read: the read path's record, or ``None`` when no row was metered.
        tier_b: the Tier-B record, or ``None`` (no ledger, or a scheme without dither).
        audit: the audit record, or ``None`` (``audit=False``).

    Example:
        >>> rec = LayerRecord(3, write=WriteRecord(6, 0.5, 0.75))
        >>> rec.writes, rec.reads, sorted(rec.paths)
        (6, 0, [<ProbePath.WRITE: 'write'>])
    """

    layer: int
    write: WriteRecord | None = None
    read: ReadRecord | None = None
    tier_b: TierBRecord | None = None
    audit: AuditRecord | None = None

    @property
    def writes(self) -> int:
        """Tokens written (0 without a write record)."""
        return 0 if self.write is None else self.write.tokens

    @property
    def reads(self) -> int:
        """Query rows metered (0 without a read record)."""
        return 0 if self.read is None else self.read.rows

    @property
    def paths(self) -> frozenset[ProbePath]:
        """The paths that produced data."""
        present = ((ProbePath.WRITE, self.write), (ProbePath.READ, self.read),
                   (ProbePath.TIER_B, self.tier_b), (ProbePath.AUDIT, self.audit))
        return frozenset(path for path, rec in present if rec is not None)
