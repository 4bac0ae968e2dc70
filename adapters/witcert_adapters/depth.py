"""Through depth on a Hugging Face model: per-layer memory bounds carried to the next token.

A served forward reads a compressed KV memory at the layers of a *depth window* (the others
read the exact one); an exact forward beside it reads the exact memory everywhere. For the
current (last) token of each forward this module

1. meters every head of every window layer (Tier A, deterministic: the key and value
   witnesses ``||k_t - k^_t||``, ``||v_t - v^_t||`` written when the entries are stored,
   :func:`witcert_kernels.meter.logit_bound`, :func:`~witcert_kernels.meter.tv_meter_batch`,
   :func:`~witcert_kernels.meter.output_error_bound`): the attention-output error of the
   layer's own compression, a :class:`~witcert_calculus.metrics.AttentionOutputL2` reading;
2. reads the constants of :mod:`witcert_calculus.meters.depth` off the served activations (the
   layer's input and middle residual, queries, the cache's keys and values, the MLP's gate
   and up activations; operator norms once per model, :class:`ModelNorms`);
3. composes the contracts of :mod:`witcert_calculus.meters.depth` from the window's first layer to
   the head: a :class:`~witcert_calculus.metrics.ResidualL2` reading after every layer and a
   :class:`~witcert_calculus.metrics.NextTokenTV` reading of the next-token distribution;
4. audits: the true residual distance after every layer and the true next-token TV, from the
   exact forward (float64 arithmetic on the float32 activations).

Both forwards read the same cache history (the exact model's keys and values, compressed on
read at the window's layers, the current token's entries included, as a cache holds them):
the bound is about the memory's effect at this step. The model runs in float32 eager
arithmetic; the bounds are of exact arithmetic on the served activations, with margins.

Main declarations
-----------------
- :class:`ModelNorms`, :func:`model_norms`: the model's operator norms (once per model).
- :class:`DepthStep`, :func:`depth_step`: one token's bound and audit.
"""

from __future__ import annotations

import math
from collections.abc import Generator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Final, cast, final

import numpy as np
import torch
from torch.utils.hooks import RemovableHandle

from witcert_adapters.schemes import EntryRole, WriteContext, get_scheme
from witcert_calculus.contracts import Reading, _reading  # pyright: ignore[reportPrivateUsage]
from witcert_calculus.meters.depth import (
    SILU_LIPSCHITZ,
    AttentionSensitivity,
    HeadSensitivity,
    MlpSensitivity,
    attention_sublayer,
    mlp_sublayer,
    next_token_head,
    op_norm_upper,
    output_projection,
    rms_slope,
)
from witcert_calculus.errors import InvalidValueError
from witcert_calculus.lean.theorems import (
    OUTPUT_ERROR_CONTRACT_AT,
    TV_EFORM_METER_SOUND,
    TV_TWO_SIDED_METER_SOUND,
)
from witcert_calculus.meters.tv_forms import TVBasis
from witcert_calculus.meters.witness import RopeLayout
from witcert_calculus.metrics import AtConsume, AttentionOutputL2, NextTokenTV, ResidualL2
from witcert_calculus.tiers import Composition, _premise, _proof  # pyright: ignore[reportPrivateUsage]
from witcert_kernels.meter import l2_norm_upper, logit_bound, output_error_bound, tv_meter_batch

__all__ = ["ATTENTION", "DepthStep", "ModelNorms", "compressed_step", "depth_step", "divergence",
           "model_norms"]

#: The name this module's attention function is registered under.
ATTENTION: Final = "witcert_depth"

_F64 = torch.float64


def _inner(model: Any) -> Any:
    return model.model.language_model if hasattr(model.model, "language_model") else model.model


