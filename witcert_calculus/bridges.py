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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Final, Generic, TypeVar, final

import numpy as np
import numpy.typing as npt

from witcert_calculus.contracts import (
    Contract,
    Number,
    Transfer,
    TransferKind,
)
from witcert_calculus.errors import InvalidValueError
from witcert_calculus.metrics import (
    AttentionTV,
    DroppedMass,
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
)
from witcert_calculus.lean.theorems import (
    DECOMPRESSION_CONTRACT_SOUND,
    EVICT_TV_METER_EQ,
    POOLING_L2_CONTRACT_SOUND,
    POOLING_MAX_CONTRACT_SOUND,
    RANK_PREFIX_SELECTION_CONTRACT_SOUND,
    RANK_PREFIX_STABLE,
    RECURRENCE_CONTRACT_SOUND,
    SCORE_BRIDGE_CONTRACT_SOUND,
    SELECTOR_MASS_EFORM_CONTRACT_SOUND,
    SOFTMAX_TV_AFFINE_CONTRACT_SOUND,
    SOFTMAX_TV_EFORM_CONTRACT_SOUND,
    SOFTMAX_TV_TANH_CONTRACT_SOUND,
    SOFTMAX_TV_TANH_OSC_CONTRACT_SOUND,
    WITNESS_CONTRACT_SOUND,
)
from witcert_calculus.numerics.validation import (
    FLOAT_MAX,
    exact,
    float_up,
    positive_int,
    real_array,
)
from witcert_calculus.schemas import Claim, Schema, _builtin  # pyright: ignore[reportPrivateUsage]
from witcert_calculus.tiers import Measurement

