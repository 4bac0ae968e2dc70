"""Generate ``formal/WitCert/GeneratedChecks.lean``: Python's exact values, confirmed by Lean.

For seeded, generated inputs, the library's real code computes on exact rationals
(``fractions.Fraction``): series-composition coefficients, deltas, tiers and
propagated caps (``Contract.__rshift__``), tier meets (``weakest``), tier
decisions (``decide_tier``), metric saturations (``metric_info``), telescoping
allowances and spends (``telescoping_delta``, ``telescoping_spent``), the pooling
max caliber (``pooling``) and the rank-prefix selection offset
(``rank_prefix_selection``). Each value is written as a Lean statement closed by
``decide +kernel``, so the Lean kernel recomputes it from the Lean definitions.

The transfer coefficients of the softmax-to-TV bridges and the algebraic cores of the meters
are read from Python's own code path, never retyped: each bridge's ``Transfer`` (and the
affine bridge's slope computation, and ``tv_forms._eform_raw`` / ``_two_sided_raw``) is run
with ``mpmath``/``numpy``'s exponentials replaced by exact rational stand-ins that record their
arguments, and with the outward rounding step (``math.nextafter``, a separate soundness step)
replaced by the identity; the recorded arguments and results are compared, by the kernel, with
the Lean definitions that the statements use (``WitCert.Analytic.sharpOscArg``,
``sharpLinfArg``, ``eformArg``, ``eformBridgeCore``, ``affineSlopeArg``, ``eformCore``,
``twoSidedCore`` in ``WitCert/Sharp.lean``, each tied there to its theorem by an ``example``).
The tanh bridges' transfers must return the value of the ``tanh`` they evaluated, unscaled;
the e-form is checked at arguments up to 350 (``2x = 700``, the last one it evaluates) and must
saturate to ``inf`` past it without evaluating ``exp``. The telescoping checks evaluate
``WitCert.Ledger.telescopeDelta`` and ``WitCert.Ledger.spent``.

The fp8 format witnesses are checked exhaustively: ``formats.code_value``,
``code_step`` and ``witness_exact`` (with the module's ``ETA`` and ``EPS``) for every code
``0..255`` of both formats, both roundings and two dyadic scales, each whole 256-entry list
against ``WitCert.Formats.codeValue``, ``codeStep`` and ``witness`` (``WitCert/Formats.lean``,
tied there to ``format_residual_le``).

The Cauchy-Schwarz coefficients are compared with the statements that prove them: the score
and decompression slopes (``a * a = s * s * (q * q)``), the l2 pooling caliber
(``Σ w² ≤ a * a``) and the witness logit bound ``c`` (at least ``s Σ_b ‖q_b‖ w_b`` at query
bands with exact norms), and the output-error contract's slope (``2 M``) and offset (at least
``Σ q ρ``, ``output_error_bound_vector_sound``). ``rounding.outward`` (with real margins) and
``rounding.add_up`` are checked exactly at float points. The meters' ``log A`` / ``log A-`` and
the retention form are compared, in the generator itself, with 50-digit evaluations of the
statements' values (:func:`log_a_checks`), and each rounding margin with the error it claims
to cover, in 50-digit arithmetic at adversarial points (``scripts/margin_checks.py``).
:data:`VALUE_CHECKS` names each section's Python code and Lean definitions
(``formal/README.md`` lists them).

Usage::

    python scripts/gen_lean_checks.py          # rewrite the generated file
    python scripts/gen_lean_checks.py --check  # exit 1 (and a diff) if the committed file is stale

``bash scripts/check_formal_sync.sh`` runs the ``--check`` together with the statement lock.

Main declarations:

- :func:`generate`: the file's text (deterministic).
- :func:`main`: the command-line entry point.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import math
import random
import sys
import types
from collections.abc import Callable, Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import mpmath
import numpy as np

from margin_checks import margin_checks
from witcert_calculus import bridges as _bridges
from witcert_calculus import contracts as _contracts
from witcert_calculus import metrics as M
from witcert_calculus.meters import tv_forms as _tv_forms
from witcert_calculus.bridges import (
    decompression_bridge,
    pooling,
    rank_prefix_selection,
    selector_mass_eform,
    softmax_tv_affine,
    softmax_tv_eform,
    softmax_tv_tanh,
    softmax_tv_tanh_osc,
    score_bridge,
)
from witcert_calculus.accounting.budget import telescoping_delta, telescoping_spent
from witcert_calculus.contracts import Contract, _proved  # pyright: ignore[reportPrivateUsage]
from witcert_calculus.errors import InvalidValueError
from witcert_calculus.meters.output_bound import output_error_contract
from witcert_calculus.meters.witness import RopeLayout, logit_bound
from witcert_calculus.numerics.rounding import add_up, outward, tanh_margin, tv_margin
from witcert_calculus.meters.formats import (
    EPS,
    ETA,
    Fp8Format,
    Rounding,
    code_step,
    code_value,
    witness_exact,
)
from witcert_calculus.tiers import Measurement, Proof, Restricted, Tier, _proof, decide_tier, weakest  # pyright: ignore[reportPrivateUsage]

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "formal" / "WitCert" / "GeneratedChecks.lean"
SEED = 20260101

METRICS: tuple[str, ...] = (
    "KeyResidualRel", "KeyResidualAbs", "ValueResidual", "LogitLinf", "LogitOsc", "AttentionTV",
    "SelectorMass", "AttentionOutputL2", "LatentResidual", "RecurrentStateError", "PerTokenL2",
    "PerTokenMax", "PooledError", "ResidualL2", "NextTokenTV",
)
SITES: tuple[str, ...] = ("AtWrite", "AtConsume")
TIERS = {Tier.SATURATED: "Tier.saturated", Tier.EMPIRICAL: "Tier.empirical",
         Tier.PARTIALLY_CERTIFIED: "Tier.partiallyCertified", Tier.CERTIFIED: "Tier.certified"}

HEADER = '''\
/-
Copyright (c) 2026 witcert-calculus contributors. All rights reserved.
Released under Apache 2.0 license as described in the file LICENSE.
-/
module

public import WitCert.Contracts
public import WitCert.Bridges
public import WitCert.Ledger
public import WitCert.Sharp
public import WitCert.Meters
public import WitCert.Formats

/-!
# Python values confirmed by the Lean kernel (generated)

GENERATED by `scripts/gen_lean_checks.py` (seed {seed}); do not edit. `tests/test_formal.py`
fails when this file differs from a fresh generation.

Each `example` is a value computed by the Python library on exact rationals, for a generated
input, restated over the Lean definitions and closed by `decide +kernel`: the kernel evaluates
the Lean side and compares. Covered: series composition (`Contract.comp`: slope, offset, delta,
tier, propagated cap), tier meets (`Tier.weakest`), tier decisions (`Tier.decideTier`), metric
saturations (`Metric.saturation`), telescoping allowances and spends (`Ledger.telescopeDelta`,
`Ledger.spent`), the pooling max caliber and the rank-prefix selection bound; the transfer
coefficients of the softmax-to-TV bridges and the algebraic cores of the e-form and two-sided
meters, read from Python's code path run on rational stand-ins for the exponentials, against
the definitions of `WitCert/Sharp.lean` (`Analytic.sharpOscArg`, `Analytic.sharpLinfArg`,
`Analytic.eformArg`, `Analytic.eformBridgeCore`, `Analytic.affineSlopeArg`,
`Analytic.eformCore`, `Analytic.twoSidedCore`), each tied there to its theorem; and the fp8
format witnesses, every code of both formats, both roundings and two scales
(`Formats.codeValue`, `Formats.codeStep`, `Formats.witness`, tied in `WitCert/Formats.lean` to
`Formats.format_residual_le`).
-/

namespace WitCert.GeneratedChecks

-- Kernel-evaluated only: no code is generated for these definitions.
noncomputable section

open WitCert

/-- A contract from its Python fields (`cap` becomes the one-constraint domain `e ≤ cap`). -/
def mk {{s t : Site}} (i : Metric s) (o : Metric t) (a b delta : Rat) (tier : Tier)
    (cap : Option Rat) : Contract i o :=
  ⟨a, b, delta, tier, Contract.capDomain cap⟩
'''

METER_TIES = '''\
/-! ### The meters' statements use the cores of `WitCert/Sharp.lean`

`Meters.tv_eform_sound` and `Meters.tv_two_sided_sound` restated with `Analytic.eformCore` and
`Analytic.twoSidedCore` (proved from the theorems by unfolding): the cores checked below are
the ones those statements bound `TV` by. -/

section MeterTies

open WitCert.Analytic

variable {{α : Type}} [Lean.Grind.Field α] [LE α] [LT α] [Std.LawfulOrderLT α]
  [Std.IsLinearOrder α] [Lean.Grind.OrderedRing α]

example {{β : Type}} (E : ExpLaws α) (z z' c : β → α) (L : List β) (hL : L ≠ [])
    (hc : ∀ t ∈ L, absA (z t - z' t) ≤ c t) :
    tv (softmax E z L) (softmax E z' L) L ≤ eformCore (Meters.aPlus E z' c L) :=
  Meters.tv_eform_sound E z z' c L hL hc

example {{β : Type}} (E : ExpLaws α) (z z' c : β → α) (L : List β) (hL : L ≠ [])
    (hc : ∀ t ∈ L, absA (z t - z' t) ≤ c t) :
    tv (softmax E z L) (softmax E z' L) L ≤
      twoSidedCore (Meters.aPlus E z' c L) (Meters.aMinus E z' c L) :=
  Meters.tv_two_sided_sound E z z' c L hL hc

end MeterTies
'''


def rat(x: Fraction | int) -> str:
    """A Lean `Rat` literal for an exact rational."""
    fr = Fraction(x)
    body = str(fr.numerator) if fr.denominator == 1 else f"{fr.numerator}/{fr.denominator}"
    return f"({body} : Rat)" if fr >= 0 else f"(-({-fr.numerator}/{fr.denominator}) : Rat)"


def opt_rat(x: Fraction | None) -> str:
    """A Lean `Option Rat` literal."""
    return "none" if x is None else f"(some {rat(x)})"


def lean_metric(cls_name: str, site: str) -> str:
    """The Lean metric for a Python metric class name and site name."""
    ctor = cls_name[0].lower() + cls_name[1:]
    return f"(Metric.{ctor} .{site[0].lower() + site[1:]})"


def py_metric(cls_name: str, site: str) -> Any:
    """The Python metric type ``Cls[Site]``."""
    return M.at(getattr(M, cls_name), getattr(M, site))


def _frac(rng: random.Random, *, lo: int = 0, hi: int = 12, dens: tuple[int, ...] = (1, 2, 3, 4,
          5, 8, 10, 16)) -> Fraction:
    return Fraction(rng.randint(lo, hi), rng.choice(dens))


def _stage(rng: random.Random, m_in: tuple[str, str], m_out: tuple[str, str], name: str
           ) -> Contract[Any, Any]:
    """A stage of random coefficients, proved (for its own claim), restricted or measured."""
    cap = None if rng.random() < 0.4 else _frac(rng, lo=1, hi=20)
    a, b = _frac(rng), _frac(rng, hi=6)
    delta = Fraction(rng.randint(0, 3), rng.choice((100, 1000, 64)))
    kind = rng.randrange(3)
    if kind == 2:
        return Contract(py_metric(*m_in), py_metric(*m_out), a=a, b=b, delta=delta, cap=cap,
                        evidence=Measurement("generated", samples=rng.randint(1, 9)), name=name)
    return _proved(py_metric(*m_in), py_metric(*m_out), a=a, b=b, delta=delta, cap=cap,
                   theorem="WitCert.Contract.comp_sound", name=name,
                   subset="e_in <= 1" if kind == 1 else "")


def _def(name: str, c: Contract[Any, Any], m_in: tuple[str, str], m_out: tuple[str, str]) -> str:
    return (f"/-- Stage `{name}`. -/\n"
            f"def {name} :\n    Contract {lean_metric(*m_in)} {lean_metric(*m_out)} :=\n"
            f"  mk _ _ {rat(c.a)} {rat(c.b)} {rat(c.delta)}\n"
            f"    {TIERS[c.tier]} {opt_rat(c.cap)}\n")


def _example(statement: str, rhs: str | None = None) -> str:
    """An ``example`` closed by ``decide +kernel``, wrapped to stay within 100 columns."""
    op = "="
    if rhs is None:
        cut = max(statement.rfind(" = "), statement.rfind(" ≤ "), statement.rfind(" < "))
        op = statement[cut + 1]
        statement, rhs = statement[:cut], statement[cut + 3:]
    one = f"example : {statement} {op} {rhs} := by decide +kernel"
    if len(one) <= 100 and "\n" not in one:
        return one + "\n"
    return f"example :\n    {statement} {op}\n      {rhs} := by\n  decide +kernel\n"


def composition_checks(rng: random.Random, count: int) -> list[str]:
    """Two- and three-stage compositions: every field of the composite."""
    out: list[str] = []
    made = 0
    while made < count:
        site = rng.choice(SITES)
        names = [(rng.choice(METRICS), site) for _ in range(4)]
        three = made % 3 == 2
        c1 = _stage(rng, names[0], names[1], "s1")
        c2 = _stage(rng, names[1], names[2], "s2")
        try:
            comp = c1 >> c2
            c3 = _stage(rng, names[2], names[3], "s3") if three else None
            if c3 is not None:
                comp = comp >> c3
        except InvalidValueError:
            continue  # the stages do not compose (delta >= 1 or an empty domain)
        tag = f"comp{made}"
        out.append(_def(f"{tag}s1", c1, names[0], names[1]))
        out.append(_def(f"{tag}s2", c2, names[1], names[2]))
        lean = f"({tag}s2.comp {tag}s1)"
        if c3 is not None:
            out.append(_def(f"{tag}s3", c3, names[2], names[3]))
            lean = f"({tag}s3.comp {lean})"
        out.append(_example(f"{lean}.a = {rat(comp.a)}"))
        out.append(_example(f"{lean}.b = {rat(comp.b)}"))
        out.append(_example(f"{lean}.delta = {rat(comp.delta)}"))
        out.append(_example(f"{lean}.tier = {TIERS[comp.tier]}"))
        out.append(_example(f"{lean}.cap = {opt_rat(comp.cap)}"))
        made += 1
    return out


def tier_checks(rng: random.Random, count: int) -> list[str]:
    """Tier meets of two and three tiers, and tier decisions at and around saturation."""
    out: list[str] = []
    tiers = list(TIERS)
    for _ in range(count):
        ts = [rng.choice(tiers) for _ in range(rng.choice((2, 3)))]
        lean = "." + TIERS[ts[-1]].removeprefix("Tier.")
        for t in reversed(ts[:-1]):
            lean = f"(Tier.weakest .{TIERS[t].removeprefix('Tier.')} {lean})"
        out.append(_example(f"{lean} = {TIERS[weakest(*ts)]}"))
    kinds: list[tuple[str, Callable[[], Proof | Restricted | Measurement]]] = [
        ("Evidence.proof", lambda: _proof("WitCert.Contract.comp_sound")),
        ("Evidence.restricted", lambda: Restricted(_proof("WitCert.Contract.comp_sound"),
                                                  subset="e_in <= 1")),
        ("Evidence.measurement", lambda: Measurement("generated", samples=3)),
    ]
    for _ in range(count):
        lean_ev, make = rng.choice(kinds)
        sat = Fraction(rng.choice((1, 2, 4)), rng.choice((1, 2)))
        value = sat + Fraction(rng.randint(-4, 4), 8)
        value = max(value, Fraction(0))
        got = decide_tier(make(), value=float(value), saturation=float(sat))
        out.append(_example(f"Tier.decideTier {lean_ev} (some {rat(value)}) (some {rat(sat)})",
                            TIERS[got]))
    return out


def saturation_checks() -> list[str]:
    """Every metric's saturation, at both sites."""
    out: list[str] = []
    for name in METRICS:
        for site in SITES:
            sat = M.metric_info(py_metric(name, site)).saturation
            lean_sat = "none" if sat is None else f"(some {rat(Fraction(sat))})"
            out.append(_example(f"{lean_metric(name, site)}.saturation = {lean_sat}"))
    return out


