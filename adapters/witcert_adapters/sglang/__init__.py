"""An SGLang adapter that meters inside SGLang's own decode kernels and KV pools.

Installed by anchored source edits of the SGLang files (:mod:`.installer`), switched on by one
environment variable, ``WITCERT_SGLANG`` (:mod:`.config`), read once per process. With it
off the patched kernels run their upstream specialisation. The KV pools write band
witnesses beside the keys (:func:`.runtime.write_keys`); stage 1 of SGLang's MHA and grouped
decode kernels and its extend (prefill) kernel accumulate the Tier-A meter
(:mod:`.triton_meter`); the split partials merge
on the host into bounds, and the step's readings go into the same ledger accounts as the
vLLM plugin's (:class:`.runtime.Recorder`).

Main declarations
-----------------
- :func:`install`, :func:`installed`, :class:`SGLangConfig`, :class:`Recorder`,
  :func:`metering`.
"""

from __future__ import annotations

from witcert_adapters.sglang.config import SGLangConfig
from witcert_adapters.sglang.installer import install, installed
from witcert_adapters.sglang.runtime import Recorder, metering

__all__ = ["Recorder", "SGLangConfig", "install", "installed", "metering"]
