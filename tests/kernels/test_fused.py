"""The compiled fp8 pass (witcert_kernels.fused) against the torch meter's own formulas.

The kernel reads an fp8 cache's bytes in place and gives the logits and the format logit
bound of every (row, visible token). Checked here: against the torch path it replaces
(dequantized keys met by ``matmul``, :func:`~witcert_kernels.meter.format_logit_bound` on the
looked-up witnesses) over random caches in both of vLLM's CPU layouts, both fp8 formats,
every GQA grouping and ragged visibility; never below the exact rational bound; saturating
where the writer clamps; refusing positions outside the caches and a build that fails.
The compiled check of writes (``mismatched_elements``) against the torch gather it replaces:
every planted difference counted, in every layer, layout and element size.
"""

from __future__ import annotations

import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from witcert_adapters.vllm_plugin.paged import CacheFormat, CacheLayout, dequantize, \
    element_offsets, stored_elements
from witcert_calculus.errors import ForgedBoundError, InvalidValueError, PremiseError
from witcert_calculus.lean.theorems import TV_EFORM_METER_SOUND, TV_TWO_SIDED_METER_SOUND
from witcert_calculus.meters.formats import Fp8Format, Rounding
from witcert_calculus.meters.witness import LogitBound, is_established
from witcert_calculus.numerics.rounding import logit_margin, tv_margin
from witcert_kernels.fused import fp8_codes, fp8_logits_and_bound, mismatched_elements, \
    tv_meter_rows
from witcert_kernels.meter import TVMeter, format_logit_bound, format_witness, tv_meter_batch

BS = 32
_FMT = {Fp8Format.E4M3: CacheFormat.FP8_E4M3, Fp8Format.E5M2: CacheFormat.FP8_E5M2}


def _case(seed: int, *, layers: int, kvh: int, d: int, rows: int, width: int,
          blocks: int = 6) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    # Caches as vLLM allocates them (views into one buffer at nonzero offsets), random bytes
    # (every code, the writer's clamped ones included); distinct random slots per request.
    gen = torch.Generator().manual_seed(seed)
    size = blocks * kvh * BS * 2 * d
    buffer = torch.randint(0, 256, (layers * size + 5,), generator=gen, dtype=torch.uint8)
    caches = [buffer[5 + i * size:5 + (i + 1) * size].view(blocks, kvh, BS, 2 * d)
              for i in range(layers)]
    slots = torch.stack([torch.randperm(blocks * BS, generator=gen)[:width]
                         for _ in range(rows)])
    visible = torch.rand(rows, width, generator=gen) < 0.8
    return caches, slots, visible


def _reference(q: torch.Tensor, caches: list[torch.Tensor], slots: torch.Tensor,
               visible: torch.Tensor, *, layout: CacheLayout, fmt: Fp8Format,
               scales: list[float], scale: float
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # The torch path the kernel replaces: keys dequantized to float64, witnesses looked up
    # per element (zero where not visible), both stacked layer-major as the meter does.
    raw = stored_elements(caches, slots, layout=layout, heads_first=True)  # [L, R, kvh, S, d]
    keys = dequantize(raw, fmt=_FMT[fmt], scales=scales)
    w = torch.stack([format_witness(raw[k], fmt=fmt, rounding=Rounding.TRUNCATE,
                                    scale=scales[k]) for k in range(len(caches))])
    n, r, kvh, width, d = (int(x) for x in raw.shape)
    keys = keys.transpose(0, 1).reshape(r, n * kvh, width, d)
    w = torch.where(visible.view(1, r, 1, width, 1), w, 0.0).transpose(0, 1) \
        .reshape(r, n * kvh, width, d)
    _, h, g, qn, _ = (int(x) for x in q.shape)
    logits = (scale * torch.matmul(q.reshape(r, h, g * qn, d), keys.transpose(-1, -2))) \
        .view(r, h, g, qn, width)
    size = scale * torch.matmul(q.abs().reshape(r, h, g * qn, d), keys.abs().transpose(-1, -2))
    return logits, format_logit_bound(q, w, scale=scale).values, size.view(r, h, g, qn, width)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2 ** 16), layers=st.integers(1, 3), kvh=st.integers(1, 3),
       g=st.integers(1, 3), qn=st.integers(1, 3), rows=st.integers(1, 3),
       width=st.integers(1, 40), layout=st.sampled_from(list(CacheLayout)),
       fmt=st.sampled_from(list(Fp8Format)))
