"""Per-request accounting in the engine: ledger accounts, tallies, gate, verdicts.

Every request the engine schedules gets one :class:`~witcert_calculus.ledger.RiskLedger`
account, opened when the request first appears and keyed by the ledger's own monotone id
(vLLM's request ids may be reused after an abort; the ledger's never are). Each metered
step adds the request's tallies (cells, covered cells, the worst cell, audited
violations) and one typed :class:`~witcert_calculus.contracts.Reading` of the request's
worst cell, admitted into its account (Tier A: deterministic, ``delta = 0``). A request
whose memory could not be witnessed (a stale or unwritten slot), or whose audit found a cell
above its bound, fails closed: it keeps no tier and reports why.

When the request finishes, its :class:`RequestVerdict` is assembled: tier and spent budget
from the ledger, coverage at ``tau``, the worst cell, and the acceptance gate run on the
request's coverage records, keyed by ``(layer, path)`` (coverage: every layer wrote every
token and read every row; magnitude: no NaN, meters in ``[0, 1]``; soundness: zero audited
violations, or "not audited").

Main declarations
-----------------
- :class:`RequestVerdict`, :class:`WorstCell`, :class:`RepairVerdict`, :class:`RequestTally`,
  :class:`Accounts`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import Any, Final, final

import numpy as np
import numpy.typing as npt

from witcert_adapters.gate import GateVerdict, Stage, StageResult, declared_problems, \
    ordered_verdict
from witcert_adapters.runs import ProbePath, Site
from witcert_adapters.vllm_plugin.meter import SUMMARY
from witcert_calculus.accounting.budget import telescoping_spent
from witcert_calculus.contracts import _reading  # pyright: ignore[reportPrivateUsage]
from witcert_calculus.errors import InvalidValueError
from witcert_calculus.ledger import RiskLedger
from witcert_calculus.metrics import AtConsume, AttentionTV
from witcert_calculus.tiers import Evidence

__all__ = ["CUT_PREFIX", "Accounts", "RepairVerdict", "RequestTally", "RequestVerdict",
           "WorstCell", "cut_verdict", "recount_spent"]


@final
@dataclass(frozen=True, slots=True)
class WorstCell:
    """The request's worst metered cell: reported meter and where it is."""

    meter: float
    layer: int
    head: int
    position: int


@final
@dataclass(frozen=True, slots=True)
class RepairVerdict:
    """What the gate that repairs did for one request.

    Attributes:
        cells: cells repaired; ``risk_ranked``: of which the blocks were chosen by raw risk
            (above saturation).
        paged: (layer, kv head, position) entries paged in; ``page_in_fraction``: of the
            request's entries (its longest visible length, times layers and kv heads).
        page_in_bytes: bytes moved from the backing store (keys and values).
        true_max: the largest audited true TV of a repaired cell (0 without audit).
        label: ``"certified"`` when every repair followed the certified decrease,
            ``"risk-ranked"`` otherwise, ``"none"`` when nothing needed repair.
    """

    cells: int
    risk_ranked: int
    paged: int
    page_in_fraction: float
    page_in_bytes: int
    true_max: float
    label: str


