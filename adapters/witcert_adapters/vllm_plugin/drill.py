"""The plugin under load and ``kill -9``: a drill against vLLM's OpenAI-compatible server.

:func:`drill` starts the server with the plugin on (audit on, a verdict store), and:

1. **load**: sends 32 completion requests at once and reads every verdict through the side
   endpoint (those verdicts are now *acknowledged*). Each verdict is recounted from what the
   client saw, independently of the plugin: one verdict per request, under the request's
   own id; its metered rows equal the prompt's tokens plus the generated ones less one (the
   last token is never fed back: a read attributed to another request would change the
   count); its cells equal rows x layers x heads of the model's config; every cell audited,
   none above its bound; its ledger spend equal to the recount from its readings (one per
   metered step, each deterministic, ``delta = 0``: the exact sum is ``0``) and its budget
   the configured one;
2. **kill -9**: sends 8 streaming requests, waits until each has streamed a token, and kills
   the server's whole process group with ``SIGKILL`` mid-generation;
3. **restart**: starts the server again on the same store and checks that the store passes
   SQLite's integrity check, that every acknowledged verdict is still there unchanged, that
   each cut request is reported failed closed (no tier, never CERTIFIED, the reason named),
   and that a new request is served and metered.

``python -m witcert_adapters.vllm_plugin.drill`` runs it and prints the report with the
times; :func:`drill` returns it as a :class:`DrillReport`.

Main declarations
-----------------
- :func:`drill`, :class:`DrillReport`.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Final, final

from witcert_adapters.vllm_plugin.config import PluginConfig
from witcert_adapters.vllm_plugin.launch import Server
from witcert_adapters.vllm_plugin.verdicts import CUT_PREFIX, recount_spent

__all__ = ["DrillReport", "drill", "main"]

_LOAD: Final = 32
_CUT: Final = 8
_WORDS: Final = ("river", "harbour", "puzzle", "library", "kitchen", "orchestra", "pollen",
                 "mountain")


@final
@dataclass(slots=True)
class DrillReport:
    """What the drill measured; :attr:`problems` is empty when every check held."""

    load_requests: int = 0
    load_s: float = 0.0
    verdicts: int = 0
    cells: int = 0
    audited: int = 0
    violations: int = 0
    misattributed: int = 0
    spend_mismatches: int = 0
    startup_s: float = 0.0
    streams_started_s: float = 0.0
    killed_after_tokens: int = 0
    restart_s: float = 0.0
    integrity: str = ""
    acknowledged_kept: int = 0
    cut: int = 0
    cut_failed_closed: int = 0
    certified_after_restart: bool = False
    problems: list[str] = field(default_factory=lambda: list[str]())

    def text(self) -> str:
        """The report, one fact a line."""
        return "\n".join([
            f"load: {self.load_requests} concurrent completions in {self.load_s:.1f} s; "
            f"{self.verdicts} verdicts, {self.cells} cells, {self.audited} audited, "
            f"{self.violations} violations, {self.misattributed} misattributed, "
            f"{self.spend_mismatches} ledger-spend mismatches against the recount",
            f"server start {self.startup_s:.1f} s; {_CUT} streams started in "
            f"{self.streams_started_s:.1f} s; SIGKILL to the process group after "
            f"{self.killed_after_tokens} streamed chunks",
            f"restart on the same store: healthy in {self.restart_s:.1f} s; integrity_check: "
            f"{self.integrity}; acknowledged verdicts kept: {self.acknowledged_kept} of "
            f"{self.verdicts}; cut requests reported failed closed: "
            f"{self.cut_failed_closed} of {self.cut}; a new request certified after the "
            f"restart: {self.certified_after_restart}",
            "problems: " + ("none" if not self.problems else "; ".join(self.problems)),
        ]) + "\n"


def _model_shape(model: Path) -> tuple[int, int]:
    cfg = json.loads((model / "config.json").read_text())
    return int(cfg["num_hidden_layers"]), int(cfg["num_attention_heads"])


def _complete(server: Server, i: int) -> dict[str, Any]:
    status, body = server.request("/v1/completions", {
        "model": "smollm2", "prompt": f"Write one line about the {_WORDS[i % 8]} number {i}.",
        "max_tokens": 16, "temperature": 0.0, "ignore_eos": True},
        headers={"X-Request-Id": f"load-{i}"}, timeout=600.0)
    if status != 200:
        raise RuntimeError(f"load-{i} failed with {status}: {body}")
    return dict(body)


def _check_load(server: Server, bodies: Sequence[dict[str, Any]], shape: tuple[int, int],
                config: PluginConfig, report: DrillReport) -> dict[str, list[dict[str, Any]]]:
    acknowledged: dict[str, list[dict[str, Any]]] = {}
    layers, heads = shape
    for i, body in enumerate(bodies):
        rid = f"load-{i}"
        found = server.verdicts(rid)
        acknowledged[rid] = found
        usage = body["usage"]
        rows = int(usage["prompt_tokens"]) + int(usage["completion_tokens"]) - 1
        if len(found) != 1 or found[0]["external"] != f"cmpl-{rid}-0" or \
                found[0]["rows"] != rows or found[0]["cells"] != rows * layers * heads:
            report.misattributed += 1
            report.problems.append(f"{rid}: {len(found)} verdicts, rows "
                                   f"{[v['rows'] for v in found]} (client saw {rows})")
        for v in found:
            report.verdicts += 1
            report.cells += int(v["cells"])
            report.audited += int(v["audited"])
            report.violations += int(v["violations"])
            recount = recount_spent(v)
            if Fraction(v["spent"]) != recount or Fraction(v["delta_req"]) != config.delta_req \
                    or v["tier"] is None or int(v["steps"]) < 1:
                report.spend_mismatches += 1
                report.problems.append(f"{rid}: spent {v['spent']} of {v['delta_req']} "
                                       f"(recount {recount}), tier {v['tier']}")
    if report.audited != report.cells or report.violations:
        report.problems.append(f"{report.cells - report.audited} cells unaudited, "
                               f"{report.violations} violations")
    return acknowledged


def _stream(server: Server, i: int, started: threading.Event, chunks: list[int]) -> None:
    body = json.dumps({"model": "smollm2", "prompt": f"Tell a long story about the "
                       f"{_WORDS[i % 8]}.", "max_tokens": 400, "temperature": 0.0,
                       "ignore_eos": True, "stream": True}).encode()
    req = urllib.request.Request(server.url + "/v1/completions", data=body, method="POST",
                                 headers={"Content-Type": "application/json",
                                          "X-Request-Id": f"cut-{i}"})
    try:
        with urllib.request.urlopen(req, timeout=600.0) as r:
            for line in r:
                if line.startswith(b"data: {"):
                    chunks[i] += 1
                    started.set()
    except OSError:
        pass  # the server is gone: that is the drill


def drill(*, model: Path, folder: Path, kv: str = "fp8") -> DrillReport:
    """Run the drill in ``folder`` (the store and the servers' logs); see the module."""
    report = DrillReport(load_requests=_LOAD)
    config = PluginConfig(store=folder / "verdicts.sqlite", tau=0.1, audit=True)
    shape = _model_shape(model)
    extra = ("--max-num-seqs", str(_LOAD))
    t0 = time.perf_counter()
    server = Server(config, model=model, kv=kv, log=folder / "server-1.log", extra=extra)
    try:
        report.startup_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        with ThreadPoolExecutor(_LOAD) as pool:
            bodies = list(pool.map(_complete, [server] * _LOAD, range(_LOAD)))
        report.load_s = time.perf_counter() - t0
        acknowledged = _check_load(server, bodies, shape, config, report)
        events = [threading.Event() for _ in range(_CUT)]
        chunks = [0] * _CUT
        threads = [threading.Thread(target=_stream, args=(server, i, events[i], chunks),
                                    daemon=True) for i in range(_CUT)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for i, e in enumerate(events):
            if not e.wait(timeout=600.0):
                report.problems.append(f"cut-{i} streamed nothing in 600 s")
        report.streams_started_s = time.perf_counter() - t0
        report.killed_after_tokens = sum(chunks)
        os.killpg(server.proc.pid, signal.SIGKILL)
        server.proc.wait()
        for t in threads:
            t.join(timeout=30.0)
    finally:
        server.close()
    t0 = time.perf_counter()
    with Server(config, model=model, kv=kv, log=folder / "server-2.log", extra=extra) as again:
        report.restart_s = time.perf_counter() - t0
        with sqlite3.connect(config.store) as conn:
            report.integrity = str(conn.execute("PRAGMA integrity_check").fetchone()[0])
        for rid, before in acknowledged.items():
            if again.verdicts(rid) == before:
                report.acknowledged_kept += 1
            else:
                report.problems.append(f"{rid}: its acknowledged verdict changed or is gone")
        report.cut = _CUT
        for i in range(_CUT):
            found = again.verdicts(f"cut-{i}", timeout=10.0)
            if len(found) == 1 and found[0]["tier"] is None and \
                    str(found[0]["failure"]).startswith(CUT_PREFIX):
                report.cut_failed_closed += 1
            else:
                report.problems.append(f"cut-{i}: {[(v['tier'], v['failure']) for v in found]}")
        status, _ = again.request("/v1/completions", {
            "model": "smollm2", "prompt": "After the restart:", "max_tokens": 4,
            "temperature": 0.0}, headers={"X-Request-Id": "after-restart"})
        fresh = again.verdicts("after-restart") if status == 200 else []
        report.certified_after_restart = bool(fresh) and fresh[0]["tier"] is not None and \
            fresh[0]["violations"] == 0
    if report.integrity != "ok":
        report.problems.append(f"integrity_check: {report.integrity}")
    if not report.certified_after_restart:
        report.problems.append("the request after the restart got no clean verdict")
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """Run the drill on SmolLM2 and print the report (exit 1 on a problem)."""
    import argparse

    from witcert_adapters.demo.models import smollm2_engine_dir

    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--kv", default="fp8", choices=("fp8", "auto"))
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        report = drill(model=smollm2_engine_dir(), folder=Path(tmp), kv=args.kv)
    print(report.text(), end="")
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