def test_the_compiled_pass_equals_the_torch_path(seed: int, layers: int, kvh: int, g: int,
                                                 qn: int, rows: int, width: int,
                                                 layout: CacheLayout, fmt: Fp8Format) -> None:
    """Logits within float64 rounding of the matmul's; the bound equal to the torch bound up
    to its own margin (only the summation order differs), infinite and zero on the same
    tokens; an invisible token's bound 0."""
    d = 32
    caches, slots, visible = _case(seed, layers=layers, kvh=kvh, d=d, rows=rows, width=width)
    scales = [0.5, 0.03125 * 3, 1.25][:layers]
    q = torch.randn(rows, layers * kvh, g, qn, d, generator=torch.Generator().manual_seed(seed),
                    dtype=torch.float64)
    q[..., 0, :3] = 0.0  # zero channels (and, with g = 1, some zero channels of every row)
    scale = d ** -0.5
    offsets = element_offsets(caches, slots, layout=layout, heads_first=True)
    assert offsets is not None
    side = fp8_codes(caches, *offsets, fmt=fmt, rounding=Rounding.TRUNCATE, scales=scales)
    logits, c = fp8_logits_and_bound(q, side, torch.arange(rows), visible, scale=scale)
    assert is_established(c)
    want_logits, want_c, size = _reference(q, caches, slots, visible, layout=layout, fmt=fmt,
                                           scales=scales, scale=scale)
    seen = visible.view(rows, 1, 1, 1, width).expand_as(logits)
    finite = seen & torch.isfinite(want_logits)
    gamma = logit_margin(d, scale=scale).gamma
    # |dot - dot'| <= 2 gamma_d sum |q k| for two summation orders of the same products
    assert bool(((logits - want_logits).abs() <= 2 * gamma * size + 1e-300)[finite]
                .all())
    assert torch.equal(torch.isnan(logits[seen]), torch.isnan(want_logits[seen]))
    v, wv = c.values, want_c
    assert torch.equal(torch.isinf(v), torch.isinf(wv))
    assert torch.equal(v == 0, wv == 0)
    both = torch.isfinite(v) & (wv > 0)
    assert bool(((v - wv).abs() <= 3 * gamma * wv)[both].all())
    assert bool((v[~seen] == 0).all())


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2 ** 16), kvh=st.integers(1, 2), g=st.integers(1, 3),
       qn=st.integers(1, 3), width=st.integers(1, 70), hidden=st.integers(0, 3),
       d=st.sampled_from([4, 16, 21]), fmt=st.sampled_from(list(Fp8Format)))
def test_block_runs_read_eight_at_a_time_give_the_same_bits(seed: int, kvh: int, g: int,
                                                            qn: int, width: int, hidden: int,
                                                            d: int, fmt: Fp8Format) -> None:
    """Tokens that sit side by side in a block (the vec layout: each channel's bytes of a
    block consecutive) are read eight at a time; the same tokens in a scattered order take
    the token-by-token read; with ``vectorized=False`` the portable loops run. All three
    give the same logits and bound bit for bit (the same multiply-adds in the same order),
    token for token, hidden tokens and partial tiles included."""
    rows = 2
    caches, _, _ = _case(seed, layers=2, kvh=kvh, d=d, rows=rows, width=width, blocks=8)
    gen = torch.Generator().manual_seed(seed)
    # request r's tokens: a run from the start of block 3r on (crossing into the next block)
    slots = torch.stack([3 * r * BS + torch.arange(width) for r in range(rows)])
    visible = torch.ones(rows, width, dtype=torch.bool)
    visible[0, torch.randperm(width, generator=gen)[:hidden]] = False
    q = torch.randn(rows, 2 * kvh, g, qn, d, generator=gen, dtype=torch.float64)
    perm = torch.randperm(width, generator=gen)

    def run(order: torch.Tensor, vectorized: bool = True) -> tuple[torch.Tensor, ...]:
        offsets = element_offsets(caches, slots[:, order], layout=CacheLayout.VEC,
                                  heads_first=True)
        assert offsets is not None
        side = fp8_codes(caches, *offsets, fmt=fmt, rounding=Rounding.TRUNCATE,
                         scales=[0.75, 0.0625])
        logits, c = fp8_logits_and_bound(q, side, torch.arange(rows), visible[:, order],
                                         scale=0.25, vectorized=vectorized)
        return logits, c.values

    runs = run(torch.arange(width))
    scattered = run(perm)
    portable = run(torch.arange(width), vectorized=False)
    for a, b, p in zip(runs, scattered, portable, strict=True):
        assert torch.equal(a[..., perm].view(torch.int64), b.view(torch.int64))
        assert torch.equal(a.view(torch.int64), p.view(torch.int64))
    assert not bool(torch.isnan(runs[1]).any())