@final
@dataclass(frozen=True, slots=True)
class RequestVerdict:
    """A finished request's verdict, as the client reads it.

    Attributes:
        request: vLLM's (internal) request id; ``external``: the id the client sent or
            received (the internal one without vLLM's random suffix).
        account: the ledger account (unique within ``session``).
        session: the engine process that metered it.
        kv_cache_dtype: the cache it was served from; ``form``: the TV bound reported
            (``meter``, ``tanh`` or ``cascade``); ``witness``: what bounded the keys
            (``format``, ``bands=B`` or ``format+bands=B``).
        tier: the ledger's verdict tier, or ``None`` when the request failed closed.
        failure: why the request failed closed (``None`` otherwise).
        tau: coverage threshold; ``coverage``: share of cells with meter ``<= tau``.
        cells, covered, saturated: cell counts (layer x head x query row).
        worst: the worst cell.
        spent: exact failure probability spent (a string such as ``"0"``); ``delta_req``.
        steps: metered engine steps; ``rows``: metered query rows.
        prefill_steps: steps in which the request had more than one row (a prefill chunk);
            ``mixed_steps``: steps whose batch held both decode rows and a prefill chunk.
        audited, violations: audited cells and those whose true TV exceeded the bound.
        true_max: largest audited true TV (0 when not audited).
        gate: ``accepted``, ``failed_stage`` and each stage's text.
        repair: what the gate that repairs did (``None`` with repair off).
        by_tanh: cells whose value is ``tanh(max c)`` (all of them for ``form=tanh``, none
            for ``form=meter``, those the cascade did not meter otherwise).
    """

    request: str
    external: str
    account: int
    session: str
    kv_cache_dtype: str
    form: str
    witness: str
    tier: str | None
    failure: str | None
    tau: float
    coverage: float
    cells: int
    covered: int
    saturated: int
    worst: WorstCell
    spent: str
    delta_req: str
    steps: int
    rows: int
    prefill_steps: int
    mixed_steps: int
    audited: int
    violations: int
    true_max: float
    gate: dict[str, Any]
    repair: RepairVerdict | None = None
    by_tanh: int = 0

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (nested dataclasses become dicts)."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RequestVerdict:
        """Inverse of :meth:`to_json`."""
        fields = dict(data)
        fields["worst"] = WorstCell(**fields["worst"])
        if fields.get("repair") is not None:
            fields["repair"] = RepairVerdict(**fields["repair"])
        return cls(**fields)


def external_id(request: str) -> str:
    """The client's id of an internal vLLM request id (vLLM appends ``-`` and 8 characters).

    Example:
        >>> external_id("cmpl-abc-0-1a2b3c4d")
        'cmpl-abc-0'
    """
    head, sep, tail = request.rpartition("-")
    return head if sep and len(tail) == 8 else request


#: How the failure of a request cut by its engine's death begins.
CUT_PREFIX: Final = "cut:"


def cut_verdict(request: str, account: int, session: str, settings: dict[str, str]
                ) -> RequestVerdict:
    """The verdict of a request its engine died serving (``settings``: the session's
    ``kv_cache_dtype``, ``form``, ``witness``, ``tau``, ``delta_req``): failed closed, no
    tier, nothing metered counted, the whole budget spent."""
    reason = (f"{CUT_PREFIX} engine session {session} ended (its process is gone) before the request "
              "finished; no verdict was written for it")
    return RequestVerdict(
        request=request, external=external_id(request), account=account, session=session,
        kv_cache_dtype=settings["kv_cache_dtype"], form=settings["form"],
        witness=settings["witness"], tier=None, failure=reason, tau=float(settings["tau"]),
        coverage=0.0, cells=0, covered=0, saturated=0, worst=WorstCell(0.0, -1, -1, -1),
        spent=settings["delta_req"], delta_req=settings["delta_req"], steps=0, rows=0,
        prefill_steps=0, mixed_steps=0, audited=0, violations=0, true_max=0.0,
        gate={"accepted": False, "failed_stage": "cut", "stages": {}})


def recount_spent(verdict: dict[str, Any]) -> Fraction:
    """A verdict's ledger spend recounted from its own fields, independently of the ledger:
    each metered step admitted one reading of the request's worst cell, deterministic
    (Tier A, ``delta = 0``), so the telescoping sum over its probabilistic readings is over
    none; a request cut by its engine's death counts its whole budget."""
    delta_req = Fraction(verdict["delta_req"])
    if str(verdict["failure"] or "").startswith(CUT_PREFIX):
        return delta_req
    return telescoping_spent(0, delta_req)


