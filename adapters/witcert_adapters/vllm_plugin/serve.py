"""Start vLLM's OpenAI-compatible server with the plugin's endpoint allowed.

``python -m witcert_adapters.vllm_plugin.serve [vLLM server arguments]`` runs vLLM's own
``vllm.entrypoints.openai.api_server`` (``vllm serve`` looks up a distribution named
``vllm``, which vLLM's CPU build is not) after making sure ``VLLM_PLUGINS`` allows the
``witcert`` plugins: vLLM loads endpoint plugins only when that variable names them. The
plugin itself is switched by ``WITCERT_VLLM`` as always.
"""

from __future__ import annotations

import os
import runpy


def main() -> None:
    """Allow the plugin, then run vLLM's server module as ``__main__``."""
    allowed = [p for p in os.environ.get("VLLM_PLUGINS", "").split(",") if p]
    if "witcert" not in allowed:
        os.environ["VLLM_PLUGINS"] = ",".join([*allowed, "witcert"])
    runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__",
                     alter_sys=True)


if __name__ == "__main__":
    main()
