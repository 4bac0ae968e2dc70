"""Through depth: each step's bound against an adversary that searches the ball for the worst
perturbation (projected gradient ascent, float64), the operator norms against the SVD, the
polynomial transfer, the contracts' metrics, and bad input."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from witcert_calculus import (
    AtConsume,
    AttentionSensitivity,
    HeadSensitivity,
    MlpSensitivity,
    attention_sublayer,
    mlp_sublayer,
    next_token_head,
    op_norm_upper,
    output_projection,
)
from witcert_calculus.contracts import Transfer, TransferKind
from witcert_calculus.errors import InvalidValueError, MetricMismatchError
from witcert_calculus.meters.depth import SILU_LIPSCHITZ, rms_slope, silu_lipschitz
from witcert_calculus.tiers import Tier

F64 = torch.float64
EPS = 1e-6


def _norm(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return g * x / torch.sqrt((x * x).mean() + EPS)


class Layer:
    """A tiny pre-norm decoder layer in float64: GQA attention over a fixed exact cache plus
    the current token's own entries, and a SwiGLU MLP; weights at a chosen scale."""

    def __init__(self, seed: int, scale: float, d: int = 8, heads: int = 2, hd: int = 4,
                 past: int = 5, inner: int = 12) -> None:
        g = torch.Generator().manual_seed(seed)

        def w(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=g, dtype=F64) * scale

        self.d, self.heads, self.hd = d, heads, hd
        self.wq, self.wk, self.wv, self.wo = w(heads * hd, d), w(hd, d), w(hd, d), w(d, heads * hd)
        self.g1 = 1 + 0.3 * torch.randn(d, generator=g, dtype=F64)
        self.g2 = 1 + 0.3 * torch.randn(d, generator=g, dtype=F64)
        self.wg, self.wu, self.wd = w(inner, d), w(inner, d), w(d, inner)
        self.keys = torch.randn(past, hd, generator=g, dtype=F64)
        self.values = torch.randn(past, hd, generator=g, dtype=F64)
        self.x = torch.randn(d, generator=g, dtype=F64) * 2
        self.scale = hd ** -0.5

    def attn(self, x: torch.Tensor) -> torch.Tensor:
        u = _norm(x, self.g1)
        k = torch.cat([self.keys, (self.wk @ u)[None]])
        v = torch.cat([self.values, (self.wv @ u)[None]])
        q = (self.wq @ u).reshape(self.heads, self.hd)
        p = torch.softmax(q @ k.T * self.scale, dim=-1)
        return x + self.wo @ (p @ v).reshape(-1)

    def mlp(self, m: torch.Tensor) -> torch.Tensor:
        u = _norm(m, self.g2)
        return m + self.wd @ (torch.nn.functional.silu(self.wg @ u) * (self.wu @ u))

    def attention_sensitivity(self) -> AttentionSensitivity:
        u = _norm(self.x, self.g1)
        k = torch.cat([self.keys, (self.wk @ u)[None]])
        v = torch.cat([self.values, (self.wv @ u)[None]])
        q = (self.wq @ u).reshape(self.heads, self.hd)
        radius = float((k - k.mean(0)).norm(dim=-1).max()) * (1 + 1e-12)
        rep = np.ones(self.heads)
        return AttentionSensitivity(
            norm_slope=rms_slope(self.x.numpy(), gain_max=float(self.g1.abs().max()), eps=EPS),
            scale=self.scale, out_norm=op_norm_upper(self.wo.numpy()),
            wq=np.array([op_norm_upper(self.wq[h * self.hd:(h + 1) * self.hd].numpy())
                         for h in range(self.heads)]),
            wk=rep * op_norm_upper(self.wk.numpy()), wv=rep * op_norm_upper(self.wv.numpy()),
            q_norm=q.norm(dim=-1).numpy() * (1 + 1e-12), key_radius=rep * radius,
            value_norm=rep * float(v.norm(dim=-1).max()) * (1 + 1e-12))

    def mlp_sensitivity(self, m: torch.Tensor) -> MlpSensitivity:
        u = _norm(m, self.g2)
        a, b = self.wg @ u, self.wu @ u
        g2 = float(self.g2.abs().max())
        return MlpSensitivity(
            norm_slope=rms_slope(m.numpy(), gain_max=g2, eps=EPS),
            down_norm=op_norm_upper(self.wd.numpy()), gate_norm=op_norm_upper(self.wg.numpy()),
            up_norm=op_norm_upper(self.wu.numpy()), up_max=float(b.abs().max()) * (1 + 1e-12),
            act_max=float(torch.nn.functional.silu(a).abs().max()) * (1 + 1e-12),
            gate_reach=op_norm_upper(self.wg.numpy()) * g2 * math.sqrt(self.d) * (1 + 1e-12))