def telescope_checks(rng: random.Random, count: int) -> list[str]:
    """Telescoping allowances and their sums, term by term and in closed form."""
    out: list[str] = []
    for _ in range(count):
        delta = Fraction(rng.randint(1, 99), rng.choice((100, 1000, 128)))
        n = rng.randint(0, 12)
        parts = [telescoping_delta(i, delta) for i in range(n)]
        total = sum(parts, Fraction(0))
        spent = telescoping_spent(n, delta)
        if total != spent:  # the library disagrees with itself: fail generation loudly
            raise SystemExit(f"telescoping sum {total} != closed form {spent} (n={n})")
        lean_sum = f"((List.range {n}).map (Ledger.telescopeDelta {rat(delta)})).sum"
        out.append(_example(lean_sum, rat(total)))
        out.append(_example(f"Ledger.spent {rat(delta)} {n} = {rat(spent)}"))
        out.append(_example(f"Ledger.spent {rat(delta)} {n} < {rat(delta)}"))
        for i in sorted({0, n - 1} if n else set()):
            out.append(_example(f"Ledger.telescopeDelta {rat(delta)} {i} = {rat(parts[i])}"))
    return out


def pooling_checks(rng: random.Random, count: int) -> list[str]:
    """The pooling max caliber ``a = ||w||_1`` and the bound it gives on generated errors."""
    out: list[str] = []
    for _ in range(count):
        n = rng.randint(1, 6)
        weights = [Fraction(rng.randint(0, 8), 8) for _ in range(n)]
        errors = [Fraction(rng.randint(-16, 16), 16) for _ in range(n)]
        pool = pooling(M.AtConsume, weights=[float(w) for w in weights])
        a = pool.max.a
        m = max(abs(e) for e in errors)
        name = f"pool{len(out) // 3}"
        pairs = ",\n    ".join(f"({rat(w)}, {rat(e)})"
                                 for w, e in zip(weights, errors, strict=True))
        out.append(f"/-- Weights and errors `{name}`. -/\ndef {name} : List (Rat × Rat) :=\n"
                   f"  [{pairs}]\n")
        out.append(_example(f"({name}.map Prod.fst).sum = {rat(a)}"))
        out.append(_example(f"Bridges.abs (Bridges.dot {name}) ≤ {rat(a)} * {rat(m)}"))
    return out


