# pyright: reportUnknownMemberType=false, reportUnknownVariableType=false, reportUnknownArgumentType=false
"""The README demo: live WitCert meters on SmolLM2-135M-Instruct under several KV schemes.

Run ``python -m witcert_adapters.demo --out DIR``. For a fixed prompt set it

1. decodes a greedy reference continuation with the uncompressed model;
2. for every scheme, replays prompt and continuation through the compressed cache with
   teacher forcing (decode steps one token at a time), metering every (layer, head, step)
   cell, auditing each against exact attention, and running the acceptance gate;
3. measures the teacher-forced KL(uncompressed || compressed) and top-1 agreement of the
   next-token distributions at the decode steps (never free decoding: free trajectories
   diverge for reasons unrelated to compression);
4. prints a report per request (per-layer readings with tiers, the composed chain's bound
   and tier, the ledger's verdict and spend, the gate verdict, and where a page-in would go),
   for the dithered scheme also the Tier-B (probabilistic) certificates next to Tier A, the
   table over schemes with Spearman's rank correlation between coverage and KL, and writes
   ``report.txt``, ``report.json`` and ``coverage.png`` into the output folder.

For ``dither_int8`` (subtractively dithered INT8 keys) the demo also issues Tier-B
certificates: each forward call of a request is one probabilistic event admitted into the
request's :class:`~witcert_calculus.ledger.RiskLedger` (telescoping allowance
``delta_req / ((i+1)(i+2))``, split over layers, heads and rows), reported next to Tier A.
Tier A is the deterministic, adaptive-safe bound; Tier B holds except with its delta and only
for non-adaptive queries. Teacher forcing makes the demo's queries non-adaptive: a layer's
queries depend on the fixed token sequence and on other layers' dither streams only.

What the numbers mean: a certified cell's true TV never exceeds its bound (checked on every
cell, for Tier B too). High coverage is evidence of safety. Low coverage guarantees nothing either way: the
bound is a worst case over every error consistent with the witnesses, so a scheme can be
uncertified and still harmless.

Main declarations
-----------------
- :func:`run_demo`, :func:`main`, :data:`PROMPTS`, :data:`DEMO_SCHEMES`.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, final

import numpy as np

__all__ = ["DEMO_SCHEMES", "PROMPTS", "SchemeRow", "main", "run_demo", "spearman"]

PROMPTS: Final = (
    "The capital of France is",
    "def fibonacci(n):",
    "Water boils at a temperature of",
)
DEMO_SCHEMES: Final = (
    "int8_token", "dither_int8", "fp8_e4m3_scaled", "fp8_e4m3", "fp8_e5m2_scaled", "int4_g32",
    "kivi2_g32",
)
THRESHOLD: Final = 0.1
CONTINUATION: Final = 9


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


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman's rank correlation (average ranks for ties); NaN when a side is constant."""
    def ranks(v: list[float]) -> np.ndarray[Any, np.dtype[np.float64]]:
        a = np.asarray(v, dtype=np.float64)
        order = np.argsort(a, kind="stable")
        r = np.empty_like(a)
        r[order] = np.arange(a.size, dtype=np.float64)
        for val in np.unique(a):
            idx = a == val
            r[idx] = r[idx].mean()
        return r
    rx, ry = ranks(x), ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return math.nan
    return float(np.corrcoef(rx, ry)[0, 1])


def _kl_top1(ref: Any, comp: Any) -> tuple[list[float], list[bool]]:
    import torch

    lp = torch.log_softmax(ref.to(torch.float64), dim=-1)
    lq = torch.log_softmax(comp.to(torch.float64), dim=-1)
    kl = (lp.exp() * (lp - lq)).sum(dim=-1)
    agree = ref.argmax(dim=-1) == comp.argmax(dim=-1)
    return [float(v) for v in kl], [bool(v) for v in agree]


def _short(tier: str) -> str:
    return {"CERTIFIED": "cert", "SATURATED": "sat", "PARTIALLY_CERTIFIED": "part",
            "EMPIRICAL": "emp"}.get(tier, tier)