@final
@dataclass(frozen=True, slots=True)
class ModelNorms:
    """Operator-norm upper bounds and gains of a Llama-family model (computed once).

    Attributes (lists indexed by layer; per head or KV group where nested):
        wq, wk, wv: ``||W_Q^h||``, ``||W_K^g||``, ``||W_V^g||``.
        wo, wgate, wup, wdown: the layer's ``||W_O||``, ``||W_gate||``, ``||W_up||``, ``||W_down||``.
        g1, g2: ``max |g|`` of the input and post-attention RMSNorm gains.
        gf: ``max |g|`` of the final norm.
        eps: RMSNorm's epsilon.
        row_radius: ``max_j ||w_j - c||`` over the head's rows, ``c`` their mean.
        hidden: the residual stream's width.
    """

    wq: list[list[float]]
    wk: list[list[float]]
    wv: list[list[float]]
    wo: list[float]
    wgate: list[float]
    wup: list[float]
    wdown: list[float]
    g1: list[float]
    g2: list[float]
    gf: float
    eps: float
    row_radius: float
    hidden: int


def _np(t: torch.Tensor) -> np.ndarray[Any, Any]:
    return t.detach().to(_F64).cpu().numpy()


def _slices(w: torch.Tensor, n: int) -> list[float]:
    rows = w.shape[0] // n
    return [op_norm_upper(_np(w[i * rows:(i + 1) * rows])) for i in range(n)]


def _gain_max(norm: Any) -> float:
    return float(torch.max(torch.abs(norm.weight.detach().to(_F64))))


def model_norms(model: Any) -> ModelNorms:
    """The operator norms and gains of ``model`` (a Llama-family causal LM, bias-free).

    Raises:
        InvalidValueError: if a projection has a bias (not modelled) or the head is missing.

    Example:
        >>> # norms = model_norms(model); len(norms.wo) == model.config.num_hidden_layers
    """
    cfg = model.config
    heads, groups = int(cfg.num_attention_heads), int(cfg.num_key_value_heads)
    out: dict[str, list[Any]] = {k: [] for k in ("wq", "wk", "wv", "wo", "wgate", "wup",
                                                 "wdown", "g1", "g2")}
    for i, layer in enumerate(_inner(model).layers):
        att, mlp = layer.self_attn, layer.mlp
        for name, mod in (("q_proj", att.q_proj), ("k_proj", att.k_proj), ("v_proj", att.v_proj),
                          ("o_proj", att.o_proj), ("gate_proj", mlp.gate_proj),
                          ("up_proj", mlp.up_proj), ("down_proj", mlp.down_proj)):
            if getattr(mod, "bias", None) is not None:
                raise InvalidValueError(f"layers[{i}].{name}.bias", "present",
                                        "the depth bridge models bias-free projections")
        out["wq"].append(_slices(att.q_proj.weight, heads))
        out["wk"].append(_slices(att.k_proj.weight, groups))
        out["wv"].append(_slices(att.v_proj.weight, groups))
        out["wo"].append(op_norm_upper(_np(att.o_proj.weight)))
        out["wgate"].append(op_norm_upper(_np(mlp.gate_proj.weight)))
        out["wup"].append(op_norm_upper(_np(mlp.up_proj.weight)))
        out["wdown"].append(op_norm_upper(_np(mlp.down_proj.weight)))
        out["g1"].append(_gain_max(layer.input_layernorm))
        out["g2"].append(_gain_max(layer.post_attention_layernorm))
    head = model.get_output_embeddings()
    if head is None or getattr(head, "bias", None) is not None:
        raise InvalidValueError("lm_head", head, "must be a bias-free linear head")
    w = head.weight.detach().to(_F64)
    radius = float(torch.sqrt(((w - w.mean(dim=0)) ** 2).sum(dim=1)).max())
    return ModelNorms(**out, gf=_gain_max(_inner(model).norm), eps=float(cfg.rms_norm_eps),
                      row_radius=radius * (1 + 1e-12), hidden=int(cfg.hidden_size))


#: Norms of no model: an unmetered forward reads none.
_NO_NORMS: Final = ModelNorms([], [], [], [], [], [], [], [], [], 0.0, 0.0, 0.0, 0)


