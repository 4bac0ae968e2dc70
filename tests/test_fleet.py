"""witcert_adapters.fleet: one request served by several ranks, one account, one verdict.

One spawn of 4 gloo ranks on 127.0.0.1 checks the fleet end to end (identical verdicts on
every rank, equal to a single-process ledger fed the unsharded trace; the same results when
the trace is replayed; the spend exact and paid once; journals merged with their owners;
mismatched sharding and divergent spending refused on every rank; a rank that dies
mid-request failing the request closed). The rest runs in this process, in a one-rank group.
"""

from __future__ import annotations

import datetime
import os
import pickle
import socket
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
import torch
import torch.distributed as dist
import torch.multiprocessing as tmp

from witcert_adapters.fleet import FleetLedger
from witcert_adapters.head_shards import HeadShard, check_sharding
from witcert_adapters.journal_merge import merge_journals
from witcert_calculus.accounting.budget import telescoping_delta, telescoping_spent
from witcert_calculus.accounting.entries import Aggregate
from witcert_calculus.contracts import Reading
from witcert_calculus.numerics.probability import Probability
from witcert_calculus.errors import (
    AdmissionError,
    InvalidValueError,
    UnknownRequestError,
)
from witcert_calculus.ledger import RiskLedger
from witcert_calculus.metrics import AtConsume, AttentionTV
from witcert_calculus.tiers import Proof, Tier
from reference.issued import proof, reading

TV = AttentionTV[AtConsume]
PROOF = proof("WitCert.Meters.tv_eform_sound")
WORLD = 4
HEADS = 16
PER_HEAD = 6                    # entries (query rows) per head and step
N_REQ = 3
STEPS = 6
TAU = 0.1
DELTA = Fraction(1, 100)
LOCAL = HEADS // WORLD * PER_HEAD
N_SLOTS = N_REQ * STEPS * LOCAL
VACUOUS_STEP = 4


def trace(seed: int) -> np.ndarray:
    """Per-entry bounds ``[steps, requests, heads * per_head]``: mostly small, some above tau,
    now and then a vacuous (saturated) one."""
    g = np.random.default_rng(seed)
    b = g.exponential(0.05, size=(STEPS, N_REQ, HEADS * PER_HEAD))
    b[g.random(b.shape) < 0.003] = 1.0
    b[VACUOUS_STEP, 0, 5] = 1.0
    return b


def threshold(step: int) -> float:
    # One step keeps every entry (threshold 1), so a saturated bound is kept: vacuous.
    return 1.0 if step == VACUOUS_STEP else TAU


def probabilistic(step: int) -> bool:
    return step % 3 == 1


def slot_of(j: int, step: int) -> np.ndarray:
    return (j * STEPS + step) * LOCAL + np.arange(LOCAL)


def _init(rank: int, port: int, timeout_s: float) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD, timeout=datetime.timedelta(seconds=timeout_s))


def _scenario(rank: int, bounds: np.ndarray, journal: Path | None, first_id: int) -> dict[str, Any]:
    fleet = FleetLedger(HeadShard.even(rank=rank, world=WORLD, total=HEADS), n_slots=N_SLOTS,
                        journal=journal)
    ids = [first_id + j for j in range(N_REQ)]
    for r in ids:
        fleet.open_request(r, delta_req=DELTA)
    cols = slice(rank * LOCAL, (rank + 1) * LOCAL)
    steps = []
    allowances = []
    for t in range(STEPS):
        p = probabilistic(t)
        if p:
            allowances.append([fleet.allowance(r) for r in ids])
        slots = torch.as_tensor(np.stack([slot_of(j, t) for j in range(N_REQ)]))
        steps.append(fleet.step(ids, torch.as_tensor(bounds[t][:, cols]), threshold=threshold(t),
                                metric=TV, evidence=PROOF, probabilistic=p, slots=slots))
    final = [fleet.close_request(r) for r in ids]
    local = [fleet.local.verdict(r) for r in ids]
    fleet.close()
    return {"steps": steps, "final": final, "local": local, "allowances": allowances,
            "shards": fleet.shards}


