"""Fail-closed slot state: explicit states, generations, attribution and the shared-read invariants."""

from __future__ import annotations

from fractions import Fraction

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from witcert_calculus.errors import (
    InvalidValueError,
    SlotOwnershipError,
    StaleReadError,
    UnknownRequestError,
    UnwrittenSlotError,
)
from witcert_calculus.accounting.slots import ReadGrant, SlotState
from witcert_calculus.ledger import RiskLedger
from witcert_calculus.metrics import AtConsume, AttentionTV
from witcert_calculus.tiers import Proof
from reference.issued import proof

TV = AttentionTV[AtConsume]
PROOF = proof("WitCert.Meters.tv_eform_sound")


def write(led: RiskLedger, r: int, slots: list[int], bounds: list[float], *,
          threshold: float = 0.05, prob: bool = False) -> None:
    led.admit_entries(r, bounds, threshold=threshold, metric=TV, evidence=PROOF,
                      delta=led.next_allowance(r) if prob else 0, slots=slots)


def test_states_owner_generation() -> None:
    led = RiskLedger(n_slots=4)
    r = led.open_request(delta_req="1/100")
    rec = led.slots.record(0)
    assert (rec.state, rec.owner, rec.generation) == (SlotState.UNWRITTEN, None, 0)
    write(led, r, [0, 1], [0.01, 0.5])
    assert led.slots.record(0).state is SlotState.MASKED
    assert led.slots.record(0).bound == 0.01
    assert led.slots.record(1).state is SlotState.KEPT_EXACT  # violating entry restored
    assert led.slots.record(1).bound == 0.0
    assert led.slots.record(1).owner == r and led.slots.record(1).generation == 1
    write(led, r, [1], [0.001])
    assert led.slots.record(1).generation == 2 and led.slots.record(1).state is SlotState.MASKED
    assert led.slots.counts() == {SlotState.UNWRITTEN: 2, SlotState.MASKED: 2,
                                  SlotState.KEPT_EXACT: 0}


def test_unwritten_read_raises() -> None:
    led = RiskLedger(n_slots=2)
    r = led.open_request(delta_req="1/100")
    with pytest.raises(UnwrittenSlotError, match="slot 1 is UNWRITTEN"):
        led.slots.authorize(r, 1)


def test_stale_read_raises() -> None:
    led = RiskLedger(n_slots=2)
    r = led.open_request(delta_req="1/100")
    write(led, r, [0], [0.01])
    g = led.slots.authorize(r, 0)
    assert led.slots.read(g).generation == 1
    write(led, r, [0], [0.02])
    with pytest.raises(StaleReadError, match="authorised at generation 1 but is now at generation 2"):
        led.slots.read(g)
    g2 = led.slots.authorize(r, 0)
    led.evict(r, [0])
    with pytest.raises(StaleReadError):
        led.slots.read(g2)
    with pytest.raises(UnwrittenSlotError):
        led.slots.authorize(r, 0)


def test_unknown_reader_raises() -> None:
    led = RiskLedger(n_slots=2)
    r = led.open_request(delta_req="1/100")
    write(led, r, [0], [0.01])
    with pytest.raises(UnknownRequestError, match="unknown request id 42"):
        led.slots.authorize(42, 0)
    g = led.slots.authorize(r, 0)
    forged = type(g)(slot=0, reader=42, generation=g.generation, owner=r)
    with pytest.raises(UnknownRequestError):
        led.slots.read(forged)
    led.close_request(r)
    with pytest.raises(UnknownRequestError):
        led.slots.read(g)


@pytest.mark.parametrize("slot", [-1, 2, 1.0, True])
def test_bad_slot_index(slot: object) -> None:
    led = RiskLedger(n_slots=2)
    r = led.open_request(delta_req="1/100")
    with pytest.raises(InvalidValueError, match="slot"):
        led.slots.authorize(r, slot)  # type: ignore[arg-type]


def test_bad_write_slots_leave_state_untouched() -> None:
    led = RiskLedger(n_slots=4)
    r = led.open_request(delta_req="1/100")
    with pytest.raises(InvalidValueError, match="repeat"):
        write(led, r, [1, 1], [0.01, 0.01])
    with pytest.raises(InvalidValueError, match="one slot per entry"):
        write(led, r, [1], [0.01, 0.01])
    with pytest.raises(InvalidValueError, match=r"\[0, 4\)"):
        write(led, r, [4], [0.01])
    with pytest.raises(InvalidValueError, match=r"bounds\[0\]"):
        write(led, r, [0], [float("nan")])
    # invariant 1: a write that failed its audit leaves nothing readable
    assert led.slots.counts()[SlotState.UNWRITTEN] == 4
    for s in range(4):
        with pytest.raises(UnwrittenSlotError):
            led.slots.authorize(r, s)
    assert led.verdict(r).counts.total == 0


