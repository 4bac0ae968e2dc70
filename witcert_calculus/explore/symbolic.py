"""Symbolic chains: a composed contract as a sympy expression of its stages' parameters.

:func:`symbolic_chain` writes a contract's bound as an expression in the input error ``x``
and one symbol per stage parameter (``a_i``, ``b_i``, and ``k_i`` for a ``tanh`` transfer),
composed exactly as :meth:`~witcert_calculus.contracts.Contract.bound` composes the stages:
each stage gives ``Min(a_i y + b_i, T_i(y))`` of the previous stage's output ``y`` (or the
affine part alone), and the reported value is clamped to the output metric's saturation.
A notebook can then differentiate the chain, substitute other parameters, find where it
saturates (:func:`saturation_point`) and invert it (:func:`invert`). :func:`gate_law` gives
the closed-form gate-law inverse of each softmax-to-TV bridge as an expression in ``tau``
(``eps* = log(1 + 2 tau)/2``, ``osc* = 4 atanh(tau)``, ...), which the tests check against the
solved forward bridge and against :func:`witcert_calculus.explore.gate_laws.gate_threshold`.

The numeric chain stays the authority: :meth:`Contract.bound` evaluates in 50-digit
arithmetic and rounds up, and :meth:`SymbolicChain.value` agrees with it to float rounding
(tested). This module imports sympy, which ``import witcert_calculus`` never loads: the
package imports it on first use.

Main declarations: :class:`SymbolicChain`, :func:`symbolic_chain`, :func:`gate_law`,
:func:`invert`, :func:`saturation_point`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, final

import sympy

from witcert_calculus.contracts import Contract, Stage, TransferKind
from witcert_calculus.errors import InvalidValueError
from witcert_calculus.explore.gate_laws import GateForm, gate_form
from witcert_calculus.metrics import metric_info
from witcert_calculus.numerics.validation import nonneg_real

# sympy's own annotations are partial; its expressions are typed ``Any`` here.
sp: Any = sympy
Expr = Any
Symbol = Any
Rational = Any

__all__ = ["SymbolicChain", "forward_law", "gate_law", "invert", "saturation_point", "symbolic_chain"]


def _rational(v: Fraction) -> Rational:
    return sp.Rational(v.numerator, v.denominator)


@final
@dataclass(frozen=True, eq=False)
class SymbolicChain:
    """A contract's bound as a sympy expression.

    Attributes:
        x: the input error symbol (nonnegative).
        expr: the composed bound before clamping, in ``x`` and the parameter symbols.
        params: each parameter symbol's exact value in the contract.
        saturation: the output metric's saturation (``None``: it does not saturate).
        cap: the domain's upper end (``None``: unbounded).
        stages: the stage names, in order (parameter ``a_i`` belongs to ``stages[i - 1]``).
        limit: the bound's limit as ``x`` grows without end (``oo`` when unbounded),
            composed stage by stage from each stage's own limit.
    """

    x: Symbol
    expr: Expr
    params: dict[Symbol, Rational] = field(repr=False)
    saturation: Rational | None
    cap: Rational | None
    stages: tuple[str, ...]
    limit: Expr

    @property
    def reported(self) -> Expr:
        """The reported bound: :attr:`expr` clamped to the saturation."""
        if self.saturation is None:
            return self.expr
        return sp.Min(self.expr, self.saturation)

    def numeric(self, *, reported: bool = True) -> Expr:
        """The bound with every parameter replaced by its value: a function of ``x`` only."""
        e = self.reported if reported else self.expr
        return e.subs(self.params)

    def value(self, e_in: float | Fraction) -> float:
        """The reported bound at ``e_in``, evaluated with 30 digits (for checks and plots).

        Raises:
            InvalidValueError: ``e_in`` is negative, not finite, or above the domain's cap.
        """
        x = nonneg_real("e_in", e_in)
        if self.cap is not None and sp.Rational(Fraction(x)) > self.cap:
            raise InvalidValueError("e_in", e_in, f"lies above the chain's domain cap {self.cap}")
        return float(self.numeric().subs(self.x, sp.Rational(Fraction(x))).evalf(30))


def _stage_expr(i: int, s: Stage, y: Expr, lim: Expr, params: dict[Symbol, Rational],
                saturation: Fraction | None) -> tuple[Expr, Expr]:
    # The stage applied to the previous output ``y``, and to its limit ``lim`` (numeric).
    # ``saturation`` is given for the last stage: a constant affine part at or above it says
    # nothing (the reported value is clamped there anyway), so only the transfer is kept.
    a, b = sp.Symbol(f"a_{i}", nonnegative=True), sp.Symbol(f"b_{i}", nonnegative=True)
    params[a], params[b] = _rational(s.a), _rational(s.b)
    affine = a * y + b
    affine_lim = params[b] if s.a == 0 else params[a] * lim + params[b]
    if s.transfer is None:
        return affine, affine_lim
    if s.transfer.kind is TransferKind.EXP_TV:
        tight: Expr = (sp.exp(2 * y) - 1) / 2
        tight_lim: Expr = (sp.exp(2 * lim) - 1) / 2
    elif s.transfer.kind is TransferKind.POLY:
        cs = [sp.Symbol(f"c_{i}_{j}", nonnegative=True) for j in range(len(s.transfer.coeffs))]
        for c, value in zip(cs, s.transfer.coeffs, strict=True):
            params[c] = _rational(value)
        tight = sum((c * y ** j for j, c in enumerate(cs)), sp.Integer(0))
        tight_lim = sum((params[c] * lim ** j for j, c in enumerate(cs)), sp.Integer(0))
    else:
        k = sp.Symbol(f"k_{i}", positive=True)
        params[k] = _rational(s.transfer.k)
        tight, tight_lim = sp.tanh(k * y), sp.tanh(params[k] * lim)
    if saturation is not None and s.a == 0 and s.b >= saturation:
        del params[a], params[b]
        return tight, tight_lim
    return sp.Min(affine, tight), sp.Min(affine_lim, tight_lim)


def symbolic_chain(contract: Contract[Any, Any]) -> SymbolicChain:
    """The contract's bound as a sympy expression of ``x`` and its stages' parameters.

    Example:
        >>> from witcert_calculus import AtConsume, score_bridge, softmax_tv_eform
        >>> c = score_bridge(AtConsume, scale=1, q_norm_max=2) >> softmax_tv_eform(AtConsume)
        >>> s = symbolic_chain(c)
        >>> s.expr
        exp(2*a_1*x + 2*b_1)/2 - 1/2
        >>> round(s.value(0.1), 6)
        0.245912
    """
    x = sp.Symbol("x", nonnegative=True)
    params: dict[Symbol, Rational] = {}
    y: Expr = x
    lim: Expr = sp.oo
    sat = metric_info(contract.m_out).saturation
    parts = contract.parts
    for i, s in enumerate(parts, 1):
        last = None if i < len(parts) or sat is None else Fraction(sat)
        y, lim = _stage_expr(i, s, y, lim, params, last)
    return SymbolicChain(x=x, expr=y, params=params,
                         saturation=None if sat is None else sp.Rational(Fraction(sat)),
                         cap=None if contract.cap is None else _rational(contract.cap),
                         stages=contract.stages, limit=lim)


_TAU = sp.Symbol("tau", positive=True)
_EPS0 = sp.Symbol("eps0", positive=True)


def gate_law(form: GateForm | str) -> tuple[Expr, Symbol]:
    """The gate-law inverse of a softmax-to-TV bridge as an expression in ``tau``.

    Returns ``(threshold, tau)``: the largest witness whose bound is at most ``tau``, valid
    for ``0 < tau < 1`` (the tanh forms) or ``tau > 0`` (e-form, affine; the affine form's
    expression also holds the symbol ``eps0``, its domain cap).

    Example:
        >>> law, tau = gate_law("eform")
        >>> law
        log(2*tau + 1)/2
        >>> round(float(law.subs(tau, sp.Rational(1, 5))), 7)
        0.1682361
    """
    f = gate_form(form)
    if f is GateForm.EFORM:
        return sp.log(1 + 2 * _TAU) / 2, _TAU
    if f is GateForm.OSC:
        return 4 * sp.atanh(_TAU), _TAU
    if f is GateForm.TANH:
        return 2 * sp.atanh(_TAU), _TAU
    return sp.Min(_EPS0, _TAU * sp.exp(-2 * _EPS0)), _TAU


def forward_law(form: GateForm | str) -> tuple[Expr, Symbol]:
    """The bridge a gate law inverts, as an expression in its witness ``w``."""
    f = gate_form(form)
    w = sp.Symbol("w", nonnegative=True)
    if f is GateForm.EFORM:
        return (sp.exp(2 * w) - 1) / 2, w
    if f is GateForm.OSC:
        return sp.tanh(w / 4), w
    if f is GateForm.TANH:
        return sp.tanh(w / 2), w
    return sp.exp(2 * _EPS0) * w, w


def invert(expr: Expr, x: Symbol, level: Expr, *,
           probe: Expr = sp.Rational(1, 5)) -> Expr:
    """The real solution ``x >= 0`` of ``expr = level`` for an increasing ``expr`` (sympy ``solve``).

    sympy may return complex branches (``log`` of a negative number) beside the real one; the
    real branch is chosen by evaluating each candidate with every free symbol of ``level`` set
    to ``probe``.

    Raises:
        InvalidValueError: no candidate, or more than one, is real and nonnegative there.
    """
    at = {v: probe for v in level.free_symbols}
    sols: list[Any] = []
    for sol in sp.solve(sp.Eq(expr, level), x):
        v = complex(sp.N(sol.subs(at), 30))
        if abs(v.imag) <= 1e-25 * max(1.0, abs(v.real)) and v.real >= 0:
            sols.append(sol)
    if len(sols) != 1:
        raise InvalidValueError("expr", expr, f"has {len(sols)} real nonnegative solutions of "
                                f"= {level} in {x}, expected one")
    return sp.simplify(sols[0])


def saturation_point(chain: SymbolicChain, *, digits: int = 30) -> float | None:
    """The smallest input at which the chain's bound reaches its saturation.

    ``None`` when it never does: the metric does not saturate, or the bound's limit at
    infinity is at most the saturation while the bound at 0 is below it (a ``tanh``
    transfer approaches 1 and never reaches it). Found by bisection on the
    monotone bound to ``digits`` significant digits, then rounded up to a float.

    Example:
        >>> from witcert_calculus import AtConsume, softmax_tv_eform
        >>> p = saturation_point(symbolic_chain(softmax_tv_eform(AtConsume)))
        >>> round(p, 7)  # log(3)/2, where (e^{2x} - 1)/2 = 1
        0.5493061
    """
    if chain.saturation is None:
        return None
    f = chain.numeric(reported=False)
    sat = chain.saturation
    if f.subs(chain.x, 0).evalf(digits + 5) >= sat:
        return 0.0
    # A nonconstant bound whose limit is the saturation only approaches it (a tanh form).
    if chain.limit <= sat:
        return None
    lo, hi = sp.Integer(0), sp.Integer(1)
    while f.subs(chain.x, hi).evalf(digits) < sat:
        lo, hi = hi, 2 * hi
    tol = sp.Rational(1, 10 ** digits)
    while hi - lo > tol * hi:
        mid = (lo + hi) / 2
        if f.subs(chain.x, mid).evalf(digits + 5) >= sat:
            hi = mid
        else:
            lo = mid
    return math.nextafter(float(hi), math.inf)
