"""The three-operator memory interface and the registry of memory classes.

Every attention memory is written as three operators,

- update ``m' = U(m, x)``: how an entry (or a state) is written;
- select ``I = S(q, m)``: which entries a query reads;
- read ``y = R(q, m, I)``: how the read combines them,

and the adapter attaches a witness to ``U`` (write time) and a meter to ``R`` (read time),
with ``S`` contributing its own contract when it is data dependent. Supporting a new
architecture is a registry entry (here, or an :class:`~witcert_adapters.architectures.ArchSpec`
for a new attention layout), not a new tool.

=================  =========================================  ==============================  =====================================
memory class       update (witness at write)                  select                          read (meter at read)
=================  =========================================  ==============================  =====================================
dense              ``Cache.update``: band witnesses of        all cached tokens (causal)      softmax attention: Tier-A TV meter
                   post-RoPE keys, value residuals                                             and attention-output bound
latent             ``Cache.update`` of the MLA latent and     all cached tokens (causal)      decompression + softmax: witness on
                   the rope part                                                               the latent through the absorbed query
sparse_selector    ``Cache.update_indexer``: indexer-key      learned top-k over index        selection contract (rank-prefix
                   witnesses                                  scores                          stable rows) and selector-score mass
recurrent          ``Cache.update_recurrent_state`` (prefill) contraction (no selection)      state error: ``E_t <= a_t E_{t-1}
                   and an in-place hook (decode)                                              + b_t`` composed over steps
=================  =========================================  ==============================  =====================================

The registry's probes satisfy :class:`~witcert_adapters.runs.MemoryProbe` and their runs
:class:`~witcert_adapters.runs.ProbeRun`; each class's gate takes the run its probe returns
(a run of another class is rejected, naming both).

Main declarations
-----------------
- :class:`MemoryClass`, :data:`MEMORY_CLASSES`, :func:`memory_class_of`, :func:`open_probe`.
- :class:`ProbeFactory`, :class:`GateFn`: the registry entries' probe and gate signatures.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol, final

from witcert_adapters.runs import MemoryKind, MemoryProbe, ObservedLayer, ProbeRun
from witcert_calculus.errors import InvalidValueError

if TYPE_CHECKING:
    from witcert_adapters.gate import GateVerdict
    from witcert_calculus import RiskLedger

__all__ = ["MEMORY_CLASSES", "GateFn", "MemoryClass", "ProbeFactory", "memory_class_of",
           "open_probe"]


class ProbeFactory(Protocol):
    """Opens a memory class's probe on a model."""

    def __call__(self, model: Any, *, scheme: str, request_id: int, audit: bool,
                 ledger: RiskLedger | None) -> MemoryProbe:
        """Attach the probe.

        Args:
            model: the transformers model.
            scheme: registered scheme name.
            request_id: the request (an open account of ``ledger`` when one is given).
            audit: audit against exact twins.
            ledger: the request ledger for Tier-B events, or ``None``.
        """
        ...


class GateFn(Protocol):
    """Runs a memory class's acceptance gate on its probe's run."""

    def __call__(self, run: ProbeRun[ObservedLayer], *, tokens: int, writes: int
                 ) -> GateVerdict:
        """Gate ``run``.

        Args:
            run: the run the class's probe returned.
            tokens: tokens processed (prefill plus decode steps).
            writes: recurrent state writes (one per forward call).
        """
        ...


@final
@dataclass(frozen=True, slots=True)
class MemoryClass:
    """One memory class of the registry.

    Attributes:
        name: the :class:`~witcert_adapters.runs.MemoryKind` (equal to its name as a string).
        update: where the write operator is observed.
        select: what the select operator is.
        read: what the read-time meter bounds.
        model_types: ``config.model_type`` values served by this class.
        probe: ``(model, *, scheme, request_id, audit, ledger) -> probe``.
        gate: ``(run, *, tokens, writes) -> GateVerdict``: ``tokens`` processed (prefill
            plus decode steps; attention, selector and a hybrid's attention layers) and
            recurrent ``writes`` (one per forward call; recurrent layers).
    """

    name: MemoryKind
    update: str
    select: str
    read: str
    model_types: tuple[str, ...]
    probe: ProbeFactory
    gate: GateFn


def _wrong_run(kind: str, run: object) -> InvalidValueError:
    return InvalidValueError("run", type(run).__name__, f"is not a run of the {kind} memory "
                             "class; gate the run its own probe returned")


def _attention_probe(model: Any, *, scheme: str, request_id: int, audit: bool,
                     ledger: RiskLedger | None) -> MemoryProbe:
    from witcert_adapters.hf import Probe

    return Probe(model, scheme=scheme, request_id=request_id, audit=audit, ledger=ledger)