def test_shared_read_attributed_to_owner_and_not_charged() -> None:
    """Prefix sharing: reads of another request's slot are attributed to the writer, never charged."""
    led = RiskLedger(n_slots=8)
    a = led.open_request(delta_req="1/100")
    b = led.open_request(delta_req="1/100")
    write(led, a, [0, 1, 2], [0.01, 0.02, 0.9], prob=True)
    spent_a, spent_b = led.spent(a), led.spent(b)
    assert spent_a == Fraction(1, 200)
    for _ in range(100):
        for s in (0, 1, 2):
            rd = led.slots.read(led.slots.authorize(b, s))
            assert rd.owner == a and rd.reader == b and rd.shared
    assert led.spent(a) == spent_a and led.spent(b) == spent_b  # invariant 4: once per write
    assert led.slots.reads == (0, 300)
    rd = led.slots.read(led.slots.authorize(a, 0))
    assert not rd.shared and led.slots.reads == (1, 300)
    # the violating entry (bound 0.9 > threshold) was restored to exact bytes before any read
    assert led.slots.read(led.slots.authorize(b, 2)).state is SlotState.KEPT_EXACT
    # another request cannot take the slot over; once its owner evicts it, the slot is free:
    # old grants go stale, new reads are attributed to the new owner
    g = led.slots.authorize(b, 1)
    with pytest.raises(SlotOwnershipError):
        write(led, b, [1], [0.001])
    assert led.slots.read(g).owner == a
    led.evict(a, [1])
    write(led, b, [1], [0.001])
    with pytest.raises(StaleReadError):
        led.slots.read(g)
    assert led.slots.read(led.slots.authorize(a, 1)).owner == b


def test_slot_state_only_through_ledger() -> None:
    led = RiskLedger(n_slots=2)
    r = led.open_request(delta_req="1/100")
    with pytest.raises(InvalidValueError, match="only through its ledger"):
        led.slots.apply_evict(object(), r, np.array([0], dtype=np.int64))
    with pytest.raises(InvalidValueError, match="only through its ledger"):
        led.slots.apply_write(object(), r, np.array([0], dtype=np.int64), np.array([True]),
                              np.array([0.01]))


@given(st.lists(st.tuples(st.sampled_from(["write", "evict", "read", "auth"]),
                          st.integers(0, 5), st.integers(0, 2),
                          st.floats(0, 0.2, allow_nan=False)), max_size=80))
@settings(max_examples=80, deadline=None)
def test_model_based_fail_closed(ops: list[tuple[str, int, int, float]]) -> None:
    """Against a reference model: every read either returns the model's (owner, generation) or raises."""
    led = RiskLedger(n_slots=6)
    reqs = [led.open_request(delta_req="1/10") for _ in range(3)]
    model: dict[int, tuple[int, int, bool] | None] = {s: None for s in range(6)}
    gens = dict.fromkeys(range(6), 0)
    grants: list[tuple[ReadGrant, int]] = []
    for op, slot, who, bound in ops:
        r = reqs[who]
        held = model[slot]
        if op in ("write", "evict") and held is not None and held[0] != r:
            # only the owner may rewrite or evict a written slot; nothing changes on refusal
            with pytest.raises(SlotOwnershipError,
                               match=f"request {r} may not {op} slot {slot}: it is owned by "
                                     f"request {held[0]} "):
                if op == "write":
                    write(led, r, [slot], [bound], threshold=0.1)
                else:
                    led.evict(r, [slot])
        elif op == "write":
            write(led, r, [slot], [bound], threshold=0.1)
            gens[slot] += 1
            model[slot] = (r, gens[slot], bound <= 0.1)
        elif op == "evict":
            led.evict(r, [slot])
            gens[slot] += 1
            model[slot] = None
        elif op == "auth":
            if model[slot] is None:
                with pytest.raises(UnwrittenSlotError):
                    led.slots.authorize(r, slot)
            else:
                grants.append((led.slots.authorize(r, slot), gens[slot]))
        elif grants:
            g, gen = grants[who % len(grants)]
            cur = model[g.slot]
            if gens[g.slot] != gen:
                with pytest.raises(StaleReadError):
                    led.slots.read(g)
            else:
                assert cur is not None
                rd = led.slots.read(g)
                assert (rd.owner, rd.generation) == (cur[0], cur[1])
                assert rd.state is (SlotState.MASKED if cur[2] else SlotState.KEPT_EXACT)
    st_, owners, gen_arr, _ = led.slots.snapshot()
    for s in range(6):
        assert int(gen_arr[s]) == gens[s]
        m = model[s]
        assert int(st_[s]) == (0 if m is None else (1 if m[2] else 2))
        assert int(owners[s]) == (-1 if m is None else m[0])