@dataclass
class _Layer:
    # What one layer recorded for the current token of the served forward.
    local: float = 0.0                      # ||concat_h beta_h||: this layer's compression
    local_truth: float = 0.0                # its true value
    basis: TVBasis | None = None            # what the layer's TV bounds rest on
    checks: tuple[tuple[str, bool], ...] = ()  # the output bound's premises, computed
    sens: AttentionSensitivity | None = None
    x: torch.Tensor | None = None           # input residual
    m: torch.Tensor | None = None           # middle residual
    out: torch.Tensor | None = None         # output residual


@dataclass
class _Forward:
    window: frozenset[int]
    scheme: str | None
    norms: ModelNorms
    meter: bool = True          # record the bounds' numbers (else: only compress and attend)
    layers: dict[int, _Layer] = field(default_factory=dict[int, "_Layer"])

    def at(self, i: int) -> _Layer:
        return self.layers.setdefault(i, _Layer())


def _compress(scheme: str, x: torch.Tensor, layer: int, role: EntryRole) -> torch.Tensor:
    # The whole cache at once: every built-in scheme (dithered keys aside) is per token, so
    # this equals what the cache stored when each entry was written.
    ctx = WriteContext(request_id=0, layer=layer, start=0, role=role)
    return get_scheme(scheme).fn(x, ctx).to(x.dtype)


