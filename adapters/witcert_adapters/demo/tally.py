"""One scheme's requests accumulated into its row of the measured table.

Main declarations
-----------------
- :class:`SchemeTally` (one scheme's requests, accumulated) and :class:`SchemeRow` (its
  row of the measured table); :func:`audited_violations` (one layer's audited cells above
  their bounds).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import final

import numpy as np
import numpy.typing as npt

from witcert_adapters.demo.replay import RequestResult
from witcert_adapters.live_run import LiveRun
from witcert_adapters.schemes import get_scheme
from witcert_calculus.errors import InvalidValueError

__all__ = ["SchemeRow", "SchemeTally", "audited_violations"]

FloatArray = npt.NDArray[np.float64]


@final
@dataclass(frozen=True, slots=True)
class SchemeRow:
    """One row of the measured table.

    Attributes:
        scheme: scheme name.
        coverage: fraction of decode-step (layer, head, step) cells with meter <= threshold.
        kl: mean teacher-forced KL(uncompressed || compressed) in nats per step.
        top1: teacher-forced top-1 agreement with the uncompressed model.
        max_true_tv: largest true TV over all audited cells.
        violations: audited cells whose true TV exceeded the bound (must be 0).
        gate: ``"accepted"`` or the failed stage.
        tier_b_coverage: for a dithered scheme, the same coverage under the Tier-B
            (probabilistic, non-adaptive) certificate; ``None`` otherwise.
        tier_b_violations: audited cells whose true TV exceeded the Tier-B bound.
        tier_b_delta_loc: the largest per-cell failure probability used.
        tier_b_spent: the ledger's spend per request (exact, as text), e.g. ``"9/1000"``.
        tier_b_fixed_coverage: the Tier-B coverage at the fixed-horizon allocation
            ``delta_req / (L H T)`` (for comparison with the anytime-valid one).
        key_bytes: stored bytes per key per token per kv head: measured from the stored
            tensors for a dithered store (codes, scales, outlier values, pair indices),
            the scheme's format otherwise.
        key_bytes_measured: whether :attr:`key_bytes` was measured from stored tensors.
        output_coverage: decode-step cells whose output bound over ``max ||v||`` is at most
            the threshold.
        joint_coverage: decode-step cells where both the TV meter and the relative output
            bound are at most the threshold (counted cell by cell, not from the marginals).
        pair_token_overlap / pair_final_overlap: with outlier pairs, how stable the prefill
            choice was: the mean fraction of each later token's own top-``m`` pairs among the
            fixed ones, and of the top-``m`` pairs over all tokens that are the fixed ones.
    """

    scheme: str
    coverage: float
    kl: float
    top1: float
    max_true_tv: float
    violations: int
    gate: str
    tier_b_coverage: float | None = None
    tier_b_violations: int | None = None
    tier_b_delta_loc: float | None = None
    tier_b_spent: str | None = None
    tier_b_fixed_coverage: float | None = None
    key_bytes: float = 0.0
    key_bytes_measured: bool = False
    output_coverage: float | None = None
    joint_coverage: float | None = None
    pair_token_overlap: float | None = None
    pair_final_overlap: float | None = None


def _strings() -> list[str]:
    return []


def _floats() -> list[float]:
    return []


def _flags() -> list[bool]:
    return []


def audited_violations(run: LiveRun, layer: int) -> tuple[int, int]:
    """One layer's audited cells whose true TV exceeds the reported Tier-A bound, and the
    reported Tier-B bound (0 without Tier B).

    Raises:
        InvalidValueError: the layer has no audit record (the demo always audits).
    """
    rec = run.records[layer]
    if rec.audit is None:
        raise InvalidValueError(f"layer {layer}", None, "has no audit record")
    tv = rec.audit.true_tv
    above_b = 0 if rec.tier_b is None else int((tv > rec.tier_b.reported()).sum())
    return int((tv > run.reported(layer)).sum()), above_b


@dataclass(slots=True)
class SchemeTally:
    """One scheme's requests, accumulated in order (mutable; one per scheme).

    Attributes:
        scheme: the scheme's name.
        hits / cells: per layer, decode-step cells at or below the threshold, and all of them.
        kl / top1: every decode step's KL and top-1 agreement, request after request.
        max_true_tv / violations: the largest audited true TV, and cells above their bound.
        b_hits / b_cells / b_violations / b_delta_loc: the same for the Tier-B bound, and
            the largest per-cell failure probability used.
        b_spent: per request with Tier-B events, the ledger's spend (exact, as text).
        b_fixed_hits: Tier-B hits at the fixed-horizon allocation.
        out_hits / joint_hits / out_cells: decode-step cells with the relative output bound
            at or below the threshold, with both it and the meter, and all such cells.
        store_bytes / overlaps: per layer and request, a dithered store's measured bytes
            and its outlier pairs' ``(token, final)`` overlaps.
        verdicts: per request, ``"accepted"`` or ``"rejected at <stage>"``.
    """

    scheme: str
    hits: FloatArray
    cells: FloatArray
    kl: list[float] = field(default_factory=_floats)
    top1: list[bool] = field(default_factory=_flags)
    max_true_tv: float = 0.0
    violations: int = 0
    b_hits: int = 0
    b_cells: int = 0
    b_violations: int = 0
    b_delta_loc: float = 0.0
    b_spent: list[str] = field(default_factory=_strings)
    b_fixed_hits: int = 0
    out_hits: int = 0
    joint_hits: int = 0
    out_cells: int = 0
    store_bytes: list[float] = field(default_factory=_floats)
    token_overlaps: list[float] = field(default_factory=_floats)
    final_overlaps: list[float] = field(default_factory=_floats)
    verdicts: list[str] = field(default_factory=_strings)

    @classmethod
    def start(cls, scheme: str, *, layers: int) -> SchemeTally:
        """An empty tally over ``layers`` layers."""
        return cls(scheme, np.zeros(layers), np.zeros(layers))

    def add(self, result: RequestResult, *, threshold: float) -> None:
        """Fold one request in: its steps, its decode-step cells and its verdict.

        Raises:
            InvalidValueError: a metered layer without an audit (the demo always audits).
        """
        run = result.run
        plen = result.reference.prompt_len
        self.kl += result.kl
        self.top1 += result.top1
        v = result.verdict
        self.verdicts.append("accepted" if v.accepted else f"rejected at {v.failed_stage}")
        for layer in run.layers:
            rec = run.records[layer]
            above, above_b = audited_violations(run, layer)
            assert rec.audit is not None  # audited_violations raised otherwise
            sel = run.read(layer).positions >= plen
            rep = run.reported(layer)[..., sel]
            self.hits[layer] += (rep <= threshold).sum()
            self.cells[layer] += rep.size
            tv = rec.audit.true_tv
            self.max_true_tv = max(self.max_true_tv, float(tv.max()))
            self.violations += above
            out = run.read(layer).output_cells(threshold=threshold, min_position=plen)
            if out is not None:
                self.out_cells += out[0]
                self.out_hits += out[1]
                self.joint_hits += out[2]
            if rec.tier_b is not None:
                rep_b = rec.tier_b.reported()
                self.b_hits += int((rep_b[..., sel] <= threshold).sum())
                self.b_cells += int(rep_b[..., sel].size)
                self.b_violations += above_b
                self.b_delta_loc = max(self.b_delta_loc, float(rec.tier_b.delta_loc.max()))
                fixed = rec.tier_b.fixed_meter
                if fixed is not None:
                    self.b_fixed_hits += int((np.minimum(1.0, fixed[..., sel]) <= threshold).sum())
            store = None if rec.write is None else rec.write.store
            if store is not None:
                self.store_bytes.append(store.key_bytes)
                if store.token_overlap is not None:
                    self.token_overlaps.append(store.token_overlap)
                if store.final_overlap is not None:
                    self.final_overlaps.append(store.final_overlap)
        if run.tier_b_events:
            self.b_spent.append(str(result.ledger.spent))

    def per_layer(self) -> list[float]:
        """Per layer, the covered fraction of decode-step cells."""
        out: list[float] = (self.hits / self.cells).tolist()
        return out

    def row(self, *, head_dim: int) -> SchemeRow:
        """The scheme's row of the measured table (``head_dim`` sizes a format's key bytes)."""
        gate = "accepted" if all(v == "accepted" for v in self.verdicts) else \
            "; ".join(sorted(set(self.verdicts)))
        tier_b = self.b_cells > 0
        measured = bool(self.store_bytes)
        key_bytes = float(np.mean(self.store_bytes)) if measured else \
            get_scheme(self.scheme).key_bytes(head_dim)
        out = self.out_cells > 0
        return SchemeRow(self.scheme, float(self.hits.sum() / self.cells.sum()),
                         float(np.mean(self.kl)), float(np.mean(self.top1)), self.max_true_tv,
                         self.violations, gate,
                         tier_b_coverage=self.b_hits / self.b_cells if tier_b else None,
                         tier_b_violations=self.b_violations if tier_b else None,
                         tier_b_delta_loc=self.b_delta_loc if tier_b else None,
                         tier_b_spent=", ".join(sorted(set(self.b_spent))) if tier_b else None,
                         tier_b_fixed_coverage=self.b_fixed_hits / self.b_cells if tier_b
                         else None,
                         key_bytes=key_bytes, key_bytes_measured=measured,
                         output_coverage=self.out_hits / self.out_cells if out else None,
                         joint_coverage=self.joint_hits / self.out_cells if out else None,
                         pair_token_overlap=float(np.mean(self.token_overlaps))
                         if self.token_overlaps else None,
                         pair_final_overlap=float(np.mean(self.final_overlaps))
                         if self.final_overlaps else None)
