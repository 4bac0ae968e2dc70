"""Bridges between metrics, and the local contracts of the three-operator memory model.

Bridges are the only way across metrics. Proved bridges keep the tier of the
chain; a measured (ratio) bridge is EMPIRICAL, so any chain through it is
EMPIRICAL too. Every function here names the Lean theorem that proves it.

Main declarations:

- :func:`witness_contract`: the stored residual witness bounds the residual.
- :func:`latent_witness_contract`, :func:`decompression_bridge`: the same for a latent
  (MLA-style) cache, and the row-wise Cauchy–Schwarz step from a latent residual to the
  per-token value error.
- :func:`score_bridge`: Cauchy–Schwarz, key residual -> logit sup-norm error.
- :func:`softmax_tv_eform`, :func:`softmax_tv_tanh`, :func:`softmax_tv_tanh_osc`,
  :func:`softmax_tv_affine`, :func:`selector_mass_eform`: logit error -> total variation.
- :func:`empirical_ratio_bridge`: a measured ratio between two metrics (EMPIRICAL).
- :func:`pooling`: gate-weighted pooling in both calibers (:class:`Pooling`).
- :func:`rank_prefix_selection`, :func:`rank_prefix_stable`: top-k selection.
- :func:`recurrence`: a recurrent state with per-step contraction (:class:`Recurrence`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Generic, TypeVar, cast, final

import numpy as np
import numpy.typing as npt

from witcert_calculus.contracts import (
    Contract,
    Number,
    Transfer,
    TransferKind,
    _proved,  # pyright: ignore[reportPrivateUsage]
)
from witcert_calculus.errors import InvalidValueError
from witcert_calculus.metrics import (
    AttentionTV,
    KeyResidualAbs,
    LatentResidual,
    LogitLinf,
    LogitOsc,
    Metric,
    PerTokenL2,
    PerTokenMax,
    PooledError,
    RecurrentStateError,
    SelectorMass,
    Site,
    at,
    metric_info,
)
from witcert_calculus.lean.theorems import (
    POOLING_L2_CALIBER,
    POOLING_MAX_CALIBER,
    RANK_PREFIX_SELECTION_SOUND,
    RANK_PREFIX_STABLE,
    RECURRENCE_COMP_SOUND,
    SCORE_BRIDGE_SOUND,
    SOFTMAX_TV_AFFINE_SOUND,
    SOFTMAX_TV_EFORM_SOUND,
    SOFTMAX_TV_TANH_SOUND,
    WITNESS_SOUND,
)
from witcert_calculus.numerics.validation import exact, float_up, positive_int
from witcert_calculus.tiers import Measurement

__all__ = [
    "Pooling",
    "Recurrence",
    "StableRows",
    "decompression_bridge",
    "empirical_ratio_bridge",
    "latent_witness_contract",
    "pooling",
    "rank_prefix_selection",
    "rank_prefix_stable",
    "recurrence",
    "score_bridge",
    "selector_mass_eform",
    "softmax_tv_affine",
    "softmax_tv_eform",
    "softmax_tv_tanh",
    "softmax_tv_tanh_osc",
    "witness_contract",
]

S = TypeVar("S", bound=Site)
A = TypeVar("A", bound=Metric[Any])
B = TypeVar("B", bound=Metric[Any])

THEOREMS: dict[str, str] = {
    "witness_contract": WITNESS_SOUND,
    "latent_witness_contract": WITNESS_SOUND,
    "decompression_bridge": SCORE_BRIDGE_SOUND,
    "score_bridge": SCORE_BRIDGE_SOUND,
    "softmax_tv_eform": SOFTMAX_TV_EFORM_SOUND,
    "selector_mass_eform": SOFTMAX_TV_EFORM_SOUND,
    "softmax_tv_tanh": SOFTMAX_TV_TANH_SOUND,
    "softmax_tv_tanh_osc": SOFTMAX_TV_TANH_SOUND,
    "softmax_tv_affine": SOFTMAX_TV_AFFINE_SOUND,
    "pooling.l2": POOLING_L2_CALIBER,
    "pooling.max": POOLING_MAX_CALIBER,
    "rank_prefix_selection": RANK_PREFIX_SELECTION_SOUND,
    "rank_prefix_stable": RANK_PREFIX_STABLE,
    "recurrence": RECURRENCE_COMP_SOUND,
}
"""Each public rule of this module and the Lean theorem that proves it."""


def witness_contract(site: type[S], *, witness_max: Number
                     ) -> Contract[KeyResidualAbs[S], KeyResidualAbs[S]]:
    """The residual is at most its stored witness: ``e_out <= 0 * e_in + witness_max``.

    A witness is the residual norm computed when the entry is written and rounded
    upward when stored, so it bounds the residual deterministically.

    Lean: ``WitCert.Bridges.witness_sound``.

    Args:
        site: where the residual is consumed, e.g. ``AtConsume``.
        witness_max: the largest stored witness over the entries concerned (>= 0).

    Example:
        >>> from witcert_calculus import AtConsume
        >>> witness_contract(AtConsume, witness_max=0.02).b
        Fraction(5764607523034235, 288230376151711744)
    """
    w = exact(witness_max, "witness_max")
    m = cast("type[KeyResidualAbs[S]]", at(KeyResidualAbs, site))
    return _proved(m, m, a=0, b=w, theorem=THEOREMS["witness_contract"], name="storage witness")


def latent_witness_contract(site: type[S], *, witness_max: Number
                            ) -> Contract[LatentResidual[S], LatentResidual[S]]:
    """A latent entry's residual is at most its stored witness: ``e_out <= 0 * e_in + w``.

    The latent cache's counterpart of :func:`witness_contract` (the theorem is stated for
    any list of residual–witness pairs).

    Lean: ``WitCert.Bridges.witness_sound``.

    Example:
        >>> from witcert_calculus import AtConsume
        >>> float(latent_witness_contract(AtConsume, witness_max=0.5).b)
        0.5
    """
    w = exact(witness_max, "witness_max")
    m = cast("type[LatentResidual[S]]", at(LatentResidual, site))
    return _proved(m, m, a=0, b=w, theorem=THEOREMS["latent_witness_contract"],
                   name="latent witness")


def decompression_bridge(site: type[S], *, row_norm_max: Number
                         ) -> Contract[LatentResidual[S], PerTokenMax[S]]:
    """Decompressing a latent, ``v = W c``: each coordinate of the value error is the dot
    product of a row of ``W`` with the latent residual, so by Cauchy–Schwarz
    ``max_j |(W (c_hat - c))_j| <= max_j ||W_j|| * ||c_hat - c||``.

    Lean: ``WitCert.Bridges.score_bridge_sound`` (stated for any pairs and any scale; here
    scale one and the rows of ``W``).

    Args:
        site: observation site of both metrics.
        row_norm_max: an upper bound on the largest row norm of ``W`` (>= 0; round it up).

    Example:
        >>> from witcert_calculus import AtConsume
        >>> float(decompression_bridge(AtConsume, row_norm_max=2).a)
        2.0
    """
    r = exact(row_norm_max, "row_norm_max")
    return _proved(cast("type[LatentResidual[S]]", at(LatentResidual, site)),
                   cast("type[PerTokenMax[S]]", at(PerTokenMax, site)), a=r, b=0,
                   theorem=THEOREMS["decompression_bridge"],
                   name="decompression (row-wise Cauchy-Schwarz)")


def score_bridge(site: type[S], *, scale: Number, q_norm_max: Number
                 ) -> Contract[KeyResidualAbs[S], LogitLinf[S]]:
    """Cauchy–Schwarz: ``|Δ(scale <q, k>)| <= scale ||q|| ||Δk||``, so ``a = scale * max ||q||``.

    Lean: ``WitCert.Bridges.score_bridge_sound``.

    Args:
        site: observation site of both metrics.
        scale: the attention scale (e.g. ``d ** -0.5``), > 0.
        q_norm_max: the largest query norm the bound covers, >= 0.

    Raises:
        InvalidValueError: on a non-finite or negative argument, or ``scale == 0``.

    Example:
        >>> from witcert_calculus import AtConsume
        >>> float(score_bridge(AtConsume, scale=0.125, q_norm_max=8).a)
        1.0
    """
    sc = exact(scale, "scale")
    if sc == 0:
        raise InvalidValueError("scale", scale, "must be > 0")
    q = exact(q_norm_max, "q_norm_max")
    return _proved(cast("type[KeyResidualAbs[S]]", at(KeyResidualAbs, site)),
                    cast("type[LogitLinf[S]]", at(LogitLinf, site)), a=sc * q, b=0,
                    theorem=THEOREMS["score_bridge"], name="score bridge")


def _tv_bridge(rule: str, m_in: type[A], m_out: type[B], transfer: Transfer,
               name: str) -> Contract[A, B]:
    sat = metric_info(m_out).saturation
    assert sat is not None  # both target metrics saturate at 1
    # The affine part is the saturation line e_out <= 1, true of every distribution;
    # the transfer carries the informative bound.
    return _proved(m_in, m_out, a=0, b=sat, theorem=THEOREMS[rule], name=name,
                   transfer=transfer)


def softmax_tv_eform(site: type[S]) -> Contract[LogitLinf[S], AttentionTV[S]]:
    """Exact transfer form: ``|Δ_t| <= eps`` for all t gives ``TV <= (exp(2 eps) - 1) / 2``.

    Non-affine: the contract's affine part is the saturation line ``TV <= 1`` and
    its transfer ``(exp(2x) - 1) / 2`` gives the bound; both compose soundly.

    Lean: ``WitCert.Analytic.softmax_tv_eform_sound``.

    Example:
        >>> from witcert_calculus import AtConsume
        >>> round(softmax_tv_eform(AtConsume).bound(0.05).value, 6)
        0.052585
    """
    return _tv_bridge("softmax_tv_eform", cast("type[LogitLinf[S]]", at(LogitLinf, site)),
                      cast("type[AttentionTV[S]]", at(AttentionTV, site)),
                      Transfer(TransferKind.EXP_TV), "softmax->TV (e-form)")


def selector_mass_eform(site: type[S]) -> Contract[LogitLinf[S], SelectorMass[S]]:
    """The e-form bridge applied to a selector's own score softmax (selector-score mass).

    Selector-score mass is kept distinct from attention mass: crossing to attention
    needs a further bridge (e.g. :func:`empirical_ratio_bridge`).

    Lean: ``WitCert.Analytic.softmax_tv_eform_sound``.
    """
    return _tv_bridge("selector_mass_eform", cast("type[LogitLinf[S]]", at(LogitLinf, site)),
                      cast("type[SelectorMass[S]]", at(SelectorMass, site)),
                      Transfer(TransferKind.EXP_TV), "selector scores->mass (e-form)")


def softmax_tv_tanh(site: type[S]) -> Contract[LogitLinf[S], AttentionTV[S]]:
    """Sharp form from the sup-norm: ``osc <= 2 eps`` so ``TV <= tanh(osc/4) <= tanh(eps/2)``.

    Lean: ``WitCert.Analytic.softmax_tv_tanh_sound``.

    Example:
        >>> from witcert_calculus import AtConsume
        >>> round(softmax_tv_tanh(AtConsume).bound(0.05).value, 6)
        0.024995
    """
    return _tv_bridge("softmax_tv_tanh", cast("type[LogitLinf[S]]", at(LogitLinf, site)),
                      cast("type[AttentionTV[S]]", at(AttentionTV, site)),
                      Transfer(TransferKind.TANH, Fraction(1, 2)), "softmax->TV (tanh)")


def softmax_tv_tanh_osc(site: type[S]) -> Contract[LogitOsc[S], AttentionTV[S]]:
    """Sharp form from the oscillation: ``TV <= tanh(osc / 4)``.

    Lean: ``WitCert.Analytic.softmax_tv_tanh_sound``.
    """
    return _tv_bridge("softmax_tv_tanh_osc", cast("type[LogitOsc[S]]", at(LogitOsc, site)),
                      cast("type[AttentionTV[S]]", at(AttentionTV, site)),
                      Transfer(TransferKind.TANH, Fraction(1, 4)), "softmax->TV (tanh osc)")


def softmax_tv_affine(site: type[S], *, eps0: Number) -> Contract[LogitLinf[S], AttentionTV[S]]:
    """Affine relaxation ``TV <= exp(2 eps0) * eps`` valid on ``eps <= eps0`` (domain-restricted).

    The slope ``exp(2 eps0)`` is computed with 50 digits and rounded upward.

    Lean: ``WitCert.Analytic.softmax_tv_affine_sound``.

    Example:
        >>> from witcert_calculus import AtConsume
        >>> c = softmax_tv_affine(AtConsume, eps0=0.1)
        >>> c.tier.name, c.subset
        ('PARTIALLY_CERTIFIED', 'e_in <= 0.1 (exactly 3602879701896397/36028797018963968)')
    """
    e0 = exact(eps0, "eps0")
    slope = Fraction(Transfer(TransferKind.EXP_TV)(float(e0)) * 2 + 1)
    slope = Fraction(math.nextafter(float(slope), math.inf))
    return _proved(cast("type[LogitLinf[S]]", at(LogitLinf, site)),
                    cast("type[AttentionTV[S]]", at(AttentionTV, site)), a=slope, b=0, cap=e0,
                    theorem=THEOREMS["softmax_tv_affine"], name="softmax->TV (affine)")


def empirical_ratio_bridge(m_in: type[A], m_out: type[B], *, ratio: Number, samples: int,
                           statistic: str, set_type: str) -> Contract[A, B]:
    """A measured ratio ``e_out ~ ratio * e_in``: EMPIRICAL, and so is any chain through it.

    Args:
        m_in: the metric measured on the input side, e.g. ``SelectorMass[AtConsume]``.
        m_out: the metric on the output side, e.g. ``AttentionTV[AtConsume]``.
        ratio: the measured ratio (e.g. a median or a tail quantile), >= 0.
        samples: how many observations it was measured on (>= 1).
        statistic: which statistic, e.g. ``"median"`` or ``"p99"``.
        set_type: the sets it was measured on, e.g. ``"top-64 pages, SmolLM2, 3 prompts"``.

    Example:
        >>> from witcert_calculus import AtConsume, SelectorMass, AttentionTV
        >>> c = empirical_ratio_bridge(SelectorMass[AtConsume], AttentionTV[AtConsume],
        ...     ratio=0.8, samples=4096, statistic="p99", set_type="top-64 pages")
        >>> c.tier.name
        'EMPIRICAL'
    """
    r = exact(ratio, "ratio")
    evidence = Measurement(f"{statistic} ratio {metric_name_pair(m_in, m_out)}", samples,
                           extra=(("statistic", statistic), ("set_type", set_type)))
    return Contract(m_in, m_out, a=r, b=0, evidence=evidence, name=f"measured {statistic} ratio")


def metric_name_pair(m_in: object, m_out: object) -> str:
    """``"A[S] -> B[S]"`` for two metrics (used in descriptions)."""
    from witcert_calculus.metrics import metric_name

    return f"{metric_name(m_in)} -> {metric_name(m_out)}"


def _weights(weights: Sequence[float] | npt.NDArray[np.floating[Any]]) -> list[Fraction]:
    arr = np.asarray(weights, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise InvalidValueError("weights", weights, "must be a non-empty 1-d sequence")
    out: list[Fraction] = []
    for i, w in enumerate(arr.tolist()):
        out.append(exact(w, f"weights[{i}]"))
    return out


def _sqrt_up(x: Fraction) -> Fraction:
    """A float-representable upper bound on sqrt(x), exact integer arithmetic (no underflow)."""
    if x == 0:
        return Fraction(0)
    n, d = x.numerator, x.denominator
    p = max(0, 64 - (n.bit_length() - d.bit_length()) // 2)
    s = math.isqrt((n << (2 * p)) // d) + 1  # s / 2^p > sqrt(n / d)
    return Fraction(float_up(Fraction(s, 1 << p)))


@final
@dataclass(frozen=True, slots=True)
class Pooling(Generic[S]):
    """Gate-weighted pooling in both calibers; never one alone.

    Attributes:
        l2: ``|Σ w e| <= ||w||_2 * ||e||_2`` (Lean ``WitCert.Bridges.pooling_l2_caliber``).
        max: ``|Σ w e| <= ||w||_1 * max |e|``, ``= max |e|`` when the weights sum to 1
            (Lean ``WitCert.Bridges.pooling_max_caliber``).
    """

    l2: Contract[PerTokenL2[S], PooledError[S]]
    max: Contract[PerTokenMax[S], PooledError[S]]


def pooling(site: type[S], *, weights: Sequence[float] | npt.NDArray[np.floating[Any]]
            ) -> Pooling[S]:
    """Contracts for pooling per-token errors with gate weights ``w >= 0``.

    Args:
        site: observation site.
        weights: the gate weights (nonnegative; typically summing to 1).

    Returns:
        A :class:`Pooling` with the l2 caliber (``a = ||w||_2``, rounded up) and the
        max caliber (``a = ||w||_1``, exactly 1 for weights summing to 1).

    Raises:
        InvalidValueError: naming the first negative, NaN or infinite weight.

    Example:
        >>> from witcert_calculus import AtConsume
        >>> p = pooling(AtConsume, weights=[0.5, 0.25, 0.25])
        >>> float(p.max.a), round(float(p.l2.a), 6)
        (1.0, 0.612372)
    """
    ws = _weights(weights)
    l2 = _sqrt_up(sum((w * w for w in ws), Fraction(0)))
    l1 = sum(ws, Fraction(0))
    premise = ("w >= 0", all(w >= 0 for w in ws))
    out = cast("type[PooledError[S]]", at(PooledError, site))
    c_l2 = _proved(cast("type[PerTokenL2[S]]", at(PerTokenL2, site)), out, a=l2, b=0,
                    theorem=THEOREMS["pooling.l2"], premises=(premise,), name="pooling (l2 caliber)")
    c_max = _proved(cast("type[PerTokenMax[S]]", at(PerTokenMax, site)), out, a=l1, b=0,
                     theorem=THEOREMS["pooling.max"], premises=(premise,), name="pooling (max caliber)")
    return Pooling(l2=c_l2, max=c_max)


def rank_prefix_selection(site: type[S], *, m_out: Number, m_in: Number
                          ) -> Contract[AttentionTV[S], AttentionTV[S]]:
    """Top-k selection: ``TV <= (m_out + m_in) / 2 + (1/2) Σ_{I∩Î} |p - p̂|``.

    The input is the total variation restricted to the kept set; ``(a, b) =
    (1, (m_out + m_in) / 2)``.

    Lean: ``WitCert.Bridges.rank_prefix_selection_sound``.

    Args:
        site: observation site.
        m_out: attention mass dropped by the selection, in [0, 1].
        m_in: mass brought in by swapped entries, in [0, 1].

    Example:
        >>> from witcert_calculus import AtConsume
        >>> float(rank_prefix_selection(AtConsume, m_out=0.02, m_in=0.01).b)
        0.015
    """
    mo = exact(m_out, "m_out", upper=Fraction(1))
    mi = exact(m_in, "m_in", upper=Fraction(1))
    m = cast("type[AttentionTV[S]]", at(AttentionTV, site))
    return _proved(m, m, a=1, b=(mo + mi) / 2, theorem=THEOREMS["rank_prefix_selection"],
                    name="rank-prefix selection")


@final
@dataclass(frozen=True, slots=True)
class StableRows:
    """Which rows keep their top-k set under score errors up to ``eps``.

    Attributes:
        stable: boolean per row: margin between the k-th and (k+1)-th score > 2*eps.
        margin: that margin per row.
        subset: the decidable subset, stated.
        theorem: the Lean theorem (``WitCert.Bridges.rank_prefix_stable``).
    """

    stable: npt.NDArray[np.bool_]
    margin: npt.NDArray[np.float64]
    subset: str
    theorem: str

    @property
    def fraction(self) -> float:
        """Fraction of rows that are stable (the partially certified share)."""
        return float(self.stable.mean()) if self.stable.size else 0.0


def rank_prefix_stable(scores: npt.ArrayLike, *, k: int, eps: float) -> StableRows:
    """Rows whose top-k set cannot change when every score moves by at most ``eps``.

    If the gap between the k-th and (k+1)-th largest scores exceeds ``2 eps``, no
    perturbation bounded by ``eps`` can swap an entry across the boundary.

    Lean: ``WitCert.Bridges.rank_prefix_stable``.

    Args:
        scores: array of shape (rows, n) or (n,).
        k: size of the kept set, ``1 <= k < n``.
        eps: bound on each score's error, finite and >= 0.

    Example:
        >>> rank_prefix_stable([[3.0, 1.0, 0.9]], k=1, eps=0.5).stable.tolist()
        [True]
    """
    arr = np.atleast_2d(np.asarray(scores, dtype=np.float64))
    if arr.ndim != 2 or not np.all(np.isfinite(arr)):
        raise InvalidValueError("scores", scores, "must be a finite 1-d or 2-d array")
    n = arr.shape[1]
    if positive_int("k", k) >= n:
        raise InvalidValueError("k", k, f"must be an int with 1 <= k < {n}")
    e = float(exact(eps, "eps"))
    part = -np.partition(-arr, [k - 1, k], axis=1)
    margin = part[:, k - 1] - part[:, k]
    return StableRows(stable=margin > 2 * e, margin=margin,
                      subset=f"rows whose top-{k} margin exceeds 2*eps = {2 * e!r}",
                      theorem=THEOREMS["rank_prefix_stable"])


@final
@dataclass(frozen=True, slots=True)
class Recurrence(Generic[S]):
    """A recurrent state's error over T steps, ``e_t <= a_t e_{t-1} + b_t``.

    Attributes:
        contract: the composed contract from the initial to the final state error.
        mean_caliber: ``log(mean a_t)`` (what a naive average reports).
        mean_log_a: ``E[log a_t]``, the rate that actually governs decay.
        half_life: ``ln 2 / (-E[log a])`` steps when ``E[log a] < 0``, else ``inf``.
        half_life_of_mean: ``ln 2 / (-log(mean a))``, the half-life a naive average reports
            (never shorter than :attr:`half_life`: ``E[log a] <= log(mean a)``).
    """

    contract: Contract[RecurrentStateError[S], RecurrentStateError[S]]
    mean_caliber: float
    mean_log_a: float
    half_life: float
    half_life_of_mean: float = math.inf


def recurrence(site: type[S], *, a_steps: npt.ArrayLike, b_steps: npt.ArrayLike | None = None
               ) -> Recurrence[S]:
    """Compose per-step contractions of a recurrent state over steps.

    Exact coefficients: ``a = Π a_t`` and ``b = Σ_t (Π_{s>t} a_s) b_t``.

    Lean: ``WitCert.Bridges.recurrence_comp_sound``.

    Args:
        site: observation site.
        a_steps: per-step contraction coefficients ``a_t >= 0``.
        b_steps: per-step injected error bounds ``b_t >= 0`` (default zeros).

    Example:
        >>> from witcert_calculus import AtConsume
        >>> r = recurrence(AtConsume, a_steps=[0.5, 0.5])
        >>> float(r.contract.a), round(r.half_life, 6)
        (0.25, 1.0)
    """
    a_arr = np.asarray(a_steps, dtype=np.float64).ravel()
    if a_arr.size == 0:
        raise InvalidValueError("a_steps", a_steps, "needs at least one step")
    b_arr = np.zeros_like(a_arr) if b_steps is None else np.asarray(b_steps, np.float64).ravel()
    if b_arr.shape != a_arr.shape:
        raise InvalidValueError("b_steps", b_steps, f"must have {a_arr.size} entries like a_steps")
    a_ex = [exact(v, f"a_steps[{i}]") for i, v in enumerate(a_arr.tolist())]
    b_ex = [exact(v, f"b_steps[{i}]") for i, v in enumerate(b_arr.tolist())]
    a_tot, b_tot = Fraction(1), Fraction(0)
    for a_t, b_t in zip(a_ex, b_ex, strict=True):
        a_tot, b_tot = a_t * a_tot, a_t * b_tot + b_t
    m = cast("type[RecurrentStateError[S]]", at(RecurrentStateError, site))
    contract = _proved(m, m, a=a_tot, b=b_tot, theorem=THEOREMS["recurrence"],
                        name=f"recurrence over {a_arr.size} steps")
    mean_a = float(a_arr.mean())
    with np.errstate(divide="ignore"):
        logs = np.log(a_arr)
    mean_log = float(logs.mean())
    half = math.log(2) / -mean_log if mean_log < 0 else math.inf
    caliber = math.log(mean_a) if mean_a > 0 else -math.inf
    return Recurrence(contract=contract, mean_caliber=caliber, mean_log_a=mean_log,
                      half_life=half,
                      half_life_of_mean=math.log(2) / -caliber if caliber < 0 else math.inf)

