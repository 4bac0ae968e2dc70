"""Gate-law inverses: the largest witness that keeps a softmax-to-TV bridge at or below ``tau``.

An acceptance gate admits a cache entry when its certified TV bound is at most ``tau``. Each
softmax-to-TV bridge is an increasing function of its witness, so the gate is equivalent to
a threshold on the witness itself, which a kernel can test without evaluating the bridge:

- e-form (``TV <= (e^{2 eps} - 1) / 2``, Lean ``WitCert.Analytic.softmax_tv_eform_sound``):
  ``eps* = 1/2 ln(1 + 2 tau)``;
- oscillation form (``TV <= tanh(osc / 4)``, ``WitCert.Analytic.softmax_tv_tanh_sound``):
  ``osc* = 4 atanh(tau)`` (``tau < 1``);
- sup-norm form (``TV <= tanh(eps / 2)``, the same theorem with ``osc = 2 eps``):
  ``eps* = 2 atanh(tau)``;
- affine form (``TV <= e^{2 eps0} eps`` on ``eps <= eps0``,
  ``WitCert.Analytic.softmax_tv_affine_sound``): ``eps* = min(eps0, tau e^{-2 eps0})``.

At ``tau = 0.2``: ``eps* = 0.1682361...`` (e-form), ``osc* = 0.8109302...``. Each threshold
is evaluated with 50-digit arithmetic and rounded *down* to a float, and then checked
against the forward bridge evaluated the same way: a witness at the threshold never gives a
bound above ``tau``. ``tau >= 1`` (TV's saturation) admits everything for the tanh forms,
which never reach 1: their threshold is ``inf``.

Main declarations: :class:`GateForm`, :func:`gate_threshold`, :func:`gate_bound` (the forward
bridge, for checking).
"""

from __future__ import annotations

import enum
import math
from typing import Any, final

from witcert_calculus.errors import InvalidValueError
from witcert_calculus.numerics.validation import real

__all__ = ["GateForm", "gate_bound", "gate_form", "gate_threshold"]

_DPS = 50


def _mp() -> Any:  # mpmath ships no type information
    import mpmath

    return mpmath


@final
class GateForm(enum.Enum):
    """The softmax-to-TV bridge a gate inverts."""

    EFORM = "eform"
    """``(e^{2 eps} - 1) / 2``, the witness a sup-norm logit error ``eps``."""
    OSC = "osc"
    """``tanh(osc / 4)``, the witness the logit error's oscillation ``osc``."""
    TANH = "tanh"
    """``tanh(eps / 2)``, the witness a sup-norm logit error ``eps``."""
    AFFINE = "affine"
    """``e^{2 eps0} eps`` on ``eps <= eps0``."""


def gate_form(form: GateForm | str) -> GateForm:
    """The :class:`GateForm` named by ``form`` (a member or its value).

    Raises:
        InvalidValueError: ``form`` names no form.
    """
    try:
        return form if isinstance(form, GateForm) else GateForm(form)
    except ValueError:
        raise InvalidValueError("form", form,
                                f"must be one of {[f.value for f in GateForm]}") from None


def _exact_bound(form: GateForm, x: Any, eps0: Any) -> Any:
    mp = _mp()
    if form is GateForm.EFORM:
        return (mp.exp(2 * x) - 1) / 2
    if form is GateForm.OSC:
        return mp.tanh(x / 4)
    if form is GateForm.TANH:
        return mp.tanh(x / 2)
    if x > eps0:
        return mp.inf  # outside the affine bridge's domain: no bound
    return mp.exp(2 * eps0) * x


def _eps0(form: GateForm, eps0: float | None) -> Any:
    if form is not GateForm.AFFINE:
        if eps0 is not None:
            raise InvalidValueError("eps0", eps0, "is a parameter of the affine form only")
        return None
    if eps0 is None:
        raise InvalidValueError("eps0", eps0, "the affine form needs its domain cap eps0 > 0")
    return _mp().mpf(real("eps0", eps0, lo=0.0, lo_open=True))


def gate_bound(witness: float, *, form: GateForm | str, eps0: float | None = None) -> float:
    """The forward bridge at ``witness``, rounded up: the TV bound a gate compares with tau.

    Example:
        >>> round(gate_bound(0.1682361, form="eform"), 6)
        0.2
    """
    f = gate_form(form)
    w = real("witness", witness, lo=0.0)
    mp = _mp()
    with mp.workdps(_DPS):
        val = _exact_bound(f, mp.mpf(w), _eps0(f, eps0))
        if mp.isinf(val):
            return math.inf
        out = float(val)
        if mp.mpf(out) < val:
            out = math.nextafter(out, math.inf)
        return out


def gate_threshold(tau: float, *, form: GateForm | str, eps0: float | None = None) -> float:
    """The largest witness whose bridge bound is at most ``tau``, rounded down.

    Args:
        tau: the gate's TV threshold, ``> 0``.
        form: the bridge (:class:`GateForm` or its value: ``"eform"``, ``"osc"``, ``"tanh"``,
            ``"affine"``).
        eps0: the affine form's domain cap (only for ``"affine"``).

    Returns:
        A float threshold; ``inf`` for a tanh form at ``tau >= 1`` (it never exceeds 1).

    Raises:
        InvalidValueError: a non-positive or NaN ``tau``, an unknown form, or ``eps0`` given
            to a form without one (or missing for the affine form).

    Example:
        >>> round(gate_threshold(0.2, form="eform"), 7), round(gate_threshold(0.2, form="osc"), 7)
        (0.1682361, 0.8109302)
    """
    f = gate_form(form)
    t = real("tau", tau, lo=0.0, lo_open=True)
    e0 = _eps0(f, eps0)
    mp = _mp()
    with mp.workdps(_DPS):
        tt = mp.mpf(t)
        if f is GateForm.EFORM:
            val = mp.log1p(2 * tt) / 2
        elif f in (GateForm.OSC, GateForm.TANH):
            if tt >= 1:
                return math.inf
            val = (4 if f is GateForm.OSC else 2) * mp.atanh(tt)
        else:
            val = min(e0, tt * mp.exp(-2 * e0))
        out = float(val)
        if mp.mpf(out) > val:
            out = math.nextafter(out, 0.0)
        # the soundness direction, checked: the threshold's own bound is at most tau
        while out > 0 and _exact_bound(f, mp.mpf(out), e0) > tt:
            out = math.nextafter(out, 0.0)
        return out
