"""The live plugin, shown: vLLM serves SmolLM2 with its KV cache metered, per-request verdicts.

``python -m witcert_adapters.vllm_demo [--out FILE]`` starts vLLM's OpenAI-compatible
server (CPU build, in ``.venv-vllm``) three times with the plugin switched on and audited:
a bfloat16 cache (the model's own dtype), vLLM's fp8 (e4m3) cache metered, and the same fp8
cache with the gate that repairs (:mod:`witcert_adapters.vllm_plugin.repair`). Each server
gets a short battery of completion and chat requests and the retrieval battery (key-value
needles among filler, answered greedily); the demo reads each request's verdict from the
side endpoint ``/witcert/verdicts/{id}`` and the ``witcert_`` metrics from ``/metrics``,
stops the server, and prints the three side by side: verdict, coverage, worst cell, audited
violations, repaired cells and page-in fraction, and the retrieval result.

Main declarations
-----------------
- :func:`serve_battery`: one server, the battery, the verdicts and metrics.
- :func:`report`: the side-by-side text; :func:`main`.
- :data:`BATTERY`, :data:`SERVED`, :func:`demo_retrieval`.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, final

from witcert_adapters.demo.models import smollm2_engine_dir
from witcert_adapters.demo.repair import RetrievalItem, retrieval_battery
from witcert_adapters.vllm_plugin.config import PluginConfig
from witcert_adapters.vllm_plugin.launch import Server

__all__ = ["BATTERY", "SERVED", "Served", "demo_retrieval", "main", "report", "serve_battery"]

TAU: Final = 0.1
MAX_TOKENS: Final = 16
BATTERY: Final = (
    ("completion", "The capital of France is"),
    ("completion", "def fibonacci(n):"),
    ("chat", "Name three colours of the rainbow."),
    ("chat", "What is two plus two?"),
)
"""The requests sent: ``(kind, prompt)``."""

SERVED: Final = (("bf16", "auto", False), ("fp8", "fp8", False), ("fp8+repair", "fp8", True))
"""The three servers: ``(name, kv_cache_dtype, repair)``."""

RETRIEVAL_ITEMS: Final = 4
RETRIEVAL_FACTS: Final = 4
RETRIEVAL_FILLER: Final = 6
MAX_MODEL_LEN: Final = 1024


def demo_retrieval() -> tuple[RetrievalItem, ...]:
    """The retrieval items the demo asks: the battery's first items, 4 needles among 6
    filler sentences each (about 300 tokens; every prefill row is metered, which costs far
    more than the engine's own attention, so the demo keeps its prompts short, and
    ``benchmarks/bench_vllm_fp8.py repair`` measures longer contexts)."""
    return retrieval_battery(items=RETRIEVAL_ITEMS, facts=RETRIEVAL_FACTS,
                             filler=RETRIEVAL_FILLER)


@final
@dataclass(frozen=True, slots=True)
class Served:
    """One server's battery.

    Attributes:
        name: ``bf16``, ``fp8`` or ``fp8+repair``; ``kv_cache_dtype``: the cache served.
        texts: each request's generated text; ``response_ids``: the ids in the responses.
        verdicts: each request's verdict (JSON), fetched by the id the client sent
            (``X-Request-Id``); ``by_response_id``: the same verdicts, by the response's id.
        answers: each retrieval item's greedy answer; ``hits``: which were right.
        retrieval_verdicts: the retrieval requests' verdicts.
        metrics: the ``witcert_`` lines of ``/metrics``; ``vllm_metrics``: how many of
            vLLM's own metric lines the same page held.
    """

    name: str
    kv_cache_dtype: str
    texts: tuple[str, ...]
    response_ids: tuple[str, ...]
    verdicts: tuple[dict[str, Any], ...]
    by_response_id: tuple[dict[str, Any], ...]
    answers: tuple[str, ...]
    hits: tuple[bool, ...]
    retrieval_verdicts: tuple[dict[str, Any], ...]
    metrics: tuple[str, ...]
    vllm_metrics: int


def _send(server: Server, kind: str, prompt: str, request_id: str,
          max_tokens: int = MAX_TOKENS) -> tuple[str, str]:
    headers = {"X-Request-Id": request_id}
    if kind == "chat":
        status, body = server.request("/v1/chat/completions", {
            "model": "smollm2", "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "temperature": 0.0}, headers=headers)
        text = body["choices"][0]["message"]["content"] if status == 200 else ""
    else:
        status, body = server.request("/v1/completions", {
            "model": "smollm2", "prompt": prompt, "max_tokens": max_tokens,
            "temperature": 0.0}, headers=headers)
        text = body["choices"][0]["text"] if status == 200 else ""
    if status != 200:
        raise RuntimeError(f"{kind} request failed with {status}: {body}")
    return str(text), str(body["id"])


def serve_battery(name: str, kv: str, *, model: Path, folder: Path, repair: bool = False,
                  battery: Sequence[tuple[str, str]] = BATTERY,
                  retrieval: Sequence[RetrievalItem] = ()) -> Served:
    """Start one audited server, send the battery and the retrieval items, collect verdicts
    and metrics.

    Raises:
        RuntimeError: the server failed to start or a request failed.
    """
    config = PluginConfig(store=folder / f"verdicts-{name}.sqlite", tau=TAU, audit=True,
                          repair=repair)
    with Server(config, model=model, kv=kv, log=folder / f"server-{name}.log",
                max_model_len=MAX_MODEL_LEN) as server:
        sent = [_send(server, kind, prompt, f"demo-{name}-{i}")
                for i, (kind, prompt) in enumerate(battery)]
        verdicts = [server.verdicts(f"demo-{name}-{i}") for i in range(len(battery))]
        by_response = [server.verdicts(rid) for _, rid in sent]
        answers = [_send(server, "completion", item.prompt, f"needle-{name}-{i}",
                         max_tokens=6)[0] for i, item in enumerate(retrieval)]
        found = [server.verdicts(f"needle-{name}-{i}")[0] for i in range(len(retrieval))]
        _, page = server.request("/metrics")
    lines = str(page).splitlines()
    hits = tuple(a.strip().startswith(item.answer) for a, item in zip(answers, retrieval,
                                                                       strict=True))
    return Served(name, kv, tuple(t for t, _ in sent), tuple(r for _, r in sent),
                  tuple(v[0] for v in verdicts), tuple(v[0] for v in by_response),
                  tuple(answers), hits, tuple(found),
                  tuple(x for x in lines if x.startswith("witcert_")),
                  sum(1 for x in lines if x.startswith("vllm:")))


def _cell(v: dict[str, Any]) -> str:
    w = v["worst"]
    tier = {"CERTIFIED": "cert", "PARTIALLY_CERTIFIED": "part"}.get(str(v["tier"]), "FAIL")
    text = (f"{tier} cov {v['coverage']:.3f} worst {w['meter']:.4f} (L{w['layer']},h{w['head']},"
            f"p{w['position']}) viol {v['violations']}/{v['audited']}")
    rep = v.get("repair")
    if rep:
        text += f" repaired {rep['cells']} page-in {rep['page_in_fraction']:.3f}"
    return text


def _totals(verdicts: Sequence[dict[str, Any]]) -> tuple[int, int, int, float, int]:
    cells = sum(v["cells"] for v in verdicts)
    covered = sum(v["covered"] for v in verdicts)
    viol = sum(v["violations"] for v in verdicts)
    reps = [v["repair"] for v in verdicts if v.get("repair")]
    paged = sum(r["page_in_bytes"] for r in reps)
    fraction = sum(r["page_in_fraction"] for r in reps) / len(reps) if reps else 0.0
    return cells, covered, viol, fraction, paged


def report(served: Sequence[Served]) -> str:
    """The verdicts side by side, one line per request and one column per server."""
    items = demo_retrieval()
    lines = ["WitCert live in vLLM (CPU build): SmolLM2-135M-Instruct served through the "
             "OpenAI-compatible server,",
             f"every (layer, head, query row) cell metered and audited; coverage: meter <= "
             f"{TAU}; {MAX_TOKENS} greedy tokens per request;",
             "bf16: the model's own cache; fp8: vLLM's fp8 (e4m3) cache; fp8+repair: the same "
             f"cache with every cell above {TAU} repaired by exact page-in", ""]
    width = max(len(s.name) for s in served)
    for i, (kind, prompt) in enumerate(BATTERY):
        lines.append(f"request {i + 1} ({kind}): {prompt!r}")
        for s in served:
            lines.append(f"  {s.name:{width}s} {s.texts[i][:34]!r:38s} | {_cell(s.verdicts[i])}")
    lines.append("")
    tokens = sorted({v["rows"] for s in served for v in s.retrieval_verdicts})
    span = f"{tokens[0]}-{tokens[-1]}" if tokens else "?"
    lines.append(f"retrieval: {len(items)} items of {RETRIEVAL_FACTS} key-value needles "
                 f"({span} tokens each), the code asked for, answered greedily:")
    for s in served:
        cells, covered, viol, fraction, moved = _totals(s.retrieval_verdicts)
        answers = " ".join(a.strip()[:4] or "-" for a in s.answers)
        lines.append(f"  {s.name:{width}s} {sum(s.hits)}/{len(s.hits)} right ({answers}; asked "
                     f"{' '.join(it.answer for it in items)}), coverage {covered / cells:.3f}, "
                     f"violations {viol}" + (f", page-in {fraction:.3f} ({moved / 2**20:.1f} MiB)"
                                             if any(v.get("repair") for v in
                                                    s.retrieval_verdicts) else ""))
    lines.append("")
    for s in served:
        every = list(s.verdicts) + list(s.retrieval_verdicts)
        cells, covered, viol, fraction, moved = _totals(every)
        lines.append(f"{s.name}: {len(every)} requests, {cells} cells, coverage "
                     f"{covered / cells:.3f}, audited violations {viol}; /metrics: "
                     f"{len(s.metrics)} witcert_ lines next to {s.vllm_metrics} of vLLM's")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Serve, query, print (and with ``--out``, write) the report."""
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--out", type=Path, help="also write the report here")
    args = p.parse_args(argv)
    model = smollm2_engine_dir()
    with tempfile.TemporaryDirectory() as tmp:
        served = [serve_battery(name, kv, model=model, folder=Path(tmp), repair=repair,
                                retrieval=demo_retrieval()) for name, kv, repair in SERVED]
    text = report(served)
    print(text, end="")
    if args.out is not None:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
