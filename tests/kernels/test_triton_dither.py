"""The Triton dithered store: bit-identical to the numpy reference and the torch port, keyed
by slot, and its read regenerates exactly the write's stream."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from witcert_calculus.errors import InvalidValueError  # noqa: E402
from witcert_calculus.meters import dither as ref  # noqa: E402
from witcert_calculus.meters.witness import RopeLayout  # noqa: E402
from witcert_kernels.dither import (  # noqa: E402
    dither_noise,
    dither_quantize,
    exact_channels,
    select_outlier_pairs,
)
from witcert_kernels.triton_dither import DitherPool, dither_read, dither_store  # noqa: E402

SEED = (5 << 32) + 0x9ABCDEF1  # both Philox key words in use


def _keys(tokens: int, heads: int, d: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, heads, d, generator=g) * 2
    x[1 % tokens, 0, 3] = 60.0  # a massive channel
    return x.to(dtype)


def _pool(x: torch.Tensor, *, slots: int, block: int, m: int, layout: RopeLayout,
          layer: int = 3) -> DitherPool:
    h, d = int(x.shape[1]), int(x.shape[2])
    pairs = select_outlier_pairs(x.double().transpose(0, 1).unsqueeze(0), count=m, layout=layout)
    exact = exact_channels(pairs, head_dim=d, layout=layout)
    return DitherPool.empty(slots=slots, kv_heads=h, head_dim=d, block_size=block, exact=exact,
                            seed=SEED, layer=layer)


def _pairs_of(pool: DitherPool, layout: RopeLayout) -> list[np.ndarray]:
    d = pool.head_dim
    out = []
    for hh in range(pool.heads):
        ch = np.flatnonzero(pool.exact[hh].numpy())
        first = ch[ch % 2 == 0] // 2 if layout is RopeLayout.INTERLEAVED else ch[ch < d // 2]
        out.append(np.asarray(first, dtype=np.intp))
    return out


@pytest.mark.parametrize("layout", list(RopeLayout))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("block, m", [(16, 4), (32, 0), (32, 2), (64, 4)])
def test_store_and_read_equal_the_numpy_reference(layout: RopeLayout, dtype: torch.dtype,
                                                  block: int, m: int) -> None:
    x = _keys(5, 2, 64, dtype)
    pool = _pool(x, slots=16, block=block, m=m, layout=layout)
    slots = torch.tensor([9, 2, 14, 0, 5])
    assert bool(dither_store(pool, x, slots).all())
    back = dither_read(pool, slots, dtype=torch.float64)
    for hh, pairs in enumerate(_pairs_of(pool, layout)):
        # The reference keyed by the slots: its "token" counter word is the slot.
        st = ref.dither_quantize(x[:, hh].double().numpy(), key=ref.DitherKey(SEED, 3, hh),
                                 tokens=slots.numpy(), block_size=block, layout=layout,
                                 outlier_pairs=pairs)
        sl = slots.numpy()
        assert np.array_equal(pool.codes[sl, hh].numpy(), st.payload)
        assert np.array_equal(pool.scales[sl, hh].numpy(), st.scales)
        assert np.array_equal(pool.outlier_values[sl, hh].numpy(),
                              st.outlier_values.astype(np.float16))
        keep = ~pool.exact[hh].numpy()
        x_hat = ref.dither_dequantize(st)
        assert np.array_equal(back[:, hh].numpy()[:, keep], x_hat[:, keep])
        assert np.array_equal(back[:, hh].numpy()[:, ~keep],
                              x_hat[:, ~keep].astype(np.float16).astype(np.float64))


@pytest.mark.parametrize("out", [torch.float64, torch.float32, torch.float16])
def test_read_equals_the_torch_ports_read_bit_for_bit(out: torch.dtype) -> None:
    layout = RopeLayout.HALF_SPLIT
    x = _keys(6, 3, 32, torch.float32, seed=4)
    pool = _pool(x, slots=8, block=16, m=2, layout=layout, layer=11)
    slots = torch.tensor([7, 1, 4, 0, 6, 3])
    dither_store(pool, x, slots)
    pairs = torch.as_tensor(np.stack(_pairs_of(pool, layout)), dtype=torch.int64)
    noise = dither_noise(request=SEED, layer=11, kv_heads=3, tokens=slots, head_dim=32)
    enc = dither_quantize(x.transpose(0, 1).unsqueeze(0), request=SEED, layer=11, start=0,
                          block_size=16, outlier_pairs=pairs, layout=layout, noise=noise)
    assert torch.equal(pool.codes[slots].transpose(0, 1), enc.codes[0])
    assert torch.equal(pool.scales[slots].transpose(0, 1), enc.scales[0])
    assert torch.equal(pool.outlier_values[slots].transpose(0, 1), enc.outlier_values[0])
    got = dither_read(pool, slots, dtype=out)
    assert got.dtype == out
    assert torch.equal(got.transpose(0, 1), enc.read(out)[0])


def test_the_slot_keys_the_stream_whatever_the_write_order_or_the_reader() -> None:
    """Paging (which token lands in which slot, written in which call) and prefix sharing
    (another request reading the slot) never change what a written slot decodes to."""
    layout = RopeLayout.INTERLEAVED
    x = _keys(6, 2, 32, torch.float32, seed=9)
    slots = torch.tensor([12, 3, 8, 0, 15, 6])
    one = _pool(x, slots=16, block=16, m=2, layout=layout)
    dither_store(one, x, slots)
    two = DitherPool.empty(slots=16, kv_heads=2, head_dim=32, block_size=16, exact=one.exact,
                           seed=SEED, layer=3)
    order = torch.tensor([4, 1, 5, 0, 2, 3])
    for part in (order[:2], order[2:3], order[3:]):  # three calls, another order
        dither_store(two, x[part], slots[part])
    for name in ("codes", "scales", "outlier_values"):
        assert torch.equal(getattr(one, name), getattr(two, name)), name
    # Two readers of a shared prefix (slots 12, 3, 8) read the same keys, in any order.
    a = dither_read(one, slots[:3], dtype=torch.float32)
    b = dither_read(two, slots[:3].flip(0), dtype=torch.float32).flip(0)
    assert torch.equal(a, b)


def test_the_read_regenerates_the_write_stream() -> None:
    """Subtractive dither: with the write's stream, every kept channel is within half a scale
    step of the key. A read whose stream differs from the write's (another layer, another
    seed, or the slots' neighbours) breaks that bound: the test fails on such a drift."""
    layout = RopeLayout.HALF_SPLIT
    x = _keys(8, 2, 64, torch.float32, seed=2)
    pool = _pool(x, slots=8, block=32, m=2, layout=layout)
    slots = torch.arange(8)
    dither_store(pool, x, slots)
    keep = ~pool.exact.unsqueeze(0)
    half = pool.scales.double().repeat_interleave(32, dim=-1) / 2

    def worst(p: DitherPool, read_slots: torch.Tensor) -> float:
        err = (dither_read(p, read_slots, dtype=torch.float64) - x.double()).abs()
        return float(torch.where(keep, err / half[slots], 0.0).max())

    assert worst(pool, slots) <= 1.0
    for other in (DitherPool(pool.codes, pool.scales, pool.outlier_values, pool.exact,
                             pool.block_size, pool.seed, pool.layer + 1),
                  DitherPool(pool.codes, pool.scales, pool.outlier_values, pool.exact,
                             pool.block_size, pool.seed ^ 1, pool.layer)):
        assert worst(other, slots) > 1.0
    shifted = torch.roll(slots, 1)
    err = (dither_read(pool, shifted, dtype=torch.float64) - x.double()[shifted]).abs()
    assert float(torch.where(keep, err / half[shifted], 0.0).max()) <= 1.0  # its own rows
    assert float(torch.where(keep, (dither_read(pool, shifted, dtype=torch.float64)
                                    - x.double()).abs() / half[slots], 0.0).max()) > 1.0


