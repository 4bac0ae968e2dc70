"""The vLLM plugin's engine-independent parts, on synthetic paged caches in vLLM's layout.

The engine itself is exercised in test_vllm_engine.py and test_vllm_server.py; here every
piece the engine glue calls is checked against independent references: the cache decode
against the bytes written, the batched meter against the library's per-row numpy meter and
against exact attention (with an adversarial understated witness that the audit must
catch), the side buffer's generations, the switch, the accounts and gate, the SQLite store
and the Prometheus collector.
"""

from __future__ import annotations

import math
import sqlite3
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from witcert_adapters.vllm_plugin.config import PluginConfig, from_environ
from witcert_adapters.vllm_plugin.launch import STEP_TIMEOUT_S, engine_env
from witcert_adapters.vllm_plugin.meter import ROW_BLOCK, SUMMARY, KeySide, RowGroup, \
    StepMeter, meter_layer, meter_layers, meter_step, row_groups, write_witnesses
from witcert_adapters.vllm_plugin.paged import CacheFormat, CacheLayout, StepLayout, \
    cache_format, dequantize, element_offsets, stored_elements, stored_keys, visible_keys
from witcert_adapters.vllm_plugin.quantizer import ROUNDING, engine_codes
from witcert_adapters.vllm_plugin.store import VerdictStore
from witcert_adapters.vllm_plugin.verdicts import Accounts, external_id, recount_spent
from witcert_adapters.vllm_plugin.witnesses import Positions, SlotWitnesses, raise_for
from witcert_calculus.errors import EngineMismatchError, InvalidValueError, StaleReadError, \
    UnwrittenSlotError
from witcert_calculus.lean.theorems import SOFTMAX_TV_TANH_CONTRACT_SOUND, TV_EFORM_METER_SOUND, TV_TWO_SIDED_METER_SOUND
from witcert_calculus.meters.formats import Fp8Format
from witcert_calculus.meters.tv_forms import tv_meter, tv_tanh_max
from witcert_calculus.meters.witness import RopeLayout, band_witness, logit_bound

BS = 16  # block size
KVH, G, D, B = 2, 2, 16, 4
H = KVH * G


def _cache(layers: int, blocks: int, dtype: torch.dtype) -> list[torch.Tensor]:
    # as vLLM allocates them: every layer's cache a view into one buffer (nonzero offsets)
    size = blocks * KVH * BS * 2 * D
    buffer = torch.zeros(layers * size + 7, dtype=dtype)
    return [buffer[7 + i * size:7 + (i + 1) * size].view(blocks, KVH, BS, 2 * D)
            for i in range(layers)]


@pytest.mark.parametrize("layout", [CacheLayout.VEC, CacheLayout.AMX])
def test_stored_elements_read_caches_that_share_one_buffer(layout: CacheLayout) -> None:
    """Caches that are views into one buffer at nonzero offsets read as separate copies do,
    element for element, keys and values, slot-major and heads-first."""
    shared = _cache(3, 4, torch.bfloat16)
    for c in shared:
        c.copy_(torch.randn(c.shape).to(torch.bfloat16))
    assert shared[1].storage_offset() > 0
    copies = [c.clone() for c in shared]
    for slots in (torch.tensor([0, 5, 17, 63]), torch.tensor([[3, 9], [60, 2]])):
        for part in (0, 1):
            for heads_first in (False, True):
                got = stored_elements(shared, slots, layout=layout, part=part,
                                      heads_first=heads_first)
                want = stored_elements(copies, slots, layout=layout, part=part,
                                       heads_first=heads_first)
                assert torch.equal(got, want)


