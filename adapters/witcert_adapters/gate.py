"""Acceptance gate for live witnesses: coverage, then magnitude, then soundness.

The order is fixed and a failure invalidates everything after it (later stages are
reported as not evaluated): a structurally green run can be semantically wrong (a probe
on a path the model never takes, a per-layer accumulator overwriting itself, a store
that was never written), so structure is checked before numbers, and numbers before
soundness.

1. **coverage**: the run declared at least one site (no evidence, no certificate: a run
   with no metered reading is never accepted); the observed ``(layer, path)`` set equals
   the declared set; every layer's
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

The stage folding (an evaluated stage, then "not evaluated" after a failure) and the
site checks are shared by every memory class's gate and written against
:class:`~witcert_adapters.runs.ProbeRun`: the selector and recurrent gates use them too.

Main declarations
-----------------
- :class:`Stage`, :class:`StageResult`, :class:`GateVerdict`, :func:`run_gate`,
  :func:`attention_stages`.
- Shared by every gate: :func:`ordered_verdict`, :func:`site_problems` (and
  :func:`declared_problems`), :func:`sites_text`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final, final

import numpy as np

from witcert_adapters.live_run import LiveRun
from witcert_adapters.runs import ObservedLayer, ProbePath, ProbeRun, Site
from witcert_calculus.errors import InvalidValueError
from witcert_calculus.metrics import AtConsume, AttentionTV, check_value
from witcert_calculus.numerics.validation import positive_int

__all__ = ["NO_EVIDENCE", "STAGES", "GateVerdict", "Stage", "StageResult", "attention_stages",
           "declared_problems", "ordered_verdict", "run_gate", "site_problems", "sites_text"]


@final
class Stage(enum.StrEnum):
    """The gate's stages, in the order they run."""

    COVERAGE = "coverage"
    MAGNITUDE = "magnitude"
    SOUNDNESS = "soundness"


STAGES: Final = tuple(Stage)

NO_EVIDENCE: Final = ("no site declared: a run without a metered reading has no evidence "
                      "(no evidence, no certificate)")
"""The coverage problem of a run that declared nothing: a gate never accepts it."""


@final
@dataclass(frozen=True, slots=True)
class StageResult:
    """One stage's outcome.

    Attributes:
        stage: the :class:`Stage` (equal to its name as a string).
        passed: ``True``/``False``, or ``None`` when not evaluated (an earlier stage failed).
        detail: what was checked, or the first problems found.
        checked: number of items checked (cells, layers).
        failures: number of failing items.
    """

    stage: Stage
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
    def failed_stage(self) -> Stage | None:
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


def ordered_verdict(coverage: StageResult, magnitude: Callable[[], StageResult],
                    soundness: Callable[[], StageResult]) -> GateVerdict:
    """Fold the three stages in order: a stage runs only when every earlier one passed.

    Args:
        coverage: the evaluated coverage stage.
        magnitude: evaluates the magnitude stage (called only after coverage passed).
        soundness: evaluates the soundness stage (called only after magnitude passed).

    Returns:
        The :class:`GateVerdict`; stages after the first failure read "not evaluated".

    Example:
        >>> cov = StageResult(Stage.COVERAGE, False, "layer 0 never observed")
        >>> ordered_verdict(cov, lambda: cov, lambda: cov).stages[2].detail
        'coverage failed'
    """
    if not coverage.passed:
        return GateVerdict((coverage, StageResult(Stage.MAGNITUDE, None, "coverage failed"),
                            StageResult(Stage.SOUNDNESS, None, "coverage failed")))
    mag = magnitude()
    if not mag.passed:
        return GateVerdict((coverage, mag, StageResult(Stage.SOUNDNESS, None, "magnitude failed")))
    return GateVerdict((coverage, mag, soundness()))


def sites_text(sites: Iterable[Site], *, limit: int = 6) -> str:
    """The first ``limit`` sites, sorted, as ``[(layer, 'path'), ...]``.

    Example:
        >>> sites_text({(1, ProbePath.READ), (0, ProbePath.WRITE)})
        "[(0, 'write'), (1, 'read')]"
    """
    return repr([(layer, str(path)) for layer, path in sorted(sites)[:limit]])


def site_problems(run: ProbeRun[ObservedLayer], *, joined: bool = False) -> list[str]:
    """Coverage problems of a run's sites: declared but never observed, and the reverse.

    Args:
        run: any probe's run.
        joined: report both directions in one entry (even when one side is empty), as the
            selector and recurrent gates do.

    Returns:
        The problems, empty when the observed sites equal the declared ones.
    """
    return declared_problems(run.declared, run.observed, joined=joined)


def declared_problems(declared: frozenset[Site], observed: frozenset[Site], *,
                      joined: bool = False) -> list[str]:
    """:func:`site_problems` of two site sets (for records that are not a :class:`ProbeRun`).

    No evidence, no certificate: a run that declared no site has no metered reading,
    and that is a coverage problem too (a gate never accepts a run that checked nothing).

    Example:
        >>> declared_problems(frozenset({(0, ProbePath.READ)}), frozenset())
        ["declared but never observed: [(0, 'read')]"]
        >>> declared_problems(frozenset(), frozenset())
        ['no site declared: a run without a metered reading has no evidence (no evidence, no certificate)']
    """
    if not declared:
        return [NO_EVIDENCE + (f"; observed but never declared: {sites_text(observed)}"
                               if observed else "")]
    missing = declared - observed
    extra = observed - declared
    if joined:
        if not missing and not extra:
            return []
        return [f"declared but never observed: {sites_text(missing)}; "
                f"observed but never declared: {sites_text(extra)}"]
    problems: list[str] = []
    if missing:
        problems.append(f"declared but never observed: {sites_text(missing)}")
    if extra:
        problems.append(f"observed but never declared: {sites_text(extra)}")
    return problems


