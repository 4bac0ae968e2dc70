"""Learned sparse selector (DeepSeek-V3.2's indexer): compressed indexer keys, selection contract.

Memory class ``sparse selector``: a learned indexer scores every cached token and the
attention reads only the top-k. The indexer keys live in the cache
(``Cache.update_indexer``, overridden here to compress them and record the witness
``w_t = ||k_hat_t - k_t||``). For query row ``s`` the index score is
``I[s, t] = sum_h g[s, h] * scale * relu(q[s, h] . k_t)``; relu is 1-Lipschitz, so the score
error is at most ``eps[s, t] = scale * sum_h |g[s, h]| ||q[s, h]|| * w_t`` (Cauchy-Schwarz).

Two readings per row, kept apart:

- **selection**: the row is *rank-prefix stable* when its top-k margin exceeds
  ``2 * max_t eps[s, t]`` (``bridges.rank_prefix_stable``); on stable rows the selected set
  equals the exact one (a certificate restricted to that decidable subset of rows);
- **selector-score mass**: ``SelectorMass`` of the softmax of the index scores, bounded
  through ``bridges.selector_mass_eform`` from the row's score error. This is mass of the
  selector's own distribution, not attention mass.

The queries and gate weights are recomputed in a pre-hook from the indexer's own
projections (``wq_b``, ``weights_proj``) and rotary tables; the compressed scores are
recomputed from the cached keys, and the top-k of those must equal what the model selected
(checked). With ``audit=True`` the exact keys are kept, and the exact selection and score
distribution are compared on every row.

Main declarations
-----------------
- :class:`SelectorCache`, :class:`SelectorProbe`, :class:`SelectorRun`, :func:`run_selector_gate`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, final

import numpy as np
import numpy.typing as npt
import torch
from transformers import DynamicCache

from witcert_adapters.gate import GateVerdict, StageResult
from witcert_adapters.schemes import Scheme, WriteContext, get_scheme
from witcert_calculus.errors import InvalidValueError
from witcert_kernels.meter import l2_norm, round_up_f32

__all__ = ["SelectorCache", "SelectorProbe", "SelectorRun", "run_selector_gate"]

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


class SelectorCache(DynamicCache):
    """A ``DynamicCache`` whose indexer keys are compressed and witnessed on write."""

    def __init__(self, *, config: Any, scheme: Scheme, request_id: int = 0) -> None:
        super().__init__(config=config)
        self.scheme = scheme
        self.request_id = request_id
        self.witness: dict[int, list[torch.Tensor]] = {}
        self.exact: dict[int, list[torch.Tensor]] = {}
        self.writes: dict[int, int] = {}

    def update_indexer(self, indexer_key_states: torch.Tensor, layer_idx: int) -> torch.Tensor:
        """Compress new indexer keys ``[B, S, D]``, record witnesses, store them as usual."""
        start = self.writes.get(layer_idx, 0)
        k = indexer_key_states.unsqueeze(1)
        hat = self.scheme(k, WriteContext(self.request_id, layer_idx, start, "indexer_key"))
        self.witness.setdefault(layer_idx, []).append(
            round_up_f32(l2_norm(hat.to(torch.float64) - k.to(torch.float64)))[:, 0])
        self.exact.setdefault(layer_idx, []).append(indexer_key_states.detach())
        self.writes[layer_idx] = start + indexer_key_states.shape[1]
        out: torch.Tensor = super().update_indexer(hat[:, 0], layer_idx)
        return out


@final
@dataclass(frozen=True, slots=True)
class SelectorRun:
    """What a selector probe observed; row arrays are ``[B, S]`` per layer.

    Attributes:
        scheme / layers / declared / observed / writes: as for the attention probe.
        k: the indexer's top-k per layer.
        eps: per-row score-error bound ``max_t eps[s, t]``.
        margin: per-row top-k margin of the compressed scores.
        stable: rows certified rank-prefix stable.
        mass_bound: per-row ``SelectorMass`` bound (raw e-form of ``eps``).
        selection_matches_model: recomputed compressed top-k equals the model's choice.
        same_selection: (audit) exact and compressed top-k sets are equal.
        true_mass: (audit) TV between exact and compressed score softmax.
    """

    scheme: str
    layers: tuple[int, ...]
    declared: frozenset[tuple[int, str]]
    observed: frozenset[tuple[int, str]]
    writes: dict[int, int]
    k: dict[int, int]
    eps: dict[int, FloatArray]
    margin: dict[int, FloatArray]
    stable: dict[int, BoolArray]
    mass_bound: dict[int, FloatArray]
    selection_matches_model: dict[int, bool]
    same_selection: dict[int, BoolArray]
    true_mass: dict[int, FloatArray]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class SelectorProbe:
    """Attach indexer-key compression and the selection contract to DeepSeek-V3.2 indexers.

    Args:
        model: a model whose attention layers own an ``indexer`` module.
        scheme: registered scheme for the indexer keys.
        request_id: request id.
        audit: compare with the exact selection on every row.

    Raises:
        InvalidValueError: unknown scheme, or no indexer in the model.
    """

    def __init__(self, model: Any, *, scheme: str, request_id: int = 0, audit: bool = False) -> None:
        self.model = model
        self.scheme = get_scheme(scheme)
        self.request_id = request_id
        self.audit = audit
        self.indexers = sorted(((m.layer_idx, m) for m in model.modules()
                                if hasattr(m, "wq_b") and hasattr(m, "index_topk")),
                               key=lambda t: t[0])
        if not self.indexers:
            raise InvalidValueError("model", type(model).__name__, "has no learned indexer")
        self.cache: SelectorCache | None = None
        self._pending: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self._rows: dict[int, list[dict[str, Any]]] = {}
        self._handles: list[Any] = []
        for layer, ix in self.indexers:
            self._handles.append(ix.register_forward_pre_hook(self._make_pre(layer, ix), with_kwargs=True))
            self._handles.append(ix.register_forward_hook(self._make_post(layer, ix), with_kwargs=True))

    def declared(self) -> frozenset[tuple[int, str]]:
        """``(layer, path)`` pairs promised: indexer-key writes, selection reads, audit."""
        paths = ["write", "select"] + (["audit"] if self.audit else [])
        return frozenset((layer, p) for layer, _ in self.indexers for p in paths)

    def new_cache(self) -> SelectorCache:
        """A fresh cache for one request."""
        self.cache = SelectorCache(config=self.model.config, scheme=self.scheme,
                                   request_id=self.request_id)
        self._rows.clear()
        return self.cache

    def close(self) -> None:
        """Remove the hooks."""
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _make_pre(self, layer: int, ix: Any) -> Any:
        def pre(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            hidden, q_resid, pos, mask = args[0], args[1], args[2], args[3]
            b, s, _ = hidden.shape
            with torch.no_grad():
                q = ix.wq_b(q_resid).view(b, s, ix.n_heads, ix.head_dim)
                q_rot, q_pass = torch.split(q, [ix.qk_rope_head_dim, ix.head_dim - ix.qk_rope_head_dim],
                                            dim=-1)
                cos, sin = pos
                q_rot = q_rot * cos.unsqueeze(2) + _rotate_half(q_rot) * sin.unsqueeze(2)
                q = torch.cat([q_rot, q_pass], dim=-1)
                g = ix.weights_proj(hidden).float() * (ix.n_heads ** -0.5)
            self._pending[layer] = (q, g, mask)
        return pre

    def _make_post(self, layer: int, ix: Any) -> Any:
        def post(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: torch.Tensor) -> None:
            cache = self.cache
            if cache is None:
                raise InvalidValueError("cache", None, "call SelectorProbe.new_cache() first")
            q, g, mask = self._pending.pop(layer)
            with torch.no_grad():
                entry: Any = cache.layers[layer]
                k_hat: torch.Tensor = entry.indexer_keys
                w = torch.cat(cache.witness[layer], dim=1).to(torch.float64)  # [B, T]
                qd, gd = q.to(torch.float64), g.to(torch.float64)
                scale = float(ix.softmax_scale)

                def scores(keys: torch.Tensor) -> torch.Tensor:
                    sc = torch.relu(torch.einsum("bshd,btd->bsht", qd, keys.to(torch.float64)) * scale)
                    out = torch.einsum("bsh,bsht->bst", gd, sc)
                    if mask.dtype == torch.bool:
                        return out.masked_fill(~mask, float("-inf"))
                    return out + mask.to(torch.float64)

                s_hat = scores(k_hat)
                eps_tok = scale * torch.einsum("bsh,bt->bst", gd.abs() * l2_norm(qd), w)
                valid = torch.isfinite(s_hat)
                eps_row = torch.where(valid, eps_tok, torch.zeros_like(eps_tok)).amax(dim=-1)
                kk = int(output.shape[-1])
                row: dict[str, Any] = {"k": kk, "eps": eps_row * (1.0 + 1e-12)}
                n_valid = valid.sum(dim=-1)
                top = torch.topk(s_hat, min(kk + 1, s_hat.shape[-1]), dim=-1).values
                if top.shape[-1] > kk:
                    margin = top[..., kk - 1] - top[..., kk]
                    margin = torch.where(n_valid > kk, margin, torch.full_like(margin, float("inf")))
                else:
                    margin = torch.full(top.shape[:-1], float("inf"), dtype=torch.float64)
                row["margin"] = margin
                model_set = torch.zeros_like(valid).scatter_(-1, output.long(), True) & valid
                mine = torch.zeros_like(valid).scatter_(-1, s_hat.topk(kk, dim=-1).indices, True) & valid
                row["matches"] = bool(torch.equal(model_set, mine))
                eps_c = torch.clamp(eps_row, max=350.0)
                row["mass_bound"] = torch.where(eps_row > 350.0, torch.full_like(eps_row, float("inf")),
                                                0.5 * torch.expm1(2.0 * eps_c)) * (1.0 + 1e-12) + 1e-15
                if self.audit:
                    k_ex = torch.cat(cache.exact[layer], dim=1)
                    s_ex = scores(k_ex)
                    exact_set = torch.zeros_like(valid).scatter_(-1, s_ex.topk(kk, dim=-1).indices, True) & valid
                    row["same"] = (exact_set == mine).all(dim=-1)
                    p_ex = torch.softmax(s_ex, dim=-1)
                    p_hat = torch.softmax(s_hat, dim=-1)
                    row["true_mass"] = 0.5 * (p_ex - p_hat).abs().sum(dim=-1)
                self._rows.setdefault(layer, []).append(row)
        return post

    def result(self) -> SelectorRun:
        """Collect the run."""
        cache = self.cache
        if cache is None:
            raise InvalidValueError("probe", "detached", "nothing observed")
        observed: set[tuple[int, str]] = set()
        k: dict[int, int] = {}
        eps: dict[int, FloatArray] = {}
        margin: dict[int, FloatArray] = {}
        stable: dict[int, BoolArray] = {}
        mass: dict[int, FloatArray] = {}
        matches: dict[int, bool] = {}
        same: dict[int, BoolArray] = {}
        true: dict[int, FloatArray] = {}
        for layer, _ in self.indexers:
            if cache.writes.get(layer):
                observed.add((layer, "write"))
            rows = self._rows.get(layer)
            if not rows:
                continue
            observed.add((layer, "select"))
            k[layer] = rows[0]["k"]
            eps[layer] = torch.cat([r["eps"] for r in rows], dim=1).numpy()
            margin[layer] = torch.cat([r["margin"] for r in rows], dim=1).numpy()
            stable[layer] = margin[layer] > 2.0 * eps[layer]
            mass[layer] = torch.cat([r["mass_bound"] for r in rows], dim=1).numpy()
            matches[layer] = all(bool(r["matches"]) for r in rows)
            if self.audit:
                observed.add((layer, "audit"))
                same[layer] = torch.cat([r["same"] for r in rows], dim=1).numpy()
                true[layer] = torch.cat([r["true_mass"] for r in rows], dim=1).numpy()
        return SelectorRun(self.scheme.name, tuple(sorted(eps)), self.declared(), frozenset(observed),
                           dict(cache.writes), k, eps, margin, stable, mass, matches, same, true)

    def readings(self, run: SelectorRun, layer: int) -> tuple[Any, Any]:
        """The layer's worst-row ``SelectorMass`` reading and the stable-row fraction.

        Returns:
            ``(reading, stable_fraction)``; the reading comes from
            ``bridges.selector_mass_eform`` at the layer's largest row score error.
        """
        from witcert_calculus.bridges import selector_mass_eform
        from witcert_calculus.metrics import AtConsume

        return (selector_mass_eform(AtConsume).bound(float(run.eps[layer].max())),
                float(run.stable[layer].mean()))


def run_selector_gate(run: SelectorRun, *, tokens: int) -> GateVerdict:
    """Coverage, magnitude, soundness for a selector run.

    Soundness: on every stable row the exact selection equals the compressed one, and on
    every row the true selector-score TV is at most its bound.
    """
    problems: list[str] = []
    if run.observed != run.declared:
        problems.append(f"declared but never observed: {sorted(run.declared - run.observed)[:6]}; "
                        f"observed but never declared: {sorted(run.observed - run.declared)[:6]}")
    for layer in sorted({layer for layer, _ in run.declared}):
        if run.writes.get(layer, 0) != tokens:
            problems.append(f"layer {layer}: {run.writes.get(layer, 0)} indexer keys written, expected {tokens}")
        if layer in run.selection_matches_model and not run.selection_matches_model[layer]:
            problems.append(f"layer {layer}: recomputed selection differs from the model's")
    cov = StageResult("coverage", not problems, "; ".join(problems[:6]) if problems else
                      f"{len(run.declared)} (layer, path) pairs", checked=len(run.declared),
                      failures=len(problems))
    if problems:
        return GateVerdict((cov, StageResult("magnitude", None, "coverage failed"),
                            StageResult("soundness", None, "coverage failed")))
    bad = [f"layer {layer}: score-error bounds not finite and >= 0" for layer in run.layers
           if not (np.isfinite(run.eps[layer]).all() and (run.eps[layer] >= 0).all())]
    mag = StageResult("magnitude", not bad, "; ".join(bad) if bad else "bounds finite and >= 0")
    if bad:
        return GateVerdict((cov, mag, StageResult("soundness", None, "magnitude failed")))
    viol = 0
    rows = 0
    for layer in run.layers:
        same = run.same_selection.get(layer)
        true = run.true_mass.get(layer)
        if same is None or true is None:
            viol += 1
            continue
        rows += same.size
        viol += int((run.stable[layer] & ~same).sum())
        viol += int((true > np.minimum(1.0, run.mass_bound[layer])).sum())
    sound = StageResult("soundness", viol == 0, f"{rows} audited rows, {viol} violations",
                        checked=rows, failures=viol)
    return GateVerdict((cov, mag, sound))
