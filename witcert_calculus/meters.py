"""The WitCert meters: sound per-(layer, head, step) bounds on attention total variation.

Setting: one layer, head and decode step; ``p`` and ``p_tilde`` are the softmax
attention over ``S`` cached tokens from exact and compressed keys; ``eps_t`` the
logit error of token ``t``; ``c_t >= |eps_t|`` any per-token bound (e.g.
:func:`logit_bound` of the stored band witness). ``TV(p, p_tilde) = 1/2 sum |p_t -
p_tilde_t|``. Every TV bound is reported as ``min(1, raw)``; ``raw`` (which may be
``inf``) is kept next to it as a risk score.

Tier A (deterministic; holds for any cache-preserving quantizer and any query,
adaptive or not). With ``A = sum_t p_tilde_t e^{c_t}`` and
``A- = sum_t p_tilde_t e^{-c_t}``:

- e-form ``TV <= (A^2 - 1) / 2`` (Lean ``WitCert.Meters.tv_eform_sound``);
- two-sided ``TV <= (A/A- - A-/A) / 2`` (``WitCert.Meters.tv_two_sided_sound``);
- retention ``TV <= 1/2 sum_t p_tilde_t min(A e^{c_t} - 1, max(e^{c_t}/A- - 1,
  1 - e^{-c_t}/A))`` (``WitCert.Meters.tv_retention_sound``);
- the meter ``min(1, e-form, two-sided)``;
- the comparison shape ``tanh(max_t c_t)`` (``WitCert.Analytic.softmax_tv_tanh_sound``
  gives ``TV <= tanh(osc/4) <= tanh(max c / 2) <= tanh(max c)``).

``A`` and ``A-`` are evaluated as ``log1p(sum p_tilde expm1(+-c))`` (accurate for
small ``c``) or by a log-sum-exp (large ``c``); an overflow reports saturation
with ``raw = inf``; ``c`` is never truncated.

Output error (``WitCert.Meters.output_error_bound_vector_sound``; scalar case
``WitCert.Meters.output_error_bound_sound``):
``||y - y_hat|| <= 2 TV max_t ||v_t|| + sum_t p_tilde_t rho_t`` with ``rho_t`` the
value reconstruction error, as a contract from ``AttentionTV`` to
``AttentionOutputL2``.

Repair (``WitCert.Meters.page_in_decrease``): with block-constant bounds ``u_j``
and compressed masses ``mass_j``, replacing block ``j`` by exact values
(``u_j -> 0``) lowers ``A`` by exactly ``mass_j (e^{u_j} - 1)``;
:func:`page_in_order` returns the fewest blocks that bring the e-form under a
threshold. The identity concerns ``A`` evaluated at the current ``p_tilde``; after
the page-in the meter is recomputed on the new attention.

The tempting dispersion shape ``1/2 e^{2 c_max} (E|c - c_bar| + c_bar (e^{c_max} - 1))``
is unsound; it is kept as :func:`dispersion_bound_unsound` with its counterexample
:data:`DISPERSION_COUNTEREXAMPLE` so that the soundness suites can show they catch it.

Main declarations:

- :class:`TVBound`, :class:`TVBatch`: a bound (raw and reported) with its theorem.
- :func:`tv_eform`, :func:`tv_two_sided`, :func:`tv_retention`, :func:`tv_meter`,
  :func:`tv_tanh_max`, :func:`tv_bounds_batch`
- :func:`output_error_bound`, :func:`output_error_contract`
- :func:`block_summary`, :func:`page_in_order`, :class:`PageInPlan`
- :func:`dispersion_bound_unsound`, :data:`DISPERSION_COUNTEREXAMPLE`
- :data:`THEOREMS`: the Lean theorem names behind each public function
- re-exported: :func:`band_witness`, :func:`band_norms`, :func:`logit_bound`,
  :func:`logit_linf_reading`,
  :class:`RopeLayout` (:mod:`witcert_calculus.witness`); :func:`dither_quantize`,
  :func:`dither_dequantize`, :func:`subgaussian_radius`, :func:`delta_local`,
  :func:`tier_b_certificate` (:mod:`witcert_calculus.dither`);
  :func:`sentinel_rounds`, :func:`rate_upper_bound` (:mod:`witcert_calculus.sentinels`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Final, final

import numpy as np
from numpy.typing import ArrayLike

from witcert_calculus.validation import F64, UNIT_ROUNDOFF, distribution, nonneg_array, \
    positive_int, real
from witcert_calculus.contracts import Contract, Reading, round_up
from witcert_calculus.dither import (
    byte_account,
    ByteAccount,
    delta_local,
    dither_dequantize,
    dither_mean_offset,
    dither_noise,
    dither_quantize,
    dither_variance_proxy,
    DitheredKeys,
    DitherKey,
    select_outlier_pairs,
    subgaussian_radius,
    tier_b_certificate,
)
from witcert_calculus.errors import InvalidValueError
from witcert_calculus.metrics import AtConsume, AttentionOutputL2, AttentionTV
from witcert_calculus.sentinels import rate_upper_bound, sentinel_rounds
from witcert_calculus.theorems import (
    DITHER_LOGIT_TAIL,
    GRID_MGF_LE,
    LOGIT_BOUND_SOUND,
    ONE_SUB_POW_LE_EXP,
    OUTPUT_ERROR_BOUND_VECTOR_SOUND,
    PAGE_IN_DECREASE,
    RATE_UPPER_BOUND_SOUND,
    SENTINEL_ROUNDS_SOUND,
    SIGNAVG_UNION_LE,
    SOFTMAX_TV_TANH_SOUND,
    TV_EFORM_SOUND,
    TV_RETENTION_SOUND,
    TV_TWO_SIDED_SOUND,
)
from witcert_calculus.tiers import Premise, Proof
from witcert_calculus.witness import RopeLayout, band_channels, band_norms, band_pairs, \
    band_witness, logit_bound, logit_linf_reading

__all__ = [
    "ByteAccount",
    "DISPERSION_COUNTEREXAMPLE",
    "DispersionCounterexample",
    "DitherKey",
    "DitheredKeys",
    "PageInPlan",
    "RopeLayout",
    "THEOREMS",
    "TVBatch",
    "TVBound",
    "band_channels",
    "band_norms",
    "band_pairs",
    "band_witness",
    "block_summary",
    "byte_account",
    "delta_local",
    "dispersion_bound_unsound",
    "dither_dequantize",
    "dither_mean_offset",
    "dither_noise",
    "dither_quantize",
    "dither_variance_proxy",
    "logit_bound",
    "logit_linf_reading",
    "output_error_bound",
    "output_error_contract",
    "page_in_order",
    "rate_upper_bound",
    "select_outlier_pairs",
    "sentinel_rounds",
    "subgaussian_radius",
    "tier_b_certificate",
    "tv_bounds_batch",
    "tv_eform",
    "tv_meter",
    "tv_retention",
    "tv_tanh_max",
    "tv_two_sided",
]


_PREMISE_C = "c_t >= |eps_t| for every token t (per-token logit error bound)"

#: The Lean theorems behind each public meter function (checked against the Lean export).
THEOREMS: Final[dict[str, tuple[str, ...]]] = {
    "logit_bound": (LOGIT_BOUND_SOUND,),
    "tv_eform": (TV_EFORM_SOUND,),
    "tv_two_sided": (TV_TWO_SIDED_SOUND,),
    "tv_retention": (TV_RETENTION_SOUND,),
    "tv_meter": (TV_EFORM_SOUND, TV_TWO_SIDED_SOUND),
    "tv_tanh_max": (SOFTMAX_TV_TANH_SOUND,),
    "output_error_bound": (OUTPUT_ERROR_BOUND_VECTOR_SOUND,),
    "output_error_contract": (OUTPUT_ERROR_BOUND_VECTOR_SOUND,),
    "page_in_order": (PAGE_IN_DECREASE,),
    "dither_variance_proxy": (GRID_MGF_LE,),
    "subgaussian_radius": (DITHER_LOGIT_TAIL, SIGNAVG_UNION_LE),
    "tier_b_certificate": (DITHER_LOGIT_TAIL, SIGNAVG_UNION_LE, TV_EFORM_SOUND),
    "sentinel_rounds": (SENTINEL_ROUNDS_SOUND,),
    "rate_upper_bound": (RATE_UPPER_BOUND_SOUND,
                         ONE_SUB_POW_LE_EXP),
}


# --------------------------------------------------------------------------- cores
# Batched cores over the last axis; the public one-query functions call these.

def _lse(logs: F64) -> F64:
    """log sum exp along the last axis; all -inf gives -inf, any +inf gives +inf."""
    m: F64 = logs.max(axis=-1)
    finite_m: F64 = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        body: F64 = finite_m + np.log(np.exp(logs - finite_m[..., None]).sum(axis=-1))
    out: F64 = np.where(np.isinf(m), m, body)
    return out


def _log_p(p: F64) -> F64:
    with np.errstate(divide="ignore"):
        out: F64 = np.where(p > 0, np.log(np.where(p > 0, p, 1.0)), -np.inf)
    return out


def _log_a_plus(p: F64, c: F64) -> F64:
    """log A = log sum p e^{c} along the last axis (p > 0 entries only)."""
    with np.errstate(over="ignore", invalid="ignore"):
        b: F64 = np.where(p > 0, p * np.expm1(c), 0.0).sum(axis=-1)
        small: F64 = np.log1p(b)
        ok = np.isfinite(b)
        if ok.all():
            return small
        logs: F64 = np.where(p > 0, _log_p(p) + c, -np.inf)
    out: F64 = np.where(ok, small, _lse(logs))
    return out


def _log_a_minus(p: F64, c: F64) -> F64:
    """log A- = log sum p e^{-c} along the last axis (p > 0 entries only)."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        b: F64 = np.where(p > 0, p * np.expm1(-c), 0.0).sum(axis=-1)
        small: F64 = np.log1p(b)
        ok = b > -0.5
        if ok.all():
            return small
        logs: F64 = np.where(p > 0, _log_p(p) - c, -np.inf)
    out: F64 = np.where(ok, small, _lse(logs))
    return out


