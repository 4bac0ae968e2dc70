"""The ``witcert`` command line (the top layer: it reaches the library and the demo).

Commands (``witcert COMMAND --help`` documents each):

- ``witcert gate-law --tau 0.2 --form eform|osc|tanh|affine [--eps0 E]``: the largest witness
  that keeps a softmax-to-TV bridge at or below ``tau`` (:func:`witcert_calculus.explore.gate_laws.
  gate_threshold`), with the forward bridge at that witness;
- ``witcert rate --trials N --delta D``: the zero-failure rate bounds, exact
  ``1 - delta^(1/n)`` and ``ln(1/delta)/n``;
- ``witcert explain SPEC [--site consume|write]``: a chain spec (text, or a ``.json`` /
  ``.toml`` file; :mod:`witcert_calculus.explore.chain_spec` documents the format) built and
  explained: each stage's coefficients, evidence with the Lean statement and axioms of every
  theorem it cites, tier;
- ``witcert ledger replay TRACE [--plot PNG] [--points N]``: a recorded entry trace
  (:mod:`witcert_calculus.explore.entry_trace`; the demo writes one per scheme) replayed into the
  retention / per-step bound trade-off curve, printed and plotted;
- ``witcert formal check [--root DIR] [--jobs N] [--no-build]``: in a source checkout, the
  Lean build (a line per module), the fast sync check, and the fresh export registered
  against the shipped one;
- ``witcert paths run --out DIR [--path NAME ...]``: serve vLLM's serving paths
  (:data:`witcert_adapters.paths.PATHS`) with the plugin on and off, one artifact per path;
  ``witcert paths matrix DIR``: the path-contract matrix judged from the artifacts alone;
- ``witcert demo [ARGS...]``: the README's main job (:mod:`witcert_adapters.demo`; needs the
  ``hf`` extra), with the demo's own arguments.

``--json`` prints one JSON object instead of text.

Main declarations: :func:`main`, :func:`build_parser`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from witcert_calculus.errors import WitcertError

if TYPE_CHECKING:
    from witcert_calculus.lean.theorems import TheoremRecord

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``witcert`` and its commands."""
    ap = argparse.ArgumentParser(prog="witcert", description="witcert-calculus: typed contracts "
                                 "for runtime error bounds on LLM attention memory.")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    gate = sub.add_parser("gate-law", help="the witness threshold that keeps TV <= tau",
                          description="The largest witness whose softmax-to-TV bound is at most "
                          "tau (rounded down), and the bound at it (rounded up).")
    gate.add_argument("--tau", type=float, required=True, help="the gate's TV threshold (> 0)")
    gate.add_argument("--form", required=True, choices=["eform", "osc", "tanh", "affine"],
                      help="eform: (e^{2 eps}-1)/2; osc: tanh(osc/4); tanh: tanh(eps/2); "
                      "affine: e^{2 eps0} eps on eps <= eps0")
    gate.add_argument("--eps0", type=float, help="the affine form's domain cap")
    gate.add_argument("--json", action="store_true", help="print JSON")
    rate = sub.add_parser("rate", help="zero-failure rate bounds after n clean trials",
                          description="Upper bounds on a failure rate after zero failures in n "
                          "independent trials, at confidence 1 - delta.")
    rate.add_argument("--trials", type=int, required=True, help="clean trials n (>= 1)")
    rate.add_argument("--delta", type=float, required=True, help="confidence parameter in (0, 1)")
    rate.add_argument("--json", action="store_true", help="print JSON")
    explain = sub.add_parser("explain", help="build a chain from a spec and explain it",
                             description="Build the contract a chain spec describes and print "
                             "each stage (coefficients, evidence with the Lean statement of "
                             "each cited theorem, tier) and the composed total. SPEC is text "
                             "('score(scale=0.125, q_norm_max=12) >> eform') or a .json/.toml "
                             "file; see witcert_calculus.explore.chain_spec for the format.")
    explain.add_argument("spec", help="the chain spec, or a path to a .json or .toml spec")
    explain.add_argument("--site", choices=["consume", "write"],
                         help="the observation site of a text spec (default consume)")
    explain.add_argument("--json", action="store_true", help="print JSON")
    ledger = sub.add_parser("ledger", help="ledger tools (replay)",
                            description="Tools over recorded ledger input.")
    lsub = ledger.add_subparsers(dest="ledger_command", required=True, metavar="COMMAND")
    replay = lsub.add_parser("replay", help="replay an entry trace into the trade-off curve",
                             description="Replay a recorded entry trace (witcert_calculus."
                             "entry_trace; the demo writes traces/SCHEME.jsonl): for each "
                             "per-entry threshold, the retained fraction of entries and the "
                             "worst per-step bound; writes a plot.")
    replay.add_argument("trace", help="the trace file (JSON Lines)")
    replay.add_argument("--points", type=int, default=11,
                        help="thresholds from 0 to the largest bound (default 11)")
    replay.add_argument("--plot", type=Path,
                        help="the plot to write (default: TRACE with suffix .tradeoff.png)")
    replay.add_argument("--json", action="store_true", help="print JSON")
    formal = sub.add_parser("formal", help="the Lean companion (check)",
                            description="The Lean 4 development under formal/.")
    fsub = formal.add_subparsers(dest="formal_command", required=True, metavar="COMMAND")
    check = fsub.add_parser("check", help="build the Lean development and cross-check it",
                            description="In a source checkout: the Lean build (scripts/"
                            "lean_build.sh, a progress line per module), the fast sync check "
                            "(scripts/check_formal_sync.sh), then the fresh export registered "
                            "against the shipped one (every cited theorem, same statements).")
    check.add_argument("--root", type=Path, help="the checkout (default: found upward from "
                       "the current folder)")
    check.add_argument("--jobs", type=int, default=2, help="parallel Lean processes (default 2)")
    check.add_argument("--no-build", action="store_true",
                       help="skip the Lean build; check the existing formal/build export")
    paths = sub.add_parser("paths", help="serving paths of vLLM with the plugin: run, matrix",
                           description="Serve each path twice (plugin on with audit, plugin "
                           "off) and write its artifact, or print the path-contract matrix "
                           "judged from a folder of artifacts alone.")
    psub = paths.add_subparsers(dest="paths_command", required=True, metavar="ACTION")
    prun = psub.add_parser("run", help="serve paths with vLLM's CPU build, write artifacts")
    prun.add_argument("--out", type=Path, required=True, help="the artifacts' folder")
    prun.add_argument("--path", action="append", default=[],
                      help="a path to run (repeatable; default: every path)")
    pmat = psub.add_parser("matrix", help="print the matrix judged from a folder of artifacts")
    pmat.add_argument("folder", type=Path, help="the artifacts' folder")
    pmat.add_argument("--json", action="store_true", help="print JSON")
    demo = sub.add_parser("demo", help="the README's main job (needs the hf extra)",
                          description="Run the demo: a real model's attention memory observed "
                          "through contracts; arguments after 'demo' go to the demo "
                          "(witcert demo --help).", add_help=False)
    demo.add_argument("args", nargs=argparse.REMAINDER)
    return ap


