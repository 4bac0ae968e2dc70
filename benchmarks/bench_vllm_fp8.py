"""vLLM's own fp8 KV cache, metered and repaired: coverage per witness, and what repair restores.

Two measurements, each engine one process of vLLM's CPU build serving SmolLM2-135M-Instruct
through the plugin (``run_offline``):

``coverage``: the share of (layer, head, query row) cells certified at ``tau`` = 0.1 and 0.2
on an fp8 (e4m3) cache, audited (every cell's true TV measured; violations must be 0), for
4, 8, 16 and 32 band witnesses with and without the format witness each stored byte carries,
and for the format witness alone; with the witness bytes stored per token per kv head (a
band witness is one float32). The requests: the live demo's battery and a long story,
16 greedy tokens each.

``repair``: the built-in retrieval battery (key-value needles among filler; the answer
scored teacher-forced, one request per continuation token with its full next-token
distribution, prefix caching on) at growing contexts, served by the engine alone in bf16
(the reference) and fp8, and, at the contexts ``--repair-fillers`` names, fp8 metered and fp8
with the gate that repairs at each threshold (``repair=1``: each request's last row gated), and
with ``--every-row`` also with every row gated at the first threshold (``repair=all``). Every
prefill row is metered in float64, far more work than the engine's own attention, so long
contexts take long; gating every row of a 1k-token prefill takes minutes per step. Per
context: retrieval accuracy, teacher-forced ``KL(bf16 || run)`` and top-1 agreement, the
page-in fraction and bytes, the repaired cells, and wall time per scored token.

Run: ``.venv/bin/python benchmarks/bench_vllm_fp8.py coverage`` or ``... repair
[--fillers 30,60,100] [--repair-fillers 30] [--facts 4] [--items 8] [--taus 0.1]
[--every-row]``; ``--json FILE`` also writes the numbers.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from witcert_adapters.demo.models import smollm2_engine_dir
from witcert_adapters.demo.repair import retrieval_battery
from witcert_adapters.vllm_demo import BATTERY
from witcert_adapters.vllm_plugin.config import PluginConfig
from witcert_adapters.vllm_plugin.launch import run_offline

STORY = "Here is a long story. " + "The river ran past the old mill and the miller sang. " * 16
WITNESSES = [(b, f) for b in (4, 8, 16, 32) for f in (False, True)] + [(0, True)]


def coverage(args: argparse.Namespace) -> dict[str, Any]:
    model = smollm2_engine_dir()
    prompts = [p for _, p in BATTERY] + [STORY]
    rows: list[dict[str, Any]] = []
    trivial = 0.0
    print("fp8 (e4m3) cache, audited; coverage = cells with meter <= tau")
    print(f"{'witness':>18s} {'B/token/kvh':>11s} {'cov@0.1':>8s} {'cov@0.2':>8s} "
          f"{'violations':>10s} {'cells':>7s} {'max true TV':>11s}")
    with tempfile.TemporaryDirectory() as tmp:
        for bands, fmt in WITNESSES:
            row: dict[str, Any] = {"bands": bands, "format": fmt, "bytes": 4 * bands}
            for tau in (0.1, 0.2):
                cfg = PluginConfig(store=Path(tmp) / f"{bands}-{fmt}-{tau}.sqlite", tau=tau,
                                   bands=bands, format_witness=fmt, audit=True)
                rec = run_offline(cfg, model=model, kv="fp8", prompts=prompts,
                                  max_tokens=args.tokens, repeat=1)
                mine = {r["request_id"] for r in rec["requests"]}
                vs = [v for v in rec["verdicts"] if v["external"] in mine]
                cells = sum(v["cells"] for v in vs)
                row[f"coverage@{tau}"] = sum(v["covered"] for v in vs) / cells
                row["violations"] = row.get("violations", 0) + sum(v["violations"] for v in vs)
                row["cells"] = cells
                row["true_max"] = max(v["true_max"] for v in vs)
                # each request's first row sees one token: TV exactly 0, covered at any tau
                trivial = sum(v["cells"] / v["rows"] for v in vs) / cells
            name = "+".join((["format"] if fmt else []) + ([f"bands={bands}"] if bands else []))
            print(f"{name:>18s} {row['bytes']:>11d} {row['coverage@0.1']:>8.3f} "
                  f"{row['coverage@0.2']:>8.3f} {row['violations']:>10d} {row['cells']:>7d} "
                  f"{row['true_max']:>11.4f}", flush=True)
            rows.append(row)
    print(f"(the cells of rows that see a single token, TV exactly 0: {trivial:.3f} of all; "
          "B/token/kvh: witness bytes stored per token per kv head, the fp8 key itself 64)")
    return {"coverage": rows, "single_token_share": trivial}


def _quality(scored: list[dict[str, Any]], dist: Any, ref: Any) -> dict[str, float]:
    kls: list[float] = []
    agree: list[bool] = []
    hits = 0
    for i, item in enumerate(scored):
        run, base = dist[f"item{i}"].astype(np.float64), ref[f"item{i}"].astype(np.float64)
        p = np.exp(base)
        with np.errstate(invalid="ignore"):  # -inf - -inf where both have no mass
            terms = np.where(p > 0, p * (base - run), 0.0)
        kls += terms.sum(axis=-1).tolist()
        agree += (run.argmax(-1) == base.argmax(-1)).tolist()
        answer = item["token_ids"][:-1]  # the space and the digits; the final '.' is not asked
        hits += bool((run.argmax(-1)[:len(answer)] == np.asarray(answer)).all())
    return {"kl": float(np.mean(kls)), "top1": float(np.mean(agree)),
            "retrieval": hits / len(scored)}


def repair(args: argparse.Namespace) -> dict[str, Any]:
    model = smollm2_engine_dir()
    out: list[dict[str, Any]] = []
    taus = [float(t) for t in args.taus.split(",")]
    plain: list[tuple[str, str, str | None, float]] = [
        ("bf16 engine", "auto", None, taus[0]), ("fp8 engine", "fp8", None, taus[0])]
    metered = [("fp8 metered", "fp8", "meter", taus[0])] + \
        [(f"fp8 repair {t}", "fp8", "repair", t) for t in taus] + \
        ([(f"fp8 repair-all {taus[0]}", "fp8", "repair-all", taus[0])] if args.every_row else [])
    repaired_at = {int(f) for f in args.repair_fillers.split(",") if f}
    print(f"retrieval battery ({args.items} items, {args.facts} needles each), teacher-forced; "
          f"coverage at tau {taus[0]}; KL and top-1 against bf16")
    print(f"{'context':>8s} {'run':>19s} {'retrieval':>9s} {'KL':>9s} {'top-1':>6s} "
          f"{'coverage':>8s} {'repaired':>9s} {'page-in':>8s} {'MiB in':>7s} {'ms/tok':>8s}")
    with tempfile.TemporaryDirectory() as tmp:
        for filler in [int(f) for f in args.fillers.split(",")]:
            items = retrieval_battery(items=args.items, facts=args.facts, filler=filler)
            pairs = Path(tmp) / f"pairs-{filler}.json"
            pairs.write_text(json.dumps([[it.prompt, it.continuation] for it in items]))
            found: dict[str, Any] = {}
            ref = None
            for name, kv, mode, tau in plain + (metered if filler in repaired_at else []):
                scores = Path(tmp) / f"{filler}-{kv}-{mode}-{tau}.npz"
                cfg = None if mode is None else PluginConfig(
                    store=Path(tmp) / f"{filler}-{kv}-{mode}-{tau}.sqlite", tau=tau,
                    bands=args.bands, repair=mode != "meter",
                    repair_every_row=mode == "repair-all")
                rec = run_offline(cfg, model=model, kv=kv, prompts=["."], max_tokens=1,
                                  repeat=1, kv_space_gib=args.kv_space, timeout=3600.0,
                                  extra=("--score-file", str(pairs), "--scores-out",
                                         str(scores), "--prefix-caching", "--max-model-len",
                                         "8192", "--max-num-batched-tokens", "2048"))
                dist = np.load(scores)
                ref = dist if ref is None else ref
                q = _quality(rec["scored"], dist, ref)
                scored_ids = {i for r in rec["scored"] for i in r["request_ids"]}
                vs = [v for v in rec.get("verdicts", []) if v["request"] in scored_ids
                      or v["external"] in scored_ids]
                cells = sum(v["cells"] for v in vs)
                rep = [v["repair"] for v in vs if v.get("repair")]
                tokens = sum(len(r["token_ids"]) for r in rec["scored"])
                row = {"context": rec["scored"][0]["prompt_tokens"], "run": name, **q,
                       "coverage": sum(v["covered"] for v in vs) / cells if cells else None,
                       "violations": sum(v["violations"] for v in vs),
                       "repaired_cells": sum(r["cells"] for r in rep),
                       "risk_ranked_cells": sum(r["risk_ranked"] for r in rep),
                       "page_in_fraction": (float(np.mean([r["page_in_fraction"] for r in rep]))
                                            if rep else 0.0),
                       "page_in_bytes": sum(r["page_in_bytes"] for r in rep),
                       "ms_per_token": 1000 * sum(r["wall_s"] for r in rec["scored"]) / tokens}
                found[name] = row
                cov = "-" if row["coverage"] is None else f"{row['coverage']:.3f}"
                print(f"{row['context']:>8d} {name:>19s} {row['retrieval']:>9.3f} "
                      f"{row['kl']:>9.5f} {row['top1']:>6.3f} {cov:>8s} "
                      f"{row['repaired_cells']:>9d} {row['page_in_fraction']:>8.4f} "
                      f"{row['page_in_bytes'] / 2**20:>7.2f} {row['ms_per_token']:>8.1f}",
                      flush=True)
            out.append(found)
    return {"repair": out, "taus": taus, "items": args.items, "facts": args.facts,
            "bands": args.bands}


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("what", choices=("coverage", "repair"))
    p.add_argument("--tokens", type=int, default=16, help="coverage: greedy tokens per prompt")
    p.add_argument("--fillers", default="30,60,100",
                   help="repair: filler sentences per needle, one context each (the engine "
                   "alone, bf16 and fp8)")
    p.add_argument("--repair-fillers", default="30", help="repair: the contexts also served "
                   "metered and repaired (every prefill row metered: slow at long contexts)")
    p.add_argument("--facts", type=int, default=4, help="repair: needles per item")
    p.add_argument("--items", type=int, default=8, help="repair: battery items per context")
    p.add_argument("--taus", default="0.1", help="repair: the gate's thresholds (the first "
                   "also the coverage threshold of the metered runs)")
    p.add_argument("--every-row", action="store_true", help="repair: also gate every prefill "
                   "row at the first threshold (repair=all; minutes per 1k-token prefill step)")
    p.add_argument("--bands", type=int, default=0, help="repair: band witnesses (with the "
                   "format witness)")
    p.add_argument("--kv-space", type=int, default=1, help="vLLM's KV cache space, GiB")
    p.add_argument("--json", type=Path, help="also write the numbers here")
    args = p.parse_args()
    result = coverage(args) if args.what == "coverage" else repair(args)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
