"""Recurrent-state memories: compressed states, per-step contraction, audited exact twin.

Covered layers: Mamba2 mixers, Gated DeltaNet (Qwen3-Next linear-attention layers) and
Kimi Delta Attention (Kimi-Linear). For the delta-rule layers the state update is
``S_t = (I - beta_t k_t k_t^T) Diag(alpha_t) S_{t-1} + beta_t k_t v_t^T`` with unit ``k_t``
(the layers l2-normalise keys) and ``beta_t in (0, 1)``, so ``||I - beta k k^T|| = 1`` and the
contraction is ``max_c alpha_{t,c}`` (a scalar ``alpha_t`` per head for Gated DeltaNet, read
from ``in_proj_ba``; a per-channel gate for KDA, read from ``forget_gate``).


Memory class ``recurrent``: the state is contracted and updated, never appended. For a
Mamba2 head ``h`` the decode update is ``h_t = a_t h_{t-1} + dt_t B_t x_t`` with the scalar
``a_t = exp(softplus(dt_raw + dt_bias) * A_h)``, ``A_h = -exp(A_log_h)``; the adapter reads
``dt_raw`` from the layer's own ``in_proj`` output (a forward hook) and the parameters from
the layer. When the stored state is compressed after every write with error ``b_t`` (the
write-time witness), the error against the exact trajectory under the same inputs obeys
``E_t <= a_t E_{t-1} + b_t`` and composes over steps (``bridges.recurrence``).

Attachment: the prefill writes its final state through ``Cache.update_recurrent_state``
(overridden by :class:`RecurrentWitnessCache`); a decode step updates the state *in place*
inside the layer, so the compression of decode states runs in a forward hook on the mixer,
which overwrites the cached state with its compressed version. With ``audit=True`` the hook
also runs the same mixer on the same input against a twin cache that is never compressed
(an independent exact trajectory), and records the true error per (layer, batch, head, step).

Hybrid models (Qwen3-Next, Kimi-Linear) interleave recurrent layers with full-attention
layers (``config.layer_types``). The probe observes both: the recurrent layers as above,
and the full-attention layers through the attention :class:`~witcert_adapters.hf.Probe`
with the layout the config dictates (dense gated GQA with partial RoPE for Qwen3-Next,
MLA-with-NoPE latent for Kimi-Linear), writing into the same cache. The declared set is
the union, so the gate's coverage stage fails when any attention layer goes unobserved;
magnitude and soundness then run on both kinds of layer.

Main declarations
-----------------
- :class:`RecurrentWitnessCache`, :class:`RecurrentProbe`, :func:`run_recurrent_gate`.
- :class:`RecurrentRun` and its per-layer record :class:`RecurrentLayerRecord`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias, final

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F
from torch.utils.hooks import RemovableHandle
from transformers import DynamicCache

from witcert_adapters.architectures import ArchSpec, spec_for
from witcert_adapters.gate import (
    GateVerdict,
    Stage,
    StageResult,
    attention_stages,
    ordered_verdict,
    site_problems,
)
from witcert_adapters.hf import Probe
from witcert_adapters.live_run import LiveRun
from witcert_adapters.runs import MemoryKind, ProbePath, Site, observed_sites
from witcert_adapters.schemes import EntryRole, Scheme, WriteContext, get_scheme
from witcert_adapters.witness_cache import WitnessCache
from witcert_calculus import RiskLedger
from witcert_calculus.bridges import Recurrence, recurrence
from witcert_calculus.errors import InvalidValueError
from witcert_calculus.metrics import AtConsume
from witcert_calculus.numerics.validation import positive_int
from witcert_kernels.meter import l2_norm_upper, round_up_f32

__all__ = ["RecurrentLayerRecord", "RecurrentProbe", "RecurrentRun", "RecurrentWitnessCache",
           "run_recurrent_gate"]

FloatArray = npt.NDArray[np.float64]


def _fro(x: torch.Tensor) -> torch.Tensor:
    # Frobenius norm over the last two axes of [B, H, P, N], in float64.
    return l2_norm_upper(x.to(torch.float64).flatten(-2))


class RecurrentWitnessCache(WitnessCache):
    """A :class:`~witcert_adapters.witness_cache.WitnessCache` whose recurrent-state writes are also
    compressed and witnessed (attention writes of a hybrid go through the parent).

    Args:
        config: the model config.
        scheme: compression scheme for the state (``None``: untouched).
        request_id: keys randomised schemes.
        spec: the attention layout of a hybrid's full-attention layers (``None``: no
            attention layers).
        audit: keep exact attention entries (the attention soundness stage needs them).
    """

    def __init__(self, *, config: Any, scheme: Scheme | None, request_id: int = 0,
                 spec: ArchSpec | None = None, audit: bool = False) -> None:
        super().__init__(config=config, spec=spec, scheme=scheme, request_id=request_id,
                         audit=audit)
        self.writes: dict[int, int] = {}
        self.b: dict[int, list[torch.Tensor]] = {}
        self.steps: dict[int, int] = {}

    def compress_state(self, state: torch.Tensor, layer_idx: int) -> torch.Tensor:
        """Compress a state, record its witness ``||h_hat - h||`` per (batch, head)."""
        if self.scheme is None:
            return state
        step = self.steps.get(layer_idx, 0)
        hat = self.scheme(state, WriteContext(self.request_id, layer_idx, step, EntryRole.STATE))
        self.b.setdefault(layer_idx, []).append(round_up_f32(_fro(hat.to(torch.float64)
                                                                   - state.to(torch.float64))))
        self.writes[layer_idx] = self.writes.get(layer_idx, 0) + 1
        self.steps[layer_idx] = step + 1
        return hat

    def update_recurrent_state(self, recurrent_states: torch.Tensor, layer_idx: int,
                               state_idx: int = 0, **kwargs: Any) -> torch.Tensor:
        """Compress the written state (prefill path), then store it as usual."""
        hat = self.compress_state(recurrent_states, layer_idx)
        out: torch.Tensor = super().update_recurrent_state(  # pyright: ignore[reportUnknownMemberType]
            hat, layer_idx, state_idx, **kwargs)
        return out


@final
@dataclass(frozen=True, slots=True)
class RecurrentLayerRecord:
    """What one recurrent layer produced during a request; arrays are ``[T, B, H]``.

    Attributes:
        layer: the layer index.
        writes: state writes.
        b: write witnesses ``||h_hat - h||`` per step (``None``: nothing written).
        a: contraction coefficients per step (step 0 is the prefill write, whose
            coefficient is 0: the error before the first write is 0); ``None``: no step read.
        bound: composed bounds ``E_t = a_t E_{t-1} + b_t`` (``None`` unless both ``a`` and
            ``b`` cover the same steps).
        true_err: true errors against the exact twin (audit), else ``None``.
    """

    layer: int
    writes: int
    b: FloatArray | None = None
    a: FloatArray | None = None
    bound: FloatArray | None = None
    true_err: FloatArray | None = None

    @property
    def paths(self) -> frozenset[ProbePath]:
        """The paths that produced data."""
        present = ((ProbePath.WRITE, self.b), (ProbePath.CONTRACTION, self.a),
                   (ProbePath.AUDIT, self.true_err))
        return frozenset(path for path, arr in present if arr is not None)

    def composition(self) -> tuple[FloatArray, FloatArray, FloatArray]:
        """``(a, b, bound)`` of a layer whose steps were composed.

        Raises:
            InvalidValueError: the layer has no composed bound.
        """
        if self.a is None or self.b is None or self.bound is None:
            raise InvalidValueError("layer", self.layer, "has no composed bound (a state write "
                                    "or a contraction step was never observed)")
        return self.a, self.b, self.bound


@final
@dataclass(frozen=True, slots=True)
class RecurrentRun:
    """What a recurrent probe observed (satisfies :class:`~witcert_adapters.runs.ProbeRun`).

    Attributes:
        scheme: scheme name.
        declared: ``(layer, path)`` sites promised (a hybrid's attention sites included).
        records: one :class:`RecurrentLayerRecord` per recurrent layer, keyed by layer index.
        attention: what the hybrid's full-attention layers observed (``None`` for a model
            without attention layers); its sites are part of :attr:`declared` and
            :attr:`observed`.
    """

    scheme: str
    declared: frozenset[Site]
    records: Mapping[int, RecurrentLayerRecord]
    attention: LiveRun | None = None

    @property
    def memory_class(self) -> MemoryKind:
        """Always :attr:`MemoryKind.RECURRENT`."""
        return MemoryKind.RECURRENT

    @property
    def layers(self) -> tuple[int, ...]:
        """The recurrent layers with a composed bound, sorted."""
        return tuple(sorted(k for k, rec in self.records.items() if rec.bound is not None))

    @property
    def observed(self) -> frozenset[Site]:
        """The sites that produced data, the attention run's included."""
        own = observed_sites(self.records.values())
        return own if self.attention is None else own | self.attention.observed

    def summary(self, layer: int) -> Recurrence[AtConsume]:
        """``bridges.recurrence`` over the layer's steps for its worst (batch, head).

        Returns:
            The :class:`~witcert_calculus.bridges.Recurrence` (contract, ``E[log a]``, mean
            caliber, half-life).

        Raises:
            InvalidValueError: the layer has no composed bound.
        """
        a_all, b_all, bound = self.records[layer].composition()
        worst = int(np.argmax(bound[-1].reshape(-1)))
        a = a_all.reshape(a_all.shape[0], -1)[:, worst]
        b = b_all.reshape(b_all.shape[0], -1)[:, worst]
        return recurrence(AtConsume, a_steps=a[1:] if a.size > 1 else a,
                          b_steps=b[1:] if b.size > 1 else b)


