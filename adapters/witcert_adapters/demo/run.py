"""The demo run: load the model, replay every prompt under every scheme, write the report.

Main declarations
-----------------
- :func:`run_demo`: the whole run; writes ``report.txt``, ``report.json`` and
  ``coverage.png`` and returns the JSON report.
- :func:`measure_scheme`: one scheme over every reference.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, final

import numpy as np
import numpy.typing as npt
import torch
from tqdm import tqdm

from witcert_adapters.demo.measure import spearman
from witcert_adapters.demo.models import load_smollm2
from witcert_adapters.demo.plot import plot_coverage
from witcert_adapters.demo.reference import Reference, greedy_references
from witcert_adapters.demo.replay import RequestResult, replay
from witcert_adapters.demo.report import (
    Json,
    header_lines,
    page_in_line,
    report_json,
    request_json,
    request_lines,
    summary_line,
    summary_lines,
    table_lines,
    terminal_lines,
    wall_line,
)
from witcert_adapters.demo.settings import (
    BANDS,
    CONTINUATION,
    DELTA_REQ,
    DEMO_SCHEMES,
    PROMPTS,
    THRESHOLD,
    DemoSettings,
)
from witcert_adapters.demo.tally import SchemeRow, SchemeTally
from witcert_adapters.records import FloatArray
from witcert_calculus import Aggregate, InvalidValueError, RiskLedger
from witcert_calculus.explore.entry_trace import write_entry_trace

__all__ = ["SchemeReport", "measure_scheme", "run_demo"]


@final
@dataclass(frozen=True, slots=True)
class SchemeReport:
    """One scheme measured over every reference.

    Attributes:
        row: its row of the measured table.
        per_layer: per layer, the covered fraction of decode-step cells.
        lines: the report's block of every request, in order.
        summary: the one-line summary of every request, in order.
        requests: the JSON entry of every request, in order.
        trace: per decode step of every request, the reported Tier-A meter of each
            (layer, head) cell, with its ``(request, step)`` label (an entry trace,
            :mod:`witcert_calculus.explore.entry_trace`).
    """

    row: SchemeRow
    per_layer: list[float]
    lines: tuple[str, ...]
    summary: tuple[str, ...]
    requests: tuple[Json, ...]
    trace: tuple[tuple[tuple[str, int], FloatArray], ...]


def decode_step_entries(result: RequestResult) -> list[tuple[tuple[str, int], FloatArray]]:
    """Each decode step's reported meter over every (layer, head) cell, labelled
    ``(scheme/request id, step)``: the entries a per-step gate would keep or send exact."""
    run, plen = result.run, result.reference.prompt_len
    cols: list[FloatArray] = []
    positions: npt.NDArray[np.int64] | None = None
    for layer in run.layers:
        pos = run.read(layer).positions
        sel = pos >= plen
        if positions is not None and not np.array_equal(positions, pos[sel]):
            raise InvalidValueError(f"layer {layer} positions", pos.tolist(),
                                    "must be the decode positions of every other layer")
        positions = pos[sel]
        cols.append(run.reported(layer)[0][:, sel])  # [heads, decode steps]
    cells = np.concatenate(cols, axis=0)  # [(layer, head), decode steps]
    return [((f"{result.scheme}/{result.request_id}", k), cells[:, k].copy())
            for k in range(cells.shape[1])]


def measure_scheme(model: Any, ledger: RiskLedger, scheme: str, refs: Sequence[Reference],
                   settings: DemoSettings) -> SchemeReport:
    """Replay every reference under ``scheme`` (one new request each) and tally them.

    Args:
        model: the model (eager attention).
        ledger: the ledger every request is admitted into.
        scheme: a registered scheme name.
        refs: the references, in prompt order.
        settings: the run's settings (threshold).

    Returns:
        The :class:`SchemeReport`.
    """
    tally = SchemeTally.start(scheme, layers=int(model.config.num_hidden_layers))
    lines: list[str] = []
    summary: list[str] = []
    requests: list[Json] = []
    trace: list[tuple[tuple[str, int], FloatArray]] = []
    for ref in refs:
        result = replay(model, ledger, scheme, ref, delta_req=DELTA_REQ, bands=settings.bands)
        trace += decode_step_entries(result)
        tally.add(result, threshold=settings.threshold)
        page = page_in_line(result.run, settings.threshold)
        lines += request_lines(result, threshold=settings.threshold, page_in=page)
        summary.append(summary_line(result, threshold=settings.threshold))
        requests.append(request_json(result, page_in=page))
    return SchemeReport(tally.row(head_dim=int(model.config.head_dim)), tally.per_layer(),
                        tuple(lines), tuple(summary), tuple(requests), tuple(trace))


def _write(out: Path, lines: Sequence[str], report: Json, per_layer: dict[str, list[float]],
           threshold: float, measured: Sequence[SchemeReport]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "traces").mkdir(exist_ok=True)
    for m in measured:
        write_entry_trace(out / "traces" / f"{m.row.scheme}.jsonl", [b for _, b in m.trace],
                          labels=[lab for lab, _ in m.trace], metric="AttentionTV[AtConsume]",
                          aggregate=Aggregate.MAX, saturation=1.0)
    (out / "report.txt").write_text("\n".join(lines) + "\n")
    (out / "report.json").write_text(json.dumps(report, indent=2, allow_nan=True))
    plot_coverage(per_layer, threshold, out / "coverage.png")


def run_demo(out: Path, *, schemes: tuple[str, ...] = DEMO_SCHEMES,
             prompts: tuple[str, ...] = PROMPTS, continuation: int = CONTINUATION,
             threshold: float = THRESHOLD, threads: int = 1, bands: int = BANDS,
             verbose: bool = False) -> Json:
    """Run the demo and write ``report.txt``, ``report.json``, ``coverage.png`` and one entry
    trace per scheme, ``traces/SCHEME.jsonl`` (``witcert ledger replay`` reads it), into ``out``.

    Prints what a person reads: one line per request, the measured table with the operating
    point, the wall time and where the files are; the per-request blocks (per-layer readings,
    ledger, gate, page-in) go to ``report.txt`` only, unless ``verbose``.

    Args:
        out: the output folder (created if missing).
        schemes: registered scheme names, in report order.
        prompts: the prompts, in report order.
        continuation: greedy reference tokens per prompt.
        threshold: the coverage threshold tau, in ``(0, 1)``.
        threads: torch CPU threads.
        bands: witness bands per key.
        verbose: print the whole report, the per-request blocks included.

    Returns:
        The JSON-ready report (what ``report.json`` holds).

    Raises:
        InvalidValueError: an unknown scheme or a setting out of range.

    Example:
        >>> # run_demo(Path("out/demo"), schemes=("int8_token", "dither_int8"))
    """
    settings = DemoSettings(schemes=schemes, prompts=prompts, continuation=continuation,
                            threshold=threshold, threads=threads, bands=bands)
    torch.set_num_threads(settings.threads)
    t0 = time.perf_counter()
    model, tokenizer = load_smollm2()
    header = header_lines(settings, load_s=time.perf_counter() - t0)
    refs = greedy_references(model, tokenizer, settings.prompts,
                             continuation=settings.continuation)
    ledger = RiskLedger()
    measured = [measure_scheme(model, ledger, scheme, refs, settings)
                for scheme in tqdm(settings.schemes, desc="witcert demo", unit="scheme",
                                   leave=False)]
    blocks = [ln for m in measured for ln in m.lines]
    summary = summary_lines([ln for m in measured for ln in m.summary],
                            threshold=settings.threshold)
    rows = [m.row for m in measured]
    rho = spearman([r.coverage for r in rows], [r.kl for r in rows])
    fp16_bytes = 2.0 * int(model.config.head_dim)
    table = table_lines(rows, rho=rho, settings=settings, fp16_bytes=fp16_bytes)
    wall = time.perf_counter() - t0
    lines = [*header, *blocks, *summary, *table, wall_line(wall)]
    per_layer = {m.row.scheme: m.per_layer for m in measured}
    report = report_json(settings, requests=[r for m in measured for r in m.requests],
                         rows=rows, rho=rho, per_layer=per_layer, wall_s=wall,
                         fp16_bytes=fp16_bytes)
    _write(out, lines, report, per_layer, settings.threshold, measured)
    shown = [*header, *blocks, *summary, *table] if verbose else [*header, *summary, *table]
    print("\n".join(terminal_lines(shown, wall_s=wall, out=out)))
    return report