def _worker(rank: int, port: int, out: str, seed: int) -> None:
    _init(rank, port, timeout_s=6.0)
    res: dict[str, Any] = {}
    bounds = trace(seed)
    base = Path(out)
    res["a"] = _scenario(rank, bounds, base / f"rank{rank}.sqlite", first_id=1)
    res["b"] = _scenario(rank, bounds, None, first_id=1)  # the same trace again, fresh state
    # Mismatched sharding: rank 2 claims heads [8, 11) -> every rank refuses.
    wrong = HeadShard(8, 11, HEADS) if rank == 2 else HeadShard.even(rank=rank, world=WORLD,
                                                                      total=HEADS)
    try:
        check_sharding(wrong)
        res["shard_error"] = None
    except InvalidValueError as exc:
        res["shard_error"] = str(exc)
    # Divergent spending: rank 1 draws an extra allowance behind the fleet's back.
    fleet = FleetLedger(HeadShard.even(rank=rank, world=WORLD, total=HEADS))
    fleet.open_request(7, delta_req=DELTA)
    if rank == 1:
        fleet.local.admit_next(7, lambda a: reading(TV, 0.01, evidence=PROOF, delta=a))
    try:
        fleet.step([7], torch.full((1, LOCAL), 0.01), threshold=TAU, metric=TV, evidence=PROOF,
                   probabilistic=True)
        res["diverge"] = None
    except AdmissionError as exc:
        res["diverge"] = str(exc)
    res["diverge_verdict"] = fleet.verdict(7)
    # Ranks that step different requests: rank 0 steps request 11, the others 12.
    fleet = FleetLedger(HeadShard.even(rank=rank, world=WORLD, total=HEADS))
    mine = 11 if rank == 0 else 12
    fleet.open_request(mine, delta_req=DELTA)
    try:
        fleet.step([mine], torch.full((1, LOCAL), 0.01), threshold=TAU, metric=TV,
                   evidence=PROOF)
        res["ids"] = None
    except InvalidValueError as exc:
        res["ids"] = str(exc)
    res["ids_verdict"] = fleet.verdict(mine)
    # A rank that dies mid-request: rank 3 exits after the first step of request 9.
    fleet = FleetLedger(HeadShard.even(rank=rank, world=WORLD, total=HEADS),
                        journal=base / f"death{rank}.sqlite")
    fleet.open_request(9, delta_req=DELTA)
    ok = fleet.step([9], torch.full((1, LOCAL), 0.01), threshold=TAU, metric=TV,
                    evidence=PROOF, probabilistic=True)
    res["before_death"] = (ok, fleet.verdict(9))
    with open(base / f"result{rank}.pkl", "wb") as f:
        pickle.dump(res, f)
    if rank == 3:
        os._exit(17)
    broken = fleet.step([9], torch.full((1, LOCAL), 0.01), threshold=TAU, metric=TV,
                        evidence=PROOF, probabilistic=True)
    after = fleet.verdict(9)
    again = fleet.step([9], torch.full((1, LOCAL), 0.01), threshold=TAU, metric=TV,
                       evidence=PROOF)
    res["death"] = (broken, after, again, fleet.local.verdict(9))
    fleet.close()
    with open(base / f"result{rank}.pkl", "wb") as f:
        pickle.dump(res, f)
    os._exit(0)  # the group lost a member; do not wait on it at shutdown


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _reference(bounds: np.ndarray) -> list[Any]:
    """The single-process ledger fed the unsharded trace, step by step."""
    led = RiskLedger()
    ids = [led.open_request(delta_req=DELTA) for _ in range(N_REQ)]
    for t in range(STEPS):
        for j, r in enumerate(ids):
            delta = led.next_allowance(r) if probabilistic(t) else 0
            led.admit_entries(r, bounds[t, j], threshold=threshold(t), metric=TV, evidence=PROOF,
                              delta=delta, aggregate=Aggregate.MAX)
    return [led.close_request(r) for r in ids]


@pytest.fixture(scope="module")
def fleet_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    out = tmp_path_factory.mktemp("fleet")
    ctx = tmp.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, str(out), 1234)) for r in range(WORLD)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=240)
    codes = [p.exitcode for p in procs]
    for p in procs:
        if p.is_alive():
            p.kill()
    assert codes == [0, 0, 0, 17], codes
    results = []
    for r in range(WORLD):
        with open(out / f"result{r}.pkl", "rb") as f:
            results.append(pickle.load(f))
    return out, results