def _page_in(run: Any, threshold: float) -> str:
    from witcert_calculus.meters import block_summary, page_in_order

    best = None
    for layer in run.layers:
        p, c = run.last_p[layer], run.last_c[layer]
        rep = run.reported(layer)[..., -1]
        h = int(np.argmax(rep[0]))
        if best is None or rep[0, h] > best[0]:
            best = (float(rep[0, h]), layer, h, p[0, h], c[0, h])
    assert best is not None
    value, layer, head, p, c = best
    if value <= threshold:
        return f"no page-in needed: worst final-step cell (layer {layer}, head {head}) at {value:.4f}"
    mass, u = block_summary(p / p.sum(), c, block_size=4)
    plan = page_in_order(mass, u, threshold=threshold)
    return (f"worst final-step cell: layer {layer}, head {head}, meter {value:.4f}; paging in "
            f"{len(plan.order)} of {mass.size} blocks of 4 tokens {list(plan.order)[:8]} brings the "
            f"e-form from {plan.eform_before:.4g} to {plan.eform_after:.4g} (threshold {threshold})")


def _tier_b_line(run: Any, plen: int, threshold: float) -> str:
    a_cells = b_cells = a_hits = b_hits = tighter = 0
    for layer in run.layers:
        sel = run.positions[layer] >= plen
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


