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

import contextlib
import math
from collections.abc import Iterator
from fractions import Fraction
from types import ModuleType
from typing import Any

import mpmath
import numpy as np

from witcert_calculus.meters import dither as _dither
from witcert_calculus.meters import eviction as _eviction
from witcert_calculus.meters import formats as _formats
from witcert_calculus.meters import output_bound as _output_bound
from witcert_calculus.meters import tv_forms as _tv_forms
from witcert_calculus.meters import witness as _witness
from witcert_calculus.meters.witness import RopeLayout
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
    ("`rounding.band_norm_margin(size)`", "`witness._band_norms_upper` (scaled band norms)",
     "50-digit `sqrt(Σ_c x_c²)` per band; error at most `gamma v + alpha amax + TINY`"),
    ("`rounding.logit_margin(bands, scale)`",
     "`witness.logit_bound`, `formats.format_logit_bound`",
     "exact `scale Σ_b w_b n_b` at the same float band norms `n_b` (or `abs(q_c)`)"),
    ("`rounding.sum_margin(terms)`", "`output_bound._sum_upper`", "exact `Σ_t p_t ρ_t`"),
    ("`rounding.variance_margin(d, blocks, scale)`", "`dither.dither_variance_proxy`",
     "exact `scale² Σ_c q_c² s_{t,c}² / 12` from `DitheredKeys.channel_scales`"),
    ("`rounding.grid_mean_margin(d, blocks, scale)`", "`dither.dither_mean_offset`",
     "exact `scale Σ_c abs(q_c) s_{t,c} 2^-25` from `DitheredKeys.channel_scales`"),
    ("`rounding.radius_margin()`", "`dither.subgaussian_radius`",
     "50-digit `sqrt(2 v log(2 S / delta))`"),
    ("`rounding.norm_margin(size)`", "`eviction._norm_up` (a query's norm, a key's distance "
     "to its stored center)", "50-digit `sqrt(Σ_c x_c²)`"),
    ("`rounding.dot_margin(d + 3)`", "`eviction._dropped_logit_up`",
     "exact `scale (q.c + min(‖q‖₁ h, ‖q‖₂ r))` from the float inputs: the float bound is not "
     "below it"),
    ("`rounding.eviction_margin(S, B)`", "`eviction.dropped_mass_batch` (its log-sum-exps and "
     "`_mass_raw`)", "50-digit `U / (Z_K + U)`, `U = Σ_b n_b e^{u_b}`, `Z_K = Σ_t e^{s_t}` at the "
     "same float `u`, `s`; error at most `gamma (1 + abs(log U) + abs(log Z_K)) abs(v) + alpha`"),
)
"""Each margin checked: its name, the Python code it covers, the exact evaluation it is
compared with. The torch ports' ``dot_margin`` and ``cast_margin`` are not evaluated here (they
need torch); the kernels' tests compare those ports with the numpy meters above."""


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


@contextlib.contextmanager
def _raw(module: ModuleType) -> Iterator[list[tuple[Any, Any, Any, Any]]]:
    """Run ``module``'s code with its outward step recording ``(value, gamma, alpha, exact)``
    and returning the value unchanged: the float evaluation before the margin is applied."""
    calls: list[tuple[Any, Any, Any, Any]] = []
    real = getattr(module, "outward")

    def record(value: Any, *, gamma: Any, alpha: Any, exact: Any = None) -> Any:
        calls.append((np.asarray(value, dtype=np.float64), gamma, alpha, exact))
        return value

    setattr(module, "outward", record)
    try:
        yield calls
    finally:
        setattr(module, "outward", real)


def _entries(name: str, where: str, call: tuple[Any, Any, Any, Any], wants: list[Any]) -> int:
    """Each recorded value against its exact value, within the recorded margins."""
    value, gamma, alpha, exact = call
    shape = value.shape
    g = np.broadcast_to(np.asarray(gamma, dtype=np.float64), shape).reshape(-1)
    al = np.broadcast_to(np.asarray(alpha, dtype=np.float64), shape).reshape(-1)
    ex = (np.zeros(shape, dtype=bool) if exact is None
          else np.broadcast_to(np.asarray(exact), shape)).reshape(-1)
    count = 0
    for i, (got, want) in enumerate(zip(value.reshape(-1).tolist(), wants, strict=True)):
        if ex[i]:
            if mpmath.mpf(got) != want:
                raise SystemExit(f"{name} at {where}, entry {i}: marked exact, but {got!r} is "
                                 f"not the exact {mpmath.nstr(want, 17)}")
            continue
        _check(name, f"{where}, entry {i}", got, want,
               mpmath.mpf(float(g[i])) * abs(want) + mpmath.mpf(float(al[i])))
        count += 1
    return count


