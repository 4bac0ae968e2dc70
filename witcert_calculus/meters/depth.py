"""Through depth: from a layer's attention-output error to the next-token distribution.

A pre-norm decoder layer of the Llama family (RMSNorm, rotary attention over grouped KV heads,
a SwiGLU MLP) maps the residual stream ``x`` of the current token to

    m = x + W_O attn(n_1(x)),      y = m + W_down (silu(W_gate n_2(m)) * W_up n_2(m)),

and the model's head maps the last layer's output ``h`` to ``softmax(W_U n_f(h))``, where
``n(x) = g * x / rms_eps(x)``. A served run reads a compressed memory; the exact run reads
the exact one. At a layer whose input differs by ``eta = ||x - x*||`` (the metric
:class:`~witcert_calculus.metrics.ResidualL2`), this module bounds what leaves the layer,
from numbers computed on the served run's actual activations (a "local" bound: the
constants are those of this token at this step):

- **RMSNorm** (Lean ``WitCert.Depth.rms_normalize_lipschitz``): ``||n(x) - n(x*)|| <=
  r eta`` with ``r = 2 max|g| / rms_eps(x)``, for every ``x*`` (no domain).
- **Attention sublayer, query side** (``WitCert.Depth.attn_query_step_le``): reading the
  exact cache, the served and exact heads differ only through the current token's query,
  key and value: ``||dq_h|| <= W_Q^h nu``, ``||dk|| <= W_K^g nu``, ``||dv|| <= W_V^g nu``
  (``nu = r eta``; rotary embedding is orthogonal). Every logit shift minus the common
  ``scale dq . c`` is at most ``D_h = scale (dq R_h + ||q_h|| dk + dq dk)`` (Cauchy-Schwarz,
  ``R_h = max_t ||k_t - c||`` over the cache and the current key), so
  ``||o_h - o*_h|| <= 2 M_h tanh(D_h / 2) + dv <= 2 M_h D_h + dv`` with ``M_h = max_t ||v_t||``
  (``tanh y <= 2 y``, ``WitCert.Depth.tanhE_le_two_mul``),
  and ``<= 2 M_h + dv`` always. Across heads (Minkowski) and through ``W_O``:
  ``||m - m*|| <= eta + ||W_O|| (||c_1||_2 nu + ||c_2||_2 nu^2)``,
  ``c_1h = 2 M_h scale (W_Q^h R_h + ||q_h|| W_K^g) + W_V^g``, ``c_2h = 2 M_h scale W_Q^h W_K^g``.
- **Output projection** (``WitCert.Semantic.output_projection_contract_sound``; the
  compression of this layer's memory,
  :class:`~witcert_calculus.metrics.AttentionOutputL2` from the meters, concatenated over the
  heads): ``||W_O e|| <= ||W_O|| ||e||``; its reading adds to the sublayer's
  (``Reading + Reading``, Lean ``WitCert.Contract.add_sound``).
- **MLP sublayer** (``WitCert.Depth.glu_step_le``): with ``a = W_gate u``, ``b = W_up u``,
  ``u = n_2(m)``, ``L = 1.1 >= max |silu'|``, ``B = max |b_j|``, ``P = max |silu(a_j)|``:
  ``||y - y*|| <= eta' + ||W_down|| ((L B W_gate + P W_up) nu' + L W_gate W_up nu'^2)``,
  and, everywhere, with ``P`` replaced by ``A = W_gate max|g_2| sqrt(d) >= |a*_j|`` (an RMSNorm
  output has norm at most ``max|g| sqrt(d)``, and ``|silu(t)| <= |t|``), the affine
  ``eta' + ||W_down|| (L B W_gate + A W_up) nu'``.
- **Head** (``WitCert.Depth.next_token_tv_le``): the vocabulary logits shift by
  ``w_j . dn``; minus ``c . dn`` each is at most ``R_W ||dn||``, ``R_W = max_j ||w_j - c||``,
  so ``TV(next token) <= tanh(R_W r_f eta / 2)``.

Each sublayer is one contract ``ResidualL2 -> ResidualL2`` whose affine part is the bound
that holds everywhere and whose transfer (:attr:`TransferKind.POLY`) is the tighter local
polynomial; a chain of them is composed by the algebra, its tier the weakest of its stages.
Operator norms are rigorous upper bounds (:func:`op_norm_upper`); every float that enters a
coefficient is rounded upward.

What the bound says: the distance between the next-token distribution read through the
compressed memory and the one read through the exact memory, at the same token history of
the cache (after an exact prefill, the first step's distance to the uncompressed model).
Later steps of a generation also differ through the compressed run's own history; the shadow
audit (:mod:`witcert_calculus.accounting.rate`) measures that end-to-end distance.

Main declarations:

- :class:`AttentionSensitivity`, :class:`MlpSensitivity`, :class:`HeadSensitivity`: the
  constants read off the served activations.
- :func:`attention_sublayer`, :func:`output_projection`, :func:`mlp_sublayer`,
  :func:`next_token_head`: the contracts.
- :func:`op_norm_upper`, :func:`rms_slope`, :func:`silu_lipschitz`: the numbers they need.
- :data:`SILU_LIPSCHITZ`.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Any, Final, TypeVar, final

import numpy as np
import numpy.typing as npt

from witcert_calculus.contracts import Contract, Number, Transfer, TransferKind
from witcert_calculus.errors import InvalidValueError
from witcert_calculus.lean.theorems import (
    ATTN_QUERY_STEP_LE,
    GLU_STEP_LE,
    OUTPUT_PROJECTION_CONTRACT_SOUND,
    NEXT_TOKEN_CONTRACT_SOUND,
    NEXT_TOKEN_TV_LE,
    RESIDUAL_STEP_CONTRACT_SOUND,
    RMS_NORMALIZE_LIPSCHITZ,
)
from witcert_calculus.metrics import AttentionOutputL2, NextTokenTV, ResidualL2, Site
from witcert_calculus.numerics.validation import UNIT_ROUNDOFF, exact, real, real_array
from witcert_calculus.schemas import Claim, Schema, _builtin  # pyright: ignore[reportPrivateUsage]
from witcert_calculus.tiers import Assumption

__all__ = [
    "EIGENSOLVER_ASSUMPTION",
    "SCHEMAS",
    "SILU_LIPSCHITZ",
    "THEOREMS",
    "AttentionSensitivity",
    "HeadSensitivity",
    "MlpSensitivity",
    "attention_sublayer",
    "mlp_sublayer",
    "next_token_head",
    "op_norm_upper",
    "output_projection",
    "rms_slope",
    "silu_lipschitz",
]

S = TypeVar("S", bound=Site)
FloatArray = npt.NDArray[np.float64]

#: An upper bound of ``max_t |silu'(t)|`` (the exact value is 1.0998...,
#: :func:`silu_lipschitz` computes it; a test checks the bound).
SILU_LIPSCHITZ: Final = Fraction(11, 10)


def _up(x: float, terms: int = 1) -> float:
    """``x`` enlarged by a relative ``4 (terms + 4) u``: above the float64 error of a sum of
    ``terms`` nonnegative products, a square root and a division computed from it."""
    if not math.isfinite(x):
        raise InvalidValueError("x", x, "must be finite")
    return math.nextafter(x * (1.0 + 4.0 * (terms + 4) * UNIT_ROUNDOFF), math.inf)


def _down(x: float, terms: int = 1) -> float:
    return math.nextafter(x * (1.0 - 4.0 * (terms + 4) * UNIT_ROUNDOFF), -math.inf)


def op_norm_upper(w: npt.ArrayLike) -> float:
    """A rigorous upper bound of the operator (spectral) norm ``||W||_2`` of a matrix.

    The Gram matrix ``G`` of the smaller side is formed in float64 (entrywise error at most
    ``gamma_m ||W||_F^2`` in Frobenius norm); ``eigvalsh``'s largest eigenvalue is exact for
    ``G + E`` with ``||E||_2 <= 8 n u ||G||_F`` (symmetric eigensolvers are backward stable;
    the constant is generous); by Weyl's inequality ``||W||_2^2`` is at most the computed
    eigenvalue plus both perturbations, rounded upward.

    Raises:
        InvalidValueError: on a matrix that is not 2-D, empty or not finite.

    Example:
        >>> 5.0 <= op_norm_upper([[3.0, 0.0], [0.0, 5.0]]) < 5.0 + 1e-9
        True
    """
    m = real_array("w", w)
    if m.ndim != 2 or m.size == 0 or not np.isfinite(m).all():
        raise InvalidValueError("w", f"array of shape {m.shape}", "must be a finite, nonempty "
                                "matrix")
    if m.shape[0] > m.shape[1]:
        m = m.T
    g = m @ m.T
    n, k = g.shape[0], m.shape[1]
    fro2 = _up(float(np.sum(m * m)), m.size)
    g_fro = _up(float(np.sqrt(np.sum(g * g))), g.size)
    lam = float(np.linalg.eigvalsh(g)[-1])
    gamma = (k + 4) * UNIT_ROUNDOFF / (1 - (k + 4) * UNIT_ROUNDOFF)
    bound = max(lam, 0.0) + gamma * fro2 + 8 * n * UNIT_ROUNDOFF * g_fro
    return _up(math.sqrt(_up(bound, 4)))


def rms_slope(x: npt.ArrayLike, *, gain_max: float, eps: float) -> float:
    """``2 max|g| / rms_eps(x)``, rounded upward: RMSNorm's slope at the served ``x``.

    ``||n(x) - n(x*)|| <= rms_slope * ||x - x*||`` for every ``x*`` (Lean
    ``WitCert.Depth.rms_normalize_lipschitz`` with ``a^2 = ||x||^2 + d eps``).

    Raises:
        InvalidValueError: on a non-finite ``x``, a negative gain bound or ``eps < 0``.

    Example:
        >>> 1.0 <= rms_slope([1.0, 1.0, 1.0, 1.0], gain_max=0.5, eps=0.0) < 1.0 + 1e-12
        True
    """
    v = real_array("x", x).reshape(-1)
    if v.size == 0 or not np.isfinite(v).all():
        raise InvalidValueError("x", f"array of shape {v.shape}", "must be finite and nonempty")
    g = real("gain_max", gain_max, lo=0.0)
    e = real("eps", eps, lo=0.0)
    ms = _down(float(np.sum(v * v)), v.size) / v.size + e
    if ms <= 0:
        raise InvalidValueError("x", "zero vector with eps = 0", "RMSNorm is undefined there")
    return _up(2.0 * g / _down(math.sqrt(_down(ms))))


@lru_cache(maxsize=1)
def silu_lipschitz() -> float:
    """``max_t |silu'(t)|``, computed with mpmath at 50 digits (1.0998...).

    ``silu'(t) = s(t) (1 + t (1 - s(t)))`` with ``s`` the logistic function tends to 1 at
    ``+inf`` and 0 at ``-inf``; its extremes are where ``silu''`` vanishes, found here.

    Example:
        >>> 1.0998 < silu_lipschitz() < float(SILU_LIPSCHITZ)
        True
    """
    mp: Any = importlib.import_module("mpmath")
    with mp.workdps(50):
        def d1(t: Any) -> Any:
            s = 1 / (1 + mp.exp(-t))
            return s * (1 + t * (1 - s))

        def d2(t: Any) -> Any:
            return mp.diff(d1, t)

        hi = d1(mp.findroot(d2, 2.4))
        lo = d1(mp.findroot(d2, -2.4))
        return float(max(abs(hi), abs(lo), mp.mpf(1)))


def _nonneg_vec(name: str, v: npt.ArrayLike, size: int | None = None) -> FloatArray:
    a = real_array(name, v).reshape(-1)
    if a.size == 0 or not np.isfinite(a).all() or (a < 0).any():
        raise InvalidValueError(name, a.tolist() if a.size < 8 else f"array of shape {a.shape}",
                                "must be finite, nonnegative and nonempty")
    if size is not None and a.size != size:
        raise InvalidValueError(name, f"{a.size} entries", f"must have {size}, one per head")
    return a


def _l2_up(v: FloatArray) -> float:
    return _up(math.sqrt(_up(float(np.sum(v * v)), v.size)))


@final
@dataclass(frozen=True, slots=True)
class AttentionSensitivity:
    """One layer's attention sublayer at the served token: the numbers its bound reads.

    Attributes (per query head where an array, all upper bounds, all >= 0):
        norm_slope: :func:`rms_slope` of the layer's input norm.
        scale: the attention scale.
        out_norm: ``||W_O||_2``.
        wq, wk, wv: ``||W_Q^h||_2``, and ``||W_K^g||_2``, ``||W_V^g||_2`` of the head's KV group.
        q_norm: ``||q_h||`` of the served query (after the rotary embedding).
        key_radius: ``max_t ||k_t - c_g||`` over the cache and the current key, some center.
        value_norm: ``max_t ||v_t||`` over the cache and the current value.

    Raises:
        InvalidValueError: on a negative or non-finite number, or arrays of unequal lengths.
    """

    norm_slope: float
    scale: float
    out_norm: float
    wq: FloatArray
    wk: FloatArray
    wv: FloatArray
    q_norm: FloatArray
    key_radius: FloatArray
    value_norm: FloatArray

    def __post_init__(self) -> None:
        for name in ("norm_slope", "scale", "out_norm"):
            object.__setattr__(self, name, real(name, getattr(self, name), lo=0.0))
        heads = np.asarray(self.wq).size
        for name in ("wq", "wk", "wv", "q_norm", "key_radius", "value_norm"):
            object.__setattr__(self, name, _nonneg_vec(name, getattr(self, name), heads))

    def coefficients(self) -> tuple[tuple[float, float, float], tuple[float, float]]:
        """``((0, c_1, c_2), (a, b))``: the local polynomial in ``eta`` and the global affine
        bound of ``||m - m*||`` (the sublayer alone, reading the exact cache)."""
        r, sc, wo = self.norm_slope, self.scale, self.out_norm
        # 2 M tanh(D / 2) <= 2 M D (tanh y <= 2 y, WitCert.Depth.tanhE_le_two_mul)
        c1 = 2 * self.value_norm * sc * (self.wq * self.key_radius + self.q_norm * self.wk) \
            + self.wv
        c2 = 2 * self.value_norm * sc * self.wq * self.wk
        p1 = _up(1.0 + wo * r * _l2_up(c1), 3)
        p2 = _up(wo * r * r * _l2_up(c2), 3)
        a = _up(1.0 + wo * r * _l2_up(self.wv), 3)
        b = _up(2.0 * wo * _l2_up(self.value_norm))
        return (0.0, p1, p2), (a, b)


@final
@dataclass(frozen=True, slots=True)
class MlpSensitivity:
    """One layer's SwiGLU MLP at the served token: the numbers its bound reads.

    Attributes (all upper bounds, >= 0):
        norm_slope: :func:`rms_slope` of the MLP's input norm.
        down_norm, gate_norm, up_norm: ``||W_down||_2``, ``||W_gate||_2``, ``||W_up||_2``.
        up_max: ``max_j |b_j|`` of the served ``b = W_up u``.
        act_max: ``max_j |silu(a_j)|`` of the served ``a = W_gate u``.
        gate_reach: ``||W_gate||_2 max|g_2| sqrt(d)``: at least ``|a*_j|`` for every input.

    Raises:
        InvalidValueError: on a negative or non-finite number.
    """

    norm_slope: float
    down_norm: float
    gate_norm: float
    up_norm: float
    up_max: float
    act_max: float
    gate_reach: float

    def __post_init__(self) -> None:
        for name in ("norm_slope", "down_norm", "gate_norm", "up_norm", "up_max", "act_max",
                     "gate_reach"):
            object.__setattr__(self, name, real(name, getattr(self, name), lo=0.0))

    def coefficients(self) -> tuple[tuple[float, float, float], tuple[float, float]]:
        """``((0, c_1, c_2), (a, 0))``: the local polynomial and the global affine bound of
        ``||y - y*||`` in ``eta' = ||m - m*||``."""
        r, wd, wg, wu = self.norm_slope, self.down_norm, self.gate_norm, self.up_norm
        lip = float(SILU_LIPSCHITZ)
        p1 = _up(1.0 + wd * r * (lip * self.up_max * wg + self.act_max * wu), 6)
        p2 = _up(wd * lip * wg * wu * r * r, 5)
        a = _up(1.0 + wd * r * (lip * self.up_max * wg + self.gate_reach * wu), 6)
        return (0.0, p1, p2), (a, 0.0)


