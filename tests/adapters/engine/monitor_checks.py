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
         finished: set[str] = frozenset()) -> None:  # type: ignore[assignment]
    """One engine step: per request (id, slots written, visible length, block table row)."""
    qsl, seq, table, slot_map = [0], [], [], []
    for _, slots, length, blocks in rows:
        qsl.append(qsl[-1] + len(slots))
        seq.append(length)
        table.append(blocks)
        slot_map += slots
    sched = SimpleNamespace(finished_req_ids=set(finished),
                            num_scheduled_tokens={r: len(s) for r, s, _, _ in rows},
                            total_num_scheduled_tokens=len(slot_map))
    mon.begin(sched)
    md = SimpleNamespace(num_actual_tokens=len(slot_map), query_start_loc=torch.tensor(qsl),
                         seq_lens=torch.tensor(seq), block_table=torch.tensor(table),
                         slot_mapping=torch.tensor(slot_map, dtype=torch.int64))
    if not slot_map:
        return
    for layer, cache in enumerate(CACHES):
        key = torch.randn(len(slot_map), KVH, D, generator=GEN).to(torch.bfloat16)
        kc, vc = cache.view(NB, KVH, 2 * BS, D).chunk(2, dim=2)
        ops.cpu_attn_reshape_and_cache(key, torch.zeros_like(key), kc, vc, md.slot_mapping,
                                       "vec", kv_cache_dtype="auto")
        mon.wrote(layer, key, cache, md.slot_mapping, 1.0)
        query = torch.randn(len(slot_map), H, D, generator=GEN).to(torch.bfloat16)
        mon.read(layer, query, md)
    runner = SimpleNamespace(input_batch=SimpleNamespace(req_ids=[r for r, _, _, _ in rows]),
                             get_model=lambda: torch.nn.Module())
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
    other.begin(sched)
    try:
        other.end(SimpleNamespace(), sched)
        verdicts["unmetered_backend"] = "no error"
    except Exception as exc:  # noqa: BLE001 - the message is the result
        verdicts["unmetered_backend"] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(verdicts))


if __name__ == "__main__":
    main()