def selection_checks(rng: random.Random, count: int) -> list[str]:
    """The rank-prefix selection offset ``b = (m_out + m_in) / 2`` on generated supports."""
    out: list[str] = []
    for _ in range(count):
        common = [(Fraction(rng.randint(0, 8), 32), Fraction(rng.randint(0, 8), 32))
                  for _ in range(rng.randint(1, 4))]
        dropped = [Fraction(rng.randint(0, 4), 64) for _ in range(rng.randint(0, 3))]
        added = [Fraction(rng.randint(0, 4), 64) for _ in range(rng.randint(0, 3))]
        m_out, m_in = sum(dropped, Fraction(0)), sum(added, Fraction(0))
        b = rank_prefix_selection(M.AtConsume, m_out=float(m_out), m_in=float(m_in)).b
        name = f"sel{len(out) // 4}"
        sep = ",\n    "
        cl = sep.join(f"({rat(p)}, {rat(q)})" for p, q in common)
        dl = sep.join(f"({rat(p)}, 0)" for p in dropped)
        al = sep.join(f"(0, {rat(q)})" for q in added)
        full = sep.join(x for x in (cl, dl, al) if x)
        out.append(f"/-- Entries kept by both supports in `{name}`. -/\n"
                   f"def {name}Common : List (Rat × Rat) :=\n  [{cl}]\n")
        out.append(f"/-- All entries of `{name}`: common, dropped (`p' = 0`), added (`p = 0`). -/\n"
                   f"def {name}All : List (Rat × Rat) :=\n  [{full}]\n")
        offset = f"Bridges.selectionOffset {rat(m_out)} {rat(m_in)}"
        out.append(_example(f"{offset} = {rat(b)}"))
        out.append(_example(f"Bridges.tv {name}All ≤ {offset} + Bridges.tv {name}Common"))
    return out


