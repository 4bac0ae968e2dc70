"""The demo's report: the text printed per request and per scheme, and its JSON form.

Every function here formats values computed elsewhere (a page-in plan and a request's
violation count are the things computed here, from the run's records); the text is what
``report.txt`` holds, what the terminal shows and what the README block is cut from, so its
format is part of the demo's output.

``report.txt`` holds the header, one block per request (per-layer readings, output bound,
Tier B, ledger, gate, page-in), the summary with one line per request, the measured table and
the wall time. The terminal shows the same without the per-request blocks
(:func:`terminal_lines`); ``--verbose`` prints all of it.

Main declarations
-----------------
- Text: :func:`header_lines`, :func:`request_lines`, :func:`summary_line`,
  :func:`summary_lines`, :func:`output_line`, :func:`tier_b_line`, :func:`page_in_line`,
  :func:`table_lines`, :func:`wall_line`, :func:`where_line`, :func:`terminal_lines`;
  :func:`violations`.
- JSON: :data:`Json`, :func:`request_json`, :func:`scheme_json`, :func:`report_json`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TypeAlias

import numpy as np

from witcert_adapters.demo.replay import RequestResult
from witcert_adapters.demo.settings import DELTA_REQ, MODEL_NAME, MODEL_TITLE, OPERATING_POINT, \
    DemoSettings
from witcert_adapters.demo.tally import SchemeRow, audited_violations
from witcert_adapters.live_run import LiveRun
from witcert_adapters.readings import coverage
from witcert_calculus import block_summary, page_in_order

__all__ = ["Json", "header_lines", "output_line", "page_in_line", "report_json", "request_json",
           "request_lines", "scheme_json", "summary_line", "summary_lines", "table_lines",
           "terminal_lines", "tier_b_line", "violations", "wall_line", "where_line"]

Json: TypeAlias = "dict[str, Json] | list[Json] | str | int | float | bool | None"
"""A JSON value as :func:`json.dumps` writes it."""

_SHORT = {"CERTIFIED": "cert", "SATURATED": "sat", "PARTIALLY_CERTIFIED": "part",
          "EMPIRICAL": "emp"}


def _short(tier: str) -> str:
    return _SHORT.get(tier, tier)


def header_lines(settings: DemoSettings, *, load_s: float) -> list[str]:
    """The report's first lines: the model, the threshold, the steps and the load time.

    Example:
        >>> header_lines(DemoSettings(), load_s=1.25)[1]
        'threshold for coverage: meter <= 0.2; 8 teacher-forced decode steps per prompt; 8 witness bands per key; model load 1.2 s'
    """
    return [f"WitCert live meters on {MODEL_TITLE}",
            f"threshold for coverage: meter <= {settings.threshold}; {settings.decode_steps} "
            f"teacher-forced decode steps per prompt; {settings.bands} witness bands per key; "
            f"model load {load_s:.1f} s",
            ""]


def page_in_line(run: LiveRun, threshold: float) -> str:
    """Where a page-in would go for the run's worst final-step cell (batch 0), as text."""
    best: tuple[float, int, int] | None = None
    for layer in run.layers:
        rep = run.reported(layer)[..., -1]
        h = int(np.argmax(rep[0]))
        if best is None or rep[0, h] > best[0]:
            best = (float(rep[0, h]), layer, h)
    assert best is not None, "a run without metered layers has no final-step cell"
    value, layer, head = best
    if value <= threshold:
        return f"no page-in needed: worst final-step cell (layer {layer}, head {head}) at {value:.4f}"
    read = run.read(layer)
    p, c = read.last_p[0, head], read.last_c[0, head]
    mass, u = block_summary(p / p.sum(), c, block_size=4)
    plan = page_in_order(mass, u, threshold=threshold)
    return (f"worst final-step cell: layer {layer}, head {head}, meter {value:.4f}; paging in "
            f"{len(plan.order)} of {mass.size} blocks of 4 tokens {list(plan.order)[:8]} brings the "
            f"e-form from {plan.eform_before:.4g} to {plan.eform_after:.4g} (threshold {threshold})")


def _tier_b_coverage(run: LiveRun, plen: int, threshold: float) -> float | None:
    # Decode-step cells at or below the threshold under the Tier-B bound; None without Tier B.
    hits = cells = 0
    for layer in run.tier_b_layers:
        sel = run.read(layer).positions >= plen
        b = run.reported_tier_b(layer)[..., sel]
        hits += int((b <= threshold).sum())
        cells += b.size
    return hits / cells if cells else None


