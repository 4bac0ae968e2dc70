"""The fused decode kernel's Tier-B meter, its read straight from a dithered pool, MLA shapes,
and the launch paths' freedom from host reads.

Tier B: the kernel's ``u_t``-driven meter equals the torch twin (``tv_bounds_batch`` on
``tier_b_logit_bound`` of the same inputs) to a tight relative error and bounds the exact TV
between attention on the true keys and on the dithered keys, row by row, on random and
adversarial (non-adaptive) queries. The pooled read equals ``fused_decode_tier_b`` over
``dither_read`` keys, and a read with the wrong stream key is caught.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from witcert_calculus.errors import InvalidValueError, PremiseError  # noqa: E402
from witcert_calculus.lean.theorems import TV_EFORM_METER_SOUND  # noqa: E402
from witcert_calculus.meters.witness import RopeLayout  # noqa: E402
from witcert_calculus.tiers import Tier, assumptions_of  # noqa: E402
from witcert_kernels.dither import STORED_ENCODING, dither_quantize, exact_channels, \
    select_outlier_pairs, tier_b_logit_bound  # noqa: E402
from witcert_kernels.meter import l2_norm_upper, logit_bound, tv_bounds_batch  # noqa: E402
from witcert_kernels.triton_decode import POOL_WRITTEN_BY_STORE, FusedDecodeTiers, \
    fused_decode, fused_decode_pool, fused_decode_tier_b, pool_cast_bound  # noqa: E402
from witcert_kernels.triton_dither import DitherPool, dither_read, dither_store  # noqa: E402
from witcert_kernels.triton_witness import witness_write  # noqa: E402
from reference.issued import reading

LAYOUT = RopeLayout.HALF_SPLIT
D = 32
BLOCK_SIZE = 16
DELTA = 1e-3


class Store:
    """A paged cache of ``lens`` requests over dithered keys (the torch port's encoding of the
    slots as positions of one request), its true keys, and the keys a ``dtype`` cache reads."""

    def __init__(self, lens: list[int], *, kv_heads: int, page: int, seed: int,
                 dtype: torch.dtype, outlier_pairs: int = 2, d: int = D) -> None:
        g = torch.Generator().manual_seed(seed)
        pages = [math.ceil(n / page) for n in lens]
        total = sum(pages) + 2
        order = torch.randperm(total, generator=g)
        self.page, self.lens, self.kv_heads = page, lens, kv_heads
        self.indptr = torch.tensor(np.cumsum([0, *pages]), dtype=torch.int32)
        self.indices = order[:sum(pages)].to(torch.int32)
        slots = total * page
        self.x = torch.randn(slots, kv_heads, d, generator=g, dtype=torch.float64)
        self.x[:, :, 5] *= 12.0  # a massive channel
        self.x[:, :, 9] *= 4.0
        xs = self.x.permute(1, 0, 2).unsqueeze(0)  # [1, kv, slots, d]: slot = position
        pairs = select_outlier_pairs(xs, count=outlier_pairs, layout=LAYOUT)
        enc = dither_quantize(xs, request=seed, layer=3, start=0, block_size=BLOCK_SIZE,
                              outlier_pairs=pairs, layout=LAYOUT)
        self.exact = enc.exact
        read = enc.read(dtype)  # what the cache holds
        self.k = read[0].permute(1, 0, 2).contiguous()  # [slots, kv, d]
        self.scales = enc.scales[0].permute(1, 0, 2).contiguous()  # [slots, kv, nb] fp16
        self.cast = l2_norm_upper(read.double() - enc.x_hat)[0].permute(1, 0).contiguous()
        self.v = torch.randn(slots, kv_heads, d, generator=g).to(dtype)
        self.w = witness_write(self.x.float(), self.k.float(), bands=4, layout=LAYOUT)

    def slots_of(self, b: int) -> torch.Tensor:
        t = torch.arange(self.lens[b])
        pages = self.indices[int(self.indptr[b]):int(self.indptr[b + 1])].to(torch.int64)
        return pages[t // self.page] * self.page + t % self.page

    def common(self) -> dict[str, object]:
        return {"kv_indptr": self.indptr, "kv_indices": self.indices,
                "seq_lens": torch.tensor(self.lens, dtype=torch.int32),
                "page_size": self.page, "max_tokens": max(self.lens)}

    def run(self, q: torch.Tensor, *, splits: int = 1, scale: float = 0.25,
            witness: bool = False, scales: torch.Tensor | None = None) -> FusedDecodeTiers:
        return fused_decode_tier_b(q, self.k, self.v, self.scales if scales is None else scales,
                                   exact=self.exact, cast=self.cast, delta_loc=DELTA,
                                   scale=scale, splits=splits,
                                   witness=self.w if witness else None,
                                   layout=LAYOUT if witness else None,
                                   **self.common())  # type: ignore[arg-type]


def _twin(c: Store, q: torch.Tensor, scale: float) -> dict[str, torch.Tensor]:
    """Per row: the twin's Tier-B meter and largest u_t on the same keys, the Tier-A meter,
    and the exact TV between attention on the true and on the stored keys."""
    bsz, heads, _ = q.shape
    group = heads // c.kv_heads
    meter, u_max, meter_a, tv = [], [], [], []
    for b in range(bsz):
        sl = c.slots_of(b)
        n = torch.tensor([len(sl)])
        for h in range(heads):
            kv = h // group
            qh = q[b, h].double()
            p_hat = torch.softmax((c.k[sl, kv].double() @ qh) * scale, 0)
            p = torch.softmax((c.x[sl, kv] @ qh) * scale, 0)
            u = tier_b_logit_bound(qh.view(1, -1), c.scales[sl, kv], c.cast[sl, kv],
                                   scale=scale, delta_loc=DELTA, visible=n, exact=c.exact[kv])
            meter.append(tv_bounds_batch(p_hat.view(1, -1), u, visible=n).meter[0])
            u_max.append(u.values.max())
            lb = logit_bound(qh, c.w[sl, kv].double(), scale=scale, layout=LAYOUT)
            meter_a.append(tv_bounds_batch(p_hat, lb, visible=n[0]).meter)
            tv.append(0.5 * (p - p_hat).abs().sum())
    return {k: torch.stack(v).view(bsz, heads) for k, v in
            (("meter", meter), ("u_max", u_max), ("meter_a", meter_a), ("tv", tv))}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a - b).abs() / b.abs().clamp(min=1e-300)).max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("page, heads, kv_heads", [(1, 4, 2), (16, 4, 1), (16, 2, 2)],
                         ids=["gqa-page1", "mqa-page16", "mha-page16"])
def test_tier_b_meter_matches_the_torch_twin_and_bounds_the_exact_tv(
        dtype: torch.dtype, page: int, heads: int, kv_heads: int) -> None:
    lens = [37, 1, 20, 54]
    c = Store(lens, kv_heads=kv_heads, page=page, seed=page + 3 * heads + kv_heads, dtype=dtype)
    q = torch.randn(len(lens), heads, D, generator=torch.Generator().manual_seed(4)).to(dtype)
    got = c.run(q, splits=2, witness=True)
    ref = _twin(c, q, 0.25)
    rel_u = _rel(got.tier_b.bound_max, ref["u_max"])
    rel = _rel(got.tier_b.meter, ref["meter"])
    assert got.tier_a is not None
    rel_a = _rel(got.tier_a.meter, ref["meter_a"])
    print(f"max relative error vs the twin: u_max {rel_u:.2e}, Tier-B meter {rel:.2e}, "
          f"Tier-A meter {rel_a:.2e}")
    assert rel_u < 1e-13, rel_u  # the same formula and margins: float64 summation order only
    assert rel < 1e-4, rel  # the twin's float64 p_hat vs the kernel's float32 logits
    assert rel_a < 1e-4, rel_a
    assert bool((got.tier_b.meter >= ref["tv"]).all())  # sound, row by row
    assert bool((got.tier_b.meter[1] == 0).all())  # one token
    assert float(ref["tv"].max()) > 1e-4  # the store is lossy: the bound is not vacuous
    reading_basis = got.tier_b.basis
    assert reading_basis.delta == pytest.approx(DELTA)
    assert STORED_ENCODING in reading_basis.assumptions
    ev = reading_basis.evidence(TV_EFORM_METER_SOUND)
    assert ev is not None


@pytest.mark.slow  # Triton's interpreter: seconds per launch on a CPU
def test_tier_b_bounds_the_exact_tv_on_adversarial_queries() -> None:
    """Non-adaptive worst cases: queries along the massive channel, on the largest block
    scale's channels, on the outlier channels only (exact: only the cast term), and a large
    softmax scale (TV far from 0). The bound holds on every row."""
    c = Store([64, 48, 33], kv_heads=1, page=16, seed=9, dtype=torch.float16)
    q = torch.zeros(3, 4, D, dtype=torch.float64)
    for b in range(3):
        sl = c.slots_of(b)
        q[b, 0, 5] = 3.0  # the massive channel
        big = int(c.scales[sl, 0].double().mean(0).argmax())
        q[b, 1, big * BLOCK_SIZE:(big + 1) * BLOCK_SIZE] = torch.sign(c.x[sl[0], 0,
                                                                           big * BLOCK_SIZE:
                                                                           (big + 1) * BLOCK_SIZE])
        q[b, 2] = torch.where(c.exact[0], 2.0, 0.0)  # only the exact channels
        q[b, 3] = 1.5 * c.x[sl, 0].mean(0) / c.x[sl, 0].mean(0).norm()
    q = q.to(torch.float16)
    worst = 0.0
    for scale in (1.0, 8.0, 32.0):
        got = c.run(q, splits=3, scale=scale)
        ref = _twin(c, q, scale)
        assert bool((torch.clamp(got.tier_b.meter, max=1.0) >= ref["tv"]).all()), scale
        assert bool((got.tier_b.tanh_max >= ref["tv"]).all())
        assert _rel(got.tier_b.bound_max, ref["u_max"]) < 1e-13
        worst = max(worst, float(ref["tv"].max()))
    assert worst > 1e-3, worst  # the adversarial rows move attention
    # exact-channel-only queries see no dither: their bound is the cast term's alone
    assert float(got.tier_b.bound_max[:, 2].max()) < float(got.tier_b.bound_max[:, 1].min())


def test_tier_b_fails_closed_on_a_broken_store() -> None:
    c = Store([30, 12], kv_heads=2, page=1, seed=2, dtype=torch.float32)
    q = torch.randn(2, 2, D, generator=torch.Generator().manual_seed(0))
    zero = c.run(q, scales=torch.zeros_like(c.scales))
    assert bool(torch.isfinite(zero.tier_b.meter).all())  # cast term only, still finite
    s = c.scales.clone()
    s[c.slots_of(0)[3], :, 1] = math.inf
    sat = c.run(q, scales=s)
    assert bool(torch.isinf(sat.tier_b.meter[0]).all())
    assert bool(torch.isfinite(sat.tier_b.meter[1]).all())
    with pytest.raises(PremiseError):
        sat.tier_b.basis.evidence(TV_EFORM_METER_SOUND)
    s[c.slots_of(1)[2], :, 0] = math.nan
    bad = c.run(q, scales=s)
    assert bool(torch.isnan(bad.tier_b.meter[1]).all())  # never a finite certificate
    s = c.scales.clone()
    s[c.slots_of(1)[0], 0, 0] = -1.0
    neg = c.run(q, scales=s)
    with pytest.raises(PremiseError):
        neg.tier_b.basis.evidence(TV_EFORM_METER_SOUND)


def test_tier_b_bad_input_is_a_typed_error() -> None:
    c = Store([8], kv_heads=2, page=1, seed=1, dtype=torch.float32)
    q = torch.randn(1, 4, D)
    with pytest.raises(InvalidValueError, match="scales"):
        c.run(q, scales=c.scales.float())
    with pytest.raises(InvalidValueError, match="delta_loc"):
        fused_decode_tier_b(q, c.k, c.v, c.scales, exact=c.exact, cast=c.cast, delta_loc=1.0,
                            scale=1.0, **c.common())  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match="exact"):
        fused_decode_tier_b(q, c.k, c.v, c.scales, exact=c.exact[:1], cast=c.cast,
                            delta_loc=DELTA, scale=1.0, **c.common())  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match="cast"):
        fused_decode_tier_b(q, c.k, c.v, c.scales, exact=c.exact, cast=c.cast[:, :1],
                            delta_loc=DELTA, scale=1.0, **c.common())  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match="layout"):
        fused_decode_tier_b(q, c.k, c.v, c.scales, exact=c.exact, cast=c.cast,
                            delta_loc=DELTA, scale=1.0, witness=c.w,
                            **c.common())  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- pooled read

class Pool:
    """True keys written into a DitherPool at shuffled slots by ``dither_store``."""

    def __init__(self, lens: list[int], *, kv_heads: int, page: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        pages = [math.ceil(n / page) for n in lens]
        total = sum(pages) + 2
        order = torch.randperm(total, generator=g)
        self.page, self.lens = page, lens
        self.indptr = torch.tensor(np.cumsum([0, *pages]), dtype=torch.int32)
        self.indices = order[:sum(pages)].to(torch.int32)
        self.slots = total * page
        self.x = torch.randn(self.slots, kv_heads, D, generator=g, dtype=torch.float64)
        self.x[:, :, 3] *= 10.0
        pairs = select_outlier_pairs(self.x.permute(1, 0, 2).unsqueeze(0), count=2,
                                     layout=LAYOUT)
        exact = exact_channels(pairs, head_dim=D, layout=LAYOUT)
        self.pool = DitherPool.empty(slots=self.slots, kv_heads=kv_heads, head_dim=D,
                                     block_size=BLOCK_SIZE, exact=exact, seed=2**40 + seed,
                                     layer=5)
        dither_store(self.pool, self.x, torch.randperm(self.slots, generator=g).sort().values)
        self.v = torch.randn(self.slots, kv_heads, D, generator=g).half()

    def common(self) -> dict[str, object]:
        return {"kv_indptr": self.indptr, "kv_indices": self.indices,
                "seq_lens": torch.tensor(self.lens, dtype=torch.int32),
                "page_size": self.page, "max_tokens": max(self.lens), "scale": 0.5,
                "delta_loc": DELTA}


@pytest.mark.slow  # Triton's interpreter: tens of seconds on a CPU
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("page, splits", [(1, 1), (16, 3)])
def test_the_pooled_read_equals_decode_over_dither_read(dtype: torch.dtype, page: int,
                                                        splits: int) -> None:
    p = Pool([40, 1, 25], kv_heads=2, page=page, seed=page + splits)
    all_slots = torch.arange(p.slots)
    keys = dither_read(p.pool, all_slots, dtype=dtype)
    cast = pool_cast_bound(p.pool, all_slots, key_dtype=dtype)
    # the cast bound holds against the true outlier values
    x_hat = torch.where(p.pool.exact, p.x, dither_read(p.pool, all_slots, dtype=torch.float64))
    assert bool((cast >= (keys.double() - x_hat).norm(dim=-1)).all())
    w = witness_write(p.x.float(), keys.float(), bands=4, layout=LAYOUT)
    q = torch.randn(3, 4, D, generator=torch.Generator().manual_seed(2)).to(dtype)
    pooled = fused_decode_pool(q, p.pool, p.v, key_dtype=dtype, splits=splits, witness=w,
                               layout=LAYOUT, **p.common())  # type: ignore[arg-type]
    over = fused_decode_tier_b(q, keys, p.v, p.pool.scales, exact=p.pool.exact, cast=cast,
                               splits=splits, witness=w, layout=LAYOUT,
                               **p.common())  # type: ignore[arg-type]
    err = float(((pooled.output.double() - over.output.double()).abs()
                 / over.output.double().abs().amax(-1, keepdim=True)).max())
    rel_b = _rel(pooled.tier_b.meter, over.tier_b.meter)
    assert pooled.tier_a is not None and over.tier_a is not None
    rel_a = _rel(pooled.tier_a.meter, over.tier_a.meter)
    print(f"pooled vs dither_read: output max rel err {err:.2e}, Tier-B meter {rel_b:.2e}, "
          f"Tier-A meter {rel_a:.2e}")
    assert err == 0.0  # the same keys, bit for bit, in the same order
    assert rel_b < 1e-13 and rel_a == 0.0
    assert POOL_WRITTEN_BY_STORE in pooled.tier_b.basis.assumptions
    # and it is sound against the true keys
    tv = []
    for b in range(3):
        t = torch.arange(p.lens[b])
        pages = p.indices[int(p.indptr[b]):int(p.indptr[b + 1])].to(torch.int64)
        sl = pages[t // p.page] * p.page + t % p.page
        for h in range(4):
            qh = q[b, h].double()
            pt = torch.softmax((p.x[sl, h // 2] @ qh) * 0.5, 0)
            ph = torch.softmax((keys[sl, h // 2].double() @ qh) * 0.5, 0)
            tv.append(0.5 * (pt - ph).abs().sum())
    assert bool((pooled.tier_b.meter >= torch.stack(tv).view(3, 4)).all())


@pytest.mark.slow  # Triton's interpreter: tens of seconds on a CPU
def test_a_read_with_the_wrong_stream_key_is_caught() -> None:
    p = Pool([33, 18], kv_heads=1, page=16, seed=4)
    all_slots = torch.arange(p.slots)
    s = p.pool.scales.double().repeat_interleave(BLOCK_SIZE, dim=-1)
    kept = ~p.pool.exact
    good = dither_read(p.pool, all_slots, dtype=torch.float64)
    assert bool(((good - p.x).abs() <= s / 2)[:, kept].all())  # |x_hat - x| <= s/2 holds
    q = torch.randn(2, 2, D, generator=torch.Generator().manual_seed(1))
    right = fused_decode_pool(q, p.pool, p.v, key_dtype=torch.float32,
                              **p.common())  # type: ignore[arg-type]
    fields = {f: getattr(p.pool, f) for f in ("codes", "scales", "outlier_values", "exact",
                                              "block_size", "seed", "layer")}
    for wrong in ({"layer": 6}, {"seed": p.pool.seed + 1}):
        other = DitherPool(**{**fields, **wrong})  # type: ignore[arg-type]
        bad = dither_read(other, all_slots, dtype=torch.float64)
        assert not bool(((bad - p.x).abs() <= s / 2)[:, kept].all()), wrong
        got = fused_decode_pool(q, other, p.v, key_dtype=torch.float32,
                                **p.common())  # type: ignore[arg-type]
        assert float((got.output - right.output).abs().max()) > 1e-3, wrong


def test_pooled_read_rejects_bad_input() -> None:
    p = Pool([8], kv_heads=1, page=1, seed=1)
    q = torch.randn(1, 2, D)
    with pytest.raises(InvalidValueError, match="key_dtype"):
        fused_decode_pool(q, p.pool, p.v, key_dtype=torch.bfloat16,
                          **p.common())  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match="counter"):
        fused_decode_pool(q, p.pool, p.v, key_dtype=torch.float16,
                          counter=torch.zeros(2, dtype=torch.int32),
                          **p.common())  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match="key_dtype"):
        pool_cast_bound(p.pool, torch.arange(2), key_dtype=torch.float64)


def test_the_launch_counter_counts_launches() -> None:
    p = Pool([10, 6], kv_heads=1, page=1, seed=3)
    q = torch.randn(2, 2, D)
    counter = torch.zeros(1, dtype=torch.int32)
    for _ in range(3):
        fused_decode_pool(q, p.pool, p.v, key_dtype=torch.float16, counter=counter, splits=2,
                          **p.common())  # type: ignore[arg-type]
    assert int(counter[0]) == 3


# ----------------------------------------------------------------------------- MLA

@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.parametrize("splits", [1, 3])
def test_mla_latent_cache_matches_the_float64_reference(page: int, splits: int) -> None:
    """Lk = 576 (512 latent + 64 rope), Lv = 512: one kv head shared by every query head, the
    values the first 512 channels of the same cache rows (a view, no second tensor)."""
    lk, lv, heads = 576, 512, 4
    lens = [29, 1, 40]
    g = torch.Generator().manual_seed(page * 10 + splits)
    pages = [math.ceil(n / page) for n in lens]
    total = sum(pages) + 1
    order = torch.randperm(total, generator=g)
    indptr = torch.tensor(np.cumsum([0, *pages]), dtype=torch.int32)
    indices = order[:sum(pages)].to(torch.int32)
    slots = total * page
    x = torch.randn(slots, 1, lk, generator=g)
    k = (x + 0.01 * torch.randn(slots, 1, lk, generator=g)).half()
    w = witness_write(x, k.float(), bands=8, layout=LAYOUT)  # bands over all 576 channels
    q = torch.randn(len(lens), heads, lk, generator=g).half()
    scale = lk ** -0.5
    got = fused_decode(q, k, k[..., :lv], w, layout=LAYOUT, kv_indptr=indptr,
                       kv_indices=indices, seq_lens=torch.tensor(lens, dtype=torch.int32),
                       page_size=page, scale=scale, max_tokens=max(lens), splits=splits)
    worst, rel = 0.0, 0.0
    for b, n in enumerate(lens):
        t = torch.arange(n)
        pg = indices[int(indptr[b]):int(indptr[b + 1])].to(torch.int64)
        sl = pg[t // page] * page + t % page
        for h in range(heads):
            qh = q[b, h].double()
            p_hat = torch.softmax((k[sl, 0].double() @ qh) * scale, 0)
            p = torch.softmax((x[sl, 0].double() @ qh) * scale, 0)
            ref = p_hat @ k[sl, 0, :lv].double()
            worst = max(worst, float((got.output[b, h].double() - ref).abs().max()
                                     / ref.abs().max()))
            lb = logit_bound(qh, w[sl, 0].double(), scale=scale, layout=LAYOUT)
            m = tv_bounds_batch(p_hat, lb, visible=torch.tensor(n)).meter
            rel = max(rel, float((got.meter[b, h] - m).abs() / m.clamp(min=1e-300)))
            assert float(got.meter[b, h]) >= float(0.5 * (p - p_hat).abs().sum())
    print(f"MLA page {page} splits {splits}: output max rel err {worst:.2e}, meter {rel:.2e}")
    assert worst < 2e-3  # float16 output
    assert rel < 1e-4
    assert tuple(got.output.shape) == (len(lens), heads, lv)


# ----------------------------------------------------------------------------- capturable

_READS = ("item", "__bool__", "tolist", "cpu", "numpy", "__int__", "__float__", "__index__")


@contextmanager
def _no_host_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every tensor-to-host read raises, except inside a kernel launch (Triton's interpreter
    itself moves the launch's arguments to numpy: on a GPU that is the device's own work)."""
    from triton.runtime import interpreter

    inside = [0]
    seen: list[str] = []
    launch = interpreter.GridExecutor.__call__

    def in_kernel(self: object, *args: object, **kwargs: object) -> object:
        inside[0] += 1
        try:
            return launch(self, *args, **kwargs)
        finally:
            inside[0] -= 1

    def guard(name: str) -> None:
        original = getattr(torch.Tensor, name)

        def read(self: torch.Tensor, *args: object, **kwargs: object) -> object:
            if not inside[0]:
                seen.append(name)
                raise AssertionError(f"host read torch.Tensor.{name} on the launch path")
            return original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, read)

    monkeypatch.setattr(interpreter.GridExecutor, "__call__", in_kernel)
    for name in _READS:
        guard(name)
    try:
        yield seen
    finally:
        monkeypatch.undo()