def test_a_failed_row_check_is_a_flag_or_a_typed_error() -> None:
    x = _keys(3, 2, 32, torch.float32)
    pool = _pool(x, slots=4, block=16, m=0, layout=RopeLayout.HALF_SPLIT)
    bad = x.clone()
    bad[1, 1, 5] = 1e7  # amax / 126.5 > 65504: the float16 scale overflows
    bad[2, 0, 0] = float("nan")
    flags = dither_store(pool, bad, torch.tensor([0, 1, 2]), check=False)
    assert flags.tolist() == [[1, 1], [1, 0], [0, 1]]
    with pytest.raises(InvalidValueError, match="token 1, kv head 1"):
        dither_store(pool, bad, torch.tensor([0, 1, 2]))


@pytest.mark.parametrize("call, match", [
    (lambda p, x: dither_store(p, x, torch.tensor([0, 9, 1])), "slots"),
    (lambda p, x: dither_store(p, x[:, :1], torch.tensor([0, 1, 2])), r"tokens, 2, 32"),
    (lambda p, x: dither_store(p, x, torch.tensor([0, 1])), "slots"),
    (lambda p, x: dither_store(p, x, torch.tensor([0.0, 1.0, 2.0])), "integer"),
    (lambda p, x: dither_read(p, torch.tensor([-1]), dtype=torch.float32), "slots"),
])
def test_bad_input_is_a_typed_error(call, match: str) -> None:  # type: ignore[no-untyped-def]
    x = _keys(3, 2, 32, torch.float32)
    pool = _pool(x, slots=4, block=16, m=0, layout=RopeLayout.HALF_SPLIT)
    with pytest.raises(InvalidValueError, match=match):
        call(pool, x)


