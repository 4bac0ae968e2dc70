"""Acceptance gate for live witnesses: coverage, then magnitude, then soundness.

The order is fixed and a failure invalidates everything after it (later stages are
reported as not evaluated): a structurally green run can be semantically wrong (a probe
on a path the model never takes, a per-layer accumulator overwriting itself, a store
that was never written), so structure is checked before numbers, and numbers before
soundness.

1. **coverage**: the observed ``(layer, path)`` set equals the declared set; every layer's
   write counter equals the tokens the run processed and its read counter the query rows;
   every layer's readings cover the same positions. With Tier B declared, every layer's
   Tier-B cells match its Tier-A cells one to one, and the ledger's probabilistic counter
   advanced once per forward call (admissions with consecutive indices, each charged
   exactly its certificate's delta).
2. **magnitude**: no NaN; witnesses finite and nonnegative; every reported meter value
   ``min(1, raw)`` (Tier A and Tier B) in the range of ``AttentionTV`` (``[0, 1]``), raw
   values not NaN and nonnegative (``inf`` is allowed: it is an overflow reported as
   saturation).
3. **soundness**: on every audited cell (layer, batch, head, position), the true TV
   against exact attention is at most the reported bound, and for dense memories the true
   attention-output error is at most its bound. Tier-B cells are checked the same way: a
   probabilistic bound may fail with probability ``delta_loc`` per cell, and a violation is
   still counted and reported (with the tiny deltas used, any violation points at a bug).
   Zero violations are accepted.

Main declarations
-----------------
- :class:`StageResult`, :class:`GateVerdict`, :func:`run_gate`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import final

import numpy as np

from witcert_adapters.hf import LiveRun
from witcert_calculus.errors import InvalidValueError
from witcert_calculus.metrics import AtConsume, AttentionTV, check_value

__all__ = ["STAGES", "GateVerdict", "StageResult", "attention_stages", "run_gate"]

STAGES = ("coverage", "magnitude", "soundness")


@final
@dataclass(frozen=True, slots=True)
class StageResult:
    """One stage's outcome.

    Attributes:
        stage: ``"coverage"``, ``"magnitude"`` or ``"soundness"``.
        passed: ``True``/``False``, or ``None`` when not evaluated (an earlier stage failed).
        detail: what was checked, or the first problems found.
        checked: number of items checked (cells, layers).
        failures: number of failing items.
    """

    stage: str
    passed: bool | None
    detail: str
    checked: int = 0
    failures: int = 0


@final
@dataclass(frozen=True, slots=True)
class GateVerdict:
    """The gate's verdict on one run.

    Attributes:
        stages: the three :class:`StageResult` in order.
    """

    stages: tuple[StageResult, ...]

    @property
    def accepted(self) -> bool:
        """True when every stage passed."""
        return all(s.passed is True for s in self.stages)

    @property
    def failed_stage(self) -> str | None:
        """The first stage that failed, or ``None``."""
        for s in self.stages:
            if s.passed is False:
                return s.stage
        return None

    def __str__(self) -> str:
        parts: list[str] = []
        for s in self.stages:
            mark = {True: "pass", False: "FAIL", None: "not evaluated"}[s.passed]
            parts.append(f"{s.stage}: {mark} ({s.detail})")
        return "; ".join(parts)


def _coverage(run: LiveRun, tokens: int) -> StageResult:
    problems: list[str] = []
    missing = sorted(run.declared - run.observed)
    extra = sorted(run.observed - run.declared)
    if missing:
        problems.append(f"declared but never observed: {missing[:6]}")
    if extra:
        problems.append(f"observed but never declared: {extra[:6]}")
    layers = sorted({layer for layer, _ in run.declared})
    for layer in layers:
        w = run.writes.get(layer, 0)
        r = run.reads.get(layer, 0)
        if w != tokens:
            problems.append(f"layer {layer}: {w} tokens written, expected {tokens}")
        if r != tokens:
            problems.append(f"layer {layer}: {r} query rows metered, expected {tokens}")
        pos = run.positions.get(layer)
        if pos is not None and not np.array_equal(pos, np.arange(tokens)):
            problems.append(f"layer {layer}: positions {pos[:4].tolist()}... are not 0..{tokens - 1}")
        tb = run.tier_b.get(layer)
        if (layer, "tier_b") in run.declared and tb is not None and layer in run.meter \
                and tb.shape != run.meter[layer].shape:
            problems.append(f"layer {layer}: Tier-B cells {tb.shape} do not match Tier-A cells "
                            f"{run.meter[layer].shape}")
    if any(path == "tier_b" for _, path in run.declared):
        if not run.tier_b_events:
            problems.append("Tier B declared but no probabilistic event was admitted")
        indices = [ev.admission.prob_index for ev in run.tier_b_events]
        for i, ev in enumerate(run.tier_b_events):
            adm = ev.admission
            prev = indices[i - 1] if i else None
            if adm.prob_index is None or (prev is not None and adm.prob_index != prev + 1) \
                    or adm.charged != ev.delta:
                problems.append(f"Tier-B event {i}: ledger index {adm.prob_index}, charged "
                                f"{adm.charged} for delta {ev.delta} (counter did not advance)")
                break
    return StageResult("coverage", not problems,
                       "; ".join(problems[:6]) if problems else
                       f"{len(run.declared)} (layer, path) pairs, {tokens} tokens per layer",
                       checked=len(run.declared), failures=len(problems))


def _magnitude(run: LiveRun) -> StageResult:
    problems: list[str] = []
    checked = 0
    metric = AttentionTV[AtConsume]
    for layer in run.layers:
        wmax = run.witness_max.get(layer, 0.0)
        if not np.isfinite(wmax) or wmax < 0:
            problems.append(f"layer {layer}: witness max {wmax!r} not finite and >= 0")
        raw = run.meter[layer]
        checked += raw.size
        if np.isnan(raw).any() or (raw < 0).any():
            problems.append(f"layer {layer}: raw meter has NaN or negative entries")
            continue
        rep = run.reported(layer)
        lo, hi = float(rep.min()), float(rep.max())
        for v, what in ((lo, "min"), (hi, "max")):
            try:
                check_value(metric, v, what=f"layer {layer} reported meter {what}")
            except InvalidValueError as err:
                problems.append(str(err))
        tb = run.tier_b.get(layer)
        if tb is not None:
            checked += tb.size
            if np.isnan(tb).any() or (tb < 0).any():
                problems.append(f"layer {layer}: raw Tier-B bound has NaN or negative entries")
        for name, arr in (("out_bound", run.out_bound.get(layer)),
                          ("true_tv", run.true_tv.get(layer)),
                          ("true_out", run.true_out.get(layer))):
            if arr is not None and (not np.isfinite(arr).all() or (arr < 0).any()):
                problems.append(f"layer {layer}: {name} has non-finite or negative entries")
    return StageResult("magnitude", not problems,
                       "; ".join(problems[:6]) if problems else
                       f"{checked} cells finite and in range",
                       checked=checked, failures=len(problems))


def _soundness(run: LiveRun) -> StageResult:
    cells = 0
    violations = 0
    worst = 0.0
    b_cells = 0
    b_viol = 0
    b_worst = 0.0
    b_dloc = 0.0
    first: list[str] = []
    for layer in run.layers:
        true_tv = run.true_tv.get(layer)
        if true_tv is None:
            first.append(f"layer {layer}: no audit (run with audit=True)")
            violations += 1
            continue
        bound = run.reported(layer)
        bad = true_tv > bound
        cells += true_tv.size
        n = int(bad.sum())
        if n:
            violations += n
            idx = tuple(int(i) for i in np.argwhere(bad)[0])
            first.append(f"layer {layer} cell {idx}: true TV {float(true_tv[idx]):.6g} > "
                         f"bound {float(bound[idx]):.6g}")
        worst = max(worst, float((true_tv / np.maximum(bound, 1e-300)).max()))
        tb = run.tier_b.get(layer)
        if tb is not None:
            bound_b = run.reported_tier_b(layer)
            b_cells += true_tv.size
            nb = int((true_tv > bound_b).sum())
            if nb:
                b_viol += nb
                idx = tuple(int(i) for i in np.argwhere(true_tv > bound_b)[0])
                first.append(f"layer {layer} cell {idx}: true TV {float(true_tv[idx]):.6g} > "
                             f"Tier-B bound {float(bound_b[idx]):.6g}")
            b_worst = max(b_worst, float((true_tv / np.maximum(bound_b, 1e-300)).max()))
            dl = run.tier_b_delta_loc.get(layer)
            if dl is not None and dl.size:
                b_dloc = max(b_dloc, float(dl.max()))
        tout = run.true_out.get(layer)
        ob = run.out_bound.get(layer)
        if tout is not None and ob is not None:
            cells += tout.size
            m = int((tout > ob).sum())
            if m:
                violations += m
                first.append(f"layer {layer}: {m} output-error cells above their bound")
    tier_b = (f"; Tier B: {b_cells} audited cells (delta_loc <= {b_dloc:.3g} each), "
              f"{b_viol} violations, largest true/bound ratio {b_worst:.3g}") if b_cells else ""
    detail = ("; ".join(first[:4]) + tier_b if violations or b_viol else
              f"Tier A: {cells} audited cells, 0 violations, largest true/bound ratio "
              f"{worst:.3g}{tier_b}")
    total = violations + b_viol
    return StageResult("soundness", total == 0, detail, checked=cells + b_cells, failures=total)


def attention_stages(run: LiveRun, *, tokens: int) -> tuple[StageResult, StageResult, StageResult]:
    """All three stages of an attention run, each evaluated (for composite gates).

    A composite gate (a hybrid model's) folds these into its own stages in the fixed order;
    :func:`run_gate` is the ordered gate for a pure attention run.
    """
    return _coverage(run, tokens), _magnitude(run), _soundness(run)


def run_gate(run: LiveRun, *, tokens: int) -> GateVerdict:
    """Run coverage, magnitude and soundness in order on ``run``.

    Args:
        run: what a :class:`~witcert_adapters.hf.Probe` observed.
        tokens: how many tokens the request processed (prefill plus decode steps); every
            declared layer must have written and metered exactly this many.

    Returns:
        A :class:`GateVerdict`; stages after the first failure are not evaluated.

    Raises:
        InvalidValueError: ``tokens`` not positive.
    """
    if tokens < 1:
        raise InvalidValueError("tokens", tokens, "must be >= 1")
    cov = _coverage(run, tokens)
    if not cov.passed:
        return GateVerdict((cov, StageResult("magnitude", None, "coverage failed"),
                            StageResult("soundness", None, "coverage failed")))
    mag = _magnitude(run)
    if not mag.passed:
        return GateVerdict((cov, mag, StageResult("soundness", None, "magnitude failed")))
    return GateVerdict((cov, mag, _soundness(run)))