def _attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
            mask: torch.Tensor | None, scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    groups = query.shape[1] // key.shape[1]
    k = key.repeat_interleave(groups, dim=1)
    v = value.repeat_interleave(groups, dim=1)
    s = torch.matmul(query, k.transpose(2, 3)) * scaling
    if mask is not None:
        s = s + mask[:, :, :, : k.shape[-2]]
    p = torch.softmax(s, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(p, v).transpose(1, 2).contiguous(), p


def _attention_function(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        attention_mask: torch.Tensor | None, scaling: float,
                        dropout: float = 0.0, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager attention; at a window layer of a served forward it reads the compressed memory,
    meters the last query row and records the constants of its propagation bound."""
    run: _Forward | None = getattr(module, "_witcert_depth", None)
    i = int(module.layer_idx)
    if run is None or run.scheme is None or i not in run.window:
        out, p = _attend(query, key, value, attention_mask, scaling)
        if run is not None and run.meter:
            _record(run, i, query, key, value, p, scaling, None)
        return out, p
    k_hat = _compress(run.scheme, key, i, EntryRole.KEY)
    v_hat = _compress(run.scheme, value, i, EntryRole.VALUE)
    out, p = _attend(query, k_hat, v_hat, attention_mask, scaling)
    if run.meter:
        _record(run, i, query, key, value, p, scaling, (k_hat, v_hat))
    return out, p


def _record(run: _Forward, i: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
            p: torch.Tensor, scaling: float, hat: tuple[torch.Tensor, torch.Tensor] | None) -> None:
    # The last query row of batch 0: [H, d] queries, [G, T, d] entries, [H, T] probabilities.
    q = query[0, :, -1].to(_F64)
    k, v = key[0].to(_F64), value[0].to(_F64)
    groups = q.shape[0] // k.shape[0]
    rec = run.at(i)
    if hat is not None:
        k_hat, v_hat = hat[0][0].to(_F64), hat[1][0].to(_F64)
        wit = l2_norm_upper(k - k_hat).repeat_interleave(groups, dim=0)        # [H, T]
        rho = l2_norm_upper(v - v_hat).repeat_interleave(groups, dim=0)
        stored = l2_norm_upper(v_hat).repeat_interleave(groups, dim=0)
        vmax = (stored + rho).max(dim=-1).values
        p_tilde = p[0, :, -1].to(_F64)
        c = logit_bound(q, wit[..., None], scale=float(scaling), layout=RopeLayout.HALF_SPLIT)
        meter = tv_meter_batch(p_tilde, c)
        beta = output_error_bound(meter.meter, value_norm_max=vmax, p_tilde=p_tilde, rho=rho)
        rec.local = math.nextafter(float(torch.sqrt((beta ** 2).sum())) * (1 + 1e-12), math.inf)
        rec.basis = meter.basis
        rec.checks = (
            ("rho_t >= 0 for every token t (value witnesses)", bool((rho >= 0).all())),
            ("p_tilde is a probability vector (renormalized)",
             bool(torch.isfinite(p_tilde).all() and (p_tilde >= 0).all()
                  and (p_tilde.sum(dim=-1) > 0).all())),
            ("value_norm_max >= ||v^_t|| + rho_t >= ||v_t|| for every token t",
             bool((vmax[:, None] >= stored + rho).all())))
        kx, vx = k.repeat_interleave(groups, dim=0), v.repeat_interleave(groups, dim=0)
        p_exact = torch.softmax((kx @ q[..., None])[..., 0] * scaling, dim=-1)
        o_exact = (p_exact[..., None] * vx).sum(dim=1)
        o_served = (p_tilde[..., None] * v_hat.repeat_interleave(groups, dim=0)).sum(dim=1)
        gap = o_served - o_exact
        rec.local_truth = float(torch.sqrt((gap * gap).sum()))
    center = k.mean(dim=1, keepdim=True)
    radius = l2_norm_upper(k - center).max(dim=-1).values.repeat_interleave(groups)
    vnorm = l2_norm_upper(v).max(dim=-1).values.repeat_interleave(groups)
    n = run.norms
    rep = [g for g in range(k.shape[0]) for _ in range(groups)]
    rec.sens = AttentionSensitivity(
        norm_slope=0.0, scale=float(scaling), out_norm=n.wo[i], wq=np.array(n.wq[i]),
        wk=np.array([n.wk[i][g] for g in rep]), wv=np.array([n.wv[i][g] for g in rep]),
        q_norm=l2_norm_upper(q).numpy(), key_radius=radius.numpy(), value_norm=vnorm.numpy())


@contextmanager
def _probe(model: Any, run: _Forward) -> Generator[None, None, None]:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(ATTENTION, _attention_function)  # pyright: ignore[reportUnknownMemberType]
    AttentionMaskInterface.register(  # pyright: ignore[reportUnknownMemberType]
        ATTENTION, ALL_MASK_ATTENTION_FUNCTIONS["eager"])  # pyright: ignore[reportUnknownArgumentType]
    handles: list[RemovableHandle] = []
    layers = _inner(model).layers
    for i, layer in enumerate(layers):
        layer.self_attn._witcert_depth = run

        def pre(mod: Any, args: Any, kwargs: dict[str, Any], i: int = i) -> None:
            hs: torch.Tensor = args[0] if args else kwargs["hidden_states"]
            run.at(i).x = hs[0, -1].detach().clone()

        def mid(mod: Any, args: Any, i: int = i) -> None:
            run.at(i).m = args[0][0, -1].detach().clone()

        def post(mod: Any, args: Any, kwargs: dict[str, Any], output: Any, i: int = i) -> None:
            hs = cast(torch.Tensor, output[0] if isinstance(output, tuple) else output)
            run.at(i).out = hs[0, -1].detach().clone()

        handles.append(layer.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(layer.post_attention_layernorm.register_forward_pre_hook(mid))
        handles.append(layer.register_forward_hook(post, with_kwargs=True))
    previous = model.config._attn_implementation
    model.config._attn_implementation = ATTENTION
    for layer in layers:
        layer.self_attn.config._attn_implementation = ATTENTION
    try:
        yield
    finally:
        model.config._attn_implementation = previous
        for layer in layers:
            layer.self_attn.config._attn_implementation = previous
            del layer.self_attn._witcert_depth
        for h in handles:
            h.remove()


def _rms64(x: torch.Tensor, gain: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.to(_F64)
    return gain.to(_F64) * x / torch.sqrt((x * x).mean() + eps)


def _matvec_upper(w: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # W u in float64 and a bound of its rounding error, gamma_n |W| |u| (n the inner width).
    w64, u64 = w.detach().to(_F64), u.to(_F64)
    n = u64.numel()
    gamma = (n + 2) * 2.0 ** -53 / (1 - (n + 2) * 2.0 ** -53)
    return w64 @ u64, gamma * (w64.abs() @ u64.abs())


def _mlp_sensitivity(layer: Any, m: torch.Tensor, norms: ModelNorms, i: int) -> MlpSensitivity:
    mlp = layer.mlp
    u = _rms64(m, layer.post_attention_layernorm.weight.detach(), norms.eps)
    a, ea = _matvec_upper(mlp.gate_proj.weight, u)
    b, eb = _matvec_upper(mlp.up_proj.weight, u)
    act = (torch.abs(torch.nn.functional.silu(a)) * (1 + 1e-12)
           + float(SILU_LIPSCHITZ) * ea).max()
    return MlpSensitivity(
        norm_slope=rms_slope(_np(m), gain_max=norms.g2[i], eps=norms.eps),
        down_norm=norms.wdown[i], gate_norm=norms.wgate[i], up_norm=norms.wup[i],
        up_max=float((b.abs() + eb).max()), act_max=float(act),
        gate_reach=norms.wgate[i] * norms.g2[i] * math.sqrt(norms.hidden) * (1 + 1e-12))


def _local_reading(rec: _Layer) -> Reading[AttentionOutputL2[AtConsume]]:
    # The layer's own compression: the Tier-A meter's TV bounds (their basis: the logit bounds
    # established from the witnesses written with the entries) through the output bound,
    # whose value norms and value witnesses are computed from the stored entries.
    assert rec.basis is not None
    tv = rec.basis.evidence(TV_EFORM_METER_SOUND, TV_TWO_SIDED_METER_SOUND)
    out = _proof(OUTPUT_ERROR_CONTRACT_AT, tuple(_premise(text, holds)
                                                 for text, holds in rec.checks))
    return _reading(AttentionOutputL2[AtConsume], rec.local, evidence=Composition((tv, out)))


@final
@dataclass(frozen=True, slots=True)
class DepthStep:
    """One token's depth bound beside its audit.

    Attributes:
        first: the window's first layer (the layers before it read the exact memory).
        local: per layer from ``first``: ``||concat_h beta_h||``, the layer's own compression.
        local_truth: per layer from ``first``: the true error of the concatenated heads.
        bound: per layer from ``first``: the bound of ``||h - h*||`` after the layer.
        truth: per layer from ``first``: the true ``||h - h*||`` after the layer.
        reading: the next-token TV bound, a typed reading (its tier SATURATED when the
            bound says nothing).
        tv_truth: the true next-token TV.
        kl_truth: the true ``KL(exact || served)`` of the next token.
        head_slope: ``k`` of the head's ``TV <= tanh(k eta)`` (what the head alone would give
            at the true distance: ``tanh(k truth[-1])``).
    """

    first: int
    local: tuple[float, ...]
    local_truth: tuple[float, ...]
    bound: tuple[float, ...]
    truth: tuple[float, ...]
    reading: Reading[NextTokenTV[AtConsume]]
    tv_truth: float
    kl_truth: float
    head_slope: float

    @property
    def tv_bound(self) -> float:
        """The next-token TV bound's value (at most 1)."""
        return self.reading.value


def compressed_step(model: Any, token: torch.Tensor, cache: Any, *, scheme: str) -> torch.Tensor:
    """Decode ``token`` (``[1, 1]``) after ``cache``, every layer reading its memory compressed
    by ``scheme`` (the current token's entries included); return the next-token logits
    (float64). The cache keeps the exact entries (each read compresses them, as the cache
    would have stored them)."""
    layers = frozenset(range(len(_inner(model).layers)))
    return _forward(model, token, cache, _Forward(layers, scheme, _NO_NORMS, meter=False))


def divergence(served: torch.Tensor, exact: torch.Tensor) -> tuple[list[float], list[float]]:
    """Per row of two ``[steps, vocab]`` log-probability arrays: the true next-token TV and
    ``KL(exact || served)`` (float64 as given; a token without exact mass adds nothing)."""
    p, px = torch.exp(served), torch.exp(exact)
    tv = 0.5 * (p - px).abs().sum(dim=-1)
    kl = torch.where(px > 0, px * (exact - served), torch.zeros_like(px)).sum(dim=-1)
    return [float(t) for t in tv], [float(k) for k in kl]


def _forward(model: Any, ids: torch.Tensor, cache: Any, run: _Forward) -> torch.Tensor:
    with _probe(model, run), torch.no_grad():
        out = model(ids[:, -1:], cache=cache, use_cache=True)
    logits: torch.Tensor = out.logits[0, -1].to(_F64)
    return logits


def depth_step(model: Any, ids: torch.Tensor, *, scheme: str, window: Sequence[int],
               norms: ModelNorms, cache: Any | None = None) -> DepthStep:
    """Bound and audit the next-token distribution after ``ids`` (batch 1).

    The prefix ``ids[:, :-1]`` is prefilled exactly (or ``cache`` holds it); the last token is
    decoded twice, reading the memory compressed by ``scheme`` at the layers of ``window`` and
    reading it exact.

    Raises:
        InvalidValueError: on an empty window or a layer out of range.
    """
    from transformers import DynamicCache

    layers = _inner(model).layers
    win = frozenset(int(w) for w in window)
    if not win or min(win) < 0 or max(win) >= len(layers):
        raise InvalidValueError("window", sorted(win), f"must be layers in [0, {len(layers)})")
    if cache is None:
        cache = DynamicCache(config=model.config)
        with torch.no_grad():
            model(ids[:, :-1], cache=cache, use_cache=True)
    served = _Forward(win, scheme, norms)
    logits = _forward(model, ids, cache, served)
    cache.crop(-1)
    exact = _Forward(frozenset(), None, norms, meter=False)
    logits_x = _forward(model, ids, cache, exact)
    cache.crop(-1)
    first = min(win)
    eta: Reading[ResidualL2[AtConsume]] | None = None
    local: list[float] = []
    local_truth: list[float] = []
    bound: list[float] = []
    truth: list[float] = []
    for i in range(first, len(layers)):
        rec, ref = served.at(i), exact.at(i)
        assert rec.sens is not None and rec.x is not None and rec.m is not None
        assert rec.out is not None and ref.out is not None
        sens = replace(rec.sens, norm_slope=rms_slope(_np(rec.x), gain_max=norms.g1[i],
                                                      eps=norms.eps))
        attention = attention_sublayer(AtConsume, sens)
        mid = attention.bound(0.0 if eta is None else eta)
        if i in win:
            mid = mid + output_projection(AtConsume, out_norm=norms.wo[i]).bound(
                _local_reading(rec))
        eta = mlp_sublayer(AtConsume, _mlp_sensitivity(layers[i], rec.m, norms, i)).bound(mid)
        local.append(rec.local)
        local_truth.append(rec.local_truth)
        bound.append(eta.raw)
        diff = rec.out.to(_F64) - ref.out.to(_F64)
        truth.append(float(torch.sqrt((diff * diff).sum())))
    h_last = served.at(len(layers) - 1).out
    assert h_last is not None and eta is not None
    head = HeadSensitivity(norm_slope=rms_slope(_np(h_last), gain_max=norms.gf, eps=norms.eps),
                           row_radius=norms.row_radius)
    tv_reading = next_token_head(AtConsume, head).bound(eta)
    (tv,), (kl,) = divergence(torch.log_softmax(logits, -1)[None],
                              torch.log_softmax(logits_x, -1)[None])
    return DepthStep(first, tuple(local), tuple(local_truth), tuple(bound), tuple(truth),
                     tv_reading, tv, kl, head.tanh_slope())
