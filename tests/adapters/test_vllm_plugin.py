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

from witcert_adapters.vllm_plugin.config import PluginConfig, from_environ
from witcert_adapters.vllm_plugin.meter import SUMMARY, meter_rows, write_witnesses
from witcert_adapters.vllm_plugin.paged import CacheFormat, StepLayout, cache_format, \
    stored_keys, visible_keys
from witcert_adapters.vllm_plugin.store import VerdictStore
from witcert_adapters.vllm_plugin.verdicts import Accounts, external_id
from witcert_adapters.vllm_plugin.witnesses import Positions, SlotWitnesses, raise_for
from witcert_calculus.errors import InvalidValueError, StaleReadError, UnwrittenSlotError
from witcert_calculus.theorems import SOFTMAX_TV_TANH_SOUND, TV_EFORM_SOUND, TV_TWO_SIDED_SOUND
from witcert_calculus.tv_forms import tv_meter, tv_tanh_max
from witcert_calculus.witness import RopeLayout, band_witness, logit_bound

BS = 16  # block size
KVH, G, D, B = 2, 2, 16, 4
H = KVH * G


def _cache(layers: int, blocks: int, dtype: torch.dtype) -> list[torch.Tensor]:
    return [torch.zeros(blocks, KVH, BS, 2 * D, dtype=dtype) for _ in range(layers)]


def _write(cache: torch.Tensor, slots: torch.Tensor, keys: torch.Tensor,
           fmt: CacheFormat, scale: float) -> None:
    """Write keys in vLLM's CPU layout: per (block, head) K as [d, bs], then V."""
    nb = cache.shape[0]
    view = cache.view(nb, KVH, 2, D, BS)
    for s, k in zip(slots.tolist(), keys, strict=True):
        if fmt is CacheFormat.MODEL_DTYPE:
            view[s // BS, :, 0, :, s % BS] = k.to(cache.dtype)
        else:
            q = (k.float() / scale).to(torch.float8_e4m3fn)
            view[s // BS, :, 0, :, s % BS] = q.view(torch.uint8)


class _Engine:
    """A two-layer paged memory written like vLLM's, with exact keys kept aside."""

    def __init__(self, fmt: CacheFormat, *, layers: int = 2, blocks: int = 8) -> None:
        self.fmt = fmt
        dtype = torch.bfloat16 if fmt is CacheFormat.MODEL_DTYPE else torch.uint8
        self.caches = _cache(layers, blocks, dtype)
        self.scales = [0.5, 0.25][:layers]
        self.layers = layers
        self.exact: dict[int, torch.Tensor] = {}
        self.buffer = SlotWitnesses(layers=layers, slots=blocks * BS, kv_heads=KVH, bands=B,
                                    exact_dim=D, exact_dtype=torch.float32)
        self.gen = torch.Generator().manual_seed(0)

    def write(self, slots: list[int]) -> torch.Tensor:
        s = torch.tensor(slots)
        keys = torch.randn(self.layers, len(slots), KVH, D, generator=self.gen).to(torch.bfloat16)
        for layer in range(self.layers):
            _write(self.caches[layer], s, keys[layer], self.fmt, self.scales[layer])
        stored = stored_keys(self.caches, s, fmt=self.fmt, k_scales=self.scales)
        w = write_witnesses(keys, stored, bands=B, layout=RopeLayout.HALF_SPLIT)
        return self.buffer.write(s, w, keys.float())


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
            want = (keys.float() / 0.5).to(torch.float8_e4m3fn).double() * 0.5
            assert torch.equal(got, want)
            assert not torch.equal(got, keys.double())  # fp8 is lossy


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


def _meter(eng: _Engine, lay: StepLayout, queries: torch.Tensor, *, understate: float = 1.0):
    keys = visible_keys(eng.caches, lay.slots, fmt=eng.fmt, k_scales=eng.scales)
    assert torch.equal(keys, stored_keys(eng.caches, lay.slots, fmt=eng.fmt,
                                         k_scales=eng.scales).permute(0, 1, 3, 2, 4))
    assert eng.buffer.exact is not None
    return meter_rows(lay, queries=queries, keys=keys,
                      witnesses=eng.buffer.witness[:, lay.slots] * understate, scale=D ** -0.5,
                      layout=RopeLayout.HALF_SPLIT, tau=0.1,
                      exact_keys=eng.buffer.exact[:, lay.slots])


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
    assert m.basis.evidence(TV_EFORM_SOUND, TV_TWO_SIDED_SOUND) is not None


def test_a_row_that_sees_one_token_meters_zero() -> None:
    """A request's first prompt token attends to itself alone: TV is exactly 0 whatever its
    witness (Lean WitCert.Meters.tv_single_token), and the other rows keep their meter."""
    from witcert_calculus.theorems import TV_SINGLE_TOKEN
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
    assert TV_SINGLE_TOKEN in theorems_of(m.basis.evidence(TV_EFORM_SOUND, TV_TWO_SIDED_SOUND))


def test_the_cheap_form_needs_no_keys_and_is_sound() -> None:
    eng = _Engine(CacheFormat.FP8_E4M3)
    lay, queries = _mixed_step(eng)
    assert eng.buffer.exact is not None
    common = dict(queries=queries, witnesses=eng.buffer.witness[:, lay.slots],
                  scale=D ** -0.5, layout=RopeLayout.HALF_SPLIT, tau=0.1)
    cheap = meter_rows(lay, keys=None, form="tanh", **common)  # type: ignore[arg-type]
    assert cheap.theorems == (SOFTMAX_TV_TANH_SOUND,)
    assert cheap.basis.evidence(*cheap.theorems) is not None
    keys = visible_keys(eng.caches, lay.slots, fmt=eng.fmt, k_scales=eng.scales)
    audited = meter_rows(lay, keys=keys, form="tanh",  # type: ignore[arg-type]
                         exact_keys=eng.buffer.exact[:, lay.slots], **common)
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
        meter_rows(lay, keys=None, **common)  # type: ignore[arg-type]


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


def _summary(cells: int, covered: int, worst: float, *, violations: int = 0) -> list[float]:
    row = dict.fromkeys(SUMMARY, 0.0)
    row.update(cells=cells, covered=covered, worst=worst, worst_layer=1, worst_head=2,
               worst_position=3, audited=cells, violations=violations, true_max=worst / 2)
    return [float(row[k]) for k in SUMMARY]


def _evidence():
    eng = _Engine(CacheFormat.MODEL_DTYPE)
    lay, queries = _mixed_step(eng)
    return _meter(eng, lay, queries).basis.evidence(TV_EFORM_SOUND, TV_TWO_SIDED_SOUND)


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
