#!/usr/bin/env python3
"""Adversarial soak of the WitCert meters: per-query soundness checks, counted and printed.

Every trial is one query (one layer, head and step) with its own compressed
attention ``p_tilde``, per-token bounds ``c`` and a logit error ``eps`` with
``|eps_t| <= c_t``; the true TV is the exact TV between ``p_tilde`` and
``p ∝ p_tilde e^{-eps}``. Each bound is compared with the truth *per trial*,
never in aggregate. The truth is computed in float64 with cancellation-free
formulas; every trial whose float truth comes within 1e-9 (relative) of its
bound is re-decided on the very same float inputs at 100 digits (mpmath; the
logit bound with exact Fractions), and only that decision counts as a violation
(margin: 1e-60 relative plus 1e-90 of the quantity's scale, above the 100-digit
noise that turns an exact zero into ~1e-102).

Adversarial families: extreme sign patterns (all +c, all -c, alternating, light
tokens boosted and heavy ones suppressed, random subsets, random), flat /
random / peaked / two-level ``p_tilde``, ``c`` from 1e-10 to 800 (overflow), ``c``
concentrated on light tokens (where the e-form is tight), massive-activation
channels and Cauchy-Schwarz-aligned residuals for the logit bound.

Bounds soaked: the TV forms (e-form, two-sided, retention, meter, tanh_max), the
output error bound (with the exact TV and with the meter as input), the per-band
logit bound, the Tier-B event ``|eps_t| <= u_t`` (probabilistic: failures are
counted against ``delta_loc * trials``), the sentinel rounds and the rate bound.

Usage::

    python scripts/soak_meters.py                 # 1,000,000 trials per bound
    python scripts/soak_meters.py --trials 20000  # the CI subset
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Final

import mpmath as mp
import numpy as np
from numpy.typing import NDArray

from witcert_calculus.meters import dispersion
from witcert_calculus.meters.dither import DitheredKeys, DitherKey, dither_dequantize, dither_quantize, \
    dither_variance_proxy, subgaussian_radius
from witcert_calculus.meters.sentinels import rate_upper_bound, sentinel_rounds
from witcert_calculus.meters.tv_forms import tv_bounds_batch
from witcert_calculus.meters.witness import RopeLayout, band_channels, band_witness, logit_bound

F64 = NDArray[np.float64]
TVBoundFn = Callable[[F64, F64], F64]

RECHECK_REL: Final = 1e-9  # float truths are accurate to ~1e-12 relative; recheck anything closer
MP_DPS: Final = 100
MP_REL: Final = mp.mpf("1e-60")  # 100-digit evaluation noise is ~1e-95 relative
MP_ABS: Final = mp.mpf("1e-90")  # in units of the quantity's scale (1 for TV, max||v|| for y)
CHUNK: Final = 20000


@dataclass(frozen=True, slots=True)
class SoakResult:
    """Counts of one bound's soak."""

    name: str
    trials: int
    rechecked: int
    violations: int
    worst_ratio: float  # max over trials of truth / bound (float, for information)
    note: str = ""

    def line(self) -> str:
        extra = f"  {self.note}" if self.note else ""
        return (f"{self.name:<34} trials={self.trials:>9,d}  rechecked_exactly={self.rechecked:>7,d}"
                f"  violations={self.violations:>3d}  max(truth/bound)={self.worst_ratio:.9g}{extra}")


def _tv_forms() -> dict[str, TVBoundFn]:
    def pick(field: str) -> TVBoundFn:
        def fn(p: F64, c: F64) -> F64:
            out: F64 = getattr(tv_bounds_batch(p, c), field)
            return out
        return fn
    return {name: pick(name) for name in ("eform", "two_sided", "retention", "meter", "tanh_max")}


TV_BOUNDS: Final[Mapping[str, TVBoundFn]] = _tv_forms()


