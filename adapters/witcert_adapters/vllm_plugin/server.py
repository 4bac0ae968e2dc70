# pyright: reportMissingImports=false, reportUnknownMemberType=false, reportUnknownVariableType=false, reportUnknownArgumentType=false
"""The API server's side: per-request verdicts over HTTP, and ``witcert_`` metrics.

Loaded by vLLM's ``vllm.endpoint_plugins`` mechanism in the API server process:

- ``GET /witcert/verdicts/{request_id}``: the verdicts of a request, by vLLM's internal id,
  by the client's id (the ``X-Request-Id`` header, or the response's ``id``: a
  completion's id covers each of its prompts), as JSON ``{"request_id": ..., "verdicts":
  [...]}``; 404 until the engine has written one (one engine step after the request
  finished). ``GET /witcert/verdicts`` lists all.
- metrics through prometheus_client, in the registry vLLM's ``/metrics`` serves (the
  families are built by :mod:`witcert_calculus.export.prometheus`, which also defines the
  ledger's and the meters' families): per
  ``(kv_cache_dtype, tier)`` counters of requests and cells, covered, saturated, audited
  and violating cells, and the coverage ratio and threshold. Labels are low-cardinality
  (dtype and tier); per-request values never become labels.

Main declarations
-----------------
- :class:`VerdictEndpoint`, :class:`VerdictCollector`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, final

from prometheus_client.registry import Collector

from witcert_adapters.vllm_plugin.config import PluginConfig, active
from witcert_adapters.vllm_plugin.store import VerdictStore
from witcert_calculus.export.prometheus import counter, gauge

__all__ = ["VerdictCollector", "VerdictEndpoint"]

#: ``(family name, field of the store's totals, help)`` of each verdict counter.
_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("witcert_requests_total", "requests", "Finished requests with a verdict"),
    ("witcert_cells_total", "cells", "Metered (layer, head, query row) cells"),
    ("witcert_cells_covered_total", "covered", "Cells whose meter is <= the threshold"),
    ("witcert_cells_saturated_total", "saturated", "Cells whose bound is vacuous (>= 1)"),
    ("witcert_cells_audited_total", "audited", "Cells audited against exact attention"),
    ("witcert_audit_violations_total", "violations",
     "Audited cells whose true TV exceeded the bound"),
)


@final
class VerdictCollector(Collector):
    """Prometheus metrics computed from the verdict store at each scrape."""

    def __init__(self, store: VerdictStore, config: PluginConfig) -> None:
        self.store = store
        self.config = config

    def collect(self) -> Iterator[Any]:
        """The verdict families, built by :mod:`witcert_calculus.export.prometheus` (one definition)."""
        labels = ["kv_cache_dtype", "tier"]
        totals = self.store.totals()

        def by(t: Any) -> dict[str, str]:
            return {"kv_cache_dtype": t.kv_cache_dtype, "tier": t.tier}

        for name, field, help_ in _COUNTERS:
            yield counter(name, help_, [(by(t), float(getattr(t, field))) for t in totals],
                          labels=labels)
        yield gauge("witcert_coverage_ratio", "Covered cells / cells over finished requests",
                    [(by(t), t.covered / t.cells if t.cells else 0.0) for t in totals],
                    labels=labels)
        yield gauge("witcert_coverage_threshold", "Meter threshold of coverage",
                    [({}, self.config.tau)])


@final
class VerdictEndpoint:
    """The ``vllm.endpoint_plugins`` object (vLLM's ``EndpointPlugin`` protocol)."""

    name = "witcert"
    required_tasks = None

    def __init__(self) -> None:
        self.config = active()
        self.store = None if self.config is None else VerdictStore(self.config.store)

    def attach_router(self, app: Any) -> None:
        """Add the verdict routes to the server's FastAPI app."""
        from starlette.responses import JSONResponse

        store = self.store

        async def one(request_id: str) -> Any:
            if store is None:
                return JSONResponse({"error": "the witcert plugin is off (WITCERT_VLLM unset)"},
                                    status_code=404)
            found = [v.to_json() for v in store.find(request_id)]
            if not found:
                return JSONResponse({"request_id": request_id, "verdicts": [],
                                     "error": "no verdict yet"}, status_code=404)
            return JSONResponse({"request_id": request_id, "verdicts": found})

        async def every() -> Any:
            return JSONResponse({"verdicts": [] if store is None else
                                 [v.to_json() for v in store.all()]})

        app.add_api_route("/witcert/verdicts/{request_id}", one, methods=["GET"])
        app.add_api_route("/witcert/verdicts", every, methods=["GET"])

    async def init_state(self, engine_client: Any, state: Any, args: Any) -> None:
        """Register the metrics in the registry vLLM's ``/metrics`` serves."""
        if self.store is None or self.config is None:
            return
        from vllm.v1.metrics.prometheus import get_prometheus_registry
        get_prometheus_registry().register(VerdictCollector(self.store, self.config))
