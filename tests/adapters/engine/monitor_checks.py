"""The plugin's engine-side Monitor driven step by step, inside the engine's environment.

Run by tests/adapters/test_vllm_engine.py as a script; prints one JSON line. The keys are
written into real paged caches by vLLM's own CPU kernel (``cpu_attn_reshape_and_cache``);
the Monitor sees exactly what the attention backend would hand it. Three requests:

- ``clean``: prefill then decode; its verdict must be CERTIFIED;
- ``victim``: prefilled; then another request's write lands in one of its slots while it
  still maps that slot (what an engine bug or a premature slot reuse does), then it decodes:
  its verdict must fail closed (no tier, a StaleReadError named);
- ``thief``: the request whose write reused the slot.

A second Monitor, whose model never ran the metered implementation (another backend),
must refuse the first step with tokens.

On an fp8 cache (vLLM's own fp8 writer), a byte changed after the engine wrote it: at a
layer's first write (start-up) the Monitor refuses, naming the layer, slot, kv head and
channel; at a later write the step's requests fail closed with the same message.

The cascade on the model-dtype cache (audited): every bound is 0, every cell reports
``tanh(max c) = 0`` without reading a key, and the audit finds no violation; a model whose
keys are not in the cache's dtype (the cache rounds them) is refused at start-up without
band witnesses.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

from vllm import _custom_ops as ops

from witcert_adapters.vllm_plugin.config import PluginConfig
from witcert_adapters.vllm_plugin.engine import Monitor
from witcert_adapters.vllm_plugin.paged import CacheFormat
from witcert_adapters.vllm_plugin.store import VerdictStore

LAYERS, KVH, H, D, BS, NB = 2, 2, 4, 64, 128, 4
GEN = torch.Generator().manual_seed(0)
CACHES = [torch.zeros(NB, KVH, BS, 2 * D, dtype=torch.bfloat16) for _ in range(LAYERS)]


def step(mon: Monitor, rows: list[tuple[str, list[int], int, list[int]]],
         finished: set[str] = frozenset(),  # type: ignore[assignment]
         caches: list[torch.Tensor] = CACHES, kv: str = "auto",
         corrupt: tuple[int, int] | None = None, key_dtype: torch.dtype = torch.bfloat16
         ) -> None:
    """One engine step: per request (id, slots written, visible length, block table row);
    ``corrupt=(layer, byte)`` changes one byte of that layer's cache after the engine wrote
    it."""
    qsl, seq, table, slot_map = [0], [], [], []
    for _, slots, length, blocks in rows:
        qsl.append(qsl[-1] + len(slots))
        seq.append(length)
        table.append(blocks)
        slot_map += slots
    sched = SimpleNamespace(finished_req_ids=set(finished),
                            num_scheduled_tokens={r: len(s) for r, s, _, _ in rows},
                            total_num_scheduled_tokens=len(slot_map))
    runner = SimpleNamespace(input_batch=SimpleNamespace(req_ids=[r for r, _, _, _ in rows]),
                             get_model=lambda: torch.nn.Module())
    mon.begin(runner, sched)
    md = SimpleNamespace(num_actual_tokens=len(slot_map), query_start_loc=torch.tensor(qsl),
                         seq_lens=torch.tensor(seq), block_table=torch.tensor(table),
                         slot_mapping=torch.tensor(slot_map, dtype=torch.int64))
    if not slot_map:
        return
    for layer, cache in enumerate(caches):
        key = torch.randn(len(slot_map), KVH, D, generator=GEN).to(key_dtype)
        value = torch.randn(len(slot_map), KVH, D, generator=GEN).to(torch.bfloat16)
        kc, vc = cache.view(NB, KVH, 2 * BS, D).chunk(2, dim=2)
        ops.cpu_attn_reshape_and_cache(key.to(cache.dtype) if kv == "auto" else key, value,
                                       kc, vc, md.slot_mapping, "vec",
                                       kv_cache_dtype=kv)
        if corrupt is not None and corrupt[0] == layer:
            cache.view(torch.uint8).view(-1)[corrupt[1]] ^= 0x01
        mon.wrote(layer, key, value, cache, md.slot_mapping, 1.0, 1.0, "vec")
        query = torch.randn(len(slot_map), H, D, generator=GEN).to(torch.bfloat16)
        mon.read(layer, query, md, torch.empty(len(slot_map), H, D, dtype=torch.bfloat16))
    mon.end(runner, sched)


def main() -> None:
    store = Path(sys.argv[1])
    mon = Monitor(PluginConfig(store=store, tau=0.1, audit=True))
    mon.n_layers, mon.seats, mon.length = LAYERS, 4, 256
    mon.fmt, mon.kv_cache_dtype = CacheFormat.MODEL_DTYPE, "auto"
    mon.num_heads, mon.scale = H, D ** -0.5
    step(mon, [("clean-aaaaaaaa", [0, 1, 2], 3, [0]),
               ("victim-bbbbbbbb", [128, 129, 130], 3, [1])])
    step(mon, [("clean-aaaaaaaa", [3], 4, [0]),
               ("thief-cccccccc", [128, 129], 2, [1])])  # lands in the victim's slots
    step(mon, [("clean-aaaaaaaa", [4], 5, [0]), ("victim-bbbbbbbb", [131], 4, [1])])
    step(mon, [], finished={"clean-aaaaaaaa", "victim-bbbbbbbb", "thief-cccccccc"})
    verdicts: dict[str, object] = {v.external: v.to_json() for v in VerdictStore(store).all()}
    # A backend that never runs the metered implementation: the first step with tokens
    # stops the engine instead of serving unmetered.
    other = Monitor(PluginConfig(store=store, tau=0.1))
    sched = SimpleNamespace(finished_req_ids=set(), num_scheduled_tokens={"r": 3},
                            total_num_scheduled_tokens=3)
    other.begin(SimpleNamespace(), sched)
    try:
        other.end(SimpleNamespace(), sched)
        verdicts["unmetered_backend"] = "no error"
    except Exception as exc:  # noqa: BLE001 - the message is the result
        verdicts["unmetered_backend"] = f"{type(exc).__name__}: {exc}"
    verdicts["fp8"] = fp8_checks(store.with_name("fp8.sqlite"))
    verdicts["cascade"] = cascade_checks(store.with_name("cascade.sqlite"))
    print(json.dumps(verdicts))


def fp8_checks(store: Path) -> dict[str, object]:
    """A changed byte in an fp8 cache: refused at start-up, failed closed later."""
    out: dict[str, object] = {}
    caches = [torch.zeros(NB, KVH, BS, 2 * D, dtype=torch.uint8) for _ in range(LAYERS)]

    def fresh() -> Monitor:
        mon = Monitor(PluginConfig(store=store, tau=0.1))
        mon.n_layers, mon.seats, mon.length = LAYERS, 4, 256
        mon.fmt, mon.kv_cache_dtype = CacheFormat.FP8_E4M3, "fp8"
        mon.num_heads, mon.scale = H, D ** -0.5
        return mon

    # layer 1's key byte of slot 130, kv head 1, channel 5: (block 1, head 1) region,
    # K at c * BS + o (vec layout)
    byte = (1 * KVH + 1) * 2 * BS * D + 5 * BS + 2
    try:
        step(fresh(), [("a-aaaaaaaa", [128, 129, 130], 3, [1])], caches=caches, kv="fp8",
             corrupt=(1, byte))
        out["startup"] = "no error"
    except Exception as exc:  # noqa: BLE001 - the message is the result
        out["startup"] = f"{type(exc).__name__}: {exc}"
    for scale in (0.0, float("nan"), float("inf")):
        mon = fresh()
        try:
            mon.wrote(0, torch.ones(1, KVH, D), torch.ones(1, KVH, D), caches[0],
                      torch.tensor([5]), scale, 1.0, "vec")
            out[f"scale {scale}"] = "no error"
        except Exception as exc:  # noqa: BLE001 - the message is the result
            out[f"scale {scale}"] = f"{type(exc).__name__}: {exc}"
    try:
        fresh().wrote(0, torch.ones(1, KVH, D), torch.ones(1, KVH, D), caches[0],
                      torch.tensor([5]), 1.0, 1.0, "vec16")
        out["isa"] = "no error"
    except Exception as exc:  # noqa: BLE001 - the message is the result
        out["isa"] = f"{type(exc).__name__}: {exc}"
    mon = fresh()
    step(mon, [("b-bbbbbbbb", [0, 1, 2], 3, [0])], caches=caches, kv="fp8")
    later = (0 * KVH + 0) * 2 * BS * D + BS * D + 3 * D + 7  # layer 0 value byte, slot 3
    step(mon, [("b-bbbbbbbb", [3], 4, [0])], caches=caches, kv="fp8", corrupt=(0, later))
    step(mon, [], finished={"b-bbbbbbbb"}, caches=caches, kv="fp8")
    (v,) = [v for v in VerdictStore(store).all() if v.external == "b"]
    out["later"] = v.to_json()
    return out


def cascade_checks(store: Path) -> dict[str, object]:
    """The cascade on a model-dtype cache, audited; float32 keys into a bfloat16 cache."""
    out: dict[str, object] = {}
    caches = [torch.zeros(NB, KVH, BS, 2 * D, dtype=torch.bfloat16) for _ in range(LAYERS)]

    def fresh(**items: object) -> Monitor:
        mon = Monitor(PluginConfig(store=store, tau=0.1, **items))  # type: ignore[arg-type]
        mon.n_layers, mon.seats, mon.length = LAYERS, 4, 256
        mon.fmt, mon.kv_cache_dtype = CacheFormat.MODEL_DTYPE, "auto"
        mon.num_heads, mon.scale = H, D ** -0.5
        return mon

    mon = fresh(form="cascade", audit=True)
    step(mon, [("c-cccccccc", [0, 1, 2], 3, [0])], caches=caches)
    step(mon, [("c-cccccccc", [3], 4, [0])], caches=caches)
    step(mon, [], finished={"c-cccccccc"}, caches=caches)
    (v,) = [v for v in VerdictStore(store).all() if v.external == "c"]
    out["verdict"] = v.to_json()
    try:
        step(fresh(), [("f-ffffffff", [0, 1], 2, [0])], caches=caches,
             key_dtype=torch.float32)
        out["float32 keys"] = "no error"
    except Exception as exc:  # noqa: BLE001 - the message is the result
        out["float32 keys"] = f"{type(exc).__name__}: {exc}"
    return out


if __name__ == "__main__":
    main()
