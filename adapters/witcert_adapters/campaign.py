"""A diagnosis campaign that localizes a planted fault from run artifacts alone.

The fault (:mod:`witcert_adapters.planted`, put on the engine's ``PYTHONPATH`` by this module
only, for arms whose ``fault`` knob is ``planted``) corrupts the keys of KV blocks that a
preemption freed, in every later step: one structural regime. The campaign serves the same
requests through vLLM's CPU build with the plugin on (audit on: every cell's true total
variation measured against its bound) in six arms of three knobs, each in independent rounds
(other prompts, other seeds):

- ``kv_blocks``: the KV space, 32 blocks (no preemption) or 6 (the scheduler preempts);
- ``prefix_caching``: off or on (shared prefix blocks);
- ``fault``: ``off`` or ``planted``.

Each run writes an artifact (:func:`run_campaign`); :func:`adjudicate` reads the artifacts
only and applies :mod:`witcert_calculus.explore.diagnosis`: controlled pairs are attributed
when the effect on the outcome (audited cells above their bound) replicates in every round,
comparisons of arms that differ in two knobs are refused as confounded, and the regime the
failures occur in is read from the engine's own preemption counter. The fault-free regime is
shown exact: no violation, no request failed closed, and the same token ids as the engine
without the fault. ``python -m witcert_adapters.campaign run --out DIR`` serves it (18 engine
starts, about 14 minutes here); ``python -m witcert_adapters.campaign log DIR`` prints the
adjudication; ``docs/campaign/`` holds the artifacts and ``docs/campaign.txt`` the log.

Main declarations:

- :data:`DESIGN`, :data:`ARMS`, :func:`spec_of`: the campaign's knobs, arms and specs.
- :func:`run_campaign`, :func:`run_arm`: serve arms and write their artifacts.
- :class:`Outcome`, :func:`load_outcomes`: the numbers an artifact holds, checked.
- :func:`adjudicate`: the adjudication log.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, final

from witcert_adapters.paths import ENGINE, ServingPath, need, read_json_object, serve_spec, \
    served_verdicts, slim
from witcert_calculus.errors import ConfoundedComparisonError, InvalidValueError
from witcert_calculus.explore.diagnosis import Arm, Design, Run, compare_arms

__all__ = ["ARMS", "DESIGN", "FAULT_DIR", "Outcome", "adjudicate", "load_outcomes", "main",
           "run_arm", "run_campaign", "spec_of"]

#: The folder whose ``sitecustomize`` plants the fault; on no default path.
FAULT_DIR: Final = Path(__file__).resolve().parent / "planted"

_FAULT_ENV: Final = "WITCERT_PLANTED_FAULT"
_SCHEMA: Final = 1
_CAMPAIGN: Final = "preempted-blocks-corrupted"

#: The knobs and their settings.
DESIGN: Final = Design({"kv_blocks": (32, 6), "prefix_caching": (False, True),
                        "fault": ("off", "planted")})

#: The arms, by name.
ARMS: Final[Mapping[str, Arm]] = {a.name: a for a in (
    DESIGN.arm("clean", kv_blocks=32, prefix_caching=False, fault="off"),
    DESIGN.arm("base", kv_blocks=32, prefix_caching=False, fault="planted"),
    DESIGN.arm("cached", kv_blocks=32, prefix_caching=True, fault="planted"),
    DESIGN.arm("tight-clean", kv_blocks=6, prefix_caching=False, fault="off"),
    DESIGN.arm("tight", kv_blocks=6, prefix_caching=False, fault="planted"),
    DESIGN.arm("tight-cached", kv_blocks=6, prefix_caching=True, fault="planted"),
)}

_ROUNDS: Final = 3

_SENTENCES: Final = (
    "The river ran past the old mill and the miller sang to the water.",
    "A ship left the harbour before the storm reached the rocky coast.",
    "Seven students solved the puzzle in under an hour and went home.",
    "The library keeps its oldest maps in a cold and very dry room.",
    "Bread rises faster in a warm kitchen than in a cold one at night.",
    "The orchestra tuned their instruments before the concert began.",
    "Bees carry pollen from flower to flower all summer long and rest.",
    "The mountain road closes every winter after the first deep snow.",
    "Old clocks in the hall chimed twice while the guests were eating.",
)
# about 150 tokens: one whole block of vLLM's CPU block size (128) shared by every request
_PREFIX: Final = ("Read the note below and continue it in the same calm style, one plain "
                  "sentence at a time. " * 7)


def spec_of(arm: Arm, round_: int) -> dict[str, Any]:
    """The serving spec of one arm in one round: 8 requests of about 230 tokens that grow
    past two blocks, all in flight, greedy, each round with other notes.

    Raises:
        InvalidValueError: an arm not of :data:`DESIGN`, or a negative round.
    """
    if not isinstance(arm, Arm) or arm.design != DESIGN:
        raise InvalidValueError("arm", arm, "must be an arm of the campaign's design")
    if isinstance(round_, bool) or not isinstance(round_, int) or round_ < 0:
        raise InvalidValueError("round", round_, "must be an integer >= 0")
    s = arm.settings
    prompts = tuple(_PREFIX + f"Note {i}: " + " ".join(
        _SENTENCES[(i + round_ + k) % len(_SENTENCES)] for k in range(6)) for i in range(8))
    path = ServingPath(
        f"{arm.name}-r{round_}", f"campaign arm {arm.name}, round {round_}",
        {"kv_cache_dtype": "fp8", "max_model_len": 512, "max_num_seqs": 8,
         "max_num_batched_tokens": 512, "enable_prefix_caching": bool(s["prefix_caching"]),
         "num_gpu_blocks_override": int(s["kv_blocks"])},
        prompts, in_flight=8, max_tokens=40, seed=round_)
    return path.spec()


def run_arm(arm: Arm, round_: int, *, model: Path, out_dir: Path,
            timeout: float = 900.0) -> Path:
    """Serve one arm in one round (plugin on, audit on; the fault planted if the arm says so)
    and write its artifact ``out_dir / f"{arm.name}-r{round_}.json"``."""
    from witcert_adapters.vllm_plugin.config import PluginConfig

    spec = spec_of(arm, round_)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        poisoned = work / "freed-by-preemption.txt"
        extra: dict[str, str] = {}
        if arm.settings["fault"] == "planted":
            extra = {_FAULT_ENV: str(poisoned),
                     "PYTHONPATH": os.pathsep.join(
                         [str(FAULT_DIR), *filter(None, [os.environ.get("PYTHONPATH")])])}
        config = PluginConfig(store=work / "verdicts.sqlite", tau=0.1, audit=True)
        record = serve_spec(spec, model=model, workdir=work, config=config, extra_env=extra,
                            timeout=timeout)
        blocks = sorted({int(x) for x in poisoned.read_text().split()}) \
            if poisoned.exists() else []
    artifact = {"schema": _SCHEMA, "campaign": _CAMPAIGN, "arm": arm.name,
                "settings": dict(arm.settings), "round": round_,
                "engine": record.get("engine", ENGINE), "spec": spec,
                "fault_blocks": blocks, "run": slim(record)}
    target = out_dir / f"{arm.name}-r{round_}.json"
    target.write_text(json.dumps(artifact, indent=1, sort_keys=True) + "\n")
    return target


def run_campaign(*, model: Path, out_dir: Path, rounds: int = _ROUNDS) -> list[Path]:
    """Serve every arm in every round, round by round."""
    return [run_arm(arm, r, model=model, out_dir=out_dir)
            for r in range(rounds) for arm in ARMS.values()]


# --------------------------------------------------------------------------- outcomes


@final
@dataclass(frozen=True, slots=True)
class Outcome:
    """What one artifact measured.

    Attributes:
        arm: the arm; ``round``: the round.
        violations: audited cells whose true TV exceeded the bound (the outcome compared).
        audited: audited cells; ``failed_closed``: requests that failed closed.
        preemptions: the engine's preemption counter; ``prefix_hits``: its prefix-cache hit
            tokens (the regime, read from the engine).
        fault_blocks: blocks the planted fault corrupted.
        outputs: each request's token ids.
    """

    arm: Arm
    round: int
    violations: int
    audited: int
    failed_closed: int
    preemptions: int
    prefix_hits: int
    fault_blocks: int
    outputs: Mapping[str, Any]

    @property
    def run(self) -> Run:
        """The diagnosis calculus's view: the outcome is the violation count."""
        return Run(self.arm, self.round, float(self.violations), "idle host, 1 thread")