def test_every_code_is_looked_up_by_every_read() -> None:
    """All 256 codes in block runs (read eight tokens at a time) against the portable
    loops, bit for bit, in both formats: every table entry, NaN codes and saturated
    witnesses included."""
    d, width = 21, 64
    caches, _, _ = _case(3, layers=1, kvh=1, d=d, rows=1, width=width, blocks=4)
    slots = torch.arange(width).view(1, width)
    offsets = element_offsets(caches, slots, layout=CacheLayout.VEC, heads_first=True)
    assert offsets is not None
    start, channels = offsets
    flat = caches[0].view(-1)
    positions = (start[0, 0].view(width, 1) + channels.view(1, d)).reshape(-1)
    flat[positions] = torch.arange(positions.numel()).remainder(256).to(torch.uint8)
    assert set(flat[positions].tolist()) == set(range(256))
    q = torch.randn(1, 1, 1, 3, d, generator=torch.Generator().manual_seed(1),
                    dtype=torch.float64)
    for fmt in Fp8Format:
        side = fp8_codes(caches, start, channels, fmt=fmt, rounding=Rounding.TRUNCATE,
                         scales=[0.375])
        seen = torch.ones(1, width, dtype=torch.bool)
        want = fp8_logits_and_bound(q, side, torch.arange(1), seen, scale=0.5,
                                    vectorized=False)
        got = fp8_logits_and_bound(q, side, torch.arange(1), seen, scale=0.5)
        assert torch.equal(got[0].view(torch.int64), want[0].view(torch.int64))
        assert torch.equal(got[1].values.view(torch.int64), want[1].values.view(torch.int64))


def test_the_bound_is_never_below_the_exact_one() -> None:
    """Against exact rational arithmetic on every (row, token) of a small case: the
    outward-rounded bound holds ``scale * sum_c |q_c| w_c`` from above."""
    caches, slots, visible = _case(7, layers=2, kvh=2, d=16, rows=2, width=12)
    visible[:] = True
    scales = [0.375, 2.0]
    q = torch.randn(2, 4, 2, 1, 16, generator=torch.Generator().manual_seed(1),
                    dtype=torch.float64) * 3
    offsets = element_offsets(caches, slots, layout=CacheLayout.VEC, heads_first=True)
    assert offsets is not None
    side = fp8_codes(caches, *offsets, fmt=Fp8Format.E4M3, rounding=Rounding.TRUNCATE,
                     scales=scales)
    _, c = fp8_logits_and_bound(q, side, torch.arange(2), visible, scale=0.25)
    raw = stored_elements(caches, slots, layout=CacheLayout.VEC, heads_first=True)
    checked = 0
    for layer in range(2):
        for kv in range(2):
            h = layer * 2 + kv
            for r in range(2):
                for t in range(12):
                    ws = [float(side.witnesses[h, int(b)]) for b in raw[layer, r, kv, t]]
                    if float("inf") in ws:  # a clamped code: saturated (its own test)
                        continue
                    w = [Fraction(x) for x in ws]
                    for m in range(2):
                        got = float(c.values[r, h, m, 0, t])
                        if got == float("inf"):
                            continue
                        exact = Fraction(0.25) * sum(
                            (abs(Fraction(float(x))) * wc for x, wc in
                             zip(q[r, h, m, 0], w, strict=True)), Fraction(0))
                        assert Fraction(got) >= exact
                        checked += 1
    assert checked > 50