def _coverage(run: LiveRun, tokens: int) -> StageResult:
    problems = site_problems(run)
    tier_b_declared = any(path == ProbePath.TIER_B for _, path in run.declared)
    for layer in sorted({layer for layer, _ in run.declared}):
        rec = run.records.get(layer)
        w = 0 if rec is None else rec.writes
        r = 0 if rec is None else rec.reads
        if w != tokens:
            problems.append(f"layer {layer}: {w} tokens written, expected {tokens}")
        if r != tokens:
            problems.append(f"layer {layer}: {r} query rows metered, expected {tokens}")
        read = None if rec is None else rec.read
        pos = None if read is None else read.positions
        if pos is not None and not np.array_equal(pos, np.arange(tokens)):
            problems.append(f"layer {layer}: positions {pos[:4].tolist()}... are not 0..{tokens - 1}")
        tb = None if rec is None else rec.tier_b
        if (layer, ProbePath.TIER_B) in run.declared and tb is not None and read is not None \
                and tb.meter.shape != read.meter.shape:
            problems.append(f"layer {layer}: Tier-B cells {tb.meter.shape} do not match Tier-A "
                            f"cells {read.meter.shape}")
    if tier_b_declared:
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
    return StageResult(Stage.COVERAGE, not problems,
                       "; ".join(problems[:6]) if problems else
                       f"{len(run.declared)} (layer, path) pairs, {tokens} tokens per layer",
                       checked=len(run.declared), failures=len(problems))


def _magnitude(run: LiveRun) -> StageResult:
    problems: list[str] = []
    checked = 0
    metric = AttentionTV[AtConsume]
    for layer in run.layers:
        rec = run.records[layer]
        read = run.read(layer)
        wmax = 0.0 if rec.write is None else rec.write.witness_max
        if not np.isfinite(wmax) or wmax < 0:
            problems.append(f"layer {layer}: witness max {wmax!r} not finite and >= 0")
        raw = read.meter
        checked += raw.size
        if np.isnan(raw).any() or (raw < 0).any():
            problems.append(f"layer {layer}: raw meter has NaN or negative entries")
            continue
        rep = read.reported()
        lo, hi = float(rep.min()), float(rep.max())
        for v, what in ((lo, "min"), (hi, "max")):
            try:
                check_value(metric, v, what=f"layer {layer} reported meter {what}")
            except InvalidValueError as err:
                problems.append(str(err))
        if rec.tier_b is not None:
            tb = rec.tier_b.meter
            checked += tb.size
            if np.isnan(tb).any() or (tb < 0).any():
                problems.append(f"layer {layer}: raw Tier-B bound has NaN or negative entries")
        audit = rec.audit
        for name, arr in (("out_bound", read.out_bound),
                          ("true_tv", None if audit is None else audit.true_tv),
                          ("true_out", None if audit is None else audit.true_out)):
            if arr is not None and (not np.isfinite(arr).all() or (arr < 0).any()):
                problems.append(f"layer {layer}: {name} has non-finite or negative entries")
    return StageResult(Stage.MAGNITUDE, not problems,
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
        rec = run.records[layer]
        if rec.audit is None:
            first.append(f"layer {layer}: no audit (run with audit=True)")
            violations += 1
            continue
        true_tv = rec.audit.true_tv
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
        if rec.tier_b is not None:
            bound_b = rec.tier_b.reported()
            b_cells += true_tv.size
            nb = int((true_tv > bound_b).sum())
            if nb:
                b_viol += nb
                idx = tuple(int(i) for i in np.argwhere(true_tv > bound_b)[0])
                first.append(f"layer {layer} cell {idx}: true TV {float(true_tv[idx]):.6g} > "
                             f"Tier-B bound {float(bound_b[idx]):.6g}")
            b_worst = max(b_worst, float((true_tv / np.maximum(bound_b, 1e-300)).max()))
            dl = rec.tier_b.delta_loc
            if dl.size:
                b_dloc = max(b_dloc, float(dl.max()))
        tout = rec.audit.true_out
        ob = run.read(layer).out_bound
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
    return StageResult(Stage.SOUNDNESS, total == 0, detail, checked=cells + b_cells,
                       failures=total)


def attention_stages(run: LiveRun, *, tokens: int) -> tuple[StageResult, StageResult, StageResult]:
    """All three stages of an attention run, each evaluated (for composite gates).

    A composite gate (a hybrid model's) folds these into its own stages in the fixed order;
    :func:`run_gate` is the ordered gate for a pure attention run.

    Args:
        run: what a :class:`~witcert_adapters.hf.Probe` observed.
        tokens: tokens processed (prefill plus decode steps).

    Returns:
        ``(coverage, magnitude, soundness)``, each evaluated whatever the others say.
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
        InvalidValueError: ``tokens`` not a positive int.

    Example:
        >>> # with attach(model, scheme="int8_token", audit=True) as probe:
        >>> #     model(ids, cache=probe.new_cache()); run = probe.result()
        >>> # run_gate(run, tokens=ids.shape[1]).accepted
    """
    tokens = positive_int("tokens", tokens)
    return ordered_verdict(_coverage(run, tokens), lambda: _magnitude(run),
                           lambda: _soundness(run))