def _exact(x: float) -> Any:
    return mpmath.mpf(Fraction(x).numerator) / Fraction(x).denominator


def _witness_margin_checks(rng: np.random.Generator) -> int:
    count = 0
    for d, bands, spread in ((64, 8, 1e-3), (128, 16, 1e3), (128, 4, 1.0)):
        q = rng.standard_normal(d) * np.exp(rng.uniform(-8, 8, d)) * spread
        w = np.abs(rng.standard_normal((32, bands))) * 1e-2
        with _raw(_witness) as calls:
            _witness.logit_bound(q, w, layout=RopeLayout.HALF_SPLIT, scale=1 / math.sqrt(d))
        (norms, *_), logit = calls
        perm, starts, _ = _witness._band_order(d, bands, RopeLayout.HALF_SPLIT)
        bounds = list(starts.tolist()) + [d]
        xq = q[perm]
        want_norms = [mpmath.sqrt(mpmath.fsum(_exact(x) ** 2 for x in xq[a:b].tolist()))
                      for a, b in zip(bounds, bounds[1:])]
        count += _entries(f"band_norm_margin({d // bands})", f"d = {d}, bands = {bands}",
                          calls[0], want_norms)
        s = _exact(1 / math.sqrt(d))
        count += _entries(f"logit_margin({bands})", f"witness.logit_bound, d = {d}", logit,
                          [s * mpmath.fsum(_exact(wi) * _exact(ni)
                                           for wi, ni in zip(row, norms.tolist()))
                           for row in w.tolist()])
    q = rng.standard_normal(64)
    w = np.abs(rng.standard_normal((16, 64))) * np.exp(rng.uniform(-20, 0, (16, 64)))
    with _raw(_formats) as calls:
        _formats.format_logit_bound(q, w, scale=0.125)
    count += _entries("logit_margin(64)", "formats.format_logit_bound", calls[0],
                      [_exact(0.125) * mpmath.fsum(_exact(wi) * abs(_exact(qi))
                                                  for wi, qi in zip(row, q.tolist()))
                       for row in w.tolist()])
    return count


def _sum_margin_checks(rng: np.random.Generator) -> int:
    count = 0
    for n in (3, 257, 4096):
        p = rng.dirichlet(np.ones(n))
        r = np.abs(rng.standard_normal(n)) * np.exp(rng.uniform(-30, 5, n))
        with _raw(_output_bound) as calls:
            _output_bound._sum_upper(p, r)
        count += _entries(f"sum_margin({n})", "output_bound._sum_upper", calls[0],
                          [mpmath.fsum(_exact(a) * _exact(b)
                                       for a, b in zip(p.tolist(), r.tolist()))])
    return count


def _dither_margin_checks(rng: np.random.Generator) -> int:
    count = 0
    d, block = 64, 16
    x = rng.standard_normal((24, d)) * np.exp(rng.uniform(-6, 6, (24, 1)))
    stored = _dither.dither_quantize(x, key=_dither.DitherKey(1, 2, 3), tokens=np.arange(24),
                                     block_size=block, layout=RopeLayout.HALF_SPLIT,
                                     outlier_pairs=np.array([3]))
    s = stored.channel_scales()
    for spread in (1e-4, 1.0, 1e4):
        q = rng.standard_normal(d) * spread
        sc = 1 / math.sqrt(d)
        with _raw(_dither) as calls:
            _dither.dither_variance_proxy(q, stored, scale=sc)
            _dither.dither_mean_offset(q, stored, scale=sc)
        e_sc = _exact(sc)
        count += _entries("variance_margin", f"dither_variance_proxy, spread = {spread}",
                          calls[0], [e_sc * e_sc * mpmath.fsum(
                              _exact(qc) ** 2 * _exact(st) ** 2
                              for qc, st in zip(q.tolist(), row)) / 12 for row in s.tolist()])
        count += _entries("grid_mean_margin", f"dither_mean_offset, spread = {spread}",
                          calls[1], [e_sc * mpmath.fsum(
                              abs(_exact(qc)) * _exact(st) for qc, st in zip(q.tolist(), row))
                              * mpmath.mpf(2) ** -25 for row in s.tolist()])
    v = np.abs(rng.standard_normal(64)) * np.exp(rng.uniform(-40, 10, 64))
    for dl, n in ((0.05, 64), (1e-12, 10**6)):
        with _raw(_dither) as calls:
            _dither.subgaussian_radius(v, delta_loc=dl, tokens=n)
        count += _entries("radius_margin", f"subgaussian_radius, delta = {dl}", calls[0],
                          [mpmath.sqrt(2 * _exact(vi) * mpmath.log(2 * n / _exact(dl)))
                           for vi in v.tolist()])
    return count