__all__ = [
    "Pooling",
    "Recurrence",
    "StableRows",
    "decompression_bridge",
    "dropped_mass_tv",
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

def _witness(witness_max: Fraction) -> Claim:
    # the stored entry's error is the input's error plus the stored residual (triangle inequality)
    return Claim(a=1, b=witness_max)


def _cauchy_schwarz(**norms: Fraction) -> Claim:
    # the scale (1 for a decompression) times the largest norm of the other factor
    return Claim(a=math.prod(norms.values(), start=Fraction(1)), b=0)


def _saturation_line(transfer: Transfer) -> Callable[[], Claim]:
    # The affine part is the saturation line e_out <= 1, true of every distribution; the
    # transfer carries the informative bound.
    return lambda: Claim(a=0, b=1, transfer=transfer)


def _affine(eps0: Fraction) -> Claim:
    # the slope exp(2 eps0), evaluated with 50 digits and rounded upward
    slope = Transfer(TransferKind.EXP_TV)(float(eps0)) * 2 + 1
    if not math.isfinite(slope):
        raise InvalidValueError("eps0", eps0, "is too large: the slope exp(2 eps0) overflows "
                                "a float")
    return Claim(a=Fraction(math.nextafter(float(Fraction(slope)), math.inf)), b=0, cap=eps0)


def _pooled_l2(weights: tuple[Fraction, ...]) -> Claim:
    return Claim(a=_sqrt_up(sum((w * w for w in weights), Fraction(0))), b=0)


def _pooled_max(weights: tuple[Fraction, ...]) -> Claim:
    return Claim(a=sum(weights, Fraction(0)), b=0)


def _selection(m_out: Fraction, m_in: Fraction) -> Claim:
    return Claim(a=1, b=(m_out + m_in) / 2)


def _weights_nonnegative(weights: tuple[Fraction, ...]) -> bool:
    return all(w >= 0 for w in weights)


def _slopes_nonnegative(a_steps: tuple[Fraction, ...], b_steps: tuple[Fraction, ...]) -> bool:
    return all(a >= 0 for a in a_steps)


def _recurrence(a_steps: tuple[Fraction, ...], b_steps: tuple[Fraction, ...]) -> Claim:
    a_tot, b_tot = Fraction(1), Fraction(0)
    for a_t, b_t in zip(a_steps, b_steps, strict=True):
        a_tot, b_tot = a_t * a_tot, a_t * b_tot + b_t
    return Claim(a=a_tot, b=b_tot)


# Fragments of the cited statements (definitions named without the WitCert. root) that state
# each claim: the contract's bound, written out.
_SUP = "Semantic.lsup (fun t => Analytic.absA (z t - z' t)) L"
_WITNESS = ("≤ 1 * N.norm (N.sub k k') + w",)
_SCORE = ("≤ sc * sc * (List.map (fun t => q t * q t) L).sum * Semantic.keyErr L k k' + 0",)
_DECOMPRESSION = ("≤ sc * sc * (List.map (fun t => r t * r t) L).sum * Semantic.keyErr L c c' + 0",)
_EFORM = (f"≤ 1 / 2 * (E.exp (2 * {_SUP}) - 1)",)
_EVICTED = ("Analytic.tv ((Semantic.evictTV E L hL drop S s).exact z) ((Semantic.evictTV E L hL "
            "drop S s).approx ω z) L = Eviction.droppedMass (fun t => E.exp (z t)) drop L / "
            "(Eviction.keptMass (fun t => E.exp (z t)) drop L + Eviction.droppedMass",)

#: Each public rule of this module and the schema of the theorem that proves it: a theorem about
#: the rule's semantic contract (``WitCert.Semantic``), whose soundness field is the bound.
SCHEMAS: Final[dict[str, Schema]] = {rule: _builtin(schema) for rule, schema in {
    "witness_contract": Schema(WITNESS_CONTRACT_SOUND, KeyResidualAbs, KeyResidualAbs,
                               ("witness_max",), _witness, states=_WITNESS,
                               name="storage witness"),
    "latent_witness_contract": Schema(WITNESS_CONTRACT_SOUND, LatentResidual, LatentResidual,
                                      ("witness_max",), _witness, states=_WITNESS,
                                      name="latent witness"),
    "decompression_bridge": Schema(DECOMPRESSION_CONTRACT_SOUND, LatentResidual, PerTokenMax,
                                   ("row_norm_max",), _cauchy_schwarz, states=_DECOMPRESSION,
                                   name="decompression (row-wise Cauchy-Schwarz)"),
    "score_bridge": Schema(SCORE_BRIDGE_CONTRACT_SOUND, KeyResidualAbs, LogitLinf,
                           ("scale", "q_norm_max"), _cauchy_schwarz, states=_SCORE,
                           name="score bridge"),
    "softmax_tv_eform": Schema(SOFTMAX_TV_EFORM_CONTRACT_SOUND, LogitLinf, AttentionTV, (),
                               _saturation_line(Transfer(TransferKind.EXP_TV)), states=_EFORM,
                               name="softmax->TV (e-form)"),
    "selector_mass_eform": Schema(SELECTOR_MASS_EFORM_CONTRACT_SOUND, LogitLinf, SelectorMass, (),
                                  _saturation_line(Transfer(TransferKind.EXP_TV)),
                                  states=_EFORM, name="selector scores->mass (e-form)"),
    "softmax_tv_tanh": Schema(SOFTMAX_TV_TANH_CONTRACT_SOUND, LogitLinf, AttentionTV, (),
                              _saturation_line(Transfer(TransferKind.TANH, Fraction(1, 2))),
                              states=(f"≤ Analytic.tanhE E ({_SUP} / 2)",),
                              name="softmax->TV (tanh)"),
    "softmax_tv_tanh_osc": Schema(SOFTMAX_TV_TANH_OSC_CONTRACT_SOUND, LogitOsc, AttentionTV, (),
                                  _saturation_line(Transfer(TransferKind.TANH, Fraction(1, 4))),
                                  states=("≤ Analytic.tanhE E ((Semantic.lmax (fun t => z' t - z t) L"
                                          " - Semantic.lmin (fun t => z' t - z t) L) / 4)",),
                                  name="softmax->TV (tanh osc)"),
    "dropped_mass_tv": Schema(EVICT_TV_METER_EQ, DroppedMass, AttentionTV, (),
                              lambda: Claim(a=1, b=0), states=_EVICTED,
                              name="dropped mass->TV (eviction)"),
    "softmax_tv_affine": Schema(SOFTMAX_TV_AFFINE_CONTRACT_SOUND, LogitLinf, AttentionTV,
                                ("eps0",), _affine,
                                states=(f"≤ E.exp (2 * ε₀) * {_SUP} + 0", f"{_SUP} ≤ ε₀"),
                                name="softmax->TV (affine)"),
    "pooling.l2": Schema(POOLING_L2_CONTRACT_SOUND, PerTokenL2, PooledError, ("weights",),
                         _pooled_l2, premises=(
                             ("w >= 0", _weights_nonnegative),),
                         states=("≤ (List.map (fun t => w t * w t) L).sum * "
                                 "Semantic.keyErr L v v' + 0",),
                         name="pooling (l2 caliber)"),
    "pooling.max": Schema(POOLING_MAX_CONTRACT_SOUND, PerTokenMax, PooledError, ("weights",),
                          _pooled_max, premises=(
                              ("w >= 0", _weights_nonnegative),),
                          states=("≤ (List.map w L).sum * "
                                  "Semantic.lsup (fun t => Bridges.abs (v t - v' t)) L + 0",),
                          name="pooling (max caliber)"),
    "rank_prefix_selection": Schema(RANK_PREFIX_SELECTION_CONTRACT_SOUND, AttentionTV,
                                    AttentionTV, ("m_out", "m_in"), _selection,
                                    states=("≤ 1 * Bridges.tv (p.val.zip p'.val) + "
                                            "Bridges.selectionOffset mOut mIn",),
                                    name="rank-prefix selection"),
    "recurrence": Schema(RECURRENCE_CONTRACT_SOUND, RecurrentStateError, RecurrentStateError,
                         ("a_steps", "b_steps"), _recurrence, premises=(
                             ("a_t >= 0 for every step", _slopes_nonnegative),),
                         states=("Bridges.recurrenceCoeffs (1, 0)",),
                         name="recurrence"),
}.items()}

THEOREMS: dict[str, str] = {
    **{rule: schema.theorem for rule, schema in SCHEMAS.items()},
    "rank_prefix_stable": RANK_PREFIX_STABLE,
}
"""Each public rule of this module and the Lean theorem that proves it."""


def witness_contract(site: type[S], *, witness_max: Number
                     ) -> Contract[KeyResidualAbs[S], KeyResidualAbs[S]]:
    """A stored entry is within its input's error plus its witness: ``e_out <= e_in + witness_max``.

    A witness is the residual norm computed when the entry is written and rounded
    upward when stored, so it bounds the stored residual deterministically. The stored entry's
    distance from the exact one is at most the input's distance from it plus that residual (the
    triangle inequality), so ``a = 1``: an entry stored from an exact input (``e_in = 0``) is
    within the witness alone, and one stored from an already compressed input carries that
    error forward.

    Lean: ``WitCert.Semantic.witness_contract_sound`` (the contract ``storageTriangle``, from
    ``WitCert.Bridges.witness_triangle_sound``'s triangle step).

    Args:
        site: where the residual is consumed, e.g. ``AtConsume``.
        witness_max: the largest stored witness over the entries concerned (>= 0).

    Example:
        >>> from witcert_calculus import AtConsume
        >>> witness_contract(AtConsume, witness_max=0.02).b
        Fraction(5764607523034235, 288230376151711744)
    """
    return SCHEMAS["witness_contract"].issue(site, witness_max=exact(witness_max, "witness_max"))


def latent_witness_contract(site: type[S], *, witness_max: Number
                            ) -> Contract[LatentResidual[S], LatentResidual[S]]:
    """A stored latent entry is within its input's error plus its witness: ``e_out <= e_in + w``.

    The latent cache's counterpart of :func:`witness_contract` (the theorem is stated for
    vectors of any length).

    Lean: ``WitCert.Semantic.witness_contract_sound`` (one metric parameter serves both).

    Example:
        >>> from witcert_calculus import AtConsume
        >>> float(latent_witness_contract(AtConsume, witness_max=0.5).b)
        0.5
    """
    return SCHEMAS["latent_witness_contract"].issue(
        site, witness_max=exact(witness_max, "witness_max"))


def decompression_bridge(site: type[S], *, row_norm_max: Number
                         ) -> Contract[LatentResidual[S], PerTokenMax[S]]:
    """Decompressing a latent, ``v = W c``: each coordinate of the value error is the dot
    product of a row of ``W`` with the latent residual, so by Cauchy–Schwarz
    ``max_j |(W (c_hat - c))_j| <= max_j ||W_j|| * ||c_hat - c||``.

    Lean: ``WitCert.Semantic.decompression_contract_sound`` (the contract
    ``decompressionBridge``, Cauchy–Schwarz ``WitCert.Bridges.score_bridge_sound`` between the
    latent and per-token metrics, for one row ``r`` of ``W``).

    Args:
        site: observation site of both metrics.
        row_norm_max: an upper bound on the largest row norm of ``W`` (>= 0; round it up).

    Example:
        >>> from witcert_calculus import AtConsume
        >>> float(decompression_bridge(AtConsume, row_norm_max=2).a)
        2.0
    """
    return SCHEMAS["decompression_bridge"].issue(
        site, row_norm_max=exact(row_norm_max, "row_norm_max"))


def score_bridge(site: type[S], *, scale: Number, q_norm_max: Number
                 ) -> Contract[KeyResidualAbs[S], LogitLinf[S]]:
    """Cauchy–Schwarz: ``|Δ(scale <q, k>)| <= scale ||q|| ||Δk||``, so ``a = scale * max ||q||``.

    Lean: ``WitCert.Semantic.score_bridge_contract_sound`` (the contract ``scoreBridge``, from
    ``WitCert.Bridges.score_bridge_sound``).

    Args:
        site: observation site of both metrics.
        scale: the attention scale (e.g. ``d ** -0.5``), > 0.
        q_norm_max: the largest query norm the bound covers, >= 0.

    Raises:
        InvalidValueError: on a non-finite or negative argument, ``scale == 0``, or a
            product ``scale * q_norm_max`` above the largest float.

    Example:
        >>> from witcert_calculus import AtConsume
        >>> float(score_bridge(AtConsume, scale=0.125, q_norm_max=8).a)
        1.0
    """
    sc = exact(scale, "scale")
    if sc == 0:
        raise InvalidValueError("scale", scale, "must be > 0")
    q = exact(q_norm_max, "q_norm_max")
    if sc * q > FLOAT_MAX:
        raise InvalidValueError("scale * q_norm_max", f"{scale!r} * {q_norm_max!r}",
                                "must not exceed the largest float (the slope a)")
    return SCHEMAS["score_bridge"].issue(site, scale=sc, q_norm_max=q)


def dropped_mass_tv(site: type[S]) -> Contract[DroppedMass[S], AttentionTV[S]]:
    """Eviction: the TV between full and kept attention *is* the dropped mass, ``e_out <= e_in``.

    A cache that keeps the tokens ``K`` and drops ``D`` serves the softmax over ``K`` alone;
    its TV from the full softmax is ``p(D) = Z_D / (Z_K + Z_D)`` exactly, so a bound on the
    dropped mass (:func:`witcert_calculus.meters.eviction.dropped_mass_batch`) is a bound on
    the attention TV with ``a = 1, b = 0``.

    Lean: ``WitCert.Semantic.evict_tv_meter_eq`` (the contract ``evictTV``, from
    ``WitCert.Eviction.tv_softmax_kept_eq``).

    Example:
        >>> from witcert_calculus import AtConsume
        >>> dropped_mass_tv(AtConsume).bound(0.125).value
        0.125
    """
    return SCHEMAS["dropped_mass_tv"].issue(site)


def softmax_tv_eform(site: type[S]) -> Contract[LogitLinf[S], AttentionTV[S]]:
    """Exact transfer form: ``|Δ_t| <= eps`` for all t gives ``TV <= (exp(2 eps) - 1) / 2``.

    Non-affine: the contract's affine part is the saturation line ``TV <= 1`` and
    its transfer ``(exp(2x) - 1) / 2`` gives the bound; both compose soundly.

    Lean: ``WitCert.Semantic.softmax_tv_eform_contract_sound`` (the contract ``softmaxTVEform``,
    from ``WitCert.Analytic.softmax_tv_eform_sound``).

    Example:
        >>> from witcert_calculus import AtConsume
        >>> round(softmax_tv_eform(AtConsume).bound(0.05).value, 6)
        0.052585
    """
    return SCHEMAS["softmax_tv_eform"].issue(site)


def selector_mass_eform(site: type[S]) -> Contract[LogitLinf[S], SelectorMass[S]]:
    """The e-form bridge applied to a selector's own score softmax (selector-score mass).

    Selector-score mass is kept distinct from attention mass: crossing to attention
    needs a further bridge (e.g. :func:`empirical_ratio_bridge`).

    Lean: ``WitCert.Semantic.selector_mass_eform_contract_sound`` (the contract
    ``selectorMassEform``, into the selector's own mass space).
    """
    return SCHEMAS["selector_mass_eform"].issue(site)


def softmax_tv_tanh(site: type[S]) -> Contract[LogitLinf[S], AttentionTV[S]]:
    """Sharp form from the sup-norm: ``osc <= 2 eps`` so ``TV <= tanh(osc/4) <= tanh(eps/2)``.

    Lean: ``WitCert.Semantic.softmax_tv_tanh_contract_sound`` (the contract ``softmaxTVTanh``,
    from ``WitCert.Analytic.softmax_tv_tanh_sound``).

    Example:
        >>> from witcert_calculus import AtConsume
        >>> round(softmax_tv_tanh(AtConsume).bound(0.05).value, 6)
        0.024995
    """
    return SCHEMAS["softmax_tv_tanh"].issue(site)


def softmax_tv_tanh_osc(site: type[S]) -> Contract[LogitOsc[S], AttentionTV[S]]:
    """Sharp form from the oscillation: ``TV <= tanh(osc / 4)``.

    Lean: ``WitCert.Semantic.softmax_tv_tanh_osc_contract_sound`` (the contract
    ``softmaxTVTanhOsc`` on the oscillation ``max (z' - z) - min (z' - z)``).
    """
    return SCHEMAS["softmax_tv_tanh_osc"].issue(site)


def softmax_tv_affine(site: type[S], *, eps0: Number) -> Contract[LogitLinf[S], AttentionTV[S]]:
    """Affine relaxation ``TV <= exp(2 eps0) * eps`` valid on ``eps <= eps0`` (domain-restricted).

    The slope ``exp(2 eps0)`` is computed with 50 digits and rounded upward.

    Lean: ``WitCert.Semantic.softmax_tv_affine_contract_sound`` (the contract
    ``softmaxTVAffine``, from ``WitCert.Analytic.softmax_tv_affine_sound``).

    Example:
        >>> from witcert_calculus import AtConsume
        >>> c = softmax_tv_affine(AtConsume, eps0=0.1)
        >>> c.tier.name, c.subset
        ('PARTIALLY_CERTIFIED', 'e_in <= 0.1 (exactly 3602879701896397/36028797018963968)')
    """
    return SCHEMAS["softmax_tv_affine"].issue(site, eps0=exact(eps0, "eps0"))


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
    arr = real_array("weights", weights)
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
        l2: ``|Σ w e| <= ||w||_2 * ||e||_2`` (Lean ``WitCert.Semantic.pooling_l2_contract_sound``).
        max: ``|Σ w e| <= ||w||_1 * max |e|``, ``= max |e|`` when the weights sum to 1
            (Lean ``WitCert.Semantic.pooling_max_contract_sound``).
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
    ws = tuple(_weights(weights))
    return Pooling(l2=SCHEMAS["pooling.l2"].issue(site, weights=ws),
                   max=SCHEMAS["pooling.max"].issue(site, weights=ws))


def rank_prefix_selection(site: type[S], *, m_out: Number, m_in: Number
                          ) -> Contract[AttentionTV[S], AttentionTV[S]]:
    """Top-k selection: ``TV <= (m_out + m_in) / 2 + (1/2) Σ_{I∩Î} |p - p̂|``.

    The input is the total variation restricted to the kept set; ``(a, b) =
    (1, (m_out + m_in) / 2)``.

    Lean: ``WitCert.Semantic.rank_prefix_selection_contract_sound`` (the contract
    ``selectionBridge``, from ``WitCert.Bridges.rank_prefix_selection_offset_sound``).

    Args:
        site: observation site.
        m_out: attention mass dropped by the selection, in [0, 1].
        m_in: mass brought in by swapped entries, in [0, 1].

    Example:
        >>> from witcert_calculus import AtConsume
        >>> float(rank_prefix_selection(AtConsume, m_out=0.02, m_in=0.01).b)
        0.015
    """
    return SCHEMAS["rank_prefix_selection"].issue(
        site, m_out=exact(m_out, "m_out", upper=Fraction(1)),
        m_in=exact(m_in, "m_in", upper=Fraction(1)))


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
    arr = np.atleast_2d(real_array("scores", scores))
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

    Lean: ``WitCert.Semantic.Contract.recurrence_sound`` (coefficients of
    ``WitCert.Bridges.recurrence_comp_sound``).

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
    a_arr = real_array("a_steps", a_steps).ravel()
    if a_arr.size == 0:
        raise InvalidValueError("a_steps", a_steps, "needs at least one step")
    b_arr = np.zeros_like(a_arr) if b_steps is None else real_array("b_steps", b_steps).ravel()
    if b_arr.shape != a_arr.shape:
        raise InvalidValueError("b_steps", b_steps, f"must have {a_arr.size} entries like a_steps")
    a_ex = [exact(v, f"a_steps[{i}]") for i, v in enumerate(a_arr.tolist())]
    b_ex = [exact(v, f"b_steps[{i}]") for i, v in enumerate(b_arr.tolist())]
    contract = SCHEMAS["recurrence"].issue(site, a_steps=tuple(a_ex), b_steps=tuple(b_ex),
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

