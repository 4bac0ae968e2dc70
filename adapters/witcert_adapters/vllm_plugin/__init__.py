"""A vLLM plugin that meters the engine's own KV cache while it serves (extra ``vllm``).

Switched on by one environment variable, ``WITCERT_VLLM`` (:mod:`.config`), read once per
process; with it unset nothing of the plugin runs and vLLM is untouched. Two entry points,
both named ``witcert``:

- ``vllm.general_plugins`` -> :func:`register`: in every vLLM process, when the switch is
  on, checks the engine and re-points the CPU attention backend, or on GPUs the Triton
  backend (:mod:`.engine`);
- ``vllm.endpoint_plugins`` -> :func:`endpoint`: in the API server, the side endpoint
  ``GET /witcert/verdicts/{request_id}`` and the ``witcert_`` Prometheus metrics next to
  vLLM's ``/metrics`` (:mod:`.server`). vLLM loads endpoint plugins only when
  ``VLLM_PLUGINS`` names them (``VLLM_PLUGINS=witcert``); ``python -m
  witcert_adapters.vllm_plugin.serve`` sets both variables and starts vLLM's server.

Modules: :mod:`.config` (the switch), :mod:`.paged` (the paged cache and a step's rows),
:mod:`.witnesses` (the side buffer with generations), :mod:`.meter` (a step metered at
once), :mod:`.verdicts` (ledger accounts, gate, verdicts), :mod:`.store` (the SQLite
verdict store), :mod:`.engine` (the hooks), :mod:`.unified` (vLLM's own
``unified_attention`` with the meter, built in memory from anchored edits), :mod:`.triton_path`
(the Triton backend's route and accounting, on GPUs), :mod:`.server` (endpoint and metrics),
:mod:`.serve` (the launcher).

Main declarations
-----------------
- :func:`register`, :func:`endpoint`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["endpoint", "register"]


def register() -> None:
    """The ``vllm.general_plugins`` entry point: attach when the switch is on, else nothing.

    Raises:
        EngineMismatchError: the switch is on and the engine is not one the plugin supports.
        InvalidValueError: the switch is malformed.
    """
    from witcert_adapters.vllm_plugin.config import active
    if active() is None:
        return
    from witcert_adapters.vllm_plugin.engine import attach
    attach()


def endpoint() -> Any:
    """The ``vllm.endpoint_plugins`` entry point: the verdict endpoint and metrics."""
    from witcert_adapters.vllm_plugin.server import VerdictEndpoint
    return VerdictEndpoint()