def _worst(f: object, x: torch.Tensor, eta: float, seed: int, steps: int = 150) -> float:
    """The largest ``||f(x + delta) - f(x)||`` found on the sphere ``||delta|| = eta``."""
    fn = f  # a callable torch function
    g = torch.Generator().manual_seed(seed)
    base = fn(x).detach()  # type: ignore[operator]
    best = 0.0
    for _ in range(4):
        delta = torch.randn(x.shape, generator=g, dtype=F64)
        delta = (delta * eta / delta.norm()).requires_grad_(True)
        for _ in range(steps):
            gap = (fn(x + delta) - base).norm()  # type: ignore[operator]
            best = max(best, float(gap.detach()))
            (grad,) = torch.autograd.grad(gap, delta)
            with torch.no_grad():
                step = delta + eta * 0.3 * grad / (grad.norm() + 1e-300)
                delta = (step * eta / step.norm()).requires_grad_(True)
        best = max(best, float((fn(x + delta) - base).norm().detach()))  # type: ignore[operator]
    return best


@given(seed=st.integers(0, 10_000), scale=st.sampled_from([0.05, 0.3, 1.0]),
       eta=st.sampled_from([1e-3, 0.05, 0.5, 3.0]))
@settings(max_examples=12, deadline=None)
def test_attention_sublayer_holds_against_the_worst_perturbation(seed: int, scale: float,
                                                                  eta: float) -> None:
    layer = Layer(seed, scale)
    bound = attention_sublayer(AtConsume, layer.attention_sensitivity()).bound(eta).value
    assert _worst(layer.attn, layer.x, eta, seed) <= bound


@given(seed=st.integers(0, 10_000), scale=st.sampled_from([0.05, 0.3, 1.0]),
       eta=st.sampled_from([1e-3, 0.05, 0.5, 3.0]))
@settings(max_examples=12, deadline=None)
def test_mlp_sublayer_holds_against_the_worst_perturbation(seed: int, scale: float,
                                                            eta: float) -> None:
    layer = Layer(seed, scale)
    m = layer.attn(layer.x).detach()
    bound = mlp_sublayer(AtConsume, layer.mlp_sensitivity(m)).bound(eta).value
    assert _worst(layer.mlp, m, eta, seed) <= bound


@given(seed=st.integers(0, 10_000), eta=st.sampled_from([1e-3, 0.02, 0.3]))
@settings(max_examples=10, deadline=None)
def test_next_token_head_holds_against_the_worst_perturbation(seed: int, eta: float) -> None:
    g = torch.Generator().manual_seed(seed)
    unembed = torch.randn(40, 8, generator=g, dtype=F64) * 0.3
    gain = 1 + 0.2 * torch.randn(8, generator=g, dtype=F64)
    h = torch.randn(8, generator=g, dtype=F64) * 2

    def dist(x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(unembed @ _norm(x, gain), dim=-1)

    radius = float((unembed - unembed.mean(0)).norm(dim=-1).max()) * (1 + 1e-12)
    head = HeadSensitivity(norm_slope=rms_slope(h.numpy(), gain_max=float(gain.abs().max()),
                                                eps=EPS), row_radius=radius)
    reading = next_token_head(AtConsume, head).bound(eta)
    # ||p - p*||_2 <= ||p - p*||_1 = 2 TV: the adversary maximises the l2 gap, then the TV is
    # measured at the perturbation it found and at random ones.
    worst_l2 = _worst(dist, h, eta, seed)
    assert worst_l2 / 2 <= reading.value
    for _ in range(20):
        d = torch.randn(8, generator=g, dtype=F64)
        tv = 0.5 * float((dist(h + d * eta / d.norm()) - dist(h)).abs().sum())
        assert tv <= reading.value
    assert reading.tier is Tier.CERTIFIED


@given(seed=st.integers(0, 10_000), size=st.sampled_from([1e-4, 0.1, 1.0, 10.0]))
@settings(max_examples=60, deadline=None)
def test_rms_slope_bounds_rmsnorm_for_any_perturbation(seed: int, size: float) -> None:
    rng = np.random.default_rng(seed)
    d = int(rng.integers(2, 40))
    x, delta = rng.normal(size=d) * rng.uniform(0.01, 10), rng.normal(size=d)
    delta *= size / np.linalg.norm(delta)
    gain = rng.normal(size=d)
    eps = float(rng.choice([0.0, 1e-6, 1e-2]))

    def n(v: np.ndarray) -> np.ndarray:
        return gain * v / math.sqrt(float(np.mean(v * v)) + eps)

    for y in (x + delta, -x, x * 0.5, x + 1e-9):   # crossing zero and near-collinear cases too
        if eps == 0 and not np.any(y):
            continue
        gap = float(np.linalg.norm(n(x) - n(y)))
        assert gap <= rms_slope(x, gain_max=float(np.abs(gain).max()), eps=eps) * float(
            np.linalg.norm(x - y)) * (1 + 1e-12) + 1e-300


@given(seed=st.integers(0, 10_000), rows=st.integers(1, 30), cols=st.integers(1, 30))
@settings(max_examples=60, deadline=None)
def test_op_norm_upper_bounds_the_largest_singular_value(seed: int, rows: int, cols: int) -> None:
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(rows, cols)) * 10 ** rng.uniform(-3, 3)
    if rng.random() < 0.3:                      # rank one: the Gram matrix is singular
        w = np.outer(rng.normal(size=rows), rng.normal(size=cols))
    sigma = float(np.linalg.svd(w, compute_uv=False)[0])
    up = op_norm_upper(w)
    assert sigma <= up <= sigma * (1 + 1e-8) + 1e-300


