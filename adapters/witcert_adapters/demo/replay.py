"""One request: a reference replayed through the compressed cache, metered, gated, admitted.

The prompt is prefilled and the continuation teacher-forced one token at a time through
the probe's :class:`~witcert_adapters.witness_cache.WitnessCache`, with the audit on and every
forward call of a dithered scheme admitted as a Tier-B event. The run then passes the
acceptance gate, its worst-cell readings (with each layer's coarse dense chain) are
admitted into the request's ledger account, and the account is closed.

Main declarations
-----------------
- :class:`RequestResult`, :func:`replay`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, final

import torch

from witcert_adapters.demo.measure import kl_top1
from witcert_adapters.demo.reference import Reference
from witcert_adapters.gate import GateVerdict, run_gate
from witcert_adapters.hf import attach
from witcert_adapters.live_run import LiveRun
from witcert_adapters.readings import (
    DenseChain,
    LayerReading,
    admit_readings,
    dense_chain,
    layer_readings,
)
from witcert_calculus import RiskLedger, Verdict
from witcert_calculus.errors import InvalidValueError

__all__ = ["RequestResult", "replay"]


@final
@dataclass(frozen=True, slots=True)
class RequestResult:
    """What one replayed request produced.

    Attributes:
        request_id: the ledger account.
        scheme: the scheme's name.
        reference: the replayed reference.
        run: what the probe observed.
        verdict: the acceptance gate's verdict.
        kl / top1: per decode step, KL(uncompressed || compressed) in nats and top-1
            agreement of the next-token distributions.
        readings: per layer, the worst-cell meter and the coarse chain's bound.
        ledger: the account's verdict after every admission.
    """

    request_id: int
    scheme: str
    reference: Reference
    run: LiveRun
    verdict: GateVerdict
    kl: tuple[float, ...]
    top1: tuple[bool, ...]
    readings: tuple[LayerReading, ...]
    ledger: Verdict


def _teacher_forced(model: Any, ref: Reference, cache: Any) -> torch.Tensor:
    # Prefill the prompt, then one decode step per continuation token; the step logits.
    seq, plen = ref.tokens, ref.prompt_len
    with torch.no_grad():
        model(seq[:, :plen], cache=cache, use_cache=True)
        steps = [model(seq[:, t:t + 1], cache=cache, use_cache=True).logits[0, -1]
                 for t in range(plen, ref.processed)]
    return torch.stack(steps)


def _readings(model: Any, run: LiveRun) -> tuple[LayerReading, ...]:
    # Worst-cell readings with each layer's coarse chain.
    scale = float(model.config.head_dim) ** -0.5
    chains: dict[int, DenseChain] = {}
    for layer in run.layers:
        write = run.records[layer].write
        if write is None:
            raise InvalidValueError(f"layer {layer}", None, "metered rows but wrote nothing")
        chains[layer] = dense_chain(witness_max=write.witness_full_max,
                                    q_norm_max=run.read(layer).q_norm_max, scale=scale)
    return tuple(layer_readings(run, chains=chains))


def replay(model: Any, ledger: RiskLedger, scheme: str, ref: Reference, *,
           delta_req: str, bands: int | None = None) -> RequestResult:
    """Replay ``ref`` through ``scheme`` as a new request of ``ledger``.

    Args:
        model: the transformers causal LM (eager attention).
        ledger: the ledger; a request is opened, admitted into and closed.
        scheme: a registered scheme name.
        ref: the reference to replay.
        delta_req: the request's failure-probability budget.
        bands: witness bands per key (``None``: the layout's default).

    Returns:
        The :class:`RequestResult`.

    Example:
        >>> # result = replay(model, RiskLedger(), "int8_token", refs[0], delta_req="1/100")
        >>> # result.verdict.accepted
    """
    request_id = ledger.open_request(delta_req=delta_req)
    # The horizon (every query row of the request) is known in advance here, so the probe
    # also reports the fixed-horizon allocation next to the anytime-valid one it spends.
    with attach(model, scheme=scheme, request_id=request_id, audit=True, bands=bands,
                ledger=ledger, horizon=ref.processed) as probe:
        comp = _teacher_forced(model, ref, probe.new_cache())
        run = probe.result()
    kl, top1 = kl_top1(ref.step_logits, comp)
    verdict = run_gate(run, tokens=ref.processed)
    readings = _readings(model, run)
    account = admit_readings(ledger, request_id, readings)
    ledger.close_request(request_id)
    return RequestResult(request_id, scheme, ref, run, verdict, tuple(kl), tuple(top1),
                         readings, account)
