"""Start-up checks of the vLLM plugin, run inside the engine's environment (.venv-vllm).

Run by tests/adapters/test_vllm_engine.py as a script; prints one JSON line of results.
Each check uses the installed vLLM itself: its version string, its classes' signatures,
its CPU attention implementation's constructor and its cache-writing kernel.
"""

from __future__ import annotations

import json
import os
import sys

import torch


def _error(fn) -> str:  # type: ignore[no-untyped-def]
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the message is the result
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def main() -> None:
    out: dict[str, object] = {}
    # With the switch off, registering attaches nothing and imports none of the hooks.
    os.environ.pop("WITCERT_VLLM", None)
    from witcert_adapters.vllm_plugin import register
    register()
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    out["off_backend"] = AttentionBackendEnum.CPU_ATTN.get_path()
    out["off_engine_imported"] = "witcert_adapters.vllm_plugin.engine" in sys.modules

    os.environ["WITCERT_VLLM"] = f"store={sys.argv[1]}"
    import vllm
    from vllm import _custom_ops as ops
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.v1.attention.backends import cpu_attn

    from witcert_adapters.vllm_plugin import engine
    from witcert_adapters.vllm_plugin.paged import CacheFormat, stored_keys

    out["as_installed"] = _error(engine.check_engine)
    real = vllm.__version__
    vllm.__version__ = "0.33.0"
    out["other_version"] = _error(engine.check_engine)
    vllm.__version__ = real
    original = cpu_attn.CPUAttentionBackendImpl.do_kv_cache_update

    def changed(self, layer, key, value, kv_cache, slot_mapping, kv_scales):  # type: ignore[no-untyped-def]
        return None

    cpu_attn.CPUAttentionBackendImpl.do_kv_cache_update = changed
    out["changed_hook"] = _error(engine.check_engine)
    cpu_attn.CPUAttentionBackendImpl.do_kv_cache_update = original

    def impl(**kw: object) -> object:
        args: dict[str, object] = dict(num_heads=4, head_size=64, scale=0.125, num_kv_heads=2,
                                       alibi_slopes=None, sliding_window=None,
                                       kv_cache_dtype="auto")
        args.update(kw)
        with set_current_vllm_config(VllmConfig()):
            return engine.WitcertCPUAttentionImpl(**args)

    out["sliding_window"] = _error(lambda: impl(sliding_window=64))
    out["soft_cap"] = _error(lambda: impl(logits_soft_cap=30.0))
    out["unknown_dtype"] = _error(lambda: impl(kv_cache_dtype="nvfp4"))

    # The engine's own cache-writing kernel, read back through the plugin's decode.
    nb, kvh, bs, d = 4, 2, 128, 64
    cache = torch.zeros(nb, kvh, bs, 2 * d, dtype=torch.bfloat16)
    kc, vc = cache.view(nb, kvh, 2 * bs, d).chunk(2, dim=2)
    slots = torch.tensor([5, 130, 511], dtype=torch.int64)
    key = torch.randn(3, kvh, d).to(torch.bfloat16)
    ops.cpu_attn_reshape_and_cache(key, torch.randn_like(key), kc, vc, slots, "vec",
                                   kv_cache_dtype="auto")
    back = stored_keys([cache], slots, fmt=CacheFormat.MODEL_DTYPE, k_scales=[1.0])[0]
    out["layout_exact"] = bool(torch.equal(back, key.double()))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
