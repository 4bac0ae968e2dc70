"""The eviction certificate's cost next to the press's own decode step, side by side in one run.

SmolLM2-135M (float32, eager attention, one CPU thread) prefills a prompt of ``--tokens``
tokens under a kvpress press at ``--ratio``, then decodes ``--steps`` tokens one step at a
time, in two modes, alternated round by round so that both see the same machine load:

- ``pressed``: the press alone (:func:`witcert_adapters.eviction.pressed`), transformers' eager
  attention over the compressed cache;
- ``grouped``: the press alone, with the meter's attention function unmetered (the same eager
  arithmetic, each key head's query heads as one group of rows; the meter's own cost is
  ``metered / grouped``);
- ``metered``: the same press under :func:`witcert_adapters.eviction.meter_press` (no audit, no
  gate): the witnesses written at the compression, and every decode step's attention metered
  for every (layer, query head) cell.

Only the decode steps are timed (the prefill and the compression happen once per request). The
median step time of each mode is printed with their ratio (the goal: at most 1.10).

Run: ``.venv/bin/python benchmarks/bench_eviction.py [--press KnormPress] [--ratio 0.5]
[--tokens 1024] [--steps 16] [--rounds 5]``
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Generator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import torch
from transformers import DynamicCache

from witcert_adapters.demo.models import load_smollm2
from witcert_adapters.eviction import meter_press, pressed


def decode_times(model: Any, ids: torch.Tensor, steps: int,
                 mode: Callable[[], AbstractContextManager[Any]]) -> list[float]:
    """Prefill under ``mode``, then ``steps`` greedy decode steps; each step's seconds."""
    n = int(ids.shape[1])
    times: list[float] = []
    with mode(), torch.no_grad():
        cache = DynamicCache(config=model.config)
        out = model(ids, cache=cache, use_cache=True, position_ids=torch.arange(n)[None])
        nxt = out.logits[:, -1:].argmax(-1)
        for i in range(steps):
            began = time.perf_counter()
            out = model(nxt, cache=cache, use_cache=True, position_ids=torch.tensor([[n + i]]))
            nxt = out.logits[:, -1:].argmax(-1)
            times.append(time.perf_counter() - began)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--press", default="KnormPress")
    parser.add_argument("--ratio", type=float, default=0.5)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    import kvpress

    model, _ = load_smollm2()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 40000, (1, args.tokens), generator=g)

    def press() -> Any:
        return getattr(kvpress, args.press)(compression_ratio=args.ratio)

    @contextmanager
    def grouped() -> Generator[None, None, None]:
        # the meter's attention function with no run attached: attention only
        from witcert_adapters.eviction import ATTENTION, register_attention

        register_attention()
        before = model.config._attn_implementation
        model.config._attn_implementation = ATTENTION
        try:
            with pressed(model, press()):
                yield
        finally:
            model.config._attn_implementation = before

    modes: dict[str, Callable[[], AbstractContextManager[Any]]] = {
        "pressed": lambda: pressed(model, press()),
        "grouped": grouped,
        "metered": lambda: meter_press(model, press()),
    }
    times: dict[str, list[float]] = {name: [] for name in modes}
    for mode in modes.values():  # warm every path once
        decode_times(model, ids[:, :128], 2, mode)
    for _ in range(args.rounds):
        for name, mode in modes.items():
            times[name] += decode_times(model, ids, args.steps, mode)
    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"{args.press} at ratio {args.ratio}, {args.tokens} prompt tokens, "
          f"{args.rounds} rounds x {args.steps} decode steps per mode (one CPU thread)")
    for name, m in med.items():
        print(f"  {name:<8} median decode step {m * 1e3:8.2f} ms")
    print(f"  ratio metered / pressed: {med['metered'] / med['pressed']:.3f}")
    print(f"  ratio metered / grouped (the meter alone): {med['metered'] / med['grouped']:.3f}")


if __name__ == "__main__":
    main()