# ----------------------------------------------------------------- the bridges' coefficients
#
# Python's bridges evaluate their transfers with mpmath at 50 digits and round upward. To read
# the exact coefficients their code uses (not a retyped literal), that code is run with an
# mpmath stand-in whose numbers are exact rationals and whose ``exp``/``tanh`` record their
# argument and return a chosen rational (the stand-in for the exponential), and with
# ``math.nextafter`` (the upward rounding, a separate soundness step) as the identity. The
# stand-ins are dyadic, so the floats the code passes values through hold them exactly.


_TANH_VALUE = Fraction(1, 2)
"""The ``tanh`` stand-in's value (dyadic, so a float holds it exactly)."""


class _Recorder:
    """The calls of the exponential stand-ins: ``(function, exact argument)``."""

    def __init__(self, exp_values: list[Fraction]) -> None:
        self.calls: list[tuple[str, Fraction]] = []
        self._exp = list(exp_values)

    def take(self, name: str, arg: object) -> Fraction:
        self.calls.append((name, Fraction(arg)))  # type: ignore[arg-type]
        if name == "exp":
            return self._exp.pop(0)
        return _TANH_VALUE  # tanh: the stand-in's value, which the transfer must return


def _fake_mpmath(rec: _Recorder) -> types.SimpleNamespace:
    @contextlib.contextmanager
    def workdps(_digits: int) -> Iterator[None]:
        yield

    return types.SimpleNamespace(
        workdps=workdps, mpf=lambda x: Fraction(x),
        exp=lambda y: rec.take("exp", y), tanh=lambda y: rec.take("tanh", y))


class _MathNoRounding(types.ModuleType):
    """``math`` with ``nextafter`` as the identity (outward rounding removed)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(math, name)

    @staticmethod
    def nextafter(x: float, _to: float) -> float:
        return x


@contextlib.contextmanager
def _exact_exponentials(rec: _Recorder) -> Iterator[None]:
    """Run the library's bridges on the stand-ins (restored afterwards)."""
    saved = (_contracts._mpmath, _contracts.math, _bridges.math)  # type: ignore[attr-defined]
    nomath = _MathNoRounding("math")
    _contracts._mpmath = lambda: _fake_mpmath(rec)  # type: ignore[attr-defined]
    _contracts.math = nomath  # type: ignore[attr-defined]
    _bridges.math = nomath  # type: ignore[attr-defined]
    try:
        yield
    finally:
        (_contracts._mpmath, _contracts.math,  # type: ignore[attr-defined]
         _bridges.math) = saved  # type: ignore[attr-defined]


def _transfer_of(c: Contract[Any, Any]) -> Any:
    """The one stage's transfer, the function ``Contract.bound`` evaluates."""
    stages = c._stages  # the library's own stage: the transfer its bound evaluates
    if len(stages) != 1 or stages[0].transfer is None:
        raise SystemExit(f"{c.name}: expected one stage with a transfer")
    return stages[0].transfer


def _run_transfer(c: Contract[Any, Any], x: Fraction, exp_value: Fraction
                  ) -> tuple[list[tuple[str, Fraction]], Fraction | float]:
    rec = _Recorder([exp_value])
    tr = _transfer_of(c)
    with _exact_exponentials(rec):
        out = tr(float(x))
    return rec.calls, out if math.isinf(out) else Fraction(out)


_INPUTS = (Fraction(1, 8), Fraction(3, 4), Fraction(2), Fraction(5, 16))
_EXPS = (Fraction(9, 8), Fraction(5, 4), Fraction(3, 2), Fraction(17, 16))
# The e-form at large arguments, up to the last one it evaluates (2x = 700; above it the
# transfer saturates): stand-ins whose (e - 1) / 2 a float holds exactly.
_LARGE_INPUTS = (Fraction(4), Fraction(7), Fraction(350))
_LARGE_EXPS = (Fraction(2981), Fraction(1202604), Fraction(2**60 + 1))
_SATURATED = Fraction(351)


