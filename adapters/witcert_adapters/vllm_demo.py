"""The live plugin, shown: vLLM serves SmolLM2 with its KV cache metered, per-request verdicts.

``python -m witcert_adapters.vllm_demo [--out FILE]`` starts vLLM's OpenAI-compatible
server (CPU build, in ``.venv-vllm``) with the plugin switched on, audited, with a bfloat16
KV cache (the model's own dtype; no fp8 cache: :data:`~witcert_adapters.vllm_plugin.launch.
FP8_NOT_METERED` says why, and the report says so). It sends a short battery of
completion and chat requests, reads each request's verdict from the side endpoint
``/witcert/verdicts/{id}`` and the ``witcert_`` metrics from ``/metrics``, stops the server,
and prints the verdicts side by side.

Main declarations
-----------------
- :func:`serve_battery`: one server, the battery, the verdicts and metrics.
- :func:`report`: the side-by-side text; :func:`main`.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, final

from witcert_adapters.demo.models import smollm2_engine_dir
from witcert_adapters.vllm_plugin.config import PluginConfig
from witcert_adapters.vllm_plugin.launch import FP8_NOT_METERED, Server

__all__ = ["BATTERY", "Served", "main", "report", "serve_battery"]

TAU: Final = 0.1
MAX_TOKENS: Final = 16
BATTERY: Final = (
    ("completion", "The capital of France is"),
    ("completion", "def fibonacci(n):"),
    ("chat", "Name three colours of the rainbow."),
    ("chat", "What is two plus two?"),
)
"""The requests sent: ``(kind, prompt)``."""


@final
@dataclass(frozen=True, slots=True)
class Served:
    """One server's battery.

    Attributes:
        kv_cache_dtype: the cache served; ``texts``: each request's generated text.
        response_ids: the ids in the responses; ``verdicts``: each request's verdict (JSON),
            fetched by the id the client sent (``X-Request-Id``).
        by_response_id: the same verdicts, fetched by the response's id.
        metrics: the ``witcert_`` lines of ``/metrics``; ``vllm_metrics``: how many of
            vLLM's own metric lines the same page held.
    """

    kv_cache_dtype: str
    texts: tuple[str, ...]
    response_ids: tuple[str, ...]
    verdicts: tuple[dict[str, Any], ...]
    by_response_id: tuple[dict[str, Any], ...]
    metrics: tuple[str, ...]
    vllm_metrics: int


def _send(server: Server, kind: str, prompt: str, request_id: str) -> tuple[str, str]:
    headers = {"X-Request-Id": request_id}
    if kind == "chat":
        status, body = server.request("/v1/chat/completions", {
            "model": "smollm2", "messages": [{"role": "user", "content": prompt}],
            "max_tokens": MAX_TOKENS, "temperature": 0.0}, headers=headers)
        text = body["choices"][0]["message"]["content"] if status == 200 else ""
    else:
        status, body = server.request("/v1/completions", {
            "model": "smollm2", "prompt": prompt, "max_tokens": MAX_TOKENS,
            "temperature": 0.0}, headers=headers)
        text = body["choices"][0]["text"] if status == 200 else ""
    if status != 200:
        raise RuntimeError(f"{kind} request failed with {status}: {body}")
    return str(text), str(body["id"])


def serve_battery(kv: str, *, model: Path, folder: Path,
                  battery: Sequence[tuple[str, str]] = BATTERY) -> Served:
    """Start one audited server for ``kv``, send the battery, collect verdicts and metrics.

    Raises:
        RuntimeError: the server failed to start or a request failed.
    """
    config = PluginConfig(store=folder / f"verdicts-{kv}.sqlite", tau=TAU, audit=True)
    with Server(config, model=model, kv=kv, log=folder / f"server-{kv}.log") as server:
        sent = [_send(server, kind, prompt, f"demo-{kv}-{i}")
                for i, (kind, prompt) in enumerate(battery)]
        verdicts = [server.verdicts(f"demo-{kv}-{i}") for i in range(len(battery))]
        by_response = [server.verdicts(rid) for _, rid in sent]
        _, page = server.request("/metrics")
    lines = str(page).splitlines()
    return Served(kv, tuple(t for t, _ in sent), tuple(r for _, r in sent),
                  tuple(v[0] for v in verdicts), tuple(v[0] for v in by_response),
                  tuple(x for x in lines if x.startswith("witcert_")),
                  sum(1 for x in lines if x.startswith("vllm:")))


def _name(kv: str) -> str:
    return "bf16" if kv == "auto" else kv


def _cell(v: dict[str, Any]) -> str:
    w = v["worst"]
    tier = {"CERTIFIED": "cert", "PARTIALLY_CERTIFIED": "part"}.get(str(v["tier"]), "FAIL")
    return (f"{tier} cov {v['coverage']:.3f} worst {w['meter']:.4f} (L{w['layer']},h{w['head']},"
            f"p{w['position']}) viol {v['violations']}/{v['audited']}")


def report(served: Sequence[Served], *, missing: Sequence[str] = ()) -> str:
    """The verdicts side by side, one line per request and one column per cache."""
    lines = ["WitCert live in vLLM (CPU build): SmolLM2-135M-Instruct served through the "
             "OpenAI-compatible server,",
             f"every (layer, head, query row) cell metered and audited; coverage: meter <= "
             f"{TAU}; {MAX_TOKENS} greedy tokens per request", ""]
    for note in missing:
        lines.append(note)
    if missing:
        lines.append("")
    for i, (kind, prompt) in enumerate(BATTERY):
        lines.append(f"request {i + 1} ({kind}): {prompt!r}")
        for s in served:
            lines.append(f"  {_name(s.kv_cache_dtype):5s} {s.texts[i][:40]!r:44s} | "
                         f"{_cell(s.verdicts[i])}")
    lines.append("")
    for s in served:
        cells = sum(v["cells"] for v in s.verdicts)
        covered = sum(v["covered"] for v in s.verdicts)
        viol = sum(v["violations"] for v in s.verdicts)
        lines.append(f"{_name(s.kv_cache_dtype)}: {len(s.verdicts)} requests, {cells} cells, "
                     f"coverage {covered / cells:.3f}, audited violations {viol}; /metrics: "
                     f"{len(s.metrics)} witcert_ lines next to {s.vllm_metrics} of vLLM's")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Serve, query, print (and with ``--out``, write) the report."""
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--out", type=Path, help="also write the report here")
    args = p.parse_args(argv)
    model = smollm2_engine_dir()
    dtypes = ["auto"]
    missing = [FP8_NOT_METERED]
    with tempfile.TemporaryDirectory() as tmp:
        served = [serve_battery(kv, model=model, folder=Path(tmp)) for kv in dtypes]
    text = report(served, missing=missing)
    print(text, end="")
    if args.out is not None:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