def test_a_clamped_code_saturates_its_token_and_a_zero_query_does_not_hide_it() -> None:
    """e4m3's 0x7E (448, where the writer clamps) has an infinite witness: its token's bound
    is inf even against a query that is zero on that channel (inf * 0 saturates)."""
    caches, slots, visible = _case(3, layers=1, kvh=1, d=8, rows=1, width=4)
    visible[:] = True
    offsets = element_offsets(caches, slots, layout=CacheLayout.VEC, heads_first=True)
    assert offsets is not None
    start, channels = offsets
    caches[0].view(-1)[int(start[0, 0, 2] + channels[5])] = 0x7E
    side = fp8_codes(caches, start, channels, fmt=Fp8Format.E4M3, rounding=Rounding.TRUNCATE,
                     scales=[1.0])
    q = torch.ones(1, 1, 1, 1, 8, dtype=torch.float64)
    q[..., 5] = 0.0
    _, c = fp8_logits_and_bound(q, side, torch.arange(1), visible, scale=1.0)
    assert float(c.values[0, 0, 0, 0, 2]) == float("inf")


def test_a_negative_witness_table_fails_the_premise() -> None:
    """The premise w >= 0 is computed over the tables every witness comes from: a table
    with a negative entry gives a bound whose evidence is refused."""
    caches, slots, visible = _case(5, layers=1, kvh=1, d=8, rows=1, width=6)
    offsets = element_offsets(caches, slots, layout=CacheLayout.VEC, heads_first=True)
    assert offsets is not None
    side = fp8_codes(caches, *offsets, fmt=Fp8Format.E4M3, rounding=Rounding.TRUNCATE,
                     scales=[1.0])
    object.__setattr__(side, "witnesses", side.witnesses.neg())
    q = torch.randn(1, 1, 1, 1, 8, dtype=torch.float64)
    logits, c = fp8_logits_and_bound(q, side, torch.arange(1), visible, scale=1.0)
    p = torch.softmax(logits.masked_fill(~visible.view(1, 1, 1, 1, 6), -torch.inf), dim=-1)
    for basis in (tv_meter_batch(p, c, check=False).basis,
                  tv_meter_rows(logits, c, visible.view(1, 1, 6)).basis):
        with pytest.raises(PremiseError, match="w"):
            basis.evidence(TV_EFORM_METER_SOUND, TV_TWO_SIDED_METER_SOUND)


def test_positions_outside_the_caches_are_refused_by_name() -> None:
    caches, slots, _ = _case(2, layers=2, kvh=1, d=8, rows=1, width=3)
    offsets = element_offsets(caches, slots, layout=CacheLayout.VEC, heads_first=True)
    assert offsets is not None
    start, channels = offsets
    with pytest.raises(InvalidValueError, match="start"):
        fp8_codes(caches, start + caches[0].numel(), channels, fmt=Fp8Format.E4M3,
                  rounding=Rounding.TRUNCATE, scales=[1.0, 1.0])
    with pytest.raises(InvalidValueError, match="scales"):
        fp8_codes(caches, start, channels, fmt=Fp8Format.E4M3, rounding=Rounding.TRUNCATE,
                  scales=[1.0])
    with pytest.raises(InvalidValueError, match="caches"):
        fp8_codes([c.view(torch.int8) for c in caches], start, channels, fmt=Fp8Format.E4M3,
                  rounding=Rounding.TRUNCATE, scales=[1.0, 1.0])


def test_a_kernel_that_cannot_be_built_is_a_typed_error(tmp_path: Path) -> None:
    """A compiler that fails: KernelBuildError naming the kernel, no meter without it."""
    code = ("from witcert_kernels.fused import load\n"
            "from witcert_calculus.errors import KernelBuildError\n"
            "try:\n    load()\nexcept KernelBuildError as e:\n    print('refused:', e)\n")
    env = {**os.environ, "CXX": "false", "WITCERT_KERNEL_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=300, check=True)
    assert "refused: kernel 'witcert_fused' cannot be built" in out.stdout, out.stdout + out.stderr


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2 ** 16), layers=st.integers(1, 4), kvh=st.integers(1, 3),
       rows=st.integers(1, 9), part=st.integers(0, 1), layout=st.sampled_from(list(CacheLayout)),
       dtype=st.sampled_from([torch.uint8, torch.bfloat16, torch.float16, torch.float32]),
       plants=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 8), st.integers(0, 2),
                                 st.integers(0, 15)), max_size=6))
