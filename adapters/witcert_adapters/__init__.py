"""Adapters that read live witnesses from serving stacks (optional extras ``hf``, ``vllm``).

Main declarations (import the submodules; nothing heavy loads at package import):

- :mod:`witcert_adapters.runs`: memory kinds, probe paths and ``(layer, path)`` sites, and
  the protocols every probe and run satisfies (:class:`~witcert_adapters.runs.ProbeRun`,
  :class:`~witcert_adapters.runs.MemoryProbe`).
- :mod:`witcert_adapters.schemes`: registry of KV compression schemes (one tensor function each).
- :mod:`witcert_adapters.architectures`: registry of memory layouts (dense GQA with RoPE,
  MLA latent) and how each layer's post-RoPE queries are recomputed.
- :mod:`witcert_adapters.hf`: :class:`~witcert_adapters.hf.Probe` (read-side hooks) and
  :func:`~witcert_adapters.hf.attach`; the write path
  :class:`~witcert_adapters.witness_cache.WitnessCache` (a transformers ``DynamicCache``
  subclass), the per-layer steps (:mod:`witcert_adapters.layer_log`) and the run,
  :class:`~witcert_adapters.live_run.LiveRun`.
- :mod:`witcert_adapters.records`: the attention run's per-layer records.
- :mod:`witcert_adapters.gate`: the acceptance gate (coverage, magnitude, soundness).
- :mod:`witcert_adapters.readings`: typed readings and composed contracts per layer.
- :mod:`witcert_adapters.selector`, :mod:`witcert_adapters.recurrent`: the learned-selector
  and recurrent-state probes, their runs and gates.
- :mod:`witcert_adapters.memory`: one registry over the four memory classes.
- :mod:`witcert_adapters.demo`: an application, ``python -m witcert_adapters.demo --out DIR``
  (with its offline SmolLM2 loading in :mod:`witcert_adapters.demo.models`).
- :mod:`witcert_adapters.vllm_plugin`: the vLLM plugin that meters the engine's own KV cache
  while it serves (extra ``vllm``, in its own environment ``.venv-vllm``), and
  :mod:`witcert_adapters.vllm_demo`, ``python -m witcert_adapters.vllm_demo``.
"""