def bridge_checks() -> list[str]:
    """The transfer coefficients of the softmax-to-TV bridges, from Python's code path."""
    out: list[str] = []
    site = M.AtConsume
    tanh_rules = (("softmax_tv_tanh_osc", softmax_tv_tanh_osc(site), "Analytic.sharpOscArg"),
                  ("softmax_tv_tanh", softmax_tv_tanh(site), "Analytic.sharpLinfArg"))
    for rule, c, lean in tanh_rules:
        k = _transfer_of(c).k
        out.append(f"-- `bridges.{rule}`: the transfer's parameter k = {k} is the argument "
                   f"of `tanh` at 1.\n" + _example(f"{lean} (1 : Rat) = {rat(k)}"))
        for x in _INPUTS:
            calls, value = _run_transfer(c, x, Fraction(1))
            (name, arg), = calls
            if name != "tanh":
                raise SystemExit(f"{rule}: its transfer evaluated {name}, not tanh")
            # The statement bounds TV by `tanh` of the argument itself: the transfer's value must
            # be the value of `tanh` it evaluated (the stand-in's), nothing scaled or shifted.
            if value != _TANH_VALUE:
                raise SystemExit(f"{rule}: its transfer at {x} returned {value} where its tanh "
                                 f"gave {_TANH_VALUE} (the statement bounds TV by that tanh)")
            out.append(_example(f"{lean} {rat(x)} = {rat(arg)}"))
    for rule, c in (("softmax_tv_eform", softmax_tv_eform(site)),
                    ("selector_mass_eform", selector_mass_eform(site))):
        out.append(f"-- `bridges.{rule}`: `(exp(2x) - 1) / 2` at a rational stand-in for "
                   f"`exp`.\n")
        for x, e in zip(_INPUTS + _LARGE_INPUTS, _EXPS + _LARGE_EXPS, strict=True):
            calls, value = _run_transfer(c, x, e)
            (name, arg), = calls
            if name != "exp" or not isinstance(value, Fraction):
                raise SystemExit(f"{rule}: its transfer evaluated {name}, not exp, or returned "
                                 f"{value} at {x}")
            out.append(_example(f"Analytic.eformArg {rat(x)} = {rat(arg)}"))
            out.append(_example(f"Analytic.eformBridgeCore {rat(e)} = {rat(value)}"))
        calls, value = _run_transfer(c, _SATURATED, Fraction(1))
        if calls or value != math.inf:
            raise SystemExit(f"{rule}: at {_SATURATED} its transfer evaluated {calls} and "
                             f"returned {value}; past 2x = 700 it must saturate (inf)")
    out.append("-- `bridges.softmax_tv_affine`: the slope `exp(2 eps0)` on the domain "
               "`e_in <= eps0`; the library\n-- computes it as `2 (e-form) + 1`, at a "
               "rational stand-in for `exp`.\n")
    for e0, e in zip(_INPUTS[:3], _EXPS[:3], strict=True):
        rec = _Recorder([e])
        with _exact_exponentials(rec):
            c = softmax_tv_affine(site, eps0=float(e0))
        (name, arg), = rec.calls
        if name != "exp":
            raise SystemExit(f"softmax_tv_affine: evaluated {name}, not exp")
        # The statement's slope is `exp (affineSlopeArg ε₀)` on `ε ≤ ε₀`: the contract's slope
        # must be the exponential the code evaluated, and the kernel checks that the code's
        # argument is `affineSlopeArg` of the contract's own cap (the ε₀ of its domain).
        if c.a != e or c.cap is None:
            raise SystemExit(f"softmax_tv_affine(eps0={e0}): slope {c.a} and cap {c.cap}, but "
                             f"the statement's slope is exp({arg}) = {e} (stand-in) on a cap")
        out.append(f"-- eps0 = {e0}: slope {c.a} = the stand-in for exp {arg}, cap {c.cap}.\n"
                   + _example(f"Analytic.affineSlopeArg {rat(c.cap)} = {rat(arg)}"))
    out.append("-- `tv_forms.tv_tanh_max`: `tanh` of the code's argument is at least the proved\n"
               "-- `tanh (sharpLinfArg (max c))` (`tanh` is increasing) when the argument is at "
               "least `sharpLinfArg (max c)`.\n")
    rng = random.Random(SEED + 1)
    for _ in range(4):
        c_row = [Fraction(rng.randint(0, 64), 16) for _ in range(rng.randint(1, 5))]
        arr = np.empty(len(c_row), dtype=object)
        arr[:] = c_row
        arg = Fraction(_tv_forms._tanh_max_arg(arr))  # type: ignore[attr-defined]
        out.append(_example(f"Analytic.sharpLinfArg {rat(max(c_row))} ≤ {rat(arg)}"))
    return out


class _LogOf:
    """``log x`` for an exact rational ``x > 0``: numpy's ufuncs on an object array call these
    methods, so the library's log-domain cores run on exact stand-ins for ``exp``."""

    def __init__(self, x: Fraction) -> None:
        self.x = x

    def __sub__(self, other: _LogOf) -> _LogOf:
        return _LogOf(self.x / other.x)  # log x - log y = log (x / y)

    def __add__(self, other: _LogOf) -> _LogOf:
        return _LogOf(self.x * other.x)  # log x + log y = log (x y)

    def __neg__(self) -> _LogOf:
        return _LogOf(1 / self.x)  # -log x = log (1 / x)

    def expm1(self) -> Fraction:
        return self.x - 1

    def sinh(self) -> Fraction:
        return (self.x - 1 / self.x) / 2


def _objects(*xs: Fraction) -> Any:
    arr = np.empty(len(xs), dtype=object)
    for i, x in enumerate(xs):
        arr[i] = _LogOf(x)
    return arr


_A_PLUS = (Fraction(1), Fraction(9, 8), Fraction(5, 4), Fraction(3, 2), Fraction(33, 32),
           Fraction(2))
_A_MINUS = (Fraction(1), Fraction(7, 8), Fraction(3, 4), Fraction(5, 8), Fraction(31, 32),
            Fraction(1, 2))


# Rows (A, A-, [(p_t, e^{c_t})]) of the retention core: dyadic, so the code's final float
# product is exact; they reach each branch of its min and max (A A- < 1 is no meter's, it
# reaches the one-sided branch).
_RETENTION_ROWS = (
    (Fraction(2), Fraction(1, 2), ((Fraction(1, 2), Fraction(1)), (Fraction(1, 4), Fraction(2)),
                                   (Fraction(1, 4), Fraction(4)))),
    (Fraction(4), Fraction(1), ((Fraction(3, 4), Fraction(1)), (Fraction(1, 4), Fraction(8)))),
    (Fraction(1), Fraction(1, 2), ((Fraction(1, 2), Fraction(1)), (Fraction(1, 2), Fraction(2)))),
    (Fraction(1), Fraction(1), ((Fraction(1), Fraction(1)),)),
)


def meter_checks() -> list[str]:
    """The e-form, two-sided and retention cores, by ``tv_forms``' code path at rational ``A``,
    ``A-`` and ``e^c``."""
    out: list[str] = ["-- `tv_forms._eform_raw(log A)` and `tv_forms._two_sided_raw(log A, "
                      "log A-)` at rational `A`, `A-`.\n"]
    eform = _tv_forms._eform_raw(_objects(*_A_PLUS))  # type: ignore[attr-defined]
    two = _tv_forms._two_sided_raw(_objects(*_A_PLUS),  # type: ignore[attr-defined]
                                   _objects(*_A_MINUS))
    for a, am, e, s in zip(_A_PLUS, _A_MINUS, eform.tolist(), two.tolist(), strict=True):
        out.append(_example(f"Analytic.eformCore {rat(a)} = {rat(Fraction(e))}"))
        out.append(_example(f"Analytic.twoSidedCore {rat(a)} {rat(am)} = {rat(Fraction(s))}"))
    out.append("-- `tv_forms._retention_raw(p, c, log A, log A-)` at rational `A`, `A-`, "
               "`e^c` (tied to\n-- `tv_retention_sound` by `Meters.tv_retention_core_sound`).\n")
    for a, am, terms in _RETENTION_ROWS:
        p = np.empty((1, len(terms)), dtype=object)
        p[0, :] = [pi for pi, _ in terms]
        c = np.empty((1, len(terms)), dtype=object)
        c[0, :] = [_LogOf(x) for _, x in terms]
        raw = _tv_forms._retention_raw(p, c, _objects(a), _objects(am))  # type: ignore[attr-defined]
        value = Fraction(raw[0])
        triples = ",\n      ".join(f"({rat(pi)}, {rat(x)}, {rat(1 / x)})" for pi, x in terms)
        out.append(_example(f"Meters.retentionCore {rat(a)} {rat(am)} [{triples}] = {rat(value)}"))
    return out