def _need(data: Mapping[str, Any], key: str, where: str) -> Any:
    return need(data, key, where, kind="a campaign artifact")


def _outcome(file: Path) -> Outcome:
    data = read_json_object(file)
    where = file.name
    if _need(data, "schema", where) != _SCHEMA or _need(data, "campaign", where) != _CAMPAIGN:
        raise InvalidValueError(f"{where}.schema/campaign", (data["schema"], data["campaign"]),
                                f"must be {_SCHEMA} / {_CAMPAIGN!r}")
    name = _need(data, "arm", where)
    if name not in ARMS:
        raise InvalidValueError(f"{where}.arm", name, f"must be one of {', '.join(ARMS)}")
    arm = ARMS[name]
    if _need(data, "settings", where) != dict(arm.settings):
        raise InvalidValueError(f"{where}.settings", data["settings"],
                                f"must be arm {name!r}'s settings {dict(arm.settings)}")
    round_ = _need(data, "round", where)
    if _need(data, "spec", where) != spec_of(arm, round_):
        raise InvalidValueError(f"{where}.spec", f"the spec stored in {where}",
                                f"must be arm {name!r} round {round_} as defined now")
    if _need(data, "engine", where) != ENGINE:
        raise InvalidValueError(f"{where}.engine", data["engine"], f"must be {ENGINE}")
    run = _need(data, "run", where)
    if "refused" in run:
        raise InvalidValueError(f"{where}.run", run["refused"], "is a refused run: the "
                                "campaign needs every arm served")
    for key in ("outputs", "verdicts", "counters", "plugin"):
        _need(run, key, f"{where}.run")
    mine, _ = served_verdicts(run, 1)
    if len(mine) != len(run["outputs"]):
        raise InvalidValueError(f"{where}.run.verdicts", len(mine),
                                f"must hold one verdict per served request "
                                f"({len(run['outputs'])})")
    counters: Mapping[str, float] = run["counters"]
    return Outcome(arm, int(round_), sum(int(v["violations"]) for v in mine),
                   sum(int(v["audited"]) for v in mine),
                   sum(1 for v in mine if v["failure"] is not None),
                   int(counters.get("vllm:num_preemptions", 0)),
                   int(counters.get("vllm:prefix_cache_hits", 0)),
                   len(_need(data, "fault_blocks", where)), run["outputs"])


