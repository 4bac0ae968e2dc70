"""Registry of attention-memory layouts: how to find each layer's attention and its queries.

An entry says, for one ``model_type``, which modules are the attention layers, how the
cache's two slots enter the attention logits, and how to recompute the layer's
post-RoPE queries from the arguments the layer itself receives (its own projection
weights and the rotary tables the model passes in). Recomputing costs one query
projection per layer; it reads nothing the model does not already compute.

Two memory classes are covered here (and the full-attention layers of the hybrid
recurrent models, observed with the same layouts next to their recurrent layers):

- ``dense`` (Llama, Qwen2, Mistral style GQA with RoPE): slot 0 holds post-RoPE keys and
  enters the logits with the query; slot 1 holds values.
- ``latent`` (DeepSeek-V2/V3 MLA): slot 0 holds the normalised KV latent ``c``, slot 1 the
  shared post-RoPE key part. The logit of head ``h`` is
  ``scale * (q_nope_h . W_kb,h c + q_rot_h . k_rot)``; the adapter uses the absorbed query
  ``W_kb,h^T q_nope_h`` so a latent residual bounds the logit error exactly through the
  decompression map (Cauchy-Schwarz on the absorbed query).
- ``qwen3_next`` full-attention layers: dense GQA whose query is the first half of a
  gated ``q_proj`` (the second half gates the output), RMS-normalised per head, with
  *partial* RoPE (the first ``rotary_dim`` channels rotated in the half-split layout of
  that sub-vector, the rest passed through). The witness uses one band (the whole head
  vector), for which band unitarity holds trivially; per-band Cauchy-Schwarz is sound for
  any partition, one band is the partition that needs no layout.
- ``kimi_linear`` full-attention layers: MLA with NoPE (the cached "rope" part is
  shared but never rotated): slot 0 the normalised latent with the absorbed query, slot 1
  the shared key part with the unrotated query part.

Main declarations
-----------------
- :class:`LogitPart`, :class:`ArchSpec`, :func:`register_architecture`, :func:`spec_for`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, final

import torch

from witcert_adapters.runs import MemoryKind
from witcert_calculus.errors import InvalidValueError
from witcert_calculus.meters.witness import RopeLayout

__all__ = ["DENSE_BANDS", "ArchSpec", "LogitPart", "architectures", "register_architecture",
           "spec_for"]

DENSE_BANDS: Final = 8
"""Witness bands of a dense model's keys (a ``Probe``'s ``bands=`` overrides it), chosen by
measurement (``scripts/measure_bands.py`` prints the demo's Tier-A coverage per band count):
coverage keeps rising with more bands, and each band stores one float32 per token and kv
head; 8 bands keep the witness side buffer at a quarter of an fp16 key of 64 channels."""


@final
@dataclass(frozen=True, slots=True)
class LogitPart:
    """One cache slot that enters the attention logits.

    Attributes:
        slot: 0 (the ``key_states`` argument of ``Cache.update``) or 1 (``value_states``).
        bands: witness bands (contiguous runs of rotary pairs) for this slot.
        layout: rotary pair layout of the cached tensor.
    """

    slot: int
    bands: int
    layout: RopeLayout


QueryFn = Callable[[Any, torch.Tensor, Any], tuple[torch.Tensor, ...]]


@final
@dataclass(frozen=True, slots=True)
class ArchSpec:
    """How one architecture's attention memory is observed.

    Attributes:
        model_type: the config's ``model_type``.
        memory_class: :attr:`MemoryKind.DENSE` or :attr:`MemoryKind.LATENT`.
        parts: the slots that enter the logits, in the order :attr:`queries` returns queries.
        queries: ``(attention_module, hidden_states, position_embeddings)`` -> one post-RoPE
            query tensor ``[batch, heads, q_len, dim]`` per part.
        value_slot: index of the slot holding values (dense), or ``None`` (latent: values
            are decompressed from slot 0 and no output bound is produced here).
    """

    model_type: str
    memory_class: MemoryKind
    parts: tuple[LogitPart, ...]
    queries: QueryFn
    value_slot: int | None


_ARCH: dict[str, ArchSpec] = {}


def register_architecture(spec: ArchSpec) -> ArchSpec:
    """Register an :class:`ArchSpec` under its ``model_type``.

    Raises:
        InvalidValueError: the model type is already registered.
    """
    if spec.model_type in _ARCH:
        raise InvalidValueError("model_type", spec.model_type, "is already registered")
    _ARCH[spec.model_type] = spec
    return spec


def spec_for(model_type: str) -> ArchSpec:
    """Return the spec registered for ``model_type``.

    Raises:
        InvalidValueError: no spec for that model type (lists the known ones).
    """
    try:
        return _ARCH[model_type]
    except KeyError:
        raise InvalidValueError(
            "model_type", model_type, f"has no registered memory layout; known: {sorted(_ARCH)}"
        ) from None


def architectures() -> list[str]:
    """Registered model types, sorted."""
    return sorted(_ARCH)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _dense_queries(module: Any, hidden: torch.Tensor, pos: Any) -> tuple[torch.Tensor, ...]:
    b, s = hidden.shape[:-1]
    q = module.q_proj(hidden).view(b, s, -1, module.head_dim).transpose(1, 2)
    cos, sin = pos
    cos = cos.unsqueeze(1)
    sin = sin.unsqueeze(1)
    # The same expression as transformers' ``apply_rotary_pos_emb`` (half-split layout).
    return ((q * cos) + (_rotate_half(q) * sin),)


def _mla_split(module: Any, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    b, s = hidden.shape[:-1]
    if module.q_lora_rank is None:
        q = module.q_proj(hidden)
    else:
        q = module.q_b_proj(module.q_a_layernorm(module.q_a_proj(hidden)))
    q = q.view(b, s, -1, module.qk_head_dim).transpose(1, 2)
    q_nope, q_rot = torch.split(q, [module.qk_nope_head_dim, module.qk_rope_head_dim], dim=-1)
    heads = q.shape[1]
    w = module.kv_b_proj.weight.view(heads, module.qk_nope_head_dim + module.v_head_dim, -1)
    w_kb = w[:, : module.qk_nope_head_dim, :]
    q_abs = torch.einsum("bhqn,hnr->bhqr", q_nope, w_kb)
    return q_abs, q_rot, q


def _deepseek_v2_queries(module: Any, hidden: torch.Tensor, pos: Any) -> tuple[torch.Tensor, ...]:
    q_abs, q_rot, _ = _mla_split(module, hidden)
    # Interleaved complex rotation, as DeepSeek-V2's ``apply_rotary_emb``.
    qc = torch.view_as_complex(q_rot.float().reshape(*q_rot.shape[:-1], -1, 2))
    rot = torch.view_as_real(qc * pos.unsqueeze(1)).flatten(3).type_as(q_rot)
    return q_abs, rot


def _deepseek_v3_queries(module: Any, hidden: torch.Tensor, pos: Any) -> tuple[torch.Tensor, ...]:
    q_abs, q_rot, _ = _mla_split(module, hidden)
    cos, sin = pos
    if module.config.rope_interleave:
        # The interleaved pairs come out de-interleaved: (evens, odds) halves, a half-split layout.
        c = cos[..., : cos.shape[-1] // 2].unsqueeze(1)
        s = sin[..., : sin.shape[-1] // 2].unsqueeze(1)
        q1, q2 = q_rot[..., 0::2], q_rot[..., 1::2]
        rot = torch.cat([q1 * c - q2 * s, q2 * c + q1 * s], dim=-1)
    else:
        rot = (q_rot * cos.unsqueeze(1)) + (_rotate_half(q_rot) * sin.unsqueeze(1))
    return q_abs, rot


def _qwen3_next_queries(module: Any, hidden: torch.Tensor, pos: Any) -> tuple[torch.Tensor, ...]:
    b, s = hidden.shape[:-1]
    q, _ = torch.chunk(module.q_proj(hidden).view(b, s, -1, module.head_dim * 2), 2, dim=-1)
    q = module.q_norm(q.reshape(b, s, -1, module.head_dim)).transpose(1, 2)
    cos, sin = pos
    cos = cos.unsqueeze(1)
    sin = sin.unsqueeze(1)
    r = cos.shape[-1]  # partial rotary: only the first r channels rotate
    q_rot, q_pass = q[..., :r], q[..., r:]
    return (torch.cat([(q_rot * cos) + (_rotate_half(q_rot) * sin), q_pass], dim=-1),)


def _kimi_linear_queries(module: Any, hidden: torch.Tensor, pos: Any) -> tuple[torch.Tensor, ...]:
    # NoPE: the shared key part and its query part are used unrotated (pos is None).
    q_abs, q_rot, _ = _mla_split(module, hidden)
    return q_abs, q_rot


def _dense_spec(model_type: str, bands: int = DENSE_BANDS) -> ArchSpec:
    return ArchSpec(model_type, MemoryKind.DENSE,
                    (LogitPart(0, bands, RopeLayout.HALF_SPLIT),), _dense_queries, 1)


for _mt in ("llama", "qwen2", "mistral"):
    register_architecture(_dense_spec(_mt))

register_architecture(ArchSpec(
    "deepseek_v2", MemoryKind.LATENT,
    (LogitPart(0, 1, RopeLayout.HALF_SPLIT), LogitPart(1, 1, RopeLayout.INTERLEAVED)),
    _deepseek_v2_queries, None,
))
register_architecture(ArchSpec(
    "deepseek_v3", MemoryKind.LATENT,
    (LogitPart(0, 1, RopeLayout.HALF_SPLIT), LogitPart(1, 1, RopeLayout.HALF_SPLIT)),
    _deepseek_v3_queries, None,
))
register_architecture(ArchSpec(
    "qwen3_next", MemoryKind.DENSE, (LogitPart(0, 1, RopeLayout.HALF_SPLIT),),
    _qwen3_next_queries, 1,
))
register_architecture(ArchSpec(
    "kimi_linear", MemoryKind.LATENT,
    (LogitPart(0, 1, RopeLayout.HALF_SPLIT), LogitPart(1, 1, RopeLayout.HALF_SPLIT)),
    _kimi_linear_queries, None,
))