def violations(run: LiveRun) -> int:
    """Audited cells whose true TV exceeds the reported bound, Tier A and Tier B together
    (:func:`~witcert_adapters.demo.tally.audited_violations` summed over the layers).

    Raises:
        InvalidValueError: a metered layer without an audit (the demo always audits).
    """
    return sum(sum(audited_violations(run, layer)) for layer in run.layers)


def summary_line(result: RequestResult, *, threshold: float) -> str:
    """One request in one line: scheme, prompt, decode-step coverage (Tier A, and Tier B where
    the scheme has it), the ledger's verdict, the acceptance gate and the audited violations."""
    run, ref = result.run, result.reference
    cov = coverage(run, threshold=threshold, min_position=ref.prompt_len)
    b = _tier_b_coverage(run, ref.prompt_len, threshold)
    tier_b = f"  B {b:.3f}" if b is not None else " " * 9
    v = result.verdict
    gate = "accepted" if v.accepted else f"rejected at {v.failed_stage}"
    return (f"  {result.request_id:>3d}  {result.scheme:<18s}  {ref.prompt!r:<33s}  coverage "
            f"{cov:.3f}{tier_b}  {result.ledger.tier.name:<19s}  {gate}  violations "
            f"{violations(run)}")


def summary_lines(lines: Sequence[str], *, threshold: float) -> list[str]:
    """The summary: a title, then the requests' :func:`summary_line` in order, then a blank."""
    return [f"Requests (decode-step coverage at tau {threshold}: Tier A, and B for Tier B; the "
            "ledger's verdict; the acceptance gate; audited cells above their bound):",
            *lines, ""]


def tier_b_line(run: LiveRun, plen: int, threshold: float) -> str:
    """The Tier-B summary of a request with Tier-B events, next to Tier A (decode steps)."""
    a_cells = b_cells = a_hits = b_hits = tighter = 0
    for layer in run.layers:
        sel = run.read(layer).positions >= plen
        a = run.reported(layer)[..., sel]
        b = run.reported_tier_b(layer)[..., sel]
        a_cells += a.size
        b_cells += b.size
        a_hits += int((a <= threshold).sum())
        b_hits += int((b <= threshold).sum())
        tighter += int((b < a).sum())
    ev = run.tier_b_events
    worst = max(e.reading.raw for e in ev)
    return (f"  Tier B (probabilistic, {ev[0].reading.tier.name}, non-adaptive scope): "
            f"{len(ev)} forward calls admitted as probabilistic events, deltas "
            f"{ev[0].delta} ... {ev[-1].delta}; decode-step coverage {b_hits / b_cells:.3f} vs "
            f"Tier A {a_hits / a_cells:.3f}; Tier B tighter on {tighter / b_cells:.1%} of cells; "
            f"worst Tier-B cell {min(1.0, worst):.4f}")


def output_line(run: LiveRun, plen: int, threshold: float) -> str | None:
    """The value side next to TV (decode steps): the output bound ``||y - y^|| <= 2 TV max||v||
    + sum p~ rho_v`` over ``max ||v||``, its coverage, its joint coverage with the TV meter
    (counted cell by cell) and its worst audited true/bound ratio; ``None`` without values."""
    cells = hits = joint = 0
    worst = ratio = 0.0
    for layer in run.layers:
        read = run.read(layer)
        rel = read.relative_output()
        out = read.output_cells(threshold=threshold, min_position=plen)
        audit = run.records[layer].audit
        if rel is None or out is None or read.out_bound is None:
            return None
        cells, hits, joint = cells + out[0], hits + out[1], joint + out[2]
        worst = max(worst, float(rel[..., read.positions >= plen].max()))
        if audit is not None and audit.true_out is not None:
            bound = np.maximum(read.out_bound, 1e-300)
            ratio = max(ratio, float((audit.true_out / bound).max()))
    return (f"  output bound / max||v|| (decode steps): coverage {hits / cells:.3f}, joint with "
            f"the TV meter {joint / cells:.3f}; worst {worst:.4f}; largest audited "
            f"true/bound ratio {ratio:.3g}")


def _layer_cells(result: RequestResult) -> list[str]:
    cells: list[str] = []
    for lr in result.readings:
        ch = lr.chain_reading
        assert ch is not None, "the demo bounds every layer's chain"
        cells.append(f"L{lr.layer:<2d} {lr.meter.value:6.4f} [{_short(lr.meter.tier.name):<4}] "
                     f"(h{lr.cell[1]},p{lr.cell[2]:<2d}) | {ch.value:6.4f} "
                     f"[{_short(ch.tier.name):<4}]")
    return cells


