"""The rounding margins against the error bounds they claim, evaluated exactly at adversarial points.

A margin function of :mod:`witcert_calculus.numerics.rounding` claims that the float64
evaluation of one formula lies within ``gamma |v| + alpha`` of the exact value ``v`` of the same
formula at the same float inputs; :func:`~witcert_calculus.numerics.rounding.outward` relies on
that claim. Floating-point rounding has no model in the Lean development (its statements are
over ordered fields), so these claims are not Lean theorems: each is checked here by evaluating
the formula in 50-digit arithmetic (``mpmath``) at float inputs chosen where float evaluation
loses most (cancelling ``expm1`` sums over thousands of tokens, the log-sum-exp branches, a
distribution with one tiny weight, arguments of ``tanh`` near 0, near ``tanh = 1/2`` and near
saturation), and comparing with what the library's own code computes (the raw forms of
:mod:`witcert_calculus.meters.tv_forms`, before the outward step). A margin made smaller than
the error it must cover (``0``, for instance) fails: the float forms are off by a few units of
the last place at these points.

:data:`MARGIN_CHECKS` names each margin, the Python code it covers and how it is checked
(``formal/README.md`` lists them); :func:`margin_checks` runs them and raises ``SystemExit`` with
the offending point (``scripts/gen_lean_checks.py`` runs it, so the fast sync check fails).
"""

from __future__ import annotations

from typing import Any

import mpmath
import numpy as np

from witcert_calculus.meters import tv_forms as _tv_forms
from witcert_calculus.numerics.rounding import tanh_margin, tv_margin

SEED = 20261206

MARGIN_CHECKS: tuple[tuple[str, str, str], ...] = (
    ("`rounding.tv_margin(S)`",
     "`tv_forms._eform_raw`, `_two_sided_raw`, `_retention_raw` from `_log_a_plus`, "
     "`_log_a_minus`",
     "50-digit `(A² - 1) / 2`, `(A / A- - A- / A) / 2` and the retention form, "
     "`A = 1 + Σ p (e^c - 1)` at the same float `p`, `c`; error at most "
     "`gamma (1 + abs(log A) + abs(log A-) + max c) abs(v) + alpha`"),
    ("`rounding.tanh_margin()`", "`np.tanh` as `tv_forms._tanh_max` calls it",
     "50-digit `tanh x`; error at most `gamma abs(v) + alpha`"),
)
"""Each margin checked: its name, the Python code it covers, the exact evaluation it is
compared with."""


def _tv_rows() -> list[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]]:
    """Weights and logit bounds where the TV forms lose most in float64."""
    rng = np.random.default_rng(SEED)
    rows = []
    for size, scale in ((4096, 1e-9), (4096, 1e-3), (1024, 0.05), (64, 1.0), (16, 3.0)):
        p = rng.dirichlet(np.ones(size))
        rows.append((p, rng.uniform(0.0, scale, size)))
    flat = np.full(2048, 1.0 / 2048)
    rows.append((flat, np.full(2048, 1e-12)))                     # A - 1 cancels to ~1e-12
    rows.append((np.array([1.0 - 2.0**-40, 2.0**-40]), np.array([0.0, 30.0])))  # tiny weight
    rows.append((np.array([0.5, 0.5]), np.array([710.0, 1.0])))   # log-sum-exp branch of A
    rows.append((np.array([0.25, 0.75]), np.array([40.0, 0.5])))  # log-sum-exp branch of A-
    return rows


def _check(name: str, where: str, got: float, want: Any, bound: Any) -> None:
    err = abs(mpmath.mpf(got) - want)
    if err > bound:
        raise SystemExit(f"{name} at {where}: the float value {got!r} is "
                         f"{mpmath.nstr(err, 5)} from the 50-digit {mpmath.nstr(want, 17)}, "
                         f"more than the margin's {mpmath.nstr(bound, 5)}")


def _tv_margin_checks() -> int:
    forms: Any = _tv_forms  # the module's private cores, run as the meters run them
    count = 0
    for p, c in _tv_rows():
        la, lm = forms._log_a_plus(p, c), forms._log_a_minus(p, c)
        margin = tv_margin(p.shape[-1])
        gamma = mpmath.mpf(margin.gamma) * (1 + abs(mpmath.mpf(float(la))) +
                                            abs(mpmath.mpf(float(lm))) + mpmath.mpf(c.max()))
        terms = [(mpmath.mpf(pi), mpmath.mpf(ci)) for pi, ci in zip(p.tolist(), c.tolist(),
                                                                     strict=True)]
        # A = 1 + sum p (e^c - 1), the sum the meters evaluate (p as given, its float sum a few
        # units of the last place from 1)
        a = 1 + mpmath.fsum(pi * mpmath.expm1(ci) for pi, ci in terms)
        am = 1 + mpmath.fsum(pi * mpmath.expm1(-ci) for pi, ci in terms)
        wants = [("_eform_raw", forms._eform_raw(la), (a * a - 1) / 2),
                 ("_two_sided_raw", forms._two_sided_raw(la, lm), (a / am - am / a) / 2)]
        if c.max() <= 100:  # past it e^c overflows float64: the retention form is inf there
            wants.append(("_retention_raw", forms._retention_raw(p, c, la, lm),
                          mpmath.fsum(pi * min(a * mpmath.exp(ci) - 1,
                                               max(mpmath.exp(ci) / am - 1,
                                                   1 - mpmath.exp(-ci) / a))
                                      for pi, ci in terms) / 2))
        for form, got, want in wants:
            if not np.isfinite(got):
                continue  # an infinite bound is reported as it is, never rounded
            _check(f"tv_margin({p.shape[-1]}) for tv_forms.{form}",
                   f"S = {p.shape[-1]}, max c = {float(c.max())!r}", float(got), want,
                   gamma * abs(want) + mpmath.mpf(margin.alpha))
            count += 1
    return count


def _tanh_margin_checks() -> int:
    rng = np.random.default_rng(SEED + 1)
    xs = np.concatenate([rng.uniform(0.0, 1e-6, 64), rng.uniform(0.5, 0.6, 256),
                         rng.uniform(0.0, 4.0, 256), rng.uniform(15.0, 19.5, 64)])
    margin = tanh_margin()
    t = np.tanh(xs)
    for x, got in zip(xs.tolist(), t.tolist(), strict=True):
        want = mpmath.tanh(mpmath.mpf(x))
        _check("tanh_margin() for np.tanh", f"x = {x!r}", got, want,
               mpmath.mpf(margin.gamma) * abs(want) + mpmath.mpf(margin.alpha))
    return int(xs.size)


def margin_checks() -> int:
    """Run every check of :data:`MARGIN_CHECKS`; the number of points checked.

    Raises:
        SystemExit: a float value farther from the 50-digit value than its margin allows,
            naming the margin, the form and the point.
    """
    with mpmath.workdps(50):
        return _tv_margin_checks() + _tanh_margin_checks()


if __name__ == "__main__":
    print(f"margin checks: {margin_checks()} points within their margins")