def test_a_pool_is_checked_when_made() -> None:
    exact = torch.zeros(2, 32, dtype=torch.bool)
    with pytest.raises(InvalidValueError, match="block_size"):
        DitherPool.empty(slots=4, kv_heads=2, head_dim=32, block_size=12, exact=exact, seed=0,
                         layer=0)
    odd = exact.clone()
    odd[0, 3] = True
    with pytest.raises(InvalidValueError, match="even number"):
        DitherPool.empty(slots=4, kv_heads=2, head_dim=32, block_size=16, exact=odd, seed=0,
                         layer=0)
    with pytest.raises(InvalidValueError, match="seed"):
        DitherPool.empty(slots=4, kv_heads=2, head_dim=32, block_size=16, exact=exact,
                         seed=2**64, layer=0)


@pytest.mark.parametrize("where", ["band", "token", "head"])
def test_a_nan_key_never_stores_a_zero_scale(where: str) -> None:
    """Triton's max skips NaN: a NaN key in a block whose other keys are 0 once stored the
    scale 0 (a lossless block). The block's scale is NaN (the torch port's amax propagates
    it), the row check fails, and a decode over the pool reads NaN, not a certificate."""
    import math
    import warnings

    from witcert_calculus.errors import PremiseError
    from witcert_calculus.lean.theorems import TV_EFORM_METER_SOUND
    from witcert_kernels.triton_decode import fused_decode_pool

    x = _keys(6, 2, 32, torch.float32)
    pool = _pool(x, slots=6, block=16, m=0, layout=RopeLayout.HALF_SPLIT)
    rows = slice(None) if where == "head" else slice(2, 3)
    x[rows, 0] = 0.0
    if where == "band":
        x[rows, 0, 3] = math.nan  # block 0 of 2
    else:
        x[rows, 0] = math.nan
    flags = dither_store(pool, x, torch.arange(6), check=False)
    assert not bool(flags[rows, 0].any()) and bool(flags[:, 1].all())
    s = pool.scales[rows, 0].float()
    assert bool(torch.isnan(s[..., 0]).all()), s
    if where == "band":
        assert bool((s[..., 1] == 0).all())  # the block without a NaN: lossless
    assert bool(torch.isfinite(pool.scales[:, 1]).all())
    q = torch.randn(1, 2, 32, generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "All-NaN slice encountered", RuntimeWarning)
        got = fused_decode_pool(q, pool, torch.randn(6, 2, 32).half(), key_dtype=torch.float32,
                                delta_loc=1e-3, kv_indptr=torch.tensor([0, 6], dtype=torch.int32),
                                kv_indices=torch.arange(6, dtype=torch.int32),
                                seq_lens=torch.tensor([6], dtype=torch.int32), page_size=1,
                                scale=0.25, max_tokens=6)
    assert bool(torch.isnan(got.tier_b.meter[0, 0]))
    assert bool(torch.isfinite(got.tier_b.meter[0, 1]))
    with pytest.raises(PremiseError):
        got.tier_b.basis.evidence(TV_EFORM_METER_SOUND)
