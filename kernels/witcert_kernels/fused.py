"""Compiled CPU kernels of the vLLM plugin: the fp8 meter's per-token pass, and the check of
the bytes an engine stored.

The torch meter (:mod:`witcert_kernels.meter`) dequantizes every visible key of an fp8 cache
to float64, looks up each element's format witness into a second float64 tensor, and then
meets both with the queries: three passes over eight bytes per stored byte. The kernel here
reads each stored byte once and gives, per (query row, visible token), the logit and the
format logit bound ``c_t = scale * sum_c |q_c| w_{t,c}``
(:func:`witcert_kernels.meter.format_logit_bound`'s formula, the same float64 arithmetic up
to the summation order, which its margin covers), from two 256-entry tables per head: the
codes' exact values times the layer's scale, and their witnesses
(:func:`witcert_calculus.meters.formats.witness_table`), the bound already rounded
outward.

The meter of those rows (:func:`tv_meter_rows`) takes their logits and bounds: per row, in
one pass over its tokens, the masked softmax and the sums ``log A`` and ``log A-`` of
:func:`witcert_kernels.meter.tv_meter_batch`, with the premises it checks; the forms follow
from the sums in torch, by the torch meter's own code
(:func:`witcert_kernels.meter.meter_from_sums`), so the torch meter's float64 tensors of a
step (``p~``, ``expm1(+-c)``, their products) are never made.

The check of a write (:func:`mismatched_elements`) compares, bit for bit, the elements an
engine's caches hold at given positions with the elements expected there, every layer in
one call, reading the caches in place.

All are C++ (``csrc/fp8_meter.cpp``, ``csrc/tv_meter.cpp``, ``csrc/stored_check.cpp``:
one extension) built with the system compiler through torch's extension tools on first use,
into a folder named after the sources' hash and torch's version (one build per machine and
environment;
``WITCERT_KERNEL_DIR`` moves it). A build or load that fails raises
:class:`~witcert_calculus.errors.KernelBuildError`.

Main declarations:

- :class:`Fp8Codes`: the stored bytes of the visible keys with their two tables.
- :func:`fp8_codes`: the tables of a cache format and per-layer scales.
- :func:`fp8_logits_and_bound`: the logits and the established bound of a group of rows.
- :func:`tv_meter_rows`: the meter of those rows from their logits and bounds.
- :func:`mismatched_elements`: per layer, the stored elements that differ from the expected.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from pathlib import Path
from typing import Final, final

import torch

from witcert_calculus.errors import ForgedBoundError, InvalidValueError, KernelBuildError
from witcert_calculus.meters.formats import BOX_PREMISE, Fp8Format, Rounding, box_evidence
from witcert_calculus.meters.witness import ESTABLISHERS, LogitBound, is_established
from witcert_calculus.numerics.rounding import logit_margin
from witcert_calculus.numerics.validation import real

from witcert_calculus.meters.witness import _establish  # pyright: ignore[reportPrivateUsage]
from witcert_kernels.meter import TVMeter, meter_from_sums
from witcert_kernels.meter import _add_bounds  # pyright: ignore[reportPrivateUsage]
from witcert_kernels.meter import _witness_table  # pyright: ignore[reportPrivateUsage]

__all__ = ["Fp8Codes", "fp8_codes", "fp8_logits_and_bound", "load", "mismatched_elements",
           "tv_meter_rows"]

_SOURCES: Final = tuple(Path(__file__).with_name("csrc") / f
                        for f in ("fp8_meter.cpp", "tv_meter.cpp", "stored_check.cpp"))
# no contraction of a product and a sum into one multiply-add: the bound's outward step
# rounds as the rule's two operations do
_CFLAGS: Final = ("-O3", "-ffp-contract=off")
_F64: Final = torch.float64
_FP8_DTYPE: Final = {Fp8Format.E4M3: torch.float8_e4m3fn, Fp8Format.E5M2: torch.float8_e5m2}


@lru_cache(maxsize=1)
def load() -> None:
    """Build (once per source and torch version) and load the kernel.

    Raises:
        KernelBuildError: the compiler or the loader failed; the message names which.
    """
    from torch.utils import cpp_extension  # noqa: PLC0415 - only when the kernel is used

    text = b"".join(s.read_bytes() for s in _SOURCES) + " ".join(_CFLAGS).encode()
    tag = re.sub(r"[^0-9A-Za-z]", "_", torch.__version__)
    name = f"witcert_fused_{hashlib.sha256(text).hexdigest()[:12]}_{tag}"
    root = Path(os.environ.get("WITCERT_KERNEL_DIR",
                               Path.home() / ".cache" / "witcert" / "kernels"))
    build = root / name
    try:
        build.mkdir(parents=True, exist_ok=True)
        cpp_extension.load(  # pyright: ignore[reportUnknownMemberType]
            name=name, sources=[str(s) for s in _SOURCES], build_directory=str(build),
            extra_cflags=list(_CFLAGS), is_python_module=False, verbose=False)
    except (OSError, RuntimeError, ImportError, subprocess.SubprocessError) as exc:
        lines = [ln for ln in str(exc).splitlines() if ln.strip()]
        raise KernelBuildError("witcert_fused", " | ".join(lines[-3:])[:400] or
                               type(exc).__name__) from exc


@final
@dataclass(frozen=True, slots=True)
class Fp8Codes:
    """Where the stored bytes of every request's visible keys are, with what they mean.

    Attributes:
        caches: per layer, the engine's cache bytes flattened (``uint8``, one size).
        start: ``[R, kvh, S]`` int64, the position of request ``r``'s token ``s`` (kv head
            ``k``) in every layer's flattened cache; ``channels``: ``[d]`` int64, the
            offsets of its elements from there.
        values: ``[L * kvh, 256]`` float64, each code's exact value times the layer's scale
            (heads layer-major).
        witnesses: ``[L * kvh, 256]`` float64, each code's format witness at that scale.
    """

    caches: tuple[torch.Tensor, ...]
    start: torch.Tensor
    channels: torch.Tensor
    values: torch.Tensor
    witnesses: torch.Tensor


def fp8_codes(caches: Sequence[torch.Tensor], start: torch.Tensor, channels: torch.Tensor, *,
              fmt: Fp8Format, rounding: Rounding, scales: Sequence[float]) -> Fp8Codes:
    """:class:`Fp8Codes` of the bytes of ``caches`` (one per layer, contiguous, one size) at
    ``start[..., None] + channels``, stored in ``fmt`` by a writer that rounds by
    ``rounding``, each layer at its float32 ``scales[k]`` (the caller's float32 reading of the engine's scale).

    Raises:
        InvalidValueError: caches that are not contiguous bytes of one size, positions out
            of their range, or one scale per layer missing.
    """
    flat = tuple(c.view(-1) if c.is_contiguous() else c for c in caches)
    size = int(flat[0].numel()) if flat else 0
    if not flat or any(c.dtype != torch.uint8 or not c.is_contiguous() or c.dim() != 1 or
                       int(c.numel()) != size for c in flat):
        raise InvalidValueError("caches", f"{len(flat)} tensors",
                                "must be contiguous uint8 caches of one size, one per layer")
    if len(scales) != len(flat):
        raise InvalidValueError("scales", len(scales), f"must be one per layer ({len(flat)})")
    ok = start.dtype == channels.dtype == torch.int64 and start.dim() == 3 and \
        channels.dim() == 1
    if ok and start.numel() and channels.numel():
        ok = int(start.min()) + int(channels.min()) >= 0 and \
            int(start.max()) + int(channels.max()) < size
    if not ok:
        raise InvalidValueError("start", f"tensors of {start.dtype} {tuple(start.shape)} and "
                                f"{channels.dtype} {tuple(channels.shape)}",
                                f"must be [R, kvh, S] and [d] int64 positions below {size}")
    heads = int(start.shape[1])
    exact = torch.arange(256, dtype=torch.int64).to(torch.uint8).view(_FP8_DTYPE[fmt]).to(_F64)
    values = torch.stack([exact * s for s in scales]).repeat_interleave(heads, dim=0)
    wit = torch.stack([_witness_table(fmt, rounding, float(s), torch.device("cpu"))
                       for s in scales])
    return Fp8Codes(flat, start, channels, values.contiguous(),
                    wit.repeat_interleave(heads, dim=0).contiguous())


def fp8_logits_and_bound(query: torch.Tensor, side: Fp8Codes, requests: torch.Tensor,
                         visible: torch.Tensor, *, scale: float, vectorized: bool = True
                         ) -> tuple[torch.Tensor, LogitBound[torch.Tensor]]:
    """The logits and the established format logit bound of a group of rows, in one pass.

    Args:
        query: ``[N, H, G, Q, d]`` the rows' queries (``G`` query heads per kv head).
        side: where the stored bytes are (:class:`Fp8Codes`); ``requests`` (``[N]``): the
            group's rows of its index.
        visible: ``[N, S]`` the tokens each request sees (others: logit 0, bound 0).
        scale: the softmax scale (positive, finite).
        vectorized: AVX-512 where the processor has it (``False``: the portable loops, the
            same operations in the same order, hence the same bits).

    Returns:
        ``[N, H, G, Q, S]`` float64 logits (``scale * q . k`` of the stored keys) and the
        bound ``scale * sum_c |q_c| w_{t,c}``, rounded outward with
        :func:`~witcert_calculus.numerics.rounding.logit_margin` of ``d`` products, an
        established :class:`~witcert_calculus.meters.witness.LogitBound` (Lean
        ``WitCert.Formats.box_logit_bound_sound``).

    Raises:
        KernelBuildError: the kernel cannot be built; InvalidValueError: a bad scale.
    """
    sc = real("scale", scale, lo=0.0, lo_open=True)
    load()
    n, h, g, qn, d = (int(x) for x in query.shape)
    q = query.to(_F64).reshape(n, h, g * qn, d).contiguous()
    start = side.start[requests].contiguous()
    margin = logit_margin(d, scale=sc)
    logits, values = torch.ops.witcert_fused.fp8_logits_and_bound(
        q, list(side.caches), start, side.channels, side.values, side.witnesses,
        visible.contiguous(), sc, margin.gamma, margin.alpha, vectorized)
    width = int(start.shape[2])
    bound = _establish(values.view(n, h, g, qn, width),
                       evidence=box_evidence(scale=sc, channels=d, witness_ok=None),
                       delta=Fraction(0), source="witcert_kernels.fused.fp8_logits_and_bound",
                       add=_add_bounds, checks=((BOX_PREMISE, (side.witnesses >= 0).all()),))
    return logits.view(n, h, g, qn, width), bound


def tv_meter_rows(logits: torch.Tensor, c: LogitBound[torch.Tensor], mask: torch.Tensor, *,
                  vectorized: bool = True) -> TVMeter:
    """The meter ``min(e-form, two-sided)`` of rows given by their logits, one pass over each
    row's tokens: :func:`~witcert_kernels.meter.tv_meter_batch` of their masked softmax,
    without a float64 tensor per step of it.

    Args:
        logits: ``[N, H, G, Q, S]`` float64 logits (as :func:`fp8_logits_and_bound` gives
            them); ``c``: their established logit bounds, of the same shape.
        mask: ``[N, Q, S]`` the tokens each query row attends to (the softmax's support;
            the bounds of the others count only in ``max c``).
        vectorized: AVX-512 where the processor has it (eight tokens at once, with the vector
            exp and expm1 of torch's CPU kernels; ``False``: the portable loops, with the C
            library's).

    Returns:
        A :class:`~witcert_kernels.meter.TVMeter` of ``[N, H, G, Q]`` bounds (rows with one
        token 0), the sums' margin :func:`~witcert_calculus.numerics.rounding.tv_margin`
        over ``S`` tokens, its basis with the premises computed here.

    Raises:
        ForgedBoundError: a ``LogitBound`` no establishing function produced;
        InvalidValueError: shapes that differ; KernelBuildError: no kernel.
    """
    if not is_established(c):
        raise ForgedBoundError("LogitBound", ESTABLISHERS)
    n, h, g, qn, width = (int(x) for x in logits.shape)
    if tuple(c.values.shape) != tuple(logits.shape) or tuple(mask.shape) != (n, qn, width):
        raise InvalidValueError("c", f"bounds {tuple(c.values.shape)} and mask "
                                f"{tuple(mask.shape)}", f"must fit the logits "
                                f"{tuple(logits.shape)}")
    load()
    la, lm, cmax, positive, p_ok, c_ok = torch.ops.witcert_fused.tv_meter_rows(
        logits.reshape(n, h, g * qn, width).to(_F64),
        c.values.reshape(n, h, g * qn, width).to(_F64), mask.contiguous(), vectorized)
    rows = (n, h, g, qn)
    forms = meter_from_sums(la.view(rows), lm.view(rows), cmax.view(rows), c=c, tokens=width,
                            premises=(p_ok.all(), c_ok.all()),
                            visible=mask.sum(dim=-1).view(n, 1, 1, qn),
                            positive=positive.view(rows))
    return forms.meter()


def mismatched_elements(caches: Sequence[torch.Tensor], start: torch.Tensor,
                        channels: torch.Tensor, expected: Sequence[torch.Tensor]
                        ) -> torch.Tensor:
    """Per layer, how many elements of its cache at ``start[..., None] + channels`` differ,
    bit for bit, from ``expected`` (0: the cache holds exactly what was expected).

    Args:
        caches: per layer, the cache (contiguous; one shape and element size).
        start: ``[...]`` int64 positions in every layer's flattened cache (as
            :func:`~witcert_adapters.vllm_plugin.paged.element_offsets` gives them);
            ``channels``: ``[d]`` int64 offsets from each.
        expected: per layer, its expected elements ``[..., d]``, of the caches' element
            size.

    Returns:
        ``[L]`` int64 counts of differing elements.

    Raises:
        KernelBuildError: the kernel cannot be built; InvalidValueError: shapes, element
            sizes or positions that do not fit the caches (named by the kernel's message).
    """
    load()
    flat = [c.view(-1) if c.is_contiguous() else c for c in caches]
    try:
        out: torch.Tensor = torch.ops.witcert_fused.mismatched_elements(
            flat, start.contiguous(), channels.contiguous(), [e.contiguous() for e in expected])
    except RuntimeError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        shapes = [f"{tuple(e.shape)} {e.dtype}" for e in expected[:2]]
        raise InvalidValueError("expected", ", ".join(shapes) + (" ..." if len(expected) > 2
                                                                 else ""),
                                f"does not fit the caches: {first}") from exc
    return out
