"""The ``witcert`` command line (the top layer: it reaches the library and the demo).

Commands (``witcert COMMAND --help`` documents each):

- ``witcert gate-law --tau 0.2 --form eform|osc|tanh|affine [--eps0 E]``: the largest witness
  that keeps a softmax-to-TV bridge at or below ``tau`` (:func:`witcert_calculus.gate_laws.
  gate_threshold`), with the forward bridge at that witness;
- ``witcert rate --trials N --delta D``: the zero-failure rate bounds, exact
  ``1 - delta^(1/n)`` and ``ln(1/delta)/n``;
- ``witcert demo [ARGS...]``: the README's main job (:mod:`witcert_adapters.demo`; needs the
  ``hf`` extra), with the demo's own arguments.

``--json`` prints one JSON object instead of text.

Main declarations: :func:`main`, :func:`build_parser`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from witcert_calculus.errors import WitcertError

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
    demo = sub.add_parser("demo", help="the README's main job (needs the hf extra)",
                          description="Run the demo: a real model's attention memory observed "
                          "through contracts; arguments after 'demo' go to the demo "
                          "(witcert demo --help).", add_help=False)
    demo.add_argument("args", nargs=argparse.REMAINDER)
    return ap


def _gate(args: argparse.Namespace) -> dict[str, object]:
    from witcert_calculus.gate_laws import gate_bound, gate_threshold

    x = gate_threshold(args.tau, form=args.form, eps0=args.eps0)
    if x == float("inf"):  # a tanh form never reaches tau >= 1: every witness passes
        return {"form": args.form, "tau": args.tau, "eps0": args.eps0, "threshold": None,
                "admits_every_witness": True, "bound_at_threshold": None}
    return {"form": args.form, "tau": args.tau, "eps0": args.eps0, "threshold": x,
            "admits_every_witness": False,
            "bound_at_threshold": gate_bound(x, form=args.form, eps0=args.eps0)}


def _rate(args: argparse.Namespace) -> dict[str, object]:
    from witcert_calculus.sentinels import rate_upper_bound, rate_upper_bound_exact

    return {"trials": args.trials, "delta": args.delta,
            "exact": rate_upper_bound_exact(args.trials, args.delta),
            "exponential": rate_upper_bound(args.trials, args.delta)}


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
        out = _gate(args) if args.command == "gate-law" else _rate(args)
    except WitcertError as exc:
        print(f"witcert {args.command}: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(out))
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
