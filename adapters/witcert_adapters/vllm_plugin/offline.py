# pyright: reportMissingImports=false, reportUnknownMemberType=false, reportUnknownVariableType=false, reportUnknownArgumentType=false
"""Offline generation through vLLM (``LLM.generate``) with the plugin, as one JSON record.

Run in the engine's environment (``.venv-vllm``), one engine per process, because the
switch is read once per process::

    WITCERT_VLLM=store=/tmp/v.sqlite,audit=1 .venv-vllm/bin/python -m \\
        witcert_adapters.vllm_plugin.offline --model DIR --kv auto --out run.json \\
        --prompts-json '["The capital of France is"]' --max-tokens 16

It writes the prompts' token ids, text and timings, and (switch on) every request's
verdict; the tests, the demo and the benchmark all drive the engine through it. With
``--score-file`` (a JSON file: a list of ``[prompt, continuation]`` pairs) it also scores each
continuation (text, or a list of token ids taken as they are) teacher-forced: the engine returns the full next-token distribution of every
continuation token (one request per continuation token, sampling one token with ``logprobs=-1``; with
``--prefix-caching`` the prompt's blocks are computed once); the distributions go to
``--scores-out`` (an ``.npz`` of one ``[tokens, vocab]`` float32 array per item) and each
item's prompt length, token ids and timing to the record. With ``--step-prompt-tokens N``
the timed batteries are stepped one engine step at a time instead (prompts of ``N`` token
ids each, distinct per sequence), and the record's ``steps`` holds each run's wall time,
prefill time and every decode step's latency (the steps after every sequence has its first
token). ``--turns FILE --turn NAME --next NAME`` runs those batteries in turns with another
engine process (a benchmark's side-by-side pair): before each run this one waits until
``FILE`` holds its own name, and after it writes the other's.

Main declarations
-----------------
- :func:`main`; :func:`settle_verdicts` (also what :mod:`.path_run` collects its verdicts with).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


__all__ = ["main", "settle_verdicts"]


def _run(args: argparse.Namespace) -> dict[str, Any]:
    from vllm import LLM, SamplingParams

    from witcert_adapters.vllm_plugin.config import active
    t0 = time.perf_counter()
    llm = LLM(model=args.model, dtype="bfloat16", kv_cache_dtype=args.kv,
              enforce_eager=not args.compile, max_model_len=args.max_model_len,
              max_num_seqs=args.max_num_seqs, seed=0,
              max_num_batched_tokens=args.max_num_batched_tokens,
              enable_chunked_prefill=True, enable_prefix_caching=args.prefix_caching,
              max_logprobs=-1 if args.score_file else 20, logprobs_mode="raw_logprobs")
    started = time.perf_counter() - t0
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True,
                            logprobs=1)
    prompts: list[str] = json.loads(args.prompts_json)
    timings: dict[str, list[float]] = {}
    # Timed batteries first (the first `b` prompts, `repeat` times each), then the recorded
    # generation of every prompt.
    steps: dict[str, list[dict[str, Any]]] = {}
    for b in [int(x) for x in args.batch_sizes.split(",") if x]:
        if args.step_prompt_tokens:
            steps[str(b)] = _stepped(llm, b, args.step_prompt_tokens, params, args.repeat,
                                     turns=(args.turns, args.turn, args.next))
            timings[str(b)] = [run["wall_s"] for run in steps[str(b)]]
            continue
        llm.generate(prompts[:b], params, use_tqdm=False)  # warm-up
        for _ in range(args.repeat):
            t1 = time.perf_counter()
            llm.generate(prompts[:b], params, use_tqdm=False)
            timings.setdefault(str(b), []).append(time.perf_counter() - t1)
    scored = _score(llm, json.loads(args.score_file.read_text()), args.scores_out) \
        if args.score_file else None
    outputs = llm.generate(prompts, params, use_tqdm=False)
    record: dict[str, Any] = {
        "startup_s": started, "generate_s": timings, "steps": steps,
        "requests": [{"request_id": o.request_id, "text": o.outputs[0].text,
                      "token_ids": list(o.outputs[0].token_ids),
                      "logprobs": [float(next(iter(lp.values())).logprob)
                                   for lp in (o.outputs[0].logprobs or [])]}
                     for o in outputs]}
    if scored is not None:
        record["scored"] = scored
    config = active()
    if config is not None:
        ids = [r["request_id"] for r in record["requests"]] + \
            [i for r in record.get("scored", []) for i in r["request_ids"]]
        record["verdicts"], late = settle_verdicts(llm, config.store, ids)
        if late is not None:
            raise TimeoutError(late)
    return record


def settle_verdicts(llm: Any, store: Path, ids: Sequence[str], *, timeout: float = 60.0
                    ) -> tuple[list[dict[str, Any]], str | None]:
    """Every verdict the store holds once ``ids`` have theirs, and ``None``; or, when some
    still have none after ``timeout`` seconds, the verdicts there are and the wait's message
    (naming them).

    The engine writes a request's verdict one step after it finished: one more tiny request
    makes that step happen, then the verdicts are awaited.
    """
    from vllm import SamplingParams

    from witcert_adapters.vllm_plugin.store import VerdictStore

    llm.generate(["."], SamplingParams(max_tokens=1), use_tqdm=False)
    verdicts = VerdictStore(store)
    late = None
    try:
        verdicts.wait(list(ids), timeout=timeout)
    except TimeoutError as exc:
        late = str(exc)
    return [v.to_json() for v in verdicts.all()], late


def _stepped(llm: Any, b: int, prompt_tokens: int, params: Any, repeat: int, *,
             turns: tuple[Path | None, str, str]) -> list[dict[str, Any]]:
    # b sequences of prompt_tokens distinct token ids each, stepped by hand: a warm-up run,
    # then `repeat` timed runs, each: wall, prefill (until every sequence has a token) and
    # every decode step's latency; each run in this engine's turn (when turns are given).
    from vllm import TokensPrompt

    engine = llm.llm_engine
    vocab = int(engine.model_config.get_vocab_size())
    runs: list[dict[str, Any]] = []
    board, mine, other = turns
    for rep in range(repeat + 1):
        deadline = time.monotonic() + 3600.0
        while board is not None and (turn := board.read_text().strip()) != mine:
            if turn == "stopped":
                raise SystemExit(f"--turns: the other engine ({other!r}) stopped")
            if time.monotonic() > deadline:
                raise SystemExit(f"--turns: no turn for {mine!r} in an hour (the other engine "
                                 "stopped?)")
            time.sleep(0.01)
        for i in range(b):
            ids = [(1000 + 7919 * (i + 1) * (k + 1) + 31 * rep) % (vocab - 1000) + 500
                   for k in range(prompt_tokens)]
            engine.add_request(f"step-{b}-{rep}-{i}", TokensPrompt(prompt_token_ids=ids),
                               params)
        started: set[str] = set()
        decode: list[float] = []
        t0 = time.perf_counter()
        prefill = None
        while engine.has_unfinished_requests():
            t1 = time.perf_counter()
            outputs = engine.step()
            dt = time.perf_counter() - t1
            if prefill is None:
                started.update(o.request_id for o in outputs if o.outputs and
                               o.outputs[0].token_ids)
                if len(started) == b:
                    prefill = time.perf_counter() - t0
            else:
                decode.append(dt)
        if rep:
            runs.append({"wall_s": time.perf_counter() - t0, "prefill_s": prefill,
                         "decode_step_s": decode})
        if board is not None:
            board.write_text(other)
    return runs


def _score(llm: Any, pairs: list[list[Any]], out: Path | None) -> list[dict[str, Any]]:
    # Teacher-forced scoring: for each item and each continuation token k, one request of
    # the prompt and the first k continuation tokens that samples one token with every
    # logprob (its full next-token distribution, raw). Requests go in waves by k, so with
    # prefix caching each wave reuses the blocks the previous one cached.
    import numpy as np
    from vllm import SamplingParams, TokensPrompt

    if out is None:
        raise SystemExit("--score-file needs --scores-out")
    tok = llm.get_tokenizer()
    vocab = int(llm.llm_engine.model_config.get_vocab_size())
    heads, fulls = [], []
    for prompt, continuation in pairs:
        head = tok(prompt).input_ids
        if isinstance(continuation, list):      # token ids, scored exactly as given
            full = head + [int(t) for t in continuation]
        else:
            full = tok(prompt + continuation).input_ids
        if full[:len(head)] != head:
            raise SystemExit(f"continuation {continuation!r} does not tokenize as a suffix")
        heads.append(head)
        fulls.append(full)
    params = SamplingParams(temperature=0.0, max_tokens=1, logprobs=-1, detokenize=False,
                            flat_logprobs=True)
    rows: list[list[Any]] = [[] for _ in pairs]
    ids: list[list[str]] = [[] for _ in pairs]
    t0 = time.perf_counter()
    for k in range(max(len(f) - len(h) for h, f in zip(heads, fulls, strict=True))):
        wave = [i for i, (h, f) in enumerate(zip(heads, fulls, strict=True))
                if len(h) + k < len(f)]
        outputs = llm.generate([TokensPrompt(prompt_token_ids=fulls[i][:len(heads[i]) + k])
                                for i in wave], params, use_tqdm=False)
        for i, o in zip(wave, outputs, strict=True):
            flat = o.outputs[0].logprobs
            a, b = flat.start_indices[0], flat.end_indices[0]
            dense = np.full(vocab, -np.inf, dtype=np.float32)
            dense[np.asarray(flat.token_ids[a:b])] = np.asarray(flat.logprobs[a:b])
            rows[i].append(dense)
            ids[i].append(o.request_id)
    wall = time.perf_counter() - t0
    arrays: dict[str, Any] = {f"item{i}": np.stack(r) for i, r in enumerate(rows)}
    np.savez(out, **arrays)
    return [{"request_ids": ids[i], "prompt_tokens": len(h), "token_ids": f[len(h):],
             "wall_s": wall / len(pairs)} for i, (h, f) in enumerate(zip(heads, fulls,
                                                                        strict=True))]


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the arguments, generate, write the JSON record."""
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--model", required=True, help="model folder (safetensors + config)")
    p.add_argument("--kv", default="auto", help="vLLM kv_cache_dtype (auto, fp8, ...)")
    p.add_argument("--prompts-json", required=True, help="JSON list of prompts")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--batch-sizes", default="", help="timed batteries: comma-separated counts "
                   "of prompts, each generated --repeat times (e.g. 1,8)")
    p.add_argument("--repeat", type=int, default=3, help="timed repetitions per battery")
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--max-num-batched-tokens", type=int, default=1024)
    p.add_argument("--prefix-caching", action="store_true")
    p.add_argument("--step-prompt-tokens", type=int, default=0,
                   help="step the timed batteries by hand, prompts of this many tokens")
    p.add_argument("--turns", type=Path, help="a file naming whose turn it is to run")
    p.add_argument("--turn", default="", help="this engine's name in --turns")
    p.add_argument("--next", default="", help="the other engine's name in --turns")
    p.add_argument("--compile", action="store_true", help="torch.compile (default: eager)")
    p.add_argument("--score-file", type=Path,
                   help="a JSON file: a list of [prompt, continuation] pairs to score")
    p.add_argument("--scores-out", type=Path, help="the .npz the scored distributions go to")
    p.add_argument("--out", required=True, type=Path)
    args = p.parse_args(argv)
    args.out.write_text(json.dumps(_run(args), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