def _state(cache: DynamicCache, layer: int) -> torch.Tensor:
    # The layer's recurrent state tensor (linear-attention cache layers hold it in a dict).
    entry: Any = cache.layers[layer]
    state = entry.recurrent_states[0]
    if not isinstance(state, torch.Tensor):
        raise InvalidValueError(f"recurrent state of layer {layer}", state, "was never written")
    return state


def _mamba2_a(mixer: Any, out: torch.Tensor) -> torch.Tensor:
    # in_proj output ends with dt_raw per head; a = exp(softplus(dt_raw + dt_bias) * A).
    dt_raw = out[:, -1, -mixer.num_heads:].to(torch.float64)
    dt = F.softplus(dt_raw + mixer.dt_bias.to(torch.float64))
    return torch.exp(dt * -torch.exp(mixer.A_log.to(torch.float64)))


def _gated_deltanet_a(mixer: Any, out: torch.Tensor) -> torch.Tensor:
    # in_proj_ba output, ordered as in the layer: [.., num_k_heads, (b | a) per group].
    per = mixer.num_v_heads // mixer.num_k_heads
    ba = out[:, -1].reshape(out.shape[0], mixer.num_k_heads, 2 * per)
    a_raw = ba[..., per:].reshape(out.shape[0], mixer.num_v_heads).to(torch.float64)
    g = -torch.exp(mixer.A_log.to(torch.float64)) * F.softplus(a_raw + mixer.dt_bias.to(torch.float64))
    # S_t = alpha_t (I - beta k k^T) S_{t-1} + ..., ||I - beta k k^T|| = 1 for unit k, beta in (0,1)
    return torch.exp(g)