def _eviction_margin_checks(rng: np.random.Generator) -> int:
    count = 0
    ev: Any = _eviction  # the module's private cores, run as the meter runs them
    for d, kept, dropped, spread, lift in ((64, 4096, 512, 1.0, 0.0), (64, 16, 2048, 3.0, 2.0),
                                          (128, 300, 40, 1e-3, 0.0), (16, 2, 3, 30.0, -5.0)):
        keys = rng.standard_normal((dropped, d)) * spread
        q = rng.standard_normal((3, d)) + lift
        s = rng.standard_normal((3, kept)) * spread * 4
        block = rng.integers(0, max(1, dropped // 4), dropped)
        w = _eviction.evict_witness(keys, np.ones((dropped, 1)), block,
                                    blocks=int(block.max()) + 1)
        with _raw(_eviction) as calls:
            _eviction.dropped_mass_batch(q, s, w, scale=1 / math.sqrt(d))
        norm_call, final = calls[0], calls[-1]
        count += _entries(f"norm_margin({d})", f"eviction._norm_up, d = {d}", norm_call,
                          [mpmath.sqrt(mpmath.fsum(_exact(x) ** 2 for x in row))
                           for row in q.tolist()])
        u = ev._dropped_logit_up(q, w, 1 / math.sqrt(d))
        sc = _exact(1 / math.sqrt(d))
        qn = [mpmath.sqrt(mpmath.fsum(_exact(x) ** 2 for x in row)) for row in q.tolist()]
        for i, row in enumerate(q.tolist()):
            q1 = mpmath.fsum(abs(_exact(x)) for x in row)
            for b in range(w.count.shape[-1]):
                if w.count[b] == 0:
                    continue
                want = sc * (mpmath.fsum(_exact(x) * _exact(c) for x, c in
                                         zip(row, w.center[b].tolist()))
                             + min(q1 * _exact(float(w.linf[b])),
                                   qn[i] * _exact(float(w.radius[b]))))
                if mpmath.mpf(float(u[i, b])) < want:
                    raise SystemExit(f"dot_margin for eviction._dropped_logit_up, d = {d}, row "
                                     f"{i}, block {b}: the float bound {float(u[i, b])!r} is "
                                     f"below the exact {mpmath.nstr(want, 17)}")
                count += 1
        wants = []
        for i in range(3):
            big_u = mpmath.fsum(_exact(float(w.count[b])) * mpmath.exp(_exact(float(u[i, b])))
                                for b in range(w.count.shape[-1]) if w.count[b] > 0)
            z = mpmath.fsum(mpmath.exp(_exact(x)) for x in s[i].tolist())
            wants.append(big_u / (z + big_u))
        count += _entries(f"eviction_margin({kept}, {w.count.shape[-1]})",
                          f"eviction.dropped_mass_batch, d = {d}", final, wants)
    return count


def margin_checks() -> int:
    """Run every check of :data:`MARGIN_CHECKS`; the number of points checked.

    Raises:
        SystemExit: a float value farther from the 50-digit value than its margin allows,
            naming the margin, the form and the point.
    """
    with mpmath.workdps(50):
        rng = np.random.default_rng(SEED + 2)
        return (_tv_margin_checks() + _tanh_margin_checks() + _witness_margin_checks(rng)
                + _sum_margin_checks(rng) + _dither_margin_checks(rng)
                + _eviction_margin_checks(rng))


if __name__ == "__main__":
    print(f"margin checks: {margin_checks()} points within their margins")