@final
@dataclass(frozen=True, slots=True)
class HeadSensitivity:
    """The model's head at the served last hidden state.

    Attributes (upper bounds, >= 0):
        norm_slope: :func:`rms_slope` of the final norm.
        row_radius: ``max_j ||w_j - c||`` over the rows of ``W_U``, some center ``c``.

    Raises:
        InvalidValueError: on a negative or non-finite number.
    """

    norm_slope: float
    row_radius: float

    def __post_init__(self) -> None:
        for name in ("norm_slope", "row_radius"):
            object.__setattr__(self, name, real(name, getattr(self, name), lo=0.0))

    def tanh_slope(self) -> float:
        """``k = R_W r_f / 2``: ``TV <= tanh(k eta)``."""
        return _up(self.row_radius * self.norm_slope / 2.0, 2)


# --------------------------------------------------------------------------- contracts

#: The operator norms come from a symmetric eigensolver whose backward error is taken as
#: ``8 n u ||G||_F`` (:func:`op_norm_upper`): a standard bound of numerical linear algebra that
#: no code checks here.
EIGENSOLVER_ASSUMPTION: Final = Assumption(
    "the symmetric eigensolver's backward error is at most 8 n u ||G||_F",
    reason="a property of LAPACK's algorithm, not checked where the norm is computed")

