"""Tiny random-initialised models for the adapter tests (no download)."""

from __future__ import annotations

from typing import Any

import torch
import transformers

torch.set_num_threads(1)

_COMMON = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
               num_attention_heads=4, max_position_embeddings=128)
_MLA = dict(kv_lora_rank=32, q_lora_rank=None, qk_rope_head_dim=16, qk_nope_head_dim=16,
            v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
            moe_intermediate_size=32, first_k_dense_replace=1, num_key_value_heads=4)


def tiny_config(name: str) -> Any:
    """A tiny config of the named family."""
    if name == "llama":
        return transformers.LlamaConfig(num_key_value_heads=2, **_COMMON)
    if name == "qwen2":
        return transformers.Qwen2Config(num_key_value_heads=2, **_COMMON)
    if name == "deepseek_v2":
        return transformers.DeepseekV2Config(**_COMMON, **_MLA)
    if name == "deepseek_v3":
        return transformers.DeepseekV3Config(**_COMMON, **_MLA, n_group=1, topk_group=1)
    raise KeyError(name)


def tiny_model(name: str, *, seed: int = 0) -> Any:
    """A tiny random-initialised causal LM in eval mode with eager attention."""
    torch.manual_seed(seed)
    cfg = tiny_config(name)
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()


def run_probe(model: Any, probe: Any, ids: Any, decode_steps: int) -> int:
    """Prefill ``ids`` then teacher-force ``decode_steps`` more tokens; return tokens processed."""
    cache = probe.new_cache()
    with torch.no_grad():
        model(ids, cache=cache, use_cache=True)
        for t in range(decode_steps):
            model(ids[:, t:t + 1], cache=cache, use_cache=True)
    return int(ids.shape[1]) + decode_steps


def mamba2() -> Any:
    torch.manual_seed(0)
    cfg = transformers.Mamba2Config(vocab_size=97, hidden_size=64, num_hidden_layers=2, num_heads=8,
                                    head_dim=16, state_size=16, n_groups=1, expand=2, chunk_size=8)
    return transformers.AutoModelForCausalLM.from_config(cfg).eval()


def v32() -> Any:
    torch.manual_seed(0)
    cfg = transformers.DeepseekV32Config(
        vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=128, kv_lora_rank=32, q_lora_rank=32,
        qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=4,
        num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=32, first_k_dense_replace=1,
        num_key_value_heads=4, n_group=1, topk_group=1, index_topk=4, index_head_dim=32,
        index_n_heads=4)
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()


_SMALL = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, max_position_embeddings=128)


def qwen3_next() -> Any:
    torch.manual_seed(0)
    cfg = transformers.Qwen3NextConfig(
        **_SMALL, num_key_value_heads=2, head_dim=16, layer_types=["linear_attention", "full_attention"],
        linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_num_key_heads=2, linear_num_value_heads=4, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, shared_expert_intermediate_size=32, decoder_sparse_step=1)
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()


def kimi_linear() -> Any:
    torch.manual_seed(0)
    cfg = transformers.KimiLinearConfig(
        **_SMALL, num_key_value_heads=4, kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=8,
        v_head_dim=16, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        layer_types=["linear_attention", "full_attention"], linear_head_dim=16, linear_num_heads=4,
        linear_conv_kernel_dim=4)
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
