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
- :class:`SelectorCache`, :class:`SelectorProbe`, :func:`run_selector_gate`.
- :class:`SelectorRun` and its per-layer records :class:`SelectorLayerRecord`,
  :class:`SelectionRecord`, :class:`SelectionAuditRecord`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, final

import numpy as np
import numpy.typing as npt
import torch
from torch.utils.hooks import RemovableHandle
from transformers import DynamicCache

from witcert_adapters.gate import GateVerdict, Stage, StageResult, ordered_verdict, site_problems
from witcert_adapters.runs import MemoryKind, ProbePath, Site, observed_sites
from witcert_adapters.schemes import EntryRole, Scheme, WriteContext, get_scheme
from witcert_calculus.bridges import selector_mass_eform
from witcert_calculus.contracts import Reading
from witcert_calculus.errors import InvalidValueError
from witcert_calculus.metrics import AtConsume, SelectorMass
from witcert_calculus.numerics.validation import positive_int
from witcert_kernels.meter import l2_norm_upper, round_up_f32

__all__ = ["SelectionAuditRecord", "SelectionRecord", "SelectorCache", "SelectorLayerRecord",
           "SelectorProbe", "SelectorRun", "run_selector_gate"]

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


def _tensors() -> dict[int, list[torch.Tensor]]:
    return {}


class SelectorCache(DynamicCache):
    """A ``DynamicCache`` whose indexer keys are compressed and witnessed on write.

    Args:
        config: the model config.
        scheme: compression scheme for the indexer keys.
        request_id: keys randomised schemes.
    """

    def __init__(self, *, config: Any, scheme: Scheme, request_id: int = 0) -> None:
        super().__init__(config=config)
        self.scheme = scheme
        self.request_id = request_id
        self.witness: dict[int, list[torch.Tensor]] = _tensors()
        self.exact: dict[int, list[torch.Tensor]] = _tensors()
        self.writes: dict[int, int] = {}

    def update_indexer(self, indexer_key_states: torch.Tensor, layer_idx: int) -> torch.Tensor:
        """Compress new indexer keys ``[B, S, D]``, record witnesses, store them as usual."""
        start = self.writes.get(layer_idx, 0)
        k = indexer_key_states.unsqueeze(1)
        ctx = WriteContext(self.request_id, layer_idx, start, EntryRole.INDEXER_KEY)
        hat = self.scheme(k, ctx)
        self.witness.setdefault(layer_idx, []).append(
            round_up_f32(l2_norm_upper(hat.to(torch.float64) - k.to(torch.float64)))[:, 0])
        self.exact.setdefault(layer_idx, []).append(indexer_key_states.detach())
        self.writes[layer_idx] = start + indexer_key_states.shape[1]
        out: torch.Tensor = super().update_indexer(hat[:, 0], layer_idx)
        return out


@final
@dataclass(frozen=True, slots=True)
class SelectionRecord:
    """A layer's selection contract per query row; row arrays are ``[B, S]``.

    Attributes:
        k: the indexer's top-k.
        eps: per-row score-error bound ``max_t eps[s, t]``.
        margin: per-row top-k margin of the compressed scores.
        stable: rows certified rank-prefix stable (``margin > 2 eps``).
        mass_bound: per-row ``SelectorMass`` bound (raw e-form of ``eps``).
        selection_matches_model: the recomputed compressed top-k equals the model's choice
            on every row.
    """

    k: int
    eps: FloatArray
    margin: FloatArray
    stable: BoolArray
    mass_bound: FloatArray
    selection_matches_model: bool


@final
@dataclass(frozen=True, slots=True)
class SelectionAuditRecord:
    """A layer's selection against the exact indexer keys; row arrays are ``[B, S]``.

    Attributes:
        same_selection: exact and compressed top-k sets are equal.
        true_mass: TV between the exact and the compressed score softmax.
    """

    same_selection: BoolArray
    true_mass: FloatArray