def test_verdicts_identical_on_every_rank_and_equal_to_one_process(
        fleet_run: tuple[Path, list[dict[str, Any]]]) -> None:
    _, res = fleet_run
    ref = _reference(trace(1234))
    for run in ("a", "b"):
        first = res[0][run]
        for r in range(1, WORLD):
            assert res[r][run]["final"] == first["final"]
            assert res[r][run]["steps"] == first["steps"]
        for fv, single in zip(first["final"], ref, strict=True):
            v = fv.verdict
            assert fv.complete and fv.ranks == WORLD and fv.failure is None
            assert (v.tier, v.delta_req, v.spent, v.entries, v.entries_kept, v.steps,
                    v.vacuous_steps, v.worst_step_bound, v.retained_fraction) == \
                (single.tier, single.delta_req, single.spent, single.entries,
                 single.entries_kept, single.steps, single.vacuous_steps,
                 single.worst_step_bound, single.retained_fraction)
            assert v.counts.probabilistic == single.counts.probabilistic
            assert v.counts.deterministic == single.counts.deterministic
        for j, fv in enumerate(first["final"]):
            assert fv.meter_max == float(trace(1234)[:, j].max())
    # The trace exercises each path: fallbacks, a vacuous step, a partial verdict.
    assert any(any(s.fallback) for s in res[0]["a"]["steps"])
    assert any(any(s.vacuous) for s in res[0]["a"]["steps"])
    assert {fv.tier for fv in res[0]["a"]["final"]} >= {Tier.PARTIALLY_CERTIFIED}
    assert res[0]["a"]["shards"] == tuple(HeadShard.even(rank=r, world=WORLD, total=HEADS)
                                          for r in range(WORLD))


def test_replay_is_deterministic(fleet_run: tuple[Path, list[dict[str, Any]]]) -> None:
    _, res = fleet_run
    for r in range(WORLD):
        assert res[r]["a"]["steps"] == res[r]["b"]["steps"]
        assert res[r]["a"]["final"] == res[r]["b"]["final"]
        assert res[r]["a"]["local"] == res[r]["b"]["local"]


def test_budget_spent_once_not_once_per_rank(
        fleet_run: tuple[Path, list[dict[str, Any]]]) -> None:
    _, res = fleet_run
    n_prob = sum(probabilistic(t) for t in range(STEPS))
    for r in range(WORLD):
        run = res[r]["a"]
        for j, fv in enumerate(run["final"]):
            assert fv.spent == telescoping_spent(n_prob, DELTA) < DELTA
            local = run["local"][j]
            assert local.delta_req == DELTA / WORLD
            assert local.spent == telescoping_spent(n_prob, DELTA / WORLD)
        # Each probabilistic step charges the whole request delta_req/((i+1)(i+2)) once,
        # and each rank certified its heads at a quarter of it.
        i = 0
        for t, step in enumerate(run["steps"]):
            expect = telescoping_delta(i, DELTA) if probabilistic(t) else Fraction(0)
            assert step.charged == (expect,) * N_REQ
            i += probabilistic(t)
        for k, per_req in enumerate(run["allowances"]):
            assert per_req == [telescoping_delta(k, DELTA) / WORLD] * N_REQ
    total = sum(res[r]["a"]["local"][0].spent for r in range(WORLD))
    assert total == res[0]["a"]["final"][0].spent


def test_journals_merge_with_owners(fleet_run: tuple[Path, list[dict[str, Any]]]) -> None:
    out, res = fleet_run
    bounds = trace(1234)
    merged = merge_journals([out / f"rank{r}.sqlite" for r in range(WORLD)], n_slots=N_SLOTS)
    assert [m.request_id for m in merged] == [1, 2, 3]
    for j, m in enumerate(merged):
        fv = res[0]["a"]["final"][j].verdict
        assert m.agreed and m.tier is fv.tier
        assert (m.delta_req, m.spent, m.entries, m.entries_kept) == \
            (DELTA, fv.spent, fv.entries, fv.entries_kept)
        want = sorted((r, int(s), m.request_id,
                       bool(bounds[t, j, r * LOCAL + e] <= threshold(t)))
                      for r in range(WORLD) for t in range(STEPS)
                      for e, s in enumerate(slot_of(j, t)))
        assert [(w.rank, w.slot, w.request_id, w.kept) for w in m.writes] == want


def test_mismatched_sharding_refused_on_every_rank(
        fleet_run: tuple[Path, list[dict[str, Any]]]) -> None:
    _, res = fleet_run
    msgs = {res[r]["shard_error"] for r in range(WORLD)}
    assert len(msgs) == 1
    (msg,) = msgs
    assert msg is not None and "head shard of rank 3='heads [12, 16) of 16'" in msg
    assert "must start at head 11 (rank 2 holds heads [8, 11))" in msg


