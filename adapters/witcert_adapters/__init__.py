"""Adapters that read live witnesses from serving stacks (optional extras ``hf``, ``sglang``).

Main declarations (import the submodules; nothing heavy loads at package import):

- :mod:`witcert_adapters.schemes`: registry of KV compression schemes (one tensor function each).
- :mod:`witcert_adapters.architectures`: registry of memory layouts (dense GQA with RoPE,
  MLA latent) and how each layer's post-RoPE queries are recomputed.
- :mod:`witcert_adapters.hf`: :class:`~witcert_adapters.hf.WitnessCache` (a transformers
  ``DynamicCache`` subclass) and :class:`~witcert_adapters.hf.Probe` (read-side hooks).
- :mod:`witcert_adapters.gate`: the acceptance gate (coverage, magnitude, soundness).
- :mod:`witcert_adapters.readings`: typed readings and composed contracts per layer.
- :mod:`witcert_adapters.models`: offline SmolLM2 loading with a safetensors cache.
- :mod:`witcert_adapters.demo`: ``python -m witcert_adapters.demo --out DIR``.
"""