def _attention_gate(run: ProbeRun[ObservedLayer], *, tokens: int, writes: int) -> GateVerdict:
    from witcert_adapters.gate import run_gate
    from witcert_adapters.live_run import LiveRun

    if not isinstance(run, LiveRun):
        raise _wrong_run("attention (dense or latent)", run)
    return run_gate(run, tokens=tokens)


def _selector_probe(model: Any, *, scheme: str, request_id: int, audit: bool,
                    ledger: RiskLedger | None) -> MemoryProbe:
    from witcert_adapters.selector import SelectorProbe

    # The selector contract is deterministic: the ledger is not needed.
    return SelectorProbe(model, scheme=scheme, request_id=request_id, audit=audit)


def _selector_gate(run: ProbeRun[ObservedLayer], *, tokens: int, writes: int) -> GateVerdict:
    from witcert_adapters.selector import SelectorRun, run_selector_gate

    if not isinstance(run, SelectorRun):
        raise _wrong_run(MemoryKind.SPARSE_SELECTOR.value, run)
    return run_selector_gate(run, tokens=tokens)


def _recurrent_probe(model: Any, *, scheme: str, request_id: int, audit: bool,
                     ledger: RiskLedger | None) -> MemoryProbe:
    from witcert_adapters.recurrent import RecurrentProbe

    return RecurrentProbe(model, scheme=scheme, request_id=request_id, audit=audit,
                          ledger=ledger)


def _recurrent_gate(run: ProbeRun[ObservedLayer], *, tokens: int, writes: int) -> GateVerdict:
    from witcert_adapters.recurrent import RecurrentRun, run_recurrent_gate

    if not isinstance(run, RecurrentRun):
        raise _wrong_run(MemoryKind.RECURRENT.value, run)
    return run_recurrent_gate(run, writes=writes, tokens=tokens)


MEMORY_CLASSES: Final[dict[MemoryKind, MemoryClass]] = {
    m.name: m for m in (
        MemoryClass(MemoryKind.DENSE, "Cache.update (post-RoPE keys and values)",
                    "all cached tokens", "attention TV and output error",
                    ("llama", "qwen2", "mistral"), _attention_probe, _attention_gate),
        MemoryClass(MemoryKind.LATENT, "Cache.update (MLA latent and rope part)",
                    "all cached tokens", "attention TV through the decompression map",
                    ("deepseek_v2", "deepseek_v3"), _attention_probe, _attention_gate),
        MemoryClass(MemoryKind.SPARSE_SELECTOR, "Cache.update_indexer (indexer keys)",
                    "learned top-k over index scores", "selection stability and selector mass",
                    ("deepseek_v32",), _selector_probe, _selector_gate),
        MemoryClass(MemoryKind.RECURRENT,
                    "Cache.update_recurrent_state and an in-place decode hook",
                    "none (contraction)",
                    "state error composed over steps (and a hybrid's attention layers)",
                    ("mamba2", "qwen3_next", "kimi_linear"),
                    _recurrent_probe, _recurrent_gate),
    )
}


def memory_class_of(model_type: str) -> MemoryClass:
    """The registered memory class serving ``model_type``.

    Args:
        model_type: a transformers ``config.model_type``.

    Returns:
        The :class:`MemoryClass` whose :attr:`~MemoryClass.model_types` hold it.

    Raises:
        InvalidValueError: no class serves it (the message lists what is registered).

    Example:
        >>> memory_class_of("llama").name
        <MemoryKind.DENSE: 'dense'>
    """
    for m in MEMORY_CLASSES.values():
        if model_type in m.model_types:
            return m
    known = sorted(t for m in MEMORY_CLASSES.values() for t in m.model_types)
    raise InvalidValueError("model_type", model_type, f"is served by no memory class; known: {known}")


def open_probe(model: Any, *, scheme: str, request_id: int = 0, audit: bool = False,
               ledger: RiskLedger | None = None) -> tuple[MemoryClass, MemoryProbe]:
    """Open the probe of the model's memory class.

    Args:
        model: the model.
        scheme: registered scheme name.
        request_id: the request (an open account of ``ledger`` when one is given).
        audit: audit against exact twins (the gate's soundness stage needs it).
        ledger: a :class:`~witcert_calculus.ledger.RiskLedger` for Tier-B events of a
            dithered scheme on attention layers.

    Returns:
        ``(memory_class, probe)``; use ``probe.new_cache()``, run the model with
        ``cache=``, then ``memory_class.gate(probe.result(), tokens=..., writes=...)``;
        ``probe.close()``.

    Raises:
        InvalidValueError: no memory class serves the model's type, or the probe rejects
            the model or scheme.

    Example:
        >>> # mc, probe = open_probe(model, scheme="int8_token", audit=True)
        >>> # model(ids, cache=probe.new_cache())
        >>> # mc.gate(probe.result(), tokens=ids.shape[1], writes=1).accepted
    """
    mc = memory_class_of(model.config.model_type)
    return mc, mc.probe(model, scheme=scheme, request_id=request_id, audit=audit, ledger=ledger)