_RESIDUAL = ("≤ N.norm (N.sub x x') + T (N.norm (N.sub x x'))",)


def _poly_claim(coefficients: tuple[tuple[float, float, float], tuple[float, float]]) -> Claim:
    (c0, c1, c2), (a, b) = coefficients
    # The transfer e + T(e) of the Lean contract, written as one polynomial (c_1 includes the 1).
    return Claim(a=Fraction(a) if a > 0 else 0, b=Fraction(b),
                 transfer=Transfer(TransferKind.POLY,
                                   coeffs=(Fraction(c0), Fraction(c1), Fraction(c2))))


def _attention_claim(sens: AttentionSensitivity) -> Claim:
    return _poly_claim(sens.coefficients())


def _mlp_claim(sens: MlpSensitivity) -> Claim:
    return _poly_claim(sens.coefficients())


def _silu_premise(sens: MlpSensitivity) -> bool:
    return silu_lipschitz() <= float(SILU_LIPSCHITZ)


def _projection_claim(out_norm: Fraction) -> Claim:
    return Claim(a=out_norm, b=0)


def _head_claim(slope: Fraction) -> Claim:
    # The affine part is the saturation line TV <= 1; the transfer tanh(slope * e) the bound.
    return Claim(a=0, b=1, transfer=Transfer(TransferKind.TANH, slope))