def _gate(args: argparse.Namespace) -> dict[str, object]:
    from witcert_calculus.explore.gate_laws import gate_bound, gate_threshold

    x = gate_threshold(args.tau, form=args.form, eps0=args.eps0)
    if x == float("inf"):  # a tanh form never reaches tau >= 1: every witness passes
        return {"form": args.form, "tau": args.tau, "eps0": args.eps0, "threshold": None,
                "admits_every_witness": True, "bound_at_threshold": None}
    return {"form": args.form, "tau": args.tau, "eps0": args.eps0, "threshold": x,
            "admits_every_witness": False,
            "bound_at_threshold": gate_bound(x, form=args.form, eps0=args.eps0)}


def _rate(args: argparse.Namespace) -> dict[str, object]:
    from witcert_calculus.meters.sentinels import rate_upper_bound, rate_upper_bound_exact

    return {"trials": args.trials, "delta": args.delta,
            "exact": rate_upper_bound_exact(args.trials, args.delta),
            "exponential": rate_upper_bound(args.trials, args.delta)}


def _explain(args: argparse.Namespace) -> dict[str, object]:
    from witcert_calculus.explore.chain_spec import load_chain_spec
    from witcert_calculus.lean.theorems import lookup
    from witcert_calculus.tiers import theorems_of

    c = load_chain_spec(args.spec, site=args.site)
    stages = [{"name": s.name, "a": str(s.a), "b": str(s.b), "delta": str(s.delta),
               "cap": None if s.cap is None else str(s.cap),
               "transfer": None if s.transfer is None else s.transfer.formula(),
               "tier": s.tier.name,
               "theorems": [_cited(lookup(t)) for t in theorems_of(s.evidence)]}
              for s in c.parts]
    return {"name": c.name, "tier": c.tier.name, "a": str(c.a), "b": str(c.b),
            "delta": str(c.delta), "cap": None if c.cap is None else str(c.cap),
            "subset": c.subset, "stages": stages, "explain": c.explain()}