def test_silu_constant_covers_its_derivative() -> None:
    assert 1.0998 < silu_lipschitz() <= float(SILU_LIPSCHITZ)
    t = torch.linspace(-40, 40, 400_001, dtype=F64)
    s = torch.nn.functional.silu(t)
    slopes = (s[1:] - s[:-1]).abs() / (t[1:] - t[:-1])
    assert float(slopes.max()) <= float(SILU_LIPSCHITZ)


def test_polynomial_transfer_is_exact_and_checked() -> None:
    t = Transfer(TransferKind.POLY, coeffs=(Fraction(1, 3), Fraction(2), Fraction(5)))
    assert t(0.5) >= float(Fraction(1, 3) + 1 + Fraction(5, 4))
    assert t(0.5) == math.nextafter(float(Fraction(1, 3) + 1 + Fraction(5, 4)), math.inf) or \
        t(0.5) == float(Fraction(1, 3) + 1 + Fraction(5, 4))
    assert t(math.inf) == math.inf
    with pytest.raises(InvalidValueError, match="coeffs"):
        Transfer(TransferKind.POLY, coeffs=(Fraction(-1),))
    with pytest.raises(InvalidValueError, match="coeffs"):
        Transfer(TransferKind.POLY)
    with pytest.raises(InvalidValueError, match="coeffs"):
        Transfer(TransferKind.TANH, coeffs=(Fraction(1),))


def test_contracts_compose_by_metric_and_refuse_a_mismatch() -> None:
    layer = Layer(3, 0.05)
    attn = attention_sublayer(AtConsume, layer.attention_sensitivity())
    mlp = mlp_sublayer(AtConsume, layer.mlp_sensitivity(layer.attn(layer.x).detach()))
    head = next_token_head(AtConsume, HeadSensitivity(norm_slope=0.5, row_radius=1.0))
    proj = output_projection(AtConsume, out_norm=2.0)
    chain = proj >> mlp >> head
    reading = chain.bound(1e-3)
    assert reading.value < 1
    assert reading.tier is Tier.PARTIALLY_CERTIFIED     # operator norms: the eigensolver
    assert "eigensolver" in chain.explain()
    # the composite is at least the stages applied in turn (the chain is never tighter)
    step = mlp.bound(proj.bound(1e-3).value).value
    assert head.bound(step).value <= reading.value * (1 + 1e-12)
    with pytest.raises(MetricMismatchError):
        head >> attn  # type: ignore[operator]
    with pytest.raises(MetricMismatchError):
        proj >> proj  # type: ignore[operator]
    saturated = (attn >> mlp >> head).bound(1e6)
    assert saturated.value == 1.0 and saturated.tier is Tier.SATURATED


def test_bad_input_is_refused_by_name() -> None:
    with pytest.raises(InvalidValueError, match="key_radius"):
        AttentionSensitivity(norm_slope=1, scale=1, out_norm=1, wq=[1.0], wk=[1.0], wv=[1.0],
                             q_norm=[1.0], key_radius=[-1.0], value_norm=[1.0])
    with pytest.raises(InvalidValueError, match="one per head"):
        AttentionSensitivity(norm_slope=1, scale=1, out_norm=1, wq=[1.0, 1.0], wk=[1.0], wv=[1.0],
                             q_norm=[1.0], key_radius=[1.0], value_norm=[1.0])
    with pytest.raises(InvalidValueError, match="up_max"):
        MlpSensitivity(norm_slope=1, down_norm=1, gate_norm=1, up_norm=1, up_max=math.nan,
                       act_max=1, gate_reach=1)
    with pytest.raises(InvalidValueError, match="row_radius"):
        HeadSensitivity(norm_slope=1, row_radius=-2)
    with pytest.raises(InvalidValueError, match="w"):
        op_norm_upper([[math.inf]])
    with pytest.raises(InvalidValueError, match="x"):
        rms_slope([0.0, 0.0], gain_max=1.0, eps=0.0)
    with pytest.raises(InvalidValueError, match="sens"):
        attention_sublayer(AtConsume, "not a sensitivity")  # type: ignore[arg-type]