def _norm_nonneg(out_norm: Fraction) -> bool:
    return out_norm >= 0


def _slope_nonneg(slope: Fraction) -> bool:
    return slope >= 0


#: The schemas of this module's contracts.
SCHEMAS: Final[dict[str, Schema]] = {rule: _builtin(schema) for rule, schema in {
    "attention_sublayer": Schema(
        RESIDUAL_STEP_CONTRACT_SOUND, ResidualL2, ResidualL2, ("sens",), _attention_claim,
        states=_RESIDUAL, name="attention sublayer (query side, exact cache)",
        assumptions=(EIGENSOLVER_ASSUMPTION,)),
    "mlp_sublayer": Schema(
        RESIDUAL_STEP_CONTRACT_SOUND, ResidualL2, ResidualL2, ("sens",), _mlp_claim,
        premises=(("max |silu'| <= 1.1 (computed with 50 digits)", _silu_premise),),
        states=_RESIDUAL, name="MLP sublayer (SwiGLU)", assumptions=(EIGENSOLVER_ASSUMPTION,)),
    "output_projection": Schema(
        OUTPUT_PROJECTION_CONTRACT_SOUND, AttentionOutputL2, ResidualL2, ("out_norm",),
        _projection_claim, premises=(("||W_O|| bound >= 0", _norm_nonneg),),
        states=("≤ L * N.norm (N.sub x x')",), name="output projection W_O",
        assumptions=(EIGENSOLVER_ASSUMPTION,)),
    "next_token_head": Schema(
        NEXT_TOKEN_CONTRACT_SOUND, ResidualL2, NextTokenTV, ("slope",), _head_claim,
        premises=(("R_W r_f / 2 >= 0", _slope_nonneg),),
        states=("≤ Analytic.tanhE E (R * N.norm (N.sub x x') / 2)",),
        name="next-token head (final norm, unembedding, softmax)"),
}.items()}

