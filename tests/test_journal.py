"""Crash-safe SQLite journal: replay to identical state, tamper detection, SIGKILL crash test."""

from __future__ import annotations

import multiprocessing
import os
import select
import signal
import sqlite3
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from witcert_calculus.accounting.budget import telescoping_spent
from witcert_calculus.accounting.journal import FORMAT_VERSION, HighWaterMark, genesis_digest, \
    row_digest
from witcert_calculus.accounting.records import EmpiricalPolicy
from witcert_calculus.contracts import Reading, Regime
from witcert_calculus.errors import JournalError, SlotOwnershipError, TokenReusedError
from witcert_calculus.ledger import RiskLedger
from witcert_calculus.metrics import AtConsume, AttentionTV
from witcert_calculus.tiers import Measurement, Proof, Restricted, Tier
from reference.issued import proof, reading

TV = AttentionTV[AtConsume]
PROOF = proof("WitCert.Meters.tv_eform_sound")
N_SLOTS = 64


def _state(led: RiskLedger) -> tuple[Any, ...]:
    verdicts = tuple(led.verdict(r) for r in led.request_ids())
    snap = tuple(a.tolist() for a in led.slots.snapshot())
    sentinels = tuple((n, led.sentinel(n)) for n in led.sentinel_names())
    s = led.stats()
    return (verdicts, snap, sentinels, s.counts, s.open_by_tier, s.slots, s.events,
            s.slot_writes, s.worst_spent_fraction)


def _random_workload(led: RiskLedger, rng: np.random.Generator, n_ops: int) -> None:
    open_ids: list[int] = []
    led.add_sentinel("drift", delta=0.01)
    for _ in range(n_ops):
        u = rng.random()
        if not open_ids or u < 0.08:
            open_ids.append(led.open_request(delta_req=Fraction(1, int(rng.integers(2, 1000)))))
            continue
        r = open_ids[int(rng.integers(len(open_ids)))]
        if u < 0.35:
            led.admit(r, reading(TV, float(rng.random() * 0.1), evidence=PROOF,
                                 delta=led.next_allowance(r)))
        elif u < 0.5:
            ev = PROOF if rng.random() < 0.8 else Restricted(PROOF, subset="e_in <= 0.5")
            led.admit(r, reading(TV, 0.01, evidence=ev))
        elif u < 0.58:
            pol = EmpiricalPolicy.DEGRADE if rng.random() < 0.3 else EmpiricalPolicy.FALLBACK
            led.admit(r, reading(TV, 0.2, evidence=Measurement("probe", samples=3),
                                 regime=Regime.MEASURED), on_empirical=pol)
        elif u < 0.85:
            owners = led.slots.snapshot()[1]
            mine = np.flatnonzero((owners == -1) | (owners == r))
            foreign = np.flatnonzero((owners != -1) & (owners != r))
            evict = u >= 0.8
            k = 2 if evict else int(rng.integers(1, 9))
            if foreign.size and rng.random() < 0.15:
                # a batch that touches another request's slot is refused whole, and not journaled
                slots = np.append(rng.choice(mine, size=min(k - 1, mine.size), replace=False),
                                  rng.choice(foreign))
                seq = led.applied_seq
                with pytest.raises(SlotOwnershipError):
                    if evict:
                        led.evict(r, slots)
                    else:
                        led.admit_entries(r, rng.exponential(0.02, slots.size), threshold=0.03,
                                          metric=TV, evidence=PROOF, slots=slots)
                assert led.applied_seq == seq
                continue
            slots = rng.choice(mine, size=min(k, mine.size), replace=False)
            if evict:
                led.evict(r, slots)
            elif slots.size:
                led.admit_entries(r, rng.exponential(0.02, slots.size), threshold=0.03,
                                  metric=TV, evidence=PROOF, slots=slots,
                                  delta=led.next_allowance(r) if rng.random() < 0.5 else 0)
        elif u < 0.93:
            led.observe("drift", rng.uniform(0, 1, int(rng.integers(1, 5))), m=0.5, c=1.0)
        elif len(open_ids) > 1:
            led.close_request(r)
            open_ids.remove(r)