def dispersion_unsound(p: F64, c: F64) -> F64:
    """The unsound dispersion shape, batched; for showing that the soak catches it."""
    return dispersion._dispersion_raw(p, c)  # pyright: ignore[reportPrivateUsage]


# ----------------------------------------------------------------------------- generators

def _softmax_rows(z: F64) -> F64:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    out: F64 = e / e.sum(axis=1, keepdims=True)
    return out


def tv_cases(rng: np.random.Generator, n: int,
             sizes: tuple[int, ...] = (1, 2, 3, 5, 8, 17, 64, 256)) -> tuple[F64, F64, F64]:
    """n adversarial (p_tilde, c, eps) queries of one random length S."""
    s = int(rng.choice(sizes))
    shape = rng.integers(0, 4)
    if shape == 0:  # flat
        z = np.zeros((n, s))
    elif shape == 1:  # random, any temperature
        z = rng.normal(size=(n, s)) * rng.choice([0.1, 1.0, 5.0, 20.0])
    elif shape == 2:  # peaked
        z = rng.normal(size=(n, s))
        z[np.arange(n), rng.integers(0, s, size=n)] += rng.uniform(5, 60, size=n)
    else:  # two-level: k heavy tokens, the rest tiny
        k = rng.integers(0, s + 1, size=(n, 1))
        z = np.where(np.arange(s)[None, :] < k, 0.0, -rng.uniform(1, 40, size=(n, 1)))
    p = _softmax_rows(z)
    cmax = float(rng.choice([1e-10, 1e-3, 0.05, 0.5, 2.0, 5.0, 50.0, 800.0]))
    cshape = rng.integers(0, 4)
    c = rng.uniform(0, cmax, size=(n, s))
    if cshape == 1:  # one token only
        c = np.zeros((n, s))
        c[np.arange(n), rng.integers(0, s, size=n)] = cmax
    elif cshape == 2:  # on light tokens (the e-form's tight regime)
        c = np.where(p < np.median(p, axis=1, keepdims=True), cmax, 0.0)
    elif cshape == 3:  # constant
        c = np.full((n, s), cmax)
    pattern = rng.integers(0, 6)
    if pattern == 0:
        sign = np.ones((n, s))
    elif pattern == 1:
        sign = -np.ones((n, s))
    elif pattern == 2:
        sign = np.where(np.arange(s) % 2 == 0, 1.0, -1.0)[None, :].repeat(n, 0)
    elif pattern == 3:  # boost light tokens (eps = -c raises p), suppress heavy ones
        sign = np.where(p < np.median(p, axis=1, keepdims=True), -1.0, 1.0)
    elif pattern == 4:  # a random subset boosted, the rest suppressed (extreme points)
        sign = np.where(rng.random((n, s)) < rng.random((n, 1)), -1.0, 1.0)
    else:
        sign = rng.uniform(-1, 1, size=(n, s))
    eps: F64 = sign * c
    return p, c, eps


# ----------------------------------------------------------------------------- truths

def true_tv(p: F64, eps: F64) -> tuple[F64, F64]:
    """TV(p_tilde, p) per row in float64, relative-accurate; also p - p_tilde.

    With the offset ``r = eps_k`` of the heaviest token ``k`` and ``delta = r - eps``,
    ``p_t / p_tilde_t = e^{delta_t} / (1 + B)``, ``B = sum_t p_tilde_t expm1(delta_t)``
    (weights normalized by division only, so every rounding is relative), and
    ``p_t - p_tilde_t = p_tilde_t expm1(delta_t - log1p(B))``. ``1 + B >= p_tilde_k``,
    so ``log1p`` never loses the result; a log-sum-exp takes over when ``expm1`` overflows.
    """
    rows = np.arange(p.shape[0])
    pn = p / p.sum(axis=1, keepdims=True)
    r = eps[rows, pn.argmax(axis=1)]
    delta = r[:, None] - eps
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        b = np.where(pn > 0, pn * np.expm1(delta), 0.0).sum(axis=1)
        logpn = np.where(pn > 0, np.log(np.where(pn > 0, pn, 1.0)), -np.inf)
        x = logpn + delta
        m = x.max(axis=1)
        lse = m + np.log(np.exp(x - m[:, None]).sum(axis=1))
        log_z = np.where(np.isfinite(b), np.log1p(b), lse)
        y = delta - log_z[:, None]  # log(p_t / p_tilde_t)
        diff = np.where(y < 700, pn * np.expm1(y), np.exp(logpn + y))
        diff = np.where(pn > 0, diff, 0.0)
    tv: F64 = 0.5 * np.abs(diff).sum(axis=1)
    return tv, diff