def _write(cache: torch.Tensor, slots: torch.Tensor, keys: torch.Tensor,
           fmt: CacheFormat, scale: float, values: torch.Tensor | None = None) -> None:
    """Write keys (and values) in vLLM's CPU layout: per (block, head) K as [d, bs], then V
    as [bs, d]; fp8 bytes by the model of vLLM's CPU writer (truncation)."""
    nb = cache.shape[0]
    kview = cache.view(nb, KVH, 2, D, BS)
    vview = cache.view(nb, KVH, 2, BS, D)

    def stored(x: torch.Tensor) -> torch.Tensor:
        fp8 = fmt.fp8
        return x.to(cache.dtype) if fp8 is None else engine_codes(x, scale=scale, fmt=fp8)

    for i, s in enumerate(slots.tolist()):
        kview[s // BS, :, 0, :, s % BS] = stored(keys[i])
        if values is not None:
            vview[s // BS, :, 1, s % BS, :] = stored(values[i])


class _Engine:
    """A two-layer paged memory written like vLLM's, with exact keys kept aside."""

    def __init__(self, fmt: CacheFormat, *, layers: int = 2, blocks: int = 8) -> None:
        self.fmt = fmt
        dtype = torch.bfloat16 if fmt is CacheFormat.MODEL_DTYPE else torch.uint8
        self.caches = _cache(layers, blocks, dtype)
        self.scales = [0.5, 0.25, 0.375][:layers]
        self.layers = layers
        self.exact: dict[int, torch.Tensor] = {}
        self.buffer = SlotWitnesses(layers=layers, slots=blocks * BS, kv_heads=KVH, bands=B,
                                    exact_dim=D, exact_dtype=torch.float32, values=True)
        self.gen = torch.Generator().manual_seed(0)

    def write(self, slots: list[int]) -> torch.Tensor:
        s = torch.tensor(slots)
        keys = torch.randn(self.layers, len(slots), KVH, D, generator=self.gen).to(torch.bfloat16)
        values = torch.randn(self.layers, len(slots), KVH, D, generator=self.gen).to(
            torch.bfloat16)
        for layer in range(self.layers):
            _write(self.caches[layer], s, keys[layer], self.fmt, self.scales[layer],
                   values[layer])
        stored = stored_keys(self.caches, s, fmt=self.fmt, k_scales=self.scales)
        w = write_witnesses(keys, stored, bands=B, layout=RopeLayout.HALF_SPLIT)
        gens = self.buffer.bump(s)
        self.buffer.put(slice(None), s, w, keys.float(), values.float())
        return gens


def test_stored_keys_decode_the_bytes_written() -> None:
    for fmt in (CacheFormat.MODEL_DTYPE, CacheFormat.FP8_E4M3):
        eng = _Engine(fmt)
        slots = torch.tensor([3, 17, 40])
        keys = torch.randn(3, KVH, D).to(torch.bfloat16)
        _write(eng.caches[0], slots, keys, fmt, eng.scales[0])
        got = stored_keys(eng.caches[:1], slots, fmt=fmt, k_scales=eng.scales[:1])[0]
        if fmt is CacheFormat.MODEL_DTYPE:
            assert torch.equal(got, keys.double())
        else:
            codes = engine_codes(keys, scale=0.5, fmt=Fp8Format.E4M3)
            want = codes.view(torch.float8_e4m3fn).double() * 0.5
            assert torch.equal(got, want)
            assert not torch.equal(got, keys.double())  # fp8 is lossy


def test_layers_quantized_at_once_equal_each_layer_alone() -> None:
    """One scale per layer: the stacked layers' bytes are each layer's own, bit for bit
    (specials included); a scale count that does not match the layers is refused."""
    gen = torch.Generator().manual_seed(4)
    x = (torch.randn(3, 5, KVH, D, generator=gen) * 300).to(torch.bfloat16)
    x[0, 0, 0, :4] = torch.tensor([float("nan"), float("inf"), -0.0, 1e-30])
    scales = [0.5, 0.037, 3.0]
    for fmt in Fp8Format:
        got = engine_codes(x, scale=scales, fmt=fmt)
        want = torch.stack([engine_codes(x[k], scale=s, fmt=fmt) for k, s in enumerate(scales)])
        assert torch.equal(got, want)
    with pytest.raises(InvalidValueError, match="scale"):
        engine_codes(x, scale=scales[:2], fmt=Fp8Format.E4M3)
    with pytest.raises(InvalidValueError, match="kv scale"):
        engine_codes(x, scale=[0.5, -1.0, 2.0], fmt=Fp8Format.E4M3)


def test_cache_format_names_unknown_dtypes() -> None:
    assert cache_format("auto") is CacheFormat.MODEL_DTYPE
    assert cache_format("fp8_e5m2") is CacheFormat.FP8_E5M2
    with pytest.raises(InvalidValueError, match="nvfp4.*meters only"):
        cache_format("nvfp4")


def _layout(q_lens: list[int], seq_lens: list[int], tables: list[list[int]]) -> StepLayout:
    qsl = torch.tensor([0, *np.cumsum(q_lens).tolist()])
    slots: list[int] = []
    for q, s, t in zip(q_lens, seq_lens, tables, strict=True):
        slots += [t[p // BS] * BS + p % BS for p in range(s - q, s)]
    return StepLayout.of(query_start_loc=qsl, seq_lens=torch.tensor(seq_lens),
                         block_table=torch.tensor(tables), slot_mapping=torch.tensor(slots),
                         block_size=BS)


def test_step_layout_rows_positions_and_slots() -> None:
    lay = _layout([1, 3], [20, 3], [[2, 5], [1, 0]])
    assert lay.row_request.tolist() == [0, 1, 1, 1]
    assert lay.row_position.tolist() == [19, 0, 1, 2]
    assert lay.row_slot.tolist() == [5 * BS + 3, 16, 17, 18]
    assert lay.slots[0, 16:20].tolist() == [80, 81, 82, 83]
    assert lay.visible.sum(dim=1).tolist() == [20, 3]


def test_step_layout_refuses_metadata_that_disagree() -> None:
    with pytest.raises(InvalidValueError, match="disagrees with the block table"):
        StepLayout.of(query_start_loc=torch.tensor([0, 1]), seq_lens=torch.tensor([4]),
                      block_table=torch.tensor([[2]]), slot_mapping=torch.tensor([7]),
                      block_size=BS)
    with pytest.raises(InvalidValueError, match="more rows than visible"):
        StepLayout.of(query_start_loc=torch.tensor([0, 3]), seq_lens=torch.tensor([2]),
                      block_table=torch.tensor([[0]]), slot_mapping=torch.tensor([0, 1, 2]),
                      block_size=BS)


def _mixed_step(eng: _Engine) -> tuple[StepLayout, torch.Tensor]:
    # Request 0 decodes its 21st token; request 1 prefills positions 9..13 (a chunk, its
    # first 9 tokens written by an earlier step): one batch with both kinds of rows.
    eng.write([2 * BS + p for p in range(16)] + [5 * BS + p for p in range(4)])
    eng.write([1 * BS + p for p in range(9)])
    lay = _layout([1, 5], [21, 14], [[2, 5], [1, 0]])
    eng.write(lay.row_slot.tolist())
    queries = torch.randn(eng.layers, lay.rows, H, D, generator=eng.gen).to(torch.bfloat16)
    return lay, queries


def _sides(eng: _Engine, lay: StepLayout, keys: torch.Tensor | None, *,
           understate: float = 1.0, audit: bool = True) -> list[KeySide]:
    assert eng.buffer.exact is not None
    return [KeySide(None if keys is None else keys[i],
                    eng.buffer.witness[i, lay.slots] * understate,
                    exact=eng.buffer.exact[i, lay.slots] if audit else None)
            for i in range(eng.layers)]


def _meter(eng: _Engine, lay: StepLayout, queries: torch.Tensor, *,
           understate: float = 1.0) -> StepMeter:
    keys = visible_keys(eng.caches, lay.slots, fmt=eng.fmt, k_scales=eng.scales)
    assert torch.equal(keys, stored_keys(eng.caches, lay.slots, fmt=eng.fmt,
                                         k_scales=eng.scales).permute(0, 1, 3, 2, 4))
    return meter_step(lay, queries=queries, sides=_sides(eng, lay, keys, understate=understate),
                      kv_heads=KVH, scale=D ** -0.5, layout=RopeLayout.HALF_SPLIT, tau=0.1)


def test_meter_equals_the_librarys_per_row_meter_and_is_sound() -> None:
    eng = _Engine(CacheFormat.FP8_E4M3)
    lay, queries = _mixed_step(eng)
    m = _meter(eng, lay, queries)
    keys = stored_keys(eng.caches, lay.slots, fmt=eng.fmt, k_scales=eng.scales)
    assert eng.buffer.exact is not None
    checked = 0
    for layer in range(eng.layers):
        for t in range(lay.rows):
            r, pos = int(lay.row_request[t]), int(lay.row_position[t])
            vis = lay.slots[r, :pos + 1]
            for h in range(H):
                q = queries[layer, t, h].double().numpy()
                kh = keys[layer, r, :pos + 1, h // G].numpy()
                k = eng.buffer.exact[layer, vis, h // G].double().numpy()
                w = band_witness(k - kh, bands=B, layout=RopeLayout.HALF_SPLIT)
                c = logit_bound(q, w, layout=RopeLayout.HALF_SPLIT, scale=D ** -0.5)
                logits = D ** -0.5 * kh @ q
                p_tilde = np.exp(logits - logits.max())
                p_tilde /= p_tilde.sum()
                ref = tv_meter(p_tilde, c).raw
                got = float(m.meter[layer, t, h])
                # the side buffer keeps float32 witnesses rounded up: never below, barely above
                assert ref <= got and math.isclose(got, ref, rel_tol=1e-5)
                exact = D ** -0.5 * k @ q
                p = np.exp(exact - exact.max())
                p /= p.sum()
                assert 0.5 * np.abs(p - p_tilde).sum() <= min(got, 1.0)
                checked += 1
    assert checked == eng.layers * 6 * H
    summary = dict(zip(SUMMARY, m.summary[1].tolist(), strict=True))
    assert summary["cells"] == eng.layers * 5 * H
    assert summary["audited"] == summary["cells"] and summary["violations"] == 0
    assert 0 < summary["true_max"] <= summary["worst"] <= 1
    assert m.basis.evidence(TV_EFORM_METER_SOUND, TV_TWO_SIDED_METER_SOUND) is not None


def test_a_row_that_sees_one_token_meters_zero() -> None:
    """A request's first prompt token attends to itself alone: TV is exactly 0 whatever its
    witness (Lean WitCert.Meters.tv_single_token), and the other rows keep their meter."""
    from witcert_calculus.lean.theorems import TV_SINGLE_TOKEN_METER
    from witcert_calculus.tiers import theorems_of

    eng = _Engine(CacheFormat.FP8_E4M3)
    lay = _layout([1, 4], [21, 4], [[2, 5], [1, 0]])  # request 1 prefills positions 0..3
    eng.write([2 * BS + p for p in range(20)])
    eng.write(lay.row_slot.tolist())
    queries = torch.randn(eng.layers, lay.rows, H, D, generator=eng.gen).to(torch.bfloat16)
    m = _meter(eng, lay, queries, understate=1e3)  # witnesses so large every other row saturates
    first = [t for t in range(lay.rows) if int(lay.row_position[t]) == 0]
    assert len(first) == 1
    assert bool((m.meter[:, first[0]] == 0).all())
    others = [t for t in range(lay.rows) if t != first[0]]
    assert bool((m.meter[:, others] > 1).all())
    assert TV_SINGLE_TOKEN_METER in theorems_of(m.basis.evidence(TV_EFORM_METER_SOUND, TV_TWO_SIDED_METER_SOUND))


def test_the_cheap_form_needs_no_keys_and_is_sound() -> None:
    eng = _Engine(CacheFormat.FP8_E4M3)
    lay, queries = _mixed_step(eng)
    assert eng.buffer.exact is not None
    common = dict(queries=queries, kv_heads=KVH, scale=D ** -0.5, layout=RopeLayout.HALF_SPLIT,
                  tau=0.1)
    cheap = meter_step(lay, sides=_sides(eng, lay, None, audit=False), form="tanh",
                       **common)  # type: ignore[arg-type]
    assert cheap.theorems == (SOFTMAX_TV_TANH_CONTRACT_SOUND,)
    assert cheap.basis.evidence(*cheap.theorems) is not None
    keys = visible_keys(eng.caches, lay.slots, fmt=eng.fmt, k_scales=eng.scales)
    audited = meter_step(lay, sides=_sides(eng, lay, keys), form="tanh",
                         **common)  # type: ignore[arg-type]
    assert torch.equal(audited.meter, cheap.meter)
    assert audited.summary[:, SUMMARY.index("violations")].sum() == 0
    assert audited.summary[:, SUMMARY.index("audited")].sum() > 0
    # each cell is tanh(max_t c_t) over the row's visible tokens
    t, h = 3, 1
    r, pos = int(lay.row_request[t]), int(lay.row_position[t])
    kh = keys[0, r, h // G, :pos + 1].numpy()
    k = eng.buffer.exact[0, lay.slots[r, :pos + 1], h // G].double().numpy()
    c = logit_bound(queries[0, t, h].double().numpy(),
                    band_witness(k - kh, bands=B, layout=RopeLayout.HALF_SPLIT),
                    layout=RopeLayout.HALF_SPLIT, scale=D ** -0.5)
    ref = tv_tanh_max(c).raw
    assert ref <= float(cheap.meter[0, t, h]) and math.isclose(
        float(cheap.meter[0, t, h]), ref, rel_tol=1e-5)
    with pytest.raises(InvalidValueError, match="needs the stored keys"):
        meter_step(lay, sides=_sides(eng, lay, None, audit=False),
                   **common)  # type: ignore[arg-type]


@pytest.mark.parametrize("tau", [0.1, 0.25, 0.5])  # the cells' tanh(max c): 0.13 .. 0.37
def test_the_cascade_meters_only_cells_tanh_leaves_above_tau(tau: float) -> None:
    """Each cell: tanh(max c) where it is <= tau, else the smaller of it and the meter; the
    same coverage as the better of the two forms cell by cell, each cell's form counted,
    never below the audited true TV."""
    eng = _Engine(CacheFormat.FP8_E4M3)
    lay, queries = _mixed_step(eng)
    keys = visible_keys(eng.caches, lay.slots, fmt=eng.fmt, k_scales=eng.scales)
    common = dict(queries=queries, kv_heads=KVH, scale=D ** -0.5, layout=RopeLayout.HALF_SPLIT,
                  tau=tau)
    sides = _sides(eng, lay, keys)
    meter = meter_step(lay, sides=sides, **common)  # type: ignore[arg-type]
    tanh = meter_step(lay, sides=sides, form="tanh", **common)  # type: ignore[arg-type]
    cascade = meter_step(lay, sides=sides, form="cascade", **common)  # type: ignore[arg-type]
    low = tanh.meter <= tau
    want = torch.where(low, tanh.meter, torch.minimum(tanh.meter, meter.meter))
    assert torch.equal(cascade.meter, want)
    col = {name: SUMMARY.index(name) for name in ("covered", "by_tanh", "violations")}
    assert cascade.summary[:, col["covered"]].sum() == \
        (torch.minimum(tanh.meter, meter.meter).clamp(max=1.0) <= tau).sum()
    by_tanh = low | (tanh.meter <= meter.meter)
    assert cascade.summary[:, col["by_tanh"]].sum() == by_tanh.sum()
    assert cascade.summary[:, col["violations"]].sum() == 0
    assert meter.summary[:, col["by_tanh"]].sum() == 0
    assert tanh.summary[:, col["by_tanh"]].sum() == tanh.meter.numel()
    assert {0.1: not low.any(), 0.25: low.any() and not low.all(), 0.5: low.all()}[tau]
    needed = bool((~low).any())
    assert cascade.theorems == ((SOFTMAX_TV_TANH_CONTRACT_SOUND, TV_EFORM_METER_SOUND, TV_TWO_SIDED_METER_SOUND)
                                if needed else (SOFTMAX_TV_TANH_CONTRACT_SOUND,))
    assert cascade.basis.evidence(*cascade.theorems) is not None
    if needed:  # a cell above tau without the keys to meter it
        with pytest.raises(InvalidValueError, match="needs the stored keys"):
            meter_step(lay, sides=_sides(eng, lay, None, audit=False), form="cascade",
                       **common)  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match="tau"):
        meter_layer(lay, queries=queries[0], side=sides[0], kv_heads=KVH, scale=D ** -0.5,
                    layout=RopeLayout.HALF_SPLIT, form="cascade")


def test_a_cache_stored_exactly_meters_zero_without_reading_a_key() -> None:
    """A model-dtype cache: every bound is 0 (the box bound of a zero witness), so the
    cascade reads no key and every cell is tanh(0) = 0; the audit agrees; the premise's
    truth is the caller's computation, and a false one refuses the evidence."""
    from witcert_calculus.errors import PremiseError

    eng = _Engine(CacheFormat.MODEL_DTYPE)
    lay, queries = _mixed_step(eng)
    common = dict(queries=queries, kv_heads=KVH, scale=D ** -0.5, layout=RopeLayout.HALF_SPLIT,
                  tau=0.1, form="cascade")
    assert eng.buffer.exact is not None
    bare = [KeySide(None, None, stored_exactly=True) for _ in range(eng.layers)]
    m = meter_step(lay, sides=bare, **common)  # type: ignore[arg-type]
    assert float(m.meter.abs().max()) == 0.0 and m.theorems == (SOFTMAX_TV_TANH_CONTRACT_SOUND,)
    assert m.summary[:, SUMMARY.index("by_tanh")].tolist() == \
        m.summary[:, SUMMARY.index("cells")].tolist()
    assert "exactly" in str(m.basis.evidence(*m.theorems))
    keys = visible_keys(eng.caches, lay.slots, fmt=eng.fmt, k_scales=eng.scales)
    audited = meter_step(lay, sides=[KeySide(keys[i], None, exact=eng.buffer.exact[i, lay.slots],
                                             stored_exactly=True) for i in range(eng.layers)],
                         **common)  # type: ignore[arg-type]
    assert audited.summary[:, SUMMARY.index("violations")].sum() == 0
    assert audited.summary[:, SUMMARY.index("true_max")].max() == 0.0
    false = meter_step(lay, sides=[KeySide(None, None, stored_exactly=False)] * eng.layers,
                       **common)  # type: ignore[arg-type]
    with pytest.raises(PremiseError, match="holds every visible key exactly"):
        false.basis.evidence(*false.theorems)
    # the exact bound on an fp8 cache (a false premise) is what the audit would catch
    fp8 = _Engine(CacheFormat.FP8_E4M3)
    lay8, q8 = _mixed_step(fp8)
    keys8 = visible_keys(fp8.caches, lay8.slots, fmt=fp8.fmt, k_scales=fp8.scales)
    assert fp8.buffer.exact is not None
    lying = meter_step(lay8, queries=q8, kv_heads=KVH, scale=D ** -0.5,
                       layout=RopeLayout.HALF_SPLIT, tau=0.1, form="cascade",
                       sides=[KeySide(keys8[i], None, exact=fp8.buffer.exact[i, lay8.slots],
                                      stored_exactly=True) for i in range(fp8.layers)])
    assert lying.summary[:, SUMMARY.index("violations")].sum() > 0


def _ragged_step(eng: _Engine, rows: list[tuple[int, int]], seed: int
                 ) -> tuple[StepLayout, torch.Tensor]:
    # One step of requests (rows of this step, tokens written before), its earlier tokens
    # and its own written; every layer's queries.
    eng.gen.manual_seed(seed)
    q_lens = [q for q, _ in rows]
    seq_lens = [q + before for q, before in rows]
    tables = [[2 * r, 2 * r + 1] for r in range(len(rows))]
    earlier = [t[p // BS] * BS + p % BS for (q, before), t in zip(rows, tables, strict=True)
               for p in range(before)]
    if earlier:
        eng.write(earlier)
    lay = _layout(q_lens, seq_lens, tables)
    eng.write(lay.row_slot.tolist())
    return lay, torch.randn(eng.layers, lay.rows, H, D, generator=eng.gen).to(torch.bfloat16)


@settings(max_examples=25, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(1, 5), st.integers(0, 2 * BS - 5)), min_size=1,
                     max_size=3),
       form=st.sampled_from(["meter", "tanh", "cascade"]), fp8=st.booleans(),
       layers=st.integers(1, 3), seed=st.integers(0, 2 ** 16))
def test_layers_metered_in_one_pass_equal_each_layer_alone(
        rows: list[tuple[int, int]], form: str, fp8: bool, layers: int, seed: int) -> None:
    """Ragged steps (decode rows, prefill chunks, first tokens), GQA, 1-3 layers, every form:
    the layers' heads side by side give each layer's cells exactly as metered alone, and the
    audit finds no violation."""
    eng = _Engine(CacheFormat.FP8_E4M3 if fp8 else CacheFormat.MODEL_DTYPE, layers=layers)
    lay, queries = _ragged_step(eng, rows, seed)
    keys = visible_keys(eng.caches, lay.slots, fmt=eng.fmt, k_scales=eng.scales)
    assert eng.buffer.exact is not None
    exact = eng.buffer.exact[:layers][:, lay.slots]
    witnesses = eng.buffer.witness[:layers][:, lay.slots]
    exactly = None if fp8 else True
    common = dict(kv_heads=KVH, scale=D ** -0.5, layout=RopeLayout.HALF_SPLIT, form=form,
                  tau=0.1)
    together = meter_layers(lay, queries=queries, side=KeySide(keys, witnesses, exact=exact,
                                                               stored_exactly=exactly),
                            **common)  # type: ignore[arg-type]
    for i in range(layers):
        alone = meter_layer(lay, queries=queries[i], side=KeySide(
            keys[i], witnesses[i], exact=exact[i], stored_exactly=exactly),
            **common)  # type: ignore[arg-type]
        assert torch.equal(together[i].meter, alone.meter)
        assert together[i].true_tv is not None and alone.true_tv is not None
        assert torch.equal(together[i].true_tv, alone.true_tv)
        assert bool((alone.true_tv <= alone.meter.clamp(max=1.0)).all())
        assert (together[i].by_tanh is None) == (alone.by_tanh is None)
        if alone.by_tanh is not None:
            assert together[i].by_tanh is not None
            assert torch.equal(together[i].by_tanh, alone.by_tanh)
    assert together[0].basis.evidence(*together[0].theorems) is not None


@settings(max_examples=20, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(1, 5), st.integers(0, 2 * BS - 5)), min_size=1,
                     max_size=3),
       form=st.sampled_from(["meter", "cascade"]), layers=st.integers(1, 3),
       fmt=st.sampled_from([CacheFormat.FP8_E4M3, CacheFormat.FP8_E5M2]),
       seed=st.integers(0, 2 ** 16))
def test_the_compiled_fp8_pass_meters_as_the_torch_path(
        rows: list[tuple[int, int]], form: str, layers: int, fmt: CacheFormat,
        seed: int) -> None:
    """The format witness on an fp8 cache: the logits and bounds read from the bytes in one
    compiled pass (the engine's path) give every cell the torch path's meter up to the
    float64 summation order (relative 1e-12, far inside the margins), with the same
    theorems, and the audit finds no violation."""
    from witcert_kernels.fused import fp8_codes
    from witcert_kernels.meter import format_witness

    eng = _Engine(fmt, layers=layers)
    lay, queries = _ragged_step(eng, rows, seed)
    assert eng.buffer.exact is not None and fmt.fp8 is not None
    exact = eng.buffer.exact[:layers][:, lay.slots]
    raw = stored_elements(eng.caches, lay.slots, layout=CacheLayout.VEC, heads_first=True)
    keys = dequantize(raw, fmt=fmt, scales=eng.scales)
    bounds = torch.stack([format_witness(raw[k], fmt=fmt.fp8, rounding=ROUNDING,
                                         scale=eng.scales[k]) for k in range(layers)])
    offsets = element_offsets(eng.caches, lay.slots, layout=CacheLayout.VEC, heads_first=True)
    assert offsets is not None
    codes = fp8_codes(eng.caches, *offsets, fmt=fmt.fp8, rounding=ROUNDING, scales=eng.scales)
    common = dict(queries=queries, kv_heads=KVH, scale=D ** -0.5, layout=RopeLayout.HALF_SPLIT,
                  form=form, tau=0.1)
    torch_path = meter_layers(lay, side=KeySide(keys, None, bounds, exact),
                              **common)  # type: ignore[arg-type]
    compiled = meter_layers(lay, side=KeySide(None, None, None, exact, codes=codes),
                            **common)  # type: ignore[arg-type]
    for a, b in zip(torch_path, compiled, strict=True):
        assert torch.equal(torch.isinf(a.meter), torch.isinf(b.meter))
        fin = torch.isfinite(a.meter)
        assert torch.allclose(a.meter[fin], b.meter[fin], rtol=1e-12, atol=1e-300)
        assert a.theorems == b.theorems
        assert b.true_tv is not None and bool((b.true_tv <= b.meter.clamp(max=1.0)).all())
    assert compiled[0].basis.evidence(*compiled[0].theorems) is not None


@pytest.mark.parametrize("form", ["meter", "cascade"])
def test_a_long_chunk_is_metered_in_row_blocks_as_in_one_group(form: str) -> None:
    """A prefill chunk of 70 rows after 10 earlier tokens, beside a decode row: groups of at
    most ROW_BLOCK consecutive rows, each reading the tokens up to its last row, every row
    in exactly one group. Every cell's value is never above the one-group value: the
    meter equal to it up to the margin of the longer sum, the cascade's tanh(max c) over
    fewer hidden tokens; the audited true TV the same, no violation."""
    from witcert_kernels.fused import fp8_codes

    eng = _Engine(CacheFormat.FP8_E4M3, layers=1, blocks=8)
    tables = [[0, 1, 2, 3, 4, 5], [6, 7, 7, 7, 7, 7]]
    eng.write([t * BS + p % BS for p in range(10) for t in [tables[0][p // BS]]] +
              [tables[1][p // BS] * BS + p % BS for p in range(19)])
    lay = _layout([70, 1], [80, 20], tables)
    eng.write(lay.row_slot.tolist())
    queries = torch.randn(1, lay.rows, H, D, generator=eng.gen).to(torch.bfloat16)
    groups = row_groups(lay)
    assert sorted(torch.cat([g.rows.flatten() for g in groups]).tolist()) == \
        list(range(lay.rows))
    chunk = [g for g in groups if int(g.requests[0]) == 0 and g.rows.shape[1] > 1]
    assert len(chunk) == 3 and all(int(g.rows.shape[1]) <= ROW_BLOCK for g in chunk)
    assert [g.width for g in chunk] == [int(lay.row_position[g.rows[0, -1]]) + 1
                                        for g in chunk] == [42, 74, 80]
    offsets = element_offsets(eng.caches, lay.slots, layout=CacheLayout.VEC, heads_first=True)
    assert offsets is not None and eng.buffer.exact is not None
    side = KeySide(None, None, None, eng.buffer.exact[0, lay.slots],
                   codes=fp8_codes(eng.caches, *offsets, fmt=Fp8Format.E4M3,
                                   rounding=ROUNDING, scales=eng.scales))
    common = dict(queries=queries[0], side=side, kv_heads=KVH, scale=D ** -0.5,
                  layout=RopeLayout.HALF_SPLIT, form=form, tau=0.1)
    blocked = meter_layer(lay, **common)  # type: ignore[arg-type]
    whole = meter_layer(lay, groups=[g for g in groups if int(g.rows.shape[1]) == 1] +
                        [RowGroup(torch.tensor([0]), torch.arange(70).unsqueeze(0))],
                        **common)  # type: ignore[arg-type]
    assert torch.equal(torch.isinf(blocked.meter), torch.isinf(whole.meter))
    fin = torch.isfinite(whole.meter)
    assert bool((blocked.meter[fin] <= whole.meter[fin]).all())
    if form == "meter":
        assert torch.allclose(blocked.meter[fin], whole.meter[fin], rtol=1e-9, atol=0.0)
    assert blocked.true_tv is not None and whole.true_tv is not None
    assert torch.allclose(blocked.true_tv, whole.true_tv, rtol=1e-12, atol=1e-15)
    assert bool((blocked.true_tv <= blocked.meter.clamp(max=1.0)).all())


def test_audit_catches_an_understated_witness() -> None:
    eng = _Engine(CacheFormat.FP8_E4M3)
    lay, queries = _mixed_step(eng)
    honest = _meter(eng, lay, queries)
    forged = _meter(eng, lay, queries, understate=1e-3)
    col = SUMMARY.index("violations")
    assert honest.summary[:, col].sum() == 0
    assert forged.summary[:, col].sum() > 0


def test_a_lossless_cache_meters_zero() -> None:
    eng = _Engine(CacheFormat.MODEL_DTYPE)
    lay, queries = _mixed_step(eng)
    m = _meter(eng, lay, queries)
    assert float(m.meter.max()) == 0.0
    assert m.summary[:, SUMMARY.index("covered")].tolist() == \
        m.summary[:, SUMMARY.index("cells")].tolist()


def test_positions_refuse_stale_and_unwritten_slots() -> None:
    buf = SlotWitnesses(layers=1, slots=64, kv_heads=1, bands=1)
    pos = Positions(seats=2, length=8)
    w = torch.ones(1, 3, 1, 1)
    gens = buf.write(torch.tensor([4, 5, 6]), w)
    seats = torch.tensor([0])
    pos.wrote(torch.tensor([0, 0, 0]), torch.tensor([0, 1, 2]), torch.tensor([4, 5, 6]), gens)
    slots = torch.tensor([[4, 5, 6]])
    visible = torch.ones(1, 3, dtype=torch.bool)
    assert pos.check(seats, slots, visible, buf).tolist() == [0]
    buf.write(torch.tensor([5]), torch.ones(1, 1, 1, 1))  # another request reuses slot 5
    assert pos.check(seats, slots, visible, buf).tolist() == [1]
    with pytest.raises(StaleReadError, match="slot 5 was authorised at generation 1 but is "
                                             "now at generation 2"):
        raise_for(1, slots[0], visible[0], pos.gen[0, :3], buf)
    fresh = torch.tensor([[4, 9, 6]])  # position 1 now maps to a slot never written
    assert pos.check(seats, fresh, visible, buf).tolist() == [2]
    with pytest.raises(UnwrittenSlotError, match="slot 9 is UNWRITTEN"):
        raise_for(2, fresh[0], visible[0], pos.gen[0, :3], buf)
    # A prefix-cache hit: seat 1 reads slots another request wrote, and adopts them.
    assert pos.check(torch.tensor([1]), slots, visible, buf).tolist() == [0]
    assert pos.gen[1, :3].tolist() == buf.generation[slots[0]].tolist()


def test_side_buffer_refuses_out_of_range_slots() -> None:
    buf = SlotWitnesses(layers=1, slots=8, kv_heads=1, bands=1)
    with pytest.raises(InvalidValueError, match=r"slots=\(0, 8\).*\[0, 8\)"):
        buf.write(torch.tensor([0, 8]), torch.ones(1, 2, 1, 1))
    with pytest.raises(InvalidValueError, match="audit mode"):
        buf.write(torch.tensor([0]), torch.ones(1, 1, 1, 1), torch.ones(1, 1, 1, 4))


def test_switch_parses_and_names_each_bad_item(tmp_path: Path) -> None:
    store = tmp_path / "v.sqlite"
    assert from_environ({}) is None and from_environ({"WITCERT_VLLM": " "}) is None
    cfg = from_environ({"WITCERT_VLLM": f"store={store},tau=0.2,bands=2,audit=1,delta=1/50,"
                                        "form=tanh"})
    assert cfg == PluginConfig(store=store, tau=0.2, bands=2, audit=True,
                               delta_req=Fraction(1, 50), form="tanh")
    assert cfg is not None and from_environ({"WITCERT_VLLM": cfg.to_env()}) == cfg
    bad = {
        "tau=0.1": "store=PATH",
        f"store={store},tau": "key=value",
        f"store={store},colour=red": "unknown key 'colour'",
        f"store={store},tau=0.1,tau=0.2": "given twice",
        f"store={store},tau=1.5": "open interval",
        f"store={store},audit=yes": "must be 0 or 1",
        f"store={store},bands=two": "does not parse",
        f"store={store},form=fast": "must be one of",
        f"store={tmp_path}/missing/v.sqlite": "folder does not exist",
    }
    for text, message in bad.items():
        with pytest.raises(InvalidValueError, match=message):
            from_environ({"WITCERT_VLLM": text})



def test_a_metered_engine_outlasts_vllms_step_timeout(tmp_path: Path) -> None:
    # a gated 1k-token prefill step ran past vLLM's 300-s RPC limit and killed the engine
    cfg = PluginConfig(store=tmp_path / "v.sqlite", tau=0.1)
    env = engine_env(cfg, base={})
    assert int(env["VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"]) == STEP_TIMEOUT_S >= 3600
    assert from_environ(env) == cfg
    # the plugin off leaves vLLM's limit alone; a limit the caller set is kept
    assert "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS" not in engine_env(None, base={})
    mine = engine_env(cfg, base={"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "60"})
    assert mine["VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"] == "60"

def _summary(cells: int, covered: int, worst: float, *, violations: int = 0) -> list[float]:
    row = dict.fromkeys(SUMMARY, 0.0)
    row.update(cells=cells, covered=covered, worst=worst, worst_layer=1, worst_head=2,
               worst_position=3, audited=cells, violations=violations, true_max=worst / 2)
    return [float(row[k]) for k in SUMMARY]


def _evidence():
    eng = _Engine(CacheFormat.MODEL_DTYPE)
    lay, queries = _mixed_step(eng)
    return _meter(eng, lay, queries).basis.evidence(TV_EFORM_METER_SOUND, TV_TWO_SIDED_METER_SOUND)


def test_accounts_verdicts_gate_and_fail_closed() -> None:
    acc = Accounts(layers=2, seats=2, tau=0.1, audit=True, delta_req=Fraction(1, 100),
                   session="s", kv_cache_dtype="fp8")
    ev = _evidence()
    a, b = acc.tally("cmpl-x-0-1a2b3c4d"), acc.tally("chatcmpl-y-5e6f7a8b")
    acc.add_step([a, b], [_summary(8, 8, 0.05), _summary(4, 2, 0.3)], [2, 1],
                 written=[0, 1], read=[0, 1], evidence=ev)
    acc.add_step([a], [_summary(4, 3, 0.2)], [1], written=[0, 1], read=[0], evidence=ev)
    with pytest.raises(InvalidValueError, match="more concurrent requests than"):
        acc.tally("third")
    va = acc.finish("cmpl-x-0-1a2b3c4d")
    assert va is not None and va.external == "cmpl-x-0" and va.tier == "CERTIFIED"
    assert (va.cells, va.covered, va.steps, va.rows, va.mixed_steps) == (12, 11, 2, 3, 1)
    assert va.worst.meter == 0.2 and va.spent == "0"
    # layer 1 metered 2 of the request's 3 rows: the gate's coverage stage fails, by name
    assert va.gate["failed_stage"] == "coverage"
    assert "layers [1] metered fewer rows" in va.gate["stages"]["coverage"]["detail"]
    acc.fail(b, "StaleReadError: slot 5 ...")
    vb = acc.finish("chatcmpl-y-5e6f7a8b")
    assert vb is not None and vb.tier is None and vb.failure is not None
    assert vb.gate["accepted"] is False
    assert acc.finish("never-seen") is None
    c = acc.tally("c")  # a freed seat is reused, the ledger account is new
    assert c.account not in (va.account, vb.account)


def test_accounts_gate_accepts_a_complete_audited_request() -> None:
    acc = Accounts(layers=2, seats=1, tau=0.1, audit=True, delta_req=Fraction(1, 100),
                   session="s", kv_cache_dtype="auto")
    t = acc.tally("r")
    acc.add_step([t], [_summary(8, 8, 0.0)], [2], written=[0, 1], read=[0, 1],
                 evidence=_evidence())
    v = acc.finish("r")
    assert v is not None and v.gate["accepted"] is True and v.tier == "CERTIFIED"
    bad = Accounts(layers=2, seats=1, tau=0.1, audit=True, delta_req=Fraction(1, 100),
                   session="s", kv_cache_dtype="auto")
    t = bad.tally("r")
    bad.add_step([t], [_summary(8, 8, 0.0, violations=1)], [2], written=[0, 1],
                 read=[0, 1], evidence=_evidence())
    v = bad.finish("r")
    assert v is not None and v.gate["failed_stage"] == "soundness"
    # a request whose audit caught a cell above its bound keeps no tier: it fails closed
    assert v.tier is None and v.failure is not None and v.failure.startswith("audit: 1 of 8")
    assert v.violations == 1 and recount_spent(v.to_json()) == Fraction(v.spent) == 0


def test_external_ids() -> None:
    assert external_id("cmpl-abc-0-1a2b3c4d") == "cmpl-abc-0"
    assert external_id("0-aedcbcde") == "0"
    assert external_id("plain") == "plain"


def test_store_round_trip_find_wait_and_totals(tmp_path: Path) -> None:
    acc = Accounts(layers=2, seats=3, tau=0.1, audit=True, delta_req=Fraction(1, 100),
                   session="s", kv_cache_dtype="auto")
    ev = _evidence()
    names = ["cmpl-q_1-0-aaaaaaaa", "cmpl-q_1-1-bbbbbbbb", "cmpl-qX1-0-cccccccc"]
    for n in names:
        t = acc.tally(n)
        acc.add_step([t], [_summary(8, 6, 0.2)], [2], written=[0, 1], read=[0, 1], evidence=ev)
    store = VerdictStore(tmp_path / "v.sqlite")
    for n in names:
        v = acc.finish(n)
        assert v is not None
        store.put(v)
    other = VerdictStore(tmp_path / "v.sqlite")  # a second connection: the server's
    assert [v.request for v in other.find("cmpl-q_1")] == names[:2]  # '_' is not a wildcard
    assert other.find("cmpl-q_1-1")[0].request == names[1]
    assert other.find(names[2])[0].to_json() == store.find(names[2])[0].to_json()
    assert other.wait(["cmpl-q_1"], timeout=1.0)["cmpl-q_1"]
    with pytest.raises(TimeoutError, match="nope"):
        other.wait(["nope"], timeout=0.1)
    (tot,) = other.totals()
    assert (tot.kv_cache_dtype, tot.tier, tot.requests, tot.cells, tot.covered) == \
        ("auto", "CERTIFIED", 3, 24, 18)
    rows = sqlite3.connect(tmp_path / "v.sqlite").execute(
        "SELECT COUNT(*) FROM verdicts").fetchone()
    assert rows == (3,)


def test_collector_exports_low_cardinality_metrics(tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from witcert_adapters.vllm_plugin.server import VerdictCollector

    acc = Accounts(layers=2, seats=2, tau=0.1, audit=True, delta_req=Fraction(1, 100),
                   session="s", kv_cache_dtype="fp8")
    store = VerdictStore(tmp_path / "v.sqlite")
    for name, covered in (("r1-aaaaaaaa", 6), ("r2-bbbbbbbb", 2)):
        t = acc.tally(name)
        acc.add_step([t], [_summary(8, covered, 0.5)], [2], written=[0, 1], read=[0, 1],
                     evidence=_evidence())
        v = acc.finish(name)
        assert v is not None
        store.put(v)
    registry = CollectorRegistry()
    registry.register(VerdictCollector(store, PluginConfig(store=tmp_path / "v.sqlite")))
    text = generate_latest(registry).decode()
    assert 'witcert_requests_total{kv_cache_dtype="fp8",tier="CERTIFIED"} 2.0' in text
    assert 'witcert_cells_covered_total{kv_cache_dtype="fp8",tier="CERTIFIED"} 8.0' in text
    assert 'witcert_coverage_ratio{kv_cache_dtype="fp8",tier="CERTIFIED"} 0.5' in text
    assert "witcert_coverage_threshold 0.1" in text
    assert "r1" not in text and "r2" not in text  # request ids never become labels


@pytest.mark.parametrize("name", ["config", "paged", "witnesses", "verdicts"])
def test_docstring_examples(name: str) -> None:
    import doctest
    import importlib

    module = importlib.import_module(f"witcert_adapters.vllm_plugin.{name}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0, (name, result)


# ------------------------------------------------------------------ the gate that repairs

def _repair_setup(eng: _Engine, *, bands: int, fmt: bool):
    from witcert_adapters.vllm_plugin.paged import CacheLayout, dequantize, stored_elements
    from witcert_kernels.meter import format_witness

    lay, queries = _mixed_step(eng)
    raw = stored_elements(eng.caches[:1], lay.slots, layout=CacheLayout.VEC, heads_first=True)
    keys = dequantize(raw, fmt=eng.fmt, scales=eng.scales[:1])[0]
    bounds = format_witness(raw[0], fmt=Fp8Format.E4M3, rounding=ROUNDING,
                            scale=eng.scales[0]) if fmt else None
    assert eng.buffer.exact is not None
    side = KeySide(keys, eng.buffer.witness[0, lay.slots][..., :bands] if bands else None,
                   bounds, eng.buffer.exact[0, lay.slots])
    raw_v = stored_elements(eng.caches[:1], lay.slots, layout=CacheLayout.VEC, part=1,
                            heads_first=True)
    values = dequantize(raw_v, fmt=eng.fmt, scales=eng.scales[:1])[0]
    return lay, queries[0], side, values


def _attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, pos: int) -> torch.Tensor:
    logits = D ** -0.5 * keys[:pos + 1] @ q
    p = torch.softmax(logits, dim=0)
    return p @ values[:pos + 1]


@pytest.mark.parametrize("bands,fmt,every_row", [(4, False, True), (0, True, True),
                                                (4, True, True), (0, True, False)])
def test_the_gate_repairs_every_cell_above_tau_and_serves_its_attention(
        bands: int, fmt: bool, every_row: bool) -> None:
    from witcert_adapters.repair import RepairPolicy
    from witcert_adapters.vllm_plugin.meter import meter_layer
    from witcert_adapters.vllm_plugin.repair import Gate

    eng = _Engine(CacheFormat.FP8_E4M3)
    lay, q, side, values = _repair_setup(eng, bands=bands, fmt=fmt)

    def meter(s: KeySide, groups: object = None):  # type: ignore[no-untyped-def]
        return meter_layer(lay, queries=q, side=s, kv_heads=KVH, scale=D ** -0.5,
                           layout=RopeLayout.HALF_SPLIT, groups=groups,  # type: ignore[arg-type]
                           keep=True)

    lm = meter(side)
    tau = min(0.5, float(lm.meter.median()))  # some cells above it, some not
    last = torch.zeros(lay.rows, dtype=torch.bool)
    last[torch.cumsum(lay.q_lens, 0) - 1] = True  # each request's last row
    gated = torch.ones(lay.rows, dtype=torch.bool) if every_row else last
    bad = (lm.meter > tau) & gated.unsqueeze(1)
    assert bool(bad.any()) and not bool(bad.all())
    seats = torch.tensor([0, 1])
    positions = Positions(seats=2, length=64)
    assert positions.check(seats, lay.slots, lay.visible, eng.buffer).tolist() == [0, 0]
    engine_out = torch.stack([torch.stack([_attention(
        q[t, h].double(), side.keys[int(lay.row_request[t]), h // G],  # type: ignore[index]
        values[int(lay.row_request[t]), h // G], int(lay.row_position[t]))
        for h in range(H)]) for t in range(lay.rows)]).to(torch.bfloat16)
    output = engine_out.clone()
    gate = Gate(seats=2, layers=eng.layers, kv_heads=KVH, length=64,
                policy=RepairPolicy(tau, block_size=4))
    done = gate.repair(0, lay, lm, side, seats=seats, ok=torch.ones(2, dtype=torch.bool),
                       buffer=eng.buffer, positions=positions, values=values, output=output,
                       remeter=meter, rows=None if every_row else last)
    assert int(done.repaired.sum()) == int(bad.sum()) and int(done.risk_ranked.sum()) == 0
    assert bool((done.meter[bad] <= tau).all())  # every repaired cell ends at or below tau
    assert torch.equal(done.meter[~bad], lm.meter[~bad])
    assert done.true_tv is not None
    assert bool((done.true_tv <= torch.clamp(done.meter, max=1.0)).all())  # audited: sound
    assert int(done.paged.sum()) > 0
    assert int(done.page_in_bytes.sum()) == int(done.paged.sum()) * D * 2 * 4
    # the served output: the engine's where no repair was needed, the attention over the
    # mixed keys and values (exact where paged) where it was
    assert torch.equal(output[~bad], engine_out[~bad])
    assert eng.buffer.exact is not None and eng.buffer.exact_values is not None
    checked = 0
    for t, h in torch.nonzero(bad).tolist():
        r, pos = int(lay.row_request[t]), int(lay.row_position[t])
        paged = gate.paged[r, 0, h // G, :lay.slots.shape[1]]
        slots = lay.slots[r]
        keys = torch.where(paged.unsqueeze(-1), eng.buffer.exact[0, slots, h // G].double(),
                           side.keys[r, h // G])  # type: ignore[index]
        vals = torch.where(paged.unsqueeze(-1),
                           eng.buffer.exact_values[0, slots, h // G].double(), values[r, h // G])
        want = _attention(q[t, h].double(), keys, vals, pos)
        got = output[t, h].double()
        assert bool(((got - want).abs() <= 2.0 ** -8 * want.abs() + 1e-30).all()), (t, h)
        checked += 1
    assert checked == int(bad.sum())


def test_the_gate_audit_catches_a_backing_store_that_is_not_exact() -> None:
    from witcert_adapters.repair import RepairPolicy
    from witcert_adapters.vllm_plugin.meter import meter_layer
    from witcert_adapters.vllm_plugin.repair import Gate

    eng = _Engine(CacheFormat.FP8_E4M3)
    lay, q, side, values = _repair_setup(eng, bands=4, fmt=False)

    def meter(s: KeySide, groups: object = None):  # type: ignore[no-untyped-def]
        return meter_layer(lay, queries=q, side=s, kv_heads=KVH, scale=D ** -0.5,
                           layout=RopeLayout.HALF_SPLIT, groups=groups,  # type: ignore[arg-type]
                           keep=True)

    lm = meter(side)
    assert eng.buffer.exact is not None
    eng.buffer.exact[0] += 0.5  # the audit keeps the true keys; the store now lies
    seats = torch.tensor([0, 1])
    positions = Positions(seats=2, length=64)
    positions.check(seats, lay.slots, lay.visible, eng.buffer)
    gate = Gate(seats=2, layers=eng.layers, kv_heads=KVH, length=64,
                policy=RepairPolicy(0.02, block_size=4))
    done = gate.repair(0, lay, lm, side, seats=seats, ok=torch.ones(2, dtype=torch.bool),
                       buffer=eng.buffer, positions=positions, values=values,
                       output=torch.zeros(lay.rows, H, D), remeter=meter)
    assert done.true_tv is not None
    assert bool((done.true_tv > torch.clamp(done.meter, max=1.0)).any())


def test_the_backing_store_refuses_unwritten_and_stale_slots() -> None:
    buf = SlotWitnesses(layers=1, slots=8, kv_heads=1, bands=0, exact_dim=2, values=True)
    gens = buf.bump(torch.tensor([3]))
    buf.put(slice(None), torch.tensor([3]), torch.zeros(1, 1, 1, 0), torch.ones(1, 1, 1, 2),
            torch.full((1, 1, 1, 2), 2.0))
    k, v = buf.read_exact(0, torch.tensor([3]), gens)
    assert k.tolist() == [[[1.0, 1.0]]] and v.tolist() == [[[2.0, 2.0]]]
    with pytest.raises(UnwrittenSlotError, match="slot 4 is UNWRITTEN"):
        buf.read_exact(0, torch.tensor([3, 4]), torch.tensor([1, 1]))
    buf.bump(torch.tensor([3]))  # another write reused slot 3
    with pytest.raises(StaleReadError, match="slot 3 was authorised at generation 1"):
        buf.read_exact(0, torch.tensor([3]), gens)
    with pytest.raises(InvalidValueError, match="repair"):
        SlotWitnesses(layers=1, slots=8, kv_heads=1, bands=1).read_exact(
            0, torch.tensor([0]), torch.tensor([0]))


def test_amx_layout_reads_what_a_model_of_the_amx_writer_wrote() -> None:
    """The AMX writer's placement (vLLM's scalar AMX writer, by its formulas), written element
    by element into a flat region, and read back through the plugin's views."""
    from witcert_adapters.vllm_plugin.paged import CacheLayout, cache_layout, stored_elements

    nb, kvh, bs, d = 3, 2, 32, 32
    cache = torch.full((nb, kvh, bs, 2 * d), 0xFF, dtype=torch.uint8)
    flat = cache.view(-1)
    gen = torch.Generator().manual_seed(4)
    keys = torch.randint(0, 255, (nb * bs, kvh, d), generator=gen, dtype=torch.int32).to(torch.uint8)
    values = torch.randint(0, 255, (nb * bs, kvh, d), generator=gen, dtype=torch.int32).to(
        torch.uint8)
    slots = torch.randperm(nb * bs, generator=gen)[:40]
    for s in slots.tolist():
        b, o = divmod(s, bs)
        for h in range(kvh):
            base = (b * kvh + h) * 2 * bs * d
            for c in range(d):
                flat[base + (o // 16) * 16 * d + (c // 2) * 32 + (o % 16) * 2 + c % 2] = \
                    keys[s, h, c]
                flat[base + bs * d + (c // 16) * 16 * bs + (o // 2) * 32 + (c % 16) * 2 + o % 2] = \
                    values[s, h, c]
    assert cache_layout("amx") is CacheLayout.AMX
    got_k = stored_elements([cache], slots, layout=CacheLayout.AMX, part=0)[0]
    got_v = stored_elements([cache], slots, layout=CacheLayout.AMX, part=1)[0]
    assert torch.equal(got_k, keys[slots]) and torch.equal(got_v, values[slots])
    heads_first = stored_elements([cache], slots.view(4, 10), layout=CacheLayout.AMX,
                                  heads_first=True)[0]
    assert torch.equal(heads_first, keys[slots].view(4, 10, kvh, d).transpose(1, 2))
    # the vec reader reads other bytes: a wrong layout is not silently right
    assert not torch.equal(stored_elements([cache], slots, layout=CacheLayout.VEC)[0],
                           keys[slots])
    with pytest.raises(EngineMismatchError, match="CPU attention ISA.*'vec16'"):
        cache_layout("vec16")
    odd = torch.zeros(1, kvh, 24, 2 * d, dtype=torch.uint8)  # a block the tiles do not divide
    with pytest.raises(EngineMismatchError, match="AMX cache layout.*block size 24"):
        stored_elements([odd], torch.tensor([0]), layout=CacheLayout.AMX)


def test_a_request_without_metered_steps_is_neither_certified_nor_accepted() -> None:
    """No evidence, no certificate: the ledger's tier and the gate agree."""
    acc = Accounts(layers=2, seats=1, tau=0.1, audit=True, delta_req=Fraction(1, 100),
                   session="s", kv_cache_dtype="auto")
    acc.tally("r")
    v = acc.finish("r")
    assert v is not None and v.tier == "EMPIRICAL" and v.steps == 0
    assert v.gate["accepted"] is False and v.gate["failed_stage"] == "coverage"