def test_the_compiled_write_check_counts_every_difference(
        seed: int, layers: int, kvh: int, rows: int, part: int, layout: CacheLayout,
        dtype: torch.dtype, plants: list[tuple[int, int, int, int]]) -> None:
    """Expected = what the torch gather reads, with planted bit flips: the kernel counts,
    per layer, exactly the elements the torch comparison of bits finds different."""
    d, blocks = 16, 3
    gen = torch.Generator().manual_seed(seed)
    size = blocks * kvh * BS * 2 * d  # elements of one layer, views into one buffer
    raw = torch.randint(0, 256, ((layers * size + 3) * dtype.itemsize,), generator=gen,
                        dtype=torch.uint8)
    buffer = raw.view(dtype)
    caches = [buffer[3 + i * size:3 + (i + 1) * size].view(blocks, kvh, BS, 2 * d)
              for i in range(layers)]
    slots = torch.randperm(blocks * BS, generator=gen)[:rows].unsqueeze(0)
    written = slots[0]
    offsets = element_offsets(caches, written, layout=layout, part=part)
    assert offsets is not None
    stored = stored_elements(caches, written, layout=layout, part=part)
    want = [x.clone() for x in stored.unbind(0)]
    for layer, row, head, channel in plants:
        if layer < layers and row < rows and head < kvh and channel < int(want[0].shape[-1]):
            bits = want[layer].view(torch.uint8 if dtype == torch.uint8 else
                                    {2: torch.int16, 4: torch.int32}[dtype.itemsize])
            bits[row, head, channel] ^= 1
    truth = torch.tensor([int((a.view(torch.uint8) != b.view(torch.uint8))
                              .view(*a.shape, -1).any(dim=-1).sum()) for a, b in
                          zip(stored.unbind(0), want, strict=True)])
    assert torch.equal(mismatched_elements(caches, *offsets, want), truth)


def test_the_compiled_write_check_refuses_what_does_not_fit() -> None:
    caches, slots, _ = _case(3, layers=2, kvh=1, d=8, rows=1, width=3)
    start, channels = element_offsets(caches, slots[0], layout=CacheLayout.VEC) or (None, None)
    assert start is not None and channels is not None
    good = [torch.zeros(3, 1, 8, dtype=torch.uint8)] * 2
    assert mismatched_elements(caches, start, channels, good).shape == (2,)
    with pytest.raises(InvalidValueError, match="expected"):
        mismatched_elements(caches, start, channels, good[:1])  # one layer missing
    with pytest.raises(InvalidValueError, match="expected"):
        mismatched_elements(caches, start, channels, [g.to(torch.int16) for g in good])
    with pytest.raises(InvalidValueError, match="outside the cache"):
        mismatched_elements(caches, start + caches[0].numel(), channels, good)


# --------------------------------------------------------------------------- compiled meter

def _meter_case(seed: int, *, n: int, h: int, g: int, qn: int, width: int, d: int = 8,
                spread: float = 3.0, big: bool = False
                ) -> tuple[torch.Tensor, LogitBound[torch.Tensor], torch.Tensor]:
    # Random logits, an established format bound (some tokens exact, some saturated, some
    # large enough to overflow expm1 when ``big``), a causal-looking mask with every row
    # seeing at least one token (some exactly one).
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, h, g, qn, width, generator=gen, dtype=torch.float64) * spread
    w = torch.rand(n, h, width, d, generator=gen, dtype=torch.float64) * 0.05
    w[..., torch.rand(width, generator=gen) < 0.2, :] = 0.0
    if big:
        w[..., torch.rand(width, generator=gen) < 0.2, :] = 1000.0  # c past expm1's range
    if width > 2:
        w[0, 0, 1, 0] = float("inf")
    q = torch.randn(n, h, g, qn, d, generator=gen, dtype=torch.float64)
    c = format_logit_bound(q, w, scale=0.5)
    mask = torch.rand(n, qn, width, generator=gen) < 0.7
    mask[:, :, 0] = True
    mask[:, 0, 1:] = False  # the first row of every request sees one token
    return logits, c, mask


def _torch_meter(logits: torch.Tensor, c: LogitBound[torch.Tensor], mask: torch.Tensor
                 ) -> TVMeter:
    n, _, _, qn, width = (int(x) for x in logits.shape)
    p = torch.softmax(logits.masked_fill(~mask.view(n, 1, 1, qn, width), -torch.inf), dim=-1)
    return tv_meter_batch(p, c, check=False, visible=mask.sum(dim=-1).view(n, 1, 1, qn))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2 ** 16), n=st.integers(1, 3), h=st.integers(1, 3),
       g=st.integers(1, 3), qn=st.integers(1, 4), width=st.integers(1, 45),
       spread=st.sampled_from([0.0, 1.0, 30.0]), big=st.booleans(),
       vectorized=st.booleans())
