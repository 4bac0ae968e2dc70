"""One scheme's requests accumulated into its row of the measured table.

Main declarations
-----------------
- :class:`SchemeTally` (one scheme's requests, accumulated) and :class:`SchemeRow` (its
  row of the measured table).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import final

import numpy as np
import numpy.typing as npt

from witcert_adapters.demo.replay import RequestResult
from witcert_calculus.errors import InvalidValueError

__all__ = ["SchemeRow", "SchemeTally"]

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


def _strings() -> list[str]:
    return []


def _floats() -> list[float]:
    return []


def _flags() -> list[bool]:
    return []


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
            if rec.audit is None:
                raise InvalidValueError(f"layer {layer}", None, "has no audit record")
            sel = run.read(layer).positions >= plen
            rep = run.reported(layer)[..., sel]
            self.hits[layer] += (rep <= threshold).sum()
            self.cells[layer] += rep.size
            tv = rec.audit.true_tv
            self.max_true_tv = max(self.max_true_tv, float(tv.max()))
            self.violations += int((tv > run.reported(layer)).sum())
            if rec.tier_b is not None:
                rep_b = rec.tier_b.reported()
                self.b_hits += int((rep_b[..., sel] <= threshold).sum())
                self.b_cells += int(rep_b[..., sel].size)
                self.b_violations += int((tv > rep_b).sum())
                self.b_delta_loc = max(self.b_delta_loc, float(rec.tier_b.delta_loc.max()))
        if run.tier_b_events:
            self.b_spent.append(str(result.ledger.spent))

    def per_layer(self) -> list[float]:
        """Per layer, the covered fraction of decode-step cells."""
        out: list[float] = (self.hits / self.cells).tolist()
        return out

    def row(self) -> SchemeRow:
        """The scheme's row of the measured table."""
        gate = "accepted" if all(v == "accepted" for v in self.verdicts) else \
            "; ".join(sorted(set(self.verdicts)))
        tier_b = self.b_cells > 0
        return SchemeRow(self.scheme, float(self.hits.sum() / self.cells.sum()),
                         float(np.mean(self.kl)), float(np.mean(self.top1)), self.max_true_tv,
                         self.violations, gate,
                         tier_b_coverage=self.b_hits / self.b_cells if tier_b else None,
                         tier_b_violations=self.b_violations if tier_b else None,
                         tier_b_delta_loc=self.b_delta_loc if tier_b else None,
                         tier_b_spent=", ".join(sorted(set(self.b_spent))) if tier_b else None)