def load_outcomes(directory: Path) -> list[Outcome]:
    """Every artifact of a campaign folder, checked (sorted by round, then arm).

    Raises:
        InvalidValueError: no such folder, no artifact, a file that does not check, or a
            file whose name is not its arm and round.
    """
    if not Path(directory).is_dir():
        raise InvalidValueError("folder", str(directory), "must be a folder of campaign "
                                "artifacts")
    out: list[Outcome] = []
    for f in sorted(Path(directory).glob("*.json")):
        o = _outcome(f)
        if f.stem != f"{o.arm.name}-r{o.round}":
            raise InvalidValueError("artifact", f.name, f"must be named "
                                    f"{o.arm.name}-r{o.round}.json")
        out.append(o)
    if not out:
        raise InvalidValueError("folder", str(directory), "holds no campaign artifact")
    names = list(ARMS)
    return sorted(out, key=lambda o: (o.round, names.index(o.arm.name)))


# --------------------------------------------------------------------------- adjudication

#: The controlled comparisons: (baseline arm, arm that changes one knob, what it asks).
CONTROLLED: Final = (
    ("clean", "tight-clean", "does preemption alone break anything (fault off)?"),
    ("clean", "base", "does the planted fault show without preemption?"),
    ("base", "cached", "does prefix caching matter (fault planted, no preemption)?"),
    ("base", "tight", "does preemption matter with the fault planted?"),
    ("tight-clean", "tight", "does the fault matter under preemption?"),
    ("tight", "tight-cached", "does prefix caching matter under preemption?"),
)

