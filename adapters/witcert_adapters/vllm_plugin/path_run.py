# pyright: reportMissingImports=false, reportUnknownMemberType=false, reportUnknownVariableType=false, reportUnknownArgumentType=false
"""One serving path of vLLM's engine, driven step by step, as one JSON record.

Run in the engine's environment (``.venv-vllm``), one engine per process (the switch is read
once per process); :func:`witcert_adapters.paths.run_path` starts it twice per path, with the
plugin on (audit on) and off, and merges the two records into the path's artifact::

    WITCERT_VLLM=store=/tmp/v.sqlite,audit=1 .venv-vllm/bin/python -m \\
        witcert_adapters.vllm_plugin.path_run --spec spec.json --model DIR --out run.json

The spec (:class:`witcert_adapters.paths.ServingPath`, as JSON) gives the engine's settings
and the requests: their prompts, how many are in flight at once, ``n`` samples each, a
request to abort after some steps and whose id is then served again. The record holds the
engine's version and settings, every request's token ids in the order of the spec, the
engine's own counters (preemptions, prefix-cache hits, from ``LLM.get_metrics``), the
requests aborted, and (switch on) every verdict the store holds once the engine has finished.
An engine that refuses the path (an error at start-up, or while serving) writes the error
instead, so the path's verdict names it.

Main declarations
-----------------
- :func:`main`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["main"]


def _metrics(llm: Any) -> dict[str, float]:
    out: dict[str, float] = {}
    for m in llm.get_metrics():
        value = getattr(m, "value", None)
        if isinstance(value, (int, float)):
            out[m.name] = out.get(m.name, 0.0) + float(value)
    return out


def _serve(llm: Any, spec: dict[str, Any]) -> dict[str, Any]:
    """Serve the spec's requests, at most ``in_flight`` at once; abort one after some steps
    and serve its id again from the start (a client that disconnected and retried)."""
    from vllm import SamplingParams

    engine = llm.llm_engine
    prompts: list[str] = spec["prompts"]
    n = int(spec["n"])
    params = SamplingParams(temperature=0.0 if n == 1 else 0.8, n=n, seed=int(spec["seed"]),
                            max_tokens=int(spec["max_tokens"]), ignore_eos=True)
    waiting = [(f"{spec['name']}-{i}", p) for i, p in enumerate(prompts)]
    live: set[str] = set()
    outputs: dict[str, list[list[int]]] = {}
    completions: dict[str, dict[int, list[int]]] = {}
    aborted: list[str] = []
    abort = spec.get("abort")
    steps = 0
    t0 = time.perf_counter()
    while waiting or live:
        while waiting and len(live) < int(spec["in_flight"]):
            rid, prompt = waiting.pop(0)
            engine.add_request(rid, prompt, params)
            live.add(rid)
        for out in engine.step():
            if out.request_id not in live:
                continue
            # each step's output holds the samples that moved (cumulative token ids each)
            samples = completions.setdefault(out.request_id, {})
            for c in out.outputs:
                samples[int(c.index)] = list(c.token_ids)
            if out.finished:
                outputs[out.request_id] = [samples[k] for k in sorted(samples)]
                live.discard(out.request_id)
        steps += 1
        if abort is not None and steps == int(abort["after_steps"]):
            rid = f"{spec['name']}-{abort['index']}"
            if rid not in live:
                raise RuntimeError(f"request {rid} was not in flight at step {steps}")
            engine.abort_request([rid])
            live.discard(rid)
            completions.pop(rid, None)
            aborted.append(rid)
            waiting.insert(0, (rid, prompts[int(abort["index"])]))  # the same id, again
    return {"wall_s": time.perf_counter() - t0, "steps": steps,
            "outputs": {f"{spec['name']}-{i}": outputs[f"{spec['name']}-{i}"]
                        for i in range(len(prompts))},
            "aborted": aborted}


def _run(args: argparse.Namespace) -> dict[str, Any]:
    import vllm
    from vllm import LLM

    from witcert_adapters.vllm_plugin.config import active

    spec: dict[str, Any] = json.loads(args.spec.read_text())
    record: dict[str, Any] = {"engine": {"name": "vllm", "version": vllm.__version__},
                              "spec": spec, "plugin": active() is not None}
    t0 = time.perf_counter()
    try:
        llm = LLM(model=str(args.model), dtype="bfloat16", enforce_eager=True, seed=0,
                  disable_log_stats=False, **spec["engine"])
    except Exception as exc:  # the engine (or the plugin in it) refused the path
        record["refused"] = f"{type(exc).__name__}: {exc}"[:2000]
        record["trace"] = traceback.format_exc()[-4000:]
        return record
    record["startup_s"] = time.perf_counter() - t0
    hf = llm.llm_engine.model_config.hf_config
    record["model"] = {"layers": int(hf.num_hidden_layers), "heads": int(hf.num_attention_heads)}
    try:
        served = _serve(llm, spec)
    except Exception as exc:
        record["refused"] = f"while serving: {type(exc).__name__}: {exc}"[:2000]
        record["trace"] = traceback.format_exc()[-4000:]
        return record
    record.update(served)
    record["counters"] = _metrics(llm)
    config = active()
    if config is not None:
        from witcert_adapters.vllm_plugin.offline import settle_verdicts

        # n > 1 samples are child requests "k_<id>", each with its own verdict
        n = int(spec["n"])
        ids = [r if n == 1 else f"{k}_{r}" for r in served["outputs"] for k in range(n)]
        record["verdicts"], late = settle_verdicts(llm, config.store, ids)
        if late is not None:  # the judge sees which requests have none
            record["verdict_wait"] = late
    return record


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the arguments, serve the path, write the JSON record."""
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--spec", required=True, type=Path, help="the path's spec (JSON)")
    p.add_argument("--model", required=True, type=Path, help="model folder")
    p.add_argument("--out", required=True, type=Path)
    args = p.parse_args(argv)
    args.out.write_text(json.dumps(_run(args), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
