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
- :class:`RecurrentWitnessCache`, :class:`RecurrentProbe`, :class:`RecurrentRun`,
  :func:`run_recurrent_gate`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, final

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F
from transformers import DynamicCache

from witcert_adapters.architectures import spec_for
from witcert_adapters.gate import GateVerdict, StageResult, attention_stages
from witcert_adapters.hf import LiveRun, Probe, WitnessCache
from witcert_adapters.schemes import Scheme, WriteContext, get_scheme
from witcert_calculus.ledger import RiskLedger
from witcert_calculus.errors import InvalidValueError
from witcert_kernels.meter import l2_norm, round_up_f32

__all__ = ["RecurrentProbe", "RecurrentRun", "RecurrentWitnessCache", "run_recurrent_gate"]

FloatArray = npt.NDArray[np.float64]


def _fro(x: torch.Tensor) -> torch.Tensor:
    # Frobenius norm over the last two axes of [B, H, P, N], in float64.
    return l2_norm(x.to(torch.float64).flatten(-2))


class RecurrentWitnessCache(WitnessCache):
    """A :class:`~witcert_adapters.hf.WitnessCache` whose recurrent-state writes are also
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
                 spec: Any = None, audit: bool = False) -> None:
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
        hat = self.scheme(state, WriteContext(self.request_id, layer_idx, step, "state"))
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
class RecurrentRun:
    """What a recurrent probe observed.

    Attributes:
        scheme: scheme name.
        layers: observed layers.
        declared / observed: ``(layer, path)`` sets.
        writes: state writes per layer.
        a: per layer, contraction coefficients ``[T, B, H]`` (step 0 is the prefill write,
            whose coefficient is 0: the error before the first write is 0).
        b: per layer, write witnesses ``[T, B, H]``.
        bound: per layer, composed bounds ``E_t`` ``[T, B, H]``.
        true_err: per layer, true errors against the twin (audit) ``[T, B, H]``.
        attention: what the hybrid's full-attention layers observed (``None`` for a model
            without attention layers); its ``(layer, path)`` pairs are part of
            :attr:`declared` and :attr:`observed`.
    """

    scheme: str
    layers: tuple[int, ...]
    declared: frozenset[tuple[int, str]]
    observed: frozenset[tuple[int, str]]
    writes: dict[int, int]
    a: dict[int, FloatArray]
    b: dict[int, FloatArray]
    bound: dict[int, FloatArray]
    true_err: dict[int, FloatArray]
    attention: LiveRun | None = None

    def summary(self, layer: int) -> Any:
        """``bridges.recurrence`` over the layer's steps for its worst (batch, head).

        Returns the :class:`~witcert_calculus.bridges.Recurrence` (contract, ``E[log a]``,
        mean caliber, half-life).
        """
        from witcert_calculus.bridges import recurrence
        from witcert_calculus.metrics import AtConsume

        flat = self.bound[layer][-1].reshape(-1)
        worst = int(np.argmax(flat))
        a = self.a[layer].reshape(self.a[layer].shape[0], -1)[:, worst]
        b = self.b[layer].reshape(self.b[layer].shape[0], -1)[:, worst]
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


# (required attributes, name of the submodule whose output carries the decay, reader)
_READERS: tuple[tuple[tuple[str, ...], str, Any], ...] = (
    (("in_proj_ba", "A_log", "dt_bias", "layer_idx"), "in_proj_ba", _gated_deltanet_a),
    (("forget_gate", "b_proj", "layer_idx"), "forget_gate", _kda_a),
    (("in_proj", "A_log", "dt_bias", "layer_idx"), "in_proj", _mamba2_a),
)


def _reader(module: Any) -> tuple[str, Any] | None:
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
    """

    def __init__(self, model: Any, *, scheme: str, request_id: int = 0, audit: bool = False,
                 ledger: RiskLedger | None = None) -> None:
        self.model = model
        self.scheme = get_scheme(scheme)
        self.request_id = request_id
        self.audit = audit
        found: list[tuple[int, Any, str, Any]] = []
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
        self._handles: list[Any] = []
        for layer, mixer, sub, fn in found:
            self._handles.append(getattr(mixer, sub).register_forward_hook(
                self._make_dt(layer, mixer, fn)))
            self._handles.append(mixer.register_forward_pre_hook(self._make_pre(layer),
                                                                 with_kwargs=True))
            self._handles.append(mixer.register_forward_hook(self._make_post(layer, mixer),
                                                             with_kwargs=True))

    def declared(self) -> frozenset[tuple[int, str]]:
        """The ``(layer, path)`` pairs promised: state writes, contraction reads, audit."""
        paths = ["write", "contraction"] + (["audit"] if self.audit else [])
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

    def _make_dt(self, layer: int, mixer: Any, fn: Any) -> Any:
        def hook(module: Any, args: Any, output: torch.Tensor) -> None:
            if not self._in_twin:
                with torch.no_grad():
                    self._dt[layer] = fn(mixer, output.detach())
        return hook

    def _make_pre(self, layer: int) -> Any:
        def pre(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if not self._in_twin and self.cache is not None:
                self._writes_before[layer] = self.cache.writes.get(layer, 0)
        return pre

    def _make_post(self, layer: int, mixer: Any) -> Any:
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

    def result(self) -> RecurrentRun:
        """Collect the run; composes ``E_t = a_t E_{t-1} + b_t`` per (layer, batch, head)."""
        cache = self.cache
        if cache is None:
            raise InvalidValueError("probe", "detached", "nothing observed")
        observed: set[tuple[int, str]] = set()
        a_out: dict[int, FloatArray] = {}
        b_out: dict[int, FloatArray] = {}
        bound: dict[int, FloatArray] = {}
        true: dict[int, FloatArray] = {}
        for layer, _ in self.mixers:
            bs = cache.b.get(layer)
            if bs:
                observed.add((layer, "write"))
                b_out[layer] = torch.stack(bs).numpy()
            a_s = self._a.get(layer)
            if a_s:
                observed.add((layer, "contraction"))
                a_out[layer] = torch.stack(a_s).numpy()
            if bs and a_s and len(bs) == len(a_s):
                e = np.zeros_like(b_out[layer][0])
                rows: list[FloatArray] = []
                for a_t, b_t in zip(a_out[layer], b_out[layer], strict=True):
                    # Outward rounding: the composed bound is nudged up by 1e-12 relative.
                    e = (a_t * e + b_t) * (1.0 + 1e-12)
                    rows.append(e)
                bound[layer] = np.stack(rows)
            if self._true.get(layer):
                observed.add((layer, "audit"))
                true[layer] = torch.stack(self._true[layer]).numpy()
        attention = None if self.attention is None else self.attention.result()
        if attention is not None:
            observed |= attention.observed
        return RecurrentRun(self.scheme.name, tuple(sorted(bound)), self.declared(),
                            frozenset(observed), dict(cache.writes), a_out, b_out, bound, true,
                            attention)


def run_recurrent_gate(run: RecurrentRun, *, writes: int, tokens: int | None = None
                       ) -> GateVerdict:
    """Coverage, magnitude, soundness (in that order) for a recurrent (or hybrid) run.

    Args:
        run: the observed run.
        writes: expected state writes per recurrent layer (1 for the prefill plus one per
            decode step).
        tokens: tokens processed (prefill plus decode steps); required when the model has
            full-attention layers, whose write and read counters must reach it.

    Raises:
        InvalidValueError: a hybrid run without ``tokens``.
    """
    att_stages: tuple[StageResult, ...] = ()
    if run.attention is not None:
        if tokens is None:
            raise InvalidValueError("tokens", None, "a hybrid run's attention layers need the "
                                    "number of tokens processed")
        att_stages = attention_stages(run.attention, tokens=tokens)
    att_layers: set[int] = set() if run.attention is None else \
        {layer for layer, _ in run.attention.declared}
    problems: list[str] = []
    if run.observed != run.declared:
        problems.append(f"declared but never observed: {sorted(run.declared - run.observed)[:6]}; "
                        f"observed but never declared: {sorted(run.observed - run.declared)[:6]}")
    if att_stages and not att_stages[0].passed:
        problems.append(f"attention layers: {att_stages[0].detail}")
    for layer, _ in sorted(run.declared):
        if layer in att_layers:
            continue
        if run.writes.get(layer, 0) != writes:
            problems.append(f"layer {layer}: {run.writes.get(layer, 0)} state writes, expected {writes}")
    att_note = "" if run.attention is None else \
        f" and {len(att_layers)} attention layers at {tokens} tokens"
    cov = StageResult("coverage", not problems, "; ".join(sorted(set(problems))[:6]) if problems
                      else f"{len(run.declared)} (layer, path) pairs, {writes} writes per "
                      f"recurrent layer{att_note}",
                      checked=len(run.declared), failures=len(problems))
    if problems:
        return GateVerdict((cov, StageResult("magnitude", None, "coverage failed"),
                            StageResult("soundness", None, "coverage failed")))
    bad: list[str] = []
    cells = 0
    for layer in run.layers:
        a, b, e = run.a[layer], run.b[layer], run.bound[layer]
        cells += e.size
        if not (np.isfinite(a).all() and ((a >= 0) & (a <= 1)).all()):
            bad.append(f"layer {layer}: contraction coefficients outside [0, 1]")
        if not (np.isfinite(b).all() and (b >= 0).all() and np.isfinite(e).all()):
            bad.append(f"layer {layer}: witnesses or bounds not finite and >= 0")
    if att_stages and not att_stages[1].passed:
        bad.append(f"attention layers: {att_stages[1].detail}")
        cells += att_stages[1].checked
    mag = StageResult("magnitude", not bad, "; ".join(bad[:6]) if bad else f"{cells} cells in range",
                      checked=cells, failures=len(bad))
    if bad:
        return GateVerdict((cov, mag, StageResult("soundness", None, "magnitude failed")))
    viol = 0
    audited = 0
    first: list[str] = []
    for layer in run.layers:
        t = run.true_err.get(layer)
        if t is None:
            viol += 1
            first.append(f"layer {layer}: no audit")
            continue
        audited += t.size
        over = t > run.bound[layer]
        if over.any():
            viol += int(over.sum())
            first.append(f"layer {layer}: true error above the composed bound in {int(over.sum())} cells")
    if att_stages:
        att = att_stages[2]
        audited += att.checked
        viol += att.failures
        first.append(f"attention layers: {att.detail}")
    sound = StageResult("soundness", viol == 0, "; ".join(first[:4]) if viol else
                        f"{audited} audited cells, 0 violations" +
                        ("" if not att_stages else f" ({first[-1]})"),
                        checked=audited, failures=viol)
    return GateVerdict((cov, mag, sound))
