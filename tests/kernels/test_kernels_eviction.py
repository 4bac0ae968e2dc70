"""The torch eviction meter (witcert_kernels.eviction) against the numpy reference: the same
witness fields bit for bit, the same bounds to a few ulps, the same fail-closed cells."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from witcert_calculus.errors import ForgedBoundError, InvalidValueError  # noqa: E402
from witcert_calculus.meters import eviction as ref  # noqa: E402
from witcert_kernels import eviction as tk  # noqa: E402


@pytest.mark.parametrize("center", ["int8", "float16", "float32", "float64"])
@pytest.mark.parametrize("block_size", [1, 3])
def test_torch_matches_numpy(center: str, block_size: int) -> None:
    rng = np.random.default_rng(7)
    keys = rng.normal(size=(2, 3, 12, 16)).astype(np.float32) * 3
    values = rng.normal(size=(2, 3, 12, 8)).astype(np.float32)
    block = np.broadcast_to(np.arange(12) // block_size, (2, 3, 12)).copy()
    blocks = int(block.max()) + 1
    q = rng.normal(size=(2, 3, 5, 16))
    kept = rng.normal(size=(2, 3, 5, 9)) * 2
    kept[..., -1] = -np.inf  # a masked position
    wn = ref.evict_witness(keys, values, block, blocks=blocks, center=center)
    wt = tk.evict_witness(torch.tensor(keys), torch.tensor(values), torch.tensor(block),
                          blocks=blocks, center=center)
    for field in ("center", "linf", "radius", "count", "value_norm"):
        np.testing.assert_array_equal(getattr(wt, field).numpy(), getattr(wn, field), field)
    assert wt.stored_bytes == wn.stored_bytes
    back = np.zeros((2, 3, blocks), dtype=bool)
    back[0, 1, 0] = True
    bn = ref.dropped_mass_batch(q, kept, wn, scale=0.25, dropped=np.full((2, 3), 12),
                                restored=back)
    bt = tk.dropped_mass_batch(torch.tensor(q), torch.tensor(kept), wt, scale=0.25,
                               dropped=torch.full((2, 3), 12), restored=torch.tensor(back))
    np.testing.assert_allclose(bt.mass.numpy(), bn.mass, rtol=1e-13, atol=0)
    assert bt.worst().tier is bn.worst().tier


def test_float32_queries_take_the_float32_product_soundly() -> None:
    # float32 queries against int8 centers: q.c in float32 with its own margin, never below
    # the float64 reference and within a few float32 roundings of it
    rng = np.random.default_rng(8)
    keys = rng.normal(size=(3, 40, 64)).astype(np.float32) * 4
    q = (rng.normal(size=(3, 6, 64)) * 3).astype(np.float32)
    kept = rng.normal(size=(3, 6, 20)) * 4
    block = np.broadcast_to(np.arange(40), (3, 40)).copy()
    wn = ref.evict_witness(keys, np.ones((3, 40, 1)), block, blocks=40)
    wt = tk.evict_witness(torch.tensor(keys), torch.ones(3, 40, 1), torch.tensor(block), blocks=40)
    assert wt.center32 is not None and wt.center32.dtype == torch.float32
    bn = ref.dropped_mass_batch(q.astype(np.float64), kept, wn, scale=0.125)
    bt = tk.dropped_mass_batch(torch.tensor(q), torch.tensor(kept), wt, scale=0.125)
    assert (bt.mass.numpy() >= bn.mass).all()
    np.testing.assert_allclose(bt.mass.numpy(), bn.mass, rtol=1e-4)
    # and against the exact mass, from the exact float keys
    s_d = torch.tensor(q).double() @ torch.tensor(keys).double().transpose(1, 2) * 0.125
    zk, zd = torch.logsumexp(torch.tensor(kept), -1), torch.logsumexp(s_d, -1)
    assert (bt.mass >= torch.sigmoid(zd - zk)).all()


def test_torch_fails_closed_like_numpy() -> None:
    w = tk.evict_witness(torch.ones(2, 3, 4), torch.ones(2, 3, 1), torch.zeros(2, 3, dtype=torch.long),
                         blocks=1)
    kept = torch.zeros(2, 2, 5, dtype=torch.float64)
    b = tk.dropped_mass_batch(torch.ones(2, 2, 4), kept, w, scale=1.0,
                              dropped=torch.tensor([3, 7]))
    assert torch.isfinite(b.mass[0]).all() and torch.isinf(b.mass[1]).all()
    kept[0, 0, 0] = float("inf")   # a broken logit never yields a small mass
    kept[0, 1] = float("-inf")     # nothing kept
    b = tk.dropped_mass_batch(torch.ones(2, 2, 4), kept, w, scale=1.0)
    assert torch.isinf(b.mass[0]).all()


def test_torch_refuses_forged_and_bad_input() -> None:
    w = ref.evict_witness(np.ones((1, 4)), np.ones((1, 1)), np.array([0]), blocks=1)
    with pytest.raises(ForgedBoundError):
        tk.block_log_terms(torch.ones(1, 4), object(), scale=1.0)  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match="block"):
        tk.evict_witness(torch.ones(2, 4), torch.ones(2, 1), torch.tensor([0, 2]), blocks=2)
    with pytest.raises(InvalidValueError, match="restored"):
        tk.dropped_mass_batch(torch.ones(1, 4, dtype=torch.float64),
                              torch.zeros(1, 1, dtype=torch.float64),
                              tk.evict_witness(torch.ones(1, 4), torch.ones(1, 1),
                                               torch.tensor([0]), blocks=1),
                              scale=1.0, restored=torch.tensor([1]))
    assert w.count.tolist() == [1.0]


def test_torch_kept_bound_matches_numpy() -> None:
    from witcert_calculus.meters.witness import RopeLayout, band_witness, logit_bound
    from witcert_kernels.meter import logit_bound as logit_bound_t

    rng = np.random.default_rng(10)
    q = rng.normal(size=16)
    kept = rng.normal(size=(1, 12))
    wit = band_witness(np.abs(rng.normal(size=(12, 16))) * 0.01, bands=4,
                       layout=RopeLayout.HALF_SPLIT)
    cn = logit_bound(q, wit, layout=RopeLayout.HALF_SPLIT, scale=0.25)
    ct = logit_bound_t(torch.tensor(q), torch.tensor(wit), scale=0.25,
                       layout=RopeLayout.HALF_SPLIT)
    keys = rng.normal(size=(5, 16))
    wn = ref.evict_witness(keys, np.ones((5, 1)), np.arange(5), blocks=5)
    wt2 = tk.evict_witness(torch.tensor(keys), torch.ones(5, 1), torch.arange(5), blocks=5)
    bn = ref.dropped_mass_batch(q[None], kept, wn, scale=0.25, kept_bound=cn)
    bt = tk.dropped_mass_batch(torch.tensor(q)[None], torch.tensor(kept), wt2, scale=0.25,
                               kept_bound=ct)
    np.testing.assert_allclose(bt.mass.numpy(), bn.mass, rtol=1e-12)
    plain = ref.dropped_mass_batch(q[None], kept, wn, scale=0.25)
    assert (bn.mass >= plain.mass).all()   # a lower Z_K only raises the bound
