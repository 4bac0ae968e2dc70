"""The fused decode attention + Tier-A meter kernel over paged caches: its output matches the
torch reference, its meter matches the twin's and bounds the exact TV, and split-KV partials
merge to the same bounds."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from witcert_calculus.errors import InvalidValueError  # noqa: E402
from witcert_calculus.meters.witness import RopeLayout  # noqa: E402
from witcert_kernels.meter import logit_bound, tv_bounds_batch  # noqa: E402
from witcert_kernels.triton_decode import fused_decode  # noqa: E402
from witcert_kernels.triton_witness import witness_write  # noqa: E402
from reference.issued import reading

LAYOUT = RopeLayout.HALF_SPLIT
BANDS = 4


class Paged:
    """A paged cache of ``lens`` requests with shuffled pages, and its exact keys."""

    def __init__(self, lens: list[int], *, kv_heads: int, d: int, page: int, seed: int,
                 noise: float = 0.02) -> None:
        g = torch.Generator().manual_seed(seed)
        pages = [math.ceil(n / page) for n in lens]
        total = sum(pages) + 3  # spare pages nobody reads
        order = torch.randperm(total, generator=g)
        self.page, self.lens = page, lens
        self.indptr = torch.tensor(np.cumsum([0, *pages]), dtype=torch.int32)
        self.indices = order[:sum(pages)].to(torch.int32)
        slots = total * page
        self.k = torch.randn(slots, kv_heads, d, generator=g)
        self.k[:, :, 5] *= 8.0  # a massive channel
        self.k_hat = self.k + noise * torch.randn(slots, kv_heads, d, generator=g)
        self.v = torch.randn(slots, kv_heads, d, generator=g)
        self.w = witness_write(self.k, self.k_hat, bands=BANDS, layout=LAYOUT)

    def slots_of(self, b: int) -> torch.Tensor:
        t = torch.arange(self.lens[b])
        pages = self.indices[int(self.indptr[b]):int(self.indptr[b + 1])].to(torch.int64)
        return pages[t // self.page] * self.page + t % self.page

    def run(self, q: torch.Tensor, *, splits: int = 1, scale: float = 0.125,
            witness: torch.Tensor | None = None) -> object:
        return fused_decode(q, self.k_hat, self.v, self.w if witness is None else witness,
                            layout=LAYOUT,
                            kv_indptr=self.indptr, kv_indices=self.indices,
                            seq_lens=torch.tensor(self.lens, dtype=torch.int32),
                            page_size=self.page, scale=scale, max_tokens=max(self.lens),
                            splits=splits, block=16)


def _reference(c: Paged, q: torch.Tensor, scale: float) -> dict[str, torch.Tensor]:
    """Per row: the float64 output on the stored keys, the twin's meter on the same logits,
    and the exact TV between attention on the exact and on the stored keys."""
    bsz, heads, _ = q.shape
    group = heads // int(c.k.shape[1])
    out, meter, tv = [], [], []
    for b in range(bsz):
        sl = c.slots_of(b)
        for h in range(heads):
            kv = h // group
            qh = q[b, h].double()
            s_hat = (c.k_hat[sl, kv].double() @ qh) * scale
            s = (c.k[sl, kv].double() @ qh) * scale
            p_hat, p = torch.softmax(s_hat, 0), torch.softmax(s, 0)
            out.append(p_hat @ c.v[sl, kv].double())
            lb = logit_bound(q[b, h].double(), c.w[sl, kv].double(), scale=scale, layout=LAYOUT)
            meter.append(tv_bounds_batch(p_hat, lb, visible=torch.tensor(len(sl))).meter)
            tv.append(0.5 * (p - p_hat).abs().sum())
    return {"output": torch.stack(out).view(bsz, heads, -1),
            "meter": torch.stack(meter).view(bsz, heads),
            "tv": torch.stack(tv).view(bsz, heads)}


@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.parametrize("heads, kv_heads", [(4, 2), (4, 1), (2, 2)], ids=["gqa", "mqa", "mha"])
def test_output_and_meter_match_the_references(page: int, heads: int, kv_heads: int) -> None:
    lens = [37, 1, 16, 70]
    c = Paged(lens, kv_heads=kv_heads, d=32, page=page, seed=page + heads + kv_heads)
    q = torch.randn(len(lens), heads, 32, generator=torch.Generator().manual_seed(3))
    got = c.run(q)
    ref = _reference(c, q, 0.125)
    err = ((got.output.double() - ref["output"]).abs().amax(-1)
           / ref["output"].abs().amax(-1)).max()
    assert float(err) < 1e-5, float(err)
    # the meter equals the twin's on the same attention, up to the float32 logits' rounding
    rel = ((got.meter - ref["meter"]).abs() / ref["meter"].clamp(min=1e-300)).max()
    print(f"max relative error vs the reference: output {float(err):.2e}, meter {float(rel):.2e}")
    assert float(rel) < 1e-4, float(rel)
    assert bool((got.meter[:, :] >= ref["tv"]).all())  # sound: above the exact TV
    assert bool((got.meter[1] == 0).all())  # one token: TV is exactly 0
    assert bool((got.witness_min >= 0).all())


@pytest.mark.slow  # Triton's interpreter: tens of seconds on a CPU
def test_split_kv_merges_to_the_same_output_and_bounds() -> None:
    c = Paged([90, 33, 5], kv_heads=2, d=32, page=16, seed=11)
    q = torch.randn(3, 4, 32, generator=torch.Generator().manual_seed(1))
    one = c.run(q, splits=1)
    ref = _reference(c, q, 0.125)
    for splits in (2, 3, 8):
        many = c.run(q, splits=splits)
        assert float((many.output - one.output).abs().max()) < 1e-6
        assert float((many.lse - one.lse).abs().max()) < 1e-5
        rel = ((many.meter - one.meter).abs() / one.meter).max()
        assert float(rel) < 1e-9, (splits, float(rel))
        assert bool((many.meter >= ref["tv"]).all())


def test_the_meter_bounds_the_exact_tv_under_adversarial_queries() -> None:
    """Queries along the key residuals: the logit errors are as large as the witnesses
    allow, and the TV is far from 0; the bound still holds, row by row."""
    c = Paged([64, 40], kv_heads=1, d=32, page=1, seed=5, noise=0.3)
    q = torch.empty(2, 2, 32)
    for b in range(2):
        sl = c.slots_of(b)
        r = (c.k_hat[sl, 0] - c.k[sl, 0])
        q[b, 0] = 4 * r[0] / r[0].norm()
        q[b, 1] = -6 * r.mean(0) / r.mean(0).norm()
    got = c.run(q, splits=2, scale=1.0)
    ref = _reference(c, q, 1.0)
    assert float(ref["tv"].min()) > 1e-3
    assert bool((torch.clamp(got.meter, max=1.0) >= ref["tv"]).all())
    assert bool((got.tanh_max >= ref["tv"]).all())


def test_lossless_rows_are_exactly_zero_and_overflow_saturates() -> None:
    c = Paged([20, 9], kv_heads=2, d=32, page=1, seed=2)
    q = torch.randn(2, 2, 32, generator=torch.Generator().manual_seed(0))
    zero = c.run(q, witness=torch.zeros_like(c.w))
    assert bool((zero.meter == 0).all()) and bool((zero.log_a == 0).all())
    w = c.w.clone()
    w[c.slots_of(0)[3], :, 1] = math.inf
    sat = c.run(q, witness=w)
    assert bool(torch.isinf(sat.meter[0]).all()) and bool(torch.isfinite(sat.meter[1]).all())
    w[c.slots_of(1)[2], :, 0] = math.nan
    bad = c.run(q, witness=w)
    assert bool(torch.isnan(bad.meter[1]).all())  # never a finite certificate from a NaN


def test_bad_input_is_a_typed_error() -> None:
    c = Paged([8], kv_heads=3, d=32, page=1, seed=1)
    q = torch.randn(1, 4, 32)
    with pytest.raises(InvalidValueError, match="kv_heads"):
        c.run(q)
    with pytest.raises(InvalidValueError, match="witness"):
        fused_decode(torch.randn(1, 3, 32), c.k_hat, c.v, c.w[:, :2], layout=LAYOUT,
                     kv_indptr=c.indptr, kv_indices=c.indices, seq_lens=torch.tensor([8]),
                     page_size=1, scale=1.0, max_tokens=8)
    with pytest.raises(InvalidValueError, match="scale"):
        c.run(torch.randn(1, 3, 32), scale=0.0)


def test_the_unmetered_kernel_gives_the_same_output() -> None:
    from witcert_kernels.triton_decode import decode_attention

    c = Paged([30, 12], kv_heads=2, d=32, page=16, seed=8)
    q = torch.randn(2, 4, 32, generator=torch.Generator().manual_seed(6))
    metered = c.run(q, splits=2)
    out, lse = decode_attention(q, c.k_hat, c.v, kv_indptr=c.indptr, kv_indices=c.indices,
                                seq_lens=torch.tensor(c.lens, dtype=torch.int32),
                                page_size=16, scale=0.125, splits=2)
    assert torch.equal(out, metered.output) and torch.equal(lse, metered.lse)


@pytest.mark.slow  # Triton's interpreter: tens of seconds on a CPU
def test_the_gpu_benchmark_runs_dry() -> None:
    """``benchmarks/bench_kernels_gpu.py --dry`` checks its arguments and runs the benchmark's
    code at toy sizes in the interpreter, checking instead of timing: the metered and
    unmetered kernels (and the pooled read against decode over ``dither_read`` keys) give the
    same outputs, the launch counter counts every launch, the store reads back within s/2
    (the GPU numbers come from a GPU run)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    script = str(root / "benchmarks" / "bench_kernels_gpu.py")
    proc = subprocess.run([sys.executable, script, "--dry"], capture_output=True, text=True,
                          timeout=300, cwd=root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if line[:1] == " "]
    assert [(int(r[0]), int(r[1])) for r in rows] == [(16, 1), (16, 2), (48, 1), (48, 2)] * 2
    assert all(r[2] == "equal" for r in rows)
    assert "launch counter 4 (expected 4)" in proc.stdout
    assert "read back within s/2, witnesses equal to their twin" in proc.stdout
    assert " ms" not in proc.stdout  # no timings in a dry run
    bad = subprocess.run([sys.executable, script, "--dry", "--replays", "0"],
                         capture_output=True, text=True, timeout=300, cwd=root)
    assert bad.returncode == 2 and "--replays must be positive" in bad.stderr