@final
@dataclass(frozen=True, slots=True)
class SelectorLayerRecord:
    """What one indexer layer produced during a request, by path.

    Attributes:
        layer: the layer index.
        writes: indexer keys written.
        select: the selection record, or ``None`` when no row was selected.
        audit: the audit record, or ``None`` (``audit=False``).
    """

    layer: int
    writes: int
    select: SelectionRecord | None = None
    audit: SelectionAuditRecord | None = None

    @property
    def paths(self) -> frozenset[ProbePath]:
        """The paths that produced data."""
        present = ((ProbePath.WRITE, self.writes or None), (ProbePath.SELECT, self.select),
                   (ProbePath.AUDIT, self.audit))
        return frozenset(path for path, rec in present if rec is not None)


@final
@dataclass(frozen=True, slots=True)
class SelectorRun:
    """What a selector probe observed (satisfies :class:`~witcert_adapters.runs.ProbeRun`).

    Attributes:
        scheme: the scheme's name.
        declared: the ``(layer, path)`` sites promised.
        records: one :class:`SelectorLayerRecord` per indexer layer, keyed by layer index.
    """

    scheme: str
    declared: frozenset[Site]
    records: Mapping[int, SelectorLayerRecord]

    @property
    def memory_class(self) -> MemoryKind:
        """Always :attr:`MemoryKind.SPARSE_SELECTOR`."""
        return MemoryKind.SPARSE_SELECTOR

    @property
    def layers(self) -> tuple[int, ...]:
        """The layers with a selection record, sorted."""
        return tuple(sorted(k for k, rec in self.records.items() if rec.select is not None))

    @property
    def observed(self) -> frozenset[Site]:
        """The ``(layer, path)`` sites that produced data."""
        return observed_sites(self.records.values())

    def select(self, layer: int) -> SelectionRecord:
        """Layer ``layer``'s selection record.

        Raises:
            InvalidValueError: the layer selected no row.
        """
        rec = self.records.get(layer)
        if rec is None or rec.select is None:
            raise InvalidValueError("layer", layer, f"selected no row; selected: {self.layers}")
        return rec.select


@final
@dataclass(frozen=True, slots=True)
class _SelectStep:
    # One indexer call's rows (tensors [B, S]); the audit fields only with audit=True.
    k: int
    eps: torch.Tensor
    margin: torch.Tensor
    matches: bool
    mass_bound: torch.Tensor
    same: torch.Tensor | None = None
    true_mass: torch.Tensor | None = None


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


PreHook = Callable[[Any, tuple[Any, ...], dict[str, Any]], None]
PostHook = Callable[[Any, tuple[Any, ...], dict[str, Any], torch.Tensor], None]


