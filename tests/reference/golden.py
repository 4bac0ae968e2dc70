"""Golden evaluations with mpmath at 50 significant digits.

Inputs are floats (exact binary rationals); every operation runs at 50 digits.
"""

from __future__ import annotations

from collections.abc import Sequence

import mpmath as mp

DPS = 50


def _norm(p: Sequence[float]) -> list[mp.mpf]:
    ps = [mp.mpf(x) for x in p]
    total = mp.fsum(ps)
    return [x / total for x in ps]


def log_a(p: Sequence[float], c: Sequence[float], sign: int = 1) -> mp.mpf:
    """log sum p e^{+-c}, as log1p(sum p expm1(+-c)) so tiny c keep their digits."""
    with mp.workdps(DPS):
        ps = _norm(p)
        return mp.log1p(mp.fsum(pi * mp.expm1(sign * mp.mpf(ci)) for pi, ci in zip(ps, c)
                                if pi > 0))


def eform(p: Sequence[float], c: Sequence[float]) -> mp.mpf:
    with mp.workdps(DPS):
        b = mp.expm1(log_a(p, c))  # A - 1
        return b * (b + 2) / 2


def two_sided(p: Sequence[float], c: Sequence[float]) -> mp.mpf:
    with mp.workdps(DPS):
        return mp.sinh(log_a(p, c) - log_a(p, c, -1))  # (A/A- - A-/A) / 2


def retention(p: Sequence[float], c: Sequence[float]) -> mp.mpf:
    with mp.workdps(DPS):
        ps = _norm(p)
        la, lm = log_a(p, c), log_a(p, c, -1)
        total = mp.mpf(0)
        for pi, ci in zip(ps, c):
            ci = mp.mpf(ci)
            total += pi * min(mp.expm1(la + ci), max(mp.expm1(ci - lm), -mp.expm1(-ci - la)))
        return total / 2


def tanh_max(c: Sequence[float]) -> mp.mpf:
    with mp.workdps(DPS):
        return mp.tanh(max(mp.mpf(x) for x in c))


def true_tv(p_tilde: Sequence[float], eps: Sequence[float]) -> mp.mpf:
    """TV(p, p_tilde) with ``p_t proportional to p_tilde_t e^{-eps_t}`` (exact logits = compressed - eps)."""
    with mp.workdps(DPS):
        ps = _norm(p_tilde)
        w = [pi * mp.exp(-mp.mpf(e)) for pi, e in zip(ps, eps)]
        z = mp.fsum(w)
        return mp.fsum(abs(wi / z - pi) for wi, pi in zip(w, ps)) / 2


def softmax(logits: Sequence[float]) -> list[mp.mpf]:
    with mp.workdps(DPS):
        m = max(mp.mpf(x) for x in logits)
        w = [mp.exp(mp.mpf(x) - m) for x in logits]
        z = mp.fsum(w)
        return [x / z for x in w]


def band_norms(x: Sequence[float], pairs: Sequence[tuple[int, int]],
               bands: Sequence[tuple[int, int]]) -> list[mp.mpf]:
    """Band norms given the channel pair of each frequency and the pair range of each band."""
    with mp.workdps(DPS):
        out = []
        for a, b in bands:
            out.append(mp.sqrt(mp.fsum(mp.mpf(x[i]) ** 2 + mp.mpf(x[j]) ** 2
                                       for i, j in pairs[a:b])))
        return out


def radius(var: float, tokens: int, delta: float) -> mp.mpf:
    with mp.workdps(DPS):
        return mp.sqrt(2 * mp.mpf(var) * mp.log(2 * mp.mpf(tokens) / mp.mpf(delta)))


def rate(trials: int, delta: float) -> mp.mpf:
    with mp.workdps(DPS):
        return mp.log(1 / mp.mpf(delta)) / trials


def sentinel(corrupted: int, slots: int, draws: int, delta: float) -> int:
    with mp.workdps(DPS):
        q = (mp.mpf(slots - corrupted) / slots) ** draws
        return int(mp.ceil(mp.log(mp.mpf(delta)) / mp.log(q)))