def test_the_kernels_bounds_become_readings_with_computed_premises() -> None:
    """The engine-side path into the contracts: a reading of the fused meter cites the TV
    theorems and the logit bound's theorem, with its premises read from the device; a
    negative witness (a broken store) refuses the evidence instead of certifying."""
    from witcert_calculus import AtConsume, AttentionTV, Reading, Tier
    from witcert_calculus.errors import PremiseError
    from witcert_calculus.lean.theorems import LOGIT_BOUND_METER_SOUND, TV_EFORM_METER_SOUND
    from witcert_calculus.tiers import theorems_of

    c = Paged([40, 17], kv_heads=2, d=32, page=16, seed=4)
    q = torch.randn(2, 4, 32, generator=torch.Generator().manual_seed(9))
    got = c.run(q, splits=2)
    worst = float(got.meter.max())
    issued = reading(AttentionTV[AtConsume], min(1.0, worst),
                      evidence=got.basis.evidence(TV_EFORM_METER_SOUND))
    assert issued.tier is Tier.CERTIFIED
    assert TV_EFORM_METER_SOUND in theorems_of(issued.evidence)
    # Tier A: the logit bound is certified, so its premise is stated by name, not composed
    assert got.basis.logit is not None and LOGIT_BOUND_METER_SOUND in theorems_of(got.basis.logit)
    w = c.w.clone()
    w[c.slots_of(0)[1], 0, 2] = -1.0
    broken = c.run(q, witness=w)
    with pytest.raises(PremiseError):
        broken.basis.evidence(TV_EFORM_METER_SOUND)