def test_divergent_spend_refused_and_failed_closed(
        fleet_run: tuple[Path, list[dict[str, Any]]]) -> None:
    _, res = fleet_run
    for r in range(WORLD):
        assert res[r]["diverge"] is not None and "disagree" in res[r]["diverge"]
        assert "(1 to 2)" in res[r]["diverge"]
        assert res[r]["diverge_verdict"].tier is Tier.EMPIRICAL


def test_ranks_stepping_different_requests_refused(
        fleet_run: tuple[Path, list[dict[str, Any]]]) -> None:
    _, res = fleet_run
    for r in range(WORLD):
        assert res[r]["ids"] is not None and "ids from 11 to 12" in res[r]["ids"]
        v = res[r]["ids_verdict"]
        assert v.tier is Tier.EMPIRICAL and not v.complete


def test_dead_rank_fails_the_request_closed(
        fleet_run: tuple[Path, list[dict[str, Any]]]) -> None:
    out, res = fleet_run
    for r in range(WORLD):
        ok, before = res[r]["before_death"]
        assert ok.complete and before.tier is Tier.CERTIFIED and before.complete
    for r in range(WORLD - 1):
        broken, after, again, local = res[r]["death"]
        assert not broken.complete and not again.complete
        assert after.tier is Tier.EMPIRICAL and not after.complete
        assert after.failure is not None and "step reduction failed" in after.failure
        assert local.tier is Tier.EMPIRICAL  # recorded in the rank's own journal
        # The spend never understates what the step in flight drew.
        assert after.spent == telescoping_spent(2, DELTA)
    merged = merge_journals([out / f"death{r}.sqlite" for r in range(WORLD)], n_slots=0)
    (m,) = merged
    assert m.tier is Tier.EMPIRICAL and not m.agreed
    assert m.spent < DELTA


# ----------------------------------------------------------------- one rank, in process


@pytest.fixture
def one_rank(tmp_path: Path) -> Any:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1, timeout=datetime.timedelta(seconds=5))
    yield
    dist.destroy_process_group()


@given(st.integers(1, 64), st.integers(0, 200), st.integers(1, 10**6), st.integers(2, 10**6))
def test_rank_shares_sum_to_one_allowance(world: int, i: int, num: int, den: int) -> None:
    # The identity the fleet's spend rests on: R ranks, each drawing the i-th allowance of
    # the share delta/R, together draw exactly the i-th allowance of delta, and after n
    # steps exactly one request's spend, below delta.
    delta = Fraction(min(num, den - 1), den)
    share = Probability.budget(delta).split(world)
    assert world * telescoping_delta(i, share) == telescoping_delta(i, delta)
    assert world * telescoping_spent(i, share) == telescoping_spent(i, delta) < delta


def test_head_shard_validation() -> None:
    with pytest.raises(InvalidValueError, match="0 <= start < stop <= total"):
        HeadShard(4, 4, 8)
    with pytest.raises(InvalidValueError, match="multiple of world=3"):
        HeadShard.even(rank=0, world=3, total=8)
    with pytest.raises(InvalidValueError, match="rank=4"):
        HeadShard.even(rank=4, world=4, total=8)


def test_needs_a_process_group() -> None:
    with pytest.raises(InvalidValueError, match="init_process_group"):
        FleetLedger(HeadShard(0, 4, 4))


def test_one_rank_shard_must_hold_every_head(one_rank: None) -> None:
    with pytest.raises(InvalidValueError, match=r"heads \[3, 4\) are held by no rank"):
        check_sharding(HeadShard(0, 3, 4))
    with pytest.raises(InvalidValueError, match="must start at head 0"):
        check_sharding(HeadShard(1, 4, 4))