# ------------------------------------------------------------------ the fp8 format witnesses

FORMATS = {Fp8Format.E4M3: "Formats.e4m3", Fp8Format.E5M2: "Formats.e5m2"}
ROUNDINGS = {Rounding.TRUNCATE: "false", Rounding.NEAREST: "true"}
FORMAT_SCALES = (Fraction(1), Fraction(3, 16))

DYADIC = '''\
/-- The dyadic rational `n / 2^k`: the format checks write Python's exact values with it. -/
def dy (n : Int) (k : Nat) : Rat := (n : Rat) / ((2 ^ k : Nat) : Rat)

/-- `formats.ETA`, the relative slack of the writer's float32 arithmetic. -/
def formatEta : Rat := {eta}

/-- `formats.EPS`, the absolute slack of a float32 product that underflows. -/
def formatEps : Rat := {eps}
'''


def dyadic(x: Fraction) -> str:
    """``dy n k`` for a dyadic rational ``n / 2^k`` (fails generation for any other)."""
    den = x.denominator
    k = den.bit_length() - 1
    if den != 1 << k:
        raise SystemExit(f"format checks: {x} is not dyadic")
    n = str(x.numerator) if x.numerator >= 0 else f"({x.numerator})"
    return f"dy {n} {k}"


def _list_example(lhs: str, items: list[str]) -> str:
    """``example : lhs = [items] := by decide +kernel``, the list packed within 100 columns."""
    lines: list[str] = []
    line = "      ["
    for i, item in enumerate(items):
        piece = item + ("] := by" if i == len(items) - 1 else ",")
        if len(line) + len(piece) > 100 and line.strip() != "[":
            lines.append(line.rstrip())
            line = "       "
        line += piece + " "
    lines.append(line.rstrip())
    return f"example :\n    {lhs} =\n" + "\n".join(lines) + "\n  decide +kernel\n"


def format_checks() -> list[str]:
    """Every code ``0..255``: its value and step per format, and its witness per format,
    rounding and scale, from ``formats``'s own functions, as whole-list equalities."""
    out: list[str] = [DYADIC.format(eta=dyadic(ETA), eps=dyadic(EPS))]
    codes = range(256)
    for fmt, lean in FORMATS.items():
        out.append(f"-- `{fmt.value}`: mantissa bits, bias and clamping code of "
                   "`formats.Fp8Format`.\n"
                   + _example(f"{lean}.mantissaBits = {fmt.mantissa_bits}"))
        out.append(_example(f"{lean}.bias = {fmt.bias}"))
        out.append(_example(f"{lean}.maxCode = {fmt.max_code}"))
        out.append(_list_example(f"(List.range 256).map (Formats.codeValue {lean})",
                                 [dyadic(code_value(c, fmt)) for c in codes]))
        out.append(_list_example(f"(List.range 256).map (Formats.codeStep {lean})",
                                 [dyadic(code_step(c, fmt)) for c in codes]))
        for rounding, half in ROUNDINGS.items():
            for scale in FORMAT_SCALES:
                ws = [witness_exact(c, fmt, rounding, scale) for c in codes]
                lhs = (f"(List.range 256).map\n      (Formats.witness {lean} {half} "
                       f"({dyadic(scale)}) formatEta formatEps)")
                items = ["none" if w is None else f"some ({dyadic(w)})" for w in ws]
                out.append(f"-- `witness_exact(code, {fmt.name}, {rounding.name}, "
                           f"Fraction({scale}))` for code = 0..255 (`none`: saturated).\n"
                           + _list_example(lhs, items))
    return out


# ------------------------------------------------------------------ Cauchy-Schwarz coefficients


