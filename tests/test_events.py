"""The typed ledger events and their one codec: every event survives the journal encoding."""

from __future__ import annotations

import json
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from witcert_calculus.accounting.entries import certify_entries
from witcert_calculus.errors import InvalidValueError
from witcert_calculus.numerics.probability import Probability
from witcert_calculus.accounting.events import (
    AddSentinel,
    Admit,
    AdmitEntries,
    CloseRequest,
    EncodedEvent,
    Event,
    Evict,
    Observe,
    OpenRequest,
    SlotWrite,
    decode,
)
from witcert_calculus.accounting.records import EventKind
from witcert_calculus.tiers import Tier


def _through_json(e: EncodedEvent) -> EncodedEvent:
    # What the journal stores and reads back: the payload as JSON text.
    return EncodedEvent(e.op, json.loads(json.dumps(e.payload, sort_keys=True)), e.data, e.token)


def _round_trips(ev: Event) -> None:
    enc = ev.encode()
    back = decode(_through_json(enc))
    assert type(back) is type(ev)
    assert back.encode() == enc


admits = st.builds(
    Admit, request_id=st.integers(1, 2**62), ordinal=st.integers(0, 2**40),
    kind=st.sampled_from(EventKind),
    charged=st.fractions(min_value=0, max_value=1, max_denominator=2**80),
    cap=st.sampled_from(Tier), tier=st.sampled_from(Tier), saturated=st.booleans(),
    token=st.none() | st.text(min_size=1, max_size=8))


@given(ev=admits)
@settings(max_examples=100, deadline=None)
def test_admit_round_trips(ev: Admit) -> None:
    _round_trips(ev)
    assert decode(_through_json(ev.encode())) == ev


@given(ev=admits, bounds=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=20),
       with_slots=st.booleans())
@settings(max_examples=100, deadline=None)
def test_entries_round_trip(ev: Admit, bounds: list[float], with_slots: bool) -> None:
    cert = certify_entries(bounds, threshold=0.5)
    slots = np.arange(len(bounds), dtype=np.int64)[::-1].copy() if with_slots else None
    entries = AdmitEntries.of(ev, cert, slots=slots, bounds=np.asarray(bounds))
    _round_trips(entries)
    back = decode(_through_json(entries.encode()))
    assert isinstance(back, AdmitEntries) and back.charge == ev
    if ev.kind is EventKind.EMPIRICAL_FALLBACK:
        assert back.n_kept == 0
    if with_slots:
        assert back.write is not None and entries.write is not None
        assert np.array_equal(back.write.slots, slots)
        assert np.array_equal(back.write.keep, entries.write.keep)
        assert np.array_equal(back.write.bounds, np.where(entries.write.keep, bounds, 0.0))


def test_other_events_round_trip() -> None:
    for ev in (OpenRequest(7, Probability.budget(Fraction(1, 3))), CloseRequest(7),
               CloseRequest(7, np.array([4, 0, 9], dtype=np.int64)),
               Evict(7, np.array([3, 1, 2], dtype=np.int64)),
               AddSentinel("layer0.tv", 0.01, 0.5),
               Observe("layer0.tv", np.array([[0.1, 0.2], [0.0, 0.0], [1.0, 1.0]]))):
        _round_trips(ev)
    assert OpenRequest(7, Probability.budget("1/3")).encode().payload["delta_req"] == "1/3"
    back = decode(_through_json(CloseRequest(7, np.array([4, 0], dtype=np.int64)).encode()))
    assert isinstance(back, CloseRequest) and back.slots.tolist() == [4, 0]
    assert CloseRequest(7).slots.size == 0 and CloseRequest(7).encode().data == b""


def test_unknown_operation_and_mismatched_arrays_are_refused() -> None:
    with pytest.raises(InvalidValueError, match="op='bogus'.*not a known event kind"):
        decode(EncodedEvent("bogus", {}))
    write = SlotWrite(np.array([0, 1], dtype=np.int64), np.array([True, False]),
                      np.array([0.1, 0.0]))
    with pytest.raises(InvalidValueError, match="does not match its arrays"):
        SlotWrite.unpack(write.pack(), 2, kept=2)
    with pytest.raises(InvalidValueError, match="does not match its arrays"):
        SlotWrite.unpack(write.pack()[:-8], 2, kept=1)