def test_one_rank_step_validation(one_rank: None) -> None:
    fleet = FleetLedger(HeadShard(0, 2, 2))
    fleet.open_request(1, delta_req="1/100")
    with pytest.raises(InvalidValueError, match=r"bounds=\(3,\)"):
        fleet.step([1], torch.zeros(3), threshold=TAU, metric=TV, evidence=PROOF)
    with pytest.raises(InvalidValueError, match="slots"):
        fleet.step([1], torch.zeros(1, 3), threshold=TAU, metric=TV, evidence=PROOF,
                   slots=torch.zeros(1, 2, dtype=torch.int64))
    with pytest.raises(UnknownRequestError):
        fleet.step([2], torch.zeros(1, 3), threshold=TAU, metric=TV, evidence=PROOF)
    with pytest.raises(InvalidValueError, match=r"bounds\[1\]"):
        fleet.step([1], torch.tensor([[0.0, float("nan")]]), threshold=TAU, metric=TV,
                   evidence=PROOF)
    with pytest.raises(InvalidValueError, match="must not repeat"):
        fleet.step([1, 1], torch.zeros(2, 3), threshold=TAU, metric=TV, evidence=PROOF)
    s = fleet.step([1], torch.tensor([[0.05, 0.5]]), threshold=TAU, metric=TV, evidence=PROOF)
    assert s.complete and s.kept == (1,) and s.entries == (2,) and s.fallback == (True,)
    assert s.meter_max == (0.5,) and s.charged == (Fraction(0),)
    v = fleet.close_request(1)
    assert v.verdict.closed and v.spent == 0 and v.verdict.counts.deterministic == 1
    with pytest.raises(UnknownRequestError):
        fleet.close_request(1)


def test_merge_refuses_budget_shares_that_differ(tmp_path: Path) -> None:
    paths = [tmp_path / "a.sqlite", tmp_path / "b.sqlite"]
    for p, share in zip(paths, ("1/200", "1/300"), strict=True):
        led = RiskLedger(journal=p)
        led.open_request(delta_req=share, request_id=5)
        led.close()
    from witcert_calculus.errors import JournalError

    with pytest.raises(JournalError, match="budget shares differ"):
        merge_journals(paths, n_slots=0)


def test_one_rank_no_evidence_no_certificate(one_rank: None) -> None:
    """A fleet request with no step, or with steps no rank certified, is not CERTIFIED, as
    its local ledger says; one certified step is evidence."""
    from witcert_calculus.tiers import Measurement

    fleet = FleetLedger(HeadShard(0, 2, 2))
    for r in (1, 2, 3):
        fleet.open_request(r, delta_req="1/100")
    empty = fleet.close_request(1)
    assert empty.tier is Tier.EMPIRICAL and empty.complete
    assert empty.verdict.reason is not None and "no evidence" in empty.verdict.reason
    assert fleet.local.verdict(1).tier is Tier.EMPIRICAL
    probe = Measurement("probe", samples=1)
    fleet.step([2], torch.tensor([[0.01, 0.02]]), threshold=TAU, metric=TV, evidence=probe)
    only = fleet.close_request(2)
    assert only.tier is Tier.EMPIRICAL and only.verdict.counts.empirical_fallback == 1
    assert only.verdict.counts.deterministic == 0
    assert only.verdict.reason is not None and "no evidence" in only.verdict.reason
    assert fleet.local.verdict(2).tier is Tier.EMPIRICAL
    fleet.step([3], torch.tensor([[0.01, 0.02]]), threshold=TAU, metric=TV, evidence=probe)
    fleet.step([3], torch.tensor([[0.01, 0.02]]), threshold=TAU, metric=TV, evidence=PROOF)
    done = fleet.close_request(3)
    assert done.tier is Tier.CERTIFIED and done.verdict.reason is None
    assert fleet.local.verdict(3).tier is Tier.CERTIFIED
    fleet.close()


def test_merged_accounts_say_why_they_are_not_certified(tmp_path: Path) -> None:
    from witcert_calculus.tiers import Measurement
    from witcert_calculus.contracts import Regime

    paths = [tmp_path / "a.sqlite", tmp_path / "b.sqlite"]
    for k, p in enumerate(paths):
        led = RiskLedger(journal=p)
        led.open_request(delta_req="1/200", request_id=5)  # no reading on either rank
        led.open_request(delta_req="1/200", request_id=6)
        led.admit(6, reading(TV, 0.01, evidence=PROOF))
        if k == 0:  # only rank 0 serves request 7
            led.open_request(delta_req="1/200", request_id=7)
            led.admit(7, reading(TV, 0.01, evidence=PROOF))
            led.admit(5, reading(TV, 0.3, evidence=Measurement("p", samples=1),
                                 regime=Regime.MEASURED))
        led.close()
    merged = {m.request_id: m for m in merge_journals(paths, n_slots=0)}
    assert merged[6].tier is Tier.CERTIFIED and merged[6].reason is None
    assert merged[5].tier is Tier.EMPIRICAL and merged[5].reason is not None
    assert "rank 0: no evidence" in merged[5].reason and "rank 1: no evidence" in merged[5].reason
    assert merged[7].tier is Tier.EMPIRICAL
    assert merged[7].reason is not None and "ranks [1] lack the request" in merged[7].reason