THEOREMS: dict[str, str] = {
    **{rule: schema.theorem for rule, schema in SCHEMAS.items()},
    "rms_slope": RMS_NORMALIZE_LIPSCHITZ,
    "attention_step": ATTN_QUERY_STEP_LE,
    "mlp_step": GLU_STEP_LE,
    "head_step": NEXT_TOKEN_TV_LE,
}
"""Each public rule of this module and the Lean theorem that proves it."""


def attention_sublayer(site: type[S], sens: AttentionSensitivity
                       ) -> Contract[ResidualL2[S], ResidualL2[S]]:
    """The attention sublayer's residual step, reading the exact cache (see the module
    docstring): affine everywhere, the local polynomial as its transfer.

    Lean: ``WitCert.Semantic.residual_step_contract_sound`` with the transfer of
    ``WitCert.Depth.attn_query_step_le`` and ``rms_normalize_lipschitz``.

    Example:
        >>> from witcert_calculus import AtConsume
        >>> s = AttentionSensitivity(norm_slope=0.5, scale=0.125, out_norm=2.0, wq=[1.0],
        ...     wk=[1.0], wv=[1.0], q_norm=[4.0], key_radius=[2.0], value_norm=[3.0])
        >>> c = attention_sublayer(AtConsume, s)
        >>> 0.01 < c.bound(0.01).value < 0.2, c.tier.name
        (True, 'PARTIALLY_CERTIFIED')
    """
    if not isinstance(sens, AttentionSensitivity):
        raise InvalidValueError("sens", type(sens).__name__, "must be an AttentionSensitivity")
    return SCHEMAS["attention_sublayer"].issue(site, sens=sens)