def _mp_true_tv(p: F64, eps: F64) -> mp.mpf:
    """Exact-input TV at 100 digits: 1/2 sum p_t |e^{-eps_t} T - Z| / (Z T)."""
    with mp.workdps(MP_DPS):
        ps = [mp.mpf(float(x)) for x in p]
        e = [mp.exp(-mp.mpf(float(x))) for x in eps]
        t = mp.fsum(ps)
        z = mp.fsum(pi * ei for pi, ei in zip(ps, e))
        return mp.fsum(pi * abs(ei * t - z) for pi, ei in zip(ps, e)) / (2 * z * t)


def _exceeds(truth: mp.mpf, bound: float, scale: float = 1.0) -> bool:
    """Violation iff the 100-digit truth exceeds the float bound beyond 100-digit noise.

    The noise of a 100-digit evaluation is ~1e-95 of the quantity's scale; exact
    zeros (e.g. a constant eps) come back as ~1e-102. The generators produce no
    true value below 1e-50 other than exact zeros, so the margins hide nothing.
    """
    with mp.workdps(MP_DPS):
        b = mp.mpf(bound)
        return bool(truth > b * (1 + MP_REL) + MP_ABS * mp.mpf(scale))


# ----------------------------------------------------------------------------- soaks

def _chunks(trials: int) -> Iterator[int]:
    return _chunks_of(trials, CHUNK)


def _chunks_of(trials: int, size: int) -> Iterator[int]:
    left = trials
    while left > 0:
        n = min(size, left)
        yield n
        left -= n


