"""Typed readings and contracts from a :class:`~witcert_adapters.live_run.LiveRun`.

Per layer, the worst (largest) Tier-A meter over all cells becomes a
``Reading[AttentionTV[AtConsume]]`` backed by the meter's Lean theorem; its tier is
decided by the machine (CERTIFIED below 1, SATURATED at or above). For dense memories the
layer's coarse chain ``storage witness >> score bridge >> softmax->TV`` is also built
from the layer's largest full-residual witness and query norm, and bounded; it is the
composed contract a user can inspect with ``explain()``.

Main declarations
-----------------
- :class:`LayerReading`, :func:`layer_readings`, :func:`dense_chain` (its type
  :data:`DenseChain`), :func:`coverage`, :func:`admit_readings` (into the request ledger).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, TypeAlias, final

import numpy as np

from witcert_adapters.live_run import LiveRun
from witcert_calculus import RiskLedger, Verdict
from witcert_calculus.contracts import Contract, Reading, chain, _reading  # pyright: ignore[reportPrivateUsage]
from witcert_calculus.errors import InvalidValueError
from witcert_calculus.lean.theorems import TV_EFORM_METER_SOUND, TV_TWO_SIDED_METER_SOUND
from witcert_calculus.metrics import AtConsume, AttentionTV, KeyResidualAbs
from witcert_calculus.numerics.validation import real

__all__ = ["METER_THEOREM", "DenseChain", "LayerReading", "admit_readings", "coverage",
           "dense_chain", "layer_readings"]

METER_THEOREM: Final = TV_TWO_SIDED_METER_SOUND

DenseChain: TypeAlias = Contract[KeyResidualAbs[AtConsume], AttentionTV[AtConsume]]
"""The composed contract of one dense layer: storage witness to attention TV."""


@final
@dataclass(frozen=True, slots=True)
class LayerReading:
    """One layer's worst-cell meter reading and (dense) composed chain.

    Attributes:
        layer: layer index.
        meter: the worst cell's meter as a typed reading.
        cell: ``(batch, head, position)`` of the worst cell.
        chain: the composed contract, or ``None`` when not built.
        chain_reading: the chain's bound, or ``None``.
    """

    layer: int
    meter: Reading[AttentionTV[AtConsume]]
    cell: tuple[int, int, int]
    chain: DenseChain | None
    chain_reading: Reading[AttentionTV[AtConsume]] | None


def layer_readings(run: LiveRun, *, chains: Mapping[int, DenseChain] | None = None
                   ) -> list[LayerReading]:
    """Worst-cell readings per layer (and chains when given).

    Args:
        run: the observed run.
        chains: optional per-layer composed contracts from
            :func:`witcert_adapters.readings.dense_chain`; bounded at input 0 (the witness
            contract carries its own constant).

    Returns:
        One :class:`LayerReading` per metered layer, in layer order.

    Example:
        >>> # readings = layer_readings(probe.result())
        >>> # [(r.layer, r.meter.tier.name) for r in readings]
    """
    out: list[LayerReading] = []
    for layer in run.layers:
        read = run.read(layer)
        raw = read.meter
        flat = int(np.argmax(raw))
        cell = tuple(int(i) for i in np.unravel_index(flat, raw.shape))
        value = float(raw.reshape(-1)[flat])
        eform_wins = float(read.eform.reshape(-1)[flat]) <= float(
            read.two_sided.reshape(-1)[flat])
        # The logit bounds were established from the stored witnesses and the live queries
        # (witcert_kernels.meter.logit_bound); each call's computed premises are read here.
        evidence = read.evidence(TV_EFORM_METER_SOUND if eform_wins else METER_THEOREM)
        reading = _reading(AttentionTV[AtConsume], value, evidence=evidence)
        ch = None if chains is None else chains.get(layer)
        out.append(LayerReading(layer, reading, (cell[0], cell[1], cell[2]), ch,
                                None if ch is None else ch.bound(0.0)))
    return out


def dense_chain(*, witness_max: float, q_norm_max: float, scale: float) -> DenseChain:
    """``storage witness >> score bridge >> softmax->TV (e-form)`` for one layer.

    Args:
        witness_max: largest full-residual witness ``||k_hat - k||`` in the layer
            (:attr:`~witcert_adapters.records.WriteRecord.witness_full_max`).
        q_norm_max: largest query norm in the layer
            (:attr:`~witcert_adapters.records.ReadRecord.q_norm_max`).
        scale: the attention scale.

    Returns:
        The composed contract; ``bound(0.0)`` is the layer's coarse TV bound.

    Raises:
        InvalidValueError: a negative or non-finite witness, norm or scale (from the stages).

    Example:
        >>> dense_chain(witness_max=0.01, q_norm_max=2.0, scale=0.125).bound(0.0).tier.name
        'CERTIFIED'
    """
    from witcert_calculus.bridges import score_bridge, softmax_tv_eform, witness_contract

    return chain(witness_contract(AtConsume, witness_max=witness_max),
                 score_bridge(AtConsume, scale=scale, q_norm_max=q_norm_max),
                 softmax_tv_eform(AtConsume))


def coverage(run: LiveRun, *, threshold: float, min_position: int = 0) -> float:
    """Fraction of (layer, batch, head, position) cells whose reported meter is <= threshold.

    Only cells at positions ``>= min_position`` count (e.g. decode steps only).

    Args:
        run: the observed run.
        threshold: the meter value a covered cell may reach.
        min_position: the first query position that counts.

    Returns:
        The covered fraction in ``[0, 1]``.

    Raises:
        InvalidValueError: ``threshold`` outside ``[0, 1]`` or no cell selected.

    Example:
        >>> # coverage(run, threshold=0.1, min_position=prompt_len)  # decode steps only
    """
    threshold = real("threshold", threshold, lo=0.0, hi=1.0)
    hit = 0
    total = 0
    for layer in run.layers:
        read = run.read(layer)
        sel = read.positions >= min_position
        rep = read.reported()[..., sel]
        hit += int((rep <= threshold).sum())
        total += rep.size
    if total == 0:
        raise InvalidValueError("min_position", min_position, "selects no cell")
    return hit / total


def admit_readings(ledger: RiskLedger, request_id: int, readings: Sequence[LayerReading]
                   ) -> Verdict:
    """Admit every layer's worst-cell meter reading into ``request_id``'s ledger account.

    Tier-A readings are deterministic (delta 0) and cost nothing; a saturated reading caps
    the request's verdict at PARTIALLY_CERTIFIED (the ledger's rule). Tier-B readings are
    admitted by the probe itself, one probabilistic event per forward call (see
    :mod:`witcert_adapters.hf`).

    Args:
        ledger: the request ledger.
        request_id: an open account of ``ledger``.
        readings: from :func:`layer_readings`; each is admitted once (idempotency token
            ``r{request_id}-l{layer}``).

    Returns:
        The ledger's :class:`~witcert_calculus.ledger.Verdict` after the admissions.

    Raises:
        UnknownRequestError: ``request_id`` is not an open account of ``ledger``.

    Example:
        >>> # verdict = admit_readings(ledger, rid, layer_readings(run)); verdict.spent
    """
    for r in readings:
        ledger.admit(request_id, r.meter, token=f"r{request_id}-l{r.layer}")
    return ledger.verdict(request_id)