def _eform_raw(log_a: F64) -> F64:
    with np.errstate(over="ignore"):
        b = np.expm1(log_a)
        out: F64 = 0.5 * b * (b + 2.0)
    return out


def _two_sided_raw(log_a: F64, log_am: F64) -> F64:
    with np.errstate(over="ignore", invalid="ignore"):
        out: F64 = np.sinh(log_a - log_am)
    return out


def _retention_raw(p: F64, c: F64, log_a: F64, log_am: F64) -> F64:
    la = log_a[..., None]
    lm = log_am[..., None]
    with np.errstate(over="ignore", invalid="ignore"):
        one_sided = np.expm1(la + c)
        up = np.expm1(c - lm)
        down = -np.expm1(-c - la)
        per = np.minimum(one_sided, np.maximum(up, down))
        out: F64 = 0.5 * np.where(p > 0, p * per, 0.0).sum(axis=-1)
    return out


def _outward(raw: F64, tokens: int, log_a: F64, log_am: F64, cmax: F64) -> F64:
    """Round a float64 bound outward: inflate by a first-order bound on its evaluation error.

    The sums carry a relative error of at most ``(S + 16) u``; passing through
    ``log1p``/``expm1``/``sinh`` multiplies it by at most ``4 + 4 |x|`` for an
    argument ``x`` of size ``|log A| + |log A-| + max c``; subnormal terms add
    ``S * 2^-1070`` absolutely. The soak (scripts/soak_meters.py) checks the result
    against 100-digit truths on the same float inputs.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        size = np.abs(log_a) + np.abs(log_am) + cmax
        gamma = (tokens + 16) * UNIT_ROUNDOFF * (4.0 + 4.0 * size)
        out: F64 = np.nextafter(raw * (1.0 + gamma) + tokens * 2.0**-1070, np.inf)
    # c = 0 everywhere gives A = A- = 1 exactly and the exact bound 0.
    return np.where(np.isfinite(raw) & (cmax > 0), out, raw)


# --------------------------------------------------------------------------- values

@final
@dataclass(frozen=True, slots=True)
class TVBound:
    """A total-variation bound for one query.

    Attributes:
        raw: the unclamped bound (a risk score; ``inf`` after an overflow).
        value: the reported bound ``min(1, raw)``.
        theorem: the Lean theorem that proves it.
        form: which formula produced it (``"eform"``, ``"two_sided"``, ...).
    """

    raw: float
    value: float
    theorem: str
    form: str

    @property
    def saturated(self) -> bool:
        """True when the bound says nothing (``raw >= 1``)."""
        return self.raw >= 1.0

    def reading(self) -> Reading[AttentionTV[AtConsume]]:
        """This bound as a typed reading of ``AttentionTV[AtConsume]``.

        The tier is decided by the machine: CERTIFIED below 1, SATURATED otherwise.

        Example:
            >>> tv_eform(np.array([0.5, 0.5]), np.array([0.01, 0.02])).reading().tier.name
            'CERTIFIED'
        """
        evidence = Proof(self.theorem, (Premise(_PREMISE_C, True),
                                        Premise("p_tilde is a probability vector", True)))
        return Reading(AttentionTV[AtConsume], self.raw, evidence=evidence)


def _tv(raw: float, theorem: str, form: str) -> TVBound:
    return TVBound(raw=raw, value=min(1.0, raw), theorem=theorem, form=form)


@final
@dataclass(frozen=True, slots=True, eq=False)
class TVBatch:
    """Raw TV bounds of many queries at once (arrays of shape ``(N,)``).

    Attributes:
        eform: ``(A^2 - 1) / 2``.
        two_sided: ``(A/A- - A-/A) / 2``.
        retention: the per-token retention form.
        meter: ``min(eform, two_sided)`` (report ``min(1, meter)``).
        tanh_max: ``tanh(max_t c_t)``.
        log_a: ``log A``; ``log_a_minus``: ``log A-``.
    """

    eform: F64
    two_sided: F64
    retention: F64
    meter: F64
    tanh_max: F64
    log_a: F64
    log_a_minus: F64


def _inputs(p_tilde: ArrayLike, c: ArrayLike, ndim: int) -> tuple[F64, F64]:
    p = distribution("p_tilde", p_tilde, ndim=ndim)
    cc = nonneg_array("c", c, ndim=ndim, allow_inf=True)
    if cc.shape != p.shape:
        raise InvalidValueError("c", f"array of shape {cc.shape}",
                                f"must have the shape of p_tilde {p.shape}")
    return p, cc


def tv_bounds_batch(p_tilde: ArrayLike, c: ArrayLike) -> TVBatch:
    """All TV bounds for a batch of queries, vectorized.

    Args:
        p_tilde: compressed attention, shape ``(N, S)``; rows sum to 1 (within 1e-6,
            renormalized).
        c: per-token logit error bounds ``>= 0`` (``inf`` allowed), shape ``(N, S)``.

    Returns:
        A :class:`TVBatch` of raw bounds.

    Raises:
        InvalidValueError: on NaN, negative ``c``, mismatched shapes, rows not summing to 1.

    Example:
        >>> b = tv_bounds_batch(np.full((2, 4), 0.25), np.zeros((2, 4)))
        >>> b.meter.tolist()
        [0.0, 0.0]
    """
    p, cc = _inputs(p_tilde, c, 2)
    la, lm, e, t, r = _forms(p, cc)
    return TVBatch(eform=e, two_sided=t, retention=r, meter=np.minimum(e, t),
                   tanh_max=np.tanh(cc.max(axis=-1)), log_a=la, log_a_minus=lm)


def _forms(p: F64, c: F64, *, retention: bool = True) -> tuple[F64, F64, F64, F64, F64]:
    """log A, log A-, and the outward-rounded e-form, two-sided and retention bounds."""
    la = _log_a_plus(p, c)
    lm = _log_a_minus(p, c)
    n = p.shape[-1]
    cmax: F64 = np.where(np.isfinite(c), c, 0.0).max(axis=-1)
    e = _outward(_eform_raw(la), n, la, lm, cmax)
    t = _outward(_two_sided_raw(la, lm), n, la, lm, cmax)
    if not retention:
        return la, lm, e, t, e
    # retention <= e-form holds exactly; each is rounded outward on its own, so keep
    # the smaller of two sound bounds
    r = np.minimum(_outward(_retention_raw(p, c, la, lm), n, la, lm, cmax), e)
    return la, lm, e, t, r


def tv_eform(p_tilde: ArrayLike, c: ArrayLike) -> TVBound:
    """e-form bound ``TV <= (A^2 - 1) / 2`` with ``A = sum_t p_tilde_t e^{c_t}``.

    Lean: ``WitCert.Meters.tv_eform_sound``.

    Args:
        p_tilde: compressed attention over ``S`` tokens, shape ``(S,)``.
        c: per-token bounds ``c_t >= |eps_t|``, shape ``(S,)``; ``inf`` allowed.

    Returns:
        A :class:`TVBound` (``raw`` may be ``inf``; ``value = min(1, raw)``).

    Raises:
        InvalidValueError: on NaN, negative ``c``, shape mismatch, ``sum(p_tilde) != 1``.

    Example:
        >>> round(tv_eform(np.array([0.5, 0.5]), np.array([0.1, 0.1])).raw, 6)
        0.110701
    """
    p, cc = _inputs(p_tilde, c, 1)
    return _tv(float(_forms(p, cc, retention=False)[2]), TV_EFORM_SOUND, "eform")


def tv_two_sided(p_tilde: ArrayLike, c: ArrayLike) -> TVBound:
    """Two-sided bound ``TV <= (A/A- - A-/A) / 2 = sinh(log A - log A-)``.

    Lean: ``WitCert.Meters.tv_two_sided_sound``. Arguments as :func:`tv_eform`.

    Example:
        >>> round(tv_two_sided(np.array([0.99, 0.01]), np.array([0.0, 4.0])).raw, 6)
        0.453276
    """
    p, cc = _inputs(p_tilde, c, 1)
    return _tv(float(_forms(p, cc, retention=False)[3]), TV_TWO_SIDED_SOUND, "two_sided")


def tv_retention(p_tilde: ArrayLike, c: ArrayLike) -> TVBound:
    """Per-token retention bound (never above the e-form).

    ``TV <= 1/2 sum_t p_tilde_t min(A e^{c_t} - 1, max(e^{c_t}/A- - 1, 1 - e^{-c_t}/A))``.
    Lean: ``WitCert.Meters.tv_retention_sound``. Arguments as :func:`tv_eform`.

    Example:
        >>> p, c = np.array([0.5, 0.5]), np.array([0.1, 0.1])
        >>> tv_retention(p, c).raw <= tv_eform(p, c).raw
        True
    """
    p, cc = _inputs(p_tilde, c, 1)
    return _tv(float(_forms(p, cc)[4]), TV_RETENTION_SOUND, "retention")


def tv_meter(p_tilde: ArrayLike, c: ArrayLike) -> TVBound:
    """The WitCert meter ``min(1, e-form, two-sided)``.

    The returned bound names the theorem of the form that attains the minimum.
    Arguments as :func:`tv_eform`.

    Example:
        >>> m = tv_meter(np.array([0.99, 0.01]), np.array([0.0, 4.0]))
        >>> (round(m.raw, 6), m.form)
        (0.453276, 'two_sided')
    """
    p, cc = _inputs(p_tilde, c, 1)
    _, _, ea, ta, _ = _forms(p, cc, retention=False)
    e, t = float(ea), float(ta)
    if t < e:
        return _tv(t, TV_TWO_SIDED_SOUND, "two_sided")
    return _tv(e, TV_EFORM_SOUND, "eform")


def tv_tanh_max(c: ArrayLike) -> TVBound:
    """Deterministic comparison shape ``TV <= tanh(max_t c_t)``.

    Sound because the oscillation of the logit error is at most ``2 max c`` and
    ``TV <= tanh(osc / 4)`` (Lean ``WitCert.Analytic.softmax_tv_tanh_sound``);
    it ignores ``p_tilde`` and is kept as a comparison for the meter.

    Example:
        >>> round(tv_tanh_max(np.array([0.1, 0.3])).raw, 6)
        0.291313
    """
    cc = nonneg_array("c", c, ndim=1, allow_inf=True)
    if cc.size == 0:
        raise InvalidValueError("c", "empty array", "must hold at least one token")
    return _tv(float(np.tanh(cc.max())), SOFTMAX_TV_TANH_SOUND, "tanh_max")


# --------------------------------------------------------------------------- output

def _sum_upper(x: F64) -> float:
    """An upper bound of the exact sum of products already rounded to nearest."""
    total = math.fsum(x.tolist())
    return math.nextafter(total * (1.0 + 3.0 * UNIT_ROUNDOFF), math.inf) if total > 0 else 0.0


def output_error_contract(*, value_norm_max: float, p_tilde: ArrayLike, rho: ArrayLike
                          ) -> Contract[AttentionTV[AtConsume], AttentionOutputL2[AtConsume]]:
    """Contract ``||y - y_hat|| <= 2 max_t ||v_t|| * TV + sum_t p_tilde_t rho_t``.

    Lean: ``WitCert.Meters.output_error_bound_vector_sound``. Input metric ``AttentionTV``,
    output ``AttentionOutputL2``, both at the consumption site.

    Args:
        value_norm_max: ``max_t ||v_t||`` of the exact values (>= 0).
        p_tilde: compressed attention, shape ``(S,)``.
        rho: value reconstruction errors ``rho_t >= ||v_t - v_hat_t||``, shape ``(S,)``.

    Returns:
        The contract; ``b`` is rounded upward from the float sum.

    Example:
        >>> k = output_error_contract(value_norm_max=2.0, p_tilde=np.array([0.5, 0.5]),
        ...                           rho=np.array([0.0, 0.2]))
        >>> (float(k.a), round(float(k.b), 12))
        (4.0, 0.1)
    """
    vmax = real("value_norm_max", value_norm_max, lo=0.0)
    p = distribution("p_tilde", p_tilde)
    r = nonneg_array("rho", rho, ndim=1)
    if r.shape != p.shape:
        raise InvalidValueError("rho", f"array of shape {r.shape}",
                                f"must have the shape of p_tilde {p.shape}")
    b = _sum_upper(p * r)
    evidence = Proof(OUTPUT_ERROR_BOUND_VECTOR_SOUND, (
        Premise("value_norm_max >= max_t ||v_t||", True),
        Premise("rho_t >= ||v_t - v_hat_t||", True),
        Premise("p_tilde is a probability vector", True)))
    return Contract(AttentionTV[AtConsume], AttentionOutputL2[AtConsume],
                    a=2 * Fraction(vmax), b=b, evidence=evidence, name="output_error")


def output_error_bound(tv: float, *, value_norm_max: float, p_tilde: ArrayLike,
                       rho: ArrayLike) -> float:
    """Output error bound ``2 * min(1, tv) * max_t ||v_t|| + sum_t p_tilde_t rho_t``.

    A TV bound above 1 is replaced by 1 (total variation never exceeds 1, so this
    is the metric's range, not a clamp of the certificate). Rounded upward.

    Args:
        tv: any upper bound of ``TV(p, p_tilde)`` (e.g. ``tv_meter(...).raw``), >= 0.
        value_norm_max, p_tilde, rho: as :func:`output_error_contract`.

    Returns:
        The bound on ``||y - y_hat||`` as a float.

    Raises:
        InvalidValueError: on NaN or negative inputs.

    Example:
        >>> round(output_error_bound(0.1, value_norm_max=2.0, p_tilde=np.array([0.5, 0.5]),
        ...                          rho=np.array([0.0, 0.2])), 12)
        0.5
    """
    t = real("tv", tv, lo=0.0, allow_inf=True)
    k = output_error_contract(value_norm_max=value_norm_max, p_tilde=p_tilde, rho=rho)
    return round_up(k.a * Fraction(min(1.0, t)) + k.b)


# --------------------------------------------------------------------------- page-in

@final
@dataclass(frozen=True, slots=True)
class PageInPlan:
    """Which blocks to replace by exact values, in order.

    Attributes:
        order: block indices, largest decrease of ``A`` first; the shortest prefix
            that brings the e-form under the threshold.
        eform_before: e-form bound (raw) before any page-in.
        eform_after: e-form bound (raw) after paging in ``order``.
        log_a_before, log_a_after: ``log A`` before and after.
        threshold: the target.
    """

    order: tuple[int, ...]
    eform_before: float
    eform_after: float
    log_a_before: float
    log_a_after: float
    threshold: float


def block_summary(p_tilde: ArrayLike, c: ArrayLike, *, block_size: int) -> tuple[F64, F64]:
    """Per-block compressed mass and block-constant bound ``u_j = max_{t in j} c_t``.

    Blocks are consecutive runs of ``block_size`` tokens (the last may be shorter).

    Example:
        >>> m, u = block_summary(np.full(4, 0.25), np.array([0.0, 0.1, 0.3, 0.2]), block_size=2)
        >>> (m.tolist(), u.tolist())
        ([0.5, 0.5], [0.1, 0.3])
    """
    p, cc = _inputs(p_tilde, c, 1)
    bs = positive_int("block_size", block_size)
    starts = np.arange(0, p.size, bs)
    mass: F64 = np.add.reduceat(p, starts)
    u: F64 = np.maximum.reduceat(cc, starts)
    return mass, u


def page_in_order(block_mass: ArrayLike, block_u: ArrayLike, *, threshold: float) -> PageInPlan:
    """The fewest blocks whose exact page-in brings the e-form ``(A^2 - 1)/2`` under ``threshold``.

    With ``A = sum_j mass_j e^{u_j}``, paging in block ``j`` (``u_j -> 0``) lowers
    ``A`` by exactly ``mass_j (e^{u_j} - 1)`` (Lean ``WitCert.Meters.page_in_decrease``).
    Decreases are independent and add, so taking blocks by decreasing decrease
    reaches the target with the fewest blocks. Evaluated in the log domain.

    Args:
        block_mass: compressed attention mass of each block (sums to 1).
        block_u: block-constant logit error bounds ``u_j >= 0`` (``inf`` allowed).
        threshold: target for the e-form, in ``[0, 1)``.

    Returns:
        A :class:`PageInPlan` (empty ``order`` when already under the threshold).

    Raises:
        InvalidValueError: on invalid masses, bounds or threshold.

    Example:
        >>> page_in_order(np.array([0.5, 0.3, 0.2]), np.array([0.01, 1.0, 0.5]),
        ...               threshold=0.05).order
        (1, 2)
    """
    mass, u = _inputs(block_mass, block_u, 1)
    tau = real("threshold", threshold, lo=0.0, hi=1.0, hi_open=True)
    target = 0.5 * math.log1p(2.0 * tau)  # e-form <= tau  <=>  log A <= log sqrt(1 + 2 tau)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        log_mass = np.where(mass > 0, np.log(np.where(mass > 0, mass, 1.0)), -np.inf)
        # log(mass (e^u - 1)) = log mass + u + log(1 - e^-u), finite for finite u > 0
        live = (u > 0) & (mass > 0)
        log_dec = np.where(live, log_mass + u + np.log(-np.expm1(-u)), -np.inf)
        dec = np.where(live, mass * np.expm1(u), 0.0)
    order = np.lexsort((np.arange(mass.size), -log_dec))  # largest decrease first, stable
    # After paging in the first k blocks of `order`, A_k - 1 = sum_{rest} mass (e^u - 1):
    # a suffix sum of nonnegative terms (accurate); the log domain takes over on overflow.
    dec_sorted = dec[order]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        tail = np.concatenate([np.cumsum(dec_sorted[::-1])[::-1], [0.0]])
        lu = np.where(mass > 0, log_mass + u, -np.inf)[order]
        rest = np.concatenate([np.logaddexp.accumulate(lu[::-1])[::-1], [-np.inf]])
        done = np.log(np.concatenate([[0.0], np.cumsum(mass[order])]))
        log_a_k = np.where(np.isfinite(tail), np.log1p(tail), np.logaddexp(rest, done))
    log_a_k[-1] = 0.0  # every block exact: A = sum mass = 1
    k = int(np.nonzero(log_a_k <= target)[0][0])
    log_a0 = float(log_a_k[0])
    la_after = float(log_a_k[k])
    return PageInPlan(order=tuple(int(i) for i in order[:k]),
                      eform_before=float(_eform_raw(np.asarray(log_a0))),
                      eform_after=float(_eform_raw(np.asarray(la_after))),
                      log_a_before=log_a0, log_a_after=la_after, threshold=tau)


# --------------------------------------------------------------------------- counterexample

def dispersion_bound_unsound(p_tilde: ArrayLike, c: ArrayLike) -> float:
    """UNSOUND: ``1/2 e^{2 c_max} (E_p~|c - c_bar| + c_bar (e^{c_max} - 1))``.

    Kept only as a named counterexample: see :data:`DISPERSION_COUNTEREXAMPLE`,
    where it returns 0.006423 while the true TV is 0.049834. Never use it as a bound.

    Example:
        >>> round(dispersion_bound_unsound(np.array([0.5, 0.5]), np.array([0.1, 0.1])), 6)
        0.006423
    """
    p, cc = _inputs(p_tilde, c, 1)
    return float(_dispersion_raw(p[None, :], cc[None, :])[0])


def _dispersion_raw(p: F64, c: F64) -> F64:
    cmax = c.max(axis=-1)
    cbar = (p * c).sum(axis=-1)
    disp = (p * np.abs(c - cbar[..., None])).sum(axis=-1)
    with np.errstate(over="ignore", invalid="ignore"):
        out: F64 = 0.5 * np.exp(2.0 * cmax) * (disp + cbar * np.expm1(cmax))
    return out


@final
@dataclass(frozen=True, slots=True)
class DispersionCounterexample:
    """The pinned counterexample to the dispersion shape.

    Attributes:
        p_tilde, c, eps: the instance (``|eps_t| <= c_t``).
        true_tv: ``TV(p, p_tilde)`` with ``p = softmax(log p_tilde - eps)``.
        claimed: what the dispersion shape returns.
    """

    p_tilde: tuple[float, ...]
    c: tuple[float, ...]
    eps: tuple[float, ...]
    true_tv: float
    claimed: float


DISPERSION_COUNTEREXAMPLE: Final = DispersionCounterexample(
    p_tilde=(0.5, 0.5), c=(0.1, 0.1), eps=(0.1, -0.1),
    true_tv=0.5 * math.tanh(0.1),  # p = (e^-0.1, e^0.1) / (2 cosh 0.1)
    claimed=0.5 * math.exp(0.2) * 0.1 * math.expm1(0.1),
)