class SelectorProbe:
    """Attach indexer-key compression and the selection contract to DeepSeek-V3.2 indexers.

    Args:
        model: a model whose attention layers own an ``indexer`` module.
        scheme: registered scheme for the indexer keys.
        request_id: request id.
        audit: compare with the exact selection on every row.

    Raises:
        InvalidValueError: unknown scheme, or no indexer in the model.

    Example:
        >>> # probe = SelectorProbe(model, scheme="int8_token", audit=True)
        >>> # model(ids, cache=probe.new_cache()); run = probe.result(); probe.close()
        >>> # run_selector_gate(run, tokens=ids.shape[1]).accepted
    """

    def __init__(self, model: Any, *, scheme: str, request_id: int = 0, audit: bool = False) -> None:
        self.model = model
        self.scheme = get_scheme(scheme)
        self.request_id = request_id
        self.audit = audit
        self.indexers: list[tuple[int, Any]] = sorted(
            ((m.layer_idx, m) for m in model.modules()
             if hasattr(m, "wq_b") and hasattr(m, "index_topk")), key=lambda t: t[0])
        if not self.indexers:
            raise InvalidValueError("model", type(model).__name__, "has no learned indexer")
        self.cache: SelectorCache | None = None
        self._pending: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self._rows: dict[int, list[_SelectStep]] = {}
        self._handles: list[RemovableHandle] = []
        for layer, ix in self.indexers:
            self._handles.append(ix.register_forward_pre_hook(self._make_pre(layer, ix), with_kwargs=True))
            self._handles.append(ix.register_forward_hook(self._make_post(layer, ix), with_kwargs=True))

    def declared(self) -> frozenset[Site]:
        """``(layer, path)`` sites promised: indexer-key writes, selection reads, audit."""
        paths = [ProbePath.WRITE, ProbePath.SELECT] + ([ProbePath.AUDIT] if self.audit else [])
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

    def _make_pre(self, layer: int, ix: Any) -> PreHook:
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

    def _make_post(self, layer: int, ix: Any) -> PostHook:
        def post(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: torch.Tensor) -> None:
            cache = self.cache
            if cache is None:
                raise InvalidValueError("cache", None, "call SelectorProbe.new_cache() first")
            q, g, mask = self._pending.pop(layer)
            with torch.no_grad():
                self._rows.setdefault(layer, []).append(
                    self._select(layer, ix, cache, q, g, mask, output))
        return post

    def _select(self, layer: int, ix: Any, cache: SelectorCache, q: torch.Tensor, g: torch.Tensor,
                mask: torch.Tensor, output: torch.Tensor) -> _SelectStep:
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
        eps_tok = scale * torch.einsum("bsh,bt->bst", gd.abs() * l2_norm_upper(qd), w)
        valid = torch.isfinite(s_hat)
        eps_row = torch.where(valid, eps_tok, torch.zeros_like(eps_tok)).amax(dim=-1)
        kk = int(output.shape[-1])
        n_valid = valid.sum(dim=-1)
        top = torch.topk(s_hat, min(kk + 1, s_hat.shape[-1]), dim=-1).values
        if top.shape[-1] > kk:
            margin = top[..., kk - 1] - top[..., kk]
            margin = torch.where(n_valid > kk, margin, torch.full_like(margin, float("inf")))
        else:
            margin = torch.full(top.shape[:-1], float("inf"), dtype=torch.float64)
        model_set = torch.zeros_like(valid).scatter_(-1, output.long(), True) & valid
        mine = torch.zeros_like(valid).scatter_(-1, s_hat.topk(kk, dim=-1).indices, True) & valid
        eps_c = torch.clamp(eps_row, max=350.0)
        mass_bound = torch.where(eps_row > 350.0, torch.full_like(eps_row, float("inf")),
                                 0.5 * torch.expm1(2.0 * eps_c)) * (1.0 + 1e-12) + 1e-15
        same = true_mass = None
        if self.audit:
            s_ex = scores(torch.cat(cache.exact[layer], dim=1))
            exact_set = torch.zeros_like(valid).scatter_(-1, s_ex.topk(kk, dim=-1).indices, True) & valid
            same = (exact_set == mine).all(dim=-1)
            p_ex, p_hat = torch.softmax(s_ex, dim=-1), torch.softmax(s_hat, dim=-1)
            true_mass = 0.5 * (p_ex - p_hat).abs().sum(dim=-1)
        return _SelectStep(kk, eps_row * (1.0 + 1e-12), margin, bool(torch.equal(model_set, mine)),
                           mass_bound, same, true_mass)

    def _record(self, layer: int, writes: int) -> SelectorLayerRecord:
        rows = self._rows.get(layer)
        if not rows:
            return SelectorLayerRecord(layer, writes)
        eps = torch.cat([r.eps for r in rows], dim=1).numpy()
        margin = torch.cat([r.margin for r in rows], dim=1).numpy()
        select = SelectionRecord(
            rows[0].k, eps, margin, margin > 2.0 * eps,
            torch.cat([r.mass_bound for r in rows], dim=1).numpy(),
            all(r.matches for r in rows))
        same = [r.same for r in rows if r.same is not None]
        true = [r.true_mass for r in rows if r.true_mass is not None]
        audit = None
        if self.audit and same and true:
            audit = SelectionAuditRecord(torch.cat(same, dim=1).numpy(),
                                         torch.cat(true, dim=1).numpy())
        return SelectorLayerRecord(layer, writes, select, audit)

    def result(self) -> SelectorRun:
        """Collect the run.

        Raises:
            InvalidValueError: no cache was opened.
        """
        cache = self.cache
        if cache is None:
            raise InvalidValueError("probe", "detached", "nothing observed")
        records = {layer: self._record(layer, cache.writes.get(layer, 0))
                   for layer, _ in self.indexers}
        return SelectorRun(self.scheme.name, self.declared(), records)

    def readings(self, run: SelectorRun, layer: int
                 ) -> tuple[Reading[SelectorMass[AtConsume]], float]:
        """The layer's worst-row ``SelectorMass`` reading and the stable-row fraction.

        Args:
            run: a run of this probe.
            layer: a layer with a selection record.

        Returns:
            ``(reading, stable_fraction)``; the reading comes from
            ``bridges.selector_mass_eform`` at the layer's largest row score error.

        Raises:
            InvalidValueError: the layer selected no row.
        """
        select = run.select(layer)
        return (selector_mass_eform(AtConsume).bound(float(select.eps.max())),
                float(select.stable.mean()))