def test_the_compiled_meter_equals_the_torch_meter(seed: int, n: int, h: int, g: int, qn: int,
                                                   width: int, spread: float, big: bool,
                                                   vectorized: bool) -> None:
    """The compiled meter's e-form, two-sided form and meter against the torch meter of the
    masked softmax: saturated on the same rows, 0 on the same rows (one token, c = 0),
    elsewhere within the forms' own margin (the sums differ only in their order and the
    library's exp), the log-sum-exp branch (expm1 overflowing) included; every premise
    holds."""
    logits, c, mask = _meter_case(seed, n=n, h=h, g=g, qn=qn, width=width, spread=spread,
                                  big=big)
    want = _torch_meter(logits, c, mask)
    got = tv_meter_rows(logits, c, mask, vectorized=vectorized)
    gamma = tv_margin(width).gamma
    for a, b in ((got.meter, want.meter), (got.eform, want.eform),
                 (got.two_sided, want.two_sided)):
        assert torch.equal(torch.isinf(a), torch.isinf(b))
        assert torch.equal(a == 0, b == 0)
        both = torch.isfinite(b) & (b > 0)
        assert bool(((a - b).abs() <= 8 * gamma * (1 + b.abs().log1p()) * b)[both].all())
    assert all(bool(t) for _, t in got.basis.checks)
    assert [s for s, _ in got.basis.checks] == [s for s, _ in want.basis.checks]


def test_the_compiled_meter_is_never_below_the_true_tv() -> None:
    """Against 50-digit arithmetic: for true logits ``s + delta`` with ``|delta_t| <= c_t``
    (each sign pattern that pushes weight away from the largest tokens, and random ones),
    the exact ``TV(softmax(s + delta), softmax(s))`` never exceeds the compiled meter."""
    import mpmath as mp

    logits, c, mask = _meter_case(11, n=2, h=2, g=1, qn=3, width=12, spread=2.0)
    got = tv_meter_rows(logits, c, mask)
    gen = torch.Generator().manual_seed(5)
    checked = 0
    with mp.workdps(50):
        for i in range(2):
            for k in range(2):
                for r in range(3):
                    bound = float(got.meter[i, k, 0, r])
                    seen = [t for t in range(12) if bool(mask[i, r, t])]
                    if len(seen) < 2 or bound == float("inf"):
                        continue
                    s = [mp.mpf(float(logits[i, k, 0, r, t])) for t in seen]
                    cs = [mp.mpf(float(c.values[i, k, 0, r, t])) for t in seen]
                    top = max(range(len(s)), key=lambda j: s[j])
                    patterns = [[-1 if j == top else 1 for j in range(len(s))],
                                [1 if j == top else -1 for j in range(len(s))]]
                    patterns += [[1 if bool(b) else -1 for b in torch.rand(len(s), generator=gen)
                                  < 0.5] for _ in range(4)]
                    p = [mp.exp(x) for x in s]
                    zp = mp.fsum(p)
                    for signs in patterns:
                        e = [mp.exp(x + sg * cc) for x, sg, cc in zip(s, signs, cs, strict=True)]
                        ze = mp.fsum(e)
                        tv = mp.fsum(abs(a / ze - b / zp) for a, b in zip(e, p, strict=True)) / 2
                        assert mp.mpf(bound) >= tv
                        checked += 1
    assert checked > 30


def test_the_compiled_meter_refuses_what_it_cannot_read() -> None:
    """A bound no establishing function made, and shapes that do not fit, are typed errors
    naming them; NaN logits fail the weights' premise instead of giving a bound."""
    logits, c, mask = _meter_case(2, n=1, h=1, g=1, qn=2, width=5)
    fake = object.__new__(LogitBound)  # built around the establishing functions
    object.__setattr__(fake, "values", c.values)
    with pytest.raises(ForgedBoundError):
        tv_meter_rows(logits, fake, mask)
    with pytest.raises(InvalidValueError, match="c="):
        tv_meter_rows(logits, c, mask[:, :, :4])
    bad = logits.clone()
    bad[0, 0, 0, 1, 0] = float("nan")
    basis = tv_meter_rows(bad, c, mask).basis
    with pytest.raises(PremiseError, match="p_tilde"):
        basis.evidence(TV_EFORM_METER_SOUND, TV_TWO_SIDED_METER_SOUND)