@final
@dataclass(slots=True)
class RequestTally:
    """What one request accumulated while it was served (mutable, engine-side)."""

    request: str
    account: int
    seat: int
    layers: int
    audit: bool
    writes: npt.NDArray[np.int64]
    reads: npt.NDArray[np.int64]
    written_rows: int = 0
    rows: int = 0
    steps: int = 0
    prefill_steps: int = 0
    mixed_steps: int = 0
    cells: int = 0
    covered: int = 0
    saturated: int = 0
    nan: int = 0
    by_tanh: int = 0
    worst: WorstCell = field(default_factory=lambda: WorstCell(0.0, -1, -1, -1))
    audited: int = 0
    violations: int = 0
    true_max: float = 0.0
    failure: str | None = None
    repaired: int = 0
    risk_ranked: int = 0
    paged: int = 0
    page_in_bytes: int = 0
    repaired_true_max: float = 0.0
    length: int = 0

    @property
    def paths(self) -> tuple[ProbePath, ...]:
        """The paths every layer declares (the audit's only in audit mode)."""
        return (ProbePath.WRITE, ProbePath.READ) + ((ProbePath.AUDIT,) if self.audit else ())

    def sites(self) -> frozenset[Site]:
        """Observed ``(layer, path)`` sites (a path counts once it produced data)."""
        counts = {ProbePath.WRITE: self.writes, ProbePath.READ: self.reads,
                  ProbePath.AUDIT: self.reads if self.audited else np.zeros_like(self.reads)}
        return frozenset((layer, p) for p in self.paths for layer in range(self.layers)
                         if int(counts[p][layer]) > 0)


def _gate(t: RequestTally) -> GateVerdict:
    declared = frozenset((layer, p) for layer in range(t.layers) for p in t.paths)
    problems = declared_problems(declared, t.sites())
    bad_w = [layer for layer in range(t.layers) if int(t.writes[layer]) != t.written_rows]
    bad_r = [layer for layer in range(t.layers) if int(t.reads[layer]) != t.rows]
    if bad_w:
        problems.append(f"layers {bad_w[:6]} wrote fewer tokens than the request's "
                        f"{t.written_rows}")
    if bad_r:
        problems.append(f"layers {bad_r[:6]} metered fewer rows than the request's {t.rows}")
    if t.failure is not None:
        problems.append(t.failure)
    coverage = StageResult(Stage.COVERAGE, not problems,
                           "; ".join(problems) if problems else
                           f"{t.layers} layers x {len(t.paths)} paths, {t.rows} rows",
                           checked=t.layers, failures=len(problems))

    def magnitude() -> StageResult:
        ok = t.nan == 0 and 0.0 <= t.worst.meter <= 1.0
        return StageResult(Stage.MAGNITUDE, ok,
                           f"{t.cells} cells, {t.nan} NaN, worst {t.worst.meter:.6g}",
                           checked=t.cells, failures=t.nan)

    def soundness() -> StageResult:
        if not t.audit:
            return StageResult(Stage.SOUNDNESS, None, "not audited (audit=0)")
        return StageResult(Stage.SOUNDNESS, t.violations == 0,
                           f"{t.audited} audited cells, {t.violations} violations, "
                           f"largest true TV {t.true_max:.6g}",
                           checked=t.audited, failures=t.violations)

    return ordered_verdict(coverage, magnitude, soundness)