def run_selector_gate(run: SelectorRun, *, tokens: int) -> GateVerdict:
    """Coverage, magnitude, soundness for a selector run.

    Soundness: on every stable row the exact selection equals the compressed one, and on
    every row the true selector-score TV is at most its bound.

    Args:
        run: what a :class:`SelectorProbe` observed.
        tokens: tokens processed; every declared layer must have written this many keys.

    Returns:
        The :class:`~witcert_adapters.gate.GateVerdict`.

    Raises:
        InvalidValueError: ``tokens`` not a positive int.
    """
    tokens = positive_int("tokens", tokens)
    problems = site_problems(run, joined=True)
    for layer in sorted({layer for layer, _ in run.declared}):
        rec = run.records.get(layer)
        writes = 0 if rec is None else rec.writes
        if writes != tokens:
            problems.append(f"layer {layer}: {writes} indexer keys written, expected {tokens}")
        if rec is not None and rec.select is not None and not rec.select.selection_matches_model:
            problems.append(f"layer {layer}: recomputed selection differs from the model's")
    cov = StageResult(Stage.COVERAGE, not problems, "; ".join(problems[:6]) if problems else
                      f"{len(run.declared)} (layer, path) pairs", checked=len(run.declared),
                      failures=len(problems))
    return ordered_verdict(cov, lambda: _selector_magnitude(run), lambda: _selector_soundness(run))


def _selector_magnitude(run: SelectorRun) -> StageResult:
    bad: list[str] = []
    for layer in run.layers:
        eps = run.select(layer).eps
        if not (np.isfinite(eps).all() and (eps >= 0).all()):
            bad.append(f"layer {layer}: score-error bounds not finite and >= 0")
    return StageResult(Stage.MAGNITUDE, not bad,
                       "; ".join(bad) if bad else "bounds finite and >= 0")


def _selector_soundness(run: SelectorRun) -> StageResult:
    viol = 0
    rows = 0
    for layer in run.layers:
        select, audit = run.select(layer), run.records[layer].audit
        if audit is None:
            viol += 1
            continue
        rows += audit.same_selection.size
        viol += int((select.stable & ~audit.same_selection).sum())
        viol += int((audit.true_mass > np.minimum(1.0, select.mass_bound)).sum())
    return StageResult(Stage.SOUNDNESS, viol == 0, f"{rows} audited rows, {viol} violations",
                       checked=rows, failures=viol)