def run_demo(out: Path, *, schemes: tuple[str, ...] = DEMO_SCHEMES,
             prompts: tuple[str, ...] = PROMPTS, continuation: int = CONTINUATION,
             threshold: float = THRESHOLD, threads: int = 1) -> dict[str, Any]:
    """Run the demo and write ``report.txt``, ``report.json`` and ``coverage.png`` into ``out``.

    Returns:
        The JSON-ready report.
    """
    import torch

    from witcert_adapters.gate import run_gate
    from witcert_adapters.hf import attach
    from witcert_adapters.models import load_smollm2
    from witcert_adapters.readings import admit_readings, coverage, dense_chain, layer_readings
    from witcert_calculus.ledger import RiskLedger

    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    model, tok = load_smollm2()
    load_s = time.perf_counter() - t0
    lines: list[str] = []
    say = lines.append
    say("WitCert live meters on SmolLM2-135M-Instruct (30 layers, 9 query heads, 3 kv heads)")
    say(f"threshold for coverage: meter <= {threshold}; {continuation - 1} teacher-forced decode "
        f"steps per prompt; model load {load_s:.1f} s")
    say("")
    refs: list[tuple[Any, Any, int]] = []
    with torch.no_grad():
        for prompt in prompts:
            ids = tok(prompt, return_tensors="pt").input_ids
            seq = ids
            for _ in range(continuation):
                nxt = model(seq).logits[:, -1:].argmax(-1)
                seq = torch.cat([seq, nxt], dim=-1)
            ref_logits = model(seq).logits[0]
            refs.append((seq, ref_logits, ids.shape[1]))
    requests: list[dict[str, Any]] = []
    report: dict[str, Any] = {"model": "SmolLM2-135M-Instruct.Q4_1 (dequantised)",
                              "threshold": threshold, "prompts": list(prompts),
                              "requests": requests}
    ledger = RiskLedger()
    rows: list[SchemeRow] = []
    per_layer_cov: dict[str, list[float]] = {}
    for scheme in schemes:
        kls: list[float] = []
        agrees: list[bool] = []
        hits = np.zeros(model.config.num_hidden_layers)
        tots = np.zeros(model.config.num_hidden_layers)
        max_tv = 0.0
        violations = 0
        b_hits = 0
        b_tots = 0
        b_viol = 0
        b_dloc = 0.0
        b_spent: list[str] = []
        verdicts: list[str] = []
        for (seq, ref_logits, plen), prompt in zip(refs, prompts, strict=True):
            request_id = ledger.open_request(delta_req="1/100")
            with attach(model, scheme=scheme, request_id=request_id, audit=True,
                        ledger=ledger) as probe:
                cache = probe.new_cache()
                with torch.no_grad():
                    model(seq[:, :plen], cache=cache, use_cache=True)
                    steps = []
                    for t in range(plen, seq.shape[1] - 1):
                        steps.append(model(seq[:, t:t + 1], cache=cache, use_cache=True).logits[0, -1])
                run = probe.result()
            comp = torch.stack(steps)
            kl, ag = _kl_top1(ref_logits[plen:seq.shape[1] - 1], comp)
            kls += kl
            agrees += ag
            verdict = run_gate(run, tokens=seq.shape[1] - 1)
            verdicts.append("accepted" if verdict.accepted else f"rejected at {verdict.failed_stage}")
            for layer in run.layers:
                sel = run.positions[layer] >= plen
                rep = run.reported(layer)[..., sel]
                hits[layer] += (rep <= threshold).sum()
                tots[layer] += rep.size
                tv = run.true_tv[layer]
                max_tv = max(max_tv, float(tv.max()))
                violations += int((tv > run.reported(layer)).sum())
                if layer in run.tier_b:
                    rep_b = run.reported_tier_b(layer)
                    b_hits += int((rep_b[..., sel] <= threshold).sum())
                    b_tots += int(rep_b[..., sel].size)
                    b_viol += int((tv > rep_b).sum())
                    b_dloc = max(b_dloc, float(run.tier_b_delta_loc[layer].max()))
            chains = {layer: dense_chain(witness_max=run.witness_full_max[layer],
                                         q_norm_max=run.q_norm_max[layer],
                                         scale=float(model.config.head_dim) ** -0.5)
                      for layer in run.layers}
            readings = layer_readings(run, chains=chains)
            say(f"request {request_id}: scheme {scheme}, prompt {prompt!r}")
            text = tok.decode(seq[0, plen:])
            say(f"  teacher continuation: {text!r}")
            say(f"  meter coverage (decode steps): {coverage(run, threshold=threshold, min_position=plen):.3f}; "
                f"mean KL {np.mean(kl):.5f} nats; top-1 agreement {np.mean(ag):.3f}")
            say("  per layer: worst-cell meter [tier] (head, position) | coarse chain bound [tier]")
            req_layers: list[dict[str, Any]] = []
            cells_txt: list[str] = []
            for lr in readings:
                assert lr.chain_reading is not None
                cells_txt.append(f"L{lr.layer:<2d} {lr.meter.value:6.4f} [{_short(lr.meter.tier.name):<4}] "
                                 f"(h{lr.cell[1]},p{lr.cell[2]:<2d}) | {lr.chain_reading.value:6.4f} "
                                 f"[{_short(lr.chain_reading.tier.name):<4}]")
                req_layers.append({"layer": lr.layer, "meter_raw": lr.meter.raw,
                                   "meter": lr.meter.value, "tier": lr.meter.tier.name,
                                   "cell": list(lr.cell), "chain_bound": lr.chain_reading.value,
                                   "chain_tier": lr.chain_reading.tier.name})
            for i in range(0, len(cells_txt), 3):
                say("    " + "   ".join(cells_txt[i:i + 3]))
            if run.tier_b_events:
                say(_tier_b_line(run, plen, threshold))
            lv = admit_readings(ledger, request_id, readings)
            if run.tier_b_events:
                b_spent.append(str(lv.spent))
            say(f"  ledger: verdict {lv.tier.name}, spent {lv.spent} of {lv.delta_req} "
                f"({lv.counts.deterministic} deterministic Tier-A admissions at delta 0, "
                f"{lv.counts.probabilistic} probabilistic Tier-B admissions, "
                f"{lv.counts.saturated} saturated)")
            ledger.close_request(request_id)
            say(f"  gate: {verdict}")
            page = _page_in(run, threshold)
            say(f"  page-in: {page}")
            say("")
            requests.append({"request": request_id, "scheme": scheme, "prompt": prompt,
                                       "layers": req_layers, "gate": str(verdict),
                                       "accepted": verdict.accepted, "page_in": page,
                                       "kl": float(np.mean(kl)), "top1": float(np.mean(ag)),
                                       "ledger_tier": lv.tier.name,
                                       "ledger_spent": str(lv.spent)})
        cov = float(hits.sum() / tots.sum())
        per_layer_cov[scheme] = (hits / tots).tolist()
        gate = "accepted" if all(v == "accepted" for v in verdicts) else "; ".join(sorted(set(verdicts)))
        rows.append(SchemeRow(scheme, cov, float(np.mean(kls)), float(np.mean(agrees)), max_tv,
                              violations, gate,
                              tier_b_coverage=b_hits / b_tots if b_tots else None,
                              tier_b_violations=b_viol if b_tots else None,
                              tier_b_delta_loc=b_dloc if b_tots else None,
                              tier_b_spent=", ".join(sorted(set(b_spent))) if b_tots else None))
    rho = spearman([r.coverage for r in rows], [r.kl for r in rows])
    say(f"Measured table ({len(prompts)} prompts x {continuation - 1} teacher-forced decode steps, "
        f"coverage threshold {threshold}):")
    say("  scheme            coverage  KL(nats)    top-1   max true TV  violations  gate")
    for r in rows:
        say(f"  {r.scheme:16s}  {r.coverage:8.3f}  {r.kl:9.5f}  {r.top1:6.3f}  {r.max_true_tv:11.4g}  "
            f"{r.violations:10d}  {r.gate}")
    for r in rows:
        if r.tier_b_coverage is not None:
            say(f"  {r.scheme + ' [B]':16s}  {r.tier_b_coverage:8.3f}  (Tier B: probabilistic, "
                f"non-adaptive scope; delta_loc <= {r.tier_b_delta_loc:.3g} per cell, ledger spend "
                f"{r.tier_b_spent} of 1/100 per request)  violations {r.tier_b_violations}")
    say("  (rows without [B] are Tier A, the adaptive-safe deterministic bound; a [B] row gives "
        "the same scheme's coverage under its Tier-B probabilistic certificate)")
    say(f"Spearman rank correlation between coverage (Tier A) and KL: {rho:.3f}")
    say("High coverage is evidence of safety; low coverage guarantees nothing either way.")
    wall = time.perf_counter() - t0
    say(f"wall time {wall:.1f} s")
    report["table"] = [r.__repr__() for r in rows]
    report["rows"] = [{"scheme": r.scheme, "coverage": r.coverage, "kl": r.kl, "top1": r.top1,
                       "max_true_tv": r.max_true_tv, "violations": r.violations, "gate": r.gate,
                       "tier_b_coverage": r.tier_b_coverage,
                       "tier_b_violations": r.tier_b_violations,
                       "tier_b_delta_loc": r.tier_b_delta_loc, "tier_b_spent": r.tier_b_spent}
                      for r in rows]
    report["spearman_coverage_kl"] = rho
    report["per_layer_coverage"] = per_layer_cov
    report["wall_s"] = wall
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.txt").write_text("\n".join(lines) + "\n")
    (out / "report.json").write_text(json.dumps(report, indent=2, allow_nan=True))
    _plot(per_layer_cov, threshold, out / "coverage.png")
    print("\n".join(lines))
    return report


def _plot(per_layer: dict[str, list[float]], threshold: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pyright: ignore[reportUnknownMemberType]

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for scheme, cov in per_layer.items():
        ax.plot(range(len(cov)), cov, marker="o", ms=3,  # pyright: ignore[reportUnknownMemberType]
                label=scheme)
    ax.set_xlabel("layer")
    ax.set_ylabel(f"fraction of (head, step) cells with meter <= {threshold}")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("WitCert meter coverage per layer, SmolLM2-135M")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m witcert_adapters.demo --out DIR``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=Path("out/demo"),
                        help="folder for report.txt, report.json and coverage.png")
    parser.add_argument("--schemes", nargs="*", default=list(DEMO_SCHEMES),
                        help="registered scheme names (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args(argv)
    run_demo(args.out, schemes=tuple(args.schemes), threads=args.threads)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