def test_the_detector_catches_a_host_read(monkeypatch: pytest.MonkeyPatch) -> None:
    t = torch.ones(2)
    with _no_host_reads(monkeypatch) as seen:
        for read in (lambda: bool(t.sum() > 0), lambda: t.sum().item(), lambda: t.tolist(),
                     lambda: int(t[0]), lambda: t.numpy()):
            with pytest.raises(AssertionError, match="host read"):
                read()
    assert len(seen) == 5


@pytest.mark.slow  # Triton's interpreter: seconds per launch on a CPU
def test_the_launch_paths_do_no_host_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tier A, Tier B and the pooled read, split-KV merged, with no host read between the
    arguments and the results; the premises are read afterwards, building the evidence."""
    c = Store([20, 1, 9], kv_heads=2, page=16, seed=6, dtype=torch.float16)
    p = Pool([12, 7], kv_heads=1, page=1, seed=8)
    q = torch.randn(3, 4, D, generator=torch.Generator().manual_seed(5)).half()
    q2 = torch.randn(2, 2, D, generator=torch.Generator().manual_seed(6))
    counter = torch.zeros(1, dtype=torch.int32)
    common = c.common()
    with _no_host_reads(monkeypatch):
        a = fused_decode(q, c.k, c.v, c.w, layout=LAYOUT, scale=0.25, splits=2,
                         **common)  # type: ignore[arg-type]
        b = fused_decode_tier_b(q, c.k, c.v, c.scales, exact=c.exact, cast=c.cast,
                                delta_loc=DELTA, scale=0.25, splits=2, witness=c.w,
                                layout=LAYOUT, **common)  # type: ignore[arg-type]
        pooled = fused_decode_pool(q2, p.pool, p.v, key_dtype=torch.float16, splits=2,
                                   counter=counter, **p.common())  # type: ignore[arg-type]
    for basis in (a.basis, b.tier_b.basis, pooled.tier_b.basis):
        evidence = basis.evidence(TV_EFORM_METER_SOUND)
        assert evidence is not None
    assert b.tier_a is not None
    assert torch.equal(a.meter, b.tier_a.meter) and torch.equal(a.output, b.output)
    assert int(counter[0]) == 1


def test_tier_b_readings_are_partially_certified_on_their_assumptions() -> None:
    from witcert_calculus import AtConsume, AttentionTV, Reading
    from witcert_calculus.meters.dither import NON_ADAPTIVE_QUERIES, PHILOX_UNIFORM

    c = Store([26, 11], kv_heads=1, page=1, seed=12, dtype=torch.float32)
    q = torch.randn(2, 2, D, generator=torch.Generator().manual_seed(3))
    got = c.run(q)
    basis = got.tier_b.basis
    issued = reading(AttentionTV[AtConsume], min(1.0, float(got.tier_b.meter.max())),
                      evidence=basis.evidence(TV_EFORM_METER_SOUND), delta=basis.delta)
    assert issued.tier is Tier.PARTIALLY_CERTIFIED
    assumed = assumptions_of(issued.evidence)
    for a in (NON_ADAPTIVE_QUERIES, PHILOX_UNIFORM, STORED_ENCODING):
        assert a in assumed


@pytest.mark.parametrize("where", ["band", "token", "head"])
@pytest.mark.parametrize("what", ["scale", "query", "pooled scale"])
def test_tier_b_a_nan_never_reads_as_zero(what: str, where: str) -> None:
    """A NaN block scale (its neighbours 0, so that a NaN-skipping max reads the token as
    lossless) or a NaN query entry makes the row's Tier-B meter NaN, in the kernel (over
    stored keys and over the dithered pool) as in the torch twin, and refuses the evidence."""
    import warnings

    q = torch.randn(2, 2, D, generator=torch.Generator().manual_seed(0))
    if what == "pooled scale":
        p = Pool([20, 9], kv_heads=2, page=1, seed=3)
        t = torch.arange(9)
        sl = p.indices[int(p.indptr[1]):int(p.indptr[2])].to(torch.int64)[t]
        s = p.pool.scales
    else:
        c = Store([20, 9], kv_heads=2, page=1, seed=2, dtype=torch.float32)
        sl = c.slots_of(1)
        s = c.scales.clone()
    if what == "query":
        q[1, 0] = 0.0
        q[1, 0, {"band": [7], "token": [7, 20], "head": list(range(D))}[where]] = math.nan
    else:
        rows = sl if where == "head" else sl[2:3]
        s[rows, 0] = 0.0
        s[rows, 0, slice(None) if where == "token" else 0] = math.nan
    with warnings.catch_warnings():
        # the interpreter reduces with numpy's nanmax, which warns on a slice of NaN only
        warnings.filterwarnings("ignore", "All-NaN slice encountered", RuntimeWarning)
        if what == "pooled scale":
            got = fused_decode_pool(q, p.pool, p.v, key_dtype=torch.float32,
                                    **p.common())  # type: ignore[arg-type]
        else:
            got = c.run(q, scales=s, witness=True)
    assert bool(torch.isnan(got.tier_b.meter[1, 0])), got.tier_b.meter
    assert bool(torch.isfinite(got.tier_b.meter[0]).all())
    assert bool(torch.isfinite(got.tier_b.meter[1, 1]))
    with pytest.raises(PremiseError):
        got.tier_b.basis.evidence(TV_EFORM_METER_SOUND)
    if what != "pooled scale":
        qh = q[1, 0].double()
        n = torch.tensor([len(sl)])
        p_hat = torch.softmax((c.k[sl, 0].double() @ qh) * 0.25, 0)
        try:  # the torch twin: a NaN bound or a refusal, never a finite number
            u = tier_b_logit_bound(qh.view(1, -1), s[sl, 0], c.cast[sl, 0], scale=0.25,
                                   delta_loc=DELTA, visible=n, exact=c.exact[0])
            twin = tv_bounds_batch(p_hat.view(1, -1), u, visible=n).meter
            assert not bool(torch.isfinite(twin).any()), twin
        except InvalidValueError as e:
            assert "NaN" in str(e) or "nan" in str(e), e
