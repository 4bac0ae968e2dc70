# pyright: reportMissingImports=false, reportUnknownMemberType=false, reportUnknownVariableType=false, reportUnknownArgumentType=false, reportAttributeAccessIssue=false
"""The diagnosis campaign's planted fault: KV blocks freed by preemption come back corrupted.

Never on a default path: only :mod:`witcert_adapters.campaign` puts this folder on an engine
process's ``PYTHONPATH`` (Python imports ``sitecustomize`` at start-up), and only for the arms
whose ``fault`` knob is ``planted``; the switch is the variable :data:`ENV` naming a file
that the processes of one engine share.

The fault, in one structural regime only: when vLLM's scheduler preempts a request, the blocks
its release returns to the free pool (reference count 0) are recorded in that file; before
every model step, the key half of every recorded block in every layer's cache gets its sign
bits set (fp8 and 16-bit caches alike), as a late copy or a stale transfer landing on a
reused block would. Blocks never freed by a preemption are untouched, so a run without
preemption is exactly the fault-free engine.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

ENV = "WITCERT_PLANTED_FAULT"

_preempting = [False]


def _record(blocks: list[int]) -> None:
    with open(os.environ[ENV], "a") as f:
        f.write("".join(f"{b}\n" for b in blocks))


def _poisoned() -> list[int]:
    try:
        with open(os.environ[ENV]) as f:
            return sorted({int(line) for line in f if line.strip()})
    except FileNotFoundError:
        return []


def _patch_scheduler(module: ModuleType) -> None:
    cls = module.Scheduler
    original = cls._preempt_request

    @functools.wraps(original)
    def _preempt_request(self: Any, *args: Any, **kwargs: Any) -> Any:
        _preempting[0] = True
        try:
            return original(self, *args, **kwargs)
        finally:
            _preempting[0] = False

    cls._preempt_request = _preempt_request


def _patch_pool(module: ModuleType) -> None:
    cls = module.BlockPool
    original = cls.free_blocks

    @functools.wraps(original)
    def free_blocks(self: Any, ordered_blocks: Any) -> Any:
        blocks = list(ordered_blocks)
        out = original(self, blocks)
        if _preempting[0]:
            _record([int(b.block_id) for b in blocks if b.ref_cnt == 0 and not b.is_null])
        return out

    cls.free_blocks = free_blocks


def _corrupt(caches: Sequence[Any], blocks: list[int]) -> None:
    import torch

    for cache in caches:
        if cache is None or cache.dim() != 4:
            continue
        nb, kvh, bs, two_d = cache.shape
        ids = torch.tensor([b for b in blocks if b < nb], dtype=torch.long)
        if ids.numel() == 0:
            continue
        # the keys are the first half of each (block, kv head)'s elements
        flat = cache.view(nb, kvh, bs * two_d)
        keys = flat[ids, :, : bs * two_d // 2]
        if cache.element_size() == 1:
            bits = keys.view(torch.uint8) | 0x80
            flat[ids, :, : bs * two_d // 2] = bits.view(cache.dtype)
        else:
            bits = keys.view(torch.int16) | torch.tensor(-32768, dtype=torch.int16)
            flat[ids, :, : bs * two_d // 2] = bits.view(cache.dtype)


def _patch_runner(module: ModuleType) -> None:
    cls = module.GPUModelRunner
    original = cls.execute_model

    @functools.wraps(original)
    def execute_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        blocks = _poisoned()
        if blocks and getattr(self, "kv_caches", None):
            _corrupt(self.kv_caches, blocks)
        return original(self, *args, **kwargs)

    cls.execute_model = execute_model


_TARGETS: dict[str, Callable[[ModuleType], None]] = {
    "vllm.v1.core.sched.scheduler": _patch_scheduler,
    "vllm.v1.core.block_pool": _patch_pool,
    "vllm.v1.worker.gpu_model_runner": _patch_runner,
}


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: Any, patch: Callable[[ModuleType], None]) -> None:
        self.inner = inner
        self.patch = patch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        self.patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None
                  ) -> importlib.machinery.ModuleSpec | None:
        patch = _TARGETS.get(fullname)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader, patch)
                return spec
        return None


if os.environ.get(ENV):
    sys.meta_path.insert(0, _Finder())
