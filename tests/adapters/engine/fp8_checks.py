"""vLLM's CPU fp8 writer against the plugin's model, byte for byte (run in .venv-vllm).

Run by tests/adapters/test_vllm_engine.py as a script; prints one JSON line. Everything is
written through the installed engine's own kernel, ``torch.ops._C.cpu_attn_reshape_and_cache``
(ISA ``vec``, the one this CPU runs), and read back through the plugin's layout reader:

- every finite bfloat16 value, and +-0, +-inf and NaN, as keys and as values, at five
  scales, for e4m3 and e5m2: the bytes the engine stored against
  :func:`~witcert_adapters.vllm_plugin.quantizer.engine_codes` (counts of differing bytes);
- 2^20 random float32 values (a float32 model) at scale 1.7, the same way;
- the layout: a cache filled with a sentinel byte, random keys and values written at
  scattered slots of several blocks and heads; the bytes the reader finds at each written
  (slot, head, channel) must be the model's, and every other byte must still be the
  sentinel (nothing written elsewhere);
- the residual bound each byte carries (``witcert_calculus.meters.formats``) against the
  true residual ``|x - s q|`` of every element written: the largest ratio and the count
  above the bound.
"""

from __future__ import annotations

import json
import torch

from vllm import _custom_ops as ops

from witcert_adapters.vllm_plugin.paged import CacheFormat, CacheLayout, cache_format, \
    dequantize, stored_elements
from witcert_adapters.vllm_plugin.quantizer import ROUNDING, engine_codes, float32_scale
from witcert_calculus.meters.formats import format_witness

D, KVH, BS = 64, 2, 128
SENTINEL = 0x55


def _write(keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor, kv: str,
           scale: float, blocks: int) -> torch.Tensor:
    cache = torch.full((blocks, KVH, BS, 2 * D), SENTINEL, dtype=torch.uint8)
    kc, vc = cache.view(blocks, KVH, 2 * BS, D).chunk(2, dim=2)
    ops.cpu_attn_reshape_and_cache(keys, values, kc, vc, slots, "vec", k_scale=scale,
                                   v_scale=scale, kv_cache_dtype=kv)
    return cache


def _elements(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # pad to whole tokens of KVH * D elements; one slot per token, in order
    per = KVH * D
    n = -(-x.numel() // per)
    flat = torch.zeros(n * per, dtype=x.dtype)
    flat[:x.numel()] = x
    return flat.view(n, KVH, D), torch.arange(n, dtype=torch.int64)


def _values_check(x: torch.Tensor, kv: str, scale: float) -> dict[str, int]:
    fmt = cache_format(kv).fp8
    assert fmt is not None
    keys, slots = _elements(x)
    values = keys.flip(0).contiguous()  # different elements in the values
    blocks = -(-int(slots.numel()) // BS)
    cache = _write(keys, values, slots, kv, scale, blocks)
    k = stored_elements([cache], slots, layout=CacheLayout.VEC, part=0)[0]
    v = stored_elements([cache], slots, layout=CacheLayout.VEC, part=1)[0]
    model_k = engine_codes(keys, scale=scale, fmt=fmt)
    model_v = engine_codes(values, scale=scale, fmt=fmt)
    # the format witness against the true residual: x - s q is exact in float64 here (both
    # have at most 28 significant bits, and a finite witness means they are within a step)
    finite = torch.isfinite(keys.float())
    q = dequantize(k.unsqueeze(0), fmt=cache_format(kv), scales=[scale])[0]
    w = torch.from_numpy(format_witness(k.numpy(), fmt=fmt, rounding=ROUNDING,
                                        scale=float32_scale(scale)))
    residual = (keys.double() - q).abs()
    over = finite & (residual > w)
    ratio = torch.where(finite & torch.isfinite(w), residual / w, 0.0)
    return {"elements": int(x.numel()),
            "key_bytes_differ": int((k != model_k).sum()),
            "value_bytes_differ": int((v != model_v).sum()),
            "witness_violations": int(over.sum()),
            "saturated_codes": int((~torch.isfinite(w)).sum()),
            "witness_max_ratio": float(ratio.max())}


def _layout_check(kv: str) -> dict[str, int]:
    fmt = cache_format(kv).fp8
    assert fmt is not None
    gen = torch.Generator().manual_seed(3)
    blocks = 4
    slots = torch.randperm(blocks * BS, generator=gen)[:300].sort().values
    keys = (4 * torch.randn(300, KVH, D, generator=gen)).to(torch.bfloat16)
    values = (4 * torch.randn(300, KVH, D, generator=gen)).to(torch.bfloat16)
    cache = _write(keys, values, slots, kv, 1.0, blocks)
    k = stored_elements([cache], slots, layout=CacheLayout.VEC, part=0)[0]
    v = stored_elements([cache], slots, layout=CacheLayout.VEC, part=1)[0]
    # the flat positions the reader reads, through its own views of an index tensor; every
    # other byte must still be the sentinel
    index = torch.arange(cache.numel(), dtype=torch.int64).view(cache.shape)
    read = torch.cat([stored_elements([index], slots, layout=CacheLayout.VEC, part=p)[0].flatten()
                      for p in (0, 1)])
    touched = torch.zeros(cache.numel(), dtype=torch.bool)
    touched[read] = True
    untouched = cache.view(-1)[~touched]
    return {"slots": int(slots.numel()),
            "key_bytes_differ": int((k != engine_codes(keys, scale=1.0, fmt=fmt)).sum()),
            "value_bytes_differ": int((v != engine_codes(values, scale=1.0, fmt=fmt)).sum()),
            "positions_read": int(touched.sum()),
            "expected_positions": int(read.numel()),
            "other_bytes_changed": int((untouched != SENTINEL).sum())}


def main() -> None:
    torch.set_num_threads(1)
    out: dict[str, object] = {}
    everything = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan")],
                           dtype=torch.bfloat16)
    finite = everything[torch.isfinite(everything.float())]
    out["finite_bf16"] = int(finite.numel())
    patterns = torch.cat([finite, special])
    for kv in ("fp8", "fp8_e5m2"):
        for scale in (1.0, 1 / 16, 0.1, 3.0, 1.7):
            out[f"{kv}@{scale}"] = _values_check(patterns, kv, scale)
        gen = torch.Generator().manual_seed(1)
        rand = torch.randn(2 ** 20, generator=gen) * torch.exp2(
            torch.randint(-30, 12, (2 ** 20,), generator=gen).float())
        out[f"{kv}@float32"] = _values_check(rand, kv, 1.7)
        out[f"{kv}@layout"] = _layout_check(kv)
    assert CacheFormat.FP8_E4M3.fp8 is not None
    print(json.dumps(out))


if __name__ == "__main__":
    main()