def _cited(rec: TheoremRecord) -> dict[str, object]:
    return {"name": rec.name, "statement": rec.statement,
            "axioms": None if rec.axioms is None else list(rec.axioms),
            "axioms_scope": rec.axioms_scope, "axioms_text": rec.describe_axioms()}


def _explain_text(out: dict[str, Any]) -> str:
    lines = [out["explain"], "", "theorems cited:"]
    seen: set[str] = set()
    for st in out["stages"]:
        for t in st["theorems"]:
            if t["name"] not in seen:
                seen.add(t["name"])
                lines.append(f"  {t['name']}:\n    {t['statement']}\n    {t['axioms_text']}")
    if not seen:
        lines.append("  (none: every stage is measured)")
    lines.append(f"tier {out['tier']}")
    return "\n".join(lines)


def _replay(args: argparse.Namespace) -> dict[str, object]:
    from witcert_calculus.explore.entry_trace import read_entry_trace, replay_entry_trace

    trace = read_entry_trace(args.trace)
    curve = replay_entry_trace(trace, points=args.points)
    plot = args.plot if args.plot is not None else Path(args.trace).with_suffix(".tradeoff.png")
    _plot_tradeoff(curve, trace.metric, plot)
    return {"trace": str(args.trace), "metric": trace.metric,
            "aggregate": trace.aggregate.value, "steps": curve.n_steps,
            "entries": sum(int(s.size) for s in trace.steps), "plot": str(plot),
            "thresholds": curve.thresholds.tolist(),
            "retained_fraction": curve.retained_fraction.tolist(),
            "worst_step_bound": curve.worst_step_bound.tolist(),
            "vacuous_steps": curve.vacuous_steps.tolist()}


