"""The per-layer accumulator of a Hugging Face probe: step records while the model runs.

Records: every write and every metered call appends one frozen step record
(:class:`WriteStep`, :class:`ReadStep`, :class:`TierBStep`, :class:`AuditStep`) to the
layer's :class:`LayerLog`; :meth:`Probe.result` converts each log once into the layer's
:class:`~witcert_adapters.records.LayerRecord` of numpy values.

Main declarations:

- :class:`LayerLog`: one attention layer's steps, converted once into a
  :class:`~witcert_adapters.records.LayerRecord` of numpy values.
- :class:`WriteStep`, :class:`ReadStep`, :class:`TierBStep`, :class:`AuditStep`: the steps.
- :func:`concat`, :func:`concat_np`, :func:`pair_overlap`: the tensor helpers the probe and
  the cache share with the log.
"""


from __future__ import annotations

from dataclasses import dataclass, field
from typing import final

import torch

from witcert_adapters.records import (
    AuditRecord,
    FloatArray,
    KeyStoreRecord,
    LayerRecord,
    ReadRecord,
    TierBRecord,
    WriteRecord,
)
from witcert_calculus.errors import InvalidValueError
from witcert_calculus.meters.tv_forms import TVBasis

__all__ = ["AuditStep", "LayerLog", "ReadStep", "TierBStep", "WriteStep", "concat", "concat_np",
           "pair_overlap"]


def concat(xs: list[torch.Tensor], dim: int) -> torch.Tensor:
    return xs[0] if len(xs) == 1 else torch.cat(xs, dim=dim)


def concat_np(xs: list[torch.Tensor]) -> FloatArray:
    # Steps joined along the cell axis, as float64 numpy (once, when a run is collected).
    return concat(xs, dim=-1).to(torch.float64).numpy()


@final
@dataclass(frozen=True, slots=True)
class WriteStep:
    """One ``Cache.update`` call of one layer as recorded (tensors; float32 witnesses).

    Attributes:
        tokens: entries written.
        witnesses: per logit part, band witnesses ``[B, Hkv, T, bands]``, rounded up.
        witness_full: ``||k_hat - k||`` of the first logit slot per token ``[B, Hkv, T]``.
        value_res / value_norm: dense memories: ``||v_hat - v||`` and ``||v||`` per token;
            ``None`` for a latent memory.
        exact: with ``audit=True``, the exact ``(key_states, value_states)``; else ``None``.
        dither_scales: a dithered key store's float16 block scales ``[B, Hkv, T, nb]`` as
            stored; ``None`` for any other scheme.
        dither_cast: with a dithered store, ``||k - x_hat||`` per token for the key ``k`` the
            cache holds (the deterministic rounding of the reconstruction to the model's
            dtype and of the outlier values to float16).
        store_bytes: with a dithered store, the bytes of this write's packed codes, scales
            and outlier values per kv head and batch row (summed over its tokens), measured
            from the stored tensors.
        pair_overlap: with outlier pairs, per token of a write after the first, the
            fraction of the token's own top-``m`` pairs (by pair energy) that are among the
            layer's fixed pairs ``[B, Hkv, T]``; ``None`` otherwise.
    """

    tokens: int
    witnesses: tuple[torch.Tensor, ...]
    witness_full: torch.Tensor
    value_res: torch.Tensor | None = None
    value_norm: torch.Tensor | None = None
    exact: tuple[torch.Tensor, torch.Tensor] | None = None
    dither_scales: torch.Tensor | None = None
    dither_cast: torch.Tensor | None = None
    store_bytes: float = 0.0
    pair_overlap: torch.Tensor | None = None


@final
@dataclass(frozen=True, slots=True)
class ReadStep:
    """One metered forward call of one layer (Tier A), cells ``[B, H, Q]``.

    Attributes:
        rows: query rows metered (``Q``).
        meter / eform / two_sided: the raw min-form TV bound and its two forms.
        c_max: ``max_t c_t`` per cell.
        positions: the call's query positions ``[Q]``.
        q_norm: the largest norm of the first logit slot's query (a 0-d tensor).
        out_bound: the attention-output error bound (dense memories), else ``None``.
        value_scale: with ``out_bound``, the ``max_t ||v_t||`` it scales with ``[B, H, Q]``
            (the output bound relative to it is comparable with a TV threshold).
        basis: what the call's TV bounds rest on
            (:class:`~witcert_calculus.meters.tv_forms.TVBasis`:
            the logit bound's evidence and the premises computed from the call's inputs; one
            basis shared by the layers metered together, stacked, at the end of a forward).
    """

    rows: int
    meter: torch.Tensor
    eform: torch.Tensor
    two_sided: torch.Tensor
    c_max: torch.Tensor
    positions: torch.Tensor
    q_norm: torch.Tensor
    out_bound: torch.Tensor | None = None
    basis: TVBasis | None = None
    value_scale: torch.Tensor | None = None