def test_replay_reaches_identical_state(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    led = RiskLedger(n_slots=N_SLOTS, journal=path)
    mem = RiskLedger(n_slots=N_SLOTS)
    _random_workload(led, np.random.default_rng(42), 600)
    _random_workload(mem, np.random.default_rng(42), 600)
    before = _state(led)
    assert before == _state(mem)  # the journal changes nothing about the semantics
    led.close()
    again = RiskLedger(n_slots=N_SLOTS, journal=path)
    assert _state(again) == before
    assert again.applied_seq == before[6] > 500
    with sqlite3.connect(path) as con:
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    again.close()


def test_wrong_slot_count_and_garbage_file(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    RiskLedger(n_slots=8, journal=path).close()
    with pytest.raises(JournalError, match="n_slots=8"):
        RiskLedger(n_slots=9, journal=path)
    bad = tmp_path / "garbage.sqlite"
    bad.write_bytes(b"this is not a database" * 100)
    with pytest.raises(JournalError, match="garbage.sqlite"):
        RiskLedger(journal=bad)


def test_tampered_journal_refuses_to_replay(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    led = RiskLedger(journal=path)
    r = led.open_request(delta_req="1/100")
    led.admit(r, reading(TV, 0.01, evidence=PROOF, delta=Fraction(1, 200)))
    led.admit(r, reading(TV, 0.01, evidence=PROOF, delta=Fraction(1, 600)))
    led.close()
    with sqlite3.connect(path) as con:  # inflate the second charge
        row = con.execute("SELECT seq, payload FROM events WHERE op='admit' ORDER BY seq DESC"
                          ).fetchone()
        con.execute("UPDATE events SET payload=? WHERE seq=?",
                    (row[1].replace('"1/600"', '"1/300"'), row[0]))
    with pytest.raises(JournalError, match="event 3 fails its digest"):
        RiskLedger(journal=path)  # the chain catches the edit
    _reseal(path)
    with pytest.raises(JournalError, match="is not the allowance 1/600"):
        RiskLedger(journal=path)  # and the replay rules a resealed one
    with sqlite3.connect(path) as con:  # a duplicated event (applied twice) is refused too
        con.execute("UPDATE events SET payload=replace(payload, '\"1/300\"', '\"1/600\"')")
        con.execute("INSERT INTO events (seq, op, payload, data, prev, digest) SELECT seq + 1, "
                    "op, payload, data, prev, digest FROM events WHERE op='admit' "
                    "ORDER BY seq DESC LIMIT 1")
    with pytest.raises(JournalError, match="event [34] fails its digest"):
        RiskLedger(journal=path)
    _reseal(path)
    with pytest.raises(JournalError, match=r"event 4 \(admit\) does not replay: .*applied twice"):
        RiskLedger(journal=path)


def test_admit_next_is_journaled_like_any_admission(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    led = RiskLedger(journal=path)
    r = led.open_request(delta_req="1/100")
    adm = [led.admit_next(r, lambda a: reading(TV, 0.01, evidence=PROOF, delta=a),
                          token=f"t{i}") for i in range(3)]
    with sqlite3.connect(path) as con:
        assert con.execute("SELECT COUNT(*) FROM events WHERE op='admit'").fetchone()[0] == 3
    led.close()
    again = RiskLedger(journal=path)
    assert [again.admission(f"t{i}") for i in range(3)] == adm
    assert again.spent(r) == telescoping_spent(3, "1/100")
    assert again.next_allowance(r) == Fraction(1, 2000)
    again.close()


def test_two_ledgers_on_one_journal_respect_slot_ownership(tmp_path: Path) -> None:
    """A second process's ledger sees the first one's writes before it decides, and a refused
    eviction or write is not journaled."""
    path = tmp_path / "j.sqlite"
    one = RiskLedger(n_slots=4, journal=path)
    two = RiskLedger(n_slots=4, journal=path)
    a = one.open_request(delta_req="1/100")
    b = two.open_request(delta_req="1/100")
    one.admit_entries(a, [0.01, 0.01], threshold=0.05, metric=TV, evidence=PROOF, slots=[0, 1])
    seq = one.applied_seq
    with pytest.raises(SlotOwnershipError, match="request 2 may not evict slot 1: it is owned by "
                                                 "request 1 \\(generation 1\\)"):
        two.evict(b, [1])
    with pytest.raises(SlotOwnershipError, match="request 2 may not write slot 0"):
        two.admit_entries(b, [0.01, 0.01], threshold=0.05, metric=TV, evidence=PROOF,
                          slots=[2, 0])
    with sqlite3.connect(path) as con:
        assert con.execute("SELECT MAX(seq) FROM events").fetchone()[0] == seq
    two.close_request(b)
    one.close_request(a)  # releases slots 0 and 1 in both replicas
    for led in (one, two):
        assert led.slots.snapshot()[1].tolist() == [-1] * 4
    assert one.slots.snapshot()[2].tolist() == two.slots.snapshot()[2].tolist() == [2, 2, 0, 0]
    one.close()
    two.close()
    again = RiskLedger(n_slots=4, journal=path)
    assert again.slots.snapshot()[2].tolist() == [2, 2, 0, 0]
    again.close()


def _reseal(path: Path) -> None:
    """Recompute the hash chain and the high-water mark after an edit, as a deliberate
    rewrite would (the chain carries no secret): what is left to catch it are the replay
    rules."""
    with sqlite3.connect(path) as con:
        meta = dict(con.execute("SELECT key, value FROM meta").fetchall())
        prev = genesis_digest(meta["journal_id"], int(meta["n_slots"]))
        rows = con.execute("SELECT seq, op, payload, data, token FROM events ORDER BY seq"
                           ).fetchall()
        seq = 0
        for seq, op, payload, data, token in rows:
            digest = row_digest(prev, seq, op, payload, bytes(data or b""), token)
            con.execute("UPDATE events SET prev=?, digest=? WHERE seq=?", (prev, digest, seq))
            prev = digest
    mark = HighWaterMark(f"{path}.mark", meta["journal_id"])
    mark.rewrite(seq, prev)
    mark.close()


def _tamper(path: Path, op: str, data: bytes | None = None, payload: str | None = None,
            nth: int = -1) -> None:
    with sqlite3.connect(path) as con:
        rows = con.execute("SELECT seq, payload FROM events WHERE op=? ORDER BY seq",
                           (op,)).fetchall()
        seq, old = rows[nth]
        con.execute("UPDATE events SET data=coalesce(?, data), payload=? WHERE seq=?",
                    (data, payload if payload is not None else old, seq))
    _reseal(path)


def test_replay_refuses_a_write_or_eviction_of_another_requests_slot(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    led = RiskLedger(n_slots=4, journal=path)
    a = led.open_request(delta_req="1/100")
    b = led.open_request(delta_req="1/100")
    led.admit_entries(a, [0.01], threshold=0.05, metric=TV, evidence=PROOF, slots=[0])
    led.admit_entries(b, [0.01], threshold=0.05, metric=TV, evidence=PROOF, slots=[1])
    led.evict(b, [1])
    led.close()
    slot0 = np.array([0], dtype="<i8").tobytes()
    with sqlite3.connect(path) as con:  # slots as <i8, then their generations
        (evicted,) = con.execute("SELECT data FROM events WHERE op='evict'").fetchone()
    assert evicted == np.array([1, 1], dtype="<i8").tobytes()
    _tamper(path, "evict", data=slot0 + evicted[8:])  # b's eviction now names a's slot
    with pytest.raises(JournalError, match=r"event 5 \(evict\) does not replay: request 2 may "
                                           r"not evict slot 0: it is owned by request 1"):
        RiskLedger(n_slots=4, journal=path)
    _tamper(path, "evict", data=evicted)
    RiskLedger(n_slots=4, journal=path).close()  # restored: it replays again
    with sqlite3.connect(path) as con:  # b's write (slots first, as <i8) now names a's slot
        (data,) = con.execute("SELECT data FROM events WHERE op='entries' ORDER BY seq DESC"
                              ).fetchone()
    assert data[:8] == np.array([1], dtype="<i8").tobytes()
    _tamper(path, "entries", data=slot0 + data[8:])  # its recorded generation is slot 1's
    with pytest.raises(JournalError, match=r"event 4 \(entries\) does not replay: request 2: its "
                                           r"write names slot 0 at generation 0, but the slot "
                                           r"is at generation 1"):
        RiskLedger(n_slots=4, journal=path)
    one = np.array([1], dtype="<i8").tobytes()  # and with slot 0's generation, its owner
    _tamper(path, "entries", data=slot0 + data[8:-8] + one)
    with pytest.raises(JournalError, match=r"event 4 \(entries\) does not replay: request 2 may "
                                           r"not write slot 0"):
        RiskLedger(n_slots=4, journal=path)


def test_replay_refuses_a_close_that_does_not_release_exactly_its_slots(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    led = RiskLedger(n_slots=4, journal=path)
    a = led.open_request(delta_req="1/100")
    b = led.open_request(delta_req="1/100")
    led.admit_entries(a, [0.01, 0.01], threshold=0.05, metric=TV, evidence=PROOF, slots=[0, 2])
    led.admit_entries(b, [0.01], threshold=0.05, metric=TV, evidence=PROOF, slots=[1])
    led.close_request(a)
    led.close()
    with sqlite3.connect(path) as con:
        (data,) = con.execute("SELECT data FROM events WHERE op='close'").fetchone()
    assert np.frombuffer(data, dtype="<i8").tolist() == [0, 2, 1, 1]  # slots, generations
    for bad in ([0], [0, 1, 2], []):
        _tamper(path, "close", data=np.array(bad + [1] * len(bad), dtype="<i8").tobytes())
        with pytest.raises(JournalError, match=r"request 1: its close releases slots .* but "
                                               r"it owns slots \[0, 2\]"):
            RiskLedger(n_slots=4, journal=path)


def test_journal_of_another_format_refuses_to_open(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    RiskLedger(journal=path).close()
    assert FORMAT_VERSION == 3
    with sqlite3.connect(path) as con:
        con.execute("UPDATE meta SET value='2' WHERE key='format'")
    with pytest.raises(JournalError, match="format '2', expected 3"):
        RiskLedger(journal=path)


def test_durable_before_acknowledged(tmp_path: Path) -> None:
    """An acknowledged admission is already in the file, seen by an independent connection."""
    path = tmp_path / "j.sqlite"
    led = RiskLedger(journal=path)
    r = led.open_request(delta_req="1/100")
    adm = led.admit(r, reading(TV, 0.01, evidence=PROOF, delta=Fraction(1, 200)), token="t0")
    with sqlite3.connect(path) as con:
        assert con.execute("SELECT COUNT(*) FROM events WHERE token='t0'").fetchone()[0] == 1
    other = RiskLedger(journal=path)
    assert other.admission("t0") == adm and other.spent(r) == Fraction(1, 200)
    other.close()
    led.close()


# ----------------------------------------------------------------- SIGKILL crash test

PLAN_REQUESTS = 30
PLAN_OPS = 24


def _plan_delta(r: int) -> Fraction:
    return Fraction(1, 10 + r)


def _writer(path: str, ack_path: str) -> None:
    """Child process: run the fixed plan, resuming from the journal, acking every admission."""
    led = RiskLedger(n_slots=N_SLOTS, journal=path)
    fd = os.open(ack_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    known = set(led.request_ids())
    for r in range(1, PLAN_REQUESTS + 1):
        if r not in known:
            led.open_request(delta_req=_plan_delta(r), request_id=r)
        for k in range(PLAN_OPS):
            tok = f"{r}:{k}"
            rng = np.random.default_rng(r * 1000 + k)
            u = rng.random()
            if u < 0.45:
                adm = led.admit(r, reading(TV, 0.01, evidence=PROOF,
                                           delta=led.next_allowance(r)), token=tok)
            elif u < 0.7:
                adm = led.admit(r, reading(TV, 0.01, evidence=PROOF), token=tok)
            elif u < 0.8:
                adm = led.admit(r, reading(TV, 0.3, evidence=Measurement("p", samples=1),
                                           regime=Regime.MEASURED), token=tok)
            else:  # each request writes its own two slots
                slots = 2 * (r - 1) + rng.choice(2, size=2, replace=False)
                adm = led.admit_entries(r, rng.exponential(0.02, 2), threshold=0.03, metric=TV,
                                        evidence=PROOF, slots=slots, token=tok,
                                        delta=led.next_allowance(r)).admission
            os.write(fd, f"{tok} {adm.ordinal} {adm.charged} {adm.spent}\n".encode())
    os._exit(0)


def _check(path: Path, acked: dict[str, tuple[int, str, str]]) -> RiskLedger:
    led = RiskLedger(n_slots=N_SLOTS, journal=path)  # replay validates ordinals and charges
    for tok, (ordinal, charged, spent) in acked.items():
        adm = led.admission(tok)
        assert adm is not None, f"acknowledged event {tok} lost"
        assert (adm.ordinal, str(adm.charged), str(adm.spent)) == (ordinal, charged, spent)
    with sqlite3.connect(path) as con:
        counts = dict(con.execute(
            "SELECT json_extract(payload, '$.rid'), COUNT(*) FROM events "
            "WHERE op IN ('admit', 'entries') GROUP BY 1").fetchall())
        dup = con.execute("SELECT COUNT(*) - COUNT(DISTINCT token) FROM events "
                          "WHERE token IS NOT NULL").fetchone()[0]
    assert dup == 0
    for r in led.request_ids():
        v = led.verdict(r)
        assert v.counts.total == counts.get(r, 0)  # no event applied twice, none dropped
        assert v.spent == telescoping_spent(v.counts.probabilistic, _plan_delta(r)) < v.delta_req
    return led


def _read_acks(ack_path: Path) -> dict[str, tuple[int, str, str]]:
    out: dict[str, tuple[int, str, str]] = {}
    if not ack_path.exists():
        return out
    for line in ack_path.read_text().split("\n")[:-1]:  # only complete lines
        tok, ordinal, charged, spent = line.split()
        assert tok not in out or out[tok] == (int(ordinal), charged, spent)
        out[tok] = (int(ordinal), charged, spent)
    return out


def _complete(path: Path, ack_path: Path) -> None:
    acked = _read_acks(ack_path)
    assert len(acked) == PLAN_REQUESTS * PLAN_OPS
    led = _check(path, acked)
    assert sum(led.verdict(r).counts.total for r in led.request_ids()) == PLAN_REQUESTS * PLAN_OPS
    led.close()


@pytest.mark.slow
def test_sigkill_crash_loses_nothing_acknowledged(tmp_path: Path) -> None:
    """>= 50 SIGKILLs of a journaled writer at random points: no acknowledged event lost,
    none applied twice, no budget exceeded; then the plan completes exactly once."""
    epoch = 0
    path = tmp_path / f"crash{epoch}.sqlite"
    ack_path = tmp_path / f"acks{epoch}.txt"
    ctx = multiprocessing.get_context("fork")
    rng = np.random.default_rng(99)
    kills = 0
    progress: set[int] = set()
    window = 0.12  # kill delay range, widened when a loaded machine makes no progress
    while kills < 60:
        proc = ctx.Process(target=_writer, args=(str(path), str(ack_path)))
        proc.start()
        time.sleep(float(rng.uniform(0.0, window)))
        assert proc.pid is not None
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        if proc.exitcode == 0:  # the plan completed before this kill (fast disk): new epoch
            _complete(path, ack_path)
            epoch += 1
            path = tmp_path / f"crash{epoch}.sqlite"
            ack_path = tmp_path / f"acks{epoch}.txt"
            continue
        assert proc.exitcode == -signal.SIGKILL
        kills += 1
        if not path.exists():  # killed before the journal file was created: wait longer
            window = min(window * 1.5, 2.0)
            continue
        led = _check(path, _read_acks(ack_path))
        if led.applied_seq in progress:
            window = min(window * 1.5, 2.0)
        progress.add(led.applied_seq)
        led.close()
    assert kills >= 50
    assert len(progress) > 10  # the kills landed at many different points
    # finish the plan without interference and check it is applied exactly once
    proc = ctx.Process(target=_writer, args=(str(path), str(ack_path)))
    proc.start()
    proc.join(timeout=300)
    assert proc.exitcode == 0
    _complete(path, ack_path)


# ----------------------------------------------------------------- integrity and durability


def _degraded_journal(path: Path) -> RiskLedger:
    led = RiskLedger(journal=path)
    r = led.open_request(delta_req="1/100")
    led.admit(r, reading(TV, 0.01, evidence=PROOF))
    led.admit(r, reading(TV, 0.2, evidence=Measurement("probe", samples=3),
                         regime=Regime.MEASURED), on_empirical=EmpiricalPolicy.DEGRADE)
    return led


def test_an_edited_admission_never_changes_the_verdict(tmp_path: Path) -> None:
    """Reproducer: editing one admission's cap (EMPIRICAL -> CERTIFIED) in the file used to
    reopen as a CERTIFIED verdict with empirical_degraded=1; now it is a JournalError naming
    the event."""
    path = tmp_path / "j.sqlite"
    led = _degraded_journal(path)
    assert led.verdict(1).tier is Tier.EMPIRICAL
    led.close()
    with sqlite3.connect(path) as con:
        (payload,) = con.execute("SELECT payload FROM events WHERE seq=3").fetchone()
        assert '"cap": 1' in payload
        con.execute("UPDATE events SET payload=? WHERE seq=3",
                    (payload.replace('"cap": 1', '"cap": 3'),))
    with pytest.raises(JournalError, match="event 3") as info:
        RiskLedger(journal=path)
    assert info.value.seq == 3


def test_a_resealed_edit_is_refused_by_the_replay_rules(tmp_path: Path) -> None:
    """An edit whose chain was recomputed (the chain has no secret) still meets the replay
    rules: an empirical admission that does not cap the verdict at EMPIRICAL is refused."""
    path = tmp_path / "j.sqlite"
    _degraded_journal(path).close()
    with sqlite3.connect(path) as con:
        (payload,) = con.execute("SELECT payload FROM events WHERE seq=3").fetchone()
        con.execute("UPDATE events SET payload=? WHERE seq=3",
                    (payload.replace('"cap": 1', '"cap": 3'),))
    _reseal(path)
    with pytest.raises(JournalError, match=r"event 3 \(admit\).*empirical_degraded.*caps the "
                                           r"verdict at CERTIFIED") as info:
        RiskLedger(journal=path)
    assert info.value.seq == 3


def _wal_crash_copy(tmp_path: Path, n_events: int) -> tuple[Path, int]:
    """A journal as a crash leaves it: events committed to the WAL, never checkpointed."""
    live = tmp_path / "live"
    live.mkdir()
    path = live / "j.sqlite"
    led = RiskLedger(journal=path)
    r = led.open_request(delta_req="1/100")
    for _ in range(n_events - 1):
        led.admit(r, reading(TV, 0.01, evidence=PROOF))
    seq = led.applied_seq
    crash = tmp_path / "crash"
    crash.mkdir()
    for f in live.iterdir():  # the files as they are on disk while the writer runs
        (crash / f.name).write_bytes(f.read_bytes())
    led.close()
    return crash / "j.sqlite", seq


def test_a_damaged_wal_never_reopens_with_fewer_events(tmp_path: Path) -> None:
    """Reproducer: a crash before checkpoint, then a damaged WAL, used to reopen silently at
    seq 11 of 25; now the high-water mark beside the database refuses it."""
    path, acked = _wal_crash_copy(tmp_path, 25)
    assert acked == 25
    wal = Path(f"{path}-wal")
    assert wal.stat().st_size > 0
    intact = tmp_path / "intact"
    intact.mkdir()
    for f in path.parent.iterdir():
        (intact / f.name).write_bytes(f.read_bytes())
    led = RiskLedger(journal=intact / "j.sqlite")  # the undamaged copy replays everything
    assert led.applied_seq == 25
    led.close()
    data = bytearray(wal.read_bytes())
    data[len(data) // 2] ^= 0xFF  # a frame in the middle: SQLite stops reading the WAL there
    wal.write_bytes(bytes(data))
    with pytest.raises(JournalError, match="high-water mark") as info:
        RiskLedger(journal=path)
    assert info.value.seq == 25


def test_a_truncated_database_never_reopens_with_fewer_events(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    led = RiskLedger(journal=path)
    r = led.open_request(delta_req="1/100")
    for _ in range(9):
        led.admit(r, reading(TV, 0.01, evidence=PROOF))
    led.close()
    with sqlite3.connect(path) as con:  # the tail lost: the last four events
        con.execute("DELETE FROM events WHERE seq > 6")
    with pytest.raises(JournalError, match="high-water mark") as info:
        RiskLedger(journal=path)
    assert info.value.seq == 10


def test_idempotency_tokens_are_scoped_to_their_request(tmp_path: Path) -> None:
    """Reproducer: admit(r3, c, token="t") then admit(r2, c, token="t") used to return r3's
    acknowledgement and record nothing for r2."""
    led = RiskLedger(journal=tmp_path / "j.sqlite")
    r1, r2, r3 = (led.open_request(delta_req="1/100") for _ in range(3))
    cert = reading(TV, 0.01, evidence=PROOF)
    first = led.admit(r3, cert, token="t")
    assert led.admit(r3, cert, token="t") == first  # a retry on the same request
    with pytest.raises(TokenReusedError, match=r"token 't'.*request 3.*request 2") as info:
        led.admit(r2, cert, token="t")
    assert (info.value.token, info.value.request_id, info.value.recorded_request_id) == (
        "t", r2, r3)
    with pytest.raises(TokenReusedError):
        led.admit_next(r1, lambda a: cert, token="t")
    with pytest.raises(TokenReusedError):
        led.admit_entries(r2, [0.01], threshold=0.1, metric=TV, evidence=PROOF, token="t")
    assert led.verdict(r2).counts.total == 0 and led.verdict(r1).counts.total == 0
    led.close()


def _small_journal(path: Path) -> RiskLedger:
    led = RiskLedger(n_slots=8, journal=path)
    led.add_sentinel("drift", delta=0.01)
    a = led.open_request(delta_req="1/100")
    b = led.open_request(delta_req="1/140")
    led.admit(a, reading(TV, 0.01, evidence=PROOF, delta=led.next_allowance(a)), token="a0")
    led.admit(a, reading(TV, 0.01, evidence=Restricted(PROOF, subset="e_in <= 0.5")))
    led.admit(b, reading(TV, 0.2, evidence=Measurement("probe", samples=3),
                         regime=Regime.MEASURED), on_empirical=EmpiricalPolicy.DEGRADE)
    led.admit(b, reading(TV, 0.2, evidence=Measurement("probe", samples=3),
                         regime=Regime.MEASURED), token="b1")
    led.admit_entries(a, [0.01, 0.5, 0.02], threshold=0.05, metric=TV, evidence=PROOF,
                      slots=[0, 1, 2], delta=led.next_allowance(a), token="a2")
    led.admit_entries(b, [0.01], threshold=0.05, metric=TV, evidence=PROOF, slots=[5])
    led.evict(a, [1])
    led.observe("drift", [0.2, 0.7], m=0.5, c=1.0)
    c = led.open_request(delta_req="1/7")
    led.admit(c, reading(TV, 0.01, evidence=PROOF), token="c0")
    led.close_request(c)
    return led


def _full_state(led: RiskLedger) -> tuple[Any, ...]:
    return (_state(led), led.applied_seq,
            tuple(led.admission(t) for t in ("a0", "b1", "a2", "c0")))


def test_every_flipped_byte_is_refused_or_changes_nothing(tmp_path: Path) -> None:
    """Flip single bytes of a small journal (a sample of >= 500 positions of the database and
    every byte of its mark): each reopens with a JournalError or to exactly the state before."""
    path = tmp_path / "j.sqlite"
    led = _small_journal(path)
    expected = _full_state(led)
    led.close()
    db, mark = path.read_bytes(), Path(f"{path}.mark").read_bytes()
    assert not Path(f"{path}-wal").exists()  # checkpointed on close: one file holds all
    rng = np.random.default_rng(7)
    positions = [("db", int(p)) for p in rng.choice(len(db), size=min(len(db), 1000),
                                                      replace=False)]
    positions += [("mark", p) for p in range(len(mark))]
    outcomes = {"refused": 0, "unchanged": 0}
    work = tmp_path / "flip"
    for which, pos in positions:
        if work.exists():
            for f in work.iterdir():
                f.unlink()
        else:
            work.mkdir()
        d, m = bytearray(db), bytearray(mark)
        (d if which == "db" else m)[pos] ^= 0xFF
        (work / "j.sqlite").write_bytes(bytes(d))
        (work / "j.sqlite.mark").write_bytes(bytes(m))
        try:
            again = RiskLedger(n_slots=8, journal=work / "j.sqlite")
        except JournalError:
            outcomes["refused"] += 1
            continue
        try:
            got = _full_state(again)
        finally:
            again.close()
        assert got == expected, f"a flipped byte at {which}[{pos}] changed the state silently"
        outcomes["unchanged"] += 1
    assert outcomes["refused"] > 50 and sum(outcomes.values()) == len(positions) >= 500


def _ack_writer(path: str, fd_out: int, epoch: int) -> None:
    """Child: admit in a loop; after each admission returns, write its seq to the pipe."""
    led = RiskLedger(journal=path)
    cert = reading(TV, 0.01, evidence=PROOF)
    i = 0
    while True:
        tok = f"{epoch}:{i}"
        if i % 3 == 2:
            adm = led.admit_next(1, lambda a: reading(TV, 0.01, evidence=PROOF, delta=a),
                                 token=tok)
        else:
            adm = led.admit(1, cert, token=tok)
        os.write(fd_out, f"{led.applied_seq} {tok} {adm.ordinal} {adm.spent}\n".encode())
        i += 1


def _read_lines(fd: int, buf: bytearray, want: int, deadline: float) -> bool:
    """Read the pipe into ``buf`` until it holds ``want`` complete lines; whether EOF came."""
    while buf.count(b"\n") < want:
        if time.monotonic() > deadline:
            raise AssertionError("the writer stopped acknowledging")
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                return True
            buf += chunk
    return False


def test_sigkill_loses_no_acknowledged_event(tmp_path: Path) -> None:
    """>= 50 kill -9 of a child that admits in a loop and writes each acknowledged seq to a
    pipe: after every kill the journal reopens (no JournalError) with every acknowledged event,
    as acknowledged; an event acknowledged is one whose admit returned."""
    path = tmp_path / "j.sqlite"
    setup = RiskLedger(journal=path)
    setup.open_request(delta_req="1/100")
    setup.close()
    ctx = multiprocessing.get_context("fork")
    rng = np.random.default_rng(5)
    acked: dict[str, tuple[int, int, str]] = {}
    deadline = time.monotonic() + 120
    kills = 0
    for epoch in range(60):
        r, w = os.pipe()
        proc = ctx.Process(target=_ack_writer, args=(str(path), w, epoch))
        proc.start()
        os.close(w)
        buf = bytearray()
        try:
            eof = _read_lines(r, buf, int(rng.integers(1, 12)), deadline)
            assert not eof, "the writer died before it was killed"
            time.sleep(float(rng.uniform(0.0, 0.004)))  # land anywhere in the next admission
            assert proc.pid is not None
            os.kill(proc.pid, signal.SIGKILL)
            proc.join()
            assert proc.exitcode == -signal.SIGKILL
            kills += 1
            assert _read_lines(r, buf, 1 << 30, deadline)  # to EOF: every ack written before
        finally:
            os.close(r)
        for line in buf.decode().split("\n")[:-1]:  # complete lines only
            seq, tok, ordinal, spent = line.split()
            acked[tok] = (int(seq), int(ordinal), spent)
        led = RiskLedger(journal=path)  # never refuses: nothing acknowledged is missing
        for tok, (seq, ordinal, spent) in acked.items():
            adm = led.admission(tok)
            assert adm is not None, f"acknowledged event {seq} ({tok}) lost after kill {kills}"
            assert (adm.ordinal, str(adm.spent)) == (ordinal, spent)
        assert led.applied_seq >= max(s for s, _, _ in acked.values())
        led.close()
    assert kills >= 50 and len(acked) >= kills


def test_replay_checks_the_generations_a_slot_event_recorded(tmp_path: Path) -> None:
    """A write, an eviction and a close record the generations of their slots; a resealed
    edit of one is refused naming the slot and both generations."""
    path = tmp_path / "j.sqlite"
    led = RiskLedger(n_slots=4, journal=path)
    a = led.open_request(delta_req="1/100")
    led.admit_entries(a, [0.01, 0.01], threshold=0.05, metric=TV, evidence=PROOF, slots=[0, 1])
    led.admit_entries(a, [0.01], threshold=0.05, metric=TV, evidence=PROOF, slots=[1])
    led.evict(a, [1])
    led.close()
    with sqlite3.connect(path) as con:
        (data,) = con.execute("SELECT data FROM events WHERE op='evict'").fetchone()
    assert np.frombuffer(data, dtype="<i8").tolist() == [1, 2]  # slot 1, written twice
    _tamper(path, "evict", data=np.array([1, 1], dtype="<i8").tobytes())
    with pytest.raises(JournalError, match=r"event 4 \(evict\) does not replay: request 1: its "
                                           r"evict names slot 1 at generation 1, but the slot "
                                           r"is at generation 2") as info:
        RiskLedger(n_slots=4, journal=path)
    assert info.value.seq == 4
    _tamper(path, "evict", data=np.array([1], dtype="<i8").tobytes(), payload='{"rid": 1}')
    with pytest.raises(JournalError, match="does not record their generations"):
        RiskLedger(n_slots=4, journal=path)


def test_a_deleted_or_emptied_database_is_refused_beside_its_mark(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    led = RiskLedger(journal=path)
    led.open_request(delta_req="1/100")
    led.close()
    path.write_bytes(b"")  # emptied: SQLite would start a new, empty journal
    with pytest.raises(JournalError, match="belongs to another journal that acknowledged 1 "
                                           "events") as info:
        RiskLedger(journal=path)
    assert info.value.seq == 1
    path.unlink()  # deleted: the same
    with pytest.raises(JournalError, match="the database was replaced or emptied"):
        RiskLedger(journal=path)
    path.unlink()
    Path(f"{path}.mark").unlink()  # both deleted: a fresh journal (cannot be detected)
    fresh = RiskLedger(journal=path)
    assert fresh.applied_seq == 0
    fresh.close()
    again = RiskLedger(journal=path)
    assert again.request_ids() == ()
    again.close()