#: Comparisons a hand analysis is tempted to make; both change two knobs at once.
CONFOUNDED: Final = (
    ("base", "tight-cached", "the memory-tight, prefix-cached configuration fails and the "
     "default does not: blame prefix caching?"),
    ("clean", "tight", "the faulty build under memory pressure against the clean build "
     "with room: blame the fault?"),
)


def _in_order(o: Outcome) -> list[Any]:
    # the requests' token ids by request index (ids are "<arm>-r<round>-<i>")
    return [o.outputs[f"{o.arm.name}-r{o.round}-{i}"] for i in range(len(o.outputs))]


def _settings(arm: Arm) -> str:
    return " ".join(f"{k}={v}" for k, v in arm.settings.items())


def adjudicate(directory: Path, *, replications: int = _ROUNDS) -> str:
    """The adjudication log of a campaign folder, every number read from its artifacts.

    Raises:
        InvalidValueError: artifacts that do not check, or rounds in which the compared arms
            are unmatched (named).
    """
    outcomes = load_outcomes(directory)
    runs = [o.run for o in outcomes]
    rounds = sorted({o.round for o in outcomes})
    lines = [f"# Diagnosis campaign: {_CAMPAIGN}",
             "",
             f"{len(outcomes)} artifacts ({len(ARMS)} arms x {len(rounds)} rounds), vLLM "
             f"{ENGINE['version']} CPU, fp8 cache, plugin on with audit. Outcome compared: "
             "audited cells whose true TV exceeded the bound (violations).",
             "",
             "## Arms and runs",
             "",
             "| arm | settings | round | violations / audited | failed closed | "
             "preemptions | prefix-hit tokens | blocks corrupted |",
             "|---|---|---|---|---|---|---|---|"]
    for o in outcomes:
        lines.append(f"| {o.arm.name} | {_settings(o.arm)} | {o.round} | {o.violations} / "
                     f"{o.audited} | {o.failed_closed} | {o.preemptions} | {o.prefix_hits} | "
                     f"{o.fault_blocks} |")
    lines += ["", f"## Controlled comparisons (one knob each; attributed when the effect "
              f"has one sign in at least {replications} rounds and the other in none)", ""]
    attributed: list[str] = []
    for first, second, question in CONTROLLED:
        v = compare_arms(runs, ARMS[first], ARMS[second], replications=replications)
        knob, before, after = v.knob
        effects = ", ".join(f"{e:+g}" for e in v.effects)
        verdict = "ATTRIBUTED" if v.attributed else "not attributed"
        lines.append(f"- {first} -> {second} ({knob}: {before} -> {after}; {question}) "
                     f"effects by round [{effects}]: **{verdict}** ({v.reason}); tier "
                     f"{v.tier.name}")
        if v.attributed:
            attributed.append(f"{knob} {before} -> {after} ({first} -> {second}: "
                              f"violations {'rise' if sum(v.effects) > 0 else 'fall'})")
    lines += ["", "## Confounded comparisons (refused)", ""]
    for first, second, temptation in CONFOUNDED:
        a, b = ARMS[first], ARMS[second]
        va = sum(o.violations for o in outcomes if o.arm == a)
        vb = sum(o.violations for o in outcomes if o.arm == b)
        try:
            compare_arms(runs, a, b, replications=replications)
        except ConfoundedComparisonError as exc:
            lines.append(f"- {first} ({va} violations) vs {second} ({vb}): {temptation} "
                         f"**REFUSED**: {exc}")
        else:
            raise InvalidValueError("comparison", (first, second), "was expected to be "
                                    "confounded and was not")
    lines += ["", "## Localization (regime read from the engine's counters)", ""]
    planted = [o for o in outcomes if o.arm.settings["fault"] == "planted"]
    hit = [o for o in planted if o.preemptions > 0]
    miss = [o for o in outcomes if o not in hit]
    lines.append(f"- fault planted and preemptions > 0: violations in "
                 f"{sum(o.violations > 0 for o in hit)} of {len(hit)} runs "
                 f"({sum(o.violations for o in hit)} cells)")
    lines.append(f"- every other run (fault off, or no preemption): violations in "
                 f"{sum(o.violations > 0 for o in miss)} of {len(miss)} runs "
                 f"({sum(o.violations for o in miss)} cells)")
    tight_clean = {o.round: o for o in outcomes if o.arm.name == "tight-clean"}
    for o in outcomes:
        if o.arm.name == "tight" and o.round in tight_clean:
            differ = sum(a != b for a, b in zip(_in_order(o), _in_order(tight_clean[o.round]),
                                                strict=True))
            lines.append(f"- round {o.round}: the fault changed the token ids of {differ} of "
                         f"{len(o.outputs)} requests (tight against tight-clean); the plugin "
                         f"saw {o.violations} cells above their bound")
    exact = all(o.violations > 0 for o in hit) and not any(o.violations for o in miss)
    lines.append("- the failures occur " + ("exactly" if exact else "NOT exactly") +
                 " in the runs where the fault is planted and the engine preempted")
    lines += ["", "## The fault-free regime is exact", ""]
    clean = {o.round: o for o in outcomes if o.arm.name == "clean"}
    for o in outcomes:
        if o.preemptions == 0 and o.arm.settings["fault"] == "planted" and o.round in clean:
            c = clean[o.round]
            same = sum(a == b for a, b in zip(_in_order(o), _in_order(c), strict=True))
            lines.append(f"- {o.arm.name} round {o.round} (fault planted, no preemption): "
                         f"{o.violations} violations, {o.failed_closed} failed closed, "
                         f"{o.fault_blocks} blocks corrupted; token ids equal to the clean "
                         f"build's for {same} of {len(o.outputs)} requests")
    lines += ["", "## Verdict", ""]
    lines.append("- attributed: " + ("; ".join(attributed) if attributed else "nothing"))
    lines.append(f"- refused as confounded: {len(CONFOUNDED)} comparisons")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """``run --out DIR [--arm NAME --round K]`` serves; ``log DIR`` prints the adjudication."""
    p = argparse.ArgumentParser(prog="python -m witcert_adapters.campaign",
                                description=(__doc__ or "").split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="serve the campaign's arms and write their artifacts")
    r.add_argument("--out", required=True, type=Path)
    r.add_argument("--arm", choices=list(ARMS), help="one arm only")
    r.add_argument("--round", type=int, help="one round only (with --arm)")
    r.add_argument("--rounds", type=int, default=_ROUNDS)
    g = sub.add_parser("log", help="print the adjudication log of a campaign folder")
    g.add_argument("folder", type=Path)
    args = p.parse_args(argv)
    if args.command == "log":
        print(adjudicate(args.folder), end="")
        return 0
    from witcert_adapters.demo.models import smollm2_engine_dir

    model = smollm2_engine_dir()
    if args.arm is not None:
        for k in ([args.round] if args.round is not None else range(args.rounds)):
            print(run_arm(ARMS[args.arm], k, model=model, out_dir=args.out))
        return 0
    for f in run_campaign(model=model, out_dir=args.out, rounds=args.rounds):
        print(f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