def cauchy_schwarz_checks(rng: random.Random) -> list[str]:
    """The score bridge's and the decompression bridge's slopes, the pooling l2 caliber and the
    witness logit bound ``c``, by the library's own code, against the coefficients of the
    statements that prove them (``score_bridge_sound``, ``pooling_l2_caliber``,
    ``logit_bound_sound``). Rational inputs with exact square roots, so each check is exact."""
    out = ["-- `bridges.score_bridge`, `decompression_bridge`: `score_bridge_sound` bounds the "
           "squared\n-- error by `s * s * (‖q‖² ‖d‖²)`, so the slope `a` must satisfy "
           "`a * a = s * s * (q * q)`.\n"]
    for _ in range(4):
        sc, q = Fraction(rng.randint(1, 16), 16), Fraction(rng.randint(0, 64), 8)
        a = score_bridge(M.AtConsume, scale=float(sc), q_norm_max=float(q)).a
        out.append(_example(f"{rat(a)} * {rat(a)} = {rat(sc)} * {rat(sc)} * ({rat(q)} * {rat(q)})"))
        r = Fraction(rng.randint(0, 64), 8)
        a = decompression_bridge(M.AtConsume, row_norm_max=float(r)).a
        out.append(_example(f"{rat(a)} * {rat(a)} = 1 * 1 * ({rat(r)} * {rat(r)})"))
    out.append("-- `bridges.pooling(...).l2`: `pooling_l2_caliber` bounds the squared pooled "
               "error by\n-- `(Σ w²) (Σ e²)`, so the caliber `a` (rounded up) must satisfy "
               "`Σ w² ≤ a * a`.\n")
    for i in range(4):
        ws = [Fraction(rng.randint(0, 8), 8) for _ in range(rng.randint(1, 6))]
        a = pooling(M.AtConsume, weights=[float(w) for w in ws]).l2.a
        items = ", ".join(rat(w) for w in ws)
        out.append(f"/-- Pooling weights `poolL2{i}`. -/\ndef poolL2{i} : List Rat :=\n"
                   f"  [{items}]\n")
        out.append(f"example :\n    (poolL2{i}.map fun w => w * w).sum ≤\n      {rat(a)} *\n"
                   f"        {rat(a)} := by\n  decide +kernel\n")
    out.append("-- `witness.logit_bound`: `logit_bound_sound` bounds `|s ⟨q, r_t⟩|` by `s * Σ_b "
               "‖q_b‖ w_tb`;\n-- query bands (one RoPE pair each) with exact norms `n_b`, so "
               "the code's `c_t` must be at least\n-- `s * Σ_b n_b w_tb`.\n")
    triples = ((3, 4, 5), (5, 12, 13), (8, 15, 17), (0, 0, 0), (7, 24, 25), (20, 21, 29))
    for i in range(3):
        picks = [triples[rng.randrange(len(triples))] for _ in range(rng.randint(1, 4))]
        k = Fraction(1, 2 ** rng.randint(0, 4))
        q = [Fraction(x) * k for t in picks for x in t[:2]]
        norms = [Fraction(t[2]) * k for t in picks]
        sc = Fraction(1, 2 ** rng.randint(1, 4))
        w = [[Fraction(rng.randint(0, 32), 16) for _ in picks] for _ in range(2)]
        c = logit_bound(np.array([float(x) for x in q]),
                        np.array([[float(x) for x in row] for row in w]),
                        layout=RopeLayout.INTERLEAVED, scale=float(sc)).values
        for (x, y, _), n in zip(picks, norms, strict=True):
            out.append(_example(f"{rat(Fraction(x) * k)} * {rat(Fraction(x) * k)} + "
                                f"{rat(Fraction(y) * k)} * {rat(Fraction(y) * k)} = "
                                f"{rat(n)} * {rat(n)}"))
        for j, (row, ct) in enumerate(zip(w, c.tolist(), strict=True)):
            pairs = ", ".join(f"({rat(n)}, {rat(wb)})" for n, wb in zip(norms, row, strict=True))
            name = f"logitRow{i}{j}"
            out.append(f"/-- Band norms and witnesses `{name}`. -/\ndef {name} : "
                       f"List (Rat × Rat) :=\n  [{pairs}]\n")
            out.append(_example(f"{rat(sc)} * ({name}.map fun e => e.1 * e.2).sum ≤ "
                                f"{rat(Fraction(ct))}"))
    return out


# ------------------------------------------------------------------ the output-error contract


def output_checks(rng: random.Random) -> list[str]:
    """``output_bound.output_error_contract`` against ``output_error_bound_vector_sound``:
    the slope is ``2 M`` exactly and the offset at least ``Σ_t q_t ρ_t``."""
    out = ["-- `output_bound.output_error_contract`: `output_error_bound_vector_sound` bounds the "
           "output\n-- error by `2 * TV * M + Σ q ρ`: slope `a = 2 * M`, offset `b ≥ Σ q ρ`.\n"]
    for i in range(4):
        n = rng.randint(1, 5)
        cuts = sorted(rng.sample(range(1, 16), n - 1))
        q = [Fraction(b - a, 16) for a, b in zip([0, *cuts], [*cuts, 16], strict=True)]
        rho = [Fraction(rng.randint(0, 16), 32) for _ in range(n)]
        m = Fraction(rng.randint(0, 64), 8)
        k = output_error_contract(value_norm_max=float(m), p_tilde=np.array([float(x) for x in q]),
                                  rho=np.array([float(x) for x in rho]))
        name = f"outRow{i}"
        pairs = ",\n    ".join(f"({rat(a)}, {rat(r)})" for a, r in zip(q, rho, strict=True))
        out.append(f"/-- Weights and value errors `{name}`. -/\ndef {name} : List (Rat × Rat) :="
                   f"\n  [{pairs}]\n")
        out.append(_example(f"{rat(k.a)} = 2 * {rat(m)}"))
        out.append(_example(f"({name}.map fun e => e.1 * e.2).sum ≤ {rat(k.b)}"))
    return out


# ------------------------------------------------------------------ outward rounding


def rounding_checks() -> list[str]:
    """``rounding.outward`` with real margins, and ``rounding.add_up``, at float points: each
    reported value is at least the exact ``y (1 + gamma) + alpha`` (the rule's claim), resp. the
    exact sum, as rationals the kernel compares."""
    out = ["-- `rounding.outward(y, gamma, alpha)` is at least the exact `y * (1 + gamma) + "
           "alpha`,\n-- with the margins of `tv_margin(4)` and `tanh_margin()`.\n"]
    points = (1 / 3, 0.7, 123456.789, 2.0**-1060)
    for margin in (tv_margin(4), tanh_margin()):
        for y in points:
            v = float(outward(np.array([y]), gamma=margin.gamma, alpha=margin.alpha)[0])
            out.append(_example(f"({dyadic(Fraction(y))}) * (1 + {dyadic(Fraction(margin.gamma))})"
                                f" + {dyadic(Fraction(margin.alpha))} ≤ {dyadic(Fraction(v))}"))
    out.append("-- `rounding.add_up(a, b)` is at least the exact `a + b`.\n")
    for a, b in ((1.0, 2.0**-60), (0.1, 0.2), (1e16, 1.0), (1 / 3, 2 / 3)):
        v = float(add_up(np.array([a]), np.array([b]))[0])
        out.append(_example(f"{dyadic(Fraction(a))} + {dyadic(Fraction(b))} ≤ "
                            f"{dyadic(Fraction(v))}"))
    return out