def _plot_tradeoff(curve: Any, metric: str, path: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        raise WitcertError("the plot needs matplotlib (pip install matplotlib)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig: Any
    ax: Any
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(curve.retained_fraction, curve.worst_step_bound, marker="o")
    ax.set_xlabel("retained fraction of entries")
    ax.set_ylabel(f"worst per-step bound ({metric})")
    ax.set_title(f"retention vs per-step bound over {curve.n_steps} steps")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(str(path), dpi=110)
    plt.close(fig)


def _replay_text(out: dict[str, Any]) -> str:
    lines = [f"{out['trace']}: {out['steps']} steps, {out['entries']} entries of "
             f"{out['metric']} (aggregate {out['aggregate']})",
             "  threshold  retained  worst step bound  vacuous steps"]
    for t, r, w, v in zip(out["thresholds"], out["retained_fraction"], out["worst_step_bound"],
                          out["vacuous_steps"], strict=True):
        lines.append(f"  {t:9.4f}  {r:8.3f}  {w:16.4f}  {v:13d}")
    lines.append(f"plot: {out['plot']}")
    return "\n".join(lines)


def _checkout(root: Path | None) -> Path:
    if root is not None:
        if not (root / "scripts" / "lean_build.sh").is_file():
            raise WitcertError(f"--root {root}: not a witcert-calculus checkout "
                               "(no scripts/lean_build.sh)")
        return root
    for folder in (Path.cwd(), *Path.cwd().parents):
        if (folder / "scripts" / "lean_build.sh").is_file() and (folder / "formal").is_dir():
            return folder
    raise WitcertError(f"no witcert-calculus checkout at or above {Path.cwd()} (formal check "
                       "needs the sources: formal/ and scripts/); pass --root")


def _formal(args: argparse.Namespace) -> dict[str, object]:
    from witcert_calculus.lean.theorems import cited_theorems, register_theorems
    from witcert_calculus.numerics.validation import positive_int

    root = _checkout(args.root)
    jobs = positive_int("--jobs", args.jobs)
    steps: list[tuple[str, list[str]]] = []
    if not args.no_build:
        steps.append(("Lean build", ["bash", "scripts/lean_build.sh", "--jobs", str(jobs)]))
    steps.append(("sync check", ["bash", "scripts/check_formal_sync.sh"]))
    for what, cmd in steps:
        print(f"witcert formal check: {what}: {' '.join(cmd)}", flush=True)
        if subprocess.run(cmd, cwd=root, check=False).returncode != 0:
            raise WitcertError(f"{what} failed (see its output above)")
    export = root / "formal" / "build" / "theorems.json"
    if not export.is_file():
        raise WitcertError(f"{export} is missing: run the Lean build (without --no-build)")
    fresh = {r.name for r in register_theorems(export)}  # refuses a changed statement
    missing = sorted(set(cited_theorems()) - fresh)
    if missing:
        raise WitcertError(f"{export} lacks theorems the library cites: {missing}")
    return {"root": str(root), "built": not args.no_build, "export": str(export),
            "theorems": len(fresh), "cited": len(cited_theorems())}


def _paths(args: argparse.Namespace) -> dict[str, object]:
    from dataclasses import asdict

    from witcert_adapters.paths import PATHS, matrix_of, render_matrix, run_path, serving_path

    if args.paths_command == "run":
        from witcert_adapters.demo.models import smollm2_engine_dir

        chosen = [serving_path(n) for n in args.path] if args.path else list(PATHS.values())
        written = [str(run_path(p, model=smollm2_engine_dir(), out_dir=args.out))
                   for p in chosen]
        return {"written": written, "text": "\n".join(written)}
    rows = matrix_of(args.folder)
    return {"rows": [asdict(r) for r in rows], "text": render_matrix(rows)}


_COMMANDS: dict[str, Callable[[argparse.Namespace], dict[str, object]]] = {
    "gate-law": _gate, "rate": _rate, "explain": _explain, "ledger": _replay, "formal": _formal,
    "paths": _paths}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``witcert``; returns the exit code (2 on a bad argument)."""
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == ["demo"]:  # everything after 'demo' is the demo's, --help included
        try:
            from witcert_adapters.demo.cli import main as demo_main
        except ImportError as exc:
            print(f"witcert demo needs the hf extra (pip install 'witcert-calculus[hf]'): {exc}",
                  file=sys.stderr)
            return 2
        return demo_main(words[1:])
    args = build_parser().parse_args(words)
    try:
        out: dict[str, Any] = _COMMANDS[args.command](args)
    except WitcertError as exc:
        print(f"witcert {args.command}: {exc}", file=sys.stderr)
        return 2
    if getattr(args, "json", False):
        print(json.dumps(out))
    elif args.command == "explain":
        print(_explain_text(out))
    elif args.command == "paths":
        print(str(out["text"]).rstrip("\n"))
    elif args.command == "ledger":
        print(_replay_text(out))
    elif args.command == "formal":
        print(f"witcert formal check: ok: {out['theorems']} theorems exported, every one of "
              f"the {out['cited']} the library cites with its shipped statement")
    elif args.command == "gate-law" and out["admits_every_witness"]:
        print(f"{out['form']}: every witness keeps TV <= {out['tau']!r} (the form stays below 1)")
    elif args.command == "gate-law":
        print(f"{out['form']}: witness <= {out['threshold']!r} keeps TV <= {out['tau']!r} "
              f"(the bound there: {out['bound_at_threshold']!r})")
    else:
        print(f"zero failures in {out['trials']} trials, confidence 1 - {out['delta']!r}: "
              f"rate <= {out['exact']!r} (exact, 1 - delta^(1/n)); "
              f"<= {out['exponential']!r} (ln(1/delta)/n)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
