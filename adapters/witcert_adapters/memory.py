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

Main declarations
-----------------
- :class:`MemoryClass`, :data:`MEMORY_CLASSES`, :func:`memory_class_of`, :func:`open_probe`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, final

from witcert_calculus.errors import InvalidValueError

__all__ = ["MEMORY_CLASSES", "MemoryClass", "memory_class_of", "open_probe"]


@final
@dataclass(frozen=True, slots=True)
class MemoryClass:
    """One memory class of the registry.

    Attributes:
        name: ``"dense"``, ``"latent"``, ``"sparse_selector"`` or ``"recurrent"``.
        update: where the write operator is observed.
        select: what the select operator is.
        read: what the read-time meter bounds.
        model_types: ``config.model_type`` values served by this class.
        probe: ``(model, scheme=..., request_id=..., audit=..., ledger=...) -> probe``.
        gate: ``(run, *, tokens, writes) -> GateVerdict``: ``tokens`` processed (prefill
            plus decode steps; attention, selector and a hybrid's attention layers) and
            recurrent ``writes`` (one per forward call; recurrent layers).
    """

    name: str
    update: str
    select: str
    read: str
    model_types: tuple[str, ...]
    probe: Callable[..., Any]
    gate: Callable[..., Any]


def _attention_probe(model: Any, **kw: Any) -> Any:
    from witcert_adapters.hf import Probe

    return Probe(model, **kw)


def _attention_gate(run: Any, *, tokens: int, writes: int) -> Any:
    from witcert_adapters.gate import run_gate

    return run_gate(run, tokens=tokens)


def _selector_probe(model: Any, **kw: Any) -> Any:
    from witcert_adapters.selector import SelectorProbe

    kw.pop("ledger", None)  # the selector contract is deterministic
    return SelectorProbe(model, **kw)


def _selector_gate(run: Any, *, tokens: int, writes: int) -> Any:
    from witcert_adapters.selector import run_selector_gate

    return run_selector_gate(run, tokens=tokens)


def _recurrent_probe(model: Any, **kw: Any) -> Any:
    from witcert_adapters.recurrent import RecurrentProbe

    return RecurrentProbe(model, **kw)


def _recurrent_gate(run: Any, *, tokens: int, writes: int) -> Any:
    from witcert_adapters.recurrent import run_recurrent_gate

    return run_recurrent_gate(run, writes=writes, tokens=tokens)


MEMORY_CLASSES: Final[dict[str, MemoryClass]] = {
    m.name: m for m in (
        MemoryClass("dense", "Cache.update (post-RoPE keys and values)", "all cached tokens",
                    "attention TV and output error", ("llama", "qwen2", "mistral"),
                    _attention_probe, _attention_gate),
        MemoryClass("latent", "Cache.update (MLA latent and rope part)", "all cached tokens",
                    "attention TV through the decompression map", ("deepseek_v2", "deepseek_v3"),
                    _attention_probe, _attention_gate),
        MemoryClass("sparse_selector", "Cache.update_indexer (indexer keys)",
                    "learned top-k over index scores", "selection stability and selector mass",
                    ("deepseek_v32",), _selector_probe, _selector_gate),
        MemoryClass("recurrent", "Cache.update_recurrent_state and an in-place decode hook",
                    "none (contraction)",
                    "state error composed over steps (and a hybrid's attention layers)",
                    ("mamba2", "qwen3_next", "kimi_linear"),
                    _recurrent_probe, _recurrent_gate),
    )
}


def memory_class_of(model_type: str) -> MemoryClass:
    """The registered memory class serving ``model_type``.

    Raises:
        InvalidValueError: no class serves it (the message lists what is registered).
    """
    for m in MEMORY_CLASSES.values():
        if model_type in m.model_types:
            return m
    known = sorted(t for m in MEMORY_CLASSES.values() for t in m.model_types)
    raise InvalidValueError("model_type", model_type, f"is served by no memory class; known: {known}")


def open_probe(model: Any, *, scheme: str, request_id: int = 0, audit: bool = False,
               ledger: Any = None) -> tuple[MemoryClass, Any]:
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
    """
    mc = memory_class_of(model.config.model_type)
    return mc, mc.probe(model, scheme=scheme, request_id=request_id, audit=audit, ledger=ledger)