@final
class Accounts:
    """Engine-side accounts: one ledger account and tally per live request.

    Args:
        layers: attention layers metered; ``seats``: concurrent requests at most.
        tau: coverage threshold; ``audit``: whether cells are audited.
        delta_req: each request's budget; ``session``: this engine's id;
        kv_cache_dtype: what is served; ``form``: the TV bound each cell reports;
        witness: what bounds the keys; ``repair``: whether the gate repairs;
        kv_heads: kv heads per layer (the page-in fraction's denominator).

    Attribute ``on_open`` (``None`` by default) is called with each request's tally when its
    account opens (:func:`~witcert_adapters.vllm_plugin.store.track` records it in the store,
    so a request cut by the engine's death is found).
    """

    __slots__ = ("_free", "_live", "audit", "delta_req", "form", "kv_cache_dtype", "kv_heads",
                 "layers", "ledger", "on_open", "repair", "session", "tau", "witness")

    def __init__(self, *, layers: int, seats: int, tau: float, audit: bool,
                 delta_req: Fraction, session: str, kv_cache_dtype: str,
                 form: str = "meter", witness: str = "bands=4", repair: bool = False,
                 kv_heads: int = 1) -> None:
        self.layers = layers
        self.form = form
        self.witness = witness
        self.repair = repair
        self.kv_heads = kv_heads
        self.on_open: Callable[[RequestTally], None] | None = None
        self.tau = tau
        self.audit = audit
        self.delta_req = delta_req
        self.session = session
        self.kv_cache_dtype = kv_cache_dtype
        self.ledger = RiskLedger()
        self._live: dict[str, RequestTally] = {}
        self._free = list(range(seats - 1, -1, -1))

    def tally(self, request: str) -> RequestTally:
        """The live tally of ``request``, opening its account on first sight.

        Raises:
            InvalidValueError: more concurrent requests than seats.
        """
        t = self._live.get(request)
        if t is None:
            if not self._free:
                raise InvalidValueError("requests", len(self._live) + 1,
                                        "more concurrent requests than the plugin's seats")
            account = self.ledger.open_request(delta_req=self.delta_req)
            zeros = np.zeros(self.layers, dtype=np.int64)
            t = RequestTally(request, account, self._free.pop(), self.layers, self.audit,
                             zeros.copy(), zeros.copy())
            self._live[request] = t
            if self.on_open is not None:
                self.on_open(t)
        return t

    def seat(self, request: str) -> int | None:
        """The seat of a live request (``None`` if it is not live)."""
        t = self._live.get(request)
        return None if t is None else t.seat

    def add_step(self, tallies: Sequence[RequestTally], summary: Sequence[Sequence[float]],
                 q_lens: Sequence[int], *, written: Iterable[int], read: Iterable[int],
                 evidence: Evidence | None) -> None:
        """Fold one metered step into the tallies and admit each request's worst cell.

        Args:
            tallies: the step's requests, in batch order.
            summary: their rows of :attr:`~witcert_adapters.vllm_plugin.meter.StepMeter.summary`.
            q_lens: their query rows in the step.
            written: layers whose writes were captured; ``read``: layers metered.
            evidence: the step's evidence (one per step, shared by its readings); ``None``
                only when every request of the step has failed closed.

        Raises:
            InvalidValueError: no evidence for a request that has not failed.
        """
        w_layers = list(written)
        r_layers = list(read)
        mixed = 1 in q_lens and any(q > 1 for q in q_lens)
        for t, row, q in zip(tallies, summary, q_lens, strict=True):
            t.writes[w_layers] += q
            t.written_rows += q
            if t.failure is not None:
                continue
            t.reads[r_layers] += q
            t.rows += q
            t.steps += 1
            t.prefill_steps += int(q > 1)
            t.mixed_steps += int(mixed)
            col = dict(zip(SUMMARY, row, strict=True))
            t.cells += int(col["cells"])
            t.covered += int(col["covered"])
            t.saturated += int(col["saturated"])
            t.nan += int(col["nan"])
            t.by_tanh += int(col["by_tanh"])
            worst = float(col["worst"])
            if worst > t.worst.meter or t.worst.layer < 0:
                t.worst = WorstCell(worst, int(col["worst_layer"]), int(col["worst_head"]),
                                    int(col["worst_position"]))
            t.audited += int(col["audited"])
            t.violations += int(col["violations"])
            t.true_max = max(t.true_max, float(col["true_max"]))
            if evidence is None:
                raise InvalidValueError("evidence", None, f"request {t.request} has readings "
                                        "but the step has no evidence")
            reading = _reading(AttentionTV[AtConsume], worst, evidence=evidence,
                              delta=Fraction(0))
            self.ledger.admit(t.account, reading)

    def add_repairs(self, tallies: Sequence[RequestTally], layers: Sequence[Any],
                    lengths: Sequence[int]) -> None:
        """Fold one step's repairs (one :class:`~witcert_adapters.vllm_plugin.repair.
        LayerRepair` per layer) into the tallies, in batch order; ``lengths``: each
        request's visible length after the step."""
        for t, n in zip(tallies, lengths, strict=True):
            t.length = max(t.length, int(n))
        for layer in layers:
            for t, cells, risky, paged, moved, true in zip(
                    tallies, layer.repaired.tolist(), layer.risk_ranked.tolist(),
                    layer.paged.tolist(), layer.page_in_bytes.tolist(),
                    layer.repaired_true_max.tolist(), strict=True):
                t.repaired += int(cells)
                t.risk_ranked += int(risky)
                t.paged += int(paged)
                t.page_in_bytes += int(moved)
                t.repaired_true_max = max(t.repaired_true_max, float(true))

    def fail(self, tally: RequestTally, reason: str) -> None:
        """Fail a request closed: no more readings, no tier; ``reason`` is reported."""
        if tally.failure is None:
            tally.failure = reason

    def finish_all(self, requests: Iterable[str]) -> list[tuple[int, RequestVerdict]]:
        """Close the accounts of finished requests (in sorted order; unseen ones skipped):
        each one's seat, freed, and verdict."""
        done: list[tuple[int, RequestVerdict]] = []
        for request in sorted(requests):
            seat = self.seat(request)
            verdict = self.finish(request)
            if verdict is not None and seat is not None:
                done.append((seat, verdict))
        return done

    def finish(self, request: str) -> RequestVerdict | None:
        """Close a finished request's account and return its verdict (``None`` if unseen)."""
        t = self._live.pop(request, None)
        if t is None:
            return None
        self._free.append(t.seat)
        verdict = self.ledger.close_request(t.account)
        gate = _gate(t)
        if t.violations and t.failure is None:
            # the audit caught a bound below the true TV (the gate's soundness stage says
            # which): no tier is kept for the request
            t.failure = (f"audit: {t.violations} of {t.audited} audited cells above their "
                         f"bound (true TV up to {t.true_max:.4g})")
        repair = None
        if self.repair:
            entries = t.length * self.layers * self.kv_heads
            repair = RepairVerdict(
                t.repaired, t.risk_ranked, t.paged, t.paged / entries if entries else 0.0,
                t.page_in_bytes, t.repaired_true_max,
                "none" if t.repaired == 0 else "certified" if t.risk_ranked == 0 else
                "risk-ranked")
        return RequestVerdict(
            request=request, external=external_id(request), account=t.account,
            session=self.session, kv_cache_dtype=self.kv_cache_dtype, form=self.form,
            witness=self.witness,
            tier=None if t.failure is not None else str(verdict.tier.name),
            failure=t.failure, tau=self.tau,
            coverage=(t.covered / t.cells) if t.cells else 0.0, cells=t.cells,
            covered=t.covered, saturated=t.saturated, worst=t.worst,
            spent=str(verdict.spent), delta_req=str(verdict.delta_req), steps=t.steps,
            rows=t.rows, prefill_steps=t.prefill_steps, mixed_steps=t.mixed_steps,
            audited=t.audited, violations=t.violations, true_max=t.true_max,
            gate={"accepted": gate.accepted,
                  "failed_stage": None if gate.failed_stage is None else str(gate.failed_stage),
                  "stages": {str(s.stage): {"passed": s.passed, "detail": s.detail}
                             for s in gate.stages}},
            repair=repair, by_tanh=t.by_tanh)