@final
@dataclass(frozen=True, slots=True)
class TierBStep:
    """One forward call's Tier-B cells of one layer.

    Attributes:
        meter: raw Tier-B min-form bound ``[B, H, Q]``.
        delta_loc: the per-cell failure probability of each row ``[Q]``.
        fixed_meter: the same bound at the fixed-horizon allocation
            ``delta_req / (L H T)`` (for comparison; never admitted), or ``None``.
    """

    meter: torch.Tensor
    delta_loc: torch.Tensor
    fixed_meter: torch.Tensor | None = None


@final
@dataclass(frozen=True, slots=True)
class AuditStep:
    """One forward call's true errors of one layer, cells ``[B, H, Q]``.

    Attributes:
        true_tv: true TV against exact attention.
        true_out: true attention-output error (dense memories), else ``None``.
    """

    true_tv: torch.Tensor
    true_out: torch.Tensor | None = None


def _write_steps() -> list[WriteStep]:
    return []


def _read_steps() -> list[ReadStep]:
    return []


def _tier_b_steps() -> list[TierBStep]:
    return []


def _audit_steps() -> list[AuditStep]:
    return []


@dataclass(slots=True)
class LayerLog:
    """Mutable per-layer accumulator (one per layer; never shared between layers).

    Every call appends one step record (:class:`WriteStep` per ``Cache.update``,
    :class:`ReadStep`, :class:`TierBStep` and :class:`AuditStep` per metered forward call);
    only the final query row's probabilities and bounds are kept, overwritten per call.
    :meth:`record` converts the steps into the layer's :class:`LayerRecord` once.

    Attributes:
        written / metered / tier_b_steps / audited: the step records, in call order.
        last_p / last_c: ``p_tilde`` and ``c`` of the most recent query row ``[B, H, S]``.
        last_u: the Tier-B ``c`` (radius plus undithered parts) of that row.
        outlier_pairs: a dithered store's outlier pairs ``[Hkv, m]``, fixed on the layer's
            first write and kept for the request; ``None`` without a dithered store.
        dither_exact: their channel mask ``[Hkv, d]``.
        pair_energy: the running pair energy ``[Hkv, d/2]`` of every key written (to measure
            how stable the fixed choice is); ``None`` without outlier pairs.
        index_bytes: the stored outlier pair indices' bytes per kv head (one set per head).
        revision: how many write steps were replaced (:meth:`replace_write`); appends do not
            count.
    """

    written: list[WriteStep] = field(default_factory=_write_steps)
    metered: list[ReadStep] = field(default_factory=_read_steps)
    tier_b_steps: list[TierBStep] = field(default_factory=_tier_b_steps)
    audited: list[AuditStep] = field(default_factory=_audit_steps)
    last_p: torch.Tensor | None = None
    last_c: torch.Tensor | None = None
    last_u: torch.Tensor | None = None
    outlier_pairs: torch.Tensor | None = None
    dither_exact: torch.Tensor | None = None
    pair_energy: torch.Tensor | None = None
    index_bytes: float = 0.0
    revision: int = 0

    @property
    def writes(self) -> int:
        """Tokens written so far."""
        return sum(step.tokens for step in self.written)

    @property
    def reads(self) -> int:
        """Query rows metered so far."""
        return sum(step.rows for step in self.metered)

    def add_write(self, step: WriteStep) -> None:
        """Append one write call's records."""
        self.written.append(step)

    def replace_write(self, index: int, step: WriteStep) -> None:
        """Replace write step ``index`` (a repair's zeroed witnesses); bumps :attr:`revision`,
        which tells a reader holding copies of earlier steps that they changed."""
        self.written[index] = step
        self.revision += 1

    def add_read(self, step: ReadStep, *, last_p: torch.Tensor, last_c: torch.Tensor) -> None:
        """Append one metered call and keep its final row's ``p_tilde`` and ``c``."""
        self.metered.append(step)
        self.last_p = last_p
        self.last_c = last_c

    def add_tier_b(self, step: TierBStep, *, last_u: torch.Tensor) -> None:
        """Append one call's Tier-B cells and keep its final row's ``c``."""
        self.tier_b_steps.append(step)
        self.last_u = last_u

    def add_audit(self, step: AuditStep) -> None:
        """Append one call's true errors."""
        self.audited.append(step)

    def witnesses(self, part: int) -> torch.Tensor:
        """Band witnesses of logit part ``part`` over every written token ``[B, Hkv, S, bands]``."""
        return concat([step.witnesses[part] for step in self.written], dim=2)

    def exact(self, slot: int) -> torch.Tensor:
        """The exact entries of cache slot ``slot`` (0 keys, 1 values) ``[B, Hkv, S, d]``.

        Raises:
            InvalidValueError: the cache did not keep exact entries (``audit=False``).
        """
        kept = [step.exact[slot] for step in self.written if step.exact is not None]
        if not kept:
            raise InvalidValueError("audit", False, "no exact entries were kept")
        return concat(kept, dim=2)

    def value_residuals(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(||v_hat - v||, ||v||)`` per written token ``[B, Hkv, S]`` (dense memories).

        Raises:
            InvalidValueError: the layout has no value slot.
        """
        res, norm = self.recorded("value_res"), self.recorded("value_norm")
        if not res or not norm:
            raise InvalidValueError("value_slot", None, "no value residuals were recorded")
        return concat(res, dim=2), concat(norm, dim=2)

    def recorded(self, field: str) -> list[torch.Tensor]:
        """One :class:`WriteStep` field's tensors, one per write call that recorded it:
        ``value_res`` / ``value_norm`` (``||v_hat - v||``, ``||v||`` per token, dense
        memories), ``dither_scales`` (the dithered key store's float16 block scales) or
        ``dither_cast`` (``||fl(x_hat) - x_hat||`` per token)."""
        return [t for step in self.written if (t := getattr(step, field)) is not None]

    @property
    def dither_scales(self) -> list[torch.Tensor]:
        """The dithered key store's float16 block scales, one tensor per write call."""
        return self.recorded("dither_scales")

    @property
    def dither_cast(self) -> list[torch.Tensor]:
        """``||fl(x_hat) - x_hat||`` per token, one tensor per write call."""
        return self.recorded("dither_cast")

    def _store_record(self) -> KeyStoreRecord | None:
        # The dithered key store's measured bytes and the stability of its outlier pairs.
        pairs = self.outlier_pairs
        if pairs is None:
            return None
        per_token = (sum(s.store_bytes for s in self.written) + self.index_bytes) / self.writes
        later = [s.pair_overlap.reshape(-1) for s in self.written if s.pair_overlap is not None]
        final = None
        if self.pair_energy is not None:  # the energy of every token written, as one "token"
            final = float(pair_overlap(self.pair_energy.view(1, pairs.shape[0], 1, -1),
                                        pairs).mean())
        return KeyStoreRecord(per_token, outlier_pairs=pairs.to(torch.int64).numpy(),
                              token_overlap=float(torch.cat(later).mean()) if later else None,
                              final_overlap=final)

    def record(self, layer: int) -> LayerRecord:
        """The layer's :class:`LayerRecord` (numpy), one sub-record per path with data."""
        write = read = tier_b = audit = None
        if self.written:
            write = WriteRecord(
                self.writes,
                witness_max=max(float(torch.cat([s.witnesses[i].reshape(-1) for s in self.written])
                                      .max()) for i in range(len(self.written[0].witnesses))),
                witness_full_max=float(torch.cat([s.witness_full.reshape(-1)
                                                  for s in self.written]).max()),
                store=self._store_record())
        steps = self.metered
        if steps and self.last_p is not None and self.last_c is not None:
            bounds = [s.out_bound for s in steps if s.out_bound is not None]
            vscale = [s.value_scale for s in steps if s.value_scale is not None]
            read = ReadRecord(
                self.reads, meter=concat_np([s.meter for s in steps]),
                eform=concat_np([s.eform for s in steps]),
                two_sided=concat_np([s.two_sided for s in steps]),
                c_max=concat_np([s.c_max for s in steps]),
                positions=torch.cat([s.positions for s in steps]).numpy(),
                q_norm_max=float(torch.stack([s.q_norm for s in steps]).max()),
                last_p=self.last_p.to(torch.float64).numpy(), last_c=self.last_c.numpy(),
                out_bound=concat_np(bounds) if bounds else None,
                value_scale=concat_np(vscale) if vscale else None,
                bases=tuple(s.basis for s in steps if s.basis is not None))
        if self.tier_b_steps and self.last_u is not None:
            fixed = [s.fixed_meter for s in self.tier_b_steps if s.fixed_meter is not None]
            tier_b = TierBRecord(concat_np([s.meter for s in self.tier_b_steps]),
                                 delta_loc=concat_np([s.delta_loc for s in self.tier_b_steps]),
                                 last_u=self.last_u.numpy(),
                                 fixed_meter=concat_np(fixed) if fixed else None)
        if self.audited:
            outs = [s.true_out for s in self.audited if s.true_out is not None]
            audit = AuditRecord(concat_np([s.true_tv for s in self.audited]),
                                true_out=concat_np(outs) if outs else None)
        return LayerRecord(layer, write=write, read=read, tier_b=tier_b, audit=audit)


def pair_overlap(energy: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
    # Per token, the fraction of its own top-m pairs (by its pair energy [B, Hkv, T, d/2])
    # that are among the fixed pairs [Hkv, m].
    m = int(pairs.shape[-1])
    own = torch.topk(energy, m, dim=-1).indices  # [B, Hkv, T, m]
    hit = (own.unsqueeze(-1) == pairs.view(1, pairs.shape[0], 1, 1, m)).any(-1)
    return hit.to(torch.float64).mean(dim=-1)

