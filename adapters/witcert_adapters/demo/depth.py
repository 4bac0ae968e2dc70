"""Through depth on SmolLM2: the inter-layer bound against audited truth, and the shadow audit.

``python -m witcert_adapters.demo --depth --out DIR`` measures two things.

1. **Non-vacuity of the certified inter-layer bound** (:mod:`witcert_calculus.meters.depth`, composed
   by :func:`witcert_adapters.depth.depth_step`): per scheme and depth window (the last ``W``
   layers read the compressed memory, the others the exact one), over fixed prompts, the
   composed next-token TV bound, its tier, the audited true TV, and where the looseness comes
   from: the layer's own meter against its true attention-output error, the bound of the
   residual distance after the window's first layer against its truth, and what the head's
   contract alone gives at the *true* final residual distance.
2. **The shadow audit** (:mod:`witcert_adapters.shadow`): requests served greedily through the
   compressed memory; a sample decided before serving is replayed exactly; the rate of
   requests whose largest step TV exceeds the threshold gets an anytime-valid upper confidence
   bound (:class:`~witcert_calculus.accounting.rate.RateBound`, PARTIALLY_CERTIFIED under the
   uniform-sample assumption). Per request: the depth bound at the first compressed step
   (the whole model as the window) beside its truth, and the audited end-to-end distance.
3. **The shadow audit through vLLM** (:func:`~witcert_adapters.shadow.vllm_shadow_audit`, when
   the engine's environment exists and the CPU serves an fp8 cache): requests served by the
   engine with the plugin on its fp8 cache, the sample replayed on its exact cache.
4. **An EMPIRICAL amplification bridge**, kept apart from every certified chain: on the first
   half of the audited requests, the largest ratio of the true first-step next-token TV to the
   sum of the layers' own meter bounds
   (:func:`~witcert_calculus.bridges.empirical_ratio_bridge`, ``AttentionOutputL2 ->
   NextTokenTV``); on the second half, how often that ratio times the meters' sum covered the
   truth.

Main declarations
-----------------
- :func:`run_depth`: the whole measurement; writes ``depth.json`` and ``depth.txt``.
- :data:`DEPTH_SCHEMES`, :data:`WINDOWS`: what it runs by default.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import torch

from witcert_adapters.demo.models import load_smollm2
from witcert_adapters.demo.report import Json
from witcert_adapters.demo.settings import MODEL_NAME, OPERATING_POINT
from witcert_adapters.depth import DepthStep, depth_step, model_norms
from witcert_adapters.shadow import (
    RequestAudit,
    ShadowAudit,
    ShadowSampler,
    request_prompts,
    shadow_audit,
    vllm_shadow_audit,
)
from witcert_calculus.bridges import empirical_ratio_bridge
from witcert_calculus.errors import InvalidValueError
from witcert_calculus.metrics import AtConsume, AttentionOutputL2, NextTokenTV
from witcert_calculus.numerics.validation import positive_int, real

__all__ = ["DEPTH_SCHEMES", "SHADOW_SCHEMES", "WINDOWS", "run_depth"]

#: Schemes of the non-vacuity table: fp8 as served, the certified operating point, and int4.
DEPTH_SCHEMES: Final = ("fp8_e4m3_scaled", OPERATING_POINT, "int4_g32")
#: Depth windows: the last ``W`` layers read the compressed memory.
WINDOWS: Final = (1, 2, 4, 8, 16, 30)
#: Schemes of the shadow audit: fp8 as served, and int4 as a stress.
SHADOW_SCHEMES: Final = ("fp8_e4m3_scaled", "int4_g32")
#: Requests listed one per line in the text report (all of them are in the JSON).
_SHOWN: Final = 6


def _window_rows(model: Any, tok: Any, norms: Any, schemes: Sequence[str],
                 windows: Sequence[int], cases: int) -> list[dict[str, Any]]:
    layers = int(model.config.num_hidden_layers)
    prompts = request_prompts(cases)
    rows: list[dict[str, Any]] = []
    for scheme in schemes:
        for w in windows:
            steps: list[DepthStep] = []
            for p in prompts:
                ids = tok(p, return_tensors="pt").input_ids
                steps.append(depth_step(model, ids, scheme=scheme, window=range(layers - w, layers),
                                        norms=norms))
            rows.append({
                "scheme": scheme, "window": w, "cases": len(steps),
                "bound_median": statistics.median(s.tv_bound for s in steps),
                "nonvacuous": sum(s.tv_bound < 1.0 for s in steps),
                "tiers": sorted({s.reading.tier.name for s in steps}),
                "violations": sum(s.tv_truth > s.tv_bound for s in steps),
                "layer_violations": sum(t > b for s in steps for b, t in zip(s.bound, s.truth)),
                "truth_max": max(s.tv_truth for s in steps),
                "truth_median": statistics.median(s.tv_truth for s in steps),
                "local_slack": statistics.median(b / t for s in steps
                                                 for b, t in zip(s.local, s.local_truth) if t > 0),
                "first_layer_slack": statistics.median(s.bound[0] / s.truth[0] for s in steps
                                                       if s.truth[0] > 0),
                "head_at_truth": statistics.median(
                    float(torch.tanh(torch.tensor(s.head_slope * s.truth[-1]))) for s in steps),
            })
    return rows


def _request_row(r: RequestAudit) -> dict[str, Any]:
    row: dict[str, Any] = {"id": r.request_id, "sampled": r.sampled}
    if r.depth is not None:
        d = r.depth
        row.update(max_tv=r.max_tv, layer_max=max(d.local), layer_sum=sum(d.local),
                   window=[d.first, d.first + len(d.bound) - 1], bound=d.tv_bound,
                   tier=d.reading.tier.name, truth=d.tv_truth)
    return row


def _shadow_rows(audit: ShadowAudit) -> dict[str, Any]:
    audited = audit.audited
    steps = [r.depth for r in audited if r.depth is not None]
    half = len(steps) // 2
    calib, held = steps[:half], steps[half:]
    ratio = max(s.tv_truth / sum(s.local) for s in calib)
    bridge = empirical_ratio_bridge(AttentionOutputL2[AtConsume], NextTokenTV[AtConsume],
                                    ratio=ratio, samples=len(calib), statistic="max",
                                    set_type="first half of the audited requests")
    covered = sum(bridge.bound(sum(s.local)).value >= s.tv_truth for s in held)
    return {
        "scheme": audit.scheme, "requests": len(audit.requests), "audited": len(audited),
        "threshold": audit.threshold, "alpha": audit.alpha,
        "exceeded": audit.rate.events, "rate_upper": audit.rate.upper, "tier": audit.tier.name,
        "max_tv_median": statistics.median(r.max_tv for r in audited),
        "max_tv_max": max(r.max_tv for r in audited),
        "kl_mean": statistics.fmean(statistics.fmean(r.kl) for r in audited),
        "depth_bound_median": statistics.median(s.tv_bound for s in steps),
        "depth_tiers": sorted({s.reading.tier.name for s in steps}),
        "depth_truth_median": statistics.median(s.tv_truth for s in steps),
        "depth_violations": sum(s.tv_truth > s.tv_bound for s in steps),
        "empirical_ratio": ratio, "empirical_tier": bridge.tier.name,
        "empirical_covered": covered, "empirical_held_out": len(held),
        "requests_detail": [_request_row(r) for r in audit.requests],
    }


def _vllm_row(audit: ShadowAudit) -> dict[str, Any]:
    audited = audit.audited
    return {
        "scheme": audit.scheme, "requests": len(audit.requests), "audited": len(audited),
        "threshold": audit.threshold, "alpha": audit.alpha, "exceeded": audit.rate.events,
        "rate_upper": audit.rate.upper, "tier": audit.tier.name,
        "retokenized": audit.retokenized,
        "max_tv_median": statistics.median(r.max_tv for r in audited),
        "max_tv_max": max(r.max_tv for r in audited),
        "kl_mean": statistics.fmean(statistics.fmean(r.kl) for r in audited)}


def _text(report: dict[str, Any]) -> str:
    lines = [f"depth: {report['model']}, {report['layers']} layers; "
             f"{report['cases']} prompts per row, the next token after each prompt",
             "",
             "certified inter-layer bound (the last W layers read the compressed memory):",
             f"{'scheme':>20} {'W':>3} {'TV bound':>9} {'tier':>10} {'<1':>4} {'viol':>5} "
             f"{'true TV':>9} {'meter/true':>10} {'layer1 b/t':>11} {'head@truth':>10}"]
    for r in report["windows"]:
        lines.append(
            f"{r['scheme']:>20} {r['window']:>3} {r['bound_median']:>9.3g} "
            f"{'/'.join(t[:4] for t in r['tiers']):>10} {r['nonvacuous']:>4} "
            f"{r['violations'] + r['layer_violations']:>5} {r['truth_median']:>9.2g} "
            f"{r['local_slack']:>10.3g} {r['first_layer_slack']:>11.3g} {r['head_at_truth']:>10.3g}")
    lines += ["", "shadow audit (requests served through the compressed memory, a sample "
              "replayed exactly; rate of requests whose largest step TV exceeds the threshold):"]
    for s in report["shadow"]:
        lines.append(
            f"{s['scheme']}: {s['requests']} requests, {s['audited']} audited; "
            f"{s['exceeded']} exceeded TV {s['threshold']}; rate <= {s['rate_upper']:.3f} "
            f"at confidence {1 - s['alpha']:.2f}, anytime-valid [{s['tier']}]; largest step TV "
            f"median {s['max_tv_median']:.3g}, max {s['max_tv_max']:.3g}; mean step KL "
            f"{s['kl_mean']:.2g}")
        lines.append(
            f"  depth bound at the first compressed step (all layers): median "
            f"{s['depth_bound_median']:.3g} [{'/'.join(s['depth_tiers'])}] against a true "
            f"{s['depth_truth_median']:.2g}, {s['depth_violations']} violations; EMPIRICAL "
            f"amplification (true TV / sum of the layers' meter bounds) {s['empirical_ratio']:.3g},"
            f" fitted on {s['audited'] // 2}, covered {s['empirical_covered']} of "
            f"{s['empirical_held_out']} held out")
        for r in s["requests_detail"][:_SHOWN]:
            if not r["sampled"]:
                lines.append(f"  request {r['id']:>3}: served, not sampled")
                continue
            lines.append(
                f"  request {r['id']:>3}: layer meters max {r['layer_max']:.3g} (sum "
                f"{r['layer_sum']:.3g}); layers {r['window'][0]}-{r['window'][1]}: next-token "
                f"TV <= {r['bound']:.3g} [{r['tier']}], true {r['truth']:.2g}; end-to-end "
                f"largest step TV {r['max_tv']:.3g}")
    for v in report.get("vllm", []):
        lines.append(
            f"{v['scheme']} (vLLM with the plugin, replayed on its exact cache): "
            f"{v['requests']} requests, {v['audited']} audited; {v['exceeded']} exceeded TV "
            f"{v['threshold']}; rate <= {v['rate_upper']:.3f} at confidence "
            f"{1 - v['alpha']:.2f}, anytime-valid [{v['tier']}]; largest step TV median "
            f"{v['max_tv_median']:.3g}, max {v['max_tv_max']:.3g}; mean step KL "
            f"{v['kl_mean']:.2g}; retokenized {v['retokenized']}")
    return "\n".join(lines) + "\n"


def _vllm_here() -> bool:
    # vLLM's environment exists and serves an fp8 cache on this CPU
    from witcert_adapters.vllm_plugin.launch import engine_python, fp8_supported

    try:
        engine_python()
    except InvalidValueError:
        return False
    return fp8_supported()


def run_depth(out: Path, *, threads: int = 1, cases: int = 8, requests: int = 216,
              rate: float = 0.95, new_tokens: int = 8, threshold: float = 0.05,
              alpha: float = 0.05, schemes: Sequence[str] = DEPTH_SCHEMES,
              windows: Sequence[int] = WINDOWS,
              shadow_schemes: Sequence[str] = SHADOW_SCHEMES,
              vllm_requests: int = 48) -> dict[str, Any]:
    """Run the depth measurement; write ``depth.json`` and ``depth.txt`` under ``out``.

    Raises:
        InvalidValueError: on a bad count, rate, threshold or level.
    """
    torch.set_num_threads(positive_int("threads", threads))
    positive_int("cases", cases)
    real("threshold", threshold, lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    start = time.perf_counter()
    model, tok = load_smollm2()
    norms = model_norms(model)
    report: dict[str, Any] = {"model": MODEL_NAME, "layers": int(model.config.num_hidden_layers),
                              "cases": cases}
    report["windows"] = _window_rows(model, tok, norms, schemes, windows, cases)
    sampler = ShadowSampler(rate=rate, seed=20261207)
    report["shadow"] = [
        _shadow_rows(shadow_audit(model, tok, request_prompts(requests), scheme=s,
                                  sampler=sampler, threshold=threshold, alpha=alpha,
                                  new_tokens=new_tokens, norms=norms))
        for s in shadow_schemes]
    report["vllm"] = [] if vllm_requests == 0 or not _vllm_here() else [_vllm_row(
        vllm_shadow_audit(request_prompts(vllm_requests), sampler=ShadowSampler(
            rate=0.75, seed=20261207), threshold=threshold, alpha=alpha,
            new_tokens=new_tokens, work_dir=out / "vllm"))]
    report["wall_s"] = round(time.perf_counter() - start, 1)
    out.mkdir(parents=True, exist_ok=True)
    data: Json = report
    (out / "depth.json").write_text(json.dumps(data, indent=1) + "\n")
    (out / "depth.txt").write_text(_text(report))
    return report