def mlp_sublayer(site: type[S], sens: MlpSensitivity) -> Contract[ResidualL2[S], ResidualL2[S]]:
    """The SwiGLU MLP's residual step (see the module docstring).

    Lean: ``WitCert.Semantic.residual_step_contract_sound`` with the transfer of
    ``WitCert.Depth.glu_step_le``, ``hadamard_sq_le``, ``lipschitz_sq_le`` and
    ``rms_normalize_lipschitz``.
    """
    if not isinstance(sens, MlpSensitivity):
        raise InvalidValueError("sens", type(sens).__name__, "must be an MlpSensitivity")
    return SCHEMAS["mlp_sublayer"].issue(site, sens=sens)


def output_projection(site: type[S], *, out_norm: Number
                      ) -> Contract[AttentionOutputL2[S], ResidualL2[S]]:
    """``||W_O e|| <= ||W_O|| ||e||``: a layer's attention-output error (the meters' bound,
    all heads concatenated) into the residual stream.

    Lean: ``WitCert.Semantic.output_projection_contract_sound``.
    """
    return SCHEMAS["output_projection"].issue(site, out_norm=exact(out_norm, "out_norm"))


def next_token_head(site: type[S], head: HeadSensitivity
                    ) -> Contract[ResidualL2[S], NextTokenTV[S]]:
    """``TV(next token) <= tanh(R_W r_f eta / 2)``.

    Lean: ``WitCert.Semantic.next_token_contract_sound`` (``R = R_W r_f``).
    """
    if not isinstance(head, HeadSensitivity):
        raise InvalidValueError("head", type(head).__name__, "must be a HeadSensitivity")
    return SCHEMAS["next_token_head"].issue(site, slope=Fraction(head.tanh_slope()))