def soak_tv(trials: int, rng: np.random.Generator,
            bounds: Mapping[str, TVBoundFn] = TV_BOUNDS) -> list[SoakResult]:
    """Soak TV bounds: each trial checks every bound against the exact TV of that query."""
    counts = {name: [0, 0, 0.0] for name in bounds}
    batch = max(1, min(CHUNK, trials // 50 or 1))
    done = 0
    while done < trials:
        n = min(batch, trials - done)
        p, c, eps = tv_cases(rng, n)
        truth, _ = true_tv(p, eps)
        for name, fn in bounds.items():
            bound = fn(p, c)
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = np.where(bound > 0, truth / bound, np.where(truth > 0, np.inf, 0.0))
            counts[name][2] = max(float(counts[name][2]), float(np.nanmax(ratio)))
            near = np.nonzero(truth >= bound * (1 - RECHECK_REL))[0]
            for i in near:
                counts[name][0] += 1
                if _exceeds(_mp_true_tv(p[i], eps[i]), float(bound[i])):
                    counts[name][1] += 1
        done += n
    return [SoakResult(f"tv.{name}", trials, int(v[0]), int(v[1]), float(v[2]))
            for name, v in counts.items()]


def soak_output(trials: int, rng: np.random.Generator) -> list[SoakResult]:
    """||y - y_hat|| <= 2 TV max||v|| + sum p_tilde rho with adversarially aligned values."""
    res = {"exact_tv": [0, 0, 0.0], "meter": [0, 0, 0.0]}
    dv = 4
    for n in _chunks_of(trials, 2000):
        p, c, eps = tv_cases(rng, n, sizes=(1, 2, 3, 5, 8, 17, 33))
        s = p.shape[1]
        tv, diff = true_tv(p, eps)
        v = rng.normal(size=(n, s, dv)) * 0.1
        v[:, :, 0] += np.sign(diff) * rng.uniform(0.5, 3, size=(n, 1))
        noise = rng.normal(size=(n, s, dv))
        rho = rng.uniform(0, 0.3, size=(n, s)) * (rng.random((n, 1)) < 0.7)
        v_hat = v + noise / np.linalg.norm(noise, axis=2, keepdims=True) * rho[:, :, None]
        rho_up = np.linalg.norm(v - v_hat, axis=2) * (1 + 1e-12)
        vmax = np.linalg.norm(v, axis=2).max(axis=1) * (1 + 1e-12)
        # y - y_hat = sum (p - p_tilde) v + sum p_tilde (v - v_hat)
        err = np.linalg.norm((diff[:, :, None] * v).sum(1)
                             + (p[:, :, None] * (v - v_hat)).sum(1), axis=1)
        base = (p * rho_up).sum(axis=1) * (1 + 1e-12)
        for key, tv_in in (("exact_tv", tv * (1 + 1e-9)),
                           ("meter", tv_bounds_batch(p, c).meter)):
            bound = 2.0 * np.minimum(1.0, tv_in) * vmax + base
            ratio = np.where(bound > 0, err / np.where(bound > 0, bound, 1.0), 0.0)
            res[key][2] = max(float(res[key][2]), float(ratio.max()))
            for i in np.nonzero(err >= bound * (1 - RECHECK_REL))[0]:
                res[key][0] += 1
                scale = float(max(np.abs(v[i]).max(), np.abs(v_hat[i]).max()))
                if _exceeds(_mp_output_err(p[i], eps[i], v[i], v_hat[i]), float(bound[i]), scale):
                    res[key][1] += 1
    return [SoakResult(f"output_error_bound[{k}]", trials, int(v[0]), int(v[1]), float(v[2]))
            for k, v in res.items()]


def _mp_output_err(p: F64, eps: F64, v: F64, v_hat: F64) -> mp.mpf:
    """||y - y_hat|| at 100 digits: sum (p - p_tilde) v + sum p_tilde (v - v_hat), with
    p - p_tilde = p_t (e^{-eps_t} T - Z) / (Z T) (exactly 0 when eps = 0)."""
    with mp.workdps(MP_DPS):
        ps = [mp.mpf(float(x)) for x in p]
        e = [mp.exp(-mp.mpf(float(x))) for x in eps]
        t = mp.fsum(ps)
        z = mp.fsum(pi * ei for pi, ei in zip(ps, e))
        diff = [pi * (ei * t - z) / (z * t) for pi, ei in zip(ps, e)]
        comps = [mp.fsum(diff[k] * mp.mpf(float(v[k, j]))
                         + ps[k] / t * (mp.mpf(float(v[k, j])) - mp.mpf(float(v_hat[k, j])))
                         for k in range(len(ps))) for j in range(v.shape[1])]
        return mp.sqrt(mp.fsum(x * x for x in comps))


def soak_logit(trials: int, rng: np.random.Generator) -> list[SoakResult]:
    """|scale <q, r_t>| <= c_t per token; massive channels and band-aligned residuals."""
    rechecked = violations = 0
    worst = 0.0
    d, s = 64, 8
    per_batch = 2000
    done = 0
    while done < trials:
        n = min(per_batch, trials - done)  # n queries, each with s tokens -> n*s checks
        layout = RopeLayout.INTERLEAVED if rng.random() < 0.5 else RopeLayout.HALF_SPLIT
        bands = int(rng.choice([1, 2, 4, 8, 32]))
        scale = d ** -0.5
        if True:
            q = rng.normal(size=(n, d)) * 10.0 ** rng.uniform(-3, 3, size=(n, 1))
            r = rng.normal(size=(n, s, d)) * 10.0 ** rng.uniform(-8, 2, size=(n, s, 1))
            massive = rng.random(n) < 0.3
            ch = rng.integers(0, d, size=n)
            q[massive, ch[massive]] *= 1e4
            r[massive, :, ch[massive]] *= 1e4
            # one token of 5% of the queries: r_t = alpha * q (Cauchy-Schwarz is tight)
            aligned = np.zeros((n, s), dtype=bool)
            aligned[rng.random(n) < 0.05, 0] = True
            alpha = rng.uniform(-2, 2, size=(n, s, 1))
            r = np.where(aligned[:, :, None], alpha * q[:, None, :], r)
            w = band_witness(r.reshape(n * s, d), bands=bands, layout=layout).reshape(n, s, -1)
            for i in range(n):
                c = logit_bound(q[i], w[i], layout=layout, scale=scale).values
                truth = np.abs(scale * (r[i] @ q[i]))
                with np.errstate(divide="ignore", invalid="ignore"):
                    ratio = np.where(c > 0, truth / c, 0.0)
                worst = max(worst, float(ratio.max()))
                for t in np.nonzero(truth >= c * (1 - RECHECK_REL))[0]:
                    rechecked += 1
                    dot = sum((Fraction(float(a)) * Fraction(float(b))
                               for a, b in zip(q[i], r[i, t])), Fraction(0))
                    if abs(dot) * Fraction(scale) > Fraction(float(c[t])):
                        violations += 1
        done += n
    return [SoakResult("logit_bound", trials, rechecked, violations, worst,
                       note=f"({s} tokens per trial, each checked)")]


def soak_tier_b(trials: int, rng: np.random.Generator, *, delta_loc: float = 1e-3
                ) -> list[SoakResult]:
    """Tier B: the joint event |eps_t| <= u_t over a query's tokens, and TV on that event."""
    s, d = 16, 16
    failures = rechecked = violations = 0
    worst = 0.0
    request = int(rng.integers(0, 2**63))
    for n in _chunks(trials):
        x = rng.normal(size=(n * s, d)) * 10.0 ** rng.uniform(-2, 2, size=(n * s, 1))
        x[:, int(rng.integers(d))] *= float(rng.choice([1.0, 50.0]))  # a massive channel
        stored = dither_quantize(x, key=DitherKey(request, 0, 0), tokens=np.arange(n * s),
                                 block_size=8, layout=RopeLayout.HALF_SPLIT)
        request += 1
        x_hat = dither_dequantize(stored)
        q = rng.normal(size=(n, d)) * rng.choice([0.3, 3.0, 30.0])
        scale = d ** -0.5
        s_ch = stored.channel_scales().reshape(n, s, d)
        var = (scale * scale) * ((q[:, None, :] ** 2) * s_ch * s_ch).sum(axis=2) / 12.0
        u = np.sqrt(2.0 * var * math.log(2.0 * s / delta_loc))
        exact_logit = scale * np.einsum("nsd,nd->ns", x.reshape(n, s, d), q)
        comp_logit = scale * np.einsum("nsd,nd->ns", x_hat.reshape(n, s, d), q)
        eps = comp_logit - exact_logit  # compressed = exact + eps
        held = (np.abs(eps) <= u).all(axis=1)
        failures += int((~held).sum())
        p = _softmax_rows(comp_logit)
        truth, _ = true_tv(p, eps)
        bound = tv_bounds_batch(p, u).eform
        with np.errstate(divide="ignore", invalid="ignore"):
            worst = max(worst, float(np.where(held & (bound > 0), truth / bound, 0.0).max()))
        for i in np.nonzero(held & (truth >= bound * (1 - RECHECK_REL)))[0]:
            rechecked += 1
            if _exceeds(_mp_true_tv(p[i], eps[i]), float(bound[i])):
                violations += 1
    # spot-check that the batched proxy equals the public function on the last chunk
    one = dither_variance_proxy(q[0], _slice(stored, 0, s), scale=scale)
    assert np.allclose(one, var[0], rtol=1e-12), "variance proxy mismatch"
    assert np.allclose(subgaussian_radius(one, delta_loc=delta_loc), u[0], rtol=1e-12)
    note = (f"event failures={failures} (allowed <= delta_loc*trials = {delta_loc * trials:g}); "
            "violations counted on trials where the event held")
    return [SoakResult("tier_b.eform_on_event", trials, rechecked, violations, worst, note)]


def _slice(stored: DitheredKeys, start: int, stop: int) -> DitheredKeys:
    return DitheredKeys(payload=stored.payload[start:stop], scales=stored.scales[start:stop],
                        outlier_pairs=stored.outlier_pairs,
                        outlier_values=stored.outlier_values[start:stop],
                        tokens=stored.tokens[start:stop], key=stored.key,
                        block_size=stored.block_size, layout=stored.layout)


def soak_sentinel(trials: int, rng: np.random.Generator) -> list[SoakResult]:
    """q^n <= delta for n = sentinel_rounds(...), decided at 60 digits; also minimality."""
    violations = nonminimal = 0
    with mp.workdps(60):
        for _ in range(trials):
            m = int(10 ** rng.uniform(0, 7))
            b = int(rng.integers(1, m + 1)) if rng.random() < 0.5 else 1
            r = int(10 ** rng.uniform(0, 3))
            dl = float(10 ** rng.uniform(-15, -0.01))
            n = sentinel_rounds(b, m, r, dl)
            if b == m:
                continue
            log_q = r * mp.log(mp.mpf(m - b) / m)
            if n * log_q > mp.log(dl):
                violations += 1
            if n > 1 and (n - 1) * log_q <= mp.log(dl):
                nonminimal += 1
    return [SoakResult("sentinel_rounds", trials, trials, violations, 0.0,
                       note=f"non-minimal={nonminimal}")]


def soak_rate(trials: int, rng: np.random.Generator) -> list[SoakResult]:
    """(1 - b)^n <= delta at b = rate_upper_bound(n, delta), decided at 60 digits."""
    violations = 0
    with mp.workdps(60):
        for _ in range(trials):
            n = int(10 ** rng.uniform(0, 9))
            dl = float(10 ** rng.uniform(-30, -1e-6))
            b = mp.mpf(rate_upper_bound(n, dl))
            if b < 1 and n * mp.log1p(-b) > mp.log(dl):
                violations += 1
    return [SoakResult("rate_upper_bound", trials, trials, violations, 0.0)]


SOAKS: Final = (soak_tv, soak_output, soak_logit, soak_tier_b, soak_sentinel, soak_rate)
GROUPS: Final = ("tv", "output", "logit", "tier_b", "sentinel", "rate")


def run(trials: int, *, seed: int = 0, out: Callable[[str], None] = print,
        only: tuple[str, ...] = GROUPS) -> list[SoakResult]:
    """Run the soaks (all groups by default) with ``trials`` trials per bound; print one line each.

    Each group draws from its own seeded stream, so running a subset reproduces the
    same trials as the full run.
    """
    results: list[SoakResult] = []
    for i, (group, soak) in enumerate(zip(GROUPS, SOAKS)):
        if group not in only:
            continue
        t0 = time.perf_counter()
        rng = np.random.default_rng([seed, i])
        for res in soak(trials, rng):
            out(res.line() + f"  [{time.perf_counter() - t0:.1f}s]")
            results.append(res)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=1_000_000,
                        help="adversarial trials per bound (default 1,000,000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", nargs="+", choices=GROUPS, default=list(GROUPS),
                        help="run only these groups of bounds")
    args = parser.parse_args(argv)
    if args.trials < 1:
        parser.error("--trials must be >= 1")
    print(f"soak_meters: {args.trials:,d} trials per bound, seed {args.seed}, "
          f"groups {' '.join(args.only)}")
    results = run(args.trials, seed=args.seed, only=tuple(args.only))
    bad = sum(r.violations for r in results)
    print(f"total violations: {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