def _kda_a(mixer: Any, out: torch.Tensor) -> torch.Tensor:
    # forget_gate output g [B, L, H, d_k]: S_t = (I - beta k k^T) Diag(exp g) S_{t-1} + ...,
    # so the contraction of head h is max_c exp(g[h, c]).
    return torch.exp(out[:, -1].to(torch.float64)).amax(dim=-1)


DecayReader: TypeAlias = Callable[[Any, torch.Tensor], torch.Tensor]
"""``(mixer, submodule output) -> contraction coefficient per (batch, head)``, float64."""

# (required attributes, name of the submodule whose output carries the decay, reader)
_READERS: tuple[tuple[tuple[str, ...], str, DecayReader], ...] = (
    (("in_proj_ba", "A_log", "dt_bias", "layer_idx"), "in_proj_ba", _gated_deltanet_a),
    (("forget_gate", "b_proj", "layer_idx"), "forget_gate", _kda_a),
    (("in_proj", "A_log", "dt_bias", "layer_idx"), "in_proj", _mamba2_a),
)


def _reader(module: Any) -> tuple[str, DecayReader] | None:
    for attrs, sub, fn in _READERS:
        if all(hasattr(module, a) for a in attrs):
            return sub, fn
    return None


class RecurrentProbe:
    """Attach compression, contraction reading and (optionally) an exact twin to Mamba2 layers.

    Args:
        model: a model whose mixers expose ``in_proj``, ``A_log``, ``dt_bias``, ``layer_idx``
            (or the delta-rule equivalents); a hybrid's attention layers are observed too.
        scheme: registered scheme name for the state (and a hybrid's attention entries).
        request_id: request id.
        audit: run the exact twin and record true errors (and audit attention layers).
        ledger: passed to the attention probe (Tier B for a dithered scheme).

    Raises:
        InvalidValueError: unknown scheme, or no recurrent mixer found.

    Example:
        >>> # probe = RecurrentProbe(model, scheme="int8_token", audit=True)
        >>> # model(ids, cache=probe.new_cache()); run = probe.result(); probe.close()
        >>> # run_recurrent_gate(run, writes=1, tokens=ids.shape[1]).accepted
    """

    def __init__(self, model: Any, *, scheme: str, request_id: int = 0, audit: bool = False,
                 ledger: RiskLedger | None = None) -> None:
        self.model = model
        self.scheme = get_scheme(scheme)
        self.request_id = request_id
        self.audit = audit
        found: list[tuple[int, Any, str, DecayReader]] = []
        for m in model.modules():
            r = _reader(m)
            if r is not None and isinstance(getattr(m, "layer_idx", None), int):
                found.append((m.layer_idx, m, r[0], r[1]))
        found.sort(key=lambda t: t[0])
        self.mixers = [(layer, m) for layer, m, _, _ in found]
        if not self.mixers:
            raise InvalidValueError("model", type(model).__name__, "has no recurrent mixer layers")
        layer_types = getattr(model.config, "layer_types", None) or ()
        self.attention: Probe | None = None
        if "full_attention" in layer_types:
            self.attention = Probe(model, scheme=scheme, request_id=request_id, audit=audit,
                                   ledger=ledger)
            want = sorted(i for i, t in enumerate(layer_types) if t == "full_attention")
            got = [layer for layer, _ in self.attention.attention]
            if got != want:
                self.attention.close()
                raise InvalidValueError("attention layers", got,
                                        f"config.layer_types declares full attention at {want}")
        self.cache: RecurrentWitnessCache | None = None
        self.twin: DynamicCache | None = None
        self._in_twin = False
        self._dt: dict[int, torch.Tensor] = {}
        self._writes_before: dict[int, int] = {}
        self._a: dict[int, list[torch.Tensor]] = {}
        self._true: dict[int, list[torch.Tensor]] = {}
        self._handles: list[RemovableHandle] = []
        for layer, mixer, sub, fn in found:
            self._handles.append(getattr(mixer, sub).register_forward_hook(
                self._make_dt(layer, mixer, fn)))
            self._handles.append(mixer.register_forward_pre_hook(self._make_pre(layer),
                                                                 with_kwargs=True))
            self._handles.append(mixer.register_forward_hook(self._make_post(layer, mixer),
                                                             with_kwargs=True))

    def declared(self) -> frozenset[Site]:
        """The ``(layer, path)`` sites promised: state writes, contraction reads, audit."""
        paths = [ProbePath.WRITE, ProbePath.CONTRACTION] + ([ProbePath.AUDIT] if self.audit
                                                             else [])
        own = frozenset((layer, p) for layer, _ in self.mixers for p in paths)
        return own if self.attention is None else own | self.attention.declared()

    def new_cache(self) -> RecurrentWitnessCache:
        """A fresh compressed cache (and exact twin when auditing) for one request."""
        self.cache = RecurrentWitnessCache(
            config=self.model.config, scheme=self.scheme, request_id=self.request_id,
            spec=None if self.attention is None else spec_for(self.model.config.model_type),
            audit=self.audit)
        if self.attention is not None:
            self.attention.bind(self.cache)
        self.twin = DynamicCache(config=self.model.config) if self.audit else None
        self._a.clear()
        self._true.clear()
        return self.cache

    def close(self) -> None:
        """Remove the hooks."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        if self.attention is not None:
            self.attention.close()

    def _make_dt(self, layer: int, mixer: Any, fn: DecayReader
                 ) -> Callable[[Any, tuple[Any, ...], torch.Tensor], None]:
        def hook(module: Any, args: tuple[Any, ...], output: torch.Tensor) -> None:
            if not self._in_twin:
                with torch.no_grad():
                    self._dt[layer] = fn(mixer, output.detach())
        return hook

    def _make_pre(self, layer: int) -> Callable[[Any, tuple[Any, ...], dict[str, Any]], None]:
        def pre(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if not self._in_twin and self.cache is not None:
                self._writes_before[layer] = self.cache.writes.get(layer, 0)
        return pre

    def _make_post(self, layer: int, mixer: Any
                   ) -> Callable[[Any, tuple[Any, ...], dict[str, Any], Any], None]:
        def post(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
            if self._in_twin:
                return
            cache = self.cache
            if cache is None:
                raise InvalidValueError("cache", None, "call RecurrentProbe.new_cache() first")
            hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            with torch.no_grad():
                a_step = self._dt.pop(layer)
                state = _state(cache, layer)
                if hidden.shape[1] == 1:
                    a = a_step
                    if cache.writes.get(layer, 0) == self._writes_before.get(layer, 0):
                        # The layer updated the state in place (Mamba2 decode): compress it now.
                        state.copy_(cache.compress_state(state, layer))
                else:
                    a = torch.zeros_like(a_step)
                self._a.setdefault(layer, []).append(a)
                if self.twin is not None:
                    self._in_twin = True
                    try:
                        mixer(hidden, cache=self.twin, attention_mask=kwargs.get("attention_mask"))
                    finally:
                        self._in_twin = False
                    exact = _state(self.twin, layer)
                    self._true.setdefault(layer, []).append(_fro(state.to(torch.float64)
                                                                 - exact.to(torch.float64)))
        return post

    def _record(self, layer: int, cache: RecurrentWitnessCache) -> RecurrentLayerRecord:
        bs = cache.b.get(layer)
        a_s = self._a.get(layer)
        b = torch.stack(bs).numpy() if bs else None
        a = torch.stack(a_s).numpy() if a_s else None
        bound = None
        if a is not None and b is not None and len(a) == len(b):
            e = np.zeros_like(b[0])
            rows: list[FloatArray] = []
            for a_t, b_t in zip(a, b, strict=True):
                # Outward rounding: the composed bound is nudged up by 1e-12 relative.
                e = (a_t * e + b_t) * (1.0 + 1e-12)
                rows.append(e)
            bound = np.stack(rows)
        true = self._true.get(layer)
        return RecurrentLayerRecord(layer, cache.writes.get(layer, 0), b=b, a=a, bound=bound,
                                    true_err=torch.stack(true).numpy() if true else None)

    def result(self) -> RecurrentRun:
        """Collect the run; composes ``E_t = a_t E_{t-1} + b_t`` per (layer, batch, head).

        Raises:
            InvalidValueError: no cache was opened.
        """
        cache = self.cache
        if cache is None:
            raise InvalidValueError("probe", "detached", "nothing observed")
        return RecurrentRun(self.scheme.name, self.declared(),
                            {layer: self._record(layer, cache) for layer, _ in self.mixers},
                            None if self.attention is None else self.attention.result())


def run_recurrent_gate(run: RecurrentRun, *, writes: int, tokens: int | None = None
                       ) -> GateVerdict:
    """Coverage, magnitude, soundness (in that order) for a recurrent (or hybrid) run.

    Args:
        run: the observed run.
        writes: expected state writes per recurrent layer (1 for the prefill plus one per
            decode step).
        tokens: tokens processed (prefill plus decode steps); required when the model has
            full-attention layers, whose write and read counters must reach it.

    Returns:
        The :class:`~witcert_adapters.gate.GateVerdict`; a hybrid's attention stages are
        folded into each stage.

    Raises:
        InvalidValueError: a hybrid run without ``tokens``, or ``writes``/``tokens`` not a
            positive int.
    """
    writes = positive_int("writes", writes)
    att_stages: tuple[StageResult, ...] = ()
    if run.attention is not None:
        if tokens is None:
            raise InvalidValueError("tokens", None, "a hybrid run's attention layers need the "
                                    "number of tokens processed")
        att_stages = attention_stages(run.attention, tokens=positive_int("tokens", tokens))
    att_layers: set[int] = set() if run.attention is None else \
        {layer for layer, _ in run.attention.declared}
    problems = site_problems(run, joined=True)
    if att_stages and not att_stages[0].passed:
        problems.append(f"attention layers: {att_stages[0].detail}")
    for layer in sorted({layer for layer, _ in run.declared} - att_layers):
        rec = run.records.get(layer)
        got = 0 if rec is None else rec.writes
        if got != writes:
            problems.append(f"layer {layer}: {got} state writes, expected {writes}")
    att_note = "" if run.attention is None else \
        f" and {len(att_layers)} attention layers at {tokens} tokens"
    cov = StageResult(Stage.COVERAGE, not problems, "; ".join(sorted(set(problems))[:6])
                      if problems else f"{len(run.declared)} (layer, path) pairs, {writes} "
                      f"writes per recurrent layer{att_note}",
                      checked=len(run.declared), failures=len(problems))
    return ordered_verdict(cov, lambda: _recurrent_magnitude(run, att_stages),
                           lambda: _recurrent_soundness(run, att_stages))


def _recurrent_magnitude(run: RecurrentRun, att_stages: tuple[StageResult, ...]) -> StageResult:
    bad: list[str] = []
    cells = 0
    for layer in run.layers:
        a, b, e = run.records[layer].composition()
        cells += e.size
        if not (np.isfinite(a).all() and ((a >= 0) & (a <= 1)).all()):
            bad.append(f"layer {layer}: contraction coefficients outside [0, 1]")
        if not (np.isfinite(b).all() and (b >= 0).all() and np.isfinite(e).all()):
            bad.append(f"layer {layer}: witnesses or bounds not finite and >= 0")
    if att_stages and not att_stages[1].passed:
        bad.append(f"attention layers: {att_stages[1].detail}")
        cells += att_stages[1].checked
    return StageResult(Stage.MAGNITUDE, not bad, "; ".join(bad[:6]) if bad else
                       f"{cells} cells in range", checked=cells, failures=len(bad))


def _recurrent_soundness(run: RecurrentRun, att_stages: tuple[StageResult, ...]) -> StageResult:
    viol = 0
    audited = 0
    first: list[str] = []
    for layer in run.layers:
        rec = run.records[layer]
        t = rec.true_err
        if t is None:
            viol += 1
            first.append(f"layer {layer}: no audit")
            continue
        audited += t.size
        over = t > rec.composition()[2]
        if over.any():
            viol += int(over.sum())
            first.append(f"layer {layer}: true error above the composed bound in {int(over.sum())} cells")
    if att_stages:
        att = att_stages[2]
        audited += att.checked
        viol += att.failures
        first.append(f"attention layers: {att.detail}")
    return StageResult(Stage.SOUNDNESS, viol == 0, "; ".join(first[:4]) if viol else
                       f"{audited} audited cells, 0 violations" +
                       ("" if not att_stages else f" ({first[-1]})"),
                       checked=audited, failures=viol)