def test_four_shared_read_invariants_under_concurrent_readers() -> None:
    """1 write-audit before any shared read; 2 explicit state; 3 a violating entry is exact before
    any read; 4 budget spent once per write -- checked while reader threads hammer the pool."""
    n_slots, threshold = 32, 0.05
    led = RiskLedger(n_slots=n_slots)
    writer = led.open_request(delta_req="1/100")
    readers = [led.open_request(delta_req="1/100") for _ in range(3)]
    stop = threading.Event()
    seen: list[tuple[SlotState, float, int]] = []
    errors: list[BaseException] = []

    def reader(r: int) -> None:
        rng = np.random.default_rng(r)
        try:
            while not stop.is_set():
                s = int(rng.integers(n_slots))
                try:
                    rd = led.slots.read(led.slots.authorize(r, s))
                except (UnwrittenSlotError, StaleReadError):
                    continue
                seen.append((rd.state, rd.bound, rd.owner))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(r,)) for r in readers]
    for t in threads:
        t.start()
    rng = np.random.default_rng(0)
    n_writes = 0
    try:
        for _ in range(300):
            k = int(rng.integers(1, 6))
            slots = rng.choice(n_slots, size=k, replace=False).tolist()
            bounds = rng.exponential(threshold, k)
            if rng.random() < 0.2:
                bounds[0] = float("nan")  # fails the audit: nothing of this write becomes readable
                with pytest.raises(InvalidValueError):
                    write(led, writer, slots, bounds.tolist(), threshold=threshold, prob=True)
                continue
            write(led, writer, slots, bounds.tolist(), threshold=threshold, prob=True)
            n_writes += 1
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors
    assert len(seen) > 100
    for state, bound, owner in seen:
        assert owner == writer  # shared reads attributed to the writer
        assert state in (SlotState.MASKED, SlotState.KEPT_EXACT)  # 2: explicit state
        if state is SlotState.MASKED:
            assert bound <= threshold  # 1 and 3: no read ever saw a violating compressed entry
        else:
            assert bound == 0.0
    # 4: one telescoping draw per write, none per read
    v = led.verdict(writer)
    assert v.counts.probabilistic == n_writes
    assert all(led.spent(r) == 0 for r in readers)


# ----------------------------------------------------------------- ownership


def _unchanged(led: RiskLedger, before: tuple[np.ndarray, ...], seq: int) -> None:
    after = led.slots.snapshot()
    assert all(np.array_equal(x, y) for x, y in zip(before, after, strict=True))
    assert led.applied_seq == seq  # nothing was recorded


def test_evict_of_another_requests_slot_is_refused() -> None:
    led = RiskLedger(n_slots=4)
    a = led.open_request(delta_req="1/100")
    b = led.open_request(delta_req="1/100")
    write(led, a, [0, 1], [0.01, 0.01])
    before, seq = led.slots.snapshot(), led.applied_seq
    with pytest.raises(SlotOwnershipError,
                       match=r"request 2 may not evict slot 1: it is owned by request 1 "
                             r"\(generation 1\)") as info:
        led.evict(b, [2, 1])
    err = info.value
    assert isinstance(err, PermissionError)
    assert (err.request_id, err.action, err.slot, err.owner, err.generation, err.refused) == (
        b, "evict", 1, a, 1, 1)
    _unchanged(led, before, seq)  # slot 2 (free) was not evicted either: the batch is refused
    with pytest.raises(SlotOwnershipError, match="2 slots of the batch are owned by others"):
        led.evict(b, [0, 1])
    _unchanged(led, before, seq)
    rd = led.slots.read(led.slots.authorize(b, 0))
    assert rd.owner == a and rd.generation == 1
    led.evict(a, [0])  # its owner may
    led.evict(b, [0, 2])  # and anyone may evict free slots
    assert led.slots.record(0).generation == 3 and led.slots.record(2).generation == 1


