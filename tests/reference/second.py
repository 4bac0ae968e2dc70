"""A second implementation of the meter formulas in plain Python, from the formulas alone.

It evaluates A and A- directly (no log domain), so it is meant for moderate
``c``; it shares no code with the package.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def _normalize(p: Sequence[float]) -> list[float]:
    s = math.fsum(p)
    return [x / s for x in p]


def eform(p: Sequence[float], c: Sequence[float]) -> float:
    ps = _normalize(p)
    a = math.fsum(pi * math.exp(ci) for pi, ci in zip(ps, c))
    return 0.5 * (a * a - 1.0)


def two_sided(p: Sequence[float], c: Sequence[float]) -> float:
    ps = _normalize(p)
    a = math.fsum(pi * math.exp(ci) for pi, ci in zip(ps, c))
    am = math.fsum(pi * math.exp(-ci) for pi, ci in zip(ps, c))
    return 0.5 * (a / am - am / a)


def retention(p: Sequence[float], c: Sequence[float]) -> float:
    ps = _normalize(p)
    a = math.fsum(pi * math.exp(ci) for pi, ci in zip(ps, c))
    am = math.fsum(pi * math.exp(-ci) for pi, ci in zip(ps, c))
    terms = []
    for pi, ci in zip(ps, c):
        e = math.exp(ci)
        terms.append(pi * min(a * e - 1.0, max(e / am - 1.0, 1.0 - 1.0 / (e * a))))
    return 0.5 * math.fsum(terms)


def meter(p: Sequence[float], c: Sequence[float]) -> float:
    return min(1.0, eform(p, c), two_sided(p, c))


def tanh_max(c: Sequence[float]) -> float:
    return math.tanh(max(c))


def logit_bound(q: Sequence[float], residuals: Sequence[Sequence[float]], scale: float,
                band_of_channel: Sequence[int], bands: int) -> list[float]:
    """c_t = scale * sum_b ||q_b|| ||r_{t,b}|| with an explicit channel -> band map."""
    qn = [0.0] * bands
    for i, x in enumerate(q):
        qn[band_of_channel[i]] += x * x
    out = []
    for r in residuals:
        rn = [0.0] * bands
        for i, x in enumerate(r):
            rn[band_of_channel[i]] += x * x
        out.append(scale * math.fsum(math.sqrt(a) * math.sqrt(b) for a, b in zip(qn, rn)))
    return out


def output_bound(tv: float, values: Sequence[Sequence[float]], p: Sequence[float],
                 rho: Sequence[float]) -> float:
    vmax = max(math.sqrt(math.fsum(x * x for x in v)) for v in values)
    return 2.0 * min(1.0, tv) * vmax + math.fsum(pi * ri for pi, ri in zip(_normalize(p), rho))


def radius(var: float, tokens: int, delta: float) -> float:
    return math.sqrt(2.0 * var * math.log(2.0 * tokens / delta))


def sentinel_rounds(corrupted: int, slots: int, draws: int, delta: float) -> int:
    log_q = draws * math.log1p(-corrupted / slots)
    return math.ceil(math.log(delta) / log_q)


def rate(trials: int, delta: float) -> float:
    return math.log(1.0 / delta) / trials


def page_in_fewest(mass: Sequence[float], u: Sequence[float], threshold: float) -> int:
    """Fewest blocks by brute force over all subsets (small inputs only)."""
    from itertools import combinations

    n = len(mass)
    target = math.sqrt(1.0 + 2.0 * threshold)
    for k in range(n + 1):
        for subset in combinations(range(n), k):
            a = math.fsum(m if j in subset else m * math.exp(uj)
                          for j, (m, uj) in enumerate(zip(mass, u)))
            if a <= target:
                return k
    return n
