"""Thread and process safety of the ledger: exact totals, budgets, read attribution."""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from witcert_calculus.contracts import Reading
from witcert_calculus.errors import (
    AllowanceMovedError,
    SlotOwnershipError,
    StaleReadError,
    UnwrittenSlotError,
)
from witcert_calculus.accounting.budget import telescoping_delta, telescoping_spent
from witcert_calculus.accounting.slots import SlotState
from witcert_calculus.ledger import RiskLedger
from witcert_calculus.metrics import AtConsume, AttentionTV
from witcert_calculus.tiers import Proof
from reference.issued import proof, reading

TV = AttentionTV[AtConsume]
PROOF = proof("WitCert.Meters.tv_eform_sound")
DELTA_REQ = Fraction(1, 100)
# Smaller than every allowance the tests can reach (index < 10^4), so no admission races
# for its allowance; the ledger still charges the full telescoping allowance.
TINY = DELTA_REQ / 10**9


def _work(led: RiskLedger, accounts: list[int], n_ops: int, seed: int, slot_base: int,
          slots_per_worker: int, n_slots: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    det = reading(TV, 0.01, evidence=PROOF)
    prob = reading(TV, 0.01, evidence=PROOF, delta=TINY)
    charges: dict[int, list[tuple[int, Fraction]]] = defaultdict(list)
    counts: dict[int, int] = defaultdict(int)
    writes: dict[tuple[int, int], int] = {}
    gens = dict.fromkeys(range(slot_base, slot_base + slots_per_worker), 0)
    reads: list[tuple[int, int, int]] = []
    refused = 0
    for _ in range(n_ops):
        r = accounts[int(rng.integers(len(accounts)))]
        u = rng.random()
        if u < 0.55:
            adm = led.admit(r, prob)
            assert adm.prob_index is not None
            charges[r].append((adm.prob_index, adm.charged))
        elif u < 0.9:
            led.admit(r, det)
        else:
            s = slot_base + int(rng.integers(slots_per_worker))
            r = accounts[s % len(accounts)]  # a slot is written by one account: its owner
            ea = led.admit_entries(r, [float(rng.exponential(0.02))], threshold=0.05,
                                   metric=TV, evidence=PROOF, slots=[s], delta=TINY)
            adm = ea.admission
            assert adm.prob_index is not None
            charges[r].append((adm.prob_index, adm.charged))
            gens[s] += 1  # only this worker writes its slots: it knows each generation
            writes[(s, gens[s])] = r
        counts[r] += 1
        # one read of a random slot anywhere in the pool, as a random account
        reader = accounts[int(rng.integers(len(accounts)))]
        try:
            g = led.slots.authorize(reader, int(rng.integers(n_slots)))
            rd = led.slots.read(g)
            reads.append((rd.slot, rd.generation, rd.owner))
        except (UnwrittenSlotError, StaleReadError):
            refused += 1
    return {"charges": charges, "counts": counts, "writes": writes, "reads": reads,
            "refused": refused}


def _verify(led: RiskLedger, results: list[dict[str, Any]], accounts: list[int],
            total_ops: int) -> int:
    writes: dict[tuple[int, int], int] = {}
    for res in results:
        writes.update(res["writes"])
    misattributed = 0
    n_reads = 0
    for res in results:
        for slot, gen, owner in res["reads"]:
            n_reads += 1
            misattributed += writes.get((slot, gen)) != owner
    assert misattributed == 0
    assert sum(sum(res["counts"].values()) for res in results) == total_ops
    for r in accounts:
        v = led.verdict(r)
        events = sorted(c for res in results for c in res["charges"].get(r, []))
        n = len(events)
        assert [i for i, _ in events] == list(range(n))  # every index drawn exactly once
        assert all(ch == telescoping_delta(i, DELTA_REQ) for i, ch in events)
        assert v.counts.probabilistic == n
        assert v.counts.total == sum(res["counts"].get(r, 0) for res in results)
        assert v.spent == sum((ch for _, ch in events), Fraction(0))
        assert v.spent == telescoping_spent(n, DELTA_REQ) < DELTA_REQ
    return n_reads


@pytest.mark.slow
def test_sixteen_threads_eight_accounts(tmp_path: Path) -> None:
    n_threads, n_accounts, total = 16, 8, 100_000
    n_slots = n_threads * 8
    led = RiskLedger(n_slots=n_slots)
    accounts = [led.open_request(delta_req=DELTA_REQ) for _ in range(n_accounts)]
    results: list[dict[str, Any]] = [{} for _ in range(n_threads)]
    errors: list[BaseException] = []

    def run(t: int) -> None:
        try:
            results[t] = _work(led, accounts, total // n_threads, seed=t, slot_base=8 * t,
                               slots_per_worker=8, n_slots=n_slots)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=run, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    elapsed = time.perf_counter() - t0
    assert not errors, errors
    n_reads = _verify(led, results, accounts, total)
    assert n_reads > total // 2
    assert led.stats().counts.total == total
    print(f"16 threads: {total} admissions and {n_reads} reads in {elapsed:.2f} s")


def _proc(path: str, accounts: list[int], seed: int, n_ops: int, out: str) -> None:
    import pickle

    led = RiskLedger(n_slots=64, journal=path)
    res = _work(led, accounts, n_ops, seed=seed, slot_base=16 * seed, slots_per_worker=16,
                n_slots=64)
    with open(out, "wb") as f:
        pickle.dump(res, f)
    led.close()
    os._exit(0)


@pytest.mark.slow
def test_four_processes_share_one_journal(tmp_path: Path) -> None:
    import pickle

    path = tmp_path / "shared.sqlite"
    led = RiskLedger(n_slots=64, journal=path)
    accounts = [led.open_request(delta_req=DELTA_REQ) for _ in range(4)]
    led.close()
    ctx = multiprocessing.get_context("fork")
    n_ops = 150
    outs = [str(tmp_path / f"res{i}.pkl") for i in range(4)]
    procs = [ctx.Process(target=_proc, args=(str(path), accounts, i, n_ops, outs[i]))
             for i in range(4)]
    t0 = time.perf_counter()
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
        assert p.exitcode == 0
    elapsed = time.perf_counter() - t0
    results = []
    for o in outs:
        with open(o, "rb") as f:
            results.append(pickle.load(f))
    final = RiskLedger(n_slots=64, journal=path)
    _verify(final, results, accounts, 4 * n_ops)
    assert final.stats().counts.total == 4 * n_ops
    final.close()
    print(f"4 processes: {4 * n_ops} journaled admissions in {elapsed:.2f} s")


@pytest.fixture
def fine_switching() -> Iterator[None]:
    """Switch threads far more often than the interpreter's default, so that the threads
    below interleave inside ledger calls rather than each running its loop in one slice."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


def _hammer(n_threads: int, work: Any) -> None:
    errors: list[BaseException] = []
    barrier = threading.Barrier(n_threads)

    def run(t: int) -> None:
        try:
            barrier.wait()
            work(t)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors


def test_sixteen_threads_contend_for_slots_only_owners_change_them(fine_switching: None) -> None:
    """16 requests fight over 6 free slots and one that a seventeenth request holds: a slot a
    request holds changes only through it, a refused batch changes nothing, and every count
    comes out exact."""
    n_threads, n_slots, n_rounds = 16, 7, 40
    led = RiskLedger(n_slots=n_slots)
    squatter = led.open_request(delta_req=DELTA_REQ)
    held = n_slots - 1
    led.admit_entries(squatter, [0.01], threshold=0.05, metric=TV, evidence=PROOF, slots=[held])
    reqs = [led.open_request(delta_req=DELTA_REQ) for _ in range(n_threads)]
    done: list[dict[str, int]] = [{} for _ in range(n_threads)]

    def work(t: int) -> None:
        me, rng = reqs[t], np.random.default_rng(100 + t)
        tally = {"admitted": 0, "written": 0, "evicts": 0, "evicted": 0, "refused": 0}
        with pytest.raises(SlotOwnershipError, match=f"request {me} may not evict slot {held}: "
                                                     f"it is owned by request {squatter}"):
            led.evict(me, [held])
        tally["refused"] += 1
        for _ in range(n_rounds):
            batch = [int(x) for x in rng.choice(n_slots, size=int(rng.integers(1, 3)),
                                                replace=False)]
            try:
                ea = led.admit_entries(me, rng.exponential(0.02, len(batch)), threshold=0.05,
                                       metric=TV, evidence=PROOF, slots=batch, delta=TINY)
            except SlotOwnershipError as err:
                assert err.request_id == me and err.slot in batch and err.owner != me
                tally["refused"] += 1
                # this request held no slot before the batch: a refused batch left it none
                assert led.slots.owned_by(me).size == 0
                continue
            tally["admitted"] += 1
            tally["written"] += len(batch)
            assert ea.admission.charged == telescoping_delta(tally["admitted"] - 1, DELTA_REQ)
            gens = {s: led.slots.record(s).generation for s in batch}
            assert all(led.slots.record(s).owner == me for s in batch)
            other = int(rng.integers(n_slots))  # try to evict a slot another request may hold
            if other not in batch:
                try:
                    led.evict(me, [other])
                    tally["evicts"] += 1
                    tally["evicted"] += 1
                except SlotOwnershipError as err:
                    assert (err.slot, err.request_id) == (other, me) and err.owner != me
                    tally["refused"] += 1
            for s in batch:  # nobody else touched what this request holds
                rec = led.slots.record(s)
                assert (rec.owner, rec.generation) == (me, gens[s])
            led.evict(me, batch)
            tally["evicts"] += 1
            tally["evicted"] += len(batch)
        done[t] = tally

    _hammer(n_threads, work)
    total = {k: sum(d[k] for d in done) for k in done[0]}
    assert total["admitted"] > 0 and total["refused"] >= n_threads
    stats = led.stats()
    assert stats.slot_writes == total["written"] + 1
    assert stats.events == 1 + n_threads + 1 + total["admitted"] + total["evicts"]
    assert dict(stats.slots)[SlotState.UNWRITTEN] == n_slots - 1  # each holder evicted its own
    rec = led.slots.record(held)
    assert (rec.owner, rec.generation) == (squatter, 1)  # never taken over
    gen_sum = int(led.slots.snapshot()[2].sum())
    assert gen_sum == 1 + total["written"] + total["evicted"]  # one generation per change
    for t, r in enumerate(reqs):
        v = led.verdict(r)
        assert v.counts.total == v.counts.probabilistic == v.steps == done[t]["admitted"]
        assert v.spent == telescoping_spent(done[t]["admitted"], DELTA_REQ) < DELTA_REQ


def test_sixteen_threads_race_for_one_allowance(fine_switching: None) -> None:
    """16 threads spend one request's budget. Racing rounds: every thread reads the same
    allowance, then all admit with it; exactly one wins and the other 15 are refused with the
    allowance they read and the one now due. Then ``admit_next`` from all threads at once never
    loses a race. Every telescoping index is drawn exactly once, and no more is spent."""
    n_threads, n_rounds, n_next = 16, 4, 25
    led = RiskLedger()
    r = led.open_request(delta_req=DELTA_REQ)
    drawn: list[list[tuple[int, Fraction]]] = [[] for _ in range(n_threads)]
    moved: list[int] = [0] * n_threads
    barrier = threading.Barrier(n_threads)

    def work(t: int) -> None:
        for _ in range(n_rounds):
            a = led.next_allowance(r)
            barrier.wait()  # everyone has read the same allowance
            try:
                adm = led.admit(r, reading(TV, 0.01, evidence=PROOF, delta=a))
                assert adm.prob_index is not None
                drawn[t].append((adm.prob_index, adm.charged))
            except AllowanceMovedError as err:
                assert (err.request_id, err.read) == (r, a)
                assert err.read == telescoping_delta(err.read_index, DELTA_REQ)
                assert err.due_index == err.read_index + 1  # one winner moved it
                assert err.due == telescoping_delta(err.due_index, DELTA_REQ) < a
                moved[t] += 1
            barrier.wait()  # the round is over before anyone reads again
        for _ in range(n_next):
            seen: list[Fraction] = []

            def at(a: Fraction) -> Reading[Any]:
                seen.append(a)
                return reading(TV, 0.01, evidence=PROOF, delta=a)

            adm = led.admit_next(r, at)
            assert adm.prob_index is not None and seen == [adm.charged]
            drawn[t].append((adm.prob_index, adm.charged))

    _hammer(n_threads, work)
    assert sum(moved) == n_rounds * (n_threads - 1)
    events = sorted(e for d in drawn for e in d)
    n = len(events)
    assert n == n_rounds + n_threads * n_next
    assert [i for i, _ in events] == list(range(n))
    assert all(ch == telescoping_delta(i, DELTA_REQ) for i, ch in events)
    v = led.verdict(r)
    assert v.counts.total == v.counts.probabilistic == n
    assert v.spent == telescoping_spent(n, DELTA_REQ) < DELTA_REQ
    assert led.next_allowance(r) == telescoping_delta(n, DELTA_REQ)
