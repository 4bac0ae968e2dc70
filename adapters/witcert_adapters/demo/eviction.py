"""The eviction certificate on SmolLM2 under kvpress presses: coverage, audited truth, quality.

``python -m witcert_adapters.demo --eviction --out DIR`` runs every item of a long-context
retrieval battery (:func:`~witcert_adapters.demo.repair.retrieval_battery`, about 1,040 prompt
tokens per item, three needles) three ways per press and compression ratio, teacher-forced along
the fixed answer (:func:`~witcert_adapters.eviction.forced_logits`): the full cache, the raw
press and the gated press (the gate restores evicted blocks from the exact backing store until
every (layer, head, row) cell's bound is at most ``tau``). Both pressed runs are audited: the
true ``TV = p(D)`` of every cell is computed from the exact dropped keys.

Per press and ratio the report gives: coverage at ``tau`` (cells whose bound is at most
``tau``) raw and gated, the largest bound and the largest true TV, violations (cells whose
truth exceeds the bound: 0 by the theorem), witness bytes per evicted (layer, key head) entry,
the quality of the raw and gated runs (mean teacher-forced KL against the full cache, top-1
agreement, retrieval accuracy) and the share of evicted entries the gate restored. Every
request's worst cell is admitted into a :class:`~witcert_calculus.ledger.RiskLedger` as an
``AttentionTV`` reading (deterministic: it spends no failure probability).

A second table measures the witness choice on one press (bytes per evicted entry against
coverage): blocks of 1, 4 and 16 tokens with an int8 or float16 center.

The full run takes about 12 minutes on one CPU thread.

Main declarations
-----------------
- :func:`run_eviction`: the whole measurement; writes ``eviction.json`` and ``eviction.txt``.
- :data:`PRESSES`, :data:`RATIOS`: what it runs by default.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import torch

from witcert_adapters.demo.measure import kl_top1
from witcert_adapters.demo.models import load_smollm2
from witcert_adapters.demo.repair import retrieval_battery
from witcert_adapters.demo.report import Json
from witcert_adapters.demo.settings import MODEL_NAME
from witcert_adapters.eviction import EvictionSummary, PressRun, forced_logits, meter_press
from witcert_calculus.errors import InvalidValueError
from witcert_calculus.ledger import RiskLedger
from witcert_calculus.numerics.validation import positive_int, real

__all__ = ["PRESSES", "RATIOS", "run_eviction"]

#: The kvpress presses the demo meters (prefill presses; the decoding press is tested).
PRESSES: Final = ("SnapKVPress", "StreamingLLMPress", "KnormPress", "ExpectedAttentionPress",
                  "TOVAPress")
#: The compression ratios (share of the prompt's entries each press drops).
RATIOS: Final = (0.25, 0.5)
#: The witness choices measured on one press: (block size, center).
WITNESSES: Final = ((1, "int8"), (1, "float16"), (4, "int8"), (16, "float16"))

_ITEMS: Final = 4
_FACTS: Final = 3
_FILLER: Final = 38
_DELTA_REQ: Final = 1e-3


def _encode(tok: Any, prompt: str, continuation: str) -> tuple[torch.Tensor, int, int]:
    # the prompt's ids, then the continuation's; the answer's length (the space and the digits)
    p: list[int] = tok(prompt).input_ids
    full: list[int] = tok(prompt + continuation).input_ids
    if full[:len(p)] != p:
        raise InvalidValueError("continuation", continuation,
                                "must tokenize as a suffix of the prompt's tokens")
    return torch.tensor([full]), len(p), len(full) - len(p) - 1


def _quality(ref: list[torch.Tensor], runs: list[torch.Tensor], ids: list[torch.Tensor],
             plens: list[int], answers: list[int]) -> Json:
    kls: list[float] = []
    agree: list[bool] = []
    hits = 0
    for r, c, x, p, a in zip(ref, runs, ids, plens, answers, strict=True):
        kl, top1 = kl_top1(r, c)
        kls += kl
        agree += top1
        hits += bool((c.argmax(dim=-1)[:a] == x[0, p:p + a]).all())
    return {"kl": sum(kls) / len(kls), "top1": sum(agree) / len(agree),
            "retrieval": hits / len(runs)}


def _merge(parts: Sequence[EvictionSummary], tau: float) -> dict[str, Json]:
    cells = sum(p.cells for p in parts)
    evicted = sum(p.evicted_tokens for p in parts)
    return {
        "cells": cells,
        "coverage": sum(p.coverage * p.cells for p in parts) / cells if cells else 0.0,
        "max_bound": max(p.max_bound for p in parts),
        "max_true_tv": max(p.max_true_tv or 0.0 for p in parts),
        "violations": sum(p.violations or 0 for p in parts),
        "evicted_entries": evicted,
        "witness_bytes_per_entry": sum(p.witness_bytes for p in parts) / evicted if evicted else 0.0,
        "restored_entries": sum(p.restored_tokens for p in parts),
        "restored_bytes": sum(p.restored_bytes for p in parts),
        "restored_fraction": sum(p.restored_tokens for p in parts) / evicted if evicted else 0.0,
        "threshold": tau}


def _press(name: str, ratio: float) -> Any:
    import kvpress

    return getattr(kvpress, name)(compression_ratio=ratio)


def _runs(model: Any, name: str, ratio: float, ids: list[torch.Tensor], plens: list[int], *,
          threshold: float | None, tau: float, ledger: RiskLedger, verdicts: list[str],
          **witness: Any) -> tuple[list[torch.Tensor], dict[str, Json]]:
    logits: list[torch.Tensor] = []
    parts: list[EvictionSummary] = []
    for x, p in zip(ids, plens, strict=True):
        run: PressRun
        with meter_press(model, _press(name, ratio), audit=True, threshold=threshold,
                         **witness) as run:
            logits.append(forced_logits(model, x, p))
        parts.append(run.summary(threshold=tau))
        request = ledger.open_request(delta_req=_DELTA_REQ)
        ledger.admit(request, run.tv_reading())
        verdicts.append(ledger.close_request(request).tier.name)
    return logits, _merge(parts, tau)


def run_eviction(out: Path, *, presses: Sequence[str] = PRESSES,
                 ratios: Sequence[float] = RATIOS, threshold: float = 0.1,
                 items: int = _ITEMS, facts: int = _FACTS, filler: int = _FILLER,
                 witnesses: Sequence[tuple[int, str]] = WITNESSES, threads: int = 1) -> Json:
    """Measure the eviction certificate per press and ratio on SmolLM2; write the reports.

    Args:
        out: the output folder (created if missing).
        presses: kvpress press class names.
        ratios: compression ratios in ``(0, 1)``.
        threshold: ``tau``, the coverage target and the gate's threshold, in ``(0, 1)``.
        items, facts, filler: the battery's size (see
            :func:`~witcert_adapters.demo.repair.retrieval_battery`).
        witnesses: the witness choices measured on the first press at the last ratio.
        threads: torch CPU threads.

    Returns:
        The JSON object written to ``out/eviction.json``; ``out/eviction.txt`` holds the same
        as text (:func:`render`).

    Raises:
        InvalidValueError: no press, an unknown press, or a ratio or threshold out of range.

    Example:
        >>> # run_eviction(Path("out/eviction"), presses=("KnormPress",), ratios=(0.5,))
    """
    import kvpress

    if not presses:
        raise InvalidValueError("presses", presses, "must name at least one press")
    for name in presses:
        if not isinstance(getattr(kvpress, name, None), type):
            raise InvalidValueError("presses", name, "is not a kvpress press")
    rs = [real("ratios", r, lo=0.0, hi=1.0, lo_open=True, hi_open=True) for r in ratios]
    tau = real("threshold", threshold, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    torch.set_num_threads(positive_int("threads", threads))
    began = time.perf_counter()
    model, tok = load_smollm2()
    battery = retrieval_battery(items=items, facts=facts, filler=filler)
    encoded = [_encode(tok, item.prompt, item.continuation) for item in battery]
    ids = [e[0] for e in encoded]
    plens = [e[1] for e in encoded]
    answers = [e[2] for e in encoded]
    full = [forced_logits(model, x, p) for x, p in zip(ids, plens, strict=True)]
    ledger = RiskLedger()
    verdicts: list[str] = []
    rows: list[Json] = []
    for name in presses:
        for ratio in rs:
            raw, raw_stats = _runs(model, name, ratio, ids, plens, threshold=None, tau=tau,
                                   ledger=ledger, verdicts=verdicts)
            gated, gated_stats = _runs(model, name, ratio, ids, plens, threshold=tau, tau=tau,
                                       ledger=ledger, verdicts=verdicts)
            rows.append({"press": name, "ratio": ratio, "raw": raw_stats, "gated": gated_stats,
                         "quality_raw": _quality(full, raw, ids, plens, answers),
                         "quality_gated": _quality(full, gated, ids, plens, answers)})
    choice: list[Json] = []
    for block_size, center in witnesses:
        _, stats = _runs(model, presses[0], rs[-1], ids, plens, threshold=None, tau=tau,
                         ledger=ledger, verdicts=verdicts, block_size=block_size,
                         center=center)
        choice.append({"block_size": block_size, "center": center, **stats})
    report: Json = {
        "model": MODEL_NAME, "threshold": tau,
        "battery": {"items": len(battery), "facts_per_item": facts,
                    "prompt_tokens": [min(plens), max(plens)],
                    "steps": sum(int(f.shape[0]) for f in full)},
        "quality_full": _quality(full, full, ids, plens, answers),
        "presses": rows, "witness_choice": {"press": presses[0], "ratio": rs[-1], "rows": choice},
        "ledger": {"requests": len(verdicts),
                   "verdicts": {t: verdicts.count(t) for t in sorted(set(verdicts))},
                   "spent": float(sum(ledger.spent(r) for r in ledger.request_ids()))},
        "wall_s": round(time.perf_counter() - began, 1)}
    out.mkdir(parents=True, exist_ok=True)
    (out / "eviction.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "eviction.txt").write_text(render(report))
    return report


def render(report: Any) -> str:
    """The report as the text the demo prints and the README shows."""
    b = report["battery"]
    q = report["quality_full"]
    lines = [
        f"Eviction certificate on {report['model']}: {b['items']} retrieval items of "
        f"{b['prompt_tokens'][0]}-{b['prompt_tokens'][1]} prompt tokens, "
        f"{b['steps']} teacher-forced steps each run; tau = {report['threshold']}",
        f"full cache: retrieval {q['retrieval']:.2f}",
        "",
        f"{'press':<24}{'ratio':>6}{'cov raw':>9}{'cov gated':>10}{'max bound':>11}"
        f"{'max TV':>9}{'viol':>6}{'B/entry':>9}{'KL raw':>9}{'KL gated':>10}{'ret raw':>9}"
        f"{'ret gated':>10}{'restored':>10}",
    ]
    for r in report["presses"]:
        raw, gated = r["raw"], r["gated"]
        lines.append(
            f"{r['press']:<24}{r['ratio']:>6.2f}{raw['coverage']:>9.3f}{gated['coverage']:>10.3f}"
            f"{raw['max_bound']:>11.3f}{raw['max_true_tv']:>9.3f}"
            f"{raw['violations'] + gated['violations']:>6d}{raw['witness_bytes_per_entry']:>9.1f}"
            f"{r['quality_raw']['kl']:>9.4f}{r['quality_gated']['kl']:>10.4f}"
            f"{r['quality_raw']['retrieval']:>9.2f}{r['quality_gated']['retrieval']:>10.2f}"
            f"{gated['restored_fraction']:>10.3f}")
    w = report["witness_choice"]
    lines += ["", f"witness choice ({w['press']}, ratio {w['ratio']}): bytes per evicted entry "
              "against coverage at tau",
              f"{'block':>6}{'center':>9}{'B/entry':>9}{'coverage':>10}{'max bound':>11}"
              f"{'max TV':>9}{'viol':>6}"]
    for c in w["rows"]:
        lines.append(f"{c['block_size']:>6d}{c['center']:>9}{c['witness_bytes_per_entry']:>9.1f}"
                     f"{c['coverage']:>10.3f}{c['max_bound']:>11.3f}{c['max_true_tv']:>9.3f}"
                     f"{c['violations']:>6d}")
    led = report["ledger"]
    tiers = ", ".join(f"{n} {t}" for t, n in led["verdicts"].items())
    lines += ["", f"ledger: {led['requests']} requests, one AttentionTV reading each (verdicts: "
              f"{tiers}); failure probability spent {led['spent']:g} (deterministic bounds)"]
    return "\n".join(lines) + "\n"