def _plant(c: Paged, q: torch.Tensor, what: str, where: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A NaN in request 1's kv head 0, every other entry it shares a reduction with lossless
    (0), so that a NaN-skipping max or min would read the token or the query as exact."""
    w, q = c.w.clone(), q.clone()
    sl = c.slots_of(1)
    if what == "witness":
        rows = {"band": sl[2:3], "token": sl[2:3], "head": sl}[where]
        w[rows, 0] = 0.0
        w[rows, 0, 0 if where != "token" else slice(None)] = math.nan
    else:  # the query of head 0 (kv head 0): one channel, one band, or the whole head
        q[1, 0] = 0.0
        ch = {"band": [3], "token": [3, 20], "head": list(range(q.shape[-1]))}[where]
        q[1, 0, ch] = math.nan
    return w, q


@pytest.mark.parametrize("where", ["band", "token", "head"])
@pytest.mark.parametrize("what", ["witness", "query"])
def test_a_nan_never_reads_as_zero(what: str, where: str) -> None:
    """Triton's max and min skip NaN: a witness ``[nan, 0, 0, 0]`` once read as exact
    (``c_t = 0``, no flag, ``witness_min = 0``). A NaN in any witness or query entry makes
    the row's meter NaN in the kernel as in the torch twin, and refuses the evidence."""
    from witcert_calculus.errors import PremiseError
    from witcert_calculus.lean.theorems import TV_EFORM_METER_SOUND

    c = Paged([20, 9], kv_heads=2, d=32, page=1, seed=2)
    q = torch.randn(2, 4, 32, generator=torch.Generator().manual_seed(0))
    w, q = _plant(c, q, what, where)
    with warnings.catch_warnings():
        # the interpreter reduces with numpy's nanmax, which warns on a slice of NaN only
        # (the attention output's own max over a NaN query's logits)
        warnings.filterwarnings("ignore", "All-NaN slice encountered", RuntimeWarning)
        got = fused_decode(q, c.k_hat, c.v, w, layout=LAYOUT, kv_indptr=c.indptr,
                           kv_indices=c.indices,
                           seq_lens=torch.tensor(c.lens, dtype=torch.int32),
                           page_size=1, scale=0.125, max_tokens=20, block=16)
    hit = [(1, 0)] if what == "query" else [(1, 0), (1, 1)]  # heads 0, 1 read kv head 0
    sl = c.slots_of(1)
    for b, h in hit:
        qh = q[b, h].double()
        p_hat = torch.softmax((c.k_hat[sl, 0].double() @ qh) * 0.125, 0)
        try:  # the torch twin: a NaN bound or a refusal, never a finite number
            lb = logit_bound(qh, w[sl, 0].double(), scale=0.125, layout=LAYOUT)
            twin = tv_bounds_batch(p_hat, lb, visible=torch.tensor(len(sl))).meter
            assert not bool(torch.isfinite(twin)), (b, h, float(twin))
        except InvalidValueError as e:
            assert "NaN" in str(e)
        assert bool(torch.isnan(got.meter[b, h])), (b, h, float(got.meter[b, h]))
        assert bool(torch.isnan(got.log_a[b, h]))
    rest = torch.ones_like(got.meter, dtype=torch.bool)
    for b, h in hit:
        rest[b, h] = False
    assert bool(torch.isfinite(got.meter[rest]).all())
    if what == "witness":
        assert bool(torch.isnan(got.witness_min[1, :2]).all()), got.witness_min
    with pytest.raises(PremiseError):
        got.basis.evidence(TV_EFORM_METER_SOUND)