def request_lines(result: RequestResult, *, threshold: float, page_in: str) -> list[str]:
    """One request's block of the report (ending with an empty line)."""
    run, ref = result.run, result.reference
    lv = result.ledger
    lines = [f"request {result.request_id}: scheme {result.scheme}, prompt {ref.prompt!r}",
             f"  teacher continuation: {ref.continuation_text!r}",
             f"  meter coverage (decode steps): "
             f"{coverage(run, threshold=threshold, min_position=ref.prompt_len):.3f}; "
             f"mean KL {np.mean(result.kl):.5f} nats; top-1 agreement {np.mean(result.top1):.3f}",
             "  per layer: worst-cell meter [tier] (head, position) | coarse chain bound [tier]"]
    cells = _layer_cells(result)
    lines += ["    " + "   ".join(cells[i:i + 3]) for i in range(0, len(cells), 3)]
    out = output_line(run, ref.prompt_len, threshold)
    if out is not None:
        lines.append(out)
    if run.tier_b_events:
        lines.append(tier_b_line(run, ref.prompt_len, threshold))
    lines += [f"  ledger: verdict {lv.tier.name}, spent {lv.spent} of {lv.delta_req} "
              f"({lv.counts.deterministic} deterministic Tier-A admissions at delta 0, "
              f"{lv.counts.probabilistic} probabilistic Tier-B admissions, "
              f"{lv.counts.saturated} saturated)",
              f"  gate: {result.verdict}",
              f"  page-in: {page_in}",
              ""]
    return lines


def _opt(x: float | None, fmt: str = "8.3f") -> str:
    return f"{'-':>8s}" if x is None else format(x, fmt)


def table_lines(rows: Sequence[SchemeRow], *, rho: float, settings: DemoSettings,
                fp16_bytes: float) -> list[str]:
    """The measured table over schemes, its Tier-B rows, the operating point and the rank
    correlation (``fp16_bytes``: an fp16 key's bytes per token per head)."""
    tau = settings.threshold
    lines = [f"Measured table ({len(settings.prompts)} prompts x {settings.decode_steps} "
             f"teacher-forced decode steps, coverage threshold {tau}):",
             "  scheme                   B/key  coverage    joint  KL(nats)    top-1   max true TV  "
             "violations  gate"]
    for r in rows:
        lines.append(f"  {r.scheme:22s}  {r.key_bytes:6.1f}  {r.coverage:8.3f} "
                     f"{_opt(r.joint_coverage)}  {r.kl:9.5f}  {r.top1:6.3f}  "
                     f"{r.max_true_tv:11.4g}  {r.violations:10d}  {r.gate}")
    for r in rows:
        if r.tier_b_coverage is not None:
            lines.append(f"  {r.scheme + ' [B]':22s}  {r.key_bytes:6.1f}  {r.tier_b_coverage:8.3f}"
                         f"  (Tier B: probabilistic, non-adaptive scope; delta_loc <= "
                         f"{r.tier_b_delta_loc:.3g} per cell, ledger spend {r.tier_b_spent} of "
                         f"{DELTA_REQ} per request; fixed-horizon delta_req/(L H T) coverage "
                         f"{_opt(r.tier_b_fixed_coverage, '.3f')})  violations "
                         f"{r.tier_b_violations}")
    lines += [f"  (rows without [B] are Tier A, the adaptive-safe deterministic bound; a [B] row "
              "gives the same scheme's coverage under its Tier-B probabilistic certificate; "
              f"B/key: stored key bytes per token per kv head, fp16 {fp16_bytes:.0f}; joint: "
              "cells with both the TV meter and the output bound over max ||v|| at or below "
              "the threshold)"]
    point = next((r for r in rows if r.scheme == OPERATING_POINT), None)
    if point is not None and point.tier_b_coverage is not None:
        pairs = "" if point.pair_token_overlap is None else (
            f"; outlier pairs fixed at the prefill hold {point.pair_token_overlap:.3f} of each "
            f"later token's own top pairs and {_opt(point.pair_final_overlap, '.3f')} of the "
            "top pairs over all tokens")
        lines.append(f"Certified operating point {point.scheme}: Tier-B coverage "
                     f"{point.tier_b_coverage:.3f} at tau {tau} with {point.tier_b_violations} "
                     f"violations, {point.key_bytes:.1f} B per key ({point.key_bytes / fp16_bytes:.3f}"
                     f" of fp16, measured from the stored tensors){pairs}")
    lines += [f"Spearman rank correlation between coverage (Tier A) and KL: {rho:.3f}",
              "High coverage is evidence of safety; low coverage guarantees nothing either way."]
    return lines


def wall_line(wall_s: float) -> str:
    """The report's last line: the wall time."""
    return f"wall time {wall_s:.1f} s"