def test_write_over_another_requests_slot_is_refused_atomically() -> None:
    led = RiskLedger(n_slots=4)
    a = led.open_request(delta_req="1/100")
    b = led.open_request(delta_req="1/100")
    write(led, a, [0], [0.01])
    before, seq = led.slots.snapshot(), led.applied_seq
    writes = led.slots.writes
    for prob in (False, True):
        with pytest.raises(SlotOwnershipError,
                           match=r"request 2 may not write slot 0: it is owned by request 1 "
                                 r"\(generation 1\)"):
            write(led, b, [3, 0], [0.01, 0.01], prob=prob)
        _unchanged(led, before, seq)
    # an empirical batch (which would write exact bytes) is refused the same way
    from witcert_calculus.tiers import Measurement
    with pytest.raises(SlotOwnershipError, match="slot 0"):
        led.admit_entries(b, [0.01], threshold=0.05, metric=TV,
                          evidence=Measurement("probe", samples=2), slots=[0])
    _unchanged(led, before, seq)
    v = led.verdict(b)
    assert v.counts.total == 0 and v.spent == 0 and v.entries == 0  # nothing charged or counted
    assert led.slots.writes == writes
    write(led, a, [0, 3], [0.02, 0.5])  # the owner rewrites its slot, and takes a free one
    assert led.slots.record(0).generation == 2 and led.slots.record(3).owner == a
    assert led.slots.owned_by(a).tolist() == [0, 3] and led.slots.owned_by(b).size == 0


def test_close_request_releases_its_slots() -> None:
    led = RiskLedger(n_slots=4)
    a = led.open_request(delta_req="1/100")
    b = led.open_request(delta_req="1/100")
    write(led, a, [0, 1], [0.01, 0.5])
    write(led, b, [2], [0.01])
    g = led.slots.authorize(b, 0)  # b shares a's prefix
    led.close_request(a)
    for s in (0, 1):
        rec = led.slots.record(s)
        assert (rec.state, rec.owner, rec.generation) == (SlotState.UNWRITTEN, None, 2)
    with pytest.raises(StaleReadError):  # fail-closed: the writer's bytes are gone
        led.slots.read(g)
    assert led.slots.record(2).owner == b  # other requests' slots stay as they were
    write(led, b, [0], [0.01])  # a released slot is free
    assert led.slots.record(0).owner == b
    assert led.slots.owned_by(a).size == 0
    led.close_request(b)
    assert led.slots.counts()[SlotState.UNWRITTEN] == 4


def test_retry_of_a_recorded_write_changes_nothing() -> None:
    led = RiskLedger(n_slots=2)
    a = led.open_request(delta_req="1/100")
    b = led.open_request(delta_req="1/100")
    first = led.admit_entries(a, [0.01], threshold=0.05, metric=TV, evidence=PROOF, slots=[0],
                              token="a:0")
    led.evict(a, [0])
    write(led, b, [0], [0.02])
    again = led.admit_entries(a, [0.01], threshold=0.05, metric=TV, evidence=PROOF, slots=[0],
                              token="a:0")
    assert again.admission == first.admission
    assert led.slots.record(0).owner == b  # the retry did not write the slot again


def test_owned_by_bad_request_id() -> None:
    led = RiskLedger(n_slots=2)
    with pytest.raises(InvalidValueError, match="request_id='1'"):
        led.slots.owned_by("1")  # type: ignore[arg-type]
    assert led.slots.owned_by(5).size == 0


def test_slot_table_refuses_a_foreign_write_even_with_its_key() -> None:
    """Defence in depth: the table itself checks ownership before it changes anything."""
    led = RiskLedger(n_slots=2)
    a = led.open_request(delta_req="1/100")
    b = led.open_request(delta_req="1/100")
    write(led, a, [0], [0.01])
    key = led._key  # the ledger's capability, as a replay presents it
    before, seq = led.slots.snapshot(), led.applied_seq
    idx = np.array([1, 0], dtype=np.int64)
    with pytest.raises(SlotOwnershipError, match="request 2 may not write slot 0"):
        led.slots.apply_write(key, b, idx, np.array([True, True]), np.array([0.01, 0.01]))
    with pytest.raises(SlotOwnershipError, match="request 2 may not evict slot 0"):
        led.slots.apply_evict(key, b, idx)
    _unchanged(led, before, seq)


def test_check_writable_answers_without_changing_anything() -> None:
    led = RiskLedger(n_slots=3)
    a = led.open_request(delta_req="1/100")
    b = led.open_request(delta_req="1/100")
    write(led, a, [0], [0.01])
    led.slots.check_writable(a, [0, 1], "write")  # own and free slots
    led.slots.check_writable(b, [1, 2], "evict")
    with pytest.raises(SlotOwnershipError, match="request 2 may not write slot 0"):
        led.slots.check_writable(b, [1, 0], "write")
    with pytest.raises(InvalidValueError, match="action='read'"):
        led.slots.check_writable(b, [1], "read")  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match=r"slots=\[3\]"):
        led.slots.check_writable(b, [3], "write")
    with pytest.raises(InvalidValueError, match="request_id=None"):
        led.slots.check_writable(None, [1], "write")  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match="owner=1.5"):
        led.slots.holdings(1.5)  # type: ignore[arg-type]
    assert led.slots.record(0).generation == 1 and led.slots.holdings(a).tolist() == [0]