def log_a_checks() -> None:
    """``tv_forms``' ``log A`` and ``log A-`` at float inputs against 50-digit evaluations of
    the statements' ``A = Σ p e^c`` and ``A- = Σ p e^-c`` (both branches: ``log1p`` of the
    ``expm1`` sum, and the log-sum-exp where it overflows or cancels), and the retention form
    ``½ Σ p min(A e^c - 1, max(e^c / A- - 1, 1 - e^-c / A))`` (``tv_retention_sound``) from
    them. ``exp`` has no Lean definition to evaluate, so this check is Python's own, at high
    precision; it raises ``SystemExit`` (failing the sync check) on a relative error above
    ``2^-40``."""
    rows = (([0.5, 0.25, 0.25], [1e-8, 0.5, 3.0]), ([0.75, 0.25], [2.0, 0.0]),
            ([0.5, 0.5], [800.0, 1.0]), ([0.125] * 8, [0.1 * i for i in range(8)]),
            ([0.5, 0.5], [40.0, 60.0]))
    forms: Any = _tv_forms  # the module's private cores, run as the meters run them
    with mpmath.workdps(50):
        for p, c in rows:
            pa, ca = np.array(p), np.array(c)
            terms = [(mpmath.mpf(pi), mpmath.mpf(ci)) for pi, ci in zip(p, c, strict=True)]
            a = mpmath.fsum(pi * mpmath.exp(ci) for pi, ci in terms)
            am = mpmath.fsum(pi * mpmath.exp(-ci) for pi, ci in terms)
            la, lm = forms._log_a_plus(pa, ca), forms._log_a_minus(pa, ca)
            checks = [("_log_a_plus", la, mpmath.log(a), "log A"),
                      ("_log_a_minus", lm, mpmath.log(am), "log A-")]
            if max(c) <= 100:  # past it e^c overflows float64: the retention form is inf there
                checks.append(("_retention_raw", forms._retention_raw(pa, ca, la, lm),
                               mpmath.mpf(1) / 2 * mpmath.fsum(
                                   pi * min(a * mpmath.exp(ci) - 1,
                                            max(mpmath.exp(ci) / am - 1, 1 - mpmath.exp(-ci) / a))
                                   for pi, ci in terms), "retention form"))
            for name, value, want, what in checks:
                got = float(value)
                if abs(mpmath.mpf(got) - want) > mpmath.mpf(2) ** -40 * max(1, abs(want)):
                    raise SystemExit(f"tv_forms.{name} at p = {p}, c = {c}: {got}, but the "
                                     f"statement's {what} is {mpmath.nstr(want, 17)} "
                                     "(50 digits)")


VALUE_CHECKS: tuple[tuple[str, str, str], ...] = (
    ("Series composition", "`Contract.__rshift__`: slope, offset, delta, tier, propagated cap",
     "`Contract.comp` and its fields `a`, `b`, `delta`, `tier`, `cap`"),
    ("Tier meets and decisions", "`tiers.weakest`, `tiers.decide_tier`",
     "`Tier.weakest`, `Tier.decideTier`"),
    ("Metric saturations", "`metrics.metric_info` saturations", "`Metric.saturation`"),
    ("Telescoping budget", "`budget.telescoping_delta`, `budget.telescoping_spent`",
     "`Ledger.telescopeDelta`, `Ledger.spent`"),
    ("Pooling, max caliber", "`bridges.pooling(...).max`", "`Bridges.dot`, `Bridges.abs`"),
    ("Rank-prefix selection", "`bridges.rank_prefix_selection` offset",
     "`Bridges.selectionOffset`"),
    ("Softmax-to-TV bridges: transfer coefficients",
     "the transfers of `softmax_tv_tanh_osc`, `softmax_tv_tanh` (argument and value), "
     "`softmax_tv_eform`, `selector_mass_eform` (to `2x = 700`, saturation past it), "
     "`softmax_tv_affine` (slope and cap), `tv_forms._tanh_max_arg`",
     "`Analytic.sharpOscArg`, `sharpLinfArg`, `eformArg`, `eformBridgeCore`, "
     "`affineSlopeArg`"),
    ("Meters: the e-form and two-sided cores", "`tv_forms._eform_raw`, `_two_sided_raw`, "
     "`_retention_raw`", "`Analytic.eformCore`, `twoSidedCore`, `Meters.retentionCore`"),
    ("Formats: fp8 witnesses", "`formats.code_value`, `code_step`, `witness_exact`, every "
     "code", "`Formats.codeValue`, `codeStep`, `witness`"),
    ("Cauchy-Schwarz coefficients: slopes, l2 caliber, logit bound",
     "`bridges.score_bridge`, `decompression_bridge` slopes, `pooling(...).l2`, "
     "`witness.logit_bound`",
     "the coefficients of `score_bridge_sound`, `pooling_l2_caliber`, `logit_bound_sound`"),
    ("Outward rounding", "`rounding.outward` with `tv_margin`, `tanh_margin`; `rounding.add_up`",
     "exact `y (1 + gamma) + alpha` and `a + b` over `Rat`"),
    ("The output-error contract", "`output_bound.output_error_contract`: slope and offset",
     "the coefficients of `output_error_bound_vector_sound`"),
)
"""Each section of the generated file: its title, the Python code it runs, the Lean
definitions it is compared with (formal/README.md lists them, with each section's count)."""


def generate() -> str:
    """The complete generated file, deterministic for the fixed seed."""
    rng = random.Random(SEED)
    blocks: list[str] = [HEADER.format(seed=SEED), METER_TIES.format()]
    items_of = [
        composition_checks(rng, 18),
        tier_checks(rng, 16),
        saturation_checks(),
        telescope_checks(rng, 8),
        pooling_checks(rng, 6),
        selection_checks(rng, 6),
        bridge_checks(),
        meter_checks(),
        format_checks(),
        cauchy_schwarz_checks(random.Random(SEED + 2)),
        rounding_checks(),
        output_checks(random.Random(SEED + 3)),
    ]
    sections = [(title, items) for (title, _, _), items
                in zip(VALUE_CHECKS, items_of, strict=True)]
    for title, items in sections:
        blocks.append(f"/-! ### {title} -/\n")
        blocks.extend(items)
    blocks.append("end\n\nend WitCert.GeneratedChecks\n")
    return "\n".join(blocks)


def main(argv: list[str] | None = None) -> int:
    """Write the file, or with ``--check`` report whether the committed copy is stale."""
    ap = argparse.ArgumentParser(description="Generate the Lean kernel checks of Python values.")
    ap.add_argument("--check", action="store_true", help="exit 1 if the file is stale")
    args = ap.parse_args(argv)
    text = generate()
    current = TARGET.read_text(encoding="utf-8") if TARGET.exists() else ""
    stale = current != text
    if args.check and stale:
        print(f"{TARGET} is stale: run python scripts/gen_lean_checks.py", file=sys.stderr)
        diff = list(difflib.unified_diff(current.splitlines(), text.splitlines(),
                                         "committed", "regenerated", n=1, lineterm=""))
        print("\n".join(diff[:60]), file=sys.stderr)
        if len(diff) > 60:
            print(f"... ({len(diff) - 60} more diff lines)", file=sys.stderr)
    # after the diff: a drifted formula is reported by both
    log_a_checks()
    margin_checks()
    if args.check:
        return 1 if stale else 0
    TARGET.write_text(text, encoding="utf-8")
    print(f"wrote {TARGET} ({text.count('decide +kernel')} kernel checks)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