def where_line(out: Path) -> str:
    """Where the run's files are (the terminal's last line).

    Example:
        >>> where_line(Path("out/demo")).split("; ")
        ['full report (one block per request): out/demo/report.txt', 'JSON: out/demo/report.json',
         'entry traces: out/demo/traces/SCHEME.jsonl', 'plot: out/demo/coverage.png']
    """
    return (f"full report (one block per request): {out / 'report.txt'}; JSON: "
            f"{out / 'report.json'}; entry traces: {out / 'traces'}/SCHEME.jsonl; plot: "
            f"{out / 'coverage.png'}")


def terminal_lines(shown: Sequence[str], *, wall_s: float, out: Path) -> list[str]:
    """What the demo prints: the ``shown`` part of the report (``report.txt`` without the
    per-request blocks, unless verbose), then one line with the wall time and where the files
    are.

    Example:
        >>> lines = terminal_lines(["title", "", "table"], wall_s=2.0, out=Path("o"))
        >>> lines[:3], lines[3][:56]
        (['title', '', 'table'], 'wall time 2.0 s; full report (one block per request): o/')
    """
    return [*shown, f"{wall_line(wall_s)}; {where_line(out)}"]


def request_json(result: RequestResult, *, page_in: str) -> Json:
    """One request's entry of ``report.json``."""
    layers: list[Json] = []
    for lr in result.readings:
        ch = lr.chain_reading
        assert ch is not None, "the demo bounds every layer's chain"
        layers.append({"layer": lr.layer, "meter_raw": lr.meter.raw, "meter": lr.meter.value,
                       "tier": lr.meter.tier.name, "cell": list(lr.cell),
                       "chain_bound": ch.value, "chain_tier": ch.tier.name})
    v = result.verdict
    return {"request": result.request_id, "scheme": result.scheme,
            "prompt": result.reference.prompt, "layers": layers, "gate": str(v),
            "accepted": v.accepted, "page_in": page_in, "kl": float(np.mean(result.kl)),
            "top1": float(np.mean(result.top1)), "ledger_tier": result.ledger.tier.name,
            "ledger_spent": str(result.ledger.spent)}


def _row_json(r: SchemeRow) -> Json:
    return {"scheme": r.scheme, "coverage": r.coverage, "kl": r.kl, "top1": r.top1,
            "max_true_tv": r.max_true_tv, "violations": r.violations, "gate": r.gate,
            "tier_b_coverage": r.tier_b_coverage, "tier_b_violations": r.tier_b_violations,
            "tier_b_delta_loc": r.tier_b_delta_loc, "tier_b_spent": r.tier_b_spent}


def scheme_json(r: SchemeRow, *, threshold: float, fp16_bytes: float) -> Json:
    """One scheme's entry of ``report.json``'s ``"schemes"`` list."""
    return {"name": r.scheme, "threshold": threshold, "coverage_tier_a": r.coverage,
            "coverage_tier_b": r.tier_b_coverage,
            "coverage_tier_b_fixed_horizon": r.tier_b_fixed_coverage,
            "violations": r.violations + (r.tier_b_violations or 0),
            "violations_tier_a": r.violations, "violations_tier_b": r.tier_b_violations,
            "key_bytes_per_token_head": r.key_bytes,
            "key_bytes_measured": r.key_bytes_measured, "key_bytes_fp16": fp16_bytes,
            "coverage_output": r.output_coverage, "coverage_joint": r.joint_coverage,
            "kl": r.kl, "top1": r.top1, "gate": r.gate,
            "tier_b_delta_loc": r.tier_b_delta_loc, "tier_b_spent": r.tier_b_spent,
            "outlier_pair_token_overlap": r.pair_token_overlap,
            "outlier_pair_final_overlap": r.pair_final_overlap}


def report_json(settings: DemoSettings, *, requests: Sequence[Json], rows: Sequence[SchemeRow],
                rho: float, per_layer: Mapping[str, list[float]], wall_s: float,
                fp16_bytes: float) -> Json:
    """The whole ``report.json``: settings, the schemes, requests, the table and per-layer
    coverage."""
    per_layer_json: dict[str, Json] = {k: list[Json](v) for k, v in per_layer.items()}
    return {"model": MODEL_NAME, "threshold": settings.threshold, "bands": settings.bands,
            "operating_point": OPERATING_POINT,
            "schemes": [scheme_json(r, threshold=settings.threshold, fp16_bytes=fp16_bytes)
                        for r in rows],
            "prompts": list[Json](settings.prompts), "requests": list(requests),
            "table": [repr(r) for r in rows], "rows": [_row_json(r) for r in rows],
            "spearman_coverage_kl": rho, "per_layer_coverage": per_layer_json,
            "wall_s": wall_s}
